// The standard sequence that allocation-failure injection runs, once per failed allocation: what
// an engine does with one mechanism of a plugin, start to end. `nxmem conform --oom` runs it
// failing the plugin's allocations; test/fault_injection runs it failing the host's and the
// plugin's.
//
//   load (dlopen and the plugin's initialisers, NxmemNegotiate, NxmemCreateAllocatorFactories),
//   pin, open the mechanism, allocate twice, commit/mapped_bytes/decommit (virtual backing),
//   create/retain/commit/release a shared prefix (shared mapping), release, enqueue_release and
//   drain (deferred release) or release, query_usage, close, readiness, try_unload.
//
// Each call must succeed, or answer OUT_OF_MEMORY (or the step's documented code) with both
// tallies as they were before it (and, for load, nothing left mapped), and then succeed when
// repeated. After the unload the library must be unmapped (dlopen RTLD_NOLOAD) and, when the
// plugin's allocations are tracked (allocation_failure.hpp), none of them may be left.
// Nothing here allocates while noting a failure: the first one is kept in a fixed buffer.
#pragma once

#include "allocation_failure.hpp"

#include <nxmem/device.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace nxmem::fault {

class sequence_run {
public:
    // Notes a failure ("STEP: WHAT: DETAIL"); only the first is kept.
    void note(const char* step, const char* what, const char* detail) noexcept;

    bool failed() const noexcept { return failed_; }
    const char* first_failure() const noexcept { return first_failure_; }

    // How many allocations of the counted side loading the plugin made (all of them, when the
    // load was the last step reached).
    std::uint64_t allocations_to_load = 0;

private:
    bool failed_ = false;
    char first_failure_[1024] = {};
};

// Runs the sequence on `mechanism` of the plugin at `path`, on `device`, opening it with
// `options`; every failure is noted in `run`, none thrown.
void run_sequence(sequence_run& run, const std::filesystem::path& path, std::string_view mechanism,
                  device_id device, std::string_view options);

// What to run the sequence on.
struct sequence_subject {
    std::filesystem::path path;
    std::string_view mechanism;
    device_id device{NXMEM_DEVICE_CPU, 0};
    std::string_view options;
    unsigned timeout_seconds = 300; // for each child
};

// What a sweep found, kept in fixed buffers (a sweep allocates nothing between its children).
struct sweep_report {
    // The clean run: how many allocations of the counted side, how many of them loading, and
    // how it ended ("" when clean; then nothing was failed).
    std::uint64_t allocations = 0;
    std::uint64_t allocations_to_load = 0;
    char clean_failure[1024] = {};
    // The runs with one allocation failing: how many there were and how many did not end cleanly,
    // with the first few of those ("allocation N: STEP: WHAT: DETAIL").
    std::uint64_t failed_at_first = 0;
    std::uint64_t runs = 0;
    std::uint64_t unclean = 0;
    static constexpr int kept = 3;
    char first_unclean[kept][1024] = {};
};

// Runs the sequence once without a failure, then once for each allocation of `counted` from the
// first (or, with `skip_load`, the first after those loading made) to the last, each in a child
// forked from this process: the clean run counts, each child fails one. Nothing is allocated in
// this process between the children, so each starts from the same heap and makes the same
// allocations in the same order (a mechanism's bookkeeping may depend on the addresses it gets).
// In AddressSanitizer builds each child also asks LeakSanitizer.
void sweep(const sequence_subject& subject, side counted, bool skip_load, sweep_report& report);

// Whether `path` is mapped in this process (without loading it).
bool is_mapped(const std::filesystem::path& path) noexcept;

} // namespace nxmem::fault
