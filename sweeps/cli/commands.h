// Subcommands of slidedp-sweep, each registered on the app; the callback stores the exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/cli_main.h"  // command_line

namespace slidedp {

void add_fidelity_command(CLI::App& app, int argc, char** argv);
void add_run_command(CLI::App& app, int argc, char** argv);
void add_measured_command(CLI::App& app, int argc, char** argv);
int last_command_status();
void set_command_status(int status);

}  // namespace slidedp
