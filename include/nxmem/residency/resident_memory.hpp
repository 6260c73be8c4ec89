// What residency_tags drives: memory that can sleep and wake under a tag, whatever its device
// and upstream (resident_pool is one).
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/residency/residency_state.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <string>

namespace nxmem {

class resident_memory {
public:
    virtual ~resident_memory() = default;
    virtual const std::string& tag() const noexcept = 0;
    virtual residency_state state() const noexcept = 0;
    virtual result<residency_report> sleep(const sleep_policy& policy) = 0;
    virtual result<residency_report> wake() = 0;
    virtual residency_usage residency() const = 0;

protected:
    resident_memory() = default;
    resident_memory(const resident_memory&) = default;
    resident_memory& operator=(const resident_memory&) = default;
};

} // namespace nxmem
