// Factories: named, bounded, unique; the capacity rule; and every factory released exactly once.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/checks_tables.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/printable.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace nxmem::conform {

// factories.names: every factory readable, named (1 to 127 bytes), ids non-zero, both unique.
struct check_factories_names {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports",
                          detail::open_with_exports(target));
        NXMEM_CONFORM_TRY(factories, "NxmemCreateAllocatorFactories succeeds",
                          detail::raw_factories::create(library));
        if (factories.tables().empty()) {
            return failed("at least one factory", "none");
        }
        std::set<std::string> names;
        std::set<std::uint64_t> ids;
        for (NxmemAllocatorFactoryVtable* factory : factories.tables()) {
            result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
                abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, NXMEM_ABI_MINOR);
            if (!copy) {
                return failed("a readable factory table", copy.error().describe());
            }
            const NxmemAllocatorFactoryVtable& table = copy.value().table;
            const std::size_t length =
                table.name == nullptr ? 0 : ::strnlen(table.name, NXMEM_MAX_FACTORY_NAME_BYTES + 1);
            if (length == 0 || length > NXMEM_MAX_FACTORY_NAME_BYTES) {
                return failed("a name of 1 to " + std::to_string(NXMEM_MAX_FACTORY_NAME_BYTES) +
                                  " bytes",
                              table.name == nullptr ? std::string("NULL")
                                                    : "a name of " + std::to_string(length) +
                                                          (length > NXMEM_MAX_FACTORY_NAME_BYTES
                                                               ? "+ bytes"
                                                               : " bytes"));
            }
            const std::string name(table.name, length);
            if (table.mechanism_id == 0) {
                return failed("a non-zero mechanism id", "factory '" + name + "' has mechanism id 0");
            }
            if (!names.insert(name).second) {
                return failed("unique factory names", "'" + name + "' appears twice");
            }
            if (!ids.insert(table.mechanism_id).second) {
                return failed("unique mechanism ids", "mechanism id " +
                                                          std::to_string(table.mechanism_id) +
                                                          " appears twice");
            }
        }
        if (names.count(target.mechanism) == 0) {
            return failed("a factory named '" + target.mechanism + "'", "none");
        }
        return passed();
    }
};

// factories.capacity: with too little room the plugin creates none, says how many it needs and
// returns INVALID_ARGUMENT.
struct check_factories_capacity {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports",
                          detail::open_with_exports(target));
        std::size_t needed = 0;
        {
            NXMEM_CONFORM_TRY(factories, "NxmemCreateAllocatorFactories succeeds",
                              detail::raw_factories::create(library));
            needed = factories.tables().size();
        }
        NxmemAllocatorFactoryVtable* room[1] = {nullptr};
        std::uint32_t count = 0;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = library.create_factories()(room, 0, &count, &status);
        const std::string expected = "INVALID_ARGUMENT, count " + std::to_string(needed) +
                                     " and no factory for capacity 0";
        if (room[0] != nullptr) {
            if (NxmemReleaseFactoryFn release = detail::factory_release_slot(room[0])) {
                release(room[0]);
            }
            return failed(expected, "a factory was written past the capacity");
        }
        if (code != NXMEM_STATUS_INVALID_ARGUMENT || count != needed) {
            return failed(expected, code_name(code) + ", count " + std::to_string(count));
        }
        return passed();
    }
};

// factories.released_once: load and unload cycles leave nothing behind. A plugin that exports the
// test counters NxmemTestFactoriesCreated/Released is also held to exact counts.
struct check_factories_released_once {
    static constexpr int cycles = 3;

    static finding run(const subject& target, const suite_options&) {
        using counter_fn = std::uint64_t (*)();
        std::optional<detail::raw_library> keep;
        counter_fn created = nullptr;
        counter_fn released = nullptr;
        {
            NXMEM_CONFORM_TRY(probe, "the plugin loads", detail::raw_library::open(target.path));
            created = probe.function<counter_fn>("NxmemTestFactoriesCreated");
            released = probe.function<counter_fn>("NxmemTestFactoriesReleased");
            if (created != nullptr && released != nullptr) {
                keep.emplace(std::move(probe)); // keeps the counters readable after unload
            }
        }
        const std::uint64_t created_before = keep ? created() : 0;
        const std::uint64_t released_before = keep ? released() : 0;
        std::uint64_t published = 0;
        for (int cycle = 0; cycle < cycles; ++cycle) {
            NXMEM_CONFORM_TRY(module, "the host loads the plugin", host::plugin_module::load(target.path));
            published += module->factories().size();
            NXMEM_CONFORM_TRY(readiness, "the plugin reports its readiness", module->readiness());
            if (!readiness.plugin.idle()) {
                return failed("an all-zero unload report after load",
                              readiness.plugin.describe());
            }
            result<void> unloaded = module->try_unload();
            if (!unloaded) {
                return failed("an idle plugin unloads", unloaded.error().describe());
            }
            if (!keep && detail::is_mapped(target.path)) {
                return failed("the library unmapped after unload (cycle " +
                                  std::to_string(cycle + 1) + ")",
                              "still mapped");
            }
        }
        if (keep) {
            const std::uint64_t made = created() - created_before;
            const std::uint64_t gone = released() - released_before;
            keep->close();
            if (made != published || gone != published) {
                return failed(std::to_string(published) + " factories created and released",
                              std::to_string(made) + " created, " + std::to_string(gone) +
                                  " released");
            }
            if (detail::is_mapped(target.path)) {
                return failed("the library unmapped after unload", "still mapped");
            }
        }
        return passed();
    }
};

// factories.fresh_after_release: a library stays mapped while its factories are released and
// asked for again (a second host in the process, or one that reloads its list): the new tables are
// whole, tagged, named and numbered as the first list's, and the mechanism opens through them and
// allocates. A plugin that frees or clears its table on release and hands out the same pointer
// again fails here (L3, X5).
struct check_factories_fresh_after_release {
    static constexpr check_revision revision{"L3 X5", "1.0", "2026-11-29", false,
                                            "the rules of the first contract, binding every plugin already: a "
                                            "table handed out after its release is one the host reads freed"};

    struct listed {
        std::string name;
        std::uint64_t mechanism_id = 0;
        std::uint64_t device_types = 0;
    };

    // Each factory as read within its own struct_size, or what is wrong with the first that is not.
    static result<std::vector<listed>> read_list(const detail::raw_factories& factories) {
        std::vector<listed> list;
        for (NxmemAllocatorFactoryVtable* factory : factories.tables()) {
            const auto table = detail::raw_table<NxmemAllocatorFactoryVtable>::read(factory);
            if (std::string problem = detail::tag_problem(table); !problem.empty()) {
                return fail(status_code::contract_violation, "factory " + std::to_string(list.size()) + ": " + problem);
            }
            result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
                abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, NXMEM_ABI_MINOR);
            if (!copy) {
                return fail(status_code::contract_violation,
                            "factory " + std::to_string(list.size()) + ": " + copy.error().describe());
            }
            const NxmemAllocatorFactoryVtable& read = copy.value().table;
            const std::size_t length = read.name == nullptr ? 0 : ::strnlen(read.name, NXMEM_MAX_FACTORY_NAME_BYTES + 1);
            list.push_back({std::string(read.name == nullptr ? "" : read.name, length), read.mechanism_id,
                            read.device_types});
        }
        return list;
    }

    // The mechanism opened through `factories` (with the subject's device and options) and 64 B
    // allocated and released through it; what failed, if anything.
    static std::optional<std::string> opens_and_allocates(const detail::raw_factories& factories,
                                                          const subject& target) {
        NxmemAllocatorFactoryVtable* factory = factories.find(target.mechanism);
        if (factory == nullptr) {
            return "no factory named '" + target.mechanism + "'";
        }
        result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
            abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, factories.negotiated_minor());
        if (!copy || copy.value().table.open_allocator == nullptr) {
            return "the factory cannot be read: " + (copy ? std::string("open_allocator is NULL") : copy.error().describe());
        }
        detail::callback_host callbacks; // a host offering both, as the host library does
        callbacks.on_reclaim = [](const NxmemReclaimRequest&, NxmemStatus*) { return NXMEM_STATUS_OK; };
        callbacks.on_completed = [](const NxmemReleaseCompletion&) {};
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = target.device.to_wire();
        request.callbacks = callbacks.table();
        request.options = target.options.data();
        request.options_length = target.options.size();
        NxmemAllocatorVtable* opened = nullptr;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = copy.value().table.open_allocator(factory, &request, &opened, &status);
        if (code != NXMEM_STATUS_OK) {
            return "open_allocator: " + std::string(status_code_name(status_code_from_wire(code))) + " (" +
                   abi::read_status_message(status) + ")";
        }
        std::optional<std::string> failure;
        result<abi::table_copy<NxmemAllocatorVtable>> table =
            abi::read_prefix<NxmemAllocatorVtable>(opened, factories.negotiated_minor());
        if (!table) {
            failure = "the allocator table: " + table.error().describe();
        } else {
            const detail::raw_slots slots(opened, table.value().table, target.device);
            result<NxmemAllocation> made = slots.allocate(64, 8);
            if (!made) {
                failure = "allocate 64 B: " + made.error().describe();
            } else if (const detail::slot_reply released = slots.deallocate(made.value()); !released.ok()) {
                failure = "deallocate: " + released.describe();
            }
        }
        if (NxmemReleaseFn release = host::detail::locate_release_slot(opened)) {
            release(opened);
        }
        return failure;
    }

    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        std::vector<listed> first;
        std::optional<std::string> first_open;
        {
            announce_step("create the factories, open the mechanism and allocate, release them all");
            NXMEM_CONFORM_TRY(factories, "NxmemCreateAllocatorFactories succeeds", detail::raw_factories::create(library));
            result<std::vector<listed>> read = read_list(factories);
            if (!read) {
                return not_applicable("the first list is not readable (see factories.names, tables.type_tags): " +
                                      read.error().describe());
            }
            first = std::move(read).value();
            first_open = opens_and_allocates(factories, target);
        }
        announce_step("create the factories again after releasing every one");
        NXMEM_CONFORM_TRY(again, "NxmemCreateAllocatorFactories succeeds again after its factories were released",
                          detail::raw_factories::create(library));
        result<std::vector<listed>> second = read_list(again);
        if (!second) {
            return failed_rule("L3 X5", "whole, tagged factory tables from a second NxmemCreateAllocatorFactories (L3)",
                               second.error().describe() +
                                   ": a table released before, handed out again (freed or cleared on release?)");
        }
        if (second.value().size() != first.size()) {
            return failed_rule("X5", std::to_string(first.size()) + " factories again (X5)",
                               std::to_string(second.value().size()));
        }
        for (std::size_t index = 0; index < first.size(); ++index) {
            const listed& was = first[index];
            const listed& now = second.value()[index];
            if (now.name != was.name || now.mechanism_id != was.mechanism_id || now.device_types != was.device_types) {
                return failed_rule("X5",
                                   "factory " + std::to_string(index) + " named '" + nxmem::detail::printable(was.name) + "', mechanism id " +
                                       std::to_string(was.mechanism_id) + ", again (X5)",
                                   "'" + nxmem::detail::printable(now.name) + "', mechanism id " +
                                       std::to_string(now.mechanism_id) + ", device types " +
                                       std::to_string(now.device_types));
            }
        }
        if (first_open) {
            return passed(); // the mechanism does not open here at all: allocator.open's to judge
        }
        if (std::optional<std::string> failure = opens_and_allocates(again, target)) {
            return failed_rule("L3 X5", "the mechanism opens and allocates 64 B through the second list, as through the first",
                               *failure);
        }
        return passed();
    }
};

} // namespace nxmem::conform
