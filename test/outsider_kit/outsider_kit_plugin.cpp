// Two mechanisms written from docs/PLUGINS.md and the kit's headers alone:
//   outsider-huge  host memory from mmap (MAP_HUGETLB, else madvise(MADV_HUGEPAGE)) under a
//                  `budget` option, asking the host to reclaim when it is short.
//   outsider-memfd virtual backing over a memfd per allocation, shared prefixes (memfds) and
//                  their export/import to other processes (minor 3).
#include <nxmem/plugin.hpp>

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace {

namespace kit = nxmem::plugin;
using nxmem::result;
using nxmem::status_code;

constexpr std::uint64_t huge_page = 2ull << 20;

// ---------------------------------------------------------------------------------------------
class huge_budget {
public:
    static constexpr const char* name = "outsider-huge";
    static constexpr std::uint64_t mechanism_id = 0x4F55545349444531u;
    static constexpr std::uint64_t device_types = kit::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool uses_host_reclaim = true;
    static constexpr bool retires_through_release_allocation = true;

    huge_budget(std::optional<std::uint64_t> limit, const kit::open_context& context)
        : budget_(limit, context.host, mechanism_id, context.device, name) {}

    static result<std::unique_ptr<huge_budget>> open(kit::open_context& context) {
        NXMEM_TRY_VOID(kit::serve_device_indices(context, 1));
        NXMEM_TRY(limit, context.options.take_bytes("budget"));
        return std::make_unique<huge_budget>(limit, context);
    }

    result<kit::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(length, length_of(size));
        return budget_.charged<kit::block>(length, [&]() -> result<kit::block> {
            NXMEM_TRY(address, map(length, alignment));
            return kit::block{address, length, length}; // eager: costs every page it maps
        });
    }

    result<kit::release_outcome> release_allocation(const kit::allocation_record& record) {
        const std::uint64_t length = length_of(record.size).value(); // it was mapped, so it rounds
        if (kit::unmap(record.address, length) != 0) {
            return kit::errno_failure(name, status_code::internal_error, "munmap", errno);
        }
        budget_.credit(length);
        return kit::release_outcome{NXMEM_RELEASE_COMPLETE, length, 0};
    }

    // Every block costs its size, which the kit counts as reserved bytes.
    result<nxmem::allocator_usage> usage(nxmem::allocator_usage counted) const {
        counted.mapped_bytes = counted.reserved_bytes;
        return counted;
    }

private:
    // Whole huge pages from 2 MiB up (so a MAP_HUGETLB mapping unmaps whole), else whole pages.
    static result<std::uint64_t> length_of(std::uint64_t size) {
        return kit::round_up(size, size >= huge_page ? huge_page : kit::page_bytes(), name);
    }

    static result<std::uint64_t> map(std::uint64_t length, std::uint64_t alignment) {
        constexpr int prot = PROT_READ | PROT_WRITE;
        constexpr int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
        if (length % huge_page == 0 && alignment <= huge_page) {
            // A hugetlb mapping is huge-page aligned already: nothing to trim (which munmap
            // would refuse on a hugetlb mapping anyway).
            auto huge = kit::map_aligned(length, kit::page_bytes(), prot, flags | MAP_HUGETLB, name);
            if (huge) {
                return huge;
            }
        }
        // No hugetlb pages reserved (the common case), or an alignment above the huge page:
        // ordinary pages, offered to transparent huge pages where they are large enough.
        NXMEM_TRY(address, kit::map_aligned(length, alignment, prot, flags, name));
        if (length >= huge_page) {
            ::madvise(reinterpret_cast<void*>(address), length, MADV_HUGEPAGE); // a hint: may fail
        }
        return address;
    }

    kit::byte_budget budget_;
};

// ---------------------------------------------------------------------------------------------
struct prefix {
    kit::owned_fd fd;
    std::uint64_t size = 0;   // as created (the handle's size)
    std::uint64_t length = 0; // the memfd's, whole pages
    bool read_only = false;   // imported read-only
    bool imported = false;
};

struct prefix_fields {
    std::uint64_t size;
};
using prefix_opaque = kit::opaque_record<prefix_fields>;
constexpr const char* prefix_tag = "outsider-memfd-prefix";
constexpr std::uint64_t max_imports = 1024; // ABI.md IP18: what a peer can make us import

class memfd_lazy {
public:
    static constexpr const char* name = "outsider-memfd";
    static constexpr std::uint64_t mechanism_id = 0x4F55545349444532u;
    static constexpr std::uint64_t device_types = kit::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool retires_through_release_allocation = true;

    static result<std::unique_ptr<memfd_lazy>> open(kit::open_context& context) {
        NXMEM_TRY_VOID(kit::serve_device_indices(context, 1));
        return std::make_unique<memfd_lazy>();
    }

    // Reserves: a memfd of the allocation's pages mapped shared, PROT_NONE until committed.
    result<kit::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(length, kit::round_up(size, kit::page_bytes(), name));
        NXMEM_TRY(address, kit::map_aligned(length, alignment, PROT_NONE,
                                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, name));
        auto fd = kit::create_shareable_memfd(name, length);
        if (!fd) {
            kit::unmap(address, length);
            return fd.error();
        }
        kit::owned_fd file(fd.value()); // the mapping keeps the file; the descriptor goes
        if (::mmap(reinterpret_cast<void*>(address), length, PROT_NONE, MAP_SHARED | MAP_FIXED,
                   file.get(), 0) == MAP_FAILED) {
            const int code = errno;
            kit::unmap(address, length);
            return kit::errno_failure(name, status_code::out_of_memory, "mmap of a memfd", code);
        }
        return kit::block{address, size, 0}; // a reservation costs nothing yet
    }

    result<kit::release_outcome> release_allocation(const kit::allocation_record& record) {
        // Unmapping the whole reservation also undoes a prefix mapped over its start.
        if (kit::unmap(record.address, kit::round_up(record.size, kit::page_bytes(), name).value()) != 0) {
            return kit::errno_failure(name, status_code::internal_error, "munmap", errno);
        }
        return kit::release_outcome{NXMEM_RELEASE_COMPLETE, granules_.forget(record.address), 0};
    }

    result<void> commit(const kit::allocation_record& record, nxmem::byte_range range) {
        return granules_.commit(record, range, [&](nxmem::byte_range part) -> result<void> {
            return protect(record.address + part.offset, part.length, PROT_READ | PROT_WRITE);
        });
    }

    // Frees the pages (MADV_REMOVE punches the memfd's hole; it needs a writable shared mapping).
    result<void> decommit(const kit::allocation_record& record, nxmem::byte_range range) {
        return granules_.decommit(record, range, [&](nxmem::byte_range part) -> result<void> {
            void* start = reinterpret_cast<void*>(record.address + part.offset);
            NXMEM_TRY_VOID(protect(record.address + part.offset, part.length, PROT_READ | PROT_WRITE));
            if (::madvise(start, part.length, MADV_REMOVE) != 0) {
                return kit::errno_failure(name, status_code::internal_error, "madvise(MADV_REMOVE)", errno);
            }
            return protect(record.address + part.offset, part.length, PROT_NONE);
        });
    }

    result<std::uint64_t> mapped_bytes(const kit::allocation_record& record) {
        return granules_.mapped_bytes(record.address);
    }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        auto made = std::make_shared<prefix>();
        NXMEM_TRY(length, kit::round_up(size, kit::page_bytes(), name));
        NXMEM_TRY(fd, kit::create_shareable_memfd("outsider-prefix", length));
        made->fd = kit::owned_fd(fd);
        made->size = size;
        made->length = length;
        const std::uint64_t id = prefixes_.next_id();
        prefixes_.insert(id, std::move(made));
        return id;
    }

    result<void> commit_shared_prefix(const kit::allocation_record& record, std::uint64_t prefix_id) {
        NXMEM_TRY(found, prefixes_.find(prefix_id, name));
        NXMEM_TRY_VOID(kit::check_prefix_fits(name, record.address, record.size,
                                              record.prefixes.empty() ? 0 : record.prefixes.front(),
                                              found->size));
        // Make the allocation's granule entry now (it may throw), so nothing can fail after the
        // prefix replaces the allocation's pages.
        NXMEM_TRY_VOID(granules_.commit(record, nxmem::byte_range{0, 0}));
        const int prot = found->read_only ? PROT_READ : PROT_READ | PROT_WRITE;
        if (::mmap(reinterpret_cast<void*>(record.address), found->length, prot, MAP_SHARED | MAP_FIXED,
                   found->fd.get(), 0) == MAP_FAILED) {
            const int code = errno;
            // IP17: an imported prefix the kernel refuses to map is the handle's fault.
            const bool refused = found->imported && (code == EPERM || code == EACCES);
            return kit::errno_failure(name, refused ? status_code::invalid_argument : status_code::out_of_memory,
                                      "mmap of a shared prefix", code);
        }
        granules_.map_prefix(record.address, record.size, found->size);
        return nxmem::success();
    }

    void destroy_shared_prefix(std::uint64_t prefix_id) {
        if (auto gone = prefixes_.take(prefix_id); gone && gone->imported) {
            imports_.fetch_sub(1, std::memory_order_relaxed);
        }
    }

    result<void> export_shared_prefix(std::uint64_t prefix_id, std::uint32_t access, NxmemIpcHandle& handle) {
        NXMEM_TRY(found, prefixes_.find(prefix_id, name));
        if (found->imported) {
            return kit::mechanism_failure(name, status_code::invalid_argument,
                                          "an imported prefix is exported by its owner");
        }
        NXMEM_TRY(id, kit::new_export_id());
        NXMEM_TRY_VOID(kit::seal_memfd_for_export(found->fd.get(), access));
        NXMEM_TRY(fd, kit::memfd_descriptor_for(found->fd.get(), access)); // last: nothing fails after
        prefix_opaque{prefix_opaque::tag_of(prefix_tag), id, prefix_fields{found->size}}.write_to(handle);
        handle.size = found->size;
        handle.fd_count = 1;
        handle.fds[0] = fd;
        return nxmem::success();
    }

    result<kit::imported_prefix> import_shared_prefix(const NxmemIpcHandle& handle, std::uint32_t access) {
        NXMEM_TRY(record, prefix_opaque::read_from(handle, prefix_tag, name));
        if (handle.fd_count != 1 || handle.size != record.fields.size ||
            handle.size > UINT64_MAX - kit::page_bytes()) {
            return kit::mechanism_failure(name, status_code::invalid_argument,
                                          "the handle's descriptor count or size is not its export's");
        }
        const std::uint64_t length = kit::round_up(handle.size, kit::page_bytes(), name).value();
        NXMEM_TRY_VOID(kit::check_imported_memfd(handle.fds[0], length, access, 0));
        auto made = std::make_shared<prefix>();
        NXMEM_TRY(fd, kit::imported_memfd_descriptor(handle.fds[0], access));
        made->fd = kit::owned_fd(fd);
        made->size = handle.size;
        made->length = length;
        made->read_only = access == NXMEM_IPC_READ_ONLY;
        made->imported = true;
        if (imports_.fetch_add(1, std::memory_order_relaxed) >= max_imports) {
            imports_.fetch_sub(1, std::memory_order_relaxed);
            return kit::mechanism_failure(name, status_code::busy, "1024 imported prefixes alive (IP18)");
        }
        if (auto admitted = replay_.admit(record.id, name); !admitted) {
            imports_.fetch_sub(1, std::memory_order_relaxed);
            return admitted.error();
        }
        const std::uint64_t id = prefixes_.next_id();
        try {
            prefixes_.insert(id, std::move(made));
        } catch (...) {
            replay_.forget(record.id);
            imports_.fetch_sub(1, std::memory_order_relaxed);
            throw;
        }
        return kit::imported_prefix{id, length};
    }

    result<nxmem::allocator_usage> usage(nxmem::allocator_usage counted) const {
        counted.mapped_bytes = granules_.total_mapped_bytes();
        return counted;
    }

private:
    static result<void> protect(std::uint64_t address, std::uint64_t length, int prot) {
        if (::mprotect(reinterpret_cast<void*>(address), length, prot) != 0) {
            return kit::errno_failure(name, status_code::out_of_memory, "mprotect", errno);
        }
        return nxmem::success();
    }

    kit::committed_granules granules_{kit::page_bytes()};
    kit::prefix_table<prefix> prefixes_;
    kit::replay_guard replay_;
    std::atomic<std::uint64_t> imports_{0};
};

static_assert(kit::uses_host_reclaim<huge_budget>);
static_assert(kit::offers_usage_query<huge_budget>);
static_assert(kit::offers_deferred_release<huge_budget>);
static_assert(kit::offers_virtual_backing<memfd_lazy>);
static_assert(kit::offers_shared_mapping<memfd_lazy>);
static_assert(kit::shares_prefixes<memfd_lazy>);
static_assert(kit::offers_usage_query<memfd_lazy>);

} // namespace

NXMEM_EXPORT_PLUGIN(huge_budget, memfd_lazy);
