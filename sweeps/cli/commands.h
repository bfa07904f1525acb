// Subcommands of slidedp-sweep, each registered on the app; the callback stores the exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace slidedp {

void add_fidelity_command(CLI::App& app, int argc, char** argv);
void add_run_command(CLI::App& app, int argc, char** argv);
void add_measured_command(CLI::App& app, int argc, char** argv);
int last_command_status();
// The command as reports print it: the tool's name without the build folder it ran from, then the
// arguments.
std::string command_line(int argc, char** argv);
void set_command_status(int status);

}  // namespace slidedp
