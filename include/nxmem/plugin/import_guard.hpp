// The opaque bytes of an IPC handle and replay protection for imports (minor 3), beside
// memfd_share.hpp's checks of the descriptor. A mechanism's handle carries, in its 64 opaque bytes,
// a tag naming the mechanism's record (so bytes of another mechanism or kind are refused), a
// random export id (16 bytes from getrandom) and whatever fields the mechanism needs; an importer
// reads them back only when their length and tag are exactly the record's, and admits each export
// id once: a handle imported a second time (a replay of a record another process kept) is refused
// (docs/ABI.md IP7, IP8). Every refusal is INVALID_ARGUMENT naming the mechanism and the fault.
// import_limits bounds what another process can make one allocator import, by count and by bytes
// (IP18), with the options posix-lazy names them by.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>
#include <nxmem/plugin/options.hpp>

#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>

namespace nxmem::plugin {

using export_id = std::array<std::uint8_t, 16>;

// A fresh, unguessable export id; INTERNAL_ERROR when the kernel gives no random bytes.
inline result<export_id> new_export_id() {
    export_id id{};
    std::size_t filled = 0;
    while (filled < id.size()) {
        const ssize_t got = ::getrandom(id.data() + filled, id.size() - filled, 0);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return fail(status_code::internal_error, "getrandom gave no export id: " + std::string(std::strerror(errno)));
        }
        filled += static_cast<std::size_t>(got);
    }
    return id;
}

// The opaque bytes of one mechanism's handle: an 8-byte tag, the export id and `Fields` (trivially
// copyable), at most NXMEM_IPC_OPAQUE_BYTES in all.
template <class Fields> struct opaque_record {
    static_assert(std::is_trivially_copyable_v<Fields>, "the fields cross processes as bytes");

    std::array<char, 8> tag{};
    export_id id{};
    Fields fields{};

    static_assert(sizeof(std::array<char, 8>) + sizeof(export_id) + sizeof(Fields) <= NXMEM_IPC_OPAQUE_BYTES,
                  "an IPC handle carries at most NXMEM_IPC_OPAQUE_BYTES opaque bytes");

    // `tag` is the first 8 bytes of `name` ("posix-lazy-alloc", say), zero-padded.
    static std::array<char, 8> tag_of(std::string_view name) noexcept {
        std::array<char, 8> made{};
        std::memcpy(made.data(), name.data(), name.size() < made.size() ? name.size() : made.size());
        return made;
    }

    // Writes the record into `handle`'s opaque bytes (and their length).
    void write_to(NxmemIpcHandle& handle) const noexcept {
        std::memset(handle.opaque, 0, sizeof handle.opaque);
        std::memcpy(handle.opaque, this, sizeof *this);
        handle.opaque_length = sizeof *this;
    }

    // The record `handle` carries, when its opaque bytes are exactly one of ours tagged `tag`.
    static result<opaque_record> read_from(const NxmemIpcHandle& handle, std::string_view tag,
                                           const char* mechanism) {
        opaque_record read;
        if (handle.opaque_length != sizeof read) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": a handle of " + std::to_string(sizeof read) +
                            " opaque bytes was expected, not " + std::to_string(handle.opaque_length));
        }
        std::memcpy(&read, handle.opaque, sizeof read);
        if (read.tag != tag_of(tag)) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": the handle's opaque bytes are not a " + std::string(tag) + " record");
        }
        return read;
    }
};

// The export ids imported through this guard: each is admitted once. One per allocator (ABI.md
// IP8: a handle imports once into an allocator; another allocator may import it too).
class replay_guard {
public:
    // OK the first time `id` is seen; INVALID_ARGUMENT (a replay) every later time.
    result<void> admit(const export_id& id, const char* mechanism) {
        std::lock_guard lock(mutex_);
        if (!seen_.insert(id).second) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": this handle was imported here before (a replay)");
        }
        return boost::outcome_v2::success();
    }

    // Forgets `id` (an import that failed after admit, so the same handle may be tried again).
    void forget(const export_id& id) noexcept {
        std::lock_guard lock(mutex_);
        seen_.erase(id);
    }

private:
    std::mutex mutex_;
    std::set<export_id> seen_;
};

// The bounds of IP18, read at open from the options `max_imports` (imports alive; default 1024)
// and `max_imported_bytes` (their mapped bytes; default the machine's physical memory, so a
// peer's sparse handles cannot fill the address space). 0 imports means none is accepted.
struct import_bounds {
    static constexpr std::uint64_t default_max_imports = 1024;
    std::uint64_t max_imports = default_max_imports;
    std::uint64_t max_bytes = physical_memory_bytes();

    static std::uint64_t physical_memory_bytes() noexcept {
        const long pages = ::sysconf(_SC_PHYS_PAGES);
        const long page = ::sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                                     : UINT64_MAX;
    }

    // Takes both options (k, M, G suffixes), each absent one at its default.
    static result<import_bounds> take(options& open_options) {
        import_bounds taken;
        NXMEM_TRY(imports, open_options.take_bytes("max_imports"));
        NXMEM_TRY(bytes, open_options.take_bytes("max_imported_bytes"));
        taken.max_imports = imports.value_or(taken.max_imports);
        taken.max_bytes = bytes.value_or(taken.max_bytes);
        return taken;
    }
};

// What one allocator has imported and may still import (IP18): imports alive (allocation imports
// not closed, imported prefixes not destroyed) and the bytes they map. `reserve` before an import
// maps or keeps anything; `release` when it ends, or when it fails after its reserve.
class import_limits {
public:
    explicit import_limits(import_bounds bounds) noexcept : bounds_(bounds) {}

    // Counts one more import of `bytes` (what it maps: imported_prefix::mapped_bytes or
    // imported_allocation::mapped_bytes). INVALID_ARGUMENT when the handle alone is larger than
    // max_imported_bytes (or max_imports is 0): it never fits. BUSY naming the limit when the
    // imports alive leave no room: closing imports makes room, and the same handle imports then.
    // A refusal counts nothing.
    result<void> reserve(std::uint64_t bytes, const char* mechanism) {
        if (bytes > bounds_.max_bytes || bounds_.max_imports == 0) [[unlikely]] {
            return never_fits(bytes, mechanism);
        }
        std::unique_lock lock(mutex_);
        if (imports_ < bounds_.max_imports && bytes <= bounds_.max_bytes - bytes_) [[likely]] {
            ++imports_;
            bytes_ += bytes;
            return boost::outcome_v2::success();
        }
        const std::uint64_t alive = imports_;
        const std::uint64_t held = bytes_;
        lock.unlock(); // the message is built without it
        return no_room(bytes, alive, held, mechanism);
    }

    // An import of `bytes` that reserve admitted ends (or failed after it).
    void release(std::uint64_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        --imports_;
        bytes_ -= bytes;
    }

    std::uint64_t imports() const noexcept {
        std::lock_guard lock(mutex_);
        return imports_;
    }
    std::uint64_t bytes() const noexcept {
        std::lock_guard lock(mutex_);
        return bytes_;
    }

private:
    [[gnu::cold]] failure never_fits(std::uint64_t bytes, const char* mechanism) const {
        return fail(status_code::invalid_argument,
                    std::string(mechanism) + ": a handle of " + std::to_string(bytes) +
                        " bytes is refused: this allocator imports at most " +
                        std::to_string(bounds_.max_imports) + " objects of at most " +
                        std::to_string(bounds_.max_bytes) +
                        " bytes in all (max_imports, max_imported_bytes)");
    }

    [[gnu::cold]] failure no_room(std::uint64_t bytes, std::uint64_t alive, std::uint64_t held,
                                  const char* mechanism) const {
        return fail(status_code::busy,
                    std::string(mechanism) + ": importing " + std::to_string(bytes) + " bytes would pass " +
                        (alive >= bounds_.max_imports
                             ? "max_imports=" + std::to_string(bounds_.max_imports) + " (" +
                                   std::to_string(alive) + " imports alive)"
                             : "max_imported_bytes=" + std::to_string(bounds_.max_bytes) + " (" +
                                   std::to_string(held) + " bytes imported now)") +
                        "; close imports to make room");
    }

    const import_bounds bounds_;
    mutable std::mutex mutex_;
    std::uint64_t imports_ = 0;
    std::uint64_t bytes_ = 0;
};

} // namespace nxmem::plugin
