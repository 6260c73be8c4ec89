// What every harness shares: a reader that draws values from the fuzzer's bytes (zeros once they
// run out, so a short input means "the plain case"), exactly sized buffers so AddressSanitizer
// catches a read or write one byte past a struct_size, and an invariant check that aborts, which
// libFuzzer and the replay runner both report as a failure.
#pragma once

#include "../support/byte_buffer.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

// The entry point every harness defines; libFuzzer calls it, and so does replay_main.cpp.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// A broken invariant: print where and what, then abort (a crash to libFuzzer and to the replay).
#define NXMEM_FUZZ_CHECK(condition)                                                                \
    do {                                                                                           \
        if (!(condition)) {                                                                        \
            std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__,         \
                         #condition);                                                              \
            std::abort();                                                                          \
        }                                                                                          \
    } while (false)

namespace nxmem::fuzz {

// Draws little-endian values from the input; every read past the end yields zeros.
class input_reader {
public:
    input_reader(const std::uint8_t* data, std::size_t size) noexcept : data_(data), left_(size) {}

    std::size_t remaining() const noexcept { return left_; }
    bool empty() const noexcept { return left_ == 0; }

    template <class T> T take() noexcept {
        T value{};
        const std::size_t count = left_ < sizeof(T) ? left_ : sizeof(T);
        if (count > 0) {
            std::memcpy(&value, data_, count);
        }
        data_ += count;
        left_ -= count;
        return value;
    }
    std::uint8_t u8() noexcept { return take<std::uint8_t>(); }
    std::uint32_t u32() noexcept { return take<std::uint32_t>(); }
    std::uint64_t u64() noexcept { return take<std::uint64_t>(); }
    bool flag() noexcept { return (u8() & 1u) != 0; }

    // Up to `limit` bytes of the input (fewer when it runs out).
    std::span<const std::uint8_t> bytes(std::size_t limit) noexcept {
        const std::size_t count = left_ < limit ? left_ : limit;
        std::span<const std::uint8_t> taken(data_, count);
        data_ += count;
        left_ -= count;
        return taken;
    }
    std::string_view text(std::size_t limit) noexcept {
        const auto taken = bytes(limit);
        return {reinterpret_cast<const char*>(taken.data()), taken.size()};
    }

private:
    const std::uint8_t* data_;
    std::size_t left_;
};

// `length` bytes, the first ones copied from `source`, the rest zero, at the very end of a heap
// block (so one byte further is a heap overflow), at an address `misalign` bytes past an 8-byte
// boundary.
class exact_bytes {
public:
    exact_bytes(std::span<const std::uint8_t> source, std::size_t length, std::size_t misalign = 0)
        : buffer_(length + misalign), misalign_(misalign) {
        const std::size_t count = source.size() < length ? source.size() : length;
        if (count > 0) {
            std::memcpy(data(), source.data(), count);
        }
    }
    unsigned char* data() const noexcept { return buffer_.data() + misalign_; }
    std::size_t size() const noexcept { return buffer_.size() - misalign_; }

private:
    nxmem::test::byte_buffer buffer_;
    std::size_t misalign_;
};

} // namespace nxmem::fuzz
