#!/bin/sh
# What the conformance suite needs of a capacity-limited mechanism (docs/CONFORMANCE.md, "What the
# suite needs of a mechanism"): the outsider arena conforms with 6 MiB and fails exactly the four
# allocation-grid checks with OUT_OF_MEMORY at 5 MiB, each message naming the code once.
# Usage: check_capacity.sh NXMEM OUTSIDER_PLUGIN
nxmem=$1
plugin=$2
fail() { echo "check_capacity.sh: $*" >&2; exit 1; }
enough=$("$nxmem" conform --mechanism outsider-arena --options capacity=6M "$plugin")
printf '%s\n' "$enough"
printf '%s\n' "$enough" | grep -q '^    outsider-arena: .* 0 failed, .* -- conforms$' || fail "6 MiB is not enough"
short=$("$nxmem" conform --mechanism outsider-arena --options capacity=5M "$plugin")
printf '%s\n' "$short"
failed=$(printf '%s\n' "$short" | grep '^    FAIL' | awk '{print $2}' | sort | tr '\n' ' ')
[ "$failed" = "allocation.accounting allocation.no_overlap allocation.sizes_alignments allocation.writable " ] ||
    fail "at 5 MiB expected the four allocation-grid checks to fail, got: $failed"
printf '%s\n' "$short" | grep '^    FAIL' | grep -v 'OUT_OF_MEMORY' && fail "a failure at 5 MiB is not OUT_OF_MEMORY"
if printf '%s\n' "$short" | grep -q 'OUT_OF_MEMORY.*OUT_OF_MEMORY'; then
    fail "a message names the code twice"
fi
exit 0
