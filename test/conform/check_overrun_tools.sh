#!/bin/sh
# A plugin that writes 320 bytes into the 264-byte status whenever it refuses (the C example with
# that fault planted): `nxmem inspect --host-range 2.0-2.1` does not crash, exits 1 and names the
# overrun at offset 264 of the status; `nxmem conform` does not crash either and reports it. A
# plugin whose allocate never returns is reported as timed out, not crashed, with check and step.
# Usage: check_overrun_tools.sh NXMEM OVERRUN_PLUGIN HANGING_PLUGIN
nxmem=$1
plugin=$2
hanging=$3
fail() { echo "check_overrun_tools.sh: $*" >&2; exit 1; }
output=$("$nxmem" inspect --host-range 2.0-2.1 "$plugin")
status=$?
printf '%s\n' "$output"
[ "$status" -eq 1 ] || fail "nxmem inspect: expected exit status 1, got $status"
printf '%s\n' "$output" | grep -q '^  overrun .*at offset 264 of a status of size 264 (past its end)' ||
    fail "nxmem inspect does not name the overrun at offset 264 of the status"
json=$("$nxmem" inspect --json --host-range 2.0-2.1 "$plugin")
status=$?
[ "$status" -eq 1 ] || fail "nxmem inspect --json: expected exit status 1, got $status"
printf '%s\n' "$json" | grep -q '"overrun": ".*at offset 264 of a status of size 264' ||
    fail "nxmem inspect --json does not name the overrun"
output=$("$nxmem" conform --timeout 120 "$plugin")
status=$?
printf '%s\n' "$output"
[ "$status" -eq 1 ] || fail "nxmem conform: expected exit status 1, got $status"
printf '%s\n' "$output" |
    grep -q '^    CRASH crashed (SIGSEGV: a write at offset 264 of a status of size 264 (past its end)) during check negotiation\.[a-z]*, step "NxmemNegotiate with host range ' ||
    fail "nxmem conform does not report the write at offset 264 of the status with its check and step"
output=$("$nxmem" conform --timeout 2 "$hanging")
status=$?
printf '%s\n' "$output"
[ "$status" -eq 1 ] || fail "nxmem conform on a hang: expected exit status 1, got $status"
printf '%s\n' "$output" |
    grep -q '^    TIMEOUT timed out after 2 s during check allocation.basic, step "allocate 64 B at alignment 8"$' ||
    fail "the hang is not reported as a timeout during allocation.basic with its step"
printf '%s\n' "$output" | grep -q 'CRASH' && fail "the hang is reported as a crash"
exit 0
