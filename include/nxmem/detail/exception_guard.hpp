// The exception guard both sides wrap around every extern "C" body: no exception ever crosses the
// boundary; std::bad_alloc becomes OUT_OF_MEMORY, every other exception INTERNAL_ERROR carrying
// its what(), truncated into the inline buffer.
#pragma once

#include <nxmem/abi/status.hpp>

#include <exception>
#include <functional>
#include <new>
#include <type_traits>

namespace nxmem::detail {

// Converts the exception in flight into a status: OUT_OF_MEMORY for std::bad_alloc (running out
// of memory is an expected failure, whoever threw it), INTERNAL_ERROR for anything else. Call
// only inside a catch.
inline NxmemStatusCode status_from_current_exception(NxmemStatus* status) noexcept {
    try {
        throw;
    } catch (const std::bad_alloc& failure) {
        return abi::write_status(status, NXMEM_STATUS_OUT_OF_MEMORY, failure.what());
    } catch (const std::exception& failure) {
        return abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, failure.what());
    } catch (...) {
        return abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR,
                                 "exception of a type not derived from std::exception");
    }
}

// Runs `body`, which returns an NxmemStatusCode; an exception becomes OUT_OF_MEMORY
// (std::bad_alloc) or INTERNAL_ERROR.
template <class Body>
NxmemStatusCode guard_status(NxmemStatus* status, Body&& body) noexcept {
    static_assert(std::is_convertible_v<std::invoke_result_t<Body>, NxmemStatusCode>,
                  "a guarded body returns an NxmemStatusCode");
    try {
        return std::invoke(std::forward<Body>(body));
    } catch (...) {
        return status_from_current_exception(status);
    }
}

// Runs `body` for a slot that has no status to report through (retain, release,
// release_completed). Returns false when `body` threw; the exception is contained, and
// `on_failure` (if given) receives the INTERNAL_ERROR status describing it.
template <class Body, class OnFailure = void (*)(const NxmemStatus&)>
bool guard_void(Body&& body, OnFailure&& on_failure = [](const NxmemStatus&) {}) noexcept {
    try {
        std::invoke(std::forward<Body>(body));
        return true;
    } catch (...) {
        NxmemStatus status = abi::make_status();
        status_from_current_exception(&status);
        try {
            std::invoke(std::forward<OnFailure>(on_failure), status);
        } catch (...) {
            // The failure report itself failed; nothing further can be said across the boundary.
        }
        return false;
    }
}

} // namespace nxmem::detail
