#!/usr/bin/env python3
"""The fault matrix: slidedp-run under kill -9, SIGINT, SIGTERM, a full disk and concurrent writers,
each case checked against what the executor promises (docs/EXECUTOR.md, docs/RUN_LOG.md):

  kill -9 at a random moment   the run log passes integrity_check and keeps the run as 'running' under
                               a dead pid (readers say "did not finish"); every published checkpoint has
                               its step row; the newest checkpoint resumes, and the resumed run's saved
                               model is byte-identical to an uninterrupted run's
  kill -9 during --save-model  the model folder is absent or complete, never half-written; the next save
                               to it succeeds and leaves no temporary folder
  SIGINT / SIGTERM             exit 0, the run logged 'interrupted', a checkpoint of the last step, and
                               the resumed model byte-identical to the uninterrupted one
  full disk (tmpfs)            exit 4 naming the checkpoint path, the run logged 'failed' with an error
                               row, every checkpoint written before it intact and resumable
  concurrent writers           N runs on one --db at once all finish, each with all its step rows

Usage: scripts/fault_matrix.py [--bin build/bin] [--trials 6] [--out results/reliability]
The full-disk case mounts a tmpfs, which needs root; without it that case is reported as not run.
Writes OUT/README.md (the matrix and every case's outcome) and OUT/cases.csv.
"""
import argparse
import csv
import datetime
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

STEPS = 12
EVERY = 2


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


class Matrix:
    def __init__(self, bin_dir, work):
        self.bin = os.path.join(bin_dir, "slidedp-run")
        self.work = work
        self.rows = []  # (case, trial, detail, ok, why)
        base = os.path.join(work, "reference")
        os.makedirs(base)
        r = run([self.bin, "--steps", str(STEPS), "-q", "--no-db", "--save-model", os.path.join(base, "model")])
        if r.returncode != 0:
            sys.exit("the reference run failed:\n" + r.stdout)
        self.reference = self.model_bytes(os.path.join(base, "model"))
        started = time.monotonic()
        run([self.bin, "--steps", str(STEPS), "-q", "--no-db"])
        self.run_s = time.monotonic() - started

    @staticmethod
    def model_bytes(folder):
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            return f.read()

    def record(self, case, trial, detail, problems):
        self.rows.append((case, trial, detail, not problems, "; ".join(problems)))
        print(f"{case:28s} {trial:3d}  {'ok  ' if not problems else 'FAIL'}  {detail}  {'; '.join(problems)}", flush=True)

    def log_checks(self, db, expect_status, problems):
        con = sqlite3.connect(db)
        try:
            if con.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                problems.append("integrity_check failed")
            rows = con.execute("SELECT id, status, pid FROM runs ORDER BY id").fetchall()
            if not rows:
                problems.append("no run row")
                return None, set(), None
            run_id, status, pid = rows[-1]
            if expect_status is not None and status != expect_status:
                problems.append(f"run status {status}, expected {expect_status}")
            if expect_status == "running" and pid and os.path.exists(f"/proc/{pid}"):
                problems.append(f"pid {pid} of a killed run is alive")
            steps = {s for (s,) in con.execute("SELECT step FROM steps WHERE run_id = ?", (run_id,))}
            errors = con.execute("SELECT count(*) FROM errors WHERE run_id = ?", (run_id,)).fetchone()[0]
            return errors, steps, status
        finally:
            con.close()

    @staticmethod
    def checkpoints(root):
        if not os.path.isdir(root):
            return []
        return sorted(int(n[5:]) for n in os.listdir(root) if n.startswith("step-") and n[5:].isdigit())

    def resume_matches(self, ckpt_root, last_step, problems):
        """Resumes from the newest checkpoint to STEPS and compares the saved model with the reference."""
        out = os.path.join(ckpt_root, "..", "resumed-model")
        cmd = [self.bin, "-q", "--no-db", "--save-model", out]
        if last_step > 0:
            cmd += ["--resume", ckpt_root, "--steps", str(STEPS - last_step)]
        else:
            cmd += ["--steps", str(STEPS)]
        r = run(cmd)
        if r.returncode != 0:
            problems.append(f"resume from step {last_step} exited {r.returncode}: {r.stdout.strip()[-200:]}")
        elif self.model_bytes(out) != self.reference:
            problems.append(f"resumed from step {last_step}: weights differ from the uninterrupted run")

    def training_cmd(self, d):
        return [self.bin, "--steps", str(STEPS), "-q", "--db", os.path.join(d, "runs.db"),
                "--checkpoint-dir", os.path.join(d, "ckpt"), "--checkpoint-every", str(EVERY)]

    def kill9(self, trial, rng):
        d = tempfile.mkdtemp(dir=self.work, prefix="kill9-")
        delay = rng.uniform(0.05, self.run_s * 1.1)
        p = subprocess.Popen(self.training_cmd(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        code = p.wait()
        problems = []
        if code == 0:
            self.record("kill -9 while training", trial, f"after {delay:.2f} s: finished first", [])
            return
        if not os.path.exists(os.path.join(d, "runs.db")):
            self.record("kill -9 while training", trial, f"after {delay:.2f} s: before the log existed", [])
            return
        _, steps, _ = self.log_checks(os.path.join(d, "runs.db"), "running", problems)
        ckpts = self.checkpoints(os.path.join(d, "ckpt"))
        for c in ckpts:
            if c not in steps:
                problems.append(f"checkpoint of step {c} published without its step row")
        self.resume_matches(os.path.join(d, "ckpt"), ckpts[-1] if ckpts else 0, problems)
        self.record("kill -9 while training", trial,
                    f"after {delay:.2f} s: {len(steps)} step rows, checkpoints {ckpts or 'none'}", problems)

    def stop_signal(self, trial, rng, sig):
        name = signal.Signals(sig).name
        d = tempfile.mkdtemp(dir=self.work, prefix=name + "-")
        delay = rng.uniform(0.3, self.run_s * 0.8)
        p = subprocess.Popen(self.training_cmd(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(sig)
        code = p.wait()
        problems = []
        if code != 0:
            problems.append(f"exit {code}")
        _, steps, status = self.log_checks(os.path.join(d, "runs.db"), None, problems)
        ckpts = self.checkpoints(os.path.join(d, "ckpt"))
        finished = len(steps) == STEPS
        if status != ("finished" if finished else "interrupted"):
            problems.append(f"run status {status} after {len(steps)} steps")
        if steps and (not ckpts or ckpts[-1] != max(steps)):
            problems.append(f"newest checkpoint {ckpts[-1] if ckpts else 'none'}, last step {max(steps)}")
        self.resume_matches(os.path.join(d, "ckpt"), ckpts[-1] if ckpts else 0, problems)
        self.record(f"{name} while training", trial, f"after {delay:.2f} s: stopped after step {max(steps) if steps else 0}",
                    problems)

    def kill9_save(self, trial, rng):
        d = tempfile.mkdtemp(dir=self.work, prefix="save-")
        model = os.path.join(d, "model")
        p = subprocess.Popen([self.bin, "--steps", str(STEPS), "-q", "--no-db", "--save-model", model],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The save writes a temporary folder beside the target and renames it: kill once it appears.
        caught = False
        while p.poll() is None:
            if any(n.startswith(".tmp-") for n in os.listdir(d)):
                caught = True
                break
            time.sleep(0.0005)
        delay = rng.uniform(0.0, 0.01)
        if caught:
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
        code = p.wait()
        problems = []
        state = "absent"
        if os.path.exists(model):
            state = "complete"
            try:
                if self.model_bytes(model) != self.reference:
                    problems.append("a model folder with other weights")
            except OSError as e:
                problems.append(f"half-written model folder: {e}")
        r = run([self.bin, "--steps", str(STEPS), "-q", "--no-db", "--save-model", model])
        if r.returncode != 0:
            problems.append(f"the next save exited {r.returncode}")
        elif self.model_bytes(model) != self.reference:
            problems.append("the next save wrote other weights")
        leftovers = [n for n in os.listdir(d) if n.startswith(".tmp-")]
        if leftovers:
            problems.append(f"temporary folders left: {leftovers}")
        what = (f"{delay * 1000:.1f} ms into the save (exit {code})" if caught
                else f"the save finished before it was seen (exit {code})")
        self.record("kill -9 during --save-model", trial, f"{what}: folder {state}", problems)

    def disk_full(self, trial, size_mib):
        d = tempfile.mkdtemp(dir=self.work, prefix="full-")
        mnt = os.path.join(d, "small")
        os.makedirs(mnt)
        if run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}M", "tmpfs", mnt]).returncode != 0:
            self.record("full disk", trial, f"tmpfs of {size_mib} MiB", ["not run: mounting a tmpfs needs root"])
            return
        try:
            ckpt = os.path.join(mnt, "ckpt")
            cmd = [self.bin, "--steps", str(STEPS), "-q", "--db", os.path.join(d, "runs.db"), "--checkpoint-dir", ckpt,
                   "--checkpoint-every", str(EVERY)]
            r = run(cmd)
            problems = []
            if r.returncode != 4:
                problems.append(f"exit {r.returncode}, expected 4")
            if ckpt not in r.stdout:
                problems.append("the message does not name the checkpoint folder")
            errors, steps, _ = self.log_checks(os.path.join(d, "runs.db"), "failed", problems)
            if not errors:
                problems.append("no error row")
            ckpts = self.checkpoints(ckpt)
            if any(n.startswith(".") for n in os.listdir(ckpt)) if os.path.isdir(ckpt) else False:
                problems.append("temporary files left on the full disk")
            if ckpts:
                # The newest complete checkpoint resumes and, run on to the end off the full disk, matches.
                keep = os.path.join(d, "ckpt-copy")
                shutil.copytree(ckpt, keep)
                self.resume_matches(keep, ckpts[-1], problems)
            self.record("full disk", trial, f"tmpfs of {size_mib} MiB: checkpoints {ckpts or 'none'} kept, "
                        f"{len(steps)} step rows", problems)
        finally:
            run(["umount", mnt])

    def concurrent(self, trial, writers):
        d = tempfile.mkdtemp(dir=self.work, prefix="concurrent-")
        db = os.path.join(d, "runs.db")
        procs = [subprocess.Popen([self.bin, "--steps", str(STEPS), "-q", "--db", db], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(writers)]
        codes = [p.wait() for p in procs]
        problems = [f"a writer exited {c}" for c in codes if c != 0]
        con = sqlite3.connect(db)
        if con.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
            problems.append("integrity_check failed")
        for run_id, status in con.execute("SELECT id, status FROM runs"):
            n = con.execute("SELECT count(*) FROM steps WHERE run_id = ?", (run_id,)).fetchone()[0]
            if status != "finished" or n != STEPS:
                problems.append(f"run {run_id}: {status} with {n} steps")
        runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        con.close()
        if runs != writers:
            problems.append(f"{runs} run rows for {writers} writers")
        self.record("concurrent writers", trial, f"{writers} runs on one --db", problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin", help="folder holding slidedp-run")
    ap.add_argument("--trials", type=int, default=6, help="random moments per signal case")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--out", default="results/reliability", help="where README.md and cases.csv go")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="slidedp-faults-")
    started = time.monotonic()
    try:
        m = Matrix(a.bin, work)
        print(f"reference: {STEPS} steps in {m.run_s:.2f} s", flush=True)
        for t in range(a.trials):
            m.kill9(t, rng)
        for t in range(a.trials):
            m.stop_signal(t, rng, signal.SIGINT)
        for t in range(a.trials):
            m.stop_signal(t, rng, signal.SIGTERM)
        for t in range(max(1, a.trials // 2)):
            m.kill9_save(t, rng)
        for t, size in enumerate((12, 24)):
            m.disk_full(t, size)
        for t, writers in enumerate((2, 4)):
            m.concurrent(t, writers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cases.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "trial", "detail", "ok", "problems"])
        w.writerows(m.rows)
    cases = sorted({r[0] for r in m.rows}, key=[r[0] for r in m.rows].index)
    git = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = "+dirty" if run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip() else ""
    lines = ["# Fault matrix: slidedp-run under kills, stop signals, a full disk and concurrent writers", "",
             f"Produced by: `scripts/fault_matrix.py --trials {a.trials} --seed {a.seed}` "
             f"(git {git}{dirty}, {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, {datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%M:%SZ')}, "
             f"{time.monotonic() - started:.0f} s). What each case checks is the script's docstring; "
             f"slidedp-tiny, {STEPS} steps, a checkpoint every {EVERY}, on the embedded text.", "",
             "| case | trials | held | not held |", "|---|---|---|---|"]
    for c in cases:
        rows = [r for r in m.rows if r[0] == c]
        bad = [r for r in rows if not r[3]]
        lines.append(f"| {c} | {len(rows)} | {len(rows) - len(bad)} | "
                     f"{'; '.join(r[4] for r in bad) if bad else '-'} |")
    lines += ["", "Every case (cases.csv has the same):", "", "| case | trial | what happened | outcome |",
              "|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} | {'held' if r[3] else 'NOT HELD: ' + r[4]} |" for r in m.rows]
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    failed = sum(1 for r in m.rows if not r[3])
    print(f"{len(m.rows)} cases, {failed} not held; {a.out}/README.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
