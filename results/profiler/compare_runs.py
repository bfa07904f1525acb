#!/usr/bin/env python3
"""Compares two `slidedp-profile --json` outputs of the same machine: for every measured case, is the
second run's median inside the first run's [min, max] over its repetitions, and how far apart are the
written profile values. Usage: compare_runs.py first.json second.json [--markdown]"""
import json
import sys


def key(m):
    p = {k: v for k, v in m["params"].items()}
    return (m["stage"], m["name"], json.dumps(p, sort_keys=True))


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, path + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[path] = float(v)
    return out


def main():
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    md = "--markdown" in sys.argv
    mb = {key(m): m for m in b["measurements"]}
    by_stage = {}
    for m in a["measurements"]:
        o = mb.get(key(m))
        if o is None:
            continue
        inside = m["min"] <= o["median"] <= m["max"]
        rel = abs(o["median"] - m["median"]) / m["median"] if m["median"] else 0.0
        s = by_stage.setdefault(m["stage"], [0, 0, []])
        s[0] += 1
        s[1] += inside
        s[2].append(rel)
    rows = []
    for stage, (n, inside, rels) in by_stage.items():
        rels.sort()
        rows.append((stage, n, inside, rels[len(rels) // 2], rels[-1]))
    ha, hb = flat(a["hardware"]), flat(b["hardware"])
    prof = []
    for k in sorted(ha):
        if k in hb and ha[k] and not k.startswith("unit_times"):
            prof.append((k, ha[k], hb[k], (hb[k] - ha[k]) / ha[k]))
    if md:
        print("| stage | cases | re-run median inside first run's [min, max] | median difference | max difference |")
        print("|---|---|---|---|---|")
        for st, n, inside, med, mx in rows:
            print(f"| {st} | {n} | {inside} ({100 * inside / n:.0f}%) | {100 * med:.1f}% | {100 * mx:.1f}% |")
        print()
        print("| profile value | first | second | difference |")
        print("|---|---|---|---|")
        for k, x, y, d in prof:
            print(f"| {k} | {x:.4g} | {y:.4g} | {100 * d:+.1f}% |")
    else:
        for r in rows:
            print(*r)
        for p in prof:
            print(*p)


if __name__ == "__main__":
    main()
