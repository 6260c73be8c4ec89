// What a host tells the loader: the versions it speaks.
#pragma once

#include <nxmem/abi/version.hpp>

namespace nxmem::host {

struct load_options {
    // The host's range; an older host passes an older range and still drives newer plugins.
    abi::version_range host_range = abi::supported_range;
};

} // namespace nxmem::host
