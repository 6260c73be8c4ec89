#!/bin/sh
# A plugin of the corpus (test/conform/corpus/README.md) under today's nxmem conform: it conforms,
# or fails exactly the checks of the real slips it is known for (a space-separated list, possibly
# empty), every other check passing, warning or not applicable.
# Usage: check_corpus.sh NXMEM PLUGIN "KNOWN_FAILURES"
set -u
tool=$1
plugin=$2
known=$3
report=$("$tool" conform "$plugin")
status=$?
printf '%s\n' "$report"
failed=$(printf '%s\n' "$report" | sed -n 's/^    FAIL  \([a-z_.]*\) .*/\1/p' | sort | tr '\n' ' ' | sed 's/ $//')
wanted=$(printf '%s\n' $known | sort | tr '\n' ' ' | sed 's/ $//')
if printf '%s\n' "$report" | grep -q '^    \(CRASH\|TIMEOUT\) '; then
    echo "check_corpus: the plugin crashed or timed out" >&2
    exit 1
fi
if [ "$failed" != "$wanted" ]; then
    echo "check_corpus: failed checks [$failed], expected exactly [$wanted]" >&2
    exit 1
fi
if [ -z "$wanted" ] && [ "$status" -ne 0 ]; then
    echo "check_corpus: exit status $status for a plugin that conforms" >&2
    exit 1
fi
echo "check_corpus: as expected (failed: [${failed}])"
