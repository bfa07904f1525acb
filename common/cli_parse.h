// Parsing a tool's command line the one way every slidedp-* tool does: --help and --version print and
// exit 0, a usage error prints CLI11's message and exits 2 (ErrorKind::kInput, docs/CLI.md).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

namespace slidedp {

// nullopt: parsed, go on; otherwise the exit code the tool returns now (the message is printed).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace slidedp
