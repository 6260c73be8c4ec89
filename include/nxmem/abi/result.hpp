// The error and result types of the C++ side: a status code and the message that explains it.
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/abi/status.hpp>

// basic_result, not result.hpp: that one includes boost/exception_ptr.hpp, whose static
// exception objects are allocated by a dynamic initialiser in every translation unit, so a
// plugin would allocate (and could throw) while dlopen runs its initialisers (issue 23).
#include <boost/outcome/basic_result.hpp>

#include <stdexcept>
#include <string>
#include <utility>

namespace nxmem {

// What went wrong: a stable code and a human-readable message (the plugin's own, when it came
// from the plugin). Expected failures are values of this type, never exceptions.
struct error {
    status_code code = status_code::internal_error;
    std::string message;

    // User-provided on purpose: Boost.Outcome's result<T> holds an error beside its value even on
    // success, and value-initialising an error whose constructor is implicit zero-fills it first.
    // A successful result then costs a zero-fill on every hot path; with these it costs the three
    // stores of an empty string.
    error() noexcept {}
    error(status_code failed, std::string text) noexcept : code(failed), message(std::move(text)) {}

    // "CODE: message", the form every tool prints.
    std::string describe() const {
        std::string text(status_code_name(code));
        if (!message.empty()) {
            text += ": ";
            text += message;
        }
        return text;
    }

    friend bool operator==(const error&, const error&) = default;
};

// Thrown only by result<T>::value() on a failed result; hot paths test the result instead.
class bad_result_access : public std::runtime_error {
public:
    explicit bad_result_access(error failure)
        : std::runtime_error(failure.describe()), failure_(std::move(failure)) {}
    const error& failure() const noexcept { return failure_; }

private:
    error failure_;
};

namespace detail {
// Outcome policy: accessing the value of a failed result throws bad_result_access.
struct throw_nxmem_error : boost::outcome_v2::policy::base {
    template <class Impl> static constexpr void wide_value_check(Impl&& self) {
        if (!base::_has_value(self)) {
            throw bad_result_access(base::_error(std::forward<Impl>(self)));
        }
    }
    template <class Impl> static constexpr void wide_error_check(Impl&& self) {
        if (!base::_has_error(self)) {
            throw std::logic_error("nxmem: error() called on a successful result");
        }
    }
};
} // namespace detail

template <class T> using result = boost::outcome_v2::basic_result<T, error, detail::throw_nxmem_error>;

// What `fail` returns: converts to any result<T> as its failure. Name it to declare a failure
// helper of your own, kept off the hot path:
//   [[gnu::cold]] nxmem::failure too_big(std::uint64_t size) { return nxmem::fail(...); }
using failure = boost::outcome_v2::failure_type<error>;

// A failed result with `code` and `message`.
inline failure fail(status_code code, std::string message) {
    return boost::outcome_v2::failure(error{code, std::move(message)});
}

// What a successful result<void> returns: `return nxmem::success();`.
constexpr boost::outcome_v2::success_type<void> success() noexcept { return {}; }

} // namespace nxmem

// NXMEM_TRY(name, expression): evaluates a result; on failure returns that failure from the
// enclosing function, else declares `name` holding the value. NXMEM_TRY_VOID(expression) for
// result<void>. (Boost.Outcome's own TRY changed its signature between Boost versions.)
#define NXMEM_DETAIL_CONCAT2(a, b) a##b
#define NXMEM_DETAIL_CONCAT(a, b) NXMEM_DETAIL_CONCAT2(a, b)
#define NXMEM_DETAIL_TRY_RESULT NXMEM_DETAIL_CONCAT(nxmem_try_result_, __LINE__)
#define NXMEM_TRY(name, ...)                                                                       \
    auto&& NXMEM_DETAIL_TRY_RESULT = (__VA_ARGS__);                                                \
    if (!NXMEM_DETAIL_TRY_RESULT.has_value())                                                      \
        return ::boost::outcome_v2::failure(std::move(NXMEM_DETAIL_TRY_RESULT).error());           \
    auto name = std::move(NXMEM_DETAIL_TRY_RESULT).value()
#define NXMEM_TRY_VOID(...)                                                                        \
    do {                                                                                           \
        auto&& nxmem_try_void_result = (__VA_ARGS__);                                              \
        if (!nxmem_try_void_result.has_value())                                                    \
            return ::boost::outcome_v2::failure(std::move(nxmem_try_void_result).error());         \
    } while (false)
