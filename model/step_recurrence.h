// The step model's recurrence (step_recurrence.cc): the passes of one evaluation and what each
// pass measured. step_model.cc turns them into a Prediction.
#pragma once

#include <vector>

#include "model/contention.h"
#include "model/prediction.h"
#include "model/step_model.h"
#include "model/step_work.h"

namespace slidedp {

// One step of the recurrence: its time, breakdown, the work it did and its phases.
struct RunResult {
  double step_s = 0;
  double first_compute_s = 0;
  Breakdown breakdown;
  // Totals for the busy times.
  double h2d_bytes = 0, d2h_bytes = 0, fabric_s = 0, h2d_copies = 0, d2h_copies = 0;
  double host_mem_bytes = 0, cpu_update_thread_s = 0, cpu_core_thread_s = 0, compute_s = 0;
  double network_s = 0;  // several nodes: this node's network busy time (latencies included)
  // 2 per micro-step the recurrence ran (forward, backward + drain); micro_repeat[m]: the micro-steps
  // the m-th pair stands for (contention.h).
  std::vector<PhaseStats> phases;
  std::vector<long> micro_repeat;
};

// The passes of one evaluation, all one recurrence continued from where the last ended: two steps
// without contention (the first starts cold; the second is the critical path), then, for
// kContention, one step without latencies from there (the synchronisation figure) and one step
// with the phases' contention factors (solve_contention).
struct Passes {
  RunResult critical, no_latency, contended;
};

// `jump`: jump over the periodic regime of runs of identical layers (regime_jump.h) and of the
// middle micro-steps of a long accumulation (MicroStepJump in step_recurrence.cc); `counters`
// receives what the evaluation did.
Passes run_passes(const StepWork& sw, ModelFidelity fidelity, bool jump, RecurrenceCounters& counters);

}  // namespace slidedp
