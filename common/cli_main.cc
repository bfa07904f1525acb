// Error-kind -> exit-code mapping for all tools; see cli_main.h.
#include "common/cli_main.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <exception>

#include "common/error.h"

namespace slidedp {

std::string command_line(int argc, char** argv) {
  std::string command = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "";
  for (int i = 1; i < argc; ++i) command += " " + std::string(argv[i]);
  return command;
}

int run_cli(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const InfeasibleError& e) {
    std::fprintf(stderr, "%s: infeasible: %s\n", program, e.what());
    return static_cast<int>(ErrorKind::kInfeasible);
  } catch (const Error& e) {
    const char* label = "error";
    switch (e.kind()) {
      case ErrorKind::kInput: label = "bad input"; break;
      case ErrorKind::kIo: label = "I/O error"; break;
      case ErrorKind::kNumeric: label = "numeric error"; break;
      case ErrorKind::kRuntime: label = "runtime error"; break;
      case ErrorKind::kInfeasible: label = "infeasible"; break;
    }
    std::fprintf(stderr, "%s: %s: %s\n", program, label, e.what());
    return static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace slidedp
