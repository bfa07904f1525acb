#include "executor/cli/run_log_session.h"

#include <fmt/format.h>

#include <chrono>

namespace slidedp {

RunLogSession::RunLogSession(const std::string& db, const runlog::RunInfo& info,
                             const std::optional<Prediction>& predicted)
    : log_(runlog::RunLog::open(db)) {
  run_id_ = log_.begin_run(info);
  if (predicted) log_.log_prediction(run_id_, runlog::prediction_record(*predicted));
  step_log_.emplace(log_);
}

void RunLogSession::log_step(const runlog::StepRecord& r, const exec::TrainStep& s) {
  step_log_->submit([id = run_id_, r, totals = s.totals, spans = s.spans](runlog::RunLog& l) {
    l.log_step(id, r, totals, spans);
  });
}

void RunLogSession::log_eval(const runlog::EvalRecord& r) {
  step_log_->submit([id = run_id_, r](runlog::RunLog& l) { l.log_eval(id, r); });
}

void RunLogSession::settle(bool failing) {
  if (!step_log_) return;
  runlog::PatientLog::Outcome left;
  try {
    left = step_log_->flush(std::chrono::seconds(60));
  } catch (const Error&) {
    step_log_.reset();
    if (!failing) throw;
    return;
  }
  step_log_.reset();
  if (left.uncommitted + left.dropped == 0) return;
  const std::string what = fmt::format(
      "{} step rows were not logged: the run log was locked by another process "
      "for more than a minute after training ({} still queued, {} beyond the queue)",
      left.uncommitted + left.dropped, left.uncommitted, left.dropped);
  fmt::print(stderr, "warning: {}: {}\n", log_.path(), what);
  runlog::ErrorRecord er;
  er.kind = "log";
  er.message = what;
  try {
    log_.log_error(run_id_, er);
  } catch (const runlog::LogLocked&) {
  }
}

void RunLogSession::end(bool stopped_early) {
  settle(false);
  log_.end_run(run_id_, stopped_early ? runlog::RunStatus::kInterrupted : runlog::RunStatus::kFinished);
}

void RunLogSession::fail(const Error& e, bool interrupted) {
  settle(true);
  runlog::ErrorRecord er;
  er.kind = interrupted                          ? "interrupted"
            : e.kind() == ErrorKind::kNumeric    ? "numeric"
            : e.kind() == ErrorKind::kInfeasible ? "infeasible"
                                                 : "error";
  er.message = e.what();
  log_.log_error(run_id_, er);
  log_.end_run(run_id_, interrupted ? runlog::RunStatus::kInterrupted : runlog::RunStatus::kFailed);
}

void RunLogSession::fail() {
  settle(true);
  log_.end_run(run_id_, runlog::RunStatus::kFailed);
}

}  // namespace slidedp
