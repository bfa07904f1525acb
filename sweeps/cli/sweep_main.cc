// slidedp-sweep: studies over many plans. Subcommands:
//   fidelity   run a validation set of plans with the executor on this machine and compare them
//              with the model's predictions (issue 10)
//   run        evaluate a sweep spec (hardware x models x sequence lengths x batches x systems)
//   measured   run a spec's points paced on the executor, each with its system's data movement
//   validation predict a corpus of published measured runs and report the model's error
#include <CLI/CLI.hpp>

#include "common/cli_main.h"
#include "common/cli_parse.h"
#include "common/error.h"
#include "sweeps/cli/commands.h"

int main(int argc, char** argv) {
  return slidedp::run_cli("slidedp-sweep", [&] {
    CLI::App app{"slidedp-sweep: evaluate many plans -- model sweeps, baselines, what-if hardware, and model fidelity."};
    app.require_subcommand(1);
    slidedp::add_fidelity_command(app, argc, argv);
    slidedp::add_run_command(app, argc, argv);
    slidedp::add_measured_command(app, argc, argv);
    slidedp::add_validation_command(app, argc, argv);
    if (const std::optional<int> done = slidedp::parse_command_line(app, argc, argv)) return *done;
    return slidedp::last_command_status();
  });
}
