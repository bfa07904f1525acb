// `slidedp-sweep run SPEC.yaml [--out DIR] [--simulate] [--json]`: evaluates a sweep spec with the
// model (sweeps/sweep_runner.h) and writes points.csv, README.md and SVG plots into DIR (default
// results/sweeps/<spec name>). Bad specs exit 2 with the file and key named (common/cli_main.h).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "common/units.h"
#include "sweeps/cli/commands.h"
#include "sweeps/sweep_analysis.h"
#include "sweeps/sweep_report.h"
#include "sweeps/sweep_runner.h"
#include "sweeps/sweep_spec.h"

namespace slidedp {
namespace {

struct RunArgs {
  std::string spec;
  bool simulate = false;
  ReportFlags report;
};

}  // namespace

void add_run_command(CLI::App& app, int argc, char** argv) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd =
      app.add_subcommand("run",
                         "Evaluate a sweep spec (hardware x models x sequence lengths x batches x systems) "
                         "with the step model; write points.csv, README.md and SVG plots");
  cmd->add_option("spec", args->spec, "Sweep spec YAML (see sweeps/specs/ and docs/SWEEPS.md)")->required();
  cmd->add_flag("--simulate", args->simulate, "Re-score every chosen plan with the discrete-event simulator");
  args->report.add_to(cmd);
  const std::string command = command_line(argc, argv);
  cmd->callback([args, command] {
    const SweepSpec spec = load_sweep_spec(args->spec);
    const std::string out = args->report.folder(spec.name, args->spec);
    const std::size_t total = expand_points(spec).size();
    Progress progress("sweep " + spec.name, static_cast<double>(total), "points",
                      args->report.progress());
    SweepRunOptions opt;
    opt.simulate = args->simulate;
    opt.progress = [&](int done, int, const SweepRow& r) {
      progress.update(done, fmt::format("{} {} {} {}", r.hardware, r.model,
                                        format_tokens(r.point.tokens_per_step), r.system));
    };
    const SweepResult res = run_sweep(spec, opt);
    progress.finish();
    const std::vector<std::string> files = write_sweep_report(res, out, command);
    if (args->report.json) {
      std::cout << sweep_summary_json(res, files, out).dump(2) << "\n";
    } else {
      int feasible = 0;
      for (const SweepRow& r : res.rows) feasible += r.feasible ? 1 : 0;
      fmt::print("{}: {} points ({} fit) in {}\n", spec.name, res.rows.size(), feasible,
                 format_seconds(res.wall_s));
      for (const ClaimResult& c : evaluate_claims(res))
        fmt::print("  {}\n    paper: {}\n    model: {}\n", c.claim.claim, c.claim.paper, c.model);
      fmt::print("wrote {} files to {}/ (README.md, points.csv, plots)\n", files.size(), out);
    }
    set_command_status(0);
  });
}

}  // namespace slidedp
