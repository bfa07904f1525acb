// Sweep analyses; see sweep_analysis.h. Ratios are only taken where both systems fit the point: a
// baseline that cannot run a point is counted (baseline_infeasible), never given a speedup of infinity.
#include "sweeps/sweep_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace slidedp {
namespace {

bool matches(const SweepRow& r, const std::string& hardware, const std::string& model) {
  return (hardware.empty() || r.hardware == hardware) && (model.empty() || r.model == model);
}

std::string pct(double x) { return fmt::format("{:.1f}%", 100.0 * x); }

// The rows of `rows` matching the filters, indexed by case.
CaseMap filtered_cases(const std::vector<SweepRow>& rows, const std::string& hardware,
                       const std::string& model) {
  CaseMap m;
  for (const SweepRow& r : rows)
    if (matches(r, hardware, model)) m[case_key(r.point)][r.point.system] = &r;
  return m;
}

std::vector<System> baselines_in(const std::vector<SweepRow>& rows) {
  std::vector<System> out;
  for (const SweepRow& r : rows)
    if (r.point.system != System::kSlideDP && std::find(out.begin(), out.end(), r.point.system) == out.end())
      out.push_back(r.point.system);
  return out;
}

double figure_of(const SweepRow& r, Figure f) {
  return f == Figure::kScored ? r.tokens_per_s() : r.analytical_tokens_per_s();
}

SpeedupStat speedup_over(const std::vector<const std::map<System, const SweepRow*>*>& cases, System baseline,
                         Figure figure) {
  SpeedupStat s;
  s.baseline = system_name(baseline);
  std::vector<double> ratios;
  for (const auto* c : cases) {
    auto sd = c->find(System::kSlideDP), b = c->find(baseline);
    if (sd == c->end() || b == c->end()) continue;
    if (!sd->second->feasible) {
      ++s.slidedp_infeasible;
      continue;
    }
    if (!b->second->feasible) {
      ++s.baseline_infeasible;
      continue;
    }
    ratios.push_back(figure_of(*sd->second, figure) / figure_of(*b->second, figure));
  }
  s.points = static_cast<int>(ratios.size());
  if (!ratios.empty()) {
    s.geomean = geometric_mean(ratios);
    s.min = *std::min_element(ratios.begin(), ratios.end());
    s.max = *std::max_element(ratios.begin(), ratios.end());
  }
  return s;
}

}  // namespace

CaseKey case_key(const SweepPoint& p) {
  return {p.grid, p.hardware, p.model, p.seq_len, p.ranks, p.batch_value};
}

CaseMap index_cases(const std::vector<SweepRow>& rows) {
  CaseMap m;
  for (const SweepRow& r : rows) m[case_key(r.point)][r.point.system] = &r;
  return m;
}

double geometric_mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / static_cast<double>(v.size()));
}

std::string format_tokens(int64_t t) {
  if (t >= (int64_t{1} << 20) && t % (int64_t{1} << 20) == 0) return fmt::format("{}M", t >> 20);
  if (t >= 1024 && t % 1024 == 0) return fmt::format("{}K", t >> 10);
  return fmt::format("{}", t);
}

std::vector<SpeedupStat> speedup_stats(const std::vector<SweepRow>& rows, Figure figure) {
  // Groups: cases sharing everything but the batch.
  struct GroupKey {
    int grid, hardware, model;
    int64_t seq_len;
    int ranks;
    auto operator<=>(const GroupKey&) const = default;
  };
  std::map<GroupKey, std::vector<const std::map<System, const SweepRow*>*>> groups;
  std::map<GroupKey, const SweepRow*> any;
  const CaseMap cases = index_cases(rows);
  for (const auto& [k, c] : cases) {
    GroupKey g{k.grid, k.hardware, k.model, k.seq_len, k.ranks};
    groups[g].push_back(&c);
    any.emplace(g, c.begin()->second);
  }
  std::vector<SpeedupStat> out;
  const std::vector<System> baselines = baselines_in(rows);
  for (const auto& [g, cs] : groups) {
    for (System b : baselines) {
      SpeedupStat s = speedup_over(cs, b, figure);
      if (s.points == 0 && s.baseline_infeasible == 0 && s.slidedp_infeasible == 0)
        continue;  // not in this grid
      const SweepRow* r = any.at(g);
      s.hardware = r->hardware;
      s.model = r->model;
      s.seq_len = g.seq_len;
      s.ranks = g.ranks;
      out.push_back(s);
    }
  }
  return out;
}

std::vector<SpeedupStat> speedup_totals(const std::vector<SweepRow>& rows, const std::string& hardware,
                                        const std::string& model, Figure figure) {
  const CaseMap cases = filtered_cases(rows, hardware, model);
  std::vector<const std::map<System, const SweepRow*>*> all;
  for (const auto& [k, c] : cases) all.push_back(&c);
  std::vector<SpeedupStat> out;
  for (System b : baselines_in(rows)) {
    SpeedupStat s = speedup_over(all, b, figure);
    s.hardware = hardware;
    s.model = model;
    out.push_back(s);
  }
  return out;
}

std::vector<LongestFit> longest_fits(const std::vector<SweepRow>& rows) {
  struct Key {
    int grid, hardware, model, ranks;
    int64_t batch;
    System system;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : rows)
    by[{r.point.grid, r.point.hardware, r.point.model, r.point.ranks, r.point.batch_value, r.point.system}]
        .push_back(&r);
  std::vector<LongestFit> out;
  for (auto& [k, v] : by) {
    std::sort(v.begin(), v.end(),
              [](const SweepRow* a, const SweepRow* b) { return a->point.seq_len < b->point.seq_len; });
    LongestFit f;
    f.hardware = v.front()->hardware;
    f.model = v.front()->model;
    f.system = v.front()->system;
    f.ranks = k.ranks;
    f.batch_value = k.batch;
    for (const SweepRow* r : v) {
      if (r->feasible) {
        f.longest_seq = r->point.seq_len;
        f.tokens_per_s = r->tokens_per_s();
        f.plan = r->plan_summary;
        f.first_failing_seq = 0;
        f.why.clear();
      } else if (f.first_failing_seq == 0) {
        f.first_failing_seq = r->point.seq_len;
        f.why = r->infeasible_reason;
      }
    }
    out.push_back(f);
  }
  return out;
}

std::vector<ComputeBound> compute_bound_thresholds(const std::vector<SweepRow>& rows) {
  std::map<std::tuple<int, int, int, int, int64_t>, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : rows)
    if (r.point.system == System::kSlideDP && r.feasible)
      by[{r.point.grid, r.point.hardware, r.point.ranks, r.point.model, r.point.seq_len}].push_back(&r);
  std::vector<ComputeBound> out;
  for (auto& [k, v] : by) {
    std::sort(v.begin(), v.end(), [](const SweepRow* a, const SweepRow* b) {
      return a->point.tokens_per_step < b->point.tokens_per_step;
    });
    ComputeBound c;
    c.grid = v.front()->grid;
    c.hardware = v.front()->hardware;
    c.model = v.front()->model;
    c.ranks = std::get<2>(k);
    c.seq_len = std::get<4>(k);
    c.smallest_tokens = v.front()->point.tokens_per_step;
    c.smallest_tokens_per_s = v.front()->tokens_per_s();
    c.smallest_binding = v.front()->scored().bottleneck;
    // Walk down from the largest point while GPU compute binds.
    std::size_t first = v.size();
    while (first > 0 && v[first - 1]->scored().bottleneck == "gpu_compute") --first;
    if (first < v.size()) {
      c.from_tokens = v[first]->point.tokens_per_step;
      c.tokens_per_s_from = v[first]->tokens_per_s();
    }
    const SweepRow* below = first > 0 ? v[first - 1] : nullptr;
    if (below != nullptr) {
      const Prediction& p = below->scored();
      c.below_tokens = below->point.tokens_per_step;
      c.below_binding = p.bottleneck;
      c.below_exposed_share = p.step_time_s > 0 ? p.exposed_s / p.step_time_s : 0.0;
    }
    out.push_back(c);
  }
  return out;
}

std::vector<ScalingPoint> scaling_points(const SweepResult& result) {
  struct Key {
    int grid, hardware, model;
    int64_t seq;
    int64_t batch;
    System system;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : result.rows)
    by[{r.point.grid, r.point.hardware, r.point.model, r.point.seq_len, r.point.batch_value, r.point.system}]
        .push_back(&r);
  std::vector<ScalingPoint> out;
  for (auto& [k, v] : by) {
    if (v.size() < 2) continue;  // one rank count: nothing to scale
    const auto gpus = [](const SweepRow* r) { return r->point.nodes * r->point.ranks; };
    std::sort(v.begin(), v.end(), [&](const SweepRow* a, const SweepRow* b) { return gpus(a) < gpus(b); });
    const SweepRow* base = v.front();
    const bool weak =
        result.spec.grids[static_cast<std::size_t>(k.grid)].batch_mode == BatchMode::kSequencesPerRank;
    for (const SweepRow* r : v) {
      ScalingPoint s;
      s.hardware = r->hardware;
      s.model = r->model;
      s.system = r->system;
      s.seq_len = k.seq;
      s.weak = weak;
      s.batch_value = k.batch;
      s.ranks = gpus(r);
      s.base_ranks = gpus(base);
      s.nodes = r->point.nodes;
      s.tokens_per_s = r->tokens_per_s();
      s.bottleneck = r->feasible ? r->scored().bottleneck : "";
      if (r->feasible) {
        s.host_state = r->point.nodes > 1 ? host_state_name(r->plan.host_state) : "";
        s.host_gib = r->predicted.memory.host_bytes / (1024.0 * 1024 * 1024);
      }
      if (base->feasible && r->feasible) {
        s.speedup = r->tokens_per_s() / base->tokens_per_s();
        s.efficiency = s.speedup * s.base_ranks / s.ranks;
      }
      out.push_back(s);
    }
  }
  return out;
}

std::vector<ClaimResult> evaluate_claims(const SweepResult& result) {
  std::vector<ClaimResult> out;
  const std::vector<SweepRow>& rows = result.rows;
  for (const PaperClaim& c : result.spec.claims) {
    ClaimResult cr;
    cr.claim = c;
    if (c.metric == "speedup_geomean") {
      std::vector<std::string> parts;
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      int points = 0;
      for (const SpeedupStat& s : speedup_totals(rows, c.hardware, c.model)) {
        if (!c.baselines.empty() &&
            std::find(c.baselines.begin(), c.baselines.end(), s.baseline) == c.baselines.end())
          continue;
        if (s.points == 0) {
          parts.push_back(fmt::format("{}: no point where both fit", s.baseline));
          continue;
        }
        parts.push_back(
            fmt::format("{} {:.2f}x", s.baseline, s.geomean) +
            (s.baseline_infeasible ? fmt::format(" (+{} points it cannot fit)", s.baseline_infeasible) : ""));
        lo = std::min(lo, s.geomean);
        hi = std::max(hi, s.geomean);
        points = std::max(points, s.points);
      }
      if (hi > 0) {
        cr.low = lo;
        cr.high = hi;
        cr.model = fmt::format("{:.2f}-{:.2f}x ({}; geometric means over up to {} matched points)", lo, hi,
                               fmt::join(parts, ", "), points);
      } else {
        cr.model = fmt::format("no comparable points ({})", fmt::join(parts, ", "));
      }
    } else if (c.metric == "fsdp2_ratio") {
      std::vector<std::string> parts;
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      for (const auto& [k, cs] : filtered_cases(rows, c.hardware, c.model)) {
        auto sd = cs.find(System::kSlideDP), f = cs.find(System::kFsdp2);
        if (sd == cs.end() || f == cs.end()) continue;
        const SweepRow& a = *sd->second;
        const SweepRow& b = *f->second;
        if (!a.feasible) continue;
        if (!b.feasible) {
          parts.push_back(fmt::format("{}: FSDP2 does not fit", format_tokens(a.point.tokens_per_step)));
          continue;
        }
        const double r = a.tokens_per_s() / b.tokens_per_s();
        lo = std::min(lo, r);
        hi = std::max(hi, r);
        parts.push_back(fmt::format("{}: {:.2f}x", format_tokens(a.point.tokens_per_step), r));
      }
      if (hi > 0) cr.low = lo, cr.high = hi;
      cr.model = parts.empty() ? "no point with both systems"
                               : fmt::format("SlideDP / FSDP2 at {}", fmt::join(parts, ", "));
    } else if (c.metric == "fsdp2_peak_excess") {
      const SweepRow* peak = nullptr;
      const SweepRow* best = nullptr;
      for (const SweepRow& r : rows) {
        if (!matches(r, c.hardware, c.model) || !r.feasible) continue;
        if (r.point.system == System::kFsdp2 && (!peak || r.tokens_per_s() > peak->tokens_per_s())) peak = &r;
        if (r.point.system == System::kSlideDP && r.point.tokens_per_step >= c.min_tokens_per_step &&
            (!best || r.tokens_per_s() > best->tokens_per_s()))
          best = &r;
      }
      if (peak && best) {
        cr.low = cr.high = best->tokens_per_s() / peak->tokens_per_s() - 1.0;
        cr.model = fmt::format(
            "{:+.1f}%: SlideDP {:.0f} tokens/s at {} tokens/step vs FSDP2's peak {:.0f} tokens/s at {}",
            100.0 * cr.low, best->tokens_per_s(), format_tokens(best->point.tokens_per_step),
            peak->tokens_per_s(), format_tokens(peak->point.tokens_per_step));
      } else {
        cr.model = peak ? "SlideDP fits no point at that size" : "FSDP2 fits no point";
      }
    } else if (c.metric == "longest_sequence") {
      std::vector<std::string> parts;
      for (const LongestFit& f : longest_fits(rows)) {
        if ((!c.hardware.empty() && f.hardware != c.hardware) || (!c.model.empty() && f.model != c.model))
          continue;
        if (f.system == "slidedp") cr.low = cr.high = static_cast<double>(f.longest_seq);
        parts.push_back(f.longest_seq > 0 ? fmt::format("{} {} ({:.0f} tokens/s)", f.system,
                                                        format_tokens(f.longest_seq), f.tokens_per_s)
                                          : fmt::format("{} none", f.system));
      }
      cr.model = parts.empty() ? "no matching rows" : fmt::format("{}", fmt::join(parts, "; "));
    } else if (c.metric == "feasible") {
      const SweepRow* best = nullptr;
      int fits = 0, total = 0;
      std::string why;
      for (const SweepRow& r : rows) {
        if (!matches(r, c.hardware, c.model) || r.point.system != System::kSlideDP) continue;
        ++total;
        if (!r.feasible) {
          if (why.empty()) why = r.infeasible_reason;
          continue;
        }
        ++fits;
        if (!best || r.tokens_per_s() > best->tokens_per_s()) best = &r;
      }
      cr.low = cr.high = total ? static_cast<double>(fits) / total : 0.0;
      cr.model = best ? fmt::format(
                            "fits {} of {} points; best {:.0f} tokens/s ({:.1f} TFLOP/s per GPU) at {} "
                            "tokens/step: {}",
                            fits, total, best->tokens_per_s(), best->scored().tflops_per_gpu,
                            format_tokens(best->point.tokens_per_step), best->plan_summary)
                      : fmt::format("fits none of {} points: {}", total, why);
    } else if (c.metric == "weak_scaling_efficiency" || c.metric == "strong_scaling_efficiency") {
      const bool weak = c.metric == "weak_scaling_efficiency";
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      std::vector<std::string> at_max;
      int max_ranks = 0;
      const std::vector<ScalingPoint> sp = scaling_points(result);
      auto selected = [&](const ScalingPoint& s) {
        return s.weak == weak && s.system == "slidedp" && s.ranks != s.base_ranks && s.efficiency > 0 &&
               (c.hardware.empty() || s.hardware == c.hardware) && (c.model.empty() || s.model == c.model);
      };
      for (const ScalingPoint& s : sp)
        if (selected(s)) max_ranks = std::max(max_ranks, s.ranks);
      for (const ScalingPoint& s : sp) {
        if (!selected(s)) continue;
        lo = std::min(lo, s.efficiency);
        hi = std::max(hi, s.efficiency);
        if (s.ranks == max_ranks)
          at_max.push_back(fmt::format(
              "{} {} {}", s.model,
              s.weak ? fmt::format("{} seq/rank", s.batch_value) : format_tokens(s.batch_value) + " tok/step",
              pct(s.efficiency)));
      }
      if (hi > 0) {
        cr.low = lo;
        cr.high = hi;
        cr.model = fmt::format("{}-{} over every rank count > the smallest; at {} ranks: {}", pct(lo),
                               pct(hi), max_ranks, fmt::join(at_max, ", "));
      } else {
        cr.model = "no scaling points";
      }
    }
    out.push_back(cr);
  }
  return out;
}

}  // namespace slidedp
