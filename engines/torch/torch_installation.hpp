// What torch.ops.nxmem does, in C++: open a plugin mechanism (pooled or direct), wrap it in an
// immortal nxmem::pytorch::cpu_allocator and make that PyTorch's CPU allocator; pooled over
// virtual backing (posix-lazy), tagged tensors that sleep and wake (tagged_pools.hpp). Shared by
// the loadable module, its C++ tests and bench/torch.
#pragma once

#include "tagged_pools.hpp"

#include <nxmem/committing_allocator.hpp>
#include <nxmem/host.hpp>
#include <nxmem/host/pooled_allocator.hpp>
#include <nxmem/pool.hpp>
#include <nxmem/torch/cpu_allocator.hpp>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::torch_engine {

using usage_figures = std::vector<std::pair<std::string, std::uint64_t>>;

// One installed allocator. Immortal, like the adapter it wraps.
class installed_allocator {
public:
    virtual c10::Allocator& allocator() noexcept = 0;
    virtual bool owns(const c10::DataPtr& data_ptr) const noexcept = 0;
    virtual usage_figures usage() const = 0;
    virtual std::uint64_t trim() = 0;
    virtual const std::shared_ptr<host::plugin_module>& module() const noexcept = 0;
    // Where its tags' pools are opened; null when it serves no tags (not pooled, or its
    // mechanism offers no virtual backing).
    virtual const tag_source* tags() const noexcept { return nullptr; }

protected:
    ~installed_allocator() = default;
};

namespace detail {

inline usage_figures plugin_usage(const host::plugin_allocator<cpu_device>& plugin) {
    auto usage = plugin.query_usage();
    allocator_usage figures = usage ? usage.value() : allocator_usage{};
    return {{"plugin_live_allocations", figures.live_allocations},
            {"plugin_reserved_bytes", figures.reserved_bytes},
            {"plugin_mapped_bytes", figures.mapped_bytes}};
}

template <class Upstream> class installed : public installed_allocator {
public:
    installed(std::shared_ptr<Upstream> upstream, host::plugin_allocator<cpu_device>& plugin)
        : adapter_(pytorch::cpu_allocator<Upstream>::create(std::move(upstream))), plugin_(plugin) {}

    c10::Allocator& allocator() noexcept override { return adapter_; }
    bool owns(const c10::DataPtr& data_ptr) const noexcept override { return adapter_.owns(data_ptr); }
    const std::shared_ptr<host::plugin_module>& module() const noexcept override {
        return plugin_.module();
    }

    usage_figures usage() const override {
        usage_figures figures = plugin_usage(plugin_);
        figures.emplace_back("pooled", is_pool ? 1 : 0);
        if constexpr (is_pool) {
            const pool_usage pooled = adapter_.upstream().usage();
            figures.emplace_back("pool_live_allocations", pooled.live_allocations);
            figures.emplace_back("pool_in_use_bytes", pooled.in_use_bytes);
            figures.emplace_back("pool_held_bytes", pooled.held_bytes);
            figures.emplace_back("pool_idle_bytes", pooled.idle_bytes);
        }
        figures.emplace_back("failed_releases", adapter_.failed_releases());
        return figures;
    }

    std::uint64_t trim() override {
        if constexpr (is_pool) {
            return adapter_.upstream().trim(0);
        } else {
            return 0;
        }
    }

protected:
    static constexpr bool is_pool = pytorch::releases_by_address<Upstream>;
    pytorch::cpu_allocator<Upstream>& adapter_;
    host::plugin_allocator<cpu_device>& plugin_; // inside the upstream, which the adapter keeps
};

// A pooled installation over virtual backing: PyTorch's allocator is a tagging_allocator in
// front of the adapter, so a thread's tensors can go to a tag's resident pool.
class tagging_installed final : public installed<host::pooled_plugin_allocator<cpu_device>> {
public:
    using pool_type = host::pooled_plugin_allocator<cpu_device>;
    tagging_installed(std::shared_ptr<pool_type> upstream, host::plugin_allocator<cpu_device>& plugin, tag_source source)
        : installed(std::move(upstream), plugin), tagging_(tagging_allocator<pool_type>::create(adapter_)),
          source_(std::move(source)) {}

    c10::Allocator& allocator() noexcept override { return tagging_; }
    bool owns(const c10::DataPtr& data_ptr) const noexcept override {
        return installed::owns(data_ptr) || tagged_pools::is_tagged(data_ptr);
    }
    usage_figures usage() const override {
        usage_figures figures = installed::usage();
        figures.emplace_back("tags", tagged_pools::get().count());
        figures.emplace_back("tag_failed_releases", tagged_pools::get().failed_releases());
        return figures;
    }
    const tag_source* tags() const noexcept override { return &source_; }

private:
    tagging_allocator<pool_type>& tagging_;
    tag_source source_;
};

[[noreturn]] inline void refuse(const std::string& what, const error& failure) {
    TORCH_CHECK(false, "nxmem: ", what, ": ", failure.describe());
    std::abort(); // not reached
}

} // namespace detail

// The process's installations, oldest first. Every member is immortal; `current` is the one
// c10 uses now (null when PyTorch's own allocator is back).
class installation {
public:
    // Opens `mechanism` of the plugin at `plugin` on cpu:0 and makes it PyTorch's CPU allocator;
    // `pooled` puts nxmem's pool in front. Throws c10::Error with the reason, and changes nothing,
    // when the plugin cannot be loaded or the mechanism opened.
    static installed_allocator& install(const std::string& plugin, const std::string& mechanism,
                                        const std::string& options, bool pooled) {
        state& process = state::get();
        std::lock_guard lock(process.lock);
        // Refused before anything is loaded or opened: nothing to undo.
        TORCH_CHECK(pytorch::cpu_allocators_left() > 0, "nxmem: cannot install ", plugin, " '", mechanism,
                    "': ", pytorch::cpu_allocator_limit_reached());
        auto module = host::plugin_module::load(plugin);
        if (!module) {
            detail::refuse("cannot load " + plugin, module.error());
        }
        installed_allocator* made = pooled ? open_pooled(module.value(), mechanism, options)
                                           : open_direct(module.value(), mechanism, options);
        c10::Allocator* previous = pytorch::install_cpu_allocator(made->allocator());
        if (process.pytorch_allocator == nullptr) {
            process.pytorch_allocator = previous;
        }
        process.current = made;
        process.all.push_back(made);
        return *made;
    }

    // NXMEM_TORCH_POOLED's value: unset or empty is pooled (the default); 1, true, yes, on mean
    // pooled and 0, false, no, off direct, in any case. Anything else throws c10::Error naming the
    // variable and the value: a typo must not silently pick a mode.
    static bool pooled_from_environment(const char* value) {
        if (value == nullptr || *value == '\0') {
            return true;
        }
        std::string lowered(value);
        for (char& each : lowered) {
            each = static_cast<char>(std::tolower(static_cast<unsigned char>(each)));
        }
        for (const char* yes : {"1", "true", "yes", "on"}) {
            if (lowered == yes) {
                return true;
            }
        }
        for (const char* no : {"0", "false", "no", "off"}) {
            if (lowered == no) {
                return false;
            }
        }
        TORCH_CHECK(false, "NXMEM_TORCH_POOLED=", value, " is neither true (1, true, yes, on) nor false ",
                    "(0, false, no, off), in any case; unset or empty means pooled");
        return true; // not reached
    }

    // Puts PyTorch's own allocator back. Tensors made by an nxmem allocator keep its deleter.
    static void uninstall() {
        state& process = state::get();
        std::lock_guard lock(process.lock);
        if (process.current != nullptr) {
            c10::SetCPUAllocator(process.pytorch_allocator, 0);
            process.current = nullptr;
        }
    }

    // The current installation's figures (the last one's after an uninstall), with "installed".
    static usage_figures usage() {
        state& process = state::get();
        std::lock_guard lock(process.lock);
        usage_figures figures{{"installed", process.current != nullptr ? 1 : 0}};
        if (!process.all.empty()) {
            auto more = process.all.back()->usage();
            figures.insert(figures.end(), more.begin(), more.end());
        }
        return figures;
    }

    // Gives every installation's idle pooled memory, and every awake tag's, back to its plugin;
    // returns the bytes.
    static std::uint64_t trim() {
        state& process = state::get();
        std::lock_guard lock(process.lock);
        std::uint64_t given_back = 0;
        for (installed_allocator* each : process.all) {
            given_back += each->trim();
        }
        return given_back + tagged_pools::get().trim();
    }

    // The calling thread's new CPU tensors come from `tag`'s resident pool from now on ("":
    // untagged, the installation's pool, as without tags); returns the previous tag. A tag's pool
    // is made on its first use, from the current installation, which must serve tags (pooled,
    // over a mechanism with virtual backing: posix-lazy). Throws c10::Error, the thread's tag
    // unchanged, when it cannot.
    static std::string use_tag(const std::string& tag) {
        if (tag.empty()) {
            return choose_tag(nullptr);
        }
        state& process = state::get();
        std::lock_guard lock(process.lock);
        const tag_source* source = process.current != nullptr ? process.current->tags() : nullptr;
        TORCH_CHECK(source != nullptr, "nxmem: use_tag('", tag, "'): ",
                    process.current == nullptr ? "nothing is installed" : "the installed allocator serves no tags",
                    "; tags need torch.ops.nxmem.install(plugin, mechanism) pooled, on a mechanism with virtual "
                    "backing (posix-lazy)");
        return choose_tag(&tagged_pools::get().find_or_make(tag, *source));
    }

    // The tags' pools put to sleep per `policy` ("discard", "host", "file:DIR") or woken; every
    // tag when `tags` is empty. Throws c10::Error with the library's reason.
    static usage_figures sleep(std::span<const std::string> tags, const std::string& policy) {
        return tagged_pools::get().sleep(tags, policy);
    }
    static usage_figures wake(std::span<const std::string> tags) { return tagged_pools::get().wake(tags); }

    static bool owns(const c10::DataPtr& data_ptr) {
        state& process = state::get();
        std::lock_guard lock(process.lock);
        for (installed_allocator* each : process.all) {
            if (each->owns(data_ptr)) {
                return true;
            }
        }
        return false;
    }

private:
    struct state {
        std::mutex lock;
        std::vector<installed_allocator*> all;
        installed_allocator* current = nullptr;
        c10::Allocator* pytorch_allocator = nullptr;
        // Immortal too: a deleter never needs it, but usage() may run at any time before exit.
        static state& get() {
            static state* process = new state;
            return *process;
        }
    };

    using plugin_type = host::plugin_allocator<cpu_device>;

    static installed_allocator* open_pooled(const std::shared_ptr<host::plugin_module>& module,
                                            const std::string& mechanism, const std::string& options) {
        auto pool = host::open_pooled_allocator<cpu_device>(module, mechanism, 0, options);
        if (!pool) {
            detail::refuse("cannot open '" + mechanism + "' pooled", pool.error());
        }
        plugin_type& plugin = pool.value()->upstream();
        // Over virtual backing (the pool reserved address space): tags can sleep and wake.
        if (pool.value()->grows_by_commit()) {
            return new detail::tagging_installed(std::move(pool).value(), plugin,
                                                 tag_source{module, mechanism, options});
        }
        return new detail::installed<pool_allocator<plugin_type>>(std::move(pool).value(), plugin);
    }

    static installed_allocator* open_direct(const std::shared_ptr<host::plugin_module>& module,
                                            const std::string& mechanism, const std::string& options) {
        auto opened = host::open_allocator<cpu_device>(module, mechanism, 0, options);
        if (!opened) {
            detail::refuse("cannot open '" + mechanism + "'", opened.error());
        }
        // A mechanism that only reserves (posix-lazy) gets each allocation committed whole.
        if (auto backing = opened.value().virtual_backing()) {
            using committing = committing_allocator<plugin_type, host::virtual_backing_view<cpu_device>>;
            auto upstream = std::make_shared<committing>(opened.value(), std::move(backing).value());
            plugin_type& plugin = upstream->upstream();
            return new detail::installed<committing>(std::move(upstream), plugin);
        }
        auto upstream = std::make_shared<plugin_type>(std::move(opened).value());
        plugin_type& plugin = *upstream;
        return new detail::installed<plugin_type>(std::move(upstream), plugin);
    }
};

} // namespace nxmem::torch_engine
