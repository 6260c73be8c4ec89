// Running one risky call into a plugin in a disposable child process: the boundary checks hand a
// plugin memory that ends at a PROT_NONE page, and a plugin that writes past it must fail the
// check, not kill the run. The child reports its value, or the fault (fault_report.hpp) before it
// dies; whatever the plugin changed in the child's memory dies with it.
#pragma once

#include <nxmem/conform/detail/fault_report.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

namespace nxmem::conform::detail {

// Everything readable from `fd` until end of file (the child's end of the pipe closed).
inline std::string read_until_closed(int fd) {
    std::string received;
    char chunk[4096];
    for (;;) {
        const ssize_t got = ::read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return received;
        }
        received.append(chunk, static_cast<std::size_t>(got));
    }
}

template <class T> struct contained_result {
    std::optional<T> value; // the child returned
    std::string failure;    // otherwise: "SIGSEGV: a write at ...", "timed out after 10 s", ...
};

inline constexpr unsigned contained_call_timeout_seconds = 30;

// Runs `body` (returning a trivially copyable T) in a forked child under a timeout.
template <class T, class Body>
contained_result<T> run_contained(Body&& body, unsigned timeout_seconds = contained_call_timeout_seconds) {
    static_assert(std::is_trivially_copyable_v<T>, "the value crosses a pipe as bytes");
    contained_result<T> outcome;
    int fds[2];
    if (::pipe(fds) != 0) {
        outcome.failure = std::string("pipe failed: ") + std::strerror(errno);
        return outcome;
    }
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        outcome.failure = std::string("fork failed: ") + std::strerror(errno);
        return outcome;
    }
    if (child == 0) {
        ::close(fds[0]);
        install_fault_reporter(fds[1]);
        ::alarm(timeout_seconds);
        const T value = body();
        std::string bytes = "V";
        bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
        (void)!::write(fds[1], bytes.data(), bytes.size());
        ::_exit(0);
    }
    ::close(fds[1]);
    const std::string received = read_until_closed(fds[0]);
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && received.size() == 1 + sizeof(T) &&
        received[0] == 'V') {
        T value;
        std::memcpy(&value, received.data() + 1, sizeof value);
        outcome.value = value;
    } else if (std::string fault = fault_text_of(received); !fault.empty()) {
        outcome.failure = std::move(fault);
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        outcome.failure = "timed out after " + std::to_string(timeout_seconds) + " s";
    } else if (WIFSIGNALED(status)) {
        outcome.failure = "killed by signal " + std::to_string(WTERMSIG(status));
    } else {
        outcome.failure = "exit status " + std::to_string(WEXITSTATUS(status));
    }
    return outcome;
}

} // namespace nxmem::conform::detail
