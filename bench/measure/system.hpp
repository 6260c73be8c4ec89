// What the process and the machine report about themselves: the load average (a ratio of two
// thread counts means little on a busy machine), minor page faults, the C heap's bytes in use,
// and resident and proportional set sizes.
#pragma once

#include <malloc.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace nxmem::measure {

// A positive count from the environment variable `name`, else `otherwise`.
inline std::uint64_t count_from_environment(const char* name, std::uint64_t otherwise) {
    const char* text = std::getenv(name);
    const std::uint64_t wanted = text != nullptr ? std::strtoull(text, nullptr, 10) : 0;
    return wanted != 0 ? wanted : otherwise;
}

// The 1-minute load average from /proc/loadavg; nullopt where it cannot be read.
inline std::optional<double> load_average() {
    std::ifstream file("/proc/loadavg");
    double one_minute = 0;
    if (!(file >> one_minute)) {
        return std::nullopt;
    }
    return one_minute;
}

// Minor page faults of the whole process so far (getrusage's ru_minflt): a page touched for the
// first time since it was mapped or given back costs one.
inline std::uint64_t minor_faults() noexcept {
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    return static_cast<std::uint64_t>(usage.ru_minflt);
}

// Bytes the C heap has handed out and not had back: chunks in its arenas plus chunks it mapped
// on its own (a large table lands there).
inline std::uint64_t heap_bytes_in_use() noexcept {
    const struct mallinfo2 info = ::mallinfo2();
    return static_cast<std::uint64_t>(info.uordblks) + static_cast<std::uint64_t>(info.hblkhd);
}

// One "Name:   N kB" field of a /proc/self file, in bytes; nullopt where absent.
inline std::optional<std::uint64_t> proc_kilobytes_field(const char* file_name, const std::string& field) {
    std::ifstream file(file_name);
    std::string line;
    while (std::getline(file, line)) {
        if (line.rfind(field + ":", 0) == 0) {
            std::istringstream fields(line.substr(field.size() + 1));
            std::uint64_t kilobytes = 0;
            if (fields >> kilobytes) {
                return kilobytes * 1024;
            }
        }
    }
    return std::nullopt;
}

// Proportional set size of the whole process: a page mapped n times counts 1/n at each mapping,
// so a prefix shared by many allocations counts about once.
inline std::optional<std::uint64_t> pss_bytes() { return proc_kilobytes_field("/proc/self/smaps_rollup", "Pss"); }
inline std::optional<std::uint64_t> rss_bytes() { return proc_kilobytes_field("/proc/self/smaps_rollup", "Rss"); }
// The process's peak resident set since it started or since reset_peak_rss().
inline std::optional<std::uint64_t> peak_rss_bytes() { return proc_kilobytes_field("/proc/self/status", "VmHWM"); }

// Resets VmHWM to the current RSS (Linux >= 4.0); false where the kernel refuses.
inline bool reset_peak_rss() {
    std::ofstream file("/proc/self/clear_refs");
    file << "5";
    file.flush();
    return static_cast<bool>(file);
}

} // namespace nxmem::measure
