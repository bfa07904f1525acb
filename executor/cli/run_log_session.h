// slidedp-run's rows in the run log: the run and its prediction when it begins; step and evaluation
// rows through a patient writer while it trains (a log another process holds past the busy timeout
// must not stop training); its end: finished, interrupted, or failed with an error row.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"
#include "executor/trainer.h"
#include "model/step_model.h"
#include "runlog/patient_log.h"
#include "runlog/run_log.h"

namespace slidedp {

class RunLogSession {
 public:
  // Opens the log at `db` and begins the run.
  RunLogSession(const std::string& db, const runlog::RunInfo& info,
                const std::optional<Prediction>& predicted);
  RunLogSession(const RunLogSession&) = delete;
  RunLogSession& operator=(const RunLogSession&) = delete;

  int64_t run_id() const { return run_id_; }

  // From the training thread, queued.
  void log_step(const runlog::StepRecord& r, const exec::TrainStep& s);
  void log_eval(const runlog::EvalRecord& r);

  // The run ended: finished, or interrupted when it stopped early on request.
  void end(bool stopped_early);
  // The run failed with `e`: an error row of its kind, the run interrupted or failed.
  void fail(const Error& e, bool interrupted);
  // The run failed with something that is not an Error: the run failed, no error row.
  void fail();

 private:
  // Before the run's last rows: every queued step row committed, or counted in an error row. On a
  // failed run (`failing`) a queued row's own error is dropped: the error being reported comes first.
  void settle(bool failing);

  runlog::RunLog log_;
  int64_t run_id_ = -1;
  std::optional<runlog::PatientLog> step_log_;
};

}  // namespace slidedp
