// A plugin that breaks the rule the kit keeps (docs/PLUGINS.md): it allocates while dlopen runs
// its initialisers, as every kit plugin did before issue 23 (Boost.Exception's static exception
// objects), and throws from one when NXMEM_TEST_INITIALISER_THROWS is set. Otherwise it is the
// posix plugin.
#include "../../plugins/posix/posix_plugin.cpp"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

std::string allocate_at_load() {
    if (std::getenv("NXMEM_TEST_INITIALISER_THROWS") != nullptr) {
        throw std::runtime_error("an initialiser of the test fixture failed");
    }
    return std::string(100, 'x'); // past the small-string buffer: an allocation
}

// A global with a destructor: kept, and freed again at dlclose.
const std::string allocated_at_load = allocate_at_load();

} // namespace

