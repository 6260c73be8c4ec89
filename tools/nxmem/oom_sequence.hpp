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

#include <nxmem/device.hpp>

#include <cstdint>
#include <filesystem>
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

// Whether `path` is mapped in this process (without loading it).
bool is_mapped(const std::filesystem::path& path) noexcept;

} // namespace nxmem::fault
