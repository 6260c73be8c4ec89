// Deferred release for a mechanism whose release waits for nothing (munmap, the CUDA driver's
// unmap): a queued allocation retires at once, with the outcome of releasing it then.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <optional>
#include <utility>

namespace nxmem::posix {

inline result<std::optional<plugin::release_outcome>> retired_now(result<plugin::release_outcome> released) {
    NXMEM_TRY(outcome, std::move(released));
    return std::optional<plugin::release_outcome>{outcome};
}

} // namespace nxmem::posix
