// What a test that exports cuda-vmm memory and the importing process (cuda_ipc_peer) agree on:
// the bytes the exporter writes, the marker the importer writes back, and how the importer is
// started (fork + exec, with one end of a SOCK_SEQPACKET socket pair that carries the handle).
// Used on the fake driver (cuda_ipc_test.cpp) and on a GPU (cuda_gpu_test.cpp) alike: the peer
// reads and writes device memory with cuMemcpyDtoH/HtoD only.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace nxmem::test {

// Byte `index` of the exported memory.
inline unsigned char exported_byte(std::uint64_t index) noexcept {
    return static_cast<unsigned char>((index * 131 + 7) & 0xFF);
}

// What a read-write importer writes at offset 0 once it has read everything.
inline constexpr char importer_marker[] = "written by the importing process";

// exit statuses of cuda_ipc_peer: 0 all held, else the step that did not (it says why on stderr)
inline const char* peer_step(int status) noexcept {
    static const char* const steps[] = {"none",
                                        "arguments",
                                        "the driver for copies",
                                        "loading the plugin and opening cuda-vmm",
                                        "receiving the handle",
                                        "import",
                                        "usage counts the import apart",
                                        "a sequence maps the imported prefix",
                                        "reading the exporter's bytes",
                                        "writing the marker",
                                        "a replay while the import lives is refused",
                                        "unload refused while the import lives",
                                        "closing the import and unloading"};
    return status >= 0 && status < static_cast<int>(sizeof steps / sizeof *steps) ? steps[status]
                                                                                   : "unknown";
}

// The importing process, started with its end of a socket pair; the handle goes through
// `socket()`. `access` is "rw" or "ro". finish() waits for it; the destructor kills it if not.
class importer_process {
public:
    importer_process(const std::string& peer, const std::string& plugin, const std::string& access) {
        int pair[2] = {-1, -1};
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
            return;
        }
        pid_ = ::fork();
        if (pid_ == 0) {
            const int kept = ::dup(pair[1]); // without close-on-exec
            ::execl(peer.c_str(), peer.c_str(), plugin.c_str(), std::to_string(kept).c_str(),
                    access.c_str(), static_cast<char*>(nullptr));
            std::_Exit(127);
        }
        ::close(pair[1]);
        socket_ = pair[0];
    }
    importer_process(const importer_process&) = delete;
    importer_process& operator=(const importer_process&) = delete;
    ~importer_process() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            (void)::waitpid(pid_, nullptr, 0);
        }
        if (socket_ >= 0) {
            ::close(socket_);
        }
    }

    bool started() const noexcept { return pid_ > 0 && socket_ >= 0; }
    int socket() const noexcept { return socket_; }

    // The exit status (a step number), or -1 if it died of a signal.
    int finish() {
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }

private:
    pid_t pid_ = -1;
    int socket_ = -1;
};

} // namespace nxmem::test
