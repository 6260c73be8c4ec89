// posix-eager: memory that is usable, and costs, from the moment it is allocated.
//   small (under mmap_threshold, 256 KiB by default,  malloc from the C heap (posix_memalign
//          aligned to at most a page)                 when aligned beyond malloc's guarantee)
//   large (everything else)                           an anonymous private mmap, over-mapped by
//                                                     the alignment and trimmed with munmap
// Copies (minor 4) are a memcpy: every byte is usable from the start.
// The path is a pure function of (size, alignment) and the threshold fixed at open, so a release
// finds it again from the kit's
// record: the mechanism keeps no per-allocation state, takes no lock of its own and counts
// nothing (the kit counts allocations and their bytes for the usage query). A small allocation
// without a budget costs what the C heap's own malloc and free cost: no locked instruction, no
// text, nothing shared with other threads.
#pragma once

#include "budget.hpp"
#include "pages.hpp"
#include "settings.hpp"

#include <nxmem/plugin.hpp>

#include <cerrno>
#include <cstddef>
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

    eager_mechanism(const eager_settings& taken, const plugin::open_context& context)
        : settings_(taken), page_(page_bytes()), small_limit_(taken.mmap_threshold),
          unbudgeted_small_limit_(taken.budget ? 0 : taken.mmap_threshold),
          budget_(taken.budget, context.host, mechanism_id, context.device, name) {}

    static result<std::unique_ptr<eager_mechanism>> open(plugin::open_context& context) {
        NXMEM_TRY(taken, eager_settings::take(context.options, name));
        return std::make_unique<eager_mechanism>(taken, context);
    }

    result<plugin::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        // One compare for "small, and no budget to charge" (the limit is 0 with a budget), one
        // for malloc's own alignment; everything else (posix_memalign included) is charged.
        if (size < unbudgeted_small_limit_ && alignment <= alignof(std::max_align_t)) [[likely]] {
            if (void* memory = std::malloc(static_cast<std::size_t>(size)); memory != nullptr) [[likely]] {
                return plugin::block{reinterpret_cast<std::uint64_t>(memory), size, size};
            }
        }
        return allocate_charged(size, alignment);
    }

    // Releases through the kit's deallocate (which forwards here) and its release_allocation.
    result<plugin::release_outcome> release_allocation(const plugin::allocation_record& record) {
        if (record.size < unbudgeted_small_limit_ && record.alignment <= page_) [[likely]] {
            std::free(reinterpret_cast<void*>(record.address));
            return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
        }
        return release_charged(record);
    }

    // Copies (minor 4): every byte of an eager allocation is usable from the start.
    result<void> copy(const plugin::allocation_record& record, const plugin::copy_job& job) {
        plugin::copy_host_memory(record.address + job.offset, job);
        return success();
    }

    // The kit counts the allocations and their blocks' bytes; everything eager costs its usable
    // size from the start (a block's size is its cost), so what is mapped is what is reserved.
    result<allocator_usage> usage(allocator_usage counted) const {
        counted.mapped_bytes = counted.reserved_bytes;
        return counted;
    }

private:
    bool is_small(std::uint64_t size, std::uint64_t alignment) const noexcept {
        return size < small_limit_ && alignment <= page_;
    }

    // malloc's own alignment covers every fundamental type (16 bytes on x86-64 glibc); beyond
    // it, posix_memalign. Both are released with free.
    static void* heap_allocate(std::uint64_t size, std::uint64_t alignment) noexcept {
        if (alignment <= alignof(std::max_align_t)) {
            return std::malloc(static_cast<std::size_t>(size));
        }
        void* memory = nullptr;
        return ::posix_memalign(&memory, static_cast<std::size_t>(alignment),
                                static_cast<std::size_t>(size)) == 0
                   ? memory
                   : nullptr;
    }

    // Everything but an unbudgeted small allocation the heap granted at once: a budget to charge
    // (asking the host to reclaim when short), a mapping, or the heap's refusal to explain.
    result<plugin::block> allocate_charged(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(cost, cost_of(size, alignment));
        if (!budget_.limited()) { // nothing to charge: no reclaim to arrange around the call
            NXMEM_TRY(address, is_small(size, alignment) ? from_heap(size, alignment) : from_mmap(cost, alignment));
            return plugin::block{address, cost, cost};
        }
        NXMEM_TRY(address, budget_.charged<std::uint64_t>(cost, [&] {
            return is_small(size, alignment) ? from_heap(size, alignment) : from_mmap(cost, alignment);
        }));
        return plugin::block{address, cost, cost};
    }

    // Everything but an unbudgeted small release: heap memory to credit, or a mapping.
    result<plugin::release_outcome> release_charged(const plugin::allocation_record& record) {
        if (is_small(record.size, record.alignment)) {
            std::free(reinterpret_cast<void*>(record.address));
            budget_.credit(record.size);
            return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
        }
        NXMEM_TRY(cost, cost_of(record.size, record.alignment)); // it was computed once already
        if (unmap(record.address, cost) != 0) {
            const int code = errno;
            return fail(status_code::internal_error,
                        std::string(name) + ": munmap failed: " + errno_text(code));
        }
        budget_.credit(cost);
        return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, cost, 0};
    }

    // What an allocation costs and reports as its usable size: the size itself from the heap,
    // whole pages from mmap.
    result<std::uint64_t> cost_of(std::uint64_t size, std::uint64_t alignment) const {
        if (is_small(size, alignment)) {
            return size;
        }
        return round_up(size, page_, name);
    }

    static result<std::uint64_t> from_heap(std::uint64_t size, std::uint64_t alignment) {
        errno = 0;
        void* memory = heap_allocate(size, alignment);
        if (memory == nullptr) {
            const int code = errno;
            return fail(status_code::out_of_memory,
                        std::string(name) + ": the C heap refused " + std::to_string(size) +
                            " bytes aligned to " + std::to_string(alignment) + ": " +
                            errno_text(code == 0 ? ENOMEM : code));
        }
        return reinterpret_cast<std::uint64_t>(memory);
    }

    result<std::uint64_t> from_mmap(std::uint64_t length, std::uint64_t alignment) {
        const bool huge = settings_.huge_pages && length >= huge_page_bytes;
        const std::uint64_t page = page_;
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

    eager_settings settings_;
    std::uint64_t page_;
    std::uint64_t small_limit_;            // mmap_threshold: the C heap below it
    std::uint64_t unbudgeted_small_limit_; // small_limit_ without a budget, else 0
    byte_budget budget_;
    std::atomic<bool> populate_supported_{true};
};

} // namespace nxmem::posix
