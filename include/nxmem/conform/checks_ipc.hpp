// Sharing across processes (minor 3), for a mechanism that declares NXMEM_CAP_IPC and shared
// mapping: a prefix exported and imported back in a child process (fork) that maps it and reads
// the parent's bytes; forged handles refused; the import counted apart and closed once
// (docs/ABI.md IP rules). A child that cannot run is a failure naming the step, never a hang:
// it exits, and the parent waits for it.
//
// Device memory (cuda, hip) is not readable here, and a GPU driver cannot be used in a forked
// child of a process that initialised it: the importer is a second allocator of this process
// (imports are per allocator), and the round trip, the accounting, the forged handles and the
// replay are checked without the bytes. The bytes across processes are the plugin's own tests'
// (cuda-vmm: test/cuda/cuda_ipc_test.cpp, and cuda_gpu_tests on a GPU).
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/host/ipc_view.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

namespace nxmem::conform {

struct check_capability_ipc {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        if constexpr (!std::is_same_v<D, cpu_device>) {
            return run_on_device<D>(target);
        } else {
            return run_on_host(target);
        }
    }

private:
    static constexpr std::uint64_t bytes = 64 * 1024;

    // Opens the mechanism with its views and a prefix of `bytes`, runs
    // `body(opened, mapping, sharing, prefix)` and releases the prefix.
    template <Device D, class Body> static finding with_prefix(const subject& target, Body&& body) {
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
        const finding verdict = body(opened, mapping, sharing, prefix);
        (void)mapping.release_prefix(prefix);
        return verdict;
    }

    static finding run_on_host(const subject& target) {
        using D = cpu_device;
        return with_prefix<D>(target, [](session<D>& opened, host::shared_mapping_view<D>& mapping,
                                         host::ipc_view<D>& sharing, const host::shared_prefix& prefix) {
            auto& allocator = opened.allocator();
            NXMEM_CONFORM_TRY(filled, "an allocation to fill the prefix through", allocator.allocate(bytes, 4096));
            finding verdict = passed();
            if (result<prefix_commit> committed = mapping.commit_prefix(filled, prefix); !committed) {
                verdict = failed("the prefix maps into an allocation", committed.error().describe());
            } else {
                std::memset(filled.address, 0x5C, bytes);
                verdict = exchange(allocator, mapping, sharing, prefix, bytes);
            }
            (void)allocator.release(filled);
            return verdict;
        });
    }

    template <Device D> static finding run_on_device(const subject& target) {
        return with_prefix<D>(target, [&](session<D>& opened, host::shared_mapping_view<D>&,
                                          host::ipc_view<D>& sharing, const host::shared_prefix& prefix) {
            NXMEM_CONFORM_TRY(importer, "a second allocator to import into",
                              host::open_allocator<D>(opened.module(), target.mechanism, target.device.index,
                                                      target.options));
            return exchange_in_process(sharing, importer, prefix, bytes);
        });
    }

    // Export, then import into `importer` (another allocator of this process), map, close, replay.
    template <Device D>
    static finding exchange_in_process(host::ipc_view<D>& sharing, host::plugin_allocator<D>& importer,
                                       const host::shared_prefix& prefix, std::uint64_t bytes) {
        NXMEM_CONFORM_TRY(handle, "export_prefix succeeds", sharing.export_prefix(prefix));
        NXMEM_CONFORM_TRY(importing, "the importer's ipc view", importer.ipc());
        NXMEM_CONFORM_TRY(importer_mapping, "the importer's shared mapping view", importer.shared_mapping());
        if (std::optional<finding> refused = refuse_forged(importing, handle)) {
            return *refused;
        }
        NXMEM_CONFORM_TRY(imported, "the import succeeds", importing.import(handle));
        if ((importer.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0) {
            result<allocator_usage> usage = importer.query_usage();
            if (!usage || usage.value().live_imports != 1 || usage.value().imported_bytes < bytes) {
                return failed("usage counts the import apart (live_imports 1, imported_bytes)",
                              usage ? "live_imports " + std::to_string(usage.value().live_imports) +
                                          ", imported_bytes " + std::to_string(usage.value().imported_bytes)
                                    : usage.error().describe());
            }
        }
        NXMEM_CONFORM_TRY(sequence, "a sequence in the importer", importer.allocate(bytes, 4096));
        result<prefix_commit> committed = importer_mapping.commit_prefix(sequence, imported.prefix());
        (void)importer.release(sequence);
        if (!committed || committed.value().newly_mapped_bytes != 0) {
            return failed("the imported prefix maps into a sequence, costing nothing there",
                          committed ? "newly_mapped_bytes " + std::to_string(committed.value().newly_mapped_bytes)
                                    : committed.error().describe());
        }
        if (result<void> closed = imported.close(); !closed) {
            return failed("the import closes", closed.error().describe());
        }
        if (result<host::imported_memory<D>> replay = importing.import(handle); replay) {
            return failed("a replay of a closed handle is refused", "it was imported again");
        }
        return passed();
    }

    // None of the forged copies of `handle` may import, nor count; nullopt when all are refused.
    template <Device D>
    static std::optional<finding> refuse_forged(host::ipc_view<D>& sharing, const host::ipc_handle& handle) {
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
        return std::nullopt;
    }

    template <Device D>
    static finding exchange(host::plugin_allocator<D>& allocator, host::shared_mapping_view<D>& mapping,
                            host::ipc_view<D>& sharing, const host::shared_prefix& prefix,
                            std::uint64_t bytes) {
        NXMEM_CONFORM_TRY(handle, "export_prefix succeeds", sharing.export_prefix(prefix));
        if (std::optional<finding> refused = refuse_forged(sharing, handle)) {
            return *refused;
        }
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
