#!/usr/bin/env bash
# The abidiff gate: compares the ABI of freshly built binaries with the committed baseline, or
# rewrites the baseline.
#
# Usage:
#   abi_gate.sh check  BASELINE_DIR SCRATCH_DIR SUPPRESSION_DIR NAME=BINARY[:entry-points]...
#   abi_gate.sh update BASELINE_DIR SCRATCH_DIR SUPPRESSION_DIR NAME=BINARY[:entry-points]...
#   abi_gate.sh skip   REASON
# Each BINARY is read with abidw into SCRATCH_DIR/NAME.abi.xml; a binary marked :entry-points is
# restricted to the three plugin entry points (SUPPRESSION_DIR/entry_points.suppr, and
# SUPPRESSION_DIR/drop_variables.suppr for abidw only). `check` runs abidiff of
# BASELINE_DIR/NAME.abi.xml against it and fails on ANY non-zero abidiff status: an error (bit 1),
# a usage error (bit 2), any ABI change (bit 4), an incompatible change (bit 8). Harmless changes
# (an added enumerator, i.e. a new constant of the header) count too (--harmless), and so do added
# functions (a new type of the header). `update` writes the files into BASELINE_DIR instead.
# After a clean comparison, `check` also runs a negative control: the same abidiff, with the same
# options, against a copy of the fresh XML in which NxmemAllocation is twice as large must fail;
# otherwise an option or a suppression has made the gate blind, and that is a failure too.
# `skip` prints why the gate cannot run in this build and exits 77 (a Meson skip).
set -euo pipefail

regenerate_command="scripts/abi-baseline"

mode=${1:-}
if [[ "$mode" == skip ]]; then
  echo "abi gate skipped: ${2:-no reason given}"
  exit 77
fi
if [[ "$mode" != check && "$mode" != update ]] || (($# < 5)); then
  echo "usage: abi_gate.sh check|update BASELINE_DIR SCRATCH_DIR SUPPRESSION_DIR NAME=BINARY[:entry-points]..." >&2
  echo "       abi_gate.sh skip REASON" >&2
  exit 2
fi
baseline_dir=$2 scratch_dir=$3 suppression_dir=$4
shift 4

for tool in abidw abidiff; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "abi gate skipped: $tool not found; install the Debian package abigail-tools" \
         "(scripts/test and $regenerate_command install it)"
    exit 77
  fi
done

# Pinned so the XML depends on the binary's types alone: no paths, no source locations, no
# DT_NEEDED, no undefined symbols, type ids derived from the types (stable across rebuilds).
abidw_options=(--no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed
               --drop-undefined-syms --type-id-style hash --exported-interfaces-only)
abidiff_options=(--harmless --no-default-suppression)

mkdir -p "$scratch_dir"
failed=0
for spec in "$@"; do
  name=${spec%%=*}
  binary=${spec#*=}
  restrict=() drop_variables=()
  if [[ "$binary" == *:entry-points ]]; then
    binary=${binary%:entry-points}
    restrict=(--suppressions "$suppression_dir/entry_points.suppr")
    drop_variables=(--suppressions "$suppression_dir/drop_variables.suppr")
  fi
  fresh="$scratch_dir/$name.abi.xml"
  baseline="$baseline_dir/$name.abi.xml"
  if [[ ! -f "$binary" ]]; then
    echo "abi gate: $name: $binary does not exist (build it first)" >&2
    failed=1
    continue
  fi
  abidw "${abidw_options[@]}" "${restrict[@]}" "${drop_variables[@]}" --out-file "$fresh" "$binary"
  # Without debug info abidw still succeeds but records symbols only: refuse that loudly.
  if ! grep -q '<function-decl' "$fresh"; then
    echo "abi gate: $name: $binary has no DWARF debug info for its exports; it must be built with -g" >&2
    failed=1
    continue
  fi

  if [[ "$mode" == update ]]; then
    cp "$fresh" "$baseline"
    echo "abi gate: wrote $baseline"
    continue
  fi

  if [[ ! -f "$baseline" ]]; then
    echo "abi gate: $name: no baseline $baseline; create it with $regenerate_command" >&2
    failed=1
    continue
  fi
  status=0
  abidiff "${abidiff_options[@]}" "${restrict[@]}" "$baseline" "$fresh" >"$scratch_dir/$name.abidiff.txt" 2>&1 ||
    status=$?
  if ((status == 0)); then
    # The negative control: a struct every baseline reaches, grown, must be seen.
    mutated="$scratch_dir/$name.negative-control.abi.xml"
    sed -E "s/(<class-decl name='NxmemAllocation' size-in-bits=')([0-9]+)'/\\1999999'/" "$fresh" >"$mutated"
    control=0
    if cmp -s "$fresh" "$mutated"; then
      echo "abi gate: $name: negative control impossible: $fresh defines no NxmemAllocation" >&2
      failed=1
      continue
    fi
    abidiff "${abidiff_options[@]}" "${restrict[@]}" "$baseline" "$mutated" >/dev/null 2>&1 || control=$?
    if ((control & 4)); then
      echo "abi gate: $name: same ABI as the baseline (and a grown NxmemAllocation is caught)"
    else
      echo "abi gate: $name: BLIND: abidiff exited $control for an XML whose NxmemAllocation grew;" \
           "the options or suppressions of this script hide changes" >&2
      failed=1
    fi
    continue
  fi
  failed=1
  what=()
  ((status & 1)) && what+=("abidiff error")
  ((status & 2)) && what+=("abidiff usage error")
  ((status & 4)) && what+=("ABI change")
  ((status & 8)) && what+=("INCOMPATIBLE ABI change")
  echo "abi gate: $name: abidiff exited $status ($(IFS=,; echo "${what[*]}")) against $baseline:"
  cat "$scratch_dir/$name.abidiff.txt"
  if ((status & 12)); then
    echo "abi gate: if this change is a deliberate new minor (appended fields, slots, types or"
    echo "constants, by the rules of docs/ABI.md), regenerate the baseline with $regenerate_command"
    echo "and commit it; anything else breaks plugins already built."
  fi
done
exit "$failed"
