// Errors of SlideDP, in two tiers (STYLE habit 5).
//  * Internal invariants: SLIDEDP_CHECK aborts with file:line and is never compiled out.
//  * Bad input and environment: typed exceptions naming the file, the key path and the expectation.
//    Each CLI maps the kind to an exit code through run_cli() (common/cli_main.h).
#pragma once

#include <stdexcept>
#include <string>

namespace slidedp {

enum class ErrorKind {
  kInput = 2,       // malformed or out-of-range input (YAML, flags, files' contents)
  kInfeasible = 3,  // a plan that does not fit a budget (memory, host RAM, pinned limit)
  kIo = 4,          // missing, unreadable or truncated files; failed writes
  kNumeric = 5,     // NaN/Inf where finite numbers are required (gradients, loss)
  kRuntime = 6,     // a failure while running (a rank threw, a backend failed)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Bad input. `where` is "file: key.path" (either part may be empty); `what` says what was expected.
class InputError : public Error {
 public:
  InputError(const std::string& where, const std::string& what)
      : Error(ErrorKind::kInput, where.empty() ? what : where + ": " + what) {}
};

// A plan or configuration that is well formed but does not fit; the message carries the numbers.
class InfeasibleError : public Error {
 public:
  explicit InfeasibleError(const std::string& why) : Error(ErrorKind::kInfeasible, why) {}
};

class IoError : public Error {
 public:
  IoError(const std::string& path, const std::string& what)
      : Error(ErrorKind::kIo, path.empty() ? what : path + ": " + what) {}
};

class NumericError : public Error {
 public:
  explicit NumericError(const std::string& what) : Error(ErrorKind::kNumeric, what) {}
};

class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& what) : Error(ErrorKind::kRuntime, what) {}
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& message);

}  // namespace slidedp

// Internal invariant: always on (not `assert`), prints the expression, file:line and a message.
#define SLIDEDP_CHECK(cond, ...)                                                   \
  do {                                                                             \
    if (!(cond)) ::slidedp::check_failed(#cond, __FILE__, __LINE__, std::string(__VA_ARGS__)); \
  } while (0)
