// Memory that ends at a PROT_NONE page: the boundary checks hand a plugin a status or an output
// of exactly N bytes placed right before such a page, so a plugin that writes past the N bytes
// faults at once instead of corrupting something unseen. The bytes are watched
// (fault_report.hpp), so the fault names the offset within them.
#pragma once

#include <nxmem/conform/detail/fault_report.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

namespace nxmem::conform::detail {

class guarded_bytes {
public:
    // `size` bytes (at most a page) ending at a PROT_NONE page, filled with `fill`; `noun` names
    // them in a fault report ("a status"). nullopt when the pages cannot be mapped.
    static std::optional<guarded_bytes> make(std::size_t size, const char* noun, unsigned char fill = 0) {
        const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        if (size == 0 || size > page) {
            return std::nullopt;
        }
        void* pages = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages == MAP_FAILED) {
            return std::nullopt;
        }
        auto* base = static_cast<unsigned char*>(pages);
        if (::mprotect(base + page, page, PROT_NONE) != 0) {
            ::munmap(pages, 2 * page);
            return std::nullopt;
        }
        guarded_bytes made;
        made.pages_ = base;
        made.page_ = page;
        made.data_ = base + page - size;
        made.size_ = size;
        std::memset(made.data_, fill, size);
        made.watch_ = std::make_unique<watch_region>(made.data_, size, noun);
        return made;
    }

    guarded_bytes(guarded_bytes&& other) noexcept
        : pages_(std::exchange(other.pages_, nullptr)), page_(other.page_), data_(other.data_),
          size_(other.size_), watch_(std::move(other.watch_)) {}
    guarded_bytes& operator=(guarded_bytes&&) = delete;
    guarded_bytes(const guarded_bytes&) = delete;
    guarded_bytes& operator=(const guarded_bytes&) = delete;
    ~guarded_bytes() {
        watch_.reset();
        if (pages_ != nullptr) {
            ::munmap(pages_, 2 * page_);
        }
    }

    unsigned char* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    // The bytes as a T whose first `size()` bytes are usable (T's alignment holds: the end of a
    // page minus a multiple of T's alignment).
    template <class T> T* as() const noexcept { return reinterpret_cast<T*>(data_); }

private:
    guarded_bytes() = default;
    unsigned char* pages_ = nullptr;
    std::size_t page_ = 0;
    unsigned char* data_ = nullptr;
    std::size_t size_ = 0;
    std::unique_ptr<watch_region> watch_; // a pointer: a watched slot holds its address
};

// A status of `struct_size` bytes (8 to 264) ending at a PROT_NONE page: struct_size set, the
// code OK, and the message (the part of it that exists) filled with `message_fill`.
inline std::optional<guarded_bytes> guarded_status(std::uint32_t struct_size, unsigned char message_fill) {
    std::optional<guarded_bytes> bytes = guarded_bytes::make(struct_size, "a status", message_fill);
    if (bytes) {
        std::memcpy(bytes->data(), &struct_size, sizeof struct_size);
        const NxmemStatusCode ok = NXMEM_STATUS_OK;
        std::memcpy(bytes->data() + offsetof(NxmemStatus, code), &ok, sizeof ok);
    }
    return bytes;
}

} // namespace nxmem::conform::detail
