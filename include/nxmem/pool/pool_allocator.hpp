// pool_allocator<Upstream>: serves many allocations from few upstream ones, so an engine crosses
// into its upstream (a plugin, the driver) once per chunk, not once per allocation, and reuses
// memory it already faulted in. Itself a DeviceAllocator, so pools compose.
//
// A facade over four layers (docs/HOST.md "Pools" draws them), each a header owning its state and
// knowing only the layer below:
//   small_blocks  (pool/detail/small_blocks.hpp)  requests up to 16 KiB: size classes on slabs
//   cached_spans  (pool/detail/cached_spans.hpp)  larger ones: the per-shard span caches, over
//   span_heap     (pool/detail/span_heap.hpp)     best fit across bins, split and merge
//   chunk_source  (pool/detail/chunk_source.hpp)  chunks, segments, the reservation and its arena;
//                                                 every give-back, leases, the region list
// This class routes a request, checks a release's identity, and says what the pool holds; trim
// decides the order in which idle memory goes back, the source does the giving.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/pool/detail/cached_spans.hpp>
#include <nxmem/pool/detail/chunk_source.hpp>
#include <nxmem/pool/detail/pool_errors.hpp>
#include <nxmem/pool/detail/pooled_id.hpp>
#include <nxmem/pool/detail/small_blocks.hpp>
#include <nxmem/pool/detail/span_heap.hpp>
#include <nxmem/pool/pool_lease.hpp>
#include <nxmem/pool/pool_options.hpp>
#include <nxmem/pool/pool_region.hpp>
#include <nxmem/pool/pool_usage.hpp>
#include <nxmem/pool/size_classes.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

namespace nxmem {

template <DeviceAllocator Upstream> class pool_allocator {
public:
    using device_type = typename Upstream::device_type;
    using address_type = typename device_type::address_type;

    explicit pool_allocator(Upstream upstream, pool_options options = {})
        : source_(std::move(upstream), options), blocks_(source_), spans_(source_),
          caches_(spans_, options.span_cache_bytes), device_(source_.device()),
          pass_through_bytes_(options.pass_through_bytes != 0 ? options.pass_through_bytes
                                                              : pool_default_pass_through_bytes),
          retain_limit_bytes_(options.retain_limit_bytes) {}

    // Constructs the upstream in place, from `arguments`: for an upstream that cannot be moved
    // (or see shared_upstream, for one the engine keeps using beside the pool).
    template <class... Arguments>
    explicit pool_allocator(std::in_place_t, pool_options options, Arguments&&... arguments)
        : source_(std::in_place, options, std::forward<Arguments>(arguments)...), blocks_(source_), spans_(source_),
          caches_(spans_, options.span_cache_bytes), device_(source_.device()),
          pass_through_bytes_(options.pass_through_bytes != 0 ? options.pass_through_bytes
                                                              : pool_default_pass_through_bytes),
          retain_limit_bytes_(options.retain_limit_bytes) {}

    pool_allocator(const pool_allocator&) = delete;
    pool_allocator& operator=(const pool_allocator&) = delete;

    // Gives everything it holds back to the upstream, live allocations included: they end with
    // the pool. The segments go first; the source, destroyed last, gives back its chunks or its
    // reservation.
    ~pool_allocator() { spans_.release_at_exit(); }

    device_id device() const noexcept { return device_; }

    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        // The common case first, calling nothing: a small request, a free block in the thread's
        // current slab of the class. Not std::has_single_bit: without -mpopcnt it is a call into
        // libgcc (21 instructions).
        if (size != 0 && alignment != 0 && (alignment & (alignment - 1)) == 0) [[likely]] {
            const std::uint32_t size_class = pool_classes::class_of(size, alignment);
            if (size_class != pool_classes::not_small) [[likely]] {
                pool_detail::shard* home = nullptr;
                if (pool_detail::slab* slab = blocks_.lock_current_slab(size_class, home); slab != nullptr) [[likely]] {
                    return blocks_.hand_out_block(*home, *slab, size, alignment);
                }
            }
        }
        return allocate_checked(size, alignment);
    }

    // Checked as the host adapter checks a release (docs/ABI.md M10's order): another mechanism
    // (WRONG_MECHANISM), another device (WRONG_DEVICE), a size or alignment no allocation has
    // (INVALID_ARGUMENT), an allocation not live here (UNKNOWN_ALLOCATION), a live one
    // misdescribed (INVALID_ARGUMENT); a refused release changes nothing. A pooled release
    // reports COMPLETE with unmapped_bytes 0 (the memory stays in the pool, idle); a
    // pass-through one reports what the upstream reported.
    result<release_report> release(const allocation<device_type>& live) {
        // The common case first, calling nothing: a small block of its shard's current slab.
        if (!pool_detail::names_span(live.allocation_id) && blocks_.try_release_current(live)) [[likely]] {
            return release_report{release_state::complete, 0, 0};
        }
        return release_checked(live);
    }

    // Releases the allocation that starts at `address`, found in the pool's own records, with the
    // same checks. UNKNOWN_ALLOCATION, naming the address, when no live allocation starts there.
    result<release_report> release_by_address(address_type address) {
        const std::uint64_t wire = device_type::to_wire(address);
        std::optional<allocation<device_type>> live;
        if (source_.in_arena(wire)) {
            live = spans_.find_live_in_arena(wire);
        } else {
            source_.visit_region_holding(wire, [&](const pool_detail::mapped_region& region) {
                live = region.segment ? spans_.find_live_in_segment(region.tag, wire)
                                      : blocks_.find_live(wire, region.tag, region.base);
            });
        }
        if (!live.has_value()) {
            return pool_detail::refused_address(wire);
        }
        return release(*live);
    }

    // Gives idle memory back to the upstream until at most keep_bytes are idle or nothing idle is
    // left to give, in this order: the span pieces parked in the caches go back to the free
    // lists (merging); the committed granules of free arena pieces (from the top down); idle
    // segments; the shards' idle current slabs join the free slabs; chunks with no block in use.
    // Free blocks of slabs still in use stay. Returns the bytes given back: 0 while a lease is
    // held (lease()).
    std::uint64_t trim(std::uint64_t keep_bytes = 0) {
        caches_.flush_all();
        const pool_usage now = usage();
        if (now.idle_bytes <= keep_bytes || source_.leases() != 0) {
            spans_.lower_arena_top_locked();
            return 0;
        }
        const std::uint64_t excess = now.idle_bytes - keep_bytes;
        std::uint64_t given = spans_.decommit_free_arena(excess);
        if (given < excess) {
            given += spans_.give_back_idle_segments(excess - given);
        }
        if (given < excess) {
            blocks_.retire_idle_current_slabs();
            given += blocks_.give_back_free_chunks(excess - given);
        }
        return given;
    }

    // What the pool holds and what it cost its upstream (pool_usage.hpp says each figure).
    pool_usage usage() const {
        const pool_detail::block_figures blocks = blocks_.figures();
        const pool_detail::span_figures spans = caches_.figures();
        pool_usage totals;
        source_.add_upstream_figures(totals);
        totals.live_allocations = blocks.live_allocations + spans.live_allocations;
        totals.in_use_bytes = blocks.in_use_bytes + spans.in_use_bytes;
        const std::uint64_t handed_out = blocks.handed_out_bytes + spans.handed_out_bytes;
        totals.idle_bytes = totals.held_bytes > handed_out ? totals.held_bytes - handed_out : 0;
        return totals;
    }

    // The regions the pool holds from its upstream now (pool/pool_region.hpp): visit(const
    // pool_region&) is called for each, with the pool's records held, so it must not call into
    // the pool. For whoever names the pool's memory to someone else (a transfer engine registering
    // it once); region_generation() grows whenever the list changes.
    template <class Visit> void for_each_region(Visit&& visit) const { source_.for_each_region(std::forward<Visit>(visit)); }
    std::uint64_t region_generation() const noexcept { return source_.region_generation(); }

    // While the lease lives the pool gives nothing back and decommits nothing (trim, the
    // retention limit and reclaim give 0), so the regions listed keep their memory and addresses
    // (pool/pool_lease.hpp). It must end before the pool.
    pool_lease lease() noexcept { return source_.lease(); }
    // The leases held now.
    std::uint64_t leases() const noexcept { return source_.leases(); }

    Upstream& upstream() noexcept { return source_.upstream(); }
    const Upstream& upstream() const noexcept { return source_.upstream(); }

    // What the pool resolved its options to.
    std::uint64_t chunk_bytes() const noexcept { return source_.chunk_bytes(); }
    std::uint64_t pass_through_bytes() const noexcept { return pass_through_bytes_; }
    bool grows_by_commit() const noexcept { return source_.grows_by_commit(); }
    // The address space reserved once when growing by commit (0 otherwise): not memory, and not
    // in usage().held_bytes.
    std::uint64_t reserved_bytes() const noexcept { return source_.reserved_bytes(); }

private:
    using source_type = pool_detail::chunk_source<Upstream>;
    using blocks_type = pool_detail::small_blocks<source_type>;
    using spans_type = pool_detail::span_heap<source_type>;
    using caches_type = pool_detail::cached_spans<spans_type>;

    [[gnu::noinline]] result<allocation<device_type>> allocate_checked(std::uint64_t size, std::uint64_t alignment) {
        if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) [[unlikely]] {
            return pool_detail::refused_request(size, alignment);
        }
        const std::uint32_t size_class = pool_classes::class_of(size, alignment);
        if (size_class != pool_classes::not_small) [[likely]] {
            return blocks_.allocate(size_class, size, alignment);
        }
        if (size > pass_through_bytes_) {
            return spans_.allocate_segment(size, size, alignment, true);
        }
        return caches_.allocate(size, alignment);
    }

    [[gnu::noinline]] result<release_report> release_checked(const allocation<device_type>& live) {
        if (const auto code = identity_fault(live); code != status_code::ok) [[unlikely]] {
            return pool_detail::refused_release(code, live);
        }
        // The layers call back when idle memory grew (a piece released, a slab emptied), and
        // their result is returned as it is: moving a result would move its error's text too.
        const auto retain = [this]() { enforce_retention(); };
        if (pool_detail::names_span(live.allocation_id)) {
            return caches_.release(live, retain);
        }
        return blocks_.release(live, retain);
    }

    status_code identity_fault(const allocation<device_type>& live) const noexcept {
        if (live.mechanism_id != source_.mechanism_id() && source_.mechanism_known()) [[unlikely]] {
            return status_code::wrong_mechanism;
        }
        if (live.device != device_) [[unlikely]] {
            return status_code::wrong_device;
        }
        return status_code::ok;
    }

    // Beyond the retention limit, idle memory (free slabs, the committed bytes of free pieces,
    // parked pieces) goes back down to it.
    void enforce_retention() {
        if (retain_limit_bytes_ == std::numeric_limits<std::uint64_t>::max()) [[likely]] {
            return;
        }
        const std::uint64_t reclaimable = blocks_.free_bytes() + spans_.free_bytes() + caches_.parked_bytes();
        if (reclaimable > retain_limit_bytes_) {
            trim(retain_limit_bytes_);
        }
    }

    // Declared first, destroyed last: the layers above describe its memory.
    source_type source_;
    blocks_type blocks_;
    spans_type spans_;
    caches_type caches_;
    device_id device_;
    std::uint64_t pass_through_bytes_;
    std::uint64_t retain_limit_bytes_;
};

namespace pool_detail {
// Stand-ins for any upstream of a device type, to assert that a pool over one is itself a
// DeviceAllocator (declared only: never called).
template <Device D> struct upstream_archetype {
    using device_type = D;
    device_id device() const noexcept;
    result<allocation<D>> allocate(std::uint64_t size, std::uint64_t alignment);
    result<release_report> release(const allocation<D>& live);
};
} // namespace pool_detail

static_assert(assert_device_allocator<pool_allocator<pool_detail::upstream_archetype<cpu_device>>>());
static_assert(assert_device_allocator<pool_allocator<pool_detail::upstream_archetype<cuda_device>>>());
static_assert(assert_device_allocator<pool_allocator<pool_allocator<pool_detail::upstream_archetype<cuda_device>>>>(),
              "pools compose");

} // namespace nxmem
