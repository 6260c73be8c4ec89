// The C factory table the kit publishes for one mechanism class.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/plugin/allocator_object.hpp>
#include <nxmem/plugin/guard.hpp>
#include <nxmem/plugin/mechanism.hpp>
#include <nxmem/plugin/module_state.hpp>

#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>

namespace nxmem::plugin {

template <exportable_mechanism M> class factory_object {
public:
    static_assert(M::mechanism_id != 0, "a mechanism id is non-zero");
    static_assert(std::string_view(M::name).size() > 0 &&
                      std::string_view(M::name).size() <= NXMEM_MAX_FACTORY_NAME_BYTES,
                  "a mechanism name is non-empty and at most NXMEM_MAX_FACTORY_NAME_BYTES long");

    // A new factory, or NULL when memory ran out (nothing then changed); the host owns it and
    // releases it exactly once.
    static NxmemAllocatorFactoryVtable* create() noexcept {
        static_assert(std::is_standard_layout_v<factory_object>);
        auto* factory = new (std::nothrow) factory_object();
        if (factory == nullptr) {
            return nullptr;
        }
        this_module().factories_created.fetch_add(1);
        return &factory->table_;
    }

private:
    factory_object() noexcept {
        table_ = abi::make_struct<NxmemAllocatorFactoryVtable>();
        table_.abi_minor = NXMEM_ABI_MINOR_BASELINE;
        table_.type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
        table_.name = M::name;
        table_.mechanism_id = M::mechanism_id;
        table_.device_types = M::device_types;
        table_.open_allocator = &slot_open_allocator;
        table_.release = &slot_release;
    }

    static NxmemStatusCode slot_open_allocator(NxmemAllocatorFactoryVtable*,
                                               const NxmemOpenRequest* request,
                                               NxmemAllocatorVtable** out,
                                               NxmemStatus* status) noexcept {
        if constexpr (raw_mechanism<M>) {
            return guard_status(status, [&] { return M::open_raw(request, out, status); });
        } else {
            return detail::run_slot(status, [&]() -> result<void> {
                if (out == nullptr) {
                    return fail(status_code::invalid_argument, "allocator output is NULL");
                }
                NXMEM_TRY(copy, abi::read_request(request));
                NXMEM_TRY(opened, allocator_object<M>::open(copy));
                *out = opened;
                return boost::outcome_v2::success();
            });
        }
    }

    // The table is the first member: the pointer the host holds is the object's address.
    static void slot_release(NxmemAllocatorFactoryVtable* table) noexcept {
        guard_void([&] {
            delete reinterpret_cast<factory_object*>(table);
            this_module().factories_released.fetch_add(1);
        });
    }

    NxmemAllocatorFactoryVtable table_;
};

} // namespace nxmem::plugin
