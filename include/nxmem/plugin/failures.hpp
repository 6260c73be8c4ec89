// Failure helpers for a mechanism's cold paths: messages prefixed with the mechanism's name, and
// a failed system call with its errno explained. Each returns nxmem::failure, which converts to
// any result<T>; each is out of line and cold, so a hot path that may fail builds no text unless
// it does.
#pragma once

#include <nxmem/abi/result.hpp>

#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace nxmem::plugin {

// "NAME: MESSAGE" with `code`.
[[gnu::cold]] [[gnu::noinline]] inline failure mechanism_failure(std::string_view name, status_code code,
                                                                 std::string_view message) {
    std::string text(name);
    text += ": ";
    text += message;
    return fail(code, std::move(text));
}

// "NAME: WHAT: strerror(error_number)" with `code`, for a failed system call (pass errno, read
// right after the call).
[[gnu::cold]] [[gnu::noinline]] inline failure errno_failure(std::string_view name, status_code code,
                                                             std::string_view what, int error_number) {
    std::string text(what);
    text += ": ";
    text += std::strerror(error_number);
    return mechanism_failure(name, code, text);
}

} // namespace nxmem::plugin
