// Arithmetic at the edges (ABI.md Q18): sizes near 2^64 that wrap when rounded up, sizes cut to 32
// bits, and commit or decommit ranges whose offset + length wraps or whose offset is cut to 32
// bits. Every call goes straight to the plugin's slots, past the host's own checks (which would
// refuse most of these first), so a plugin that computes in too few bits, or lets a sum wrap, is
// caught; each refusal must also change nothing (state_snapshot.hpp, E12).
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_boundary.hpp>
#include <nxmem/conform/detail/heap_fill_pause.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/detail/state_snapshot.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/hex.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace nxmem::conform {

// edges.sizes (Q18, Q11): a size near 2^64, or one above 2^32, is refused or served whole: an
// accepted result is at least the size asked and does not wrap the address space.
struct check_edges_sizes {
    static constexpr check_revision revision{"Q18", "1.0", "2026-12-04", false,
                                            "the host refuses a short result (Q11) and any size of 2^57 "
                                            "or more (M9) before the plugin sees it"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        struct edge {
            std::uint64_t size;
            std::uint64_t alignment;
            const char* what;
        };
        const edge edges[] = {
            {UINT64_MAX, 8, "2^64 - 1 bytes"},
            {UINT64_MAX - 4094, 4096, "2^64 - 4095 bytes (wraps when rounded up to a page)"},
            {UINT64_MAX - (1ull << 21) + 2, 1ull << 21, "2^64 - 2^21 + 2 bytes (wraps when rounded up to 2 MiB)"},
            {(1ull << 63) + 1, 8, "2^63 + 1 bytes"},
            {(1ull << 32) + 4096, 4096, "2^32 + 4096 bytes (4096 when cut to 32 bits)"},
        };
        const detail::heap_fill_pause no_fill; // 2^32 + 4096 bytes must not be written (see there)
        for (const edge& at : edges) {
            announce_step(std::string("allocate ") + at.what + " through the raw slot");
            const detail::state_snapshot before = detail::take_snapshot(opened.library, slots);
            const NxmemAllocRequest request = slots.request(at.size, at.alignment);
            NxmemAllocResult out{};
            const detail::slot_reply reply = slots.allocate(&request, out);
            if (!reply.ok()) {
                const detail::state_snapshot after = detail::take_snapshot(opened.library, slots);
                if (const std::string moved = before.difference(after); !moved.empty()) {
                    return failed("a refused allocation changes nothing (E12)",
                                  std::string("allocate ") + at.what + " was refused with " +
                                      reply.describe() + ", yet " + moved);
                }
                continue;
            }
            const bool short_result = out.size < at.size;
            const bool wraps = out.address > UINT64_MAX - at.size;
            const NxmemAllocation described = detail::raw_slots::describe(request, out);
            (void)slots.deallocate(described);
            if (short_result || wraps) {
                return failed(std::string("allocate ") + at.what +
                                  " refused (OUT_OF_MEMORY), or served whole: a result of at least " +
                                  std::to_string(at.size) + " bytes that does not wrap (Q18, Q11)",
                              "OK with address " + nxmem::detail::to_hex(out.address) + " and size " +
                                  std::to_string(out.size) +
                                  (short_result ? ": short of the size asked (computed in too few bits, or "
                                                  "rounded past 2^64)"
                                                : ": the allocation would wrap past 2^64"));
            }
        }
        return passed();
    }
};

// edges.ranges (Q18, M7): a commit or decommit whose offset + length wraps past 2^64 and lands
// inside the allocation, or whose offset lies inside it only when cut to 32 bits, is refused with
// INVALID_ARGUMENT and commits nothing.
struct check_edges_ranges {
    static constexpr check_revision revision{"Q18", "1.0", "2026-12-04", false,
                                            "the host checks every range against the allocation before "
                                            "it calls the plugin (M7)"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots);
        if (!backing) {
            return not_applicable("the mechanism has no virtual backing");
        }
        const std::uint64_t granule = backing->commit_granularity != 0 ? backing->commit_granularity : 4096;
        NXMEM_CONFORM_TRY(live, "an allocation of 4 granules", slots.allocate(4 * granule, 64));
        struct wrapped_range {
            std::uint64_t offset;
            std::uint64_t length;
            const char* what;
        };
        const wrapped_range ranges[] = {
            {granule, 0 - granule, "offset + length wraps to 0"},
            {2 * granule, 0 - granule, "offset + length wraps to one granule, inside the allocation"},
            {(1ull << 32) + granule, granule, "the offset is one granule when cut to 32 bits"},
            {granule, (1ull << 32) + granule, "the length is one granule when cut to 32 bits"},
        };
        finding found = passed();
        for (const wrapped_range& range : ranges) {
            for (const bool commit : {true, false}) {
                const std::string name = std::string(commit ? "commit" : "decommit") + " [" +
                                         std::to_string(range.offset) + ", +" + std::to_string(range.length) +
                                         ") of a " + std::to_string(4 * granule) + "-byte allocation (" +
                                         range.what + ")";
                announce_step(name);
                const detail::state_snapshot before = detail::take_snapshot(opened.library, slots, &live);
                auto request = abi::make_struct<NxmemRangeRequest>();
                request.allocation = live;
                request.range = abi::make_struct<NxmemByteRange>();
                request.range.offset = range.offset;
                request.range.length = range.length;
                NxmemStatus status = abi::make_status();
                const NxmemStatusCode code = commit ? backing->commit(slots.self(), &request, &status)
                                                    : backing->decommit(slots.self(), &request, &status);
                const detail::state_snapshot after = detail::take_snapshot(opened.library, slots, &live);
                if (code != NXMEM_STATUS_INVALID_ARGUMENT) {
                    found = failed(name + ": INVALID_ARGUMENT, the range lies outside the allocation (Q18, M7)",
                                   code_name(code) + " (" + abi::read_status_message(status) + ")");
                } else if (const std::string moved = before.difference(after); !moved.empty()) {
                    found = failed(name + ": refused, changing nothing (E12)", "refused, yet " + moved);
                }
                if (found.verdict != outcome::pass) {
                    break;
                }
            }
            if (found.verdict != outcome::pass) {
                break;
            }
        }
        (void)slots.deallocate(live);
        return found;
    }
};

} // namespace nxmem::conform
