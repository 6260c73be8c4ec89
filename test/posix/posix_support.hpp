// Helpers for the posix plugin's tests: where the plugin is, what the kernel says about pages
// (mincore) and what the process holds (/proc/self/status and smaps_rollup).
#pragma once

#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::test {

inline std::string posix_plugin_path() { return plugin_path("NXMEM_POSIX_PLUGIN"); }

inline std::uint64_t page_size() { return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)); }

// How many of the `pages` pages at `address` are resident, as mincore reports them.
inline std::uint64_t resident_pages(const void* address, std::uint64_t pages) {
    std::vector<unsigned char> residency(pages);
    REQUIRE(::mincore(const_cast<void*>(address), pages * page_size(), residency.data()) == 0);
    std::uint64_t resident = 0;
    for (unsigned char page : residency) {
        resident += page & 1u;
    }
    return resident;
}

// A "Key:   1234 kB" field of a /proc file, in bytes; 0 when absent.
inline std::uint64_t proc_field_bytes(const char* file, const std::string& key) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key + ":", 0) == 0) {
            std::istringstream fields(line.substr(key.size() + 1));
            std::uint64_t kilobytes = 0;
            fields >> kilobytes;
            return kilobytes * 1024;
        }
    }
    return 0;
}

// What the process holds in anonymous and shared memory, two ways:
//   rss  RssAnon + RssShmem: every page table entry counted, so one shared page mapped at eight
//        addresses counts eight times;
//   pss  Pss_Anon + Pss_Shmem: each page divided among its mappings, so it counts once.
struct process_memory {
    std::uint64_t rss = 0;
    std::uint64_t pss = 0;

    static process_memory now() {
        return {proc_field_bytes("/proc/self/status", "RssAnon") +
                    proc_field_bytes("/proc/self/status", "RssShmem"),
                proc_field_bytes("/proc/self/smaps_rollup", "Pss_Anon") +
                    proc_field_bytes("/proc/self/smaps_rollup", "Pss_Shmem")};
    }
};

// The same two figures for the mappings that overlap `ranges` ([first, end) addresses) only, from
// /proc/self/smaps: what those allocations cost, without the heap, the test's own memory or a
// sanitizer's shadow memory (ThreadSanitizer's shadows every byte an access touches, per address,
// so it grows with every mapping of a shared page).
inline process_memory mapped_memory(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    process_memory sum;
    while (std::getline(smaps, line)) {
        std::uint64_t first = 0;
        std::uint64_t end = 0;
        char dash = 0;
        std::istringstream header(line);
        if (header >> std::hex >> first >> dash >> end && dash == '-' &&
            line.find(':') > line.find(' ')) {
            inside = false;
            for (const auto& range : ranges) {
                inside = inside || (first < range.second && range.first < end);
            }
            continue;
        }
        if (!inside) {
            continue;
        }
        std::istringstream fields(line);
        std::string key;
        std::uint64_t kilobytes = 0;
        fields >> key >> kilobytes;
        if (key == "Rss:") {
            sum.rss += kilobytes * 1024;
        } else if (key == "Pss:") {
            sum.pss += kilobytes * 1024;
        }
    }
    return sum;
}

// Whether this build runs under ThreadSanitizer, whose shadow memory distorts process-wide figures.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool thread_sanitizer = true;
#else
inline constexpr bool thread_sanitizer = false;
#endif
#else
inline constexpr bool thread_sanitizer = false;
#endif

// Whether this build runs under AddressSanitizer, which keeps the shadow pages of memory the test
// touched after that memory is unmapped (one shadow byte per 8: 64 MiB for this test's 512 MiB).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool address_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool address_sanitizer = true;
#else
inline constexpr bool address_sanitizer = false;
#endif
#else
inline constexpr bool address_sanitizer = false;
#endif

inline constexpr std::uint64_t mib = 1ull << 20;

} // namespace nxmem::test
