// The states of a resident pool and what a sleep or a wake reports (docs/HOST.md "Residency").
#pragma once

#include <nxmem/pool/pool_usage.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace nxmem {

enum class residency_state : std::uint8_t {
    awake = 0,    // allocates and releases as a pool does
    sleeping = 1, // a sleep is under way: allocate refused (BUSY), releases wait for it
    asleep = 2,   // committed memory given back, addresses kept: allocate refused (BUSY); release works
    waking = 3,   // a wake is under way: as sleeping
};

constexpr std::string_view residency_state_name(residency_state state) noexcept {
    switch (state) {
    case residency_state::awake: return "awake";
    case residency_state::sleeping: return "sleeping";
    case residency_state::asleep: return "asleep";
    case residency_state::waking: return "waking";
    }
    return "unknown";
}

// What one sleep or wake did (summed over the pools of a tag group).
struct residency_report {
    std::uint64_t pools = 0;                // that changed state
    std::uint64_t unchanged_pools = 0;      // already in the state asked for: nothing done
    std::uint64_t ranges = 0;               // committed ranges given back (sleep) or committed again (wake)
    std::uint64_t bytes = 0;                // their bytes
    std::uint64_t backed_up_bytes = 0;      // kept in the backup (sleep), or restored from it (wake)
    std::uint64_t still_resident_bytes = 0; // ranges the upstream refused to decommit: kept, intact
};

// What a resident pool holds, asleep or awake.
struct residency_usage {
    std::string tag;
    residency_state state = residency_state::awake;
    std::uint64_t asleep_bytes = 0;    // given back by sleep, to be committed again by wake
    std::uint64_t backed_up_bytes = 0; // of those, kept in the backup
    sleep_policy_kind policy = sleep_policy_kind::discard; // of the current sleep
    std::string backup_location;       // "host memory", "an unnamed file in DIR", ...
    std::uint64_t committed_bytes = 0; // committed now (0 asleep, unless the upstream refused a decommit)
    pool_usage pool;                   // the pool's own figures (they do not change with sleep)
};

} // namespace nxmem
