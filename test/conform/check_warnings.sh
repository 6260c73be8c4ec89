#!/bin/sh
# WARN in nxmem conform's text, JSON and JUnit, and --rules (docs/CONFORMANCE.md, "Warnings").
# Usage: check_warnings.sh NXMEM NULL_STATUS_PLUGIN TESTPLUGIN WORKDIR
#   NULL_STATUS_PLUGIN: the C example (minor 0) storing through a NULL status, which E10 (1.2,
#   2026-12-01) forbids: a warning for a plugin of minor 0, so it conforms.
#   TESTPLUGIN: its unmasked-flags mechanism breaks C7 (1.2, 2026-11-30) and opens cpu:-1 (Q16,
#   2026-12-01): it fails by today's rules and conforms, warned, by those of 1.1 (2026-11-29).
set -u
tool=$1
warned=$2
testplugin=$3
work=$4
fail() { echo "check_warnings: $*" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: cannot check the JSON" >&2; exit 77; }

text=$("$tool" conform "$warned") || fail "a plugin with only a warning must conform (exit 0)"
printf '%s\n' "$text"
printf '%s\n' "$text" | grep -q '^    WARN  boundary.null_status .*rule E10 entered in 1.2 (2026-12-01), after minor 0.*; rule E10)$' ||
    fail "no WARN line for boundary.null_status naming E10 and why it does not fail"
printf '%s\n' "$text" | grep -q '1 warned (not failing) -- conforms$' || fail "the summary does not count the warning"

"$tool" conform --json "$warned" > "$work/warnings.json" || fail "--json: exit status $?"
python3 - "$work/warnings.json" <<'PY' || fail "the JSON does not carry the warning"
import json, sys
plugin = json.load(open(sys.argv[1]))[0]
mechanism = plugin["mechanisms"][0]
check = next(c for c in mechanism["checks"] if c["id"] == "boundary.null_status")
assert plugin["conforms"] and mechanism["conforms"], "conforms"
assert mechanism["warned"] == 1 and mechanism["failed"] == 0, mechanism
assert check["outcome"] == "warn" and check["rules"] == "E10" and "not failing" in check["actual"], check
PY

"$tool" conform --junit "$work/warnings.xml" "$warned" > /dev/null || fail "--junit: exit status $?"
grep -q 'failures="0"' "$work/warnings.xml" || fail "JUnit counts the warning as a failure"
grep -q '<system-out>WARN (rule E10): expected ' "$work/warnings.xml" || fail "JUnit does not carry the warning"

if "$tool" conform --mechanism unmasked-flags "$testplugin" > "$work/today.txt"; then
    fail "unmasked-flags conforms by today's rules"
fi
grep -q '^    FAIL  tables.flags_within_minor ' "$work/today.txt" || fail "unmasked-flags does not fail C7 today"
"$tool" conform --rules 1.1 --mechanism unmasked-flags "$testplugin" > "$work/old.txt" ||
    { cat "$work/old.txt"; fail "unmasked-flags does not conform by the rules of 1.1"; }
grep -q '^    WARN  tables.flags_within_minor .*after the rule set judged by (1.1 (2026-11-29)).*; rule C7)$' "$work/old.txt" ||
    fail "--rules 1.1 does not warn of C7"
if "$tool" conform --rules 1.7 "$testplugin" 2> "$work/usage.txt"; then
    fail "--rules 1.7 is accepted"
fi
grep -q 'no release 1.7; releases: 1.1 (2026-11-29)' "$work/usage.txt" || fail "--rules 1.7 does not name the releases"
echo "check_warnings: WARN in text, JSON and JUnit; --rules 1.1 as expected"
