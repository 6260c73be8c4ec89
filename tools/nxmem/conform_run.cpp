#include "conform_run.hpp"

#include "child_process.hpp"

#include <nxmem/conform/suite.hpp>
#include <nxmem/host/module.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <exception>
#include <string_view>

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

// "during check ID, step \"STEP\"": where in the suite the child stopped.
std::string where(const std::string& check, const std::string& step) {
    std::string text = "during check " + check;
    if (!step.empty()) {
        text += ", step \"" + step + "\"";
    }
    return text;
}

} // namespace

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
    if (!outcome.finished() && !run.load_error) {
        run.load_error = (outcome.timed_out ? outcome.ending(request.timeout_seconds)
                                            : "crashed (" + outcome.ending(request.timeout_seconds) + ")") +
                         " while loading the plugin";
    }
}

namespace {

mechanism_run run_mechanism(const conform_request& request, const std::string& name, device_id device) {
    mechanism_run run;
    run.name = name;
    run.device = device_label(device);
    const child_outcome outcome = run_in_child(
        [&](const emit_function& emit) {
            conform::suite_hooks hooks;
            hooks.on_start = [&](const conform::check_definition& check) {
                emit({{"event", "start"}, {"id", check.id}});
                emit({{"event", "step"}, {"text", ""}}); // no step of this check yet
            };
            hooks.on_step = [&](std::string_view step) {
                emit({{"event", "step"}, {"text", step}});
            };
            hooks.on_result = [&](const conform::check_result& result) {
                emit({{"event", "result"},
                      {"id", result.id},
                      {"title", result.title},
                      {"outcome", conform::outcome_name(result.verdict)},
                      {"expected", result.expected},
                      {"actual", result.actual},
                      {"rules", result.rule}});
            };
            conform::suite_options options;
            options.mechanism_options = request.mechanism_options;
            options.model_seed = request.model_seed;
            options.model_steps = request.model_steps;
            options.rules.as_of = request.rules;
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
                                   : verdict == "warn" ? conform::outcome::warn
                                                       : conform::outcome::not_applicable;
            check.result.expected = event.value("expected", "");
            check.result.rule = event.value("rules", "");
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
    if (!outcome.finished() && !run.crash) {
        // "timed out after 30 s" or "crashed (SIGSEGV: a write at address 0x0)"
        const std::string how = outcome.timed_out
                                    ? outcome.ending(request.timeout_seconds)
                                    : "crashed (" + outcome.ending(request.timeout_seconds) + ")";
        run.timed_out = outcome.timed_out;
        if (!running.empty()) {
            run.crash = how + " " + where(running, outcome.last_step);
            conform_check stopped;
            stopped.result.id = running;
            if (const conform::check_definition* definition = conform::find_check(running)) {
                stopped.result.title = std::string(definition->title);
                stopped.rule = std::string(definition->rule);
            }
            stopped.result.verdict = conform::outcome::fail;
            stopped.result.expected = "the check runs to completion";
            stopped.result.actual = how + (outcome.last_step.empty() ? std::string()
                                                               : " at step \"" + outcome.last_step + "\"");
            run.checks.push_back(std::move(stopped));
        } else {
            run.crash = how + (last_done.empty() ? std::string(" before the first check")
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
    if (auto unlisted = unlisted_mechanism(request, listed)) {
        run.load_error = std::move(unlisted);
        return run;
    }
    for (const listed_mechanism& mechanism : listed) {
        if (asks_for(request, mechanism.name)) {
            run.mechanisms.push_back(
                run_mechanism(request, mechanism.name, request.device ? *request.device : mechanism.device));
        }
    }
    return run;
}

bool asks_for(const conform_request& request, const std::string& name) {
    return request.mechanisms.empty() ||
           std::find(request.mechanisms.begin(), request.mechanisms.end(), name) != request.mechanisms.end();
}

std::optional<std::string> unlisted_mechanism(const conform_request& request,
                                              const std::vector<listed_mechanism>& listed) {
    for (const std::string& asked : request.mechanisms) {
        if (std::none_of(listed.begin(), listed.end(),
                         [&](const listed_mechanism& mechanism) { return mechanism.name == asked; })) {
            return "the plugin has no mechanism called '" + asked + "'";
        }
    }
    return std::nullopt;
}

} // namespace nxmem::tool
