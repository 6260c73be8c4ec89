#!/bin/sh
# nxmem conform on the test plugin: the segfaulting mechanism is reported as crashed during the
# check and step that were running, at the faulting address; the other mechanisms are still
# reported, the exit status is non-zero, and --junit writes XML that parses. Usage:
#   check_conform_tool.sh NXMEM TESTPLUGIN SCRATCH_DIR [--mechanism NAME]...
# (the options after SCRATCH_DIR go to nxmem conform: the sanitizer builds name the six asserted on)
# Exits 77 (skipped) when python3 is not available to parse the XML.
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: cannot check the XML" >&2; exit 77; }
nxmem=$1
plugin=$2
junit=$3/conform-testplugin.junit.xml
shift 3
rm -f "$junit"
output=$("$nxmem" conform --junit "$junit" "$@" "$plugin")
status=$?
printf '%s\n' "$output"
fail() { echo "check_conform_tool.sh: $*" >&2; exit 1; }
[ "$status" -eq 1 ] || fail "expected exit status 1, got $status"
# The crash names the check, the step and the faulting address (a write on x86-64, where the
# fault's error code says so; an access elsewhere).
printf '%s\n' "$output" |
    grep -Eq '^    CRASH crashed \(SIGSEGV: a(n access| write) at address 0x0\) during check allocation\.basic, step "allocate 64 B at alignment 8"$' ||
    fail "the segfaulting mechanism is not reported as crashed at NULL during allocation.basic, with its step"
for mechanism in eager legacy-1-0 lazy no-misuse-check lying-capabilities segfaulting; do
    printf '%s\n' "$output" | grep -q "^  mechanism $mechanism on cpu:0\$" ||
        fail "mechanism $mechanism is missing from the report"
done
printf '%s\n' "$output" | grep -q '^    eager: .* 0 failed, .* -- conforms$' || fail "eager does not conform"
printf '%s\n' "$output" | grep -q '^    FAIL  misuse.misdescribed ' || fail "no-misuse-check passed misuse.misdescribed"
python3 - "$junit" <<'PY' || fail "the JUnit report is not what was expected"
import sys
import xml.etree.ElementTree as E
root = E.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
suites = {s.get("name").split(":", 1)[1]: s for s in root.findall("testsuite")}
assert "eager" in suites and "segfaulting" in suites, sorted(suites)
eager = suites["eager"]
assert eager.get("failures") == "0", eager.get("failures")
assert len(eager.findall("testcase")) == int(eager.get("tests"))
assert eager.findall("testcase/skipped"), "eager has no skipped (not applicable) checks"
crashed = suites["segfaulting"]
failures = [c.get("name") for c in crashed.findall("testcase") if c.find("failure") is not None]
assert failures == ["allocation.basic"], failures
PY
# --mechanism, repeated, checks exactly those (the gcc build, which ran them all above); a name the
# plugin does not list refuses the run, naming it.
if [ "$#" -eq 0 ]; then
    two=$("$nxmem" conform --mechanism eager --mechanism lazy "$plugin")
    [ "$(printf '%s\n' "$two" | grep -c '^  mechanism ')" -eq 2 ] || fail "--mechanism eager --mechanism lazy did not check exactly two"
    unknown=$("$nxmem" conform --mechanism eager --mechanism no-such-mechanism "$plugin")
    [ "$?" -eq 1 ] || fail "an unknown --mechanism did not fail the run"
    printf '%s\n' "$unknown" | grep -q "no mechanism called 'no-such-mechanism'" || fail "the refusal does not name the unknown mechanism"
fi
exit 0
