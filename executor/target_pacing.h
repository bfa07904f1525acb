// What each operation of a run would cost on a target machine, so the CPU backend can run at that
// machine's ratios (slidedp-run --emulate): the step model's own per-unit work for the plan on the
// target hardware (model/step_work.h) -- GPU seconds per unit pass, bytes per delivery and gradient,
// CPU thread-seconds and host-memory bytes per update -- turned into flows for the pacer
// (executor/cpu/pacer.h). A paced run does every operation for real and then holds it until the
// target would be done, with time stretched by the scale S; the model's prediction for the target,
// times S, is what it should measure. What this checks and what it cannot: docs/EXECUTOR.md.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "executor/cpu/pacer.h"
#include "model/copy_bytes.h"
#include "model/hardware.h"
#include "model/plan.h"
#include "model/step_work.h"
#include "model/system.h"
#include "model/workload.h"

namespace slidedp::exec {

struct PacedWork {
  Pacer::Usages usages;
  double work = 0;     // units of the usages: GPU seconds, bytes or thread-seconds on the target
  double delay_s = 0;  // fixed latency on the target (per copy, per collective)
};

// The time scales a run may pace at: below 1e-3 a target's second passes in under a millisecond here
// and the paced clock's rounding stops it making progress; above 1e6 one second of the target takes
// eleven days here.
inline constexpr double kMinTimeScale = 1e-3, kMaxTimeScale = 1e6;

class TargetPacing {
 public:
  // Throws InputError naming `target.name` when the profile lacks a rate the pacing needs. `system`:
  // whose data movement the run does (the baselines' work differs, model/step_work.h).
  TargetPacing(const Workload& w, const Hardware& target, const Plan& plan, double time_scale,
               System system = System::kSlideDP);

  const std::string& target_name() const { return target_name_; }
  double time_scale() const { return pacer_->time_scale(); }
  Pacer& pacer() const { return *pacer_; }
  const StepWork& work() const { return sw_; }

  // One pass of unit `unit` on `rank`: "fwd" (the head's includes its fused backward), "bwd", "recompute".
  PacedWork compute(int rank, int unit, const std::string& op) const;
  // A copy of `elements` of `kind`, weighed as the step model weighs them (model/copy_bytes.h): the
  // work is the target's bytes, which the copy's span reports (MeasuredSpan::bytes).
  PacedWork copy(int rank, bool h2d, CopyKind kind, double elements) const;
  // A copy the model does not charge (token ids, the loss, counters): `bytes` as they are.
  PacedWork copy(int rank, bool h2d, double bytes) const;
  // One rank's part of a collective: `bytes_per_port` on that rank's fabric port at the all-gather's
  // or the reduce-scatter's bus bandwidth. Every rank paces its own part (after the rendezvous), so a
  // collective takes as long as the simulator's one task over all ports.
  PacedWork collective(int rank, bool all_gather, double bytes_per_port) const;
  // The host's update work for `elements` of `unit`: the fused reduce + AdamW on the last micro-step,
  // the accumulation on earlier ones; `rank_share` of it (1: all ranks' contributions at once; 1/N: one
  // rank's, when ranks add their gradients one at a time). SlideFormer's two barriers per chunk add
  // their latency.
  PacedWork update(int unit, int64_t elements, bool last_micro, double rank_share = 1.0) const;
  // SlideFormer: one rank's conversion of `elements` of `unit`'s fp32 master to bf16 before delivery.
  PacedWork convert(int rank, int unit, int64_t elements) const;
  // FSDP2: AdamW of `elements` of `rank`'s sharded state on its GPU (its share of the model's
  // post-backward GPU optimizer time).
  PacedWork device_update(int rank, int64_t elements) const;
  // Verify mode (clipping, skipping): the whole update after the backward, every parameter at once.
  PacedWork post_backward_update() const;

  // A time scale at which this host's real work fits inside the paced time: one decoder layer's
  // forward and backward and the head's pass are timed here (the CPU backend's kernels, one thread,
  // the plan's micro-batch), their largest ratio to the target's time is taken, times the share of a
  // core each emulated device gets (ranks + the updater on this host's cores), times 1.5 for noise.
  static double measured_time_scale(const Workload& w, const Hardware& target, const Plan& plan,
                                    System system = System::kSlideDP);

 private:
  std::string target_name_;
  StepWork sw_;
  std::unique_ptr<Pacer> pacer_;
};

}  // namespace slidedp::exec
