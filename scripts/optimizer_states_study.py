#!/usr/bin/env python3
"""Loss parity of AdamW's moment formats (issue: fewer host bytes per parameter, item 3).

Trains the same model on the same real text with fp32 moments, with bf16 moments (stochastic
rounding) and with 8-bit blockwise moments, everything else equal (the split master in all), and writes
into OUT:
  runs.csv       step, format, training loss, learning rate
  evals.csv      step, format, held-out loss
  summary.json   per format: mean and worst relative gap of the training loss to fp32's over the last
                 20% of the steps, the final held-out loss; the commands, git revision, machine, date
  loss.svg       the training-loss curves (and the held-out points)

The text is Debian's license texts (/usr/share/common-licenses, present on every Debian system),
byte-tokenized; 10% of the files are held out. Usage:
  /usr/bin/python3 scripts/optimizer_states_study.py --build build --out results/optimizer-states
"""
import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

MODEL = """name: study-3m
model_type: llama
hidden_size: 256
num_hidden_layers: 4
num_attention_heads: 4
num_key_value_heads: 2
intermediate_size: 768
vocab_size: 256
max_position_embeddings: 4096
tie_word_embeddings: false
"""


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="results/optimizer-states")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--formats", default="fp32,bf16,8bit")
    ap.add_argument("--merge", default="", help="an earlier OUT whose other formats' runs join these")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="slidedp_states_")  # the token files and the card; removed at the end
    card = os.path.join(work, "model.yaml")
    with open(card, "w") as f:
        f.write(MODEL)
    texts = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p))
    train, held = os.path.join(work, "train.bin"), os.path.join(work, "eval.bin")
    data_cmd = [os.path.join(args.build, "bin/slidedp-data"), "build", *texts, "--out", train,
                "--eval-fraction", "0.1", "--eval-out", held, "--split-seed", "1"]
    run(data_cmd)
    commands = {"data": " ".join(data_cmd)}
    runs, evals, summary = [], [], {}
    for fmt in args.formats.split(","):
        cmd = [os.path.join(args.build, "bin/slidedp-run"), "--model", card, "--data", train, "--eval-data", held,
               "--eval-every", str(max(1, args.steps // 10)), "--seq", "256", "--ranks", "2", "--micro-batch", "4",
               "--steps", str(args.steps), "--lr", "1e-3", "--schedule", "cosine", "--warmup", str(args.steps // 20),
               "--optimizer-states", fmt, "--no-db", "--json"]
        commands[fmt] = " ".join(cmd)
        j = json.loads(run(cmd))
        for s in j["steps"]:
            runs.append((s["step"], fmt, s["loss"], s.get("lr", "")))
        for e in j.get("evals", []):
            evals.append((e["step"], fmt, e["loss"]))
        summary[fmt] = {"final_eval_loss": j["evals"][-1]["loss"] if j.get("evals") else None,
                        "host_state_bytes": j.get("host_state_bytes")}
    by = {}
    for step, fmt, loss, _ in runs:
        by.setdefault(fmt, {})[step] = loss
    if args.merge:  # the formats run before, from the OUT of an earlier run (same data and commands)
        with open(os.path.join(args.merge, "runs.csv")) as f:
            for line in f.read().splitlines()[1:]:
                step, fmt, loss, lr = line.split(",")
                if fmt not in by:
                    runs.append((int(step), fmt, float(loss), lr))
        with open(os.path.join(args.merge, "evals.csv")) as f:
            for line in f.read().splitlines()[1:]:
                step, fmt, loss = line.split(",")
                if fmt not in by:
                    evals.append((int(step), fmt, float(loss)))
        with open(os.path.join(args.merge, "summary.json")) as f:
            earlier = json.load(f)
        for fmt, v in earlier.items():
            if fmt != "provenance" and fmt not in by:
                summary[fmt] = {k: v[k] for k in ("final_eval_loss", "host_state_bytes") if k in v}
                summary[fmt]["from"] = earlier.get("provenance", {}).get("git", "?")
        by = {}
        for step, fmt, loss, _ in runs:
            by.setdefault(fmt, {})[step] = loss
    steps = sorted(by["fp32"])
    tail = steps[int(0.8 * len(steps)):]
    for fmt in by:
        gaps = [abs(by[fmt][s] - by["fp32"][s]) / by["fp32"][s] for s in tail]
        summary[fmt]["tail_mean_rel_gap"] = sum(gaps) / len(gaps)
        summary[fmt]["tail_worst_rel_gap"] = max(gaps)
        summary[fmt]["tail_mean_loss"] = sum(by[fmt][s] for s in tail) / len(tail)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary["provenance"] = {"git": rev, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "machine": platform.node(), "cpu": platform.processor() or platform.machine(),
                             "commands": commands, "texts": texts}
    with open(os.path.join(args.out, "runs.csv"), "w") as f:
        f.write("step,format,loss,lr\n")
        for r in runs:
            f.write(",".join(str(x) for x in r) + "\n")
    with open(os.path.join(args.out, "evals.csv"), "w") as f:
        f.write("step,format,eval_loss\n")
        for r in evals:
            f.write(",".join(str(x) for x in r) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    write_svg(os.path.join(args.out, "loss.svg"), by, evals)
    shutil.rmtree(work)
    json.dump({k: v for k, v in summary.items() if k != "provenance"}, sys.stdout, indent=2)
    print()


def write_svg(path, by, evals):
    colors = {"fp32": "#1f77b4", "bf16": "#d62728", "8bit": "#2ca02c"}
    W, H, L, B = 720, 400, 60, 40
    steps = [s for f in by for s in by[f]]
    losses = [l for f in by for l in by[f].values()] + [e[2] for e in evals]
    x0, x1, y0, y1 = min(steps), max(steps), min(losses), max(losses)
    X = lambda s: L + (s - x0) / max(1, x1 - x0) * (W - L - 20)
    Y = lambda v: H - B - (v - y0) / max(1e-9, y1 - y0) * (H - B - 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">optimizer step</text>',
           f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">training loss (nats/token)</text>']
    for v in (y0, (y0 + y1) / 2, y1):
        out.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for s in (x0, (x0 + x1) // 2, x1):
        out.append(f'<text x="{X(s):.1f}" y="{H - B + 16}" text-anchor="middle">{s}</text>')
    for i, fmt in enumerate(by):
        pts = " ".join(f"{X(s):.1f},{Y(by[fmt][s]):.1f}" for s in sorted(by[fmt]))
        out.append(f'<polyline fill="none" stroke="{colors.get(fmt, "gray")}" stroke-width="1" points="{pts}"/>')
        out.append(f'<text x="{W - 150}" y="{30 + 16 * i}" fill="{colors.get(fmt, "gray")}">{fmt} moments</text>')
    for step, fmt, loss in evals:
        out.append(f'<circle cx="{X(step):.1f}" cy="{Y(loss):.1f}" r="3" fill="{colors.get(fmt, "gray")}"/>')
    out.append(f'<text x="{W - 150}" y="{30 + 16 * len(by)}">dots: held-out loss</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
