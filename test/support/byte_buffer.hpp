// An exactly sized, 8-aligned heap buffer: under AddressSanitizer a read or write even one byte
// past its end is reported, so "never reads (or writes) past struct_size" is checked to the byte.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace nxmem::test {

class byte_buffer {
public:
    explicit byte_buffer(std::size_t size, unsigned char fill = 0)
        : size_(size),
          data_(static_cast<unsigned char*>(::operator new(size, std::align_val_t{8}))) {
        std::memset(data_.get(), fill, size_);
    }

    unsigned char* data() const noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }
    template <class T> T* as() const noexcept { return reinterpret_cast<T*>(data()); }
    std::vector<unsigned char> bytes() const { return {data(), data() + size_}; }

private:
    struct aligned_delete {
        void operator()(unsigned char* bytes) const noexcept {
            ::operator delete(bytes, std::align_val_t{8});
        }
    };
    std::size_t size_;
    std::unique_ptr<unsigned char, aligned_delete> data_;
};

} // namespace nxmem::test
