#!/usr/bin/env python3
"""Writes the code block that follows `<!-- readme-example: NAME ...-->` in README.md to OUTPUT,
so the README's examples are compiled and run as they are printed (an engine author copies them).
Usage: extract_readme_example.py README NAME OUTPUT"""
import re
import sys


def main() -> int:
    readme, name, output = sys.argv[1:4]
    text = open(readme, encoding="utf-8").read()
    pattern = re.compile(r"<!-- readme-example: " + re.escape(name) + r"\b[^>]*-->\n```[a-z+]*\n(.*?)\n```",
                         re.DOTALL)
    found = pattern.findall(text)
    if len(found) != 1:
        print(f"{readme}: expected one example named '{name}', found {len(found)}", file=sys.stderr)
        return 1
    with open(output, "w", encoding="utf-8") as out:
        out.write(f"// Extracted from {readme} (example '{name}'); edit it there.\n")
        out.write(found[0] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
