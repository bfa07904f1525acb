#!/usr/bin/env python3
"""Which clang-tidy findings a change is answerable for (scripts/style_check.sh).

Reads clang-tidy's output on stdin, with "clang-tidy: FILE exited RC" lines where a run failed.
- An error anywhere, or a failed run, counts: a changed source that does not compile alone
  (clang-tidy parses each with its own command, so a missing include shows even when the build
  compiled it in a unity batch) or a clang-tidy that could not run.
- A function-size warning counts wherever it is in a changed file outside tests, fuzz and bench
  (adding lines inside a long function makes it long, and the warning sits on its first line),
  unless the allowlist names "FILE FUNCTION". Tests may hold long tables.
- Every other warning counts when it or one of its notes is on a line the change added or modified
  (git diff -U0 BASE): a new std::move before an old use is the change's; code older than the check
  is not blamed on whoever touches its file.
Prints one line per finding, "FILE:LINE: message [check]", and exits 1 when there is any.

    clang-tidy ... | tidy_findings.py --root ROOT --base BASE --allowlist FILE
"""
import argparse
import re
import subprocess
import sys

DIAGNOSTIC = re.compile(
    r"^(?P<file>/.+?):(?P<line>\d+):\d+: (?P<kind>warning|error): (?P<message>.*) \[(?P<check>[\w.,-]+)\]$")
NOTE = re.compile(r"^(?P<file>/.+?):(?P<line>\d+):\d+: note: ")
FAILED_RUN = re.compile(r"^clang-tidy: (?P<file>\S+) exited (?P<rc>\d+)$")
# An error about the command rather than a place in the source ("error: unknown argument ...").
BARE_ERROR = re.compile(r"^error: (?P<message>.*?)(?: \[(?P<check>[\w.,-]+)\])?$")
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@")
FUNCTION = re.compile(r"function '(?P<name>[^']+)' exceeds")
NO_SIZE_LIMIT = ("tests/", "fuzz/", "bench/")


def changed_lines(root, base):
    """{path relative to root: set of line numbers added or modified since base} (the work tree)."""
    diff = subprocess.run(["git", "-C", root, "diff", "-U0", "--no-color", "--no-ext-diff", "--src-prefix=a/",
                           "--dst-prefix=b/", "--diff-filter=AMR", base],
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
        return file[len(root) + 1:] if file.startswith(root + "/") else file

    findings = set()
    diagnostics = []  # (match, [(path, line) of its notes])
    for row in sys.stdin:
        row = row.rstrip("\n")
        if m := DIAGNOSTIC.match(row):
            diagnostics.append((m, []))
        elif (n := NOTE.match(row)) and diagnostics:
            diagnostics[-1][1].append((relative(n["file"]), int(n["line"])))
        elif b := BARE_ERROR.match(row):
            findings.add(("(command line)", 0, "error: " + b["message"], b["check"] or "clang-tidy"))
        elif f := FAILED_RUN.match(row):
            findings.add((f["file"], 0, f"clang-tidy exited {f['rc']} (an error listed here, or clang-tidy could not run)", "clang-tidy"))
    for m, notes in diagnostics:
        path, line = relative(m["file"]), int(m["line"])
        if m["kind"] == "error":
            findings.add((path, line, "error: " + m["message"], m["check"]))
        elif "readability-function-size" in m["check"]:
            name = FUNCTION.search(m["message"])
            if path in changed and not path.startswith(NO_SIZE_LIMIT) and \
                    not (name and f"{path} {name['name']}" in allowed):
                findings.add((path, line, m["message"], m["check"]))
        elif any(at in changed.get(p, ()) for p, at in [(path, line)] + notes):
            findings.add((path, line, m["message"], m["check"]))
    for path, line, message, check in sorted(findings):
        print(f"{path}:{line}: {message} [{check}]")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
