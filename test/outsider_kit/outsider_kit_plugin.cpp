// Two mechanisms written from docs/PLUGINS.md and the kit's headers alone:
//   outsider-huge  host memory from mmap (MAP_HUGETLB, else madvise(MADV_HUGEPAGE)) under a
//                  `budget` option, asking the host to reclaim when it is short.
//   outsider-memfd virtual backing over a memfd per allocation, shared prefixes (memfds) and
//                  their export/import to other processes (minor 3), imports bounded by the
//                  options max_imports and max_imported_bytes.
// Built by hand with the command of PLUGINS.md's "Build flags" and held to `nxmem conform`
// (test/outsider_kit/meson.build); the points its first author had to guess are answered in
// PLUGINS.md now, and this file follows the answers.
#include <nxmem/plugin.hpp>

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
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

    // Eager memory: no MAP_NORESERVE, so hugetlb pages are reserved by mmap itself (or it fails)
    // rather than faulting the first touch with SIGBUS.
    static result<std::uint64_t> map(std::uint64_t length, std::uint64_t alignment) {
        constexpr int prot = PROT_READ | PROT_WRITE;
        constexpr int flags = MAP_PRIVATE | MAP_ANONYMOUS;
        if (length % huge_page == 0 && alignment <= huge_page) {
            // 2 MiB pages whatever the default size; huge-page aligned already: nothing to trim
            // (which munmap would refuse on a hugetlb mapping anyway).
            auto huge = kit::map_aligned(length, kit::page_bytes(), prot,
                                         flags | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), name);
            if (huge) {
                return huge;
            }
        }
        // No hugetlb pages reserved (the common case), or an alignment above the huge page:
        // ordinary pages, aligned so transparent huge pages fit them whole where they are large enough.
        const bool large = length >= huge_page;
        NXMEM_TRY(address, kit::map_aligned(length, large ? std::max(alignment, huge_page) : alignment,
                                            prot, flags, name));
        if (large) {
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

class memfd_lazy {
public:
    static constexpr const char* name = "outsider-memfd";
    static constexpr std::uint64_t mechanism_id = 0x4F55545349444532u;
    static constexpr std::uint64_t device_types = kit::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool retires_through_release_allocation = true;

    explicit memfd_lazy(kit::import_bounds bounds) : imports_(bounds) {}

    static result<std::unique_ptr<memfd_lazy>> open(kit::open_context& context) {
        NXMEM_TRY_VOID(kit::serve_device_indices(context, 1));
        NXMEM_TRY(bounds, kit::import_bounds::take(context.options));
        return std::make_unique<memfd_lazy>(bounds);
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
            return protect(record.address + part.offset, part.length, PROT_READ | PROT_WRITE,
                           status_code::out_of_memory);
        });
    }

    // Frees the pages: MADV_REMOVE punches the memfd's hole (its descriptor is closed; it needs a
    // writable shared mapping). A failure keeps the granules committed and counted (IP16).
    result<void> decommit(const kit::allocation_record& record, nxmem::byte_range range) {
        return granules_.decommit(record, range, [&](nxmem::byte_range part) -> result<void> {
            const std::uint64_t start = record.address + part.offset;
            NXMEM_TRY_VOID(protect(start, part.length, PROT_READ | PROT_WRITE, status_code::internal_error));
            if (::madvise(reinterpret_cast<void*>(start), part.length, MADV_REMOVE) != 0) {
                return kit::errno_failure(name, status_code::internal_error, "madvise(MADV_REMOVE)", errno);
            }
            return protect(start, part.length, PROT_NONE, status_code::internal_error);
        });
    }

    result<std::uint64_t> mapped_bytes(const kit::allocation_record& record) {
        return granules_.mapped_bytes(record.address);
    }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        NXMEM_TRY(length, kit::round_up(size, kit::page_bytes(), name));
        NXMEM_TRY(fd, kit::create_shareable_memfd("outsider-prefix", length));
        auto made = std::make_shared<prefix>(prefix{kit::owned_fd(fd), size, length}); // owns fd at once
        const std::uint64_t id = prefixes_.next_id();
        prefixes_.insert(id, std::move(made));
        return id;
    }

    result<void> commit_shared_prefix(const kit::allocation_record& record, std::uint64_t prefix_id) {
        NXMEM_TRY(found, prefixes_.find(prefix_id, name));
        NXMEM_TRY_VOID(kit::check_prefix_fits(name, record.address, record.size,
                                              record.prefixes.empty() ? 0 : record.prefixes.front(),
                                              found->size));
        // IP17: a read-write import whose exporter sealed it against writes since is refused
        // before anything changes (the mmap would fail with EPERM). A created prefix never is.
        if (!found->read_only && (::fcntl(found->fd.get(), F_GET_SEALS) & kit::memfd_write_seals) != 0) {
            return kit::mechanism_failure(name, status_code::invalid_argument, "the prefix is sealed against writes");
        }
        granules_.make_entry(record.address, record.size); // may throw: before anything is undone
        // The allocation's own pages under the prefix leave its file first: once the prefix is
        // mapped over them, nothing could reach them to free them.
        NXMEM_TRY_VOID(decommit(record, nxmem::byte_range{0, std::min(found->length, record.size)}));
        const int prot = found->read_only ? PROT_READ : PROT_READ | PROT_WRITE;
        void* at = reinterpret_cast<void*>(record.address);
        if (::mmap(at, found->length, prot, MAP_SHARED | MAP_FIXED, found->fd.get(), 0) == MAP_FAILED) {
            const int code = errno;
            // The kernel may have unmapped the range already: reserve it again, uncommitted.
            ::mmap(at, found->length, PROT_NONE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            const bool refused = code == EPERM || code == EACCES; // IP17: the file's, not memory's
            return kit::errno_failure(name, refused ? status_code::invalid_argument : status_code::out_of_memory,
                                      "mmap of a shared prefix", code);
        }
        granules_.map_prefix(record.address, record.size, found->size);
        return nxmem::success();
    }

    void destroy_shared_prefix(std::uint64_t prefix_id) {
        if (auto gone = prefixes_.take(prefix_id); gone && gone->imported) {
            imports_.release(gone->length);
        }
    }

    // An imported prefix may be exported again (its seals are final already), read-only when it
    // was imported read-only (IP5).
    result<void> export_shared_prefix(std::uint64_t prefix_id, std::uint32_t access, NxmemIpcHandle& handle) {
        NXMEM_TRY(found, prefixes_.find(prefix_id, name));
        if (found->read_only && access == NXMEM_IPC_READ_WRITE) {
            return kit::mechanism_failure(name, status_code::invalid_argument,
                                          "a prefix imported read-only is exported read-only");
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
        NXMEM_TRY_VOID(replay_.admit(record.id, name));
        if (auto room = imports_.reserve(length, name); !room) { // IP18, in whole pages as mapped
            replay_.forget(record.id); // not consumed: it imports once there is room
            return room.error();
        }
        bool kept = false; // until then every way out (a failure, a throw) undoes both steps above
        const std::shared_ptr<void> undo(nullptr, [&](void*) {
            if (!kept) {
                imports_.release(length);
                replay_.forget(record.id);
            }
        });
        NXMEM_TRY(fd, kit::imported_memfd_descriptor(handle.fds[0], access));
        auto made = std::make_shared<prefix>(
            prefix{kit::owned_fd(fd), handle.size, length, access == NXMEM_IPC_READ_ONLY, true});
        const std::uint64_t id = prefixes_.next_id();
        prefixes_.insert(id, std::move(made));
        kept = true;
        return kit::imported_prefix{id, length}; // it maps whole pages: what imported_bytes counts
    }

    result<nxmem::allocator_usage> usage(nxmem::allocator_usage counted) const {
        counted.mapped_bytes = granules_.total_mapped_bytes();
        return counted;
    }

private:
    // A commit's failure is OUT_OF_MEMORY (the kernel's map count or memory), a decommit's
    // INTERNAL_ERROR.
    static result<void> protect(std::uint64_t address, std::uint64_t length, int prot, status_code code) {
        if (::mprotect(reinterpret_cast<void*>(address), length, prot) != 0) {
            return kit::errno_failure(name, code, "mprotect", errno);
        }
        return nxmem::success();
    }

    kit::committed_granules granules_{kit::page_bytes()};
    kit::prefix_table<prefix> prefixes_;
    kit::replay_guard replay_;
    kit::import_limits imports_;
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
