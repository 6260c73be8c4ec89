// Tables: the allocator table a mechanism hands out (and the factory and capability tables behind
// it), read byte by byte within their own struct_size, before and independently of the host's
// read_prefix: type tags, struct_size against the declared level (and the level against the minor
// that introduced the table), capability flags against slots, required slots, identity.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/host/detail/table_checks.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace nxmem::conform {

namespace detail {

// The first bytes of a table, read within its own struct_size.
template <class T> struct raw_table {
    const void* address = nullptr;
    std::uint32_t struct_size = 0;
    std::uint32_t declared_minor = 0; // valid when struct_size covers it
    std::uint32_t type_tag = 0;       // valid when struct_size covers it
    T copy{};                         // min(struct_size, sizeof(T)) bytes, zero beyond

    bool covers(std::size_t end) const noexcept { return struct_size >= end; }
    bool covers_header() const noexcept { return covers(abi::table_header_bytes); }
    // The level this header can check: min(declared, what this header knows).
    std::uint32_t checked_minor() const noexcept {
        return std::min(declared_minor, abi::known_minor<T>());
    }

    static raw_table read(const void* untrusted) {
        raw_table table;
        table.address = untrusted;
        if (untrusted == nullptr) {
            return table;
        }
        const auto* bytes = static_cast<const unsigned char*>(untrusted);
        std::memcpy(&table.struct_size, bytes, sizeof table.struct_size);
        if (table.covers(8)) {
            std::memcpy(&table.declared_minor, bytes + 4, sizeof table.declared_minor);
        }
        if (table.covers(12)) {
            std::memcpy(&table.type_tag, bytes + 8, sizeof table.type_tag);
        }
        std::memcpy(&table.copy, bytes, std::min<std::size_t>(table.struct_size, sizeof(T)));
        return table;
    }

    // "" when struct_size is consistent with the declared level, else what is wrong.
    std::string size_problem() const {
        const std::string name(abi::struct_traits<T>::name);
        if (!covers_header()) {
            return name + ": struct_size " + std::to_string(struct_size) +
                   " does not cover the 12-byte table header";
        }
        if (struct_size > NXMEM_MAX_STRUCT_SIZE) {
            return name + ": struct_size " + std::to_string(struct_size) + " exceeds " +
                   std::to_string(NXMEM_MAX_STRUCT_SIZE);
        }
        if (declared_minor < abi::introduced_minor<T>()) { // rule R13: its slots would read as absent
            return name + ": declares minor " + std::to_string(declared_minor) + ", below minor " +
                   std::to_string(abi::introduced_minor<T>()) + ", which introduced it";
        }
        const std::size_t needed = abi::bytes_required<T>(declared_minor);
        if (struct_size < needed) {
            return name + ": struct_size " + std::to_string(struct_size) + " but minor " +
                   std::to_string(declared_minor) + " needs " + std::to_string(needed);
        }
        return {};
    }

    // "" when every required slot up to the checked level is non-NULL, else the first missing.
    std::string missing_slot() const {
        for (const abi::field_info& field : abi::struct_traits<T>::fields) {
            if (field.role == abi::field_role::required_slot &&
                field.since <= std::max(checked_minor(), abi::introduced_minor<T>()) &&
                (!covers(field.offset + field.size) || !host::detail::slot_is_set(copy, field))) {
                return std::string(abi::struct_traits<T>::name) + "::" + std::string(field.name) +
                       " is NULL";
            }
        }
        return {};
    }
};

inline NxmemStatusCode accept_reclaim(void*, const NxmemReclaimRequest*, NxmemStatus*) noexcept {
    return NXMEM_STATUS_OK;
}
inline void ignore_completion(void*, const NxmemReleaseCompletion*) noexcept {}

// The mechanism's allocator opened by calling its factory directly, with the host nowhere in
// between; released through its own release slot when it can be located, as the host would.
class raw_allocator {
public:
    // Negotiates `host_range` (the whole supported range by default), then opens.
    static result<std::unique_ptr<raw_allocator>> open(const subject& target,
                                                       const abi::version_range& host_range = abi::supported_range) {
        announce_step("open " + target.describe() + " through its factory, host range " + host_range.describe());
        NXMEM_TRY(library, open_with_exports(target));
        auto opened = std::unique_ptr<raw_allocator>(new raw_allocator(std::move(library)));
        NXMEM_TRY(factories, raw_factories::create(opened->library_, host_range));
        opened->negotiated_minor = factories.negotiated_minor();
        opened->factories_.emplace(std::move(factories));
        opened->factory_raw_ = opened->factories_->find(target.mechanism);
        if (opened->factory_raw_ == nullptr) {
            return fail(status_code::invalid_argument, "no factory named '" + target.mechanism + "'");
        }
        opened->factory = raw_table<NxmemAllocatorFactoryVtable>::read(opened->factory_raw_);
        NXMEM_TRY(factory_copy, abi::read_prefix<NxmemAllocatorFactoryVtable>(opened->factory_raw_,
                                                                              NXMEM_ABI_MINOR));
        if (factory_copy.table.open_allocator == nullptr) {
            return fail(status_code::contract_violation, "the factory's open_allocator is NULL");
        }
        opened->callbacks_ = abi::make_struct<NxmemHostCallbacks>();
        opened->callbacks_.abi_minor = NXMEM_ABI_MINOR;
        opened->callbacks_.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        opened->callbacks_.request_reclaim = &accept_reclaim;
        opened->callbacks_.release_completed = &ignore_completion;
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = target.device.to_wire();
        request.callbacks = &opened->callbacks_;
        NxmemStatus status = abi::make_status();
        NxmemAllocatorVtable* table = nullptr;
        const NxmemStatusCode code = factory_copy.table.open_allocator(opened->factory_raw_, &request,
                                                                       &table, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        "open_allocator refused: " + abi::read_status_message(status));
        }
        opened->table_raw_ = table;
        opened->allocator = raw_table<NxmemAllocatorVtable>::read(table);
        opened->factory_mechanism_id = factory_copy.table.mechanism_id;
        return opened;
    }

    raw_allocator(const raw_allocator&) = delete;
    raw_allocator& operator=(const raw_allocator&) = delete;
    ~raw_allocator() {
        if (NxmemReleaseFn release = host::detail::locate_release_slot(table_raw_)) {
            release(table_raw_);
        }
        factories_.reset();
    }

    raw_table<NxmemAllocatorFactoryVtable> factory;
    raw_table<NxmemAllocatorVtable> allocator;
    std::uint64_t factory_mechanism_id = 0;
    std::uint32_t negotiated_minor = 0;

    // A capability table the allocator points to, if its struct_size covers the pointer.
    template <class T> std::optional<raw_table<T>> capability_table(std::string_view field_name) const {
        const abi::field_info* field = abi::find_field<NxmemAllocatorVtable>(field_name);
        if (!allocator.covers(field->offset + field->size) || field->since > allocator.checked_minor()) {
            return std::nullopt; // not part of the table at its declared level
        }
        const void* pointer = nullptr;
        std::memcpy(&pointer, reinterpret_cast<const unsigned char*>(&allocator.copy) + field->offset,
                    sizeof pointer);
        if (pointer == nullptr) {
            return std::nullopt;
        }
        return raw_table<T>::read(pointer);
    }

    // The first problem `problem_of` (called with each raw_table<T> present) finds among the
    // capability tables the allocator points to, in the table's order; empty when none.
    template <class ProblemOf> std::string capability_table_problem(ProblemOf&& problem_of) const {
        std::string problem;
        const auto visit = [&]<class T>(std::string_view field_name) {
            if (problem.empty()) {
                if (auto table = capability_table<T>(field_name)) {
                    problem = problem_of(*table);
                }
            }
        };
        visit.template operator()<NxmemVirtualBackingVtable>("virtual_backing");
        visit.template operator()<NxmemSharedMappingVtable>("shared_mapping");
        visit.template operator()<NxmemIpcVtable>("ipc");
        visit.template operator()<NxmemFencedReleaseVtable>("fenced_release");
        visit.template operator()<NxmemCopyVtable>("copy");
        return problem;
    }

private:
    explicit raw_allocator(raw_library library) : library_(std::move(library)) {}

    raw_library library_; // declared first: destroyed last
    std::optional<raw_factories> factories_;
    NxmemAllocatorFactoryVtable* factory_raw_ = nullptr;
    NxmemAllocatorVtable* table_raw_ = nullptr;
    NxmemHostCallbacks callbacks_{};
};

// What the table checks expect before anything else; a failure with it means the factory refused
// to open an allocator, and says nothing about the tables.
inline constexpr const char* factory_opens = "the factory opens an allocator";

template <class T> std::string tag_problem(const raw_table<T>& table) {
    const std::string name(abi::struct_traits<T>::name);
    if (!table.covers_header()) {
        return name + ": struct_size " + std::to_string(table.struct_size) +
               " does not cover the type tag";
    }
    if (table.type_tag != abi::struct_traits<T>::type_tag) {
        return name + ": type tag 0x" + nxmem::detail::to_hex(table.type_tag);
    }
    return {};
}

} // namespace detail

// tables.type_tags
struct check_tables_type_tags {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, detail::factory_opens, detail::raw_allocator::open(target));
        std::string problem = detail::tag_problem(opened->factory);
        if (problem.empty()) {
            problem = detail::tag_problem(opened->allocator);
        }
        if (problem.empty()) {
            problem = opened->capability_table_problem(
                [](const auto& table) { return detail::tag_problem(table); });
        }
        if (!problem.empty()) {
            return failed("each table carries its own type tag at offset 8", problem);
        }
        return passed();
    }
};

// tables.struct_size
struct check_tables_struct_size {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, detail::factory_opens, detail::raw_allocator::open(target));
        std::string problem = opened->factory.size_problem();
        if (problem.empty()) {
            problem = opened->allocator.size_problem();
        }
        if (problem.empty()) {
            problem = opened->capability_table_problem([](const auto& table) { return table.size_problem(); });
        }
        if (!problem.empty()) {
            return failed("a declared level no lower than the table's introduction, and a struct_size "
                          "that covers it and stays within " +
                              std::to_string(NXMEM_MAX_STRUCT_SIZE) + " bytes",
                          problem);
        }
        return passed();
    }
};

// tables.capabilities
struct check_tables_capabilities {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, detail::factory_opens, detail::raw_allocator::open(target));
        const auto& table = opened->allocator;
        const std::string expected = "every capability flag set exactly when its slots are";
        NxmemCapabilities flags = table.copy.capabilities;
        if (table.declared_minor > abi::known_minor<NxmemAllocatorVtable>()) {
            flags &= NXMEM_CAP_ALL_V1; // a newer minor's flags are not this header's to judge
        }
        if (const std::uint64_t stray = flags & ~abi::capabilities_at_minor(table.declared_minor);
            stray != 0) {
            return failed(expected, "capability bits 0x" + nxmem::detail::to_hex(stray) +
                                        " are defined by no minor up to the declared one (" +
                                        std::to_string(table.declared_minor) + ")");
        }
        if ((flags & NXMEM_CAP_FENCED_RELEASE) != 0 && (flags & NXMEM_CAP_DEFERRED_RELEASE) == 0) {
            return failed(expected, "NXMEM_CAP_FENCED_RELEASE is set without NXMEM_CAP_DEFERRED_RELEASE (F2)");
        }
        for (const abi::capability_pair& pair : abi::allocator_capabilities) {
            const bool flagged = (flags & pair.flag) != 0;
            for (std::string_view name : pair.fields) {
                if (name.empty()) {
                    continue;
                }
                const abi::field_info* field = abi::find_field<NxmemAllocatorVtable>(name);
                if (field->since > table.checked_minor()) {
                    continue; // above the declared level: read as absent
                }
                const bool set = host::detail::slot_is_set(table.copy, *field);
                if (flagged != set) {
                    return failed(expected, std::string(pair.flag_name) + " is " +
                                                (flagged ? "set" : "clear") + " but '" +
                                                std::string(name) + "' is " +
                                                (set ? "non-NULL" : "NULL"));
                }
            }
        }
        return passed();
    }
};

// tables.flags_within_minor: at every negotiated minor the header knows, the allocator table sets
// no flag above that minor (rule C7): an older host would otherwise refuse it.
struct check_tables_flags_within_minor {
    static finding run(const subject& target, const suite_options&) {
        const std::string expected = "no capability flag above the negotiated minor";
        for (std::uint32_t ceiling = NXMEM_ABI_MINOR_BASELINE; ceiling <= NXMEM_ABI_MINOR; ++ceiling) {
            const abi::version_range host_range{NXMEM_ABI_MAJOR, NXMEM_ABI_MINOR_BASELINE, ceiling};
            result<std::unique_ptr<detail::raw_allocator>> opened =
                detail::raw_allocator::open(target, host_range);
            if (!opened) {
                continue; // the plugin does not speak this range: negotiation checks judge that
            }
            const detail::raw_allocator& raw = *opened.value();
            const NxmemCapabilities above =
                raw.allocator.copy.capabilities & ~abi::capabilities_at_minor(raw.negotiated_minor);
            if (above != 0) {
                return failed_rule("C7", expected, "host range " + host_range.describe() + " negotiated minor " +
                                            std::to_string(raw.negotiated_minor) +
                                            ", but the allocator table sets flags 0x" +
                                            nxmem::detail::to_hex(above) + " of later minors");
            }
        }
        return passed();
    }
};

// tables.required_slots
struct check_tables_required_slots {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, detail::factory_opens, detail::raw_allocator::open(target));
        std::string problem = opened->factory.missing_slot();
        if (problem.empty()) {
            problem = opened->allocator.missing_slot();
        }
        if (problem.empty()) {
            problem = opened->capability_table_problem([](const auto& table) { return table.missing_slot(); });
        }
        if (!problem.empty()) {
            return failed("every required slot non-NULL", problem);
        }
        return passed();
    }
};

// tables.identity
struct check_tables_identity {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, detail::factory_opens, detail::raw_allocator::open(target));
        const NxmemAllocatorVtable& table = opened->allocator.copy;
        if (table.mechanism_id != opened->factory_mechanism_id) {
            return failed("the allocator names its factory's mechanism id " +
                              std::to_string(opened->factory_mechanism_id),
                          "mechanism id " + std::to_string(table.mechanism_id));
        }
        if (device_id::from_wire(table.device) != target.device) {
            return failed("the allocator names the device it was opened on, " +
                              std::string(device_type_name(target.device.type)) + ":" +
                              std::to_string(target.device.index),
                          std::string(device_type_name(table.device.device_type)) + ":" +
                              std::to_string(table.device.index));
        }
        return passed();
    }
};

} // namespace nxmem::conform
