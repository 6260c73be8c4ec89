// peer: a remote agent this one is connected to, and the regions it declared.
#pragma once

#include <nxmem/transfer/detail/agent_core.hpp>

#include <memory>

namespace nxmem::transfer {

class agent;

// A remote agent this one is connected to, and the regions it declared.
class peer {
public:
    peer() = default;
    peer(peer&&) noexcept = default;
    peer& operator=(peer&& other) noexcept {
        if (this != &other) {
            disconnect(false);
            core_ = std::move(other.core_);
            record_ = std::move(other.record_);
        }
        return *this;
    }
    ~peer() { disconnect(false); }

    explicit operator bool() const noexcept { return record_ != nullptr; }
    const std::string& name() const noexcept { return record_->name; }
    const agent_id& id() const noexcept { return record_->id; }
    // The peer's endpoint failed (it died, or the network did): every transfer with it fails.
    bool failed() const noexcept { return record_->failed.load(std::memory_order_acquire); }
    // Whether UCX reports this peer's death (false over shared memory alone, UCX 1.13): without
    // it a transfer with a dead peer ends by the caller's timeout and disconnect(true).
    bool detects_failure() const noexcept { return record_->detects_failure; }
    // Whether reads and writes with this peer go as batch messages (agent_options::path;
    // automatic: UCX has no RMA lane to it) rather than one get or put per block.
    bool uses_messages() const noexcept { return record_->uses_messages; }
    // Whether batch data with this peer goes by rendezvous, UCX moving it zero-copy between the
    // blocks themselves (its endpoint has a lane for it: cma over shared memory), rather than
    // packed into eager messages (tcp).
    bool uses_rendezvous() const noexcept { return record_->rendezvous; }

    // Takes the peer's region list (its export_regions bytes), replacing any loaded before.
    // Untrusted input: refused whole, naming the fault, unless every region is well formed, the
    // list is this peer's, and UCX accepts every key.
    result<void> load_regions(std::span<const std::byte> blob) { return core_->load_regions(*record_, blob); }
    // The regions loaded, in address order (each as one descriptor of its whole range).
    std::vector<descriptor> regions() const { return core_->regions_of(*record_); }

    // Closes the endpoint. Without force, UCX first finishes the transfers in flight with it
    // (their data arrives; a notification not yet sent fails). `force` is for a peer that is
    // gone: it does not wait for the peer, and where UCX cannot detect a death (shared memory)
    // the transfers in flight fail at once and let their registrations go — never force a live
    // peer with transfers in flight.
    void disconnect(bool force = false) noexcept {
        if (record_ != nullptr) {
            core_->close_peer(*record_, force);
            record_.reset();
            core_.reset();
        }
    }

private:
    friend class agent;
    peer(std::shared_ptr<detail::agent_core> core, std::shared_ptr<detail::peer_record> record)
        : core_(std::move(core)), record_(std::move(record)) {}
    std::shared_ptr<detail::agent_core> core_;
    std::shared_ptr<detail::peer_record> record_;
};

} // namespace nxmem::transfer
