// Renderings of a SearchResult; see report.h.
#include "planner/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/table.h"
#include "common/units.h"
#include "model/prediction_report.h"

namespace slidedp::planner {
namespace {

std::string chunk_text(int64_t n) {
  if (n % (1 << 20) == 0) return fmt::format("{}M", n >> 20);
  if (n % (1 << 10) == 0) return fmt::format("{}K", n >> 10);
  return std::to_string(n);
}

std::string act_text(const Plan& p, int L) {
  Plan::PolicyCounts c = p.policy_counts(L);
  return fmt::format("o{}/r{}/k{}", c.offload, c.recompute, c.keep);
}

std::string threads_text(const Plan& p) {
  return p.update_threads == 0 ? "all" : std::to_string(p.update_threads);
}

double percent(double a, double b) { return 100.0 * (a - b) / b; }
// A percentage with enough digits to tell near-equal plans apart ("0.0042%", "0.07%", "12.30%").
std::string percent_text(double p) {
  return std::fabs(p) < 0.01 && p != 0 ? fmt::format("{:.2g}%", p) : fmt::format("{:.2f}%", p);
}

// The breakdown part that grew the most from `a` to `b` scaled by `scale_b` (seconds), named for a
// reader. The scale puts plans of different batch shapes on the same footing: b's parts are counted
// for as many tokens (or to the same token budget) as a's.
std::pair<std::string, double> largest_increase(const Breakdown& a, const Breakdown& b, double scale_b) {
  const std::pair<const char*, double> parts[] = {
      {"GPU compute", scale_b * b.compute_s - a.compute_s},
      {"stall waiting for data", scale_b * b.stall_s - a.stall_s},
      {"exposed tail (last update)", scale_b * b.exposed_tail_s - a.exposed_tail_s},
      {"exposed head (first delivery)", scale_b * b.exposed_head_s - a.exposed_head_s},
      {"sync latencies", scale_b * b.sync_s - a.sync_s}};
  auto best = std::max_element(std::begin(parts), std::end(parts),
                               [](const auto& x, const auto& y) { return x.second < y.second; });
  return {best->first, best->second};
}

}  // namespace

std::string candidate_summary(const Plan& p, int num_layers) {
  return fmt::format("{} | threads {}", p.summary(num_layers), threads_text(p));
}

std::string plan_difference(const Plan& a, const Plan& b, int L) {
  std::vector<std::string> d;
  if (a.micro_batch != b.micro_batch || a.accum_steps != b.accum_steps)
    d.push_back(fmt::format("mb {} x acc {} -> mb {} x acc {}", a.micro_batch, a.accum_steps, b.micro_batch,
                            b.accum_steps));
  if (a.param_route != b.param_route || a.grad_route != b.grad_route)
    d.push_back(fmt::format("{}/{} -> {}/{}", param_route_name(a.param_route), grad_route_name(a.grad_route),
                            param_route_name(b.param_route), grad_route_name(b.grad_route)));
  if (a.chunk_numel != b.chunk_numel)
    d.push_back(fmt::format("chunk {} -> {}", chunk_text(a.chunk_numel), chunk_text(b.chunk_numel)));
  if (act_text(a, L) != act_text(b, L))
    d.push_back(fmt::format("act {} -> {}", act_text(a, L), act_text(b, L)));
  if (a.gpu_buffer_depth != b.gpu_buffer_depth)
    d.push_back(fmt::format("depth {} -> {}", a.gpu_buffer_depth, b.gpu_buffer_depth));
  if (a.update_threads != b.update_threads)
    d.push_back(fmt::format("threads {} -> {}", threads_text(a), threads_text(b)));
  std::string out;
  for (std::size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + d[i];
  return out;
}

std::string render_top_table(const SearchResult& r) {
  const int L = r.space.num_layers;
  const bool sim = !r.top.empty() && r.top.front().simulated.has_value();
  Table t({"#", "plan", "step (model)", "step (sim)", "tokens/s", "bottleneck", "exposed", "GPU peak"},
          {"", "", "s", "s", "", "", "s", "GiB"});
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const Candidate& c = r.top[i];
    const double tokens_per_s =
        c.simulated ? c.simulated->tokens_per_s : c.predicted.tokens_per_step / c.ranked_step_s;
    t.add_row({std::to_string(i + 1), candidate_summary(c.plan, L), fmt::format("{:.4f}", c.ranked_step_s),
               sim ? fmt::format("{:.4f}", c.simulated->step_time_s) : "-",
               fmt::format("{:.0f}", tokens_per_s), c.predicted.bottleneck,
               fmt::format("{:.4f}", c.predicted.exposed_s),
               fmt::format("{:.2f}", c.predicted.memory.gpu_peak_bytes / kGiB)});
  }
  return t.render();
}

std::string explain_choice(const SearchResult& r) {
  if (r.top.empty()) return "";
  const int L = r.space.num_layers;
  const Candidate& w = r.top.front();
  const Prediction& p = w.predicted;
  std::string out = fmt::format(
      "why: the winner is bound by {} ({:.0f}% busy), {:.1f}% of its step not covered by GPU compute",
      p.bottleneck, 100.0 * p.bottleneck_utilization, 100.0 * p.exposed_s / p.step_time_s);
  if (!r.optimizer_states_reason.empty()) out += ". " + r.optimizer_states_reason;
  if (r.top.size() < 2) return out + "; it is the only candidate that fits the budgets.";
  const Candidate& u = r.top[1];
  const char* by = w.simulated ? "by the simulator" : "by the model";
  out += fmt::format(". The runner-up ({}) is {} worse {}", plan_difference(w.plan, u.plan, L),
                     percent_text(percent(u.final_score(), w.final_score())), by);
  const BatchShape ws{w.plan.micro_batch, w.plan.accum_steps}, us{u.plan.micro_batch, u.plan.accum_steps};
  const double scale = r.space.score_factor(us) / r.space.score_factor(ws);
  auto [part, delta] = largest_increase(p.breakdown, u.predicted.breakdown, scale);
  if (delta > 0)
    out += fmt::format(": +{} {}{}", format_seconds(delta), part,
                       scale != 1.0 ? fmt::format(" per {} tokens", r.space.tokens_per_step(ws)) : "");
  const double mem = w.predicted.memory.gpu_peak_bytes - u.predicted.memory.gpu_peak_bytes;
  if (mem > 0) out += fmt::format(", for {} less GPU memory per rank", format_bytes(mem));
  if (u.predicted.bottleneck != p.bottleneck)
    out += fmt::format(" (it is bound by {})", u.predicted.bottleneck);
  if (w.simulated && u.score < w.score)
    out += fmt::format("; the analytical model alone ranks the runner-up {} ahead",
                       percent_text(percent(w.score, u.score)));
  return out + ".";
}

std::string render_search_stats(const SearchResult& r) {
  const SearchStats& s = r.stats;
  std::string out = fmt::format(
      "searched {} candidates in {} ({} scored with the full model, {} critical-path bounds, {} pruned by "
      "bounds, "
      "{} infeasible",
      s.space_size, format_seconds(s.search_s), s.evaluated, s.bound_evaluations, s.pruned,
      s.infeasible_total());
  if (!s.infeasible.empty()) {
    std::vector<std::string> parts;
    for (const auto& [why, n] : s.infeasible) parts.push_back(fmt::format("{} {}", why, n));
    out += ": ";
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  }
  out += ")";
  if (s.simulations > 0)
    out +=
        fmt::format("; top {} re-scored by the simulator in {}", s.simulations, format_seconds(s.rescore_s));
  if (s.simulations_too_large > 0)
    out += fmt::format(
        "; not re-scored: the simulator cannot hold the steps of {} of the top plans (its graph limit), so all "
        "keep the analytical model's ranking",
        s.simulations_too_large);
  if (s.bound_violations > 0 || s.relaxation_violations > 0)
    out += fmt::format(
        "\nWARNING: {} candidates scored below a bound of their sub-space ({} below a relaxed critical "
        "path); "
        "the search may have missed a plan (rerun with --exhaustive to check)",
        s.bound_violations, s.relaxation_violations);
  return out;
}

nlohmann::json search_result_to_json(const SearchResult& r) {
  const int L = r.space.num_layers;
  nlohmann::json j;
  j["objective"] = objective_name(r.space.objective);
  j["ranks"] = r.space.ranks;
  j["seq_len"] = r.space.seq_len;
  nlohmann::json top = nlohmann::json::array();
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const Candidate& c = r.top[i];
    nlohmann::json e;
    e["rank"] = i + 1;
    e["summary"] = candidate_summary(c.plan, L);
    e["plan_yaml"] = plan_to_yaml(c.plan);
    e["score"] = c.score;
    e["step_time_s"] = c.predicted.step_time_s;
    e["ranked_step_s"] = c.ranked_step_s;
    e["tokens_per_step"] = c.predicted.tokens_per_step;
    e["tokens_per_s"] = c.predicted.tokens_per_s;
    e["bottleneck"] = c.predicted.bottleneck;
    e["exposed_s"] = c.predicted.exposed_s;
    e["gpu_mem_peak_bytes"] = c.predicted.memory.gpu_peak_bytes;
    e["predicted"] = prediction_to_json(c.predicted);
    if (c.simulated) {
      e["simulated_step_time_s"] = c.simulated->step_time_s;
      e["simulated_score"] = c.simulated_score;
    }
    top.push_back(e);
  }
  j["top"] = top;
  j["why"] = explain_choice(r);
  const SearchStats& s = r.stats;
  j["stats"] = {{"space_size", s.space_size},
                {"evaluated", s.evaluated},
                {"bound_evaluations", s.bound_evaluations},
                {"pruned", s.pruned},
                {"infeasible", s.infeasible},
                {"infeasible_total", s.infeasible_total()},
                {"infeasible_by_monotonicity", s.infeasible_by_monotonicity},
                {"memory_estimates", s.memory_estimates},
                {"nodes_expanded", s.nodes_expanded},
                {"simulations", s.simulations},
                {"simulations_too_large", s.simulations_too_large},
                {"bound_violations", s.bound_violations},
                {"relaxation_violations", s.relaxation_violations},
                {"search_s", s.search_s},
                {"rescore_s", s.rescore_s}};
  j["closest_miss"] = r.closest_miss;
  j["space"] = {{"batch_shapes", r.space.shapes.size()},
                {"activation_mixes", r.space.mixes.size()},
                {"routes", r.space.routes.size()},
                {"chunks", r.space.chunks},
                {"depths", r.space.depths},
                {"threads", r.space.threads},
                {"notes", r.space.notes}};
  return j;
}

PlanFile best_plan_file(const SearchResult& r, const std::string& model, const std::string& hardware,
                        int64_t seq_len) {
  PlanFile f;
  f.plan = r.best().plan;
  f.model = model;
  f.hardware = hardware;
  f.seq_len = seq_len;
  return f;
}

}  // namespace slidedp::planner
