// Sharing across processes (minor 3), for a mechanism that declares NXMEM_CAP_IPC and shared
// mapping: a prefix exported and imported back in a child process (fork) that maps it and reads
// the parent's bytes; forged handles refused; the import counted apart and closed once
// (docs/ABI.md IP rules). A child that cannot run is a failure naming the step, never a hang:
// it exits, and the parent waits for it.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/host/ipc_view.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace nxmem::conform {

struct check_capability_ipc {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        if constexpr (!std::is_same_v<D, cpu_device>) {
            (void)target;
            return not_applicable("only host memory's shared prefixes are exchanged by this check");
        } else {
            return run_on_host(target);
        }
    }

private:
    static finding run_on_host(const subject& target) {
        using D = cpu_device;
        constexpr std::uint64_t bytes = 64 * 1024;
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if ((allocator.capabilities() & NXMEM_CAP_IPC) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_IPC");
        }
        if ((allocator.capabilities() & NXMEM_CAP_SHARED_MAPPING) == 0) {
            return not_applicable("only shared prefixes are exchanged by this check");
        }
        NXMEM_CONFORM_TRY(mapping, "the shared mapping view", allocator.shared_mapping());
        NXMEM_CONFORM_TRY(sharing, "the ipc view", allocator.ipc());
        NXMEM_CONFORM_TRY(prefix, "a shared prefix of 64 KiB", mapping.create_prefix(bytes));
        NXMEM_CONFORM_TRY(filled, "an allocation to fill the prefix through", allocator.allocate(bytes, 4096));
        finding verdict = passed();
        if (result<prefix_commit> committed = mapping.commit_prefix(filled, prefix); !committed) {
            verdict = failed("the prefix maps into an allocation", committed.error().describe());
        } else {
            std::memset(filled.address, 0x5C, bytes);
            verdict = exchange(allocator, mapping, sharing, prefix, bytes);
        }
        (void)allocator.release(filled);
        (void)mapping.release_prefix(prefix);
        return verdict;
    }

    template <Device D>
    static finding exchange(host::plugin_allocator<D>& allocator, host::shared_mapping_view<D>& mapping,
                            host::ipc_view<D>& sharing, const host::shared_prefix& prefix,
                            std::uint64_t bytes) {
        NXMEM_CONFORM_TRY(handle, "export_prefix succeeds", sharing.export_prefix(prefix));
        // Forged handles first: none may import, nor count.
        NxmemIpcHandle other_mechanism = handle.record();
        other_mechanism.mechanism_id ^= 0x8000;
        NxmemIpcHandle malformed = handle.record();
        malformed.opaque_length = NXMEM_IPC_OPAQUE_BYTES + 1;
        int pipe_ends[2] = {-1, -1};
        if (::pipe2(pipe_ends, O_CLOEXEC) != 0) {
            return failed("a pipe for a forged descriptor", std::strerror(errno));
        }
        NxmemIpcHandle not_memory = handle.record();
        for (std::uint32_t index = 0; index < not_memory.fd_count; ++index) {
            not_memory.fds[index] = pipe_ends[0];
        }
        struct forged {
            const char* what;
            const NxmemIpcHandle* record;
            status_code code;
        };
        const forged cases[] = {
            {"a handle of another mechanism is WRONG_MECHANISM", &other_mechanism, status_code::wrong_mechanism},
            {"a handle with 65 opaque bytes is INVALID_ARGUMENT", &malformed, status_code::invalid_argument},
            {"a handle whose descriptors are a pipe is refused", &not_memory, status_code::invalid_argument},
        };
        for (const forged& attempt : cases) {
            if (attempt.record == &not_memory && not_memory.fd_count == 0) {
                continue;
            }
            result<host::imported_memory<D>> imported = sharing.import(*attempt.record);
            if (imported || imported.error().code != attempt.code) {
                ::close(pipe_ends[0]);
                ::close(pipe_ends[1]);
                return failed(attempt.what, imported ? std::string("it was imported")
                                                     : imported.error().describe());
            }
        }
        ::close(pipe_ends[0]);
        ::close(pipe_ends[1]);
        // The round trip, in a child process: import, map, read the parent's bytes, close.
        const pid_t child = ::fork();
        if (child < 0) {
            return failed("fork for the importing process", std::strerror(errno));
        }
        if (child == 0) {
            ::_exit(import_in_child(allocator, mapping, sharing, handle, bytes));
        }
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            static const char* const steps[] = {"", "import", "usage counts the import apart",
                                                "allocate a sequence", "commit the imported prefix",
                                                "read the exporter's bytes", "close the import",
                                                "refuse a replay of a closed handle"};
            const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
            return failed("the child process imports, maps and reads the prefix",
                          WIFEXITED(status) && code < 8
                              ? std::string("it failed at: ") + steps[code]
                              : "it died (status " + std::to_string(status) + ")");
        }
        return passed();
    }

    // 0 when everything held, else the number of the step that did not.
    template <Device D>
    static int import_in_child(host::plugin_allocator<D>& allocator, host::shared_mapping_view<D>& mapping,
                               host::ipc_view<D>& sharing, const host::ipc_handle& handle,
                               std::uint64_t bytes) {
        result<host::imported_memory<D>> imported = sharing.import(handle);
        if (!imported) {
            return 1;
        }
        if ((allocator.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0) {
            result<allocator_usage> usage = allocator.query_usage();
            if (!usage || usage.value().live_imports != 1 || usage.value().imported_bytes < bytes) {
                return 2;
            }
        }
        result<allocation<D>> sequence = allocator.allocate(bytes, 4096);
        if (!sequence) {
            return 3;
        }
        result<prefix_commit> committed = mapping.commit_prefix(sequence.value(), imported.value().prefix());
        if (!committed || committed.value().newly_mapped_bytes != 0) {
            return 4;
        }
        const auto* memory = static_cast<const unsigned char*>(sequence.value().address);
        for (std::uint64_t index = 0; index < bytes; ++index) {
            if (memory[index] != 0x5C) {
                return 5;
            }
        }
        (void)allocator.release(sequence.value());
        if (!imported.value().close()) {
            return 6;
        }
        result<host::imported_memory<D>> replay = sharing.import(handle);
        if (replay) {
            return 7;
        }
        return 0;
    }
};

} // namespace nxmem::conform
