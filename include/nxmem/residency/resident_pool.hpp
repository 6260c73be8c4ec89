// resident_pool<Upstream>: a pool that can sleep — give back every committed byte it holds from
// its upstream while keeping its reservation and every address — and wake at the same addresses
// with what was backed up restored (docs/HOST.md "Residency"). vLLM's sleep mode and SGLang's
// torch_memory_saver, for any upstream with virtual backing.
//
// A layer over pool_allocator, the pool growing from a recorded upstream (detail/
// recorded_upstream.hpp) that knows every committed range whatever layer of the pool committed
// it. This class gates allocate: asleep (or while a sleep or a wake is under way) it is refused
// with BUSY before the pool is touched, and a sleep waits for the allocations under way. Release
// works in every state: asleep, the pool's records change and no memory is touched; a pass-through
// released drops its part of the backup. While asleep the pool holds a lease, so nothing is given
// back twice (trim gives 0).
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/pool/pool_allocator.hpp>
#include <nxmem/residency/detail/recorded_upstream.hpp>
#include <nxmem/residency/resident_memory.hpp>
#include <nxmem/residency/residency_state.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace nxmem {

template <offers_virtual_backing Upstream> class resident_pool final : public resident_memory {
public:
    using device_type = typename Upstream::device_type;
    using address_type = typename device_type::address_type;
    using upstream_type = residency_detail::recorded_upstream<Upstream>;
    using pool_type = pool_allocator<upstream_type>;

    // The upstream is constructed in place from `upstream_arguments` (a plugin_allocator, say).
    template <class... Arguments>
    resident_pool(std::string tag, pool_options options, Arguments&&... upstream_arguments)
        : pool_(std::in_place, options, std::in_place, std::forward<Arguments>(upstream_arguments)...),
          tag_(std::move(tag)) {}
    resident_pool(const resident_pool&) = delete;
    resident_pool& operator=(const resident_pool&) = delete;

    device_id device() const noexcept { return pool_.device(); }

    // Refused with BUSY, naming the tag and the state, unless awake.
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        allocating_.fetch_add(1);
        if (state_.load() != residency_state::awake) [[unlikely]] {
            leave_allocate();
            return refused_allocate(size);
        }
        auto made = pool_.allocate(size, alignment);
        leave_allocate();
        return made;
    }
    // In every state (the pool's checks, as ever).
    result<release_report> release(const allocation<device_type>& live) { return pool_.release(live); }
    result<release_report> release_by_address(address_type address) { return pool_.release_by_address(address); }

    // Puts the pool to sleep: every committed range is backed up per `policy`, then decommitted;
    // the reservation and every address stay. OK with unchanged_pools 1 when already asleep.
    // Refused, the pool awake and untouched: BUSY while a sleep or wake is under way or while the
    // pool is leased (a transfer registration, an export or a mapped prefix holds it in place);
    // UNSUPPORTED_CAPABILITY when the pool does not grow by commit, or a backup of device memory
    // is asked of an upstream with no copies; the backup's own failure (a full disk, no host
    // memory) as it came.
    result<residency_report> sleep(const sleep_policy& policy) override {
        if (policy.kind() != sleep_policy_kind::discard && !upstream_type::can_back_up) {
            return fail(status_code::unsupported_capability,
                        "sleep of pool '" + tag_ + "': a " + std::string(sleep_policy_name(policy.kind())) +
                            " backup of device memory needs an upstream that copies to the host (ABI 1.4's copy table)");
        }
        if (!pool_.grows_by_commit()) {
            return fail(status_code::unsupported_capability,
                        "sleep of pool '" + tag_ + "': the pool does not grow by commit (its upstream's reservation "
                                                  "failed or growth by allocation was asked), so it cannot give memory "
                                                  "back and keep its addresses");
        }
        residency_state expected = residency_state::awake;
        if (!state_.compare_exchange_strong(expected, residency_state::sleeping)) {
            if (expected == residency_state::asleep) {
                return residency_report{0, 1, 0, 0, 0, 0};
            }
            return transition_under_way("sleep", expected);
        }
        for (std::uint64_t under_way = allocating_.load(); under_way != 0; under_way = allocating_.load()) {
            allocating_.wait(under_way);
        }
        lease_.emplace(pool_.lease());
        if (const std::uint64_t others = pool_.leases() - 1; others != 0) {
            lease_.reset();
            state_.store(residency_state::awake);
            return fail(status_code::busy, "sleep of pool '" + tag_ + "': " + std::to_string(others) +
                                               " lease(s) hold its memory in place (a transfer registration, an "
                                               "export or a mapped prefix); end them first");
        }
        auto walked = pool_.upstream().sleep(policy);
        if (!walked.has_value()) {
            lease_.reset();
            state_.store(residency_state::awake);
            return fail(walked.error().code, "sleep of pool '" + tag_ + "': " + walked.error().message +
                                                 "; the pool stays awake, nothing given back");
        }
        state_.store(residency_state::asleep);
        const residency_detail::walk_figures& figures = walked.value();
        return residency_report{1, 0, figures.ranges, figures.bytes, figures.backed_up_bytes, figures.still_resident_bytes};
    }

    // Commits every range at its address again and restores its backup. OK with
    // unchanged_pools 1 when already awake. A wake the upstream cannot satisfy (no memory) leaves
    // the pool asleep, its backup kept, and says how many bytes it needed.
    result<residency_report> wake() override {
        residency_state expected = residency_state::asleep;
        if (!state_.compare_exchange_strong(expected, residency_state::waking)) {
            if (expected == residency_state::awake) {
                return residency_report{0, 1, 0, 0, 0, 0};
            }
            return transition_under_way("wake", expected);
        }
        auto walked = pool_.upstream().wake();
        if (!walked.has_value()) {
            state_.store(residency_state::asleep);
            return fail(walked.error().code, "wake of pool '" + tag_ + "': " + walked.error().message);
        }
        lease_.reset();
        state_.store(residency_state::awake);
        const residency_detail::walk_figures& figures = walked.value();
        return residency_report{1, 0, figures.ranges, figures.bytes, figures.backed_up_bytes, 0};
    }

    const std::string& tag() const noexcept override { return tag_; }
    residency_state state() const noexcept override { return state_.load(); }
    residency_usage residency() const override {
        const auto asleep = pool_.upstream().asleep();
        residency_usage figures;
        figures.tag = tag_;
        figures.state = state_.load();
        figures.asleep_bytes = asleep.asleep_bytes;
        figures.backed_up_bytes = asleep.backed_up_bytes;
        figures.policy = asleep.policy;
        figures.backup_location = asleep.asleep_bytes != 0 ? asleep.where : std::string();
        figures.committed_bytes = pool_.upstream().committed_bytes();
        figures.pool = pool_.usage();
        return figures;
    }

    pool_usage usage() const { return pool_.usage(); }
    // Gives idle memory back (pool_allocator::trim); 0 while asleep (the pool is leased).
    std::uint64_t trim(std::uint64_t keep_bytes = 0) { return pool_.trim(keep_bytes); }

    // For a transfer engine registering the pool (transfer::agent::register_pool): the regions
    // and a lease. A leased pool refuses to sleep.
    template <class Visit> void for_each_region(Visit&& visit) const { pool_.for_each_region(std::forward<Visit>(visit)); }
    std::uint64_t region_generation() const noexcept { return pool_.region_generation(); }
    pool_lease lease() noexcept { return pool_.lease(); }

    pool_type& pool() noexcept { return pool_; }
    Upstream& upstream() noexcept { return pool_.upstream().inner(); }

private:
    void leave_allocate() noexcept {
        if (allocating_.fetch_sub(1) == 1 && state_.load() != residency_state::awake) [[unlikely]] {
            allocating_.notify_all();
        }
    }
    [[gnu::cold, gnu::noinline]] failure refused_allocate(std::uint64_t size) const {
        return fail(status_code::busy, "allocate of " + std::to_string(size) + " bytes from pool '" + tag_ + "': the pool is " +
                                           std::string(residency_state_name(state_.load())) + "; wake it first");
    }
    [[gnu::cold, gnu::noinline]] failure transition_under_way(const char* asked, residency_state now) const {
        return fail(status_code::busy, std::string(asked) + " of pool '" + tag_ + "': the pool is " +
                                           std::string(residency_state_name(now)) + " (another call is under way)");
    }

    // Declared first, destroyed last; the lease below ends before it.
    pool_type pool_;
    std::string tag_;
    std::atomic<residency_state> state_{residency_state::awake};
    std::atomic<std::uint64_t> allocating_{0};
    std::optional<pool_lease> lease_; // held while asleep
};

} // namespace nxmem
