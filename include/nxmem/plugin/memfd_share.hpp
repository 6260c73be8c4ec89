// Sharing a memfd with another process (minor 3), for mechanisms whose memory is a memfd: what an
// exporter does to the file before it hands a descriptor over, and what an importer checks of a
// descriptor it got from another process before mapping anything (docs/ABI.md IP7, IP8).
//
//   export  seal the size (F_SEAL_SHRINK | F_SEAL_GROW): no process can then truncate the file
//           under another's mapping (which would fault it with SIGBUS); a read-write handle
//           carries a duplicate of the descriptor, a read-only one a new read-only descriptor of
//           the same file, and the file's mode drops to 0400 so that a receiver cannot reopen it
//           writable through /proc/self/fd (a process with CAP_DAC_OVERRIDE still can)
//   import  the descriptor is a regular file that accepts seals (a memfd), both size seals are
//           set, its size is the size the handle claims, and its access mode is the handle's
//           access (O_RDWR for read-write, O_RDONLY for read-only); an imported allocation is then
//           mapped MAP_SHARED, writable only for a read-write import
//
// create_shareable_memfd makes the file in the first place: a memfd that takes seals, sized.
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
inline result<int> reopen_read_only(int fd) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const int reader = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (reader < 0) {
        const int code = errno;
        return fail(status_code::internal_error,
                    "opening a read-only descriptor of a memfd failed: " + errno_words(code));
    }
    return reader;
}
// A duplicate of `fd` (close-on-exec); the caller owns it. `why` says what it was for.
inline result<int> duplicate(int fd, const char* why) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        const int code = errno;
        return fail(status_code::out_of_memory, std::string(why) + " failed: " + errno_words(code));
    }
    return copy;
}
} // namespace detail

// Seals the size of the memfd `fd` (created with MFD_ALLOW_SEALING); sealing twice is harmless.
inline result<void> seal_memfd_size(int fd) {
    if (const int seals = ::fcntl(fd, F_GET_SEALS);
        seals >= 0 && (seals & memfd_size_seals) == memfd_size_seals) {
        return boost::outcome_v2::success(); // sealed already (and a read-only one takes no seals)
    }
    if (::fcntl(fd, F_ADD_SEALS, memfd_size_seals) != 0) {
        const int code = errno;
        return fail(status_code::internal_error,
                    "sealing the size of a memfd for export failed: " + detail::errno_words(code));
    }
    return boost::outcome_v2::success();
}

// A new descriptor of the memfd `fd` (sealed) that allows `access` and no more; the caller owns it.
inline result<int> memfd_descriptor_for(int fd, std::uint32_t access) {
    if (access == NXMEM_IPC_READ_WRITE) {
        return detail::duplicate(fd, "duplicating a memfd for export");
    }
    if (::fchmod(fd, S_IRUSR) != 0) {
        const int code = errno;
        return fail(status_code::internal_error,
                    "making a memfd read-only for export failed: " + detail::errno_words(code));
    }
    return detail::reopen_read_only(fd);
}

// OK when `fd` is a memfd of exactly `length` bytes, its size sealed, opened for `access`;
// otherwise INVALID_ARGUMENT naming what is wrong with descriptor `index` of the handle.
inline result<void> check_imported_memfd(int fd, std::uint64_t length, std::uint32_t access,
                                         std::uint32_t index) {
    const auto refuse = [index](const std::string& why) {
        return fail(status_code::invalid_argument,
                    "IPC handle descriptor " + std::to_string(index) + " refused: " + why);
    };
    struct stat facts {};
    if (::fstat(fd, &facts) != 0) {
        const int code = errno;
        return refuse("fstat failed: " + detail::errno_words(code));
    }
    if (!S_ISREG(facts.st_mode)) {
        return refuse("not a regular file (a socket, pipe or device is not shared memory)");
    }
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        return refuse("not a memfd (it takes no seals)");
    }
    if ((seals & memfd_size_seals) != memfd_size_seals) {
        return refuse("its size is not sealed, so its owner could shrink it under this process");
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
// a mapping, can ever write. The caller owns it.
inline result<int> imported_memfd_descriptor(int fd, std::uint32_t access) {
    if (access == NXMEM_IPC_READ_ONLY && (::fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY) {
        return detail::reopen_read_only(fd);
    }
    return detail::duplicate(fd, "keeping an imported descriptor");
}

// Maps all `length` bytes of `fd`, a descriptor check_imported_memfd accepted, shared: readable,
// and writable only for a read-write import. A read-only import maps through a read-only
// descriptor of the file (imported_memfd_descriptor), so no mprotect can make the mapping
// writable even when the handle was read-write. The mapping keeps the file alive; no descriptor
// is kept. The caller munmaps it.
inline result<std::uint64_t> map_imported_memfd(int fd, std::uint64_t length, std::uint32_t access) {
    const bool read_only = access == NXMEM_IPC_READ_ONLY;
    NXMEM_TRY(source, imported_memfd_descriptor(fd, access));
    void* mapped = ::mmap(nullptr, static_cast<std::size_t>(length),
                          read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, source, 0);
    const int code = errno;
    ::close(source);
    if (mapped == MAP_FAILED) {
        return fail(status_code::out_of_memory, "mapping an imported memfd of " +
                                                    std::to_string(length) +
                                                    " bytes failed: " + detail::errno_words(code));
    }
    return reinterpret_cast<std::uint64_t>(mapped);
}

} // namespace nxmem::plugin
