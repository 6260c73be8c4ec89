// The usage totals the kit fills itself (issue 35, item 5): a mechanism that completes the kit's
// counts and adds nothing reports, through the C table, the live allocations and their blocks'
// usable bytes (queued releases included), and the imports with the bytes they map, across
// allocate, commit, release, deferred release, import and close; a failed call leaves every total
// as it was; the registry's reserved bytes, read while threads allocate and release (some on
// other threads than allocated), never wrap and are exact once they stop.
#include <nxmem/plugin.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <thread>
#include <vector>

namespace kit_usage {

using namespace nxmem;
using namespace nxmem::plugin;

// What the test makes the mechanism do next.
struct script {
    bool refuse_release = false;  // release_allocation reports FAILED
    bool refuse_close = false;    // close_imported_allocation fails
    std::uint64_t round_to = 1;   // a block's usable size: the size rounded up to this
};
inline script& next_calls() {
    static script calls;
    return calls;
}

// Heap memory, rounded up as scripted; imports "map" nothing but report their whole pages.
struct counted_by_kit {
    static constexpr const char* name = "counted-by-kit";
    static constexpr std::uint64_t mechanism_id = 0x6b697475; // "kitu"
    static constexpr std::uint64_t device_types = device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool retires_through_release_allocation = true;

    static result<std::unique_ptr<counted_by_kit>> open(open_context&) {
        return std::make_unique<counted_by_kit>();
    }

    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        if (size == refused_size) {
            return fail(status_code::out_of_memory, "the test refuses this size");
        }
        const std::uint64_t round = next_calls().round_to;
        const std::uint64_t usable = (size + round - 1) / round * round;
        // aligned_alloc takes a size that is a multiple of the alignment.
        const std::uint64_t placed = alignment < 16 ? 16 : alignment;
        void* memory = std::aligned_alloc(static_cast<std::size_t>(placed),
                                          static_cast<std::size_t>((usable + placed - 1) / placed * placed));
        if (memory == nullptr) {
            return fail(status_code::out_of_memory, "aligned_alloc");
        }
        return block{reinterpret_cast<std::uint64_t>(memory), usable, 0};
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        if (next_calls().refuse_release) {
            return release_outcome{NXMEM_RELEASE_FAILED, 0, 0};
        }
        std::free(reinterpret_cast<void*>(record.address));
        return release_outcome{NXMEM_RELEASE_COMPLETE, 0, 0};
    }

    result<void> commit(const allocation_record&, byte_range) { return success(); }
    result<void> decommit(const allocation_record&, byte_range) { return success(); }
    result<std::uint64_t> mapped_bytes(const allocation_record&) { return std::uint64_t{0}; }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        prefix_sizes_[++last_prefix_] = size;
        return last_prefix_;
    }
    result<void> commit_shared_prefix(const allocation_record&, std::uint64_t) { return success(); }
    void destroy_shared_prefix(std::uint64_t) {}

    // The mechanism states a prefix's size (the kit fills an allocation's).
    result<void> export_shared_prefix(std::uint64_t prefix_id, std::uint32_t, NxmemIpcHandle& handle) {
        handle.size = prefix_sizes_.at(prefix_id);
        return success();
    }
    result<imported_prefix> import_shared_prefix(const NxmemIpcHandle& handle, std::uint32_t) {
        return imported_prefix{++last_prefix_, whole_pages(handle.size)};
    }
    result<void> export_allocation(const allocation_record&, std::uint32_t, NxmemIpcHandle&) {
        return success();
    }
    result<imported_allocation> import_allocation(const NxmemIpcHandle& handle, std::uint32_t) {
        return imported_allocation{0x7000'0000'0000 + ++last_prefix_ * 0x100000, whole_pages(handle.size)};
    }
    result<void> close_imported_allocation(const imported_allocation&) {
        if (next_calls().refuse_close) {
            return fail(status_code::internal_error, "the test refuses to unmap");
        }
        return success();
    }

    // Adds nothing: the query reports exactly what the kit counted.
    result<allocator_usage> usage(allocator_usage counted) const { return counted; }

    static constexpr std::uint64_t refused_size = 13;

private:
    static std::uint64_t whole_pages(std::uint64_t size) { return (size + 4095) / 4096 * 4096; }
    std::uint64_t last_prefix_ = 0;
    std::map<std::uint64_t, std::uint64_t> prefix_sizes_;
};

void note_completion(void*, const NxmemReleaseCompletion*) {}

// One allocator of counted_by_kit through its C table, opened as a host at minor 3 would.
class opened {
public:
    opened() {
        this_module().negotiated_minor.store(NXMEM_ABI_MINOR);
        callbacks_ = abi::make_struct<NxmemHostCallbacks>();
        callbacks_.abi_minor = NXMEM_ABI_MINOR;
        callbacks_.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        callbacks_.release_completed = &note_completion;
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = device_.to_wire();
        request.callbacks = &callbacks_;
        table_ = allocator_object<counted_by_kit>::open(request).value();
    }
    ~opened() { table_->release(table_); }
    opened(const opened&) = delete;
    opened& operator=(const opened&) = delete;

    NxmemAllocatorVtable* table() const { return table_; }

    allocator_usage usage() const {
        auto wire = abi::make_struct<NxmemAllocatorUsage>();
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->query_usage(table_, &wire, &status) == NXMEM_STATUS_OK);
        return allocator_usage::from_wire(wire);
    }

    // The allocation's description, or a failure code.
    NxmemStatusCode allocate(std::uint64_t size, NxmemAllocation& made) {
        auto request = abi::make_struct<NxmemAllocRequest>();
        request.mechanism_id = counted_by_kit::mechanism_id;
        request.device = device_.to_wire();
        request.allocation_id = ++last_id_;
        request.size = size;
        request.alignment = 64;
        auto result = abi::make_struct<NxmemAllocResult>();
        auto status = abi::make_struct<NxmemStatus>();
        const NxmemStatusCode code = table_->allocate(table_, &request, &result, &status);
        made = abi::make_struct<NxmemAllocation>();
        made.mechanism_id = counted_by_kit::mechanism_id;
        made.device = request.device;
        made.allocation_id = request.allocation_id;
        made.address = result.address;
        made.size = size;
        made.alignment = 64;
        return code;
    }
    NxmemAllocation allocate(std::uint64_t size) {
        NxmemAllocation made;
        REQUIRE(allocate(size, made) == NXMEM_STATUS_OK);
        return made;
    }
    NxmemStatusCode release(const NxmemAllocation& live) {
        auto outcome = abi::make_struct<NxmemReleaseOutcome>();
        auto status = abi::make_struct<NxmemStatus>();
        return table_->release_allocation(table_, &live, &outcome, &status);
    }
    NxmemStatusCode commit(const NxmemAllocation& live) {
        auto range = abi::make_struct<NxmemRangeRequest>();
        range.allocation = live;
        range.range.offset = 0;
        range.range.length = live.size;
        auto status = abi::make_struct<NxmemStatus>();
        return table_->virtual_backing->commit(table_, &range, &status);
    }
    NxmemSharedPrefixHandle create_prefix(std::uint64_t size) {
        auto request = abi::make_struct<NxmemSharedPrefixRequest>();
        request.mechanism_id = counted_by_kit::mechanism_id;
        request.device = device_.to_wire();
        request.size = size;
        auto prefix = abi::make_struct<NxmemSharedPrefixHandle>();
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->shared_mapping->create_shared_prefix(table_, &request, &prefix, &status) ==
                NXMEM_STATUS_OK);
        return prefix;
    }
    void map_prefix(const NxmemAllocation& live, const NxmemSharedPrefixHandle& prefix) {
        auto request = abi::make_struct<NxmemSharedPrefixCommitRequest>();
        request.allocation = live;
        request.prefix = prefix;
        auto info = abi::make_struct<NxmemSharedPrefixCommitInfo>();
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->shared_mapping->commit_shared_prefix(table_, &request, &info, &status) ==
                NXMEM_STATUS_OK);
    }
    void drop_prefix(const NxmemSharedPrefixHandle& prefix) {
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->shared_mapping->release_shared_prefix(table_, &prefix, &status) == NXMEM_STATUS_OK);
    }
    NxmemIpcHandle export_allocation(const NxmemAllocation& live) {
        NxmemExportRequest request = export_request(NXMEM_IPC_ALLOCATION);
        request.allocation = live;
        return export_handle(request);
    }
    NxmemIpcHandle export_prefix(const NxmemSharedPrefixHandle& prefix) {
        NxmemExportRequest request = export_request(NXMEM_IPC_PREFIX);
        request.prefix = prefix;
        return export_handle(request);
    }
    NxmemImport import(const NxmemIpcHandle& handle) {
        auto request = abi::make_struct<NxmemImportRequest>();
        request.access = NXMEM_IPC_READ_WRITE;
        request.mechanism_id = counted_by_kit::mechanism_id;
        request.device = device_.to_wire();
        request.import_id = ++last_id_;
        request.handle = &handle;
        auto imported = abi::make_struct<NxmemImport>();
        auto status = abi::make_struct<NxmemStatus>();
        const NxmemStatusCode code = table_->ipc->import_handle(table_, &request, &imported, &status);
        INFO(status.message);
        REQUIRE(code == NXMEM_STATUS_OK);
        return imported;
    }
    NxmemStatusCode close(const NxmemImport& imported) {
        auto status = abi::make_struct<NxmemStatus>();
        return table_->ipc->close_import(table_, &imported, &status);
    }

private:
    static NxmemExportRequest export_request(NxmemIpcKind kind) {
        auto request = abi::make_struct<NxmemExportRequest>();
        request.kind = kind;
        request.access = NXMEM_IPC_READ_WRITE;
        return request;
    }
    NxmemIpcHandle export_handle(const NxmemExportRequest& request) {
        auto handle = abi::make_struct<NxmemIpcHandle>();
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->ipc->export_handle(table_, &request, &handle, &status) == NXMEM_STATUS_OK);
        return handle;
    }

    device_id device_{NXMEM_DEVICE_CPU, 0};
    NxmemHostCallbacks callbacks_{};
    NxmemAllocatorVtable* table_ = nullptr;
    std::uint64_t last_id_ = 0;
};

struct scripted {
    explicit scripted(script calls) { next_calls() = calls; }
    ~scripted() { next_calls() = {}; }
};

TEST_CASE("the kit counts live allocations and their blocks' usable bytes", "[plugin-kit][usage]") {
    opened allocator;
    CHECK(allocator.usage() == allocator_usage{});

    const NxmemAllocation exact = allocator.allocate(1000); // usable 1000: a packed record
    NxmemAllocation rounded;
    {
        scripted rounding({false, false, 4096});
        rounded = allocator.allocate(5000); // usable 8192: kept whole beside the packed records
    }
    allocator_usage now = allocator.usage();
    CHECK(now.live_allocations == 2);
    CHECK(now.reserved_bytes == 1000 + 8192);

    SECTION("commit changes nothing the kit counts") {
        REQUIRE(allocator.commit(rounded) == NXMEM_STATUS_OK);
        CHECK(allocator.usage() == now);
    }
    SECTION("a failed allocate, a refused release and a misdescribed one change nothing") {
        NxmemAllocation refused;
        CHECK(allocator.allocate(counted_by_kit::refused_size, refused) == NXMEM_STATUS_OUT_OF_MEMORY);
        CHECK(allocator.usage() == now);
        {
            scripted refusing({true, false, 1});
            CHECK(allocator.release(rounded) != NXMEM_STATUS_OK);
            CHECK(allocator.release(exact) != NXMEM_STATUS_OK);
        }
        CHECK(allocator.usage() == now);
        NxmemAllocation misdescribed = rounded;
        misdescribed.size = 8192; // the usable size, not the size asked for
        CHECK(allocator.release(misdescribed) == NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK(allocator.usage() == now);
    }
    SECTION("a release takes the block's usable bytes away, whole or packed") {
        REQUIRE(allocator.release(rounded) == NXMEM_STATUS_OK);
        now = allocator.usage();
        CHECK(now.live_allocations == 1);
        CHECK(now.reserved_bytes == 1000);
        REQUIRE(allocator.release(exact) == NXMEM_STATUS_OK);
        CHECK(allocator.usage() == allocator_usage{});
    }
    SECTION("a queued release is counted until it retires") {
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(allocator.table()->enqueue_release(allocator.table(), &rounded, 1, &status) == NXMEM_STATUS_OK);
        CHECK(allocator.usage() == now);
        std::uint64_t retired = 0;
        REQUIRE(allocator.table()->drain_releases(allocator.table(), &retired, &status) == NXMEM_STATUS_OK);
        CHECK(retired == 1);
        now = allocator.usage();
        CHECK(now.live_allocations == 1);
        CHECK(now.reserved_bytes == 1000);
        REQUIRE(allocator.release(exact) == NXMEM_STATUS_OK);
    }
    SECTION("a prefix mapped into an allocation changes neither count") {
        const NxmemSharedPrefixHandle prefix = allocator.create_prefix(512);
        allocator.map_prefix(rounded, prefix);
        now = allocator.usage();
        CHECK(now.live_allocations == 2);
        CHECK(now.reserved_bytes == 1000 + 8192);
        allocator.drop_prefix(prefix);
        REQUIRE(allocator.release(rounded) == NXMEM_STATUS_OK); // its mapping and the record go
        CHECK(allocator.usage().reserved_bytes == 1000);
        CHECK(allocator.usage().shared_prefix_bytes == 0);
        REQUIRE(allocator.release(exact) == NXMEM_STATUS_OK);
    }
}

TEST_CASE("the kit counts live imports and the bytes they map, a prefix's until it goes",
          "[plugin-kit][usage]") {
    opened exporter;
    opened importer;
    const NxmemAllocation shared = exporter.allocate(6000);
    const NxmemSharedPrefixHandle prefix = exporter.create_prefix(100);
    const NxmemIpcHandle allocation_handle = exporter.export_allocation(shared);
    const NxmemIpcHandle prefix_handle = exporter.export_prefix(prefix);
    const allocator_usage exporter_before = exporter.usage();

    const NxmemImport allocation_import = importer.import(allocation_handle);
    allocator_usage now = importer.usage();
    CHECK(now.live_imports == 1);
    CHECK(now.imported_bytes == 8192); // the mechanism's whole pages
    CHECK(now.live_allocations == 0);  // an import is no allocation of the importer (IP10)
    CHECK(now.reserved_bytes == 0);

    const NxmemImport prefix_import = importer.import(prefix_handle);
    now = importer.usage();
    CHECK(now.live_imports == 2);
    CHECK(now.imported_bytes == 8192 + 4096);
    CHECK(now.shared_prefix_bytes == 0); // costed by the exporter, not here (IP10)
    CHECK(exporter.usage() == exporter_before);

    SECTION("a close that fails keeps the import and its bytes") {
        {
            scripted refusing({false, true, 1});
            CHECK(importer.close(allocation_import) == NXMEM_STATUS_INTERNAL_ERROR);
        }
        CHECK(importer.usage() == now);
        NxmemImport misdescribed = allocation_import;
        misdescribed.size += 1;
        CHECK(importer.close(misdescribed) == NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK(importer.usage() == now);
        REQUIRE(importer.close(allocation_import) == NXMEM_STATUS_OK);
        REQUIRE(importer.close(prefix_import) == NXMEM_STATUS_OK);
        CHECK(importer.usage() == allocator_usage{});
    }
    SECTION("an imported prefix mapped into an allocation stays imported bytes after its close") {
        const NxmemAllocation mapping = importer.allocate(4096);
        importer.map_prefix(mapping, prefix_import.prefix);
        REQUIRE(importer.close(prefix_import) == NXMEM_STATUS_OK);
        now = importer.usage();
        CHECK(now.live_imports == 1);
        CHECK(now.imported_bytes == 8192 + 4096);
        CHECK(now.reserved_bytes == 4096);
        REQUIRE(importer.release(mapping) == NXMEM_STATUS_OK); // the prefix's last reference
        now = importer.usage();
        CHECK(now.imported_bytes == 8192);
        REQUIRE(importer.close(allocation_import) == NXMEM_STATUS_OK);
        CHECK(importer.usage() == allocator_usage{});
    }
    exporter.drop_prefix(prefix);
    REQUIRE(exporter.release(shared) == NXMEM_STATUS_OK);
}

TEST_CASE("the registry's reserved bytes, read while threads allocate and release, are never more than "
          "was held at once, never wrap, and are exact once they stop (G6)",
          "[plugin-kit][usage][concurrency]") {
    allocation_registry registry;
    constexpr std::uint64_t pairs = 2; // a producer that inserts, a consumer that takes
    constexpr std::uint64_t rounds = 5000;
    constexpr std::uint64_t most_usable = 8192;
    registry.insert(0x1000, 100, 16, 1, 100); // live throughout
    std::atomic<std::uint64_t> running{2 * pairs};
    std::atomic<std::uint64_t> mistaken{0}; // takes refused or wrongly sized (Catch2 asserts on one thread)
    struct handoff {
        std::atomic<std::uint64_t> made{0};  // records the producer has inserted
        std::atomic<std::uint64_t> taken{0}; // records the consumer has taken
    };
    std::vector<handoff> lanes(pairs);
    auto address_of = [](std::uint64_t pair, std::uint64_t round) {
        return ((pair + 1) << 32) + (round % 64) * 0x10000; // each pair's addresses its own
    };
    auto size_of = [](std::uint64_t round) -> std::uint64_t { return round % 2 == 0 ? 4096 : 5000; };
    auto usable_of = [](std::uint64_t round) { return round % 2 == 0 ? 4096 : most_usable; };
    std::vector<std::thread> threads;
    for (std::uint64_t pair = 0; pair < pairs; ++pair) {
        threads.emplace_back([&, pair] { // producer: packed and whole records, in turn
            for (std::uint64_t round = 0; round < rounds; ++round) {
                while (lanes[pair].taken.load() != round) {
                    std::this_thread::yield(); // one record in flight per pair
                }
                registry.insert(address_of(pair, round), size_of(round), 16, 2 + round, usable_of(round));
                lanes[pair].made.store(round + 1);
            }
            running.fetch_sub(1);
        });
        threads.emplace_back([&, pair] { // consumer: takes each record on another thread
            for (std::uint64_t round = 0; round < rounds; ++round) {
                while (lanes[pair].made.load() != round + 1) {
                    std::this_thread::yield();
                }
                NxmemAllocation described{};
                described.address = address_of(pair, round);
                described.size = size_of(round);
                described.alignment = 16;
                described.allocation_id = 2 + round;
                allocation_record taken;
                registry_refusal why;
                if (!registry.take(described, taken, why) || taken.usable_size != usable_of(round)) {
                    mistaken.fetch_add(1);
                }
                lanes[pair].taken.store(round + 1);
            }
            running.fetch_sub(1);
        });
    }
    // At most one record of each pair is live at any instant (the producer waits for the take),
    // and a reading is of one instant: a record taken from a shard already summed and the next
    // inserted into one not yet summed are never both counted (as they were, before the reading
    // held every shard's lock: up to shard_count records a pair).
    const std::uint64_t bound = 100 + pairs * most_usable;
    std::uint64_t readings = 0;
    std::uint64_t worst = 0;
    while (running.load() != 0 || readings < rounds) {
        const std::uint64_t now = registry.reserved_bytes();
        worst = now > worst ? now : worst;
        ++readings;
    }
    for (std::thread& thread : threads) {
        thread.join();
    }
    CHECK(mistaken.load() == 0);
    CHECK(worst >= 100);
    CHECK(worst <= bound);
    CHECK(registry.reserved_bytes() == 100);
    CHECK(registry.size() == 1);
}

} // namespace kit_usage
