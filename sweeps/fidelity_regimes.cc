// Regime plans for a paced fidelity study; see fidelity_regimes.h.
#include "sweeps/fidelity_regimes.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <tuple>

namespace slidedp {
namespace {

std::vector<FidelityPlan> grid(int max_ranks) {
  std::vector<int> rank_counts = {1, 2, max_ranks};
  std::sort(rank_counts.begin(), rank_counts.end());
  rank_counts.erase(std::unique(rank_counts.begin(), rank_counts.end()), rank_counts.end());
  std::erase_if(rank_counts, [&](int r) { return r > max_ranks || r < 1; });
  std::vector<FidelityPlan> out;
  for (int ranks : rank_counts)
    for (int mb : {1, 2})
      for (int accum : {1, 4})
        for (ParamRoute pr : {ParamRoute::kReplicated, ParamRoute::kSharded})
          for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu})
            for (int threads : {0, 8})
              for (int64_t chunk : {int64_t{1} << 18, int64_t{1} << 22})
              for (bool recompute : {false, true}) {
                if (ranks == 1 && (pr == ParamRoute::kSharded || gr == GradRoute::kGpu)) continue;
                FidelityPlan f;
                Plan& p = f.plan;
                p.ranks = ranks;
                p.micro_batch = mb;
                p.accum_steps = accum;
                p.param_route = pr;
                p.grad_route = gr;
                p.update_threads = threads;
                p.chunk_numel = chunk;
                p.gpu_buffer_depth = 2;
                p.offload_layers = 0;
                p.recompute_layers = recompute ? -1 : 0;
                p.keep_layers = recompute ? 0 : -1;
                out.push_back(f);
              }
  return out;
}

}  // namespace

RegimeSelection regime_fidelity_plans(const Workload& w, const Hardware& target, int per_resource, int max_ranks,
                                      double min_margin, double max_margin) {
  const int L = static_cast<int>(w.model.num_layers);
  std::map<std::string, std::vector<RegimeCandidate>> by_resource;
  RegimeSelection sel;
  for (FidelityPlan& f : grid(std::min(max_ranks, target.gpu.count))) {
    if (f.plan.recompute_layers < 0) f.plan.recompute_layers = L;
    if (f.plan.keep_layers < 0) f.plan.keep_layers = L;
    RegimeCandidate c;
    c.predicted = predict_for_fidelity(w, target, f.plan);
    if (!c.predicted.feasible) continue;
    ++sel.grid_size;
    double first = 0, second = 0;
    for (const auto& [r, b] : c.predicted.busy) {
      if (b > first)
        second = first, first = b;
      else if (b > second)
        second = b;
    }
    c.margin = second > 0 ? first / second : 1e9;
    ++sel.candidates_per_resource[c.predicted.bottleneck];
    if (c.margin < min_margin || c.margin > max_margin) continue;
    c.plan = f;
    by_resource[c.predicted.bottleneck].push_back(c);
  }
  // Per resource, the cheapest to run paced first: a paced run takes the time scale x the step, and
  // the scale grows with the host's work per operation (the micro-batch) and the emulated devices per
  // core. Plans that differ from those already taken in ranks, routes or accumulation go first.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  auto cost = [&](const RegimeCandidate& c) {
    return c.predicted.step * std::max(1.0, (c.plan.plan.ranks + 1.0) / cores) * c.plan.plan.micro_batch;
  };
  for (const auto& [resource, cat] : fidelity_resources()) {
    std::vector<RegimeCandidate>& v = by_resource[resource];
    std::stable_sort(v.begin(), v.end(), [&](const RegimeCandidate& a, const RegimeCandidate& b) { return cost(a) < cost(b); });
    std::vector<std::size_t> taken;
    auto shape = [&](std::size_t i) {
      const Plan& p = v[i].plan.plan;
      return std::tuple(p.ranks, p.param_route, p.grad_route, p.accum_steps);
    };
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t i = 0; i < v.size() && static_cast<int>(taken.size()) < per_resource; ++i) {
        if (std::find(taken.begin(), taken.end(), i) != taken.end()) continue;
        const bool new_shape = std::none_of(taken.begin(), taken.end(), [&](std::size_t t) { return shape(t) == shape(i); });
        if (pass == 1 || new_shape) taken.push_back(i);
      }
    std::sort(taken.begin(), taken.end());
    for (std::size_t i : taken) sel.chosen.push_back(v[i]);
  }
  for (std::size_t i = 0; i < sel.chosen.size(); ++i) {
    sel.chosen[i].plan.name = fmt::format("r{:02d}", i + 1);
    sel.plans.push_back(sel.chosen[i].plan);
  }
  return sel;
}

}  // namespace slidedp
