// The values allocators hand out and take back: allocations, ranges, release outcomes.
#pragma once

#include <nxmem/device.hpp>

#include <cstdint>
#include <string_view>

namespace nxmem {

// A live allocation on device D. `allocation_id` is host-assigned and unique, never derived
// from the address; together with the mechanism and the device it names one allocation.
template <Device D> struct allocation {
    typename D::address_type address{};
    std::uint64_t size = 0;
    std::uint64_t alignment = 0;
    std::uint64_t allocation_id = 0;
    std::uint64_t mechanism_id = 0;
    device_id device{};
    friend bool operator==(const allocation&, const allocation&) = default;
};

// A byte range relative to an allocation's start.
struct byte_range {
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
};

// How a release ended, as the engine sees it. FAILED is never a value of this type: a failed
// release is an error, and the allocation stays live.
enum class release_state : std::uint32_t {
    complete = NXMEM_RELEASE_COMPLETE,
    quarantined = NXMEM_RELEASE_QUARANTINED,
};

struct release_report {
    release_state state = release_state::complete;
    std::uint64_t unmapped_bytes = 0;       // credited back (complete)
    std::uint64_t residual_owned_bytes = 0; // kept by the mechanism, never refunded (quarantined)
};

constexpr std::string_view release_state_name(release_state state) noexcept {
    return state == release_state::complete ? "complete" : "quarantined";
}

} // namespace nxmem
