// slidedp-run's end-of-run report, as JSON or for people.
#include "executor/cli/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "executor/kernel_activity.h"
#include "model/system.h"

namespace slidedp {
namespace {

// Steady state: every step but the first (it pays start-up).
struct SteadyState {
  double seconds = 0, tokens = 0;
  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0; }
};

SteadyState steady_state(const std::vector<exec::TrainStep>& steps) {
  SteadyState s;
  for (std::size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) {
    s.seconds += steps[i].wall_s;
    s.tokens += static_cast<double>(steps[i].tokens);
  }
  return s;
}

nlohmann::json steps_json(const exec::TrainResult& result) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : result.steps) {
    nlohmann::json step = {
        {"step", s.step}, {"loss", s.loss},       {"tokens", s.tokens}, {"wall_s", s.wall_s},
        {"lr", s.lr},     {"skipped", s.skipped}, {"busy_s", s.busy_s}, {"copied_bytes", s.copied_bytes}};
    if (s.grad_norm >= 0) step["grad_norm"] = s.grad_norm;  // measured when clipping or skipping
    steps.push_back(step);
  }
  return steps;
}

nlohmann::json account_json(const RankMemoryAccount& a) {
  nlohmann::json account = {{"peak_bytes", a.peak_bytes},
                            {"driver_peak_bytes", a.driver_peak_bytes},
                            {"peak_at", a.peak_at},
                            {"items", nlohmann::json::array()}};
  for (const MemoryItem& i : a.items) account["items"].push_back({{"name", i.name}, {"bytes", i.bytes}});
  return account;
}

// The run's largest kernels on rank 0 (CUPTI), all steps together.
void print_kernel_table(const exec::TrainResult& result) {
  const std::vector<exec::KernelTotal> kernels = exec::sum_kernels(result.spans, 0);
  double all = 0;
  for (const exec::KernelTotal& k : kernels) all += k.seconds;
  Table kt({"kernel", "calls", "time", "per call", "of kernel time"}, {"", "", "ms", "us", "%"});
  for (std::size_t i = 0; i < std::min<std::size_t>(12, kernels.size()); ++i)
    kt.add_row({kernels[i].kernel, std::to_string(kernels[i].calls),
                fmt::format("{:.3f}", kernels[i].seconds * 1e3),
                fmt::format("{:.1f}", kernels[i].seconds * 1e6 / static_cast<double>(kernels[i].calls)),
                fmt::format("{:.1f}", all > 0 ? 100 * kernels[i].seconds / all : 0.0)});
  std::cout << "\nlargest kernels, rank 0 (" << kernels.size() << " kinds, " << format_seconds(all)
            << " in all)\n"
            << kt.render();
}

}  // namespace

Table bench_table() {
  return Table(
      {"step", "loss", "step time", "compute", "h2d", "d2h", "fabric", "cpu update", "exposed", "tokens/s"},
      {"", "", "s", "s", "s", "s", "s", "s", "s", ""});
}

void add_bench_row(Table& table, const exec::TrainStep& s) {
  auto busy = [&](const char* k) { return s.busy_s.count(k) ? s.busy_s.at(k) : 0.0; };
  table.add_row({std::to_string(s.step), fmt::format("{:.4f}", s.loss), fmt::format("{:.4f}", s.wall_s),
                 fmt::format("{:.4f}", busy("compute")), fmt::format("{:.4f}", busy("h2d")),
                 fmt::format("{:.4f}", busy("d2h")), fmt::format("{:.4f}", busy("fabric")),
                 fmt::format("{:.4f}", busy("cpu_update")),
                 fmt::format("{:.4f}", std::max(0.0, s.wall_s - busy("compute"))),
                 fmt::format("{:.0f}", static_cast<double>(s.tokens) / s.wall_s)});
}

void print_json_report(const RunOutcome& run) {
  const exec::TrainResult& result = run.result;
  const exec::TrainOptions& o = run.options;
  nlohmann::json j;
  j["model"] = o.card.name;
  j["plan"] = run.run_plan.summary(static_cast<int>(o.card.num_layers));
  j["system"] = system_name(o.system);
  j["backend"] = run.flags.backend;
  j["steps"] = steps_json(result);
  j["evals"] = nlohmann::json::array();
  for (const auto& e : result.evals)
    j["evals"].push_back({{"step", e.step},
                          {"loss", e.loss},
                          {"perplexity", std::exp(e.loss)},
                          {"tokens", e.tokens},
                          {"wait_s", e.wait_s}});
  j["tokens_per_s"] = steady_state(result.steps).tokens_per_s();
  j["final_loss"] = result.steps.empty() ? 0.0 : result.steps.back().loss;
  j["device_high_water_bytes"] = result.device_high_water_bytes;
  j["device_held_high_water_bytes"] = result.device_held_high_water_bytes;
  j["device_budget_bytes"] = result.device_budget_bytes;
  j["host_state_bytes"] = result.host_state_bytes;  // this node's (node 0's in a multi-node run)
  j["parameters"] = o.card.total_params();
  j["device_memory_account"] = account_json(result.device_account);
  if (run.predicted_step_s) j["predicted_step_time_s"] = *run.predicted_step_s;
  if (!run.flags.emulate.empty()) {
    j["emulate"] = run.flags.emulate;
    j["time_scale"] = run.time_scale;
    j["paced_ops"] = result.paced_ops;
    j["paced_overruns"] = result.paced_overruns;
  }
  if (run.run_id >= 0) j["run_id"] = run.run_id, j["db"] = run.flags.db;
  if (!result.last_checkpoint.empty()) j["checkpoint"] = result.last_checkpoint;
  std::cout << j.dump(2) << "\n";
}

void print_human_report(const RunOutcome& run, const Table& bench) {
  const exec::TrainResult& result = run.result;
  const RunFlags& f = run.flags;
  if (f.bench) std::cout << "\n" << bench.render();
  if (f.bench && f.trace_kernels) print_kernel_table(result);
  const SteadyState steady = steady_state(result.steps);
  const std::size_t n = result.steps.size();
  fmt::print("\n{} steps, steady state {:.0f} tokens/s, {} per step", n, steady.tokens_per_s(),
             format_seconds(n > 1 ? steady.seconds / static_cast<double>(n - 1) : steady.seconds));
  if (run.predicted_step_s) fmt::print(" (model predicted {})", format_seconds(*run.predicted_step_s));
  fmt::print("\nloss {:.4f} -> {:.4f}\n", n == 0 ? 0.0 : result.steps.front().loss,
             n == 0 ? 0.0 : result.steps.back().loss);
  if (n > 0 && result.steps.back().grad_norm >= 0)
    fmt::print("gradient norm {:.4g} -> {:.4g} (the update after the backward: verify_updates)\n",
               result.steps.front().grad_norm, result.steps.back().grad_norm);
  int64_t hw = 0;
  for (auto h : result.device_high_water_bytes) hw = std::max(hw, h);
  fmt::print("device memory high water {} of {} budget per rank (account: {}, peak at {}); host state {}\n",
             format_bytes(static_cast<double>(hw)),
             format_bytes(static_cast<double>(result.device_budget_bytes)),
             format_bytes(result.device_account.peak_bytes), result.device_account.peak_at,
             format_bytes(static_cast<double>(result.host_state_bytes)));
  if (run.run_id >= 0) fmt::print("run {} logged to {}\n", run.run_id, f.db);
  if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
  if (!f.trace.empty()) fmt::print("timeline: {} (open in Perfetto)\n", f.trace);
  if (result.stopped_early) fmt::print("stopped early on request\n");
  if (result.paced_overruns > 0)
    fmt::print(stderr,
               "warning: {} of {} paced operations took longer here than the target would at time scale "
               "{:.4g} (by {} "
               "together): the run is slower here than the pacing allows; raise --time-scale\n",
               result.paced_overruns, result.paced_ops, run.time_scale,
               format_seconds(result.paced_overrun_s));
}

}  // namespace slidedp
