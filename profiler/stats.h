// Repeated measurements and their spread. Every profiler value is the median of several repetitions;
// the spread (max - min) / median travels with it into the table, the JSON and the profile's notes,
// so a re-run can be judged against it. Also the clock and the repeat loop every stage shares.
#pragma once

#include <functional>
#include <vector>

namespace slidedp::profiler {

struct Spread {
  double median = 0, min = 0, max = 0;
  int n = 0;
  // (max - min) / median; 0 for a single value or a zero median.
  double relative() const { return n > 1 && median != 0 ? (max - min) / median : 0.0; }
};

// Aborts on an empty list (a stage that measured nothing is a bug).
Spread summarize(std::vector<double> values);

// Seconds on a monotonic clock (steady_clock), for spans measured on any thread.
double now_s();

// Repetition policy of one measured case: `reps` timed repetitions after one untimed warm-up, each
// repetition long enough (min_rep_s) that clock resolution and thread wake-ups are noise.
struct RepeatPolicy {
  int reps = 3;
  double min_rep_s = 0.02;
  int max_inner = 1 << 14;  // cap on back-to-back iterations of a tiny body inside one repetition
};

// Runs body(inner) once as a warm-up with inner = 1 and times it; then picks inner so that a
// repetition lasts about min_rep_s, and runs `reps` repetitions. body(inner) performs the operation
// `inner` times and returns the seconds it measured for all of them (its own clock, so it can time
// work on other threads); the result is seconds per operation for each repetition.
std::vector<double> repeat_timed(const RepeatPolicy& policy, const std::function<double(int inner)>& body);

// The same for a body that measures several things at once (both directions of a duplex copy, every
// device of a collective): body(inner) returns the seconds of each; the result is
// [thing][repetition] seconds per operation. The warm-up picks inner from the slowest thing.
std::vector<std::vector<double>> repeat_timed_multi(
    const RepeatPolicy& policy, const std::function<std::vector<double>(int inner)>& body);

// Inner iterations repeat_timed would choose for an operation taking `seconds` (at least 1).
int inner_for(const RepeatPolicy& policy, double seconds);

}  // namespace slidedp::profiler
