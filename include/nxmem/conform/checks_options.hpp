// Open options against the documented grammar (ABI.md X9, Q14, E13), fuzzed from the options the
// suite runs with (`nxmem conform --options`, none by default). Texts the grammar accepts (the
// same entries reordered, with blanks and empty entries between them) must open; texts it refuses
// (an unknown key anywhere, also after a known one; a key given twice; a negative number where a
// known key had a number; an entry without '='; an empty key) must be refused with
// INVALID_ARGUMENT naming the key, in a message that is valid UTF-8 without control bytes even
// when the key held raw bytes. Every text is handed over in a buffer that ends at a PROT_NONE
// page, in a child process, so a plugin that reads past options_length (strlen, say) faults.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_rollback.hpp>
#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/printable.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nxmem::conform {

namespace detail {

struct option_entry {
    std::string key;
    std::string value;
};

// `text` read by X9's grammar; nullopt when it is not well formed (the suite's own options are
// then the user's mistake, and the grammar is not fuzzed).
inline std::optional<std::vector<option_entry>> parse_options(std::string_view text) {
    auto trim = [](std::string_view part) {
        const std::size_t first = part.find_first_not_of(" \t\r");
        return first == std::string_view::npos
                   ? std::string_view{}
                   : part.substr(first, part.find_last_not_of(" \t\r") - first + 1);
    };
    std::vector<option_entry> entries;
    while (!text.empty()) {
        const std::size_t end = text.find_first_of(";\n");
        const std::string_view entry = trim(text.substr(0, end));
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        if (entry.empty()) {
            continue;
        }
        const std::size_t equals = entry.find('=');
        if (equals == std::string_view::npos || trim(entry.substr(0, equals)).empty()) {
            return std::nullopt;
        }
        entries.push_back({std::string(trim(entry.substr(0, equals))), std::string(trim(entry.substr(equals + 1)))});
    }
    return entries;
}

// A decimal byte count, with or without a k/K/M/G suffix: the values a negative sign must not turn
// into a huge one.
inline bool is_number(std::string_view value) {
    if (!value.empty() && std::string_view("kKMG").find(value.back()) != std::string_view::npos) {
        value.remove_suffix(1);
    }
    return !value.empty() && std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct option_case {
    std::string text;
    bool accepted = false;
    std::string named; // a refusal's message names this ("" when the key cannot be named)
    std::string why;   // the grammar's reason
    std::string rule;  // what a wrong answer contradicts: Q14 (unknown keys, since the first
                       // contract) or X9 (the grammar's details, since 1.2 of 2026-12-01)
};

// The cases: the grammar's accepted forms of `entries`, and its refusals.
inline std::vector<option_case> option_cases(const std::vector<option_entry>& entries, std::uint64_t seed) {
    std::mt19937_64 random(seed);
    auto pick = [&random](std::size_t n) { return static_cast<std::size_t>(random() % n); };
    auto join = [&](const std::vector<option_entry>& items, bool decorate) {
        static constexpr const char* blanks[] = {"", " ", "\t", " \r", "  "};
        std::string text;
        for (const option_entry& item : items) {
            if (!text.empty() || (decorate && pick(3) == 0)) {
                text += decorate ? (pick(2) == 0 ? ";" : "\n") : ";";
            }
            if (decorate && pick(3) == 0) {
                text += std::string(blanks[pick(5)]) + ";"; // an empty entry
            }
            text += decorate ? std::string(blanks[pick(5)]) + item.key + blanks[pick(5)] + "=" + blanks[pick(5)] +
                                   item.value + blanks[pick(5)]
                             : item.key + "=" + item.value;
        }
        if (decorate && pick(2) == 0) {
            text += ";";
        }
        return text;
    };
    const std::string base = join(entries, false);
    const std::string unknown = "nxmem_conform_unknown";
    std::vector<option_case> cases;
    cases.push_back({base, true, "", "the suite's options as given", "Q14"});
    for (int round = 0; round < 6; ++round) {
        std::vector<option_entry> shuffled = entries;
        std::shuffle(shuffled.begin(), shuffled.end(), random);
        cases.push_back({join(shuffled, true), true, "", "the same entries reordered, with blanks and empty entries", "X9"});
    }
    cases.push_back({base + (base.empty() ? "" : ";") + unknown + "=1", false, unknown, "an unknown key after every known one", "Q14"});
    cases.push_back({unknown + "=1;" + base, false, unknown, "an unknown key before every known one", "Q14"});
    for (int round = 0; round < 3; ++round) {
        std::vector<option_entry> with = entries;
        with.insert(with.begin() + static_cast<std::ptrdiff_t>(pick(with.size() + 1)), option_entry{unknown, "2"});
        cases.push_back({join(with, true), false, unknown, "an unknown key among the known ones", "Q14"});
    }
    for (const option_entry& item : entries) {
        std::vector<option_entry> twice = entries;
        twice.push_back(item);
        cases.push_back({join(twice, false), false, item.key, "the key " + item.key + " given twice", "X9"});
        if (is_number(item.value)) {
            std::vector<option_entry> negative = entries;
            for (option_entry& changed : negative) {
                if (changed.key == item.key) {
                    changed.value = "-" + changed.value;
                }
            }
            cases.push_back({join(negative, false), false, item.key,
                             "a negative number for " + item.key + " (no byte count is negative)", "X9"});
        }
    }
    cases.push_back({base + (base.empty() ? "" : ";") + "nxmem_conform_no_equals", false,
                     "nxmem_conform_no_equals", "an entry without '='", "X9"});
    cases.push_back({base + (base.empty() ? "" : ";") + " =1", false, "", "an empty key", "X9"});
    cases.push_back({base + (base.empty() ? "" : ";") + "nxmem_conform_\xff\x01\x1b[31m=1", false, "",
                     "an unknown key of raw bytes (0xff, a control byte, an escape sequence)", "Q14"});
    std::string long_key = "nxmem_conform_";
    while (long_key.size() < 400) {
        long_key += "\xc3\xa9"; // U+00E9: a cut at an odd byte would split it
    }
    cases.push_back({base + (base.empty() ? "" : ";") + long_key + "=1", false, "",
                     "an unknown 400-byte key of two-byte UTF-8 sequences", "Q14"});
    return cases;
}

// What a child saw when it opened the mechanism with one text.
struct open_seen {
    NxmemStatusCode code = NXMEM_STATUS_OK;
    char message[NXMEM_STATUS_MESSAGE_BYTES] = {};
};

} // namespace detail

// options.grammar (X9, Q14, E13).
struct check_options_grammar {
    static constexpr check_revision revision{"X9, Q14, E13", "1.0", "2026-12-04", true,
                                            "a plugin that reads past options_length faults in the host's "
                                            "process, and one that takes unknown keys silently ignores the "
                                            "operator's configuration (Q14, since the first contract); "
                                            "X9's details (';', blanks, empty entries, keys given twice) and "
                                            "E13 (messages) warn for plugins declaring a minor before them"};

    template <Device D> static finding run(const subject& target, const suite_options& options) {
        const std::optional<std::vector<detail::option_entry>> entries = detail::parse_options(target.options);
        if (!entries) {
            return not_applicable("the options the suite runs with are not well formed: '" +
                                  nxmem::detail::printable(target.options) + "'");
        }
        NXMEM_CONFORM_TRY(library, "the plugin loads", detail::raw_library::open(target.path));
        for (const detail::option_case& test : detail::option_cases(*entries, options.model_seed)) {
            const std::string shown = "'" + nxmem::detail::printable(test.text) + "' (" + test.why + ")";
            announce_step("open with the options " + shown + ", ending at a PROT_NONE page");
            const auto called = detail::run_contained<detail::open_seen>([&]() {
                detail::open_seen seen;
                std::optional<detail::guarded_bytes> text =
                    test.text.empty() ? std::nullopt
                                      : detail::guarded_bytes::make(test.text.size(), "the options text");
                if (text) {
                    std::memcpy(text->data(), test.text.data(), test.text.size());
                }
                const detail::slot_reply reply = detail::open_with_options(
                    library, target, text ? reinterpret_cast<const char*>(text->data()) : nullptr,
                    test.text.size());
                seen.code = reply.code;
                std::strncpy(seen.message, reply.message.c_str(), sizeof seen.message - 1);
                return seen;
            });
            if (!called.value) {
                return failed_rule("Q14", "options read within options_length only (Q14: not NUL-terminated)",
                                   "open with " + shown + ": " + called.failure);
            }
            const std::string message(called.value->message);
            const NxmemStatusCode code = called.value->code;
            if (test.accepted) {
                if (code != NXMEM_STATUS_OK) {
                    return failed_rule(test.rule, "the grammar accepts " + shown + " (" + test.rule + ")",
                                       code_name(code) + " (" + nxmem::detail::printable(message) + ")");
                }
                continue;
            }
            if (code != NXMEM_STATUS_INVALID_ARGUMENT) {
                return failed_rule(test.rule, "INVALID_ARGUMENT for " + shown + " (" + test.rule + ")",
                                   code_name(code) + (code == NXMEM_STATUS_OK ? ": the open succeeded"
                                                                                : " (" + nxmem::detail::printable(message) + ")"));
            }
            if (const std::size_t bad = nxmem::detail::first_unprintable(message); bad != std::string::npos) {
                return failed_rule("E13", "a message of valid UTF-8 without control bytes, whatever bytes it names (E13)",
                                   "the refusal of " + shown + " carries byte 0x" +
                                       nxmem::detail::printable(std::string(1, message[bad])).substr(2) +
                                       " at offset " + std::to_string(bad) + ": '" +
                                       nxmem::detail::printable(message) + "'");
            }
            if (!test.named.empty() && message.find(test.named) == std::string::npos) {
                return failed_rule(test.rule, "the refusal names '" + test.named + "' (" + test.rule + ")",
                              "the refusal of " + shown + " says '" + nxmem::detail::printable(message) + "'");
            }
        }
        return passed();
    }
};

// options.numbers (Q18): a byte count in the options is read in 64 bits. Where the suite's
// options make the mechanism refuse an allocation with OUT_OF_MEMORY (no reclaim hook offered,
// H6) after serving some 64 KiB blocks, and doubling a numeric key's value lets more blocks fit
// (the key is a limit), the same key given 2^32 more must be refused with INVALID_ARGUMENT naming
// it, or serve at least as many blocks as the doubled value: cut to 32 bits it serves the same
// few as the value given. Anything else (no limit reached, a key that does not change the count,
// another refusal of the larger value) is not judged, and the check says why.
struct check_options_numbers {
    static constexpr check_revision revision{"Q18", "1.0", "2026-12-04", false,
                                            "a number cut to 32 bits gives the operator a budget it did not ask for, "
                                            "which the host cannot see; Q18 entered in release 2026-12-04, so a plugin "
                                            "declaring an earlier minor is warned"};
    static constexpr std::uint64_t block_bytes = 64 * 1024;
    static constexpr unsigned max_blocks = 1024; // 64 MiB: a limit beyond that is not reached

    // How many blocks the mechanism serves, opened with `options` and no reclaim hook, before it
    // refuses one (at most `limit`), or the refusal of the open.
    struct served {
        unsigned blocks = 0;
        bool out_of_memory = false; // it stopped on OUT_OF_MEMORY
        std::string refusal;        // the open's or the stopping allocation's refusal
        status_code open_code = status_code::ok;
    };
    static served count_blocks(const subject& target, const std::string& options, unsigned limit) {
        const subject with{target.path, target.mechanism, target.device, options};
        detail::callback_host callbacks;
        callbacks.on_completed = [](const NxmemReleaseCompletion&) {};
        announce_step("opening with the options '" + nxmem::detail::printable(options) + "' and counting blocks");
        served found;
        result<std::unique_ptr<detail::callback_allocator>> opened =
            detail::callback_allocator::open(with, callbacks.table());
        if (!opened) {
            found.open_code = opened.error().code;
            found.refusal = opened.error().describe();
            return found;
        }
        const detail::raw_slots slots = opened.value()->slots();
        std::vector<NxmemAllocation> held;
        while (held.size() < limit) {
            result<NxmemAllocation> made = slots.allocate(block_bytes, 64);
            if (!made) {
                found.out_of_memory = made.error().code == status_code::out_of_memory;
                found.refusal = made.error().describe();
                break;
            }
            held.push_back(made.value());
        }
        found.blocks = static_cast<unsigned>(held.size());
        for (const NxmemAllocation& live : held) {
            (void)slots.deallocate(live);
        }
        return found;
    }

    // A byte count as the kit reads one (k, M, G: 2^10, 2^20, 2^30); nullopt when not one.
    static std::optional<std::uint64_t> byte_count(std::string_view value) {
        unsigned shift = 0;
        if (!value.empty() && std::string_view("kKMG").find(value.back()) != std::string_view::npos) {
            shift = value.back() == 'M' ? 20 : value.back() == 'G' ? 30 : 10;
            value.remove_suffix(1);
        }
        std::uint64_t number = 0;
        const auto [rest, error] = std::from_chars(value.data(), value.data() + value.size(), number);
        if (value.empty() || error != std::errc{} || rest != value.data() + value.size() ||
            number > (UINT64_MAX >> shift)) {
            return std::nullopt;
        }
        return number << shift;
    }

    static std::string with_value(const std::vector<detail::option_entry>& entries, const std::string& key,
                                  const std::string& value) {
        std::string text;
        for (const detail::option_entry& entry : entries) {
            text += (text.empty() ? "" : ";") + entry.key + "=" + (entry.key == key ? value : entry.value);
        }
        return text;
    }

    static finding run(const subject& target, const suite_options&) {
        const std::optional<std::vector<detail::option_entry>> entries = detail::parse_options(target.options);
        if (!entries || entries->empty()) {
            return not_applicable("no numeric option to judge in the options '" +
                                  nxmem::detail::printable(target.options) + "' (--options, e.g. budget=1M)");
        }
        const served given = count_blocks(target, target.options, max_blocks);
        if (!given.out_of_memory) {
            return not_applicable("with the options '" + nxmem::detail::printable(target.options) + "' " +
                                  std::to_string(given.blocks) + " blocks of " + std::to_string(block_bytes) +
                                  " bytes were served" +
                                  (given.refusal.empty() ? "" : " before " + given.refusal) +
                                  ": no limit reached with OUT_OF_MEMORY to compare against");
        }
        std::string why_not;
        unsigned judged = 0;
        for (const detail::option_entry& entry : *entries) {
            const std::optional<std::uint64_t> value = byte_count(entry.value);
            if (!value || *value == 0 || *value >= (std::uint64_t{1} << 32)) {
                continue; // not a byte count 32 bits could hold: nothing to cut
            }
            const std::string doubled = std::to_string(*value * 2);
            const served more = count_blocks(target, with_value(*entries, entry.key, doubled), max_blocks);
            if (more.blocks <= given.blocks) {
                why_not += (why_not.empty() ? "" : "; ") + entry.key + "=" + doubled + " served " +
                           std::to_string(more.blocks) + " blocks, no more than " + entry.key + "=" + entry.value +
                           ": not a limit";
                continue;
            }
            const std::string wide = std::to_string(*value + (std::uint64_t{1} << 32));
            const served beyond = count_blocks(target, with_value(*entries, entry.key, wide), more.blocks);
            const std::string shown = entry.key + "=" + wide;
            if (beyond.open_code == status_code::invalid_argument) {
                if (beyond.refusal.find(entry.key) == std::string::npos) {
                    return failed_rule("Q14", "the refusal of '" + shown + "' names '" + entry.key + "' (Q14)",
                                       nxmem::detail::printable(beyond.refusal));
                }
                ++judged;
                continue;
            }
            if (beyond.open_code != status_code::ok) {
                why_not += (why_not.empty() ? "" : "; ") + shown + " refused with " + beyond.refusal;
                continue;
            }
            if (beyond.blocks < more.blocks) {
                return failed_rule("Q18",
                                   shown + " refused with INVALID_ARGUMENT naming '" + entry.key +
                                       "', or serving at least the " + std::to_string(more.blocks) + " blocks of " +
                                       std::to_string(block_bytes) + " bytes " + entry.key + "=" + doubled +
                                       " serves (Q18: computed in 64 bits)",
                                   std::to_string(beyond.blocks) + " blocks, as " + entry.key + "=" + entry.value +
                                       " (" + std::to_string(given.blocks) +
                                       "): the number cut to 32 bits, it seems (" + beyond.refusal + ")");
            }
            ++judged;
        }
        if (judged == 0) {
            return not_applicable("no byte count in the options limits the blocks served" +
                                  (why_not.empty() ? std::string() : " (" + why_not + ")"));
        }
        return passed();
    }
};

} // namespace nxmem::conform
