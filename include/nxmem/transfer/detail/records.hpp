// The transfer layer's shared records: a local registration, a peer and its regions, a transfer
// in flight. Owned by the agent's core (shared with the handles the engine holds); every field
// a UCX callback touches is atomic or guarded by the core's lock, under which UCX is progressed.
#pragma once

#include <nxmem/host/registration_lease.hpp>
#include <nxmem/transfer/descriptor.hpp>

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace nxmem::transfer {

// An agent's identity on the wire: 16 random bytes drawn when it starts, so region lists and
// notifications name the agent they belong to.
using agent_id = std::array<std::uint8_t, 16>;

namespace detail {

inline std::string ucx_text(ucs_status_t status) { return ucs_status_string(status); }

// One registered range of local memory.
struct registration_record {
    std::uint64_t id = 0;
    std::uint64_t base = 0;
    std::uint64_t length = 0;
    memory_kind kind = memory_kind::host;
    std::uint32_t device = 0;
    bool remote_writable = true; // false for a read-only import: peers may only read it
    bool local_writable = true;  // false for a read-only import: never the target of a read
    // Parts of it may be uncommitted (PROT_NONE): a pool's reservation, an allocation of a
    // mechanism with virtual backing, an import. A batch naming it is served only once the kernel
    // says every page named is there (page_probe).
    bool probe_pages = false;
    ucp_mem_h memh = nullptr;
    std::vector<std::byte> packed_key;
    host::registration_lease lease; // empty for memory the engine registers on its own say-so
    // A pool's registration: the pool and its lease, shared by the pool's registrations. The
    // lease is declared after the pool so it ends first (a lease must end before its pool).
    std::shared_ptr<void> pool_owner;
    std::shared_ptr<void> pool_keeper;
    std::atomic<std::uint64_t> in_flight{0}; // transfers using it now
    bool deregistered = false;              // under the core's lock
    bool release_when_idle = false;         // its handle went while transfers used it
    mutable bool exported = false;          // under the core's lock: in a region list handed out

    bool contains(std::uint64_t address, std::uint64_t bytes) const noexcept {
        return address >= base && bytes <= length && address - base <= length - bytes;
    }
};

// One region a peer declared, with its unpacked key.
struct remote_region {
    std::uint64_t id = 0;
    std::uint64_t base = 0;
    std::uint64_t length = 0;
    memory_kind kind = memory_kind::host;
    std::uint32_t device = 0;
    bool writable = true;
    ucp_rkey_h key = nullptr;

    bool contains(std::uint64_t address, std::uint64_t bytes) const noexcept {
        return address >= base && bytes <= length && address - base <= length - bytes;
    }
};

struct peer_record {
    agent_id id{};
    std::string name;
    ucp_ep_h endpoint = nullptr;
    std::atomic<bool> failed{false};
    std::atomic<int> failure{UCS_OK}; // the status UCX reported when it failed
    bool closed = false;              // under the core's lock: no new transfer
    bool close_posted = false;        // under the core's lock: its endpoint's close is under way
    bool detects_failure = true;      // UCX reports its death (not over shared memory alone)
    bool uses_messages = false; // requests go as batch messages
    bool rendezvous = false;    // their data may go by rendezvous (the endpoint has a zero-copy lane)
    std::uint64_t message_bytes_in_flight = 0; // under the core's lock: batch data sent, unanswered
    std::vector<remote_region> regions; // under the core's lock
    // Under the core's lock: the keys of regions replaced or dropped while UCX may still hold a
    // request naming them, destroyed once `transfers_in_ucx` is 0 (or with the worker).
    std::vector<ucp_rkey_h> retired_keys;
    std::uint64_t transfers_in_ucx = 0; // transfers with this peer whose requests UCX still holds
};

enum class transfer_phase : int { issuing, notifying, done };

struct transfer_state {
    std::atomic<std::uint32_t> outstanding{1}; // the issuing pass holds one until it has issued all
    std::atomic<int> error{UCS_OK};           // the first failure
    std::atomic<transfer_phase> phase{transfer_phase::issuing};
    // Finished by a forced disconnect of a peer whose death UCX cannot report: UCX may still
    // hold its requests, so the record outlives them (the core keeps it until the worker goes).
    std::atomic<bool> abandoned{false};
    bool requests_returned = false; // under the core's lock: UCX gave back every get, put and flush
    std::vector<std::shared_ptr<registration_record>> pinned; // each counted in its in_flight
    std::shared_ptr<peer_record> peer;
    std::vector<std::byte> notification; // sent once the data is in place, when not empty
    std::uint64_t blocks = 0;
    std::uint64_t bytes = 0;
    std::mutex done_mutex;
    std::condition_variable done_signal;

    void record_error(ucs_status_t status) noexcept {
        int expected = UCS_OK;
        error.compare_exchange_strong(expected, status);
    }
    bool finished() const noexcept { return phase.load(std::memory_order_acquire) == transfer_phase::done; }
    // Called once, under the core's lock: drops the pins and wakes waiters (allocates nothing).
    void finish() noexcept {
        if (finished()) {
            return;
        }
        for (auto& record : pinned) {
            record->in_flight.fetch_sub(1, std::memory_order_acq_rel);
        }
        pinned.clear();
        {
            std::lock_guard lock(done_mutex);
            phase.store(transfer_phase::done, std::memory_order_release);
        }
        done_signal.notify_all();
    }
};

} // namespace detail
} // namespace nxmem::transfer
