// Tables and JSON of a profile run; see report.h.
#include "profiler/report.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "common/error.h"
#include "common/provenance.h"
#include "common/table.h"
#include "common/units.h"

namespace slidedp::profiler {
namespace {

std::string f3(double v) { return fmt::format("{:.3g}", v); }
std::string pct(double v) { return fmt::format("{:.1f}", 100 * v); }

std::string section(const std::string& title, const Table& t, bool md) {
  return md ? fmt::format("### {}\n\n{}\n", title, t.render_markdown())
            : fmt::format("{}\n{}\n", title, t.render());
}

std::string bytes_label(int64_t b) {
  if (b >= (int64_t{1} << 30) && b % (int64_t{1} << 30) == 0) return fmt::format("{}G", b >> 30);
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}K", b >> 10);
  return std::to_string(b);
}

// YAML scalars to JSON numbers where they are numbers, so the JSON profile reads like the YAML one.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : n) j.push_back(yaml_to_json(v));
    return j;
  }
  if (n.IsScalar()) {
    const std::string s = n.as<std::string>();
    if (s == "true" || s == "false") return s == "true";
    try {
      std::size_t pos = 0;
      const double d = std::stod(s, &pos);
      if (pos == s.size()) return d;
    } catch (const std::exception&) {
    }
    return s;
  }
  return nullptr;
}

nlohmann::json fit_json(const FitQuality& q) {
  return {
      {"samples", q.n}, {"rms_rel_residual", q.rms_rel_residual}, {"max_rel_residual", q.max_rel_residual}};
}

}  // namespace

std::string profile_tables(const ProfileResult& r, bool md) {
  std::string out;
  const Hardware& hw = r.hw;
  {
    Table t({"value", "profile", "unit"}, {"", "", ""});
    t.add_row({"host_link.h2d_gbps (alone / all / bidir)",
               fmt::format("{} / {} / {}", f3(hw.link.h2d_gbps), f3(hw.link.h2d_all_gbps),
                           f3(hw.link.h2d_bidir_gbps)),
               "GB/s"});
    t.add_row({"host_link.d2h_gbps (alone / all / bidir)",
               fmt::format("{} / {} / {}", f3(hw.link.d2h_gbps), f3(hw.link.d2h_all_gbps),
                           f3(hw.link.d2h_bidir_gbps)),
               "GB/s"});
    t.add_row({"host_link.latency_us", f3(hw.link.latency_s * 1e6), "us"});
    t.add_row(
        {"fabric (" + hw.fabric.kind + ") all-gather / reduce-scatter busbw",
         fmt::format("{} / {}", f3(hw.fabric.allgather_busbw_gbps), f3(hw.fabric.reduce_scatter_busbw_gbps)),
         "GB/s"});
    t.add_row({"fabric.latency_us", f3(hw.fabric.latency_s * 1e6), "us"});
    t.add_row({"host.mem_bw_gbps", f3(hw.host.mem_bw_gbps), "GB/s"});
    if (r.network) {
      t.add_row({"network.nic_gbps (node 0 -> 1)", f3(hw.network.nic_gbps), "GB/s"});
      t.add_row({"network.latency_us", f3(hw.network.latency_s * 1e6), "us"});
    }
    for (const RatePoint& p : hw.cpu.adamw_params_per_s)
      t.add_row({fmt::format("cpu.adamw_params_per_s @{}", p.threads), f3(p.rate / 1e9), "Gparams/s"});
    for (const RatePoint& p : hw.cpu.reduce_gbps)
      t.add_row({fmt::format("cpu.reduce_gbps @{}", p.threads), f3(p.rate), "GB/s"});
    t.add_row({"cpu.convert_gbps_per_thread", f3(hw.cpu.convert_gbps_per_thread), "GB/s"});
    t.add_row({"gpu.bf16_peak_flops", f3(hw.gpu.bf16_peak_flops / 1e9), "GFLOP/s"});
    t.add_row({"gpu.matmul_efficiency", f3(hw.gpu.matmul_efficiency), ""});
    t.add_row({"gpu.hbm_gbps", f3(hw.gpu.hbm_gbps), "GB/s"});
    t.add_row({"gpu.host_threads_per_device", std::to_string(hw.gpu.host_threads_per_device), "threads"});
    out +=
        section(fmt::format("Profile {} ({} backend, {} devices)", hw.name, r.backend, hw.gpu.count), t, md);
  }
  {
    Table t({"threads", "copy", "+-", "triad", "+-"}, {"", "GB/s", "%", "GB/s", "%"});
    for (const auto& row : r.host_memory.by_threads)
      t.add_row({std::to_string(row.threads), f3(row.copy_gbps.median), pct(row.copy_gbps.relative()),
                 f3(row.triad_gbps.median), pct(row.triad_gbps.relative())});
    out += section("Host memory, profile working set (copy counts read + write; triad 12 B/element)", t, md);
  }
  if (r.host_memory.dram_bytes > 0) {
    Table t({"threads", "read", "+-", "write (non-temporal)", "+-", "copy", "+-"},
            {"", "GB/s", "%", "GB/s", "%", "GB/s", "%"});
    for (const auto& row : r.host_memory.by_threads)
      t.add_row({std::to_string(row.threads), f3(row.dram_read_gbps.median), pct(row.dram_read_gbps.relative()),
                 f3(row.dram_write_gbps.median), pct(row.dram_write_gbps.relative()), f3(row.dram_copy_gbps.median),
                 pct(row.dram_copy_gbps.relative())});
    out += section(fmt::format("Host memory in DRAM ({} buffers; copy counts read + write)",
                               format_bytes(static_cast<double>(r.host_memory.dram_bytes))),
                   t, md);
  }
  if (!r.host_memory.contention.empty()) {
    Table t({"copy threads", "triad threads", "triad", "+-", "copies", "+-", "total", "+-"},
            {"", "", "GB/s", "%", "GB/s", "%", "GB/s", "%"});
    for (const auto& c : r.host_memory.contention)
      t.add_row({std::to_string(c.dma_threads), std::to_string(c.triad_threads), f3(c.triad_gbps.median),
                 pct(c.triad_gbps.relative()), f3(c.dma_gbps.median), pct(c.dma_gbps.relative()),
                 f3(c.total_gbps.median), pct(c.total_gbps.relative())});
    out += section("Host memory under DMA-like copies (copies: bytes copied; total = triad + 2 x copies)", t,
                   md);
  }
  {
    Table t({"threads", "AdamW", "+-", "extra slot", "slot fit rms",
             fmt::format("reduce_grads x{}", r.cpu_update.reduce_slots), "+-"},
            {"", "Gparams/s", "%", "GB/s", "%", "GB/s", "%"});
    for (const auto& row : r.cpu_update.by_threads)
      t.add_row({std::to_string(row.threads), f3(row.adamw_params_per_s.median / 1e9),
                 pct(row.adamw_params_per_s.relative()), f3(row.reduce_gbps),
                 pct(row.slot_fit.rms_rel_residual), f3(row.reduce_standalone_gbps.median),
                 pct(row.reduce_standalone_gbps.relative())});
    out += section(fmt::format("CPU update (fused reduce + AdamW, bf16 slots and mirror, chunks of {})",
                               r.cpu_update.table_chunk_numel),
                   t, md);
    Table c({"threads", "chunk", "AdamW", "+-"}, {"", "elements", "Gparams/s", "%"});
    for (const Measurement& m : r.measurements.all())
      if (m.key() == "cpu_update.adamw_params_per_s") {
        const Spread s = m.spread();
        c.add_row({std::to_string(m.params.value("threads", 0)),
                   std::to_string(m.params.value("chunk_numel", 0)), f3(s.median / 1e9), pct(s.relative())});
      }
    out += section("AdamW by chunk size (one kernel call per chunk, as the updater calls it)", c, md);
  }
  {
    Table t({"mode", "direction", "devices", "latency", "bandwidth", "fit rms", "fit max"},
            {"", "", "", "us", "GB/s", "%", "%"});
    for (const auto* list : {&r.links.links, &r.links.collectives})
      for (const LinkCurve& c : *list)
        t.add_row({c.mode, c.direction.empty() ? "-" : c.direction, std::to_string(c.devices),
                   f3(c.fit.latency_s * 1e6), f3(c.fit.gbps), pct(c.fit.quality.rms_rel_residual),
                   pct(c.fit.quality.max_rel_residual)});
    out += section("Links and fabric: latency + bytes / bandwidth fits (collectives: bus bandwidth)", t, md);
    Table d({"mode", "direction", "bytes", "time", "+-", "rate"}, {"", "", "", "us", "%", "GB/s"});
    const int N = std::max(1, hw.gpu.count);
    for (const auto* list : {&r.links.links, &r.links.collectives})
      for (const LinkCurve& c : *list)
        for (const auto& p : c.points) {
          const bool coll = c.direction.empty();
          const double moved =
              coll ? static_cast<double>(p.bytes) * (N - 1) / N : static_cast<double>(p.bytes);
          d.add_row({c.mode, coll ? "-" : c.direction, bytes_label(p.bytes), f3(p.seconds.median * 1e6),
                     pct(p.seconds.relative()), f3(moved / p.seconds.median / 1e9)});
        }
    out += section("Links and fabric by size (per copy / call; collectives: bus bandwidth)", d, md);
  }
  for (const UnitComputeResult& u : r.units) {
    Table t({"unit", "op", "B", "T", "time", "+-", "alone", "fit", "resid"},
            {"", "", "", "", "ms", "%", "ms", "ms", "%"});
    for (const UnitCase& c : u.cases) {
      const auto p = std::find_if(u.profiles.begin(), u.profiles.end(), [&](const UnitTimeProfile& x) {
        return x.unit == c.kind && x.layer_type == c.layer_type;
      });
      SLIDEDP_CHECK(p != u.profiles.end(), "a unit case without its fit");
      const TimeFit& f = c.op == "fwd" ? p->forward : c.op == "bwd" ? p->backward : p->recompute;
      const double fit = f.eval(static_cast<double>(c.B * c.T), static_cast<double>(c.T));
      t.add_row({unit_label(c.kind, c.layer_type), c.op, std::to_string(c.B), std::to_string(c.T),
                 f3(c.seconds.median * 1e3), pct(c.seconds.relative()),
                 c.has_alone ? f3(c.alone_seconds.median * 1e3) : "-", f3(fit * 1e3),
                 pct((c.seconds.median - fit) / c.seconds.median)});
    }
    out +=
        section(fmt::format("Unit compute, {} (per device, {} device(s) at once; alone: device 0 by itself)",
                            u.model, u.concurrent_devices),
                t, md);
    // --kernels: each operation's five largest kernels (device 0, one run), share of the op's time
    Table k({"unit", "op", "B", "T", "kernel", "calls", "time", "of op"}, {"", "", "", "", "", "", "ms", "%"});
    for (const UnitCase& c : u.cases)
      for (std::size_t i = 0; i < std::min<std::size_t>(5, c.kernels.size()); ++i) {
        const exec::KernelTotal& kt = c.kernels[i];
        const double op_s = c.has_alone ? c.alone_seconds.median : c.seconds.median;
        k.add_row({unit_label(c.kind, c.layer_type), c.op, std::to_string(c.B), std::to_string(c.T), kt.kernel,
                   std::to_string(kt.calls), f3(kt.seconds * 1e3), pct(kt.seconds / op_s)});
      }
    if (!k.empty())
      out += section(fmt::format("Largest kernels per unit operation, {} (CUPTI, device 0)", u.model), k, md);
    Table f({"unit", "op", "fixed", "per token", "per token x T", "rms", "max"},
            {"", "", "ms", "us", "ns", "%", "%"});
    for (const auto& row : u.fits)
      f.add_row({unit_label(row.kind, row.layer_type), row.op, f3(row.fit.fit.fixed_s * 1e3),
                 f3(row.fit.fit.per_token_s * 1e6),
                 row.fit.ctx_term ? f3(row.fit.fit.per_token_ctx_s * 1e9) : "-",
                 pct(row.fit.quality.rms_rel_residual), pct(row.fit.quality.max_rel_residual)});
    out += section(
        fmt::format("Unit time fits, {}: fixed + per_token x tokens + per_token_ctx x tokens x T", u.model),
        f, md);
  }
  return out;
}

nlohmann::json profile_json(const ProfileResult& r) {
  const Provenance& p = provenance();
  nlohmann::json j;
  j["provenance"] = {{"git_revision", p.git_revision},
                     {"host", p.host},
                     {"cpu", p.cpu_model},
                     {"cpu_count", p.cpu_count},
                     {"build_type", p.build_type},
                     {"compiler", p.compiler},
                     {"version", p.version}};
  j["date"] = r.date;
  j["command"] = r.options.command_line;
  j["scale"] = profile_scale_name(r.options.scale);
  j["backend"] = r.backend;
  if (!r.gpu_note.empty()) j["gpu_note"] = r.gpu_note;
  for (const ModelCard& c : r.options.models) j["models"].push_back(c.name);
  j["working_set"] = r.working_set;
  j["seq_len"] = r.options.seq_len;
  j["micro_batches"] = r.options.micro_batches;
  j["cores"] = r.cores;
  j["load_average_1m"] = {{"before", r.load_before}, {"after", r.load_after}};
  j["expected_s"] = r.expected_s;
  j["elapsed_s"] = r.elapsed_s;
  for (const PlannedStage& s : r.stages)
    j["stages"].push_back({{"name", s.name}, {"estimate_s", s.estimate_s}});
  j["hardware"] = yaml_to_json(YAML::Load(hardware_to_yaml(r.hw)));
  if (r.network) {
    nlohmann::json n = {{"nodes", r.network->nodes},
                        {"latency_us", {{"median", r.network->latency_us.median}, {"spread", r.network->latency_us.relative()}}}};
    for (const auto& b : r.network->by_size)
      n["bandwidth"].push_back({{"bytes", b.bytes}, {"gbps", b.gbps.median}, {"spread", b.gbps.relative()}});
    j["network"] = n;
  }
  for (const Measurement& m : r.measurements.all()) {
    const Spread s = m.spread();
    j["measurements"].push_back({{"stage", m.stage},
                                 {"name", m.name},
                                 {"params", m.params},
                                 {"unit", m.unit},
                                 {"median", s.median},
                                 {"min", s.min},
                                 {"max", s.max},
                                 {"spread", s.relative()},
                                 {"values", m.values}});
  }
  nlohmann::json fits = nlohmann::json::array();
  for (const auto* list : {&r.links.links, &r.links.collectives})
    for (const LinkCurve& c : *list)
      fits.push_back(
          {{"what", c.direction.empty() ? "fabric." + c.mode : "links." + c.mode + "." + c.direction},
           {"latency_s", c.fit.latency_s},
           {"gbps", c.fit.gbps},
           {"quality", fit_json(c.fit.quality)}});
  for (const auto& row : r.cpu_update.by_threads)
    fits.push_back({{"what", "cpu.reduce_slots"},
                    {"threads", row.threads},
                    {"reduce_gbps", row.reduce_gbps},
                    {"quality", fit_json(row.slot_fit)}});
  for (const UnitComputeResult& u : r.units)
    for (const auto& row : u.fits)
      fits.push_back({{"what", fmt::format("units.{}.{}.{}", u.model, unit_label(row.kind, row.layer_type), row.op)},
                      {"fixed_s", row.fit.fit.fixed_s},
                      {"per_token_s", row.fit.fit.per_token_s},
                      {"per_token_ctx_s", row.fit.fit.per_token_ctx_s},
                      {"ctx_term", row.fit.ctx_term},
                      {"quality", fit_json(row.fit.quality)}});
  j["fits"] = fits;
  return j;
}

}  // namespace slidedp::profiler
