// Borrowing and lifecycle (ABI.md O6, O13, Q4). What the host lends a call is the plugin's only
// for that call: the open request and its options text are taken away (PROT_NONE) the moment
// open_allocator returns, and the allocator is then used; the host callback table, which lives on,
// is handed in read-only memory, so a plugin that writes it faults. A request whose struct_size
// claims more than the 4096-byte cap is refused without being scanned: the bytes past the record
// the suite hands over are a PROT_NONE page. Each runs in a child process of its own.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_boundary.hpp>
#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/detail/state_snapshot.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace nxmem::conform {

namespace detail {

// A page of its own, so it can be taken away (PROT_NONE) or made read-only.
class own_page {
public:
    own_page() : page_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {
        void* mapped = ::mmap(nullptr, page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        data_ = mapped == MAP_FAILED ? nullptr : static_cast<unsigned char*>(mapped);
    }
    own_page(const own_page&) = delete;
    own_page& operator=(const own_page&) = delete;
    ~own_page() {
        if (data_ != nullptr) {
            ::munmap(data_, page_);
        }
    }
    unsigned char* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return page_; }
    bool protect(int prot) const noexcept { return data_ != nullptr && ::mprotect(data_, page_, prot) == 0; }

private:
    std::size_t page_;
    unsigned char* data_ = nullptr;
};

inline NxmemStatusCode reclaim_nothing(void*, const NxmemReclaimRequest*, NxmemStatus*) { return NXMEM_STATUS_OK; }
inline void hear_completion(void*, const NxmemReleaseCompletion*) {}

// What the child reached: 0 none, 1 opened, 2 used, 3 released.
struct borrowing_seen {
    NxmemStatusCode open_code = NXMEM_STATUS_OK;
    int reached = 0;
};

} // namespace detail

// borrowing.after_open (O6, O13): nothing of the open request is read once open_allocator
// returned, and the callback table is never written.
struct check_borrowing_after_open {
    static constexpr check_revision revision{"O6, O13", "1.0", "2026-12-04", true,
                                            "a read of a buffer the host freed after the call, or a write "
                                            "into its callback table, is a fault in the host's process"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads", detail::raw_library::open(target.path));
        NXMEM_CONFORM_TRY(factories, "the factories are created", detail::raw_factories::create(library));
        NxmemAllocatorFactoryVtable* factory = factories.find(target.mechanism);
        if (factory == nullptr) {
            return failed("the mechanism among the factories", "no factory named '" + target.mechanism + "'");
        }
        NXMEM_CONFORM_TRY(factory_copy, "the factory table reads",
                          abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, factories.negotiated_minor()));
        const std::uint32_t minor = factories.negotiated_minor();
        announce_step("open with request and options in pages taken away after the call, callbacks read-only; "
                      "then allocate, use and release");
        const auto called = detail::run_contained<detail::borrowing_seen>([&]() {
            detail::borrowing_seen seen;
            const detail::own_page options_page;
            const detail::own_page request_page;
            const detail::own_page callbacks_page;
            if (options_page.data() == nullptr || request_page.data() == nullptr || callbacks_page.data() == nullptr ||
                target.options.size() >= options_page.size()) {
                seen.open_code = NXMEM_STATUS_INTERNAL_ERROR;
                return seen;
            }
            std::memcpy(options_page.data(), target.options.data(), target.options.size());
            auto callbacks = abi::make_struct<NxmemHostCallbacks>();
            callbacks.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
            callbacks.request_reclaim = &detail::reclaim_nothing;
            callbacks.release_completed = &detail::hear_completion;
            std::memcpy(callbacks_page.data(), &callbacks, sizeof callbacks);
            auto request = abi::make_struct<NxmemOpenRequest>();
            request.device = target.device.to_wire();
            request.callbacks = reinterpret_cast<const NxmemHostCallbacks*>(callbacks_page.data());
            request.options = reinterpret_cast<const char*>(options_page.data());
            request.options_length = target.options.size();
            std::memcpy(request_page.data(), &request, sizeof request);
            (void)callbacks_page.protect(PROT_READ);
            NxmemAllocatorVtable* opened = nullptr;
            NxmemStatus status = abi::make_status();
            seen.open_code = factory_copy.table.open_allocator(
                factory, reinterpret_cast<const NxmemOpenRequest*>(request_page.data()), &opened, &status);
            if (seen.open_code != NXMEM_STATUS_OK) {
                return seen;
            }
            seen.reached = 1;
            (void)options_page.protect(PROT_NONE);
            (void)request_page.protect(PROT_NONE);
            result<abi::table_copy<NxmemAllocatorVtable>> table = abi::read_prefix<NxmemAllocatorVtable>(opened, minor);
            if (!table) {
                return seen;
            }
            const detail::raw_slots slots(opened, table.value().table, target.device);
            for (int round = 0; round < 2; ++round) {
                result<NxmemAllocation> live = slots.allocate(64 << 10, 64);
                if (!live) {
                    continue;
                }
                if (std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots); backing) {
                    (void)detail::raw_commit(slots.self(), *backing, live.value(), 0, live.value().size);
                }
                (void)detail::raw_usage(slots);
                if (round == 1 && slots.table().enqueue_release != nullptr && slots.table().drain_releases != nullptr) {
                    std::uint64_t retired = 0;
                    if (slots.enqueue_release(live.value(), 1).ok()) {
                        (void)slots.drain_releases(retired);
                        continue;
                    }
                }
                (void)slots.deallocate(live.value());
            }
            seen.reached = 2;
            table.value().table.release(opened);
            seen.reached = 3;
            return seen;
        });
        if (!called.value) {
            return failed("nothing of the open request read after open_allocator returned, the callback table "
                          "never written (O6, O13)",
                          called.failure);
        }
        if (called.value->open_code != NXMEM_STATUS_OK) {
            return failed("the mechanism opens with its request in pages of their own",
                          code_name(called.value->open_code));
        }
        return passed();
    }
};

// borrowing.request_cap (Q4): a request whose struct_size exceeds 4096 is refused without being
// scanned.
struct check_borrowing_request_cap {
    static constexpr check_revision revision{"Q4", "1.0", "2026-12-04", true,
                                            "a scan past the record the host lent reads memory that may not "
                                            "exist, a fault in the host's process"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        for (const std::uint32_t claimed : {4097u, 1u << 16, UINT32_MAX}) {
            const std::string name = "allocate with an NxmemAllocRequest claiming struct_size " + std::to_string(claimed) +
                                     ", its " + std::to_string(sizeof(NxmemAllocRequest)) +
                                     " bytes followed by a PROT_NONE page";
            announce_step(name);
            const auto called = detail::run_contained<NxmemStatusCode>([&]() {
                std::optional<detail::guarded_bytes> bytes =
                    detail::guarded_bytes::make(sizeof(NxmemAllocRequest), "an NxmemAllocRequest");
                if (!bytes) {
                    return NXMEM_STATUS_INTERNAL_ERROR;
                }
                NxmemAllocRequest request = slots.request(64, 8);
                request.struct_size = claimed;
                std::memcpy(bytes->data(), &request, sizeof request);
                auto out = abi::make_struct<NxmemAllocResult>();
                NxmemStatus status = abi::make_status();
                return slots.table().allocate(slots.self(), bytes->as<NxmemAllocRequest>(), &out, &status);
            });
            if (!called.value) {
                return failed("a request above the 4096-byte cap refused without being scanned (Q4)", name + ": " + called.failure);
            }
            if (*called.value != NXMEM_STATUS_INVALID_ARGUMENT) {
                return failed("INVALID_ARGUMENT for a request above the 4096-byte cap (Q4)", name + ": " + code_name(*called.value));
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
