// The upstream a resident pool grows from: it forwards every call to the engine's upstream and
// records, per upstream allocation, the byte ranges the pool has committed. Sleeping is then a
// walk of that record (back up, decommit) and waking its inverse (commit, restore), whatever
// layer of the pool committed the range (a chunk, an arena run, a segment, a pass-through), with
// no change to the pool. Its mutex guards the record only: it is never held across a call into
// the upstream. While a sleep or a wake walks the record, a release of an upstream allocation
// (a pass-through the engine frees) waits for the walk to finish.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/device.hpp>
#include <nxmem/pool/virtual_upstream.hpp>
#include <nxmem/residency/detail/backup_store.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <sys/mman.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace nxmem {

// "the upstream copies its memory to and from the host" (plugin_allocator does, ABI 1.4): what a
// backup of device memory needs. Host memory is copied directly.
template <class U>
concept copies_through_host = requires(U& upstream, const allocation<typename U::device_type>& live,
                                       std::uint64_t offset, std::span<std::byte> out, std::span<const std::byte> in) {
    { upstream.copy_to_host(live, offset, out) } -> std::same_as<result<void>>;
    { upstream.copy_from_host(live, offset, in) } -> std::same_as<result<void>>;
};

} // namespace nxmem

namespace nxmem::residency_detail {

// What a walk did.
struct walk_figures {
    std::uint64_t ranges = 0;
    std::uint64_t bytes = 0;                // decommitted (sleep) or committed again (wake)
    std::uint64_t backed_up_bytes = 0;      // kept in the backup (sleep)
    std::uint64_t still_resident_bytes = 0; // the upstream refused to decommit: kept, contents intact
};

template <offers_virtual_backing Upstream> class recorded_upstream {
public:
    using device_type = typename Upstream::device_type;
    using inner_backing = virtual_backing_of<Upstream>;
    static constexpr bool host_memory = std::same_as<device_type, cpu_device>;
    static constexpr bool can_back_up = host_memory || copies_through_host<Upstream>;

    template <class... Arguments>
    explicit recorded_upstream(std::in_place_t, Arguments&&... arguments) : inner_(std::forward<Arguments>(arguments)...) {}
    recorded_upstream(const recorded_upstream&) = delete;
    recorded_upstream& operator=(const recorded_upstream&) = delete;

    // Forwards with the record kept: what the pool's VirtualBacking is.
    class backing {
    public:
        using device_type = typename Upstream::device_type;
        backing(recorded_upstream& owner, inner_backing inner) : owner_(&owner), inner_(std::move(inner)) {}
        result<void> commit(const allocation<device_type>& live, byte_range range) {
            auto done = inner_.commit(live, range);
            if (done.has_value()) {
                owner_->note(live, range, true);
            }
            return done;
        }
        result<void> decommit(const allocation<device_type>& live, byte_range range) {
            auto done = inner_.decommit(live, range);
            if (done.has_value()) {
                owner_->note(live, range, false);
            }
            return done;
        }
        result<std::uint64_t> mapped_bytes(const allocation<device_type>& live) { return inner_.mapped_bytes(live); }
        std::uint64_t commit_granularity() const noexcept
            requires states_commit_granularity<inner_backing>
        {
            return inner_.commit_granularity();
        }

    private:
        recorded_upstream* owner_;
        inner_backing inner_;
    };

    device_id device() const noexcept { return inner_.device(); }

    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        auto made = inner_.allocate(size, alignment);
        if (made.has_value()) {
            try {
                std::lock_guard lock(mutex_);
                tracked_.try_emplace(device_type::to_wire(made.value().address), tracked{made.value(), {}, {}});
            } catch (const std::bad_alloc&) {
                (void)inner_.release(made.value());
                return fail(status_code::out_of_memory, "residency: the host could not record an allocation");
            }
        }
        return made;
    }

    // An allocation released while asleep drops its part of the backup; the upstream gets the
    // release once, as ever (its ranges are decommitted, not given back, while asleep).
    result<release_report> release(const allocation<device_type>& live) {
        {
            std::unique_lock lock(mutex_);
            walk_done_.wait(lock, [&] { return !walking_; });
            if (auto found = tracked_.find(device_type::to_wire(live.address)); found != tracked_.end()) {
                for (const auto& [offset, asleep] : found->second.asleep) {
                    store_.drop(asleep.slot);
                    asleep_bytes_ -= asleep.length;
                }
                tracked_.erase(found);
            }
        }
        return inner_.release(live);
    }

    result<backing> virtual_backing() const {
        auto inner = inner_.virtual_backing();
        if (!inner.has_value()) {
            return std::move(inner).error();
        }
        return backing(const_cast<recorded_upstream&>(*this), std::move(inner).value());
    }

    Upstream& inner() noexcept { return inner_; }
    const Upstream& inner() const noexcept { return inner_; }

    // Backs up (per `policy`) and decommits every committed range. The caller holds every
    // allocation out and the pool leased. All or nothing for the backup: a backup that fails
    // leaves everything committed and untouched. A range the upstream refuses to decommit stays
    // committed, its contents intact (still_resident_bytes).
    result<walk_figures> sleep(const sleep_policy& policy) {
        NXMEM_TRY(view, inner_.virtual_backing());
        NXMEM_TRY(store, backup_store::open(policy));
        std::vector<piece> pieces = begin_walk(false);
        walk_figures figures;
        for (piece& each : pieces) {
            auto slot = store.save(each.range.length, direct(each), [&](std::uint64_t at, std::span<std::byte> out) {
                return copy_out(each, at, out);
            });
            if (!slot.has_value()) {
                end_walk();
                return std::move(slot).error();
            }
            each.slot = slot.value();
        }
        {
            std::lock_guard lock(mutex_);
            store_ = std::move(store);
        }
        for (const piece& each : pieces) {
            if (auto done = view.decommit(each.memory, each.range); !done.has_value()) {
                figures.still_resident_bytes += each.range.length;
                std::lock_guard lock(mutex_);
                store_.drop(each.slot);
                continue;
            }
            std::lock_guard lock(mutex_);
            tracked& owner = tracked_.at(each.base);
            remove_range(owner.committed, each.range);
            owner.asleep.emplace(each.range.offset, asleep_range{each.range.length, each.slot});
            asleep_bytes_ += each.range.length;
            ++figures.ranges;
            figures.bytes += each.range.length;
        }
        {
            std::lock_guard lock(mutex_);
            figures.backed_up_bytes = store_.stored_bytes();
        }
        end_walk();
        return figures;
    }

    // Commits every range put to sleep and restores its backup. All or nothing: a commit the
    // upstream refuses (or a backup that cannot be read) decommits what this wake committed and
    // leaves every range asleep, its backup kept.
    result<walk_figures> wake() {
        NXMEM_TRY(view, inner_.virtual_backing());
        std::vector<piece> pieces = begin_walk(true);
        std::size_t committed = 0;
        const auto undo = [&] {
            for (std::size_t index = 0; index < committed; ++index) {
                (void)view.decommit(pieces[index].memory, pieces[index].range);
            }
            end_walk();
        };
        for (; committed < pieces.size(); ++committed) {
            const piece& each = pieces[committed];
            if (auto done = view.commit(each.memory, each.range); !done.has_value()) {
                const std::uint64_t length = each.range.length;
                undo();
                return fail(done.error().code,
                            "wake: the upstream refused to commit " + std::to_string(length) +
                                " bytes again (" + done.error().message + "); the pool stays asleep, its backup kept");
            }
        }
        for (const piece& each : pieces) {
            prefault(each);
            auto restored = store_.restore(each.slot, direct(each), [&](std::uint64_t at, std::span<const std::byte> in) {
                return copy_in(each, at, in);
            });
            if (!restored.has_value()) {
                undo();
                return fail(restored.error().code,
                            restored.error().message + "; the pool stays asleep, its backup kept");
            }
        }
        walk_figures figures;
        {
            std::lock_guard lock(mutex_);
            for (const piece& each : pieces) {
                tracked& owner = tracked_.at(each.base);
                owner.asleep.erase(each.range.offset);
                add_range(owner.committed, each.range);
                ++figures.ranges;
                figures.bytes += each.range.length;
            }
            asleep_bytes_ = 0;
            figures.backed_up_bytes = store_.stored_bytes();
            store_.clear();
        }
        end_walk();
        return figures;
    }

    // What is asleep now, and what of it is backed up where.
    struct asleep_figures {
        std::uint64_t asleep_bytes = 0;
        std::uint64_t backed_up_bytes = 0;
        sleep_policy_kind policy = sleep_policy_kind::discard;
        std::string where;
    };
    asleep_figures asleep() const {
        std::lock_guard lock(mutex_);
        return asleep_figures{asleep_bytes_, store_.stored_bytes(), store_.kind(), store_.where()};
    }
    // The bytes committed now, as the record says.
    std::uint64_t committed_bytes() const {
        std::lock_guard lock(mutex_);
        std::uint64_t bytes = 0;
        for (const auto& [base, each] : tracked_) {
            for (const auto& [offset, length] : each.committed) {
                bytes += length;
            }
        }
        return bytes;
    }

private:
    struct asleep_range {
        std::uint64_t length = 0;
        std::size_t slot = 0;
    };
    struct tracked {
        allocation<device_type> memory;
        std::map<std::uint64_t, std::uint64_t> committed; // offset -> length, disjoint, merged
        std::map<std::uint64_t, asleep_range> asleep;     // offset -> range put to sleep
    };
    struct piece {
        std::uint64_t base = 0;
        allocation<device_type> memory;
        byte_range range;
        std::size_t slot = 0;
    };

    void note(const allocation<device_type>& live, byte_range range, bool commit) {
        std::lock_guard lock(mutex_);
        auto found = tracked_.find(device_type::to_wire(live.address));
        if (found == tracked_.end()) {
            return; // not one of the pool's (the upstream would have refused it)
        }
        if (commit) {
            add_range(found->second.committed, range);
        } else {
            remove_range(found->second.committed, range);
        }
    }

    // The ranges to walk (committed ones to sleep, asleep ones to wake), with releases held off
    // until end_walk.
    std::vector<piece> begin_walk(bool asleep_ones) {
        std::lock_guard lock(mutex_);
        walking_ = true;
        std::vector<piece> pieces;
        for (const auto& [base, each] : tracked_) {
            if (asleep_ones) {
                for (const auto& [offset, range] : each.asleep) {
                    pieces.push_back(piece{base, each.memory, byte_range{offset, range.length}, range.slot});
                }
            } else {
                for (const auto& [offset, length] : each.committed) {
                    pieces.push_back(piece{base, each.memory, byte_range{offset, length}, 0});
                }
            }
        }
        return pieces;
    }
    void end_walk() {
        {
            std::lock_guard lock(mutex_);
            walking_ = false;
        }
        walk_done_.notify_all();
    }

    // Host memory about to be restored is faulted in first, in one call: the kernel fills the
    // pages about twice as fast as a copy touching them one by one (bench/residency_bench.cpp:
    // wake of 1 GiB from a file 2.7 s against 1.4 s). Best effort: an older kernel (before 5.14)
    // answers EINVAL and the copy faults them as before. Discarded ranges are left to fault in
    // when first written.
    void prefault(const piece& each) const noexcept {
        if constexpr (host_memory) {
            if (store_.keeps_contents()) {
                (void)::madvise(direct(each), static_cast<std::size_t>(each.range.length), MADV_POPULATE_WRITE);
            }
        } else {
            (void)each;
        }
    }

    static std::byte* direct(const piece& each) noexcept {
        if constexpr (host_memory) {
            return static_cast<std::byte*>(each.memory.address) + each.range.offset;
        } else {
            return nullptr;
        }
    }
    result<void> copy_out(const piece& each, std::uint64_t at, std::span<std::byte> out) {
        if constexpr (copies_through_host<Upstream>) {
            return inner_.copy_to_host(each.memory, each.range.offset + at, out);
        } else {
            (void)each, (void)at, (void)out;
            return fail(status_code::unsupported_capability, "residency: the upstream offers no copies to the host");
        }
    }
    result<void> copy_in(const piece& each, std::uint64_t at, std::span<const std::byte> in) {
        if constexpr (copies_through_host<Upstream>) {
            return inner_.copy_from_host(each.memory, each.range.offset + at, in);
        } else {
            (void)each, (void)at, (void)in;
            return fail(status_code::unsupported_capability, "residency: the upstream offers no copies from the host");
        }
    }

    static void add_range(std::map<std::uint64_t, std::uint64_t>& ranges, byte_range range) {
        std::uint64_t begin = range.offset;
        std::uint64_t end = range.offset + range.length;
        auto at = ranges.upper_bound(begin);
        if (at != ranges.begin()) {
            if (auto before = std::prev(at); before->first + before->second >= begin) {
                begin = before->first;
                end = std::max(end, before->first + before->second);
                at = ranges.erase(before);
            }
        }
        while (at != ranges.end() && at->first <= end) {
            end = std::max(end, at->first + at->second);
            at = ranges.erase(at);
        }
        ranges.emplace(begin, end - begin);
    }
    static void remove_range(std::map<std::uint64_t, std::uint64_t>& ranges, byte_range range) {
        const std::uint64_t begin = range.offset;
        const std::uint64_t end = range.offset + range.length;
        auto at = ranges.upper_bound(begin);
        if (at != ranges.begin()) {
            at = std::prev(at);
        }
        while (at != ranges.end() && at->first < end) {
            const std::uint64_t piece_begin = at->first;
            const std::uint64_t piece_end = at->first + at->second;
            if (piece_end <= begin) {
                ++at;
                continue;
            }
            at = ranges.erase(at);
            if (piece_begin < begin) {
                ranges.emplace(piece_begin, begin - piece_begin);
            }
            if (piece_end > end) {
                ranges.emplace(end, piece_end - end);
            }
        }
    }

    // Declared first, destroyed last.
    Upstream inner_;
    mutable std::mutex mutex_;
    std::condition_variable walk_done_;
    bool walking_ = false;
    std::map<std::uint64_t, tracked> tracked_; // by base address (wire)
    backup_store store_;
    std::uint64_t asleep_bytes_ = 0;
};

} // namespace nxmem::residency_detail
