#!/usr/bin/env python3
"""Checks that README.md names only commands and flags that exist.

Usage: check_readme_commands.py --readme README.md --cohort build/cohort [--root DIR]

What it reads: every backticked span in the first cell of README's tables, and every line
of its ```sh blocks. A span or line that starts with `cohort` (or `build/cohort`) names a
command path: each bare lowercase word after it that `cohort PATH --help` lists as a
subcommand descends into it, and every `--flag` must appear in the --help text of one
command on that path (an option of `ctl` comes before `ctl`'s own subcommand). A span
that does not start with `cohort` but whose first word is a subcommand of the previous
span's parent (`... drain NAME` / `scale N`), or that is only flags (`... --inject SPEC` /
`--resume`), is checked against that command the same way. A span or line that
starts with `tools/` names a script: the file must exist and be executable, and every
`--flag` after it must appear in the script's text (a script's usage is its header).
Exit 0 when everything exists, 1 with one line per missing command or flag.
"""
import argparse
import os
import re
import subprocess
import sys

FLAG = re.compile(r"--[a-z][a-z0-9-]*")
WORD = re.compile(r"^[a-z][a-z0-9_-]*$")


class Cli:
    """`cohort ... --help` texts, asked once per command path."""

    def __init__(self, binary):
        self.binary = binary
        self.cache = {}

    def help(self, path):
        key = tuple(path)
        if key not in self.cache:
            r = subprocess.run([self.binary, *path, "--help"], capture_output=True, text=True,
                               timeout=60)
            self.cache[key] = r.stdout + r.stderr if r.returncode == 0 else None
        return self.cache[key]

    def subcommands(self, path):
        text = self.help(path) or ""
        at = text.lower().find("subcommands:")
        if at < 0:
            return set()
        names = set()
        for line in text[at:].splitlines()[1:]:
            m = re.match(r"^\s+([a-z][a-z0-9_-]*)\b", line)
            if m:
                names.add(m.group(1))
        return names


def takes_argument(help_text, flag):
    """Whether FLAG's line in HELP_TEXT shows a value after it (`--keys DIR ...`)."""
    m = re.search(r"^\s+(?:-\w,)?" + re.escape(flag) + r"( [A-Z]\S*)?", help_text, re.M)
    return bool(m and m.group(1))


def check_cohort(cli, words, start, where, problems):
    """Checks `cohort` WORDS (its arguments) from the command path START; returns the path."""
    path = list(start)
    flags = []
    takes_value = False
    for w in words:
        if w.startswith("--"):
            flags += FLAG.findall(w)
            takes_value = "=" not in w and any(
                takes_argument(cli.help(path[:i]) or "", f)
                for i in range(len(path) + 1)
                for f in FLAG.findall(w)[-1:])
            continue
        if takes_value:
            takes_value = False
            continue
        if WORD.match(w):
            subs = cli.subcommands(path)
            if w in subs:
                path.append(w)
            elif subs:
                problems.append(f"{where}: `cohort {' '.join(path)}` has no subcommand {w}")
                return path
    if cli.help(path) is None:
        problems.append(f"{where}: `cohort {' '.join(path)}` does not exist (--help failed)")
        return path
    helps = [cli.help(path[:i]) or "" for i in range(1, len(path) + 1)]
    for f in flags:
        if not any(re.search(re.escape(f) + r"\b", h) for h in helps):
            problems.append(f"{where}: `cohort {' '.join(path)}` has no option {f}")
    return path


def check_script(root, words, where, problems):
    script = os.path.join(root, words[0])
    if not (os.path.isfile(script) and os.access(script, os.X_OK)):
        problems.append(f"{where}: {words[0]} is not an executable file")
        return
    with open(script, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for w in words[1:]:
        for flag in FLAG.findall(w):
            if flag not in text:
                problems.append(f"{where}: {words[0]} has no option {flag}")


def split_alternatives(words):
    """`cohort bench train --model mlp|gpt` and `[--a \\| --b]`: keep the words, drop bars."""
    return [w.strip("[]()") for w in words if w not in ("|", "\\|", "/")]


def check_line(cli, root, text, where, previous, problems):
    """Checks one command text; returns the command path it named (or PREVIOUS)."""
    words = split_alternatives(text.split())
    if not words:
        return previous
    head = words[0]
    if head in ("cohort", "build/cohort"):
        return check_cohort(cli, words[1:], [], where, problems)
    if head.startswith("tools/"):
        for alt in re.split(r"\s+/\s+", text):
            alt_words = split_alternatives(alt.split())
            if alt_words and alt_words[0].startswith("tools/"):
                check_script(root, alt_words, where, problems)
        return previous
    if previous and head.startswith("--"):
        return check_cohort(cli, words, previous, where, problems)
    if previous and WORD.match(head) and head in cli.subcommands(previous[:-1]):
        return check_cohort(cli, words, previous[:-1], where, problems)
    return previous


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", required=True)
    ap.add_argument("--cohort", required=True)
    ap.add_argument("--root", default=None, help="the repository (default: README's folder)")
    a = ap.parse_args()
    root = a.root or os.path.dirname(os.path.abspath(a.readme))
    cli = Cli(a.cohort)
    problems = []
    checked = 0
    in_sh = False
    with open(a.readme, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        where = f"{a.readme}:{n}"
        if line.startswith("```"):
            in_sh = line.strip() in ("```sh", "```bash")
            continue
        if in_sh:
            for part in re.split(r"\s*&&\s*", line.split("#")[0].strip()):
                if part.startswith(("build/cohort", "tools/")):
                    check_line(cli, root, part, where, None, problems)
                    checked += 1
            continue
        if not line.startswith("| `"):
            continue
        first_cell = line.split(" | ")[0]
        previous = None
        for span in re.findall(r"`([^`]+)`", first_cell):
            previous = check_line(cli, root, span, where, previous, problems)
            checked += 1
    for p in problems:
        print(p)
    print(f"check_readme_commands: {checked} command texts, {len(problems)} problems")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
