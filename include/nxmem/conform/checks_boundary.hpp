// The boundary between the two sides' memory: a plugin writes a status only within the
// struct_size its caller set (down to the smallest, 8 bytes) and NUL-terminates the message
// within its 256 bytes; it tolerates a NULL status; it writes an output only within the
// struct_size its receiver set. The suite hands the plugin statuses and outputs that end right
// before a PROT_NONE page (guarded_memory.hpp) and makes each call in a child process of its own
// (contained_call.hpp), so a plugin writing past them faults there and fails the check with the
// offset it wrote at, instead of corrupting the suite or ending the run.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// The smallest status a caller may pass: struct_size and code, no message (ABI.md E9).
inline constexpr std::uint32_t smallest_status_bytes = offsetof(NxmemStatus, code) + sizeof(NxmemStatusCode);

// One call into the plugin that fails on purpose and writes a status: the allocator refusing a
// 0-byte request, or negotiation refusing a host of another major.
struct error_path {
    std::string name;
    std::function<NxmemStatusCode(NxmemStatus*)> call;
};

template <Device D>
std::vector<error_path> error_paths(const raw_slots& slots, NxmemNegotiateFn negotiate) {
    std::vector<error_path> paths;
    paths.push_back({"allocate 0 bytes", [&slots](NxmemStatus* status) {
                         const NxmemAllocRequest request = slots.request(0, 8);
                         auto out = abi::make_struct<NxmemAllocResult>();
                         return slots.table().allocate(slots.self(), &request, &out, status);
                     }});
    if (negotiate != nullptr) {
        paths.push_back({"negotiate with a host of major " + std::to_string(NXMEM_ABI_MAJOR + 1),
                         [negotiate](NxmemStatus* status) {
                             auto request = abi::make_struct<NxmemNegotiateRequest>();
                             request.host_range = abi::version_range{NXMEM_ABI_MAJOR + 1, 0, 1}.to_wire();
                             auto response = abi::make_struct<NxmemNegotiateResponse>();
                             return negotiate(&request, &response, status);
                         }});
    }
    return paths;
}

// What one call did to a guarded status, as the child saw it.
struct status_seen {
    NxmemStatusCode code = NXMEM_STATUS_OK;
    bool message_touched = false;    // some message byte differs from the fill
    bool message_terminated = false; // a NUL within the 256 bytes
};

// Calls `path` with a status of `struct_size` bytes ending at a PROT_NONE page, its message
// filled with `fill`, in a child of its own.
inline contained_result<status_seen> call_with_guarded_status(const error_path& path,
                                                              std::uint32_t struct_size,
                                                              unsigned char fill) {
    return run_contained<status_seen>([&]() {
        status_seen seen;
        std::optional<guarded_bytes> status = guarded_status(struct_size, fill);
        if (!status) {
            return seen;
        }
        seen.code = path.call(status->as<NxmemStatus>());
        if (struct_size == sizeof(NxmemStatus)) {
            const unsigned char* message = status->data() + offsetof(NxmemStatus, message);
            for (std::size_t at = 0; at < NXMEM_STATUS_MESSAGE_BYTES; ++at) {
                seen.message_touched = seen.message_touched || message[at] != fill;
                seen.message_terminated = seen.message_terminated || message[at] == '\0';
            }
        }
        return seen;
    });
}

// The allocator's raw slots and the plugin's own negotiate, for the checks below.
template <Device D> struct boundary_session {
    session<D> opened;
    raw_library library;
    NxmemNegotiateFn negotiate = nullptr;

    static result<boundary_session> open(const subject& target) {
        NXMEM_TRY(made, session<D>::open(target));
        NXMEM_TRY(library, raw_library::open(target.path));
        NxmemNegotiateFn negotiate = library.negotiate();
        return boundary_session{std::move(made), std::move(library), negotiate};
    }
};

} // namespace detail

// boundary.status_terminated (E4): a message the plugin writes ends with a NUL within the 256
// bytes, even when the caller's buffer held no zero byte before the call.
struct check_boundary_status_terminated {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        const std::string expected = "a message NUL-terminated within its 256 bytes";
        for (const detail::error_path& path : detail::error_paths<D>(slots, opened.negotiate)) {
            announce_step(path.name + " with a status whose message bytes are all 0xff");
            const auto called = detail::call_with_guarded_status(path, sizeof(NxmemStatus), 0xFF);
            if (!called.value) {
                return failed(expected + ", written within the status", path.name + ": " + called.failure);
            }
            if (called.value->message_touched && !called.value->message_terminated) {
                return failed(expected, path.name + ": the message has no NUL in its 256 bytes");
            }
        }
        return passed();
    }
};

// boundary.status_within_size (E4, E9): nothing is written at or past the status' struct_size,
// for the full 264 bytes and for the smallest status, 8 bytes with no message.
struct check_boundary_status_within_size {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        const std::string expected = "nothing written at or past the status' struct_size";
        for (const detail::error_path& path : detail::error_paths<D>(slots, opened.negotiate)) {
            for (std::uint32_t size : {std::uint32_t{sizeof(NxmemStatus)}, detail::smallest_status_bytes}) {
                announce_step(path.name + " with a " + std::to_string(size) +
                              "-byte status ending at a PROT_NONE page");
                const auto called = detail::call_with_guarded_status(path, size, 0);
                if (!called.value) {
                    return failed(expected, path.name + " with struct_size " + std::to_string(size) +
                                                ": " + called.failure);
                }
            }
        }
        return passed();
    }
};

// boundary.null_status (E10): a NULL status is tolerated; the call still returns its code.
struct check_boundary_null_status {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        for (const detail::error_path& path : detail::error_paths<D>(slots, opened.negotiate)) {
            announce_step(path.name + " with a NULL status");
            const auto called = detail::run_contained<NxmemStatusCode>([&]() { return path.call(nullptr); });
            if (!called.value) {
                return failed("a NULL status tolerated (nothing written, the code returned)",
                              path.name + ": " + called.failure);
            }
            if (*called.value == NXMEM_STATUS_OK) {
                return failed("the refusal's code returned with a NULL status as without one",
                              path.name + " returned OK");
            }
        }
        return passed();
    }
};

// boundary.output_within_size (Q6, Q7): every output the plugin fills, given with the smallest
// struct_size its receiver may set and ending at a PROT_NONE page, is written only within it; one
// of 8 bytes, too small for the baseline struct, is refused untouched (a plugin that never reads
// the receiver's struct_size writes past it).
struct check_boundary_output_within_size {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", detail::boundary_session<D>::open(target));
        const detail::raw_slots slots(opened.opened.allocator());
        const auto query_readiness = opened.library.query_unload_readiness();
        const NxmemNegotiateFn negotiate = opened.negotiate;
        const NxmemAllocatorVtable& table = slots.table();

        // Each output: its name, its smallest struct_size, and the call that fills it.
        struct output_call {
            std::string name;
            std::size_t bytes;
            std::function<NxmemStatusCode(void*, NxmemStatus*)> call;
            bool sealed = false; // a sealed record: no smaller size to try
        };
        std::vector<output_call> outputs;
        outputs.push_back({"an NxmemAllocResult (allocate 64 bytes)", abi::baseline_bytes<NxmemAllocResult>(),
                           [&](void* out, NxmemStatus* status) {
                               const NxmemAllocRequest request = slots.request(64, 8);
                               return table.allocate(slots.self(), &request,
                                                     static_cast<NxmemAllocResult*>(out), status);
                           }});
        if (negotiate != nullptr) {
            outputs.push_back({"an NxmemNegotiateResponse", abi::baseline_bytes<NxmemNegotiateResponse>(),
                               [&](void* out, NxmemStatus* status) {
                                   auto request = abi::make_struct<NxmemNegotiateRequest>();
                                   request.host_range = abi::supported_range.to_wire();
                                   return negotiate(&request, static_cast<NxmemNegotiateResponse*>(out), status);
                               }});
        }
        if (query_readiness != nullptr) {
            outputs.push_back({"an NxmemUnloadReport", abi::baseline_bytes<NxmemUnloadReport>(),
                               [&](void* out, NxmemStatus* status) {
                                   return query_readiness(static_cast<NxmemUnloadReport*>(out), status);
                               }});
        }
        if (table.query_usage != nullptr) {
            outputs.push_back({"an NxmemAllocatorUsage", abi::baseline_bytes<NxmemAllocatorUsage>(),
                               [&](void* out, NxmemStatus* status) {
                                   return table.query_usage(slots.self(),
                                                            static_cast<NxmemAllocatorUsage*>(out), status);
                               }});
        }
        if (table.release_allocation != nullptr) {
            outputs.push_back({"an NxmemReleaseOutcome (release_allocation)", sizeof(NxmemReleaseOutcome),
                               [&](void* out, NxmemStatus* status) {
                                   NxmemAllocResult made = abi::make_struct<NxmemAllocResult>();
                                   const NxmemAllocRequest request = slots.request(64, 8);
                                   if (table.allocate(slots.self(), &request, &made, status) != NXMEM_STATUS_OK) {
                                       return NXMEM_STATUS_OK; // nothing to release: allocate is judged elsewhere
                                   }
                                   const NxmemAllocation described = detail::raw_slots::describe(request, made);
                                   return table.release_allocation(slots.self(), &described,
                                                                   static_cast<NxmemReleaseOutcome*>(out), status);
                               },
                               true});
        }
        constexpr std::size_t too_small = 8;
        for (const output_call& output : outputs) {
            for (std::size_t bytes : {output.bytes, too_small}) {
                if (bytes == too_small && output.sealed) {
                    continue;
                }
                announce_step("fill " + output.name + " of struct_size " + std::to_string(bytes) +
                              ", ending at a PROT_NONE page");
                const auto called = detail::run_contained<NxmemStatusCode>([&]() {
                    std::optional<detail::guarded_bytes> out = detail::guarded_bytes::make(bytes, "an output");
                    if (!out) {
                        return NXMEM_STATUS_INTERNAL_ERROR;
                    }
                    const auto struct_size = static_cast<std::uint32_t>(bytes);
                    std::memcpy(out->data(), &struct_size, sizeof struct_size);
                    NxmemStatus status = abi::make_status();
                    return output.call(out->data(), &status);
                });
                if (!called.value) {
                    return failed(bytes == too_small
                                      ? "an output too small for the baseline struct refused untouched"
                                      : "each output written only within the struct_size its receiver set",
                                  output.name + " of struct_size " + std::to_string(bytes) + ": " +
                                      called.failure);
                }
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
