// StreamPolicy: what stream_ordered_pool needs to know of an engine's streams of device work, so
// memory released while work on a stream may still use it is handed to another stream only
// once that work is done. A policy names its stream handle and its fence (a point in a stream's
// work: a CUDA event, a host timeline's count), records a fence on a stream, says whether one
// has completed, and gives a fence back when the pool is done with it. A policy that can also
// make a stream wait for a fence (cuStreamWaitEvent) lets the pool hand pending memory to
// another stream at once, ordered after the fence, instead of waiting for it on the host.
//
// The pool calls a policy from any thread, with one of its own locks held: its calls must be
// thread-safe, must not block on device work, and must not call back into the pool.
#pragma once

#include <nxmem/abi/result.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <type_traits>

namespace nxmem {

// "the policy names a stream handle that is a small value, compared and hashed"
template <class P>
concept policy_names_its_streams = requires { typename P::stream_type; } &&
    std::is_trivially_copyable_v<typename P::stream_type> && std::equality_comparable<typename P::stream_type> &&
    requires(const typename P::stream_type& stream) {
        { std::hash<typename P::stream_type>{}(stream) } -> std::convertible_to<std::size_t>;
    };

// "the policy records a fence on a stream, says whether it completed, and takes it back"
template <class P>
concept policy_fences_streams = policy_names_its_streams<P> && requires { typename P::fence_type; } &&
    std::is_nothrow_move_constructible_v<typename P::fence_type> &&
    requires(P& policy, const typename P::stream_type& stream, const typename P::fence_type& fence,
             typename P::fence_type spent) {
        { policy.record(stream) } -> std::same_as<result<typename P::fence_type>>;
        { policy.completed(fence) } -> std::same_as<bool>;
        { policy.retire(std::move(spent)) } noexcept;
    };

template <class P>
concept StreamPolicy = policy_fences_streams<P>;

// "the policy makes a stream's later work wait for a fence", without blocking the host
template <class P>
concept stream_policy_waits = StreamPolicy<P> &&
    requires(P& policy, const typename P::stream_type& stream, const typename P::fence_type& fence) {
        { policy.wait(stream, fence) } -> std::same_as<result<void>>;
    };

} // namespace nxmem
