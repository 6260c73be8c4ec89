// Device tags: the device types an engine instantiates allocators for, each with its address type.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <compare>
#include <concepts>
#include <cstdint>
#include <string_view>

namespace nxmem {

// An address on a device that the host cannot dereference: a distinct type, so a CUDA address is
// never mistaken for a host pointer.
template <class Tag> struct device_address {
    std::uint64_t value = 0;
    friend constexpr auto operator<=>(const device_address&, const device_address&) = default;
};

// Host memory: addresses are ordinary pointers.
struct cpu_device {
    static constexpr NxmemDeviceType type = NXMEM_DEVICE_CPU;
    static constexpr std::string_view name = "cpu";
    using address_type = void*;
    static address_type from_wire(std::uint64_t wire) noexcept {
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(wire));
    }
    static std::uint64_t to_wire(address_type address) noexcept {
        return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(address));
    }
};

// NVIDIA GPU memory: opaque device addresses.
struct cuda_device {
    static constexpr NxmemDeviceType type = NXMEM_DEVICE_CUDA;
    static constexpr std::string_view name = "cuda";
    using address_type = device_address<cuda_device>;
    static address_type from_wire(std::uint64_t wire) noexcept { return {wire}; }
    static std::uint64_t to_wire(address_type address) noexcept { return address.value; }
};

// AMD GPU memory: opaque device addresses.
struct hip_device {
    static constexpr NxmemDeviceType type = NXMEM_DEVICE_HIP;
    static constexpr std::string_view name = "hip";
    using address_type = device_address<hip_device>;
    static address_type from_wire(std::uint64_t wire) noexcept { return {wire}; }
    static std::uint64_t to_wire(address_type address) noexcept { return address.value; }
};

// A device tag names its C device type, its address type and how addresses cross the wire.
template <class D>
concept Device = requires(std::uint64_t wire, typename D::address_type address) {
    { D::type } -> std::convertible_to<NxmemDeviceType>;
    { D::name } -> std::convertible_to<std::string_view>;
    { D::from_wire(wire) } noexcept -> std::same_as<typename D::address_type>;
    { D::to_wire(address) } noexcept -> std::same_as<std::uint64_t>;
} && std::regular<typename D::address_type>;

// The lowercase name of a C device type, for messages and tools.
constexpr std::string_view device_type_name(NxmemDeviceType type) noexcept {
    switch (type) {
    case NXMEM_DEVICE_CPU: return "cpu";
    case NXMEM_DEVICE_CUDA: return "cuda";
    case NXMEM_DEVICE_HIP: return "hip";
    case NXMEM_DEVICE_LEVEL_ZERO: return "level_zero";
    default: return "unknown";
    }
}

// One device: a type and an index among devices of that type.
struct device_id {
    NxmemDeviceType type = 0;
    std::int32_t index = 0;
    friend constexpr bool operator==(const device_id&, const device_id&) = default;

    NxmemDeviceId to_wire() const noexcept {
        NxmemDeviceId wire{};
        wire.struct_size = sizeof wire;
        wire.device_type = type;
        wire.index = index;
        return wire;
    }
    static constexpr device_id from_wire(const NxmemDeviceId& wire) noexcept {
        return {wire.device_type, wire.index};
    }
};

} // namespace nxmem
