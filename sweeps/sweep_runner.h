// Evaluates sweep points with the step model. SlideDP's plan at each point is the planner's choice
// (search_plans, matched batch, ranked by the analytical model). A baseline gets the same tokens per
// step and the best plan it can run: its fixed choices (plan_for_system) with every micro-batch x
// accumulation split of the step searched under its own memory model, and for FSDP2 also how many
// layers keep their activations (the rest recompute), since FSDP2 users pick checkpointing freely.
// Optionally every chosen plan is re-scored by the discrete-event simulator.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/plan.h"
#include "model/prediction.h"
#include "sweeps/sweep_spec.h"

namespace slidedp {

// One evaluated point: where it is, the plan chosen for it (as the system runs it) and what the model
// says about that plan.
struct SweepRow {
  SweepPoint point;
  std::string grid, hardware, hardware_base, overrides, model, system;
  double params = 0;  // model parameters
  int num_layers = 0;
  bool feasible = false;
  std::string infeasible_reason;  // when no plan fits: the closest miss
  Plan plan;                      // chosen plan after plan_for_system (the system's fixed choices applied)
  std::string plan_summary;
  Prediction predicted;                 // analytical model (kContention)
  std::optional<Prediction> simulated;  // when the sweep re-scores with the simulator
  bool too_large_to_simulate = false;   // re-scoring asked for, but the simulator cannot hold the step
  int64_t candidates = 0;               // plans considered for this point
  double eval_s = 0;                    // wall time of choosing and scoring the plan

  // The figure every analysis uses: the simulator's when present, else the analytical model's.
  const Prediction& scored() const { return simulated ? *simulated : predicted; }
  double tokens_per_s() const { return feasible ? scored().tokens_per_s : 0.0; }
  // The analytical model's figure alone (the simulator cross-check compares the two).
  double analytical_tokens_per_s() const { return feasible ? predicted.tokens_per_s : 0.0; }
};

struct SweepRunOptions {
  bool simulate = false;  // or the spec's `simulate: true`
  // Called after each point: (done, total, row).
  std::function<void(int, int, const SweepRow&)> progress;
};

struct SweepResult {
  SweepSpec spec;
  std::vector<SweepRow> rows;  // in expand_points order
  bool simulated = false;
  double wall_s = 0;
};

// Evaluates one point. Infeasible points are rows with feasible = false, not errors.
SweepRow evaluate_point(const SweepSpec& spec, const SweepPoint& point, bool simulate);

SweepResult run_sweep(const SweepSpec& spec, const SweepRunOptions& options = {});

// Baselines' plan search, exposed for tests: the best plan of `system` for this workload and step
// size, or nullopt with the closest miss in `why` when none fits.
struct BaselineChoice {
  Plan plan;  // before plan_for_system (what predict_analytical takes)
  Prediction predicted;
  int64_t candidates = 0;
};
std::optional<BaselineChoice> best_baseline_plan(const Workload& w, const Hardware& hw, System system,
                                                 int ranks, int64_t tokens_per_step, std::string* why);

}  // namespace slidedp
