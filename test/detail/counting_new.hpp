// A replaced global operator new that counts allocations and, while told to, fails them: for tests
// that check what happens when memory runs out, and that a path allocates nothing.
#pragma once

#include <cstddef>

namespace nxmem::test {

extern bool fail_allocations;   // set by one test thread around one call
extern std::size_t allocations; // every operator new since the start

} // namespace nxmem::test
