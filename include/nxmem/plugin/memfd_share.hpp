// Sharing a memfd with another process (minor 3), for mechanisms whose memory is a memfd: what an
// exporter does to the file before it hands a descriptor over, and what an importer checks of a
// descriptor it got from another process before mapping anything (docs/ABI.md IP5, IP7, IP15-IP17).
//
//   export  seal the size and make the seals final (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): no
//           process can then truncate the file under another's mapping (which would fault it with
//           SIGBUS), nor add a seal (F_SEAL_FUTURE_WRITE would stop the exporter's decommit from
//           punching holes); a read-write handle carries a duplicate of the descriptor, a
//           read-only one a new read-only descriptor of the same file, and the file's mode drops
//           to 0400 so that a receiver of another uid cannot reopen it writable through
//           /proc/self/fd (the file's owner can: fchmod it back and reopen; and so can a process
//           with CAP_DAC_OVERRIDE or CAP_FOWNER: IP5 says what holds)
//   import  the seals are read first: the descriptor accepts seals (a memfd) and both size seals
//           are set, so its size can no longer change; only then is its size read and compared
//           with the size the handle claims (read before the seals, a size could be cut between
//           the two reads); a read-write import refuses a file sealed against writes; the
//           descriptor's access mode is the handle's access (O_RDWR for read-write, O_RDONLY for
//           read-only). An imported allocation is then mapped MAP_SHARED, writable only for a
//           read-write import. Every refusal, whatever this process lacks to take the handle
//           (a descriptor, address space) included, is INVALID_ARGUMENT: never OUT_OF_MEMORY,
//           which tells an engine to free memory.
//
// create_shareable_memfd makes the file in the first place: a memfd that takes seals, sized.
// punch_memfd_hole frees a range of its pages and says when it could not.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace nxmem::plugin {

namespace detail {
inline std::string errno_words(int code) { return std::strerror(code); }
} // namespace detail

inline constexpr int memfd_size_seals = F_SEAL_SHRINK | F_SEAL_GROW;
// What an exporter sets before the first export: the size sealed, and no seal added after.
inline constexpr int memfd_export_seals = memfd_size_seals | F_SEAL_SEAL;
// Seals that forbid writing (a read-write import refuses them).
inline constexpr int memfd_write_seals = F_SEAL_WRITE | F_SEAL_FUTURE_WRITE;

// A new memfd of `length` bytes (a page multiple) that takes seals, close-on-exec, named `label`
// in /proc/PID/maps; the caller owns it. OUT_OF_MEMORY when the kernel refuses.
inline result<int> create_shareable_memfd(const char* label, std::uint64_t length) {
    const int fd = ::memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        const int code = errno;
        return fail(status_code::out_of_memory, "memfd_create failed: " + detail::errno_words(code));
    }
    if (length > static_cast<std::uint64_t>(INT64_MAX) ||
        ::ftruncate(fd, static_cast<off_t>(length)) != 0) {
        const int code = length > static_cast<std::uint64_t>(INT64_MAX) ? EFBIG : errno;
        ::close(fd);
        return fail(status_code::out_of_memory, "sizing a memfd to " + std::to_string(length) +
                                                    " bytes failed: " + detail::errno_words(code));
    }
    return fd;
}

namespace detail {
// A new read-only descriptor of the file `fd` names (through /proc/self/fd); the caller owns it.
// `refusal` is the status when it cannot be opened (an import's INVALID_ARGUMENT, an export's
// INTERNAL_ERROR): a duplicate and a reopening answer alike.
inline result<int> reopen_read_only(int fd, status_code refusal) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const int reader = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (reader < 0) {
        const int code = errno;
        return fail(refusal, "opening a read-only descriptor of a memfd failed: " + errno_words(code));
    }
    return reader;
}
// A duplicate of `fd` (close-on-exec); the caller owns it. `why` says what it was for.
inline result<int> duplicate(int fd, const char* why, status_code refusal) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        const int code = errno;
        return fail(refusal, std::string(why) + " failed: " + errno_words(code));
    }
    return copy;
}
} // namespace detail

// Seals the size of the memfd `fd` (created with MFD_ALLOW_SEALING) and makes its seals final,
// before it is exported with `access`; sealing twice is harmless. A read-write export of a file
// sealed against writes is INVALID_ARGUMENT: no importer would accept it (IP17).
inline result<void> seal_memfd_for_export(int fd, std::uint32_t access) {
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & memfd_export_seals) != memfd_export_seals) {
        if (::fcntl(fd, F_ADD_SEALS, memfd_export_seals) != 0) {
            const int code = errno;
            return fail(status_code::internal_error,
                        "sealing a memfd for export failed: " + detail::errno_words(code));
        }
        seals = ::fcntl(fd, F_GET_SEALS);
    }
    if (access == NXMEM_IPC_READ_WRITE && seals >= 0 && (seals & memfd_write_seals) != 0) {
        return fail(status_code::invalid_argument,
                    "the memfd is sealed against writes, so no process could import it read-write; "
                    "export it read-only");
    }
    return boost::outcome_v2::success();
}

// A new descriptor of the memfd `fd` (sealed) that allows `access` and no more; the caller owns it.
inline result<int> memfd_descriptor_for(int fd, std::uint32_t access) {
    if (access == NXMEM_IPC_READ_WRITE) {
        return detail::duplicate(fd, "duplicating a memfd for export", status_code::internal_error);
    }
    if (::fchmod(fd, S_IRUSR) != 0) {
        const int code = errno;
        return fail(status_code::internal_error,
                    "making a memfd read-only for export failed: " + detail::errno_words(code));
    }
    return detail::reopen_read_only(fd, status_code::internal_error);
}

// OK when `fd` is a memfd of exactly `length` bytes, its size sealed, opened for `access` (and,
// for a read-write import, not sealed against writes); otherwise INVALID_ARGUMENT naming what is
// wrong with descriptor `index` of the handle. The seals are read before the size: once both size
// seals are seen the size cannot change, so the size read next is the size the mapping gets.
// What may still change afterwards is only a seal added (when the exporter did not make its seals
// final): a write seal added now makes a read-write mapping fail, which map_imported_memfd (and
// a prefix's later mapping) reports as INVALID_ARGUMENT too.
inline result<void> check_imported_memfd(int fd, std::uint64_t length, std::uint32_t access,
                                         std::uint32_t index) {
    const auto refuse = [index](const std::string& why) {
        return fail(status_code::invalid_argument,
                    "IPC handle descriptor " + std::to_string(index) + " refused: " + why);
    };
    const int seals = ::fcntl(fd, F_GET_SEALS);
    struct stat facts {};
    if (seals < 0) {
        const int code = errno;
        if (::fstat(fd, &facts) != 0) {
            const int stat_code = errno;
            return refuse("fstat failed: " + detail::errno_words(stat_code));
        }
        if (!S_ISREG(facts.st_mode)) {
            return refuse("not a regular file (a socket, pipe or device is not shared memory)");
        }
        return refuse("not a memfd (it takes no seals: " + detail::errno_words(code) + ")");
    }
    if ((seals & memfd_size_seals) != memfd_size_seals) {
        return refuse("its size is not sealed, so its owner could shrink it under this process");
    }
    if (access == NXMEM_IPC_READ_WRITE && (seals & memfd_write_seals) != 0) {
        return refuse("it is sealed against writes, so it cannot be imported read-write");
    }
    if (::fstat(fd, &facts) != 0) {
        const int code = errno;
        return refuse("fstat failed: " + detail::errno_words(code));
    }
    if (!S_ISREG(facts.st_mode)) {
        return refuse("not a regular file");
    }
    if (facts.st_size < 0 || static_cast<std::uint64_t>(facts.st_size) != length) {
        return refuse("it holds " + std::to_string(facts.st_size) + " bytes, the handle claims " +
                      std::to_string(length));
    }
    const int flags = ::fcntl(fd, F_GETFL);
    const int wanted = access == NXMEM_IPC_READ_ONLY ? O_RDONLY : O_RDWR;
    if (flags < 0 || (flags & O_ACCMODE) != wanted) {
        return refuse(std::string("its access mode is not the handle's (") +
                      (access == NXMEM_IPC_READ_ONLY ? "read-only" : "read-write") + ")");
    }
    return boost::outcome_v2::success();
}

// The importer's own descriptor of `fd`, a descriptor check_imported_memfd accepted, allowing
// `access` and no more: a duplicate, or for a read-only import of a read-write handle a new
// read-only descriptor of the file, so that no mapping made through it, and no mprotect of such
// a mapping, can ever write. The caller owns it. INVALID_ARGUMENT when this process cannot open
// another descriptor (EMFILE, ENFILE), on either path.
inline result<int> imported_memfd_descriptor(int fd, std::uint32_t access) {
    if (access == NXMEM_IPC_READ_ONLY && (::fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY) {
        return detail::reopen_read_only(fd, status_code::invalid_argument);
    }
    return detail::duplicate(fd, "keeping an imported descriptor", status_code::invalid_argument);
}

// Maps all `length` bytes of `fd`, a descriptor check_imported_memfd accepted, shared: readable,
// and writable only for a read-write import. A read-only import maps through a read-only
// descriptor of the file (imported_memfd_descriptor), so no mprotect can make the mapping
// writable even when the handle was read-write. The mapping keeps the file alive; no descriptor
// is kept. The caller munmaps it. A mapping the kernel refuses (address space, a write seal added
// since the check) is INVALID_ARGUMENT: the handle is refused, nothing is mapped.
inline result<std::uint64_t> map_imported_memfd(int fd, std::uint64_t length, std::uint32_t access) {
    const bool read_only = access == NXMEM_IPC_READ_ONLY;
    NXMEM_TRY(source, imported_memfd_descriptor(fd, access));
    void* mapped = ::mmap(nullptr, static_cast<std::size_t>(length),
                          read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, source, 0);
    const int code = errno;
    ::close(source);
    if (mapped == MAP_FAILED) {
        return fail(status_code::invalid_argument, "mapping an imported memfd of " +
                                                       std::to_string(length) + " bytes failed: " +
                                                       detail::errno_words(code) +
                                                       "; the import is refused");
    }
    return reinterpret_cast<std::uint64_t>(mapped);
}

// Frees the pages of [offset, offset + length) of the memfd `fd`, keeping its size. Returns 0, or
// the errno of a failure (EPERM: the file is sealed against writes), the pages then still held.
inline int punch_memfd_hole(int fd, std::uint64_t offset, std::uint64_t length) noexcept {
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(length)) != 0) {
        return errno;
    }
    return 0;
}

} // namespace nxmem::plugin
