// A KV-cache trace replay: sequences that share prompt prefixes, grow block by block as they
// decode, and finish in random order. One trace (seeded), two stores:
//   lazy_kv_store  posix-lazy through the host: each sequence reserves its longest length, maps
//                  its prompt's shared prefix (written once, by the first sequence that uses it),
//                  and commits one block per step
//   block_kv_store any DeviceAllocator of cpu memory (nxmem::heap_allocator, a pool): each
//                  sequence copies its prompt into blocks of its own and allocates one block per
//                  step
// Both write every block they add. The replay reports blocks per second (the writes included)
// and the peak resident and proportional set sizes; with a store that says what it holds
// (held_bytes() and live_bytes(), a pooled block store), the peaks of both as well.
#pragma once

#include <measure/system.hpp>

#include <nxmem/heap_allocator.hpp>
#include <nxmem/host.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace nxmem::bench {

struct kv_trace_shape {
    std::uint64_t block_bytes = 64 * 1024;
    unsigned prompts = 4;            // distinct prompt prefixes
    std::uint64_t prompt_blocks = 16; // blocks per prompt (1 MiB)
    std::uint64_t min_decode_blocks = 8;
    std::uint64_t max_decode_blocks = 48;
    unsigned sequences = 192;
    unsigned concurrent = 32;
    std::uint64_t seed = 42;

    std::uint64_t max_blocks() const noexcept { return prompt_blocks + max_decode_blocks; }
};

struct kv_replay_result {
    std::uint64_t blocks = 0;          // blocks of sequence content: each sequence's prompt, then one per step
    double seconds = 0;                // the replay, PSS sampling excluded
    std::uint64_t peak_rss = 0; // above what the process held when the replay began
    std::uint64_t peak_pss = 0; // the same, sampled every 8 steps
    std::uint64_t peak_held = 0; // the store's held_bytes() after each step, at most (0: not said)
    std::uint64_t peak_live = 0; // the store's live_bytes() after each step, at most
};

// Runs the trace against `store` (see the two stores below for what it must offer).
template <class Store> result<kv_replay_result> replay_kv_trace(Store& store, const kv_trace_shape& shape) {
    struct sequence {
        typename Store::sequence held;
        std::uint64_t length = 0; // blocks
        std::uint64_t target = 0;
    };
    std::mt19937_64 random(shape.seed);
    std::uniform_int_distribution<unsigned> pick_prompt(0, shape.prompts - 1);
    std::uniform_int_distribution<std::uint64_t> pick_decode(shape.min_decode_blocks, shape.max_decode_blocks);

    kv_replay_result outcome;
    // The process holds memory from before (other benchmarks, the heap's free lists): the peaks
    // are reported above the levels at the start.
    (void)measure::reset_peak_rss();
    const std::uint64_t rss_at_start = measure::rss_bytes().value_or(0);
    const std::uint64_t pss_at_start = measure::pss_bytes().value_or(0);
    std::uint64_t pss_peak = pss_at_start;
    std::vector<sequence> active;
    unsigned admitted = 0;
    std::chrono::duration<double> busy{0};
    unsigned step = 0;
    while (admitted < shape.sequences || !active.empty()) {
        const auto start = std::chrono::steady_clock::now();
        while (active.size() < shape.concurrent && admitted < shape.sequences) {
            NXMEM_TRY(held, store.start(pick_prompt(random)));
            outcome.blocks += shape.prompt_blocks;
            active.push_back({std::move(held), shape.prompt_blocks, shape.prompt_blocks + pick_decode(random)});
            ++admitted;
        }
        for (sequence& each : active) {
            NXMEM_TRY_VOID(store.grow(each.held, each.length));
            ++each.length;
            ++outcome.blocks;
        }
        // Those done finish in random order.
        std::shuffle(active.begin(), active.end(), random);
        for (auto done = active.begin(); done != active.end();) {
            if (done->length >= done->target) {
                NXMEM_TRY_VOID(store.finish(done->held));
                done = active.erase(done);
            } else {
                ++done;
            }
        }
        busy += std::chrono::steady_clock::now() - start;
        if constexpr (requires { store.held_bytes(); store.live_bytes(); }) {
            outcome.peak_held = std::max<std::uint64_t>(outcome.peak_held, store.held_bytes());
            outcome.peak_live = std::max<std::uint64_t>(outcome.peak_live, store.live_bytes());
        }
        if (++step % 8 == 0) {
            pss_peak = std::max(pss_peak, measure::pss_bytes().value_or(0));
        }
    }
    outcome.seconds = busy.count();
    const std::uint64_t rss_peak = measure::peak_rss_bytes().value_or(0);
    outcome.peak_rss = rss_peak > rss_at_start ? rss_peak - rss_at_start : 0;
    outcome.peak_pss = pss_peak - pss_at_start;
    return outcome;
}

// Writes a block as a decode step would.
inline void fill_block(std::uint64_t address, std::uint64_t bytes, std::uint64_t value) {
    std::memset(reinterpret_cast<void*>(address), static_cast<int>(value & 0xff), static_cast<std::size_t>(bytes));
}

class lazy_kv_store {
public:
    struct sequence {
        allocation<cpu_device> live;
    };

    static result<lazy_kv_store> open(host::plugin_allocator<cpu_device>& allocator, const kv_trace_shape& shape) {
        NXMEM_TRY(backing, allocator.virtual_backing());
        NXMEM_TRY(mapping, allocator.shared_mapping());
        lazy_kv_store made(allocator, std::move(backing), std::move(mapping), shape);
        for (unsigned p = 0; p < shape.prompts; ++p) {
            NXMEM_TRY(prefix, made.mapping_.create_prefix(shape.prompt_blocks * shape.block_bytes));
            made.prompts_.push_back({prefix, false});
        }
        return made;
    }
    lazy_kv_store(lazy_kv_store&&) = default;
    lazy_kv_store& operator=(lazy_kv_store&&) = delete;
    ~lazy_kv_store() {
        for (const prompt& each : prompts_) {
            (void)mapping_.release_prefix(each.prefix);
        }
    }

    result<sequence> start(unsigned prompt_index) {
        NXMEM_TRY(live, allocator_->allocate(shape_.max_blocks() * shape_.block_bytes, 4096));
        prompt& shared = prompts_[prompt_index];
        result<prefix_commit> mapped = mapping_.commit_prefix(live, shared.prefix);
        if (!mapped) {
            (void)allocator_->release(live);
            return std::move(mapped).error();
        }
        if (!shared.written) { // the prompt's prefill, done once for every sequence that shares it
            for (std::uint64_t b = 0; b < shape_.prompt_blocks; ++b) {
                fill_block(reinterpret_cast<std::uint64_t>(live.address) + b * shape_.block_bytes, shape_.block_bytes, b);
            }
            shared.written = true;
        }
        return sequence{live};
    }

    result<void> grow(sequence& held, std::uint64_t length) {
        NXMEM_TRY_VOID(backing_.commit(held.live, byte_range{length * shape_.block_bytes, shape_.block_bytes}));
        fill_block(reinterpret_cast<std::uint64_t>(held.live.address) + length * shape_.block_bytes,
                   shape_.block_bytes, length);
        return boost::outcome_v2::success();
    }
    result<void> finish(sequence& held) {
        NXMEM_TRY(released, allocator_->release(held.live));
        (void)released;
        return boost::outcome_v2::success();
    }

private:
    struct prompt {
        host::shared_prefix prefix;
        bool written = false;
    };
    lazy_kv_store(host::plugin_allocator<cpu_device>& allocator, host::virtual_backing_view<cpu_device> backing,
                  host::shared_mapping_view<cpu_device> mapping, const kv_trace_shape& shape)
        : allocator_(&allocator), backing_(std::move(backing)), mapping_(std::move(mapping)), shape_(shape) {}

    host::plugin_allocator<cpu_device>* allocator_;
    host::virtual_backing_view<cpu_device> backing_;
    host::shared_mapping_view<cpu_device> mapping_;
    kv_trace_shape shape_;
    std::vector<prompt> prompts_;
};

template <class Blocks> class block_kv_store {
public:
    struct sequence {
        std::vector<allocation<cpu_device>> blocks;
    };

    block_kv_store(Blocks& blocks, const kv_trace_shape& shape) : heap_(blocks), shape_(shape) {}

    // What a pool holds and hands out, where `Blocks` is one.
    std::uint64_t held_bytes() const
        requires requires(const Blocks& pool) { pool.usage(); }
    {
        return heap_.usage().held_bytes;
    }
    std::uint64_t live_bytes() const
        requires requires(const Blocks& pool) { pool.usage(); }
    {
        return heap_.usage().in_use_bytes;
    }

    result<sequence> start(unsigned /*prompt: every sequence copies its own*/) {
        sequence made;
        made.blocks.reserve(shape_.max_blocks());
        for (std::uint64_t b = 0; b < shape_.prompt_blocks; ++b) {
            NXMEM_TRY(block, heap_.allocate(shape_.block_bytes, 4096));
            fill_block(reinterpret_cast<std::uint64_t>(block.address), shape_.block_bytes, b);
            made.blocks.push_back(block);
        }
        return made;
    }

    result<void> grow(sequence& held, std::uint64_t length) {
        NXMEM_TRY(block, heap_.allocate(shape_.block_bytes, 4096));
        fill_block(reinterpret_cast<std::uint64_t>(block.address), shape_.block_bytes, length);
        held.blocks.push_back(block);
        return boost::outcome_v2::success();
    }
    result<void> finish(sequence& held) {
        for (const allocation<cpu_device>& block : held.blocks) {
            NXMEM_TRY(released, heap_.release(block));
            (void)released;
        }
        held.blocks.clear();
        return boost::outcome_v2::success();
    }

private:
    Blocks& heap_;
    kv_trace_shape shape_;
};

} // namespace nxmem::bench
