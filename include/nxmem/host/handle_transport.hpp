// Carrying an IPC handle (minor 3) to another process over a Unix socket: the record's bytes as
// one message and its descriptors beside it as SCM_RIGHTS, so no name is ever guessable and no
// process reads another's memory (no ptrace permission is needed). The socket must keep message
// boundaries: AF_UNIX with SOCK_SEQPACKET or SOCK_DGRAM (a socketpair, or a listening socket).
// An engine with a transport of its own sends the record's struct_size bytes and the descriptors
// its way, and on arrival rewrites fds[] with the numbers it received.
//
// What the receiver gets is still untrusted: the import checks it (docs/ABI.md, IP rules). The
// receiver only makes it safe to hand over: the message and the descriptor count agree, a record
// larger than this header knows has only zero bytes beyond it, and every descriptor received is
// closed on any refusal.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/result.hpp>
#include <nxmem/host/ipc_view.hpp>

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace nxmem::host {

namespace detail {
inline result<void> check_message_socket(int socket) {
    int type = 0;
    socklen_t length = sizeof type;
    if (::getsockopt(socket, SOL_SOCKET, SO_TYPE, &type, &length) != 0) {
        const int code = errno;
        return fail(status_code::invalid_argument,
                    "not a socket: " + std::string(std::strerror(code)));
    }
    if (type != SOCK_SEQPACKET && type != SOCK_DGRAM) {
        return fail(status_code::invalid_argument,
                    "an IPC handle travels over a socket that keeps message boundaries "
                    "(SOCK_SEQPACKET or SOCK_DGRAM)");
    }
    return boost::outcome_v2::success();
}
} // namespace detail

// Sends `record` and its descriptors (they stay open here: the receiver gets duplicates).
inline result<void> send_handle(int socket, const NxmemIpcHandle& record) {
    NXMEM_TRY_VOID(detail::check_message_socket(socket));
    NXMEM_TRY(checked, abi::read_request(&record));
    if (checked.fd_count > NXMEM_IPC_MAX_FDS) {
        return fail(status_code::invalid_argument, "a handle carries at most 4 descriptors");
    }
    checked.struct_size = sizeof checked; // only what this header knows travels
    iovec bytes{&checked, sizeof checked};
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * NXMEM_IPC_MAX_FDS)> control{};
    msghdr message{};
    message.msg_iov = &bytes;
    message.msg_iovlen = 1;
    if (checked.fd_count > 0) {
        message.msg_control = control.data();
        message.msg_controllen = CMSG_SPACE(sizeof(int) * checked.fd_count);
        cmsghdr* rights = CMSG_FIRSTHDR(&message);
        rights->cmsg_level = SOL_SOCKET;
        rights->cmsg_type = SCM_RIGHTS;
        rights->cmsg_len = CMSG_LEN(sizeof(int) * checked.fd_count);
        std::memcpy(CMSG_DATA(rights), checked.fds, sizeof(int) * checked.fd_count);
    }
    for (;;) {
        const ssize_t sent = ::sendmsg(socket, &message, MSG_NOSIGNAL);
        if (sent == static_cast<ssize_t>(sizeof checked)) {
            return boost::outcome_v2::success();
        }
        if (sent < 0 && errno == EINTR) {
            continue;
        }
        const int code = sent < 0 ? errno : EMSGSIZE;
        return fail(status_code::internal_error,
                    "sending an IPC handle failed: " + std::string(std::strerror(code)));
    }
}

// Receives one handle; its descriptors are this process's and owned by the result. Blocks like
// recvmsg on the socket.
inline result<ipc_handle> receive_handle(int socket) {
    NXMEM_TRY_VOID(detail::check_message_socket(socket));
    alignas(8) std::array<unsigned char, NXMEM_MAX_STRUCT_SIZE + 1> bytes{};
    iovec into{bytes.data(), bytes.size()};
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * (NXMEM_IPC_MAX_FDS + 1))> control{};
    msghdr message{};
    message.msg_iov = &into;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    ssize_t received = 0;
    do {
        received = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    } while (received < 0 && errno == EINTR);
    if (received < 0) {
        const int code = errno;
        return fail(status_code::internal_error,
                    "receiving an IPC handle failed: " + std::string(std::strerror(code)));
    }
    // Whatever arrives is owned from here on, so every refusal below closes it.
    auto record = abi::make_struct<NxmemIpcHandle>();
    std::uint32_t fd_count = 0;
    for (cmsghdr* part = CMSG_FIRSTHDR(&message); part != nullptr; part = CMSG_NXTHDR(&message, part)) {
        if (part->cmsg_level != SOL_SOCKET || part->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        const std::size_t count = (part->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t index = 0; index < count; ++index) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(part) + index * sizeof(int), sizeof fd);
            if (fd_count < NXMEM_IPC_MAX_FDS) {
                record.fds[fd_count++] = fd;
            } else {
                (void)::close(fd);
                fd_count = NXMEM_IPC_MAX_FDS + 1; // too many: refused below
            }
        }
    }
    record.fd_count = fd_count > NXMEM_IPC_MAX_FDS ? NXMEM_IPC_MAX_FDS : fd_count;
    ipc_handle owned = ipc_handle::adopt(record); // closes them on any refusal
    const auto refuse = [](const std::string& why) {
        return fail(status_code::invalid_argument, "received IPC handle refused: " + why);
    };
    if (fd_count > NXMEM_IPC_MAX_FDS || (message.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0) {
        return refuse("more descriptors or bytes than a handle holds");
    }
    std::uint32_t size = 0;
    if (received < static_cast<ssize_t>(sizeof size)) {
        return refuse("a message of " + std::to_string(received) + " bytes");
    }
    std::memcpy(&size, bytes.data(), sizeof size);
    if (size != static_cast<std::uint64_t>(received)) {
        return refuse("struct_size " + std::to_string(size) + " in a message of " +
                      std::to_string(received) + " bytes");
    }
    // The record as this header knows it; a larger one's unknown bytes must be zero (Q3).
    const NxmemIpcHandle* sent = reinterpret_cast<const NxmemIpcHandle*>(bytes.data());
    NXMEM_TRY(copy, abi::read_request(sent));
    if (copy.fd_count != fd_count) {
        return refuse("it names " + std::to_string(copy.fd_count) + " descriptors and " +
                      std::to_string(fd_count) + " arrived");
    }
    copy.struct_size = sizeof copy;
    const NxmemIpcHandle arrived = owned.release(); // the same descriptors, now in `copy`
    for (std::uint32_t index = 0; index < NXMEM_IPC_MAX_FDS; ++index) {
        copy.fds[index] = index < fd_count ? arrived.fds[index] : -1;
    }
    return ipc_handle::adopt(copy);
}

} // namespace nxmem::host
