// The contract test plugin: host memory only, one named mechanism per behaviour the contract tests
// need, selected by name (never by environment or globals). Loaded with dlopen by the tests and
// never linked into them. Mechanisms serve the cpu and cuda device types alike (host memory behind
// opaque addresses), so the typed suites run for both device tags on machines without a GPU.
#include <nxmem/plugin.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using nxmem::byte_range;
using nxmem::fail;
using nxmem::prefix_commit;
using nxmem::result;
using nxmem::status_code;
using nxmem::plugin::allocation_record;
using nxmem::plugin::block;
using nxmem::plugin::open_context;
using nxmem::plugin::release_outcome;

constexpr std::uint64_t cpu_and_cuda =
    nxmem::plugin::device_bit(NXMEM_DEVICE_CPU) | nxmem::plugin::device_bit(NXMEM_DEVICE_CUDA);
constexpr std::uint64_t page_bytes = 4096;

std::atomic<std::uint64_t> overclaiming_releases{0};

// Host memory from the C++ heap, at the alignment asked for.
result<std::uint64_t> take_host_memory(std::uint64_t size, std::uint64_t alignment) {
    void* memory = ::operator new(size, std::align_val_t{alignment}, std::nothrow);
    if (memory == nullptr) {
        return fail(status_code::out_of_memory, "host heap refused " + std::to_string(size) + " bytes");
    }
    return reinterpret_cast<std::uint64_t>(memory);
}

void give_back_host_memory(const allocation_record& record) {
    ::operator delete(reinterpret_cast<void*>(record.address), std::align_val_t{record.alignment});
}

// Required slots only: the minimal conforming mechanism.
struct eager_mechanism {
    static constexpr const char* name = "eager";
    static constexpr std::uint64_t mechanism_id = 1;
    static constexpr std::uint64_t device_types = cpu_and_cuda;

    static result<std::unique_ptr<eager_mechanism>> open(open_context&) {
        return std::make_unique<eager_mechanism>();
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(address, take_host_memory(size, alignment));
        return block{address, size, size};
    }
    result<void> deallocate(const allocation_record& record) {
        give_back_host_memory(record);
        return boost::outcome_v2::success();
    }
};

// Built to minor 0: an older participant under a newer host. It offers a minor-0 capability
// (deferred release, retiring at once) and does not know release_allocation.
struct legacy_1_0_mechanism : eager_mechanism {
    static constexpr const char* name = "legacy-1-0";
    static constexpr std::uint64_t mechanism_id = 2;

    static result<std::unique_ptr<legacy_1_0_mechanism>> open(open_context&) {
        return std::make_unique<legacy_1_0_mechanism>();
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        give_back_host_memory(record);
        return std::optional<release_outcome>{release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0}};
    }
};

// Virtual backing, shared mapping, deferred and structured release. Memory is taken eagerly from
// the heap; what is tracked is what a real lazy mechanism would have mapped, page by page.
struct lazy_mechanism {
    static constexpr const char* name = "lazy";
    static constexpr std::uint64_t mechanism_id = 3;
    static constexpr std::uint64_t device_types = cpu_and_cuda;

    static result<std::unique_ptr<lazy_mechanism>> open(open_context&) {
        return std::make_unique<lazy_mechanism>();
    }

    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(address, take_host_memory(size, alignment));
        std::lock_guard lock(mutex_);
        live_[address] = state{std::vector<bool>((size + page_bytes - 1) / page_bytes), {}};
        return block{address, size, 0};
    }
    result<void> deallocate(const allocation_record& record) {
        unmap_all(record);
        give_back_host_memory(record);
        return boost::outcome_v2::success();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        const std::uint64_t unmapped = unmap_all(record);
        give_back_host_memory(record);
        return release_outcome{NXMEM_RELEASE_COMPLETE, unmapped, 0};
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        NXMEM_TRY(outcome, release_allocation(record));
        return std::optional<release_outcome>{outcome};
    }

    // Ranges are page-granular: the offset is page-aligned, the length a page multiple or the rest.
    result<void> commit(const allocation_record& record, byte_range range) {
        return set_pages(record, range, true);
    }
    result<void> decommit(const allocation_record& record, byte_range range) {
        return set_pages(record, range, false);
    }
    result<std::uint64_t> mapped_bytes(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        return committed_bytes(record, live_.at(record.address));
    }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        std::lock_guard lock(mutex_);
        const std::uint64_t id = ++last_prefix_id_;
        prefixes_[id] = prefix{size, 0};
        return id;
    }
    result<prefix_commit> commit_shared_prefix(const allocation_record& record,
                                               std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        prefix& found = prefixes_.at(prefix_id); // the kit has checked the id is live
        ++found.sharers;
        live_.at(record.address).prefixes.push_back(prefix_id);
        // The prefix's bytes are costed once: only the first mapping maps new memory.
        return prefix_commit{found.size, found.sharers == 1 ? found.size : 0, found.sharers};
    }
    void destroy_shared_prefix(std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        prefixes_.erase(prefix_id);
    }

private:
    struct state {
        std::vector<bool> pages;
        std::vector<std::uint64_t> prefixes;
    };
    struct prefix {
        std::uint64_t size;
        std::uint64_t sharers;
    };

    static std::uint64_t committed_bytes(const allocation_record& record, const state& live) {
        std::uint64_t bytes = 0;
        for (std::size_t page = 0; page < live.pages.size(); ++page) {
            if (live.pages[page]) {
                bytes += std::min(page_bytes, record.size - page * page_bytes);
            }
        }
        return bytes;
    }

    result<void> set_pages(const allocation_record& record, byte_range range, bool mapped) {
        if (range.offset % page_bytes != 0 ||
            (range.length % page_bytes != 0 && range.offset + range.length != record.size)) {
            return fail(status_code::invalid_argument,
                        "ranges are page-granular (4096 bytes): offset " +
                            std::to_string(range.offset) + ", length " + std::to_string(range.length));
        }
        std::lock_guard lock(mutex_);
        std::vector<bool>& pages = live_.at(record.address).pages;
        for (std::uint64_t page = range.offset / page_bytes;
             page * page_bytes < range.offset + range.length; ++page) {
            pages[page] = mapped;
        }
        return boost::outcome_v2::success();
    }

    // Undoes an allocation's mappings; returns what it had mapped.
    std::uint64_t unmap_all(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        auto found = live_.find(record.address);
        const std::uint64_t bytes = committed_bytes(record, found->second);
        for (std::uint64_t prefix_id : found->second.prefixes) {
            --prefixes_.at(prefix_id).sharers; // the kit drops the mapping's reference after
        }
        live_.erase(found);
        return bytes;
    }

    std::mutex mutex_;
    std::unordered_map<std::uint64_t, state> live_;
    std::map<std::uint64_t, prefix> prefixes_;
    std::uint64_t last_prefix_id_ = 0;
};

// Asks the host to reclaim before every allocation; fails cleanly when the host refuses or
// offers no hook. Holds no lock across the request: the host may re-enter this plugin.
struct callback_probe_mechanism : eager_mechanism {
    static constexpr const char* name = "callback-probe";
    static constexpr std::uint64_t mechanism_id = 4;
    static constexpr bool uses_host_reclaim = true;

    explicit callback_probe_mechanism(const open_context& context)
        : host_(context.host), device_(context.device) {}
    static result<std::unique_ptr<callback_probe_mechanism>> open(open_context& context) {
        return std::make_unique<callback_probe_mechanism>(context);
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY_VOID(host_.request_reclaim(mechanism_id, device_, size));
        return eager_mechanism::allocate(size, alignment);
    }

private:
    nxmem::plugin::host_link host_;
    nxmem::device_id device_;
};

// Keeps memory it cannot hand back: every structured release gives back half and keeps the
// rest, so the address is never reissued and the residue never refunded.
struct quarantining_mechanism : eager_mechanism {
    static constexpr const char* name = "quarantining";
    static constexpr std::uint64_t mechanism_id = 5;

    static result<std::unique_ptr<quarantining_mechanism>> open(open_context&) {
        return std::make_unique<quarantining_mechanism>();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        quarantined_.push_back(record);
        const std::uint64_t kept = record.size - record.size / 2;
        return release_outcome{NXMEM_RELEASE_QUARANTINED, record.size / 2, kept};
    }
    ~quarantining_mechanism() {
        for (const allocation_record& record : quarantined_) {
            give_back_host_memory(record);
        }
    }
    quarantining_mechanism() = default;
    quarantining_mechanism(const quarantining_mechanism&) = delete;
    quarantining_mechanism& operator=(const quarantining_mechanism&) = delete;

protected:
    std::mutex mutex_;
    std::vector<allocation_record> quarantined_;
};

// Reports a release state from a later contract level; the host must read it as quarantine, so
// this mechanism keeps the memory as a quarantining one would.
struct future_state_mechanism : quarantining_mechanism {
    static constexpr const char* name = "future-state";
    static constexpr std::uint64_t mechanism_id = 6;
    static constexpr NxmemReleaseState state_from_the_future = 7;

    static result<std::unique_ptr<future_state_mechanism>> open(open_context&) {
        return std::make_unique<future_state_mechanism>();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        quarantined_.push_back(record);
        return release_outcome{state_from_the_future, record.size, 0};
    }
};

// Never retires a queued release, so its module can never unload: the unload gate's test.
struct sticky_mechanism : eager_mechanism {
    static constexpr const char* name = "sticky";
    static constexpr std::uint64_t mechanism_id = 7;

    static result<std::unique_ptr<sticky_mechanism>> open(open_context&) {
        return std::make_unique<sticky_mechanism>();
    }
    result<std::optional<release_outcome>> retire(const allocation_record&) {
        return std::optional<release_outcome>{};
    }
};

// Every allocation throws: the guard must turn it into INTERNAL_ERROR.
struct throwing_mechanism : eager_mechanism {
    static constexpr const char* name = "throwing";
    static constexpr std::uint64_t mechanism_id = 8;

    static result<std::unique_ptr<throwing_mechanism>> open(open_context&) {
        return std::make_unique<throwing_mechanism>();
    }
    result<block> allocate(std::uint64_t, std::uint64_t) {
        throw std::runtime_error("throwing mechanism: allocate always throws");
    }
};

// A stateless static table claiming fewer bytes than the baseline prefix: what a plugin built
// against a mismatched header would hand out. It allocates no state, so nothing leaks when the
// host refuses it (and cannot locate its release slot).
struct short_struct_mechanism {
    static constexpr const char* name = "short-struct";
    static constexpr std::uint64_t mechanism_id = 9;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 0;

    static NxmemStatusCode open_raw(const NxmemOpenRequest*, NxmemAllocatorVtable** out,
                                    NxmemStatus*) {
        static const NxmemAllocatorVtable table = [] {
            NxmemAllocatorVtable short_table{};
            short_table.struct_size = 40; // the baseline needs 112
            short_table.abi_minor = 0;
            short_table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
            short_table.mechanism_id = mechanism_id;
            return short_table;
        }();
        *out = const_cast<NxmemAllocatorVtable*>(&table);
        return NXMEM_STATUS_OK;
    }
};

// A table that claims minor 1 but is only as large as minor 0: broken, not old. Its release slot
// lies within struct_size, so the host can still hand it back (counted, for the test).
struct overclaiming_mechanism {
    static constexpr const char* name = "overclaiming";
    static constexpr std::uint64_t mechanism_id = 10;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;

    static void release(NxmemAllocatorVtable*) { overclaiming_releases.fetch_add(1); }
    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus*) {
        static const NxmemAllocatorVtable table = [] {
            NxmemAllocatorVtable claiming{};
            claiming.struct_size = 112;
            claiming.abi_minor = 1; // minor 1 needs 120 bytes
            claiming.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
            claiming.mechanism_id = mechanism_id;
            claiming.release = &overclaiming_mechanism::release;
            return claiming;
        }();
        (void)request;
        *out = const_cast<NxmemAllocatorVtable*>(&table);
        return NXMEM_STATUS_OK;
    }
};

} // namespace

NXMEM_EXPORT_PLUGIN(eager_mechanism, legacy_1_0_mechanism, lazy_mechanism, callback_probe_mechanism,
                    quarantining_mechanism, future_state_mechanism, sticky_mechanism,
                    throwing_mechanism, short_struct_mechanism, overclaiming_mechanism);

// Test-only exports: counters read out of the loaded module itself. A test that read its own
// statically linked copy of these would observe a different variable and prove nothing.
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemTestFactoriesReleased() {
    return nxmem::plugin::this_module().factories_released.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemTestFactoriesCreated() {
    return nxmem::plugin::this_module().factories_created.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemTestOverclaimingReleases() {
    return overclaiming_releases.load();
}
