// `slidedp-sweep measured SPEC`: the matched-batch comparison measured, not only modelled (issue 19).
// Every point of a sweep spec is first evaluated by the model as `slidedp-sweep run --simulate` does
// (each system's plan chosen at the same tokens per step), then run for real by the executor on the
// CPU backend paced at the point's hardware (slidedp-run --emulate: each plan at its own measured time
// scale, the measured step divided by it), with the system's own data movement (TrainOptions::system).
// Models must be small enough to run on this host (sweeps/specs/measured_matched_batch.yaml uses
// slidedp-small).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sweeps/sweep_runner.h"

namespace slidedp {

struct MeasuredPoint {
  SweepRow row;             // the model's choice and prediction (simulated)
  bool ran = false;
  std::string not_run;      // why not ("" when it ran): no plan of the system fits
  double time_scale = 0;    // seconds here per second of the target
  double step_s = 0;        // measured, the target's seconds (median of the measured steps)
  double tokens_per_s = 0;  // measured
  int64_t paced_ops = 0, paced_overruns = 0;
  // The model's figure this is compared with: the simulator's step (the pacing shares resources as
  // it does).
  double predicted_step_s() const { return row.scored().step_time_s; }
  double error() const { return ran ? (predicted_step_s() - step_s) / step_s : 0.0; }
};

struct MeasuredOptions {
  int steps = 8;    // per point
  int warmup = 3;   // of them, not measured
  // "cpu": the CPU backend paced at each point's hardware; "cuda": this machine's GPUs, unpaced, so
  // the spec's hardware must describe this machine (sweeps/specs/measured_one_gpu.yaml).
  std::string backend = "cpu";
  double time_scale = 0;  // cpu: <= 0 measured per plan
  std::function<void(int done, int total, const MeasuredPoint&)> progress;
};

struct MeasuredSweep {
  std::string backend = "cpu";
  SweepResult modelled;              // the model's sweep (simulated), as `slidedp-sweep run` writes it
  std::vector<MeasuredPoint> points; // same order as modelled.rows
  double wall_s = 0;
  // The sweep's rows with each measured figure in place of the prediction (rows not run are marked
  // infeasible), so the speedup analysis of sweep_analysis.h applies to measurements unchanged.
  SweepResult measured_as_rows() const;
};

MeasuredSweep run_measured_sweep(const SweepSpec& spec, const MeasuredOptions& options = {});

// Writes points.csv (every point: plan, predicted, measured, error, scale, overruns), README.md
// (speedups measured beside modelled and beside the paper's claims, the model's error per system
// and hardware) and SVG plots (measured vs predicted; measured speedups per hardware) into `dir`.
std::vector<std::string> write_measured_report(const MeasuredSweep& sweep, const std::string& dir,
                                               const std::string& command);

}  // namespace slidedp
