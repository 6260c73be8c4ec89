// Rules of docs/ABI.md that are facts about the header and the ABI layer alone: sealed records
// (L7), the shape of every entry point (E3), device type values (X6), reserved and flags fields
// (Q8, Q9). Compile-time facts are STATIC_REQUIREd.
#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

namespace {

// L7: a sealed record has every field from the minor that introduced it, and no padding beyond
// what its own alignment adds: a field appended under a later minor fails this.
template <class T> constexpr bool is_sealed() {
    for (const nxmem::abi::field_info& field : nxmem::abi::struct_traits<T>::fields) {
        if (field.since != nxmem::abi::introduced_minor<T>()) {
            return false;
        }
    }
    const std::size_t end = nxmem::abi::bytes_required<T>(nxmem::abi::introduced_minor<T>());
    return sizeof(T) == (end + alignof(T) - 1) / alignof(T) * alignof(T);
}

// E3: a fallible entry point returns NxmemStatusCode and takes an NxmemStatus* last.
template <class Fn> struct entry_point;
template <class R, class... Args> struct entry_point<R (*)(Args...)> {
    static constexpr bool returns_status_code = std::is_same_v<R, NxmemStatusCode>;
    static constexpr bool returns_nothing = std::is_void_v<R>;
    static constexpr bool status_last =
        sizeof...(Args) > 0 &&
        std::is_same_v<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>, NxmemStatus*>;
    static constexpr bool takes_status = (std::is_same_v<Args, NxmemStatus*> || ...);
};
template <class... Fns> constexpr bool all_fallible() {
    return ((entry_point<Fns>::returns_status_code && entry_point<Fns>::status_last) && ...);
}
template <class... Fns> constexpr bool all_infallible() {
    return ((entry_point<Fns>::returns_nothing && !entry_point<Fns>::takes_status) && ...);
}

// Q8: every `reserved` field of every struct a sender builds with make_struct is zero.
template <class T> bool reserved_is_zero(const T& value) {
    for (const nxmem::abi::field_info& field : nxmem::abi::struct_traits<T>::fields) {
        if (field.name == "reserved") {
            std::uint32_t reserved = 1;
            std::memcpy(&reserved, reinterpret_cast<const unsigned char*>(&value) + field.offset,
                        sizeof reserved);
            if (reserved != 0) {
                return false;
            }
        }
    }
    return true;
}

} // namespace

TEST_CASE("L7: the sealed records hold only their first minor's fields", "[abi][rules]") {
    STATIC_REQUIRE(is_sealed<NxmemDeviceId>());
    STATIC_REQUIRE(is_sealed<NxmemAllocation>());
    STATIC_REQUIRE(is_sealed<NxmemByteRange>());
    STATIC_REQUIRE(is_sealed<NxmemReleaseOutcome>());
    STATIC_REQUIRE(is_sealed<NxmemSharedPrefixHandle>());
    STATIC_REQUIRE(is_sealed<NxmemVersionRange>());
    // Their sizes as frozen; the outer structs embedding them rely on these.
    STATIC_REQUIRE(sizeof(NxmemDeviceId) == 16);
    STATIC_REQUIRE(sizeof(NxmemAllocation) == 64);
    STATIC_REQUIRE(sizeof(NxmemByteRange) == 24);
    STATIC_REQUIRE(sizeof(NxmemReleaseOutcome) == 24);
    STATIC_REQUIRE(sizeof(NxmemSharedPrefixHandle) == 48);
    STATIC_REQUIRE(sizeof(NxmemVersionRange) == 16);
    // The check can fail: a growable table, which has appended fields, is not sealed.
    STATIC_REQUIRE_FALSE(is_sealed<NxmemAllocatorVtable>());
}

TEST_CASE("E3: every fallible entry point returns a status code and receives an NxmemStatus",
          "[abi][rules]") {
    STATIC_REQUIRE(all_fallible<NxmemNegotiateFn, NxmemCreateAllocatorFactoriesFn,
                                NxmemQueryUnloadReadinessFn, NxmemOpenAllocatorFn, NxmemAllocateFn,
                                NxmemDeallocateFn, NxmemEnqueueReleaseFn, NxmemDrainReleasesFn,
                                NxmemReleaseAllocationFn, NxmemQueryUsageFn, NxmemCommitFn,
                                NxmemDecommitFn, NxmemMappedBytesFn, NxmemCreateSharedPrefixFn,
                                NxmemRetainSharedPrefixFn, NxmemReleaseSharedPrefixFn,
                                NxmemCommitSharedPrefixFn, NxmemRequestReclaimFn>());
    // The slots that cannot fail (E7) return nothing and take no status.
    STATIC_REQUIRE(all_infallible<NxmemRetainFn, NxmemReleaseFn, NxmemReleaseFactoryFn,
                                  NxmemReleaseCompletedFn>());
    STATIC_REQUIRE(std::is_same_v<NxmemStatusCode, std::uint32_t>);
}

TEST_CASE("X6: the device type values, and 0 is none of them", "[abi][rules]") {
    STATIC_REQUIRE(NXMEM_DEVICE_CPU == 1);
    STATIC_REQUIRE(NXMEM_DEVICE_CUDA == 2);
    STATIC_REQUIRE(NXMEM_DEVICE_HIP == 3);
    STATIC_REQUIRE(NXMEM_DEVICE_LEVEL_ZERO == 4);
}

TEST_CASE("Q8: senders zero reserved fields and receivers ignore them", "[abi][rules]") {
    SECTION("make_struct zeroes every reserved field") {
        std::apply([](auto... types) { CHECK((reserved_is_zero(nxmem::abi::make_struct<decltype(types)>()) && ...)); },
                   nxmem::abi::all_structs{});
    }
    SECTION("a request with a non-zero reserved field is read as if it were zero") {
        auto allocation = nxmem::abi::make_struct<NxmemAllocation>();
        allocation.reserved = 0xFFFFFFFFu;
        allocation.device.reserved = 0xFFFFFFFFu;
        allocation.size = 64;
        auto read = nxmem::abi::read_request(&allocation);
        REQUIRE(read);
        CHECK(read.value().size == 64);
    }
    SECTION("a table with a non-zero reserved field is read") {
        alignas(NxmemAllocatorFactoryVtable) auto factory = nxmem::abi::make_struct<NxmemAllocatorFactoryVtable>();
        factory.type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
        factory.reserved = 0xFFFFFFFFu;
        factory.mechanism_id = 7;
        auto read = nxmem::abi::read_prefix<NxmemAllocatorFactoryVtable>(&factory, NXMEM_ABI_MINOR);
        REQUIRE(read);
        CHECK(read.value().table.mechanism_id == 7);
    }
}

TEST_CASE("Q9: a sender's flags are zero; major 1 defines none", "[abi][rules]") {
    CHECK(nxmem::abi::make_struct<NxmemAllocRequest>().flags == 0);
    // NxmemAllocRequest::flags is the only flags field of the contract.
    std::size_t flags_fields = 0;
    std::apply(
        [&](auto... types) {
            ((flags_fields += nxmem::abi::find_field<decltype(types)>("flags") != nullptr ? 1 : 0), ...);
        },
        nxmem::abi::all_structs{});
    CHECK(flags_fields == 1);
    CHECK(nxmem::abi::find_field<NxmemAllocRequest>("flags") != nullptr);
}
