// Where a sleeping pool keeps what it backed up: nothing (discard), anonymous host mappings
// (host), or an unnamed file (file). One slot a committed range; a slot dropped (its allocation
// released while asleep) gives its memory or its file blocks back at once.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::residency_detail {

class backup_store {
public:
    backup_store() = default;
    backup_store(const backup_store&) = delete;
    backup_store& operator=(const backup_store&) = delete;
    backup_store(backup_store&& other) noexcept { *this = std::move(other); }
    backup_store& operator=(backup_store&& other) noexcept {
        if (this != &other) {
            clear();
            kind_ = other.kind_;
            descriptor_ = std::exchange(other.descriptor_, -1);
            owns_descriptor_ = std::exchange(other.owns_descriptor_, false);
            where_ = std::move(other.where_);
            slots_ = std::move(other.slots_);
            file_end_ = std::exchange(other.file_end_, 0);
            stored_bytes_ = std::exchange(other.stored_bytes_, 0);
        }
        return *this;
    }
    ~backup_store() { clear(); }

    // A store for `policy`: a file policy opens (or adopts) its file now, so a directory that
    // cannot hold one is refused before anything sleeps.
    static result<backup_store> open(const sleep_policy& policy) {
        backup_store store;
        store.kind_ = policy.kind();
        if (policy.kind() == sleep_policy_kind::host) {
            store.where_ = "host memory";
        } else if (policy.kind() == sleep_policy_kind::file) {
            if (policy.descriptor() >= 0) {
                store.descriptor_ = policy.descriptor();
                store.where_ = "the engine's file descriptor " + std::to_string(policy.descriptor());
            } else {
                NXMEM_TRY(opened, open_unnamed_file(policy.directory().string()));
                store.descriptor_ = opened;
                store.owns_descriptor_ = true;
                store.where_ = "an unnamed file in " + policy.directory().string();
            }
        }
        return store;
    }

    sleep_policy_kind kind() const noexcept { return kind_; }
    bool keeps_contents() const noexcept { return kind_ != sleep_policy_kind::discard; }
    const std::string& where() const noexcept { return where_; }
    std::uint64_t stored_bytes() const noexcept { return stored_bytes_; }

    // Saves `length` bytes read by read(offset, std::span<std::byte>) -> result<void> (piece by
    // piece into a bounce buffer for a file), or straight from `direct` when the memory is the
    // host's own. Returns the slot.
    template <class Read> result<std::size_t> save(std::uint64_t length, const std::byte* direct, Read&& read) {
        slot made{nullptr, 0, length};
        if (kind_ == sleep_policy_kind::host) {
            void* mapped = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (mapped == MAP_FAILED) {
                return fail(status_code::out_of_memory,
                            "the host backup could not map " + std::to_string(length) + " bytes: " + std::strerror(errno));
            }
            made.memory = static_cast<std::byte*>(mapped);
            if (direct != nullptr) {
                std::memcpy(made.memory, direct, length);
            } else if (auto copied = read(std::uint64_t{0}, std::span<std::byte>(made.memory, length)); !copied.has_value()) {
                ::munmap(mapped, length);
                return std::move(copied).error();
            }
        } else if (kind_ == sleep_policy_kind::file) {
            made.file_offset = file_end_;
            if (direct != nullptr) {
                NXMEM_TRY_VOID(write_all(direct, length, made.file_offset));
            } else {
                std::vector<std::byte> bounce(std::min<std::uint64_t>(length, bounce_bytes));
                for (std::uint64_t at = 0; at < length; at += bounce.size()) {
                    const std::uint64_t piece = std::min<std::uint64_t>(bounce.size(), length - at);
                    NXMEM_TRY_VOID(read(at, std::span<std::byte>(bounce.data(), piece)));
                    NXMEM_TRY_VOID(write_all(bounce.data(), piece, made.file_offset + at));
                }
            }
            file_end_ += length;
        }
        slots_.push_back(made);
        stored_bytes_ += keeps_contents() ? length : 0;
        return slots_.size() - 1;
    }

    // Puts slot `index` back, through write(offset, std::span<const std::byte>) -> result<void>
    // or straight into `direct`. The slot stays until clear() (a failed wake keeps everything).
    template <class Write> result<void> restore(std::size_t index, std::byte* direct, Write&& write) const {
        const slot& saved = slots_.at(index);
        if (!keeps_contents() || saved.dropped) {
            return boost::outcome_v2::success();
        }
        if (kind_ == sleep_policy_kind::host) {
            if (direct != nullptr) {
                std::memcpy(direct, saved.memory, saved.length);
                return boost::outcome_v2::success();
            }
            return write(std::uint64_t{0}, std::span<const std::byte>(saved.memory, saved.length));
        }
        if (direct != nullptr) {
            return read_all(direct, saved.length, saved.file_offset);
        }
        std::vector<std::byte> bounce(std::min<std::uint64_t>(saved.length, bounce_bytes));
        for (std::uint64_t at = 0; at < saved.length; at += bounce.size()) {
            const std::uint64_t piece = std::min<std::uint64_t>(bounce.size(), saved.length - at);
            NXMEM_TRY_VOID(read_all(bounce.data(), piece, saved.file_offset + at));
            NXMEM_TRY_VOID(write(at, std::span<const std::byte>(bounce.data(), piece)));
        }
        return boost::outcome_v2::success();
    }

    // The allocation a slot backs was released while asleep: its backup goes now (host memory
    // unmapped, the file's blocks punched out).
    void drop(std::size_t index) noexcept {
        slot& saved = slots_[index];
        if (saved.dropped) {
            return;
        }
        saved.dropped = true;
        stored_bytes_ -= keeps_contents() ? saved.length : 0;
        if (saved.memory != nullptr) {
            ::munmap(saved.memory, saved.length);
            saved.memory = nullptr;
        } else if (kind_ == sleep_policy_kind::file && saved.length != 0) {
            (void)::fallocate(descriptor_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                              static_cast<off_t>(saved.file_offset), static_cast<off_t>(saved.length));
        }
    }

    // Everything goes: host mappings unmapped, an unnamed file closed (and so gone), an engine's
    // file truncated to nothing.
    void clear() noexcept {
        for (slot& saved : slots_) {
            if (saved.memory != nullptr) {
                ::munmap(saved.memory, saved.length);
            }
        }
        slots_.clear();
        if (descriptor_ >= 0) {
            if (owns_descriptor_) {
                ::close(descriptor_);
            } else {
                (void)::ftruncate(descriptor_, 0);
            }
        }
        descriptor_ = -1;
        owns_descriptor_ = false;
        file_end_ = 0;
        stored_bytes_ = 0;
    }

private:
    static constexpr std::uint64_t bounce_bytes = std::uint64_t{16} << 20;

    struct slot {
        std::byte* memory = nullptr;  // host backups
        std::uint64_t file_offset = 0; // file backups
        std::uint64_t length = 0;
        bool dropped = false;
    };

    // O_TMPFILE: a file with no name from the start. Where the file system lacks it, a named
    // file unlinked at once (a crash in between leaves one; its name says what it was).
    static result<int> open_unnamed_file(const std::string& directory) {
        int descriptor = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (descriptor >= 0) {
            return descriptor;
        }
        if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
            return fail(status_code::invalid_argument,
                        "sleep: cannot make a backup file in " + directory + ": " + std::strerror(errno));
        }
        std::string name = directory + "/nxmem-sleep-backup-XXXXXX";
        descriptor = ::mkostemp(name.data(), O_CLOEXEC);
        if (descriptor < 0) {
            return fail(status_code::invalid_argument,
                        "sleep: cannot make a backup file in " + directory + ": " + std::strerror(errno));
        }
        ::unlink(name.c_str());
        return descriptor;
    }

    result<void> write_all(const std::byte* from, std::uint64_t length, std::uint64_t offset) const {
        for (std::uint64_t done = 0; done < length;) {
            const ssize_t wrote = ::pwrite(descriptor_, from + done, static_cast<std::size_t>(std::min<std::uint64_t>(length - done, 1u << 30)),
                                           static_cast<off_t>(offset + done));
            if (wrote < 0 && errno == EINTR) {
                continue;
            }
            if (wrote <= 0) {
                return fail(status_code::out_of_memory, "sleep: writing the backup to " + where_ + " failed after " +
                                                            std::to_string(offset + done) + " bytes: " +
                                                            (wrote < 0 ? std::strerror(errno) : "no progress"));
            }
            done += static_cast<std::uint64_t>(wrote);
        }
        return boost::outcome_v2::success();
    }
    result<void> read_all(std::byte* into, std::uint64_t length, std::uint64_t offset) const {
        for (std::uint64_t done = 0; done < length;) {
            const ssize_t got = ::pread(descriptor_, into + done, static_cast<std::size_t>(std::min<std::uint64_t>(length - done, 1u << 30)),
                                        static_cast<off_t>(offset + done));
            if (got < 0 && errno == EINTR) {
                continue;
            }
            if (got <= 0) {
                return fail(status_code::internal_error, "wake: reading the backup from " + where_ + " at byte " +
                                                             std::to_string(offset + done) + " failed: " +
                                                             (got < 0 ? std::strerror(errno) : "the file is shorter than what was written"));
            }
            done += static_cast<std::uint64_t>(got);
        }
        return boost::outcome_v2::success();
    }

    sleep_policy_kind kind_ = sleep_policy_kind::discard;
    int descriptor_ = -1;
    bool owns_descriptor_ = false;
    std::string where_ = "nowhere (discarded)";
    std::vector<slot> slots_;
    std::uint64_t file_end_ = 0;
    std::uint64_t stored_bytes_ = 0;
};

} // namespace nxmem::residency_detail
