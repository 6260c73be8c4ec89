// The budget loop of a mechanism with a ceiling (a `budget` option, say): an atomic count of the
// bytes an allocator costs. When a charge would pass the ceiling the mechanism asks the host to
// reclaim the shortfall, holding no lock (the host may re-enter the plugin on this thread to free
// memory, H4), and tries once more; a second refusal, or a host that offered no reclaim hook, is
// OUT_OF_MEMORY naming the budget (H6, H7), and a charge for an allocation that then fails is
// given back (E12). Declare `uses_host_reclaim = true` on the mechanism.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/device.hpp>
#include <nxmem/plugin/host_link.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace nxmem::plugin {

class byte_budget {
public:
    byte_budget(std::optional<std::uint64_t> limit, plugin::host_link host, std::uint64_t mechanism_id,
           device_id device, const char* mechanism)
        : limit_(limit), host_(host), mechanism_id_(mechanism_id), device_(device),
          mechanism_(mechanism) {}

    bool limited() const noexcept { return limit_.has_value(); }
    std::uint64_t in_use() const noexcept { return used_.load(std::memory_order_relaxed); }

    // Charges `bytes` if they fit; otherwise leaves the count alone and returns the shortfall.
    std::uint64_t try_charge(std::uint64_t bytes) noexcept {
        if (!limit_ || bytes == 0) {
            return 0;
        }
        std::uint64_t used = used_.load(std::memory_order_relaxed);
        do {
            const std::uint64_t room = *limit_ - used; // used never exceeds the limit
            if (bytes > room) {
                return bytes - room;
            }
        } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
        return 0;
    }

    void credit(std::uint64_t bytes) noexcept {
        if (limit_ && bytes != 0) {
            used_.fetch_sub(bytes, std::memory_order_relaxed);
        }
    }

    // What an attempt that found the budget short reports: the bytes it wanted to charge and
    // how many of them did not fit.
    struct refusal {
        std::uint64_t wanted = 0;
        std::uint64_t shortfall = 0;
    };

    // Charges `bytes`, or records the shortfall in `refused` and fails: the first step of an
    // attempt run by with_reclaim.
    result<void> charge(std::uint64_t bytes, refusal& refused) {
        if (const std::uint64_t shortfall = try_charge(bytes); shortfall != 0) {
            refused = {bytes, shortfall};
            return fail(status_code::out_of_memory, "budget");
        }
        return boost::outcome_v2::success();
    }

    // Charges `bytes` (asking the host to reclaim when short, as with_reclaim) and runs `make()`
    // (returning result<R>), giving the charge back when it fails.
    template <class R, class Make> result<R> charged(std::uint64_t bytes, Make&& make) {
        return with_reclaim<R>([&](refusal& refused) -> result<R> {
            NXMEM_TRY_VOID(charge(bytes, refused));
            result<R> made = make();
            if (!made) {
                credit(bytes);
            }
            return made;
        });
    }

    // Runs `attempt(refusal&)` (returning result<R>). An attempt that finds the budget short
    // fills in the refusal, releases every lock it took and returns any failure; the host is then
    // asked to reclaim the shortfall and the attempt runs once more.
    template <class R, class Attempt> result<R> with_reclaim(Attempt&& attempt) {
        refusal refused;
        result<R> first = attempt(refused);
        if (first || refused.shortfall == 0) {
            return first;
        }
        if (!host_.offers_reclaim()) {
            return boost::outcome_v2::failure(exhausted(refused, "; the host offered no reclaim hook"));
        }
        // No lock is held here: the host may re-enter this plugin to satisfy the request.
        result<void> reclaimed = host_.request_reclaim(mechanism_id_, device_, refused.shortfall);
        if (!reclaimed) {
            return boost::outcome_v2::failure(
                exhausted(refused, "; the host was asked to reclaim " +
                                       std::to_string(refused.shortfall) + " bytes and did not (" +
                                       reclaimed.error().describe() + ")"));
        }
        refused = {};
        result<R> second = attempt(refused);
        if (second || refused.shortfall == 0) {
            return second;
        }
        return boost::outcome_v2::failure(
            exhausted(refused, " even after the host reclaimed memory"));
    }

private:
    error exhausted(const refusal& refused, const std::string& why) const {
        return error{status_code::out_of_memory,
                     std::string(mechanism_) + ": budget=" + std::to_string(*limit_) +
                         " bytes exceeded: " + std::to_string(refused.wanted) + " bytes asked, " +
                         std::to_string(in_use()) + " in use, " +
                         std::to_string(refused.shortfall) + " short" + why};
    }

    std::optional<std::uint64_t> limit_;
    std::atomic<std::uint64_t> used_{0};
    plugin::host_link host_;
    std::uint64_t mechanism_id_;
    device_id device_;
    const char* mechanism_;
};

} // namespace nxmem::plugin
