#!/bin/sh
# Runs the command given in "$@" and checks that its standard output is one valid JSON document.
# Exits 77 (skipped) when python3 is not available to check it.
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: cannot check JSON" >&2; exit 77; }
output=$("$@")
status=$?
if [ "$status" -ne 0 ]; then
    echo "check_json.sh: '$*' exited with status $status" >&2
    exit 1
fi
printf '%s\n' "$output" | python3 -m json.tool >/dev/null || {
    echo "check_json.sh: '$*' did not print valid JSON:" >&2
    printf '%s\n' "$output" >&2
    exit 1
}
