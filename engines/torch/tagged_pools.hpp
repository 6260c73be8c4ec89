// Tagged CPU tensors that sleep and wake (issue 33, docs/TORCH.md "Sleep and wake"): under a tag
// ("weights", "kv", ...) a thread's new tensors come from that tag's nxmem::resident_pool, which
// torch.ops.nxmem.sleep gives back (discarded, or backed up to host memory or a file) and
// torch.ops.nxmem.wake_up commits again at the same addresses. Untagged tensors take the
// installation's pool as before.
//
// * tagged_pools: the process's tags, each one resident_pool over a plugin allocator opened on the
//   installation's mechanism (it must offer virtual backing: posix-lazy), made on the tag's first
//   use and, like everything a tensor's deleter needs, never destroyed.
// * tagging_allocator: the c10::Allocator a pooled install over virtual backing makes PyTorch's.
//   It asks the calling thread's tag (use_tag; thread-local) and hands an untagged request to the
//   installation's adapter unchanged (a relaxed load until a tag was first chosen, then a
//   thread-local read too).
//
// A tagged tensor's deleter has its data pointer alone: each tag's pool has one reservation, so
// an address inside one is that tag's; what a pool hands out outside its reservation (requests
// above pool_options::pass_through_bytes, 256 MiB, are upstream allocations of their own, as are
// spans once the reservation's arena is full) is kept in a table by address. Nothing is limited
// by tensor size.
#pragma once

#include <nxmem/host.hpp>
#include <nxmem/pool.hpp>
#include <nxmem/residency.hpp>
#include <nxmem/torch/cpu_allocator.hpp>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nxmem::torch_engine {

using tag_figures = std::vector<std::pair<std::string, std::uint64_t>>;

// Where a tag's pool is opened: the installation's plugin, mechanism and options.
struct tag_source {
    std::shared_ptr<host::plugin_module> module;
    std::string mechanism;
    std::string options;
};

using resident_cpu_pool = resident_pool<host::plugin_allocator<cpu_device>>;

// One tag: its pool and the address range of the pool's reservation. Immortal.
struct tagged_pool {
    std::string tag;
    std::shared_ptr<resident_cpu_pool> pool;
    std::uint64_t begin = 0; // the reservation, [begin, end)
    std::uint64_t end = 0;
};

namespace tag_detail {
// The calling thread's tag (null: untagged), and whether any thread ever chose one: until then
// the untagged path reads no thread-local.
inline thread_local tagged_pool* current = nullptr;
inline std::atomic<bool> chosen_once{false};
} // namespace tag_detail

class tagged_pools {
public:
    // The most tags a process can have (each reserves pool_options::reserve_bytes, 64 GiB by
    // default, of address space, nothing of memory until used).
    static constexpr std::size_t max_tags = 64;

    static tagged_pools& get() {
        static tagged_pools* process = new tagged_pools; // immortal: deleters run until exit
        return *process;
    }

    // The pool of `tag`, made from `source` on the tag's first use. Throws c10::Error with the
    // reason when it cannot be made (the mechanism offers no virtual backing, no reservation, the
    // tag limit).
    tagged_pool& find_or_make(const std::string& tag, const tag_source& source) {
        std::lock_guard lock(make_lock_);
        if (tagged_pool* known = find_locked(tag)) {
            return *known;
        }
        const std::size_t made = count_.load(std::memory_order_relaxed);
        TORCH_CHECK(made < max_tags, "nxmem: cannot make a pool for tag '", tag, "': this process already has ",
                    max_tags, " tags, the most it can have");
        auto opened = host::open_allocator<cpu_device>(source.module, source.mechanism, 0, source.options);
        TORCH_CHECK(opened.has_value(), "nxmem: cannot make a pool for tag '", tag, "': cannot open '",
                    source.mechanism, "': ", opened.has_value() ? std::string() : opened.error().describe());
        auto backing = opened.value().virtual_backing();
        TORCH_CHECK(backing.has_value(), "nxmem: cannot make a pool for tag '", tag, "': mechanism '",
                    source.mechanism, "' offers no virtual backing, which sleeping at the same addresses needs (",
                    backing.has_value() ? std::string() : backing.error().describe(), "); install posix-lazy");
        auto pool = std::make_shared<resident_cpu_pool>(tag, pool_options{}, std::move(opened).value());
        auto entry = std::make_unique<tagged_pool>();
        entry->tag = tag;
        pool->for_each_region([&](const pool_region& region) {
            if (region.kind == pool_region_kind::reservation) {
                entry->begin = region.address;
                entry->end = region.address + region.bytes;
            }
        });
        TORCH_CHECK(pool->pool().grows_by_commit() && entry->end > entry->begin, "nxmem: cannot make a pool for tag '",
                    tag, "': '", source.mechanism, "' refused the pool's reservation of address space");
        entry->pool = std::move(pool);
        residency_.add(entry->pool);
        tagged_pool* published = entry.release(); // never deleted, as the pool it holds
        pools_[made].store(published, std::memory_order_release);
        count_.store(made + 1, std::memory_order_release);
        return *published;
    }

    tagged_pool* find(const std::string& tag) {
        std::lock_guard lock(make_lock_);
        return find_locked(tag);
    }

    std::vector<std::string> tags() const { return residency_.tags(); }

    // A tensor's memory from `tagged`'s pool. Refused (the tag asleep, no memory): c10::Error
    // with the pool's reason, OutOfMemoryError when the reason is memory.
    c10::DataPtr allocate(tagged_pool& tagged, std::size_t bytes) {
        if (bytes == 0) {
            return {nullptr, nullptr, &release_tagged, c10::Device(c10::DeviceType::CPU)};
        }
        auto granted = tagged.pool->allocate(bytes, pytorch::tensor_alignment);
        if (!granted.has_value()) [[unlikely]] {
            refuse_allocate(tagged, bytes, granted.error());
        }
        void* data = granted.value().address;
        const std::uint64_t wire = reinterpret_cast<std::uintptr_t>(data);
        if (wire < tagged.begin || wire >= tagged.end) [[unlikely]] {
            try {
                std::lock_guard lock(outside_lock_);
                outside_.emplace(wire, &tagged);
                outside_count_.store(outside_.size(), std::memory_order_release);
            } catch (const std::bad_alloc&) {
                (void)tagged.pool->release(granted.value());
                TORCH_CHECK_WITH(OutOfMemoryError, false, "nxmem: tag '", tagged.tag,
                                 "': no memory to record an allocation by its address");
            }
        }
        return {data, data, &release_tagged, c10::Device(c10::DeviceType::CPU)};
    }

    // The deleter of every tagged tensor.
    static void release_tagged(void* data) {
        if (data != nullptr && !get().release_if_tagged(data)) [[unlikely]] {
            get().failed_releases_.fetch_add(1, std::memory_order_relaxed);
        }
    }
    static bool is_tagged(const c10::DataPtr& data_ptr) noexcept {
        return data_ptr.get() != nullptr && data_ptr.get_deleter() == &release_tagged;
    }

    // Releases `data` when it is a tag's (true), a failed release counted; false when no tag
    // handed it out. A relaxed load and a return while no tag exists.
    bool release_if_tagged(void* data) noexcept {
        const std::size_t made = count_.load(std::memory_order_acquire);
        if (made == 0) [[likely]] {
            return false;
        }
        const std::uint64_t wire = reinterpret_cast<std::uintptr_t>(data);
        for (std::size_t index = 0; index < made; ++index) {
            tagged_pool* each = pools_[index].load(std::memory_order_acquire);
            if (wire >= each->begin && wire < each->end) {
                count_release(each->pool->release_by_address(data));
                return true;
            }
        }
        if (outside_count_.load(std::memory_order_acquire) == 0) {
            return false;
        }
        tagged_pool* owner = nullptr;
        {
            std::lock_guard lock(outside_lock_);
            if (auto found = outside_.find(wire); found != outside_.end()) {
                owner = found->second;
                outside_.erase(found);
                outside_count_.store(outside_.size(), std::memory_order_release);
            }
        }
        if (owner == nullptr) {
            return false;
        }
        count_release(owner->pool->release_by_address(data));
        return true;
    }

    // torch.ops.nxmem.sleep / wake_up: the tags (every one when empty); throws c10::Error with
    // the library's reason (an unknown tag, a policy it cannot read, a backup that failed).
    tag_figures sleep(std::span<const std::string> tags, const std::string& policy_text) {
        sleep_policy policy = sleep_policy::discard();
        TORCH_CHECK(parse_sleep_policy(policy_text, policy), "nxmem: sleep: the policy '", policy_text,
                    "' is none of discard, host, file:DIR");
        auto done = residency_.sleep(tags, policy);
        TORCH_CHECK(done.has_value(), "nxmem: sleep: ", done.has_value() ? std::string() : done.error().describe());
        return figures_of(done.value());
    }
    tag_figures wake(std::span<const std::string> tags) {
        auto done = residency_.wake(tags);
        TORCH_CHECK(done.has_value(), "nxmem: wake_up: ", done.has_value() ? std::string() : done.error().describe());
        return figures_of(done.value());
    }

    // One tag's figures (torch.ops.nxmem.residency); throws c10::Error for an unknown tag.
    tag_figures residency(const std::string& tag) {
        tagged_pool* tagged = find(tag);
        TORCH_CHECK(tagged != nullptr, "nxmem: residency: no resident pool has the tag '", tag, "'");
        const residency_usage now = tagged->pool->residency();
        return {{"state", static_cast<std::uint64_t>(now.state)},
                {"asleep_bytes", now.asleep_bytes},
                {"backed_up_bytes", now.backed_up_bytes},
                {"committed_bytes", now.committed_bytes},
                {"reserved_bytes", tagged->end - tagged->begin},
                {"pool_live_allocations", now.pool.live_allocations},
                {"pool_in_use_bytes", now.pool.in_use_bytes},
                {"pool_held_bytes", now.pool.held_bytes},
                {"pool_idle_bytes", now.pool.idle_bytes}};
    }

    // Every tag's idle memory back to the plugin (0 from a tag asleep).
    std::uint64_t trim() {
        std::uint64_t given_back = 0;
        const std::size_t made = count_.load(std::memory_order_acquire);
        for (std::size_t index = 0; index < made; ++index) {
            given_back += pools_[index].load(std::memory_order_acquire)->pool->trim(0);
        }
        return given_back;
    }

    std::uint64_t count() const noexcept { return count_.load(std::memory_order_acquire); }
    std::uint64_t failed_releases() const noexcept { return failed_releases_.load(std::memory_order_relaxed); }

private:
    tagged_pools() = default;
    ~tagged_pools() = default; // never runs

    tagged_pool* find_locked(const std::string& tag) const {
        const std::size_t made = count_.load(std::memory_order_acquire);
        for (std::size_t index = 0; index < made; ++index) {
            if (tagged_pool* each = pools_[index].load(std::memory_order_acquire); each->tag == tag) {
                return each;
            }
        }
        return nullptr;
    }

    void count_release(const result<release_report>& done) noexcept {
        if (!done.has_value()) [[unlikely]] {
            failed_releases_.fetch_add(1, std::memory_order_relaxed);
        }
    }

    [[noreturn, gnu::cold, gnu::noinline]] static void refuse_allocate(const tagged_pool& tagged, std::size_t bytes,
                                                                       const error& failure) {
        TORCH_CHECK_WITH(OutOfMemoryError, failure.code != status_code::out_of_memory, "nxmem: tag '", tagged.tag,
                         "' refused ", bytes, " bytes: ", failure.describe());
        TORCH_CHECK(false, "nxmem: tag '", tagged.tag, "' refused ", bytes, " bytes: ", failure.describe());
        std::abort(); // not reached
    }

    static tag_figures figures_of(const residency_report& report) {
        return {{"pools", report.pools},
                {"unchanged_pools", report.unchanged_pools},
                {"ranges", report.ranges},
                {"bytes", report.bytes},
                {"backed_up_bytes", report.backed_up_bytes},
                {"still_resident_bytes", report.still_resident_bytes}};
    }

    std::mutex make_lock_; // making a tag (and finding one by name)
    std::array<std::atomic<tagged_pool*>, max_tags> pools_{};
    std::atomic<std::size_t> count_{0};
    std::mutex outside_lock_;
    std::unordered_map<std::uint64_t, tagged_pool*> outside_; // allocations outside their pool's reservation
    std::atomic<std::size_t> outside_count_{0};
    std::atomic<std::uint64_t> failed_releases_{0};
    residency_tags residency_;
};

// The calling thread's tag becomes `tagged` (null: untagged); returns the previous tag's name
// ("" for untagged).
inline std::string choose_tag(tagged_pool* tagged) {
    std::string previous = tag_detail::current != nullptr ? tag_detail::current->tag : std::string();
    if (tagged != nullptr) {
        tag_detail::chosen_once.store(true, std::memory_order_relaxed);
    }
    tag_detail::current = tagged;
    return previous;
}

// PyTorch's CPU allocator for a pooled install over virtual backing: the calling thread's tag's
// pool, else the installation's adapter, whose path (and deleter) is unchanged. Immortal, as the
// adapter.
template <class Upstream> class tagging_allocator final : public c10::Allocator {
public:
    using adapter_type = pytorch::cpu_allocator<Upstream>;

    // Throws c10::Error once the process has as many as it can (one per adapter: never reached
    // before the adapter limit).
    static tagging_allocator& create(adapter_type& untagged) {
        const std::size_t slot = claimed_.fetch_add(1, std::memory_order_relaxed);
        TORCH_CHECK(slot < slot_count, "nxmem: cannot make another tagging allocator (", slot_count, " made)");
        auto* made = new tagging_allocator(untagged); // never deleted, by design
        slots_[slot].store(made, std::memory_order_release);
        made->raw_deleter_ = raw_deleter_in(slot);
        return *made;
    }

    tagging_allocator(const tagging_allocator&) = delete;
    tagging_allocator& operator=(const tagging_allocator&) = delete;

    c10::DataPtr allocate(std::size_t bytes) const override {
        if (tag_detail::chosen_once.load(std::memory_order_relaxed)) [[unlikely]] {
            if (tagged_pool* tagged = tag_detail::current; tagged != nullptr) {
                return tagged_pools::get().allocate(*tagged, bytes);
            }
        }
        return untagged_.allocate(bytes);
    }

    // c10's raw_allocate/raw_deallocate (oneDNN's scratch memory) hand back the data pointer
    // alone, tagged or not: a tag's pool takes back its own, the adapter the rest.
    c10::DeleterFnPtr raw_deleter() const override { return raw_deleter_; }

    adapter_type& untagged() const noexcept { return untagged_; }

private:
    static constexpr std::size_t slot_count = pytorch::cpu_allocator_limit;

    explicit tagging_allocator(adapter_type& untagged) : untagged_(untagged) {}
    ~tagging_allocator() = default; // never runs

    void release_raw(void* data) const {
        if (data != nullptr && !tagged_pools::get().release_if_tagged(data)) {
            untagged_.raw_deleter()(data);
        }
    }
    template <std::size_t Slot> static void release_raw_in(void* data) {
        slots_[Slot].load(std::memory_order_acquire)->release_raw(data);
    }
    template <std::size_t... Slots>
    static constexpr std::array<c10::DeleterFnPtr, sizeof...(Slots)> make_raw_deleters(std::index_sequence<Slots...>) {
        return {&release_raw_in<Slots>...};
    }
    static c10::DeleterFnPtr raw_deleter_in(std::size_t slot) noexcept {
        static constexpr std::array<c10::DeleterFnPtr, slot_count> deleters =
            make_raw_deleters(std::make_index_sequence<slot_count>{});
        return deleters[slot];
    }

    adapter_type& untagged_;
    c10::DeleterFnPtr raw_deleter_ = nullptr;
    static inline std::array<std::atomic<const tagging_allocator*>, slot_count> slots_{};
    static inline std::atomic<std::size_t> claimed_{0};
};

} // namespace nxmem::torch_engine
