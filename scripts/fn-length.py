#!/usr/bin/env python3
"""Fails when a production function of the relay's data path is longer than
100 lines (issue #31: a function that long hides its steps; split it into
named ones). Tests (`#[cfg(test)]` modules and everything after them in a
file) are not counted. A function ends at the first line that closes its
indentation with `}`, as rustfmt writes it.

    python3 scripts/fn-length.py [--max N] [DIR ...]   (default: crates/splitway-relay/src)
"""
import os
import re
import sys

FN = re.compile(r"^(\s*)(pub(\([a-z:]+\))? )?(async )?(unsafe )?fn (\w+)")


def long_functions(root, limit):
    found = []
    for base, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(base, name)
            lines = open(path, encoding="utf-8").read().split("\n")
            for i, line in enumerate(lines):
                if "#[cfg(test)]" in line:
                    break
                m = FN.match(line)
                if not m or line.rstrip().endswith(";"):
                    continue
                close = m.group(1) + "}"
                for j in range(i + 1, len(lines)):
                    if lines[j] == close:
                        if j - i + 1 > limit:
                            found.append((j - i + 1, path, i + 1, m.group(6)))
                        break
    return found


def main():
    args = sys.argv[1:]
    limit = 100
    if args[:1] == ["--max"]:
        limit = int(args[1])
        args = args[2:]
    roots = args or ["crates/splitway-relay/src"]
    found = [f for r in roots for f in long_functions(r, limit)]
    for n, path, line, name in sorted(found, reverse=True):
        print(f"{path}:{line}: fn {name} is {n} lines (at most {limit}): split it into named steps")
    if found:
        sys.exit(1)
    print(f"fn-length: no production function over {limit} lines in {', '.join(roots)}")


if __name__ == "__main__":
    main()
