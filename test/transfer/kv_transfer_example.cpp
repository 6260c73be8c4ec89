// The example that is a test (docs/TRANSFER.md, "Prefill and decode"): a prefill process fills
// KV blocks in a pool over posix-lazy and a shared prefix, registers both with a transfer agent (the
// pool once, its reservation) and
// sends its metadata, its regions and the descriptors of the blocks a sequence needs; a decode
// process pulls a strided set of the blocks and the prefix into its own memory, checks every
// byte, and notifies the prefill, which waits for both notifications. Each then deregisters,
// releases and unloads the plugin, and checks the unload succeeded.
//
//   kv_transfer_example tcp | sm      two processes on this machine, UCX_TLS=tcp or shared memory
//   kv_transfer_example netns         two network namespaces the test makes (a veth pair, its own
//                                     10.231.x.y/30 addresses), TCP between them; exits 77 saying
//                                     why when namespaces cannot be made (not root, no `ip`)
//   kv_transfer_example kill-tcp | kill-sm
//                                     the prefill is killed while the decode's read is in flight:
//                                     the read fails (or had completed whole), later transfers
//                                     fail, and the decode deregisters, releases and unloads.
//
// Bounded: every wait has a timeout and the whole run an alarm (90 s); the namespaces are removed
// on every exit path, and stale ones of dead runs are removed first.
#include <nxmem/host.hpp>
#include <nxmem/transfer.hpp>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace nxmem;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t block_bytes = 16 * 1024;
constexpr std::uint64_t block_count = 64;
constexpr std::uint64_t kv_bytes = block_bytes * block_count;
constexpr std::uint64_t prefix_bytes = 8 * 4096;
constexpr std::uint64_t big_bytes = 64ull << 20; // the read a kill interrupts

[[noreturn]] void die(const std::string& role, const std::string& what) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: FAILED: %s\n", role.c_str(), what.c_str());
    std::fflush(stderr);
    _exit(1);
}
template <class T> T take(const std::string& role, result<T> outcome, const char* what) {
    if (!outcome) {
        die(role, std::string(what) + ": " + outcome.error().describe());
    }
    return std::move(outcome).value();
}
void take(const std::string& role, result<void> outcome, const char* what) {
    if (!outcome) {
        die(role, std::string(what) + ": " + outcome.error().describe());
    }
}

std::uint8_t kv_byte(std::uint64_t block, std::uint64_t offset) {
    return static_cast<std::uint8_t>(block * 37 + offset * 11 + (offset >> 8));
}
std::uint8_t prefix_byte(std::uint64_t offset) { return static_cast<std::uint8_t>(0xA5 ^ (offset * 7)); }

// One message on a SOCK_SEQPACKET socket, with a timeout.
void send_message(const std::string& role, int socket, const std::vector<std::byte>& bytes) {
    if (::send(socket, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
        die(role, "send: " + std::string(std::strerror(errno)));
    }
}
std::vector<std::byte> receive_message(const std::string& role, int socket) {
    std::vector<std::byte> bytes(1 << 20);
    const ssize_t got = ::recv(socket, bytes.data(), bytes.size(), 0);
    if (got <= 0) {
        die(role, "receive: " + (got == 0 ? std::string("the peer closed the socket") : std::strerror(errno)));
    }
    bytes.resize(static_cast<std::size_t>(got));
    return bytes;
}
std::vector<std::byte> text(std::string_view words) {
    const auto* first = reinterpret_cast<const std::byte*>(words.data());
    return {first, first + words.size()};
}

struct mode {
    std::string name;
    std::string transports;
    bool kill = false;
    bool netns = false;
};

// Leaves only `path` to unload: every test ends with the plugin unmapped.
void unload(const std::string& role, std::shared_ptr<host::plugin_module>& module) {
    take(role, module->try_unload(), "unload");
}

// ---- prefill ----

int run_prefill(const mode& chosen, int socket) {
    const std::string role = "prefill";
    auto module = take(role, host::plugin_module::load(std::getenv("NXMEM_POSIX_PLUGIN")), "load");
    {
        auto lazy = take(role, host::open_allocator<cpu_device>(module, "posix-lazy"), "open posix-lazy");
        auto mapping = take(role, lazy.shared_mapping(), "shared mapping");
        // The KV blocks: one span of a pool over posix-lazy, each block an offset into it.
        auto pool = take(role, host::open_pooled_allocator<cpu_device>(module, "posix-lazy"), "open a pool");
        const std::uint64_t arena_bytes = chosen.kill ? big_bytes : kv_bytes;
        const allocation<cpu_device> kv = take(role, pool->allocate(arena_bytes, 4096), "allocate the KV blocks");
        auto* bytes = static_cast<std::uint8_t*>(kv.address);
        for (std::uint64_t b = 0; b < block_count; ++b) {
            for (std::uint64_t i = 0; i < block_bytes; ++i) {
                bytes[b * block_bytes + i] = kv_byte(b, i);
            }
        }
        // A shared prefix committed at the start of a sequence, written through it.
        const host::shared_prefix prefix = take(role, mapping.create_prefix(prefix_bytes), "create a prefix");
        const allocation<cpu_device> sequence = take(role, lazy.allocate(prefix_bytes * 2, 4096), "allocate a sequence");
        take(role, mapping.commit_prefix(sequence, prefix), "commit the prefix");
        for (std::uint64_t i = 0; i < prefix_bytes; ++i) {
            static_cast<std::uint8_t*>(sequence.address)[i] = prefix_byte(i);
        }

        auto agent = take(role, transfer::agent::start({"prefill", chosen.transports, true}), "start the agent");
        // The pool is registered once (its reservation); the KV span lies inside.
        auto pool_registrations = take(role, agent.register_pool(pool), "register the pool");
        if (pool_registrations.size() != 1) {
            die(role, "a pool growing by commit registered " + std::to_string(pool_registrations.size()) + " regions");
        }
        transfer::registration& kv_registration = pool_registrations.front();
        const std::uint64_t kv_base = transfer::describe(kv).address;
        auto prefix_registration =
            take(role, agent.register_prefix_mapping(lazy, sequence, prefix), "register the prefix mapping");
        // While registered, the memory stays: a release of the prefix's allocation is refused,
        // and the pool gives nothing back.
        if (lazy.release(sequence).has_value()) {
            die(role, "a registered allocation was released");
        }
        if (pool->trim(0) != 0) {
            die(role, "a registered pool gave memory back");
        }

        // What the decode needs: who we are, what it may touch, and which blocks it wants
        // (every other block from block 1: 1, 3, 5, ... 31; and the whole prefix).
        transfer::descriptor_list wanted;
        take(role, wanted.add(transfer::strided_descriptor{kv_base + block_bytes, block_bytes,
                                                           2 * block_bytes, 16}),
             "describe the blocks");
        take(role, wanted.add(take(role, prefix_registration.describe(0, prefix_bytes), "describe the prefix")),
             "describe the prefix");
        send_message(role, socket, take(role, agent.metadata(), "metadata"));
        send_message(role, socket, take(role, agent.export_regions({&kv_registration, &prefix_registration}), "regions"));
        if (chosen.kill) {
            // The whole arena as blocks of 16 KiB: a batch (batch messages over tcp, a get per
            // block over shared memory).
            transfer::descriptor_list everything;
            take(role, everything.add(transfer::strided_descriptor{kv_base, block_bytes, block_bytes, big_bytes / block_bytes}),
                 "describe");
            send_message(role, socket, everything.serialise());
            // Wait to be killed, progressing (the agent's thread serves the read).
            (void)receive_message(role, socket);
            die(role, "was not killed");
        }
        send_message(role, socket, wanted.serialise());

        // The decode notifies once per read; its final word comes over the socket.
        for (const char* expected : {"kv blocks arrived", "prefix arrived"}) {
            const transfer::notification arrived = take(role, agent.wait_notification(60s), "wait for a notification");
            if (arrived.message != text(expected)) {
                die(role, "an unexpected notification");
            }
        }
        const std::vector<std::byte> verdict = receive_message(role, socket);
        if (verdict != text("checked")) {
            die(role, "the decode reported: " + std::string(reinterpret_cast<const char*>(verdict.data()), verdict.size()));
        }
        take(role, kv_registration.deregister(), "deregister");
        take(role, prefix_registration.deregister(), "deregister");
        take(role, pool->release(kv), "release the KV blocks");
        take(role, lazy.release(sequence), "release the sequence");
        take(role, mapping.release_prefix(prefix), "release the prefix");
    }
    unload(role, module);
    std::printf("prefill: %llu blocks and a %llu-byte prefix served; unloaded\n",
                static_cast<unsigned long long>(block_count), static_cast<unsigned long long>(prefix_bytes));
    return 0;
}

// ---- decode ----

int run_decode(const mode& chosen, int socket, int control) {
    const std::string role = "decode";
    auto module = take(role, host::plugin_module::load(std::getenv("NXMEM_POSIX_PLUGIN")), "load");
    {
        auto agent = take(role, transfer::agent::start({"decode", chosen.transports, false}), "start the agent");
        auto prefill = take(role, agent.connect(receive_message(role, socket)), "connect");
        take(role, prefill.load_regions(receive_message(role, socket)), "load the regions");
        const transfer::descriptor_list remote =
            take(role, transfer::descriptor_list::parse(receive_message(role, socket)), "parse the descriptors");

        // The decode's own pool, registered once; what it pulls lands in one span of it.
        auto pool = take(role, host::open_pooled_allocator<cpu_device>(module, "posix-lazy"), "open a pool");
        const std::uint64_t local_bytes = remote.total_bytes();
        const allocation<cpu_device> mine = take(role, pool->allocate(local_bytes, 4096), "allocate");
        std::memset(mine.address, 0, local_bytes);
        auto pool_registrations = take(role, agent.register_pool(pool), "register the pool");
        transfer::registration& registered = pool_registrations.front();
        const std::uint64_t mine_base = transfer::describe(mine).address;

        if (chosen.kill) {
            transfer::descriptor_list local;
            take(role, local.add(transfer::strided_descriptor{mine_base, block_bytes, block_bytes, local_bytes / block_bytes}),
                 "describe");
            auto read = take(role, agent.read(prefill, local, remote), "read");
            const char go = 'k';
            if (::write(control, &go, 1) != 1 || ::read(control, const_cast<char*>(&go), 1) != 1) {
                die(role, "the parent did not kill the prefill");
            }
            // tcp reports the death; shared memory cannot (UCX 1.13): the timeout and a forced
            // disconnect end the read then.
            std::printf("decode: the peer's death %s reported by UCX; the read goes as %s\n",
                        prefill.detects_failure() ? "is" : "is not",
                        prefill.uses_messages() ? "batch messages" : "a get per block");
            result<void> outcome = read.wait(prefill.detects_failure() ? 30s : 2s);
            if (!outcome && outcome.error().code == status_code::busy) {
                prefill.disconnect(true);
                outcome = read.wait(10s);
            }
            const bool failed = !outcome.has_value();
            if (!failed) {
                // Completed before the kill: then whole.
                for (std::uint64_t b = 0; b < block_count; ++b) {
                    if (static_cast<std::uint8_t*>(mine.address)[b * block_bytes + 5] != kv_byte(b, 5)) {
                        die(role, "a read that reported success left block " + std::to_string(b) + " incomplete");
                    }
                }
            } else if (outcome.error().code == status_code::busy) {
                die(role, "the read was still in flight after a forced disconnect");
            }
            std::printf("decode: the read %s (%s)\n", failed ? "failed" : "had completed",
                        failed ? outcome.error().describe().c_str() : "whole");
            // The peer is gone: a new transfer is refused or fails, never hangs.
            if (prefill) {
                auto again = agent.read(prefill, local, remote);
                if (again.has_value()) {
                    auto second = again.value().wait(10s);
                    if (second.has_value()) {
                        die(role, "a read from a killed peer succeeded");
                    }
                    if (second.error().code == status_code::busy) {
                        prefill.disconnect(true);
                        if (again.value().wait(10s).has_value()) {
                            die(role, "a read from a killed peer succeeded");
                        }
                    }
                }
            }
            prefill.disconnect(true);
            take(role, registered.deregister(), "deregister after the peer died");
            take(role, pool->release(mine), "release after the peer died");
            if (pool->usage().live_allocations != 0 || pool->trim(0) == 0) {
                die(role, "allocations left, or the pool still leased, after the peer died");
            }
        } else {
            // The strided blocks, then the prefix: two reads, each notifying the prefill.
            const std::uint64_t kv_wanted = remote.runs()[0].count * block_bytes;
            transfer::descriptor_list kv_local;
            take(role, kv_local.add(transfer::strided_descriptor{mine_base, block_bytes, block_bytes,
                                                                 remote.runs()[0].count}),
                 "describe");
            transfer::descriptor_list kv_remote;
            take(role, kv_remote.add(transfer::strided_descriptor{remote.runs()[0].base, block_bytes,
                                                                  remote.runs()[0].stride, remote.runs()[0].count}),
                 "describe");
            auto kv_read = take(role, agent.read(prefill, kv_local, kv_remote, text("kv blocks arrived")), "read");
            transfer::descriptor_list prefix_local;
            take(role, prefix_local.add(transfer::descriptor{mine_base + kv_wanted, prefix_bytes}), "describe");
            transfer::descriptor_list prefix_remote;
            take(role, prefix_remote.add(remote.runs()[1].block(0)), "describe");
            auto prefix_read =
                take(role, agent.read(prefill, prefix_local, prefix_remote, text("prefix arrived")), "read");
            take(role, kv_read.wait(60s), "the KV read");
            take(role, prefix_read.wait(60s), "the prefix read");

            const auto* got = static_cast<const std::uint8_t*>(mine.address);
            for (std::uint64_t n = 0; n < remote.runs()[0].count; ++n) {
                const std::uint64_t block = 1 + 2 * n;
                for (std::uint64_t i = 0; i < block_bytes; ++i) {
                    if (got[n * block_bytes + i] != kv_byte(block, i)) {
                        send_message(role, socket, text("wrong byte"));
                        die(role, "block " + std::to_string(block) + " byte " + std::to_string(i) + " differs");
                    }
                }
            }
            for (std::uint64_t i = 0; i < prefix_bytes; ++i) {
                if (got[kv_wanted + i] != prefix_byte(i)) {
                    send_message(role, socket, text("wrong prefix byte"));
                    die(role, "prefix byte " + std::to_string(i) + " differs");
                }
            }
            prefill.disconnect();
            send_message(role, socket, text("checked"));
            take(role, registered.deregister(), "deregister");
            take(role, pool->release(mine), "release");
            std::printf("decode: %llu blocks (every other one) and the prefix pulled, every byte checked\n",
                        static_cast<unsigned long long>(remote.runs()[0].count));
        }
    }
    unload(role, module);
    return 0;
}

// ---- network namespaces ----

std::string namespace_name(pid_t owner, char side) { return "nxmem-tx-" + std::to_string(owner) + side; }

int shell(const std::string& command) {
    const int status = std::system((command + " >/dev/null 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Removes namespaces that runs now dead left behind (a run killed by SIGKILL cannot clean up).
void remove_stale_namespaces() {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator("/var/run/netns", ignored)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("nxmem-tx-", 0) != 0) {
            continue;
        }
        const pid_t owner = static_cast<pid_t>(std::atoi(name.c_str() + 9));
        if (owner > 0 && ::kill(owner, 0) != 0 && errno == ESRCH) {
            (void)shell("ip netns delete " + name);
        }
    }
}

struct namespaces {
    pid_t owner = ::getpid();
    bool made = false;
    ~namespaces() {
        if (made) {
            (void)shell("ip netns delete " + namespace_name(owner, 'a'));
            (void)shell("ip netns delete " + namespace_name(owner, 'b'));
        }
    }
};

// Two namespaces joined by a veth pair, 10.231.N.1/30 and .2/30, loopback up in each. Returns
// the reason when they cannot be made.
std::string make_namespaces(namespaces& made) {
    if (::geteuid() != 0) {
        return "network namespaces need root (CAP_SYS_ADMIN); run as root to test two machines";
    }
    if (shell("ip -V") != 0) {
        return "the `ip` command (iproute2) is not installed";
    }
    remove_stale_namespaces();
    const std::string a = namespace_name(made.owner, 'a');
    const std::string b = namespace_name(made.owner, 'b');
    const std::string veth_a = "nxa" + std::to_string(made.owner % 1000000);
    const std::string veth_b = "nxb" + std::to_string(made.owner % 1000000);
    const std::string subnet = "10.231." + std::to_string(made.owner % 250) + ".";
    if (shell("ip netns add " + a) != 0) {
        return "`ip netns add` failed (no permission to make network namespaces here)";
    }
    made.made = true;
    const std::vector<std::string> steps = {
        "ip netns add " + b,
        "ip link add " + veth_a + " type veth peer name " + veth_b,
        "ip link set " + veth_a + " netns " + a,
        "ip link set " + veth_b + " netns " + b,
        "ip -n " + a + " addr add " + subnet + "1/30 dev " + veth_a,
        "ip -n " + b + " addr add " + subnet + "2/30 dev " + veth_b,
        "ip -n " + a + " link set " + veth_a + " up",
        "ip -n " + b + " link set " + veth_b + " up",
        "ip -n " + a + " link set lo up",
        "ip -n " + b + " link set lo up",
    };
    for (const std::string& step : steps) {
        if (shell(step) != 0) {
            return "`" + step + "` failed";
        }
    }
    return {};
}

void enter_namespace(const std::string& role, const std::string& name, const std::string& device) {
    const int fd = ::open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
        die(role, "cannot enter namespace " + name + ": " + std::strerror(errno));
    }
    ::close(fd);
    // As `ip netns exec` does: a mount namespace of our own with /sys of the new network
    // namespace, where UCX looks its interfaces up.
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
        ::umount2("/sys", MNT_DETACH) != 0 || ::mount(name.c_str(), "/sys", "sysfs", 0, nullptr) != 0) {
        die(role, "cannot mount /sys for namespace " + name + ": " + std::strerror(errno));
    }
    // A veth's carrier comes up a moment after both ends are up; UCX lists only interfaces
    // that are up. Wait for it, bounded (no event to wait on short of netlink).
    const std::string operstate = "/sys/class/net/" + device + "/operstate";
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    for (;;) {
        std::FILE* file = std::fopen(operstate.c_str(), "r");
        char state[16] = {};
        if (file != nullptr) {
            (void)!std::fgets(state, sizeof state, file);
            std::fclose(file);
        }
        if (std::strncmp(state, "up", 2) == 0) {
            break;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            die(role, device + " did not come up within 10 s (operstate '" + state + "')");
        }
        ::usleep(10000);
    }
    // Only the veth between the namespaces: UCX must not fall back to the namespace's loopback.
    ::setenv("UCX_NET_DEVICES", device.c_str(), 1);
}

} // namespace

int main(int argc, char** argv) {
    const std::string requested = argc > 1 ? argv[1] : "tcp";
    mode chosen{requested, "tcp", false, false};
    if (requested == "sm" || requested == "kill-sm") {
        chosen.transports = "sm,self";
    }
    chosen.kill = requested.rfind("kill-", 0) == 0;
    chosen.netns = requested == "netns";
    if (std::getenv("NXMEM_POSIX_PLUGIN") == nullptr) {
        std::fprintf(stderr, "NXMEM_POSIX_PLUGIN is not set\n");
        return 1;
    }
    ::alarm(90); // the whole run, children included (they inherit nothing of it: each sets its own)

    namespaces made;
    if (chosen.netns) {
        const std::string why = make_namespaces(made);
        if (!why.empty()) {
            std::printf("SKIP: cannot make two network namespaces: %s\n", why.c_str());
            return 77;
        }
    }
    int sockets[2];
    int control[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0 ||
        ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, control) != 0) {
        std::perror("socketpair");
        return 1;
    }
    const pid_t owner = made.owner;
    const std::string suffix = std::to_string(owner % 1000000);
    const pid_t prefill = ::fork();
    if (prefill == 0) {
        ::alarm(80);
        if (chosen.netns) {
            enter_namespace("prefill", namespace_name(owner, 'a'), "nxa" + suffix);
        }
        const int code = run_prefill(chosen, sockets[0]);
        std::fflush(nullptr);
        _exit(code);
    }
    const pid_t decode = ::fork();
    if (decode == 0) {
        ::alarm(80);
        if (chosen.netns) {
            enter_namespace("decode", namespace_name(owner, 'b'), "nxb" + suffix);
        }
        const int code = run_decode(chosen, sockets[1], control[1]);
        std::fflush(nullptr);
        _exit(code);
    }
    if (chosen.kill) {
        char go = 0;
        if (::read(control[0], &go, 1) == 1) {
            ::kill(prefill, SIGKILL);
            (void)!::write(control[0], &go, 1);
        }
    }
    int prefill_status = 0;
    int decode_status = 0;
    ::waitpid(prefill, &prefill_status, 0);
    ::waitpid(decode, &decode_status, 0);
    const bool prefill_ok = chosen.kill ? (WIFSIGNALED(prefill_status) && WTERMSIG(prefill_status) == SIGKILL)
                                        : (WIFEXITED(prefill_status) && WEXITSTATUS(prefill_status) == 0);
    const bool decode_ok = WIFEXITED(decode_status) && WEXITSTATUS(decode_status) == 0;
    std::printf("%s: prefill %s, decode %s\n", requested.c_str(), prefill_ok ? "ok" : "FAILED",
                decode_ok ? "ok" : "FAILED");
    return prefill_ok && decode_ok ? 0 : 1;
}
