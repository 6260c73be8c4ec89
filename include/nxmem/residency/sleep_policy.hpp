// What a sleeping pool does with the contents of the memory it gives back (docs/HOST.md
// "Residency"): discard them, back them up to host memory, or back them up to a file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace nxmem {

enum class sleep_policy_kind : std::uint8_t {
    discard = 0, // the contents are gone; after wake the bytes are unspecified (zero on posix-lazy)
    host = 1,    // copied to host memory (device memory: through the upstream's copies, ABI 1.4)
    file = 2,    // written to an unnamed file (host memory: the one backup that frees RAM)
};

constexpr std::string_view sleep_policy_name(sleep_policy_kind kind) noexcept {
    switch (kind) {
    case sleep_policy_kind::discard: return "discard";
    case sleep_policy_kind::host: return "host";
    case sleep_policy_kind::file: return "file";
    }
    return "unknown";
}

class sleep_policy {
public:
    static sleep_policy discard() { return sleep_policy(sleep_policy_kind::discard, {}, -1); }
    static sleep_policy host() { return sleep_policy(sleep_policy_kind::host, {}, -1); }
    // An unnamed file (O_TMPFILE) made in `directory`: it has no name, so a process killed while
    // asleep leaves nothing a restart could mistake for a backup; it goes when the pool wakes.
    static sleep_policy file_in(std::filesystem::path directory) {
        return sleep_policy(sleep_policy_kind::file, std::move(directory), -1);
    }
    // A file the engine opened for reading and writing: written from offset 0, and truncated to
    // 0 when the pool wakes. The engine keeps the descriptor; it must outlive the sleep.
    static sleep_policy file_descriptor(int descriptor) {
        return sleep_policy(sleep_policy_kind::file, {}, descriptor);
    }

    sleep_policy_kind kind() const noexcept { return kind_; }
    const std::filesystem::path& directory() const noexcept { return directory_; }
    int descriptor() const noexcept { return descriptor_; }

    // "discard", "host", "file:DIR" (the form torch.ops.nxmem.sleep takes), or "fd:N".
    std::string describe() const {
        if (kind_ != sleep_policy_kind::file) {
            return std::string(sleep_policy_name(kind_));
        }
        return descriptor_ >= 0 ? "fd:" + std::to_string(descriptor_) : "file:" + directory_.string();
    }

private:
    sleep_policy(sleep_policy_kind kind, std::filesystem::path directory, int descriptor)
        : kind_(kind), directory_(std::move(directory)), descriptor_(descriptor) {}
    sleep_policy_kind kind_;
    std::filesystem::path directory_;
    int descriptor_;
};

// A policy from its text: "discard", "host", "file:DIR"; false when the text names none.
inline bool parse_sleep_policy(std::string_view text, sleep_policy& out) {
    if (text == "discard") {
        out = sleep_policy::discard();
        return true;
    }
    if (text == "host") {
        out = sleep_policy::host();
        return true;
    }
    if (text.starts_with("file:") && text.size() > 5) {
        out = sleep_policy::file_in(std::filesystem::path(std::string(text.substr(5))));
        return true;
    }
    return false;
}

} // namespace nxmem
