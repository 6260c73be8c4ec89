// Fuzzes the whole host against the scripted fuzz plugin (fuzz_plugin.c): the plugin's answers and
// the engine's calls are drawn, interleaved, from one input. Per input: load, then up to 64
// operations (open, allocate, release, enqueue, drain, virtual backing, shared prefixes, usage,
// pins, readiness, try_unload, letting an allocator go), then the engine lets go of everything
// with the plugin honest from there on (the input has run out).
//
// What must hold: no exception leaves the host's API; no crash or sanitizer report; the plugin
// sees no double release; after the engine has let go, every factory and every allocator the host
// could release was released (nxmem_fuzz_audit), and the module unloads unless the plugin itself
// still legitimately holds something.
//
// The plugin is dlopen'ed once per process (NXMEM_FUZZ_PLUGIN) and kept mapped, so each load of
// the module by the host is only a reference count.
#include "fuzz_plugin.h"
#include "fuzz_support.hpp"

#include <nxmem/host.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Inside nxmem::fuzz, `abi` is nxmem::abi (the global `abi` of <cxxabi.h> would clash).
namespace nxmem::fuzz {
namespace {
using device = cpu_device;

struct fuzz_plugin {
    std::string path;
    NxmemFuzzBeginFn begin = nullptr;
    NxmemFuzzDrawFn draw = nullptr;
    NxmemFuzzAuditFn audit = nullptr;
    NxmemFuzzQueuedFn queued = nullptr;
};

const fuzz_plugin& plugin() {
    static const fuzz_plugin loaded = [] {
        const char* path = std::getenv("NXMEM_FUZZ_PLUGIN");
        if (path == nullptr || *path == '\0') {
            std::cerr << "NXMEM_FUZZ_PLUGIN names no file: set it to the built nxmem_fuzz_plugin.so\n";
            std::exit(2);
        }
        void* handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL); // kept for the process's life
        if (handle == nullptr) {
            std::cerr << "cannot load " << path << ": " << ::dlerror() << "\n";
            std::exit(2);
        }
        fuzz_plugin found{path};
        found.begin = reinterpret_cast<NxmemFuzzBeginFn>(::dlsym(handle, NXMEM_FUZZ_BEGIN));
        found.draw = reinterpret_cast<NxmemFuzzDrawFn>(::dlsym(handle, NXMEM_FUZZ_DRAW));
        found.audit = reinterpret_cast<NxmemFuzzAuditFn>(::dlsym(handle, NXMEM_FUZZ_AUDIT));
        found.queued = reinterpret_cast<NxmemFuzzQueuedFn>(::dlsym(handle, NXMEM_FUZZ_QUEUED));
        if (found.begin == nullptr || found.draw == nullptr || found.audit == nullptr ||
            found.queued == nullptr) {
            std::cerr << path << " lacks the fuzz plugin's test-only exports\n";
            std::exit(2);
        }
        return found;
    }();
    return loaded;
}

// The engine's side of the stream.
template <class T> T draw() {
    T value{};
    plugin().draw(&value, sizeof value);
    return value;
}

struct held_allocator {
    host::plugin_allocator<device> allocator;
    std::vector<allocation<device>> live;
    std::vector<std::uint64_t> pending; // tickets the engine believes queued
    // Allocations whose enqueue_release failed with CONTRACT_VIOLATION: the plugin retired the
    // ticket inside the call, so the allocation is gone and its completion, under a ticket the
    // engine was never handed, comes with a later drain (docs/HOST.md, "Faults the host contains").
    std::vector<std::uint64_t> retired_by_failed_enqueue;
    std::vector<host::shared_prefix> prefixes;
    std::optional<host::virtual_backing_view<device>> backing;
    std::optional<host::shared_mapping_view<device>> mapping;
};

struct engine {
    std::shared_ptr<host::plugin_module> module;
    std::vector<held_allocator> allocators;
    std::vector<host::module_pin> pins;
    bool unloaded = false;

    held_allocator* pick() {
        return allocators.empty() ? nullptr : &allocators[draw<std::uint8_t>() % allocators.size()];
    }
    template <class T> static T* pick_in(std::vector<T>& items) {
        return items.empty() ? nullptr : &items[draw<std::uint8_t>() % items.size()];
    }

    void open() {
        const auto& factories = module->factories();
        if (factories.empty() || allocators.size() >= 4) {
            return;
        }
        const std::string name = factories[draw<std::uint8_t>() % factories.size()].name;
        const std::int32_t index = draw<std::uint8_t>() % 2;
        const std::string options(draw<std::uint8_t>() % 4, 'o');
        const bool with_reclaim = draw<std::uint8_t>() % 2 == 1;
        auto opened = with_reclaim
                          ? host::open_allocator<device>(module, name, index, options,
                                                         [](const host::reclaim_request&) -> result<void> {
                                                             if (draw<std::uint8_t>() != 0) {
                                                                 return fail(status_code::host_refused, "no");
                                                             }
                                                             return boost::outcome_v2::success();
                                                         })
                          : host::open_allocator<device>(module, name, index, options);
        if (opened) {
            allocators.push_back(held_allocator{std::move(opened).value(), {}, {}, {}, {}, {}, {}});
        }
    }

    void allocate(held_allocator& held) {
        const std::uint8_t shape = draw<std::uint8_t>();
        const std::uint64_t size = shape & 1u ? draw<std::uint64_t>() : 4096u << (shape >> 4);
        const std::uint64_t alignment = shape & 2u ? draw<std::uint64_t>() : 64u << (shape >> 5);
        auto made = held.allocator.allocate(size, alignment);
        if (made) {
            NXMEM_FUZZ_CHECK(made.value().size == size && made.value().alignment == alignment);
            NXMEM_FUZZ_CHECK(made.value().address != nullptr);
            held.live.push_back(made.value());
        }
    }

    void release(held_allocator& held) {
        if (held.live.empty()) {
            return;
        }
        const std::size_t at = draw<std::uint8_t>() % held.live.size();
        allocation<device> described = held.live[at];
        const std::uint8_t lie = draw<std::uint8_t>();
        described.size ^= lie & 1u; // a misdescription the host must refuse untouched
        auto released = held.allocator.release(described);
        if (released) {
            NXMEM_FUZZ_CHECK(lie == 0 || (lie & 1u) == 0);
            held.live.erase(held.live.begin() + static_cast<std::ptrdiff_t>(at));
        }
    }

    void enqueue(held_allocator& held) {
        if (held.live.empty()) {
            return;
        }
        const std::size_t at = draw<std::uint8_t>() % held.live.size();
        auto ticket = held.allocator.enqueue_release(held.live[at]);
        if (ticket) {
            held.pending.push_back(ticket.value());
            held.live.erase(held.live.begin() + static_cast<std::ptrdiff_t>(at));
        } else if (ticket.error().code == status_code::contract_violation) {
            held.retired_by_failed_enqueue.push_back(held.live[at].allocation_id);
            held.live.erase(held.live.begin() + static_cast<std::ptrdiff_t>(at));
        }
    }

    static void drain(held_allocator& held) {
        auto completions = held.allocator.drain_releases();
        if (!completions) {
            return;
        }
        for (const auto& completion : completions.value()) {
            // Only tickets the engine enqueued, or the completion of an allocation whose enqueue
            // failed after the plugin had retired it, each once.
            if (const auto found = std::find(held.pending.begin(), held.pending.end(), completion.ticket);
                found != held.pending.end()) {
                held.pending.erase(found);
                continue;
            }
            const auto retired = std::find(held.retired_by_failed_enqueue.begin(),
                                           held.retired_by_failed_enqueue.end(), completion.allocation_id);
            NXMEM_FUZZ_CHECK(retired != held.retired_by_failed_enqueue.end());
            held.retired_by_failed_enqueue.erase(retired);
        }
    }

    void virtual_backing(held_allocator& held) {
        if (!held.backing) {
            auto view = held.allocator.virtual_backing();
            if (!view) {
                return;
            }
            held.backing.emplace(std::move(view).value());
        }
        allocation<device>* target = pick_in(held.live);
        if (target == nullptr) {
            return;
        }
        const byte_range range{draw<std::uint64_t>() % (2 * target->size + 1),
                               draw<std::uint64_t>() % (2 * target->size + 1)};
        switch (draw<std::uint8_t>() % 3) {
        case 0: (void)held.backing->commit(*target, range); break;
        case 1: (void)held.backing->decommit(*target, range); break;
        default: (void)held.backing->mapped_bytes(*target); break;
        }
    }

    void shared_mapping(held_allocator& held) {
        if (!held.mapping) {
            auto view = held.allocator.shared_mapping();
            if (!view) {
                return;
            }
            held.mapping.emplace(std::move(view).value());
        }
        switch (draw<std::uint8_t>() % 4) {
        case 0: {
            auto prefix = held.mapping->create_prefix(4096u << (draw<std::uint8_t>() % 4));
            if (prefix) {
                held.prefixes.push_back(prefix.value());
            }
            break;
        }
        case 1:
            if (auto* prefix = pick_in(held.prefixes); prefix != nullptr && held.mapping->retain_prefix(*prefix)) {
                held.prefixes.push_back(*prefix);
            }
            break;
        case 2:
            if (auto* prefix = pick_in(held.prefixes); prefix != nullptr && held.mapping->release_prefix(*prefix)) {
                held.prefixes.erase(held.prefixes.begin() + (prefix - held.prefixes.data()));
            }
            break;
        default: {
            auto* prefix = pick_in(held.prefixes);
            auto* target = pick_in(held.live);
            if (prefix != nullptr && target != nullptr) {
                (void)held.mapping->commit_prefix(*target, *prefix);
            }
            break;
        }
        }
    }

    void try_unload() {
        auto unloaded_now = module->try_unload();
        if (unloaded_now) {
            // Only an idle module unloads: the engine held nothing of it.
            NXMEM_FUZZ_CHECK(allocators.empty() && pins.empty());
            unloaded = true;
        }
    }

    void step() {
        switch (draw<std::uint8_t>() % 13) {
        case 0: open(); break;
        case 1: if (auto* held = pick()) allocate(*held); break;
        case 2: if (auto* held = pick()) release(*held); break;
        case 3: if (auto* held = pick()) enqueue(*held); break;
        case 4: if (auto* held = pick()) drain(*held); break;
        case 5: if (auto* held = pick()) virtual_backing(*held); break;
        case 6: if (auto* held = pick()) shared_mapping(*held); break;
        case 7: if (auto* held = pick()) (void)held->allocator.query_usage(); break;
        case 8: // the engine lets an allocator go, whatever it still holds
            if (!allocators.empty()) {
                const std::size_t at = draw<std::uint8_t>() % allocators.size();
                // An allocator whose releases the plugin still holds stays pinned for good once the
                // engine lets go (by design; docs/HOST.md: "Drain until everything has retired
                // before letting go"), which LeakSanitizer reports: drain first, and keep the
                // allocator while the plugin still holds some.
                if (plugin().queued() > 0) {
                    drain(allocators[at]);
                }
                if (plugin().queued() == 0) {
                    allocators.erase(allocators.begin() + static_cast<std::ptrdiff_t>(at));
                }
            }
            break;
        case 9: try_unload(); break;
        case 10:
            if (auto pin = module->pin()) {
                pins.push_back(std::move(pin).value());
            }
            break;
        case 11:
            if (!pins.empty()) {
                pins.pop_back();
            }
            break;
        default: (void)module->readiness(); break;
        }
    }

    // The engine gives back everything it holds, as a careful engine would: prefixes, queued
    // releases (drained), allocations, views, allocators, pins.
    void let_go() {
        for (held_allocator& held : allocators) {
            while (held.mapping && !held.prefixes.empty()) {
                if (!held.mapping->release_prefix(held.prefixes.back())) {
                    break;
                }
                held.prefixes.pop_back();
            }
            for (int attempt = 0; attempt < 2 && !held.pending.empty(); ++attempt) {
                drain(held);
            }
            while (!held.live.empty()) {
                if (!held.allocator.release(held.live.back())) {
                    break; // the allocator's last release gives it back
                }
                held.live.pop_back();
            }
        }
        allocators.clear();
        pins.clear();
    }
};

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    const fuzz_plugin& fuzzed = plugin();
    fuzzed.begin(data, size);
    {
        auto loaded = host::plugin_module::load(fuzzed.path);
        if (loaded) {
            engine run{std::move(loaded).value(), {}, {}, false};
            for (int step = 0; step < 64 && !run.unloaded; ++step) {
                run.step();
            }
            // From here on the plugin is honest: whatever the 64 steps left of the input is spent.
            for (std::size_t left = size; left > 0;) {
                std::uint8_t sink[256];
                const std::size_t chunk = left < sizeof sink ? left : sizeof sink;
                fuzzed.draw(sink, chunk);
                left -= chunk;
            }
            run.let_go();
            // Drain what is left (the plugin is honest now), then unload.
            result<void> unloaded = boost::outcome_v2::success();
            if (!run.unloaded) {
                unloaded = run.module->try_unload();
            }
            int outstanding = 0;
            char message[256] = {};
            run.module.reset();
            NXMEM_FUZZ_CHECK(fuzzed.audit(&outstanding, message, sizeof message) == 0 ||
                             (std::cerr << "fuzz plugin audit: " << message << "\n", false));
            if (!outstanding && !unloaded) {
                std::cerr << "the module did not unload though the plugin holds nothing: "
                          << unloaded.error().describe() << "\n";
                NXMEM_FUZZ_CHECK(unloaded);
            }
            return 0;
        }
    }
    int outstanding = 0;
    char message[256] = {};
    NXMEM_FUZZ_CHECK(fuzzed.audit(&outstanding, message, sizeof message) == 0 ||
                     (std::cerr << "fuzz plugin audit: " << message << "\n", false));
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
