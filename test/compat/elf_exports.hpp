// The symbols a shared object defines in its dynamic symbol table (.dynsym), read from the file
// with <elf.h>: what `nm -D --defined-only` lists, and what another library can bind to.
#pragma once

#include <elf.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace nxmem::test {

namespace detail {

// Copies a T out of `image` at `offset`, refusing a read past the end of the file.
template <class T> T read_at(const std::vector<char>& image, std::size_t offset, const char* what) {
    if (offset > image.size() || image.size() - offset < sizeof(T)) {
        throw std::runtime_error(std::string("ELF file truncated at its ") + what);
    }
    T value;
    std::memcpy(&value, image.data() + offset, sizeof value);
    return value;
}

} // namespace detail

// The names of every symbol `path` defines (not merely references) in .dynsym with global, weak
// or GNU-unique binding. Throws, naming what is wrong, for a file that is not a 64-bit ELF object.
inline std::set<std::string> defined_dynamic_symbols(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) {
        throw std::runtime_error("cannot open " + path);
    }
    const std::vector<char> image{std::istreambuf_iterator<char>(file),
                                  std::istreambuf_iterator<char>()};
    const auto header = detail::read_at<Elf64_Ehdr>(image, 0, "ELF header");
    if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64) {
        throw std::runtime_error(path + " is not a 64-bit ELF object");
    }
    const auto section = [&](std::size_t index) {
        return detail::read_at<Elf64_Shdr>(image, header.e_shoff + index * sizeof(Elf64_Shdr),
                                           "section headers");
    };
    std::set<std::string> names;
    for (std::size_t index = 0; index < header.e_shnum; ++index) {
        const Elf64_Shdr symbols = section(index);
        if (symbols.sh_type != SHT_DYNSYM) {
            continue;
        }
        const Elf64_Shdr strings = section(symbols.sh_link);
        // Entry 0 is the reserved null symbol.
        for (std::size_t at = sizeof(Elf64_Sym); at + sizeof(Elf64_Sym) <= symbols.sh_size;
             at += sizeof(Elf64_Sym)) {
            const auto symbol = detail::read_at<Elf64_Sym>(image, symbols.sh_offset + at, ".dynsym");
            const unsigned binding = ELF64_ST_BIND(symbol.st_info);
            const bool visible = binding == STB_GLOBAL || binding == STB_WEAK ||
                                 binding == STB_GNU_UNIQUE;
            if (symbol.st_shndx == SHN_UNDEF || !visible) {
                continue;
            }
            const std::size_t name_at = strings.sh_offset + symbol.st_name;
            if (symbol.st_name >= strings.sh_size || name_at >= image.size()) {
                throw std::runtime_error(path + ": a .dynsym name lies outside its string table");
            }
            names.emplace(image.data() + name_at,
                          ::strnlen(image.data() + name_at, image.size() - name_at));
        }
    }
    return names;
}

} // namespace nxmem::test
