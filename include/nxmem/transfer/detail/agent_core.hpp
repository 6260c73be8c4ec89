// The agent's shared state and every UCX call it makes (context, worker, endpoints, memory
// handles, keys, gets, puts, flushes, notifications and batch messages), under one lock. The handles in
// registration.hpp, peer.hpp, transfer_request.hpp and agent.hpp each hold it.
#pragma once


#include <nxmem/host/ipc_view.hpp>
#include <nxmem/host/plugin_allocator.hpp>
#include <nxmem/host/shared_prefix.hpp>
#include <nxmem/pool/pool_lease.hpp>
#include <nxmem/pool/pool_region.hpp>
#include <nxmem/transfer/descriptor.hpp>
#include <nxmem/transfer/agent_options.hpp>
#include <nxmem/transfer/detail/batch_messages.hpp>
#include <nxmem/transfer/detail/packed_key.hpp>
#include <nxmem/transfer/detail/page_probe.hpp>
#include <nxmem/transfer/detail/records.hpp>
#include <nxmem/transfer/detail/staging_buffers.hpp>
#include <nxmem/transfer/wire.hpp>

#include <ucp/api/ucp.h>

#include <poll.h>
#include <stdio.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

namespace nxmem::transfer {

namespace detail {

inline constexpr unsigned notification_am_id = 0x6e78; // "nx"
inline constexpr std::size_t max_queued_notifications = 1u << 16;

class agent_core {
public:
    static result<std::shared_ptr<agent_core>> start(const agent_options& options) {
        auto core = std::make_shared<agent_core>();
        core->name_ = options.name.substr(0, max_name_bytes);
        core->transfer_path_ = options.path;
        std::random_device entropy;
        for (std::size_t i = 0; i < core->id_.size(); i += 4) {
            const std::uint32_t word = entropy();
            std::memcpy(core->id_.data() + i, &word, 4);
        }
        ucp_config_t* config = nullptr;
        ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
        if (status != UCS_OK) {
            return fail(status_code::internal_error, "UCX: cannot read its configuration: " + ucx_text(status));
        }
        if (!options.transports.empty()) {
            status = ucp_config_modify(config, "TLS", options.transports.c_str());
            if (status != UCS_OK) {
                ucp_config_release(config);
                return fail(status_code::invalid_argument,
                            "UCX refused transports '" + options.transports + "': " + ucx_text(status));
            }
        }
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
        params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | (options.progress_thread ? UCP_FEATURE_WAKEUP : 0);
        params.mt_workers_shared = 0; // one worker, serialised by the core's lock
        status = ucp_init(&params, config, &core->context_);
        ucp_config_release(config);
        if (status != UCS_OK) {
            core->context_ = nullptr;
            return fail(status_code::internal_error,
                        "UCX: ucp_init failed" +
                            (options.transports.empty() ? std::string() : " (transports '" + options.transports + "')") +
                            ": " + ucx_text(status));
        }
        ucp_worker_params_t worker_params{};
        worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        status = ucp_worker_create(core->context_, &worker_params, &core->worker_);
        if (status != UCS_OK) {
            core->worker_ = nullptr;
            return fail(status_code::internal_error, "UCX: ucp_worker_create failed: " + ucx_text(status));
        }
        ucp_worker_attr_t worker_attributes{};
        worker_attributes.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
        if (ucp_worker_query(core->worker_, &worker_attributes) == UCS_OK &&
            worker_attributes.max_am_header >= sizeof(batch_header) + sizeof(batch_entry)) {
            core->rendezvous_entries_ = std::min<std::size_t>(
                max_batch_entries, (worker_attributes.max_am_header - sizeof(batch_header)) / sizeof(batch_entry));
        }
        const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
            {notification_am_id, &agent_core::on_notification},
            {batch_request_am_id, &agent_core::on_batch_request},
            {batch_reply_am_id, &agent_core::on_batch_reply}};
        for (const auto& [id, callback] : handlers) {
            ucp_am_handler_param_t handler{};
            handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
            handler.id = id;
            handler.cb = callback;
            handler.arg = core.get();
            status = ucp_worker_set_am_recv_handler(core->worker_, &handler);
            if (status != UCS_OK) {
                return fail(status_code::internal_error,
                            "UCX: cannot set active-message handler " + std::to_string(id) + ": " + ucx_text(status));
            }
        }
        if (options.progress_thread) {
            status = ucp_worker_get_efd(core->worker_, &core->event_fd_);
            if (status != UCS_OK) {
                return fail(status_code::internal_error, "UCX: no event fd for a progress thread: " + ucx_text(status));
            }
            core->stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
            if (core->stop_fd_ < 0) {
                return fail(status_code::internal_error, "eventfd failed for the progress thread");
            }
            core->has_thread_ = true;
        }
        return core;
    }

    agent_core() = default;
    agent_core(const agent_core&) = delete;
    agent_core& operator=(const agent_core&) = delete;

    // Everything handed out is gone (every handle holds the core): close the endpoints, wait a
    // bounded time for UCX to give back what it still holds, destroy the worker (which drops any
    // request left), then unmap: no request outlives the memory handle or key it names.
    ~agent_core() {
        if (worker_ != nullptr) {
            std::unique_lock lock(mutex_);
            stopping_ = true; // rendezvous data arriving from now on is not taken
            for (const auto& peer : peers_) {
                close_peer_locked(*peer, true);
            }
            drain_locked(std::chrono::seconds(1));
            for (closing_endpoint& closing : closing_) {
                ucp_request_free(closing.request); // a peer that never acknowledged: UCX drops it with the worker
            }
            closing_.clear();
            fail_batches_locked(nullptr, UCS_ERR_CANCELED); // replies that never came
            start_receives_locked();                        // releases the descriptors still waiting
            for (const auto& peer : peers_) {
                destroy_keys_locked(*peer); // keys go before their worker
            }
            peers_.clear();
            ucp_worker_destroy(worker_);
            sends_.clear(); // what UCX was still sending or receiving went with the worker
            receives_.clear();
            for (auto& record : registrations_) {
                unmap_locked(*record);
            }
            registrations_.clear();
        }
        if (context_ != nullptr) {
            ucp_cleanup(context_);
        }
        if (stop_fd_ >= 0) {
            ::close(stop_fd_);
        }
    }

    const agent_id& id() const noexcept { return id_; }
    const std::string& name() const noexcept { return name_; }
    bool has_thread() const noexcept { return has_thread_; }

    // ---- metadata ----

    // header, agent id (16 bytes), name, worker address.
    result<std::vector<std::byte>> metadata() {
        std::lock_guard lock(mutex_);
        ucp_address_t* address = nullptr;
        std::size_t length = 0;
        const ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
        if (status != UCS_OK) {
            return fail(status_code::internal_error, "UCX: no worker address: " + ucx_text(status));
        }
        wire_writer out(blob_kind::agent_metadata);
        out.put_raw(id_.data(), id_.size());
        out.put_bytes(std::as_bytes(std::span(name_)));
        out.put_bytes(std::span(reinterpret_cast<const std::byte*>(address), length));
        ucp_worker_release_address(worker_, address);
        return std::move(out).finish();
    }

    // ---- registration ----

    struct region_request {
        std::uint64_t base = 0;
        std::uint64_t length = 0;
        bool remote_writable = true;
        bool local_writable = true;
        host::registration_lease lease;
        bool probe_pages = false; // parts of it may be uncommitted (registration_record::probe_pages)
    };

    result<std::shared_ptr<registration_record>> register_region(region_request&& request) {
        if (request.base == 0 || request.length == 0 || request.base > UINT64_MAX - request.length) {
            return fail(status_code::invalid_argument,
                        "register: " + std::to_string(request.length) + " bytes at 0x" +
                            nxmem::detail::to_hex(request.base) + " is not a range of memory");
        }
        auto record = std::make_shared<registration_record>();
        record->base = request.base;
        record->length = request.length;
        record->remote_writable = request.remote_writable;
        record->local_writable = request.local_writable;
        record->probe_pages = request.probe_pages;
        record->lease = std::move(request.lease);
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                            UCP_MEM_MAP_PARAM_FIELD_PROT;
        params.address = reinterpret_cast<void*>(request.base);
        params.length = request.length;
        params.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ |
                      (request.local_writable ? unsigned{UCP_MEM_MAP_PROT_LOCAL_WRITE} : 0u) |
                      (request.remote_writable ? unsigned{UCP_MEM_MAP_PROT_REMOTE_WRITE} : 0u);
        std::lock_guard lock(mutex_);
        ucs_status_t status = ucp_mem_map(context_, &params, &record->memh);
        if (status != UCS_OK) {
            record->memh = nullptr;
            return fail(status_code::internal_error, "UCX: ucp_mem_map of " + std::to_string(request.length) +
                                                         " bytes failed: " + ucx_text(status));
        }
        void* packed = nullptr;
        std::size_t packed_length = 0;
        status = ucp_rkey_pack(context_, record->memh, &packed, &packed_length);
        if (status != UCS_OK || packed_length == 0 || packed_length > max_rkey_bytes) {
            if (status == UCS_OK) {
                ucp_rkey_buffer_release(packed);
            }
            unmap_locked(*record);
            return fail(status_code::internal_error, "UCX: ucp_rkey_pack failed: " +
                                                         (status == UCS_OK ? "a key of " + std::to_string(packed_length) + " bytes"
                                                                           : ucx_text(status)));
        }
        try {
            record->packed_key.assign(static_cast<const std::byte*>(packed),
                                      static_cast<const std::byte*>(packed) + packed_length);
            ucp_rkey_buffer_release(packed);
            record->id = next_registration_id_++;
            const auto at = std::upper_bound(registrations_.begin(), registrations_.end(), record->base,
                                             [](std::uint64_t base, const auto& other) { return base < other->base; });
            registrations_.insert(at, record);
        } catch (...) {
            unmap_locked(*record);
            throw;
        }
        return record;
    }

    // What UCX 1.13 gives an endpoint, read from its table (ucp_ep_print_info: it has no query for
    // it). `rma`: a "put[N]" protocol line per RMA lane, i.e. gets and puts done by the transport
    // rather than emulated with active messages (tcp has none). `rendezvous`: a lane marked
    // "rma_bw", which moves large messages' data zero-copy by rendezvous (cma over shared memory,
    // RDMA); without one UCX would pipeline rendezvous data through its active messages, slower than
    // eager. `shared_memory`: every lane is on one host's memory (sysv, posix, cma): UCX's RMA
    // lanes there reach only segments UCX allocated itself, so gets and puts on the engine's memory
    // are emulated too. A table without lanes in it (another UCX's format) counts as RMA, no
    // rendezvous.
    struct endpoint_lanes {
        bool rma = true;
        bool rendezvous = false;
        bool shared_memory = false;
    };
    static endpoint_lanes read_lanes(ucp_ep_h endpoint) noexcept {
        char* text = nullptr;
        std::size_t size = 0;
        FILE* stream = ::open_memstream(&text, &size);
        if (stream == nullptr) {
            return {};
        }
        ucp_ep_print_info(endpoint, stream);
        std::fclose(stream);
        const std::string_view table(text != nullptr ? text : "", size);
        endpoint_lanes lanes;
        if (table.find("lane[") != std::string_view::npos) {
            lanes.rma = table.find("put[") != std::string_view::npos;
            lanes.rendezvous = table.find(" rma_bw#") != std::string_view::npos;
            lanes.shared_memory = true;
            for (std::size_t at = table.find("lane["); at != std::string_view::npos; at = table.find("lane[", at + 1)) {
                const std::string_view line = table.substr(at, table.find('\n', at) - at);
                lanes.shared_memory = lanes.shared_memory && line.find("/memory") != std::string_view::npos;
            }
        }
        std::free(text);
        return lanes;
    }

    // Device memory (docs/TRANSFER.md, "Device memory"): refused, naming what is missing.
    failure refuse_device_memory(const descriptor& memory, std::string_view device_type) const {
        std::string missing;
        if (device_type == "cuda" && !reaches_memory_type(UCS_MEMORY_TYPE_CUDA)) {
            missing = "this UCX has no cuda transport (cuda_copy, cuda_ipc): CUDA memory is not among the memory "
                      "types its context reaches";
        } else {
            missing = "nxmem's transfer layer registers host memory only; its device path is a design, not built";
        }
        return fail(status_code::unsupported_capability,
                    "register: " + std::string(device_type) + ":" + std::to_string(memory.device) + " memory (" +
                        std::to_string(memory.length) + " bytes at 0x" + nxmem::detail::to_hex(memory.address) +
                        ") cannot be registered: " + missing + " (docs/TRANSFER.md, \"Device memory\")");
    }

    // Whether UCX's context reaches memory of this type (its transports' memory domains).
    bool reaches_memory_type(ucs_memory_type_t type) const {
        ucp_context_attr_t attributes{};
        attributes.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
        std::lock_guard lock(mutex_);
        return ucp_context_query(context_, &attributes) == UCS_OK &&
               (attributes.memory_types & UCS_BIT(type)) != 0;
    }

    // BUSY while transfers use it; then unmapped and its lease ended.
    result<void> deregister(registration_record& record) {
        std::lock_guard lock(mutex_);
        if (record.deregistered) {
            return boost::outcome_v2::success();
        }
        const std::uint64_t in_flight = record.in_flight.load(std::memory_order_acquire);
        if (in_flight != 0) {
            return fail(status_code::busy, "deregister: registration " + std::to_string(record.id) + " is used by " +
                                               std::to_string(in_flight) + " transfer(s) in flight; wait for them");
        }
        forget_locked(record);
        return boost::outcome_v2::success();
    }
    // The handle went: deregister now, or once the transfers using it are done. Allocates nothing.
    void abandon(registration_record& record) noexcept {
        std::lock_guard lock(mutex_);
        if (record.deregistered) {
            return;
        }
        if (record.in_flight.load(std::memory_order_acquire) != 0) {
            record.release_when_idle = true;
            return;
        }
        forget_locked(record);
    }

    std::size_t registration_count() const {
        std::lock_guard lock(mutex_);
        return registrations_.size();
    }

    // header, agent id, region count (u32), each: id, base, length (u64), device (u32), kind
    // (u8), flags (u8: bit 0 remotely writable), packed key (u32 length + bytes).
    result<std::vector<std::byte>> export_regions(std::span<const registration_record* const> records) {
        std::lock_guard lock(mutex_);
        wire_writer out(blob_kind::regions);
        out.put_raw(id_.data(), id_.size());
        out.put_u32(static_cast<std::uint32_t>(records.size()));
        for (const registration_record* record : records) {
            if (record == nullptr || record->deregistered) {
                return fail(status_code::invalid_argument, "export_regions: a registration that is deregistered");
            }
            out.put_u64(record->id);
            out.put_u64(record->base);
            out.put_u64(record->length);
            out.put_u32(record->device);
            out.put_u8(static_cast<std::uint8_t>(record->kind));
            out.put_u8(record->remote_writable ? 1 : 0);
            out.put_bytes(record->packed_key);
        }
        for (const registration_record* record : records) {
            record->exported = true; // a peer may now ask for it in a batch
        }
        return std::move(out).finish();
    }

    // ---- peers ----

    result<std::shared_ptr<peer_record>> connect(std::span<const std::byte> metadata) {
        NXMEM_TRY(in, wire_reader::open(metadata, blob_kind::agent_metadata));
        auto peer = std::make_shared<peer_record>();
        std::span<const std::byte> name;
        std::span<const std::byte> address;
        if (!in.get_raw(peer->id.data(), peer->id.size()) || !in.get_bytes(name, max_name_bytes) ||
            !in.get_bytes(address, max_worker_address_bytes)) {
            return in.malformed("truncated, or a name or worker address over its cap");
        }
        NXMEM_TRY_VOID(in.finish());
        if (address.empty()) {
            return in.malformed("an empty worker address");
        }
        if (peer->id == id_) {
            return fail(status_code::invalid_argument, "connect: the metadata is this agent's own");
        }
        peer->name.assign(reinterpret_cast<const char*>(name.data()), name.size());
        // UCX parses the worker address without a length: hand it a copy with zeroed room behind.
        std::vector<std::byte> padded(address.begin(), address.end());
        padded.resize(address.size() + packed_key_slack);
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                            UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.address = reinterpret_cast<const ucp_address_t*>(padded.data());
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler.cb = &agent_core::on_peer_failure;
        params.err_handler.arg = peer.get();
        std::lock_guard lock(mutex_);
        peers_.reserve(peers_.size() + 1);
        ucs_status_t status = no_failure_detection_ ? UCS_ERR_UNREACHABLE
                                                    : ucp_ep_create(worker_, &params, &peer->endpoint);
        if (status == UCS_ERR_UNREACHABLE) {
            // UCX 1.13's shared-memory transports (posix, sysv, cma) cannot report a peer's death:
            // connect without it. A transfer with a dead peer then ends only by the caller's
            // timeout and a forced disconnect (docs/TRANSFER.md, "When a peer dies").
            params.field_mask &= ~static_cast<std::uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
            params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
            status = ucp_ep_create(worker_, &params, &peer->endpoint);
            peer->detects_failure = false;
            no_failure_detection_ = status == UCS_OK; // the transports stay what they are: ask once
        }
        if (status != UCS_OK) {
            peer->endpoint = nullptr;
            return fail(status_code::invalid_argument,
                        "connect to '" + peer->name + "': UCX refused the worker address: " + ucx_text(status));
        }
        const endpoint_lanes lanes = read_lanes(peer->endpoint);
        // automatic: messages wherever UCX would emulate the gets and puts on the engine's memory
        // (tcp; shared memory, whose message data then goes by cma rendezvous).
        peer->uses_messages = transfer_path_ == transfer_path::messages ||
                              (transfer_path_ == transfer_path::automatic &&
                               (!lanes.rma || (lanes.rendezvous && lanes.shared_memory)));
        peer->rendezvous = lanes.rendezvous;
        peers_.push_back(peer);
        return peer;
    }

    result<void> load_regions(peer_record& peer, std::span<const std::byte> blob) {
        NXMEM_TRY(in, wire_reader::open(blob, blob_kind::regions));
        agent_id owner{};
        std::uint32_t count = 0;
        if (!in.get_raw(owner.data(), owner.size()) || !in.get_u32(count)) {
            return in.malformed("truncated before the region count");
        }
        if (owner != peer.id) {
            return fail(status_code::invalid_argument, "load_regions: the region list belongs to another agent "
                                                       "than peer '" + peer.name + "'");
        }
        constexpr std::size_t min_region_bytes = 8 * 3 + 4 + 2 + 4 + 1;
        if (count > max_regions || count > in.left() / min_region_bytes) {
            return in.malformed(std::to_string(count) + " regions announced, room for " +
                                std::to_string(in.left() / min_region_bytes));
        }
        struct parsed {
            remote_region region;
            std::span<const std::byte> key;
        };
        std::vector<parsed> regions;
        regions.reserve(count);
        for (std::uint32_t i = 0; i < count; ++i) {
            parsed next;
            std::uint8_t kind = 0;
            std::uint8_t flags = 0;
            if (!(in.get_u64(next.region.id) && in.get_u64(next.region.base) && in.get_u64(next.region.length) &&
                  in.get_u32(next.region.device) && in.get_u8(kind) && in.get_u8(flags) &&
                  in.get_bytes(next.key, max_rkey_bytes))) {
                return in.malformed("region " + std::to_string(i) + " truncated (or a key over " +
                                    std::to_string(max_rkey_bytes) + " bytes)");
            }
            if (next.region.length == 0 || next.region.base == 0 ||
                next.region.base > UINT64_MAX - next.region.length) {
                return in.malformed("region " + std::to_string(i) + ": " + std::to_string(next.region.length) +
                                    " bytes at 0x" + nxmem::detail::to_hex(next.region.base) +
                                    " is empty or wraps past the end of the address space");
            }
            if (kind > static_cast<std::uint8_t>(memory_kind::device) || (flags & ~1u) != 0) {
                return in.malformed("region " + std::to_string(i) + ": unknown memory kind or flags");
            }
            std::string key_problem = packed_key_problem(next.key);
            if (!key_problem.empty()) {
                return in.malformed("region " + std::to_string(i) + ": packed key refused: " + key_problem);
            }
            for (const parsed& earlier : regions) {
                if (earlier.region.id == next.region.id) {
                    return in.malformed("region id " + std::to_string(next.region.id) + " appears twice");
                }
            }
            next.region.kind = static_cast<memory_kind>(kind);
            next.region.writable = (flags & 1u) != 0;
            regions.push_back(next);
        }
        NXMEM_TRY_VOID(in.finish());
        std::lock_guard lock(mutex_);
        NXMEM_TRY_VOID(usable_locked(peer));
        std::vector<remote_region> unpacked;
        unpacked.reserve(regions.size());
        peer.retired_keys.reserve(peer.retired_keys.size() + peer.regions.size());
        std::vector<std::byte> padded;
        for (parsed& next : regions) {
            padded.assign(next.key.begin(), next.key.end());
            padded.resize(next.key.size() + packed_key_slack);
            const ucs_status_t status = ucp_ep_rkey_unpack(peer.endpoint, padded.data(), &next.region.key);
            if (status != UCS_OK) {
                for (remote_region& done : unpacked) {
                    ucp_rkey_destroy(done.key);
                }
                return fail(status_code::invalid_argument, "load_regions: UCX refused the packed key of region " +
                                                               std::to_string(next.region.id) + ": " + ucx_text(status));
            }
            unpacked.push_back(next.region);
        }
        for (remote_region& old : peer.regions) {
            peer.retired_keys.push_back(old.key); // a transfer in flight may still name it
        }
        peer.regions = std::move(unpacked);
        destroy_retired_keys_locked(peer);
        std::sort(peer.regions.begin(), peer.regions.end(),
                  [](const remote_region& a, const remote_region& b) { return a.base < b.base; });
        return boost::outcome_v2::success();
    }

    std::vector<descriptor> regions_of(const peer_record& peer) const {
        std::lock_guard lock(mutex_);
        std::vector<descriptor> regions;
        regions.reserve(peer.regions.size());
        for (const remote_region& region : peer.regions) {
            regions.push_back(descriptor{region.base, region.length, region.device, region.kind});
        }
        return regions;
    }

    void close_peer(peer_record& peer, bool force) noexcept {
        std::lock_guard lock(mutex_);
        close_peer_locked(peer, force);
    }

    // ---- transfers ----

    enum class direction { read, write };

    // All checks first (nothing reaches UCX until every block has passed), then either batch
    // messages (a peer without RMA lanes) or one get or put per block and a flush for writes; the
    // notification once everything is done.
    result<std::shared_ptr<transfer_state>> submit(direction way, peer_record& peer, const descriptor_list& local,
                                                   const descriptor_list& remote, std::span<const std::byte> message) {
        const char* verb = way == direction::read ? "read" : "write";
        if (local.block_count() != remote.block_count()) {
            return fail(status_code::invalid_argument,
                        std::string(verb) + ": " + std::to_string(local.block_count()) + " local blocks against " +
                            std::to_string(remote.block_count()) + " remote blocks");
        }
        if (local.empty()) {
            return fail(status_code::invalid_argument, std::string(verb) + ": no blocks");
        }
        if (message.size() > max_notification_bytes) {
            return fail(status_code::invalid_argument, std::string(verb) + ": a notification of " +
                                                           std::to_string(message.size()) + " bytes (at most " +
                                                           std::to_string(max_notification_bytes) + ")");
        }
        auto state = std::make_shared<transfer_state>();
        state->notification.assign(message.begin(), message.end());
        state->blocks = local.block_count();
        state->bytes = local.total_bytes();
        state->pinned.reserve(4);
        std::vector<planned_op> ops;
        ops.reserve(static_cast<std::size_t>(local.block_count()));

        std::unique_lock lock(mutex_);
        NXMEM_TRY_VOID(usable_locked(peer));
        NXMEM_TRY_VOID(plan_locked(way, verb, peer, local, remote, ops, *state));
        state->peer = peer_shared_locked(peer);
        ++peer.transfers_in_ucx;
        for (auto& record : state->pinned) {
            record->in_flight.fetch_add(1, std::memory_order_acq_rel);
        }
        active_.reserve(active_.size() + 1);
        abandoned_.reserve(abandoned_.size() + active_.size() + 1); // close_peer_locked never allocates
        active_.push_back(state);

        if (peer.uses_messages) {
            issue_batch_locked(way, state, ops);
            release_one_locked(*state); // the issuing pass's own count
            after_progress_locked();
            return state;
        }
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
        param.cb.send = &agent_core::on_op_done;
        param.user_data = state.get();
        for (const planned_op& op : ops) {
            param.memh = op.memh;
            ucs_status_ptr_t issued =
                way == direction::read
                    ? ucp_get_nbx(peer.endpoint, reinterpret_cast<void*>(op.local), op.length, op.remote, op.key, &param)
                    : ucp_put_nbx(peer.endpoint, reinterpret_cast<const void*>(op.local), op.length, op.remote, op.key,
                                  &param);
            if (!account_locked(*state, issued)) {
                break; // the ops already issued still complete; the transfer reports the failure
            }
        }
        if (way == direction::write && state->error.load() == UCS_OK) {
            flush_later_locked(state);
        }
        release_one_locked(*state); // the issuing pass's own count
        after_progress_locked();
        return state;
    }

    // ---- progress ----

    // Progresses UCX until it has nothing more to do right now; true if anything happened.
    bool progress() {
        std::lock_guard lock(mutex_);
        return progress_locked();
    }

    // Waits until the transfer is done or `timeout` has passed; true when done.
    bool wait(transfer_state& state, std::chrono::nanoseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        if (has_thread_) {
            std::unique_lock lock(state.done_mutex);
            return state.done_signal.wait_until(lock, deadline, [&] { return state.finished(); });
        }
        unsigned idle = 0;
        while (!state.finished()) {
            if (progress()) {
                idle = 0;
            } else if (++idle % 64 == 0) {
                if (std::chrono::steady_clock::now() >= deadline) {
                    return state.finished();
                }
                ::sched_yield(); // a shared machine: let the peer run
            }
        }
        return true;
    }

    // ---- notifications ----

    std::optional<notification> take_notification() {
        std::lock_guard lock(notification_mutex_);
        if (notifications_.empty()) {
            return std::nullopt;
        }
        notification next = std::move(notifications_.front());
        notifications_.pop_front();
        return next;
    }
    result<notification> wait_notification(std::chrono::nanoseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        unsigned idle = 0;
        for (;;) {
            if (auto next = take_notification()) {
                std::lock_guard lock(mutex_);
                for (const auto& peer : peers_) {
                    if (peer->id == next->sender) {
                        next->sender_name = peer->name;
                        break;
                    }
                }
                return std::move(*next);
            }
            if (has_thread_) {
                std::unique_lock lock(notification_mutex_);
                if (!notification_signal_.wait_until(lock, deadline, [&] { return !notifications_.empty(); })) {
                    return timeout_failure(timeout);
                }
                continue;
            }
            if (progress()) {
                idle = 0;
            } else if (++idle % 64 == 0) {
                if (std::chrono::steady_clock::now() >= deadline) {
                    return timeout_failure(timeout);
                }
                ::sched_yield();
            }
        }
    }
    std::uint64_t dropped_notifications() const noexcept { return dropped_notifications_.load(); }
    std::uint64_t refused_batches() const noexcept { return refused_batches_.load(); }
    std::uint64_t unprobed_batches() const noexcept { return unprobed_batches_.load(); }

    // ---- the progress thread ----

    void run_progress_thread(const std::atomic<bool>& stop) {
        while (!stop.load(std::memory_order_acquire)) {
            if (progress()) {
                continue;
            }
            ucs_status_t armed = UCS_OK;
            {
                std::lock_guard lock(mutex_);
                armed = ucp_worker_arm(worker_);
            }
            if (armed == UCS_ERR_BUSY) {
                continue; // events arrived meanwhile
            }
            pollfd fds[2] = {{event_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
            (void)::poll(fds, 2, armed == UCS_OK ? 100 : 1);
        }
    }
    void wake_thread() noexcept {
        const std::uint64_t one = 1;
        (void)!::write(stop_fd_, &one, sizeof one);
    }

private:
    // Writes that wait for one flush of their peer's endpoint.
    struct flush_group {
        std::shared_ptr<peer_record> peer;
        std::vector<std::shared_ptr<transfer_state>> writes;
    };

    struct planned_op {
        std::uint64_t local = 0;
        std::uint64_t remote = 0;
        std::uint64_t length = 0;
        ucp_mem_h memh = nullptr;
        ucp_rkey_h key = nullptr;
    };

    // A batch message UCX is sending: its header and data live here until UCX is done with them.
    struct batch_send {
        agent_core* core = nullptr;
        batch_header header;
        std::vector<std::byte> header_entries; // after `header`, when the entries travel in it
        std::vector<std::byte> payload;        // the data, or:
        std::vector<ucp_dt_iov_t> blocks;      // the data as the engine's blocks (by rendezvous)
        std::shared_ptr<transfer_state> state; // an initiator's request (counted in it); empty for a reply
        // A target's reply sent from its blocks: their registrations, each counted in its
        // in_flight until UCX is done with them.
        std::vector<std::shared_ptr<registration_record>> pinned;
    };
    // Where a batch's reply stands while its data comes by rendezvous.
    enum class receive_stage : std::uint8_t { none, waiting, in_ucx };
    // A batch message sent and awaiting the target's reply.
    struct batch_pending {
        std::shared_ptr<transfer_state> state;
        std::shared_ptr<peer_record> peer;
        batch_op op = batch_op::read;
        std::vector<batch_entry> local; // a read's: where each block lands, in entry order
        std::uint64_t bytes = 0;
        bool sent = false; // counted in its peer's message_bytes_in_flight
        receive_stage receiving = receive_stage::none;
    };
    // Batch data UCX delivers by rendezvous straight into the blocks it is for: a write's bytes at
    // its target (`reply_ep` where the answer goes; the registrations written are pinned until it is
    // done) or a read's reply at its initiator (`token` the batch it answers; the transfer pins the
    // local blocks).
    struct batch_receive {
        agent_core* core = nullptr;
        void* descriptor = nullptr; // UCX's, of the data still at the sender
        std::uint64_t token = 0;
        ucp_ep_h reply_ep = nullptr;
        batch_header asked{};
        std::vector<ucp_dt_iov_t> blocks;
        std::uint64_t bytes = 0;
        std::vector<std::shared_ptr<registration_record>> pinned; // each counted in its in_flight
    };
    // A batch message waiting for its peer's window: its blocks (pieces of at most
    // batch_message_bytes); it is made when it is sent.
    struct queued_batch {
        std::uint64_t token = 0;
        std::vector<planned_op> ops;
    };

    // Whether requests to this peer carry their entries in the message's header (which bounds them
    // per message): a peer taking batch data by rendezvous, so a write sends its blocks straight
    // from the engine's memory (and a request without data is UCX's cheapest message).
    bool entries_in_header(const peer_record& peer) const noexcept {
        return peer.rendezvous && rendezvous_entries_ != 0;
    }

    // Cuts the planned blocks into batch messages of about batch_message_bytes of data (a block
    // larger than that into pieces) and queues them; each counts once in the transfer for its reply
    // (and once for its send while UCX sends it). pump_batches_locked sends them as the peer's
    // window allows. A message that cannot be made fails the transfer (those already made go on).
    void issue_batch_locked(direction way, const std::shared_ptr<transfer_state>& state,
                            const std::vector<planned_op>& ops) noexcept {
        const batch_op op = way == direction::read ? batch_op::read : batch_op::write;
        const std::size_t entries_per_message =
            entries_in_header(*state->peer) ? rendezvous_entries_ : max_batch_entries;
        try {
            std::vector<planned_op> message;
            std::uint64_t bytes = 0;
            const auto queue = [&] {
                const std::uint64_t token = next_batch_token_++;
                batch_pending pending{state, state->peer, op, {}, bytes, false, receive_stage::none};
                if (op == batch_op::read) {
                    pending.local.reserve(message.size());
                    for (const planned_op& piece : message) {
                        pending.local.push_back(batch_entry{piece.local, piece.length});
                    }
                }
                queued_.push_back(queued_batch{token, {}});
                queued_.back().ops = std::move(message);
                batches_.emplace(token, std::move(pending));
                state->outstanding.fetch_add(1, std::memory_order_acq_rel); // the reply's
                message.clear();
                bytes = 0;
            };
            for (const planned_op& whole : ops) {
                for (std::uint64_t at = 0; at < whole.length; at += batch_message_bytes) {
                    const std::uint64_t length = std::min(batch_message_bytes, whole.length - at);
                    if (!message.empty() &&
                        (bytes + length > batch_message_bytes || message.size() == entries_per_message)) {
                        queue();
                    }
                    message.push_back(planned_op{whole.local + at, whole.remote + at, length, whole.memh, whole.key});
                    bytes += length;
                }
            }
            if (!message.empty()) {
                queue();
            }
        } catch (const std::bad_alloc&) {
            state->record_error(UCS_ERR_NO_MEMORY); // the messages queued before it still go
        }
        pump_batches_locked();
    }

    // Sends queued batch messages, in order per peer, while the peer has less than
    // max_batch_bytes_in_flight of message data unanswered: a deep queue of large requests waits
    // here rather than in UCX's eager buffers and the target's staging.
    bool pump_batches_locked() noexcept {
        bool any = false;
        const peer_record* blocked[8] = {};
        std::size_t blocked_count = 0;
        for (auto it = queued_.begin(); it != queued_.end();) {
            const auto at = batches_.find(it->token);
            if (at == batches_.end()) {
                it = queued_.erase(it); // failed meanwhile (a forced close, the peer's failure)
                continue;
            }
            batch_pending& pending = at->second;
            peer_record& peer = *pending.peer;
            const bool waits = std::find(blocked, blocked + blocked_count, &peer) != blocked + blocked_count ||
                               (peer.message_bytes_in_flight != 0 &&
                                peer.message_bytes_in_flight + pending.bytes > max_batch_bytes_in_flight);
            if (waits) {
                if (blocked_count < std::size(blocked)) {
                    blocked[blocked_count++] = &peer;
                }
                ++it;
                continue;
            }
            const std::uint64_t token = it->token;
            ucs_status_t sent = UCS_OK;
            try {
                auto message = make_request_locked(token, pending, it->ops);
                pending.sent = true;
                peer.message_bytes_in_flight += pending.bytes;
                // A read's request is its entries alone: eager. A write's blocks go by rendezvous
                // where the endpoint moves them zero-copy (UCX still sends a small one eagerly),
                // else packed behind the entries as eager fragments.
                const bool rendezvous = !message->blocks.empty();
                sent = send_batch_locked(peer.endpoint, batch_request_am_id, std::move(message),
                                         UCP_AM_SEND_FLAG_REPLY | (rendezvous ? 0u : unsigned{UCP_AM_SEND_FLAG_EAGER}));
            } catch (const std::bad_alloc&) {
                sent = UCS_ERR_NO_MEMORY;
            }
            it = queued_.erase(it);
            if (sent != UCS_OK) {
                fail_batch_locked(token, sent);
            }
            any = true;
        }
        return any;
    }

    // A batch request: the header, then the entries (the blocks at the target) and a write's bytes
    // packed as the data, or, for a write by rendezvous, the entries in the header and the engine's
    // blocks as the data.
    std::unique_ptr<batch_send> make_request_locked(std::uint64_t token, const batch_pending& pending,
                                                    const std::vector<planned_op>& ops) {
        auto message = std::make_unique<batch_send>();
        message->core = this;
        message->state = pending.state;
        message->header.op = pending.op;
        message->header.token = token;
        message->header.count = static_cast<std::uint32_t>(ops.size());
        message->header.sender = id_;
        const peer_record& peer = *pending.peer;
        message->header.flags = peer.rendezvous ? batch_flag_rendezvous : 0;
        const bool in_header = entries_in_header(peer);
        const bool blocks_as_data = pending.op == batch_op::write && in_header;
        const std::size_t entry_bytes = ops.size() * sizeof(batch_entry);
        std::byte* entries = nullptr;
        std::byte* data = nullptr;
        if (in_header) {
            message->header.flags |= batch_flag_entries_in_header;
            message->header_entries.resize(sizeof(batch_header) + entry_bytes);
            entries = message->header_entries.data() + sizeof(batch_header);
            if (blocks_as_data) {
                message->blocks.reserve(ops.size());
            }
        } else {
            message->payload = buffers_.take(entry_bytes + (pending.op == batch_op::write ? pending.bytes : 0));
            entries = message->payload.data();
            data = entries + entry_bytes;
        }
        for (const planned_op& piece : ops) {
            const batch_entry remote{piece.remote, piece.length};
            std::memcpy(entries, &remote, sizeof remote);
            entries += sizeof remote;
            if (pending.op != batch_op::write) {
                continue;
            }
            if (blocks_as_data) {
                append_block(message->blocks, piece.local, piece.length);
            } else {
                std::memcpy(data, reinterpret_cast<const void*>(piece.local), piece.length);
                data += piece.length;
            }
        }
        if (in_header) {
            std::memcpy(message->header_entries.data(), &message->header, sizeof(batch_header));
        }
        return message;
    }

    // Sends one batch message; UCS_OK once it is sent or on its way (then kept in sends_).
    ucs_status_t send_batch_locked(ucp_ep_h endpoint, unsigned id, std::unique_ptr<batch_send> message, unsigned flags) {
        sends_.reserve(sends_.size() + 1); // before UCX holds it: the push below cannot throw
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = flags;
        param.cb.send = &agent_core::on_batch_sent;
        param.user_data = message.get();
        const void* header = &message->header;
        std::size_t header_length = sizeof(batch_header);
        if (!message->header_entries.empty()) {
            header = message->header_entries.data();
            header_length = message->header_entries.size();
        }
        const void* data = message->payload.data();
        std::size_t count = message->payload.size();
        if (!message->blocks.empty()) {
            param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
            param.datatype = ucp_dt_make_iov();
            data = message->blocks.data();
            count = message->blocks.size();
        }
        const ucs_status_ptr_t sent = ucp_am_send_nbx(endpoint, id, header, header_length, data, count, &param);
        if (sent == nullptr || UCS_PTR_IS_ERR(sent)) {
            buffers_.give(std::move(message->payload));
            unpin_locked(message->pinned);
            return UCS_PTR_STATUS(sent);
        }
        if (message->state != nullptr) {
            message->state->outstanding.fetch_add(1, std::memory_order_acq_rel); // the send's
        }
        sends_.push_back(std::move(message));
        return UCS_OK;
    }

    static void on_batch_sent(void* request, ucs_status_t status, void* user_data) {
        auto* message = static_cast<batch_send*>(user_data);
        if (message->state != nullptr) {
            if (status != UCS_OK) {
                message->state->record_error(status);
            }
            release_one_locked(*message->state);
        }
        ucp_request_free(request);
        agent_core& core = *message->core;
        core.buffers_.give(std::move(message->payload));
        unpin_locked(message->pinned);
        auto& sends = core.sends_;
        for (auto& held : sends) {
            if (held.get() == message) {
                held = std::move(sends.back());
                sends.pop_back();
                break;
            }
        }
    }

    // Takes a batch out of those awaiting a reply (its peer's window opens by its bytes).
    using pending_iterator = std::unordered_map<std::uint64_t, batch_pending>::iterator;
    pending_iterator forget_batch_locked(pending_iterator at, batch_pending& out) noexcept {
        out = std::move(at->second);
        if (out.sent) {
            out.peer->message_bytes_in_flight -= out.bytes;
        }
        return batches_.erase(at);
    }
    // The batch awaiting the reply `token` fails with `status`.
    void fail_batch_locked(std::uint64_t token, ucs_status_t status) noexcept {
        const auto at = batches_.find(token);
        if (at == batches_.end()) {
            return;
        }
        batch_pending gone;
        forget_batch_locked(at, gone);
        gone.state->record_error(status);
        release_one_locked(*gone.state);
    }
    // Every batch awaiting a reply from `peer` (from anyone: nullptr) fails with `status`; with
    // `only_failed`, only those whose peer failed, with the peer's status. One whose reply UCX is
    // placing into the engine's blocks right now fails when UCX is done with them (unless the
    // agent is stopping: then UCX drops it with the worker), so nothing lands after `wait`.
    void fail_batches_locked(const peer_record* peer, ucs_status_t status, bool only_failed = false) noexcept {
        for (auto at = batches_.begin(); at != batches_.end();) {
            batch_pending& pending = at->second;
            const peer_record& owner = *pending.peer;
            if ((peer != nullptr && &owner != peer) || (only_failed && !owner.failed.load(std::memory_order_acquire))) {
                ++at;
                continue;
            }
            const auto failure = only_failed ? static_cast<ucs_status_t>(owner.failure.load()) : status;
            const ucs_status_t reported = failure != UCS_OK ? failure : UCS_ERR_ENDPOINT_TIMEOUT;
            if (pending.receiving == receive_stage::in_ucx && !stopping_) {
                pending.state->record_error(reported);
                ++at;
                continue;
            }
            batch_pending gone;
            at = forget_batch_locked(at, gone);
            gone.state->record_error(reported);
            release_one_locked(*gone.state);
        }
    }

    // A peer asks this agent, as a target, for blocks (a read) or sends them (a write). Each entry
    // must lie inside one registration this agent exported and still holds, writable by peers for
    // a write; otherwise nothing is touched and the reply says so.
    static ucs_status_t on_batch_request(void* arg, const void* header, std::size_t header_length, void* data,
                                         std::size_t length, const ucp_am_recv_param_t* param) {
        auto& core = *static_cast<agent_core*>(arg);
        try {
            return core.serve_batch_locked(std::span(static_cast<const std::byte*>(header), header_length), data,
                                           length, *param);
        } catch (...) {
            core.refused_batches_.fetch_add(1); // out of memory: counted, never thrown into UCX
        }
        return UCS_OK; // a rendezvous not taken is dropped, and its sender completes
    }

    // UCS_INPROGRESS when a rendezvous' descriptor is kept to be received later (UCX's contract for
    // the active-message callback), else UCS_OK.
    ucs_status_t serve_batch_locked(std::span<const std::byte> header, void* data, std::size_t length,
                                    const ucp_am_recv_param_t& param) {
        batch_header asked;
        if (header.size() < sizeof asked || (param.recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 ||
            param.reply_ep == nullptr) {
            refused_batches_.fetch_add(1); // nobody to answer
            return UCS_OK;
        }
        std::memcpy(&asked, header.data(), sizeof asked);
        if (asked.magic != batch_magic) {
            refused_batches_.fetch_add(1);
            return UCS_OK;
        }
        const bool rendezvous = (param.recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
        const std::span<const std::byte> here =
            rendezvous ? std::span<const std::byte>() : std::span(static_cast<const std::byte*>(data), length);
        const std::optional<batch_request> request = parse_batch_request(header, here, length);
        // By rendezvous, UCX reads or writes the blocks themselves: their registrations stay
        // pinned (their deregistration refused) until it is done.
        const bool from_blocks = request && request->header.op == batch_op::read &&
                                 (request->header.flags & batch_flag_rendezvous) != 0;
        std::vector<std::shared_ptr<registration_record>> pinned;
        ucs_status_t status = !request ? UCS_ERR_INVALID_PARAM
                                       : check_entries_locked(*request, rendezvous || from_blocks ? &pinned : nullptr);
        if (status == UCS_OK && rendezvous && stopping_) {
            status = UCS_ERR_CANCELED;
        }
        if (status != UCS_OK) {
            answer_batch_locked(param.reply_ep, asked, status, {});
            return UCS_OK; // a refused rendezvous is dropped: nothing of it is taken
        }
        if (from_blocks) {
            // A read whose initiator takes rendezvous: the reply's data is the blocks themselves.
            auto reply = make_answer_locked(asked, UCS_OK);
            reply->blocks = blocks_of(*request);
            pin_locked(pinned);
            reply->pinned = std::move(pinned);
            (void)send_batch_locked(param.reply_ep, batch_reply_am_id, std::move(reply), 0);
            return UCS_OK;
        }
        if (!rendezvous) {
            std::vector<std::byte> reply;
            place_or_stage_locked(*request, reply);
            answer_batch_locked(param.reply_ep, asked, UCS_OK, std::move(reply));
            return UCS_OK;
        }
        // A write's bytes, still at the initiator: straight into the checked blocks, which stay
        // pinned (their deregistration refused) until UCX has placed them.
        auto receive = std::make_unique<batch_receive>();
        receive->core = this;
        receive->descriptor = data;
        receive->reply_ep = param.reply_ep;
        receive->asked = asked;
        receive->bytes = request->bytes;
        receive->blocks = blocks_of(*request);
        pin_locked(pinned);
        receive->pinned = std::move(pinned);
        return take_rendezvous_locked(std::move(receive));
    }

    // Adds a block to a scatter-gather list, merged into the last one where it follows it (fewer
    // entries for UCX to walk: consecutive KV blocks are one).
    static void append_block(std::vector<ucp_dt_iov_t>& blocks, std::uint64_t address, std::uint64_t length) {
        if (!blocks.empty() && reinterpret_cast<std::uint64_t>(blocks.back().buffer) + blocks.back().length == address) {
            blocks.back().length += length;
            return;
        }
        blocks.push_back(ucp_dt_iov_t{reinterpret_cast<void*>(address), length});
    }

    // The request's blocks at this agent, as UCX's scatter-gather list.
    static std::vector<ucp_dt_iov_t> blocks_of(const batch_request& request) {
        std::vector<ucp_dt_iov_t> blocks;
        blocks.reserve(request.header.count);
        for (std::uint32_t i = 0; i < request.header.count; ++i) {
            const batch_entry e = request.entry(i);
            append_block(blocks, e.address, e.length);
        }
        return blocks;
    }

    static void pin_locked(const std::vector<std::shared_ptr<registration_record>>& records) noexcept {
        for (const auto& record : records) {
            record->in_flight.fetch_add(1, std::memory_order_acq_rel);
        }
    }
    // A registration whose handle went meanwhile is unmapped by after_progress once idle.
    static void unpin_locked(std::vector<std::shared_ptr<registration_record>>& records) noexcept {
        for (const auto& record : records) {
            record->in_flight.fetch_sub(1, std::memory_order_acq_rel);
        }
        records.clear();
    }

    // Each entry inside one registration this agent exported and still holds, host memory, and
    // writable by peers for a write; and every page of it there (docs/TRANSFER.md, "What is
    // checked"). `pinned`, when given, gets each registration named (once).
    ucs_status_t check_entries_locked(const batch_request& request,
                                      std::vector<std::shared_ptr<registration_record>>* pinned) {
        const bool write = request.header.op == batch_op::write;
        page_probe probe;
        for (std::uint32_t i = 0; i < request.header.count; ++i) {
            const batch_entry e = request.entry(i);
            const std::shared_ptr<registration_record>* found = find_local_shared_locked(e.address, e.length);
            const registration_record* record = found != nullptr ? found->get() : nullptr;
            if (record == nullptr || !record->exported || record->release_when_idle ||
                record->kind != memory_kind::host || (write && !record->remote_writable)) {
                return UCS_ERR_INVALID_ADDR;
            }
            if (pinned != nullptr && std::find(pinned->begin(), pinned->end(), *found) == pinned->end()) {
                pinned->push_back(*found);
            }
            if (record->probe_pages) {
                probe.add(e.address, e.length);
            }
        }
        switch (probe.run()) {
        case probe_result::unreadable:
            return UCS_ERR_INVALID_ADDR;
        case probe_result::unavailable:
            unprobed_batches_.fetch_add(1, std::memory_order_relaxed);
            break;
        case probe_result::readable:
            break;
        }
        return UCS_OK;
    }

    // A checked request whose data is here: a write's bytes placed, a read's blocks staged as the reply.
    void place_or_stage_locked(const batch_request& request, std::vector<std::byte>& reply) {
        const bool write = request.header.op == batch_op::write;
        if (!write) {
            reply = buffers_.take(request.bytes);
        }
        std::byte* staged = reply.data();
        const std::byte* incoming = request.data.data();
        for (std::uint32_t i = 0; i < request.header.count; ++i) {
            const batch_entry e = request.entry(i);
            if (write) {
                std::memcpy(reinterpret_cast<void*>(e.address), incoming, e.length);
                incoming += e.length;
            } else {
                std::memcpy(staged, reinterpret_cast<const void*>(e.address), e.length);
                staged += e.length;
            }
        }
    }

    std::unique_ptr<batch_send> make_answer_locked(const batch_header& asked, ucs_status_t status) {
        auto reply = std::make_unique<batch_send>();
        reply->core = this;
        reply->header.op = asked.op;
        reply->header.token = asked.token;
        reply->header.sender = id_;
        reply->header.status = status;
        return reply;
    }
    // Answers a request with `status` (counted when a refusal) and a read's blocks, staged.
    void answer_batch_locked(ucp_ep_h reply_ep, const batch_header& asked, ucs_status_t status,
                             std::vector<std::byte> blocks) {
        auto reply = make_answer_locked(asked, status);
        if (status != UCS_OK) {
            refused_batches_.fetch_add(1);
            buffers_.give(std::move(blocks));
        } else {
            reply->payload = std::move(blocks);
        }
        const bool rendezvous = (asked.flags & batch_flag_rendezvous) != 0;
        (void)send_batch_locked(reply_ep, batch_reply_am_id, std::move(reply), rendezvous ? 0u : unsigned{UCP_AM_SEND_FLAG_EAGER});
    }

    // The target's answer to a batch message: a read's blocks land where the transfer asked.
    static ucs_status_t on_batch_reply(void* arg, const void* header, std::size_t header_length, void* data,
                                       std::size_t length, const ucp_am_recv_param_t* param) {
        auto& core = *static_cast<agent_core*>(arg);
        batch_header answer;
        if (header_length != sizeof answer) {
            core.refused_batches_.fetch_add(1);
            return UCS_OK;
        }
        std::memcpy(&answer, header, sizeof answer);
        const auto at = core.batches_.find(answer.token);
        // Only the peer asked may answer, once, about what it was asked.
        if (answer.magic != batch_magic || at == core.batches_.end() || at->second.peer->id != answer.sender ||
            at->second.op != answer.op || at->second.receiving != receive_stage::none) {
            core.refused_batches_.fetch_add(1);
            return UCS_OK;
        }
        batch_pending& awaited = at->second;
        const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
        if (rendezvous && answer.status == UCS_OK && awaited.op == batch_op::read && length == awaited.bytes &&
            !core.stopping_) {
            // A read's blocks, still at the target: straight into the local blocks (pinned by the
            // transfer, which cannot finish before UCX is done with them).
            try {
                auto receive = std::make_unique<batch_receive>();
                receive->core = &core;
                receive->descriptor = data;
                receive->token = answer.token;
                receive->bytes = length;
                receive->blocks.reserve(awaited.local.size());
                for (const batch_entry& block : awaited.local) {
                    append_block(receive->blocks, block.address, block.length);
                }
                awaited.receiving = receive_stage::waiting;
                return core.take_rendezvous_locked(std::move(receive));
            } catch (...) {
                core.fail_batch_locked(answer.token, UCS_ERR_NO_MEMORY);
            }
            return UCS_OK;
        }
        batch_pending pending;
        core.forget_batch_locked(at, pending);
        transfer_state& state = *pending.state;
        if (answer.status != UCS_OK) {
            state.record_error(answer.status < 0 ? static_cast<ucs_status_t>(answer.status) : UCS_ERR_INVALID_PARAM);
        } else if (pending.op == batch_op::read && length != pending.bytes) {
            state.record_error(UCS_ERR_MESSAGE_TRUNCATED);
        } else if (rendezvous) {
            state.record_error(UCS_ERR_UNSUPPORTED); // data with a write's answer: not taken
        } else if (pending.op == batch_op::read) {
            const auto* incoming = static_cast<const std::byte*>(data);
            for (const batch_entry& block : pending.local) {
                std::memcpy(reinterpret_cast<void*>(block.address), incoming, block.length);
                incoming += block.length;
            }
        }
        release_one_locked(state);
        return UCS_OK;
    }

    // Takes batch data that came by rendezvous, in arrival order and one at a time: UCX 1.13 stalls
    // for milliseconds when several rendezvous gets over cma are in flight on a worker (two 1 MiB
    // messages took 5 ms at once, 0.12 ms one after the other). UCS_INPROGRESS when the descriptor
    // waits its turn, UCS_OK when UCX has it now.
    ucs_status_t take_rendezvous_locked(std::unique_ptr<batch_receive> receive) {
        const bool waits = !receives_.empty();
        receives_.push_back(std::move(receive));
        if (waits) {
            return UCS_INPROGRESS;
        }
        start_receives_locked();
        return UCS_OK;
    }

    // Gives UCX the first waiting receive (finishing those that complete at once), unless one is in
    // UCX already. A read's reply whose batch ended meanwhile, and every waiting one once the
    // agent is stopping, is released instead: nothing lands.
    void start_receives_locked() noexcept {
        while (!receives_.empty() && !receive_in_ucx_) {
            batch_receive& next = *receives_.front();
            const auto awaited = next.reply_ep == nullptr ? batches_.find(next.token) : batches_.end();
            if (stopping_ || (next.reply_ep == nullptr && awaited == batches_.end())) {
                ucp_am_data_release(worker_, next.descriptor);
                finish_receive_locked(pop_receive_locked(), UCS_ERR_CANCELED);
                continue;
            }
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
            param.cb.recv_am = &agent_core::on_batch_received;
            param.user_data = &next;
            param.datatype = ucp_dt_make_iov();
            const ucs_status_ptr_t started =
                ucp_am_recv_data_nbx(worker_, next.descriptor, next.blocks.data(), next.blocks.size(), &param);
            if (started != nullptr && !UCS_PTR_IS_ERR(started)) {
                receive_in_ucx_ = true;
                if (awaited != batches_.end()) {
                    awaited->second.receiving = receive_stage::in_ucx;
                }
                return;
            }
            finish_receive_locked(pop_receive_locked(), UCS_PTR_STATUS(started));
        }
    }

    std::unique_ptr<batch_receive> pop_receive_locked() noexcept {
        std::unique_ptr<batch_receive> done = std::move(receives_.front());
        receives_.pop_front();
        return done;
    }

    static void on_batch_received(void* request, ucs_status_t status, std::size_t length, void* user_data) {
        auto* receive = static_cast<batch_receive*>(user_data);
        agent_core& core = *receive->core;
        ucp_request_free(request);
        const ucs_status_t outcome = status == UCS_OK && length != receive->bytes ? UCS_ERR_MESSAGE_TRUNCATED : status;
        core.receive_in_ucx_ = false; // it is the first waiting: UCX has one at a time
        core.finish_receive_locked(core.pop_receive_locked(), outcome);
        core.start_receives_locked();
    }

    // UCX is done with a rendezvous (or it failed with `status`, or was dropped). A target unpins
    // the blocks it wrote and answers (a failed receive gets no answer: the initiator's send failed
    // too); an initiator finishes the read batch if it is still awaited.
    void finish_receive_locked(std::unique_ptr<batch_receive> done, ucs_status_t status) noexcept {
        batch_receive& receive = *done;
        if (receive.reply_ep != nullptr) {
            unpin_locked(receive.pinned);
            if (status != UCS_OK || stopping_) {
                refused_batches_.fetch_add(1);
                return;
            }
            try {
                answer_batch_locked(receive.reply_ep, receive.asked, UCS_OK, {});
            } catch (...) {
                refused_batches_.fetch_add(1); // out of memory for the answer: counted, never thrown into UCX
            }
            return;
        }
        if (const auto at = batches_.find(receive.token); at != batches_.end()) {
            batch_pending pending;
            forget_batch_locked(at, pending);
            if (status != UCS_OK) {
                pending.state->record_error(status);
            }
            release_one_locked(*pending.state);
        }
    }

    static result<notification> timeout_failure(std::chrono::nanoseconds timeout) {
        return fail(status_code::busy, "no notification arrived within " +
                                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                                           " ms");
    }

    result<void> usable_locked(const peer_record& peer) const {
        if (peer.closed) {
            return fail(status_code::invalid_argument, "peer '" + peer.name + "' is disconnected");
        }
        if (peer.failed.load(std::memory_order_acquire)) {
            return fail(status_code::internal_error,
                        "peer '" + peer.name + "' failed: " + ucx_text(static_cast<ucs_status_t>(peer.failure.load())));
        }
        return boost::outcome_v2::success();
    }

    std::shared_ptr<peer_record> peer_shared_locked(const peer_record& peer) const {
        for (const auto& candidate : peers_) {
            if (candidate.get() == &peer) {
                return candidate;
            }
        }
        return nullptr;
    }

    registration_record* find_local_locked(std::uint64_t address, std::uint64_t bytes) const noexcept {
        const std::shared_ptr<registration_record>* found = find_local_shared_locked(address, bytes);
        return found != nullptr ? found->get() : nullptr;
    }
    const std::shared_ptr<registration_record>* find_local_shared_locked(std::uint64_t address,
                                                                          std::uint64_t bytes) const noexcept {
        auto at = std::upper_bound(registrations_.begin(), registrations_.end(), address,
                                   [](std::uint64_t value, const auto& record) { return value < record->base; });
        while (at != registrations_.begin()) {
            --at;
            if ((*at)->contains(address, bytes)) {
                return &*at;
            }
        }
        return nullptr;
    }
    static const remote_region* find_remote(const peer_record& peer, std::uint64_t address, std::uint64_t bytes) noexcept {
        auto at = std::upper_bound(peer.regions.begin(), peer.regions.end(), address,
                                   [](std::uint64_t value, const remote_region& region) { return value < region.base; });
        while (at != peer.regions.begin()) {
            --at;
            if (at->contains(address, bytes)) {
                return &*at;
            }
        }
        return nullptr;
    }

    // Checks every block of both lists and plans one op per pair; a run that lies in one
    // registration (one region) as a whole is checked once.
    result<void> plan_locked(direction way, const char* verb, const peer_record& peer, const descriptor_list& local,
                             const descriptor_list& remote, std::vector<planned_op>& ops, transfer_state& state) {
        std::size_t local_run = 0;
        std::size_t remote_run = 0;
        std::uint64_t local_index = 0;
        std::uint64_t remote_index = 0;
        const registration_record* run_record = nullptr; // holds the whole current local run
        const remote_region* run_region = nullptr;        // holds the whole current remote run
        for (std::uint64_t block = 0; block < local.block_count(); ++block) {
            const descriptor_run& lr = local.runs()[local_run];
            const descriptor_run& rr = remote.runs()[remote_run];
            if (local_index == 0) {
                run_record = lr.kind == memory_kind::host ? find_local_locked(lr.base, lr.end() - lr.base) : nullptr;
            }
            if (remote_index == 0) {
                run_region = find_remote(peer, rr.base, rr.end() - rr.base);
            }
            const descriptor mine = lr.block(local_index);
            const descriptor theirs = rr.block(remote_index);
            if (mine.length != theirs.length) {
                return fail(status_code::invalid_argument,
                            std::string(verb) + ": block " + std::to_string(block) + " is " + std::to_string(mine.length) +
                                " bytes here and " + std::to_string(theirs.length) + " at the peer");
            }
            if (mine.kind != memory_kind::host) {
                return fail(status_code::unsupported_capability,
                            std::string(verb) + ": block " + std::to_string(block) + " is device memory; this agent "
                                                                                       "registers host memory only");
            }
            const registration_record* record =
                run_record != nullptr ? run_record : find_local_locked(mine.address, mine.length);
            if (record == nullptr) {
                return fail(status_code::invalid_argument,
                            std::string(verb) + ": local block " + std::to_string(block) + " (" +
                                std::to_string(mine.length) + " bytes at 0x" + nxmem::detail::to_hex(mine.address) +
                                ") is not inside one registration of this agent");
            }
            if (way == direction::read && !record->local_writable) {
                return fail(status_code::invalid_argument,
                            std::string(verb) + ": local block " + std::to_string(block) +
                                " lies in a read-only registration (an import); it cannot receive a read");
            }
            const remote_region* region = run_region != nullptr ? run_region : find_remote(peer, theirs.address, theirs.length);
            if (region == nullptr || region->kind != theirs.kind || region->device != theirs.device) {
                return fail(status_code::invalid_argument,
                            std::string(verb) + ": remote block " + std::to_string(block) + " (" +
                                std::to_string(theirs.length) + " bytes at 0x" + nxmem::detail::to_hex(theirs.address) +
                                ", " + std::string(memory_kind_name(theirs.kind)) + " device " +
                                std::to_string(theirs.device) + ") is not inside one region peer '" + peer.name +
                                "' declared");
            }
            if (way == direction::write && !region->writable) {
                return fail(status_code::invalid_argument,
                            std::string(verb) + ": remote block " + std::to_string(block) + " lies in region " +
                                std::to_string(region->id) + ", which the peer declared read-only");
            }
            ops.push_back(planned_op{mine.address, theirs.address, mine.length, record->memh, region->key});
            pin_locked(state, record);
            if (++local_index == lr.count) {
                local_index = 0;
                ++local_run;
            }
            if (++remote_index == rr.count) {
                remote_index = 0;
                ++remote_run;
            }
        }
        return boost::outcome_v2::success();
    }

    void pin_locked(transfer_state& state, const registration_record* record) {
        for (const auto& pinned : state.pinned) {
            if (pinned.get() == record) {
                return;
            }
        }
        for (const auto& candidate : registrations_) {
            if (candidate.get() == record) {
                state.pinned.push_back(candidate);
                return;
            }
        }
    }

    // A write is complete once the peer has its data: a flush of the endpoint after its puts. One
    // flush covers every put issued on the endpoint before it, so the writes submitted between two
    // progress calls share one (posted by the next progress: a window of 16 writes of 4 KiB waits
    // for one flush round trip, not 16). With a progress thread, which may be asleep in poll, the
    // flush is posted at once. The write's count holds one for its flush meanwhile.
    void flush_later_locked(const std::shared_ptr<transfer_state>& state) {
        state->outstanding.fetch_add(1, std::memory_order_acq_rel); // the flush's
        if (!has_thread_) {
            try {
                for (flush_group& group : unflushed_) {
                    if (group.peer == state->peer) {
                        group.writes.push_back(state);
                        return;
                    }
                }
                unflushed_.push_back(flush_group{state->peer, {state}});
                return;
            } catch (const std::bad_alloc&) {
                // no memory to defer it: flushed alone, now
            }
        }
        flush_now_locked(flush_group{state->peer, {state}});
    }

    bool post_flushes_locked() noexcept {
        if (unflushed_.empty()) {
            return false;
        }
        for (flush_group& group : unflushed_) {
            flush_now_locked(std::move(group));
        }
        unflushed_.clear();
        return true;
    }

    // Posts one flush for `group`'s writes; each is counted down when it completes (or now, when
    // it completed at once or could not be posted: the peer gone, no memory, UCX refused).
    void flush_now_locked(flush_group group) noexcept {
        ucs_status_t status = UCS_OK;
        if (group.peer == nullptr || group.peer->closed || group.peer->failed.load()) {
            status = group.peer != nullptr && group.peer->failed.load()
                         ? static_cast<ucs_status_t>(group.peer->failure.load())
                         : UCS_ERR_NOT_CONNECTED;
        } else if (auto* posted = new (std::nothrow) flush_group(std::move(group))) {
            ucp_request_param_t flush{};
            flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
            flush.cb.send = &agent_core::on_group_flushed;
            flush.user_data = posted;
            ucs_status_ptr_t issued = ucp_ep_flush_nbx(posted->peer->endpoint, &flush);
            if (issued != nullptr && !UCS_PTR_IS_ERR(issued)) {
                return; // on_group_flushed counts them down
            }
            group = std::move(*posted);
            delete posted;
            status = issued == nullptr ? UCS_OK : UCS_PTR_STATUS(issued);
        } else {
            status = UCS_ERR_NO_MEMORY;
        }
        complete_group_locked(group, status);
    }

    static void complete_group_locked(flush_group& group, ucs_status_t status) noexcept {
        for (const auto& state : group.writes) {
            if (status != UCS_OK) {
                state->record_error(status);
            }
            release_one_locked(*state);
        }
    }

    static void on_group_flushed(void* request, ucs_status_t status, void* user_data) {
        auto* group = static_cast<flush_group*>(user_data);
        complete_group_locked(*group, status);
        delete group;
        ucp_request_free(request);
    }

    // Counts an issued op: completed now, in flight (its callback will count it), or failed.
    static bool account_locked(transfer_state& state, ucs_status_ptr_t issued) noexcept {
        if (issued == nullptr) {
            return true;
        }
        if (UCS_PTR_IS_ERR(issued)) {
            state.record_error(UCS_PTR_STATUS(issued));
            return false;
        }
        state.outstanding.fetch_add(1, std::memory_order_acq_rel);
        return true;
    }

    static void on_op_done(void* request, ucs_status_t status, void* user_data) {
        auto& state = *static_cast<transfer_state*>(user_data);
        if (status != UCS_OK) {
            state.record_error(status);
        }
        ucp_request_free(request);
        release_one_locked(state);
    }

    // Called under the core's lock (callbacks run inside progress, which holds it).
    static void release_one_locked(transfer_state& state) noexcept {
        if (state.outstanding.fetch_sub(1, std::memory_order_acq_rel) != 1) {
            return;
        }
        if (!state.requests_returned) {
            state.requests_returned = true; // its keys may go now (the notification names none)
            if (state.peer != nullptr) {
                --state.peer->transfers_in_ucx;
            }
        }
        if (state.abandoned.load()) {
            return;
        }
        if (!state.notification.empty() && state.error.load() == UCS_OK) {
            state.phase.store(transfer_phase::notifying, std::memory_order_release); // sent after progress
        } else {
            state.finish();
        }
    }

    static void on_peer_failure(void* arg, ucp_ep_h, ucs_status_t status) {
        auto& peer = *static_cast<peer_record*>(arg);
        peer.failure.store(status);
        peer.failed.store(true, std::memory_order_release);
    }

    static ucs_status_t on_notification(void* arg, const void* header, std::size_t header_length, void* data,
                                        std::size_t length, const ucp_am_recv_param_t* param) {
        auto& core = *static_cast<agent_core*>(arg);
        // A notification is eager data, an agent id in the header, at most max_notification_bytes.
        if (header_length != sizeof(agent_id) || length > max_notification_bytes ||
            (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
            core.dropped_notifications_.fetch_add(1);
            return UCS_OK;
        }
        try {
            notification next;
            std::memcpy(next.sender.data(), header, sizeof(agent_id));
            next.message.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
            {
                std::lock_guard lock(core.notification_mutex_);
                if (core.notifications_.size() >= max_queued_notifications) {
                    core.dropped_notifications_.fetch_add(1);
                    return UCS_OK;
                }
                core.notifications_.push_back(std::move(next));
            }
            core.notification_signal_.notify_all();
        } catch (...) {
            core.dropped_notifications_.fetch_add(1); // out of memory: counted, never thrown into UCX
        }
        return UCS_OK;
    }

    bool progress_locked() {
        bool any = post_flushes_locked();
        while (ucp_worker_progress(worker_) != 0) {
            any = true;
        }
        return after_progress_locked() || any;
    }

    // Sends the notifications of transfers whose data is in place, retires finished transfers,
    // unmaps registrations whose handles went while they were in use, frees finished closes.
    bool after_progress_locked() {
        bool any = false;
        for (std::size_t i = 0; i < active_.size();) {
            transfer_state& state = *active_[i];
            if (state.phase.load(std::memory_order_acquire) == transfer_phase::notifying) {
                send_notification_locked(state);
                any = true;
            }
            if (state.finished()) {
                active_[i] = std::move(active_.back());
                active_.pop_back();
                any = true;
                continue;
            }
            ++i;
        }
        for (std::size_t i = 0; i < registrations_.size();) {
            registration_record& record = *registrations_[i];
            if (record.release_when_idle && record.in_flight.load(std::memory_order_acquire) == 0) {
                forget_locked(record); // erases it from registrations_
                any = true;
                continue;
            }
            ++i;
        }
        for (std::size_t i = 0; i < peers_.size();) {
            peer_record& peer = *peers_[i];
            if (peer.closed && !peer.close_posted && !awaits_batches_locked(peer)) {
                post_close_locked(peer, false); // its last batch was answered (or failed)
                any = true;
            }
            if (!peer.retired_keys.empty() && peer.transfers_in_ucx == 0) {
                destroy_retired_keys_locked(peer);
                any = true;
            }
            if (peer.close_posted && peer.retired_keys.empty()) {
                // The record lives on in the handles and transfers that hold it.
                peers_[i] = std::move(peers_.back());
                peers_.pop_back();
                continue;
            }
            ++i;
        }
        for (std::size_t i = 0; i < closing_.size();) {
            if (ucp_request_check_status(closing_[i].request) != UCS_INPROGRESS) {
                ucp_request_free(closing_[i].request);
                closing_[i] = std::move(closing_.back());
                closing_.pop_back();
                any = true;
                continue;
            }
            ++i;
        }
        if (!batches_.empty()) {
            fail_batches_locked(nullptr, UCS_ERR_ENDPOINT_TIMEOUT, true);
            any = pump_batches_locked() || any;
        }
        return any;
    }

    void send_notification_locked(transfer_state& state) {
        state.phase.store(transfer_phase::issuing, std::memory_order_release);
        state.outstanding.store(1, std::memory_order_release);
        if (state.peer == nullptr || state.peer->closed || state.peer->failed.load()) {
            state.record_error(state.peer != nullptr ? static_cast<ucs_status_t>(state.peer->failure.load())
                                                     : UCS_ERR_NOT_CONNECTED);
            if (state.error.load() == UCS_OK) {
                state.record_error(UCS_ERR_NOT_CONNECTED);
            }
            state.finish();
            return;
        }
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_EAGER;
        param.cb.send = &agent_core::on_op_done;
        param.user_data = &state;
        ucs_status_ptr_t sent = ucp_am_send_nbx(state.peer->endpoint, notification_am_id, id_.data(), id_.size(),
                                                state.notification.data(), state.notification.size(), &param);
        if (sent == nullptr) {
            state.finish();
            return;
        }
        if (UCS_PTR_IS_ERR(sent)) {
            state.record_error(UCS_PTR_STATUS(sent));
            state.finish();
            return;
        }
        // outstanding is 1: on_op_done will finish it (the notification is no longer pending).
        state.notification.clear();
    }

    // New transfers with the peer are refused from now. Without force, the endpoint stays open
    // until the peer has answered every batch message sent to it (after_progress closes it then).
    void close_peer_locked(peer_record& peer, bool force) noexcept {
        if (peer.close_posted) {
            return;
        }
        if (!peer.closed) {
            (void)post_flushes_locked(); // writes submitted before the close are flushed before it
            peer.closed = true;
        }
        if (force || peer.failed.load()) {
            fail_batches_locked(&peer, UCS_ERR_CANCELED); // their replies may never come
        } else if (awaits_batches_locked(peer)) {
            return;
        }
        post_close_locked(peer, force);
    }

    bool awaits_batches_locked(const peer_record& peer) const noexcept {
        return std::any_of(batches_.begin(), batches_.end(), [&](const auto& pending) { return pending.second.peer.get() == &peer; });
    }

    void post_close_locked(peer_record& peer, bool force) noexcept {
        peer.close_posted = true;
        if (force && !peer.detects_failure) {
            // A forced close of a peer taken for dead, where UCX cannot purge the endpoint's
            // requests (no failure handling over shared memory): they wait for replies that will
            // not come. Its transfers fail now and let their registrations go; their records stay
            // until the worker goes. (A close without force lets UCX finish them: it flushes the
            // endpoint first.)
            for (std::size_t i = 0; i < active_.size();) {
                transfer_state& state = *active_[i];
                if (state.peer.get() == &peer && !state.finished()) {
                    state.abandoned.store(true);
                    state.record_error(UCS_ERR_CANCELED);
                    state.finish();
                    abandoned_.push_back(std::move(active_[i])); // reserved when submitted
                    active_[i] = std::move(active_.back());
                    active_.pop_back();
                    continue;
                }
                ++i;
            }
        }
        retire_keys_locked(peer);
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = (force || peer.failed.load()) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t closing = ucp_ep_close_nbx(peer.endpoint, &param);
        if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) {
            try {
                closing_.push_back(closing_endpoint{closing, peer_shared_locked(peer)});
                return;
            } catch (...) {
                // Out of memory: wait for this one here instead of tracking it.
                for (int i = 0; i < 100000 && ucp_request_check_status(closing) == UCS_INPROGRESS; ++i) {
                    ucp_worker_progress(worker_);
                }
                ucp_request_free(closing);
            }
        }
        fail_batches_locked(&peer, UCS_ERR_NOT_CONNECTED);
        // It stays in peers_ until its transfers have given their keys back (after_progress).
    }

    // The peer's keys stop being usable; they are destroyed once no transfer names them.
    void retire_keys_locked(peer_record& peer) noexcept {
        for (remote_region& region : peer.regions) {
            try {
                peer.retired_keys.push_back(region.key);
            } catch (const std::bad_alloc&) {
                ucp_rkey_destroy(region.key); // no memory to keep it: the pre-existing risk, not a leak
            }
        }
        peer.regions.clear();
        destroy_retired_keys_locked(peer);
    }
    static void destroy_retired_keys_locked(peer_record& peer) noexcept {
        if (peer.transfers_in_ucx != 0) {
            return;
        }
        for (ucp_rkey_h key : peer.retired_keys) {
            ucp_rkey_destroy(key);
        }
        peer.retired_keys.clear();
    }
    static void destroy_keys_locked(peer_record& peer) noexcept {
        peer.transfers_in_ucx = 0; // the worker goes next: nothing will use them
        for (remote_region& region : peer.regions) {
            ucp_rkey_destroy(region.key);
        }
        peer.regions.clear();
        destroy_retired_keys_locked(peer);
    }

    // Progresses until every transfer and close has finished, at most `limit`.
    void drain_locked(std::chrono::nanoseconds limit) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while ((!active_.empty() || !closing_.empty()) && std::chrono::steady_clock::now() < deadline) {
            (void)progress_locked();
        }
    }

    void unmap_locked(registration_record& record) noexcept {
        if (record.memh != nullptr) {
            (void)ucp_mem_unmap(context_, record.memh);
            record.memh = nullptr;
        }
    }

    void forget_locked(registration_record& record) noexcept {
        unmap_locked(record);
        record.deregistered = true;
        record.release_when_idle = false;
        record.lease.reset();
        record.pool_keeper.reset(); // the pool itself goes with the record, normally outside the lock
        // Sorted by base: look among the registrations of this base only.
        auto at = std::lower_bound(registrations_.begin(), registrations_.end(), record.base,
                                   [](const auto& other, std::uint64_t base) { return other->base < base; });
        for (; at != registrations_.end() && (*at)->base == record.base; ++at) {
            if (at->get() == &record) {
                registrations_.erase(at); // moves, allocates nothing
                break;
            }
        }
    }

    mutable std::mutex mutex_; // every UCX call on this context and worker
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    agent_id id_{};
    std::string name_;
    bool has_thread_ = false;
    bool no_failure_detection_ = false; // under mutex_
    int event_fd_ = -1; // the worker's (UCX closes it)
    int stop_fd_ = -1;
    std::uint64_t next_registration_id_ = 1;
    std::vector<std::shared_ptr<registration_record>> registrations_; // sorted by base
    std::vector<std::shared_ptr<peer_record>> peers_;
    std::vector<std::shared_ptr<transfer_state>> active_;
    std::vector<std::shared_ptr<transfer_state>> abandoned_; // kept until the worker is destroyed
    struct closing_endpoint {
        void* request = nullptr;
        std::shared_ptr<peer_record> peer;
    };
    std::vector<closing_endpoint> closing_; // endpoint closes in flight
    transfer_path transfer_path_ = transfer_path::automatic;
    std::uint64_t next_batch_token_ = 1;
    std::unordered_map<std::uint64_t, batch_pending> batches_; // by token: batch messages awaiting their reply
    std::deque<queued_batch> queued_;                          // of those, the ones not sent yet
    staging_buffers buffers_;                                    // batch messages' data, reused
    std::vector<std::unique_ptr<batch_send>> sends_;            // batch messages UCX is sending
    std::deque<std::unique_ptr<batch_receive>> receives_;       // batch data coming by rendezvous, in order
    bool receive_in_ucx_ = false;                               // the first of them is being received
    std::size_t rendezvous_entries_ = 0;                        // entries a message's header holds (0: none)
    bool stopping_ = false;                                     // the destructor runs: no new receive
    std::atomic<std::uint64_t> unprobed_batches_{0}; // served without the page probe (the kernel refused it)
    std::atomic<std::uint64_t> refused_batches_{0};            // batch requests this agent, as a target, refused
    std::vector<flush_group> unflushed_; // writes whose flush the next progress posts

    std::mutex notification_mutex_;
    std::condition_variable notification_signal_;
    std::deque<notification> notifications_;
    std::atomic<std::uint64_t> dropped_notifications_{0};
};

} // namespace detail

} // namespace nxmem::transfer
