#!/usr/bin/env python3
"""Test files that must compile alone in a unity build (tests/CMakeLists.txt, CMake calls this
at configure time).

A unity batch is one translation unit: two test files of a folder that both define a function
of the same name at file scope (in an anonymous namespace, say) would meet in it, and where the
signatures differ the second file's calls may silently bind to the first file's overload (seen
2026-12-07: run_config(dir, 7) took another file's run_config(dir, int steps)). Of the files of
a folder that share such a name, every one after the first (in path order) compiles alone.
Other clashes (variables, types, using-directives) fail the build loudly; tests/CMakeLists.txt
lists those by hand.

usage: unity_alone_tests.py TESTS_DIR   (prints AREA/FILE.cpp paths, ';'-separated)
"""
import collections
import pathlib
import re
import sys

# A definition or declaration at column 0 (file scope, as the house style writes them):
# optional specifiers and template header, a return type, the name, '('.
FUNCTION = re.compile(
    r'^(?:(?:static|inline|constexpr|\[\[nodiscard\]\])\s+|template\s*<[^>]*>\s*)*'
    r'[A-Za-z_][\w:<>,\s\*&]*?[\s\*&](\w+)\s*\(', re.M)
NOT_NAMES = {'TEST_CASE', 'TEST_CASE_FIXTURE', 'SUBCASE', 'main', 'if', 'for', 'while',
             'return', 'switch', 'sizeof', 'decltype', 'operator'}


def names_in(path):
    return {m.group(1) for m in FUNCTION.finditer(path.read_text(errors='replace'))} - NOT_NAMES


def main():
    root = pathlib.Path(sys.argv[1])
    alone = []
    for area in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(area.glob('*.cpp'))
        names = {f: names_in(f) for f in files}
        count = collections.Counter(n for ns in names.values() for n in ns)
        taken = set()
        for f in files:
            shared = {n for n in names[f] if count[n] > 1}
            if shared & taken:
                alone.append(f'{area.name}/{f.name}')
            taken |= shared
    print(';'.join(alone), end='')


if __name__ == '__main__':
    main()
