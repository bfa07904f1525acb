// `slidedp-sweep validation CORPUS.yaml [--out DIR] [--json]`: predicts every published run of a
// validation corpus (sweeps/specs/validation.yaml) with the matching system and hardware, and writes
// the errors, the rankings and the predicted-vs-measured plot (sweeps/validation.h).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "sweeps/cli/commands.h"
#include "sweeps/validation.h"

namespace slidedp {
namespace {

struct ValidationArgs {
  std::string corpus;
  ReportFlags report;
};

}  // namespace

void add_validation_command(CLI::App& app, int argc, char** argv) {
  auto args = std::make_shared<ValidationArgs>();
  CLI::App* cmd = app.add_subcommand(
      "validation", "Predict every published measured run of a validation corpus with the matching system and "
                    "hardware; write the errors, the rankings of systems and a predicted-vs-measured plot");
  cmd->add_option("corpus", args->corpus, "Validation corpus YAML (sweeps/specs/validation.yaml)")->required();
  args->report.add_to(cmd);
  const std::string command = command_line(argc, argv);
  cmd->callback([args, command] {
    const ValidationCorpus corpus = load_validation_corpus(args->corpus);
    const std::string out = args->report.folder(corpus.name, args->corpus);
    const ValidationResult r = run_validation(corpus);
    const std::vector<std::string> files = write_validation_report(r, out, command);
    if (args->report.json) {  // the report's summary.json, with where it went
      nlohmann::json j = nlohmann::json::parse(read_text_file(out + "/summary.json"));
      j["out"] = out;
      j["files"] = files;
      std::cout << j.dump(2) << "\n";
    } else {
      fmt::print("{}: {} points ({} calibration runs, reported apart); held out: mean |error| {:.1f}% (core {:.1f}%), worst {:.1f}% "
                 "({}), {} called infeasible; {} rankings, {} wrong\nwrote {}/README.md\n",
                 corpus.name, r.all.points, r.calibration.points, 100 * r.held_out.mean_abs_error,
                 100 * r.core.mean_abs_error, 100 * r.held_out.worst_abs_error, r.held_out.worst_id,
                 r.held_out.infeasible, r.rankings.size(),
                 std::count_if(r.rankings.begin(), r.rankings.end(), [](const RankingGroup& g) { return !g.right; }), out);
    }
    set_command_status(0);
  });
}

}  // namespace slidedp
