// The host's callbacks as a mechanism sees them. The table is read once, with read_prefix, when
// the allocator opens; the host keeps it alive for the allocator's lifetime.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/device.hpp>

#include <cstdint>
#include <string>

namespace nxmem::plugin {

class host_link {
public:
    host_link() = default;

    // Reads the host's table; a NULL table means the host offers no callbacks.
    static result<host_link> read(const NxmemHostCallbacks* table, std::uint32_t negotiated_minor) {
        host_link link;
        if (table == nullptr) {
            return link;
        }
        NXMEM_TRY(copy, abi::read_prefix<NxmemHostCallbacks>(table, negotiated_minor));
        link.table_ = copy.table;
        return link;
    }

    bool offers_reclaim() const noexcept { return table_.request_reclaim != nullptr; }
    bool offers_release_completed() const noexcept { return table_.release_completed != nullptr; }

    // Asks the host to free `bytes_needed`. Hold no lock across this call: the host may re-enter
    // this plugin on this thread to satisfy it.
    result<void> request_reclaim(std::uint64_t mechanism_id, const device_id& device,
                                 std::uint64_t bytes_needed) const {
        if (!offers_reclaim()) {
            return fail(status_code::unsupported_capability, "the host offers no reclaim hook");
        }
        auto request = abi::make_struct<NxmemReclaimRequest>();
        request.mechanism_id = mechanism_id;
        request.device = device.to_wire();
        request.bytes_needed = bytes_needed;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            table_.request_reclaim(table_.host_context, &request, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code), abi::read_status_message(status));
        }
        return boost::outcome_v2::success();
    }

    // Tells the host a queued release retired. Hold no lock across this call.
    void release_completed(const NxmemReleaseCompletion& completion) const {
        if (offers_release_completed()) {
            table_.release_completed(table_.host_context, &completion);
        }
    }

private:
    NxmemHostCallbacks table_{};
};

} // namespace nxmem::plugin
