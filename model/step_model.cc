// Analytical step-time model; see step_model.h and docs/MODEL.md for the derivation. The recurrence
// itself is step_recurrence.cc (and its jump over runs of identical layers, regime_jump.h); this file
// turns its passes into a Prediction: busy times, bottleneck, breakdown, throughput.
#include "model/step_model.h"

#include <algorithm>
#include <initializer_list>

#include "model/memory_model.h"
#include "model/step_recurrence.h"

namespace slidedp {

double pipelined_time(std::initializer_list<double> stage_s, double chunks) {
  double sum = 0, mx = 0;
  for (double s : stage_s) {
    sum += s;
    mx = std::max(mx, s);
  }
  return sum / chunks + (chunks - 1.0) / chunks * mx;
}

Prediction evaluate_step_work(const StepWork& sw, ModelFidelity fidelity, bool jump_regime,
                              RecurrenceCounters* counters) {
  RecurrenceCounters done;
  const Passes passes = run_passes(sw, fidelity, jump_regime, done);
  const RunResult& critical = passes.critical;
  const RunResult& with = fidelity == ModelFidelity::kContention ? passes.contended : passes.critical;
  const Capacities& c = sw.cap;
  Prediction p;
  p.method = "analytical";
  // Busy time per resource (rank 0 for per-rank resources), with latencies. It is the work, the
  // same in every pass; taking it from the uncontended pass gives both fidelities the same lower
  // bound bit for bit (the passes' jumps sum it in different orders), which the planner's pruning
  // by the critical path relies on.
  const RunResult& work = critical;
  double emulated_compute_threads = c.emulated ? sw.ranks * work.compute_s * c.host_threads_per_device : 0.0;
  p.busy_s[resource::kGpuCompute] = work.compute_s;
  p.busy_s[resource::kH2D] = work.h2d_bytes / c.h2d_link_Bps + work.h2d_copies * c.link_latency_s;
  p.busy_s[resource::kD2H] = work.d2h_bytes / c.d2h_link_Bps + work.d2h_copies * c.link_latency_s;
  p.busy_s[resource::kDuplex] = (work.h2d_bytes + work.d2h_bytes) / c.duplex_Bps;
  p.busy_s[resource::kH2DRoot] = sw.ranks * work.h2d_bytes / c.h2d_root_Bps;
  p.busy_s[resource::kD2HRoot] = sw.ranks * work.d2h_bytes / c.d2h_root_Bps;
  p.busy_s[resource::kHostMem] = work.host_mem_bytes / c.host_mem_Bps;
  p.busy_s[resource::kCpuUpdate] = work.cpu_update_thread_s / c.update_threads;
  p.busy_s[resource::kCpuCores] = (work.cpu_update_thread_s + work.cpu_core_thread_s + emulated_compute_threads) / c.cpu_cores;
  if (sw.ranks > 1) p.busy_s[resource::kFabric] = work.fabric_s;
  if (c.nodes > 1) p.busy_s[resource::kNetwork] = work.network_s;
  for (const auto& [name, busy] : p.busy_s) p.lower_bound_s = std::max(p.lower_bound_s, busy);

  // The critical path without contention (a max-plus recurrence plus the phase bounds) is monotone
  // in every capacity; the mean-field contention on top of it is not (docs/MODEL.md, "Monotonicity").
  p.critical_path_s = critical.step_s;
  p.step_time_s = with.step_s;
  p.breakdown = with.breakdown;
  if (fidelity == ModelFidelity::kContention) {
    // Latency on the critical path: the uncontended pipeline with and without per-copy and
    // per-collective latencies. It is taken out of the stall (where latencies show up), never more.
    double sync = critical.step_s - passes.no_latency.step_s;
    sync = std::clamp(sync, 0.0, std::max(0.0, p.breakdown.stall_s));
    p.breakdown.sync_s = sync;
    p.breakdown.stall_s -= sync;
  }
  // Contention only slows streams down, but the two-step steady-state estimate can come out a hair
  // below the uncontended critical path (step 1's slowdown delays step 2's start more than its end).
  // Floor it there, so the critical path is a true lower bound of the full model (the planner prunes
  // with it), and at the resource bound.
  const double floor = std::max(p.lower_bound_s, fidelity == ModelFidelity::kContention ? p.critical_path_s : 0.0);
  if (floor > p.step_time_s) {
    p.breakdown.stall_s += floor - p.step_time_s;
    p.step_time_s = floor;
  }
  add_sync_term(p, c.sync_factor);
  add_bottleneck_and_throughput(p, static_cast<double>(sw.tokens_per_step), sw.model_flops_per_step, sw.ranks * c.nodes);
  p.exposed_s = p.step_time_s - with.compute_s;
  if (counters) *counters = done;
  return p;
}

Prediction predict_analytical(const Workload& w, const Hardware& hw, const Plan& plan, System system) {
  StepWork sw = build_step_work(w, hw, plan, system);
  Prediction p = evaluate_step_work(sw);
  p.system = system_name(system);
  p.memory = estimate_memory(w, hw, plan, system);
  p.infeasible_reasons = p.memory.violations();
  p.feasible = p.infeasible_reasons.empty();
  return p;
}

}  // namespace slidedp
