// Subcommands of slidedp-sweep, each registered on the app; the callback stores the exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/cli_main.h"  // command_line
#include "common/output_paths.h"
#include "sweeps/sweep_report.h"

namespace slidedp {

void add_fidelity_command(CLI::App& app, int argc, char** argv);
void add_run_command(CLI::App& app, int argc, char** argv);
void add_measured_command(CLI::App& app, int argc, char** argv);
void add_validation_command(CLI::App& app, int argc, char** argv);
int last_command_status();
void set_command_status(int status);

// What the sweep commands that write a report share: --out (default results/sweeps/<spec name>),
// --json and --quiet.
struct ReportFlags {
  std::string out;
  bool json = false, quiet = false;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--out", out, "Output folder (default: results/sweeps/<spec name>)");
    cmd->add_flag("--json", json, "Print a JSON summary instead of the readable one");
    cmd->add_flag("--quiet", quiet, "No progress line");
  }
  // The output folder, checked before any point runs: not an existing file, writable, and neither the
  // spec file nor a folder holding or inside it.
  std::string folder(const std::string& spec_name, const std::string& spec_file) const {
    const std::string dir = out.empty() ? "results/sweeps/" + spec_name : out;
    check_output_folder_target({"--out", dir});
    refuse_output_over_inputs({"--out", dir}, {{"SPEC", spec_file}});
    refuse_output_in_checkpoints({"--out", dir});
    refuse_foreign_report_folder(dir, "--out");
    return dir;
  }
  bool progress() const { return !json && !quiet; }
};

}  // namespace slidedp
