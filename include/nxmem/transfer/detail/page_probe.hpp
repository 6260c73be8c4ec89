// Whether a target's own blocks can be touched, asked of the kernel rather than found out by a
// fault. A registration may cover pages that are not there: a pool growing by commit registers its
// whole reservation, whose uncommitted part is PROT_NONE. A peer naming such a part must get a
// refusal, not crash the target with its own memcpy (or UCX's packing of the blocks).
// process_vm_readv on this very process reads one byte of each page and reports a page it cannot
// read as EFAULT.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

namespace nxmem::transfer::detail {

enum class probe_result {
    readable,
    unreadable,  // a page of the ranges cannot be read: nothing may touch them
    unavailable, // the kernel refuses process_vm_readv (a seccomp filter, no CMA): not asked
};

class page_probe {
public:
    static constexpr std::uint64_t page_bytes = 4096; // the smallest page: a larger one is probed more than once
    static constexpr std::size_t pages_per_call = 1024; // IOV_MAX

    // Every page of each range added so far, one byte each.
    void add(std::uint64_t address, std::uint64_t length) {
        const std::uint64_t end = address + length; // the caller checked it does not wrap
        for (std::uint64_t at = address; at < end; at = (at / page_bytes + 1) * page_bytes) {
            pages_.push_back(iovec{reinterpret_cast<void*>(at), 1});
        }
    }

    probe_result run() noexcept {
        char scratch[pages_per_call];
        for (std::size_t first = 0; first < pages_.size(); first += pages_per_call) {
            const std::size_t count = std::min(pages_per_call, pages_.size() - first);
            const iovec into{scratch, count};
            const ssize_t read = ::process_vm_readv(::getpid(), &into, 1, pages_.data() + first,
                                                    static_cast<unsigned long>(count), 0);
            if (read < 0 && (errno == ENOSYS || errno == EPERM)) {
                return probe_result::unavailable;
            }
            if (read != static_cast<ssize_t>(count)) {
                return probe_result::unreadable; // EFAULT, or a partial read stopped at the first bad page
            }
        }
        return probe_result::readable;
    }

private:
    std::vector<iovec> pages_;
};

} // namespace nxmem::transfer::detail
