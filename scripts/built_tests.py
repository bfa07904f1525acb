#!/usr/bin/python3
"""Prints a ctest -R regex that selects the tests of BUILD whose executables this build made (they exist
under BUILD; script tests, which run an interpreter on tools that may be missing, are left out): the
tests of a build of only some targets (the sanitizer builds of scripts/test.sh). Exit 1 if none.
Usage: scripts/built_tests.py BUILD"""
import json
import os
import re
import subprocess
import sys

build = os.path.realpath(sys.argv[1])
listing = json.loads(subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True,
                                    capture_output=True, text=True).stdout)


def made_here(command):
    exe = os.path.realpath(command[0]) if command else ""
    return exe.startswith(build + os.sep) and os.path.exists(exe)


names = [t["name"] for t in listing.get("tests", []) if made_here(t.get("command"))]
if not names:
    sys.exit(f"{build}: no test executable was built")
print("^(" + "|".join(re.escape(n) for n in names) + ")$")
