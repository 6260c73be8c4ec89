// Opening and allocating: the host opens the mechanism; sizes from 1 byte to 1 MiB at alignments
// from 1 to 64 KiB come back aligned, writable (host memory) and disjoint; both tallies count
// them; malformed requests are refused and change nothing; a larger request with a zero tail is
// accepted.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/fault_report.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/hex.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nxmem::conform {

namespace detail {

inline constexpr std::uint64_t suite_sizes[] = {1, 7, 64, 4096, 65537, 1ull << 20};
inline constexpr std::uint64_t suite_alignments[] = {1, 8, 64, 4096, 65536};

template <Device D> std::uint64_t wire_address(const allocation<D>& live) {
    return D::to_wire(live.address);
}

// Allocates every size at every alignment; the first failure is reported.
template <Device D>
result<std::vector<allocation<D>>> allocate_grid(host::plugin_allocator<D>& allocator) {
    std::vector<allocation<D>> live;
    for (std::uint64_t size : suite_sizes) {
        for (std::uint64_t alignment : suite_alignments) {
            announce_step("allocate " + std::to_string(size) + " B at alignment " + std::to_string(alignment));
            result<allocation<D>> made = allocator.allocate(size, alignment);
            if (!made) {
                for (const allocation<D>& earlier : live) {
                    (void)allocator.release(earlier);
                }
                // The code stays the error's own: the message names it once, where it is printed.
                return fail(made.error().code, std::to_string(size) + " bytes aligned to " +
                                                   std::to_string(alignment) + ": " +
                                                   made.error().message);
            }
            live.push_back(made.value());
        }
    }
    return live;
}

template <Device D>
std::string release_all(host::plugin_allocator<D>& allocator, const std::vector<allocation<D>>& live) {
    std::string problem;
    for (const allocation<D>& made : live) {
        announce_step("release " + std::to_string(made.size) + " B");
        result<release_report> released = allocator.release(made);
        if (!released && problem.empty()) {
            problem = "releasing " + std::to_string(made.size) + " bytes: " +
                      released.error().describe();
        }
    }
    return problem;
}

// A virtual-backing mechanism only reserves on allocate: the whole allocation is committed before
// the host touches it. [0, size) is a legal range at any granularity: it starts at 0 and ends at
// the allocation's end (ABI rules G3, G5), so a mechanism must accept it.
template <Device D>
result<void> make_usable(host::plugin_allocator<D>& allocator, const allocation<D>& made) {
    if ((allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) == 0) {
        return boost::outcome_v2::success();
    }
    NXMEM_TRY(backing, allocator.virtual_backing());
    return backing.commit(made, {0, made.size});
}

} // namespace detail

// allocator.open
struct check_allocator_open {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the host loads the plugin", session<D>::load(target));
        result<void> accepted = opened.open_allocator(target);
        if (!accepted) {
            return failed("the host accepts the allocator table", accepted.error().describe());
        }
        if (opened.allocator().device() != target.device) {
            return failed("an allocator on the device asked for", "another device");
        }
        return passed();
    }
};

// allocation.basic
struct check_allocation_basic {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        announce_step("allocate 64 B at alignment 8");
        result<allocation<D>> made = opened.allocator().allocate(64, 8);
        if (!made) {
            return failed("64 bytes aligned to 8", made.error().describe());
        }
        announce_step("release the 64 B");
        result<release_report> released = opened.allocator().release(made.value());
        if (!released) {
            return failed("the allocation released", released.error().describe());
        }
        return passed();
    }
};

// allocation.sizes_alignments
struct check_allocation_sizes_alignments {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        NXMEM_CONFORM_TRY(live, "every size from 1 byte to 1 MiB at every alignment from 1 to 64 KiB",
                          detail::allocate_grid(allocator));
        std::uint64_t last_id = 0;
        std::string problem;
        for (const allocation<D>& made : live) {
            if (detail::wire_address(made) % made.alignment != 0) {
                problem = "address 0x" + nxmem::detail::to_hex(detail::wire_address(made)) +
                          " for alignment " + std::to_string(made.alignment);
            } else if (made.allocation_id <= last_id) {
                problem = "allocation id " + std::to_string(made.allocation_id) + " after " +
                          std::to_string(last_id);
            } else if (made.mechanism_id != allocator.mechanism_id()) {
                problem = "mechanism id " + std::to_string(made.mechanism_id);
            }
            if (!problem.empty()) {
                break;
            }
            last_id = made.allocation_id;
        }
        const std::string release_problem = detail::release_all(allocator, live);
        if (!problem.empty()) {
            return failed("aligned addresses, host ids increasing in the calling thread, the mechanism's id", problem);
        }
        if (!release_problem.empty()) {
            return failed("every allocation released", release_problem);
        }
        return passed();
    }
};

// allocation.writable (a virtual-backing mechanism's allocations are committed first)
struct check_allocation_writable {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        if constexpr (!std::is_same_v<D, cpu_device>) {
            (void)target;
            return not_applicable(std::string(D::name) +
                                  " addresses cannot be dereferenced by the host");
        } else {
            NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
            auto& allocator = opened.allocator();
            NXMEM_CONFORM_TRY(live, "every size at every alignment", detail::allocate_grid(allocator));
            std::string problem;
            std::uint8_t pattern = 1;
            for (const allocation<D>& made : live) {
                if (result<void> usable = detail::make_usable(allocator, made); !usable) {
                    problem = "commit of the legal range [0, " + std::to_string(made.size) +
                              ") refused: " + usable.error().describe();
                    break;
                }
            }
            for (const allocation<D>& made : live) {
                if (!problem.empty()) {
                    break;
                }
                // Watched: a fault here names the offset within the allocation.
                const detail::watch_region watched(made.address, made.size, "an allocation");
                announce_step("write " + std::to_string(made.size) + " B at alignment " +
                              std::to_string(made.alignment));
                std::memset(made.address, pattern++, made.size);
            }
            pattern = 1;
            for (const allocation<D>& made : live) {
                if (!problem.empty()) {
                    break; // a refused commit: nothing was written, and nothing may be read
                }
                const auto* bytes = static_cast<const std::uint8_t*>(made.address);
                if (bytes[0] != pattern || bytes[made.size - 1] != pattern) {
                    problem = "the " + std::to_string(made.size) +
                              " bytes written did not read back";
                    break;
                }
                ++pattern;
            }
            const std::string release_problem = detail::release_all(allocator, live);
            if (!problem.empty()) {
                return failed("every byte of every allocation writable", problem);
            }
            if (!release_problem.empty()) {
                return failed("every allocation released", release_problem);
            }
            return passed();
        }
    }
};

// allocation.no_overlap
struct check_allocation_no_overlap {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        NXMEM_CONFORM_TRY(live, "every size at every alignment", detail::allocate_grid(allocator));
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
        for (const allocation<D>& made : live) {
            spans.emplace_back(detail::wire_address(made), detail::wire_address(made) + made.size);
        }
        std::sort(spans.begin(), spans.end());
        std::string problem;
        for (std::size_t i = 1; i < spans.size() && problem.empty(); ++i) {
            if (spans[i - 1].second > spans[i].first) {
                problem = "[0x" + nxmem::detail::to_hex(spans[i - 1].first) + ", 0x" +
                          nxmem::detail::to_hex(spans[i - 1].second) + ") overlaps 0x" +
                          nxmem::detail::to_hex(spans[i].first);
            }
        }
        const std::string release_problem = detail::release_all(allocator, live);
        if (!problem.empty()) {
            return failed("disjoint live allocations", problem);
        }
        if (!release_problem.empty()) {
            return failed("every allocation released", release_problem);
        }
        return passed();
    }
};

// allocation.accounting
struct check_allocation_accounting {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        NXMEM_CONFORM_TRY(live, "every size at every alignment", detail::allocate_grid(allocator));
        result<host::unload_readiness> during = opened.module()->readiness();
        const std::string release_problem = detail::release_all(allocator, live);
        if (!during) {
            return failed("the plugin reports its readiness", during.error().describe());
        }
        const std::uint64_t expected = before.allocations + live.size();
        if (during.value().plugin.allocations != expected || during.value().plugin.allocators == 0) {
            return failed("the plugin reports " + std::to_string(expected) +
                              " live allocations and its allocator",
                          during.value().plugin.describe());
        }
        if (!release_problem.empty()) {
            return failed("every allocation released", release_problem);
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (after.allocations != before.allocations) {
            return failed("the plugin reports " + std::to_string(before.allocations) +
                              " live allocations after release",
                          after.describe());
        }
        return passed();
    }
};

// allocation.malformed: size 0 and alignments that are not powers of two, through the raw slot.
struct check_allocation_malformed {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        for (auto [size, alignment] : {std::pair<std::uint64_t, std::uint64_t>{0, 8}, {64, 0},
                                       {64, 3}, {64, 48}}) {
            const NxmemAllocRequest request = slots.request(size, alignment);
            NxmemAllocResult out{};
            const detail::slot_reply reply = slots.allocate(&request, out);
            if (reply.code != NXMEM_STATUS_INVALID_ARGUMENT) {
                if (reply.ok()) {
                    (void)slots.deallocate(detail::raw_slots::describe(request, out));
                }
                return failed("INVALID_ARGUMENT for size " + std::to_string(size) + ", alignment " +
                                  std::to_string(alignment),
                              reply.describe());
            }
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (after.allocations != before.allocations) {
            return failed("nothing allocated by a refused request", after.describe());
        }
        return passed();
    }
};

// allocation.larger_request: a request longer than the plugin knows, with a zero tail, is served.
struct check_allocation_larger_request {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        struct longer_request {
            NxmemAllocRequest known;
            std::uint64_t tail[2];
        } longer{};
        longer.known = slots.request(256, 16);
        longer.known.struct_size = static_cast<std::uint32_t>(sizeof longer);
        NxmemAllocResult out{};
        const detail::slot_reply reply = slots.allocate(&longer.known, out);
        if (!reply.ok()) {
            return failed("OK for a " + std::to_string(sizeof longer) +
                              "-byte request whose unknown bytes are zero",
                          reply.describe());
        }
        const detail::slot_reply released = slots.deallocate(detail::raw_slots::describe(longer.known, out));
        if (!released.ok()) {
            return failed("the allocation released", released.describe());
        }
        return passed();
    }
};

} // namespace nxmem::conform
