// The discrete-event simulator: the step's work (step_work.h) as tasks per rank, unit and chunk, on
// CUDA-like in-order streams (each rank's compute, H2D, D2H and fabric; one host CPU update queue),
// with fair sharing of every shared resource (fluid_engine.h). It returns the same Prediction as the
// analytical model, plus a timeline that chrome_trace.h writes for Perfetto.
#pragma once

#include <string>
#include <vector>

#include "model/prediction.h"
#include "model/step_work.h"

namespace slidedp {

struct TimelineSpan {
  std::string track;     // "rank 0 / gpu", "rank 0 / h2d", "host / cpu update", ...
  std::string name;      // "fwd L3", "h2d L3 c1", "adamw L3 c1"
  std::string category;  // compute | h2d | d2h | fabric | cpu
  double start_s = 0;
  double end_s = 0;
};

struct SimulatorOptions {
  int steps = 2;               // full steps simulated; the last is measured up to the next step's first compute
  bool record_timeline = true;
  bool measure_sync = true;    // a second run without latencies splits out sync time
};

struct Simulation {
  Prediction prediction;
  std::vector<TimelineSpan> timeline;
  int tasks = 0;  // tasks simulated (for benchmarks)
};

Simulation simulate_step_work(const StepWork& sw, const SimulatorOptions& options = {});
Simulation simulate(const Workload& w, const Hardware& hw, const Plan& plan, System system,
                    const SimulatorOptions& options = {});

}  // namespace slidedp
