// Stress with unloads: worker threads allocate, release, enqueue, drain, create and release shared
// prefixes, commit them into allocations, open and drop allocators (leaving allocations for the
// host to hand back) and hold pins, all at once, while another thread keeps attempting try_unload.
// The gate must refuse every attempt with BUSY while anything is live; afterwards both tallies are
// zero and the module unloads and is unmapped.
//
// The run is bounded by time, not by sleeping: each worker loops until a deadline (and at least
// a few rounds, so every operation runs even on a slow machine). NXMEM_STRESS_SECONDS sets the
// duration (default 2; raise it for long runs), NXMEM_STRESS_WATCHDOG_SECONDS the watchdog (default:
// the duration plus 120). The watchdog fails the process with what each thread was doing, instead
// of letting a deadlock hang the test run. In the Meson suite 'concurrency': scripts/test runs it
// under ThreadSanitizer.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <latch>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int worker_count = 4;
constexpr int minimum_rounds = 40; // every operation kind runs several times, however slow the machine
constexpr std::uint64_t page = 4096;

double seconds_from_env(const char* variable, double fallback) {
    const char* text = std::getenv(variable);
    if (text == nullptr || *text == '\0') {
        return fallback;
    }
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(value > 0)) {
        FAIL(variable << "='" << text << "' is not a positive number of seconds");
    }
    return value;
}

// What one thread is doing, readable by the watchdog at any moment.
struct thread_progress {
    std::atomic<const char*> activity{"starting"};
    std::atomic<std::uint64_t> steps{0};
    void now(const char* what) noexcept {
        activity.store(what, std::memory_order_relaxed);
        steps.fetch_add(1, std::memory_order_relaxed);
    }
};

// Fails the process, naming each thread and what it was doing, if the run has not finished by the
// deadline. A hang would otherwise only show as Meson's timeout, with nothing said.
class watchdog {
public:
    watchdog(std::chrono::duration<double> limit, std::vector<std::string> names,
             std::deque<thread_progress>& progress)
        : names_(std::move(names)), progress_(progress),
          thread_([this, limit] { watch(limit); }) {}
    watchdog(const watchdog&) = delete;
    watchdog& operator=(const watchdog&) = delete;
    ~watchdog() {
        {
            std::lock_guard lock(mutex_);
            finished_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

private:
    void watch(std::chrono::duration<double> limit) {
        std::unique_lock lock(mutex_);
        if (wake_.wait_for(lock, limit, [this] { return finished_; })) {
            return;
        }
        std::fprintf(stderr, "stress watchdog: the run did not finish within %.1f s (NXMEM_STRESS_WATCHDOG_SECONDS); the test fails. The threads were:\n",
                     limit.count());
        for (std::size_t i = 0; i < names_.size(); ++i) {
            std::fprintf(stderr, "  %-10s %-70s after %llu steps\n", names_[i].c_str(),
                         progress_[i].activity.load(), static_cast<unsigned long long>(progress_[i].steps.load()));
        }
        std::fflush(stderr);
        std::abort(); // a stuck thread cannot be joined; the message above is the diagnosis
    }

    std::vector<std::string> names_;
    std::deque<thread_progress>& progress_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool finished_ = false;
    std::thread thread_;
};

// Failures seen by any thread, each with who saw it and during what.
class failure_log {
public:
    void add(const std::string& text) {
        std::lock_guard lock(mutex_);
        ++count_;
        if (texts_.size() < 20) {
            texts_.push_back(text);
        }
    }
    std::size_t count() const {
        std::lock_guard lock(mutex_);
        return count_;
    }
    std::string first() const {
        std::lock_guard lock(mutex_);
        std::string all;
        for (const std::string& text : texts_) {
            all += text + "\n";
        }
        return all;
    }

private:
    mutable std::mutex mutex_;
    std::size_t count_ = 0;
    std::vector<std::string> texts_;
};

// Deterministic per-thread choices (xorshift64*), so a failing seed can be read off the log.
struct choices {
    std::uint64_t state;
    std::uint64_t next() noexcept {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 2685821657736338717ull;
    }
    std::uint64_t below(std::uint64_t bound) noexcept { return next() % bound; }
};

// What every worker shares: the module, one lazy and one legacy allocator used by all workers at
// once, and the lazy allocator's views.
struct shared_state {
    std::shared_ptr<host::plugin_module> module;
    host::plugin_allocator<cpu_device>& lazy;
    host::virtual_backing_view<cpu_device>& backing;
    host::shared_mapping_view<cpu_device>& mapping;
    host::plugin_allocator<cpu_device>& legacy;
    failure_log& failures;
    std::atomic<std::uint64_t>& gate_busy; // opens and pins refused while an unload attempt ran
};

class worker {
public:
    worker(shared_state& shared, thread_progress& progress, int index)
        : shared_(shared), progress_(progress), index_(index),
          random_{0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(index + 1)} {}

    void run(clock_type::time_point deadline) {
        progress_.now("opening its own eager allocator");
        std::optional<host::plugin_allocator<cpu_device>> own = open("eager");
        if (!own) {
            return;
        }
        own_ = &*own;
        for (int round = 0; round < minimum_rounds || clock_type::now() < deadline; ++round) {
            round_ = round;
            const std::uint64_t kinds = 7;
            switch (round < static_cast<int>(kinds) ? (round + index_) % kinds : random_.below(kinds)) {
            case 0: lazy_commit_and_release(); break;
            case 1: enqueue_and_drain(shared_.lazy, some_pages() * page, on_shared_lazy); break;
            case 2: eager_hold_and_release(); break;
            case 3: shared_prefix_round(); break;
            case 4: pinned_round(); break;
            case 5: short_lived_allocator(); break;
            default: enqueue_and_drain(shared_.legacy, 64, on_shared_legacy); break;
            }
        }
        progress_.now("releasing what it still holds");
        while (!held_.empty()) {
            release_oldest();
        }
        own_ = nullptr;
        progress_.now("done");
    }

private:
    void record(const error& failure, const char* what) {
        shared_.failures.add("worker " + std::to_string(index_) + ", round " +
                             std::to_string(round_) + ", " + what + ": " + failure.describe());
    }
    template <class T> std::optional<T> check(result<T> outcome, const char* what) {
        if (!outcome) {
            record(outcome.error(), what);
            return std::nullopt;
        }
        return std::move(outcome).value();
    }
    bool ok(const result<void>& outcome, const char* what) {
        if (!outcome) {
            record(outcome.error(), what);
        }
        return static_cast<bool>(outcome);
    }

    // Opens and pins are refused (BUSY) for as long as an unload attempt is in progress; the
    // engine retries. Any other failure is a failure.
    std::optional<host::plugin_allocator<cpu_device>> open(const char* mechanism) {
        for (;;) {
            auto opened = host::open_allocator<cpu_device>(shared_.module, mechanism);
            if (opened || opened.error().code != status_code::busy) {
                return check(std::move(opened), "open_allocator");
            }
            shared_.gate_busy.fetch_add(1, std::memory_order_relaxed);
            std::this_thread::yield();
        }
    }
    std::optional<host::module_pin> pin() {
        for (;;) {
            auto pinned = shared_.module->pin();
            if (pinned || pinned.error().code != status_code::busy) {
                return check(std::move(pinned), "pin");
            }
            shared_.gate_busy.fetch_add(1, std::memory_order_relaxed);
            std::this_thread::yield();
        }
    }

    std::uint64_t some_pages() { return 1 + random_.below(4); }

    void lazy_commit_and_release() {
        progress_.now("allocate on the shared lazy allocator");
        const std::uint64_t pages = some_pages();
        auto made = check(shared_.lazy.allocate(pages * page, page), "allocate (lazy)");
        if (!made) {
            return;
        }
        progress_.now("commit and decommit on the shared lazy allocator");
        ok(shared_.backing.commit(*made, {0, pages * page}), "commit (lazy)");
        ok(shared_.backing.decommit(*made, {0, page}), "decommit (lazy)");
        progress_.now("release (structured) on the shared lazy allocator");
        (void)check(shared_.lazy.release(*made), "release (lazy)");
    }

    // What a round of enqueue-and-drain says it is doing, per allocator.
    struct enqueue_steps {
        const char* allocate;
        const char* enqueue;
        const char* drain;
    };
    static constexpr enqueue_steps on_shared_lazy{"allocate, to enqueue, on the shared lazy allocator",
                                                  "enqueue_release on the shared lazy allocator",
                                                  "drain_releases on the shared lazy allocator"};
    static constexpr enqueue_steps on_shared_legacy{"allocate, to enqueue, on the shared minor-0 allocator",
                                                    "enqueue_release on the shared minor-0 allocator",
                                                    "drain_releases on the shared minor-0 allocator"};

    // Another worker's concurrent drain may retire this one (or a concurrent drain may retire
    // nothing); whatever is left retires at the end.
    void enqueue_and_drain(host::plugin_allocator<cpu_device>& allocator, std::uint64_t size,
                           const enqueue_steps& steps) {
        progress_.now(steps.allocate);
        auto made = check(allocator.allocate(size, 64), steps.allocate);
        if (!made) {
            return;
        }
        progress_.now(steps.enqueue);
        (void)check(allocator.enqueue_release(*made), steps.enqueue);
        progress_.now(steps.drain);
        (void)check(allocator.drain_releases(), steps.drain);
    }

    void eager_hold_and_release() {
        progress_.now("allocate on its own eager allocator");
        if (auto made = check(own_->allocate(64 + random_.below(8192), 64), "allocate (eager)")) {
            held_.push_back(*made);
        }
        if (held_.size() > 8) {
            release_oldest();
        }
    }
    void release_oldest() {
        progress_.now("release on its own eager allocator");
        (void)check(own_->release(held_.front()), "release (eager)");
        held_.pop_front();
    }

    void shared_prefix_round() {
        progress_.now("create_prefix on the shared lazy allocator");
        auto prefix = check(shared_.mapping.create_prefix(2 * page), "create_prefix");
        if (!prefix) {
            return;
        }
        progress_.now("retain_prefix");
        const bool retained = ok(shared_.mapping.retain_prefix(*prefix), "retain_prefix");
        progress_.now("allocate and commit_prefix");
        if (auto made = check(shared_.lazy.allocate(4 * page, page), "allocate (lazy, for a prefix)")) {
            (void)check(shared_.mapping.commit_prefix(*made, *prefix), "commit_prefix");
            progress_.now("release_prefix (the creator's reference), the allocation still mapping it");
            ok(shared_.mapping.release_prefix(*prefix), "release_prefix");
            progress_.now("release an allocation that maps a prefix");
            (void)check(shared_.lazy.release(*made), "release (lazy, mapping a prefix)");
        } else {
            ok(shared_.mapping.release_prefix(*prefix), "release_prefix");
        }
        if (retained) {
            progress_.now("release_prefix (the retained reference)");
            ok(shared_.mapping.release_prefix(*prefix), "release_prefix (retained)");
        }
    }

    void pinned_round() {
        progress_.now("pin the module");
        std::optional<host::module_pin> held = pin();
        if (!held) {
            return;
        }
        for (int i = 0; i < 3; ++i) {
            progress_.now("allocate and release while holding a pin");
            if (auto made = check(own_->allocate(page, page), "allocate (eager, pinned)")) {
                (void)check(own_->release(*made), "release (eager, pinned)");
            }
        }
        progress_.now("drop the pin");
    }

    // The engine lets go of an allocator that still holds allocations: the host hands them back.
    void short_lived_allocator() {
        progress_.now("open a short-lived lazy allocator");
        std::optional<host::plugin_allocator<cpu_device>> brief = open("lazy");
        if (!brief) {
            return;
        }
        progress_.now("allocate on a short-lived allocator");
        auto kept = check(brief->allocate(page, page), "allocate (short-lived)");
        auto queued = check(brief->allocate(2 * page, page), "allocate (short-lived, to enqueue)");
        if (queued) {
            progress_.now("enqueue and drain on a short-lived allocator");
            (void)check(brief->enqueue_release(*queued), "enqueue_release (short-lived)");
            // This worker is the only one draining it, so one drain retires everything queued.
            if (auto retired = check(brief->drain_releases(), "drain_releases (short-lived)");
                retired && retired->size() != 1) {
                shared_.failures.add("worker " + std::to_string(index_) + ": a lone drain retired " +
                                     std::to_string(retired->size()) + " releases, not 1");
            }
        }
        (void)kept;
        progress_.now("drop a short-lived allocator that still holds an allocation");
    }

    shared_state& shared_;
    thread_progress& progress_;
    int index_;
    int round_ = 0;
    choices random_;
    host::plugin_allocator<cpu_device>* own_ = nullptr;
    std::deque<allocation<cpu_device>> held_;
};

// Drains until nothing is pending; a drain running on another thread may have retired nothing.
void drain_everything(host::plugin_allocator<cpu_device>& allocator, const char* name) {
    for (int attempt = 0; attempt < 100; ++attempt) {
        value_or_fail(allocator.drain_releases());
        auto readiness = value_or_fail(allocator.module()->readiness());
        if (readiness.host.queued_releases == 0 && readiness.plugin.queued_releases == 0) {
            return;
        }
    }
    FAIL("the " << name << " allocator's queued releases never all retired");
}

} // namespace

TEST_CASE("allocating, releasing, enqueuing, draining, sharing and pinning threads never see the "
          "module unload, and it unloads afterwards",
          "[concurrency][stress]") {
    const std::string path = test::testplugin_path();
    const double seconds = seconds_from_env("NXMEM_STRESS_SECONDS", 2.0);
    const double watchdog_seconds = seconds_from_env("NXMEM_STRESS_WATCHDOG_SECONDS", seconds + 120.0);

    // The workers, then the unloader, then this thread.
    std::deque<thread_progress> progress(worker_count + 2);
    std::vector<std::string> names;
    for (int i = 0; i < worker_count; ++i) {
        names.push_back("worker " + std::to_string(i));
    }
    names.push_back("unloader");
    names.push_back("main");
    thread_progress& main_progress = progress[worker_count + 1];
    watchdog guard(std::chrono::duration<double>(watchdog_seconds), names, progress);

    failure_log failures;
    std::atomic<std::uint64_t> gate_busy{0};
    std::atomic<std::uint64_t> attempts{0};
    std::atomic<std::uint64_t> granted{0};
    std::atomic<int> workers_done{0};

    main_progress.now("load the test plugin");
    auto module = load_or_fail(path);
    {
        main_progress.now("open the shared allocators");
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto legacy = open_or_fail<cpu_device>(module, "legacy-1-0");
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());
        shared_state shared{module, lazy, backing, mapping, legacy, failures, gate_busy};

        std::latch start(worker_count + 1);
        const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                      std::chrono::duration<double>(seconds));
        std::vector<std::thread> threads;
        for (int i = 0; i < worker_count; ++i) {
            threads.emplace_back([&, i] {
                worker work(shared, progress[static_cast<std::size_t>(i)], i);
                start.arrive_and_wait();
                work.run(deadline);
                workers_done.fetch_add(1);
            });
        }
        std::thread unloader([&] {
            thread_progress& mine = progress[worker_count];
            start.arrive_and_wait();
            // The shared allocators stay open throughout, so every attempt must be refused.
            while (workers_done.load() < worker_count) {
                mine.now("try_unload");
                attempts.fetch_add(1, std::memory_order_relaxed);
                auto refused = module->try_unload();
                if (refused) {
                    granted.fetch_add(1);
                    failures.add("unloader: try_unload was granted while allocators were open");
                    break;
                }
                if (refused.error().code != status_code::busy) {
                    failures.add("unloader: try_unload failed with " + refused.error().describe() +
                                 " instead of BUSY");
                }
                mine.now("readiness");
                if (auto readiness = module->readiness(); !readiness) {
                    failures.add("unloader: readiness failed: " + readiness.error().describe());
                }
                std::this_thread::yield();
            }
            mine.now("done");
        });
        main_progress.now("join the workers and the unloader");
        for (auto& thread : threads) {
            thread.join();
        }
        unloader.join();
        main_progress.now("check and drain what is left");

        INFO("first failures:\n" << failures.first());
        CHECK(failures.count() == 0);
        CHECK(granted.load() == 0);
        CHECK(attempts.load() > 0);
        std::uint64_t steps = 0;
        for (int i = 0; i < worker_count; ++i) {
            steps += progress[static_cast<std::size_t>(i)].steps.load();
        }
        WARN("stress: " << worker_count << " workers, " << seconds << " s, " << steps
                        << " worker steps, " << attempts.load() << " unload attempts, "
                        << gate_busy.load() << " opens or pins refused during an attempt");

        drain_everything(lazy, "lazy");
        drain_everything(legacy, "legacy-1-0");
        auto before_close = value_or_fail(module->readiness());
        INFO(before_close.describe());
        CHECK(before_close.plugin.allocations == 0);
        CHECK(before_close.plugin.views == 0);
        CHECK(before_close.plugin.shared_prefixes == 0);
        CHECK(before_close.plugin.queued_releases == 0);
        CHECK(before_close.host.allocations == 0);
        CHECK(before_close.host.shared_prefixes == 0);
        CHECK(before_close.host.queued_releases == 0);
        CHECK(before_close.host.pins == 0);
        CHECK(before_close.host.allocators == 2); // the shared lazy and legacy allocators
        CHECK(before_close.plugin.allocators == 2);
    }
    main_progress.now("unload");
    auto idle = value_or_fail(module->readiness());
    INFO(idle.describe());
    CHECK(idle.ready());
    REQUIRE(module->try_unload());
    module.reset();
    CHECK_FALSE(test::is_mapped(path));
}
