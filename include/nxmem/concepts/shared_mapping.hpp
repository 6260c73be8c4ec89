// SharedMapping: a reference-counted prefix (a KV-cache prefix, say) mapped into many allocations
// and costed once.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>

#include <concepts>
#include <cstdint>

namespace nxmem {

// What committing a prefix into an allocation cost.
struct prefix_commit {
    std::uint64_t shared_bytes = 0;       // the prefix's size
    std::uint64_t newly_mapped_bytes = 0; // non-zero only the first time the prefix is mapped
    std::uint64_t sharers = 0;            // allocations now sharing the prefix
};

// "the mapping names the device type it serves and its prefix handle type"
template <class S>
concept mapping_names_its_types = requires {
    typename S::device_type;
    typename S::prefix_type;
} && Device<typename S::device_type> && std::copyable<typename S::prefix_type>;

// "the mapping creates, retains and releases reference-counted prefixes"
template <class S>
concept mapping_counts_prefix_references = mapping_names_its_types<S> &&
    requires(S& mapping, std::uint64_t size, const typename S::prefix_type& prefix) {
        { mapping.create_prefix(size) } -> std::same_as<result<typename S::prefix_type>>;
        { mapping.retain_prefix(prefix) } -> std::same_as<result<void>>;
        { mapping.release_prefix(prefix) } -> std::same_as<result<void>>;
    };

// "the mapping maps a prefix into the start of an allocation"
template <class S>
concept mapping_commits_prefixes = mapping_names_its_types<S> &&
    requires(S& mapping, const allocation<typename S::device_type>& live,
             const typename S::prefix_type& prefix) {
        { mapping.commit_prefix(live, prefix) } -> std::same_as<result<prefix_commit>>;
    };

template <class S>
concept SharedMapping = mapping_names_its_types<S> && mapping_counts_prefix_references<S> &&
                        mapping_commits_prefixes<S>;

template <class S> constexpr bool assert_shared_mapping() {
    static_assert(mapping_names_its_types<S>,
                  "a SharedMapping names `device_type` (a Device tag) and a copyable `prefix_type`");
    static_assert(mapping_counts_prefix_references<S>,
                  "a SharedMapping creates, retains and releases prefixes: `result<prefix_type> "
                  "create_prefix(size)`, `result<void> retain_prefix(const prefix_type&)`, "
                  "`result<void> release_prefix(const prefix_type&)`");
    static_assert(mapping_commits_prefixes<S>,
                  "a SharedMapping maps prefixes: `result<prefix_commit> commit_prefix(const "
                  "allocation<D>&, const prefix_type&)`");
    return SharedMapping<S>;
}

} // namespace nxmem
