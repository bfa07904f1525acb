#!/usr/bin/env python3
"""Draws a slidedp-run --trace (Chrome trace JSON) as an SVG timeline: one lane per track (rank and
stream, and the host's CPU update), one bar per span, coloured by category, over a chosen window of
steps. Standard library only.

  python3 scripts/trace_svg.py TRACE.json OUT.svg [--steps 2-3] [--title TEXT]
"""
import argparse
import html
import json
import re

COLORS = {"compute": "#4e79a7", "h2d": "#59a14f", "d2h": "#f28e2b", "fabric": "#b07aa1",
          "cpu_update": "#e15759", "offload": "#9c755f"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--steps", default="", help="inclusive range of 1-based steps to draw, e.g. 2-3 (default: all)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    events = json.load(open(a.trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    lo, hi = 1, 10 ** 9
    if a.steps:
        lo, hi = (int(x) for x in a.steps.split("-"))
    spans = []
    for e in events:
        if e.get("ph") != "X":
            continue
        m = re.search(r"\(step (\d+)\)", e.get("name", ""))
        if m and not lo <= int(m.group(1)) <= hi:
            continue
        track = names.get((e["pid"], e["tid"]), f"{e['pid']}/{e['tid']}")
        spans.append((track, e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e.get("cat", ""), e.get("name", "")))
    if not spans:
        raise SystemExit(f"{a.trace}: no spans in steps {lo}-{hi}")
    # From the window's first GPU compute: the drivers enqueue the next steps' token copies early, and
    # drawing from those would leave most of the picture empty.
    compute = [s[1] for s in spans if s[3] == "compute"]
    t0 = min(compute) if compute else min(s[1] for s in spans)
    spans = [(t, max(s, t0), e, c, n) for t, s, e, c, n in spans if e > t0]
    t1 = max(s[2] for s in spans)
    tracks = sorted({s[0] for s in spans}, key=lambda t: (t.startswith("host"), t))
    lane_h, left, width, top = 18, 150, 1000, 30
    height = top + lane_h * len(tracks) + 40
    scale = width / (t1 - t0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16" font-size="13">{html.escape(a.title)}</text>']
    for i, t in enumerate(tracks):
        y = top + i * lane_h
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{html.escape(t)}</text>')
        out.append(f'<line x1="{left}" x2="{left + width}" y1="{y + lane_h - 1}" y2="{y + lane_h - 1}" stroke="#eee"/>')
    for track, s, e, cat, name in spans:
        y = top + tracks.index(track) * lane_h
        x = left + (s - t0) * scale
        w = max(0.5, (e - s) * scale)
        color = COLORS.get(cat, "#bab0ac")
        out.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{lane_h - 5}" fill="{color}">'
                   f'<title>{html.escape(name)} {1e3 * (e - s):.2f} ms</title></rect>')
    axis_y = top + lane_h * len(tracks) + 14
    for k in range(6):
        x = left + width * k / 5
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle">{1e3 * (t1 - t0) * k / 5:.0f} ms</text>')
    lx = left
    for cat, color in COLORS.items():
        out.append(f'<rect x="{lx}" y="{axis_y + 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{axis_y + 17}">{cat}</text>')
        lx += 95
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
