// The host's API returns every failure as a status and never throws: a std::bad_alloc from the
// host's own bookkeeping (records, messages, tables) becomes OUT_OF_MEMORY, any other exception
// INTERNAL_ERROR. Each public entry point runs its body inside `contain`; the body keeps its state
// consistent at every point where it can throw (see docs/HOST.md, "When something fails: out of
// memory, a hostile plugin").
#pragma once

#include <nxmem/abi/result.hpp>

#include <exception>
#include <new>
#include <string>

namespace nxmem::host::detail {

// An error whose message is built only if memory allows; an empty message otherwise.
inline error error_without_allocating(status_code code, const char* operation,
                                      const char* what) noexcept {
    try {
        return error{code, std::string(operation) + ": " + what};
    } catch (...) {
        return error{code, {}};
    }
}

template <class Body> auto contain(const char* operation, Body&& body) noexcept -> decltype(body()) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return error_without_allocating(status_code::out_of_memory, operation,
                                        "the host ran out of memory");
    } catch (const std::exception& failure) {
        return error_without_allocating(status_code::internal_error, operation, failure.what());
    } catch (...) {
        return error_without_allocating(status_code::internal_error, operation,
                                        "an exception of unknown type");
    }
}

} // namespace nxmem::host::detail
