#!/bin/sh
# The compile-fail test of NXMEM_EXPORT_PLUGIN: compiling export_misspelt_member.cpp must fail,
# with one error, a static assertion that names the class (misspelt_arena) and the member (allocate), and
# no template constraint failure of the kit's templates. Usage: check_export_diagnostic.sh SOURCE INCLUDE CXX...
source=$1
include=$2
shift 2
output=$("$@" -std=c++20 -fsyntax-only -fdiagnostics-color=never -I"$include" "$source" 2>&1)
status=$?
printf '%s\n' "$output"
fail() { echo "check_export_diagnostic.sh: $*" >&2; exit 1; }
[ "$status" -ne 0 ] || fail "the misspelt mechanism compiled"
errors=$(printf '%s\n' "$output" | grep -c 'error:')
[ "$errors" -eq 1 ] || fail "expected one error, got $errors"
printf '%s\n' "$output" | grep 'error:' | grep -q 'static.assert' || fail "the error is not the static assertion"
printf '%s\n' "$output" | grep -q 'a mechanism allocates: `result<block> allocate(std::uint64_t size, std::uint64_t alignment)`' ||
    fail "the message does not name the member and its signature"
printf '%s\n' "$output" | grep -q 'misspelt_arena' || fail "the message does not name the class"
if printf '%s\n' "$output" | grep -q 'template constraint failure'; then
    fail "a template constraint failure was reported besides the static assertion"
fi
