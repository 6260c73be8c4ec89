// The C++ headers of nxmem need C++20 (concepts, <span>, designated initialisers). Included first
// by the umbrella headers and by abi/result.hpp (which every C++ header reaches), so a C++17
// translation unit stops here with one message, not a wall of template errors. The C header
// (nxmem_memory_abi.h) does not include this: C and any C++ may use it.
#pragma once

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "nxmem's C++ headers need C++20: compile with -std=c++20 (Meson: default_options : ['cpp_std=c++20']; CMake: link nxmem::nxmem, which requires cxx_std_20). A C plugin needs only <nxmem/nxmem_memory_abi.h>."
// A missing include is fatal in GCC and clang: it stops the compiler before the template errors.
#include "nxmem: C++20 required (see the error above)"
#endif
