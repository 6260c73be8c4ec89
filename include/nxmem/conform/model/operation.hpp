// One step of a model-check sequence and RapidCheck's generator for it. A step names its objects
// by pick (the allocator, allocation or prefix at that index among the live ones, modulo their
// number), so every generated sequence is valid in every state and a shrunk sequence still
// replays: a pick with nothing to pick becomes a step that does nothing.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>

namespace nxmem::conform::model {

enum class step_kind : std::uint8_t {
    open_allocator,
    retain_allocator,
    release_allocator,
    allocate,
    deallocate,
    release_allocation,
    commit,
    decommit,
    create_prefix,
    retain_prefix,
    release_prefix,
    map_prefix,
    enqueue_release,
    drain_releases,
    query,
};

inline const char* step_kind_name(step_kind kind) {
    switch (kind) {
    case step_kind::open_allocator: return "open_allocator";
    case step_kind::retain_allocator: return "retain";
    case step_kind::release_allocator: return "release";
    case step_kind::allocate: return "allocate";
    case step_kind::deallocate: return "deallocate";
    case step_kind::release_allocation: return "release_allocation";
    case step_kind::commit: return "commit";
    case step_kind::decommit: return "decommit";
    case step_kind::create_prefix: return "create_shared_prefix";
    case step_kind::retain_prefix: return "retain_shared_prefix";
    case step_kind::release_prefix: return "release_shared_prefix";
    case step_kind::map_prefix: return "commit_shared_prefix";
    case step_kind::enqueue_release: return "enqueue_release";
    case step_kind::drain_releases: return "drain_releases";
    case step_kind::query: return "query_usage and NxmemQueryUnloadReadiness";
    }
    return "?";
}

struct operation {
    step_kind kind = step_kind::query;
    unsigned allocator = 0;  // pick among the open allocators
    unsigned object = 0;     // pick among its allocations (or prefixes)
    unsigned other = 0;      // a second pick: the prefix to map, a size or range start
    unsigned shape = 0;      // an alignment or a range length
    unsigned misuse = 0;     // 0: a well-formed call; else which misuse (modulo the step's list)
    unsigned wire = 0;       // 0: structs of this header's size; else which struct_size (modulo)

    friend std::ostream& operator<<(std::ostream& out, const operation& step) {
        out << step_kind_name(step.kind) << "(allocator " << step.allocator << ", object "
            << step.object << ", pick " << step.other << ", shape " << step.shape;
        if (step.misuse != 0) {
            out << ", misuse " << step.misuse;
        }
        if (step.wire != 0) {
            out << ", struct_size pick " << step.wire;
        }
        return out << ")";
    }
};

// Mostly well-formed steps; misuse and unusual struct sizes about one step in six each.
inline rc::Gen<operation> generate_operation() {
    using kind = step_kind;
    const auto rare = [](unsigned high) {
        return rc::gen::weightedOneOf<unsigned>({{5, rc::gen::just(0u)}, {1, rc::gen::inRange(1u, high)}});
    };
    return rc::gen::map(
        rc::gen::tuple(rc::gen::weightedElement<kind>({{2, kind::open_allocator},
                                                       {1, kind::retain_allocator},
                                                       {2, kind::release_allocator},
                                                       {10, kind::allocate},
                                                       {4, kind::deallocate},
                                                       {4, kind::release_allocation},
                                                       {7, kind::commit},
                                                       {4, kind::decommit},
                                                       {3, kind::create_prefix},
                                                       {2, kind::retain_prefix},
                                                       {3, kind::release_prefix},
                                                       {4, kind::map_prefix},
                                                       {4, kind::enqueue_release},
                                                       {3, kind::drain_releases},
                                                       {4, kind::query}}),
                       rc::gen::inRange(0u, 4u), rc::gen::inRange(0u, 16u), rc::gen::inRange(0u, 16u),
                       rc::gen::inRange(0u, 16u), rare(16u), rare(16u)),
        [](const std::tuple<kind, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned>& drawn) {
            operation step;
            std::tie(step.kind, step.allocator, step.object, step.other, step.shape, step.misuse,
                     step.wire) = drawn;
            return step;
        });
}

} // namespace nxmem::conform::model
