// Saying where a plugin made a process fault. A SIGSEGV/SIGBUS handler, installed in a child that
// runs plugin code, writes one line describing the fault down a pipe before the child dies of the
// signal: the signal, whether it was a read or a write (x86-64 only), and the address, placed
// within a memory region the suite handed to the plugin when it falls in or just past one
// ("a write at offset 8 of a status of size 8 (past its end)"). The line is a JSON object,
// {"event":"fault","text":"..."}, so it travels in the nxmem tool's event stream unchanged.
//
// Everything the handler touches is async-signal-safe: fixed arrays of atomics, a static
// alternate stack, write(2). The regions are watched only in the child that runs plugin code.
#pragma once

#include <array>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

namespace nxmem::conform::detail {

// One region the suite handed to a plugin; `noun` is a static string ("an allocation").
struct watched_region {
    std::atomic<std::uintptr_t> begin{0};
    std::atomic<std::size_t> size{0}; // 0: the slot is free
    std::atomic<const char*> noun{nullptr};
};

// How far past a region's end an address still counts as "past its end": the guard page the
// boundary checks place there.
inline constexpr std::size_t past_end_slack = 4096;

inline std::array<watched_region, 64>& watched_regions() noexcept {
    static std::array<watched_region, 64> regions;
    return regions;
}

// Watches [begin, begin + size) while it lives; when every slot is taken the region goes
// unwatched (a fault in it is then reported by address only).
class watch_region {
public:
    watch_region(const void* begin, std::size_t size, const char* noun) noexcept {
        if (size == 0) {
            return;
        }
        for (watched_region& region : watched_regions()) {
            std::size_t free_slot = 0;
            if (region.size.load(std::memory_order_relaxed) == 0 &&
                region.size.compare_exchange_strong(free_slot, size)) {
                region.begin.store(reinterpret_cast<std::uintptr_t>(begin));
                region.noun.store(noun);
                slot_ = &region;
                return;
            }
        }
    }
    watch_region(const watch_region&) = delete;
    watch_region& operator=(const watch_region&) = delete;
    ~watch_region() {
        if (slot_ != nullptr) {
            slot_->noun.store(nullptr);
            slot_->begin.store(0);
            slot_->size.store(0);
        }
    }

private:
    watched_region* slot_ = nullptr;
};

// A fixed buffer the handler formats into without allocating.
class signal_safe_text {
public:
    void append(std::string_view text) noexcept {
        for (char c : text) {
            if (length_ + 1 < buffer_.size()) {
                buffer_[length_++] = c;
            }
        }
    }
    void append_decimal(std::uint64_t value) noexcept {
        char digits[24];
        std::size_t count = 0;
        do {
            digits[count++] = static_cast<char>('0' + value % 10);
            value /= 10;
        } while (value != 0);
        while (count > 0) {
            append(std::string_view(&digits[--count], 1));
        }
    }
    void append_hex(std::uint64_t value) noexcept {
        static constexpr char digits[] = "0123456789abcdef";
        char text[16];
        std::size_t count = 0;
        do {
            text[count++] = digits[value & 0xFu];
            value >>= 4;
        } while (value != 0);
        append("0x");
        while (count > 0) {
            append(std::string_view(&text[--count], 1));
        }
    }
    std::string_view view() const noexcept { return {buffer_.data(), length_}; }

private:
    std::array<char, 512> buffer_{};
    std::size_t length_ = 0;
};

// "SIGSEGV: a write at offset 264 of a status of size 264 (past its end)", or "... at address
// 0x0" when the address lies in no watched region. `access` is "a write", "a read" or "an access".
inline void describe_fault(signal_safe_text& text, int signal_number, std::uintptr_t address,
                           std::string_view access) noexcept {
    text.append(signal_number == SIGSEGV ? "SIGSEGV" : signal_number == SIGBUS ? "SIGBUS" : "signal ");
    if (signal_number != SIGSEGV && signal_number != SIGBUS) {
        text.append_decimal(static_cast<std::uint64_t>(signal_number));
    }
    text.append(": ");
    text.append(access);
    for (const watched_region& region : watched_regions()) {
        const std::size_t size = region.size.load();
        const std::uintptr_t begin = region.begin.load();
        const char* noun = region.noun.load();
        if (size == 0 || noun == nullptr || address < begin || address - begin >= size + past_end_slack) {
            continue;
        }
        text.append(" at offset ");
        text.append_decimal(address - begin);
        text.append(" of ");
        text.append(noun);
        text.append(" of size ");
        text.append_decimal(size);
        if (address - begin >= size) {
            text.append(" (past its end)");
        }
        return;
    }
    text.append(" at address ");
    text.append_hex(address);
}

inline std::atomic<int>& fault_report_fd() noexcept {
    static std::atomic<int> fd{-1};
    return fd;
}

inline void report_fault(int signal_number, siginfo_t* info, void* context) noexcept {
    std::string_view access = "an access";
#if defined(__x86_64__) && defined(REG_ERR)
    // Bit 1 of the page-fault error code: the access was a write.
    if (signal_number == SIGSEGV && context != nullptr) {
        const auto* machine = static_cast<const ucontext_t*>(context);
        access = (machine->uc_mcontext.gregs[REG_ERR] & 0x2) != 0 ? "a write" : "a read";
    }
#else
    (void)context;
#endif
    signal_safe_text line;
    line.append("{\"event\":\"fault\",\"text\":\"");
    signal_safe_text description;
    describe_fault(description, signal_number, reinterpret_cast<std::uintptr_t>(info->si_addr), access);
    line.append(description.view()); // no quote or backslash: the nouns and numbers have none
    line.append("\"}\n");
    const int fd = fault_report_fd().load();
    if (fd >= 0) {
        const std::string_view out = line.view();
        (void)!::write(fd, out.data(), out.size());
    }
    // SA_RESETHAND restored the default action: returning re-runs the faulting access, and the
    // process dies of the signal, as it would have without this handler.
}

// Installs the handler for SIGSEGV and SIGBUS, on an alternate stack (a stack overflow faults
// too), reporting to `fd`. Call it in the child only: the parent keeps its own handlers.
inline void install_fault_reporter(int fd) noexcept {
    alignas(16) static char alternate_stack[64 * 1024];
    stack_t stack{};
    stack.ss_sp = alternate_stack;
    stack.ss_size = sizeof alternate_stack;
    (void)::sigaltstack(&stack, nullptr);
    fault_report_fd().store(fd);
    struct sigaction action {};
    action.sa_sigaction = &report_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    (void)::sigaction(SIGSEGV, &action, nullptr);
    (void)::sigaction(SIGBUS, &action, nullptr);
}

// The text of a fault line, or "" when `line` is not one.
inline std::string fault_text_of(std::string_view line) {
    constexpr std::string_view head = "{\"event\":\"fault\",\"text\":\"";
    const std::size_t at = line.find(head);
    if (at == std::string_view::npos) {
        return {};
    }
    const std::size_t begin = at + head.size();
    const std::size_t end = line.find('"', begin);
    return std::string(line.substr(begin, end == std::string_view::npos ? end : end - begin));
}

} // namespace nxmem::conform::detail
