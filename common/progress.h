// Progress line for long work (profiles, sweeps, training): done/total, rate and ETA, redrawn in place
// on a terminal and printed every few seconds otherwise (logs stay readable in CI).
#pragma once

#include <chrono>
#include <string>

namespace slidedp {

class Progress {
 public:
  Progress(std::string label, double total, std::string unit, bool enabled = true);
  // Sets the amount done; `note` is appended (e.g. "loss 2.31").
  void update(double done, const std::string& note = "");
  void finish(const std::string& note = "");

 private:
  std::string label_;
  double total_;
  std::string unit_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
};

}  // namespace slidedp
