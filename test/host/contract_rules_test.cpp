// Rules of docs/ABI.md that need a plugin breaking (or showing) exactly one of them: the rule
// probe fixture (test/host/rule_probe_plugin.cpp, NXMEM_RULE_PROBE_PLUGIN) and the test plugin's
// mechanisms called through their raw tables, where the rule binds the plugin side (the kit).
// Each TEST_CASE names its rule.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

std::string probe_path() { return test::plugin_path("NXMEM_RULE_PROBE_PLUGIN"); }

// A probe-plugin function of type F, read out of the loaded module itself.
template <class F> F probe_function(const std::string& path, const char* name) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(handle != nullptr);
    void* symbol = ::dlsym(handle, name);
    ::dlclose(handle); // the module keeps it mapped
    REQUIRE(symbol != nullptr);
    return reinterpret_cast<F>(symbol);
}

// What the plugin reports, asserted all zero but for open allocators.
void require_nothing_live(const std::shared_ptr<host::plugin_module>& module) {
    auto readiness = value_or_fail(module->readiness());
    INFO(readiness.describe());
    CHECK(readiness.plugin.allocations == 0);
    CHECK(readiness.plugin.queued_releases == 0);
    CHECK(readiness.host.allocations == 0);
    CHECK(readiness.host.queued_releases == 0);
}

// The module unloads and is unmapped.
void require_unloads(std::shared_ptr<host::plugin_module>& module, const std::string& path) {
    auto readiness = value_or_fail(module->readiness());
    INFO(readiness.describe());
    REQUIRE(module->try_unload());
    module.reset();
    CHECK_FALSE(test::is_mapped(path));
}

// An open that the host must refuse with CONTRACT_VIOLATION, the plugin's table handed back.
void require_refused_open(const std::string& mechanism, const std::string& named) {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    auto opened = host::open_allocator<cpu_device>(module, mechanism);
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::contract_violation);
    CHECK_THAT(opened.error().message, Catch::Contains(named));
    auto readiness = value_or_fail(module->readiness());
    CHECK(readiness.plugin.allocators == 0); // the refused table was released
    CHECK(readiness.host.allocators == 0);
    require_unloads(module, path);
}

// A request for a raw allocate slot call, as a host would build it.
NxmemAllocRequest alloc_request(const host::plugin_allocator<cpu_device>& allocator,
                                std::uint64_t allocation_id, std::uint64_t size, std::uint64_t alignment) {
    auto request = nxmem::abi::make_struct<NxmemAllocRequest>();
    request.mechanism_id = allocator.mechanism_id();
    request.device = allocator.device().to_wire();
    request.allocation_id = allocation_id;
    request.size = size;
    request.alignment = alignment;
    return request;
}
NxmemAllocation described(const NxmemAllocRequest& request, std::uint64_t address) {
    auto allocation = nxmem::abi::make_struct<NxmemAllocation>();
    allocation.mechanism_id = request.mechanism_id;
    allocation.device = request.device;
    allocation.allocation_id = request.allocation_id;
    allocation.address = address;
    allocation.size = request.size;
    allocation.alignment = request.alignment;
    return allocation;
}

} // namespace

// ---- Versions ----

TEST_CASE("V4: the host calls NxmemNegotiate first, once per load", "[rules][versions]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    test::library_handle handle(path); // keeps the module's counters across the second load
    CHECK(handle.counter("NxmemProbeNegotiateCalls") == 1);
    REQUIRE(module->readiness());
    REQUIRE(module->try_unload());
    module.reset();

    auto again = load_or_fail(path);
    CHECK(handle.counter("NxmemProbeNegotiateCalls") == 2);
    CHECK(handle.counter("NxmemProbeCallsBeforeNegotiate") == 0);
    REQUIRE(again->try_unload());
    again.reset();
    handle.close();
    CHECK_FALSE(test::is_mapped(path));
}

// ---- Exports ----

TEST_CASE("X4: the host offers a capacity of NXMEM_MAX_FACTORIES", "[rules][exports]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    test::library_handle handle(path);
    CHECK(handle.counter("NxmemProbeFactoryCapacity") == NXMEM_MAX_FACTORIES);
    STATIC_REQUIRE(NXMEM_MAX_FACTORIES == 64);
    handle.close();
    require_unloads(module, path);
}

TEST_CASE("X4: a plugin with more factories than the capacity creates none and says how many",
          "[rules][exports]") {
    const std::string path = test::testplugin_path();
    test::library_handle handle(path);
    void* handle_for_symbol = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(handle_for_symbol != nullptr);
    auto create = reinterpret_cast<NxmemCreateAllocatorFactoriesFn>(
        ::dlsym(handle_for_symbol, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES));
    ::dlclose(handle_for_symbol);
    REQUIRE(create != nullptr);

    std::vector<NxmemAllocatorFactoryVtable*> factories(2, nullptr);
    std::uint32_t count = 0;
    NxmemStatus status = nxmem::abi::make_status();
    const NxmemStatusCode code = create(factories.data(), 2, &count, &status);
    CHECK(code == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(count > 2); // the number it needs
    CHECK(factories[0] == nullptr);
    CHECK(factories[1] == nullptr);
    CHECK(handle.counter("NxmemTestFactoriesCreated") == 0);
    CHECK_THAT(nxmem::abi::read_status_message(status), Catch::Contains("capacity is 2"));
}

TEST_CASE("X6: device type 0 is never served, by the host or by a plugin", "[rules][exports]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    for (const host::factory_info& factory : module->factories()) {
        CHECK((factory.device_types & 1u) == 0); // bit 1 << 0 would be device type 0
    }
    const host::factory_info* eager = module->find_factory("eager");
    REQUIRE(eager != nullptr);
    // The host refuses before the plugin is asked...
    auto refused = host::detail::allocator_core::open(module, *eager, device_id{0, 0}, {}, {});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::wrong_device);
    // ...and the plugin refuses when asked directly.
    auto opened = open_or_fail<cpu_device>(module, "eager");
    (void)opened;
    test::library_handle handle(path);
    void* raw = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    auto create = reinterpret_cast<NxmemCreateAllocatorFactoriesFn>(
        ::dlsym(raw, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES));
    ::dlclose(raw);
    REQUIRE(create != nullptr);
    std::vector<NxmemAllocatorFactoryVtable*> factories(NXMEM_MAX_FACTORIES, nullptr);
    std::uint32_t count = 0;
    NxmemStatus status = nxmem::abi::make_status();
    REQUIRE(create(factories.data(), NXMEM_MAX_FACTORIES, &count, &status) == NXMEM_STATUS_OK);
    auto request = nxmem::abi::make_struct<NxmemOpenRequest>();
    request.device = device_id{0, 0}.to_wire();
    NxmemAllocatorVtable* table = nullptr;
    CHECK(factories[0]->open_allocator(factories[0], &request, &table, &status) ==
          NXMEM_STATUS_WRONG_DEVICE);
    CHECK(table == nullptr);
    for (std::uint32_t i = 0; i < count; ++i) {
        factories[i]->release(factories[i]);
    }
}

// ---- Requests and outputs ----

TEST_CASE("Q8, Q9, Q13: the kit ignores reserved, refuses unknown flags, and states what an "
          "allocation costs now",
          "[rules][requests]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        for (const char* mechanism : {"eager", "lazy"}) {
            DYNAMIC_SECTION(mechanism) {
                auto allocator = open_or_fail<cpu_device>(module, mechanism);
                NxmemAllocatorVtable* raw = allocator.raw_table();
                const NxmemAllocatorVtable& slots = allocator.checked_table();
                NxmemStatus status = nxmem::abi::make_status();

                // Q9: a flag bit major 1 does not define is refused, and nothing is allocated.
                NxmemAllocRequest flagged = alloc_request(allocator, 1u << 30, 3 * 4096, 4096);
                flagged.flags = 1;
                auto refused_output = nxmem::abi::make_struct<NxmemAllocResult>();
                CHECK(slots.allocate(raw, &flagged, &refused_output, &status) ==
                      NXMEM_STATUS_INVALID_ARGUMENT);
                CHECK_THAT(nxmem::abi::read_status_message(status), Catch::Contains("flags"));
                CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);

                // Q8: the output's reserved field is written zero, however the caller left it.
                NxmemAllocRequest request = alloc_request(allocator, (1u << 30) + 1, 3 * 4096, 4096);
                NxmemAllocResult output;
                std::memset(&output, 0xA5, sizeof output);
                output.struct_size = sizeof output;
                REQUIRE(slots.allocate(raw, &request, &output, &status) == NXMEM_STATUS_OK);
                CHECK(output.reserved == 0);
                // Q13: what it costs now: all of it eagerly, nothing while only reserved.
                CHECK(output.mapped_bytes == (std::string(mechanism) == "eager" ? 3 * 4096 : 0));

                // Q8: a receiver ignores reserved, in the allocation and in its device id.
                NxmemAllocation release = described(request, output.address);
                release.reserved = 0xFFFFFFFFu;
                release.device.reserved = 0xFFFFFFFFu;
                CHECK(slots.deallocate(raw, &release, &status) == NXMEM_STATUS_OK);
                CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
            }
        }
    }
    require_unloads(module, path);
}

TEST_CASE("Q11: an allocation result that is NULL, misaligned or short is refused and handed back",
          "[rules][requests]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    for (const char* mechanism : {"null-address-result", "misaligned-result", "short-result"}) {
        DYNAMIC_SECTION(mechanism) {
            auto allocator = open_or_fail<cpu_device>(module, mechanism);
            auto refused = allocator.allocate(100, 64);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::contract_violation);
            CHECK_THAT(refused.error().message, Catch::Contains("for a request of 100 bytes aligned to 64"));
            require_nothing_live(module); // deallocate gave the plugin its memory back
        }
    }
    require_unloads(module, path);
}

TEST_CASE("Q12: the host describes an allocation with the size it asked for, not the usable size",
          "[rules][requests]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    {
        auto rounding = open_or_fail<cpu_device>(module, "rounding");
        // The plugin hands out a whole page; the kit behind it refuses a release whose size is
        // not the one asked for (M5), so each release below succeeding shows the host's size.
        auto made = value_or_fail(rounding.allocate(100, 64));
        CHECK(made.size == 100);
        auto report = value_or_fail(rounding.release(made));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 100);
        require_nothing_live(module);
    }
    require_unloads(module, path);
}

TEST_CASE("Q14: open options are at most 4096 bytes", "[rules][requests]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    STATIC_REQUIRE(NXMEM_MAX_OPTIONS_BYTES == 4096);
    // 4096 bytes pass the limit and reach the mechanism, which refuses the option by name...
    std::string options = "unknown_option=" + std::string(4096 - 15, 'x');
    REQUIRE(options.size() == 4096);
    auto at_limit = host::open_allocator<cpu_device>(module, "eager", 0, options);
    REQUIRE_FALSE(at_limit);
    CHECK(at_limit.error().code == status_code::invalid_argument);
    CHECK_THAT(at_limit.error().message, Catch::Contains("unknown_option"));
    // ...one byte more is refused for its size, by the host before the plugin is called,
    auto over = host::open_allocator<cpu_device>(module, "eager", 0, options + ";");
    REQUIRE_FALSE(over);
    CHECK(over.error().code == status_code::invalid_argument);
    CHECK_THAT(over.error().message, Catch::Contains("4097 bytes exceed 4096"));
    // and by the kit when a host sends it anyway.
    auto opened = open_or_fail<cpu_device>(module, "eager");
    (void)opened;
    void* raw = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    auto create = reinterpret_cast<NxmemCreateAllocatorFactoriesFn>(
        ::dlsym(raw, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES));
    ::dlclose(raw);
    std::vector<NxmemAllocatorFactoryVtable*> factories(NXMEM_MAX_FACTORIES, nullptr);
    std::uint32_t count = 0;
    NxmemStatus status = nxmem::abi::make_status();
    REQUIRE(create(factories.data(), NXMEM_MAX_FACTORIES, &count, &status) == NXMEM_STATUS_OK);
    const std::string too_long = options + ";";
    auto request = nxmem::abi::make_struct<NxmemOpenRequest>();
    request.device = device_id{NXMEM_DEVICE_CPU, 0}.to_wire();
    request.options = too_long.data();
    request.options_length = too_long.size();
    NxmemAllocatorVtable* table = nullptr;
    CHECK(factories[0]->open_allocator(factories[0], &request, &table, &status) ==
          NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(nxmem::abi::read_status_message(status), Catch::Contains("4097 bytes exceeds 4096"));
    CHECK(table == nullptr);
    for (std::uint32_t i = 0; i < count; ++i) {
        factories[i]->release(factories[i]);
    }
}

// ---- Nothing C++ crosses ----

TEST_CASE("E3: the returned code is authoritative over NxmemStatus::code", "[rules][status]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    {
        // OK returned with an error left in the status: the allocation succeeded.
        auto stale = open_or_fail<cpu_device>(module, "ok-with-error-status");
        auto made = value_or_fail(stale.allocate(256, 64));
        REQUIRE(stale.release(made));
        // An error returned with OK in the status: the call failed, with the returned code.
        auto failing = open_or_fail<cpu_device>(module, "error-with-ok-status");
        auto refused = failing.allocate(256, 64);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("error-with-ok-status is out of memory"));
        require_nothing_live(module);
    }
    require_unloads(module, path);
}

// ---- Slots and misuse ----

TEST_CASE("S2: a capability table with a required slot NULL is refused", "[rules][slots]") {
    SECTION("virtual backing without mapped_bytes") {
        require_refused_open("null-virtual-backing-slot", "required slot 'mapped_bytes' is NULL");
    }
    SECTION("shared mapping without commit_shared_prefix") {
        require_refused_open("null-shared-mapping-slot", "required slot 'commit_shared_prefix' is NULL");
    }
}

TEST_CASE("R13: an ipc table declaring a minor below 3, which introduced it, is refused at open",
          "[rules][R13]") {
    // Its slots would read as NULL at that level; the first ipc call jumped to address 0.
    SECTION("declaring minor 0") {
        require_refused_open("ipc-declaring-minor-0",
                             "NxmemIpcVtable: declares minor 0, below minor 3, which introduced it");
    }
    SECTION("declaring minor 2") {
        require_refused_open("ipc-declaring-minor-2",
                             "NxmemIpcVtable: declares minor 2, below minor 3, which introduced it");
    }
    SECTION("the same table declaring minor 3 is accepted, and its slots are called") {
        const std::string path = probe_path();
        auto module = load_or_fail(path);
        {
            auto opened = open_or_fail<cpu_device>(module, "ipc-declaring-minor-3");
            auto sharing = value_or_fail(opened.ipc());
            auto memory = value_or_fail(opened.allocate(4096, 64));
            auto exported = sharing.export_allocation(memory, NXMEM_IPC_READ_WRITE);
            REQUIRE_FALSE(exported);
            CHECK_THAT(exported.error().message, Catch::Contains("never called")); // the slot ran
            REQUIRE(opened.release(memory));
        }
        require_unloads(module, path);
    }
}

TEST_CASE("M6: an allocator table naming another mechanism or device is refused", "[rules][misuse]") {
    SECTION("another mechanism") {
        require_refused_open("foreign-id-table", "the table names mechanism 99, its factory is mechanism 20");
    }
    SECTION("another device") {
        require_refused_open("foreign-device-table", "another device than the one asked for");
    }
}

TEST_CASE("M3: allocation ids increase in a thread's order across a module's allocators and are "
          "never derived from the address",
          "[rules][misuse]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    {
        auto one_slot = open_or_fail<cpu_device>(module, "one-slot");
        auto rounding = open_or_fail<cpu_device>(module, "rounding");
        std::uint64_t last_id = 0;
        cpu_device::address_type slot_address{};
        std::vector<allocation<cpu_device>> earlier;
        for (int round = 0; round < 4; ++round) {
            auto from_slot = value_or_fail(one_slot.allocate(64, 64));
            auto from_rounding = value_or_fail(rounding.allocate(64, 64));
            CHECK(from_slot.allocation_id > last_id);
            CHECK(from_rounding.allocation_id > from_slot.allocation_id);
            last_id = from_rounding.allocation_id;
            // The same address every time, a new id every time.
            if (round > 0) {
                CHECK(from_slot.address == slot_address);
            }
            slot_address = from_slot.address;
            REQUIRE(rounding.release(from_rounding));
            if (round < 3) {
                REQUIRE(one_slot.release(from_slot));
                earlier.push_back(from_slot);
                continue;
            }
            // A stale handle naming the reused address cannot release the live allocation there.
            for (const auto& stale : earlier) {
                auto refused = one_slot.release(stale);
                REQUIRE_FALSE(refused);
                CHECK(refused.error().code == status_code::unknown_allocation);
            }
            CHECK(value_or_fail(module->readiness()).plugin.allocations == 1);
            REQUIRE(one_slot.release(from_slot));
        }
        require_nothing_live(module);
    }
    require_unloads(module, path);
}

// ---- Ownership ----

TEST_CASE("O3: each retain adds one reference that one more release drops", "[rules][ownership]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    NxmemAllocatorVtable* raw = nullptr;
    NxmemReleaseFn release = nullptr;
    {
        auto allocator = open_or_fail<cpu_device>(module, "eager");
        raw = allocator.raw_table();
        release = allocator.checked_table().release;
        allocator.checked_table().retain(raw);
        allocator.checked_table().retain(raw);
    } // the host drops the reference open_allocator returned
    CHECK(value_or_fail(module->readiness()).plugin.allocators == 1);
    release(raw);
    CHECK(value_or_fail(module->readiness()).plugin.allocators == 1);
    CHECK_FALSE(module->try_unload());
    release(raw); // the last reference
    CHECK(value_or_fail(module->readiness()).plugin.allocators == 0);
    require_unloads(module, path);
}

TEST_CASE("O6: a plugin keeps no pointer the host passed into a call", "[rules][ownership]") {
    // Every request, option text and status lives on the heap for one call only, then is
    // scribbled over and freed: a plugin that kept one would read garbage (AddressSanitizer:
    // a use after free) on the calls that follow.
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        auto allocator = open_or_fail<cpu_device>(module, "lazy");
        NxmemAllocatorVtable* raw = allocator.raw_table();
        const NxmemAllocatorVtable slots = allocator.checked_table();
        auto scrap = [](auto* borrowed) {
            std::memset(static_cast<void*>(borrowed), 0xDB, sizeof *borrowed);
            delete borrowed;
        };
        std::vector<NxmemAllocation> live;
        for (std::uint64_t i = 0; i < 4; ++i) {
            auto* request = new NxmemAllocRequest(alloc_request(allocator, (1u << 30) + i, 4096, 4096));
            auto* output = new NxmemAllocResult(nxmem::abi::make_struct<NxmemAllocResult>());
            auto* status = new NxmemStatus(nxmem::abi::make_status());
            REQUIRE(slots.allocate(raw, request, output, status) == NXMEM_STATUS_OK);
            live.push_back(described(*request, output->address));
            scrap(request);
            scrap(output);
            scrap(status);
        }
        for (const NxmemAllocation& allocation : live) {
            auto* range = new NxmemRangeRequest(nxmem::abi::make_struct<NxmemRangeRequest>());
            range->allocation = allocation;
            range->range = nxmem::abi::make_struct<NxmemByteRange>();
            range->range.length = 4096;
            auto* status = new NxmemStatus(nxmem::abi::make_status());
            REQUIRE(slots.virtual_backing->commit(raw, range, status) == NXMEM_STATUS_OK);
            scrap(range);
            scrap(status);
        }
        for (const NxmemAllocation& allocation : live) {
            auto* release = new NxmemAllocation(allocation);
            auto* status = new NxmemStatus(nxmem::abi::make_status());
            REQUIRE(slots.deallocate(raw, release, status) == NXMEM_STATUS_OK);
            scrap(release);
            scrap(status);
        }
        require_nothing_live(module);
    }
    require_unloads(module, path);
}

TEST_CASE("O9: an allocator the host lets go of hands back its allocations through deallocate",
          "[rules][ownership]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    test::library_handle handle(path);
    {
        auto rounding = open_or_fail<cpu_device>(module, "rounding");
        REQUIRE((rounding.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) != 0);
        for (int i = 0; i < 3; ++i) {
            REQUIRE(rounding.allocate(100 + static_cast<std::uint64_t>(i), 64));
        }
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 3);
    } // the engine lets go with three allocations live
    CHECK(handle.counter("NxmemProbeDeallocateCalls") == 3);
    CHECK(handle.counter("NxmemProbeReleaseAllocationCalls") == 0); // deallocate, not the structured release
    auto readiness = value_or_fail(module->readiness());
    CHECK(readiness.plugin.allocations == 0); // each described as allocated: the kit accepted it
    CHECK(readiness.plugin.allocators == 0);
    CHECK(readiness.host.allocations == 0);
    handle.close();
    require_unloads(module, path);
}

// ---- Release outcomes ----

TEST_CASE("RO3: the host refuses a quarantined address reissued by the plugin", "[rules][release]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    {
        auto reissuing = open_or_fail<cpu_device>(module, "reissuing");
        auto first = value_or_fail(reissuing.allocate(256, 64));
        auto report = value_or_fail(reissuing.release(first));
        REQUIRE(report.state == release_state::quarantined);
        auto reissued = reissuing.allocate(256, 64);
        REQUIRE_FALSE(reissued);
        CHECK(reissued.error().code == status_code::contract_violation);
        CHECK_THAT(reissued.error().message, Catch::Contains("reissued quarantined address"));
        require_nothing_live(module); // handed back through deallocate
        auto fresh = value_or_fail(reissuing.allocate(256, 64));
        CHECK(fresh.address != first.address);
        REQUIRE(reissuing.release(fresh));
    }
    require_unloads(module, path);
}

// ---- Deferred release ----

TEST_CASE("D1: an enqueued allocation can no longer be released directly", "[rules][deferred]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto made = value_or_fail(lazy.allocate(4096, 64));
        REQUIRE(lazy.enqueue_release(made));
        // By the host...
        auto refused = lazy.release(made);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::unknown_allocation);
        // ...and by the plugin when called directly.
        const NxmemAllocation direct = host::detail::to_wire(made);
        NxmemStatus status = nxmem::abi::make_status();
        CHECK(lazy.checked_table().deallocate(lazy.raw_table(), &direct, &status) ==
              NXMEM_STATUS_UNKNOWN_ALLOCATION);
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocations == 1);
        CHECK(readiness.plugin.queued_releases == 1);
        CHECK(readiness.host.allocations == 1);
        CHECK(readiness.host.queued_releases == 1);
        CHECK(value_or_fail(lazy.drain_releases()).size() == 1);
        require_nothing_live(module);
    }
    require_unloads(module, path);
}

namespace {
struct enqueue_observation {
    host::plugin_module* module = nullptr;
    std::uint64_t queued_during_call = 0;
    bool seen = false;
};
void observe_enqueue(void* context) {
    auto& observed = *static_cast<enqueue_observation*>(context);
    auto readiness = observed.module->readiness();
    observed.seen = static_cast<bool>(readiness);
    observed.queued_during_call = readiness ? readiness.value().host.queued_releases : 0;
}
} // namespace

TEST_CASE("D2: the host counts a queued release before the call and undoes it when enqueue fails",
          "[rules][deferred]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    enqueue_observation observed{module.get()};
    auto set_hook = probe_function<void (*)(void (*)(void*), void*)>(path, "NxmemProbeSetEnqueueHook");
    set_hook(&observe_enqueue, &observed);
    {
        auto failing = open_or_fail<cpu_device>(module, "failing-enqueue");
        auto made = value_or_fail(failing.allocate(512, 64));
        auto refused = failing.enqueue_release(made);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::internal_error);
        CHECK_THAT(refused.error().message, Catch::Contains("failing-enqueue refuses every enqueue"));
        REQUIRE(observed.seen);
        CHECK(observed.queued_during_call == 1); // counted before the ABI call
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.queued_releases == 0); // undone
        CHECK(readiness.host.allocations == 1);     // live again...
        REQUIRE(failing.release(made));             // ...and released like any live allocation
        require_nothing_live(module);
    }
    set_hook(nullptr, nullptr);
    require_unloads(module, path);
}

TEST_CASE("D5: a completion's outcome is read as a release outcome: quarantine and unknown states",
          "[rules][deferred]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    {
        SECTION("QUARANTINED: half credited, the rest kept and never refunded") {
            auto keeping = open_or_fail<cpu_device>(module, "quarantining-deferred");
            auto made = value_or_fail(keeping.allocate(1000, 64));
            const std::uint64_t ticket = value_or_fail(keeping.enqueue_release(made));
            auto completions = value_or_fail(keeping.drain_releases());
            REQUIRE(completions.size() == 1);
            CHECK(completions[0].ticket == ticket);
            CHECK(completions[0].allocation_id == made.allocation_id);
            CHECK(completions[0].report.state == release_state::quarantined);
            CHECK(completions[0].report.unmapped_bytes == 500);
            CHECK(completions[0].report.residual_owned_bytes == 500);
            CHECK(keeping.quarantined_bytes() == 500);
            require_nothing_live(module);
        }
        SECTION("a state from the future: nothing credited, the whole allocation kept") {
            auto keeping = open_or_fail<cpu_device>(module, "future-state-deferred");
            auto made = value_or_fail(keeping.allocate(1000, 64));
            REQUIRE(keeping.enqueue_release(made));
            auto completions = value_or_fail(keeping.drain_releases());
            REQUIRE(completions.size() == 1);
            CHECK(completions[0].report.state == release_state::quarantined);
            CHECK(completions[0].report.unmapped_bytes == 0);
            CHECK(completions[0].report.residual_owned_bytes == 1000);
            CHECK(keeping.quarantined_bytes() == 1000);
            require_nothing_live(module);
        }
    }
    require_unloads(module, path);
}

TEST_CASE("D6: a completion for an unknown ticket, or a malformed one, fails the next drain",
          "[rules][deferred]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    for (const auto& [mechanism, named] :
         {std::pair{"unknown-ticket-completion", "release_completed for unknown ticket 1152921504606846976"},
          std::pair{"malformed-completion", "release_completed: "}}) {
        DYNAMIC_SECTION(mechanism) {
            auto allocator = open_or_fail<cpu_device>(module, mechanism);
            auto made = value_or_fail(allocator.allocate(128, 64));
            REQUIRE(allocator.enqueue_release(made));
            auto drained = allocator.drain_releases();
            REQUIRE_FALSE(drained);
            CHECK(drained.error().code == status_code::contract_violation);
            CHECK_THAT(drained.error().message, Catch::Contains(named));
            // The genuine completion that came with it still retired the allocation, and the
            // next drain is clean again.
            require_nothing_live(module);
            REQUIRE(allocator.drain_releases());
        }
    }
    require_unloads(module, path);
}

// ---- Unload ----

TEST_CASE("U4: a failing readiness report refuses unload with its code", "[rules][unload]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    auto fail_readiness = probe_function<void (*)(std::uint32_t)>(path, "NxmemProbeFailReadiness");
    fail_readiness(NXMEM_STATUS_INTERNAL_ERROR);
    auto refused = module->try_unload();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::internal_error);
    CHECK_THAT(refused.error().message,
               Catch::Contains("the plugin's readiness report failed") &&
                   Catch::Contains("the readiness report fails on request"));
    CHECK(module->loaded());
    CHECK(test::is_mapped(path));
    fail_readiness(NXMEM_STATUS_OK);
    require_unloads(module, path);
}

// ---- Slots (the kit) ----

TEST_CASE("S7: the kit forwards deallocate to a mechanism that defines only release_allocation",
          "[rules][slots]") {
    const std::string path = probe_path();
    auto module = load_or_fail(path);
    test::library_handle handle(path);
    auto fail_releases = probe_function<void (*)(bool)>(path, "NxmemProbeFailReleaseOnly");
    {
        auto allocator = open_or_fail<cpu_device>(module, "release-only");
        NxmemAllocatorVtable* raw = allocator.raw_table();
        const NxmemAllocatorVtable& slots = allocator.checked_table();
        REQUIRE(slots.deallocate != nullptr);
        NxmemStatus status = nxmem::abi::make_status();
        auto output = nxmem::abi::make_struct<NxmemAllocResult>();

        // Through the deallocate slot, one call of release_allocation, and the allocation is gone.
        NxmemAllocRequest request = alloc_request(allocator, 1u << 30, 100, 64);
        REQUIRE(slots.allocate(raw, &request, &output, &status) == NXMEM_STATUS_OK);
        NxmemAllocation release = described(request, output.address);
        const std::uint64_t calls_before = handle.counter("NxmemProbeReleaseOnlyCalls");
        CHECK(slots.deallocate(raw, &release, &status) == NXMEM_STATUS_OK);
        CHECK(handle.counter("NxmemProbeReleaseOnlyCalls") - calls_before == 1);
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);

        // A FAILED outcome is a failed deallocate: the allocation stays live, and a later
        // deallocate of the same description succeeds.
        request = alloc_request(allocator, (1u << 30) + 1, 200, 64);
        REQUIRE(slots.allocate(raw, &request, &output, &status) == NXMEM_STATUS_OK);
        release = described(request, output.address);
        fail_releases(true);
        CHECK(slots.deallocate(raw, &release, &status) == NXMEM_STATUS_INTERNAL_ERROR);
        CHECK_THAT(nxmem::abi::read_status_message(status), Catch::Contains("failed release"));
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 1);
        fail_releases(false);
        CHECK(slots.deallocate(raw, &release, &status) == NXMEM_STATUS_OK);
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
    }
    handle.close();
    require_unloads(module, path);
}
