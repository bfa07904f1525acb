// Repeated measurements and their spread. Every profiler value is the median of several repetitions;
// the spread (max - min) / median travels with it into the table, the JSON and the profile's notes,
// so a re-run can be judged against it. Also the clock and the repeat loops the stages share: every
// stage's cases are repeated in rounds that span the whole run (run_rounds), so a case's repetitions
// are spread over the run's minutes, not its stage's seconds, and slow drifts (clock frequency, other
// tenants of the machine) widen its spread instead of shifting its median unnoticed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// For sources and notes: a value to 3 significant digits ("12.3"), a spread as a percentage ("4.2%").
std::string sig3(double v);
std::string spread_percent(const Spread& s);

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

// One case of a stage for run_rounds: warm() runs once, untimed, before the first round (page faults,
// caches, thread start-up, choosing how many operations a repetition repeats); rep() is one
// repetition and returns the value of each of the case's outputs (both directions of a duplex copy,
// every operation of a unit chain). Both may run long after the stage built the case, so they own
// (through shared state) everything they touch.
struct Case {
  std::string label;  // for the progress line
  std::function<void()> warm;
  std::function<std::vector<double>()> rep;
};

// A case from body(inner), which performs the operation `inner` times back to back and returns the
// seconds of each output for all of them: warm() picks inner from one operation (the slowest
// output), rep() returns seconds per operation.
Case timed_case(std::string label, const RepeatPolicy& policy,
                std::function<std::vector<double>(int inner)> body);

// Samples of one stage's cases: [case][output][repetition].
using CaseSamples = std::vector<std::vector<std::vector<double>>>;

// One stage's share of the run's rounds: its cases, and its estimated seconds (how much of the
// progress line its steps advance).
struct StageCases {
  std::string name;  // "host memory": the progress line shows "<name>: <case label>"
  double estimate_s = 0;
  std::vector<Case> cases;
};

// A stage built for the run's rounds: its cases, and finish(), which turns their samples into the
// stage's result (fits, medians, spreads) and records them, once every round has run.
template <class Result>
struct PreparedStage {
  std::vector<Case> cases;
  std::function<Result(const CaseSamples&)> finish;
};

// Warms every case of every stage (stage by stage, in order), then runs `reps` rounds: round r runs
// every case of every stage once, in one order shuffled per round (seeded: the same on every run),
// before any case runs round r + 1. Returns [stage] of that stage's [case][output][repetition].
// progress(estimated seconds done, "<stage>: <case>") before each step, and (total, "") at the end;
// each stage's estimate is shared equally by its cases' warm-ups and repetitions.
std::vector<CaseSamples> run_rounds(std::vector<StageCases>& stages, int reps, uint64_t seed,
                                    const std::function<void(double done_s, const std::string&)>& progress);

// Inner iterations repeat_timed would choose for an operation taking `seconds` (at least 1).
int inner_for(const RepeatPolicy& policy, double seconds);

}  // namespace slidedp::profiler
