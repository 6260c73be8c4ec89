// The Catch2 main shared by every test executable.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 with -fsanitize=address reports a false maybe-uninitialized inside std::function as used
// by <regex> (GCC bug 105562); the rest of the project keeps the warning as an error.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
