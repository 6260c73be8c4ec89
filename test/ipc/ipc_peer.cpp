// One process of the two-process tests (two_process_test.cpp runs two of these, never threads):
// a prefill process that fills a shared prefix and exports it, or a decode process that imports
// it and maps it into several sequences. Each is driven step by step over a control socket
// (argv: role, plugin path, control fd, data fd): it reads a command, does the step, and answers
// one line, "ok ..." or "fail <why>". The test may SIGKILL either between any two steps.
//
// Commands
//   prefill: fill BYTES | export rw|ro | finish
//            alloc BYTES | export-alloc rw|ro | check-alloc written   (an allocation, share=memfd)
//   decode:  import rw|ro | replay | map COUNT | verify | unload-refused | finish
//            import-alloc rw|ro | read-alloc original|written | write-alloc
// The prefill side fills its allocation with `pattern`; the decode side checks it and writes the
// complement, which `check-alloc written` (or `read-alloc written`) then finds.
// `finish` releases everything, checks that the module unloads and that the process holds no more
// descriptors than before it started, then answers and exits 0.
#include <nxmem/host.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

int control = -1;
int data = -1;

void answer(const std::string& line) {
    (void)::send(control, line.data(), line.size(), MSG_NOSIGNAL);
}

[[noreturn]] void give_up(const std::string& why) {
    answer("fail " + why);
    std::_Exit(1);
}

std::string next_command() {
    char buffer[256];
    const ssize_t got = ::recv(control, buffer, sizeof buffer - 1, 0);
    if (got <= 0) {
        std::_Exit(2); // the test went away
    }
    return std::string(buffer, static_cast<std::size_t>(got));
}

template <class T> T must(result<T> outcome, const char* what) {
    if (!outcome) {
        give_up(std::string(what) + ": " + outcome.error().describe());
    }
    if constexpr (!std::is_void_v<T>) {
        return std::move(outcome).value();
    }
}

std::size_t open_descriptors() {
    std::size_t count = 0;
    if (DIR* listing = ::opendir("/proc/self/fd"); listing != nullptr) {
        while (const dirent* entry = ::readdir(listing)) {
            count += entry->d_name[0] != '.';
        }
        ::closedir(listing);
    }
    return count - 1; // the listing's own
}

unsigned char pattern(std::uint64_t index) { return static_cast<unsigned char>(index * 131 + 7); }
unsigned char written_pattern(std::uint64_t index) { return static_cast<unsigned char>(~pattern(index)); }

// Fails the process unless `bytes` bytes at `memory` hold `which` ("original" or "written").
void expect_bytes(const void* memory, std::uint64_t bytes, const std::string& which) {
    const auto* seen = static_cast<const unsigned char*>(memory);
    for (std::uint64_t index = 0; index < bytes; ++index) {
        const unsigned char wanted = which == "written" ? written_pattern(index) : pattern(index);
        if (seen[index] != wanted) {
            give_up("byte " + std::to_string(index) + " of the allocation is not the " + which + " one");
        }
    }
}

std::uint32_t access_named(const std::string& word) {
    return word == "ro" ? NXMEM_IPC_READ_ONLY : NXMEM_IPC_READ_WRITE;
}

// Sends an export's handle over the data socket and answers how many descriptors went.
void send_export(result<host::ipc_handle> exported) {
    host::ipc_handle handle = must(std::move(exported), "export");
    (void)must(host::send_handle(data, handle.record()), "send_handle");
    answer("ok sent " + std::to_string(handle.record().fd_count) + " descriptors");
}

int run_prefill(const std::string& plugin, std::size_t descriptors_before) {
    std::optional<host::plugin_allocator<cpu_device>> lazy;
    std::optional<host::shared_mapping_view<cpu_device>> mapping;
    host::shared_prefix prefix{};
    std::optional<allocation<cpu_device>> sequence;
    std::optional<host::plugin_allocator<cpu_device>> shared_lazy; // share=memfd
    std::optional<allocation<cpu_device>> shared;
    auto module = must(host::plugin_module::load(plugin), "load");
    for (;;) {
        std::istringstream words(next_command());
        std::string command;
        words >> command;
        if (command == "fill") {
            std::uint64_t bytes = 0;
            words >> bytes;
            lazy.emplace(must(host::open_allocator<cpu_device>(module, "posix-lazy"), "open"));
            mapping.emplace(must(lazy->shared_mapping(), "shared mapping"));
            prefix = must(mapping->create_prefix(bytes), "create_prefix");
            sequence = must(lazy->allocate(bytes, 4096), "allocate");
            (void)must(mapping->commit_prefix(*sequence, prefix), "commit_prefix");
            auto* memory = static_cast<unsigned char*>(sequence->address);
            for (std::uint64_t index = 0; index < bytes; ++index) {
                memory[index] = pattern(index);
            }
            answer("ok filled " + std::to_string(bytes));
        } else if (command == "export") {
            std::string access;
            words >> access;
            auto sharing = must(lazy->ipc(), "ipc view");
            send_export(sharing.export_prefix(prefix, access_named(access)));
        } else if (command == "alloc") {
            std::uint64_t bytes = 0;
            words >> bytes;
            shared_lazy.emplace(must(host::open_allocator<cpu_device>(module, "posix-lazy", 0, "share=memfd"),
                                     "open share=memfd"));
            shared = must(shared_lazy->allocate(bytes, 4096), "allocate");
            (void)must(must(shared_lazy->virtual_backing(), "virtual backing").commit(*shared, {0, bytes}),
                       "commit");
            auto* memory = static_cast<unsigned char*>(shared->address);
            for (std::uint64_t index = 0; index < bytes; ++index) {
                memory[index] = pattern(index);
            }
            answer("ok allocated " + std::to_string(bytes));
        } else if (command == "export-alloc") {
            std::string access;
            words >> access;
            auto sharing = must(shared_lazy->ipc(), "ipc view");
            send_export(sharing.export_allocation(*shared, access_named(access)));
        } else if (command == "check-alloc") {
            std::string which;
            words >> which;
            expect_bytes(shared->address, shared->size, which);
            answer("ok " + which + " bytes seen");
        } else if (command == "finish") {
            // The exporter lets go while the importer may still map the prefix or the allocation.
            if (sequence) {
                (void)must(lazy->release(*sequence), "release");
                (void)must(mapping->release_prefix(prefix), "release_prefix");
            }
            if (shared) {
                (void)must(shared_lazy->release(*shared), "release");
                const allocator_usage usage = must(shared_lazy->query_usage(), "query_usage");
                if (usage.live_allocations != 0 || usage.mapped_bytes != 0) {
                    give_up("the exporter still counts a released allocation");
                }
            }
            shared_lazy.reset();
            mapping.reset();
            lazy.reset();
            (void)must(module->try_unload(), "try_unload");
            module.reset();
            const std::size_t descriptors = open_descriptors();
            if (descriptors != descriptors_before) {
                give_up("descriptors " + std::to_string(descriptors_before) + " before, " +
                        std::to_string(descriptors) + " after");
            }
            answer("ok clean");
            return 0;
        } else {
            give_up("unknown command " + command);
        }
    }
}

int run_decode(const std::string& plugin, std::size_t descriptors_before) {
    auto module = must(host::plugin_module::load(plugin), "load");
    std::optional<host::plugin_allocator<cpu_device>> lazy;
    lazy.emplace(must(host::open_allocator<cpu_device>(module, "posix-lazy"), "open"));
    std::optional<host::shared_mapping_view<cpu_device>> mapping_view(
        must(lazy->shared_mapping(), "shared mapping"));
    std::optional<host::ipc_view<cpu_device>> sharing_view(must(lazy->ipc(), "ipc view"));
    auto& mapping = *mapping_view;
    auto& sharing = *sharing_view;
    std::optional<host::ipc_handle> received;
    std::optional<host::imported_memory<cpu_device>> imported;
    std::optional<host::imported_memory<cpu_device>> imported_allocation;
    std::vector<allocation<cpu_device>> sequences;
    for (;;) {
        std::istringstream words(next_command());
        std::string command;
        words >> command;
        if (command == "import") {
            std::string access;
            words >> access;
            received.emplace(must(host::receive_handle(data), "receive_handle"));
            const std::uint32_t wanted = access_named(access);
            if (received->access() == NXMEM_IPC_READ_ONLY) {
                // A read-write import of a read-only handle is refused before anything is mapped.
                auto refused = sharing.import(*received, NXMEM_IPC_READ_WRITE);
                if (refused || refused.error().code != status_code::invalid_argument) {
                    give_up("a read-write import of a read-only handle was not refused");
                }
                // Not even this process's copy of the descriptor reopens writable (root may).
                const std::string path = "/proc/self/fd/" + std::to_string(received->record().fds[0]);
                const int writable = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
                if (writable >= 0) {
                    ::close(writable);
                    if (::geteuid() != 0) {
                        give_up("a read-only handle's memfd reopened read-write");
                    }
                }
            }
            imported.emplace(must(sharing.import(*received, wanted), "import"));
            answer("ok imported " + std::to_string(imported->mapped_bytes()));
        } else if (command == "replay") {
            auto again = sharing.import(*received, imported->access());
            if (again || again.error().code != status_code::invalid_argument) {
                give_up("a replayed handle was not refused");
            }
            received.reset(); // the descriptors are the import's business now
            answer("ok replay refused: " + again.error().message);
        } else if (command == "map") {
            std::size_t count = 0;
            words >> count;
            const host::shared_prefix prefix = imported->prefix();
            for (std::size_t index = 0; index < count; ++index) {
                sequences.push_back(must(lazy->allocate(prefix.size + 4096, 4096), "allocate"));
                auto committed = must(mapping.commit_prefix(sequences.back(), prefix), "commit_prefix");
                if (committed.newly_mapped_bytes != 0) {
                    give_up("an imported prefix was costed in the importer");
                }
            }
            answer("ok mapped " + std::to_string(count));
        } else if (command == "verify") {
            const std::uint64_t size = imported->size();
            std::uint64_t seen = 0;
            for (const auto& sequence : sequences) {
                const auto* memory = static_cast<const unsigned char*>(sequence.address);
                for (std::uint64_t index = 0; index < size; ++index) {
                    if (memory[index] != pattern(index)) {
                        give_up("byte " + std::to_string(index) + " differs");
                    }
                }
                seen += size;
            }
            if (imported->access() == NXMEM_IPC_READ_ONLY && !sequences.empty() &&
                ::mprotect(sequences.front().address, 4096, PROT_READ | PROT_WRITE) == 0) {
                give_up("a read-only import's mapping became writable");
            }
            const allocator_usage usage = must(lazy->query_usage(), "query_usage");
            answer("ok verified " + std::to_string(seen) + " imported_bytes " +
                   std::to_string(usage.imported_bytes) + " shared_prefix_bytes " +
                   std::to_string(usage.shared_prefix_bytes) + " live_imports " +
                   std::to_string(usage.live_imports));
        } else if (command == "import-alloc") {
            std::string access;
            words >> access;
            host::ipc_handle handle = must(host::receive_handle(data), "receive_handle");
            const std::uint32_t wanted = access_named(access);
            imported_allocation.emplace(must(sharing.import(handle, wanted), "import"));
            if (wanted == NXMEM_IPC_READ_ONLY &&
                ::mprotect(imported_allocation->address(), 4096, PROT_READ | PROT_WRITE) == 0) {
                give_up("a read-only allocation import became writable");
            }
            answer("ok imported " + std::to_string(imported_allocation->mapped_bytes()));
        } else if (command == "read-alloc") {
            std::string which;
            words >> which;
            expect_bytes(imported_allocation->address(), imported_allocation->size(), which);
            const allocator_usage usage = must(lazy->query_usage(), "query_usage");
            answer("ok " + which + " bytes read; imported_bytes " + std::to_string(usage.imported_bytes) +
                   " mapped_bytes " + std::to_string(usage.mapped_bytes));
        } else if (command == "write-alloc") {
            auto* memory = static_cast<unsigned char*>(imported_allocation->address());
            for (std::uint64_t index = 0; index < imported_allocation->size(); ++index) {
                memory[index] = written_pattern(index);
            }
            answer("ok written");
        } else if (command == "unload-refused") {
            auto refused = module->try_unload();
            if (refused || refused.error().code != status_code::busy) {
                give_up("unload was not refused while an import lives");
            }
            answer("ok " + refused.error().message);
        } else if (command == "finish") {
            for (const auto& sequence : sequences) {
                (void)must(lazy->release(sequence), "release");
            }
            if (imported) {
                (void)must(imported->close(), "close_import");
            }
            if (imported_allocation) {
                (void)must(imported_allocation->close(), "close_import");
            }
            const allocator_usage usage = must(lazy->query_usage(), "query_usage");
            if (usage.live_imports != 0 || usage.imported_bytes != 0) {
                give_up("imports still counted after close");
            }
            imported.reset();
            imported_allocation.reset();
            received.reset();
            sharing_view.reset();
            mapping_view.reset();
            lazy.reset();
            (void)must(module->try_unload(), "try_unload");
            module.reset();
            const std::size_t descriptors = open_descriptors();
            if (descriptors != descriptors_before) {
                give_up("descriptors " + std::to_string(descriptors_before) + " before, " +
                        std::to_string(descriptors) + " after");
            }
            answer("ok clean");
            return 0;
        } else {
            give_up("unknown command " + command);
        }
    }
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s prefill|decode PLUGIN CONTROL_FD DATA_FD\n", argv[0]);
        return 2;
    }
    control = std::atoi(argv[3]);
    data = std::atoi(argv[4]);
    const std::size_t descriptors_before = open_descriptors();
    const std::string role = argv[1];
    return role == "prefill" ? run_prefill(argv[2], descriptors_before)
                             : run_decode(argv[2], descriptors_before);
}
