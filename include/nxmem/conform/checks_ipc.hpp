// Sharing across processes (minor 3), for a mechanism that declares NXMEM_CAP_IPC: with shared
// mapping, a prefix exported and imported back in a child process (fork) that maps it and reads
// the parent's bytes; forged handles refused; the import counted apart and closed once. Then an
// allocation, where the mechanism shares allocations with the options given (posix-lazy:
// share=memfd; UNSUPPORTED_CAPABILITY otherwise, which passes): the child reads the parent's
// bytes through its import and writes its own, which the parent reads (docs/ABI.md IP rules,
// IP14). A child that cannot run is a failure naming the step, never a hang: it exits, and the
// parent waits for it.
//
// Device memory (cuda, hip) is not readable here, and a GPU driver cannot be used in a forked
// child of a process that initialised it: the importer is a second allocator of this process
// (imports are per allocator), and the prefix's round trip, the accounting, the forged handles and
// the replay are checked without the bytes. The bytes across processes are the plugin's own tests'
// (cuda-vmm: test/cuda/cuda_ipc_test.cpp, and cuda_gpu_tests on a GPU).
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_allocation.hpp>
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
    static finding run_on_host(const subject& target) {
        using D = cpu_device;
        constexpr std::uint64_t bytes = 64 * 1024;
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if ((allocator.capabilities() & NXMEM_CAP_IPC) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_IPC");
        }
        NXMEM_CONFORM_TRY(sharing, "the ipc view", allocator.ipc());
        const bool shares_prefixes = (allocator.capabilities() & NXMEM_CAP_SHARED_MAPPING) != 0;
        if (shares_prefixes) {
            if (finding prefixes = exchange_prefix(allocator, sharing, bytes);
                prefixes.verdict != outcome::pass) {
                return prefixes;
            }
        }
        return exchange_allocation(allocator, sharing, bytes, shares_prefixes);
    }

    template <Device D> static finding run_on_device(const subject& target) {
        constexpr std::uint64_t bytes = 64 * 1024;
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if ((allocator.capabilities() & NXMEM_CAP_IPC) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_IPC");
        }
        if ((allocator.capabilities() & NXMEM_CAP_SHARED_MAPPING) == 0) {
            return not_applicable("on device memory only shared prefixes are exchanged by this check");
        }
        NXMEM_CONFORM_TRY(mapping, "the shared mapping view", allocator.shared_mapping());
        NXMEM_CONFORM_TRY(sharing, "the ipc view", allocator.ipc());
        NXMEM_CONFORM_TRY(prefix, "a shared prefix of 64 KiB", mapping.create_prefix(bytes));
        const finding verdict = [&]() -> finding {
            NXMEM_CONFORM_TRY(importer, "a second allocator to import into",
                              host::open_allocator<D>(opened.module(), target.mechanism, target.device.index,
                                                      target.options));
            return exchange_in_process(sharing, importer, prefix, bytes);
        }();
        (void)mapping.release_prefix(prefix);
        return verdict;
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
    static finding exchange_prefix(host::plugin_allocator<D>& allocator, host::ipc_view<D>& sharing,
                                   std::uint64_t bytes) {
        NXMEM_CONFORM_TRY(mapping, "the shared mapping view", allocator.shared_mapping());
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

    // An allocation filled with 0x3A, exported read-write; a child imports it, reads the bytes,
    // writes 0xA3 over them and closes; the parent then reads 0xA3 in its own allocation.
    template <Device D>
    static finding exchange_allocation(host::plugin_allocator<D>& allocator, host::ipc_view<D>& sharing,
                                       std::uint64_t bytes, bool shares_prefixes) {
        NXMEM_CONFORM_TRY(shared, "an allocation to export", allocator.allocate(bytes, 4096));
        const finding verdict = [&]() -> finding {
            if (result<void> usable = detail::make_usable(allocator, shared); !usable) {
                return failed("the allocation to export is committed whole", usable.error().describe());
            }
            std::memset(shared.address, 0x3A, bytes);
            result<host::ipc_handle> handle = sharing.export_allocation(shared);
            if (!handle) {
                if (handle.error().code == status_code::unsupported_capability && shares_prefixes) {
                    return passed(); // this mechanism, so opened, shares prefixes only
                }
                return failed("export_allocation succeeds, or is UNSUPPORTED_CAPABILITY from a "
                              "mechanism that shares prefixes",
                              handle.error().describe());
            }
            const pid_t child = ::fork();
            if (child < 0) {
                return failed("fork for the importing process", std::strerror(errno));
            }
            if (child == 0) {
                ::_exit(import_allocation_in_child(allocator, sharing, handle.value(), bytes));
            }
            static const char* const steps[] = {"", "import the allocation",
                                                "usage counts the import apart",
                                                "read the exporter's bytes", "close the import",
                                                "refuse a replay of a closed handle"};
            if (finding child_found = child_verdict(
                    child, "the child process imports the allocation, reads and writes it", steps);
                child_found.verdict != outcome::pass) {
                return child_found;
            }
            const auto* memory = static_cast<const unsigned char*>(shared.address);
            for (std::uint64_t index = 0; index < bytes; ++index) {
                if (memory[index] != 0xA3) {
                    return failed("the exporter reads what the importing process wrote (0xA3)",
                                  "byte " + std::to_string(index) + " is " + std::to_string(memory[index]));
                }
            }
            return passed();
        }();
        (void)allocator.release(shared);
        return verdict;
    }

    // Steps 1 and 2 of both children: the import succeeds, and the usage query (where offered)
    // counts one import of at least `bytes`. 0 when both held, else the step that did not.
    template <Device D>
    static int import_counted(host::plugin_allocator<D>& allocator, host::ipc_view<D>& sharing,
                              const host::ipc_handle& handle, std::uint64_t bytes,
                              std::optional<host::imported_memory<D>>& imported) {
        result<host::imported_memory<D>> made = sharing.import(handle);
        if (!made) {
            return 1;
        }
        imported.emplace(std::move(made).value());
        if ((allocator.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0) {
            result<allocator_usage> usage = allocator.query_usage();
            if (!usage || usage.value().live_imports != 1 || usage.value().imported_bytes < bytes) {
                return 2;
            }
        }
        return 0;
    }

    // 0 when everything held, else the number of the step that did not.
    template <Device D>
    static int import_allocation_in_child(host::plugin_allocator<D>& allocator, host::ipc_view<D>& sharing,
                                          const host::ipc_handle& handle, std::uint64_t bytes) {
        std::optional<host::imported_memory<D>> imported;
        if (const int failed_step = import_counted(allocator, sharing, handle, bytes, imported)) {
            return failed_step;
        }
        auto* memory = static_cast<unsigned char*>(imported->address());
        for (std::uint64_t index = 0; index < bytes; ++index) {
            if (memory[index] != 0x3A) {
                return 3;
            }
        }
        std::memset(memory, 0xA3, bytes);
        if (!imported->close()) {
            return 4;
        }
        if (sharing.import(handle)) {
            return 5;
        }
        return 0;
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
        static const char* const steps[] = {"", "import", "usage counts the import apart",
                                            "allocate a sequence", "commit the imported prefix",
                                            "read the exporter's bytes", "close the import",
                                            "refuse a replay of a closed handle"};
        return child_verdict(child, "the child process imports, maps and reads the prefix", steps);
    }

    // Waits for `child`: exit status 0 passes, a status below N fails naming steps[status], any
    // other end fails saying how it died.
    template <std::size_t N>
    static finding child_verdict(pid_t child, const char* expected, const char* const (&steps)[N]) {
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            return passed();
        }
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        return failed(expected, WIFEXITED(status) && code < static_cast<int>(N)
                                    ? std::string("it failed at: ") + steps[code]
                                    : "it died (status " + std::to_string(status) + ")");
    }

    // 0 when everything held, else the number of the step that did not.
    template <Device D>
    static int import_in_child(host::plugin_allocator<D>& allocator, host::shared_mapping_view<D>& mapping,
                               host::ipc_view<D>& sharing, const host::ipc_handle& handle,
                               std::uint64_t bytes) {
        std::optional<host::imported_memory<D>> imported;
        if (const int failed_step = import_counted(allocator, sharing, handle, bytes, imported)) {
            return failed_step;
        }
        result<allocation<D>> sequence = allocator.allocate(bytes, 4096);
        if (!sequence) {
            return 3;
        }
        result<prefix_commit> committed = mapping.commit_prefix(sequence.value(), imported->prefix());
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
        if (!imported->close()) {
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
