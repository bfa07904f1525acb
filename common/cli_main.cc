// Error-kind -> exit-code mapping for all tools; see cli_main.h.
#include "common/cli_main.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <exception>
#include <new>
#include <system_error>

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
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the system refused (name too long, a loop of symbolic links, no permission) where the
    // code used std::filesystem directly: an I/O error naming the path, like IoError.
    std::fprintf(stderr, "%s: I/O error: %s\n", program, e.what());
    return static_cast<int>(ErrorKind::kIo);
  } catch (const std::system_error& e) {
    // The system refused a resource (a thread, a lock): a runtime failure of this machine, not a bug.
    std::fprintf(stderr, "%s: runtime error: %s (the system refused a resource; check ulimit -u and free memory)\n",
                 program, e.what());
    return static_cast<int>(ErrorKind::kRuntime);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: runtime error: out of memory (slidedp-predict shows the plan's host and device memory)\n",
                 program);
    return static_cast<int>(ErrorKind::kRuntime);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace slidedp
