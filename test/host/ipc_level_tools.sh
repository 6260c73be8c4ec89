#!/bin/sh
# Rule R13 through the tools: the rule probe plugin's ipc-declaring-minor-0 mechanism hands out an
# ipc table that fills its three minor-3 slots but declares minor 0. `nxmem conform` fails it at
# tables.struct_size, naming both minors (it used to crash in capability.ipc, calling address 0),
# and `nxmem inspect` reports its open as refused (it used to list "ipc 1.0"); the same table
# declaring minor 3 passes tables.struct_size.
# Usage: ipc_level_tools.sh NXMEM_TOOL RULE_PROBE_PLUGIN
tool=$1
plugin=$2
fail() { echo "ipc_level_tools.sh: $*" >&2; exit 1; }
output=$("$tool" conform --mechanism ipc-declaring-minor-0 "$plugin")
status=$?
printf '%s\n' "$output"
[ "$status" -eq 1 ] || fail "expected exit status 1 from nxmem conform, got $status"
printf '%s\n' "$output" |
    grep -q '^    FAIL  tables\.struct_size .*NxmemIpcVtable: declares minor 0, below minor 3, which introduced it' ||
    fail "tables.struct_size does not fail the ipc table declaring minor 0"
printf '%s\n' "$output" | grep -q 'CRASH' && fail "a check crashed"
output=$("$tool" conform --mechanism ipc-declaring-minor-3 "$plugin")
printf '%s\n' "$output" | grep -q '^    FAIL  tables\.struct_size ' &&
    fail "tables.struct_size fails the control, the same table declaring minor 3"
text=$("$tool" inspect "$plugin")
printf '%s\n' "$text"
printf '%s\n' "$text" | grep -q 'ipc 1\.0' && fail "nxmem inspect lists an ipc table at 1.0"
printf '%s\n' "$text" | grep -q 'NxmemIpcVtable: declares minor 0, below minor 3' ||
    fail "nxmem inspect does not say why ipc-declaring-minor-0 was refused"
exit 0
