#!/usr/bin/env python3
"""Which clang-tidy warnings a change is answerable for (scripts/style_check.sh).

Reads clang-tidy's output on stdin. A function-size warning counts wherever it is in a changed file
(adding lines inside a long function makes it long, and the warning sits on its first line), unless
the allowlist names "FILE FUNCTION". Every other warning counts only on a line the change added or
modified (git diff -U0 BASE), so code older than the check is not blamed on whoever touches its file.
Prints one line per finding, "FILE:LINE: message [check]", and exits 1 when there is any.

    clang-tidy ... | tidy_findings.py --root ROOT --base BASE --allowlist FILE
"""
import argparse
import re
import subprocess
import sys

WARNING = re.compile(r"^(?P<file>/[^:]+):(?P<line>\d+):\d+: warning: (?P<message>.*) \[(?P<check>[\w.,-]+)\]$")
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
    findings = set()
    for row in sys.stdin:
        m = WARNING.match(row.rstrip("\n"))
        if not m or not m["file"].startswith(root + "/"):
            continue
        path, line = m["file"][len(root) + 1:], int(m["line"])
        if path not in changed:
            continue
        if "readability-function-size" in m["check"]:
            name = FUNCTION.search(m["message"])
            if name and f"{path} {name['name']}" in allowed:
                continue
        elif line not in changed[path]:
            continue
        findings.add((path, line, m["message"], m["check"]))
    for path, line, message, check in sorted(findings):
        print(f"{path}:{line}: {message} [{check}]")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
