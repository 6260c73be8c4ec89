// Byte buffers for batch messages, kept for reuse. Fresh memory costs a page fault per page
// (about 2-3 µs each in the virtual machines measured here: a fresh 1 MiB buffer cost 0.8 ms),
// and UCX 1.13 sending by rendezvous from freshly allocated memory over cma stalled for
// milliseconds (4 replies of 1 MiB: 9.5 ms from fresh buffers, 0.29 ms from reused ones). Not
// thread-safe: the agent's lock guards it.
#pragma once

#include <cstddef>
#include <vector>

namespace nxmem::transfer::detail {

class staging_buffers {
public:
    // Buffers larger than this are not kept (a peer's oversized message is rare; keeping it would
    // hold its memory for good).
    static constexpr std::size_t largest_kept = std::size_t{2} << 20;
    static constexpr std::size_t kept = 16;

    // A buffer of `bytes` bytes, the smallest kept one that holds them where there is one
    // (its contents are then unspecified).
    std::vector<std::byte> take(std::size_t bytes) {
        std::size_t best = spares_.size();
        for (std::size_t i = 0; i < spares_.size(); ++i) {
            if (spares_[i].capacity() >= bytes &&
                (best == spares_.size() || spares_[i].capacity() < spares_[best].capacity())) {
                best = i;
            }
        }
        if (best == spares_.size()) {
            return std::vector<std::byte>(bytes);
        }
        std::vector<std::byte> buffer = std::move(spares_[best]);
        spares_[best] = std::move(spares_.back());
        spares_.pop_back();
        buffer.resize(bytes);
        return buffer;
    }

    // Gives a buffer back for reuse; when `kept` are kept already, it replaces the smallest of
    // them if it is larger (so a run of large messages after small ones reuses its buffers).
    void give(std::vector<std::byte>&& buffer) noexcept {
        if (buffer.capacity() == 0 || buffer.capacity() > largest_kept) {
            return;
        }
        if (spares_.size() < kept) {
            if (spares_.capacity() < kept) {
                try {
                    spares_.reserve(kept);
                } catch (...) {
                    return;
                }
            }
            spares_.push_back(std::move(buffer)); // within capacity: cannot throw
            return;
        }
        std::size_t smallest = 0;
        for (std::size_t i = 1; i < spares_.size(); ++i) {
            if (spares_[i].capacity() < spares_[smallest].capacity()) {
                smallest = i;
            }
        }
        if (spares_[smallest].capacity() < buffer.capacity()) {
            spares_[smallest] = std::move(buffer);
        }
    }

    std::size_t size() const noexcept { return spares_.size(); }
    std::size_t bytes_kept() const noexcept {
        std::size_t total = 0;
        for (const auto& spare : spares_) {
            total += spare.capacity();
        }
        return total;
    }

private:
    std::vector<std::vector<std::byte>> spares_;
};

} // namespace nxmem::transfer::detail
