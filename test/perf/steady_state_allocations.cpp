// No heap allocation on the success path of host or kit: N steady-state allocate + release round
// trips through the host adapter, and through the plugin's table called directly, make exactly
// the heap allocations the mechanism makes when called directly (posix-eager takes its small
// allocations from the C heap: one each). This executable interposes the C heap's entry points
// (and with them operator new, which calls malloc) and counts the calls made in a window.
// Not built under sanitizers, which interpose the same functions.
#include <measure/routes.hpp>

#include "eager.hpp" // plugins/posix

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* memory, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* memory);
}

namespace {

std::atomic<bool> counting{false};
std::atomic<std::uint64_t> heap_allocations{0};

void note_allocation() noexcept {
    if (counting.load(std::memory_order_relaxed)) {
        heap_allocations.fetch_add(1, std::memory_order_relaxed);
    }
}

} // namespace

extern "C" {
void* malloc(std::size_t size) {
    note_allocation();
    return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) {
    note_allocation();
    return __libc_calloc(count, size);
}
void* realloc(void* memory, std::size_t size) {
    note_allocation();
    return __libc_realloc(memory, size);
}
void free(void* memory) { __libc_free(memory); }
void* memalign(std::size_t alignment, std::size_t size) {
    note_allocation();
    return __libc_memalign(alignment, size);
}
void* aligned_alloc(std::size_t alignment, std::size_t size) {
    note_allocation();
    return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
    if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
        return EINVAL;
    }
    note_allocation();
    void* memory = __libc_memalign(alignment, size);
    if (memory == nullptr) {
        return ENOMEM;
    }
    *out = memory;
    return 0;
}
}

namespace {

constexpr unsigned round_trips = 1000;

// Heap allocations made by `round_trips` round trips of `route`, after as many uncounted ones.
template <class Route> std::uint64_t allocations_in(Route& route, std::uint64_t size) {
    for (unsigned i = 0; i < round_trips; ++i) {
        REQUIRE(nxmem::measure::round_trip(route, size, nxmem::measure::round_trip_alignment));
    }
    bool ok = true;
    heap_allocations = 0;
    counting = true;
    for (unsigned i = 0; i < round_trips; ++i) {
        ok = nxmem::measure::round_trip(route, size, nxmem::measure::round_trip_alignment) && ok;
    }
    counting = false;
    REQUIRE(ok);
    return heap_allocations.load();
}

std::string posix_plugin_path() {
    const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
    REQUIRE(path != nullptr);
    return path;
}

} // namespace

TEST_CASE("the interposer sees the heap allocations it must count") {
    nxmem::measure::malloc_route heap;
    CHECK(allocations_in(heap, 64) == round_trips);
    heap_allocations = 0;
    counting = true;
    void* volatile made = ::operator new(16); // a call, not a new-expression: never elided
    counting = false;
    ::operator delete(made);
    CHECK(heap_allocations.load() == 1); // operator new reaches malloc
}

TEST_CASE("host and kit make no heap allocation beyond the mechanism's own on a steady round trip") {
    auto module = nxmem::host::plugin_module::load(posix_plugin_path());
    REQUIRE(module.has_value());
    auto allocator = nxmem::host::open_allocator<nxmem::cpu_device>(module.value(), "posix-eager", 0);
    REQUIRE(allocator.has_value());
    auto mechanism = nxmem::measure::mechanism_route<nxmem::posix::eager_mechanism>::open();
    REQUIRE(mechanism.has_value());
    nxmem::measure::adapter_route adapter(allocator.value());
    nxmem::measure::table_route table(allocator.value(), 1ull << 62);

    for (std::uint64_t size : {std::uint64_t{64}, std::uint64_t{4096}, std::uint64_t{2} << 20}) {
        const std::uint64_t own = allocations_in(mechanism.value(), size);
        const std::uint64_t through_table = allocations_in(table, size);
        const std::uint64_t through_adapter = allocations_in(adapter, size);
        INFO(size << " B, " << round_trips << " round trips: heap allocations by the mechanism alone " << own
                  << ", through the plugin's table (kit) " << through_table << ", through the host adapter "
                  << through_adapter);
        CHECK(through_table == own);
        CHECK(through_adapter == own);
    }
}
