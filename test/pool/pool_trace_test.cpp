// A randomised trace of mixed sizes and alignments against a reference model (RapidCheck, fixed
// seed and bounded runs through RC_PARAMS in test/pool/meson.build): allocations never overlap,
// every byte of every live allocation is usable (host memory: a pattern written at allocate is
// intact at release), refused releases (twice, misdescribed) leave the pool unchanged, usage
// agrees with the model, and after releasing everything trim(0) leaves the upstream holding
// nothing. Over an upstream with virtual backing (growth by commit: the span arena), what the
// pool holds is what the upstream has committed at every step, and memory trimmed in the middle
// of the trace and handed out again is writable (it is PROT_NONE unless committed again).
// Then the PyTorch traces replayed through a pool growing either way.
#include "test_upstreams.hpp"

#include <nxmem/pool.hpp>

#include <catch2/catch.hpp>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

enum class step_kind : int { allocate, release, release_by_address, release_twice, misdescribe, trim };

struct step {
    step_kind kind = step_kind::allocate;
    std::uint64_t size = 1;
    std::uint64_t alignment = 1;
    std::size_t pick = 0; // which live allocation
};

rc::Gen<std::uint64_t> sizes() {
    return rc::gen::weightedOneOf<std::uint64_t>({
        {6, rc::gen::inRange<std::uint64_t>(1, 129)},
        {6, rc::gen::inRange<std::uint64_t>(129, 16 * 1024 + 1)},
        {3, rc::gen::inRange<std::uint64_t>(16 * 1024 + 1, 600 * 1024)},
        // Spans of a few whole sizes, so freed pieces are split for smaller ones and merged again
        // (trim(0) at the end giving everything back proves every segment merged whole).
        {4, rc::gen::map(rc::gen::inRange<std::uint64_t>(1, 9), [](std::uint64_t k) { return k * 64 * 1024; })},
        {1, rc::gen::inRange<std::uint64_t>(1024 * 1024, 3 * 1024 * 1024)}, // some pass through
    });
}
rc::Gen<std::uint64_t> alignments() {
    return rc::gen::map(rc::gen::weightedOneOf<int>({{8, rc::gen::inRange(0, 7)},
                                                     {3, rc::gen::inRange(7, 13)},
                                                     {1, rc::gen::inRange(13, 18)}}),
                        [](int log2) { return std::uint64_t{1} << log2; });
}
rc::Gen<step> steps() {
    return rc::gen::build<step>(
        rc::gen::set(&step::kind, rc::gen::weightedOneOf<step_kind>({
                                      {10, rc::gen::just(step_kind::allocate)},
                                      {5, rc::gen::just(step_kind::release)},
                                      {2, rc::gen::just(step_kind::release_by_address)},
                                      {1, rc::gen::just(step_kind::release_twice)},
                                      {1, rc::gen::just(step_kind::misdescribe)},
                                      {1, rc::gen::just(step_kind::trim)},
                                  })),
        rc::gen::set(&step::size, sizes()), rc::gen::set(&step::alignment, alignments()),
        rc::gen::set(&step::pick, rc::gen::inRange<std::size_t>(0, 1 << 20)));
}

template <class Upstream> void run_trace(const std::vector<step>& trace) {
    using D = typename Upstream::device_type;
    constexpr bool host_memory = std::is_same_v<D, cpu_device> && !std::is_same_v<Upstream, test::inaccessible_upstream>;
    constexpr bool by_commit = std::is_same_v<Upstream, test::committing_upstream>;
    pool_options options;
    options.pass_through_bytes = 1024 * 1024;
    options.chunk_bytes = 1024 * 1024;
    options.reserve_bytes = 256 * 1024 * 1024;
    Upstream upstream;
    auto ledger = upstream.ledger();
    {
        pool_allocator<Upstream> pool(upstream, options);
        RC_ASSERT(pool.grows_by_commit() == by_commit);
        struct modelled {
            allocation<D> live;
            unsigned char pattern;
        };
        std::map<std::uint64_t, modelled> by_address; // the model: live allocations by start
        std::uint64_t in_use = 0;
        unsigned char next_pattern = 1;
        auto pattern_intact = [&](const modelled& entry) {
            if constexpr (host_memory) {
                const auto* bytes = static_cast<const unsigned char*>(entry.live.address);
                for (std::uint64_t i = 0; i < entry.live.size; ++i) {
                    if (bytes[i] != entry.pattern) {
                        return false;
                    }
                }
            }
            return true;
        };
        auto pick = [&](std::size_t which) {
            auto chosen = by_address.begin();
            std::advance(chosen, static_cast<std::ptrdiff_t>(which % by_address.size()));
            return chosen;
        };
        std::vector<allocation<D>> released;
        for (const step& next : trace) {
            switch (next.kind) {
            case step_kind::allocate: {
                auto made = pool.allocate(next.size, next.alignment);
                RC_ASSERT(made.has_value());
                const allocation<D> live = made.value();
                const std::uint64_t start = D::to_wire(live.address);
                RC_ASSERT(start % next.alignment == 0);
                RC_ASSERT(live.size == next.size);
                RC_ASSERT(live.alignment == next.alignment);
                // No overlap with the live neighbours on either side.
                auto after = by_address.lower_bound(start);
                if (after != by_address.end()) {
                    RC_ASSERT(start + live.size <= after->first);
                }
                if (after != by_address.begin()) {
                    const auto& before = std::prev(after)->second.live;
                    RC_ASSERT(D::to_wire(before.address) + before.size <= start);
                }
                modelled entry{live, next_pattern++};
                if (next_pattern == 0) {
                    next_pattern = 1;
                }
                if constexpr (host_memory) {
                    std::memset(live.address, entry.pattern, live.size);
                }
                by_address.emplace(start, entry);
                in_use += live.size;
                break;
            }
            case step_kind::release:
            case step_kind::release_by_address: {
                if (by_address.empty()) {
                    break;
                }
                auto chosen = pick(next.pick);
                RC_ASSERT(pattern_intact(chosen->second));
                const allocation<D> live = chosen->second.live;
                auto report = next.kind == step_kind::release ? pool.release(live)
                                                                : pool.release_by_address(live.address);
                RC_ASSERT(report.has_value());
                in_use -= live.size;
                by_address.erase(chosen);
                released.push_back(live);
                break;
            }
            case step_kind::release_twice: {
                if (released.empty()) {
                    break;
                }
                const pool_usage before = pool.usage();
                const allocation<D>& stale = released[next.pick % released.size()];
                auto again = pool.release(stale);
                RC_ASSERT(!again.has_value());
                RC_ASSERT(again.error().code == status_code::unknown_allocation);
                RC_ASSERT(pool.usage() == before);
                break;
            }
            case step_kind::misdescribe: {
                if (by_address.empty()) {
                    break;
                }
                const pool_usage before = pool.usage();
                allocation<D> wrong = pick(next.pick)->second.live;
                wrong.size += 1;
                auto refused = pool.release(wrong);
                RC_ASSERT(!refused.has_value());
                RC_ASSERT(refused.error().code == status_code::invalid_argument);
                RC_ASSERT(pool.usage() == before);
                break;
            }
            case step_kind::trim:
                pool.trim(next.pick % 2 == 0 ? 0 : next.size);
                break;
            }
            const pool_usage now = pool.usage();
            RC_ASSERT(now.live_allocations == by_address.size());
            RC_ASSERT(now.in_use_bytes == in_use);
            RC_ASSERT(now.held_bytes >= now.idle_bytes);
            if constexpr (by_commit) {
                RC_ASSERT(now.held_bytes == upstream.commits->committed_bytes);
            }
        }
        for (auto& [start, entry] : by_address) {
            RC_ASSERT(pattern_intact(entry));
            RC_ASSERT(pool.release(entry.live).has_value());
        }
        pool.trim(0);
        RC_ASSERT(pool.usage().held_bytes == 0);
        if constexpr (by_commit) {
            RC_ASSERT(upstream.commits->committed_bytes == 0u);
            RC_ASSERT(ledger->live_count() == 1u); // the reservation, kept while the pool lives
        } else {
            RC_ASSERT(ledger->live_count() == 0u);
        }
    }
    RC_ASSERT(ledger->live_count() == 0u);
    RC_ASSERT(ledger->bad_releases == 0u);
}

} // namespace

TEST_CASE("a random trace against the model: host memory, every byte usable", "[pool][trace]") {
    rc::prop("pool over host memory agrees with the model",
             [] { run_trace<test::heap_upstream>(*rc::gen::container<std::vector<step>>(steps())); });
}

TEST_CASE("a random trace against the model: growth by commit, trimmed in between and committed again", "[pool][trace]") {
    rc::prop("pool growing by commit agrees with the model and with what the upstream committed",
             [] { run_trace<test::committing_upstream>(*rc::gen::container<std::vector<step>>(steps())); });
}

TEST_CASE("a random trace against the model: memory the host cannot touch", "[pool][trace]") {
    rc::prop("pool over PROT_NONE memory agrees with the model",
             [] { run_trace<test::inaccessible_upstream>(*rc::gen::container<std::vector<step>>(steps())); });
    rc::prop("pool over a fake device agrees with the model",
             [] { run_trace<test::fake_device_upstream>(*rc::gen::container<std::vector<step>>(steps())); });
}

namespace {

struct trace_event {
    bool allocate;
    std::size_t id;
    std::uint64_t size;
};

std::vector<trace_event> read_trace(const std::string& variable) {
    const char* path = std::getenv(variable.c_str());
    INFO(variable);
    REQUIRE(path != nullptr); // test/pool/meson.build sets it
    std::ifstream file(path);
    REQUIRE(file.good());
    std::vector<trace_event> events;
    for (std::string line; std::getline(file, line);) {
        if (line.empty() || line[0] == '#') {
            continue;
        }
        std::istringstream fields(line);
        char kind = 0;
        trace_event next{false, 0, 0};
        fields >> kind; // bench/traces/README.md: "a SIZE ID" or "f ID"
        next.allocate = kind == 'a';
        if (next.allocate) {
            fields >> next.size;
        }
        fields >> next.id;
        REQUIRE(fields);
        events.push_back(next);
    }
    REQUIRE(events.size() > 100);
    return events;
}

struct replay_figures {
    std::uint64_t peak_live = 0;
    std::uint64_t peak_held = 0;
    std::uint64_t upstream_calls_after_first_pass = 0; // allocations and commits
};

// Replays `events` four times through `pool` (each pass's leftovers released at its end).
template <class Pool> replay_figures replay(Pool& pool, const std::vector<trace_event>& events) {
    std::size_t ids = 0;
    for (const trace_event& next : events) {
        ids = std::max(ids, next.id + 1);
    }
    std::vector<std::optional<allocation<cpu_device>>> live(ids);
    replay_figures figures;
    std::uint64_t live_bytes = 0;
    auto upstream_calls = [&] { return pool.usage().upstream_allocations + pool.usage().upstream_commits; };
    for (int pass = 0; pass < 4; ++pass) {
        const std::uint64_t calls_before = upstream_calls();
        for (const trace_event& next : events) {
            if (next.allocate) {
                auto made = pool.allocate(next.size, 64);
                REQUIRE(made.has_value());
                live[next.id] = made.value();
                live_bytes += next.size;
            } else {
                REQUIRE(pool.release(*live[next.id]));
                live_bytes -= live[next.id]->size;
                live[next.id].reset();
            }
            figures.peak_live = std::max(figures.peak_live, live_bytes);
            figures.peak_held = std::max(figures.peak_held, pool.usage().held_bytes);
        }
        for (auto& left : live) {
            if (left.has_value()) {
                REQUIRE(pool.release(*left));
                live_bytes -= left->size;
                left.reset();
            }
        }
        if (pass > 0) {
            figures.upstream_calls_after_first_pass += upstream_calls() - calls_before;
        }
    }
    return figures;
}

} // namespace

// The host allocations of PyTorch passes (bench/traces/: a transformer forward pass, 4 B to 8 MiB,
// most 2 MiB, peak live 24 MiB; a training step, peak live 184 MiB), replayed pass after pass.
// Growing by commit, spans are pieces of one arena: free pieces merge across what were separate
// requests and the top grows in place, so the pool holds at most 1.3x the bytes live at once
// (the 2 MiB chunk of small blocks included), and after the first pass it calls the upstream no
// more.
TEST_CASE("the PyTorch traces over growth by commit: peak held at most 1.3x peak live, no upstream call after the first pass", "[pool][trace]") {
    const std::string variable = GENERATE(as<std::string>{}, "NXMEM_TRANSFORMER_TRACE", "NXMEM_TRAIN_STEP_TRACE");
    INFO("trace " << variable);
    const std::vector<trace_event> events = read_trace(variable);
    test::committing_upstream upstream;
    auto commits = upstream.commits;
    pool_options options;
    options.reserve_bytes = 1ull << 30; // an arena of 512 MiB
    pool_allocator pool(upstream, options);
    REQUIRE(pool.grows_by_commit());
    const replay_figures figures = replay(pool, events);
    INFO("peak held " << figures.peak_held << " bytes, peak live " << figures.peak_live << " bytes");
    CHECK(figures.peak_held * 10 <= figures.peak_live * 13);
    CHECK(figures.upstream_calls_after_first_pass == 0);
    CHECK(pool.usage().held_bytes == commits->committed_bytes);
    pool.trim(0);
    CHECK(pool.usage().held_bytes == 0);
    CHECK(commits->committed_bytes == 0);
}

// The same, growing by allocation: a span is a piece of a segment, one upstream allocation made
// for a request no free piece could serve, so free pieces merge only inside their segment and
// long-lived tensors land in holes of larger segments that cannot grow in place. The pool holds
// at most 1.6x peak live here (docs/HOST.md "Pools" gives both modes' figures); it held 2.43x
// when each span was cached by its size bin.
TEST_CASE("the PyTorch traces over growth by allocation: peak held at most 1.6x peak live, no upstream call after the first pass", "[pool][trace]") {
    const std::string variable = GENERATE(as<std::string>{}, "NXMEM_TRANSFORMER_TRACE", "NXMEM_TRAIN_STEP_TRACE");
    INFO("trace " << variable);
    const std::vector<trace_event> events = read_trace(variable);
    pool_allocator pool(test::heap_upstream{});
    REQUIRE_FALSE(pool.grows_by_commit());
    const replay_figures figures = replay(pool, events);
    INFO("peak held " << figures.peak_held << " bytes, peak live " << figures.peak_live << " bytes");
    CHECK(figures.peak_held * 10 <= figures.peak_live * 16);
    CHECK(figures.upstream_calls_after_first_pass == 0);
    pool.trim(0);
    CHECK(pool.usage().held_bytes == 0);
}
