// Reaching a plugin without the host in front of it: its own dlopen handle, its three exports
// called directly, its factories created and released by hand. The checks of exports,
// negotiation, factories and tables use this, so the host's checks cannot hide a plugin's faults.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/abi/version.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/step.hpp>

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nxmem::conform::detail {

// Whether the dynamic loader still has `path` mapped (RTLD_NOLOAD never maps anything).
inline bool is_mapped(const std::filesystem::path& path) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

// An independent dlopen handle on the plugin: keeps it mapped while it is open.
class raw_library {
public:
    static result<raw_library> open(const std::filesystem::path& path) {
        void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            const char* text = ::dlerror();
            return fail(status_code::invalid_argument,
                        "cannot load: " + std::string(text != nullptr ? text : path.string()));
        }
        return raw_library(handle);
    }
    raw_library(raw_library&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    raw_library& operator=(raw_library&& other) noexcept {
        if (this != &other) {
            close();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    raw_library(const raw_library&) = delete;
    raw_library& operator=(const raw_library&) = delete;
    ~raw_library() { close(); }

    void close() noexcept {
        if (handle_ != nullptr) {
            ::dlclose(handle_);
            handle_ = nullptr;
        }
    }
    void* symbol(const char* name) const noexcept {
        return handle_ == nullptr ? nullptr : ::dlsym(handle_, name);
    }
    template <class Fn> Fn function(const char* name) const noexcept {
        return reinterpret_cast<Fn>(symbol(name));
    }
    NxmemNegotiateFn negotiate() const noexcept {
        return function<NxmemNegotiateFn>(NXMEM_EXPORT_NEGOTIATE);
    }
    NxmemCreateAllocatorFactoriesFn create_factories() const noexcept {
        return function<NxmemCreateAllocatorFactoriesFn>(NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES);
    }
    NxmemQueryUnloadReadinessFn query_unload_readiness() const noexcept {
        return function<NxmemQueryUnloadReadinessFn>(NXMEM_EXPORT_QUERY_UNLOAD_READINESS);
    }

private:
    explicit raw_library(void* handle) : handle_(handle) {}
    void* handle_ = nullptr;
};

// The plugin's answer to one host range, as it came back.
struct negotiation_reply {
    NxmemStatusCode code = NXMEM_STATUS_OK;
    NxmemNegotiateResponse response{};
    std::string message;

    std::string describe() const {
        std::string text(status_code_name(status_code_from_wire(code)));
        if (code == NXMEM_STATUS_OK) {
            text += " " + std::to_string(response.major) + "." + std::to_string(response.minor) +
                    ", plugin range " + abi::version_range::from_wire(response.plugin_range).describe();
        } else if (!message.empty()) {
            text += " (" + message + ")";
        }
        return text;
    }
};

// The status lies right before a PROT_NONE page: a plugin that writes past it faults at once, and
// the fault report names the offset, instead of corrupting the suite's stack unseen.
inline negotiation_reply negotiate(NxmemNegotiateFn negotiate_fn, const abi::version_range& host) {
    announce_step("NxmemNegotiate with host range " + host.describe());
    auto request = abi::make_struct<NxmemNegotiateRequest>();
    request.host_range = host.to_wire();
    negotiation_reply reply;
    reply.response = abi::make_struct<NxmemNegotiateResponse>();
    NxmemStatus fallback = abi::make_status();
    std::optional<guarded_bytes> guarded = guarded_status(sizeof(NxmemStatus), 0);
    NxmemStatus* status = guarded ? guarded->as<NxmemStatus>() : &fallback;
    reply.code = negotiate_fn(&request, &reply.response, status);
    reply.message = abi::read_status_message(*status);
    return reply;
}

// The release slot of a factory table, read within its own struct_size; NULL if unreadable.
inline NxmemReleaseFactoryFn factory_release_slot(const NxmemAllocatorFactoryVtable* factory) {
    result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
        abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, NXMEM_ABI_MINOR);
    return copy ? copy.value().table.release : nullptr;
}

// Factories created by calling NxmemCreateAllocatorFactories directly; each is released exactly
// once, through its own release slot, when this goes away.
class raw_factories {
public:
    raw_factories() = default;
    raw_factories(raw_factories&& other) noexcept
        : tables_(std::exchange(other.tables_, {})), negotiated_minor_(other.negotiated_minor_) {}
    raw_factories& operator=(raw_factories&&) = delete;
    raw_factories(const raw_factories&) = delete;
    raw_factories& operator=(const raw_factories&) = delete;
    ~raw_factories() {
        for (NxmemAllocatorFactoryVtable* factory : tables_) {
            if (NxmemReleaseFactoryFn release = factory_release_slot(factory); release != nullptr) {
                release(factory);
            }
        }
    }

    // Negotiates `host_range` first (the whole supported range unless a check narrows it), as a
    // host would, then creates the factories.
    static result<raw_factories> create(const raw_library& library,
                                        const abi::version_range& host_range = abi::supported_range) {
        NxmemNegotiateFn negotiate_fn = library.negotiate();
        NxmemCreateAllocatorFactoriesFn create_fn = library.create_factories();
        if (negotiate_fn == nullptr || create_fn == nullptr) {
            return fail(status_code::contract_violation, "the plugin lacks an export");
        }
        negotiation_reply agreed = negotiate(negotiate_fn, host_range);
        if (agreed.code != NXMEM_STATUS_OK) {
            return fail(status_code::version_mismatch, "negotiation refused: " + agreed.describe());
        }
        std::array<NxmemAllocatorFactoryVtable*, NXMEM_MAX_FACTORIES> raw{};
        std::uint32_t count = 0;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            create_fn(raw.data(), static_cast<std::uint32_t>(raw.size()), &count, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        "creating factories failed: " + abi::read_status_message(status));
        }
        if (count > raw.size()) {
            return fail(status_code::contract_violation,
                        "the plugin reported " + std::to_string(count) + " factories for a capacity of " +
                            std::to_string(raw.size()));
        }
        raw_factories made;
        made.tables_.assign(raw.begin(), raw.begin() + count);
        made.negotiated_minor_ = agreed.response.minor;
        return made;
    }

    const std::vector<NxmemAllocatorFactoryVtable*>& tables() const noexcept { return tables_; }
    std::uint32_t negotiated_minor() const noexcept { return negotiated_minor_; }

    // The factory whose name is `name`, or NULL (names read within the table's own struct_size).
    NxmemAllocatorFactoryVtable* find(std::string_view name) const {
        for (NxmemAllocatorFactoryVtable* factory : tables_) {
            result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
                abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, NXMEM_ABI_MINOR);
            if (!copy || copy.value().table.name == nullptr) {
                continue;
            }
            const char* text = copy.value().table.name;
            if (std::string_view(text, ::strnlen(text, NXMEM_MAX_FACTORY_NAME_BYTES + 1)) == name) {
                return factory;
            }
        }
        return nullptr;
    }

private:
    std::vector<NxmemAllocatorFactoryVtable*> tables_;
    std::uint32_t negotiated_minor_ = 0;
};

} // namespace nxmem::conform::detail
