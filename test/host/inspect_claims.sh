#!/bin/sh
# Rule R11: a table that declares a minor above the negotiated ceiling is read at the ceiling, and
# `nxmem inspect` reports both minors, in text and in JSON. The test plugin's unmasked-flags
# mechanism declares minor 1 whatever was negotiated; a 1.0-1.0 host clamps it to 1.0.
# Usage: inspect_claims.sh NXMEM_TOOL TESTPLUGIN. Exits 77 (skipped) without python3 for the JSON.
tool=$1
plugin=$2
text=$("$tool" inspect --host-range 1.0-1.0 "$plugin") || { echo "nxmem inspect failed" >&2; exit 1; }
printf '%s\n' "$text" | grep -Eq '^ +unmasked-flags .* 1\.1 \(read as 1\.0\)' || {
    printf '%s\n' "$text" >&2
    echo "inspect_claims.sh: the text report does not show unmasked-flags as '1.1 (read as 1.0)'" >&2
    exit 1
}
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: the JSON report is not checked" >&2; exit 77; }
"$tool" inspect --json --host-range 1.0-1.0 "$plugin" | python3 -c '
import json, sys
report = json.load(sys.stdin)[0]
found = [f for f in report["factories"] if f["name"] == "unmasked-flags"]
assert found, "unmasked-flags is not listed"
allocator = found[0]["allocator"]
assert allocator["opened"], allocator
assert (allocator["declared_minor"], allocator["effective_minor"]) == (1, 0), allocator
assert report["negotiated_version"]["minor"] == 0, report["negotiated_version"]
' || { echo "inspect_claims.sh: the JSON report does not show declared minor 1, effective 0" >&2; exit 1; }
