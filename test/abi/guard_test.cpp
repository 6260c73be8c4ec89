// The exception guard around every extern "C" body: no exception crosses the boundary; each
// becomes INTERNAL_ERROR with a bounded, NUL-terminated message.
#include <nxmem/plugin/guard.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nxmem::abi::make_status;
using nxmem::abi::read_status_message;
using nxmem::plugin::guard_status;
using nxmem::plugin::guard_void;
using Catch::Matchers::Contains;

struct not_a_std_exception {
    int payload = 7;
};

// A body whose call is not noexcept and that throws: the guard must still be noexcept.
struct throwing_body {
    NxmemStatusCode operator()() const { throw std::runtime_error("throwing_body"); }
};
struct throwing_void_body {
    void operator()() const { throw std::runtime_error("throwing_void_body"); }
};

// The message is terminated within the 256-byte buffer.
bool terminated(const NxmemStatus& status) {
    return std::memchr(status.message, '\0', sizeof status.message) != nullptr;
}

// A status whose message bytes are all non-NUL, so a missing terminator is seen.
NxmemStatus dirty_status() {
    NxmemStatus status = make_status();
    std::memset(status.message, '#', sizeof status.message);
    return status;
}

// The shape of a real slot: a C function-pointer signature, a guarded body.
NxmemStatusCode guarded_slot(NxmemStatus* status, int behaviour) {
    return guard_status(status, [&]() -> NxmemStatusCode {
        if (behaviour == 1) {
            throw std::out_of_range("slot threw out_of_range");
        }
        return NXMEM_STATUS_UNKNOWN_ALLOCATION;
    });
}

} // namespace

TEST_CASE("the guards are noexcept even around throwing bodies", "[guard]") {
    STATIC_REQUIRE_FALSE(noexcept(throwing_body{}()));
    STATIC_REQUIRE(noexcept(guard_status(static_cast<NxmemStatus*>(nullptr), throwing_body{})));
    STATIC_REQUIRE(noexcept(nxmem::detail::guard_status(static_cast<NxmemStatus*>(nullptr),
                                                        throwing_body{})));
    STATIC_REQUIRE_FALSE(noexcept(throwing_void_body{}()));
    STATIC_REQUIRE(noexcept(guard_void(throwing_void_body{})));
    STATIC_REQUIRE(noexcept(guard_void(throwing_void_body{}, [](const NxmemStatus&) {})));
    STATIC_REQUIRE(noexcept(nxmem::detail::status_from_current_exception(nullptr)));
}

TEST_CASE("a std::bad_alloc becomes OUT_OF_MEMORY", "[guard]") {
    NxmemStatus status = dirty_status();
    const NxmemStatusCode code =
        guard_status(&status, []() -> NxmemStatusCode { throw std::bad_alloc(); });
    CHECK(code == NXMEM_STATUS_OUT_OF_MEMORY);
    CHECK(status.code == NXMEM_STATUS_OUT_OF_MEMORY);
    REQUIRE(terminated(status));
    CHECK(read_status_message(status) == std::bad_alloc().what());
    // A type derived from it is running out of memory too.
    status = dirty_status();
    CHECK(guard_status(&status, []() -> NxmemStatusCode { throw std::bad_array_new_length(); }) ==
          NXMEM_STATUS_OUT_OF_MEMORY);
}

TEST_CASE("a std::exception becomes INTERNAL_ERROR carrying its what()", "[guard]") {
    NxmemStatus status = dirty_status();
    const NxmemStatusCode code = guard_status(&status, []() -> NxmemStatusCode {
        throw std::runtime_error("the arena is exhausted");
    });
    CHECK(code == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(status.code == NXMEM_STATUS_INTERNAL_ERROR);
    REQUIRE(terminated(status));
    CHECK(read_status_message(status) == "the arena is exhausted");
}

TEST_CASE("a derived std::exception keeps its own what()", "[guard]") {
    NxmemStatus status = dirty_status();
    CHECK(guarded_slot(&status, 1) == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(status.code == NXMEM_STATUS_INTERNAL_ERROR);
    REQUIRE(terminated(status));
    CHECK(read_status_message(status) == "slot threw out_of_range");
}

TEST_CASE("an int thrown becomes INTERNAL_ERROR with a bounded message", "[guard]") {
    NxmemStatus status = dirty_status();
    const NxmemStatusCode code = guard_status(&status, []() -> NxmemStatusCode { throw 42; });
    CHECK(code == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(status.code == NXMEM_STATUS_INTERNAL_ERROR);
    REQUIRE(terminated(status));
    CHECK_FALSE(read_status_message(status).empty());
    CHECK_THAT(read_status_message(status), Contains("not derived from std::exception"));
}

TEST_CASE("a thrown struct not derived from std::exception becomes INTERNAL_ERROR", "[guard]") {
    NxmemStatus status = dirty_status();
    const NxmemStatusCode code =
        guard_status(&status, []() -> NxmemStatusCode { throw not_a_std_exception{}; });
    CHECK(code == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(status.code == NXMEM_STATUS_INTERNAL_ERROR);
    REQUIRE(terminated(status));
    CHECK_THAT(read_status_message(status), Contains("not derived from std::exception"));
}

TEST_CASE("an exception with a 10 KiB what() is truncated into the inline buffer", "[guard]") {
    NxmemStatus status = dirty_status();
    const std::string huge(10 * 1024, 'w');
    const NxmemStatusCode code =
        guard_status(&status, [&]() -> NxmemStatusCode { throw std::length_error(huge); });
    CHECK(code == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(status.code == NXMEM_STATUS_INTERNAL_ERROR);
    REQUIRE(terminated(status));
    CHECK(status.message[NXMEM_STATUS_MESSAGE_BYTES - 1] == '\0');
    CHECK(read_status_message(status) == std::string(NXMEM_STATUS_MESSAGE_BYTES - 1, 'w'));
}

TEST_CASE("an exception with a NULL status still becomes INTERNAL_ERROR", "[guard]") {
    CHECK(guard_status(nullptr, throwing_body{}) == NXMEM_STATUS_INTERNAL_ERROR);
}

TEST_CASE("an exception is reported within a short status's struct_size", "[guard]") {
    // A 16-byte status: room for 7 message bytes and the NUL, and a sentinel after it.
    std::vector<unsigned char> bytes(sizeof(NxmemStatus), 0x5A);
    const std::uint32_t size = 16;
    std::memcpy(bytes.data(), &size, sizeof size);
    auto* status = reinterpret_cast<NxmemStatus*>(bytes.data());
    CHECK(guard_status(status, throwing_body{}) == NXMEM_STATUS_INTERNAL_ERROR);
    CHECK(std::string(reinterpret_cast<const char*>(bytes.data() + 8)) == "throwin");
    for (std::size_t at = size; at < bytes.size(); ++at) {
        CAPTURE(at);
        REQUIRE(bytes[at] == 0x5A);
    }
}

TEST_CASE("a body's returned code passes through unchanged", "[guard]") {
    for (NxmemStatusCode returned = NXMEM_STATUS_OK; returned <= NXMEM_STATUS_INTERNAL_ERROR + 5;
         ++returned) {
        CAPTURE(returned);
        NxmemStatus status = make_status();
        const NxmemStatusCode code = guard_status(&status, [&] { return returned; });
        CHECK(code == returned);
        // The guard writes nothing when nothing was thrown.
        CHECK(status.code == NXMEM_STATUS_OK);
        CHECK(read_status_message(status).empty());
    }
    SECTION("what the body wrote itself is kept") {
        NxmemStatus status = make_status();
        const NxmemStatusCode code = guard_status(&status, [&] {
            return nxmem::abi::write_status(&status, NXMEM_STATUS_WRONG_DEVICE, "not device 0");
        });
        CHECK(code == NXMEM_STATUS_WRONG_DEVICE);
        CHECK(status.code == NXMEM_STATUS_WRONG_DEVICE);
        CHECK(read_status_message(status) == "not device 0");
        NxmemStatus other = make_status();
        CHECK(guarded_slot(&other, 0) == NXMEM_STATUS_UNKNOWN_ALLOCATION);
    }
}

TEST_CASE("guard_void returns true and reports nothing when the body returns", "[guard]") {
    int runs = 0;
    int failures = 0;
    CHECK(guard_void([&] { ++runs; }, [&](const NxmemStatus&) { ++failures; }));
    CHECK(runs == 1);
    CHECK(failures == 0);
    CHECK(guard_void([&] { ++runs; }));
    CHECK(runs == 2);
}

TEST_CASE("guard_void returns false and reports INTERNAL_ERROR when the body throws", "[guard]") {
    SECTION("a std::exception") {
        int failures = 0;
        NxmemStatus seen = make_status();
        CHECK_FALSE(guard_void([] { throw std::runtime_error("release failed"); },
                               [&](const NxmemStatus& status) {
                                   ++failures;
                                   seen = status;
                               }));
        CHECK(failures == 1);
        CHECK(seen.struct_size == sizeof(NxmemStatus));
        CHECK(seen.code == NXMEM_STATUS_INTERNAL_ERROR);
        REQUIRE(terminated(seen));
        CHECK(read_status_message(seen) == "release failed");
    }
    SECTION("a non-std exception") {
        int failures = 0;
        NxmemStatusCode seen_code = NXMEM_STATUS_OK;
        CHECK_FALSE(guard_void([] { throw not_a_std_exception{}; },
                               [&](const NxmemStatus& status) {
                                   ++failures;
                                   seen_code = status.code;
                                   CHECK(terminated(status));
                               }));
        CHECK(failures == 1);
        CHECK(seen_code == NXMEM_STATUS_INTERNAL_ERROR);
    }
    SECTION("without an on_failure callback") {
        CHECK_FALSE(guard_void(throwing_void_body{}));
    }
    SECTION("an on_failure that throws too is contained") {
        CHECK_FALSE(guard_void(throwing_void_body{},
                               [](const NxmemStatus&) { throw std::logic_error("report failed"); }));
    }
}
