// Commit + decommit of one range of a virtual-backing allocation, through the host's view and
// through the plugin's virtual-backing table called directly.
#pragma once

#include "routes.hpp"

#include <nxmem/abi/read_prefix.hpp>

#include <cstdint>

namespace nxmem::measure {

// The range measured: `wanted` bytes rounded up to the commit granularity, from offset 0.
inline byte_range commit_range(std::uint64_t granularity, std::uint64_t wanted) {
    return byte_range{0, (wanted + granularity - 1) / granularity * granularity};
}

class view_range_route {
public:
    view_range_route(host::virtual_backing_view<cpu_device>& view, const allocation<cpu_device>& live,
                     byte_range range)
        : view_(&view), live_(live), range_(range) {}
    bool commit_decommit() {
        return view_->commit(live_, range_).has_value() && view_->decommit(live_, range_).has_value();
    }

private:
    host::virtual_backing_view<cpu_device>* view_;
    allocation<cpu_device> live_;
    byte_range range_;
};

class table_range_route {
public:
    // `live` must have been made through `allocator` (its host description is what is sent).
    static result<table_range_route> open(const host::plugin_allocator<cpu_device>& allocator,
                                          const allocation<cpu_device>& live, byte_range range) {
        NXMEM_TRY(copy, abi::read_prefix<NxmemVirtualBackingVtable>(
                            allocator.checked_table().virtual_backing, allocator.effective_minor()));
        table_range_route made;
        made.self_ = allocator.raw_table();
        made.table_ = copy.table;
        made.request_ = abi::make_struct<NxmemRangeRequest>();
        made.request_.allocation = host::detail::to_wire(live);
        made.request_.range = abi::make_struct<NxmemByteRange>();
        made.request_.range.offset = range.offset;
        made.request_.range.length = range.length;
        return made;
    }
    bool commit_decommit() {
        NxmemStatus status = table_route::blank_status();
        return table_.commit(self_, &request_, &status) == NXMEM_STATUS_OK &&
               table_.decommit(self_, &request_, &status) == NXMEM_STATUS_OK;
    }

private:
    table_range_route() = default;
    NxmemAllocatorVtable* self_ = nullptr;
    NxmemVirtualBackingVtable table_{};
    NxmemRangeRequest request_{};
};

} // namespace nxmem::measure
