// The steps of a run, once everything is built: one thread per rank issues each step as soon as it
// is permitted (and the evaluation after it), while the calling thread announces steps to the
// updater, waits for their updates, reports each step, writes checkpoints and collects evaluations.
// A stop request ends the run after a step (checkpointed); an error or an interrupt aborts the rest.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "executor/evaluation.h"
#include "executor/host_state.h"
#include "executor/rank_driver.h"
#include "executor/run_control.h"
#include "executor/run_setup.h"
#include "executor/trainer.h"
#include "executor/updater.h"
#include "io/sequence_sampler.h"

namespace slidedp::exec {

// Lets driver threads issue step s only after the main thread announced it to the updater.
class StepPermits {
 public:
  explicit StepPermits(const RunControl& control) : control_(control) {}
  void permit(int64_t step);
  void finish();
  // True when `step` may be issued; false when the run ends before it.
  bool wait(int64_t step);

 private:
  const RunControl& control_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t permitted_ = -1;
  bool finished_ = false;
};

// What the loop drives and reads; everything outlives it.
struct StepLoopParts {
  const TrainOptions& options;
  const RunShape& shape;
  Backend& backend;
  HostState& state;
  Updater& updater;
  SequenceSampler& sampler;
  std::vector<std::unique_ptr<RankDriver>>& drivers;
  RunControl& control;
  InterruptWatch& interrupts;
  const TargetPacing* pacing;
  // The held-out data (evaluation.h): every sequence in file order, shared among the ranks.
  std::optional<SequenceSampler>& eval_sampler;
  std::optional<EvalTally>& eval_tally;
};

class StepLoop {
 public:
  StepLoop(const StepLoopParts& parts, TrainResult& result);
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;
  ~StepLoop();

  // Runs the steps after result.start_step (o.steps of them; none: evaluates the starting weights),
  // filling result's steps, evaluations, checkpoint and, with tracing, spans. Throws the run's error.
  void run(const std::function<void(const TrainStep&)>& on_step);

 private:
  bool eval_after(int64_t s) const;
  void collect_eval(int64_t after_step, int64_t id);
  void start_rank_threads();
  void announce(int64_t s);
  void join_ranks();
  void shutdown();
  // Steps [first_, last_) as the updater finishes them; returns after the last or a stop.
  void step_through(const std::function<void(const TrainStep&)>& on_step);
  TrainStep record(int64_t s, const StepOutcome& out, double wall_s);
  void checkpoint(int64_t s, const TrainStep& rec);

  StepLoopParts p_;
  TrainResult& result_;
  const int64_t first_, last_;
  StepPermits permits_;
  std::vector<std::thread> threads_;
  std::vector<MeasuredSpan> spans_;
};

}  // namespace slidedp::exec
