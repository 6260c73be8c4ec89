#!/usr/bin/env python3
"""Writes the frozen minor-0 header from the frozen minor-1 header. Run ONCE; its output,
nxmem_memory_abi_1_0.h, is committed and never edited or regenerated afterwards.

    python3 make_minor0_snapshot.py nxmem_memory_abi_1_1.h > nxmem_memory_abi_1_0.h

No header of minor 0 was ever committed, so minor 0 is reconstructed from the annotations of
minor 1: every field annotated `since=1` goes, and with it what exists only for such a field
(its slot typedef, the capability flag marked "(minor 1)" that gates it, the flag's place in
NXMEM_CAP_ALL_V1, the prose naming it); NXMEM_ABI_MINOR becomes 0 and each shortened struct's
@layout size becomes the end of its last remaining field, rounded up to its alignment. Every edit
must apply exactly once, so an input other than the minor-1 header is refused, not half-converted.
"""
import re
import sys

FIELD = re.compile(r"^\s*(?P<type>[A-Za-z_][\w ]*?)\s*\*?\s*(?P<name>\w+);\s*"
                   r"/\* @field (?P=name) offset=(?P<offset>\d+) size=(?P<size>\d+) since=(?P<since>\d+) \*/")
LAYOUT = re.compile(r"^/\* @layout (?P<name>\w+) size=(?P<size>\d+) align=(?P<align>\d+) since=\d+ \*/$")


def once(text, old, new, why):
    if text.count(old) != 1:
        sys.exit(f"make_minor0_snapshot: expected exactly one {why!r} ({old!r}); is the input the minor-1 header?")
    return text.replace(old, new)


def main(path):
    lines = open(path, encoding="utf-8").read().split("\n")

    # Fields of minor 1, the slot types only they use, and the structs they shorten.
    kept, dropped_types, shortened, struct = [], set(), {}, None
    for line in lines:
        layout = LAYOUT.match(line)
        if layout:
            struct = layout
        field = FIELD.match(line)
        if field and field["since"] == "1":
            dropped_types.add(field["type"])
            shortened[struct["name"]] = struct
            continue
        if line.strip() == "/* ---- minor 1 ---- */":
            continue
        kept.append(line)
    if not dropped_types:
        sys.exit("make_minor0_snapshot: no field is annotated since=1")
    text = "\n".join(kept)

    for slot_type in sorted(dropped_types):
        typedef = re.compile(r"typedef [^;]*\(\*" + slot_type + r"\)\([^;]*\);\n")
        text, count = typedef.subn("", text)
        if count != 1:
            sys.exit(f"make_minor0_snapshot: expected one typedef of {slot_type}")

    # Each struct a minor-1 field shortened: its size is now the end of its last field, aligned.
    for name, layout in shortened.items():
        body = text[text.index(layout.group(0)):]
        body = body[:body.index("};")]
        ends = [int(m["offset"]) + int(m["size"]) for m in map(FIELD.match, body.split("\n")) if m]
        align = int(layout["align"])
        size = (max(ends) + align - 1) // align * align
        text = once(text, layout.group(0), layout.group(0).replace(f"size={layout['size']}", f"size={size}"),
                    f"@layout of {name}")

    # The capability flag that gates the minor-1 slot, and its place in NXMEM_CAP_ALL_V1.
    text = once(text, "/* `release_allocation` slot (minor 1): a release that reports a structured outcome. */\n"
                      "#define NXMEM_CAP_STRUCTURED_RELEASE (1ull << 3)\n", "", "minor-1 flag")
    text = once(text, "     NXMEM_CAP_STRUCTURED_RELEASE | NXMEM_CAP_HOST_RECLAIM)",
                "     NXMEM_CAP_HOST_RECLAIM)", "flag in NXMEM_CAP_ALL_V1")
    text = once(text, " *   release_allocation (minor 1)        NXMEM_CAP_STRUCTURED_RELEASE\n", "",
                "slot list entry")
    text = once(text, " * release_allocation: releases and reports an NxmemReleaseOutcome. On FAILED nothing changed. */",
                " */", "slot description")
    text = once(text, "`deallocate`, `release_allocation` or a retired", "`deallocate` or a retired",
                "ownership prose")

    # The version this header describes.
    text = once(text, "#define NXMEM_ABI_MINOR 1u", "#define NXMEM_ABI_MINOR 0u", "NXMEM_ABI_MINOR")
    text = once(text, "/* The minor this header describes. Minor 1 appends exactly one slot, release_allocation. */",
                "/* The minor this header describes. */", "minor comment")
    text = once(text, " * nxmem_memory_abi.h: the nxmem memory plugin contract, ABI major 1, minors 0 and 1.\n",
                " * nxmem_memory_abi.h: the nxmem memory plugin contract, ABI major 1, minor 0.\n"
                " *\n"
                " * FROZEN SNAPSHOT of minor 0, generated once from the minor-1 header by\n"
                " * test/abi/snapshots/make_minor0_snapshot.py. Never edit it.\n",
                "title")
    sys.stdout.write(text)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_minor0_snapshot.py nxmem_memory_abi_1_1.h > nxmem_memory_abi_1_0.h")
    main(sys.argv[1])
