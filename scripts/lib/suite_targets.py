#!/usr/bin/env python3
"""Prints the ninja targets that the Meson tests of one suite need (their executables and
depends), one per line, so a build that runs only that suite compiles only what it runs.
Usage: suite_targets.py BUILD_DIR SUITE"""
import json
import os
import subprocess
import sys


def introspect(build_dir, what):
    out = subprocess.run(["meson", "introspect", build_dir, what], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    build_dir, suite = sys.argv[1], sys.argv[2]
    targets = introspect(build_dir, "--targets")
    files_of = {t["id"]: t["filename"] for t in targets}
    by_file = {f: t["id"] for t in targets for f in t["filename"]}
    wanted = set()
    for test in introspect(build_dir, "--tests"):
        if not any(s == suite or s.endswith(":" + suite) for s in test["suite"]):
            continue
        wanted.update(test["depends"])
        for word in test["cmd"]:
            if word in by_file:
                wanted.add(by_file[word])
    if not wanted:
        sys.exit(f"suite_targets.py: no test of suite '{suite}' in {build_dir}")
    root = os.path.abspath(build_dir)
    for target_id in sorted(wanted):
        for path in files_of[target_id]:
            print(os.path.relpath(path, root))


if __name__ == "__main__":
    main()
