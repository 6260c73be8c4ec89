// Sharing a prefix across two real processes (fork + exec of ipc_peer, never threads): a prefill
// process fills a posix-lazy shared prefix and exports it over a Unix socket; a decode process
// imports it and maps it into several sequences. The same for an allocation (share=memfd): the
// importer reads the exporter's bytes and writes its own, which the exporter reads. The kernel's figures (/proc/PID/smaps_rollup)
// show the prefix counted once across both; SIGKILL of either process at each step leaves the
// other able to finish: its bytes intact, everything released, the module unloaded, no
// descriptor left open.
#include "../support/plugin_paths.hpp"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr std::uint64_t prefix_bytes = 16u << 20; // 16 MiB
constexpr int sequences = 4;
constexpr std::uint64_t allocation_bytes = 4u << 20; // 4 MiB

std::string peer_path() {
    const char* path = std::getenv("NXMEM_IPC_PEER");
    REQUIRE(path != nullptr);
    return path;
}

// One peer process and the control socket the test drives it through.
class peer {
public:
    peer(const std::string& role, int data_fd) {
        int pair[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            // The child's ends must survive exec: duplicates without close-on-exec.
            const int control = ::dup(pair[1]);
            const int data = ::dup(data_fd);
            const std::string plugin = nxmem::test::plugin_path("NXMEM_POSIX_PLUGIN");
            const std::string peer = peer_path();
            ::execl(peer.c_str(), peer.c_str(), role.c_str(), plugin.c_str(),
                    std::to_string(control).c_str(), std::to_string(data).c_str(), nullptr);
            std::_Exit(127);
        }
        ::close(pair[1]);
        control_ = pair[0];
    }
    peer(const peer&) = delete;
    peer& operator=(const peer&) = delete;
    ~peer() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            (void)::waitpid(pid_, nullptr, 0);
        }
        ::close(control_);
    }

    // Sends a command and returns the answer; a "fail" answer fails the test.
    std::string ask(const std::string& command) {
        REQUIRE(::send(control_, command.data(), command.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(command.size()));
        char buffer[512];
        const ssize_t got = ::recv(control_, buffer, sizeof buffer - 1, 0);
        INFO("command: " << command);
        REQUIRE(got > 0);
        const std::string reply(buffer, static_cast<std::size_t>(got));
        INFO("reply: " << reply);
        REQUIRE(reply.rfind("ok", 0) == 0);
        return reply;
    }

    // After `finish`: the process exits 0.
    void expect_clean_exit() {
        int status = 0;
        REQUIRE(::waitpid(pid_, &status, 0) == pid_);
        pid_ = -1;
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }

    void kill_now() {
        REQUIRE(::kill(pid_, SIGKILL) == 0);
        int status = 0;
        REQUIRE(::waitpid(pid_, &status, 0) == pid_);
        CHECK(WIFSIGNALED(status));
        pid_ = -1;
    }

    pid_t pid() const noexcept { return pid_; }

private:
    pid_t pid_ = -1;
    int control_ = -1;
};

// A "Key:   1234 kB" field of /proc/PID/smaps_rollup, in bytes.
std::uint64_t rollup_bytes(pid_t pid, const std::string& key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key + ":", 0) == 0) {
            std::istringstream fields(line.substr(key.size() + 1));
            std::uint64_t kilobytes = 0;
            fields >> kilobytes;
            return kilobytes * 1024;
        }
    }
    FAIL("no " << key << " in /proc/" << pid << "/smaps_rollup");
    return 0;
}

struct data_channel {
    data_channel() { REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) == 0); }
    ~data_channel() {
        ::close(ends[0]);
        ::close(ends[1]);
    }
    int ends[2];
};

// The two peers of a case and the data socket between them.
struct two_peers {
    data_channel channel;
    peer prefill{"prefill", channel.ends[0]};
    peer decode{"decode", channel.ends[1]};
};

// Asks `who` each of commands[from, to).
void ask_each(peer& who, const std::vector<std::string>& commands, std::size_t from = 0,
              std::size_t to = std::string::npos) {
    for (std::size_t step = from; step < std::min(to, commands.size()); ++step) {
        who.ask(commands[step]);
    }
}

// `finish`: everything released, the module unloaded, no descriptor left; the process exits 0.
void finish_clean(peer& who) {
    CHECK(who.ask("finish") == "ok clean");
    who.expect_clean_exit();
}

// The exporter runs `exporting`, the importer the first `done` of `importing`; then one of them
// is killed. The survivor goes on (an importer with the rest of `importing`), runs `afterwards`
// and finishes clean.
void kill_one(const std::vector<std::string>& exporting, const std::vector<std::string>& importing,
              std::size_t done, bool kill_importer, const std::vector<std::string>& afterwards) {
    two_peers peers;
    ask_each(peers.prefill, exporting);
    ask_each(peers.decode, importing, 0, done);
    (kill_importer ? peers.decode : peers.prefill).kill_now();
    peer& survivor = kill_importer ? peers.prefill : peers.decode;
    if (!kill_importer) {
        ask_each(survivor, importing, done);
    }
    ask_each(survivor, afterwards);
    finish_clean(survivor);
}

const std::string fill_command = "fill " + std::to_string(prefix_bytes);
const std::string alloc_command = "alloc " + std::to_string(allocation_bytes);
const std::string map_command = "map " + std::to_string(sequences);

} // namespace

TEST_CASE("a prefill process's prefix is read by a decode process and counted once across both",
          "[ipc][processes]") {
    data_channel channel;
    peer prefill("prefill", channel.ends[0]);
    peer decode("decode", channel.ends[1]);
    prefill.ask(fill_command);
    CHECK(prefill.ask("export rw") == "ok sent 1 descriptors");
    CHECK(decode.ask("import rw") == "ok imported " + std::to_string(prefix_bytes));
    decode.ask("replay");
    decode.ask(map_command);
    const std::string verified = decode.ask("verify");
    CHECK(verified == "ok verified " + std::to_string(sequences * prefix_bytes) + " imported_bytes " +
                          std::to_string(prefix_bytes) + " shared_prefix_bytes 0 live_imports 1");

    // The prefix's pages are mapped once in the prefill process and four times in the decode
    // process: each process's RSS counts them in full (five times over), their PSS once.
    const std::uint64_t rss = rollup_bytes(prefill.pid(), "Rss") + rollup_bytes(decode.pid(), "Rss");
    const std::uint64_t pss_shmem =
        rollup_bytes(prefill.pid(), "Pss_Shmem") + rollup_bytes(decode.pid(), "Pss_Shmem");
    std::cout << "two processes: prefix " << prefix_bytes << " B, bytes read across processes "
              << sequences * prefix_bytes << " B, Pss_Shmem of both " << pss_shmem
              << " B, Rss of both " << rss << " B\n";
    // Each process's figure is rounded down to a KiB: 4 KiB is the slack for two of them.
    CHECK(pss_shmem + 4096 >= prefix_bytes);
    CHECK(pss_shmem < prefix_bytes + prefix_bytes / 16);
    CHECK(rss >= 2 * prefix_bytes);

    decode.ask("unload-refused");
    // The exporter releases everything and exits; the import stays valid.
    CHECK(prefill.ask("finish") == "ok clean");
    prefill.expect_clean_exit();
    decode.ask("verify");
    CHECK(decode.ask("finish") == "ok clean");
    decode.expect_clean_exit();
}

TEST_CASE("a read-only export cannot be written or imported writable", "[ipc][processes]") {
    data_channel channel;
    peer prefill("prefill", channel.ends[0]);
    peer decode("decode", channel.ends[1]);
    prefill.ask(fill_command);
    prefill.ask("export ro");
    decode.ask("import ro"); // refuses a read-write import of it first, and a writable reopen
    decode.ask(map_command);
    decode.ask("verify"); // and mprotect(PROT_WRITE) of a mapping fails
    CHECK(decode.ask("finish") == "ok clean");
    decode.expect_clean_exit();
    CHECK(prefill.ask("finish") == "ok clean");
    prefill.expect_clean_exit();
}

TEST_CASE("killing the decode process at any step leaves the prefill process clean",
          "[ipc][processes]") {
    const std::vector<std::string> steps{"import rw", "replay", map_command, "verify"};
    for (std::size_t killed_after = 0; killed_after <= steps.size(); ++killed_after) {
        DYNAMIC_SECTION("decode killed after " << killed_after << " steps") {
            kill_one({fill_command, "export rw"}, steps, killed_after, true, {});
        }
    }
}

TEST_CASE("killing the prefill process at any step leaves the decode process clean",
          "[ipc][processes]") {
    // The prefill process dies after exporting, then after each of the decode's steps; the decode
    // process goes on from there and finishes with the bytes intact.
    const std::vector<std::string> steps{"import rw", "replay", map_command, "verify"};
    for (std::size_t killed_after = 0; killed_after < steps.size(); ++killed_after) {
        DYNAMIC_SECTION("prefill killed after " << killed_after << " decode steps") {
            kill_one({fill_command, "export rw"}, steps, killed_after, false, {});
        }
    }
}

TEST_CASE("an allocation written by one process is read by another, whose writes the first sees",
          "[ipc][processes]") {
    two_peers peers;
    CHECK(peers.prefill.ask(alloc_command) == "ok allocated " + std::to_string(allocation_bytes));
    CHECK(peers.prefill.ask("export-alloc rw") == "ok sent 1 descriptors");
    CHECK(peers.decode.ask("import-alloc rw") == "ok imported " + std::to_string(allocation_bytes));
    // The importer counts the allocation as imported bytes, never as its own mapped bytes.
    CHECK(peers.decode.ask("read-alloc original") ==
          "ok original bytes read; imported_bytes " + std::to_string(allocation_bytes) + " mapped_bytes 0");
    peers.decode.ask("write-alloc");
    CHECK(peers.prefill.ask("check-alloc written") == "ok written bytes seen");
    std::cout << "two processes: allocation of " << allocation_bytes << " B written by the exporter, "
              << "read by the importer, whose writes the exporter read back\n";
    // The exporter releases the allocation and exits; the importer's mapping stays valid.
    peers.decode.ask("unload-refused");
    finish_clean(peers.prefill);
    peers.decode.ask("read-alloc written");
    finish_clean(peers.decode);
}

TEST_CASE("a read-only allocation import is refused write access", "[ipc][processes]") {
    two_peers peers;
    ask_each(peers.prefill, {alloc_command, "export-alloc ro"});
    // mprotect(PROT_WRITE) of the read-only mapping fails; the bytes are the exporter's.
    ask_each(peers.decode, {"import-alloc ro", "read-alloc original"});
    finish_clean(peers.decode);
    finish_clean(peers.prefill);
}

TEST_CASE("killing either process that shares an allocation leaves the other clean",
          "[ipc][processes]") {
    const std::vector<std::string> steps{"import-alloc rw", "read-alloc original", "write-alloc"};
    for (std::size_t done = 0; done <= steps.size(); ++done) {
        // The exporter then reads the importer's writes if it made them, else its own bytes.
        DYNAMIC_SECTION("the importer killed after " << done << " steps") {
            kill_one({alloc_command, "export-alloc rw"}, steps, done, true,
                     {done == steps.size() ? "check-alloc written" : "check-alloc original"});
        }
        // The handle is in the socket's queue or imported already: either way the bytes live.
        DYNAMIC_SECTION("the exporter killed after " << done << " importer steps") {
            kill_one({alloc_command, "export-alloc rw"}, steps, done, false, {"read-alloc written"});
        }
    }
}
