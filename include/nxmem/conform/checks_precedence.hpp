// Precedence among refusals (ABI.md M10): a request with several faults is refused with the code
// of the first in M10's order: the form of the records, mechanism, device, the request's values
// (flags, size, alignment, range), liveness, the description, resources. Each probe below carries
// several faults and is then stripped of them one at a time, in that order; each step must change
// the code to the next fault's. A plugin that checks its values before the device, or the
// allocation's liveness before the range, answers with the wrong code somewhere in the chain.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace nxmem::conform {

// misuse.precedence (M10).
struct check_misuse_precedence {
    static constexpr check_revision revision{"M10", "1.0", "2026-12-04", false,
                                            "the host checks mechanism, device and liveness itself before "
                                            "it calls the plugin; only the code of a direct call differs"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        auto allocate_code = [&](const NxmemAllocRequest& request, std::uint32_t output_size) {
            auto out = abi::make_struct<NxmemAllocResult>();
            out.struct_size = output_size;
            NxmemStatus status = abi::make_status();
            const NxmemStatusCode code = slots.table().allocate(slots.self(), &request, &out, &status);
            if (code == NXMEM_STATUS_OK) {
                (void)slots.deallocate(detail::raw_slots::describe(request, out));
            }
            return code;
        };
        auto expect = [](const std::string& what, NxmemStatusCode wanted, NxmemStatusCode got) -> std::optional<finding> {
            if (got == wanted) {
                return std::nullopt;
            }
            return failed(code_name(wanted) + " for " + what + " (M10: the first fault in its order decides)",
                          code_name(got));
        };
        announce_step("allocate with every fault at once, then one fault fewer at a time");
        NxmemAllocRequest request = slots.request(0, 3);
        request.mechanism_id ^= 0x100;
        request.device.index += 1;
        request.flags = 1;
        const std::string faults = "size 0, alignment 3, flag bit 0";
        if (auto wrong = expect("an allocate with an output of struct_size 4, another mechanism, another device, " + faults,
                                NXMEM_STATUS_INVALID_ARGUMENT, allocate_code(request, 4))) {
            return *wrong;
        }
        if (auto wrong = expect("an allocate for another mechanism, on another device, with " + faults,
                                NXMEM_STATUS_WRONG_MECHANISM, allocate_code(request, sizeof(NxmemAllocResult)))) {
            return *wrong;
        }
        request.mechanism_id = slots.mechanism_id();
        if (auto wrong = expect("an allocate on another device with " + faults, NXMEM_STATUS_WRONG_DEVICE,
                                allocate_code(request, sizeof(NxmemAllocResult)))) {
            return *wrong;
        }
        request.device = slots.device().to_wire();
        if (auto wrong = expect("an allocate with " + faults, NXMEM_STATUS_INVALID_ARGUMENT,
                                allocate_code(request, sizeof(NxmemAllocResult)))) {
            return *wrong;
        }

        announce_step("deallocate a stranger: another device, not live, misdescribed");
        NXMEM_CONFORM_TRY(live, "a 256-byte allocation", slots.allocate(256, 64));
        NxmemAllocation stranger = live;
        stranger.address += 1ull << 44;
        stranger.size += 1;
        stranger.device.index += 1;
        finding found = passed();
        if (auto wrong = expect("a deallocate on another device of an address nothing lives at, misdescribed",
                                NXMEM_STATUS_WRONG_DEVICE, slots.deallocate(stranger).code)) {
            found = *wrong;
        } else {
            stranger.device = live.device;
            if (auto unknown = expect("a deallocate of an address nothing lives at, misdescribed",
                                      NXMEM_STATUS_UNKNOWN_ALLOCATION, slots.deallocate(stranger).code)) {
                found = *unknown;
            }
        }

        std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots);
        if (found.verdict == outcome::pass && backing) {
            announce_step("commit a range past the end of an allocation that is no longer live");
            NXMEM_CONFORM_TRY(gone, "a 4096-byte allocation to release", slots.allocate(4096, 64));
            (void)slots.deallocate(gone);
            auto range = abi::make_struct<NxmemRangeRequest>();
            range.allocation = gone;
            range.allocation.device.index += 1;
            range.range = abi::make_struct<NxmemByteRange>();
            range.range.offset = 8192;
            range.range.length = 4096;
            NxmemStatus status = abi::make_status();
            if (auto wrong = expect("a commit on another device, past the end of an allocation no longer live",
                                    NXMEM_STATUS_WRONG_DEVICE, backing->commit(slots.self(), &range, &status))) {
                found = *wrong;
            } else {
                range.allocation.device = gone.device;
                if (auto values = expect("a commit past the end of an allocation no longer live (the range's values "
                                         "before liveness)",
                                         NXMEM_STATUS_INVALID_ARGUMENT, backing->commit(slots.self(), &range, &status))) {
                    found = *values;
                } else {
                    range.range.offset = 0;
                    if (auto dead = expect("a commit of [0, 4096) of an allocation no longer live",
                                           NXMEM_STATUS_UNKNOWN_ALLOCATION, backing->commit(slots.self(), &range, &status))) {
                        found = *dead;
                    }
                }
            }
        }
        const detail::slot_reply released = slots.deallocate(live);
        if (found.verdict == outcome::pass && !released.ok()) {
            return failed("the allocation still live after the refusals, and released correctly", released.describe());
        }
        return found;
    }
};

} // namespace nxmem::conform
