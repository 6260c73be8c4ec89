#!/bin/sh
# `nxmem transfer` (tools/nxmem/transfer.cpp): --quick on the posix plugin over tcp loopback prints
# a row for each of the four block sizes both ways and writes JSON with the expected keys; --help
# prints the options and measures nothing; a bad transport, a plugin that does not exist and (when
# given) a plugin with no cpu mechanism are refused with a message naming what was wrong.
# Arguments: NXMEM POSIX_PLUGIN SCRATCH_DIRECTORY [PLUGIN_WITHOUT_CPU]. Exits 77 without python3.
set -u
nxmem=$1
plugin=$2
scratch=$3
no_cpu_plugin=${4:-}
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: cannot check the JSON" >&2; exit 77; }
fail() { echo "nxmem_transfer_check.sh: $*" >&2; exit 1; }
mkdir -p "$scratch" || fail "cannot make $scratch"

"$nxmem" --help > "$scratch/help.txt" 2>&1 || fail "nxmem --help failed"
grep -q "^  transfer" "$scratch/help.txt" || fail "nxmem --help does not list transfer: $(cat "$scratch/help.txt")"
"$nxmem" transfer --help > "$scratch/transfer_help.txt" 2>&1 || fail "nxmem transfer --help failed"
for option in --transport --sizes --batch --json --baseline --quick --mechanism --options; do
    grep -q -- "$option" "$scratch/transfer_help.txt" || fail "nxmem transfer --help does not list $option"
done
if grep -q "MiB" "$scratch/transfer_help.txt" && grep -q "^tcp " "$scratch/transfer_help.txt"; then
    fail "nxmem transfer --help measured something"
fi

rm -f "$scratch/transfer.json"
"$nxmem" transfer --quick --transport tcp --json "$scratch/transfer.json" "$plugin" > "$scratch/transfer.txt" 2>&1 ||
    fail "nxmem transfer --quick failed: $(cat "$scratch/transfer.txt")"
for op in read write; do
    for size in "4 KiB" "64 KiB" "1 MiB" "16 MiB"; do
        grep -Eq "^tcp +$op +$size +[0-9]" "$scratch/transfer.txt" ||
            fail "no '$op $size' row over tcp in: $(cat "$scratch/transfer.txt")"
    done
done
grep -q "^sm " "$scratch/transfer.txt" && fail "--transport tcp also measured sm"
grep -q "registration: one 64 MiB pool" "$scratch/transfer.txt" || fail "no registration line"

python3 - "$scratch/transfer.json" "$plugin" <<'PY' || fail "the JSON is not as expected"
import json, sys
document = json.load(open(sys.argv[1]))
def need(condition, what):
    if not condition:
        sys.exit("transfer.json: " + what)
context = document["context"]
need(context["tool"] == "nxmem transfer" and context["quick"] is True, "context")
need(context["plugin"] == sys.argv[2] and context["mechanism"] == "posix-eager", "plugin and mechanism")
need(document["baseline"]["asked"] is False, "baseline asked without --baseline")
need(list(document["transports"]) == ["tcp"], "transports")
tcp = document["transports"]["tcp"]
rows = tcp["rows"]
need(sorted((row["op"], row["size"]) for row in rows) ==
     sorted((op, size) for op in ("read", "write") for size in (4096, 65536, 1 << 20, 16 << 20)), "rows")
for row in rows:
    need(row["nxmem_bytes_per_second"] > 0 and row["nxmem_seconds_per_transfer_one_at_a_time"] > 0, "figures")
    need(row["perftest_ran"] is False and row["perftest_why_not"], "baseline row without --baseline")
for op in ("read", "write"):
    batch = tcp["batch"][op]
    need(batch["blocks"] == 1000 and batch["one_request_seconds"] > 0 and batch["throughput_ratio"] > 0, "batch")
costs = document["registration"]["tcp"]
need(costs["pool_bytes"] == 64 << 20 and costs["pool_seconds"] > 0, "registration pool")
need(costs["tensors_100_seconds"] > 0 and costs["tensors_1000_seconds"] > 0, "registration tensors")
need("tcp_read_4096_bandwidth_vs_perftest" not in document["ratios"], "a ratio to a baseline that did not run")
need("registration_1000_tensors_over_pool_tcp" in document["ratios"], "registration ratio")
need("tcp_write_batch_vs_single" in document["ratios"], "batch ratio")
PY

# Refusals: each names what was wrong and exits non-zero.
"$nxmem" transfer --quick --transport carrier-pigeon "$plugin" > "$scratch/bad_transport.txt" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "an unknown transport exited $status, not 2"
grep -q "carrier-pigeon" "$scratch/bad_transport.txt" && grep -q -- "--transport" "$scratch/bad_transport.txt" ||
    fail "the unknown transport is not named: $(cat "$scratch/bad_transport.txt")"

"$nxmem" transfer --quick "$scratch/no-such-plugin.so" > "$scratch/missing.txt" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "a missing plugin exited $status, not 1"
grep -q "no-such-plugin.so" "$scratch/missing.txt" && grep -q "No such file" "$scratch/missing.txt" ||
    fail "the missing plugin is not named: $(cat "$scratch/missing.txt")"

if [ -n "$no_cpu_plugin" ]; then
    "$nxmem" transfer --quick "$no_cpu_plugin" > "$scratch/no_cpu.txt" 2>&1
    status=$?
    [ "$status" -eq 1 ] || fail "a plugin with no cpu mechanism exited $status, not 1"
    grep -q "no mechanism of this plugin serves the cpu device type" "$scratch/no_cpu.txt" ||
        fail "the missing cpu mechanism is not named: $(cat "$scratch/no_cpu.txt")"
fi
exit 0
