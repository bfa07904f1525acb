#!/usr/bin/env python3
"""The module graph of SlideDP, read from the sources' #include lines.

A module is a top-level folder that holds code (common/, card/, model/, ...); a module's command-line
tool (its cli/ folder, e.g. model/cli/ for slidedp-predict) is a node of its own, above every
library. Module A depends on module B when a file under A includes "B/...". Prints the graph (each
module with the modules it includes, in dependency order) as Markdown or JSON; --check exits 1 when
two modules include each other, directly or through others, naming one include that closes each
cycle. tests/, bench/ and fuzz/ sit on top: they may include any library, and no library includes
them (bench/ reuses test helpers).

  scripts/module_graph.py [--root DIR] [--json] [--check]
"""
import argparse
import json
import re
import sys
from pathlib import Path

SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh"}
INCLUDE_PATH = re.compile(r'^\s*#\s*include\s+"([^"]+/[^"]+)"', re.MULTILINE)
SKIPPED_DIRS = {"build", "results", "docs", "scripts", "cmake", ".git", "third_party"}


def module_folders(root: Path):
    """Top-level folders with at least one C++ or CUDA source (but build and data folders), and the
    cli/ folders of those that have a tool."""
    folders = []
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.name in SKIPPED_DIRS or path.name.startswith((".", "build")):
            continue
        if any(f.suffix in SOURCE_SUFFIXES for f in path.rglob("*")):
            folders.append(path.name)
            if path.name != "cli" and (path / "cli").is_dir():
                folders.append(f"{path.name}/cli")
    return folders


def module_of(path: str, modules):
    """The module a repository-relative path belongs to: its tool folder if it has one, else its
    top-level folder (None outside every module)."""
    parts = path.split("/")
    if len(parts) > 2 and f"{parts[0]}/{parts[1]}" in modules:
        return f"{parts[0]}/{parts[1]}"
    return parts[0] if parts[0] in modules else None


def include_edges(root: Path, modules):
    """{(from, to): [file that includes to/..., ...]} for every include between two modules."""
    edges = {}
    for top in sorted({m.split("/")[0] for m in modules}):
        for source in sorted((root / top).rglob("*")):
            if source.suffix not in SOURCE_SUFFIXES:
                continue
            relative = str(source.relative_to(root))
            module = module_of(relative, modules)
            text = source.read_text(encoding="utf-8", errors="replace")
            for included in INCLUDE_PATH.findall(text):
                target = module_of(included, modules)
                if target is not None and target != module:
                    edges.setdefault((module, target), []).append(f"{relative} includes {included}")
    return edges


def depends_on(modules, edges):
    """{module: the sorted modules it includes}."""
    return {m: sorted({b for (a, b) in edges if a == m}) for m in modules}


def strongly_connected(modules, edges):
    """Tarjan's strongly connected components: a component of two or more modules is a cycle."""
    successors = depends_on(modules, edges)
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in successors[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            components.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return [c for c in components if len(c) > 1]


def dependency_order(modules, edges):
    """The modules, each after every module it includes (the lowest first)."""
    depends = {m: set(d) for m, d in depends_on(modules, edges).items()}
    order, placed = [], set()
    while len(order) < len(modules):
        ready = [m for m in modules if m not in placed and depends[m] <= placed]
        if not ready:  # a cycle: place the rest as they come so the listing still prints
            ready = [m for m in modules if m not in placed]
        order.extend(ready)
        placed.update(ready)
    return order


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="the repository's root")
    parser.add_argument("--json", action="store_true", help="print the graph as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 if the modules' includes form a cycle")
    args = parser.parse_args()
    root = Path(args.root)
    modules = module_folders(root)
    edges = include_edges(root, modules)
    cycles = strongly_connected(modules, edges)
    order = dependency_order(modules, edges)
    deps = depends_on(modules, edges)
    if args.json:
        print(json.dumps({"modules": order,
                          "depends_on": {m: deps[m] for m in order},
                          "cycles": cycles}, indent=2))
    elif not args.check:
        print("| module | includes |\n|---|---|")
        for m in order:
            print(f"| `{m}/` | {', '.join(f'`{b}/`' for b in deps[m]) or '-'} |")
    for cycle in cycles:
        members = set(cycle)
        print(f"module_graph: the modules {', '.join(cycle)} include each other:", file=sys.stderr)
        for (a, b), files in sorted(edges.items()):
            if a in members and b in members:
                print(f"  {a} -> {b}: {files[0]}" + (f" (and {len(files) - 1} more)" if len(files) > 1 else ""),
                      file=sys.stderr)
    return 1 if (args.check and cycles) else 0


if __name__ == "__main__":
    sys.exit(main())
