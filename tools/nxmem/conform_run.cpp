#include "conform_run.hpp"

#include <nxmem/conform/suite.hpp>
#include <nxmem/host/module.hpp>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>

namespace nxmem::tool {

std::size_t mechanism_run::count(conform::outcome verdict) const {
    std::size_t total = 0;
    for (const conform_check& check : checks) {
        total += check.result.verdict == verdict ? 1 : 0;
    }
    return total;
}

bool plugin_run::conforms() const {
    if (load_error) {
        return false;
    }
    for (const mechanism_run& mechanism : mechanisms) {
        if (!mechanism.conforms()) {
            return false;
        }
    }
    return true;
}

std::string device_label(device_id device) {
    return std::string(device_type_name(device.type)) + ":" + std::to_string(device.index);
}

std::optional<device_id> parse_device(const std::string& text) {
    const std::size_t colon = text.find(':');
    const std::string type = text.substr(0, colon);
    std::int32_t index = 0;
    if (colon != std::string::npos) {
        const std::string digits = text.substr(colon + 1);
        if (digits.empty() || digits.size() > 6 ||
            digits.find_first_not_of("0123456789") != std::string::npos) {
            return std::nullopt;
        }
        index = static_cast<std::int32_t>(std::stol(digits));
    }
    for (NxmemDeviceType candidate : {NXMEM_DEVICE_CPU, NXMEM_DEVICE_CUDA, NXMEM_DEVICE_HIP,
                                      NXMEM_DEVICE_LEVEL_ZERO}) {
        if (device_type_name(candidate) == type) {
            return device_id{candidate, index};
        }
    }
    return std::nullopt;
}

namespace {

using emit_function = std::function<void(const nlohmann::json&)>;

struct child_outcome {
    std::vector<nlohmann::json> events;
    int wait_status = 0;
    bool timed_out = false;
};

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

// Runs `body` in a forked child; each event it emits is one JSON line on a pipe. The child never
// returns: it leaves with _exit, so nothing of the parent's is destroyed or flushed twice.
child_outcome run_in_child(const std::function<void(const emit_function&)>& body,
                           unsigned timeout_seconds) {
    child_outcome outcome;
    int fds[2];
    if (::pipe(fds) != 0) {
        throw std::runtime_error("pipe failed");
    }
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        throw std::runtime_error("fork failed");
    }
    if (child == 0) {
        ::close(fds[0]);
        const rlimit no_core{0, 0};
        (void)::setrlimit(RLIMIT_CORE, &no_core); // a crashing plugin leaves no core behind
        ::alarm(timeout_seconds);
        const int out = fds[1];
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
    std::string buffer;
    char chunk[4096];
    for (;;) {
        const ssize_t got = ::read(fds[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            break;
        }
        buffer.append(chunk, static_cast<std::size_t>(got));
        std::size_t newline = 0;
        while ((newline = buffer.find('\n')) != std::string::npos) {
            nlohmann::json event = nlohmann::json::parse(buffer.substr(0, newline), nullptr, false);
            if (!event.is_discarded()) {
                outcome.events.push_back(std::move(event));
            }
            buffer.erase(0, newline + 1);
        }
    }
    ::close(fds[0]);
    while (::waitpid(child, &outcome.wait_status, 0) < 0 && errno == EINTR) {
    }
    outcome.timed_out = WIFSIGNALED(outcome.wait_status) && WTERMSIG(outcome.wait_status) == SIGALRM;
    return outcome;
}

bool finished(const child_outcome& outcome) {
    return WIFEXITED(outcome.wait_status) && WEXITSTATUS(outcome.wait_status) == 0 &&
           !outcome.events.empty() && outcome.events.back().value("event", "") == "done";
}

// "signal 11", "exit status 1", "timed out after 300 s", or "no end-of-run mark".
std::string how_it_ended(const child_outcome& outcome, unsigned timeout_seconds) {
    if (outcome.timed_out) {
        return "timed out after " + std::to_string(timeout_seconds) + " s";
    }
    if (WIFSIGNALED(outcome.wait_status)) {
        return "signal " + std::to_string(WTERMSIG(outcome.wait_status));
    }
    if (WIFEXITED(outcome.wait_status) && WEXITSTATUS(outcome.wait_status) != 0) {
        return "exit status " + std::to_string(WEXITSTATUS(outcome.wait_status));
    }
    return "ended without finishing";
}

struct listed_mechanism {
    std::string name;
    device_id device;
};

void list_mechanisms(const conform_request& request, plugin_run& run,
                     std::vector<listed_mechanism>& listed) {
    const child_outcome outcome = run_in_child(
        [&](const emit_function& emit) {
            result<std::shared_ptr<host::plugin_module>> module = host::plugin_module::load(request.path);
            if (!module) {
                emit({{"event", "load_failed"}, {"message", module.error().describe()}});
                return;
            }
            for (const host::factory_info& factory : module.value()->factories()) {
                device_id device{NXMEM_DEVICE_CPU, 0};
                for (NxmemDeviceType type : {NXMEM_DEVICE_CPU, NXMEM_DEVICE_CUDA, NXMEM_DEVICE_HIP}) {
                    if (factory.serves(type)) {
                        device = device_id{type, 0};
                        break;
                    }
                }
                emit({{"event", "mechanism"}, {"name", factory.name}, {"type", device.type}});
            }
            (void)module.value()->try_unload();
        },
        request.timeout_seconds);
    for (const nlohmann::json& event : outcome.events) {
        const std::string kind = event.value("event", "");
        if (kind == "load_failed" || kind == "error") {
            run.load_error = event.value("message", "");
        } else if (kind == "mechanism") {
            listed.push_back({event.value("name", ""),
                              device_id{event.value("type", NXMEM_DEVICE_CPU), 0}});
        }
    }
    if (!finished(outcome) && !run.load_error) {
        run.load_error = "crashed (" + how_it_ended(outcome, request.timeout_seconds) +
                         ") while loading the plugin";
    }
}

mechanism_run run_mechanism(const conform_request& request, const std::string& name, device_id device) {
    mechanism_run run;
    run.name = name;
    run.device = device_label(device);
    const child_outcome outcome = run_in_child(
        [&](const emit_function& emit) {
            conform::suite_hooks hooks;
            hooks.on_start = [&](const conform::check_definition& check) {
                emit({{"event", "start"}, {"id", check.id}});
            };
            hooks.on_result = [&](const conform::check_result& result) {
                emit({{"event", "result"},
                      {"id", result.id},
                      {"title", result.title},
                      {"outcome", conform::outcome_name(result.verdict)},
                      {"expected", result.expected},
                      {"actual", result.actual}});
            };
            conform::suite_options options;
            options.mechanism_options = request.mechanism_options;
            (void)conform::run_mechanism_checks(request.path, name, device, options, hooks);
        },
        request.timeout_seconds);
    std::string running;
    std::string last_done;
    for (const nlohmann::json& event : outcome.events) {
        const std::string kind = event.value("event", "");
        if (kind == "start") {
            running = event.value("id", "");
        } else if (kind == "result") {
            conform_check check;
            check.result.id = event.value("id", "");
            check.result.title = event.value("title", "");
            const std::string verdict = event.value("outcome", "");
            check.result.verdict = verdict == "pass"   ? conform::outcome::pass
                                   : verdict == "fail" ? conform::outcome::fail
                                                       : conform::outcome::not_applicable;
            check.result.expected = event.value("expected", "");
            check.result.actual = event.value("actual", "");
            if (const conform::check_definition* definition = conform::find_check(check.result.id)) {
                check.rule = std::string(definition->rule);
            }
            run.checks.push_back(std::move(check));
            last_done = running;
            running.clear();
        } else if (kind == "error") {
            run.crash = "stopped by an exception: " + event.value("message", "");
        }
    }
    if (!finished(outcome) && !run.crash) {
        const std::string how = how_it_ended(outcome, request.timeout_seconds);
        if (!running.empty()) {
            run.crash = "crashed (" + how + ") during check " + running;
            conform_check crashed;
            crashed.result.id = running;
            if (const conform::check_definition* definition = conform::find_check(running)) {
                crashed.result.title = std::string(definition->title);
                crashed.rule = std::string(definition->rule);
            }
            crashed.result.verdict = conform::outcome::fail;
            crashed.result.expected = "the check runs to completion";
            crashed.result.actual = "crashed (" + how + ")";
            run.checks.push_back(std::move(crashed));
        } else {
            run.crash = "crashed (" + how + ")" +
                        (last_done.empty() ? std::string(" before the first check")
                                           : " after check " + last_done);
        }
    }
    return run;
}

} // namespace

plugin_run run_conformance(const conform_request& request) {
    plugin_run run;
    run.path = request.path;
    std::vector<listed_mechanism> listed;
    list_mechanisms(request, run, listed);
    if (run.load_error) {
        return run;
    }
    bool found = false;
    for (const listed_mechanism& mechanism : listed) {
        if (request.mechanism && mechanism.name != *request.mechanism) {
            continue;
        }
        found = true;
        run.mechanisms.push_back(
            run_mechanism(request, mechanism.name, request.device ? *request.device : mechanism.device));
    }
    if (request.mechanism && !found) {
        run.load_error = "the plugin has no mechanism called '" + *request.mechanism + "'";
    }
    return run;
}

} // namespace nxmem::tool
