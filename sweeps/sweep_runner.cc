// Sweep evaluation; see sweep_runner.h. The key decision is fairness: every system gets the same
// tokens per step and the same GPU budget (the GPU's memory minus the planner's 512 MiB reserve; context and NCCL buffers are items of the memory account), and
// each gets the best batch shape it can fit under its own memory model. SlideDP additionally chooses
// routes, chunks, activation mix, depth and threads (the planner); baselines keep the choices their
// implementations hard-code (model/step_work.cc, plan_for_system).
#include "sweeps/sweep_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "common/error.h"
#include "common/seconds_since.h"
#include "model/simulator.h"
#include "model/step_model.h"
#include "model/step_work.h"
#include "model/workload.h"
#include "planner/search.h"
#include "planner/search_space.h"

namespace slidedp {
namespace {

std::string join_lines(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, "; ")); }

}  // namespace

std::optional<BaselineChoice> best_baseline_plan(const Workload& w, const Hardware& hw, System system,
                                                 int ranks, int64_t tokens_per_step, std::string* why) {
  SLIDEDP_CHECK(system != System::kSlideDP, "SlideDP's plan comes from the planner");
  const int L = static_cast<int>(w.model.num_layers);
  // The planner's own resolution of "every micro-batch x accumulation split of this step" (micro-batch
  // ascending), so baselines and SlideDP walk the same batch shapes.
  planner::SearchSpec spec;
  spec.ranks = ranks;
  spec.objective = planner::Objective::kMatchedBatch;
  spec.global_batch_tokens = tokens_per_step;
  const planner::SearchSpace space = planner::make_search_space(w, hw, spec);
  // FSDP2 may keep any number of layers' activations (selective checkpointing); the others' policies
  // are fixed by plan_for_system, so one value stands for "as the system does it".
  std::vector<int> keeps = {0};
  if (system == System::kFsdp2) keeps = planner::default_layer_counts(L);

  std::optional<BaselineChoice> best;
  double closest_ratio = std::numeric_limits<double>::infinity();
  std::string closest;
  int64_t candidates = 0;
  for (int keep : keeps) {
    for (const planner::BatchShape& shape : space.shapes) {
      Plan p;
      p.ranks = ranks;
      p.micro_batch = shape.micro_batch;
      p.accum_steps = shape.accum_steps;
      p.offload_layers = 0;
      p.recompute_layers = L - keep;
      p.keep_layers = Plan::kRest;
      ++candidates;
      Prediction pred = predict_analytical(w, hw, p, system);
      if (!pred.feasible) {
        const double ratio =
            pred.memory.gpu_budget_bytes > 0 ? pred.memory.gpu_peak_bytes / pred.memory.gpu_budget_bytes : 0;
        if (ratio < closest_ratio) {
          closest_ratio = ratio;
          closest = fmt::format("closest: {}: {}", plan_for_system(p, system, w.model).summary(L),
                                join_lines(pred.infeasible_reasons));
        }
        // GPU memory only grows with the micro-batch (shapes are in ascending micro-batch order).
        break;
      }
      const bool better = !best || pred.step_time_s < best->predicted.step_time_s ||
                          (pred.step_time_s == best->predicted.step_time_s &&
                           pred.memory.gpu_peak_bytes < best->predicted.memory.gpu_peak_bytes);
      if (better) best = BaselineChoice{p, std::move(pred), 0};
    }
  }
  if (best) best->candidates = candidates;
  if (!best && why)
    *why = fmt::format("no batch shape of {} fits ({} candidates); {}", system_name(system), candidates,
                       closest);
  return best;
}

SweepRow evaluate_point(const SweepSpec& spec, const SweepPoint& pt, bool simulate) {
  const auto t0 = std::chrono::steady_clock::now();
  const SweepGrid& g = spec.grids[static_cast<std::size_t>(pt.grid)];
  const HardwareVariant& hv = g.hardware[static_cast<std::size_t>(pt.hardware)];
  const ModelCard& card = g.models[static_cast<std::size_t>(pt.model)];
  Workload w = make_workload(card, pt.seq_len);
  w.expert_aware_delivery = g.expert_aware_delivery;
  w.router_skew = g.router_skew;
  const int L = static_cast<int>(card.num_layers);

  SweepRow row;
  row.point = pt;
  row.grid = g.name;
  row.hardware = hv.label;
  row.hardware_base = hv.base;
  row.overrides = fmt::format("{}", fmt::join(hv.overrides, " "));
  row.model = card.name;
  row.system = system_name(pt.system);
  row.params = static_cast<double>(card.total_params());
  row.num_layers = L;

  if (pt.system == System::kSlideDP) {
    planner::SearchSpec s;
    s.ranks = pt.ranks;
    s.nodes = pt.nodes;
    s.objective = planner::Objective::kMatchedBatch;
    s.global_batch_tokens = pt.tokens_per_step;
    s.optimizer_states = g.optimizer_states;
    s.verify_updates = g.clip;
    planner::SearchOptions o;
    o.top_k = 1;
    o.rescore_with_simulator = false;  // every system is ranked by the same (analytical) model
    try {
      const planner::SearchResult r = planner::search_plans(w, hv.hw, s, o);
      row.feasible = true;
      row.plan = r.best().plan;
      row.predicted = r.best().predicted;
      row.candidates = r.stats.space_size;
    } catch (const InfeasibleError& e) {
      row.feasible = false;
      row.infeasible_reason = e.what();
    }
  } else if (pt.nodes > 1) {
    row.infeasible_reason = fmt::format("{} runs on one node (multi-node plans are SlideDP's)", system_name(pt.system));
  } else {
    std::string why;
    if (auto c = best_baseline_plan(w, hv.hw, pt.system, pt.ranks, pt.tokens_per_step, &why)) {
      row.feasible = true;
      row.plan = c->plan;
      row.predicted = std::move(c->predicted);
      row.candidates = c->candidates;
    } else {
      row.infeasible_reason = why;
    }
  }
  if (row.feasible && simulate) {
    SimulatorOptions so;
    so.record_timeline = false;
    try {
      row.simulated = slidedp::simulate(w, hv.hw, row.plan, pt.system, so).prediction;
    } catch (const SimulationTooLarge&) {
      row.too_large_to_simulate = true;  // scored by the analytical model; the report counts these
    }
  }
  if (row.feasible) {
    row.plan = plan_for_system(row.plan, pt.system, card);
    row.plan_summary = row.plan.summary(L);
  }
  // The reason is one line in CSV and tables.
  std::replace(row.infeasible_reason.begin(), row.infeasible_reason.end(), '\n', ' ');
  row.eval_s = seconds_since(t0);
  return row;
}

SweepResult run_sweep(const SweepSpec& spec, const SweepRunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SweepResult res;
  res.spec = spec;
  res.simulated = options.simulate || spec.simulate;
  const std::vector<SweepPoint> points = expand_points(spec);
  res.rows.reserve(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    res.rows.push_back(evaluate_point(spec, points[i], res.simulated));
    if (options.progress)
      options.progress(static_cast<int>(i + 1), static_cast<int>(points.size()), res.rows.back());
  }
  res.wall_s = seconds_since(t0);
  return res;
}

}  // namespace slidedp
