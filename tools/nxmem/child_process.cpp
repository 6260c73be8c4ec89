#include "child_process.hpp"

#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/fault_report.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <stdexcept>

namespace nxmem::tool {

namespace {

// Writes all of `text` to `fd`, retrying short writes.
void write_all(int fd, const std::string& text) {
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t written = ::write(fd, text.data() + done, text.size() - done);
        if (written < 0 && errno == EINTR) {
            continue;
        }
        if (written <= 0) {
            return;
        }
        done += static_cast<std::size_t>(written);
    }
}

// "SIGABRT" for a signal number, "signal 77" for one without a name.
std::string signal_label(int number) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    if (const char* name = ::sigabbrev_np(number)) {
        return std::string("SIG") + name;
    }
#endif
    return "signal " + std::to_string(number);
}

void take_event(child_outcome& outcome, const std::string& line) {
    nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
    if (event.is_discarded()) {
        return;
    }
    const std::string kind = event.value("event", "");
    if (kind == "step") {
        outcome.last_step = event.value("text", "");
    } else if (kind == "fault") {
        outcome.fault = event.value("text", "");
    } else {
        outcome.events.push_back(std::move(event));
    }
}

} // namespace

bool child_outcome::finished() const {
    return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 && !events.empty() &&
           events.back().value("event", "") == "done";
}

std::string child_outcome::ending(unsigned timeout_seconds) const {
    if (timed_out) {
        return "timed out after " + std::to_string(timeout_seconds) + " s";
    }
    if (!fault.empty()) {
        return fault;
    }
    if (WIFSIGNALED(wait_status)) {
        return signal_label(WTERMSIG(wait_status));
    }
    if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0) {
        return "exit status " + std::to_string(WEXITSTATUS(wait_status));
    }
    return "ended without finishing";
}

child_outcome run_in_child(const std::function<void(const emit_function&)>& body,
                           unsigned timeout_seconds) {
    child_outcome outcome;
    int fds[2];
    if (::pipe(fds) != 0) {
        throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
    }
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    }
    if (child == 0) {
        ::close(fds[0]);
        const rlimit no_core{0, 0};
        (void)::setrlimit(RLIMIT_CORE, &no_core); // a crashing plugin leaves no core behind
        const int out = fds[1];
        conform::detail::install_fault_reporter(out);
        ::alarm(timeout_seconds);
        const emit_function emit = [out](const nlohmann::json& event) {
            write_all(out, event.dump() + "\n");
        };
        try {
            body(emit);
            emit({{"event", "done"}});
        } catch (const std::exception& failure) {
            emit({{"event", "error"}, {"message", failure.what()}});
        }
        ::close(out);
        ::_exit(0);
    }
    ::close(fds[1]);
    const std::string received = conform::detail::read_until_closed(fds[0]);
    for (std::size_t begin = 0, newline = 0;
         (newline = received.find('\n', begin)) != std::string::npos; begin = newline + 1) {
        take_event(outcome, received.substr(begin, newline - begin));
    }
    ::close(fds[0]);
    while (::waitpid(child, &outcome.wait_status, 0) < 0 && errno == EINTR) {
    }
    outcome.timed_out = WIFSIGNALED(outcome.wait_status) && WTERMSIG(outcome.wait_status) == SIGALRM;
    return outcome;
}

} // namespace nxmem::tool
