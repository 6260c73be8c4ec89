// The transfer layer in one process (docs/TRANSFER.md): descriptor lists and their wire format,
// forged bytes of every kind refused before UCX sees them, reads and writes between two agents
// over UCX (UCX_TLS as the test is run with; tcp by default), notifications, and the leases a
// registration holds on plugin memory (release and close BUSY, unload refused, the tally).
#include "../posix/posix_support.hpp"

#include <nxmem/host/ipc_view.hpp>
#include <nxmem/host/pooled_allocator.hpp>
#include <nxmem/residency.hpp>
#include <nxmem/transfer.hpp>
#include <nxmem/transfer/detail/staging_buffers.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

using namespace nxmem;
using namespace std::chrono_literals;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;
using transfer::descriptor;
using transfer::descriptor_list;
using transfer::memory_kind;
using transfer::strided_descriptor;

namespace {

std::string transports() {
    const char* chosen = std::getenv("NXMEM_TRANSFER_TLS");
    return chosen != nullptr ? chosen : "tcp";
}

std::vector<std::byte> as_bytes(std::string_view text) {
    const auto* first = reinterpret_cast<const std::byte*>(text.data());
    return {first, first + text.size()};
}

template <class T> void require_refused(const result<T>& outcome, status_code code, std::string_view words) {
    REQUIRE_FALSE(outcome.has_value());
    INFO(outcome.error().describe());
    CHECK(outcome.error().code == code);
    CHECK(outcome.error().message.find(words) != std::string::npos);
}

descriptor_list list_of(std::initializer_list<descriptor> blocks) {
    descriptor_list list;
    for (const descriptor& block : blocks) {
        REQUIRE(list.add(block).has_value());
    }
    return list;
}
descriptor_list list_of(const strided_descriptor& blocks) {
    descriptor_list list;
    REQUIRE(list.add(blocks).has_value());
    return list;
}

std::uint8_t pattern(std::uint64_t offset, std::uint8_t seed) {
    return static_cast<std::uint8_t>(offset * 131u + seed + (offset >> 12));
}
void fill(std::vector<std::uint8_t>& bytes, std::uint8_t seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] = pattern(i, seed);
    }
}

} // namespace

TEST_CASE("a strided descriptor names count blocks a stride apart, and lists round-trip through bytes") {
    descriptor_list list;
    REQUIRE(list.add(strided_descriptor{0x10000, 4096, 16384, 8, 0, memory_kind::host}).has_value());
    REQUIRE(list.add(descriptor{0x900000, 100, 0, memory_kind::host}).has_value());
    CHECK(list.block_count() == 9);
    CHECK(list.total_bytes() == 8 * 4096 + 100);
    CHECK(list.runs()[0].block(7).address == 0x10000 + 7 * 16384);
    CHECK(list.runs()[0].end() == 0x10000 + 7 * 16384 + 4096);

    const std::vector<std::byte> bytes = list.serialise();
    const descriptor_list back = value_or_fail(descriptor_list::parse(bytes));
    REQUIRE(back.runs().size() == 2);
    CHECK(back.runs()[0].stride == 16384);
    CHECK(back.runs()[1].base == 0x900000);
    CHECK(back.serialise() == bytes);
}

TEST_CASE("descriptors that are empty, overlap or wrap are refused, and the list stays as it was") {
    descriptor_list list;
    require_refused(list.add(descriptor{0x1000, 0}), status_code::invalid_argument, "0 bytes");
    require_refused(list.add(strided_descriptor{0x1000, 64, 64, 0}), status_code::invalid_argument, "0 blocks");
    require_refused(list.add(strided_descriptor{0x1000, 4096, 2048, 2}), status_code::invalid_argument, "overlap");
    require_refused(list.add(descriptor{UINT64_MAX - 10, 11}), status_code::invalid_argument, "wraps");
    require_refused(list.add(strided_descriptor{0x1000, 4096, UINT64_MAX / 2, 3}), status_code::invalid_argument,
                    "wraps");
    require_refused(list.add(strided_descriptor{0x1000, 1, 1, transfer::max_blocks + 1}),
                    status_code::invalid_argument, "blocks");
    CHECK(list.empty());
    REQUIRE(list.add(strided_descriptor{0x1000, 1, 1, transfer::max_blocks}).has_value());
    require_refused(list.add(descriptor{0x1000, 1}), status_code::invalid_argument, "more than");
    CHECK(list.block_count() == transfer::max_blocks);
}

TEST_CASE("forged descriptor bytes are refused with the fault named") {
    descriptor_list list;
    REQUIRE(list.add(strided_descriptor{0x10000, 4096, 8192, 4}).has_value());
    REQUIRE(list.add(descriptor{0x20000, 64}).has_value());
    const std::vector<std::byte> genuine = list.serialise();

    SECTION("every truncation") {
        for (std::size_t keep = 0; keep < genuine.size(); ++keep) {
            INFO("kept " << keep << " of " << genuine.size() << " bytes");
            const auto parsed = descriptor_list::parse(std::span(genuine).first(keep));
            REQUIRE_FALSE(parsed.has_value());
            CHECK(parsed.error().code == status_code::invalid_argument);
        }
    }
    SECTION("a trailing byte") {
        std::vector<std::byte> longer = genuine;
        longer.push_back(std::byte{0});
        require_refused(descriptor_list::parse(longer), status_code::invalid_argument, "trailing");
    }
    SECTION("bad magic, another version, another kind") {
        std::vector<std::byte> forged = genuine;
        forged[0] = std::byte{'X'};
        require_refused(descriptor_list::parse(forged), status_code::invalid_argument, "magic");
        forged = genuine;
        forged[4] = std::byte{2};
        require_refused(descriptor_list::parse(forged), status_code::version_mismatch, "version 2");
        forged = genuine;
        forged[6] = std::byte{static_cast<unsigned char>(transfer::blob_kind::regions)};
        require_refused(descriptor_list::parse(forged), status_code::invalid_argument, "descriptor list expected");
    }
    SECTION("a run count larger than the bytes") {
        std::vector<std::byte> forged = genuine;
        const std::uint32_t lie = 0xffffffffu;
        std::memcpy(forged.data() + transfer::wire_header_bytes, &lie, 4);
        require_refused(descriptor_list::parse(forged), status_code::invalid_argument, "announced");
    }
    SECTION("a run that overlaps or wraps, written by hand") {
        std::vector<std::byte> forged = genuine;
        const std::size_t stride_at = transfer::wire_header_bytes + 4 + 16;
        const std::uint64_t short_stride = 100;
        std::memcpy(forged.data() + stride_at, &short_stride, 8);
        require_refused(descriptor_list::parse(forged), status_code::invalid_argument, "overlap");
        forged = genuine;
        const std::uint64_t high_base = UINT64_MAX - 8192;
        std::memcpy(forged.data() + transfer::wire_header_bytes + 4, &high_base, 8);
        require_refused(descriptor_list::parse(forged), status_code::invalid_argument, "wraps");
    }
}

TEST_CASE("a packed key's layout is walked before UCX sees it") {
    using transfer::detail::packed_key_problem;
    auto key = [](std::uint64_t domains, std::uint8_t type, std::vector<std::uint8_t> rest) {
        std::vector<std::byte> bytes(9);
        std::memcpy(bytes.data(), &domains, 8);
        bytes[8] = std::byte{type};
        for (std::uint8_t b : rest) {
            bytes.push_back(std::byte{b});
        }
        return bytes;
    };
    CHECK(packed_key_problem(key(1, 0, {0})).empty());          // UCX 1.13's key for tcp
    CHECK(packed_key_problem(key(3, 0, {2, 7, 7, 0})).empty()); // two domains
    CHECK(packed_key_problem({}) == "empty");
    const std::vector<std::byte> whole = key(1, 0, {0});
    CHECK(packed_key_problem(std::span(whole).first(5)).find("shorter") != std::string::npos);
    CHECK(packed_key_problem(key(1, 200, {0})).find("memory type") != std::string::npos);
    CHECK(packed_key_problem(key(1, 0, {40, 1})).find("claims 40 bytes") != std::string::npos);
    CHECK(packed_key_problem(key(7, 0, {0, 0})).find("past the end") != std::string::npos);
}

namespace {

// Two agents in one process: `target` progresses in its own thread, `initiator` is driven by its
// caller (both modes run in every case).
struct two_agents {
    transfer::agent target = value_or_fail(transfer::agent::start({"target", transports(), true}));
    transfer::agent initiator;
    std::vector<std::uint8_t> remote_bytes = std::vector<std::uint8_t>(1 << 20);
    std::vector<std::uint8_t> local_bytes = std::vector<std::uint8_t>(1 << 20);
    transfer::registration remote_registration;
    transfer::registration local_registration;
    transfer::peer to_target;

    explicit two_agents(transfer::transfer_path path = transfer::transfer_path::automatic)
        : initiator(value_or_fail(transfer::agent::start({"initiator", transports(), false, path}))) {
        fill(remote_bytes, 7);
        fill(local_bytes, 99);
        remote_registration = value_or_fail(target.register_memory(remote_bytes.data(), remote_bytes.size()));
        local_registration = value_or_fail(initiator.register_memory(local_bytes.data(), local_bytes.size()));
        to_target = value_or_fail(initiator.connect(value_or_fail(target.metadata())));
        REQUIRE(to_target.load_regions(value_or_fail(target.export_regions({&remote_registration}))).has_value());
    }
    std::uint64_t remote_at(std::uint64_t offset) const { return remote_registration.base() + offset; }
    std::uint64_t local_at(std::uint64_t offset) const { return local_registration.base() + offset; }
    // Neither buffer changed since the fixture filled them.
    void check_untouched() const {
        for (std::size_t i = 0; i < remote_bytes.size(); ++i) {
            if (remote_bytes[i] != pattern(i, 7) || local_bytes[i] != pattern(i, 99)) {
                FAIL("byte " << i << " changed");
            }
        }
    }
};

} // namespace

TEST_CASE("a strided read and a write move every byte, and the notification follows the data") {
    two_agents agents;
    constexpr std::uint64_t block = 4096;
    // Blocks 1, 4, 7, ... of the target into blocks 0, 1, 2, ... here.
    const descriptor_list remote = list_of(strided_descriptor{agents.remote_at(block), block, 3 * block, 40});
    const descriptor_list local = list_of(strided_descriptor{agents.local_at(0), block, block, 40});
    const std::vector<std::byte> message = as_bytes("kv blocks 1..118 read");
    transfer::transfer_request read = value_or_fail(agents.initiator.read(agents.to_target, local, remote, message));
    REQUIRE(read.wait(30s).has_value());
    CHECK(read.status() == transfer::transfer_status::done);
    CHECK(read.blocks() == 40);
    for (std::uint64_t b = 0; b < 40; ++b) {
        for (std::uint64_t i = 0; i < block; ++i) {
            if (agents.local_bytes[b * block + i] != pattern(block + b * 3 * block + i, 7)) {
                FAIL("block " << b << " byte " << i);
            }
        }
    }
    CHECK(agents.local_bytes[40 * block] == pattern(40 * block, 99)); // nothing past the blocks
    const transfer::notification arrived = value_or_fail(agents.target.wait_notification(30s));
    CHECK(arrived.sender == agents.initiator.id());
    CHECK(arrived.message == message);

    // Write the first 64 KiB here over the target's last 64 KiB, as 16 blocks of one list.
    const descriptor_list from = list_of(strided_descriptor{agents.local_at(0), block, block, 16});
    const descriptor_list into = list_of(strided_descriptor{agents.remote_at((1 << 20) - 16 * block), block, block, 16});
    transfer::transfer_request write = value_or_fail(agents.initiator.write(agents.to_target, from, into, as_bytes("w")));
    REQUIRE(write.wait(30s).has_value());
    CHECK(value_or_fail(agents.target.wait_notification(30s)).message == as_bytes("w"));
    CHECK(std::memcmp(agents.remote_bytes.data() + (1 << 20) - 16 * block, agents.local_bytes.data(), 16 * block) == 0);
    CHECK(agents.remote_bytes[(1 << 20) - 16 * block - 1] == pattern((1 << 20) - 16 * block - 1, 7));
}

TEST_CASE("writes submitted together share a flush, and each is done only with its data at the peer") {
    two_agents agents;
    constexpr std::uint64_t block = 4096;
    std::vector<transfer::transfer_request> writes;
    for (std::uint64_t w = 0; w < 16; ++w) {
        std::memset(agents.local_bytes.data() + w * block, static_cast<int>(0xa0 + w), block);
        writes.push_back(value_or_fail(agents.initiator.write(agents.to_target, list_of({descriptor{agents.local_at(w * block), block}}),
                                                              list_of({descriptor{agents.remote_at(2 * w * block), block}}))));
    }
    for (std::uint64_t w = 0; w < 16; ++w) {
        REQUIRE(writes[w].wait(30s).has_value());
        CHECK(agents.remote_bytes[2 * w * block] == 0xa0 + w);
        CHECK(agents.remote_bytes[2 * w * block + block - 1] == 0xa0 + w);
        CHECK(agents.remote_bytes[(2 * w + 1) * block] == pattern((2 * w + 1) * block, 7)); // between blocks: untouched
    }
}

TEST_CASE("a peer's keys outlive the transfers naming them: reloaded regions and a disconnect mid-write") {
    // Batch messages or a put per block: either way the close waits for what is in flight.
    two_agents agents(GENERATE(transfer::transfer_path::messages, transfer::transfer_path::rma));
    constexpr std::uint64_t block = 4096;
    constexpr std::uint64_t blocks = 256;
    std::memset(agents.local_bytes.data(), 0x3c, blocks * block);
    const auto write_all = [&] {
        return value_or_fail(agents.initiator.write(agents.to_target, list_of(strided_descriptor{agents.local_at(0), block, block, blocks}),
                                                    list_of(strided_descriptor{agents.remote_at(0), block, block, blocks})));
    };
    // The initiator has not progressed: UCX still holds these puts when the keys they name are
    // replaced, and when the endpoint is closed (without force: the close flushes them first).
    transfer::transfer_request reloaded = write_all();
    REQUIRE(agents.to_target.load_regions(value_or_fail(agents.target.export_regions({&agents.remote_registration}))).has_value());
    REQUIRE(reloaded.wait(30s).has_value());
    transfer::transfer_request closed = write_all();
    agents.to_target.disconnect();
    REQUIRE(closed.wait(30s).has_value());
    for (std::uint64_t i = 0; i < blocks * block; i += 997) {
        REQUIRE(agents.remote_bytes[i] == 0x3c);
    }
    // The registration is free again: nothing is in flight.
    REQUIRE(agents.local_registration.deregister().has_value());
}

TEST_CASE("reads and writes move every byte whichever path they take") {
    const transfer::transfer_path path = GENERATE(transfer::transfer_path::automatic, transfer::transfer_path::messages,
                                               transfer::transfer_path::rma);
    two_agents agents(path);
    // automatic: messages where UCX would emulate RMA on the engine's memory (tcp, and shared
    // memory, whose RMA lanes reach only segments UCX allocated), a get or put per block otherwise.
    CHECK(agents.to_target.uses_messages() == (path != transfer::transfer_path::rma));
    // Over shared memory the batch data goes by rendezvous (cma), straight between the blocks.
    CHECK(agents.to_target.uses_rendezvous() == (transports() != "tcp"));
    // 4 MiB more on each side: a batch of 2 MB goes as two messages (about 1 MiB each).
    std::vector<std::uint8_t> far(4 << 20);
    std::vector<std::uint8_t> near(4 << 20);
    fill(far, 21);
    fill(near, 42);
    transfer::registration far_registration = value_or_fail(agents.target.register_memory(far.data(), far.size()));
    transfer::registration near_registration = value_or_fail(agents.initiator.register_memory(near.data(), near.size()));
    REQUIRE(agents.to_target.load_regions(value_or_fail(agents.target.export_regions({&agents.remote_registration, &far_registration}))).has_value());
    const auto far_at = [&](std::uint64_t offset) { return far_registration.base() + offset; };
    const auto near_at = [&](std::uint64_t offset) { return near_registration.base() + offset; };

    // Read: 500 blocks of 4 KiB, every other one of the target's, into consecutive blocks here,
    // with a notification after them.
    constexpr std::uint64_t block = 4096;
    constexpr std::uint64_t blocks = 500;
    const std::vector<std::byte> message = as_bytes("500 blocks");
    transfer::transfer_request read = value_or_fail(agents.initiator.read(
        agents.to_target, list_of(strided_descriptor{near_at(0), block, block, blocks}),
        list_of(strided_descriptor{far_at(block), block, 2 * block, blocks}), message));
    REQUIRE(read.wait(30s).has_value());
    CHECK(value_or_fail(agents.target.wait_notification(30s)).message == message);
    for (std::uint64_t b = 0; b < blocks; ++b) {
        for (std::uint64_t i = 0; i < block; i += 61) {
            if (near[b * block + i] != pattern((2 * b + 1) * block + i, 21)) {
                FAIL("read: block " << b << " byte " << i);
            }
        }
    }
    CHECK(near[blocks * block] == pattern(blocks * block, 42)); // nothing past the blocks

    // Write: 300 blocks of 1000 bytes (not a page multiple) from mixed runs, to every third slot.
    descriptor_list from;
    REQUIRE(from.add(strided_descriptor{near_at(0), 1000, 1000, 100}).has_value());
    REQUIRE(from.add(strided_descriptor{agents.local_at(0), 1000, 1000, 200}).has_value());
    const descriptor_list into = list_of(strided_descriptor{far_at(0), 1000, 3000, 300});
    transfer::transfer_request write = value_or_fail(agents.initiator.write(agents.to_target, from, into));
    REQUIRE(write.wait(30s).has_value());
    for (std::uint64_t b = 0; b < 300; ++b) {
        const std::uint8_t* source = b < 100 ? near.data() + b * 1000 : agents.local_bytes.data() + (b - 100) * 1000;
        if (std::memcmp(far.data() + b * 3000, source, 1000) != 0 || far[b * 3000 + 1000] != pattern(b * 3000 + 1000, 21)) {
            FAIL("write: block " << b << " or the byte after it");
        }
    }

    // Three reads of the whole 4 MiB as one block each, submitted before any is waited on: 12 MiB
    // in pieces of 1 MiB, more than a peer's window of batch messages (the rest queue).
    std::vector<std::uint8_t> again(4 << 20);
    transfer::registration again_registration = value_or_fail(agents.initiator.register_memory(again.data(), again.size()));
    std::vector<transfer::transfer_request> whole;
    for (int i = 0; i < 3; ++i) {
        std::vector<std::uint8_t>& into_here = i == 1 ? again : near;
        whole.push_back(value_or_fail(agents.initiator.read(
            agents.to_target, list_of({descriptor{reinterpret_cast<std::uint64_t>(into_here.data()), 4 << 20}}),
            list_of({descriptor{far_at(0), 4 << 20}}))));
    }
    for (auto& each : whole) {
        REQUIRE(each.wait(30s).has_value());
    }
    CHECK(near == far);
    CHECK(again == far);
    CHECK(agents.target.refused_batches() == 0);
    CHECK(agents.initiator.refused_batches() == 0);
}

namespace {

// A peer that speaks raw UCX to an agent: sends batch messages of its own making (what a hostile
// or broken peer could send) and waits for the answer.
class raw_batch_peer {
public:
    explicit raw_batch_peer(std::span<const std::byte> metadata) {
        transfer::detail::wire_reader in = value_or_fail(transfer::detail::wire_reader::open(metadata, transfer::blob_kind::agent_metadata));
        transfer::agent_id id{};
        std::span<const std::byte> name;
        std::span<const std::byte> address;
        REQUIRE((in.get_raw(id.data(), id.size()) && in.get_bytes(name, transfer::max_name_bytes) &&
                 in.get_bytes(address, transfer::max_worker_address_bytes)));
        ucp_config_t* config = nullptr;
        REQUIRE(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
        REQUIRE(ucp_config_modify(config, "TLS", transports().c_str()) == UCS_OK);
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_AM;
        const ucs_status_t initialised = ucp_init(&params, config, &context_);
        ucp_config_release(config);
        REQUIRE(initialised == UCS_OK);
        ucp_worker_params_t worker_params{};
        REQUIRE(ucp_worker_create(context_, &worker_params, &worker_) == UCS_OK);
        ucp_am_handler_param_t handler{};
        handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
        handler.id = transfer::detail::batch_reply_am_id;
        handler.cb = &raw_batch_peer::on_reply;
        handler.arg = this;
        REQUIRE(ucp_worker_set_am_recv_handler(worker_, &handler) == UCS_OK);
        std::vector<std::byte> padded(address.begin(), address.end());
        padded.resize(address.size() + 64);
        ucp_ep_params_t endpoint{};
        endpoint.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        endpoint.address = reinterpret_cast<const ucp_address_t*>(padded.data());
        REQUIRE(ucp_ep_create(worker_, &endpoint, &endpoint_) == UCS_OK);
    }
    raw_batch_peer(const raw_batch_peer&) = delete;
    raw_batch_peer& operator=(const raw_batch_peer&) = delete;
    ~raw_batch_peer() {
        if (endpoint_ != nullptr) {
            // Without waiting for the agent (one without a thread is not progressed now).
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            ucs_status_ptr_t closing = ucp_ep_close_nbx(endpoint_, &param);
            const auto deadline = std::chrono::steady_clock::now() + 5s;
            while (closing != nullptr && !UCS_PTR_IS_ERR(closing) && ucp_request_check_status(closing) == UCS_INPROGRESS &&
                   std::chrono::steady_clock::now() < deadline) {
                ucp_worker_progress(worker_);
            }
            if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) {
                ucp_request_free(closing);
            }
        }
        if (worker_ != nullptr) {
            ucp_worker_destroy(worker_);
        }
        if (context_ != nullptr) {
            ucp_cleanup(context_);
        }
    }

    struct answer {
        std::int32_t status = 0;
        std::uint64_t bytes = 0;
    };
    // Sends (header, data) as active message `id` and waits up to `patience` for a reply (for
    // the send to leave, at most 30 s), calling `also` meanwhile (to progress an agent without a
    // thread of its own). `protocol`: UCP_AM_SEND_FLAG_EAGER, or UCP_AM_SEND_FLAG_RNDV to offer
    // the data by rendezvous (the receiver takes it, or drops it and the send still completes).
    std::optional<answer> ask(std::span<const std::byte> header, std::span<const std::byte> data,
                              std::chrono::milliseconds patience = 5000ms,
                              unsigned id = transfer::detail::batch_request_am_id, const std::function<void()>& also = {},
                              unsigned protocol = UCP_AM_SEND_FLAG_EAGER) {
        reply_.reset();
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_REPLY | protocol;
        ucs_status_ptr_t sent = ucp_am_send_nbx(endpoint_, id, header.data(), header.size(), data.data(), data.size(), &param);
        REQUIRE_FALSE(UCS_PTR_IS_ERR(sent));
        const auto start = std::chrono::steady_clock::now();
        const auto in_flight = [&] { return sent != nullptr && ucp_request_check_status(sent) == UCS_INPROGRESS; };
        while ((in_flight() && std::chrono::steady_clock::now() < start + 30s) ||
               (!reply_ && std::chrono::steady_clock::now() < start + patience)) {
            ucp_worker_progress(worker_);
            if (also) {
                also();
            }
        }
        REQUIRE_FALSE(in_flight());
        if (sent != nullptr) {
            ucp_request_free(sent);
        }
        return reply_;
    }
    void progress() { ucp_worker_progress(worker_); }

private:
    static ucs_status_t on_reply(void* arg, const void* header, std::size_t header_length, void*, std::size_t length,
                                 const ucp_am_recv_param_t*) {
        auto& self = *static_cast<raw_batch_peer*>(arg);
        transfer::detail::batch_header got;
        if (header_length == sizeof got) {
            std::memcpy(&got, header, sizeof got);
            self.reply_ = answer{got.status, length};
        }
        return UCS_OK;
    }
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    ucp_ep_h endpoint_ = nullptr;
    std::optional<answer> reply_;
};

std::vector<std::byte> batch_bytes(const transfer::detail::batch_header& header) {
    const auto* first = reinterpret_cast<const std::byte*>(&header);
    return {first, first + sizeof header};
}
// A header carrying its entries (batch_flag_entries_in_header).
std::vector<std::byte> batch_bytes(transfer::detail::batch_header header, std::span<const std::byte> entries) {
    header.flags |= transfer::detail::batch_flag_entries_in_header;
    std::vector<std::byte> bytes = batch_bytes(header);
    bytes.insert(bytes.end(), entries.begin(), entries.end());
    return bytes;
}
std::vector<std::byte> entry_bytes(std::initializer_list<transfer::detail::batch_entry> entries) {
    std::vector<std::byte> bytes(entries.size() * sizeof(transfer::detail::batch_entry));
    std::memcpy(bytes.data(), std::data(entries), bytes.size());
    return bytes;
}

// Two agents, a registration at the target it never exports, and a raw peer speaking to the target.
struct forged_target {
    two_agents agents;
    std::vector<std::uint8_t> hidden = std::vector<std::uint8_t>(64 * 1024, 0x11);
    transfer::registration hidden_registration = value_or_fail(agents.target.register_memory(hidden.data(), hidden.size()));
    raw_batch_peer forger{value_or_fail(agents.target.metadata())};

    bool hidden_untouched() const {
        return std::all_of(hidden.begin(), hidden.end(), [](std::uint8_t b) { return b == 0x11; });
    }
};

} // namespace

TEST_CASE_METHOD(forged_target, "forged batch messages are refused by the target, which touches nothing") {
    using transfer::detail::batch_entry;
    using transfer::detail::batch_header;
    using transfer::detail::batch_op;
    const auto request = [](batch_op op, std::uint32_t count) {
        batch_header header;
        header.op = op;
        header.token = 77;
        header.count = count;
        return header;
    };
    const std::vector<std::byte> page(4096, std::byte{0xee});
    const auto with_data = [](std::vector<std::byte> entries, std::span<const std::byte> data) {
        entries.insert(entries.end(), data.begin(), data.end());
        return entries;
    };
    std::uint64_t refused = 0;
    const auto refused_with = [&](const std::optional<raw_batch_peer::answer>& answer, ucs_status_t status) {
        REQUIRE(answer.has_value());
        CHECK(answer->status == status);
        CHECK(answer->bytes == 0);
        CHECK(agents.target.refused_batches() == ++refused);
    };

    // The same path serves a well-formed read of exported memory: what follows is refused for its fault.
    const auto served = forger.ask(batch_bytes(request(batch_op::read, 1)), entry_bytes({{agents.remote_at(8192), 4096}}));
    REQUIRE(served.has_value());
    CHECK(served->status == UCS_OK);
    CHECK(served->bytes == 4096);

    SECTION("a range outside every registration, or past the exported one's end") {
        std::vector<std::uint8_t> elsewhere(4096);
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 1)),
                                entry_bytes({{reinterpret_cast<std::uint64_t>(elsewhere.data()), 4096}})), UCS_ERR_INVALID_ADDR);
        refused_with(forger.ask(batch_bytes(request(batch_op::write, 1)),
                                with_data(entry_bytes({{agents.remote_at((1 << 20) - 100), 4096}}), page)), UCS_ERR_INVALID_ADDR);
    }
    SECTION("a registration never exported") {
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 1)),
                                entry_bytes({{reinterpret_cast<std::uint64_t>(hidden.data()), 4096}})), UCS_ERR_INVALID_ADDR);
        refused_with(forger.ask(batch_bytes(request(batch_op::write, 1)),
                                with_data(entry_bytes({{reinterpret_cast<std::uint64_t>(hidden.data()), 4096}}), page)),
                     UCS_ERR_INVALID_ADDR);
    }
    SECTION("entries and data that disagree, lengths that wrap, counts out of range") {
        // Two entries announced, one sent.
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 2)), entry_bytes({{agents.remote_at(0), 4096}})),
                     UCS_ERR_INVALID_PARAM);
        // A write one byte short, and one byte over.
        refused_with(forger.ask(batch_bytes(request(batch_op::write, 1)),
                                with_data(entry_bytes({{agents.remote_at(0), 4096}}), std::span(page).first(4095))),
                     UCS_ERR_INVALID_PARAM);
        std::vector<std::byte> over = with_data(entry_bytes({{agents.remote_at(0), 4096}}), page);
        over.push_back(std::byte{0});
        refused_with(forger.ask(batch_bytes(request(batch_op::write, 1)), over), UCS_ERR_INVALID_PARAM);
        // An address whose range wraps; an empty entry; a read of more than a target stages.
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 1)), entry_bytes({{UINT64_MAX - 100, 4096}})),
                     UCS_ERR_INVALID_PARAM);
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 1)), entry_bytes({{agents.remote_at(0), 0}})),
                     UCS_ERR_INVALID_PARAM);
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 2)),
                                entry_bytes({{agents.remote_at(0), 1 << 20}, {agents.remote_at(0), transfer::detail::max_batch_bytes}})),
                     UCS_ERR_INVALID_PARAM);
        refused_with(forger.ask(batch_bytes(request(batch_op::read, 0)), {}), UCS_ERR_INVALID_PARAM);
        refused_with(forger.ask(batch_bytes(request(batch_op::read, transfer::detail::max_batch_entries + 1)), {}),
                     UCS_ERR_INVALID_PARAM);
    }
    SECTION("a header of the wrong size or kind gets no answer") {
        const std::vector<std::byte> header = batch_bytes(request(batch_op::read, 1));
        CHECK_FALSE(forger.ask(std::span(header).first(20), entry_bytes({{agents.remote_at(0), 4096}}), 300ms).has_value());
        batch_header wrong = request(batch_op::read, 1);
        wrong.magic = 0x12345678;
        CHECK_FALSE(forger.ask(batch_bytes(wrong), entry_bytes({{agents.remote_at(0), 4096}}), 300ms).has_value());
        // A reply no one asked for, sent to the initiator, is dropped there.
        raw_batch_peer to_initiator(value_or_fail(agents.initiator.metadata()));
        CHECK_FALSE(to_initiator.ask(batch_bytes(request(batch_op::read, 1)), page, 50ms, transfer::detail::batch_reply_am_id,
                                     [&] { (void)agents.initiator.progress(); }).has_value());
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (agents.initiator.refused_batches() == 0 && std::chrono::steady_clock::now() < deadline) {
            (void)agents.initiator.progress();
            to_initiator.progress();
        }
        CHECK(agents.initiator.refused_batches() == 1);
        CHECK(agents.target.refused_batches() == 2);
    }
    agents.check_untouched();
    CHECK(hidden_untouched());
}

TEST_CASE("batch staging reuses its buffers, best fit first, keeping the largest") {
    transfer::detail::staging_buffers buffers;
    std::vector<std::byte> small = buffers.take(4096);
    std::vector<std::byte> large = buffers.take(1 << 20);
    CHECK(small.size() == 4096);
    const std::byte* large_memory = large.data();
    const std::byte* small_memory = small.data();
    buffers.give(std::move(large));
    buffers.give(std::move(small));
    CHECK(buffers.size() == 2);
    // The smallest that holds it: the 4 KiB one for 1,000 bytes, the 1 MiB one for 64 KiB.
    std::vector<std::byte> again = buffers.take(1000);
    CHECK(again.data() == small_memory);
    CHECK(again.size() == 1000);
    std::vector<std::byte> reused = buffers.take(64 << 10);
    CHECK(reused.data() == large_memory);
    CHECK(buffers.size() == 0);
    // Beyond largest_kept a buffer is freed, not kept.
    buffers.give(std::vector<std::byte>(transfer::detail::staging_buffers::largest_kept + 1));
    CHECK(buffers.size() == 0);
    // Full of small buffers, a larger one replaces the smallest (a run of large messages after
    // small ones reuses its buffers); a smaller one is dropped.
    for (std::size_t i = 0; i < transfer::detail::staging_buffers::kept; ++i) {
        buffers.give(std::vector<std::byte>(4096 + i));
    }
    const std::size_t before = buffers.bytes_kept();
    buffers.give(std::vector<std::byte>(1 << 20));
    CHECK(buffers.size() == transfer::detail::staging_buffers::kept);
    CHECK(buffers.bytes_kept() == before - 4096 + (1 << 20));
    buffers.give(std::vector<std::byte>(100));
    CHECK(buffers.bytes_kept() == before - 4096 + (1 << 20));
    CHECK(buffers.take(512 << 10).capacity() == 1 << 20);
}

TEST_CASE_METHOD(forged_target, "a write offered by rendezvous is checked before any of it is taken, then lands in place") {
    using transfer::detail::batch_header;
    using transfer::detail::batch_op;
    batch_header write;
    write.op = batch_op::write;
    write.token = 78;
    write.count = 1;
    const std::vector<std::byte> page(4096, std::byte{0xee});
    const auto offer = [&](std::span<const std::byte> header, std::span<const std::byte> data) {
        return forger.ask(header, data, 5000ms, transfer::detail::batch_request_am_id, {}, UCP_AM_SEND_FLAG_RNDV);
    };
    std::uint64_t refused = 0;
    const auto refused_with = [&](const std::optional<raw_batch_peer::answer>& answer, ucs_status_t status) {
        REQUIRE(answer.has_value());
        CHECK(answer->status == status);
        CHECK(agents.target.refused_batches() == ++refused);
    };

    SECTION("refused, nothing taken: outside the exported region, never exported, entries not in the header, "
            "counts and lengths that disagree, a read offering data") {
        refused_with(offer(batch_bytes(write, entry_bytes({{agents.remote_at((1 << 20) - 100), 4096}})), page),
                     UCS_ERR_INVALID_ADDR);
        refused_with(offer(batch_bytes(write, entry_bytes({{reinterpret_cast<std::uint64_t>(hidden.data()), 4096}})), page),
                     UCS_ERR_INVALID_ADDR);
        // The entries leading the data: a target cannot know where the bytes go before taking them.
        std::vector<std::byte> leading = entry_bytes({{agents.remote_at(0), 4096}});
        leading.insert(leading.end(), page.begin(), page.end());
        refused_with(offer(batch_bytes(write), leading), UCS_ERR_INVALID_PARAM);
        batch_header two = write;
        two.count = 2;
        refused_with(offer(batch_bytes(two, entry_bytes({{agents.remote_at(0), 4096}})), page), UCS_ERR_INVALID_PARAM);
        refused_with(offer(batch_bytes(write, entry_bytes({{agents.remote_at(0), 4097}})), page), UCS_ERR_INVALID_PARAM);
        refused_with(offer(batch_bytes(write, entry_bytes({{agents.remote_at(0), 4095}})), page), UCS_ERR_INVALID_PARAM);
        batch_header read = write;
        read.op = batch_op::read;
        refused_with(offer(batch_bytes(read, entry_bytes({{agents.remote_at(0), 4096}})), page), UCS_ERR_INVALID_PARAM);
        agents.check_untouched();
        CHECK(hidden_untouched());
    }
    SECTION("a read with its entries in the header is served; one whose header and count disagree is not") {
        batch_header read = write;
        read.op = batch_op::read;
        read.flags = transfer::detail::batch_flag_rendezvous;
        const auto served = forger.ask(batch_bytes(read, entry_bytes({{agents.remote_at(4096), 4096}})), {});
        REQUIRE(served.has_value());
        CHECK(served->status == UCS_OK);
        CHECK(served->bytes == 4096);
        read.count = 2;
        refused_with(forger.ask(batch_bytes(read, entry_bytes({{agents.remote_at(4096), 4096}})), {}), UCS_ERR_INVALID_PARAM);
        agents.check_untouched();
    }
    SECTION("a well-formed one lands in the blocks named, and nowhere else") {
        const auto answer = offer(batch_bytes(write, entry_bytes({{agents.remote_at(8192), 4096}})), page);
        REQUIRE(answer.has_value());
        CHECK(answer->status == UCS_OK);
        CHECK(agents.target.refused_batches() == 0);
        for (std::size_t i = 0; i < agents.remote_bytes.size(); ++i) {
            const std::uint8_t expected = i >= 8192 && i < 8192 + 4096 ? 0xee : pattern(i, 7);
            if (agents.remote_bytes[i] != expected) {
                FAIL("byte " << i);
            }
        }
    }
}

TEST_CASE("a read-only import is never written by a batch, whatever a peer sends") {
    using transfer::detail::batch_header;
    using transfer::detail::batch_op;
    auto module = load_or_fail(test::posix_plugin_path());
    transfer::agent target = value_or_fail(transfer::agent::start({"holder", transports(), true}));
    auto exporter = open_or_fail<cpu_device>(module, "posix-lazy", 0, "share=memfd");
    auto importer = open_or_fail<cpu_device>(module, "posix-lazy");
    const allocation<cpu_device> live = value_or_fail(exporter.allocate(64 * 1024, 4096));
    REQUIRE(value_or_fail(exporter.virtual_backing()).commit(live, {0, 64 * 1024}).has_value());
    std::memset(live.address, 0x5a, 64 * 1024);
    host::ipc_handle handle = value_or_fail(value_or_fail(exporter.ipc()).export_allocation(live));
    {
        host::imported_memory<cpu_device> imported = value_or_fail(value_or_fail(importer.ipc()).import(handle, NXMEM_IPC_READ_ONLY));
        transfer::registration registered = value_or_fail(target.register_import(imported));
        (void)value_or_fail(target.export_regions({&registered}));
        raw_batch_peer forger(value_or_fail(target.metadata()));
        batch_header header;
        header.op = batch_op::write;
        header.count = 1;
        std::vector<std::byte> data = entry_bytes({{registered.base(), 4096}});
        data.resize(data.size() + 4096, std::byte{0x66});
        const auto answer = forger.ask(batch_bytes(header), data);
        REQUIRE(answer.has_value());
        CHECK(answer->status == UCS_ERR_INVALID_ADDR);
        // Offered by rendezvous, entries in the header: refused before any of it is taken.
        const auto offered = forger.ask(batch_bytes(header, entry_bytes({{registered.base(), 4096}})),
                                        std::span(data).subspan(sizeof(transfer::detail::batch_entry)), 5000ms,
                                        transfer::detail::batch_request_am_id, {}, UCP_AM_SEND_FLAG_RNDV);
        REQUIRE(offered.has_value());
        CHECK(offered->status == UCS_ERR_INVALID_ADDR);
        header.op = batch_op::read; // reading it is what it is exported for
        const auto read = forger.ask(batch_bytes(header), entry_bytes({{registered.base(), 4096}}));
        REQUIRE(read.has_value());
        CHECK(read->status == UCS_OK);
        REQUIRE(registered.deregister().has_value());
        REQUIRE(imported.close().has_value());
    }
    CHECK(static_cast<unsigned char*>(live.address)[0] == 0x5a);
    CHECK(static_cast<unsigned char*>(live.address)[4095] == 0x5a);
    REQUIRE(exporter.release(live).has_value());
}

TEST_CASE("blocks outside what is registered or declared are refused before UCX sees them") {
    two_agents agents;
    const std::uint64_t size = 1 << 20;
    const auto refused = [&](const descriptor_list& local, const descriptor_list& remote, std::string_view words) {
        require_refused(agents.initiator.read(agents.to_target, local, remote), status_code::invalid_argument, words);
        require_refused(agents.initiator.write(agents.to_target, local, remote), status_code::invalid_argument, words);
    };
    const descriptor_list one_local = list_of({descriptor{agents.local_at(0), 4096}});
    SECTION("a remote range past the region's end, or straddling it") {
        refused(one_local, list_of({descriptor{agents.remote_at(size), 4096}}), "not inside one region");
        refused(one_local, list_of({descriptor{agents.remote_at(size - 100), 4096}}), "not inside one region");
        refused(one_local, list_of({descriptor{agents.remote_at(0) - 4096, 4096}}), "not inside one region");
    }
    SECTION("a strided run whose last block leaves the region") {
        refused(list_of(strided_descriptor{agents.local_at(0), 4096, 4096, 3}),
                list_of(strided_descriptor{agents.remote_at(size - 2 * 8192), 4096, 8192, 3}),
                "remote block 2");
    }
    SECTION("a local range outside this agent's registrations") {
        std::vector<std::uint8_t> unregistered(4096);
        refused(list_of({descriptor{reinterpret_cast<std::uint64_t>(unregistered.data()), 4096}}),
                list_of({descriptor{agents.remote_at(0), 4096}}), "not inside one registration");
        refused(list_of({descriptor{agents.local_at(size - 10), 4096}}), list_of({descriptor{agents.remote_at(0), 4096}}),
                "not inside one registration");
    }
    SECTION("another device or memory kind than the region's") {
        refused(one_local, list_of({descriptor{agents.remote_at(0), 4096, 1, memory_kind::host}}), "device 1");
        refused(one_local, list_of({descriptor{agents.remote_at(0), 4096, 0, memory_kind::device}}), "device device");
    }
    SECTION("lengths or counts that do not pair") {
        refused(one_local, list_of({descriptor{agents.remote_at(0), 2048}}), "bytes here");
        refused(one_local, list_of(strided_descriptor{agents.remote_at(0), 4096, 4096, 2}), "local blocks against");
    }
    SECTION("a notification over the cap") {
        const std::vector<std::byte> huge(transfer::max_notification_bytes + 1);
        require_refused(agents.initiator.read(agents.to_target, one_local, list_of({descriptor{agents.remote_at(0), 4096}}), huge),
                        status_code::invalid_argument, "notification");
    }
    agents.check_untouched();
}

TEST_CASE("forged region lists and metadata are refused whole, and the regions loaded before stay") {
    two_agents agents;
    const std::vector<std::byte> genuine = value_or_fail(agents.target.export_regions({&agents.remote_registration}));
    const descriptor_list local = list_of({descriptor{agents.local_at(0), 4096}});
    const descriptor_list remote = list_of({descriptor{agents.remote_at(0), 4096}});

    SECTION("every truncation of a region list") {
        for (std::size_t keep = 0; keep < genuine.size(); ++keep) {
            INFO("kept " << keep << " of " << genuine.size());
            CHECK_FALSE(agents.to_target.load_regions(std::span(genuine).first(keep)).has_value());
        }
    }
    SECTION("a region list of another agent") {
        transfer::agent third = value_or_fail(transfer::agent::start({"third", transports(), false}));
        std::vector<std::uint8_t> bytes(8192);
        transfer::registration theirs = value_or_fail(third.register_memory(bytes.data(), bytes.size()));
        require_refused(agents.to_target.load_regions(value_or_fail(third.export_regions({&theirs}))),
                        status_code::invalid_argument, "another agent");
    }
    const std::size_t region_at = transfer::wire_header_bytes + 16 + 4; // id, base, length, device, kind, flags, key
    SECTION("a region that wraps, or is empty") {
        std::vector<std::byte> forged = genuine;
        const std::uint64_t huge = UINT64_MAX;
        std::memcpy(forged.data() + region_at + 16, &huge, 8);
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "wraps");
        const std::uint64_t zero = 0;
        std::memcpy(forged.data() + region_at + 16, &zero, 8);
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "empty");
    }
    SECTION("a key whose domain claims more bytes than it has, or a key length past the blob") {
        std::vector<std::byte> forged = genuine;
        const std::size_t key_at = region_at + 8 * 3 + 4 + 2 + 4;
        forged[key_at + 9] = std::byte{200}; // the first domain's size
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "packed key refused");
        forged = genuine;
        const std::uint32_t long_key = 5000;
        std::memcpy(forged.data() + key_at - 4, &long_key, 4);
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "truncated");
    }
    SECTION("unknown flags, and a region count the bytes cannot hold") {
        std::vector<std::byte> forged = genuine;
        forged[region_at + 8 * 3 + 4 + 1] = std::byte{0x80};
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "flags");
        forged = genuine;
        const std::uint32_t many = 1000;
        std::memcpy(forged.data() + transfer::wire_header_bytes + 16, &many, 4);
        require_refused(agents.to_target.load_regions(forged), status_code::invalid_argument, "announced");
    }
    SECTION("forged metadata") {
        const std::vector<std::byte> metadata = value_or_fail(agents.target.metadata());
        for (std::size_t keep = 0; keep < metadata.size(); keep += 7) {
            INFO("kept " << keep << " of " << metadata.size());
            CHECK_FALSE(agents.initiator.connect(std::span(metadata).first(keep)).has_value());
        }
        require_refused(agents.target.connect(metadata), status_code::invalid_argument, "own");
    }
    // The regions loaded by the fixture are still there: a transfer into them works.
    transfer::transfer_request read = value_or_fail(agents.initiator.read(agents.to_target, local, remote));
    REQUIRE(read.wait(30s).has_value());
    CHECK(std::memcmp(agents.local_bytes.data(), agents.remote_bytes.data(), 4096) == 0);
}

TEST_CASE("a registration in use by a transfer cannot be deregistered until the transfer is done") {
    two_agents agents;
    const descriptor_list local = list_of({descriptor{agents.local_at(0), 1 << 20}});
    const descriptor_list remote = list_of({descriptor{agents.remote_at(0), 1 << 20}});
    // The initiator is driven by its caller and has not progressed: the read cannot have finished.
    transfer::transfer_request read = value_or_fail(agents.initiator.read(agents.to_target, local, remote));
    if (read.status() == transfer::transfer_status::in_progress) {
        require_refused(agents.local_registration.deregister(), status_code::busy, "in flight");
        CHECK(agents.local_registration);
    }
    REQUIRE(read.wait(30s).has_value());
    REQUIRE(agents.local_registration.deregister().has_value());
    CHECK_FALSE(agents.local_registration);
    require_refused(agents.initiator.read(agents.to_target, local, remote), status_code::invalid_argument,
                    "not inside one registration");
}

TEST_CASE("a registration leases the plugin memory it registers: release, close and unload wait for it") {
    auto module = load_or_fail(test::posix_plugin_path());
    transfer::agent agent = value_or_fail(transfer::agent::start({"lessee", transports(), false}));
    const std::uint64_t bytes = 64 * 1024;

    SECTION("an allocation") {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        const allocation<cpu_device> live = value_or_fail(lazy.allocate(bytes, 4096));
        REQUIRE(value_or_fail(lazy.virtual_backing()).commit(live, {0, bytes}).has_value());
        transfer::registration registered = value_or_fail(agent.register_allocation(lazy, live));
        CHECK(registered.length() == bytes);
        CHECK(value_or_fail(module->readiness()).host.registrations == 1);
        require_refused(lazy.release(live), status_code::busy, "registered for transfer");
        require_refused(module->try_unload(), status_code::busy, "transfer registrations 1");
        // A second registration of the same allocation holds a second lease.
        transfer::registration again = value_or_fail(agent.register_allocation(lazy, live));
        CHECK(value_or_fail(module->readiness()).host.registrations == 2);
        REQUIRE(registered.deregister().has_value());
        require_refused(lazy.release(live), status_code::busy, "registered for transfer");
        again = transfer::registration{}; // the destructor deregisters too
        CHECK(value_or_fail(module->readiness()).host.registrations == 0);
        REQUIRE(lazy.release(live).has_value());
        // A stale allocation cannot be leased.
        require_refused(agent.register_allocation(lazy, live), status_code::unknown_allocation, "no live allocation");
    }
    SECTION("a shared prefix's mapping") {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        const host::shared_prefix prefix = value_or_fail(mapping.create_prefix(3 * 4096));
        const allocation<cpu_device> sequence = value_or_fail(lazy.allocate(bytes, 4096));
        REQUIRE(mapping.commit_prefix(sequence, prefix).has_value());
        transfer::registration registered = value_or_fail(agent.register_prefix_mapping(lazy, sequence, prefix));
        CHECK(registered.length() == 3 * 4096);
        require_refused(registered.describe(3 * 4096 - 10, 11), status_code::invalid_argument, "outside registration");
        CHECK(value_or_fail(registered.describe(4096, 4096)).address == registered.base() + 4096);
        require_refused(lazy.release(sequence), status_code::busy, "registered for transfer");
        REQUIRE(registered.deregister().has_value());
        REQUIRE(lazy.release(sequence).has_value());
        REQUIRE(mapping.release_prefix(prefix).has_value());
    }
    SECTION("an import") {
        auto exporter = open_or_fail<cpu_device>(module, "posix-lazy", 0, "share=memfd");
        auto importer = open_or_fail<cpu_device>(module, "posix-lazy");
        const allocation<cpu_device> live = value_or_fail(exporter.allocate(bytes, 4096));
        REQUIRE(value_or_fail(exporter.virtual_backing()).commit(live, {0, bytes}).has_value());
        host::ipc_handle handle = value_or_fail(value_or_fail(exporter.ipc()).export_allocation(live));
        host::imported_memory<cpu_device> imported = value_or_fail(value_or_fail(importer.ipc()).import(handle));
        transfer::registration registered = value_or_fail(agent.register_import(imported));
        CHECK(registered.length() == imported.size());
        require_refused(imported.close(), status_code::busy, "registered for transfer");
        CHECK(imported.open());
        REQUIRE(registered.deregister().has_value());
        REQUIRE(imported.close().has_value());
        REQUIRE(exporter.release(live).has_value());
    }
    CHECK(agent.registration_count() == 0);
    CHECK(value_or_fail(module->readiness()).host.registrations == 0);
}

TEST_CASE("a pool is registered once, its allocations are described without UCX, and its lease stops trim") {
    auto module = load_or_fail(test::posix_plugin_path());
    transfer::agent agent = value_or_fail(transfer::agent::start({"pooler", transports(), true}));
    transfer::agent reader = value_or_fail(transfer::agent::start({"reader", transports(), false}));
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy"));
    REQUIRE(pool->grows_by_commit());
    {
        std::vector<transfer::registration> registered = value_or_fail(agent.register_pool(pool));
        REQUIRE(registered.size() == 1); // the one reservation
        CHECK(agent.registration_count() == 1);
        // KV blocks allocated after the registration lie inside it.
        std::vector<allocation<cpu_device>> blocks;
        for (int i = 0; i < 8; ++i) {
            blocks.push_back(value_or_fail(pool->allocate(64 * 1024, 4096)));
            std::memset(blocks.back().address, 0x30 + i, 64 * 1024);
        }
        CHECK(agent.registration_count() == 1);
        // The lease: trim gives nothing back while registered.
        REQUIRE(pool->release(blocks.back()).has_value());
        blocks.pop_back();
        CHECK(pool->trim(0) == 0);

        std::vector<std::uint8_t> landing(7 * 64 * 1024);
        transfer::registration mine = value_or_fail(reader.register_memory(landing.data(), landing.size()));
        transfer::peer pooler = value_or_fail(reader.connect(value_or_fail(agent.metadata())));
        std::vector<const transfer::registration*> exported;
        for (const auto& each : registered) {
            exported.push_back(&each);
        }
        REQUIRE(pooler.load_regions(value_or_fail(agent.export_regions(exported))).has_value());
        descriptor_list remote;
        for (const auto& block : blocks) {
            REQUIRE(remote.add(transfer::describe(block)).has_value());
        }
        const descriptor_list local = list_of(strided_descriptor{mine.base(), 64 * 1024, 64 * 1024, 7});
        transfer::transfer_request read = value_or_fail(reader.read(pooler, local, remote));
        REQUIRE(read.wait(30s).has_value());
        for (int i = 0; i < 7; ++i) {
            CHECK(landing[static_cast<std::size_t>(i) * 64 * 1024 + 100] == 0x30 + i);
        }
        for (const auto& block : blocks) {
            REQUIRE(pool->release(block).has_value());
        }
    }
    // Deregistered (the handles went): the lease ended, trim gives the idle memory back.
    CHECK(agent.registration_count() == 0);
    CHECK(pool->trim(0) > 0);
}

TEST_CASE("a peer naming an uncommitted part of an exported pool reservation is refused, and the target lives on") {
    using transfer::detail::batch_header;
    using transfer::detail::batch_op;
    auto module = load_or_fail(test::posix_plugin_path());
    transfer::agent target = value_or_fail(transfer::agent::start({"pooler", transports(), true}));
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy"));
    REQUIRE(pool->grows_by_commit());
    const allocation<cpu_device> block = value_or_fail(pool->allocate(64 * 1024, 4096));
    std::memset(block.address, 0x42, 64 * 1024);
    {
        std::vector<transfer::registration> registered = value_or_fail(target.register_pool(pool));
        REQUIRE(registered.size() == 1);
        (void)value_or_fail(target.export_regions({&registered.front()}));
        // The reservation's last page: far past what one block committed, so PROT_NONE.
        const std::uint64_t uncommitted = registered.front().base() + registered.front().length() - 4096;
        REQUIRE(registered.front().length() >= (64u << 20));
        raw_batch_peer forger(value_or_fail(target.metadata()));
        batch_header read;
        read.op = batch_op::read;
        read.count = 1;
        batch_header write = read;
        write.op = batch_op::write;
        std::vector<std::byte> write_data = entry_bytes({{uncommitted, 4096}});
        write_data.resize(write_data.size() + 4096, std::byte{0x66});
        const std::vector<std::byte> page(4096, std::byte{0x66});
        batch_header read_rendezvous = read;
        read_rendezvous.flags = transfer::detail::batch_flag_rendezvous;
        std::uint64_t refused = 0;
        const auto refused_with = [&](const std::optional<raw_batch_peer::answer>& answer) {
            REQUIRE(answer.has_value());
            CHECK(answer->status == UCS_ERR_INVALID_ADDR);
            CHECK(target.refused_batches() == ++refused);
        };
        refused_with(forger.ask(batch_bytes(read), entry_bytes({{uncommitted, 4096}})));
        refused_with(forger.ask(batch_bytes(write), write_data));
        // A committed block and an uncommitted one in one write: refused whole, the committed one untouched.
        batch_header two = write;
        two.count = 2;
        std::vector<std::byte> both = entry_bytes({{reinterpret_cast<std::uint64_t>(block.address), 4096}, {uncommitted, 4096}});
        both.resize(both.size() + 8192, std::byte{0x66});
        refused_with(forger.ask(batch_bytes(two), both));
        refused_with(forger.ask(batch_bytes(read_rendezvous, entry_bytes({{uncommitted, 4096}})), {}));
        refused_with(forger.ask(batch_bytes(write, entry_bytes({{uncommitted, 4096}})), page, 5000ms,
                                transfer::detail::batch_request_am_id, {}, UCP_AM_SEND_FLAG_RNDV));
        // Still serving what is committed.
        const auto served = forger.ask(batch_bytes(read), entry_bytes({{reinterpret_cast<std::uint64_t>(block.address), 4096}}));
        REQUIRE(served.has_value());
        CHECK(served->status == UCS_OK);
        CHECK(served->bytes == 4096);
        CHECK(target.unprobed_batches() == 0);
    }
    CHECK(static_cast<unsigned char*>(block.address)[0] == 0x42);
    REQUIRE(pool->release(block).has_value());
}

TEST_CASE("a resident pool registered for transfer refuses to sleep until it is deregistered") {
    auto module = load_or_fail(test::posix_plugin_path());
    transfer::agent agent = value_or_fail(transfer::agent::start({"sleeper", transports(), true}));
    pool_options options;
    options.reserve_bytes = 64 * 1024 * 1024;
    auto pool = std::make_shared<resident_pool<host::plugin_allocator<cpu_device>>>(
        "kv", options, open_or_fail<cpu_device>(module, "posix-lazy"));
    const allocation<cpu_device> block = value_or_fail(pool->allocate(64 * 1024, 4096));
    std::memset(block.address, 0x5c, block.size);
    {
        std::vector<transfer::registration> registered = value_or_fail(agent.register_pool(pool));
        REQUIRE(registered.size() == 1);
        // A NIC or a peer may be reading it: the memory cannot be given back under them.
        require_refused(pool->sleep(sleep_policy::discard()), status_code::busy, "lease");
        CHECK(pool->state() == residency_state::awake);
        CHECK(static_cast<unsigned char*>(block.address)[100] == 0x5c);
    }
    CHECK(agent.registration_count() == 0);
    REQUIRE(pool->sleep(sleep_policy::host()).has_value());
    REQUIRE(pool->wake().has_value());
    CHECK(static_cast<unsigned char*>(block.address)[100] == 0x5c);
    REQUIRE(pool->release(block).has_value());
}
