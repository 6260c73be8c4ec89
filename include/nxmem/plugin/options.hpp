// Open options as a mechanism sees them: `key=value` entries separated by ';' or '\n'. Every
// option must be taken by the mechanism; one left over is refused with its name. Messages show
// keys and values through detail::printable: a raw byte the host sent never comes back (E13).
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/printable.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nxmem::plugin {

class options {
public:
    // Parses `text`; refuses an entry without '=' or with an empty key, and duplicate keys.
    static result<options> parse(std::string_view text) {
        if (text.size() > NXMEM_MAX_OPTIONS_BYTES) {
            return fail(status_code::invalid_argument,
                        "options text of " + std::to_string(text.size()) + " bytes exceeds " +
                            std::to_string(NXMEM_MAX_OPTIONS_BYTES));
        }
        options parsed;
        while (!text.empty()) {
            const std::size_t end = text.find_first_of(";\n");
            std::string_view entry = trim(text.substr(0, end));
            text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
            if (entry.empty()) {
                continue;
            }
            const std::size_t equals = entry.find('=');
            if (equals == std::string_view::npos || trim(entry.substr(0, equals)).empty()) {
                return fail(status_code::invalid_argument,
                            "option '" + nxmem::detail::printable(entry) + "' is not of the form key=value");
            }
            std::string key(trim(entry.substr(0, equals)));
            if (parsed.find(key) != parsed.entries_.end()) {
                return fail(status_code::invalid_argument, "option '" + nxmem::detail::printable(key) + "' given twice");
            }
            parsed.entries_.push_back({std::move(key), std::string(trim(entry.substr(equals + 1))), false});
        }
        return parsed;
    }

    // The value of `key`, marking it as understood; nullopt when absent.
    std::optional<std::string> take(std::string_view key) {
        auto found = find(key);
        if (found == entries_.end()) {
            return std::nullopt;
        }
        found->taken = true;
        return found->value;
    }

    // The value of `key` as an unsigned integer (suffixes k, M, G: binary multiples).
    result<std::optional<std::uint64_t>> take_bytes(std::string_view key) {
        std::optional<std::string> text = take(key);
        if (!text) {
            return std::optional<std::uint64_t>{};
        }
        std::uint64_t value = 0;
        const char* first = text->data();
        const char* last = first + text->size();
        auto [rest, error] = std::from_chars(first, last, value);
        unsigned shift = 0;
        if (error == std::errc{} && rest + 1 == last) {
            shift = *rest == 'k' || *rest == 'K' ? 10 : *rest == 'M' ? 20 : *rest == 'G' ? 30 : 64;
            rest = shift == 64 ? rest : last;
        }
        if (error != std::errc{} || rest != last || (shift != 0 && value > (UINT64_MAX >> shift))) {
            return fail(status_code::invalid_argument,
                        "option '" + nxmem::detail::printable(key) + "' = '" + nxmem::detail::printable(*text) + "' is not a byte count");
        }
        return std::optional<std::uint64_t>{value << shift};
    }

    // The value of `key` as a boolean (true/false/1/0/on/off).
    result<std::optional<bool>> take_flag(std::string_view key) {
        std::optional<std::string> text = take(key);
        if (!text) {
            return std::optional<bool>{};
        }
        if (*text == "1" || *text == "true" || *text == "on") {
            return std::optional<bool>{true};
        }
        if (*text == "0" || *text == "false" || *text == "off") {
            return std::optional<bool>{false};
        }
        return fail(status_code::invalid_argument,
                    "option '" + nxmem::detail::printable(key) + "' = '" + nxmem::detail::printable(*text) + "' is not a boolean");
    }

    // INVALID_ARGUMENT naming every option nobody took.
    result<void> refuse_unknown(std::string_view mechanism) const {
        std::string unknown;
        for (const entry& item : entries_) {
            if (!item.taken) {
                unknown += (unknown.empty() ? "'" : ", '") + nxmem::detail::printable(item.key) + "'";
            }
        }
        if (!unknown.empty()) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + " does not know the option(s) " + unknown);
        }
        return boost::outcome_v2::success();
    }

private:
    struct entry {
        std::string key;
        std::string value;
        bool taken = false;
    };

    static std::string_view trim(std::string_view text) {
        const std::size_t first = text.find_first_not_of(" \t\r");
        if (first == std::string_view::npos) {
            return {};
        }
        return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
    }
    std::vector<entry>::iterator find(std::string_view key) {
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            if (it->key == key) {
                return it;
            }
        }
        return entries_.end();
    }

    std::vector<entry> entries_;
};

} // namespace nxmem::plugin
