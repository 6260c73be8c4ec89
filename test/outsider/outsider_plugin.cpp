// An outside author's plugin, written only against the public headers and the recipes of
// docs/PLUGINS.md, and built by hand with the flags it documents (test/outsider/meson.build).
// Two mechanisms:
//   outsider-arena  eager: first fit over one region mapped at open; structured release, usage
//   outsider-lazy   virtual backing over a PROT_NONE reservation, a memfd-backed shared prefix,
//                   deferred release
// Both serve cpu:0 only. The kit's blocks carry what every mechanism repeats; see PLUGINS.md
// "Building blocks".
#include <nxmem/plugin.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace {

using nxmem::allocator_usage;
using nxmem::byte_range;
using nxmem::result;
using nxmem::status_code;
using nxmem::plugin::allocation_record;
using nxmem::plugin::block;
using nxmem::plugin::errno_failure;
using nxmem::plugin::mechanism_failure;
using nxmem::plugin::open_context;
using nxmem::plugin::release_outcome;

const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t unit) { return (bytes + unit - 1) / unit * unit; }

// Eager: one region of `capacity` bytes (option, default 64M) mapped at open; allocations are
// page-rounded runs of it, found first fit in a free list keyed by offset.
class arena_mechanism {
public:
    static constexpr const char* name = "outsider-arena";
    static constexpr std::uint64_t mechanism_id = 0x0A7E4A;
    static constexpr std::uint64_t device_types = nxmem::plugin::device_bit(NXMEM_DEVICE_CPU);

    static result<std::unique_ptr<arena_mechanism>> open(open_context& context) {
        NXMEM_TRY_VOID(nxmem::plugin::serve_device_indices(context, 1));
        NXMEM_TRY(capacity, context.options.take_bytes("capacity"));
        const std::uint64_t bytes = round_up(capacity.value_or(64ull << 20), page);
        void* region = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) {
            return errno_failure(name, status_code::out_of_memory, "mapping the arena", errno);
        }
        return std::make_unique<arena_mechanism>(reinterpret_cast<std::uint64_t>(region), bytes);
    }
    arena_mechanism(std::uint64_t base, std::uint64_t bytes) : base_(base), bytes_(bytes) {
        free_[0] = bytes;
    }
    ~arena_mechanism() { ::munmap(reinterpret_cast<void*>(base_), bytes_); }

    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t length = round_up(size, page);
        std::lock_guard lock(mutex_);
        for (auto run = free_.begin(); run != free_.end(); ++run) {
            const std::uint64_t start = round_up(base_ + run->first, alignment) - base_;
            if (start < run->first || start - run->first + length > run->second) {
                continue;
            }
            const auto [offset, room] = *run;
            free_.erase(run);
            if (start > offset) {
                free_[offset] = start - offset;
            }
            if (offset + room > start + length) {
                free_[start + length] = offset + room - start - length;
            }
            used_ += length;
            return block{base_ + start, length, length}; // eager: it holds its whole pages (Q17)
        }
        return exhausted(size, alignment);
    }

    result<release_outcome> release_allocation(const allocation_record& record) {
        std::uint64_t offset = record.address - base_;
        std::uint64_t length = round_up(record.size, page);
        std::lock_guard lock(mutex_);
        used_ -= length;
        const std::uint64_t credited = length;
        if (auto next = free_.find(offset + length); next != free_.end()) {
            length += next->second;
            free_.erase(next);
        }
        if (auto after = free_.lower_bound(offset); after != free_.begin()) {
            if (auto before = std::prev(after); before->first + before->second == offset) {
                offset = before->first;
                length += before->second;
            }
        }
        free_[offset] = length;
        return release_outcome{NXMEM_RELEASE_COMPLETE, credited, 0};
    }

    result<allocator_usage> usage(allocator_usage counted) {
        std::lock_guard lock(mutex_);
        counted.reserved_bytes = counted.mapped_bytes = used_;
        return counted;
    }

private:
    [[gnu::cold]] nxmem::failure exhausted(std::uint64_t size, std::uint64_t alignment) const {
        return mechanism_failure(name, status_code::out_of_memory,
                                 "no free run of " + std::to_string(size) + " bytes at alignment " +
                                     std::to_string(alignment) + " in " + std::to_string(bytes_));
    }

    std::mutex mutex_;
    const std::uint64_t base_;
    const std::uint64_t bytes_;
    std::uint64_t used_ = 0;
    std::map<std::uint64_t, std::uint64_t> free_; // offset -> length
};

// Lazy: a PROT_NONE reservation per allocation, committed page by page; shared prefixes are
// memfds mapped over an allocation's first pages; queued releases retire at the next drain.
class lazy_mechanism {
public:
    static constexpr const char* name = "outsider-lazy";
    static constexpr std::uint64_t mechanism_id = 0x0A7E4B;
    static constexpr std::uint64_t device_types = nxmem::plugin::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool retires_through_release_allocation = true;

    static result<std::unique_ptr<lazy_mechanism>> open(open_context& context) {
        NXMEM_TRY_VOID(nxmem::plugin::serve_device_indices(context, 1));
        return std::make_unique<lazy_mechanism>();
    }
    ~lazy_mechanism() {
        for (const auto& [id, prefix] : prefixes_) {
            ::close(prefix.fd);
        }
    }

    // Reserves `alignment` more than needed when above a page, and gives back the slack around
    // the aligned start.
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        if (alignment > (1ull << 30)) {
            return mechanism_failure(name, status_code::out_of_memory, "alignments above 1 GiB");
        }
        const std::uint64_t length = round_up(size, page);
        const std::uint64_t slack = alignment > page ? alignment : 0;
        void* reserved = ::mmap(nullptr, length + slack, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (reserved == MAP_FAILED) {
            return errno_failure(name, status_code::out_of_memory, "reserving address space", errno);
        }
        const auto first = reinterpret_cast<std::uint64_t>(reserved);
        const std::uint64_t start = slack == 0 ? first : round_up(first, alignment);
        if (start > first) {
            ::munmap(reserved, start - first);
        }
        if (first + slack > start) {
            ::munmap(reinterpret_cast<void*>(start + length), first + slack - start);
        }
        std::lock_guard lock(mutex_);
        reserved_ += length;
        return block{start, length, 0};
    }

    // The prefix's mapping goes with the reservation; the kit drops the mapping's reference.
    result<release_outcome> release_allocation(const allocation_record& record) {
        const std::uint64_t length = round_up(record.size, page);
        if (::munmap(reinterpret_cast<void*>(record.address), length) != 0) {
            return errno_failure(name, status_code::internal_error, "unmapping", errno);
        }
        std::lock_guard lock(mutex_);
        reserved_ -= length;
        return release_outcome{NXMEM_RELEASE_COMPLETE, granules_.forget(record.address), 0};
    }

    result<void> commit(const allocation_record& record, byte_range range) {
        return granules_.commit(record, range, [&](byte_range part) {
            return remap(record, part, PROT_READ | PROT_WRITE, "committing");
        });
    }
    result<void> decommit(const allocation_record& record, byte_range range) {
        return granules_.decommit(record, range, [&](byte_range part) {
            return remap(record, part, PROT_NONE, "decommitting"); // fresh pages: the old are gone
        });
    }
    result<std::uint64_t> mapped_bytes(const allocation_record& record) {
        return granules_.mapped_bytes(record.address);
    }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        const int fd = ::memfd_create("outsider-prefix", MFD_CLOEXEC);
        if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(round_up(size, page))) != 0) {
            const int error = errno;
            if (fd >= 0) {
                ::close(fd);
            }
            return errno_failure(name, status_code::out_of_memory, "making a prefix memfd", error);
        }
        std::lock_guard lock(mutex_);
        prefixes_[++last_prefix_id_] = {fd, size};
        return last_prefix_id_;
    }
    // The kit answers shared_bytes, newly_mapped_bytes and sharers (ABI.md C8).
    result<void> commit_shared_prefix(const allocation_record& record, std::uint64_t prefix_id) {
        if (!record.prefixes.empty()) {
            return mechanism_failure(name, status_code::invalid_argument, "one prefix per allocation");
        }
        std::unique_lock lock(mutex_);
        const shared_prefix prefix = prefixes_.at(prefix_id); // the kit checked it is live
        lock.unlock();
        const std::uint64_t length = round_up(prefix.size, page);
        if (::mmap(reinterpret_cast<void*>(record.address), length, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, prefix.fd, 0) == MAP_FAILED) {
            return errno_failure(name, status_code::out_of_memory, "mapping a prefix", errno);
        }
        (void)granules_.map_prefix(record.address, record.size, prefix.size);
        return nxmem::success();
    }
    void destroy_shared_prefix(std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        ::close(prefixes_.at(prefix_id).fd);
        prefixes_.erase(prefix_id);
    }

    result<allocator_usage> usage(allocator_usage counted) {
        counted.mapped_bytes = granules_.total_mapped_bytes();
        std::lock_guard lock(mutex_);
        counted.reserved_bytes = reserved_;
        return counted;
    }

private:
    struct shared_prefix {
        int fd = -1;
        std::uint64_t size = 0;
    };

    result<void> remap(const allocation_record& record, byte_range part, int protection, const char* what) {
        void* at = reinterpret_cast<void*>(record.address + part.offset);
        if (::mmap(at, part.length, protection, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
            return errno_failure(name, status_code::out_of_memory, what, errno);
        }
        return nxmem::success();
    }

    nxmem::plugin::committed_granules granules_{page};
    std::mutex mutex_;
    std::uint64_t reserved_ = 0;
    std::map<std::uint64_t, shared_prefix> prefixes_;
    std::uint64_t last_prefix_id_ = 0;
};

static_assert(nxmem::plugin::offers_structured_release<arena_mechanism>);
static_assert(nxmem::plugin::offers_usage_query<arena_mechanism>);
static_assert(nxmem::plugin::offers_virtual_backing<lazy_mechanism>);
static_assert(nxmem::plugin::offers_shared_mapping<lazy_mechanism>);
static_assert(nxmem::plugin::offers_deferred_release<lazy_mechanism>);

} // namespace

NXMEM_EXPORT_PLUGIN(arena_mechanism, lazy_mechanism);
