#include "names.hpp"

#include <nxmem/abi/layout.hpp>
#include <nxmem/device.hpp>

#include <cctype>

namespace nxmem::tool {

namespace {
// "NXMEM_CAP_VIRTUAL_BACKING" -> "virtual-backing"
std::string flag_label(std::string_view flag_name) {
    constexpr std::string_view prefix = "NXMEM_CAP_";
    if (flag_name.starts_with(prefix)) {
        flag_name.remove_prefix(prefix.size());
    }
    std::string label;
    for (const char c : flag_name) {
        label += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return label;
}
} // namespace

std::vector<std::string> capability_names(NxmemCapabilities capabilities) {
    std::vector<std::string> names;
    NxmemCapabilities known = 0;
    for (const abi::capability_pair& pair : abi::allocator_capabilities) {
        known |= pair.flag;
        if ((capabilities & pair.flag) != 0) {
            names.push_back(flag_label(pair.flag_name));
        }
    }
    for (unsigned bit = 0; bit < 64; ++bit) {
        const NxmemCapabilities flag = NxmemCapabilities{1} << bit;
        if ((capabilities & flag) != 0 && (known & flag) == 0) {
            names.push_back("unknown(bit " + std::to_string(bit) + ")");
        }
    }
    return names;
}

std::string device_type_label(NxmemDeviceType type) {
    const std::string_view name = device_type_name(type);
    if (name == "unknown") {
        return "unknown(" + std::to_string(type) + ")";
    }
    return std::string(name);
}

std::vector<std::string> device_type_names(std::uint64_t device_types) {
    std::vector<std::string> names;
    for (NxmemDeviceType type = 0; type < 64; ++type) {
        if ((device_types & (std::uint64_t{1} << type)) != 0) {
            names.push_back(device_type_label(type));
        }
    }
    return names;
}

std::string version_label(std::uint32_t major, std::uint32_t minor) {
    return std::to_string(major) + "." + std::to_string(minor);
}

std::string version_label(const abi::negotiated_version& version) {
    return version_label(version.major, version.minor);
}

std::string join(const std::vector<std::string>& words, std::string_view separator,
                 std::string_view if_empty) {
    if (words.empty()) {
        return std::string(if_empty);
    }
    std::string text;
    for (const std::string& word : words) {
        if (!text.empty()) {
            text += separator;
        }
        text += word;
    }
    return text;
}

} // namespace nxmem::tool
