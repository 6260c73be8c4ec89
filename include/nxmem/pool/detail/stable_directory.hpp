// An index -> object table whose objects never move: leaves of 2^LeafBits objects, made on demand
// and kept until the table is destroyed, reached through an array of atomic leaf pointers so a
// reader holding any index (a forged one included) reads a leaf or null, never a torn pointer.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace nxmem::pool_detail {

template <class T, std::size_t MaxLeaves, std::uint32_t LeafBits = 10> class stable_directory {
public:
    static constexpr std::uint32_t leaf_bits = LeafBits;
    static constexpr std::uint64_t leaf_size = std::uint64_t{1} << leaf_bits;
    static constexpr std::uint64_t capacity = leaf_size * MaxLeaves;

    stable_directory() = default;
    stable_directory(const stable_directory&) = delete;
    stable_directory& operator=(const stable_directory&) = delete;
    ~stable_directory() {
        for (auto& leaf : leaves_) {
            delete[] leaf.load(std::memory_order_relaxed);
        }
    }

    // The object at `index`, or null when its leaf was never made (or index is out of range).
    T* find(std::uint64_t index) const noexcept {
        if (index >= capacity) {
            return nullptr;
        }
        T* leaf = leaves_[index >> leaf_bits].load(std::memory_order_acquire);
        return leaf == nullptr ? nullptr : leaf + (index & (leaf_size - 1));
    }
    T& operator[](std::uint64_t index) const noexcept { return *find(index); }

    // Makes the leaf holding `index`; callers serialise it. Throws std::bad_alloc.
    void make_leaf_for(std::uint64_t index) {
        std::atomic<T*>& leaf = leaves_[index >> leaf_bits];
        if (leaf.load(std::memory_order_relaxed) == nullptr) {
            leaf.store(new T[leaf_size], std::memory_order_release);
        }
    }
    // Makes the leaves holding indices [first, end); false when the host has no memory for one
    // (those made stay).
    bool make_leaves_for(std::uint64_t first, std::uint64_t end) noexcept {
        try {
            for (std::uint64_t at = first; at < end; at += leaf_size) {
                make_leaf_for(at);
            }
            if (end != 0) {
                make_leaf_for(end - 1);
            }
        } catch (const std::bad_alloc&) {
            return false;
        }
        return true;
    }
    bool has_leaf_for(std::uint64_t index) const noexcept { return find(index) != nullptr; }

private:
    std::array<std::atomic<T*>, MaxLeaves> leaves_{};
};

} // namespace nxmem::pool_detail
