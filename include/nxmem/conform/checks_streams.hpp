// The tables of minor 4 (docs/ABI.md, "Stream-ordered release and copies"), driven through their
// raw slots so that a request the host library would refuse itself still reaches the plugin:
//   capability.copy            bytes round trip both ways through `copy` (an allocation, a range of
//                              it, a shared prefix); refused copies touch neither the host buffer
//                              nor the memory; a stream of a kind the table does not list is
//                              refused (CP1, CP2, CP3).
//   capability.fenced_release  a release fenced on a host timeline the check owns retires only once
//                              the counter reaches the fence's value, in enqueue order with a plain
//                              release queued after it; malformed requests queue nothing (F1, F3,
//                              F4, F5).
// Both are not applicable to a mechanism without the table (every plugin below minor 4).
#pragma once

#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/stream_requests.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_capabilities.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/subject.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// A minor-4 capability table of the opened allocator, read as the host reads it; nullopt when the
// allocator table has none.
template <abi::growable_table T>
result<std::optional<T>> raw_stream_table(const T* untrusted) {
    if (untrusted == nullptr) {
        return std::optional<T>{};
    }
    NXMEM_TRY(copy, abi::read_prefix<T>(untrusted, NXMEM_ABI_MINOR));
    return std::optional<T>{copy.table};
}

// A host timeline fence on `counter` (F1), of the allocator's device.
inline NxmemFence timeline_fence(const std::atomic<std::uint64_t>& counter, std::uint64_t value,
                                 device_id device) {
    return abi::make_fence(NXMEM_FENCE_HOST_TIMELINE, device.to_wire(), reinterpret_cast<std::uint64_t>(&counter), value);
}

// Fences laid out `stride` bytes apart in 8-aligned memory, as a sender of a larger NxmemFence
// lays them out; the stride may be one the rules refuse.
class fence_array {
public:
    fence_array(const NxmemFence& each, std::uint32_t count, std::uint32_t stride)
        : words_((std::size_t{count} * stride + sizeof(NxmemFence) + 7) / 8) {
        auto* bytes = reinterpret_cast<unsigned char*>(words_.data());
        for (std::uint32_t index = 0; index < count; ++index) {
            std::memcpy(bytes + std::size_t{index} * stride, &each, sizeof each);
        }
    }
    const NxmemFence* data() const noexcept { return reinterpret_cast<const NxmemFence*>(words_.data()); }

private:
    std::vector<std::uint64_t> words_;
};

} // namespace detail

// capability.copy (CP1, CP2, CP3).
struct check_capability_copy {
    static constexpr check_revision revision{
        "CP1 CP2 CP3", "1.4", "2026-12-04", false,
        "a plugin declaring a minor below 4 has no copy table; the host library checks a copy's table, "
        "identity, liveness and range itself before it calls the plugin (CP4)"};

    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if (auto absent = detail::unless_declared(allocator, NXMEM_CAP_COPY, "NXMEM_CAP_COPY")) {
            return *absent;
        }
        const detail::raw_slots slots(allocator);
        NXMEM_CONFORM_TRY(table, "a readable copy table", detail::raw_stream_table(slots.table().copy));
        if (!table || table->copy == nullptr) {
            return failed("a copy table with its copy slot beside NXMEM_CAP_COPY", "none");
        }
        const copier copies{slots, *table};
        NXMEM_CONFORM_TRY(live, "an allocation of 64 KiB", slots.allocate(bytes, 4096));
        finding verdict = copy_allocation(copies, slots, live);
        (void)slots.deallocate(live);
        if (verdict.verdict != outcome::pass) {
            return verdict;
        }
        if ((allocator.capabilities() & NXMEM_CAP_SHARED_MAPPING) != 0) {
            NXMEM_CONFORM_TRY(mapping, "the shared mapping view", allocator.shared_mapping());
            NXMEM_CONFORM_TRY(prefix, "a shared prefix of 64 KiB", mapping.create_prefix(bytes));
            verdict = copy_prefix(copies, prefix.to_wire());
            (void)mapping.release_prefix(prefix);
        }
        return verdict;
    }

private:
    static constexpr std::uint64_t bytes = 64 * 1024;

    // The copy slot with a request the check builds, and its answer.
    struct copier {
        const detail::raw_slots& slots;
        NxmemCopyVtable table;

        detail::slot_reply call(const NxmemCopyRequest& request) const {
            return detail::slot_reply::of([&](NxmemStatus* status) { return table.copy(slots.self(), &request, status); });
        }
    };

    static NxmemCopyRequest request_for(const NxmemAllocation& live, NxmemCopyDirection direction,
                                        std::uint64_t offset, std::uint64_t length, void* buffer) {
        return abi::make_copy_request(direction, live, offset, length, buffer);
    }

    static std::string range_of(const NxmemCopyRequest& request) {
        return "[" + std::to_string(request.offset) + ", +" + std::to_string(request.length) + ")";
    }

    static std::vector<unsigned char> pattern(std::size_t size, unsigned seed) {
        std::vector<unsigned char> made(size);
        for (std::size_t at = 0; at < size; ++at) {
            made[at] = static_cast<unsigned char>((at * 31 + seed * 17 + at / 251) & 0xff);
        }
        return made;
    }

    // The whole memory read back, or the reason it could not be.
    static result<std::vector<unsigned char>> read_back(const copier& copies, NxmemCopyRequest whole) {
        std::vector<unsigned char> seen(static_cast<std::size_t>(whole.length), 0xEE);
        whole.direction = NXMEM_COPY_TO_HOST;
        whole.offset = 0;
        whole.host_buffer = seen.data();
        const detail::slot_reply reply = copies.call(whole);
        if (!reply.ok()) {
            return fail(status_code_from_wire(reply.code), "TO_HOST of " + range_of(whole) + ": " + reply.describe());
        }
        return seen;
    }

    // Each refusal (a request the rules refuse, and the codes they allow) sent both ways: TO_HOST
    // must leave the host buffer as it was, FROM_HOST the memory (read back through `whole`).
    struct refusal {
        NxmemCopyRequest request;
        std::string what;
        std::vector<NxmemStatusCode> codes;
        const char* rule;
    };
    static finding refused_untouched(const copier& copies, const NxmemCopyRequest& whole,
                                     const std::vector<unsigned char>& memory, const refusal& refused) {
        for (const NxmemCopyDirection direction : {NXMEM_COPY_TO_HOST, NXMEM_COPY_FROM_HOST}) {
            NxmemCopyRequest request = refused.request;
            if (abi::known_copy_direction(request.direction)) {
                request.direction = direction;
            }
            const bool to_host = request.direction == NXMEM_COPY_TO_HOST;
            const std::string name = std::string(to_host ? "TO_HOST" : "FROM_HOST") + " copy " + range_of(request) +
                                     " (" + refused.what + ")";
            announce_step(name);
            std::vector<unsigned char> host(std::max<std::size_t>(memory.size(), 4096), to_host ? 0xC3 : 0x5A);
            const std::vector<unsigned char> host_before = host;
            if (request.host_buffer != nullptr) {
                request.host_buffer = host.data();
            }
            const detail::slot_reply reply = copies.call(request);
            std::string expected;
            for (NxmemStatusCode code : refused.codes) {
                expected += (expected.empty() ? "" : " or ") + code_name(code);
            }
            if (std::find(refused.codes.begin(), refused.codes.end(), reply.code) == refused.codes.end()) {
                return failed_rule(refused.rule, name + ": refused with " + expected + " (" + refused.rule + ")",
                                   reply.describe());
            }
            if (host != host_before) {
                return failed_rule(refused.rule, name + ": a refused copy touches nothing (" + refused.rule + ")",
                                   "refused, yet it wrote into the host buffer");
            }
            NXMEM_CONFORM_TRY(after, "the memory read back after a refused copy", read_back(copies, whole));
            if (after != memory) {
                return failed_rule(refused.rule, name + ": a refused copy touches nothing (" + refused.rule + ")",
                                   "refused, yet the memory's bytes changed");
            }
            if (!abi::known_copy_direction(refused.request.direction)) {
                break; // the unknown direction is the fault: sent once
            }
        }
        return passed();
    }

    static finding copy_allocation(const copier& copies, const detail::raw_slots& slots, const NxmemAllocation& live) {
        std::vector<unsigned char> memory = pattern(bytes, 1);
        const NxmemCopyRequest whole = request_for(live, NXMEM_COPY_FROM_HOST, 0, bytes, memory.data());
        if (const std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots)) {
            // CP2: nothing is committed yet, so a copy into or out of the reservation is refused.
            std::vector<unsigned char> untouched(4096, 0xC3);
            const NxmemCopyRequest uncommitted = request_for(live, NXMEM_COPY_TO_HOST, 0, 4096, untouched.data());
            announce_step("TO_HOST copy [0, +4096) of an uncommitted reservation");
            const detail::slot_reply reply = copies.call(uncommitted);
            if (reply.code != NXMEM_STATUS_INVALID_ARGUMENT) {
                return failed_rule("CP2", "a copy of an uncommitted range refused with INVALID_ARGUMENT (CP2)",
                                   reply.describe());
            }
            if (std::any_of(untouched.begin(), untouched.end(), [](unsigned char byte) { return byte != 0xC3; })) {
                return failed_rule("CP2", "a refused copy touches nothing (CP2)", "it wrote into the host buffer");
            }
            if (const detail::slot_reply committed = detail::raw_commit(slots.self(), *backing, live, 0, bytes);
                !committed.ok()) {
                return failed("commit of the whole 64 KiB to copy into", committed.describe());
            }
        }
        announce_step("FROM_HOST copy of the whole 64 KiB, read back TO_HOST");
        if (const detail::slot_reply reply = copies.call(whole); !reply.ok()) {
            return failed_rule("CP1", "FROM_HOST copy " + range_of(whole) + " succeeds (CP1)", reply.describe());
        }
        NXMEM_CONFORM_TRY(seen, "TO_HOST copy of the whole 64 KiB succeeds (CP1)", read_back(copies, whole));
        if (seen != memory) {
            return failed_rule("CP1", "the bytes copied in read back the same (CP1)", "they differ");
        }
        // A range inside: only its bytes change.
        std::vector<unsigned char> inside = pattern(300, 2);
        const NxmemCopyRequest range = request_for(live, NXMEM_COPY_FROM_HOST, 4100, inside.size(), inside.data());
        announce_step("FROM_HOST copy " + range_of(range));
        if (const detail::slot_reply reply = copies.call(range); !reply.ok()) {
            return failed_rule("CP1", "FROM_HOST copy " + range_of(range) + " succeeds (CP1)", reply.describe());
        }
        std::copy(inside.begin(), inside.end(), memory.begin() + 4100);
        std::vector<unsigned char> part(inside.size(), 0xEE);
        const NxmemCopyRequest read_part = request_for(live, NXMEM_COPY_TO_HOST, 4100, part.size(), part.data());
        if (const detail::slot_reply reply = copies.call(read_part); !reply.ok() || part != inside) {
            return failed_rule("CP1", "TO_HOST copy " + range_of(read_part) + " reads the bytes copied in (CP1)",
                               reply.ok() ? "other bytes" : reply.describe());
        }
        NXMEM_CONFORM_TRY(after_range, "TO_HOST copy of the whole 64 KiB succeeds (CP1)", read_back(copies, whole));
        if (after_range != memory) {
            return failed_rule("CP1", "FROM_HOST " + range_of(range) + " changes only those bytes (CP1)",
                               "bytes outside it changed");
        }
        // Length 0 copies nothing and succeeds, at the end and with no buffer at all.
        for (void* buffer : {static_cast<void*>(part.data()), static_cast<void*>(nullptr)}) {
            std::fill(part.begin(), part.end(), 0xEE);
            const NxmemCopyRequest empty = request_for(live, NXMEM_COPY_TO_HOST, bytes, 0, buffer);
            announce_step(std::string("TO_HOST copy of length 0 at the end, buffer ") + (buffer ? "set" : "NULL"));
            const detail::slot_reply reply = copies.call(empty);
            if (!reply.ok() || std::any_of(part.begin(), part.end(), [](unsigned char byte) { return byte != 0xEE; })) {
                return failed_rule("CP1",
                                   std::string("a copy of length 0 at the end, buffer ") + (buffer ? "set" : "NULL") +
                                       ", succeeds and copies nothing (CP1)",
                                   reply.ok() ? "it wrote into the host buffer" : reply.describe());
            }
        }
        if (finding refusals = refusals_of(copies, slots, live, whole, memory); refusals.verdict != outcome::pass) {
            return refusals;
        }
        return refused_stream(copies, slots, live);
    }

    static finding refusals_of(const copier& copies, const detail::raw_slots& slots, const NxmemAllocation& live,
                               const NxmemCopyRequest& whole, const std::vector<unsigned char>& memory) {
        constexpr NxmemStatusCode invalid = NXMEM_STATUS_INVALID_ARGUMENT;
        std::vector<unsigned char> any(1);
        auto request = [&](std::uint64_t offset, std::uint64_t length) {
            return request_for(live, NXMEM_COPY_TO_HOST, offset, length, any.data());
        };
        std::vector<refusal> refusals{
            {request(0 - std::uint64_t{8}, 16), "offset + length wraps to 8", {invalid}, "CP1"},
            {request(bytes - 100, 200), "the last 100 bytes and 100 past the end", {invalid}, "CP1"},
            {request(bytes, 1), "one byte past the end", {invalid}, "CP1"},
            {request(bytes + 4096, 0), "length 0 past the end", {invalid}, "CP1"},
            {request(0, 16), "no host buffer", {invalid}, "CP1"},
        };
        refusals.back().request.host_buffer = nullptr;
        NxmemCopyRequest unknown_direction = request(0, 16);
        unknown_direction.direction = 3;
        refusals.push_back({unknown_direction, "direction 3", {invalid}, "CP1"});
        NxmemCopyRequest unknown_target = request(0, 16);
        unknown_target.target = 3;
        refusals.push_back({unknown_target, "target 3", {invalid}, "CP1"});
        NxmemCopyRequest other_mechanism = request(0, 16);
        other_mechanism.allocation.mechanism_id += 1;
        refusals.push_back({other_mechanism, "another mechanism's allocation", {NXMEM_STATUS_WRONG_MECHANISM}, "CP1"});
        NXMEM_CONFORM_TRY(released, "a second allocation, to release", slots.allocate(bytes, 4096));
        if (const detail::slot_reply gone = slots.deallocate(released); !gone.ok()) {
            return failed("the second allocation released", gone.describe());
        }
        NxmemCopyRequest after_release = request(0, 16);
        after_release.allocation = released;
        refusals.push_back(
            {after_release, "an allocation already released", {NXMEM_STATUS_UNKNOWN_ALLOCATION, invalid}, "CP2"});
        for (const refusal& refused : refusals) {
            if (finding found = refused_untouched(copies, whole, memory, refused); found.verdict != outcome::pass) {
                return found;
            }
        }
        return passed();
    }

    // CP3: a stream of a kind stream_kinds does not list is UNSUPPORTED_CAPABILITY, nothing copied.
    static finding refused_stream(const copier& copies, const detail::raw_slots& slots, const NxmemAllocation& live) {
        std::uint32_t kind = 60; // no kind of this header: never listed
        for (std::uint32_t known : {NXMEM_FENCE_HOST_TIMELINE, NXMEM_FENCE_CUDA_STREAM, NXMEM_FENCE_CUDA_EVENT}) {
            if ((copies.table.stream_kinds & abi::fence_kind_bit(known)) == 0) {
                kind = known;
                break;
            }
        }
        const std::atomic<std::uint64_t> counter{0};
        NxmemFence stream = detail::timeline_fence(counter, 1, slots.device());
        stream.kind = kind;
        std::vector<unsigned char> host(4096, 0xC3);
        NxmemCopyRequest request = request_for(live, NXMEM_COPY_TO_HOST, 0, host.size(), host.data());
        request.stream = &stream;
        const std::string name = "TO_HOST copy on a stream of kind " + std::to_string(kind) +
                                 ", which stream_kinds does not list";
        announce_step(name);
        const detail::slot_reply reply = copies.call(request);
        if (reply.code != NXMEM_STATUS_UNSUPPORTED_CAPABILITY) {
            return failed_rule("CP3", name + ": UNSUPPORTED_CAPABILITY (CP3)", reply.describe());
        }
        if (std::any_of(host.begin(), host.end(), [](unsigned char byte) { return byte != 0xC3; })) {
            return failed_rule("CP3", name + ": a refused copy touches nothing (CP3)", "it wrote into the host buffer");
        }
        return passed();
    }

    // A shared prefix: a round trip and a range past its end. A mechanism that copies allocations
    // only answers UNSUPPORTED_CAPABILITY, which passes.
    static finding copy_prefix(const copier& copies, const NxmemSharedPrefixHandle& prefix) {
        std::vector<unsigned char> memory = pattern(bytes, 3);
        const NxmemCopyRequest whole = abi::make_prefix_copy_request(NXMEM_COPY_FROM_HOST, prefix, 0, bytes, memory.data());
        announce_step("FROM_HOST copy of a whole 64 KiB shared prefix");
        const detail::slot_reply reply = copies.call(whole);
        if (reply.code == NXMEM_STATUS_UNSUPPORTED_CAPABILITY) {
            return passed();
        }
        if (!reply.ok()) {
            return failed_rule("CP1", "FROM_HOST copy of a shared prefix " + range_of(whole) + " succeeds (CP1)",
                               reply.describe());
        }
        NXMEM_CONFORM_TRY(seen, "TO_HOST copy of the whole prefix succeeds (CP1)", read_back(copies, whole));
        if (seen != memory) {
            return failed_rule("CP1", "the bytes copied into the prefix read back the same (CP1)", "they differ");
        }
        NxmemCopyRequest past = whole;
        past.offset = bytes - 100;
        past.length = 200;
        return refused_untouched(copies, whole, memory,
                                 {past, "a prefix's last 100 bytes and 100 past its end",
                                  {NXMEM_STATUS_INVALID_ARGUMENT}, "CP1"});
    }
};

// capability.fenced_release (F1, F3, F4, F5).
struct check_capability_fenced_release {
    static constexpr check_revision revision{
        "F1 F3 F4 F5", "1.4", "2026-12-04", false,
        "a plugin declaring a minor below 4 has no fenced_release table; the host's release_after then "
        "keeps the allocation and waits on its fences itself (F7)"};

    static finding run(const subject& target, const suite_options& options) {
        // Declared before the allocator: a release still queued at the end reads this counter
        // until the drains below retire it.
        std::atomic<std::uint64_t> counter{0};
        detail::callback_host callbacks;
        detail::retired_tickets retired;
        retired.listen(callbacks);
        NXMEM_CONFORM_TRY(opened, "the mechanism opens with release_completed offered",
                          detail::callback_allocator::open(target, callbacks.table()));
        const detail::raw_slots slots = opened->slots();
        if ((opened->capabilities() & NXMEM_CAP_FENCED_RELEASE) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_FENCED_RELEASE");
        }
        NXMEM_CONFORM_TRY(table, "a readable fenced_release table",
                          detail::raw_stream_table(slots.table().fenced_release));
        if (!table || table->enqueue_fenced_release == nullptr) {
            return failed("a fenced_release table with its slot beside NXMEM_CAP_FENCED_RELEASE", "none");
        }
        if ((table->fence_kinds & abi::fence_kind_bit(NXMEM_FENCE_HOST_TIMELINE)) == 0) {
            return not_applicable("fence_kinds lists no HOST_TIMELINE, the one kind the suite can signal");
        }
        const fenced_queue queue{slots, *table, *opened, counter, retired, options.drain_attempts};
        finding verdict = queue.in_order();
        if (verdict.verdict == outcome::pass) {
            verdict = queue.malformed_refused();
        }
        queue.settle();
        return verdict;
    }

private:
    struct fenced_queue {
        const detail::raw_slots& slots;
        NxmemFencedReleaseVtable table;
        detail::callback_allocator& allocator;
        std::atomic<std::uint64_t>& counter;
        const detail::retired_tickets& retired;
        unsigned drain_attempts;

        static constexpr std::uint64_t fenced_ticket = (1ull << 40) + 1;
        static constexpr std::uint64_t plain_ticket = (1ull << 40) + 2;
        static constexpr std::uint64_t malformed_ticket = (1ull << 40) + 3;

        detail::slot_reply enqueue(const NxmemAllocation& live, std::uint64_t ticket, const NxmemFence* fences,
                                   std::uint32_t count, std::uint32_t stride) const {
            const NxmemFencedReleaseRequest request = abi::make_fenced_release_request(live, ticket, fences, count, stride);
            return detail::slot_reply::of([&](NxmemStatus* status) {
                return table.enqueue_fenced_release(slots.self(), &request, status);
            });
        }

        // One drain; the count it reports retired, or the reason it failed.
        result<std::uint64_t> drain_once() const {
            std::uint64_t count = 0;
            const detail::slot_reply drained = slots.drain_releases(count);
            if (!drained.ok()) {
                return fail(status_code_from_wire(drained.code), "drain_releases: " + drained.describe());
            }
            return count;
        }

        // The counter past every fence, then drains until nothing the check queued is left.
        void settle() const {
            counter.store(std::numeric_limits<std::uint64_t>::max(), std::memory_order_release);
            for (unsigned attempt = 0; attempt < drain_attempts; ++attempt) {
                (void)drain_once();
            }
        }

        // F1, F4, F5: a fenced release and a plain one after it wait for the counter.
        finding in_order() const {
            NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", allocator.counts());
            NXMEM_CONFORM_TRY(fenced_one, "an allocation to release after a fence", slots.allocate(4096, 64));
            NXMEM_CONFORM_TRY(plain_one, "an allocation to release after it", slots.allocate(4096, 64));
            const NxmemFence fence = detail::timeline_fence(counter, 2, slots.device());
            announce_step("enqueue_fenced_release on a host timeline at 0 of 2, then enqueue_release");
            if (const detail::slot_reply queued = enqueue(fenced_one, fenced_ticket, &fence, 1, sizeof fence);
                !queued.ok()) {
                (void)slots.deallocate(fenced_one);
                (void)slots.deallocate(plain_one);
                return failed_rule("F1", "enqueue_fenced_release of a host timeline fence succeeds (F1)",
                                   queued.describe());
            }
            if (const detail::slot_reply queued = slots.enqueue_release(plain_one, plain_ticket); !queued.ok()) {
                (void)slots.deallocate(plain_one);
                return failed("enqueue_release after a fenced release succeeds (D1)", queued.describe());
            }
            for (const std::uint64_t reading : {std::uint64_t{0}, std::uint64_t{1}}) {
                counter.store(reading, std::memory_order_release);
                announce_step("drain_releases while the counter reads " + std::to_string(reading) + " of 2");
                NXMEM_CONFORM_TRY(count, "drain_releases succeeds", drain_once());
                const std::vector<std::uint64_t> early = retired.now();
                if (count != 0 || !early.empty()) {
                    return failed_rule("F4", "nothing retires while the fence's counter reads " +
                                                 std::to_string(reading) + " of 2, the plain release queued "
                                                 "after it neither (F4)",
                                       "tickets " + detail::describe_tickets(early) +
                                           " retired before its fence (the drain counted " +
                                           std::to_string(count) + ")");
                }
                NXMEM_CONFORM_TRY(pending, "the plugin reports its readiness", allocator.counts());
                if (pending.queued_releases != before.queued_releases + 2 ||
                    pending.allocations != before.allocations + 2) {
                    return failed_rule("F5", "the unload report counts both pending releases as allocations and "
                                             "queued releases (F5, D1)",
                                       pending.describe());
                }
            }
            counter.store(2, std::memory_order_release);
            for (unsigned attempt = 0; attempt < drain_attempts && retired.now().size() < 2; ++attempt) {
                announce_step("drain_releases once the counter reads 2, attempt " + std::to_string(attempt + 1));
                NXMEM_CONFORM_TRY(count, "drain_releases succeeds", drain_once());
                (void)count;
            }
            const std::vector<std::uint64_t> expected{fenced_ticket, plain_ticket};
            if (retired.now() != expected) {
                return failed_rule("F4", "tickets " + detail::describe_tickets(expected) +
                                             " retired in enqueue order once the counter reached 2, within " +
                                             std::to_string(drain_attempts) + " drains (F4)",
                                   "retired " + detail::describe_tickets(retired.now()));
            }
            NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", allocator.counts());
            if (after.queued_releases != before.queued_releases || after.allocations != before.allocations) {
                return failed("no queued release or allocation left once both retired", after.describe());
            }
            return passed();
        }

        // F3: each malformed request refused with its code, nothing queued, the allocation live.
        finding malformed_refused() const {
            counter.store(2, std::memory_order_release); // reached: a request wrongly queued retires at once
            NXMEM_CONFORM_TRY(live, "an allocation to release with malformed fences", slots.allocate(4096, 64));
            NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", allocator.counts());
            const std::size_t retired_before = retired.now().size();
            const NxmemFence good = detail::timeline_fence(counter, 1, slots.device());
            constexpr std::uint32_t stride = sizeof(NxmemFence);
            const detail::fence_array one(good, 1, stride);
            const detail::fence_array too_many(good, NXMEM_MAX_FENCES + 1, stride);
            const detail::fence_array short_stride(good, 1, 32);
            const detail::fence_array odd_stride(good, 1, 44);
            alignas(8) std::array<std::uint64_t, 2> misaligned_counter{2, 2};
            NxmemFence misaligned = good;
            misaligned.handle = reinterpret_cast<std::uint64_t>(misaligned_counter.data()) + 4;
            NxmemFence unknown_kind = good;
            unknown_kind.kind = 60;
            NxmemFence other_device = good;
            other_device.device.index += 1;
            struct malformed {
                const char* what;
                const NxmemFence* fences;
                std::uint32_t count;
                std::uint32_t stride;
                NxmemStatusCode code;
            };
            const malformed requests[] = {
                {"fence_count 0", one.data(), 0, stride, NXMEM_STATUS_INVALID_ARGUMENT},
                {"fence_count NXMEM_MAX_FENCES + 1", too_many.data(), NXMEM_MAX_FENCES + 1, stride,
                 NXMEM_STATUS_INVALID_ARGUMENT},
                {"fence_stride 32, below 40", short_stride.data(), 1, 32, NXMEM_STATUS_INVALID_ARGUMENT},
                {"fence_stride 44, not a multiple of 8", odd_stride.data(), 1, 44, NXMEM_STATUS_INVALID_ARGUMENT},
                {"fences NULL", nullptr, 1, stride, NXMEM_STATUS_INVALID_ARGUMENT},
                {"a host timeline counter not 8-aligned", &misaligned, 1, stride, NXMEM_STATUS_INVALID_ARGUMENT},
                {"a fence of kind 60, which fence_kinds does not list", &unknown_kind, 1, stride,
                 NXMEM_STATUS_UNSUPPORTED_CAPABILITY},
                {"a fence of another device", &other_device, 1, stride, NXMEM_STATUS_WRONG_DEVICE},
            };
            for (const malformed& request : requests) {
                const std::string name = std::string("enqueue_fenced_release with ") + request.what;
                announce_step(name);
                const detail::slot_reply reply =
                    enqueue(live, malformed_ticket, request.fences, request.count, request.stride);
                NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", allocator.counts());
                const bool queued = after.queued_releases != before.queued_releases ||
                                    retired.now().size() != retired_before;
                if (reply.ok() || queued) {
                    // Whatever was queued retires at the next drains (the counter has been reached).
                    settle();
                    return failed_rule("F3",
                                       name + ": refused with " + code_name(request.code) +
                                           ", nothing queued, the allocation still live (F3)",
                                       (reply.ok() ? std::string("OK: queued") : "queued, then " + reply.describe()) +
                                           " (" + after.describe() + ")");
                }
                if (reply.code != request.code) {
                    (void)slots.deallocate(live);
                    return failed_rule("F3", name + ": refused with " + code_name(request.code) + " (F3)",
                                       reply.describe());
                }
            }
            if (const detail::slot_reply released = slots.deallocate(live); !released.ok()) {
                return failed_rule("F3", "the allocation still live after the refused requests, released (F3)",
                                   released.describe());
            }
            return passed();
        }
    };
};

} // namespace nxmem::conform
