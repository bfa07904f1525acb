// Runs a shell command line in a test and captures what it printed (stdout and stderr together) and
// its exit status: for tests of the command-line tools.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace slidedp::testing {

struct CommandResult {
  int code = -1;  // the exit status; -1 when the command did not exit normally
  std::string out;
};

inline CommandResult run_shell(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace slidedp::testing
