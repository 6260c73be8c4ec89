// Misuse the plugin must refuse by itself. Every call here goes straight to the plugin's slots
// (raw_table()), past the host's own checks, so a plugin that does not check is caught. Each
// refusal must change nothing: the allocation stays live and its correct release then succeeds.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/hex.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace nxmem::conform {

namespace detail {

// Allocates one block through the raw slot, runs `probe` on its description, and releases it
// correctly unless the probe reports that the plugin already let it go.
template <Device D>
finding with_raw_allocation(session<D>& opened,
                            const std::function<finding(const raw_slots&, const NxmemAllocation&,
                                                        bool& gone)>& probe) {
    const raw_slots slots(opened.allocator());
    result<NxmemAllocation> live = slots.allocate(256, 64);
    if (!live) {
        return failed("a 256-byte allocation to misuse", live.error().describe());
    }
    bool gone = false;
    finding found = probe(slots, live.value(), gone);
    if (!gone) {
        const slot_reply released = slots.deallocate(live.value());
        if (!released.ok() && found.verdict == outcome::pass) {
            return failed("the allocation still live after the refusal, and released correctly",
                          released.describe());
        }
    }
    return found;
}

// The plugin refused `reply` with `expected` (or, when `expected` is OK, with any code).
inline finding expect_refused(const slot_reply& reply, NxmemStatusCode expected,
                              const std::string& what, bool& gone) {
    if (reply.ok()) {
        gone = true; // the plugin accepted it: the allocation is no longer the suite's to release
        return failed((expected == NXMEM_STATUS_OK ? std::string("a refusal")
                                                   : code_name(expected)) +
                          " for " + what,
                      "OK: the plugin acted on it");
    }
    if (expected != NXMEM_STATUS_OK && reply.code != expected) {
        return failed(code_name(expected) + " for " + what, reply.describe());
    }
    return passed();
}

inline NxmemDeviceId other_device(const NxmemDeviceId& device) {
    NxmemDeviceId other = device;
    other.index = device.index + 1;
    return other;
}

} // namespace detail

// misuse.wrong_mechanism
struct check_misuse_wrong_mechanism {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        return detail::with_raw_allocation(opened, [](const detail::raw_slots& slots,
                                                      const NxmemAllocation& live, bool& gone) {
            NxmemAllocRequest request = slots.request(64, 8);
            request.mechanism_id = slots.mechanism_id() ^ 0x5A5A0000ull;
            NxmemAllocResult out{};
            const detail::slot_reply allocated = slots.allocate(&request, out);
            if (allocated.ok()) {
                (void)slots.deallocate(detail::raw_slots::describe(request, out));
            }
            bool ignored = false;
            finding found = detail::expect_refused(allocated, NXMEM_STATUS_WRONG_MECHANISM,
                                                   "allocate naming another mechanism", ignored);
            if (found.verdict != outcome::pass) {
                return found;
            }
            NxmemAllocation described = live;
            described.mechanism_id = request.mechanism_id;
            return detail::expect_refused(slots.deallocate(described), NXMEM_STATUS_WRONG_MECHANISM,
                                          "deallocate naming another mechanism", gone);
        });
    }
};

// misuse.wrong_device
struct check_misuse_wrong_device {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        return detail::with_raw_allocation(opened, [](const detail::raw_slots& slots,
                                                      const NxmemAllocation& live, bool& gone) {
            NxmemAllocRequest request = slots.request(64, 8);
            request.device = detail::other_device(request.device);
            NxmemAllocResult out{};
            const detail::slot_reply allocated = slots.allocate(&request, out);
            if (allocated.ok()) {
                (void)slots.deallocate(detail::raw_slots::describe(request, out));
            }
            bool ignored = false;
            finding found = detail::expect_refused(allocated, NXMEM_STATUS_WRONG_DEVICE,
                                                   "allocate naming another device", ignored);
            if (found.verdict != outcome::pass) {
                return found;
            }
            NxmemAllocation described = live;
            described.device = detail::other_device(live.device);
            return detail::expect_refused(slots.deallocate(described), NXMEM_STATUS_WRONG_DEVICE,
                                          "deallocate naming another device", gone);
        });
    }
};

// misuse.unknown_allocation: an address the plugin never handed out, and one it already took back.
struct check_misuse_unknown_allocation {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        NXMEM_CONFORM_TRY(live, "a 256-byte allocation", slots.allocate(256, 64));
        const std::uint64_t never_handed_out = 0;
        NxmemAllocation stranger = live;
        stranger.address = reinterpret_cast<std::uintptr_t>(&never_handed_out); // the suite's stack
        bool gone = false;
        finding found = detail::expect_refused(slots.deallocate(stranger),
                                               NXMEM_STATUS_UNKNOWN_ALLOCATION,
                                               "deallocate of an address never handed out", gone);
        const detail::slot_reply released = slots.deallocate(live);
        if (found.verdict != outcome::pass) {
            return found;
        }
        if (!released.ok()) {
            return failed("the allocation released", released.describe());
        }
        bool freed_twice = false;
        return detail::expect_refused(slots.deallocate(live), NXMEM_STATUS_UNKNOWN_ALLOCATION,
                                      "a second deallocate of the same allocation", freed_twice);
    }
};

// misuse.misdescribed: the right address with the wrong id, size or alignment.
struct check_misuse_misdescribed {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        return detail::with_raw_allocation(opened, [](const detail::raw_slots& slots,
                                                      const NxmemAllocation& live, bool& gone) {
            struct variant {
                const char* what;
                NxmemAllocation described;
            };
            NxmemAllocation wrong_id = live;
            wrong_id.allocation_id += 1;
            NxmemAllocation wrong_size = live;
            wrong_size.size += 1;
            NxmemAllocation wrong_alignment = live;
            wrong_alignment.alignment *= 2;
            for (const variant& misdescribed :
                 {variant{"another allocation id", wrong_id}, variant{"another size", wrong_size},
                  variant{"another alignment", wrong_alignment}}) {
                finding found = detail::expect_refused(
                    slots.deallocate(misdescribed.described), NXMEM_STATUS_OK,
                    std::string("deallocate with the right address and ") + misdescribed.what, gone);
                if (found.verdict != outcome::pass) {
                    return found;
                }
                if (slots.table().release_allocation != nullptr) {
                    NxmemReleaseOutcome outcome_out{};
                    const detail::slot_reply reply =
                        slots.release_allocation(misdescribed.described, outcome_out);
                    if (reply.ok() && outcome_out.state != NXMEM_RELEASE_FAILED) {
                        gone = true;
                        return failed(std::string("a refusal for release_allocation with the right "
                                                  "address and ") +
                                          misdescribed.what,
                                      "OK: the plugin released it");
                    }
                }
            }
            return passed();
        });
    }
};

// misuse.request_tail: a request longer than the plugin knows with a non-zero unknown byte.
struct check_misuse_request_tail {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        struct longer_request {
            NxmemAllocRequest known;
            std::uint64_t tail[2];
        } longer{};
        longer.known = slots.request(256, 16);
        longer.known.struct_size = static_cast<std::uint32_t>(sizeof longer);
        longer.tail[1] = 0x100;
        NxmemAllocResult out{};
        const detail::slot_reply reply = slots.allocate(&longer.known, out);
        if (reply.ok()) {
            (void)slots.deallocate(detail::raw_slots::describe(longer.known, out));
        }
        bool ignored = false;
        finding found = detail::expect_refused(
            reply, NXMEM_STATUS_INVALID_ARGUMENT,
            "a " + std::to_string(sizeof longer) + "-byte request with a non-zero byte beyond " +
                std::to_string(sizeof(NxmemAllocRequest)),
            ignored);
        if (found.verdict != outcome::pass) {
            return found;
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (after.allocations != before.allocations) {
            return failed("nothing allocated by a refused request", after.describe());
        }
        return passed();
    }
};

// misuse.unknown_flags
struct check_misuse_unknown_flags {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        for (std::uint32_t flags : {1u, 1u << 31}) {
            NxmemAllocRequest request = slots.request(64, 8);
            request.flags = flags;
            NxmemAllocResult out{};
            const detail::slot_reply reply = slots.allocate(&request, out);
            if (reply.ok()) {
                (void)slots.deallocate(detail::raw_slots::describe(request, out));
            }
            bool ignored = false;
            finding found = detail::expect_refused(reply, NXMEM_STATUS_INVALID_ARGUMENT,
                                                   "allocation flags 0x" +
                                                       nxmem::detail::to_hex(flags),
                                                   ignored);
            if (found.verdict != outcome::pass) {
                return found;
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
