// Evaluation while training (slidedp-run --eval-data FILE --eval-every N): after step s every rank runs
// the forward of its share of the held-out sequences with the weights step s produced (parameters
// delivered as for step s + 1, no gradient leaves the device, nothing is updated) and reports each
// micro-batch's (loss sum, counted targets); the trainer waits for its node's reports, adds every
// node's, and logs the mean token loss over the whole held-out file.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "executor/node_link.h"
#include "executor/run_control.h"

namespace slidedp::exec {

struct EvalLoss {
  double loss_sum = 0;        // summed token losses (nats)
  double tokens = 0;          // targets that count
  double loss() const;        // mean token loss; NaN without tokens
  double perplexity() const;  // exp(loss)
};

// How the held-out sequences are shared: micro-batch m of global rank r (of R) covers sequences
// [(m R + r) B, (m R + r + 1) B), in file order; rows past the last sequence are padding that counts
// nothing. Every rank runs the same number of micro-batches (the collectives of sharded deliveries
// need every rank).
int64_t eval_micro_batches(int64_t sequences, int64_t global_ranks, int64_t micro_batch);
inline int64_t eval_first_sequence(int64_t micro, int global_rank, int global_ranks, int64_t micro_batch) {
  return (micro * global_ranks + global_rank) * micro_batch;
}

// Every node's sums added in node order (each node's own from its tally); every node gets the same.
EvalLoss sum_over_nodes(NodeLink& link, const EvalLoss& mine, const RunControl* control);

// This node's reports of each evaluation, summed in a fixed order (rank, then micro-batch) whatever
// order they arrive in, so that the result does not depend on stream timing.
class EvalTally {
 public:
  EvalTally(const RunControl& control, int ranks, int64_t micro_batches);
  // Thread-safe; called from the ranks' streams.
  void report(int64_t step, int rank, int64_t micro, double loss_sum, double tokens);
  // Blocks until every rank's every micro-batch of `step` has reported (throws Aborted once the run is
  // aborted) and returns their sum.
  EvalLoss wait(int64_t step);
  // Blocks until every micro-batch of `rank` for `step` has reported (throws Aborted once the run is
  // aborted): the rank's evaluation is off its streams.
  void wait_rank(int64_t step, int rank);

 private:
  const RunControl& control_;
  int ranks_;
  int64_t micro_batches_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  struct Pending {
    std::vector<double> sums, tokens;
    std::vector<int64_t> received_of;  // per rank
    int64_t received = 0;
  };
  std::map<int64_t, Pending> pending_;
};

}  // namespace slidedp::exec
