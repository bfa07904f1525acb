#!/usr/bin/env python3
"""Which clang-tidy warnings a change is answerable for (scripts/style_check.sh).

Reads clang-tidy's output on stdin. A function-size warning counts wherever it is in a changed file
(adding lines inside a long function makes it long, and the warning sits on its first line), unless
the allowlist names "FILE FUNCTION". Every other warning counts when it or one of its notes is on a
line the change added or modified (git diff -U0 BASE): a new std::move before an old use is the
change's; code older than the check is not blamed on whoever touches its file. An error anywhere
means a changed source does not compile alone (clang-tidy parses each with its own command, so a
missing include shows even when the build compiled it in a unity batch): it always counts.
Prints one line per finding, "FILE:LINE: message [check]", and exits 1 when there is any.

    clang-tidy ... | tidy_findings.py --root ROOT --base BASE --allowlist FILE
"""
import argparse
import re
import subprocess
import sys

WARNING = re.compile(
    r"^(?P<file>/[^:]+):(?P<line>\d+):\d+: (?P<kind>warning|error): (?P<message>.*) \[(?P<check>[\w.,-]+)\]$")
NOTE = re.compile(r"^(?P<file>/[^:]+):(?P<line>\d+):\d+: note: ")
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@")
FUNCTION = re.compile(r"function '(?P<name>[^']+)' exceeds")


def changed_lines(root, base):
    """{path relative to root: set of line numbers added or modified since base} (the work tree)."""
    diff = subprocess.run(["git", "-C", root, "diff", "-U0", "--no-color", "--diff-filter=AMR", base],
                          check=True, capture_output=True, text=True).stdout
    lines, current = {}, None
    for row in diff.splitlines():
        if row.startswith("+++ "):
            current = row[6:] if row.startswith("+++ b/") else None
            if current is not None:
                lines.setdefault(current, set())
        elif current is not None and (m := HUNK.match(row)):
            start, count = int(m["start"]), int(m["count"] or 1)
            lines[current].update(range(start, start + count))
    return lines


def main():
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--root", required=True)
    args.add_argument("--base", required=True)
    args.add_argument("--allowlist", required=True)
    a = args.parse_args()
    root = a.root.rstrip("/")
    with open(a.allowlist, encoding="utf-8") as f:
        allowed = {row.strip() for row in f if row.strip() and not row.startswith("#")}
    changed = changed_lines(root, a.base)
    def relative(file):
        return file[len(root) + 1:] if file.startswith(root + "/") else None

    # Each warning with the lines of the notes that follow it.
    warnings = []
    for row in sys.stdin:
        if m := WARNING.match(row.rstrip("\n")):
            warnings.append((m, []))
        elif (n := NOTE.match(row)) and warnings:
            warnings[-1][1].append((relative(n["file"]), int(n["line"])))
    findings = set()
    for m, notes in warnings:
        path, line = relative(m["file"]), int(m["line"])
        if m["kind"] == "error":
            findings.add((path or m["file"], line, "error: " + m["message"], m["check"]))
            continue
        if path not in changed:
            continue
        if "readability-function-size" in m["check"]:
            name = FUNCTION.search(m["message"])
            if name and f"{path} {name['name']}" in allowed:
                continue
        elif not any(line in changed.get(p, ()) for p, line in [(path, line)] + notes):
            continue
        findings.add((path, line, m["message"], m["check"]))
    for path, line, message, check in sorted(findings):
        print(f"{path}:{line}: {message} [{check}]")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
