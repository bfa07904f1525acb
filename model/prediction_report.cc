// Prediction rendering; see prediction_report.h.
#include "model/prediction_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "common/table.h"
#include "common/units.h"

namespace slidedp {

nlohmann::json prediction_to_json(const Prediction& p) {
  nlohmann::json j;
  j["method"] = p.method;
  j["system"] = p.system;
  j["feasible"] = p.feasible;
  j["infeasible_reasons"] = p.infeasible_reasons;
  j["step_time_s"] = p.step_time_s;
  j["tokens_per_step"] = p.tokens_per_step;
  j["tokens_per_s"] = p.tokens_per_s;
  j["tflops_per_gpu"] = p.tflops_per_gpu;
  j["bottleneck"] = p.bottleneck;
  j["bottleneck_utilization"] = p.bottleneck_utilization;
  j["exposed_s"] = p.exposed_s;
  j["lower_bound_s"] = p.lower_bound_s;
  const Breakdown& b = p.breakdown;
  j["breakdown"] = {{"compute_s", b.compute_s},           {"stall_s", b.stall_s},
                    {"exposed_tail_s", b.exposed_tail_s}, {"exposed_head_s", b.exposed_head_s},
                    {"post_update_s", b.post_update_s},   {"sync_s", b.sync_s}};
  j["busy_s"] = p.busy_s;
  j["gpu_mem_peak_bytes"] = p.memory.gpu_peak_bytes;
  j["gpu_mem_budget_bytes"] = p.memory.gpu_budget_bytes;
  j["host_mem_bytes"] = p.memory.host_bytes;
  j["host_pinned_bytes"] = p.memory.host_pinned_bytes;
  j["host_mem_bytes_per_param"] = p.memory.host_bytes_per_param;
  nlohmann::json gi = nlohmann::json::object(), hi = nlohmann::json::object();
  for (const auto& i : p.memory.gpu_items) gi[i.name] = i.bytes;
  for (const auto& i : p.memory.host_items) hi[i.name] = i.bytes;
  j["gpu_mem_items"] = gi;
  j["host_mem_items"] = hi;
  return j;
}

std::string prediction_to_text(const Prediction& p, const std::string& context) {
  std::string out;
  out += context + "\n";
  out += fmt::format("system {} ({} model)\n\n", p.system, p.method);
  if (!p.feasible) {
    out += "INFEASIBLE:\n";
    for (const auto& r : p.infeasible_reasons) out += "  - " + r + "\n";
    out += "(timing below assumes the plan could run)\n\n";
  }
  out += fmt::format("bottleneck   {} ({:.0f}% busy)\n", p.bottleneck, 100.0 * p.bottleneck_utilization);
  out += fmt::format("step time    {}\n", format_seconds(p.step_time_s));
  out += fmt::format("throughput   {:.0f} tokens/s ({} tokens/step), {:.1f} model TFLOP/s per GPU\n",
                     p.tokens_per_s, format_count(p.tokens_per_step), p.tflops_per_gpu);
  out += fmt::format("exposed      {} not covered by GPU compute ({:.1f}%)\n\n", format_seconds(p.exposed_s),
                     100.0 * p.exposed_s / p.step_time_s);

  const Breakdown& b = p.breakdown;
  Table t({"part", "time", "share"}, {"", "", "%"});
  auto row = [&](const char* name, double s) {
    if (s != 0) t.add_row({name, format_seconds(s), fmt::format("{:.1f}", 100.0 * s / p.step_time_s)});
  };
  row("GPU compute", b.compute_s);
  row("stall (waiting for data/host)", b.stall_s);
  row("exposed tail (last update)", b.exposed_tail_s);
  row("exposed head (first delivery)", b.exposed_head_s);
  row("serial optimizer phase", b.post_update_s);
  row("sync latencies", b.sync_s);
  t.add_row({"total", format_seconds(b.total()), "100.0"});
  out += t.render() + "\n";

  std::vector<std::pair<std::string, double>> busy(p.busy_s.begin(), p.busy_s.end());
  std::sort(busy.begin(), busy.end(), [](const auto& a, const auto& c) { return a.second > c.second; });
  Table r({"resource", "busy", "utilization"}, {"", "", "%"});
  for (const auto& [name, s] : busy) r.add_row({name, format_seconds(s), fmt::format("{:.1f}", 100.0 * s / p.step_time_s)});
  out += r.render() + "\n";

  Table m({"GPU memory (per rank)", "bytes"}, {"", ""});
  for (const auto& i : p.memory.gpu_items) m.add_row({i.name, format_bytes(i.bytes)});
  m.add_row({"peak", format_bytes(p.memory.gpu_peak_bytes)});
  m.add_row({"budget", format_bytes(p.memory.gpu_budget_bytes)});
  out += m.render() + "\n";
  Table h({"host memory", "bytes"}, {"", ""});
  for (const auto& i : p.memory.host_items) h.add_row({i.name, format_bytes(i.bytes)});
  h.add_row({"total", format_bytes(p.memory.host_bytes)});
  h.add_row({"per parameter", fmt::format("{:.1f} B", p.memory.host_bytes_per_param)});
  h.add_row({"RAM", format_bytes(p.memory.host_ram_bytes)});
  out += h.render();
  return out;
}

}  // namespace slidedp
