// posix-eager: memory that is usable, and costs, from the moment it is allocated.
//   small (under 256 KiB, aligned to at most a page)  posix_memalign from the C heap
//   large (everything else)                           an anonymous private mmap, over-mapped by
//                                                     the alignment and trimmed with munmap
// The path is a pure function of (size, alignment), so deallocate finds it again from the
// kit's record: the mechanism keeps no per-allocation state and takes no lock of its own.
#pragma once

#include "budget.hpp"
#include "pages.hpp"
#include "settings.hpp"

#include <nxmem/plugin.hpp>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

namespace nxmem::posix {

class eager_mechanism {
public:
    static constexpr const char* name = "posix-eager";
    static constexpr std::uint64_t mechanism_id = 0x504f5801; // "POX" 1
    static constexpr std::uint64_t device_types = plugin::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool uses_host_reclaim = true; // when a budget is set
    static constexpr std::uint64_t small_limit = 256 * 1024;

    eager_mechanism(const settings& taken, const plugin::open_context& context)
        : settings_(taken),
          budget_(taken.budget, context.host, mechanism_id, context.device, name) {}

    static result<std::unique_ptr<eager_mechanism>> open(plugin::open_context& context) {
        NXMEM_TRY(taken, settings::take(context.options, name));
        return std::make_unique<eager_mechanism>(taken, context);
    }

    result<plugin::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(cost, cost_of(size, alignment));
        return budget_.with_reclaim<plugin::block>(
            [&](byte_budget::refusal& refused) -> result<plugin::block> {
                if (const std::uint64_t shortfall = budget_.try_charge(cost); shortfall != 0) {
                    refused = {cost, shortfall};
                    return fail(status_code::out_of_memory, "budget");
                }
                result<std::uint64_t> address =
                    is_small(size, alignment) ? from_heap(size, alignment) : from_mmap(cost, alignment);
                if (!address) {
                    budget_.credit(cost);
                    return boost::outcome_v2::failure(address.error());
                }
                live_allocations_.fetch_add(1, std::memory_order_relaxed);
                live_bytes_.fetch_add(cost, std::memory_order_relaxed);
                return plugin::block{address.value(), cost, cost};
            });
    }

    result<void> deallocate(const plugin::allocation_record& record) {
        NXMEM_TRY(released, release_allocation(record));
        (void)released;
        return boost::outcome_v2::success();
    }

    result<plugin::release_outcome> release_allocation(const plugin::allocation_record& record) {
        NXMEM_TRY(cost, cost_of(record.size, record.alignment)); // it was computed once already
        if (is_small(record.size, record.alignment)) {
            std::free(reinterpret_cast<void*>(record.address));
        } else if (unmap(record.address, cost) != 0) {
            const int code = errno;
            return fail(status_code::internal_error,
                        std::string(name) + ": munmap failed: " + errno_text(code));
        }
        budget_.credit(cost);
        live_allocations_.fetch_sub(1, std::memory_order_relaxed);
        live_bytes_.fetch_sub(cost, std::memory_order_relaxed);
        return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, cost, 0};
    }

    // Everything eager is mapped from the start.
    result<allocator_usage> usage() const {
        const std::uint64_t bytes = live_bytes_.load(std::memory_order_relaxed);
        return allocator_usage{live_allocations_.load(std::memory_order_relaxed), bytes, bytes, 0, 0};
    }

private:
    static bool is_small(std::uint64_t size, std::uint64_t alignment) noexcept {
        return size < small_limit && alignment <= page_bytes();
    }

    // What an allocation costs and reports as its usable size: the size itself from the heap,
    // whole pages from mmap.
    static result<std::uint64_t> cost_of(std::uint64_t size, std::uint64_t alignment) {
        if (is_small(size, alignment)) {
            return size;
        }
        return round_up(size, page_bytes(), name);
    }

    static result<std::uint64_t> from_heap(std::uint64_t size, std::uint64_t alignment) {
        void* memory = nullptr;
        const std::size_t at_least = alignment < sizeof(void*) ? sizeof(void*) : alignment;
        const int code = ::posix_memalign(&memory, at_least, static_cast<std::size_t>(size));
        if (code != 0 || memory == nullptr) {
            return fail(status_code::out_of_memory,
                        std::string(name) + ": posix_memalign of " + std::to_string(size) +
                            " bytes failed: " + errno_text(code == 0 ? ENOMEM : code));
        }
        return reinterpret_cast<std::uint64_t>(memory);
    }

    result<std::uint64_t> from_mmap(std::uint64_t length, std::uint64_t alignment) {
        const bool huge = settings_.huge_pages && length >= huge_page_bytes;
        const std::uint64_t page = page_bytes();
        std::uint64_t placed = alignment < page ? page : alignment;
        if (huge && placed < huge_page_bytes) {
            placed = huge_page_bytes;
        }
        NXMEM_TRY(address, map_aligned(length, placed, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, name));
        if (huge) {
            advise_huge_pages(address, length);
        }
        if (settings_.populate) {
            if (const int code = populate_for_writing(address, length, populate_supported_);
                code != 0) {
                unmap(address, length);
                return fail(status_code::out_of_memory,
                            std::string(name) + ": populating " + std::to_string(length) +
                                " bytes failed: " + errno_text(code));
            }
        }
        return address;
    }

    settings settings_;
    byte_budget budget_;
    std::atomic<bool> populate_supported_{true};
    // Per allocator, not per module: no cache line shared by every allocator's threads.
    std::atomic<std::uint64_t> live_allocations_{0};
    std::atomic<std::uint64_t> live_bytes_{0};
};

} // namespace nxmem::posix
