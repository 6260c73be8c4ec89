// The opaque bytes of an IPC handle and replay protection for imports (minor 3), beside
// memfd_share.hpp's checks of the descriptor. A mechanism's handle carries, in its 64 opaque bytes,
// a tag naming the mechanism's record (so bytes of another mechanism or kind are refused), a
// random export id (16 bytes from getrandom) and whatever fields the mechanism needs; an importer
// reads them back only when their length and tag are exactly the record's, and admits each export
// id once: a handle imported a second time (a replay of a record another process kept) is refused
// (docs/ABI.md IP7, IP8). Every refusal is INVALID_ARGUMENT naming the mechanism and the fault.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <sys/random.h>

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

} // namespace nxmem::plugin
