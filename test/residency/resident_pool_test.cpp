// resident_pool over a native upstream with virtual backing (test/pool/test_upstreams.hpp's
// committing_upstream: PROT_NONE reservations, commit makes pages readable and writable, a
// ledger of committed bytes): every state, every transition, every misuse of docs/HOST.md
// "Residency", and the contents at the same addresses after wake, bitwise.
#include "../pool/test_upstreams.hpp"

#include <nxmem/residency.hpp>

#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace nxmem;
using test::committing_upstream;

namespace {
constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;
constexpr std::uint64_t pass_through = 40 * mib; // above test_options()'s pass_through_bytes

using resident = resident_pool<committing_upstream>;

pool_options test_options() {
    pool_options options;
    options.reserve_bytes = 256 * mib;
    options.pass_through_bytes = 32 * mib;
    return options;
}

template <class T> T value_or_fail(result<T> made) {
    if (!made.has_value()) {
        FAIL(made.error().describe());
    }
    return std::move(made).value();
}

// A byte pattern that differs per allocation and per offset.
std::uint8_t pattern(std::size_t which, std::size_t at) { return static_cast<std::uint8_t>(which * 131 + at * 7 + 1); }
void fill(const allocation<cpu_device>& live, std::size_t which) {
    auto* bytes = static_cast<std::uint8_t*>(live.address);
    for (std::size_t at = 0; at < live.size; ++at) {
        bytes[at] = pattern(which, at);
    }
}
bool holds(const allocation<cpu_device>& live, std::size_t which) {
    const auto* bytes = static_cast<const std::uint8_t*>(live.address);
    for (std::size_t at = 0; at < live.size; ++at) {
        if (bytes[at] != pattern(which, at)) {
            return false;
        }
    }
    return true;
}

// Small blocks, spans and a pass-through: every layer of the pool commits something.
std::vector<allocation<cpu_device>> fill_every_layer(resident& pool) {
    std::vector<allocation<cpu_device>> live;
    for (std::uint64_t size : {64 * std::uint64_t{1}, 1 * kib, 16 * kib, 200 * kib, 3 * mib, pass_through}) {
        live.push_back(value_or_fail(pool.allocate(size, 64)));
        fill(live.back(), live.size());
    }
    return live;
}
bool all_hold(const std::vector<allocation<cpu_device>>& live) {
    for (std::size_t index = 0; index < live.size(); ++index) {
        if (!holds(live[index], index + 1)) {
            return false;
        }
    }
    return true;
}
std::uint64_t committed_now(resident& pool) {
    std::lock_guard lock(pool.upstream().commits->mutex);
    return pool.upstream().commits->committed_bytes;
}
std::size_t entries_in(const std::string& directory) {
    std::size_t count = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) {
        ++count;
    }
    return count;
}
std::size_t open_descriptors() {
    return entries_in("/proc/self/fd");
}
struct scratch_directory {
    scratch_directory() {
        std::string pattern = (std::filesystem::temp_directory_path() / "nxmem-residency-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~scratch_directory() { std::filesystem::remove_all(path); }
    std::string path;
};
} // namespace

static_assert(assert_device_allocator<resident>(), "a resident pool is a DeviceAllocator");

TEST_CASE("host backup: asleep, the upstream holds no committed byte; awake, every byte is back at its address", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    const std::uint64_t committed = committed_now(pool);
    REQUIRE(committed >= 44 * mib);
    REQUIRE(pool.residency().committed_bytes == committed);

    auto slept = value_or_fail(pool.sleep(sleep_policy::host()));
    CHECK(slept.pools == 1);
    CHECK(slept.bytes == committed);
    CHECK(slept.backed_up_bytes == committed);
    CHECK(committed_now(pool) == 0);
    const residency_usage asleep = pool.residency();
    CHECK(asleep.state == residency_state::asleep);
    CHECK(asleep.asleep_bytes == committed);
    CHECK(asleep.backed_up_bytes == committed);
    CHECK(asleep.committed_bytes == 0);
    CHECK(asleep.policy == sleep_policy_kind::host);
    CHECK(asleep.backup_location == "host memory");
    CHECK(asleep.pool.live_allocations == live.size()); // the pool's records do not change

    auto woken = value_or_fail(pool.wake());
    CHECK(woken.pools == 1);
    CHECK(woken.bytes == committed);
    CHECK(committed_now(pool) == committed);
    CHECK(all_hold(live));
    CHECK(pool.residency().asleep_bytes == 0);
    for (const auto& one : live) {
        REQUIRE(pool.release(one));
    }
    CHECK(pool.upstream().commits->bad_calls == 0);
}

TEST_CASE("discard: nothing is kept, wake commits the same ranges and the memory is usable again", "[residency]") {
    resident pool("kv", test_options());
    auto live = fill_every_layer(pool);
    const std::uint64_t committed = committed_now(pool);
    auto slept = value_or_fail(pool.sleep(sleep_policy::discard()));
    CHECK(slept.bytes == committed);
    CHECK(slept.backed_up_bytes == 0);
    CHECK(pool.residency().backed_up_bytes == 0);
    value_or_fail(pool.wake());
    CHECK(committed_now(pool) == committed);
    // Refilled: the KV cache's way.
    for (std::size_t index = 0; index < live.size(); ++index) {
        fill(live[index], index + 1);
    }
    CHECK(all_hold(live));
}

TEST_CASE("file backup: an unnamed file while asleep (the directory stays empty), closed at wake, contents back", "[residency]") {
    scratch_directory directory;
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    const std::size_t descriptors = open_descriptors();
    auto slept = value_or_fail(pool.sleep(sleep_policy::file_in(directory.path)));
    CHECK(slept.backed_up_bytes == committed_now(pool) + slept.bytes);
    CHECK(entries_in(directory.path) == 0);
    CHECK(open_descriptors() == descriptors + 1);
    CHECK(pool.residency().backup_location == "an unnamed file in " + directory.path);
    value_or_fail(pool.wake());
    CHECK(open_descriptors() == descriptors);
    CHECK(all_hold(live));
}

TEST_CASE("file backup to the engine's descriptor: written from 0, truncated at wake", "[residency]") {
    scratch_directory directory;
    const std::string name = directory.path + "/backup";
    const int descriptor = ::open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(descriptor >= 0);
    {
        resident pool("weights", test_options());
        auto live = fill_every_layer(pool);
        auto slept = value_or_fail(pool.sleep(sleep_policy::file_descriptor(descriptor)));
        struct stat written {};
        REQUIRE(::fstat(descriptor, &written) == 0);
        CHECK(static_cast<std::uint64_t>(written.st_size) == slept.backed_up_bytes);
        value_or_fail(pool.wake());
        REQUIRE(::fstat(descriptor, &written) == 0);
        CHECK(written.st_size == 0);
        CHECK(all_hold(live));
    }
    ::close(descriptor);
}

TEST_CASE("asleep: allocate is refused with BUSY before the pool is touched; release works and drops its backup", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    const pool_usage before = pool.usage();
    value_or_fail(pool.sleep(sleep_policy::host()));
    const auto refused = pool.allocate(64, 16);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::busy);
    CHECK_THAT(refused.error().message, Catch::Contains("'weights'") && Catch::Contains("asleep"));
    CHECK(pool.usage() == before);

    // The pass-through: given back once, its backup dropped.
    const std::uint64_t backed_up = pool.residency().backed_up_bytes;
    const std::uint64_t releases = pool.upstream().ledger()->releases;
    REQUIRE(pool.release(live.back()));
    CHECK(pool.upstream().ledger()->releases == releases + 1);
    CHECK(pool.residency().backed_up_bytes <= backed_up - pass_through);
    CHECK(pool.residency().asleep_bytes <= backed_up - pass_through);
    live.pop_back();
    // A small block and a span: the pool's records change, the memory is not touched.
    REQUIRE(pool.release(live.front()));
    live.erase(live.begin());
    CHECK(pool.trim(0) == 0); // leased while asleep: nothing is given back twice

    value_or_fail(pool.wake());
    for (std::size_t index = 0; index < live.size(); ++index) {
        CHECK(holds(live[index], index + 2));
    }
    CHECK(pool.upstream().ledger()->bad_releases == 0);
    CHECK(pool.upstream().commits->bad_calls == 0);
}

TEST_CASE("sleeping twice and waking twice change nothing the second time", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    CHECK(value_or_fail(pool.wake()).unchanged_pools == 1); // awake already
    CHECK(value_or_fail(pool.sleep(sleep_policy::host())).pools == 1);
    const auto again = value_or_fail(pool.sleep(sleep_policy::discard()));
    CHECK(again.pools == 0);
    CHECK(again.unchanged_pools == 1);
    CHECK(pool.residency().policy == sleep_policy_kind::host); // the first sleep's backup stands
    CHECK(value_or_fail(pool.wake()).pools == 1);
    CHECK(value_or_fail(pool.wake()).unchanged_pools == 1);
    CHECK(all_hold(live));
}

TEST_CASE("a wake the upstream cannot commit leaves the pool asleep with nothing lost, and says so", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    const std::uint64_t committed = committed_now(pool);
    REQUIRE(value_or_fail(pool.sleep(sleep_policy::host())).ranges >= 2); // the reservation's, the pass-through's
    auto& commits = *pool.upstream().commits;
    {
        std::lock_guard lock(commits.mutex);
        commits.refuse_commits_from = commits.commits + 2; // the first range commits, the second is refused
    }
    const auto refused = pool.wake();
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::out_of_memory);
    CHECK_THAT(refused.error().message, Catch::Contains("stays asleep") && Catch::Contains("'weights'"));
    CHECK(pool.state() == residency_state::asleep);
    CHECK(committed_now(pool) == 0); // what this wake committed went back
    CHECK(pool.residency().asleep_bytes == committed);
    CHECK(pool.residency().backed_up_bytes == committed);
    {
        std::lock_guard lock(commits.mutex);
        commits.refuse_commits_from = UINT64_MAX;
    }
    value_or_fail(pool.wake());
    CHECK(all_hold(live));
    CHECK(commits.bad_calls == 0);
}

TEST_CASE("a leased pool (a transfer registration, an export) refuses to sleep and stays awake", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    {
        pool_lease held = pool.lease();
        const auto refused = pool.sleep(sleep_policy::discard());
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::busy);
        CHECK_THAT(refused.error().message, Catch::Contains("1 lease(s)"));
        CHECK(pool.state() == residency_state::awake);
        CHECK(all_hold(live));
        CHECK(pool.allocate(64, 16).has_value());
    }
    CHECK(value_or_fail(pool.sleep(sleep_policy::discard())).pools == 1);
}

TEST_CASE("a backup that cannot be made refuses the sleep and leaves the pool awake and untouched", "[residency]") {
    resident pool("weights", test_options());
    auto live = fill_every_layer(pool);
    const std::uint64_t committed = committed_now(pool);
    const auto refused = pool.sleep(sleep_policy::file_in("/nonexistent/nxmem-residency"));
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::invalid_argument);
    CHECK_THAT(refused.error().message, Catch::Contains("/nonexistent/nxmem-residency") && Catch::Contains("stays awake"));
    CHECK(pool.state() == residency_state::awake);
    CHECK(committed_now(pool) == committed);
    CHECK(all_hold(live));
    CHECK(pool.allocate(64, 16).has_value());
}

TEST_CASE("a pool that grows by allocation cannot sleep: UNSUPPORTED_CAPABILITY, awake", "[residency]") {
    pool_options options = test_options();
    options.growth = pool_growth::by_allocation;
    resident pool("weights", options);
    // Its chunks are the upstream's reservations, never committed: not touched here.
    REQUIRE(pool.allocate(64, 16).has_value());
    const auto refused = pool.sleep(sleep_policy::discard());
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::unsupported_capability);
    CHECK_THAT(refused.error().message, Catch::Contains("does not grow by commit"));
    CHECK(pool.state() == residency_state::awake);
    CHECK(pool.allocate(64, 16).has_value());
}

TEST_CASE("tags: a group sleeps and wakes by tag; an unknown tag is refused before anything moves; a destroyed pool is forgotten",
          "[residency]") {
    residency_tags tags;
    auto weights = std::make_shared<resident>("weights", test_options());
    auto kv = std::make_shared<resident>("kv", test_options());
    tags.add(weights);
    tags.add(kv);
    auto weight_blocks = fill_every_layer(*weights);
    auto kv_blocks = fill_every_layer(*kv);

    const std::vector<std::string> unknown{"kv", "graphs"};
    const auto refused = tags.sleep(unknown, sleep_policy::discard());
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::invalid_argument);
    CHECK_THAT(refused.error().message, Catch::Contains("'graphs'"));
    CHECK(kv->state() == residency_state::awake);

    const std::vector<std::string> kv_only{"kv"};
    CHECK(value_or_fail(tags.sleep(kv_only, sleep_policy::discard())).pools == 1);
    CHECK(kv->state() == residency_state::asleep);
    CHECK(weights->state() == residency_state::awake);
    const auto everything = value_or_fail(tags.sleep({}, sleep_policy::host()));
    CHECK(everything.pools == 1);
    CHECK(everything.unchanged_pools == 1);
    CHECK(weights->state() == residency_state::asleep);
    CHECK(value_or_fail(tags.wake({})).pools == 2);
    CHECK(all_hold(weight_blocks));

    CHECK(tags.tags() == std::vector<std::string>{"weights", "kv"});
    kv_blocks.clear();
    kv.reset();
    CHECK(tags.tags() == std::vector<std::string>{"weights"});
    CHECK(tags.usage().size() == 1);
}

TEST_CASE("a pool destroyed asleep gives its reservation back once and leaves no backup", "[residency]") {
    std::shared_ptr<test::upstream_ledger> ledger;
    const std::size_t descriptors = open_descriptors();
    scratch_directory directory;
    {
        resident pool("weights", test_options());
        ledger = pool.upstream().ledger();
        auto live = fill_every_layer(pool);
        value_or_fail(pool.sleep(sleep_policy::file_in(directory.path)));
    }
    CHECK(ledger->live_count() == 0);
    CHECK(ledger->bad_releases == 0);
    CHECK(open_descriptors() == descriptors);
}

// A process killed in the middle of a sleep, asleep, or in the middle of a wake leaves nothing in
// the directory a restart could take for a backup: the file never had a name.
TEST_CASE("a process killed mid-sleep, asleep or mid-wake leaves no backup file behind", "[residency]") {
    scratch_directory directory;
    enum class moment { mid_sleep, asleep, mid_wake };
    for (const moment killed : {moment::mid_sleep, moment::asleep, moment::mid_wake}) {
        int ready[2];
        REQUIRE(::pipe(ready) == 0);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::close(ready[0]);
            resident pool("weights", test_options());
            auto live = fill_every_layer(pool);
            if (killed != moment::mid_sleep) {
                (void)pool.sleep(sleep_policy::file_in(directory.path));
            }
            if (killed == moment::asleep) {
                (void)!::write(ready[1], "a", 1);
                ::pause();
                std::_Exit(0);
            }
            // Another thread holds the upstream's lock, so the sleep stops in its first decommit
            // (the backup written) and the wake in its first commit: the parent kills it there.
            auto& commits = *pool.upstream().commits;
            std::atomic<bool> locked{false};
            std::thread holder([&] {
                commits.mutex.lock();
                locked.store(true);
                ::pause();
            });
            while (!locked.load()) {
                std::this_thread::yield();
            }
            (void)!::write(ready[1], "s", 1);
            if (killed == moment::mid_sleep) {
                (void)pool.sleep(sleep_policy::file_in(directory.path));
            } else {
                (void)pool.wake();
            }
            holder.join();
            std::_Exit(0);
        }
        ::close(ready[1]);
        char signal_byte = 0;
        REQUIRE(::read(ready[0], &signal_byte, 1) == 1);
        ::close(ready[0]);
        // The backup file exists (it is unnamed: look at the child's descriptors).
        const std::string fds = "/proc/" + std::to_string(child) + "/fd";
        for (bool found = false; !found;) {
            for (const auto& entry : std::filesystem::directory_iterator(fds)) {
                std::error_code ignored;
                const auto target = std::filesystem::read_symlink(entry.path(), ignored).string();
                found = found || target.find(directory.path) == 0;
            }
            std::this_thread::yield();
        }
        CHECK(entries_in(directory.path) == 0);
        ::kill(child, SIGKILL);
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        CHECK(WIFSIGNALED(status));
        CHECK(entries_in(directory.path) == 0);
    }
}

TEST_CASE("allocations racing a sleep finish before it or are refused with BUSY: asleep, nothing is committed", "[residency][concurrency]") {
    resident pool("kv", test_options());
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    std::mutex made_mutex;
    std::vector<allocation<cpu_device>> made;
    // Catch's assertions are not thread-safe: the threads count, the main thread checks.
    std::atomic<std::uint64_t> refused_otherwise{0};
    std::atomic<std::uint64_t> failed_releases{0};
    for (int thread = 0; thread < 3; ++thread) {
        // Allocations and releases only: memory is not touched while the pool may be asleep.
        threads.emplace_back([&, thread] {
            std::uint64_t round = 0;
            while (!stop.load()) {
                auto one = pool.allocate(thread == 0 ? 256 * kib * (1 + round++ % 8) : 512, 64);
                if (!one.has_value()) {
                    refused_otherwise.fetch_add(one.error().code == status_code::busy ? 0 : 1);
                    continue;
                }
                std::lock_guard lock(made_mutex);
                made.push_back(one.value());
                if (made.size() > 64) {
                    failed_releases.fetch_add(pool.release(made.front()).has_value() ? 0 : 1);
                    made.erase(made.begin());
                }
            }
        });
    }
    for (int round = 0; round < 20; ++round) {
        value_or_fail(pool.sleep(sleep_policy::discard()));
        CHECK(committed_now(pool) == 0); // an allocation committing during the walk would show here
        CHECK(pool.residency().committed_bytes == 0);
        value_or_fail(pool.wake());
    }
    stop.store(true);
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(refused_otherwise.load() == 0); // refused only with BUSY
    CHECK(failed_releases.load() == 0);
    for (std::size_t index = 0; index < made.size(); ++index) {
        fill(made[index], index);
    }
    for (std::size_t index = 0; index < made.size(); ++index) {
        CHECK(holds(made[index], index));
        REQUIRE(pool.release(made[index]));
    }
    CHECK(committed_now(pool) == pool.residency().committed_bytes);
    CHECK(pool.upstream().commits->bad_calls == 0);
    CHECK(pool.upstream().ledger()->bad_releases == 0);
}
