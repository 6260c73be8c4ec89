// Upstreams for the pool's tests, each counting the calls it gets and able to refuse on demand:
// - heap_upstream (cpu): ordinary host memory, so tests can write and check patterns;
// - inaccessible_upstream (cpu): memory mapped PROT_NONE, so a pool that read or wrote what it
//   hands out would crash the test;
// - fake_device_upstream (cuda_device): addresses with no memory behind them at all;
// - committing_upstream (cpu): reserves PROT_NONE and offers a VirtualBacking (commit makes
//   pages readable and writable, decommit gives them back), as a native allocator opting in.
// Each checks that every release describes a live allocation of its own exactly.
#pragma once

#include <nxmem/pool.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

namespace nxmem::test {

// What an upstream saw, shared by its copies.
struct upstream_ledger {
    std::mutex mutex;
    std::map<std::uint64_t, allocation<cpu_device>> live_cpu;
    std::map<std::uint64_t, allocation<cuda_device>> live_device;
    std::uint64_t allocations = 0;
    std::uint64_t releases = 0;
    std::uint64_t bad_releases = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t next_id = 1;
    std::uint64_t refuse_from = UINT64_MAX; // the allocation number (1-based) from which to refuse
    std::uint64_t live_count() {
        std::lock_guard lock(mutex);
        return live_cpu.size() + live_device.size();
    }
    bool refuses_next() {
        return allocations + 1 >= refuse_from;
    }
};

inline constexpr std::uint64_t test_mechanism_id = 0x7e57;

// Host memory mapped with `protection`: an anonymous mapping aligned by over-mapping.
class mapped_upstream_base {
public:
    using device_type = cpu_device;
    explicit mapped_upstream_base(int protection)
        : ledger_(std::make_shared<upstream_ledger>()), protection_(protection) {}
    device_id device() const noexcept { return {NXMEM_DEVICE_CPU, 0}; }

    result<allocation<cpu_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        std::lock_guard lock(ledger_->mutex);
        if (ledger_->refuses_next()) {
            return fail(status_code::out_of_memory, "test upstream refuses");
        }
        const std::uint64_t page = 4096;
        const std::uint64_t align = alignment < page ? page : alignment;
        const std::uint64_t bytes = (size + page - 1) / page * page;
        void* raw = ::mmap(nullptr, bytes + align, protection_, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) {
            return fail(status_code::out_of_memory, "mmap failed");
        }
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t aligned = (start + align - 1) / align * align;
        if (aligned > start) {
            ::munmap(raw, aligned - start);
        }
        if (const std::uintptr_t tail = start + bytes + align - (aligned + bytes); tail != 0) {
            ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
        }
        ++ledger_->allocations;
        allocation<cpu_device> made{reinterpret_cast<void*>(aligned), size, alignment, ledger_->next_id++,
                                    test_mechanism_id, device()};
        ledger_->live_cpu.emplace(made.allocation_id, made);
        ledger_->live_bytes += size;
        return made;
    }
    result<release_report> release(const allocation<cpu_device>& live) {
        std::lock_guard lock(ledger_->mutex);
        auto found = ledger_->live_cpu.find(live.allocation_id);
        if (found == ledger_->live_cpu.end() || !(found->second == live)) {
            ++ledger_->bad_releases;
            return fail(status_code::unknown_allocation, "test upstream: not live");
        }
        ledger_->live_cpu.erase(found);
        ++ledger_->releases;
        ledger_->live_bytes -= live.size;
        ::munmap(live.address, (live.size + 4095) / 4096 * 4096);
        return release_report{release_state::complete, live.size, 0};
    }
    const std::shared_ptr<upstream_ledger>& ledger() const noexcept { return ledger_; }

protected:
    std::shared_ptr<upstream_ledger> ledger_;
    int protection_;
};

struct heap_upstream : mapped_upstream_base {
    heap_upstream() : mapped_upstream_base(PROT_READ | PROT_WRITE) {}
};
struct inaccessible_upstream : mapped_upstream_base {
    inaccessible_upstream() : mapped_upstream_base(PROT_NONE) {}
};

// A device the host cannot reach: addresses from a counter, nothing behind them.
class fake_device_upstream {
public:
    using device_type = cuda_device;
    fake_device_upstream() : ledger_(std::make_shared<upstream_ledger>()) {}
    device_id device() const noexcept { return {NXMEM_DEVICE_CUDA, 0}; }
    result<allocation<cuda_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        std::lock_guard lock(ledger_->mutex);
        if (ledger_->refuses_next()) {
            return fail(status_code::out_of_memory, "fake device full");
        }
        const std::uint64_t align = alignment < 256 ? 256 : alignment;
        next_address_ = (next_address_ + align - 1) / align * align;
        allocation<cuda_device> made{cuda_device::from_wire(next_address_), size, alignment,
                                     ledger_->next_id++, test_mechanism_id, device()};
        next_address_ += size;
        ++ledger_->allocations;
        ledger_->live_device.emplace(made.allocation_id, made);
        ledger_->live_bytes += size;
        return made;
    }
    result<release_report> release(const allocation<cuda_device>& live) {
        std::lock_guard lock(ledger_->mutex);
        auto found = ledger_->live_device.find(live.allocation_id);
        if (found == ledger_->live_device.end() || !(found->second == live)) {
            ++ledger_->bad_releases;
            return fail(status_code::unknown_allocation, "fake device: not live");
        }
        ledger_->live_device.erase(found);
        ++ledger_->releases;
        ledger_->live_bytes -= live.size;
        return release_report{release_state::complete, live.size, 0};
    }
    const std::shared_ptr<upstream_ledger>& ledger() const noexcept { return ledger_; }

private:
    std::shared_ptr<upstream_ledger> ledger_;
    std::uint64_t next_address_ = 0x7f0000000000ULL; // far from anything the host maps
};

// A native allocator that opts in to growth by commit: its allocations are reservations
// (PROT_NONE), its backing commits and decommits page ranges and counts the committed bytes.
struct commit_ledger {
    std::mutex mutex;
    std::uint64_t committed_bytes = 0;
    std::map<std::uint64_t, std::uint64_t> committed_by_allocation; // so a release takes its share back
    std::uint64_t commits = 0;
    std::uint64_t decommits = 0;
    std::uint64_t refuse_commits_from = UINT64_MAX;
    std::uint64_t bad_calls = 0; // a range outside the allocation, or one mprotect refused
};
class committing_backing {
public:
    using device_type = cpu_device;
    explicit committing_backing(std::shared_ptr<commit_ledger> ledger) : ledger_(std::move(ledger)) {}
    result<void> commit(const allocation<cpu_device>& live, byte_range range) {
        std::lock_guard lock(ledger_->mutex);
        if (ledger_->commits + 1 >= ledger_->refuse_commits_from) {
            return fail(status_code::out_of_memory, "commit refused");
        }
        // No Catch assertion here: pools call it from many threads.
        if (range.offset + range.length > live.size ||
            ::mprotect(static_cast<char*>(live.address) + range.offset, range.length, PROT_READ | PROT_WRITE) != 0) {
            ++ledger_->bad_calls;
            return fail(status_code::invalid_argument, "commit of a range outside the allocation");
        }
        ++ledger_->commits;
        ledger_->committed_bytes += range.length;
        ledger_->committed_by_allocation[live.allocation_id] += range.length;
        return boost::outcome_v2::success();
    }
    result<void> decommit(const allocation<cpu_device>& live, byte_range range) {
        std::lock_guard lock(ledger_->mutex);
        char* start = static_cast<char*>(live.address) + range.offset;
        if (range.offset + range.length > live.size || ::madvise(start, range.length, MADV_DONTNEED) != 0 ||
            ::mprotect(start, range.length, PROT_NONE) != 0) {
            ++ledger_->bad_calls;
            return fail(status_code::invalid_argument, "decommit of a range outside the allocation");
        }
        ++ledger_->decommits;
        ledger_->committed_bytes -= range.length;
        ledger_->committed_by_allocation[live.allocation_id] -= range.length;
        return boost::outcome_v2::success();
    }
    result<std::uint64_t> mapped_bytes(const allocation<cpu_device>&) { return ledger_->committed_bytes; }
    std::uint64_t commit_granularity() const noexcept { return 64 * 1024; }

private:
    std::shared_ptr<commit_ledger> ledger_;
};
static_assert(assert_virtual_backing<committing_backing>());

struct committing_upstream : mapped_upstream_base {
    committing_upstream() : mapped_upstream_base(PROT_NONE), commits(std::make_shared<commit_ledger>()) {}
    result<committing_backing> virtual_backing() const { return committing_backing(commits); }
    // Released, an allocation's committed pages are gone with it.
    result<release_report> release(const allocation<cpu_device>& live) {
        auto report = mapped_upstream_base::release(live);
        if (report.has_value()) {
            std::lock_guard lock(commits->mutex);
            if (auto found = commits->committed_by_allocation.find(live.allocation_id);
                found != commits->committed_by_allocation.end()) {
                commits->committed_bytes -= found->second;
                commits->committed_by_allocation.erase(found);
            }
        }
        return report;
    }
    std::shared_ptr<commit_ledger> commits;
};
static_assert(offers_virtual_backing<committing_upstream>);
static_assert(!offers_virtual_backing<heap_upstream>);

} // namespace nxmem::test
