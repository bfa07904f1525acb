// The Hardware profile's values from a run's results; see profile_assembly.h.
#include "profiler/profile_assembly.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "common/host_memory.h"
#include "common/provenance.h"
#include "model/model_costs.h"
#include "profiler/profile_sources.h"

namespace slidedp::profiler {

std::string measured_by(const ProfileResult& r, const StagePlan& plan) {
  return fmt::format("measured by slidedp-profile {} ({} run, median of {} repetitions)", r.date,
                     profile_scale_name(r.options.scale), plan.repeat.reps);
}

std::string host_label() {
  std::string host = provenance().host;
  std::replace_if(
      host.begin(), host.end(),
      [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)) && ch != '-'; }, '-');
  return host;
}

LinkCurve curve_or_alone(const BackendLinkResult& l, const std::string& mode, const std::string& dir) {
  if (const LinkCurve* c = l.find(mode, dir)) return *c;
  return *l.find("alone", dir);
}

FallbackCase fallback_case(const ProfileResult& r, const ModelCard& largest) {
  FallbackCase f;
  f.unit = &r.units.front();
  for (const UnitComputeResult& u : r.units)
    if (u.model == largest.name) f.unit = &u;
  // layer 0's (its type's) decoder, as the FLOP-based fallback charges it
  for (const UnitCase& c : f.unit->cases)
    if (c.kind == UnitKind::kDecoder && c.layer == 0 && c.op == "fwd" &&
        (!f.forward || c.B * c.T > f.forward->B * f.forward->T))
      f.forward = &c;
  return f;
}

void assemble_profile(ProfileResult& r, const StagePlan& plan, const ModelCard& largest, int devices,
                      const GpuInventory& inv) {
  Hardware& hw = r.hw;
  const std::string by = measured_by(r, plan);
  const Provenance& prov = provenance();
  const int64_t ram = physical_ram_bytes();
  const std::string host = host_label();
  auto table_of = [&](auto get) {
    std::vector<RatePoint> t;
    for (const auto& row : r.cpu_update.by_threads) t.push_back({row.threads, get(row)});
    std::sort(t.begin(), t.end(),
              [](const RatePoint& a, const RatePoint& b) { return a.threads < b.threads; });
    return t;
  };
  hw.cpu.model = prov.cpu_model;
  hw.cpu.cores = r.cores;
  hw.cpu.adamw_params_per_s = table_of([](const auto& row) { return row.adamw_params_per_s.median; });
  hw.cpu.reduce_gbps = table_of([](const auto& row) { return row.reduce_gbps; });
  hw.cpu.convert_gbps_per_thread = r.cpu_update.convert_gbps_per_thread.median;
  hw.host.mem_bw_gbps = r.host_memory.best_gbps;
  hw.host.ram_bytes = ram;
  if (r.network) {
    hw.network.nic_gbps = r.network->best_gbps;
    hw.network.latency_s = r.network->latency_us.median * 1e-6;
  }

  const LinkCurve h_alone = curve_or_alone(r.links, "alone", "h2d"),
                  d_alone = curve_or_alone(r.links, "alone", "d2h");
  hw.link.h2d_gbps = h_alone.fit.gbps;
  hw.link.d2h_gbps = d_alone.fit.gbps;
  hw.link.h2d_all_gbps = curve_or_alone(r.links, "all", "h2d").fit.gbps;
  hw.link.d2h_all_gbps = curve_or_alone(r.links, "all", "d2h").fit.gbps;
  hw.link.h2d_bidir_gbps = curve_or_alone(r.links, "bidir", "h2d").fit.gbps;
  hw.link.d2h_bidir_gbps = curve_or_alone(r.links, "bidir", "d2h").fit.gbps;
  hw.link.latency_s = 0.5 * (h_alone.fit.latency_s + d_alone.fit.latency_s);
  const auto set_fabric = [&](const std::string& kind) {
    const LinkCurve* ag = r.links.find("all_gather", "");
    const LinkCurve* rs = r.links.find("reduce_scatter", "");
    hw.fabric.kind = kind;
    hw.fabric.allgather_busbw_gbps = ag->fit.gbps;
    hw.fabric.reduce_scatter_busbw_gbps = rs->fit.gbps;
    hw.fabric.latency_s = 0.5 * (ag->fit.latency_s + rs->fit.latency_s);
  };

  if (r.backend == "cpu") {
    const int N = devices;
    hw.name = fmt::format("cpu-backend-{}", host);
    hw.description =
        fmt::format("CPU backend on {} ({} cores), {} emulated devices; {}", prov.cpu_model, r.cores, N, by);
    hw.gpu.model = "emulated (CPU threads)";
    hw.gpu.count = N;
    hw.gpu.emulated_on_host = true;
    hw.gpu.host_threads_per_device = r.threads_per_device;
    hw.gpu.mem_bytes = std::min(kCpuBackendDeviceBudget, ram / (N + 1));
    hw.gpu.bf16_peak_flops = r.sgemm_gflops.median * 1e9;
    // hbm: the host memory an emulated device's elementwise work streams through, at its threads.
    double hbm = 0;
    for (const auto& row : r.host_memory.by_threads)
      if (row.threads <= r.threads_per_device) hbm = std::max(hbm, row.triad_gbps.median);
    hw.gpu.hbm_gbps = hbm > 0 ? hbm : r.host_memory.by_threads.front().triad_gbps.median;
    hw.host.pinned_limit_bytes = ram;
    // The CPU backend's collectives are memcpy / fp32 sums between the emulated devices' memory on
    // the comm streams: a direct path that does not use the h2d / d2h streams, so not via_host
    // (which would charge the links for the collective's bytes too).
    if (N > 1) {
      set_fabric("pcie_p2p");
    } else {
      hw.fabric.kind = "none";
    }
  } else {
    hw.name = fmt::format("{}-x{}-{}", inv.model, inv.count, host);
    std::replace(hw.name.begin(), hw.name.end(), ' ', '-');
    hw.description = fmt::format("{} x {} on {}; {}", inv.count, inv.model, prov.cpu_model, by);
    hw.gpu.model = inv.model;
    hw.gpu.count = inv.count;
    hw.gpu.mem_bytes = inv.mem_bytes;
    hw.gpu.bf16_peak_flops = r.gpu.bf16_gemm_tflops.median * 1e12;
    hw.gpu.hbm_gbps = r.gpu.hbm_gbps.median;
    hw.host.pinned_limit_bytes = ram;
    hw.gpu.runtime_bytes = inv.runtime_bytes;
    hw.gpu.collective_bytes = r.gpu.collective_bytes >= 0 ? r.gpu.collective_bytes
                                                          : default_collective_bytes(hw.gpu, r.gpu.fabric_kind);
    if (inv.count > 1) {
      set_fabric(r.gpu.fabric_kind);
    } else {
      hw.fabric.kind = "none";
    }
  }

  if (!r.units.empty()) {
    for (const UnitComputeResult& u : r.units)
      hw.unit_times.insert(hw.unit_times.end(), u.profiles.begin(), u.profiles.end());
    if (r.backend == "cpu") {
      // Efficiency of the FLOP-based fallback (models without unit_times): the largest measured model's
      // decoder FLOP/s at its largest case over the SGEMM rate.
      const FallbackCase f = fallback_case(r, largest);
      const UnitFlops flops = unit_flops(largest, UnitKind::kDecoder, 0, f.forward->B, f.forward->T);
      const double eff =
          std::clamp(flops.forward() / f.forward->seconds.median / hw.gpu.bf16_peak_flops, 1e-3, 1.0);
      hw.gpu.matmul_efficiency = eff;
      hw.gpu.attention_efficiency = eff;
      for (const auto& row : f.unit->fits)
        if (row.kind == UnitKind::kDecoder && row.layer == 0 && row.op == "fwd") hw.gpu.kernel_overhead_s = row.fit.fit.fixed_s;
    }
  }
  for (auto& [key, source] : profile_sources(r, plan, largest, devices, inv)) hw.sources[key] = std::move(source);
  hw.validate("slidedp-profile");
}

}  // namespace slidedp::profiler
