// The contract test plugin: host memory only, one named mechanism per behaviour the contract tests
// need, selected by name (never by environment or globals). Loaded with dlopen by the tests and
// never linked into them. Mechanisms serve the cpu and cuda device types alike (host memory behind
// opaque addresses), so the typed suites run for both device tags on machines without a GPU.
#include <nxmem/plugin.hpp>

#include "../../test/support/host_heap.hpp"
#include "../posix/retire_now.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace {

using nxmem::allocator_usage;
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

using nxmem::test::give_back_host_memory;
using nxmem::test::take_host_memory;

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
// the heap in whole pages; what is tracked is what a real lazy mechanism would have mapped, page by
// page. What the operating system can see is real, so the conformance suite's model check can ask
// it: a decommitted page is given back (MADV_DONTNEED), and a shared prefix is a memfd mapped over
// the first pages of each allocation that maps it (the heap's pages are restored on release).
struct lazy_mechanism {
    static constexpr const char* name = "lazy";
    static constexpr std::uint64_t mechanism_id = 3;
    static constexpr std::uint64_t device_types = cpu_and_cuda;

    static result<std::unique_ptr<lazy_mechanism>> open(open_context&) {
        return std::make_unique<lazy_mechanism>();
    }

    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t alignment_taken = std::max(alignment, page_bytes);
        // Out of memory at any point gives back what was taken (nxmem conform --oom).
        state fresh{size, alignment_taken, std::vector<bool>((size + page_bytes - 1) / page_bytes), {}};
        NXMEM_TRY(address, take_host_memory(whole_pages(size), alignment_taken));
        try {
            std::lock_guard lock(mutex_);
            live_.insert_or_assign(address, std::move(fresh));
        } catch (...) {
            ::operator delete(reinterpret_cast<void*>(address), std::align_val_t{alignment_taken});
            throw;
        }
        return block{address, size, 0};
    }
    result<void> deallocate(const allocation_record& record) {
        give_back(record);
        return boost::outcome_v2::success();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        return release_outcome{NXMEM_RELEASE_COMPLETE, give_back(record), 0};
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        return nxmem::posix::retired_now(release_allocation(record));
    }

    // Ranges are page-granular: the offset is page-aligned, the length a page multiple or the rest.
    std::uint64_t commit_granularity() const noexcept { return page_bytes; }
    result<void> commit(const allocation_record& record, byte_range range) {
        return set_pages(record, range, true);
    }
    result<void> decommit(const allocation_record& record, byte_range range) {
        return set_pages(record, range, false);
    }
    result<std::uint64_t> mapped_bytes(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        return committed_bytes(live_.at(record.address));
    }

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        const int descriptor = ::memfd_create("nxmem-testplugin-prefix", MFD_CLOEXEC);
        if (descriptor < 0) {
            return fail(status_code::out_of_memory, "memfd_create failed");
        }
        if (::ftruncate(descriptor, static_cast<off_t>(whole_pages(size))) != 0) {
            ::close(descriptor);
            return fail(status_code::out_of_memory, "ftruncate of the prefix's memfd failed");
        }
        std::lock_guard lock(mutex_);
        const std::uint64_t id = ++last_prefix_id_;
        prefixes_[id] = prefix{size, 0, false, descriptor};
        return id;
    }
    result<prefix_commit> commit_shared_prefix(const allocation_record& record,
                                               std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        prefix& found = prefixes_.at(prefix_id); // the kit has checked the id is live
        state& live = live_.at(record.address);
        if (!live.prefixes.empty()) {
            return fail(status_code::invalid_argument, "lazy maps one prefix per allocation");
        }
        void* mapped = ::mmap(reinterpret_cast<void*>(record.address), whole_pages(found.size),
                              PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, found.descriptor, 0);
        if (mapped == MAP_FAILED) {
            return fail(status_code::out_of_memory, "mapping the prefix failed");
        }
        ++found.sharers;
        live.prefixes.push_back(prefix_id);
        // The prefix's bytes are costed once in its lifetime (ABI C8): only its first mapping
        // ever maps new memory, not a first one again after every sharer went.
        const bool first = !found.ever_mapped;
        found.ever_mapped = true;
        return prefix_commit{found.size, first ? whole_pages(found.size) : 0, found.sharers}; // C8 (the granules reading)
    }
    void destroy_shared_prefix(std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        auto found = prefixes_.find(prefix_id);
        ::close(found->second.descriptor);
        prefixes_.erase(found);
    }

    result<allocator_usage> usage() {
        std::lock_guard lock(mutex_);
        allocator_usage totals;
        for (const auto& [address, live] : live_) {
            ++totals.live_allocations;
            totals.reserved_bytes += live.size;
            totals.mapped_bytes += committed_bytes(live);
        }
        for (const auto& [prefix_id, shared] : prefixes_) {
            totals.shared_prefix_bytes += whole_pages(shared.size); // C8 (the granules reading)
        }
        return totals;
    }

private:
    struct state {
        std::uint64_t size;
        std::uint64_t alignment; // as taken from the heap
        std::vector<bool> pages;
        std::vector<std::uint64_t> prefixes;
    };
    struct prefix {
        std::uint64_t size;
        std::uint64_t sharers;
        bool ever_mapped;
        int descriptor;
    };

    static std::uint64_t whole_pages(std::uint64_t size) {
        return (size + page_bytes - 1) / page_bytes * page_bytes;
    }

    // What an allocation costs (Q17), less the pages under a mapped prefix: those are the
    // prefix's (C8). Called with mutex_ held.
    std::uint64_t committed_bytes(const state& live) const {
        std::uint64_t shared_end = 0;
        for (std::uint64_t prefix_id : live.prefixes) {
            shared_end = std::max(shared_end, whole_pages(prefixes_.at(prefix_id).size));
        }
        std::uint64_t bytes = 0;
        for (std::size_t page = 0; page < live.pages.size(); ++page) {
            if (live.pages[page] && page * page_bytes >= shared_end) {
                bytes += std::min(page_bytes, live.size - page * page_bytes);
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
        state& live = live_.at(record.address);
        std::uint64_t shared_end = 0; // pages under a mapped prefix are the prefix's
        for (std::uint64_t prefix_id : live.prefixes) {
            shared_end = std::max(shared_end, whole_pages(prefixes_.at(prefix_id).size));
        }
        for (std::uint64_t page = range.offset / page_bytes;
             page * page_bytes < range.offset + range.length; ++page) {
            live.pages[page] = mapped;
            if (!mapped && page * page_bytes >= shared_end) {
                ::madvise(reinterpret_cast<void*>(record.address + page * page_bytes), page_bytes, MADV_DONTNEED);
            }
        }
        return boost::outcome_v2::success();
    }

    // Undoes an allocation's mappings, restores the heap's pages and gives them back; returns
    // what it had mapped.
    std::uint64_t give_back(const allocation_record& record) {
        std::uint64_t bytes = 0;
        std::uint64_t alignment = 0;
        {
            std::lock_guard lock(mutex_);
            auto found = live_.find(record.address);
            bytes = committed_bytes(found->second);
            alignment = found->second.alignment;
            for (std::uint64_t prefix_id : found->second.prefixes) {
                --prefixes_.at(prefix_id).sharers; // the kit drops the mapping's reference after
                ::mmap(reinterpret_cast<void*>(record.address), whole_pages(prefixes_.at(prefix_id).size),
                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            }
            live_.erase(found);
        }
        ::operator delete(reinterpret_cast<void*>(record.address), std::align_val_t{alignment});
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

// ---- Deliberately broken mechanisms for the conformance suite: each breaks exactly one rule ----

// A raw allocator that checks everything except the description of a release: deallocate finds
// the allocation by address (refusing an unknown one) and frees it without comparing the host's
// allocation id, size and alignment with its record. Breaks "a release that misdescribes the
// allocation is refused" (conformance check misuse.misdescribed) and nothing else.
class no_misuse_check_allocator {
public:
    static constexpr std::uint64_t mechanism_id = 11;

    static result<NxmemAllocatorVtable*> open(const NxmemOpenRequest* raw) {
        NXMEM_TRY(request, nxmem::abi::read_request(raw));
        const nxmem::device_id device = nxmem::device_id::from_wire(request.device);
        if (device.type >= 64 || (cpu_and_cuda & nxmem::plugin::device_bit(device.type)) == 0) {
            return fail(status_code::wrong_device, "no-misuse-check serves cpu and cuda only");
        }
        if (request.options_length != 0) {
            return fail(status_code::invalid_argument, "no-misuse-check takes no options");
        }
        auto* object = new no_misuse_check_allocator(device);
        return &object->table_;
    }

private:
    explicit no_misuse_check_allocator(nxmem::device_id device) : device_(device) {
        table_ = nxmem::abi::make_struct<NxmemAllocatorVtable>();
        table_.struct_size =
            static_cast<std::uint32_t>(nxmem::abi::bytes_required<NxmemAllocatorVtable>(0));
        table_.abi_minor = 0;
        table_.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
        table_.mechanism_id = mechanism_id;
        table_.device = device.to_wire();
        table_.allocate = &slot_allocate;
        table_.deallocate = &slot_deallocate;
        table_.retain = &slot_retain;
        table_.release = &slot_release;
        nxmem::plugin::this_module().live_allocators.fetch_add(1);
    }
    ~no_misuse_check_allocator() {
        for (const auto& [address, record] : live_) {
            give_back_host_memory(record);
        }
        live_.clear(); // given back: counts_ reports none left when it goes
        nxmem::plugin::this_module().live_allocators.fetch_sub(1);
    }
    static no_misuse_check_allocator& self(NxmemAllocatorVtable* table) {
        return *reinterpret_cast<no_misuse_check_allocator*>(table); // the table is the first member
    }
    result<void> check_identity(std::uint64_t mechanism, const NxmemDeviceId& device) const {
        if (mechanism != mechanism_id) {
            return fail(status_code::wrong_mechanism, "not mechanism no-misuse-check");
        }
        if (nxmem::device_id::from_wire(device) != device_) {
            return fail(status_code::wrong_device, "not this allocator's device");
        }
        return boost::outcome_v2::success();
    }

    static NxmemStatusCode slot_allocate(NxmemAllocatorVtable* table, const NxmemAllocRequest* raw,
                                         NxmemAllocResult* out, NxmemStatus* status) noexcept {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            no_misuse_check_allocator& object = self(table);
            NXMEM_TRY(request, nxmem::abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(request.mechanism_id, request.device));
            if (request.flags != 0) {
                return fail(status_code::invalid_argument, "unknown allocation flags");
            }
            if (request.size == 0 || request.alignment == 0 ||
                (request.alignment & (request.alignment - 1)) != 0) {
                return fail(status_code::invalid_argument, "size 0 or alignment not a power of two");
            }
            NXMEM_TRY_VOID(nxmem::abi::write_output(out, nxmem::abi::make_struct<NxmemAllocResult>()));
            // Nor does it check sizes: rounded up to the alignment in 64 bits, 2^64 - 1 wraps to 0
            // and is served (as libstdc++ 12's aligned operator new itself does, unless a
            // sanitizer's replaces it: done here, the slip is the same in every build).
            const std::uint64_t rounded = (request.size + request.alignment - 1) & ~(request.alignment - 1);
            NXMEM_TRY(address, take_host_memory(rounded, request.alignment));
            {
                std::lock_guard lock(object.mutex_);
                object.live_[address] =
                    allocation_record{address, request.size, request.alignment, request.allocation_id, {},
                                      request.size};
            }
            auto written = nxmem::abi::make_struct<NxmemAllocResult>();
            written.address = address;
            written.size = request.size;
            written.mapped_bytes = request.size;
            return nxmem::abi::write_output(out, written);
        });
    }

    static NxmemStatusCode slot_deallocate(NxmemAllocatorVtable* table, const NxmemAllocation* raw,
                                           NxmemStatus* status) noexcept {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            no_misuse_check_allocator& object = self(table);
            NXMEM_TRY(described, nxmem::abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(described.mechanism_id, described.device));
            allocation_record record;
            {
                std::lock_guard lock(object.mutex_);
                auto found = object.live_.find(described.address);
                if (found == object.live_.end()) {
                    return fail(status_code::unknown_allocation, "no live allocation there");
                }
                // The broken rule: id, size and alignment are never compared with the record.
                record = found->second;
                object.live_.erase(found);
            }
            give_back_host_memory(record);
            return boost::outcome_v2::success();
        });
    }

    static void slot_retain(NxmemAllocatorVtable* table) noexcept {
        self(table).references_.fetch_add(1, std::memory_order_relaxed);
    }
    static void slot_release(NxmemAllocatorVtable* table) noexcept {
        nxmem::plugin::guard_void([&] {
            no_misuse_check_allocator& object = self(table);
            if (object.references_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                delete &object;
            }
        });
    }

    NxmemAllocatorVtable table_; // first member: the host's table pointer is this object
    std::atomic<std::uint32_t> references_{1};
    nxmem::device_id device_;
    mutable std::mutex mutex_;
    std::unordered_map<std::uint64_t, allocation_record> live_;
    // What the module's unload report sums: the records in live_ are its live allocations.
    nxmem::plugin::allocator_counts counts_{this, [](const void* self) noexcept {
        const auto& object = *static_cast<const no_misuse_check_allocator*>(self);
        std::lock_guard lock(object.mutex_);
        return object.live_.size();
    }};
};

struct no_misuse_check_mechanism {
    static constexpr const char* name = "no-misuse-check";
    static constexpr std::uint64_t mechanism_id = no_misuse_check_allocator::mechanism_id;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 0;

    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            if (out == nullptr) {
                return fail(status_code::invalid_argument, "allocator output is NULL");
            }
            NXMEM_TRY(opened, no_misuse_check_allocator::open(request));
            *out = opened;
            return boost::outcome_v2::success();
        });
    }
};

// A stateless static table that sets NXMEM_CAP_DEFERRED_RELEASE but leaves enqueue_release and
// drain_releases NULL: the host refuses it at open (and releases it). Breaks "a set flag with a
// NULL slot is a contract violation" (conformance check tables.capabilities).
struct lying_capabilities_mechanism {
    static constexpr const char* name = "lying-capabilities";
    static constexpr std::uint64_t mechanism_id = 12;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 0;

    static NxmemStatusCode never_allocate(NxmemAllocatorVtable*, const NxmemAllocRequest*,
                                          NxmemAllocResult*, NxmemStatus* status) {
        return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never opened");
    }
    static NxmemStatusCode never_deallocate(NxmemAllocatorVtable*, const NxmemAllocation*,
                                            NxmemStatus* status) {
        return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never opened");
    }
    static void no_reference(NxmemAllocatorVtable*) {}

    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus*) {
        static const NxmemAllocatorVtable cpu_table = make_table(NXMEM_DEVICE_CPU);
        static const NxmemAllocatorVtable cuda_table = make_table(NXMEM_DEVICE_CUDA);
        const bool cuda = request != nullptr && request->device.device_type == NXMEM_DEVICE_CUDA;
        *out = const_cast<NxmemAllocatorVtable*>(cuda ? &cuda_table : &cpu_table);
        return NXMEM_STATUS_OK;
    }
    static NxmemAllocatorVtable make_table(NxmemDeviceType type) {
        auto table = nxmem::abi::make_struct<NxmemAllocatorVtable>();
        table.struct_size =
            static_cast<std::uint32_t>(nxmem::abi::bytes_required<NxmemAllocatorVtable>(0));
        table.abi_minor = 0;
        table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
        table.capabilities = NXMEM_CAP_DEFERRED_RELEASE; // the lie: both slots stay NULL
        table.mechanism_id = mechanism_id;
        table.device = nxmem::device_id{type, 0}.to_wire();
        table.allocate = &never_allocate;
        table.deallocate = &never_deallocate;
        table.retain = &no_reference;
        table.release = &no_reference;
        return table;
    }
};

// Its allocate dereferences NULL: the process dies of SIGSEGV. `nxmem conform` must report the
// crash, with the check that was running, and keep the other mechanisms' results.
struct segfaulting_mechanism : eager_mechanism {
    static constexpr const char* name = "segfaulting";
    static constexpr std::uint64_t mechanism_id = 13;

    static result<std::unique_ptr<segfaulting_mechanism>> open(open_context&) {
        return std::make_unique<segfaulting_mechanism>();
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        static int* volatile nowhere = nullptr; // volatile: the compiler cannot see it is NULL
        *nowhere = 1;
        return eager_mechanism::allocate(size, alignment);
    }
};

// Its structured release fails the first time for each allocation (nothing changes, the
// allocation stays live) and completes the second time: the FAILED outcome's test.
struct failing_release_mechanism : eager_mechanism {
    static constexpr const char* name = "failing-release";
    static constexpr std::uint64_t mechanism_id = 14;

    static result<std::unique_ptr<failing_release_mechanism>> open(open_context&) {
        return std::make_unique<failing_release_mechanism>();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        {
            std::lock_guard lock(mutex_);
            if (failed_once_.insert(record.address).second) {
                return release_outcome{NXMEM_RELEASE_FAILED, 0, 0};
            }
            failed_once_.erase(record.address);
        }
        give_back_host_memory(record);
        return release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
    }

private:
    std::mutex mutex_;
    std::set<std::uint64_t> failed_once_;
};

// A working mechanism with structured release whose open ignores the negotiated minor: it builds its
// table as if the host spoke this header's newest minor, so a host that negotiated minor 0 sees
// NXMEM_CAP_STRUCTURED_RELEASE, a flag minor 0 does not define. Breaks "a sender sets only flags
// at or below the negotiated minor" (conformance check tables.flags_within_minor). The current
// host clears the flag and works on; a minor-0 host written in C would refuse the table.
struct unmasked_flags_allocation : eager_mechanism {
    static constexpr const char* name = "unmasked-flags";
    static constexpr std::uint64_t mechanism_id = 15;

    static result<std::unique_ptr<unmasked_flags_allocation>> open(open_context&) {
        return std::make_unique<unmasked_flags_allocation>();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        give_back_host_memory(record);
        return release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
    }
};

struct unmasked_flags_mechanism {
    static constexpr const char* name = unmasked_flags_allocation::name;
    static constexpr std::uint64_t mechanism_id = unmasked_flags_allocation::mechanism_id;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;

    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            if (request == nullptr || out == nullptr) {
                return fail(status_code::invalid_argument, "open request or output is NULL");
            }
            // The fault: pretend the newest minor was agreed while the kit builds the table (test
            // plugin only; a concurrent open in this module would see the pretence too).
            std::atomic<std::uint32_t>& agreed = nxmem::plugin::this_module().negotiated_minor;
            const std::uint32_t negotiated = agreed.exchange(NXMEM_ABI_MINOR);
            result<NxmemAllocatorVtable*> opened =
                nxmem::plugin::allocator_object<unmasked_flags_allocation>::open(*request);
            agreed.store(negotiated);
            NXMEM_TRY(table, std::move(opened));
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};


// ---- Faults the host must survive (issue 12's host defects) ----
// Each opens a working kit allocator and patches one slot of its table, so the fault is exactly
// one misbehaving answer; the slots it does not patch are the kit's and behave.

template <class Base> struct patched_allocator {
    // The kit's allocator for Base, whose table the caller patches (the kit's table is per object).
    static result<NxmemAllocatorVtable*> open(const NxmemOpenRequest* request) {
        if (request == nullptr) {
            return fail(status_code::invalid_argument, "open request is NULL");
        }
        return nxmem::plugin::allocator_object<Base>::open(*request);
    }
};

alignas(4096) unsigned char permissive_block[64];

// Says yes to allocation requests the contract forbids (size 0, alignment 0 or not a power of
// two), with an address of its own: the host must refuse them before asking.
struct permissive_allocation : eager_mechanism {
    static constexpr const char* name = "permissive";
    static constexpr std::uint64_t mechanism_id = 40;
    static result<std::unique_ptr<permissive_allocation>> open(open_context&) {
        return std::make_unique<permissive_allocation>();
    }
};
struct permissive_mechanism {
    static constexpr const char* name = permissive_allocation::name;
    static constexpr std::uint64_t mechanism_id = permissive_allocation::mechanism_id;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;
    static inline NxmemAllocateFn kit_allocate = nullptr;

    static NxmemStatusCode allocate_anything(NxmemAllocatorVtable* table,
                                             const NxmemAllocRequest* request,
                                             NxmemAllocResult* out, NxmemStatus* status) {
        const std::uint64_t alignment = request->alignment;
        if (request->size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
            out->address = reinterpret_cast<std::uint64_t>(&permissive_block[0]);
            out->size = request->size;
            return NXMEM_STATUS_OK;
        }
        return kit_allocate(table, request, out, status);
    }
    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            NXMEM_TRY(table, patched_allocator<permissive_allocation>::open(request));
            kit_allocate = table->allocate;
            table->allocate = &allocate_anything;
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};

// Deferred release that retires at once (like legacy-1-0, at the current minor).
struct retiring_allocation : eager_mechanism {
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        give_back_host_memory(record);
        return std::optional<release_outcome>{release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0}};
    }
};

// enqueue_release queues the allocation, retires it at once (the host hears release_completed
// inside the enqueue call, outside any drain) and then answers `Answer`.
template <class Allocation, NxmemStatusCode Answer> struct completing_in_enqueue {
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;
    static inline NxmemEnqueueReleaseFn kit_enqueue = nullptr;
    static inline NxmemDrainReleasesFn kit_drain = nullptr;

    static NxmemStatusCode enqueue_and_retire(NxmemAllocatorVtable* table,
                                              const NxmemAllocation* allocation,
                                              std::uint64_t ticket, NxmemStatus* status) {
        NxmemStatusCode code = kit_enqueue(table, allocation, ticket, status);
        if (code != NXMEM_STATUS_OK) {
            return code;
        }
        std::uint64_t retired = 0;
        code = kit_drain(table, &retired, status);
        if (code != NXMEM_STATUS_OK || Answer == NXMEM_STATUS_OK) {
            return code;
        }
        return nxmem::abi::write_status(status, Answer,
                                        "retired the ticket, then failed the enqueue (on purpose)");
    }
    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            NXMEM_TRY(table, patched_allocator<Allocation>::open(request));
            kit_enqueue = table->enqueue_release;
            kit_drain = table->drain_releases;
            table->enqueue_release = &enqueue_and_retire;
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};

struct retire_then_fail_allocation : retiring_allocation {
    static constexpr const char* name = "retire-then-fail";
    static constexpr std::uint64_t mechanism_id = 41;
    static result<std::unique_ptr<retire_then_fail_allocation>> open(open_context&) {
        return std::make_unique<retire_then_fail_allocation>();
    }
};
struct retire_then_fail_mechanism
    : completing_in_enqueue<retire_then_fail_allocation, NXMEM_STATUS_INTERNAL_ERROR> {
    static constexpr const char* name = retire_then_fail_allocation::name;
    static constexpr std::uint64_t mechanism_id = retire_then_fail_allocation::mechanism_id;
};

struct early_completion_allocation : retiring_allocation {
    static constexpr const char* name = "early-completion";
    static constexpr std::uint64_t mechanism_id = 42;
    static result<std::unique_ptr<early_completion_allocation>> open(open_context&) {
        return std::make_unique<early_completion_allocation>();
    }
};
struct early_completion_mechanism
    : completing_in_enqueue<early_completion_allocation, NXMEM_STATUS_OK> {
    static constexpr const char* name = early_completion_allocation::name;
    static constexpr std::uint64_t mechanism_id = early_completion_allocation::mechanism_id;
};

// Every other drain retires what it can and then fails: a host must keep the completions that
// such a drain reported for the next one.
struct failing_drain_allocation : retiring_allocation {
    static constexpr const char* name = "failing-drain";
    static constexpr std::uint64_t mechanism_id = 44;
    static result<std::unique_ptr<failing_drain_allocation>> open(open_context&) {
        return std::make_unique<failing_drain_allocation>();
    }
};
struct failing_drain_mechanism {
    static constexpr const char* name = failing_drain_allocation::name;
    static constexpr std::uint64_t mechanism_id = failing_drain_allocation::mechanism_id;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;
    static inline NxmemDrainReleasesFn kit_drain = nullptr;
    static inline std::atomic<std::uint64_t> drains{0};

    static NxmemStatusCode drain_then_fail(NxmemAllocatorVtable* table, std::uint64_t* retired,
                                           NxmemStatus* status) {
        const NxmemStatusCode code = kit_drain(table, retired, status);
        if (code != NXMEM_STATUS_OK || drains.fetch_add(1) % 2 != 0) {
            return code;
        }
        return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR,
                                        "retired what it could, then failed the drain (on purpose)");
    }
    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            NXMEM_TRY(table, patched_allocator<failing_drain_allocation>::open(request));
            kit_drain = table->drain_releases;
            table->drain_releases = &drain_then_fail;
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};

// create_shared_prefix hands back a handle naming another mechanism; release_shared_prefix takes
// that handle back, so a host that refuses the prefix can still return it.
constexpr std::uint64_t foreign_mechanism_id = 4343;
struct foreign_prefix_allocation : lazy_mechanism {
    static constexpr const char* name = "foreign-prefix";
    static constexpr std::uint64_t mechanism_id = 43;
    static result<std::unique_ptr<foreign_prefix_allocation>> open(open_context&) {
        return std::make_unique<foreign_prefix_allocation>();
    }
};
struct foreign_prefix_mechanism {
    static constexpr const char* name = foreign_prefix_allocation::name;
    static constexpr std::uint64_t mechanism_id = foreign_prefix_allocation::mechanism_id;
    static constexpr std::uint64_t device_types = cpu_and_cuda;
    static constexpr std::uint32_t abi_minor = 1;
    static inline const NxmemSharedMappingVtable* kit_table = nullptr;
    static inline NxmemSharedMappingVtable patched_table{};

    static NxmemStatusCode create_foreign(NxmemAllocatorVtable* table,
                                          const NxmemSharedPrefixRequest* request,
                                          NxmemSharedPrefixHandle* out, NxmemStatus* status) {
        const NxmemStatusCode code = kit_table->create_shared_prefix(table, request, out, status);
        if (code == NXMEM_STATUS_OK) {
            out->mechanism_id = foreign_mechanism_id;
        }
        return code;
    }
    static NxmemStatusCode release_foreign(NxmemAllocatorVtable* table,
                                           const NxmemSharedPrefixHandle* handle,
                                           NxmemStatus* status) {
        NxmemSharedPrefixHandle own = *handle;
        if (own.mechanism_id == foreign_mechanism_id) {
            own.mechanism_id = mechanism_id;
        }
        return kit_table->release_shared_prefix(table, &own, status);
    }
    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            NXMEM_TRY(table, patched_allocator<foreign_prefix_allocation>::open(request));
            kit_table = table->shared_mapping;
            patched_table = *kit_table;
            patched_table.create_shared_prefix = &create_foreign;
            patched_table.release_shared_prefix = &release_foreign;
            table->shared_mapping = &patched_table;
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};
} // namespace

NXMEM_EXPORT_PLUGIN(eager_mechanism, legacy_1_0_mechanism, lazy_mechanism, callback_probe_mechanism,
                    quarantining_mechanism, future_state_mechanism, sticky_mechanism,
                    throwing_mechanism, short_struct_mechanism, overclaiming_mechanism,
                    no_misuse_check_mechanism, lying_capabilities_mechanism, segfaulting_mechanism,
                    failing_release_mechanism, unmasked_flags_mechanism,
                    // issue 12's host faults (one block; append others after it)
                    permissive_mechanism, retire_then_fail_mechanism, early_completion_mechanism,
                    failing_drain_mechanism, foreign_prefix_mechanism);

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
