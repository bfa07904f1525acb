#!/usr/bin/env python3
"""A compilation database with one entry per source file, from a build's compile_commands.json.

A unity build (SLIDEDP_UNITY_BUILD) lists its batches (Unity/unity_N_cxx.cxx), not the sources they
include, so clang-tidy would find no command for a changed file and check nothing. Each source a batch
includes gets the batch's command with the batch's path replaced by its own; entries for single files
are kept as they are.

  per_file_compile_commands.py BUILD_DIR OUT_DIR   (writes OUT_DIR/compile_commands.json)
"""
import json
import re
import sys
from pathlib import Path

UNITY_INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def main():
    build, out = Path(sys.argv[1]), Path(sys.argv[2])
    entries = json.loads((build / "compile_commands.json").read_text())
    per_file = []
    for e in entries:
        batch = Path(e["file"])
        if "/Unity/unity_" not in str(batch) or not batch.exists():
            per_file.append(e)
            continue
        for source in UNITY_INCLUDE.findall(batch.read_text()):
            entry = {"directory": e["directory"], "file": source}
            if "command" in e:
                entry["command"] = e["command"].replace(str(batch), source)
            else:  # the "arguments" form of the format
                entry["arguments"] = [source if a == str(batch) else a for a in e["arguments"]]
            per_file.append(entry)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_commands.json").write_text(json.dumps(per_file, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
