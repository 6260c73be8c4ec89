// What the operating system says, for the claims a plugin makes that are physical: whether pages
// are resident (mincore), how many file descriptors the process holds (/proc/self/fd) and how many
// memfd mappings it has (/proc/self/maps). The model check asks these instead of believing the
// plugin's own figures.
#pragma once

#include <nxmem/detail/page_size.hpp>

#include <sys/mman.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace nxmem::conform::model {

// The number of pages of [address, address + length) that are resident, or nullopt when the range
// is not mapped at all. `address` and `length` are page multiples.
inline std::optional<std::uint64_t> resident_pages(std::uint64_t address, std::uint64_t length) {
    const std::uint64_t page = nxmem::detail::system_page_bytes();
    std::vector<unsigned char> flags((length + page - 1) / page);
    if (flags.empty()) {
        return 0;
    }
    if (::mincore(reinterpret_cast<void*>(address), length, flags.data()) != 0) {
        return std::nullopt;
    }
    std::uint64_t resident = 0;
    for (unsigned char flag : flags) {
        resident += (flag & 1u) != 0 ? 1 : 0;
    }
    return resident;
}

// Open file descriptors of this process.
inline std::uint64_t open_descriptors() {
    std::error_code ignored;
    std::uint64_t count = 0;
    for (auto entry = std::filesystem::directory_iterator("/proc/self/fd", ignored);
         entry != std::filesystem::directory_iterator(); entry.increment(ignored)) {
        ++count;
    }
    return count;
}

// Mappings of memfd files (the shared memory a plugin hands out by descriptor).
inline std::uint64_t memfd_mappings() {
    std::ifstream maps("/proc/self/maps");
    std::uint64_t count = 0;
    for (std::string line; std::getline(maps, line);) {
        count += line.find("/memfd:") != std::string::npos ? 1 : 0;
    }
    return count;
}

} // namespace nxmem::conform::model
