// Opening allocators and the misuse the host and the plugin must each refuse.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <span>
#include <vector>
#include <string>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

// Calls the plugin's own deallocate slot, with no host check in front of it.
template <Device D>
status_code raw_deallocate(const host::plugin_allocator<D>& allocator, const NxmemAllocation& described) {
    NxmemStatus status = nxmem::abi::make_status();
    return status_code_from_wire(
        allocator.checked_table().deallocate(allocator.raw_table(), &described, &status));
}

template <Device D> NxmemAllocation wire(const allocation<D>& live) {
    return host::detail::to_wire(live);
}

} // namespace

TEST_CASE("a short allocator vtable is refused before any slot is read", "[tables]") {
    auto module = load_or_fail(test::testplugin_path());
    auto opened = host::open_allocator<cpu_device>(module, "short-struct");
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::contract_violation);
    CHECK_THAT(opened.error().message, Catch::Contains("struct_size is 40"));
    CHECK(value_or_fail(module->readiness()).ready()); // nothing was counted, nothing leaked
    REQUIRE(module->try_unload());
}

TEST_CASE("a vtable smaller than the level it claims is refused", "[tables]") {
    const std::string path = test::testplugin_path();
    test::library_handle keep(path);
    const std::uint64_t released_before = keep.counter("NxmemTestOverclaimingReleases");
    auto module = load_or_fail(path);
    auto opened = host::open_allocator<cpu_device>(module, "overclaiming");
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::contract_violation);
    CHECK_THAT(opened.error().message, Catch::Contains("claims minor 1"));
    // Refused, but well-formed enough to locate its release slot: the host still releases it.
    CHECK(keep.counter("NxmemTestOverclaimingReleases") - released_before == 1);
    REQUIRE(module->try_unload());
}

TEST_CASE("a mechanism without optional capabilities reports none", "[tables]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        CHECK(eager.capabilities() == 0);
        CHECK(eager.declared_minor() == 0);
        auto backing = eager.virtual_backing();
        REQUIRE_FALSE(backing);
        CHECK(backing.error().code == status_code::unsupported_capability);
        auto mapping = eager.shared_mapping();
        REQUIRE_FALSE(mapping);
        CHECK(mapping.error().code == status_code::unsupported_capability);
        auto live = value_or_fail(eager.allocate(64, 16));
        auto queued = eager.enqueue_release(live);
        REQUIRE_FALSE(queued);
        CHECK(queued.error().code == status_code::unsupported_capability);
        CHECK(value_or_fail(eager.release(live)).state == release_state::complete);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a mechanism declares the level of the slots it fills", "[tables]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        CHECK(lazy.declared_minor() == 2);
        CHECK(lazy.effective_minor() == 2);
        CHECK(lazy.capabilities() == (NXMEM_CAP_VIRTUAL_BACKING | NXMEM_CAP_SHARED_MAPPING |
                                      NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE |
                                      NXMEM_CAP_USAGE_QUERY));
        auto probe = open_or_fail<cpu_device>(module, "callback-probe");
        CHECK(probe.capabilities() == NXMEM_CAP_HOST_RECLAIM);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a minor 0 mechanism works under a minor 2 host", "[versions]") {
    host::load_options minor_2;
    minor_2.host_range = {1, 0, 2};
    auto module = load_or_fail(test::testplugin_path(), minor_2);
    REQUIRE(module->version().minor == 2);
    {
        auto legacy = open_or_fail<cpu_device>(module, "legacy-1-0");
        CHECK(legacy.declared_minor() == 0);
        CHECK(legacy.effective_minor() == 0);
        CHECK(legacy.checked_table().release_allocation == nullptr);
        auto live = value_or_fail(legacy.allocate(4096, 64));
        auto report = value_or_fail(legacy.release(live));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 4096);
        // its minor-0 capability, deferred release, works too
        auto queued = value_or_fail(legacy.allocate(128, 8));
        const std::uint64_t ticket = value_or_fail(legacy.enqueue_release(queued));
        auto retired = value_or_fail(legacy.drain_releases());
        REQUIRE(retired.size() == 1);
        CHECK(retired[0].ticket == ticket);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("an older host range still drives the current plugin", "[versions]") {
    host::load_options older;
    older.host_range = {1, 0, 0};
    auto module = load_or_fail(test::testplugin_path(), older);
    REQUIRE(module->version().minor == 0);
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        // The kit sends nothing above the negotiated minor: not the level, not a slot, not a flag.
        CHECK(lazy.declared_minor() == 0);
        CHECK(lazy.effective_minor() == 0);
        CHECK(lazy.checked_table().release_allocation == nullptr);
        CHECK(lazy.raw_table()->struct_size == nxmem::abi::bytes_required<NxmemAllocatorVtable>(0));
        CHECK((lazy.raw_table()->capabilities & ~NXMEM_CAP_ALL_V1_0) == 0);
        CHECK((lazy.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0);
        auto backing = value_or_fail(lazy.virtual_backing());
        CHECK(backing.commit_granularity() == nxmem::detail::system_page_bytes());
        auto usage = lazy.query_usage();
        REQUIRE_FALSE(usage);
        CHECK(usage.error().code == status_code::unsupported_capability);
        auto live = value_or_fail(lazy.allocate(8192, 4096));
        CHECK(value_or_fail(lazy.release(live)).state == release_state::complete);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("each host range gets the tables of its own minor from the kit", "[versions]") {
    for (std::uint32_t ceiling = 0; ceiling <= NXMEM_ABI_MINOR; ++ceiling) {
        host::load_options options;
        options.host_range = {1, 0, ceiling};
        auto module = load_or_fail(test::testplugin_path(), options);
        REQUIRE(module->version().minor == ceiling);
        {
            auto lazy = open_or_fail<cpu_device>(module, "lazy");
            INFO("host range 1.0-1." << ceiling);
            // The test plugin's lazy fills slots up to minor 2 (it does not share across processes).
            CHECK(lazy.raw_table()->abi_minor == std::min<std::uint32_t>(ceiling, 2));
            CHECK((lazy.raw_table()->capabilities & ~NXMEM_CAPS_AT_MINOR(ceiling)) == 0);
            CHECK(((lazy.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) != 0) == (ceiling >= 1));
            CHECK(((lazy.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0) == (ceiling >= 2));
            CHECK(static_cast<bool>(lazy.query_usage()) == (ceiling >= 2));
        }
        REQUIRE(module->try_unload());
    }
}

TEST_CASE("the usage query reports live allocations, reserved, mapped and prefix bytes", "[usage]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        CHECK(value_or_fail(lazy.query_usage()) == nxmem::allocator_usage{});
        auto first = value_or_fail(lazy.allocate(3 * 4096, 4096));
        auto second = value_or_fail(lazy.allocate(100, 8));
        auto backing = value_or_fail(lazy.virtual_backing());
        CHECK(backing.commit_granularity() == 4096);
        REQUIRE(backing.commit(first, {4096, 8192}));
        REQUIRE(backing.commit(second, {0, 100})); // ends at the allocation's end: legal unaligned
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(512));
        auto usage = value_or_fail(lazy.query_usage());
        CHECK(usage.live_allocations == 2);
        CHECK(usage.reserved_bytes == 3 * 4096 + 100);
        CHECK(usage.mapped_bytes == 8192 + 100);
        CHECK(usage.shared_prefix_bytes == 4096); // C8: a prefix costs its whole pages
        CHECK(usage.quarantined_bytes == 0);
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(lazy.release(first));
        REQUIRE(lazy.release(second));
        CHECK(value_or_fail(lazy.query_usage()) == nxmem::allocator_usage{});
        auto eager = open_or_fail<cpu_device>(module, "eager");
        auto unsupported = eager.query_usage();
        REQUIRE_FALSE(unsupported);
        CHECK(unsupported.error().code == status_code::unsupported_capability);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a release that misdescribes the allocation is refused", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        const auto live = value_or_fail(eager.allocate(256, 64));

        SECTION("by the host, before the plugin is called") {
            for (auto misdescribe : {+[](allocation<cpu_device>& a) { a.size += 1; },
                                     +[](allocation<cpu_device>& a) { a.alignment = 32; },
                                     +[](allocation<cpu_device>& a) {
                                         a.address = static_cast<char*>(a.address) + 64;
                                     }}) {
                allocation<cpu_device> wrong = live;
                misdescribe(wrong);
                auto refused = eager.release(wrong);
                REQUIRE_FALSE(refused);
                CHECK(refused.error().code == status_code::invalid_argument);
                CHECK_THAT(refused.error().message, Catch::Contains("misdescribed"));
            }
        }
        SECTION("by the plugin, when a caller reaches its table directly") {
            NxmemAllocation wrong = wire(live);
            wrong.size = 255;
            CHECK(raw_deallocate(eager, wrong) == status_code::invalid_argument);
            wrong = wire(live);
            wrong.allocation_id += 1000;
            CHECK(raw_deallocate(eager, wrong) == status_code::invalid_argument);
        }
        // The allocation is as live as before: the true description still releases it.
        CHECK(value_or_fail(eager.release(live)).state == release_state::complete);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("releasing an unknown address fails rather than guessing", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        const auto live = value_or_fail(eager.allocate(128, 16));
        allocation<cpu_device> unknown = live;
        unknown.allocation_id = 1u << 30;
        auto refused = eager.release(unknown);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::unknown_allocation);

        NxmemAllocation stranger = wire(live);
        stranger.address += 4096; // an address the plugin never handed out
        CHECK(raw_deallocate(eager, stranger) == status_code::unknown_allocation);

        // released twice: the second time it is unknown
        REQUIRE(eager.release(live));
        auto twice = eager.release(live);
        REQUIRE_FALSE(twice);
        CHECK(twice.error().code == status_code::unknown_allocation);
        CHECK(raw_deallocate(eager, wire(live)) == status_code::unknown_allocation);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("the host's refusal messages stay word for word", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        auto legacy = open_or_fail<cpu_device>(module, "legacy-1-0");
        const auto live = value_or_fail(eager.allocate(256, 64));
        const std::string id = std::to_string(live.allocation_id);
        const std::string at = "0x" + nxmem::detail::to_hex(cpu_device::to_wire(live.address));

        allocation<cpu_device> bigger = live;
        bigger.size = 257;
        auto misdescribed = eager.release(bigger);
        REQUIRE_FALSE(misdescribed);
        CHECK(misdescribed.error().code == status_code::invalid_argument);
        CHECK(misdescribed.error().message ==
              "misdescribed allocation " + id + ": address " + at +
                  ", size 257, alignment 64 but the live one is at " + at + ", size 256, alignment 64");

        allocation<cpu_device> unknown = live;
        unknown.allocation_id += 1u << 20;
        auto refused = eager.release(unknown);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::unknown_allocation);
        CHECK(refused.error().message == "no live allocation with id " +
                                             std::to_string(unknown.allocation_id) + " (address " +
                                             at + ") in this allocator");

        auto sibling = legacy.release(live);
        REQUIRE_FALSE(sibling);
        CHECK(sibling.error().code == status_code::wrong_mechanism);
        CHECK(sibling.error().message == "an object of mechanism " + std::to_string(live.mechanism_id) +
                                             " was handed to 'legacy-1-0' (mechanism " +
                                             std::to_string(legacy.mechanism_id()) + ")");

        auto empty = eager.allocate(0, 8);
        REQUIRE_FALSE(empty);
        CHECK(empty.error().code == status_code::invalid_argument);
        CHECK(empty.error().message == "allocate: size 0 (an allocation is at least one byte)");
        auto crooked = eager.allocate(64, 24);
        REQUIRE_FALSE(crooked);
        CHECK(crooked.error().message == "allocate: alignment 24 is not a power of two");

        REQUIRE(eager.release(live));
        auto twice = eager.release(live);
        REQUIRE_FALSE(twice);
        CHECK(twice.error().message ==
              "no live allocation with id " + id + " (address " + at + ") in this allocator");
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("an allocation cannot be released by a sibling mechanism", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        auto legacy = open_or_fail<cpu_device>(module, "legacy-1-0");
        const auto live = value_or_fail(eager.allocate(512, 64));
        auto refused = legacy.release(live);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::wrong_mechanism);
        CHECK(raw_deallocate(legacy, wire(live)) == status_code::wrong_mechanism);
        CHECK(value_or_fail(eager.release(live)).state == release_state::complete);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("an object from another mechanism or device is refused", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto other_device = open_or_fail<cpu_device>(module, "lazy", 1);
        auto eager = open_or_fail<cpu_device>(module, "eager");
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());

        const auto foreign = value_or_fail(eager.allocate(8192, 4096));
        auto commit = backing.commit(foreign, {0, 4096});
        REQUIRE_FALSE(commit);
        CHECK(commit.error().code == status_code::wrong_mechanism);

        const auto elsewhere = value_or_fail(other_device.allocate(8192, 4096));
        auto wrong_device = lazy.release(elsewhere);
        REQUIRE_FALSE(wrong_device);
        CHECK(wrong_device.error().code == status_code::wrong_device);
        NxmemStatus status = nxmem::abi::make_status();
        NxmemAllocation described = wire(elsewhere);
        CHECK(lazy.checked_table().deallocate(lazy.raw_table(), &described, &status) ==
              NXMEM_STATUS_WRONG_DEVICE);

        auto prefix = value_or_fail(mapping.create_prefix(4096));
        host::shared_prefix forged = prefix;
        forged.mechanism_id = eager.mechanism_id();
        auto retained = mapping.retain_prefix(forged);
        REQUIRE_FALSE(retained);
        CHECK(retained.error().code == status_code::wrong_mechanism);

        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(eager.release(foreign));
        REQUIRE(other_device.release(elsewhere));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a mechanism refuses a device type it does not serve", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    auto opened = host::open_allocator<hip_device>(module, "eager");
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::wrong_device);
    CHECK_THAT(opened.error().message, Catch::Contains("hip"));
    REQUIRE(module->try_unload());
}

TEST_CASE("an option a mechanism does not know is refused by name", "[misuse]") {
    auto module = load_or_fail(test::testplugin_path());
    auto opened = host::open_allocator<cpu_device>(module, "eager", 0, "colour=blue");
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::invalid_argument);
    CHECK_THAT(opened.error().message, Catch::Contains("colour"));
    auto malformed = host::open_allocator<cpu_device>(module, "eager", 0, "no equals sign");
    REQUIRE_FALSE(malformed);
    CHECK_THAT(malformed.error().message, Catch::Contains("key=value"));
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("a slot that throws yields INTERNAL_ERROR and the host stays usable", "[guard]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto throwing = open_or_fail<cpu_device>(module, "throwing");
        auto failed = throwing.allocate(64, 8);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::internal_error);
        CHECK_THAT(failed.error().message, Catch::Contains("allocate always throws"));
        auto eager = open_or_fail<cpu_device>(module, "eager");
        auto live = value_or_fail(eager.allocate(64, 8));
        CHECK(eager.release(live));
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("the C example plugin is driven through the same adapter", "[c-example]") {
    auto module = load_or_fail(test::minimal_c_plugin_path());
    {
        auto minimal = open_or_fail<cpu_device>(module, "minimal-c");
        CHECK(minimal.capabilities() == 0);
        auto live = value_or_fail(minimal.allocate(1000, 256));
        CHECK(reinterpret_cast<std::uintptr_t>(live.address) % 256 == 0);
        allocation<cpu_device> wrong = live;
        wrong.size = 999;
        CHECK_FALSE(minimal.release(wrong));
        CHECK(raw_deallocate(minimal, [&] { auto w = wire(live); w.size = 999; return w; }()) ==
              status_code::invalid_argument);
        CHECK(value_or_fail(minimal.release(live)).state == release_state::complete);
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocators == 1);
        CHECK(readiness.plugin.allocations == 0);
    }
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(test::minimal_c_plugin_path()));
}

TEST_CASE("release_after keeps an allocation the mechanism cannot fence, and releases it at the "
          "first drain after its fences complete",
          "[allocator][streams]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        REQUIRE(eager.fence_kinds() == 0); // the test plugin's eager waits on nothing itself
        const device_id device = eager.device();
        std::atomic<std::uint64_t> copy_done{0};
        std::atomic<std::uint64_t> kernel_done{0};
        const allocation<cpu_device> first = value_or_fail(eager.allocate(4096, 64));
        const allocation<cpu_device> second = value_or_fail(eager.allocate(4096, 64));
        bool device_work_done = false;
        const host::fence device_event{NXMEM_FENCE_CUDA_EVENT, device, 0x1234, 0};
        const std::array first_fences{host::fence::host_timeline(copy_done, 1, device),
                                      host::fence::host_timeline(kernel_done, 3, device)};
        const std::uint64_t first_ticket = value_or_fail(eager.release_after(first, first_fences));
        const std::array second_fences{device_event};
        const std::uint64_t second_ticket = value_or_fail(eager.release_after(
            second, second_fences, [&](const host::fence& asked) {
                CHECK(asked.handle == 0x1234);
                return device_work_done;
            }));

        // Handed over: the engine's own release is refused; both still count as held.
        CHECK(eager.release(first).error().code == status_code::unknown_allocation);
        CHECK(value_or_fail(module->readiness()).host.queued_releases == 2);
        CHECK(value_or_fail(eager.drain_releases()).empty());
        copy_done.store(1);
        CHECK(value_or_fail(eager.drain_releases()).empty()); // one of its two fences is pending
        device_work_done = true;
        CHECK(value_or_fail(eager.drain_releases()).empty()); // the second waits behind the first
        kernel_done.store(3);
        const std::vector<host::release_completion> retired = value_or_fail(eager.drain_releases());
        REQUIRE(retired.size() == 2);
        CHECK(retired[0].ticket == first_ticket);
        CHECK(retired[0].allocation_id == first.allocation_id);
        CHECK(retired[1].ticket == second_ticket);
        CHECK(value_or_fail(module->readiness()).host.queued_releases == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("release_after refuses what no side can wait on, and malformed fences, keeping the "
          "allocation live",
          "[allocator][streams]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        const allocation<cpu_device> live = value_or_fail(eager.allocate(64, 64));
        std::atomic<std::uint64_t> counter{0};
        const host::fence stream{NXMEM_FENCE_CUDA_STREAM, eager.device(), 0, 0};
        const host::fence elsewhere = host::fence::host_timeline(counter, 1, device_id{NXMEM_DEVICE_CPU, 3});
        CHECK(eager.release_after(live, std::array{stream}).error().code ==
              status_code::unsupported_capability);
        CHECK(eager.release_after(live, std::array{elsewhere}).error().code == status_code::wrong_device);
        CHECK(eager.release_after(live, std::span<const host::fence>{}).error().code ==
              status_code::invalid_argument);
        CHECK(value_or_fail(module->readiness()).host.queued_releases == 0);
        CHECK(eager.release(live)); // still live
    }
    REQUIRE(module->try_unload());
}
