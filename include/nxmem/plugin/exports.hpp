// The three exports of a plugin written with the kit, and the macro that defines them:
//   NXMEM_EXPORT_PLUGIN(eager_mechanism, lazy_mechanism)
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/version.hpp>
#include <nxmem/plugin/factory.hpp>
#include <nxmem/plugin/guard.hpp>
#include <nxmem/plugin/module_state.hpp>

#include <algorithm>
#include <array>
#include <cstdint>

namespace nxmem::plugin {

template <exportable_mechanism... Ms> struct plugin_exports {
    static_assert(sizeof...(Ms) >= 1 && sizeof...(Ms) <= NXMEM_MAX_FACTORIES,
                  "a plugin publishes between 1 and NXMEM_MAX_FACTORIES mechanisms");
    static constexpr bool ids_are_unique() {
        constexpr std::array<std::uint64_t, sizeof...(Ms)> ids{Ms::mechanism_id...};
        for (std::size_t i = 0; i < ids.size(); ++i) {
            for (std::size_t j = i + 1; j < ids.size(); ++j) {
                if (ids[i] == ids[j]) {
                    return false;
                }
            }
        }
        return true;
    }
    static_assert(ids_are_unique(), "mechanism ids are unique within a plugin");

    // The plugin speaks every minor of this header's major.
    static constexpr abi::version_range plugin_range{};

    static NxmemStatusCode negotiate(const NxmemNegotiateRequest* raw,
                                     NxmemNegotiateResponse* out, NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            NXMEM_TRY(request, abi::read_request(raw));
            NXMEM_TRY(agreed, abi::choose_version(abi::version_range::from_wire(request.host_range),
                                                  plugin_range));
            this_module().negotiated_minor.store(agreed.minor);
            auto response = abi::make_struct<NxmemNegotiateResponse>();
            response.major = agreed.major;
            response.minor = agreed.minor;
            response.plugin_range = plugin_range.to_wire();
            return abi::write_output(out, response);
        });
    }

    static NxmemStatusCode create_factories(NxmemAllocatorFactoryVtable** out,
                                            std::uint32_t capacity, std::uint32_t* count,
                                            NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            if (count == nullptr || (out == nullptr && capacity > 0)) {
                return fail(status_code::invalid_argument, "factory output is NULL");
            }
            *count = sizeof...(Ms);
            if (capacity < sizeof...(Ms)) {
                return fail(status_code::invalid_argument,
                            "this plugin publishes " + std::to_string(sizeof...(Ms)) +
                                " factories; capacity is " + std::to_string(capacity));
            }
            // All or nothing: a factory that cannot be made releases those made before it.
            std::array<NxmemAllocatorFactoryVtable*, sizeof...(Ms)> made{};
            std::size_t next = 0;
            if (!(((made[next] = factory_object<Ms>::create()) != nullptr && ++next > 0) && ...)) {
                for (std::size_t each = 0; each < next; ++each) {
                    made[each]->release(made[each]);
                }
                return fail(status_code::out_of_memory, "out of memory"); // short: no allocation
            }
            std::copy(made.begin(), made.end(), out);
            return boost::outcome_v2::success();
        });
    }

    static NxmemStatusCode query_unload_readiness(NxmemUnloadReport* out,
                                                  NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            return abi::write_output(out, this_module().report());
        });
    }
};

// What NXMEM_EXPORT_PLUGIN defines its exports with: plugin_exports when every class is
// exportable, else a stand-in that compiles, so that a class missing a member fails the build
// with assert_exportable's sentence for that member alone (naming the class in the instantiation
// the compiler reports), not with a constraint failure per export.
struct refused_exports {
    static NxmemStatusCode negotiate(const NxmemNegotiateRequest*, NxmemNegotiateResponse*,
                                     NxmemStatus*) noexcept {
        return NXMEM_STATUS_INTERNAL_ERROR;
    }
    static NxmemStatusCode create_factories(NxmemAllocatorFactoryVtable**, std::uint32_t,
                                            std::uint32_t*, NxmemStatus*) noexcept {
        return NXMEM_STATUS_INTERNAL_ERROR;
    }
    static NxmemStatusCode query_unload_readiness(NxmemUnloadReport*, NxmemStatus*) noexcept {
        return NXMEM_STATUS_INTERNAL_ERROR;
    }
};
template <bool exportable, class... Ms> struct select_exports {
    using type = refused_exports;
};
template <class... Ms> struct select_exports<true, Ms...> {
    using type = plugin_exports<Ms...>;
};
template <class... Ms>
using checked_exports = typename select_exports<(assert_exportable<Ms>() && ...), Ms...>::type;

} // namespace nxmem::plugin

// Defines the three exports for the listed mechanism classes.
#define NXMEM_EXPORT_PLUGIN(...)                                                                   \
    extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(                                 \
        const NxmemNegotiateRequest* request, NxmemNegotiateResponse* response,                    \
        NxmemStatus* status) {                                                                     \
        return ::nxmem::plugin::checked_exports<__VA_ARGS__>::negotiate(request, response, status); \
    }                                                                                              \
    extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(                  \
        NxmemAllocatorFactoryVtable** factories, uint32_t capacity, uint32_t* count,               \
        NxmemStatus* status) {                                                                     \
        return ::nxmem::plugin::checked_exports<__VA_ARGS__>::create_factories(factories, capacity, \
                                                                              count, status);      \
    }                                                                                              \
    extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(                      \
        NxmemUnloadReport* report, NxmemStatus* status) {                                          \
        return ::nxmem::plugin::checked_exports<__VA_ARGS__>::query_unload_readiness(report,        \
                                                                                    status);       \
    }                                                                                              \
    static_assert(true, "NXMEM_EXPORT_PLUGIN is used as a declaration")
