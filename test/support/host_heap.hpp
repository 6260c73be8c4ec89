// Host memory from the C++ heap at the alignment asked for: what the test fixture plugins
// (plugins/testplugin, test/host/rule_probe_plugin.cpp) hand out, so only the rule they exercise
// differs from one mechanism to the next.
#pragma once

#include <nxmem/plugin.hpp>

#include <cstdint>
#include <new>
#include <string>

namespace nxmem::test {

inline result<std::uint64_t> take_host_memory(std::uint64_t size, std::uint64_t alignment) {
    void* memory = ::operator new(size, std::align_val_t{alignment}, std::nothrow);
    if (memory == nullptr) {
        return fail(status_code::out_of_memory, "host heap refused " + std::to_string(size) + " bytes");
    }
    return reinterpret_cast<std::uint64_t>(memory);
}

inline void give_back_host_memory(const plugin::allocation_record& record) {
    ::operator delete(reinterpret_cast<void*>(record.address), std::align_val_t{record.alignment});
}

} // namespace nxmem::test
