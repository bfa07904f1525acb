// `slidedp-sweep run SPEC.yaml`: evaluates a sweep spec with the model (issue 11). Registered here so
// the subcommand exists; its implementation lives in sweeps/sweep_runner.h.
#include "sweeps/cli/commands.h"

#include "common/error.h"

namespace slidedp {

void add_run_command(CLI::App& app, int /*argc*/, char** /*argv*/) {
  CLI::App* cmd = app.add_subcommand("run", "Evaluate a sweep spec (hardware x models x sequence lengths x batches x systems)");
  auto spec = std::make_shared<std::string>();
  cmd->add_option("spec", *spec, "Sweep spec YAML")->required();
  cmd->callback([spec] { throw InputError("slidedp-sweep run", "sweep specs are not available in this build yet"); });
}

}  // namespace slidedp
