#!/usr/bin/env python3
"""Checks that CTest runs every doctest case exactly once (issue #12).

For each test binary given, the case names the binary defines (--list-test-cases) must be
exactly the --test-case filters of the CTest entries that run it: a case CTest dropped or
mangled (a ';' in its name splits it into filters that match nothing) or a filter naming no
case fails this check, with the names. Run by CTest as test_list_matches_defined_cases.

usage: check_test_list.py --build BUILD_DIR BINARY...
"""
import collections
import json
import subprocess
import sys

BAD_CHARS = ";*?"  # CTest splits on ';', doctest filters treat * and ? as wildcards


def defined_cases(binary):
    out = subprocess.run([binary, "--list-test-cases", "--no-version"], check=True,
                         capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        if not line or line.startswith("[doctest]") or set(line) == {"="}:
            continue
        names.append(line)
    return names


def ctest_filters(build):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    by_binary = collections.defaultdict(list)
    for t in json.loads(out).get("tests", []):
        cmd = t.get("command") or []
        for arg in cmd[1:]:
            if arg.startswith("--test-case="):
                by_binary[cmd[0]].append(arg[len("--test-case="):].replace("\\,", ","))
    return by_binary


def main(argv):
    if len(argv) < 3 or argv[0] != "--build":
        print(__doc__, file=sys.stderr)
        return 2
    build, binaries = argv[1], argv[2:]
    filters = ctest_filters(build)
    problems = []
    total = 0
    for b in binaries:
        names = defined_cases(b)
        total += len(names)
        have = collections.Counter(filters.get(b, []))
        want = collections.Counter(names)
        for n in names:
            if any(c in n for c in BAD_CHARS):
                problems.append(f"{b}: case name {n!r} contains one of {BAD_CHARS!r}")
        for n in sorted((want - have).elements()):
            problems.append(f"{b}: case {n!r} has no CTest entry that runs it")
        for n in sorted((have - want).elements()):
            problems.append(f"{b}: CTest entry --test-case={n!r} names no case of the binary")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"{len(problems)} problem(s); rename the cases (no ';', '*', '?') and re-run cmake",
              file=sys.stderr)
        return 1
    print(f"{total} test cases in {len(binaries)} binaries, each run by exactly one CTest entry")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
