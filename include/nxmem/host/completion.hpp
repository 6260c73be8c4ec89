// A deferred release that retired, as the host reports it to the engine.
#pragma once

#include <nxmem/allocation.hpp>

#include <cstdint>

namespace nxmem::host {

struct release_completion {
    std::uint64_t ticket = 0;
    std::uint64_t allocation_id = 0;
    release_report report{};
};

} // namespace nxmem::host
