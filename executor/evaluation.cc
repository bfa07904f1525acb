// The evaluation's tally; see evaluation.h.
#include "executor/evaluation.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace slidedp::exec {

double EvalLoss::loss() const {
  return tokens > 0 ? loss_sum / tokens : std::numeric_limits<double>::quiet_NaN();
}
double EvalLoss::perplexity() const { return std::exp(loss()); }

int64_t eval_micro_batches(int64_t sequences, int64_t global_ranks, int64_t micro_batch) {
  const int64_t per = global_ranks * micro_batch;
  return (sequences + per - 1) / per;
}

EvalLoss sum_over_nodes(NodeLink& link, const EvalLoss& mine, const RunControl* control) {
  const double v[2] = {mine.loss_sum, mine.tokens};
  const std::vector<std::byte> all =
      link.all_gather(reinterpret_cast<const std::byte*>(v), sizeof v, "the evaluation's loss", -1, control);
  EvalLoss r;
  for (size_t at = 0; at + sizeof v <= all.size(); at += sizeof v) {
    double w[2];
    std::memcpy(w, all.data() + at, sizeof w);
    r.loss_sum += w[0];
    r.tokens += w[1];
  }
  return r;
}

EvalTally::EvalTally(const RunControl& control, int ranks, int64_t micro_batches)
    : control_(control), ranks_(ranks), micro_batches_(micro_batches) {}

void EvalTally::report(int64_t step, int rank, int64_t micro, double loss_sum, double tokens) {
  std::lock_guard lock(mutex_);
  Pending& p = pending_[step];
  const size_t n = static_cast<size_t>(ranks_ * micro_batches_);
  if (p.sums.empty()) {
    p.sums.assign(n, 0.0);
    p.tokens.assign(n, 0.0);
    p.received_of.assign(static_cast<size_t>(ranks_), 0);
  }
  const size_t i = static_cast<size_t>(rank * micro_batches_ + micro);
  SLIDEDP_CHECK(i < n, "evaluation report out of range");
  p.sums[i] = loss_sum;
  p.tokens[i] = tokens;
  ++p.received_of[static_cast<size_t>(rank)];
  ++p.received;
  arrived_.notify_all();
}

void EvalTally::wait_rank(int64_t step, int rank) {
  std::unique_lock lock(mutex_);
  control_.wait(lock, arrived_, [&] {
    const auto it = pending_.find(step);
    return it != pending_.end() && it->second.received_of[static_cast<size_t>(rank)] == micro_batches_;
  });
}

EvalLoss EvalTally::wait(int64_t step) {
  std::unique_lock lock(mutex_);
  const int64_t n = ranks_ * micro_batches_;
  control_.wait(lock, arrived_, [&] { return pending_.count(step) && pending_[step].received == n; });
  EvalLoss r;
  const Pending& p = pending_[step];
  for (size_t i = 0; i < p.sums.size(); ++i) {
    r.loss_sum += p.sums[i];
    r.tokens += p.tokens[i];
  }
  return r;  // the entry stays: a rank may still be waiting on it (wait_rank); a few bytes per evaluation
}

}  // namespace slidedp::exec
