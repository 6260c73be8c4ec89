// Failure paths (ABI.md E12): a call the plugin refuses, or that fails, changes nothing the host
// can see. Before and after each refused call the suite compares the plugin's unload report, the
// allocator's usage totals and the cost of a live allocation (state_snapshot.hpp): a commit refused
// half-way that keeps what it committed, a budget charged for an allocation that failed, an
// allocator counted after its open was refused, all show as a figure that moved.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_boundary.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/detail/state_snapshot.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// One call the plugin must refuse. `call` returns the reply; when the plugin accepted it after
// all, `undo` (if any) gives back what it made, and the call is not judged here.
struct refused_call {
    std::string name;
    std::function<slot_reply()> call;
    std::function<void()> undo;
};

// Opens the subject's mechanism through the plugin's factory with `options` (`length` bytes) and
// releases the allocator again when the open succeeded; the reply of the open.
inline slot_reply open_with_options(const raw_library& library, const subject& target,
                                    const char* options, std::uint64_t length,
                                    const NxmemHostCallbacks* callbacks = nullptr,
                                    const std::function<void(NxmemAllocatorVtable*, const NxmemAllocatorVtable&)>&
                                        use = {}) {
    slot_reply reply;
    result<raw_factories> factories = raw_factories::create(library);
    if (!factories) {
        reply.code = NXMEM_STATUS_INTERNAL_ERROR;
        reply.message = "the suite could not create the factories: " + factories.error().describe();
        return reply;
    }
    NxmemAllocatorFactoryVtable* factory = factories.value().find(target.mechanism);
    result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
        factory == nullptr ? result<abi::table_copy<NxmemAllocatorFactoryVtable>>(
                                 fail(status_code::invalid_argument, "no such mechanism"))
                           : abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, factories.value().negotiated_minor());
    if (!copy) {
        reply.code = NXMEM_STATUS_INTERNAL_ERROR;
        reply.message = "the suite could not read the factory: " + copy.error().describe();
        return reply;
    }
    auto request = abi::make_struct<NxmemOpenRequest>();
    request.device = target.device.to_wire();
    request.callbacks = callbacks;
    request.options = options;
    request.options_length = length;
    NxmemAllocatorVtable* opened = nullptr;
    NxmemStatus status = abi::make_status();
    reply.code = copy.value().table.open_allocator(factory, &request, &opened, &status);
    reply.message = abi::read_status_message(status);
    if (reply.code == NXMEM_STATUS_OK && opened != nullptr) {
        result<abi::table_copy<NxmemAllocatorVtable>> table =
            abi::read_prefix<NxmemAllocatorVtable>(opened, factories.value().negotiated_minor());
        if (table) {
            if (use) {
                use(opened, table.value().table);
            }
            table.value().table.release(opened);
        }
    }
    return reply;
}

// The calls every mechanism must refuse, around one live allocation `live` of `slots`.
inline std::vector<refused_call> calls_to_refuse(const raw_slots& slots, const NxmemAllocation& live,
                                                 const raw_library& library, const subject& target) {
    std::vector<refused_call> calls;
    auto allocate = [&slots](NxmemAllocRequest request) {
        return [&slots, request]() {
            NxmemAllocResult out{};
            slot_reply reply = slots.allocate(&request, out);
            if (reply.ok()) {
                (void)slots.deallocate(raw_slots::describe(request, out));
            }
            return reply;
        };
    };
    NxmemAllocRequest request = slots.request(0, 8);
    calls.push_back({"allocate 0 bytes", allocate(request), {}});
    request = slots.request(64, 3);
    calls.push_back({"allocate at alignment 3", allocate(request), {}});
    request = slots.request(64, 8);
    request.flags = 1;
    calls.push_back({"allocate with flag bit 0 set", allocate(request), {}});
    request = slots.request(64, 8);
    request.mechanism_id ^= 0x5A5A0000ull;
    calls.push_back({"allocate for another mechanism", allocate(request), {}});
    request = slots.request(64, 8);
    request.device.index += 1;
    calls.push_back({"allocate on another device", allocate(request), {}});
    calls.push_back({"allocate 64 bytes at alignment 2^40", allocate(slots.request(64, 1ull << 40)), {}});
    calls.push_back({"allocate 2^62 bytes", allocate(slots.request(1ull << 62, 4096)), {}});
    calls.push_back({"allocate 2^64 - 1 bytes", allocate(slots.request(UINT64_MAX, 8)), {}});
    NxmemAllocation unknown = live;
    unknown.address ^= 1ull << 44;
    calls.push_back({"deallocate an address nothing lives at", [&slots, unknown] { return slots.deallocate(unknown); }, {}});
    NxmemAllocation misdescribed = live;
    misdescribed.size += 1;
    calls.push_back({"deallocate the live allocation described one byte longer",
                     [&slots, misdescribed] { return slots.deallocate(misdescribed); }, {}});
    if (slots.table().release_allocation != nullptr) {
        calls.push_back({"release_allocation of the live allocation at another alignment",
                         [&slots, live] {
                             NxmemAllocation other = live;
                             other.alignment = live.alignment * 2;
                             NxmemReleaseOutcome outcome{};
                             return slots.release_allocation(other, outcome);
                         },
                         {}});
    }
    if (std::optional<NxmemVirtualBackingVtable> backing = raw_virtual_backing(slots); backing) {
        const std::uint64_t size = live.size;
        calls.push_back({"commit [size, size + 4096) past the allocation's end",
                         [&slots, backing, live, size] { return raw_commit(slots.self(), *backing, live, size, 4096); },
                         {}});
        calls.push_back({"commit [0, size + 4096), over the allocation's end",
                         [&slots, backing, live, size] { return raw_commit(slots.self(), *backing, live, 0, size + 4096); },
                         {}});
        calls.push_back({"decommit [size, size + 4096) past the allocation's end",
                         [&slots, backing, live, size] {
                             auto range = abi::make_struct<NxmemRangeRequest>();
                             range.allocation = live;
                             range.range = abi::make_struct<NxmemByteRange>();
                             range.range.offset = size;
                             range.range.length = 4096;
                             NxmemStatus status = abi::make_status();
                             slot_reply reply;
                             reply.code = backing->decommit(slots.self(), &range, &status);
                             reply.message = abi::read_status_message(status);
                             return reply;
                         },
                         {}});
    }
    const std::string unknown_option =
        target.options + (target.options.empty() ? "" : ";") + "nxmem_conform_unknown_option=1";
    calls.push_back({"open_allocator with the unknown option nxmem_conform_unknown_option",
                     [&library, &target, unknown_option] {
                         return open_with_options(library, target, unknown_option.data(), unknown_option.size());
                     },
                     {}});
    return calls;
}

} // namespace detail

// rollback.refused_calls (E12): every refused call leaves the unload report, the usage totals and
// a live allocation's cost as they were; with the subject's options (a budget, say) the refusals
// for want of memory included.
struct check_rollback_refused_calls {
    static constexpr check_revision revision{"E12", "1.0", "2026-12-04", true,
                                            "a refusal that keeps a count blocks unload for ever and a "
                                            "charge kept for a failed call starves the budget"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        std::uint64_t granule = 4096;
        if (std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots);
            backing && backing->commit_granularity != 0) {
            granule = backing->commit_granularity;
        }
        result<NxmemAllocation> live = slots.allocate(3 * granule, 64);
        if (!live) {
            return failed("an allocation of 3 granules to watch", live.error().describe());
        }
        if (std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots); backing) {
            (void)detail::raw_commit(slots.self(), *backing, live.value(), 0, granule);
        }
        finding found = passed();
        for (const detail::refused_call& call : detail::calls_to_refuse(slots, live.value(), opened.library, target)) {
            announce_step(call.name + ", comparing what the host sees before and after");
            const detail::state_snapshot before = detail::take_snapshot(opened.library, slots, &live.value());
            const detail::slot_reply reply = call.call();
            if (reply.ok()) {
                continue; // not refused: judged by the checks of what it did
            }
            const detail::state_snapshot after = detail::take_snapshot(opened.library, slots, &live.value());
            if (const std::string moved = before.difference(after); !moved.empty()) {
                found = failed("a refused call changes nothing the host can see (E12)",
                               call.name + " was refused with " + reply.describe() + ", yet " + moved);
                break;
            }
        }
        const detail::slot_reply released = slots.deallocate(live.value());
        if (found.verdict == outcome::pass && !released.ok()) {
            return failed("the watched allocation released after the refusals", released.describe());
        }
        return found;
    }
};

} // namespace nxmem::conform
