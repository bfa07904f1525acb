// Shared entry point of every slidedp-* tool: runs the body, maps error kinds to exit codes and prints
// one clear line per error. Exit codes: 0 ok, 1 internal error, 2 bad input or usage, 3 infeasible,
// 4 I/O, 5 numeric (NaN/Inf), 6 runtime failure. Documented in docs/CLI.md.
#pragma once

#include <functional>
#include <string>

namespace slidedp {

int run_cli(const char* program, const std::function<int()>& body);

// The command as typed, for run logs and reports: the program's file name (no folder, so committed
// reports do not carry a machine's paths) and the arguments, space-separated.
std::string command_line(int argc, char** argv);

}  // namespace slidedp
