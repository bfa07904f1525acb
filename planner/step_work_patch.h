// Fast plan variants for the search's inner loop. build_step_work costs about as much as one
// critical-path evaluation, and most of it (per-unit FLOPs, capacities, byte counts) is the same for
// every activation mix, buffer depth and chunk size. WorkPatcher builds the work once per (batch
// shape, routes, threads) with every layer offloaded and derives the variants by rewriting only the
// fields those three knobs change. tests/planner/step_work_patch_test.cc checks that every variant is
// field-for-field what build_step_work returns, so a change to the model cannot drift unnoticed.
#pragma once

#include <cstdint>

#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp::planner {

class WorkPatcher {
 public:
  // `plan` fixes ranks, batch shape, routes and threads; its activation, depth and chunk are ignored.
  WorkPatcher(const Workload& w, const Hardware& hw, const Plan& plan);

  // The work of `plan` (same ranks, shape, routes and threads as the constructor's) into `out`.
  void make(const Plan& plan, StepWork& out) const;
  // Only the chunk-dependent fields of `sw` (chunks, grad_chunks).
  void set_chunk(StepWork& sw, int64_t chunk_numel) const;
  // Only the activation-dependent fields (policy, recompute_s, act_offload_bytes).
  void set_activation(StepWork& sw, const Plan& plan) const;

  const StepWork& all_offload() const { return base_; }
  // GPU compute of one step, seconds: A x (forward + backward of every unit + recompute of every
  // layer that does not keep). A lower bound of every plan with this shape and `keep_layers` keep
  // layers: the model's step time is never below its GPU busy time.
  double compute_bound_s(int keep_layers) const;

 private:
  const Workload& w_;
  StepWork base_;       // every decoder layer offloaded, depth 2, smallest chunk of the constructor plan
  int64_t tied_numel_;  // the embedding's flat numel when the head reads it, else 0
  double all_compute_s_ = 0;  // per micro-step with every layer recomputing
  double recompute_s_ = 0;    // one decoder layer's recompute
};

}  // namespace slidedp::planner
