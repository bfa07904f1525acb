// `slidedp-sweep measured SPEC.yaml [--out DIR] [--steps N] [--warmup W] [--backend cpu|cuda]
// [--time-scale S] [--json]`: every point of a sweep spec chosen by the model, then run on the executor
// (paced on the CPU backend, or on this machine's GPUs) with its system's own data movement (sweeps/measured_sweep.h); writes points.csv, README.md and SVG plots.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/cli_checks.h"
#include "common/progress.h"
#include "common/units.h"
#include "executor/target_pacing.h"
#include "sweeps/cli/commands.h"
#include "sweeps/measured_sweep.h"
#include "sweeps/sweep_analysis.h"
#include "sweeps/sweep_spec.h"

namespace slidedp {
namespace {

struct MeasuredArgs {
  std::string spec;
  int steps = 8, warmup = 3;
  std::string backend = "cpu";
  double time_scale = 0;
  ReportFlags report;
};

}  // namespace

void add_measured_command(CLI::App& app, int argc, char** argv) {
  auto args = std::make_shared<MeasuredArgs>();
  CLI::App* cmd = app.add_subcommand(
      "measured",
      "Run a sweep spec's points for real: the model chooses each system's plan at matched tokens per step, the "
      "executor runs it on the CPU backend paced at the point's hardware with the system's data movement; "
      "measured speedups beside the modelled ones and the paper's claims");
  cmd->add_option("spec", args->spec, "Sweep spec YAML with models small enough to run here (sweeps/specs/measured_matched_batch.yaml)")
      ->required();
  cmd->add_option("--steps", args->steps, "Optimizer steps per point")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Of them, steps not measured")->check(CLI::NonNegativeNumber);
  cmd->add_option("--backend", args->backend,
                  "cpu: the CPU backend paced at each point's hardware (default); cuda: this machine's GPUs, unpaced "
                  "(the spec's hardware must describe this machine: sweeps/specs/measured_one_gpu.yaml)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--time-scale", args->time_scale,
                  "With the CPU backend: seconds here per second of the target (default: measured per plan)")
      ->check(finite_in(exec::kMinTimeScale, exec::kMaxTimeScale));
  args->report.add_to(cmd);
  const std::string command = command_line(argc, argv);
  cmd->callback([args, command] {
    const SweepSpec spec = load_sweep_spec(args->spec);
    const std::string out = args->report.folder(spec.name, args->spec);
    Progress progress("measured " + spec.name, static_cast<double>(expand_points(spec).size()), "points",
                      args->report.progress());
    MeasuredOptions o;
    o.steps = args->steps;
    o.warmup = args->warmup;
    o.backend = args->backend;
    o.time_scale = args->time_scale;
    o.progress = [&](int done, int, const MeasuredPoint& m) {
      progress.update(done, fmt::format("{} {} {}", m.row.hardware, format_tokens(m.row.point.tokens_per_step), m.row.system));
    };
    const MeasuredSweep s = run_measured_sweep(spec, o);
    progress.finish();
    const std::vector<std::string> files = write_measured_report(s, out, command);
    nlohmann::json j;
    j["points"] = s.points.size();
    j["out"] = out;
    j["files"] = files;
    j["wall_s"] = s.wall_s;
    nlohmann::json pts = nlohmann::json::array();
    for (const MeasuredPoint& m : s.points)
      pts.push_back({{"hardware", m.row.hardware}, {"system", m.row.system}, {"tokens_per_step", m.row.point.tokens_per_step},
                     {"ran", m.ran}, {"not_run", m.not_run}, {"predicted_step_s", m.row.feasible ? m.predicted_step_s() : 0.0},
                     {"measured_step_s", m.step_s}, {"error", m.error()}});
    j["rows"] = pts;
    if (args->report.json) {
      std::cout << j.dump(2) << "\n";
    } else {
      int ran = 0;
      for (const MeasuredPoint& m : s.points) ran += m.ran;
      fmt::print("{}: {} points, {} run on the {} backend{}, in {}\nwrote {} files to {}/\n", spec.name, s.points.size(), ran,
                 s.backend, s.backend == "cpu" ? " paced" : "", format_seconds(s.wall_s), files.size(), out);
    }
    set_command_status(0);
  });
}

}  // namespace slidedp
