// A loaded plugin module: the library, the negotiated version, the factories, the host's tally of
// what it holds from the module, and the unload gate.
#pragma once

#ifndef BOOST_DLL_USE_STD_FS
#define BOOST_DLL_USE_STD_FS // nxmem speaks std::filesystem; the nxmem dependency defines this too
#endif

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/version.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/allocation_id_source.hpp>
#include <nxmem/host/detail/contain.hpp>
#include <nxmem/host/detail/guarded_open.hpp>
#include <nxmem/host/detail/table_checks.hpp>
#include <nxmem/host/factory_info.hpp>
#include <nxmem/host/load_options.hpp>
#include <nxmem/host/tally.hpp>

#include <boost/dll/shared_library.hpp>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nxmem::host {

class plugin_module;

// Held by an execution context for its lifetime: while any pin is held the module cannot unload.
class module_pin {
public:
    module_pin() = default;
    module_pin(module_pin&& other) noexcept = default;
    module_pin& operator=(module_pin&& other) noexcept {
        reset();
        module_ = std::move(other.module_);
        return *this;
    }
    ~module_pin() { reset(); }
    void reset() noexcept;
    explicit operator bool() const noexcept { return module_ != nullptr; }

private:
    friend class plugin_module;
    explicit module_pin(std::shared_ptr<plugin_module> module) : module_(std::move(module)) {}
    std::shared_ptr<plugin_module> module_;
};

namespace detail {
class allocator_core;
}

class plugin_module : public std::enable_shared_from_this<plugin_module> {
    struct private_tag {};

public:
    // Loads `path`, checks the three exports, negotiates and reads the factories. A library that
    // fails any step is refused with the reason and unloaded before this returns.
    static result<std::shared_ptr<plugin_module>> load(const std::filesystem::path& path,
                                                       const load_options& options = {}) {
        return detail::contain("load", [&] { return load_unguarded(path, options); });
    }

private:
    static result<std::shared_ptr<plugin_module>> load_unguarded(const std::filesystem::path& path,
                                                                 const load_options& options) {
        // The plugin's initialisers run here, where an exception they throw is caught; Boost.DLL
        // then takes its own reference to the library already open.
        NXMEM_TRY(initialised, detail::run_initialisers(path));
        boost::dll::fs::error_code failure;
        boost::dll::shared_library library(path, boost::dll::load_mode::rtld_now |
                                                     boost::dll::load_mode::rtld_local,
                                           failure);
        if (failure || !library.is_loaded()) {
            // Boost.DLL reports only an error code; the loader's own words are in dlerror().
            // (glibc's text already names the file).
            const char* loader_text = ::dlerror();
            return fail(status_code::invalid_argument,
                        loader_text != nullptr
                            ? "cannot load: " + std::string(loader_text)
                            : "cannot load " + path.string() + ": " + failure.message());
        }
        std::string missing;
        for (const char* symbol : {NXMEM_EXPORT_NEGOTIATE, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES,
                                   NXMEM_EXPORT_QUERY_UNLOAD_READINESS}) {
            if (!library.has(symbol)) {
                missing += (missing.empty() ? "" : ", ") + std::string(symbol);
            }
        }
        if (!missing.empty()) {
            return fail(status_code::contract_violation,
                        path.string() + " is not an nxmem plugin: missing export(s) " + missing);
        }
        // An export that is data would be called as code: refuse it before calling anything.
        for (const char* symbol : {NXMEM_EXPORT_NEGOTIATE, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES,
                                   NXMEM_EXPORT_QUERY_UNLOAD_READINESS}) {
            if (!exports_function(library, symbol)) {
                return fail(status_code::contract_violation,
                            path.string() + ": export " + symbol + " is not a function");
            }
        }
        auto module = std::make_shared<plugin_module>(private_tag{}, std::move(library), path,
                                                      options.host_range);
        NXMEM_TRY_VOID(module->negotiate());
        NXMEM_TRY_VOID(module->read_factories());
        module->state_.store(state::loaded);
        return module;
    }

public:
    plugin_module(private_tag, boost::dll::shared_library library, std::filesystem::path path,
                  abi::version_range host_range)
        : library_(std::move(library)), path_(std::move(path)), host_range_(host_range) {
        negotiate_ = &library_.get<std::remove_pointer_t<NxmemNegotiateFn>>(NXMEM_EXPORT_NEGOTIATE);
        create_factories_ = &library_.get<std::remove_pointer_t<NxmemCreateAllocatorFactoriesFn>>(
            NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES);
        query_unload_readiness_ = &library_.get<std::remove_pointer_t<NxmemQueryUnloadReadinessFn>>(
            NXMEM_EXPORT_QUERY_UNLOAD_READINESS);
    }

    plugin_module(const plugin_module&) = delete;
    plugin_module& operator=(const plugin_module&) = delete;

    // Factories go back to the plugin before the library is closed (library_ is destroyed last).
    ~plugin_module() { release_factories(); }

    const std::filesystem::path& path() const noexcept { return path_; }
    abi::negotiated_version version() const noexcept { return version_; }
    const abi::version_range& host_range() const noexcept { return host_range_; }
    const abi::version_range& plugin_range() const noexcept { return plugin_range_; }
    const std::vector<factory_info>& factories() const noexcept { return factories_; }
    bool loaded() const noexcept { return state_.load() == state::loaded; }

    const factory_info* find_factory(std::string_view name) const noexcept {
        for (const factory_info& factory : factories_) {
            if (factory.name == name) {
                return &factory;
            }
        }
        return nullptr;
    }

    // The plugin's report and the host's tally, side by side. Allocators the engine has let go of,
    // whose queued releases have all retired, are released first.
    result<unload_readiness> readiness() {
        release_parked();
        return detail::contain("readiness", [&]() -> result<unload_readiness> {
            if (state_.load() == state::unloaded) {
                return fail(status_code::invalid_argument, path_.string() + " is already unloaded");
            }
            NXMEM_TRY(reported, query_plugin());
            return unload_readiness{reported, host_snapshot()};
        });
    }

    // Unloads when both tallies are zero: the plugin is asked first, always, then the host's own
    // counters, so a refusal carries both and a plugin that misreports is visible. After success
    // the factories are released and the library is really unmapped.
    // Allocators the engine has let go of, whose queued releases have all retired, are released
    // first. Whatever fails (out of memory included), the module is left loaded, never half-way.
    result<void> try_unload() {
        release_parked();
        return detail::contain("try_unload", [&]() -> result<void> {
            state expected = state::loaded;
            if (!state_.compare_exchange_strong(expected, state::unloading)) {
                return fail(status_code::busy, path_.string() + (expected == state::unloaded
                                                                     ? " is already unloaded"
                                                                     : " is being unloaded"));
            }
            try {
                return unload_if_idle();
            } catch (...) {
                state_.store(state::loaded);
                throw;
            }
        });
    }

    // A pin for an execution context's lifetime; refused once the module is unloading.
    result<module_pin> pin() {
        tally_.pins.fetch_add(1);
        if (state_.load() != state::loaded) {
            tally_.pins.fetch_sub(1);
            return detail::contain("pin", [&]() -> result<module_pin> {
                return fail(status_code::busy, not_loaded_reason());
            });
        }
        return module_pin(shared_from_this());
    }

    // Why a pin or an open is refused: an unload attempt still deciding (retry; the host never
    // waits on the plugin's readiness report to grant either) or the module unloaded (load again).
    std::string not_loaded_reason() const {
        return path_.string() + (state_.load() == state::unloading
                                     ? ": an unload attempt is in progress; retry"
                                     : " is not loaded");
    }

private:
    friend class module_pin;
    friend class detail::allocator_core;
    enum class state { loading, loaded, unloading, unloaded };

    struct factory_entry {
        NxmemAllocatorFactoryVtable* raw = nullptr; // the plugin's pointer, released exactly once
        NxmemAllocatorFactoryVtable table{};        // the bounded local copy
    };

    // try_unload's body, with the module marked unloading.
    result<void> unload_if_idle() {
        result<plugin_counts> reported = query_plugin();
        if (!reported) {
            state_.store(state::loaded);
            return fail(reported.error().code,
                        "unload refused: the plugin's readiness report failed: " +
                            reported.error().message);
        }
        const unload_readiness both{reported.value(), host_snapshot()};
        if (!both.ready()) {
            state_.store(state::loaded);
            return fail(status_code::busy, "unload refused: " + both.describe());
        }
        release_factories();
        library_.unload();
        state_.store(state::unloaded);
        return boost::outcome_v2::success();
    }

    result<void> negotiate() {
        auto request = abi::make_struct<NxmemNegotiateRequest>();
        request.host_range = host_range_.to_wire();
        auto response = abi::make_struct<NxmemNegotiateResponse>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = negotiate_(&request, &response, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        path_.string() + " refused the host's range " + host_range_.describe() +
                            ": " + abi::read_status_message(status));
        }
        result<abi::negotiated_version> agreed = abi::check_negotiation_reply(host_range_, response);
        if (!agreed) {
            return fail(agreed.error().code, path_.string() + ": " + agreed.error().message);
        }
        version_ = agreed.value();
        plugin_range_ = abi::version_range::from_wire(response.plugin_range);
        return boost::outcome_v2::success();
    }

    result<void> read_factories() {
        std::array<NxmemAllocatorFactoryVtable*, NXMEM_MAX_FACTORIES> raw{};
        std::uint32_t count = 0;
        // Room for every factory before the plugin hands any over: recording them cannot fail.
        entries_.reserve(raw.size());
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            create_factories_(raw.data(), static_cast<std::uint32_t>(raw.size()), &count, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        path_.string() + ": creating factories failed: " +
                            abi::read_status_message(status));
        }
        if (count > raw.size()) {
            return fail(status_code::contract_violation,
                        path_.string() + " reported " + std::to_string(count) +
                            " factories with a capacity of " + std::to_string(raw.size()));
        }
        // Own every distinct pointer first, so each is released exactly once whatever is refused
        // below; a pointer listed twice is refused, and released once.
        std::uint32_t duplicate = 0;
        std::uint32_t duplicated = 0;
        for (std::uint32_t i = 0; i < count; ++i) {
            std::uint32_t earlier = 0;
            while (earlier < i && raw[earlier] != raw[i]) {
                ++earlier;
            }
            if (earlier == i || raw[i] == nullptr) {
                entries_.push_back({raw[i], {}});
            } else if (duplicate == 0) {
                duplicate = i;
                duplicated = earlier;
            }
        }
        if (duplicate != 0) {
            return fail(status_code::contract_violation,
                        path_.string() + ": factory " + std::to_string(duplicate) +
                            " is the same pointer as factory " + std::to_string(duplicated) +
                            " (each factory is listed once)");
        }
        std::set<std::string> names;
        std::set<std::uint64_t> ids;
        for (factory_entry& entry : entries_) {
            result<factory_info> info = read_factory(entry);
            if (!info) {
                return fail(info.error().code, path_.string() + ": " + info.error().message);
            }
            if (!names.insert(info.value().name).second || !ids.insert(info.value().mechanism_id).second) {
                return fail(status_code::contract_violation,
                            path_.string() + ": factory '" + info.value().name +
                                "' repeats another factory's name or mechanism id");
            }
            factories_.push_back(std::move(info).value());
        }
        return boost::outcome_v2::success();
    }

    // Whether the dynamic symbol `symbol` of `library` is code (a function or an indirect one).
    static bool exports_function(const boost::dll::shared_library& library, const char* symbol) {
        void* address = ::dlsym(library.native(), symbol);
        Dl_info info{};
        void* symbol_entry = nullptr;
        if (address == nullptr ||
            ::dladdr1(address, &info, &symbol_entry, RTLD_DL_SYMENT) == 0 ||
            symbol_entry == nullptr) {
            return false;
        }
        const auto* entry = static_cast<const ElfW(Sym)*>(symbol_entry);
        const unsigned type = entry->st_info & 0xfu; // ELF{32,64}_ST_TYPE
        return type == STT_FUNC || type == STT_GNU_IFUNC;
    }

    result<factory_info> read_factory(factory_entry& entry) {
        NXMEM_TRY(copy, abi::read_prefix<NxmemAllocatorFactoryVtable>(entry.raw, version_.minor));
        NXMEM_TRY_VOID(detail::check_required_slots(copy));
        entry.table = copy.table;
        const char* name = copy.table.name;
        const std::size_t length =
            name == nullptr ? 0 : ::strnlen(name, NXMEM_MAX_FACTORY_NAME_BYTES + 1);
        if (length == 0 || length > NXMEM_MAX_FACTORY_NAME_BYTES) {
            return fail(status_code::contract_violation,
                        "a factory name is NULL, empty or longer than " +
                            std::to_string(NXMEM_MAX_FACTORY_NAME_BYTES) + " bytes");
        }
        // Every tool prints the name: no control bytes (UTF-8 above 0x7f is kept).
        for (std::size_t at = 0; at < length; ++at) {
            const auto byte = static_cast<unsigned char>(name[at]);
            if (byte < 0x20 || byte == 0x7f) {
                return fail(status_code::contract_violation,
                            "a factory name has byte 0x" + nxmem::detail::to_hex(byte) +
                                " at offset " + std::to_string(at) + ", which is not printable");
            }
        }
        if (copy.table.mechanism_id == 0) {
            return fail(status_code::contract_violation,
                        "factory '" + std::string(name, length) + "' has mechanism id 0");
        }
        return factory_info{std::string(name, length), copy.table.mechanism_id,
                            copy.table.device_types, copy.declared_minor, copy.effective_minor};
    }

    // Each factory whose release slot could be read goes back exactly once.
    void release_factories() noexcept {
        for (factory_entry& entry : entries_) {
            NxmemReleaseFactoryFn release = entry.table.release;
            if (release == nullptr) {
                try { // a table read without allocating; only a refusal's message allocates
                    result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
                        abi::read_prefix<NxmemAllocatorFactoryVtable>(entry.raw, version_.minor);
                    release = copy ? copy.value().table.release : nullptr;
                } catch (...) {
                    release = nullptr; // a refused table: its release slot cannot be trusted
                }
            }
            if (release != nullptr) {
                release(entry.raw);
            }
        }
        entries_.clear();
    }

    result<plugin_counts> query_plugin() const {
        auto report = abi::make_struct<NxmemUnloadReport>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = query_unload_readiness_(&report, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code), abi::read_status_message(status));
        }
        return plugin_counts::from_wire(report);
    }

    const factory_entry* entry_for(const factory_info& factory) const noexcept {
        for (const factory_entry& entry : entries_) {
            if (entry.table.mechanism_id == factory.mechanism_id) {
                return &entry;
            }
        }
        return nullptr;
    }

    // Declared first so it is destroyed last: nothing of the plugin's outlives its code.
    boost::dll::shared_library library_;
    std::filesystem::path path_;
    abi::version_range host_range_;
    abi::version_range plugin_range_{};
    abi::negotiated_version version_{};
    NxmemNegotiateFn negotiate_ = nullptr;
    NxmemCreateAllocatorFactoriesFn create_factories_ = nullptr;
    NxmemQueryUnloadReadinessFn query_unload_readiness_ = nullptr;
    // Allocators kept alive only by a queued release that retired while no drain ran (a completion
    // may arrive on any thread, inside any call): the completion parks the pin here instead of
    // dropping it inside the plugin's call, and release_parked drops it later, outside every
    // plugin call. Each queued release reserves its slot when it is enqueued, so parking never
    // allocates.

    // Reserves a parking slot for one queued release; throws std::bad_alloc, changing nothing.
    void reserve_parking_slot() {
        std::lock_guard lock(parked_mutex_);
        const std::size_t needed = parked_.size() + parking_reserved_ + 1;
        if (parked_.capacity() < needed) {
            parked_.reserve(std::max(needed, 2 * parked_.capacity()));
        }
        ++parking_reserved_;
    }
    void cancel_parking_slot() noexcept {
        std::lock_guard lock(parked_mutex_);
        --parking_reserved_;
    }
    void park(std::shared_ptr<detail::allocator_core>&& pin) noexcept {
        std::lock_guard lock(parked_mutex_);
        parked_.push_back(std::move(pin)); // within the reserved capacity
        --parking_reserved_;
    }

public:
    // Drops the parked pins one at a time, no lock held while an allocator is released.
    void release_parked() noexcept {
        for (;;) {
            std::shared_ptr<detail::allocator_core> pin;
            {
                std::lock_guard lock(parked_mutex_);
                if (parked_.empty()) {
                    return;
                }
                pin = std::move(parked_.back());
                parked_.pop_back();
            }
        }
    }

    // The host's tally; allocations are summed over the allocators now open.
    host_counts host_snapshot() const noexcept {
        host_counts counts = tally_.snapshot();
        std::lock_guard lock(allocators_mutex_);
        for (const detail::allocation_count_link* link = allocators_.next;
             link != nullptr && link != &allocators_; link = link->next) {
            counts.allocations += link->count(link->owner);
        }
        return counts;
    }

private:
    // An allocator joins the list when it opens and leaves it when it is destroyed.
    void link_allocator(detail::allocation_count_link& link) noexcept {
        std::lock_guard lock(allocators_mutex_);
        if (allocators_.next == nullptr) {
            allocators_.next = allocators_.previous = &allocators_;
        }
        link.previous = &allocators_;
        link.next = allocators_.next;
        allocators_.next->previous = &link;
        allocators_.next = &link;
    }
    void unlink_allocator(detail::allocation_count_link& link) noexcept {
        std::lock_guard lock(allocators_mutex_);
        link.previous->next = link.next;
        link.next->previous = link.previous;
        link.previous = link.next = nullptr;
    }

    std::vector<factory_entry> entries_;
    std::vector<factory_info> factories_;
    std::mutex parked_mutex_;
    std::vector<std::shared_ptr<detail::allocator_core>> parked_;
    std::size_t parking_reserved_ = 0;
    detail::host_tally tally_;
    nxmem::detail::allocation_id_source allocation_ids_; // M3: drawn by every allocator of the module
    mutable std::mutex allocators_mutex_;
    detail::allocation_count_link allocators_{}; // the list's sentinel
    std::atomic<state> state_{state::loading};
};

inline void module_pin::reset() noexcept {
    if (module_ != nullptr) {
        module_->tally_.pins.fetch_sub(1);
        module_.reset();
    }
}

} // namespace nxmem::host
