// Must not compile: NXMEM_EXPORT_PLUGIN of a mechanism whose allocate is misspelt. The build's
// message names the class and the member in one static assertion
// (test/plugin_kit/check_export_diagnostic.sh).
#include <nxmem/plugin.hpp>

#include <cstdint>
#include <memory>

namespace {

struct misspelt_arena {
    static constexpr const char* name = "misspelt-arena";
    static constexpr std::uint64_t mechanism_id = 7;
    static constexpr std::uint64_t device_types = nxmem::plugin::device_bit(NXMEM_DEVICE_CPU);
    static nxmem::result<std::unique_ptr<misspelt_arena>> open(nxmem::plugin::open_context&) {
        return std::make_unique<misspelt_arena>();
    }
    nxmem::result<nxmem::plugin::block> alocate(std::uint64_t, std::uint64_t) { return nxmem::plugin::block{}; }
    nxmem::result<void> deallocate(const nxmem::plugin::allocation_record&) { return nxmem::success(); }
};

} // namespace

NXMEM_EXPORT_PLUGIN(misspelt_arena);
