// The analytical step-time model: a per-unit recurrence over the GPU's compute stream, each rank's
// H2D and D2H copy streams, the fabric and the CPU update stream (ranks are symmetric, chunks are
// pipelined in closed form), checked against resource bounds (the links per phase, host memory and
// CPU as a queue across the step). It is O(units x micro-steps), and runs of identical layers are
// jumped once their periodic regime sets in, so the planner can score ~10^5 plans/s. The
// discrete-event simulator (simulator.h) schedules the same work per chunk and per rank with fair
// sharing and is the reference this model is tested against.
#pragma once

#include "model/hardware.h"
#include "model/plan.h"
#include "model/prediction.h"
#include "model/step_work.h"
#include "model/system.h"
#include "model/workload.h"

namespace slidedp {

// Full prediction: feasibility (memory), step time, breakdown, resources, throughput.
Prediction predict_analytical(const Workload& w, const Hardware& hw, const Plan& plan,
                              System system = System::kSlideDP);

// How much of the model to evaluate. kCriticalPath is the pipeline recurrence with the resource
// bounds but no sharing slowdowns: a lower bound on kContention, monotone in every capacity, and
// about five times faster, so the planner prunes with it.
enum class ModelFidelity { kCriticalPath, kContention };

// What one evaluation did, for tests and benchmarks: units the recurrence ran (verifications
// included), jumps taken over runs of identical layers, the layers they covered, and the units run
// to verify a jump (failed ones included).
struct RecurrenceCounters {
  long unit_visits = 0, jumps = 0, layers_jumped = 0, verifications = 0;
  // Jumps over the periodic middle of a step's micro-steps, the micro-steps they covered, and the
  // micro-steps run to verify them.
  long micro_jumps = 0, micro_steps_jumped = 0, micro_verifications = 0;
  RecurrenceCounters& operator+=(const RecurrenceCounters& o) {
    unit_visits += o.unit_visits, jumps += o.jumps, layers_jumped += o.layers_jumped;
    verifications += o.verifications, micro_jumps += o.micro_jumps;
    micro_steps_jumped += o.micro_steps_jumped, micro_verifications += o.micro_verifications;
    return *this;
  }
};

// Step time and breakdown of prebuilt work (no memory estimate): the planner's inner loop.
// `jump_regime` = false runs the recurrence through every layer: the reference for the jump over
// runs of identical layers, which gives the same result up to rounding (docs/MODEL.md, section 2).
Prediction evaluate_step_work(const StepWork& sw, ModelFidelity fidelity = ModelFidelity::kContention,
                              bool jump_regime = true, RecurrenceCounters* counters = nullptr);

// Time for `chunks` equal chunks to flow through stages whose whole-unit durations are given:
// sum(s)/c + (c-1)/c * max(s). Exact for a chunk-pipelined chain of dedicated stages.
double pipelined_time(std::initializer_list<double> stage_s, double chunks);

}  // namespace slidedp
