// An allocator of the cuda plugin (the file `plugin`) opened without the host in front of it, for the calls of ABI
// minor 4 (fenced release, copies) made straight through the plugin's tables: its exports called
// directly (conform::detail's raw library and factories), with this test's own release_completed,
// so the tickets and allocation ids are the test's. Every failure fails the test.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/stream_requests.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/device.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::test {

class raw_allocator {
public:
    raw_allocator(const std::string& plugin, const std::string& mechanism) {
        auto library = conform::detail::raw_library::open(plugin);
        REQUIRE(library.has_value());
        library_.emplace(std::move(library).value());
        auto factories = conform::detail::raw_factories::create(*library_);
        REQUIRE(factories.has_value());
        factories_.emplace(std::move(factories).value());
        REQUIRE(factories_->negotiated_minor() >= 4);
        NxmemAllocatorFactoryVtable* factory = factories_->find(mechanism);
        REQUIRE(factory != nullptr);
        auto factory_copy = abi::read_prefix<NxmemAllocatorFactoryVtable>(factory, factories_->negotiated_minor());
        REQUIRE(factory_copy.has_value());
        callbacks_.on_completed = [this](const NxmemReleaseCompletion& done) {
            std::lock_guard lock(completed_mutex_);
            completed_.push_back(done.ticket);
        };
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = device_id{NXMEM_DEVICE_CUDA, 0}.to_wire();
        request.callbacks = callbacks_.table();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            factory_copy.value().table.open_allocator(factory, &request, &self_, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
        auto table = abi::read_prefix<NxmemAllocatorVtable>(self_, factories_->negotiated_minor());
        REQUIRE(table.has_value());
        table_ = table.value().table;
    }
    raw_allocator(const raw_allocator&) = delete;
    raw_allocator& operator=(const raw_allocator&) = delete;
    // The allocator's last reference, then the factories, then the library.
    ~raw_allocator() { table_.release(self_); }

    const NxmemAllocatorVtable& table() const noexcept { return table_; }
    NxmemDeviceId device() const noexcept { return device_id{NXMEM_DEVICE_CUDA, 0}.to_wire(); }

    NxmemAllocation allocate(std::uint64_t size, std::uint64_t alignment = 256) {
        auto request = abi::make_struct<NxmemAllocRequest>();
        request.mechanism_id = table_.mechanism_id;
        request.device = device();
        request.allocation_id = ++last_allocation_id_;
        request.size = size;
        request.alignment = alignment;
        auto made = abi::make_struct<NxmemAllocResult>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.allocate(self_, &request, &made, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
        auto described = abi::make_struct<NxmemAllocation>();
        described.mechanism_id = request.mechanism_id;
        described.device = request.device;
        described.allocation_id = request.allocation_id;
        described.address = made.address;
        described.size = size;
        described.alignment = alignment;
        return described;
    }

    // cuda-vmm: commits the whole allocation.
    void commit_all(const NxmemAllocation& live) {
        REQUIRE(table_.virtual_backing != nullptr);
        auto request = abi::make_struct<NxmemRangeRequest>();
        request.allocation = live;
        request.range = abi::make_struct<NxmemByteRange>();
        request.range.length = live.size;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.virtual_backing->commit(self_, &request, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
    }

    // cuda-vmm: a shared prefix of `size` bytes, and its release.
    NxmemSharedPrefixHandle create_prefix(std::uint64_t size) {
        REQUIRE(table_.shared_mapping != nullptr);
        auto request = abi::make_struct<NxmemSharedPrefixRequest>();
        request.mechanism_id = table_.mechanism_id;
        request.device = device();
        request.size = size;
        auto made = abi::make_struct<NxmemSharedPrefixHandle>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.shared_mapping->create_shared_prefix(self_, &request, &made, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
        return made;
    }
    void commit_prefix(const NxmemAllocation& live, const NxmemSharedPrefixHandle& prefix) {
        auto request = abi::make_struct<NxmemSharedPrefixCommitRequest>();
        request.allocation = live;
        request.prefix = prefix;
        auto info = abi::make_struct<NxmemSharedPrefixCommitInfo>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.shared_mapping->commit_shared_prefix(self_, &request, &info, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
    }
    void release_prefix(const NxmemSharedPrefixHandle& prefix) {
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.shared_mapping->release_shared_prefix(self_, &prefix, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
    }

    void deallocate(const NxmemAllocation& live) {
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.deallocate(self_, &live, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
    }

    // Queues the release of `live` under a fresh ticket, to retire after `fences`; returns the
    // ticket, or 0 when the plugin refused (its code in `refused`).
    std::uint64_t release_after(const NxmemAllocation& live, const std::vector<NxmemFence>& fences,
                                NxmemStatusCode* refused = nullptr) {
        REQUIRE(table_.fenced_release != nullptr);
        const NxmemFencedReleaseRequest request =
            abi::make_fenced_release_request(live, ++last_ticket_, fences.data(), static_cast<std::uint32_t>(fences.size()));
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.fenced_release->enqueue_fenced_release(self_, &request, &status);
        if (refused != nullptr) {
            *refused = code;
            return code == NXMEM_STATUS_OK ? request.ticket : 0;
        }
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
        return request.ticket;
    }

    // One drain; the tickets retired so far, in the order the plugin reported them.
    std::vector<std::uint64_t> drain() {
        std::uint64_t retired = 0;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.drain_releases(self_, &retired, &status);
        INFO(abi::read_status_message(status));
        REQUIRE(code == NXMEM_STATUS_OK);
        std::lock_guard lock(completed_mutex_);
        return completed_;
    }

    NxmemStatusCode copy(NxmemCopyRequest request, std::string* message = nullptr) {
        REQUIRE(table_.copy != nullptr);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.copy->copy(self_, &request, &status);
        if (message != nullptr) {
            *message = abi::read_status_message(status);
        }
        return code;
    }

    // The plugin's count of queued releases (what gates its unload).
    std::uint64_t queued_releases() const {
        auto report = abi::make_struct<NxmemUnloadReport>();
        NxmemStatus status = abi::make_status();
        REQUIRE(library_->query_unload_readiness()(&report, &status) == NXMEM_STATUS_OK);
        return report.queued_releases;
    }

private:
    std::optional<conform::detail::raw_library> library_;
    std::optional<conform::detail::raw_factories> factories_;
    conform::detail::callback_host callbacks_;
    NxmemAllocatorVtable* self_ = nullptr;
    NxmemAllocatorVtable table_{};
    std::uint64_t last_allocation_id_ = 0;
    std::uint64_t last_ticket_ = 0;
    std::mutex completed_mutex_; // release_completed may come from the drain's thread
    std::vector<std::uint64_t> completed_;
};

// A CUDA fence on device 0 of the fake (or real) driver.
inline NxmemFence cuda_fence(NxmemFenceKind kind, const void* handle) {
    return abi::make_fence(kind, device_id{NXMEM_DEVICE_CUDA, 0}.to_wire(), reinterpret_cast<std::uint64_t>(handle));
}

} // namespace nxmem::test
