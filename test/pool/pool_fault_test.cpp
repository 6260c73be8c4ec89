// The pool's own host allocations (slab records, table leaves, address-map nodes) failing one
// at a time (test/fault_injection's operator new): every call ends as a value or OUT_OF_MEMORY,
// nothing throws, and once the live allocations are released trim(0) leaves the upstream
// holding nothing (LeakSanitizer checks the host side in ASan builds).
#include "../fault_injection/allocation_failure.hpp"

#include <nxmem/pool.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <optional>

using namespace nxmem;

namespace {

// An upstream that makes no host allocation of its own (so only the pool's are counted).
class mapping_upstream {
public:
    using device_type = cpu_device;
    device_id device() const noexcept { return {NXMEM_DEVICE_CPU, 0}; }
    result<allocation<cpu_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t align = alignment < 4096 ? 4096 : alignment;
        const std::uint64_t bytes = (size + 4095) / 4096 * 4096 + align;
        void* raw = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) {
            return error{status_code::out_of_memory, {}};
        }
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t aligned = (start + align - 1) / align * align;
        live->fetch_add(1);
        // The whole over-mapping is released at once: record its start and length in the id.
        return allocation<cpu_device>{reinterpret_cast<void*>(aligned), size, alignment,
                                      (static_cast<std::uint64_t>(aligned - start) << 48) | bytes, 1, device()};
    }
    result<release_report> release(const allocation<cpu_device>& memory) {
        const std::uint64_t before = memory.allocation_id >> 48;
        const std::uint64_t bytes = memory.allocation_id & ((std::uint64_t{1} << 48) - 1);
        ::munmap(static_cast<char*>(memory.address) - before, bytes);
        live->fetch_sub(1);
        return release_report{release_state::complete, memory.size, 0};
    }
    std::atomic<std::int64_t>* live;
};

} // namespace

TEST_CASE("every host allocation of the pool can fail: OUT_OF_MEMORY, nothing lost", "[pool][fault-injection]") {
    test::fault::learn_runtime_objects();
    std::atomic<std::int64_t> upstream_live{0};
    std::uint64_t total = 0;
    for (std::uint64_t fail_at = 0;; ++fail_at) {
        INFO("failing host allocation " << fail_at);
        pool_options options;
        options.pass_through_bytes = 1 << 20;
        pool_allocator<mapping_upstream> pool(mapping_upstream{&upstream_live}, options);
        static constexpr std::array<std::uint64_t, 8> sizes = {64, 64, 3000, 100000, 100000, 2 << 20, 64, 5000};
        std::array<std::optional<allocation<cpu_device>>, sizes.size()> made{};
        int refused = 0;
        test::fault::arm(fail_at);
        try {
            for (std::size_t i = 0; i < sizes.size(); ++i) {
                auto one = pool.allocate(sizes[i], 16);
                if (one.has_value()) {
                    made[i] = one.value();
                } else {
                    refused += one.error().code == status_code::out_of_memory ? 1 : 1000;
                }
            }
            for (std::size_t i = 0; i < sizes.size(); i += 2) {
                if (made[i].has_value()) {
                    (void)pool.release(*made[i]);
                    made[i].reset();
                }
            }
            (void)pool.trim(0);
        } catch (...) {
            test::fault::disarm();
            FAIL("an exception escaped the pool");
        }
        test::fault::disarm();
        const bool reached = test::fault::injected();
        if (fail_at == 0) {
            total = test::fault::host_allocations_counted();
            REQUIRE(total > 0);
        }
        CHECK(refused < 1000); // every refusal was OUT_OF_MEMORY
        for (auto& one : made) {
            if (one.has_value()) {
                REQUIRE(pool.release(*one));
            }
        }
        pool.trim(0);
        CHECK(pool.usage().held_bytes == 0);
        CHECK(upstream_live.load() == 0);
        if (fail_at > 0 && !reached) {
            break; // past the last allocation of the sequence
        }
    }
    CHECK(total >= 3);
}
