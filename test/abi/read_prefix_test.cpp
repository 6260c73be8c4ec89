// read_prefix<T>: the only way the host (or a plugin) reads a table the other side handed over.
// These tests pin every rule of DESIGN.md's read_prefix section: null and misaligned pointers,
// struct_size read first and bounded, self-contradicting senders refused, the level clamped into
// the local copy only, slots above the level NULL, and never a byte read past struct_size.
#include "../support/byte_buffer.hpp"
#include <nxmem/abi/read_prefix.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

using nxmem::status_code;
using nxmem::abi::bytes_required;
using nxmem::abi::known_minor;
using nxmem::abi::read_prefix;
using Catch::Matchers::Contains;

constexpr std::uint32_t u32_max = std::numeric_limits<std::uint32_t>::max();

using nxmem::test::byte_buffer;

// Two pages: the first read-write, the second PROT_NONE. Touching the second one faults.
class guarded_page {
public:
    guarded_page() : page_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {
        void* mapping =
            ::mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(mapping != MAP_FAILED);
        base_ = static_cast<unsigned char*>(mapping);
        REQUIRE(::mprotect(base_ + page_, page_, PROT_NONE) == 0);
    }
    ~guarded_page() { ::munmap(base_, 2 * page_); }
    guarded_page(const guarded_page&) = delete;
    guarded_page& operator=(const guarded_page&) = delete;

    // One past the last readable byte: the first byte of the PROT_NONE page.
    unsigned char* end() const noexcept { return base_ + page_; }
    unsigned char* begin() const noexcept { return base_; }
    std::size_t page_size() const noexcept { return page_; }
    void make_first_page_read_only() const { REQUIRE(::mprotect(base_, page_, PROT_READ) == 0); }

private:
    std::size_t page_;
    unsigned char* base_ = nullptr;
};

// Slot implementations: only their addresses matter, read_prefix never calls a slot.
NxmemStatusCode stub_allocate(NxmemAllocatorVtable*, const NxmemAllocRequest*, NxmemAllocResult*,
                              NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
NxmemStatusCode stub_deallocate(NxmemAllocatorVtable*, const NxmemAllocation*, NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
void stub_retain(NxmemAllocatorVtable*) {}
void stub_release(NxmemAllocatorVtable*) {}
NxmemStatusCode stub_enqueue_release(NxmemAllocatorVtable*, const NxmemAllocation*, std::uint64_t,
                                     NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
NxmemStatusCode stub_drain_releases(NxmemAllocatorVtable*, std::uint64_t*, NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
NxmemStatusCode stub_release_allocation(NxmemAllocatorVtable*, const NxmemAllocation*,
                                        NxmemReleaseOutcome*, NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
NxmemStatusCode stub_open_allocator(NxmemAllocatorFactoryVtable*, const NxmemOpenRequest*,
                                    NxmemAllocatorVtable**, NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
void stub_release_factory(NxmemAllocatorFactoryVtable*) {}
NxmemStatusCode stub_request_reclaim(void*, const NxmemReclaimRequest*, NxmemStatus*) {
    return NXMEM_STATUS_OK;
}
void stub_release_completed(void*, const NxmemReleaseCompletion*) {}

const NxmemVirtualBackingVtable some_virtual_backing{};
const NxmemSharedMappingVtable some_shared_mapping{};
int some_host_context = 0;

// A current (minor 1) allocator table with every slot and every capability table non-NULL.
NxmemAllocatorVtable full_allocator(std::uint32_t minor = 1) {
    NxmemAllocatorVtable table{};
    table.struct_size = sizeof(NxmemAllocatorVtable);
    table.abi_minor = minor;
    table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
    table.reserved = 0;
    table.capabilities = NXMEM_CAP_ALL_V1;
    table.mechanism_id = 0x1122334455667788u;
    table.device = NxmemDeviceId{sizeof(NxmemDeviceId), NXMEM_DEVICE_CPU, 3, 0};
    table.allocate = stub_allocate;
    table.deallocate = stub_deallocate;
    table.retain = stub_retain;
    table.release = stub_release;
    table.virtual_backing = &some_virtual_backing;
    table.shared_mapping = &some_shared_mapping;
    table.enqueue_release = stub_enqueue_release;
    table.drain_releases = stub_drain_releases;
    table.release_allocation = stub_release_allocation;
    return table;
}

NxmemAllocatorFactoryVtable full_factory(std::uint32_t minor = 0) {
    NxmemAllocatorFactoryVtable table{};
    table.struct_size = sizeof(NxmemAllocatorFactoryVtable);
    table.abi_minor = minor;
    table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
    table.name = "factory-under-test";
    table.mechanism_id = 42;
    table.device_types = 1u << NXMEM_DEVICE_CPU;
    table.open_allocator = stub_open_allocator;
    table.release = stub_release_factory;
    return table;
}

NxmemHostCallbacks full_callbacks(std::uint32_t minor = 0) {
    NxmemHostCallbacks table{};
    table.struct_size = sizeof(NxmemHostCallbacks);
    table.abi_minor = minor;
    table.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
    table.host_context = &some_host_context;
    table.request_reclaim = stub_request_reclaim;
    table.release_completed = stub_release_completed;
    return table;
}

// Writes `table` into `at` (at most `room` bytes of it), then the given struct_size.
template <class T>
void place(unsigned char* at, std::size_t room, const T& table, std::uint32_t struct_size) {
    std::memcpy(at, &table, std::min(room, sizeof(T)));
    std::memcpy(at, &struct_size, sizeof struct_size);
}

template <class T> std::vector<unsigned char> bytes_of(const T& value) {
    const auto* first = reinterpret_cast<const unsigned char*>(&value);
    return {first, first + sizeof(T)};
}

// The copy holds the source's bytes up to the effective level, the effective level at offset 4,
// and zeros everywhere else.
template <class T>
void check_copy_matches(const nxmem::abi::table_copy<T>& copy, const T& source,
                        std::uint32_t struct_size) {
    const std::size_t keep = bytes_required<T>(copy.effective_minor);
    const std::vector<unsigned char> got = bytes_of(copy.table);
    const std::vector<unsigned char> want = bytes_of(source);
    std::uint32_t head[3] = {};
    std::memcpy(head, got.data(), sizeof head);
    CHECK(head[0] == struct_size);
    CHECK(head[1] == copy.effective_minor);
    CHECK(head[2] == nxmem::abi::struct_traits<T>::type_tag);
    CHECK(std::equal(got.begin() + 12, got.begin() + static_cast<std::ptrdiff_t>(keep),
                     want.begin() + 12));
    CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(keep), got.end(),
                      [](unsigned char byte) { return byte == 0; }));
}

struct size_case {
    std::uint32_t struct_size;
    bool accepted_at_minor_0;
    bool accepted_at_minor_1;
};

// Every struct_size in `cases` at declared minors 0 and 1, each in a buffer of exactly
// struct_size bytes (the header's first bytes only, for sizes below 4; the whole struct for sizes
// above the cap, which must be refused without being read).
template <class T>
void check_size_matrix(const T& source_template, const std::vector<size_case>& cases) {
    for (const std::uint32_t declared : {0u, 1u}) {
        for (const size_case& row : cases) {
            CAPTURE(declared, row.struct_size);
            const bool accepted = declared == 0 ? row.accepted_at_minor_0 : row.accepted_at_minor_1;
            const std::size_t room = row.struct_size <= NXMEM_MAX_STRUCT_SIZE
                                         ? std::max<std::size_t>(row.struct_size, 4)
                                         : sizeof(T);
            byte_buffer buffer(room, 0xAB);
            T source = source_template;
            source.abi_minor = declared;
            source.struct_size = row.struct_size;
            place(buffer.data(), room, source, row.struct_size);

            const auto copy = read_prefix<T>(buffer.data(), NXMEM_ABI_MINOR);
            REQUIRE(copy.has_value() == accepted);
            if (accepted) {
                CHECK(copy.value().struct_size == row.struct_size);
                CHECK(copy.value().declared_minor == declared);
                CHECK(copy.value().effective_minor == std::min(declared, known_minor<T>()));
                CHECK(copy.value().table.abi_minor == copy.value().effective_minor);
                check_copy_matches(copy.value(), source, row.struct_size);
            } else {
                CHECK(copy.error().code == status_code::contract_violation);
                CHECK_THAT(copy.error().message, Contains("struct_size"));
                CHECK_THAT(copy.error().message, Contains(std::to_string(row.struct_size)));
                CHECK_THAT(copy.error().message,
                           Contains(std::string(nxmem::abi::struct_traits<T>::name)));
            }
        }
    }
}

// Declared minors around every negotiated ceiling; the table is the full current struct with
// every slot non-NULL, so clearing above the level is observable.
template <class T> void check_level_matrix(const T& full_source) {
    for (const std::uint32_t ceiling : {0u, 1u}) {
        std::vector<std::uint32_t> declared_minors{0u, ceiling, ceiling + 1, NXMEM_ABI_MINOR + 1,
                                                   u32_max};
        if (ceiling >= 1) {
            declared_minors.push_back(ceiling - 1);
        }
        for (const std::uint32_t declared : declared_minors) {
            CAPTURE(ceiling, declared);
            T source = full_source;
            source.abi_minor = declared;
            const std::vector<unsigned char> before = bytes_of(source);

            const auto copy = read_prefix<T>(&source, ceiling);
            REQUIRE(copy.has_value());
            const std::uint32_t expected = std::min({declared, ceiling, known_minor<T>()});
            CHECK(copy.value().effective_minor == expected);
            CHECK(copy.value().table.abi_minor == expected);
            CHECK(copy.value().declared_minor == declared);
            CHECK(copy.value().struct_size == sizeof(T));
            check_copy_matches(copy.value(), source, sizeof(T));
            // The clamped level went into the copy only.
            CHECK(bytes_of(source) == before);
            CHECK(source.abi_minor == declared);
        }
    }
}

} // namespace

TEST_CASE("the layout facts the read_prefix tests rely on hold", "[read_prefix]") {
    STATIC_REQUIRE(sizeof(NxmemAllocatorVtable) == 152);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(0) == 112);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(1) == 120);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(2) == 128);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(3) == 136);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(4) == 152);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorVtable>(u32_max) == 152);
    STATIC_REQUIRE(known_minor<NxmemAllocatorVtable>() == 4);
    STATIC_REQUIRE(offsetof(NxmemAllocatorVtable, fenced_release) == 136);
    STATIC_REQUIRE(offsetof(NxmemAllocatorVtable, copy) == 144);
    STATIC_REQUIRE(sizeof(NxmemFencedReleaseVtable) == 32);
    STATIC_REQUIRE(sizeof(NxmemCopyVtable) == 32);
    STATIC_REQUIRE(nxmem::abi::introduced_minor<NxmemFencedReleaseVtable>() == 4);
    STATIC_REQUIRE(nxmem::abi::introduced_minor<NxmemCopyVtable>() == 4);
    STATIC_REQUIRE(offsetof(NxmemAllocatorVtable, ipc) == 128);
    STATIC_REQUIRE(sizeof(NxmemIpcVtable) == 40);
    STATIC_REQUIRE(bytes_required<NxmemIpcVtable>(3) == 40);
    STATIC_REQUIRE(nxmem::abi::introduced_minor<NxmemIpcVtable>() == 3);
    STATIC_REQUIRE(sizeof(NxmemIpcHandle) == 136);
    STATIC_REQUIRE(nxmem::abi::baseline_bytes<NxmemIpcHandle>() == 136);
    STATIC_REQUIRE(sizeof(NxmemUnloadReport) == 56);
    STATIC_REQUIRE(nxmem::abi::baseline_bytes<NxmemUnloadReport>() == 48);
    STATIC_REQUIRE(offsetof(NxmemAllocatorVtable, release_allocation) == 112);
    STATIC_REQUIRE(offsetof(NxmemAllocatorVtable, query_usage) == 120);
    STATIC_REQUIRE(sizeof(NxmemVirtualBackingVtable) == 48);
    STATIC_REQUIRE(bytes_required<NxmemVirtualBackingVtable>(1) == 40);
    STATIC_REQUIRE(bytes_required<NxmemVirtualBackingVtable>(2) == 48);
    STATIC_REQUIRE(offsetof(NxmemVirtualBackingVtable, commit_granularity) == 40);
    STATIC_REQUIRE(sizeof(NxmemAllocatorUsage) == 64);
    STATIC_REQUIRE(nxmem::abi::introduced_minor<NxmemAllocatorUsage>() == 2);
    STATIC_REQUIRE(nxmem::abi::baseline_bytes<NxmemAllocatorUsage>() == 48);
    STATIC_REQUIRE(alignof(NxmemAllocatorVtable) == 8);
    STATIC_REQUIRE(sizeof(NxmemAllocatorFactoryVtable) == 56);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorFactoryVtable>(0) == 56);
    STATIC_REQUIRE(bytes_required<NxmemAllocatorFactoryVtable>(1) == 56);
    STATIC_REQUIRE(known_minor<NxmemAllocatorFactoryVtable>() == 0);
    STATIC_REQUIRE(sizeof(NxmemHostCallbacks) == 40);
    STATIC_REQUIRE(bytes_required<NxmemHostCallbacks>(0) == 40);
    STATIC_REQUIRE(known_minor<NxmemHostCallbacks>() == 0);
    STATIC_REQUIRE(nxmem::abi::table_header_bytes == 12);
    STATIC_REQUIRE(NXMEM_MAX_STRUCT_SIZE == 4096);
}

TEST_CASE("an allocator table is accepted exactly when its struct_size covers its level and the cap",
          "[read_prefix][size]") {
    // Literal expectations: 112 bytes cover minor 0, 120 cover minor 1, 4096 is the cap.
    check_size_matrix(full_allocator(), {
                                            {0, false, false},
                                            {4, false, false},
                                            {7, false, false},
                                            {8, false, false},
                                            {11, false, false},
                                            {12, false, false},
                                            {111, false, false}, // minor 0 required - 1
                                            {112, true, false},  // minor 0 required
                                            {119, true, false},  // minor 1 required - 1
                                            {120, true, true},   // minor 1 required == sizeof
                                            {121, true, true},   // sizeof + 1
                                            {128, true, true},   // sizeof rounded up to 8 more
                                            {4096, true, true},  // the cap itself
                                            {4097, false, false},
                                            {0x7FFFFFFFu, false, false},
                                            {0xFFFFFFFFu, false, false},
                                        });
}

TEST_CASE("a factory table is accepted exactly when its struct_size covers its level and the cap",
          "[read_prefix][size]") {
    // The factory table has no minor-1 field: 56 bytes cover every level.
    check_size_matrix(full_factory(), {
                                          {0, false, false},
                                          {4, false, false},
                                          {7, false, false},
                                          {8, false, false},
                                          {12, false, false},
                                          {55, false, false},
                                          {56, true, true},
                                          {57, true, true},
                                          {64, true, true},
                                          {4096, true, true},
                                          {4097, false, false},
                                          {0x7FFFFFFFu, false, false},
                                          {0xFFFFFFFFu, false, false},
                                      });
}

TEST_CASE("a host callback table is accepted exactly when its struct_size covers its level and the cap",
          "[read_prefix][size]") {
    check_size_matrix(full_callbacks(), {
                                            {0, false, false},
                                            {8, false, false},
                                            {39, false, false},
                                            {40, true, true},
                                            {41, true, true},
                                            {48, true, true},
                                            {4097, false, false},
                                            {0xFFFFFFFFu, false, false},
                                        });
}

TEST_CASE("a table claiming a level it is too small for is refused", "[read_prefix][size]") {
    NxmemAllocatorVtable source = full_allocator(1);
    source.struct_size = static_cast<std::uint32_t>(bytes_required<NxmemAllocatorVtable>(0));
    const auto copy = read_prefix<NxmemAllocatorVtable>(&source, 1);
    REQUIRE(copy.has_error());
    CHECK(copy.error().code == status_code::contract_violation);
    CHECK_THAT(copy.error().message, Contains("claims minor 1"));
    CHECK_THAT(copy.error().message, Contains("struct_size is 112"));
    CHECK_THAT(copy.error().message, Contains("120"));
}

TEST_CASE("the effective level is the least of declared, negotiated and known, and slots above it "
          "read NULL",
          "[read_prefix][level]") {
    SECTION("allocator table") { check_level_matrix(full_allocator()); }
    SECTION("factory table") { check_level_matrix(full_factory()); }
    SECTION("host callback table") { check_level_matrix(full_callbacks()); }
}

TEST_CASE("release_allocation is cleared at level 0 and kept at level 1", "[read_prefix][level]") {
    // The matrix above checks this through bytes; this names the slot itself.
    for (const std::uint32_t ceiling : {0u, 1u}) {
        for (const std::uint32_t declared : {0u, 1u, 2u, u32_max}) {
            CAPTURE(ceiling, declared);
            NxmemAllocatorVtable source = full_allocator(declared);
            const auto copy = read_prefix<NxmemAllocatorVtable>(&source, ceiling);
            REQUIRE(copy.has_value());
            const NxmemAllocatorVtable& table = copy.value().table;
            CHECK(table.allocate == &stub_allocate);
            CHECK(table.deallocate == &stub_deallocate);
            CHECK(table.retain == &stub_retain);
            CHECK(table.release == &stub_release);
            CHECK(table.virtual_backing == &some_virtual_backing);
            CHECK(table.shared_mapping == &some_shared_mapping);
            CHECK(table.enqueue_release == &stub_enqueue_release);
            CHECK(table.drain_releases == &stub_drain_releases);
            CHECK(table.capabilities == NXMEM_CAP_ALL_V1);
            CHECK(table.mechanism_id == 0x1122334455667788u);
            CHECK(table.device.index == 3);
            if (declared >= 1 && ceiling >= 1) {
                CHECK(table.release_allocation == &stub_release_allocation);
                CHECK(table.abi_minor == 1);
            } else {
                CHECK(table.release_allocation == nullptr);
                CHECK(table.abi_minor == 0);
            }
            CHECK(source.release_allocation == &stub_release_allocation);
            CHECK(source.abi_minor == declared);
        }
    }
}

TEST_CASE("a minor newer than this header is accepted and clamped when its size covers what is known",
          "[read_prefix][level]") {
    for (const std::uint32_t declared : {NXMEM_ABI_MINOR + 1, 7u, u32_max}) {
        for (const std::uint32_t struct_size : {152u, 153u, 160u, 256u, 4096u}) {
            CAPTURE(declared, struct_size);
            byte_buffer buffer(struct_size, 0xCD); // a newer plugin's unknown trailing slots
            place(buffer.data(), buffer.size(), full_allocator(declared), struct_size);
            const auto copy = read_prefix<NxmemAllocatorVtable>(buffer.data(), NXMEM_ABI_MINOR);
            REQUIRE(copy.has_value());
            CHECK(copy.value().declared_minor == declared);
            CHECK(copy.value().effective_minor == NXMEM_ABI_MINOR);
            CHECK(copy.value().table.abi_minor == NXMEM_ABI_MINOR);
            CHECK(copy.value().table.struct_size == struct_size);
            CHECK(copy.value().table.release_allocation == &stub_release_allocation);
        }
        // A newer minor is a strict superset: it cannot be shorter than the newest known level.
        CAPTURE(declared);
        NxmemAllocatorVtable short_source = full_allocator(declared);
        short_source.struct_size = 144; // covers minor 3, not minor 4
        const auto refused = read_prefix<NxmemAllocatorVtable>(&short_source, NXMEM_ABI_MINOR);
        REQUIRE(refused.has_error());
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Contains("struct_size"));
    }
}

TEST_CASE("a null table pointer is refused", "[read_prefix][pointer]") {
    const auto copy = read_prefix<NxmemAllocatorVtable>(nullptr, 1);
    REQUIRE(copy.has_error());
    CHECK(copy.error().code == status_code::contract_violation);
    CHECK_THAT(copy.error().message, Contains("NULL"));
    const auto factory = read_prefix<NxmemAllocatorFactoryVtable>(nullptr, 0);
    REQUIRE(factory.has_error());
    CHECK(factory.error().code == status_code::contract_violation);
}

TEST_CASE("a table pointer not aligned to 8 is refused before anything is read",
          "[read_prefix][pointer]") {
    const NxmemAllocatorVtable source = full_allocator(1);
    for (std::size_t offset = 1; offset <= 9; ++offset) {
        CAPTURE(offset);
        byte_buffer buffer(offset + sizeof source);
        std::memcpy(buffer.data() + offset, &source, sizeof source);
        const auto copy = read_prefix<NxmemAllocatorVtable>(buffer.data() + offset, 1);
        if (offset == 8) {
            REQUIRE(copy.has_value());
            CHECK(copy.value().effective_minor == 1);
            CHECK(copy.value().table.allocate == &stub_allocate);
            CHECK(copy.value().table.release_allocation == &stub_release_allocation);
        } else {
            REQUIRE(copy.has_error());
            CHECK(copy.error().code == status_code::contract_violation);
            CHECK_THAT(copy.error().message, Contains("aligned"));
        }
    }
}

TEST_CASE("a short table ending right before a PROT_NONE page is read without touching the page",
          "[read_prefix][bounds]") {
    guarded_page pages;

    SECTION("a minor-0 allocator table whose last byte is the last byte of the page") {
        const std::uint32_t size = static_cast<std::uint32_t>(bytes_required<NxmemAllocatorVtable>(0));
        unsigned char* at = pages.end() - size;
        place(at, size, full_allocator(0), size);
        const auto copy = read_prefix<NxmemAllocatorVtable>(at, 1);
        REQUIRE(copy.has_value());
        CHECK(copy.value().struct_size == 112);
        CHECK(copy.value().effective_minor == 0);
        CHECK(copy.value().table.drain_releases == &stub_drain_releases);
        CHECK(copy.value().table.release_allocation == nullptr);
    }
    SECTION("a factory table and a host callback table at the very end of the page") {
        unsigned char* factory_at = pages.end() - sizeof(NxmemAllocatorFactoryVtable);
        place(factory_at, sizeof(NxmemAllocatorFactoryVtable), full_factory(0),
              sizeof(NxmemAllocatorFactoryVtable));
        const auto factory = read_prefix<NxmemAllocatorFactoryVtable>(factory_at, 1);
        REQUIRE(factory.has_value());
        CHECK(factory.value().table.release == &stub_release_factory);

        unsigned char* callbacks_at = pages.end() - sizeof(NxmemHostCallbacks);
        place(callbacks_at, sizeof(NxmemHostCallbacks), full_callbacks(0),
              sizeof(NxmemHostCallbacks));
        const auto callbacks = read_prefix<NxmemHostCallbacks>(callbacks_at, 1);
        REQUIRE(callbacks.has_value());
        CHECK(callbacks.value().table.release_completed == &stub_release_completed);
    }
    SECTION("a bare 12-byte header near the end of the page is refused, not over-read") {
        // The last 8-aligned spot that holds 12 bytes: a reader that copied sizeof(T) (or
        // bytes_required) before checking struct_size would fault here.
        unsigned char* at = pages.end() - 16;
        place(at, 12, full_allocator(0), 12);
        const auto copy = read_prefix<NxmemAllocatorVtable>(at, 1);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::contract_violation);
        CHECK_THAT(copy.error().message, Contains("struct_size is 12"));
    }
    SECTION("a 12-byte header ending exactly at the page end is refused as misaligned") {
        unsigned char* at = pages.end() - 12;
        place(at, 12, full_allocator(0), 12);
        const auto copy = read_prefix<NxmemAllocatorVtable>(at, 1);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::contract_violation);
        CHECK_THAT(copy.error().message, Contains("aligned"));
    }
    SECTION("a struct_size too small for the header is refused before the type tag is read") {
        // struct_size and abi_minor are the last 8 bytes of the page; the type tag would be the
        // first bytes of the PROT_NONE page.
        for (const std::uint32_t size : {0u, 4u, 8u}) {
            CAPTURE(size);
            unsigned char* at = pages.end() - 8;
            place(at, 8, full_allocator(0), size);
            const auto copy = read_prefix<NxmemAllocatorVtable>(at, 1);
            REQUIRE(copy.has_error());
            CHECK(copy.error().code == status_code::contract_violation);
            CHECK_THAT(copy.error().message, Contains("struct_size " + std::to_string(size)));
        }
    }
}

TEST_CASE("bytes past struct_size never reach the local copy", "[read_prefix][bounds]") {
    const std::uint32_t size = static_cast<std::uint32_t>(bytes_required<NxmemAllocatorVtable>(0));
    byte_buffer buffer(sizeof(NxmemAllocatorVtable) + 16, 0xAB);
    const NxmemAllocatorVtable source = full_allocator(0);
    place(buffer.data(), size, source, size);
    REQUIRE(buffer.data()[size] == 0xAB);

    const auto copy = read_prefix<NxmemAllocatorVtable>(buffer.data(), 1);
    REQUIRE(copy.has_value());
    const std::vector<unsigned char> got = bytes_of(copy.value().table);
    CHECK(std::all_of(got.begin() + size, got.end(), [](unsigned char byte) { return byte == 0; }));
    CHECK(std::equal(got.begin(), got.begin() + size, buffer.data()));
    CHECK(copy.value().table.release_allocation == nullptr);
}

namespace {
const NxmemAllocatorVtable read_only_allocator = {
    .struct_size = sizeof(NxmemAllocatorVtable),
    .abi_minor = 1,
    .type_tag = NXMEM_TYPE_TAG_ALLOCATOR,
    .reserved = 0,
    .capabilities = NXMEM_CAP_STRUCTURED_RELEASE,
    .mechanism_id = 9,
    .device = {sizeof(NxmemDeviceId), NXMEM_DEVICE_CPU, 0, 0},
    .allocate = stub_allocate,
    .deallocate = stub_deallocate,
    .retain = stub_retain,
    .release = stub_release,
    .virtual_backing = nullptr,
    .shared_mapping = nullptr,
    .enqueue_release = nullptr,
    .drain_releases = nullptr,
    .release_allocation = stub_release_allocation,
    .query_usage = nullptr,
    .ipc = nullptr,
    .fenced_release = nullptr,
    .copy = nullptr,
};
} // namespace

TEST_CASE("a table in read-only memory is read and left unmodified", "[read_prefix][read_only]") {
    SECTION("a static const table") {
        for (const std::uint32_t ceiling : {0u, 1u}) {
            CAPTURE(ceiling);
            const auto copy = read_prefix<NxmemAllocatorVtable>(&read_only_allocator, ceiling);
            REQUIRE(copy.has_value());
            CHECK(copy.value().effective_minor == ceiling);
            CHECK(copy.value().table.abi_minor == ceiling);
            CHECK(read_only_allocator.abi_minor == 1);
            CHECK(read_only_allocator.release_allocation == &stub_release_allocation);
        }
    }
    SECTION("a page made PROT_READ") {
        guarded_page pages;
        unsigned char* at = pages.begin();
        place(at, sizeof(NxmemAllocatorVtable), full_allocator(1),
              sizeof(NxmemAllocatorVtable));
        const std::vector<unsigned char> before(at, at + sizeof(NxmemAllocatorVtable));
        pages.make_first_page_read_only();

        const auto copy = read_prefix<NxmemAllocatorVtable>(at, 0);
        REQUIRE(copy.has_value());
        CHECK(copy.value().effective_minor == 0);
        CHECK(copy.value().table.abi_minor == 0);
        CHECK(copy.value().table.release_allocation == nullptr);
        const std::vector<unsigned char> after(at, at + sizeof(NxmemAllocatorVtable));
        CHECK(after == before);
        std::uint32_t source_minor = 0;
        std::memcpy(&source_minor, at + offsetof(NxmemAllocatorVtable, abi_minor),
                    sizeof source_minor);
        CHECK(source_minor == 1);
    }
}

TEST_CASE("a table with the wrong type tag is refused", "[read_prefix][tag]") {
    SECTION("a factory tag on an allocator table") {
        NxmemAllocatorVtable source = full_allocator(1);
        source.type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
        const auto copy = read_prefix<NxmemAllocatorVtable>(&source, 1);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::contract_violation);
        CHECK_THAT(copy.error().message, Contains("type tag"));
        CHECK_THAT(copy.error().message, Contains("46414e58", Catch::CaseSensitive::No));
        CHECK_THAT(copy.error().message, Contains("4c414e58", Catch::CaseSensitive::No));
    }
    SECTION("an allocator tag on a factory table") {
        NxmemAllocatorFactoryVtable source = full_factory(0);
        source.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
        const auto copy = read_prefix<NxmemAllocatorFactoryVtable>(&source, 1);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::contract_violation);
        CHECK_THAT(copy.error().message, Contains("4c414e58", Catch::CaseSensitive::No));
    }
    SECTION("a zero tag, a byte-swapped tag and a host callback table read as an allocator") {
        for (const std::uint32_t tag :
             {0u, 0x584E414Cu, NXMEM_TYPE_TAG_HOST_CALLBACKS, NXMEM_TYPE_TAG_VIRTUAL_BACKING}) {
            CAPTURE(tag);
            NxmemAllocatorVtable source = full_allocator(1);
            source.type_tag = tag;
            const auto copy = read_prefix<NxmemAllocatorVtable>(&source, 1);
            REQUIRE(copy.has_error());
            CHECK(copy.error().code == status_code::contract_violation);
            CHECK_THAT(copy.error().message, Contains("type tag"));
        }
    }
}
