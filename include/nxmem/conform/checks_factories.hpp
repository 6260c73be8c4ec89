// Factories: named, bounded, unique; the capacity rule; and every factory released exactly once.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/subject.hpp>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>

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

} // namespace nxmem::conform
