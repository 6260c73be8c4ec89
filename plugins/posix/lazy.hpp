// posix-lazy: address space reserved at allocation, memory committed page range by page range,
// and shared prefixes backed by memfds mapped over the start of many allocations.
//
//   allocate              mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), page-rounded,
//                         aligned as asked (at least to a page); costs no memory. With
//                         commit=allocate: mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS)
//                         instead, the whole allocation committed and charged at once
//                         (+ MADV_POPULATE_WRITE with populate=1)
//   commit                mprotect(PROT_READ|PROT_WRITE) per run of uncommitted pages in the range
//                         (+ MADV_POPULATE_WRITE with populate=1)
//   decommit              mmap(PROT_NONE, MAP_FIXED|MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)
//                         per committed run: one call that drops the pages and reserves the
//                         range again (+ MADV_HUGEPAGE again with huge_pages=1); should it fail,
//                         madvise(MADV_DONTNEED) + mprotect(PROT_NONE)
//   create_shared_prefix  memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING) + ftruncate to whole pages
//   export (prefix)       seal the memfd's size and make its seals final (no peer can add one),
//                         hand over a new descriptor of it (read-only: reopened O_RDONLY, file
//                         mode 0400); a random 16-byte export id in the opaque bytes
//   import (prefix)       the descriptor checked, seals before size (a memfd, size sealed, not
//                         write-sealed for a read-write import, the claimed size, the handle's
//                         access; ../include/nxmem/plugin/memfd_share.hpp), the import limits
//                         (max_imports, max_imported_bytes), the export id never imported by this
//                         allocator before, then dup'd as a local prefix (reopened O_RDONLY for a
//                         read-only import of a read-write handle)
//   commit_shared_prefix  mmap(MAP_SHARED|MAP_FIXED, fd) over the allocation's first pages
//   release               munmap of the whole reservation (prefix mapping included)
//   copy (minor 4)        memcpy under the reservation's lock, every page touched committed (or
//                         the prefix's); a prefix's copy is pread/pwrite on its memfd
//   fenced release        the kit's: a queued release waits for the host's timelines, then munmap
//
// With share=memfd each allocation is a memfd instead, so it can be exported (ABI.md IP14):
//   allocate              memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING) + ftruncate to the whole
//                         pages, mmap(MAP_SHARED|MAP_FIXED, fd) PROT_NONE over an aligned
//                         reservation (PROT_READ|PROT_WRITE with commit=allocate)
//   commit                mprotect(PROT_READ|PROT_WRITE), as above
//   decommit              fallocate(FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE) frees the pages
//                         (MADV_DONTNEED would not: shmem pages belong to the file) +
//                         mprotect(PROT_NONE); a hole the file refuses is reported, the pages
//                         still committed and counted
//   release               munmap + close: the file lives on only in importers' mappings
//   export (allocation)   as a prefix's: the memfd's size sealed, a new descriptor of it, an
//                         export id; refused while a shared prefix is mapped over the allocation
//                         (the file does not hold the prefix's bytes: export the prefix)
//   import (allocation)   the descriptor checked as a prefix's, then the whole file mapped
//                         MAP_SHARED (read-only imports through a read-only descriptor); the
//                         mapping keeps the file, no descriptor is kept; close_import munmaps it
//
// Ranges: the offset is page-aligned and the length a page multiple, or it reaches the end of the
// allocation (the last page may be partial). Anything else is INVALID_ARGUMENT and changes
// nothing. Committing committed pages and decommitting uncommitted ones are successful no-ops.
//
// Accounting: mapped_bytes counts the allocation's committed private pages (the partial last
// page by its bytes within the allocation). A shared prefix is costed once, at the prefix level:
// its whole pages are newly_mapped_bytes of its first mapping and never part of any allocation's
// mapped_bytes. Pages under a mapped prefix belong to the prefix: commit and decommit leave them
// alone, and mapping a prefix over committed private pages uncommits them. An imported allocation
// is no allocation here: its whole pages are imported bytes, charged to no budget.
//
// Threads: reservations live in a table sharded by address (open addressing: no node per
// allocation); each has its own mutex, so calls on different allocations share no lock beyond a
// shard's, held only for a lookup. The budget and the committed bytes are atomic counters; the
// kit counts the allocations, their reserved bytes and the imports for the usage query.
#pragma once

#include "budget.hpp"
#include "page_runs.hpp"
#include "pages.hpp"
#include "prefix_table.hpp"
#include "retire_now.hpp"
#include "settings.hpp"

#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/plugin.hpp>
#include <nxmem/plugin/memfd_share.hpp>

#include <sys/random.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <array>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace nxmem::posix {

class lazy_mechanism {
public:
    static constexpr const char* name = "posix-lazy";
    static constexpr std::uint64_t mechanism_id = 0x504f5802; // "POX" 2
    static constexpr std::uint64_t device_types = plugin::device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool uses_host_reclaim = true; // when a budget is set
    // Fenced release (minor 4): the kit waits on the host's timelines; retire is munmap.
    static constexpr bool accepts_host_timeline_fences = true;

    lazy_mechanism(const lazy_settings& taken, const plugin::open_context& context)
        : settings_(taken),
          budget_(taken.budget, context.host, mechanism_id, context.device, name) {}

    lazy_mechanism(const lazy_mechanism&) = delete;
    lazy_mechanism& operator=(const lazy_mechanism&) = delete;

    // The kit hands every live allocation and prefix back before the mechanism goes; this is
    // only a backstop.
    ~lazy_mechanism() {
        reservations_.take_each([](std::uint64_t, std::shared_ptr<reservation>&& held) {
            unmap(held->address, held->length);
            if (held->fd >= 0) {
                ::close(held->fd);
            }
        });
        prefixes_.for_each([](const prefix_file& held) { ::close(held.fd); });
    }

    static result<std::unique_ptr<lazy_mechanism>> open(plugin::open_context& context) {
        NXMEM_TRY(taken, lazy_settings::take(context.options, name));
        return std::make_unique<lazy_mechanism>(taken, context);
    }

    // ---- allocation ----

    result<plugin::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t page = page_bytes();
        NXMEM_TRY(length, round_up(size, page, name));
        const bool huge = settings_.huge_pages && length >= huge_page_bytes;
        std::uint64_t placed = alignment < page ? page : alignment;
        if (huge && placed < huge_page_bytes) {
            placed = huge_page_bytes;
        }
        if (settings_.commit_at_allocate) {
            // Committed whole: charged (asking the host to reclaim when short) and mapped usable.
            return budget_.charged<plugin::block>(size, [&] { return map_committed(size, length, placed, huge); });
        }
        NXMEM_TRY(memory, map_backing(length, placed, PROT_NONE));
        if (huge) {
            advise_huge_pages(memory.address, length);
        }
        record_reservation(memory, size, length, 0);
        return plugin::block{memory.address, size, 0};
    }

    // COMPLETE with unmapped_bytes = the committed private bytes (the prefix is costed apart).
    result<plugin::release_outcome> release_allocation(const plugin::allocation_record& record) {
        NXMEM_TRY(held, take(record));
        std::unique_lock lock(held->mutex);
        if (unmap(held->address, held->length) != 0) {
            const int code = errno;
            lock.unlock();
            put_back(held); // nothing changed
            return fail(status_code::internal_error,
                        std::string(name) + ": munmap failed: " + errno_text(code));
        }
        held->released = true;
        if (held->fd >= 0) {
            ::close(held->fd); // importers' mappings keep the file
        }
        const std::uint64_t unmapped = held->committed_bytes;
        budget_.credit(unmapped);
        mapped_bytes_.fetch_sub(unmapped, std::memory_order_relaxed);
        if (held->prefix) {
            held->prefix->sharers.fetch_sub(1, std::memory_order_relaxed);
        }
        return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, unmapped, 0};
    }

    // Deferred release retires at once: munmap does not wait for anything.
    result<std::optional<plugin::release_outcome>> retire(const plugin::allocation_record& record) {
        return retired_now(release_allocation(record));
    }

    // ---- virtual backing ----

    // Whole pages; with huge pages, whole huge pages, so a commit never splits one.
    std::uint64_t commit_granularity() const noexcept {
        return settings_.huge_pages ? huge_page_bytes : page_bytes();
    }

    result<void> commit(const plugin::allocation_record& record, byte_range range) {
        NXMEM_TRY(pages, pages_of(record, range));
        NXMEM_TRY(held, find(record));
        return budget_.with_reclaim<void>([&](byte_budget::refusal& refused) -> result<void> {
            std::lock_guard lock(held->mutex);
            NXMEM_TRY_VOID(check_live(*held));
            const std::uint64_t first = std::max(pages.first, held->prefix_pages);
            if (first >= pages.second) {
                return boost::outcome_v2::success(); // all under the prefix
            }
            std::uint64_t wanted = 0;
            held->committed.for_each_gap(first, pages.second, [&](const page_run& gap) {
                wanted += held->bytes_of(gap);
                return true;
            });
            if (wanted == 0) {
                return boost::outcome_v2::success(); // committed already: costs nothing more
            }
            NXMEM_TRY_VOID(budget_.charge(wanted, refused));
            return commit_gaps(*held, page_run{first, pages.second}, wanted);
        });
    }

    result<void> decommit(const plugin::allocation_record& record, byte_range range) {
        NXMEM_TRY(pages, pages_of(record, range));
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        const std::uint64_t first = std::max(pages.first, held->prefix_pages);
        if (first >= pages.second) {
            return boost::outcome_v2::success();
        }
        const std::uint64_t page = page_bytes();
        // The runs are uncommitted in the table once the calls are made (the walk must not change
        // what it walks): up to the end, or up to the run whose call failed.
        std::uint64_t done = pages.second;
        std::uint64_t bytes = 0; // of the runs decommitted
        int failed = 0;
        std::uint64_t failed_length = 0;
        const char* failed_call = nullptr;
        held->committed.for_each_committed(first, pages.second, [&](const page_run& run) {
            const std::uint64_t at = held->address + run.first * page;
            const std::uint64_t length = (run.second - run.first) * page;
            // Private memory: one mmap frees the pages and reserves the range again. A memfd's
            // pages (or private ones the kernel would not remap) go back first: a hole the file
            // refuses (a seal against writes) leaves them committed, readable and counted, and
            // is reported (IP16); if the protection change then fails (the kernel's map count),
            // they stay committed, zero-filled, and the failure is reported.
            const bool reserved_again = held->fd < 0 && reserve_again(at, length);
            if (!reserved_again) {
                if (const int code = discard(*held, at, length); code != 0) {
                    failed = code;
                    failed_call = "fallocate(PUNCH_HOLE)";
                    failed_length = length;
                    done = run.first;
                    return false;
                }
                if (::mprotect(reinterpret_cast<void*>(at), static_cast<std::size_t>(length),
                               PROT_NONE) != 0) {
                    failed = errno;
                    failed_call = "mprotect(PROT_NONE)";
                    failed_length = length;
                    done = run.first;
                    return false;
                }
            }
            bytes += held->bytes_of(run);
            return true;
        });
        forget(*held, page_run{first, done}, bytes);
        if (failed != 0) [[unlikely]] {
            return boost::outcome_v2::failure(decommit_failed(failed_call, failed_length, failed));
        }
        return boost::outcome_v2::success();
    }

    [[gnu::cold, gnu::noinline]] static error decommit_failed(const char* call, std::uint64_t length,
                                                             int code) {
        const bool punched = call[0] == 'f';
        return error{status_code::internal_error,
                     std::string(name) + ": " + call + " of " + std::to_string(length) +
                         " bytes failed: " + errno_text(code) +
                         (punched ? "; those pages were not freed and stay committed (the "
                                    "allocation's file refuses holes: it is sealed against writes)"
                                  : "; those pages were emptied but stay committed")};
    }

    // ---- copies (minor 4) ----

    // Whether every page `range` touches is committed, or the mapped prefix's (CP2).
    bool range_committed(const plugin::allocation_record& record, byte_range range) {
        result<std::shared_ptr<reservation>> held = find(record);
        if (!held) {
            return false;
        }
        std::lock_guard lock(held.value()->mutex);
        return !held.value()->released && all_committed(*held.value(), pages_touched(range));
    }

    // A memcpy under the reservation's lock, so no decommit empties the pages meanwhile; into a
    // read-only imported prefix's pages nothing is copied (they are mapped PROT_READ).
    result<void> copy(const plugin::allocation_record& record, const plugin::copy_job& job) {
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        const page_run pages = pages_touched({job.offset, job.length});
        if (!all_committed(*held, pages)) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": the copy's pages are not all committed");
        }
        if (job.direction == NXMEM_COPY_FROM_HOST && held->prefix != nullptr &&
            held->prefix->read_only && pages.first < held->prefix_pages) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": the copy writes into a prefix imported read-only");
        }
        plugin::copy_host_memory(held->address + job.offset, job);
        return success();
    }

    // A prefix is its memfd: read or written with pread and pwrite, wherever it is mapped.
    result<void> copy_prefix(std::uint64_t prefix_id, const plugin::copy_job& job) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        auto* buffer = static_cast<unsigned char*>(job.host_buffer);
        std::uint64_t done = 0;
        while (done < job.length) {
            const auto left = static_cast<std::size_t>(job.length - done);
            const auto at = static_cast<off_t>(job.offset + done);
            const ssize_t moved = job.direction == NXMEM_COPY_TO_HOST
                                      ? ::pread(shared->fd, buffer + done, left, at)
                                      : ::pwrite(shared->fd, buffer + done, left, at);
            if (moved <= 0) {
                const int code = moved == 0 ? EIO : errno;
                if (code == EINTR) {
                    continue;
                }
                return fail(status_code::internal_error,
                            std::string(name) + ": copying shared prefix " + std::to_string(prefix_id) +
                                " failed after " + std::to_string(done) + " bytes: " + errno_text(code));
            }
            done += static_cast<std::uint64_t>(moved);
        }
        return success();
    }

    result<std::uint64_t> mapped_bytes(const plugin::allocation_record& record) {
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        return held->committed_bytes;
    }

    // ---- usage query ----

    // The kit counts the allocations, their reserved bytes and the imports with their bytes.
    // The committed bytes are an atomic total kept here; a prefix costs its whole pages, as its
    // first commit_shared_prefix reports (the kit would round to the commit granularity, a huge
    // page with huge_pages=1).
    result<allocator_usage> usage(allocator_usage counted) {
        counted.mapped_bytes = mapped_bytes_.load(std::memory_order_relaxed);
        counted.shared_prefix_bytes = 0;
        prefixes_.for_each([&counted](const prefix_file& held) {
            if (!held.imported) { // an imported prefix's pages are the kit's imported bytes
                counted.shared_prefix_bytes += held.length;
            }
        });
        return counted;
    }

    // ---- shared mapping ----

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        NXMEM_TRY(length, round_up(size, page_bytes(), name));
        return budget_.charged<std::uint64_t>(length, [&] { return make_prefix(size, length); });
    }

    result<prefix_commit> commit_shared_prefix(const plugin::allocation_record& record,
                                               std::uint64_t prefix_id) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        NXMEM_TRY_VOID(check_prefix_fits(name, held->address, held->size,
                                         held->prefix ? held->prefix->id : 0, shared->size));
        const int protection = shared->read_only ? PROT_READ : PROT_READ | PROT_WRITE;
        void* mapped = ::mmap(reinterpret_cast<void*>(held->address),
                              static_cast<std::size_t>(shared->length), protection,
                              MAP_SHARED | MAP_FIXED, shared->fd, 0);
        if (mapped == MAP_FAILED) {
            const int code = errno;
            restore_reserved(*held, shared->length);
            // An imported prefix whose exporter sealed it against writes since (EPERM), or whose
            // file this process may not map so (EACCES), is no shortage of memory (IP17).
            const bool refused_by_file = code == EPERM || code == EACCES;
            return fail(refused_by_file ? status_code::invalid_argument : status_code::out_of_memory,
                        std::string(name) + ": mapping shared prefix " + std::to_string(prefix_id) +
                            " failed: " + errno_text(code));
        }
        if (settings_.populate && !shared->read_only) {
            (void)populate_for_writing(held->address, shared->length, populate_supported_);
        }
        // The private pages the prefix now covers are gone (a memfd's stay in the file: freed).
        const std::uint64_t prefix_pages = shared->length / page_bytes();
        if (held->fd >= 0) {
            punch_hole(held->fd, 0, shared->length);
        }
        uncommit(*held, page_run{0, prefix_pages});
        held->prefix = shared;
        held->prefix_pages = prefix_pages;
        const std::uint64_t sharers = shared->sharers.fetch_add(1, std::memory_order_relaxed) + 1;
        // An imported prefix is never costed here: its bytes are the exporter's (imported bytes).
        const bool first = !shared->ever_mapped.exchange(true, std::memory_order_relaxed);
        return prefix_commit{shared->size, first && !shared->imported ? shared->length : 0,
                             sharers}; // C8: whole pages
    }

    void destroy_shared_prefix(std::uint64_t prefix_id) {
        const std::shared_ptr<prefix_file> gone = prefixes_.take(prefix_id);
        if (!gone) {
            return;
        }
        ::close(gone->fd);
        if (!gone->imported) {
            budget_.credit(gone->length); // an import was never charged
        } else {
            release_import(gone->length);
        }
    }

    // ---- sharing across processes ----

    // The opaque bytes of a posix-lazy handle: a tag (one per kind), the export's random id, and
    // the exported size exactly (a size altered within the last page would fit the file too).
    struct handle_opaque {
        std::array<char, 8> tag;
        std::array<std::uint8_t, 16> export_id;
        std::uint64_t size;
    };
    // What an import learnt from a handle it accepted.
    struct checked_export {
        std::array<std::uint8_t, 16> export_id;
        std::uint64_t length; // the file's: the size in whole pages
    };
    static constexpr std::array<char, 8> prefix_tag{'N', 'X', 'P', 'O', 'S', 'I', 'X', '1'};
    static constexpr std::array<char, 8> allocation_tag{'N', 'X', 'P', 'O', 'S', 'I', 'X', 'A'};

    result<void> export_shared_prefix(std::uint64_t prefix_id, std::uint32_t access,
                                      NxmemIpcHandle& handle) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        if (shared->read_only && access == NXMEM_IPC_READ_WRITE) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": prefix " + std::to_string(prefix_id) +
                            " was imported read-only and cannot be exported read-write");
        }
        handle.size = shared->size;
        return write_export(shared->fd, shared->size, access, prefix_tag, handle);
    }

    result<plugin::imported_prefix> import_shared_prefix(const NxmemIpcHandle& handle,
                                                         std::uint32_t access) {
        NXMEM_TRY(checked, check_export(handle, prefix_tag, "prefix"));
        // A read-only import of a read-write handle keeps a read-only descriptor (IP5): every
        // mapping of the prefix is then made through a descriptor that cannot write.
        result<int> kept = plugin::imported_memfd_descriptor(handle.fds[0], access);
        if (!kept) {
            forget_import(checked);
            return fail(kept.error().code, std::string(name) + ": " + kept.error().message);
        }
        const int fd = kept.value();
        const std::uint64_t prefix_id = prefixes_.next_id();
        try {
            auto made = std::make_shared<prefix_file>(prefix_id, fd, handle.size, checked.length);
            made->imported = true;
            made->read_only = access == NXMEM_IPC_READ_ONLY;
            prefixes_.insert(prefix_id, std::move(made));
        } catch (...) {
            ::close(fd);
            forget_import(checked);
            throw;
        }
        return plugin::imported_prefix{prefix_id, checked.length};
    }

    // share=memfd only: a private anonymous allocation cannot be handed to another process.
    result<void> export_allocation(const plugin::allocation_record& record, std::uint32_t access,
                                   NxmemIpcHandle& handle) {
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        if (held->fd < 0) {
            return fail(status_code::unsupported_capability,
                        std::string(name) + ": this allocator's allocations are private anonymous "
                                            "memory; open it with share=memfd to export them");
        }
        if (held->prefix) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": shared prefix " + std::to_string(held->prefix->id) +
                            " is mapped over the allocation at 0x" +
                            nxmem::detail::to_hex(held->address) +
                            " and its file does not hold the prefix's bytes: export the prefix");
        }
        return write_export(held->fd, held->size, access, allocation_tag, handle);
    }

    // The whole file mapped; its pages are imported bytes until close_imported_allocation.
    result<plugin::imported_allocation> import_allocation(const NxmemIpcHandle& handle,
                                                          std::uint32_t access) {
        NXMEM_TRY(checked, check_export(handle, allocation_tag, "allocation"));
        result<std::uint64_t> address = plugin::map_imported_memfd(handle.fds[0], checked.length, access);
        if (!address) {
            forget_import(checked);
            return fail(address.error().code, std::string(name) + ": " + address.error().message);
        }
        return plugin::imported_allocation{address.value(), checked.length};
    }

    result<void> close_imported_allocation(const plugin::imported_allocation& imported) {
        if (unmap(imported.address, imported.mapped_bytes) != 0) {
            const int code = errno;
            return fail(status_code::internal_error,
                        std::string(name) + ": munmap of an imported allocation failed: " +
                            errno_text(code));
        }
        release_import(imported.mapped_bytes);
        return boost::outcome_v2::success();
    }

private:
    struct prefix_file {
        prefix_file(std::uint64_t prefix_id, int file, std::uint64_t bytes, std::uint64_t whole_pages)
            : id(prefix_id), fd(file), size(bytes), length(whole_pages) {}
        const std::uint64_t id;
        const int fd;
        const std::uint64_t size;   // as asked
        const std::uint64_t length; // whole pages
        std::atomic<std::uint64_t> sharers{0};
        std::atomic<bool> ever_mapped{false};
        bool imported = false;  // from another process: its bytes are imported, never charged
        bool read_only = false; // mapped PROT_READ
    };

    // Undoes check_export's bookkeeping for an import that failed later.
    void forget_import(const checked_export& checked) {
        {
            std::lock_guard lock(imported_mutex_);
            imported_ids_.erase(checked.export_id);
        }
        release_import(checked.length);
    }

    // Counts one more import of `length` bytes (whole pages) against max_imports and
    // max_imported_bytes (IP18): BUSY naming the limit when the imports alive leave no room,
    // INVALID_ARGUMENT when the handle alone is larger than the byte limit (or imports are off).
    result<void> reserve_import(std::uint64_t length) {
        const std::uint64_t most_bytes = settings_.max_imported_bytes;
        const std::uint64_t most = settings_.max_imports;
        if (length > most_bytes || most == 0) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": a handle of " + std::to_string(length) +
                            " bytes is refused: this allocator imports at most " +
                            std::to_string(most) + " objects of at most " +
                            std::to_string(most_bytes) + " bytes in all (max_imports, max_imported_bytes)");
        }
        const std::uint64_t objects = imported_objects_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t bytes = imported_bytes_.fetch_add(length, std::memory_order_relaxed);
        if (objects < most && bytes <= most_bytes - length) [[likely]] {
            return boost::outcome_v2::success();
        }
        release_import(length);
        return fail(status_code::busy,
                    std::string(name) + ": importing " + std::to_string(length) + " bytes would pass " +
                        (objects >= most ? "max_imports=" + std::to_string(most) + " (" +
                                               std::to_string(objects) + " imports alive)"
                                         : "max_imported_bytes=" + std::to_string(most_bytes) + " (" +
                                               std::to_string(bytes) + " bytes imported now)") +
                        "; close imports to make room");
    }

    void release_import(std::uint64_t length) noexcept {
        imported_objects_.fetch_sub(1, std::memory_order_relaxed);
        imported_bytes_.fetch_sub(length, std::memory_order_relaxed);
    }

    // Fills the mechanism's part of a handle for the memfd `fd` holding `size` bytes (in whole
    // pages): its size sealed, a new descriptor allowing `access`, the opaque bytes with a new
    // export id.
    static result<void> write_export(int fd, std::uint64_t size, std::uint32_t access,
                                     const std::array<char, 8>& tag, NxmemIpcHandle& handle) {
        handle_opaque opaque{tag, {}, size};
        if (::getrandom(opaque.export_id.data(), opaque.export_id.size(), 0) !=
            static_cast<ssize_t>(opaque.export_id.size())) {
            const int code = errno;
            return fail(status_code::internal_error,
                        std::string(name) + ": getrandom for an export id failed: " + errno_text(code));
        }
        NXMEM_TRY_VOID(plugin::seal_memfd_for_export(fd, access));
        NXMEM_TRY(descriptor, plugin::memfd_descriptor_for(fd, access));
        handle.fd_count = 1;
        handle.fds[0] = descriptor;
        handle.opaque_length = sizeof opaque;
        std::memcpy(handle.opaque, &opaque, sizeof opaque);
        return boost::outcome_v2::success();
    }

    // What an import checks before it maps or keeps anything (IP7, IP8): one descriptor, opaque
    // bytes of this mechanism's export of `what` (by its tag) of exactly the handle's size, the
    // descriptor a memfd of that size in whole pages with the handle's access, and an export id
    // this allocator never imported. The id is remembered: forget_import if the import fails later.
    result<checked_export> check_export(const NxmemIpcHandle& handle, const std::array<char, 8>& tag,
                                        const char* what) {
        handle_opaque opaque{};
        if (handle.fd_count != 1 || handle.opaque_length != sizeof opaque) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": a handle carries 1 descriptor and " +
                            std::to_string(sizeof opaque) + " opaque bytes, not " +
                            std::to_string(handle.fd_count) + " and " +
                            std::to_string(handle.opaque_length));
        }
        std::memcpy(&opaque, handle.opaque, sizeof opaque);
        if (opaque.tag != tag || opaque.size != handle.size) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": the handle's opaque bytes are not a posix-lazy " +
                            what + " export of " + std::to_string(handle.size) + " bytes");
        }
        // A size no file can have (2^64 - 1 does not round to pages) is a forged handle, not a
        // shortage of memory (IP17).
        const std::uint64_t page = page_bytes();
        if (handle.size > UINT64_MAX - (page - 1)) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": a handle claiming " + std::to_string(handle.size) +
                            " bytes is refused: no memfd holds that many");
        }
        const std::uint64_t length = (handle.size + page - 1) & ~(page - 1);
        NXMEM_TRY_VOID(plugin::check_imported_memfd(handle.fds[0], length, handle.access, 0));
        NXMEM_TRY_VOID(reserve_import(length));
        bool fresh = false;
        try {
            std::lock_guard lock(imported_mutex_);
            fresh = imported_ids_.insert(opaque.export_id).second;
        } catch (...) {
            release_import(length);
            throw;
        }
        if (!fresh) {
            release_import(length);
            return fail(status_code::invalid_argument,
                        std::string(name) + ": this handle was imported here before (a replay)");
        }
        return checked_export{opaque.export_id, length};
    }

    struct reservation {
        reservation(std::uint64_t at, std::uint64_t bytes, std::uint64_t whole_pages, int file)
            : address(at), size(bytes), length(whole_pages), fd(file) {}

        // The bytes of `run` that lie within the allocation (the last page may be partial).
        std::uint64_t bytes_of(const page_run& run) const noexcept {
            const std::uint64_t page = page_bytes();
            const std::uint64_t end = std::min(run.second * page, size);
            return end - run.first * page;
        }

        const std::uint64_t address;
        const std::uint64_t size;   // as asked
        const std::uint64_t length; // whole pages
        const int fd;               // share=memfd: the memory's file; -1: private anonymous
        std::mutex mutex;           // guards everything below
        page_runs committed;
        std::uint64_t committed_bytes = 0;
        std::shared_ptr<prefix_file> prefix;
        std::uint64_t prefix_pages = 0;
        bool released = false;
    };

    // The table's check of what it holds at the record's address: a reservation of its size.
    static auto live_at(const plugin::allocation_record& record) {
        return [&record](const std::shared_ptr<reservation>* held) -> result<void> {
            if (held != nullptr && (*held)->size == record.size) [[likely]] {
                return boost::outcome_v2::success();
            }
            return boost::outcome_v2::failure(unknown(record));
        };
    }

    static error unknown(const plugin::allocation_record& record) {
        return error{status_code::unknown_allocation,
                     std::string(name) + ": no live reservation at 0x" +
                         nxmem::detail::to_hex(record.address)};
    }

    // An allocation's memory as mapped: where, and its memfd (-1 for private anonymous memory).
    struct backing {
        std::uint64_t address = 0;
        int fd = -1;
    };

    // Tables the new reservation `memory` (`committed` of its bytes committed: 0 or all) and
    // counts it; unmaps it (and closes its file) when the table cannot take it.
    void record_reservation(const backing& memory, std::uint64_t size, std::uint64_t length,
                            std::uint64_t committed) {
        const std::uint64_t address = memory.address;
        try {
            auto held = std::make_shared<reservation>(address, size, length, memory.fd);
            if (committed != 0) {
                held->committed.insert(0, length / page_bytes());
                held->committed_bytes = committed;
            }
            reservations_.insert(address, std::move(held));
        } catch (...) {
            unmap(address, length);
            if (memory.fd >= 0) {
                ::close(memory.fd);
            }
            throw; // the guard reports it
        }
        mapped_bytes_.fetch_add(committed, std::memory_order_relaxed);
    }

    // commit=allocate: one readable, writable mapping for the whole allocation, committed at
    // once; its `size` has been charged to the budget.
    result<plugin::block> map_committed(std::uint64_t size, std::uint64_t length, std::uint64_t placed,
                                        bool huge) {
        NXMEM_TRY(memory, map_backing(length, placed, PROT_READ | PROT_WRITE));
        const std::uint64_t address = memory.address;
        if (huge) {
            advise_huge_pages(address, length);
        }
        if (settings_.populate) {
            if (const int code = populate_for_writing(address, length, populate_supported_); code != 0) {
                unmap(address, length);
                if (memory.fd >= 0) {
                    ::close(memory.fd);
                }
                return fail(status_code::out_of_memory,
                            std::string(name) + ": populating " + std::to_string(length) +
                                " bytes failed: " + errno_text(code));
            }
        }
        try {
            record_reservation(memory, size, length, size);
        } catch (...) {
            budget_.credit(size); // unmapped already
            throw;
        }
        return plugin::block{address, size, size};
    }

    // The reservation behind `record`. The kit has checked the record against its own; a stale
    // copy (released, or its address reused since) is refused here.
    result<std::shared_ptr<reservation>> find(const plugin::allocation_record& record) {
        return reservations_.find(record.address, live_at(record));
    }

    // Removes the reservation from the table before it is unmapped, so a new reservation at the
    // same address can be recorded the moment the old one is gone.
    result<std::shared_ptr<reservation>> take(const plugin::allocation_record& record) {
        return reservations_.take(record.address, live_at(record));
    }

    // Its room stayed free when it was taken: putting it back does not allocate.
    void put_back(const std::shared_ptr<reservation>& held) { reservations_.insert(held->address, held); }

    // Marks the committed pages within `pages` uncommitted (their calls made) and gives back
    // what they cost: mapped_bytes, the totals and the budget.
    void uncommit(reservation& held, const page_run& pages) {
        std::uint64_t bytes = 0;
        held.committed.for_each_committed(pages.first, pages.second, [&](const page_run& run) {
            bytes += held.bytes_of(run);
            return true;
        });
        forget(held, pages, bytes);
    }

    // Marks `pages` uncommitted, their calls made, and gives back the `bytes` they cost.
    void forget(reservation& held, const page_run& pages, std::uint64_t bytes) {
        if (bytes == 0) {
            return;
        }
        held.committed.erase(pages.first, pages.second);
        held.committed_bytes -= bytes;
        mapped_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
        budget_.credit(bytes);
    }

    // The tests are inline and the messages built apart (cold), so a call that passes them costs
    // a compare or two.
    static result<void> check_live(const reservation& held) {
        if (!held.released) [[likely]] {
            return boost::outcome_v2::success();
        }
        return boost::outcome_v2::failure(released_meanwhile(held));
    }

    [[gnu::cold, gnu::noinline]] static error released_meanwhile(const reservation& held) {
        return error{status_code::unknown_allocation,
                     std::string(name) + ": the allocation at 0x" +
                         nxmem::detail::to_hex(held.address) + " was released meanwhile"};
    }

    // [first, end) page indices of a page-granular range; INVALID_ARGUMENT otherwise. The kit has
    // checked that the range is non-empty and lies within the allocation.
    // The pages any byte of `range` (not empty) lies in.
    static page_run pages_touched(byte_range range) noexcept {
        const std::uint64_t page = page_bytes();
        return page_run{range.offset / page, (range.offset + range.length + page - 1) / page};
    }

    // Whether each page of `pages` is committed or the mapped prefix's.
    static bool all_committed(const reservation& held, const page_run& pages) {
        const std::uint64_t first = std::max(pages.first, held.prefix_pages);
        bool gap = false;
        if (first < pages.second) {
            held.committed.for_each_gap(first, pages.second, [&gap](const page_run&) {
                gap = true;
                return false;
            });
        }
        return !gap;
    }

    static result<page_run> pages_of(const plugin::allocation_record& record, byte_range range) {
        const std::uint64_t page = page_bytes();
        const bool reaches_end = range.offset + range.length == record.size;
        if (range.offset % page != 0 || (range.length % page != 0 && !reaches_end)) [[unlikely]] {
            return boost::outcome_v2::failure(not_page_granular(record, range, page));
        }
        return page_run{range.offset / page, (range.offset + range.length + page - 1) / page};
    }

    [[gnu::cold, gnu::noinline]] static error not_page_granular(const plugin::allocation_record& record,
                                                               byte_range range, std::uint64_t page) {
        return error{status_code::invalid_argument,
                     std::string(name) + ": ranges are page-granular (" + std::to_string(page) +
                         " bytes): offset " + std::to_string(range.offset) + " must be a page "
                         "multiple and length " + std::to_string(range.length) +
                         " a page multiple or reach the allocation's end at " +
                         std::to_string(record.size)};
    }

    // Commits each gap within `pages`; `wanted`, their bytes, has been charged. The table learns
    // of them once the walk is over (the walk must not change what it walks). On failure what was
    // committed stays committed (mapped_bytes tells) and the rest of the charge is given back.
    result<void> commit_gaps(reservation& held, const page_run& pages, std::uint64_t wanted) {
        const std::uint64_t page = page_bytes();
        std::uint64_t done = pages.second; // [pages.first, done) is committed after the walk
        std::uint64_t committed = 0;       // the bytes of the gaps committed
        std::optional<error> failure;
        held.committed.for_each_gap(pages.first, pages.second, [&](const page_run& gap) {
            const std::uint64_t at = held.address + gap.first * page;
            const std::uint64_t length = (gap.second - gap.first) * page;
            if (::mprotect(reinterpret_cast<void*>(at), static_cast<std::size_t>(length),
                           PROT_READ | PROT_WRITE) != 0) {
                const int code = errno;
                failure = error{status_code::out_of_memory,
                                std::string(name) + ": mprotect(PROT_READ|PROT_WRITE) of " +
                                    std::to_string(length) + " bytes failed: " + errno_text(code)};
                done = gap.first;
                return false;
            }
            if (settings_.populate) {
                if (const int code = populate_for_writing(at, length, populate_supported_);
                    code != 0) {
                    (void)discard(held, at, length);
                    (void)::mprotect(reinterpret_cast<void*>(at), static_cast<std::size_t>(length),
                                     PROT_NONE);
                    failure = error{status_code::out_of_memory,
                                    std::string(name) + ": populating " + std::to_string(length) +
                                        " bytes failed: " + errno_text(code)};
                    done = gap.first;
                    return false;
                }
            }
            committed += held.bytes_of(gap);
            return true;
        });
        held.committed.insert(pages.first, done);
        held.committed_bytes += committed;
        mapped_bytes_.fetch_add(committed, std::memory_order_relaxed);
        if (failure) [[unlikely]] {
            budget_.credit(wanted - committed);
            return boost::outcome_v2::failure(std::move(*failure));
        }
        return boost::outcome_v2::success();
    }

    // Replaces [at, at + length) of a reservation with a fresh uncommitted one: the pages are
    // freed and the range is inaccessible again, in one system call. False when the kernel
    // refused it; the caller then takes the two-call way.
    bool reserve_again(std::uint64_t at, std::uint64_t length) noexcept {
        void* placed = ::mmap(reinterpret_cast<void*>(at), static_cast<std::size_t>(length), PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        if (placed == MAP_FAILED) {
            return false;
        }
        if (settings_.huge_pages) {
            advise_huge_pages(at, length); // a new mapping does not inherit the advice
        }
        return true;
    }

    // After a failed MAP_FIXED the old pages may be gone: reserve them again, uncommitted.
    void restore_reserved(reservation& held, std::uint64_t length) {
        if (held.fd >= 0) {
            (void)map_file_at(held.address, length, PROT_NONE, held.fd);
            punch_hole(held.fd, 0, length);
        } else {
            (void)::mmap(reinterpret_cast<void*>(held.address), static_cast<std::size_t>(length),
                         PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        }
        uncommit(held, page_run{0, length / page_bytes()});
    }

    // Maps `length` bytes aligned to `alignment` with `protection`: private anonymous memory, or
    // with share=memfd a new memfd of that length mapped MAP_SHARED over an aligned reservation.
    result<backing> map_backing(std::uint64_t length, std::uint64_t alignment, int protection) {
        if (!settings_.share_memfd) {
            const int flags =
                MAP_PRIVATE | MAP_ANONYMOUS | (protection == PROT_NONE ? MAP_NORESERVE : 0);
            NXMEM_TRY(address, map_aligned(length, alignment, protection, flags, name));
            return backing{address, -1};
        }
        result<int> file = plugin::create_shareable_memfd("nxmem-posix-allocation", length);
        if (!file) {
            return fail(file.error().code, std::string(name) + ": " + file.error().message);
        }
        result<std::uint64_t> reserved = map_aligned(length, alignment, PROT_NONE,
                                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, name);
        if (!reserved) {
            ::close(file.value());
            return boost::outcome_v2::failure(std::move(reserved).error());
        }
        if (!map_file_at(reserved.value(), length, protection, file.value())) {
            const int code = errno;
            unmap(reserved.value(), length);
            ::close(file.value());
            return fail(status_code::out_of_memory,
                        std::string(name) + ": mapping a memfd of " + std::to_string(length) +
                            " bytes failed: " + errno_text(code));
        }
        return backing{reserved.value(), file.value()};
    }

    // Maps the whole-page range [0, length) of the file `fd` at `address`, replacing what was there.
    static bool map_file_at(std::uint64_t address, std::uint64_t length, int protection, int fd) noexcept {
        return ::mmap(reinterpret_cast<void*>(address), static_cast<std::size_t>(length), protection,
                      MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
    }

    // Frees the pages of [offset, offset + length) of the file `fd`, keeping its size, where a
    // failure changes nothing that must be reported (the file is freed whole at its last close or
    // unmap).
    static void punch_hole(int fd, std::uint64_t offset, std::uint64_t length) noexcept {
        (void)plugin::punch_memfd_hole(fd, offset, length);
    }

    // Frees the committed pages at [at, at + length) of an allocation, leaving them mapped:
    // MADV_DONTNEED for private memory, a hole punched in the file for a memfd (whose pages
    // MADV_DONTNEED would only unmap). For every process mapping the file they read as zeros.
    // Returns 0, or the errno of a hole the file refused (the pages are then untouched).
    static int discard(const reservation& held, std::uint64_t at, std::uint64_t length) noexcept {
        if (held.fd >= 0) {
            return plugin::punch_memfd_hole(held.fd, at - held.address, length);
        }
        (void)::madvise(reinterpret_cast<void*>(at), static_cast<std::size_t>(length), MADV_DONTNEED);
        return 0;
    }

    result<std::uint64_t> make_prefix(std::uint64_t size, std::uint64_t length) {
        result<int> file = plugin::create_shareable_memfd("nxmem-posix-prefix", length);
        if (!file) {
            return fail(file.error().code, std::string(name) + ": a shared prefix of " +
                                               std::to_string(length) + " bytes: " +
                                               file.error().message);
        }
        const int fd = file.value();
        const std::uint64_t prefix_id = prefixes_.next_id();
        try {
            prefixes_.insert(prefix_id, std::make_shared<prefix_file>(prefix_id, fd, size, length));
        } catch (...) {
            ::close(fd);
            throw;
        }
        return prefix_id;
    }

    lazy_settings settings_;
    byte_budget budget_;
    std::atomic<bool> populate_supported_{true};
    nxmem::detail::sharded_table<std::shared_ptr<reservation>> reservations_;
    // The committed bytes (the usage query's mapped_bytes), kept as pages are committed and
    // decommitted so a query walks no reservation; the kit counts the rest.
    std::atomic<std::uint64_t> mapped_bytes_{0};
    // What the import limits count (IP18): allocation imports not closed and imported prefixes not
    // destroyed, and their whole pages (what usage() reports as imported_bytes).
    std::atomic<std::uint64_t> imported_objects_{0};
    std::atomic<std::uint64_t> imported_bytes_{0};
    prefix_table<prefix_file> prefixes_;
    // The export ids this allocator has imported, closed ones included: a handle imports once.
    std::mutex imported_mutex_;
    std::set<std::array<std::uint8_t, 16>> imported_ids_;
};

} // namespace nxmem::posix
