// What `nxmem conform` learned about each plugin and mechanism, and how it learned it: each
// mechanism's checks run in a forked child that streams its events (JSON lines) down a pipe.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/rules.hpp>
#include <nxmem/device.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::tool {

struct conform_check {
    conform::check_result result;
    std::string rule; // the section of docs/ABI.md; empty for a synthesised result
};

struct mechanism_run {
    std::string name;
    std::string device; // "cpu:0"
    std::vector<conform_check> checks;
    // How the child stopped early: "crashed (SIGSEGV: a write at address 0x0) during check X,
    // step \"S\"" or "timed out (timed out after 300 s) during check X, step \"S\"".
    std::optional<std::string> crash;
    bool timed_out = false; // the stop was the timeout, not a crash

    std::size_t count(conform::outcome verdict) const;
    bool conforms() const { return !crash && count(conform::outcome::fail) == 0; }
};

struct plugin_run {
    std::string path;
    std::optional<std::string> load_error; // the plugin could not even be listed
    std::vector<mechanism_run> mechanisms;

    bool conforms() const;
};

struct conform_request {
    std::string path;
    std::vector<std::string> mechanisms;  // only these (--mechanism, repeated); every one when empty
    std::optional<device_id> device;      // instead of each mechanism's default
    unsigned timeout_seconds = 300;       // per mechanism
    std::string mechanism_options;        // key=value open options for every mechanism (--options)
    std::uint64_t model_seed = 1;         // model.sequences (--seed)
    unsigned model_steps = 5000;          // model.sequences (--steps)
    std::optional<conform::contract_release> rules; // judge by this release's rules (--rules)
};

struct listed_mechanism {
    std::string name;
    device_id device; // device 0 of the first type it serves
};

// Lists the plugin's mechanisms in a child; a plugin that cannot be loaded sets run.load_error.
void list_mechanisms(const conform_request& request, plugin_run& run,
                     std::vector<listed_mechanism>& listed);

// Whether the request asks for mechanism `name` (every one when it names none).
bool asks_for(const conform_request& request, const std::string& name);
// The refusal when the request names a mechanism the plugin does not list.
std::optional<std::string> unlisted_mechanism(const conform_request& request,
                                              const std::vector<listed_mechanism>& listed);

// Lists the plugin's mechanisms in one child, then runs each mechanism's checks in another.
plugin_run run_conformance(const conform_request& request);

// "cpu:0" and back.
std::string device_label(device_id device);
std::optional<device_id> parse_device(const std::string& text);

} // namespace nxmem::tool
