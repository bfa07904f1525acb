// The discrete-event simulator: the step's work (step_work.h) as tasks per rank, unit and chunk, on
// CUDA-like in-order streams (each rank's compute, H2D, D2H and fabric; one host CPU update queue),
// with fair sharing of every shared resource (fluid_engine.h). It returns the same Prediction as the
// analytical model, plus a timeline that chrome_trace.h writes for Perfetto.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
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

// The simulator holds every task of the simulated steps at once (a few hundred bytes each, growing
// with micro-steps x units x chunks), so a step too large for it is refused once its graph reaches
// this many tasks (about 1 GiB) rather than exhausting the host's memory. The analytical model has
// no such limit.
constexpr std::int64_t kMaxSimulatedTasks = 4'000'000;

struct SimulatorOptions {
  int steps = 2;               // full steps simulated; the last is measured up to the next step's first compute
  bool record_timeline = true;
  bool measure_sync = true;    // a second run without latencies splits out sync time
  std::int64_t max_tasks = kMaxSimulatedTasks;  // per graph; a larger one throws SimulationTooLarge
};

// A step whose graph passes SimulatorOptions::max_tasks. An input error (exit 2: the user asked the
// simulator for a step it cannot hold); the planner's re-scoring and sweeps catch it and keep the
// analytical prediction.
class SimulationTooLarge : public InputError {
 public:
  explicit SimulationTooLarge(const std::string& what) : InputError("", what) {}
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
