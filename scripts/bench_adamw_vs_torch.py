#!/usr/bin/python3
"""SlideDP's CPU AdamW against torch.optim.AdamW (foreach and plain), side by side in one run.

For each size (parameter count) it first runs bench_kernels_optim on that size (triad, AdamW with fp32
gradients and no mirror = the same work as torch, AdamW with bf16 gradients + bf16 mirror = what the
executor runs), then torch.optim.AdamW on the same size, for 1 and all threads, and prints params/s
and the ratio. Interleaving per size keeps both sides under the same machine load.

torch runs in each layout of --torch-layouts: "flat" is one tensor of all the parameters (the same
buffer our kernel sees: a chunk), "4M" splits them into tensors of 4M elements (a typical LLM weight
matrix; 16 MB tensors let torch's many passes per step partly hit the 32 MB L3, which a flat tensor
cannot). Timing: the first step (which allocates torch's optimizer state) is excluded; the median of
--steps steps is reported.

Uses Debian's python3-torch with /usr/bin/python3 (`apt-get install python3-torch`).

  /usr/bin/python3 scripts/bench_adamw_vs_torch.py --bench build/bin/bench_kernels_optim \
      --csv results/kernels/adamw_vs_torch.csv
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def parse_size(text):
    text = text.strip()
    if text.endswith("M"):
        return int(text[:-1]) << 20
    return int(text)


def size_label(n):
    return f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_slidedp(bench, n, threads_list, repetitions):
    """Median seconds per call of our kernels at size n, keyed by (kernel, threads)."""
    label = size_label(n)
    threads_re = "|".join(str(t) for t in threads_list)
    filt = f"^(triad|adamw_fp32grad_nomirror|adamw_bf16grad_mirror)/{label}/threads:({threads_re})(/|$)"
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        cmd = [bench, f"--sizes={label}", f"--benchmark_filter={filt}", f"--benchmark_out={tmp.name}",
               "--benchmark_out_format=json", f"--benchmark_repetitions={repetitions}",
               "--benchmark_report_aggregates_only=true"]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        with open(tmp.name) as f:
            doc = json.load(f)
    result = {"simd": doc.get("context", {}).get("slidedp_simd", "?")}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b["run_name"].split("/")  # kernel/size/threads:T/real_time
        kernel, threads = name[0], int(name[2].split(":")[1])
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
        result[(kernel, threads)] = b["real_time"] * scale
    return result


def run_torch(torch, n, threads, foreach, steps, tensor_numel):
    """Median seconds of one torch.optim.AdamW step over n fp32 parameters."""
    torch.set_num_threads(threads)
    params = []
    left = n
    gen = torch.Generator().manual_seed(0)
    while left > 0:
        k = min(left, tensor_numel)
        p = torch.nn.Parameter(torch.randn(k, generator=gen) * 0.02)
        p.grad = torch.randn(k, generator=gen) * 1e-3
        params.append(p)
        left -= k
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=foreach)
    opt.step()  # allocates exp_avg / exp_avg_sq: not timed
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    del opt, params
    return statistics.median(times)


def run_torch_triad(torch, n, threads, reps=5):
    """GB/s (12 B/element) of torch's a = b + 0.5 c: a cross-check of our triad on the same machine."""
    torch.set_num_threads(threads)
    b = torch.full((n,), 0.01)
    c = torch.full((n,), 1e-4)
    a = torch.zeros(n)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=0.5, out=a)
        times.append(time.perf_counter() - t0)
    del a, b, c
    return n * 12 / statistics.median(times) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bin/bench_kernels_optim")
    ap.add_argument("--sizes", default="16M,64M,256M")
    ap.add_argument("--threads", default="1,all", help="comma list; 'all' = CPUs this process may use")
    ap.add_argument("--steps", type=int, default=3, help="timed torch steps per case (median)")
    ap.add_argument("--repetitions", type=int, default=3, help="bench_kernels_optim repetitions (median)")
    ap.add_argument("--torch-layouts", default="flat,4M",
                    help="comma list: 'flat' (one tensor) or elements per torch parameter tensor, e.g. 4M")
    ap.add_argument("--csv", help="write the table as CSV here")
    args = ap.parse_args()

    import torch  # after argparse so --help works without torch

    all_threads = len(os.sched_getaffinity(0))
    threads_list = []
    for t in args.threads.split(","):
        v = all_threads if t.strip() == "all" else int(t)
        if v not in threads_list:
            threads_list.append(v)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    layouts = [x.strip() for x in args.torch_layouts.split(",")]

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cpu = cpu_model()
    print(f"# {date}  CPU: {cpu} ({all_threads} CPUs)  torch {torch.__version__}  load {os.getloadavg()[0]:.2f}")
    header = ("size", "threads", "layout", "torch_plain", "torch_foreach", "slidedp_fp32", "slidedp_bf16_mirror",
              "x_fp32", "x_bf16_mirror", "triad_GBps", "torch_triad", "adamw_bf16_of_triad")
    print("# params/s in G; x_* = slidedp / best torch variant; adamw_bf16_of_triad = 28 B/param GB/s over triad")
    print("# triad_GBps: bench_kernels_optim's triad; torch_triad: torch.add(b, c, alpha=0.5, out=a), same 12 B")
    fmt_head = "%-6s %7s %6s %12s %13s %12s %19s %7s %13s %10s %11s %19s"
    print(fmt_head % header)
    rows = []
    simd = "?"
    for n in sizes:
        ours = run_slidedp(args.bench, n, threads_list, args.repetitions)
        simd = ours["simd"]
        for t in threads_list:
            fp32 = n / ours[("adamw_fp32grad_nomirror", t)]
            bf16 = n / ours[("adamw_bf16grad_mirror", t)]
            triad_gbps = n * 12 / ours[("triad", t)] / 1e9
            torch_triad = run_torch_triad(torch, n, t)
            for layout in layouts:
                tensor_numel = n if layout == "flat" else parse_size(layout)
                plain = n / run_torch(torch, n, t, False, args.steps, tensor_numel)
                foreach = n / run_torch(torch, n, t, True, args.steps, tensor_numel)
                best_torch = max(plain, foreach)
                row = (size_label(n), t, layout, plain / 1e9, foreach / 1e9, fp32 / 1e9, bf16 / 1e9,
                       fp32 / best_torch, bf16 / best_torch, triad_gbps, torch_triad, bf16 * 28 / 1e9 / triad_gbps)
                rows.append(row)
                print("%-6s %7d %6s %12.4f %13.4f %12.3f %19.3f %7.1f %13.1f %10.1f %11.1f %18.0f%%" %
                      (row[:11] + (100 * row[11],)))
                sys.stdout.flush()
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("date_utc,cpu_model,cpus,torch_version,slidedp_simd,size,threads,torch_layout,"
                    "torch_plain_params_per_s,torch_foreach_params_per_s,slidedp_fp32grad_params_per_s,"
                    "slidedp_bf16grad_mirror_params_per_s,ratio_fp32_vs_best_torch,ratio_bf16_mirror_vs_best_torch,"
                    "triad_gb_per_s,torch_triad_gb_per_s,adamw_bf16_fraction_of_triad\n")
            for r in rows:
                f.write(f'{date},"{cpu}",{all_threads},{torch.__version__},{simd},{r[0]},{r[1]},{r[2]},'
                        f"{r[3] * 1e9:.6g},{r[4] * 1e9:.6g},{r[5] * 1e9:.6g},{r[6] * 1e9:.6g},{r[7]:.4g},"
                        f"{r[8]:.4g},{r[9]:.4g},{r[10]:.4g},{r[11]:.4f}\n")
        print(f"# written to {args.csv}")


if __name__ == "__main__":
    main()
