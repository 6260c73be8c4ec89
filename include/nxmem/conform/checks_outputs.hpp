// Outputs and statuses on every path (ABI.md Q6, E9, E14). boundary.output_within_size hands
// allocate one short output on one path (64 bytes); a plugin takes other paths for other sizes and
// alignments (the heap below a threshold, mmap above it, a huge page, a refusal), and a slip on one
// of them writes the whole record past the receiver's struct_size. outputs.every_path hands the
// shortest output, ending at a PROT_NONE page, to allocate on each path. statuses.untouched_on_success
// hands every call that succeeds a status whose bytes are a pattern, ending at a PROT_NONE page:
// a call that returns OK writes nothing into it.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_boundary.hpp>
#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::conform {

// outputs.every_path (Q6, Q7): allocate at every size and alignment class, and on its refusals,
// writes an NxmemAllocResult of the smallest struct_size only within it, and refuses one of 8
// bytes (too small for the baseline) untouched.
struct check_outputs_every_path {
    static constexpr check_revision revision{"Q6", "1.0", "2026-12-04", true,
                                            "a write past the receiver's struct_size corrupts the host's "
                                            "memory, which nothing on the host's side can prevent"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        const std::size_t bytes = abi::baseline_bytes<NxmemAllocResult>();
        struct path {
            std::uint64_t size;
            std::uint64_t alignment;
        };
        std::vector<path> paths;
        for (std::uint64_t size : {1ull, 100ull, 4096ull, 65537ull, (1ull << 20) + 1, 4ull << 20}) {
            for (std::uint64_t alignment : {8ull, 4096ull, 65536ull, 2ull << 20}) {
                paths.push_back({size, alignment});
            }
        }
        paths.push_back({0, 8});               // refused: size 0
        paths.push_back({64, 3});              // refused: alignment
        paths.push_back({1ull << 62, 4096});   // refused: out of memory
        paths.push_back({64, 1ull << 40});     // refused: an alignment nobody honours
        constexpr std::size_t too_small = 8; // refused untouched on every path (Q7)
        for (const path& at : paths)
        for (const std::size_t given : {bytes, too_small}) {
            const std::string name = "allocate " + std::to_string(at.size) + " bytes at alignment " +
                                     std::to_string(at.alignment) + " into an NxmemAllocResult of struct_size " +
                                     std::to_string(given) + " ending at a PROT_NONE page";
            announce_step(name);
            const auto called = detail::run_contained<NxmemStatusCode>([&]() {
                std::optional<detail::guarded_bytes> out = detail::guarded_bytes::make(given, "an NxmemAllocResult");
                if (!out) {
                    return NXMEM_STATUS_INTERNAL_ERROR;
                }
                const auto struct_size = static_cast<std::uint32_t>(given);
                std::memcpy(out->data(), &struct_size, sizeof struct_size);
                const NxmemAllocRequest request = slots.request(at.size, at.alignment);
                NxmemStatus status = abi::make_status();
                const NxmemStatusCode code =
                    slots.table().allocate(slots.self(), &request, out->as<NxmemAllocResult>(), &status);
                // The child's memory dies with it; nothing to release.
                return code;
            });
            if (!called.value) {
                return failed("an output written only within the struct_size its receiver set, on every path (Q6, Q7)",
                              name + ": " + called.failure);
            }
            if (given == too_small && *called.value != NXMEM_STATUS_INVALID_ARGUMENT) {
                return failed("INVALID_ARGUMENT for an output too small for the baseline struct, on every path (Q7)",
                              name + ": " + code_name(*called.value));
            }
        }
        return passed();
    }
};

namespace detail {

// One call that succeeds, run with `status`; false when it did not succeed (then not judged).
struct success_path {
    std::string name;
    std::function<bool(NxmemStatus*)> call;
};

template <Device D>
std::vector<success_path> success_paths(const raw_slots& slots, const raw_library& library, NxmemNegotiateFn negotiate) {
    std::vector<success_path> paths;
    paths.push_back({"allocate 4096 bytes, then deallocate", [&slots](NxmemStatus* status) {
                         const NxmemAllocRequest request = slots.request(4096, 64);
                         auto out = abi::make_struct<NxmemAllocResult>();
                         if (slots.table().allocate(slots.self(), &request, &out, status) != NXMEM_STATUS_OK) {
                             return false;
                         }
                         const NxmemAllocation described = raw_slots::describe(request, out);
                         return slots.table().deallocate(slots.self(), &described, status) == NXMEM_STATUS_OK;
                     }});
    if (slots.table().release_allocation != nullptr) {
        paths.push_back({"allocate 4096 bytes, then release_allocation", [&slots](NxmemStatus* status) {
                             const NxmemAllocRequest request = slots.request(4096, 64);
                             auto out = abi::make_struct<NxmemAllocResult>();
                             if (slots.table().allocate(slots.self(), &request, &out, status) != NXMEM_STATUS_OK) {
                                 return false;
                             }
                             const NxmemAllocation described = raw_slots::describe(request, out);
                             auto outcome = abi::make_struct<NxmemReleaseOutcome>();
                             return slots.table().release_allocation(slots.self(), &described, &outcome, status) ==
                                    NXMEM_STATUS_OK;
                         }});
    }
    if (slots.table().query_usage != nullptr) {
        paths.push_back({"query_usage", [&slots](NxmemStatus* status) {
                             auto usage = abi::make_struct<NxmemAllocatorUsage>();
                             return slots.table().query_usage(slots.self(), &usage, status) == NXMEM_STATUS_OK;
                         }});
    }
    if (std::optional<NxmemVirtualBackingVtable> backing = raw_virtual_backing(slots); backing) {
        paths.push_back({"allocate 4096 bytes, commit, mapped_bytes, decommit, deallocate",
                         [&slots, backing](NxmemStatus* status) {
                             const NxmemAllocRequest request = slots.request(4096, 64);
                             auto out = abi::make_struct<NxmemAllocResult>();
                             if (slots.table().allocate(slots.self(), &request, &out, status) != NXMEM_STATUS_OK) {
                                 return false;
                             }
                             const NxmemAllocation described = raw_slots::describe(request, out);
                             auto range = abi::make_struct<NxmemRangeRequest>();
                             range.allocation = described;
                             range.range = abi::make_struct<NxmemByteRange>();
                             range.range.length = 4096;
                             std::uint64_t mapped = 0;
                             return backing->commit(slots.self(), &range, status) == NXMEM_STATUS_OK &&
                                    backing->mapped_bytes(slots.self(), &described, &mapped, status) == NXMEM_STATUS_OK &&
                                    backing->decommit(slots.self(), &range, status) == NXMEM_STATUS_OK &&
                                    slots.table().deallocate(slots.self(), &described, status) == NXMEM_STATUS_OK;
                         }});
    }
    if (negotiate != nullptr) {
        paths.push_back({"NxmemNegotiate with the host's whole range", [negotiate](NxmemStatus* status) {
                             auto request = abi::make_struct<NxmemNegotiateRequest>();
                             request.host_range = abi::supported_range.to_wire();
                             auto response = abi::make_struct<NxmemNegotiateResponse>();
                             return negotiate(&request, &response, status) == NXMEM_STATUS_OK;
                         }});
    }
    if (NxmemQueryUnloadReadinessFn query = library.query_unload_readiness(); query != nullptr) {
        paths.push_back({"NxmemQueryUnloadReadiness", [query](NxmemStatus* status) {
                             auto report = abi::make_struct<NxmemUnloadReport>();
                             return query(&report, status) == NXMEM_STATUS_OK;
                         }});
    }
    return paths;
}

// What a child saw of a status after a call that succeeded.
struct success_seen {
    bool succeeded = false;
    std::int32_t first_changed = -1; // the offset of the first byte the call changed
};

} // namespace detail

// statuses.untouched_on_success (E14): a call that returns OK leaves its status as the caller set
// it, for the full 264 bytes and for the smallest status of 8.
struct check_statuses_untouched_on_success {
    static constexpr check_revision revision{"E14", "1.0", "2026-12-04", false,
                                            "the host reads no status after OK (E3), and a write past "
                                            "struct_size is boundary.status_within_size's"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        for (const detail::success_path& path : detail::success_paths<D>(slots, opened.library, opened.negotiate)) {
            for (std::uint32_t size : {std::uint32_t{sizeof(NxmemStatus)}, detail::smallest_status_bytes}) {
                const std::string name = path.name + " with a " + std::to_string(size) +
                                         "-byte status of 0xa5 bytes ending at a PROT_NONE page";
                announce_step(name);
                const auto called = detail::run_contained<detail::success_seen>([&]() {
                    detail::success_seen seen;
                    std::optional<detail::guarded_bytes> status = detail::guarded_status(size, 0xA5);
                    if (!status) {
                        return seen;
                    }
                    std::vector<unsigned char> before(status->data(), status->data() + size);
                    seen.succeeded = path.call(status->as<NxmemStatus>());
                    for (std::uint32_t at = 0; at < size && seen.succeeded; ++at) {
                        if (status->data()[at] != before[at]) {
                            seen.first_changed = static_cast<std::int32_t>(at);
                            break;
                        }
                    }
                    return seen;
                });
                if (!called.value) {
                    return failed("a call that succeeds writes nothing into its status (E14)", name + ": " + called.failure);
                }
                if (called.value->succeeded && called.value->first_changed >= 0) {
                    return failed("a call that succeeds writes nothing into its status (E14)",
                                  name + ": succeeded and changed the status at offset " +
                                      std::to_string(called.value->first_changed) +
                                      (called.value->first_changed < 8 ? " (its struct_size or code)" : " (its message)"));
                }
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
