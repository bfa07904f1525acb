// The Hardware profile and its sources from a run's results; see profile_assembly.h.
#include "profiler/profile_assembly.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "common/host_memory.h"
#include "common/provenance.h"
#include "common/units.h"
#include "model/model_costs.h"

namespace slidedp::profiler {
namespace {


LinkCurve curve_or_alone(const BackendLinkResult& l, const std::string& mode, const std::string& dir) {
  if (const LinkCurve* c = l.find(mode, dir)) return *c;
  return *l.find("alone", dir);
}

}  // namespace

void assemble_profile(ProfileResult& r, const StagePlan& plan, const ModelCard& largest, int devices,
                      const GpuInventory& inv) {
  Hardware& hw = r.hw;
  const std::string by = fmt::format("measured by slidedp-profile {} ({} run, median of {} repetitions)",
                                     r.date, profile_scale_name(r.options.scale), plan.repeat.reps);
  const Provenance& prov = provenance();
  const int64_t ram = physical_ram_bytes();
  std::string host = prov.host;
  std::replace_if(
      host.begin(), host.end(),
      [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)) && ch != '-'; }, '-');
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
  hw.sources["cpu.adamw_params_per_s"] = fmt::format(
      "{}: kernels::reduce_adamw_update with one bf16 gradient slot and the bf16 mirror over {} elements in "
      "chunks of "
      "{}, per thread count",
      by, plan.update.numel, r.cpu_update.table_chunk_numel);
  hw.sources["cpu.reduce_gbps"] = fmt::format(
      "{}: bf16 input bytes/s of each extra gradient slot in the fused reduce + AdamW, the slope of a "
      "least-squares "
      "fit of seconds vs slots {} (the model's (slots-1) x 2n / rate term); the standalone "
      "kernels::reduce_grads "
      "rate is in the measured notes",
      by, fmt::join(plan.update.slots, ","));
  hw.sources["cpu.convert_gbps_per_thread"] = by + ": kernels::f32_to_bf16 on one thread, fp32 input bytes/s";
  hw.sources["cpu.cores"] = "sched_getaffinity of the profiling process";
  hw.sources["host.mem_bw_gbps"] = fmt::format(
      "{}: highest host-memory rate of any case ({}); STREAM counting", by, r.host_memory.best_case);
  if (r.host_memory.dram_bytes > 0 && !r.host_memory.by_threads.empty()) {
    const auto& all = r.host_memory.by_threads.back();
    hw.sources["host.mem_bw_gbps"] += fmt::format(
        "; in DRAM ({} buffers, {} threads): read {:.1f}, non-temporal write {:.1f}, copy {:.1f} GB/s",
        format_bytes(static_cast<double>(r.host_memory.dram_bytes)), all.threads, all.dram_read_gbps.median,
        all.dram_write_gbps.median, all.dram_copy_gbps.median);
  }
  hw.sources["host.ram_bytes"] = "sysconf(_SC_PHYS_PAGES) x page size";
  if (r.network) {
    const NetworkResult& n = *r.network;
    hw.network.nic_gbps = n.best_gbps;
    hw.network.latency_s = n.latency_us.median * 1e-6;
    hw.sources["network.nic_gbps"] = fmt::format(
        "{}: node 0 -> node 1 through SlideDP's MPI link (executor/node_link.h), {} messages of {} back to back, "
        "median {} GB/s (spread {}); {} processes on {}: on one host this is the MPI transport between processes, "
        "not a NIC",
        by, network_plan(r.options).messages, format_bytes(static_cast<double>(n.by_size.back().bytes)), sig3(n.best_gbps),
        spread_percent(n.by_size.back().gbps), n.nodes, host);
    hw.sources["network.latency_us"] = fmt::format(
        "{}: half an 8-byte round trip through the link (its progress thread polls every 50 us while waiting), "
        "median {} us (spread {})",
        by, sig3(n.latency_us.median), spread_percent(n.latency_us));
  }

  auto fit_source = [&](const LinkCurve& c, const std::string& what) {
    return fmt::format(
        "{}: {} fitted to latency + bytes / bandwidth over {} sizes {}..{} (rms residual {:.1f}%){}", by,
        what, c.points.size(), format_bytes(static_cast<double>(c.points.front().bytes)),
        format_bytes(static_cast<double>(c.points.back().bytes)), 100 * c.fit.quality.rms_rel_residual,
        c.fit.resolved ? "" : "; noise hid the size dependence: the largest size's rate");
  };
  const LinkCurve h_alone = curve_or_alone(r.links, "alone", "h2d"),
                  d_alone = curve_or_alone(r.links, "alone", "d2h");
  const LinkCurve h_all = curve_or_alone(r.links, "all", "h2d"),
                  d_all = curve_or_alone(r.links, "all", "d2h");
  const LinkCurve h_bi = curve_or_alone(r.links, "bidir", "h2d"),
                  d_bi = curve_or_alone(r.links, "bidir", "d2h");
  hw.link.h2d_gbps = h_alone.fit.gbps;
  hw.link.d2h_gbps = d_alone.fit.gbps;
  hw.link.h2d_all_gbps = h_all.fit.gbps;
  hw.link.d2h_all_gbps = d_all.fit.gbps;
  hw.link.h2d_bidir_gbps = h_bi.fit.gbps;
  hw.link.d2h_bidir_gbps = d_bi.fit.gbps;
  hw.link.latency_s = 0.5 * (h_alone.fit.latency_s + d_alone.fit.latency_s);

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
    hw.sources["gpu.count"] = fmt::format("--ranks {}: emulated devices of the CPU backend", N);
    hw.sources["gpu.emulated_on_host"] =
        "CPU backend: device compute and copies run on this host's cores and memory";
    hw.sources["gpu.host_threads_per_device"] =
        fmt::format("the CPU backend's BLAS threads per device, max(1, {} cores / {} devices)", r.cores, N);
    hw.sources["gpu.mem_bytes"] =
        fmt::format("the CPU backend's default device budget (16 GiB), capped at RAM / (devices + 1) = {}",
                    format_bytes(static_cast<double>(ram / (N + 1))));
    hw.sources["gpu.bf16_peak_flops"] = fmt::format(
        "{}: fp32 SGEMM {}^3 through kernels::gemm at {} BLAS threads (the CPU backend computes in fp32)", by,
        plan.sgemm_n, r.threads_per_device);
    hw.sources["gpu.hbm_gbps"] =
        fmt::format("{}: triad GB/s at {} threads (a device's elementwise work)", by, r.threads_per_device);
    hw.sources["host.pinned_limit_bytes"] = "CPU backend: host buffers are not page-locked; the limit is RAM";
    const std::string copies = "CPU backend: copy_h2d / copy_d2h = memcpy on the device's stream thread";
    hw.sources["host_link.h2d_gbps"] = fit_source(h_alone, copies + ", one device alone");
    hw.sources["host_link.d2h_gbps"] = fit_source(d_alone, copies + ", one device alone");
    hw.sources["host_link.h2d_all_gbps"] =
        fit_source(h_all, fmt::format("{}, all {} devices at once, per device", copies, N));
    hw.sources["host_link.d2h_all_gbps"] =
        fit_source(d_all, fmt::format("{}, all {} devices at once, per device", copies, N));
    hw.sources["host_link.h2d_bidir_gbps"] =
        fit_source(h_bi, "both directions on every device at once, per device");
    hw.sources["host_link.d2h_bidir_gbps"] =
        fit_source(d_bi, "both directions on every device at once, per device");
    hw.sources["host_link.latency_us"] =
        by + ": mean fitted latency of the alone h2d and d2h curves (stream dispatch + memcpy start)";
    if (N > 1) {
      const LinkCurve* ag = r.links.find("all_gather", "");
      const LinkCurve* rs = r.links.find("reduce_scatter", "");
      // The CPU backend's collectives are memcpy / fp32 sums between the emulated devices' memory on
      // the comm streams: a direct path that does not use the h2d / d2h streams, so not via_host
      // (which would charge the links for the collective's bytes too).
      hw.fabric.kind = "pcie_p2p";
      hw.fabric.allgather_busbw_gbps = ag->fit.gbps;
      hw.fabric.reduce_scatter_busbw_gbps = rs->fit.gbps;
      hw.fabric.latency_s = 0.5 * (ag->fit.latency_s + rs->fit.latency_s);
      hw.sources["fabric.kind"] =
          "CPU backend: collectives copy between emulated devices' memory on the comm streams, not through "
          "the h2d/d2h "
          "streams; pcie_p2p is the model's kind for a direct path";
      hw.sources["fabric.allgather_busbw_gbps"] = fit_source(
          *ag, fmt::format("Backend::all_gather (bf16) on {} devices, bus bandwidth S (N-1)/N / t", N));
      hw.sources["fabric.reduce_scatter_busbw_gbps"] = fit_source(
          *rs,
          fmt::format("Backend::reduce_scatter (bf16 in, fp32 sum out) on {} devices, bus bandwidth", N));
      hw.sources["fabric.latency_us"] = by + ": mean fitted latency of the two collectives";
    } else {
      hw.fabric.kind = "none";
      hw.sources["fabric.kind"] = "--ranks 1: one emulated device, no collectives";
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
    hw.sources["gpu.bf16_peak_flops"] =
        fmt::format("{}: cuBLAS bf16 GEMM {}^3 with fp32 accumulation on GPU 0 (achieved, not datasheet)", by,
                    plan.gpu.gemm_n);
    hw.sources["gpu.hbm_gbps"] = by + ": device-to-device cudaMemcpyAsync, read + write bytes";
    hw.sources["gpu.mem_bytes"] = "cudaGetDeviceProperties totalGlobalMem of GPU 0";
    hw.gpu.runtime_bytes = inv.runtime_bytes;
    hw.sources["gpu.runtime_bytes"] =
        "cudaMemGetInfo of GPU 0 once its context exists, before any allocation (total - free; includes other "
        "processes' memory)";
    if (r.gpu.collective_bytes >= 0) {
      hw.gpu.collective_bytes = r.gpu.collective_bytes;
      hw.sources["gpu.collective_bytes"] = "cudaMemGetInfo of GPU 0 before and after ncclCommInitAll over every GPU";
    } else {
      hw.gpu.collective_bytes = default_collective_bytes(hw.gpu, r.gpu.fabric_kind);
      hw.sources["gpu.collective_bytes"] = "one GPU: no communicator (default_collective_bytes)";
    }
    hw.sources["host.pinned_limit_bytes"] =
        "RAM (not measured: page-locking limits depend on the system's settings)";
    hw.sources["host_link.h2d_gbps"] =
        fit_source(h_alone, "pinned cudaMemcpyAsync H2D, one GPU alone (mean over GPUs)");
    hw.sources["host_link.d2h_gbps"] =
        fit_source(d_alone, "pinned cudaMemcpyAsync D2H, one GPU alone (mean over GPUs)");
    hw.sources["host_link.h2d_all_gbps"] = fit_source(h_all, "pinned H2D on every GPU at once, per GPU");
    hw.sources["host_link.d2h_all_gbps"] = fit_source(d_all, "pinned D2H on every GPU at once, per GPU");
    hw.sources["host_link.h2d_bidir_gbps"] = fit_source(h_bi, "H2D and D2H on every GPU at once, per GPU");
    hw.sources["host_link.d2h_bidir_gbps"] = fit_source(d_bi, "H2D and D2H on every GPU at once, per GPU");
    hw.sources["host_link.latency_us"] =
        by + ": mean fitted latency of the alone H2D and D2H curves (CUDA events)";
    if (inv.count > 1) {
      const LinkCurve* ag = r.links.find("all_gather", "");
      const LinkCurve* rs = r.links.find("reduce_scatter", "");
      hw.fabric.kind = r.gpu.fabric_kind;
      hw.fabric.allgather_busbw_gbps = ag->fit.gbps;
      hw.fabric.reduce_scatter_busbw_gbps = rs->fit.gbps;
      hw.fabric.latency_s = 0.5 * (ag->fit.latency_s + rs->fit.latency_s);
      hw.sources["fabric.kind"] = "cudaDeviceCanAccessPeer / NVLink query between every pair";
      hw.sources["fabric.allgather_busbw_gbps"] =
          fit_source(*ag, "ncclAllGather (bf16), nccl-tests bus bandwidth");
      hw.sources["fabric.reduce_scatter_busbw_gbps"] =
          fit_source(*rs, "ncclReduceScatter (bf16, sum), nccl-tests bus bandwidth");
      hw.sources["fabric.latency_us"] = by + ": mean fitted latency of the two collectives";
    } else {
      hw.fabric.kind = "none";
    }
  }

  if (!r.units.empty()) {
    std::vector<std::string> names;
    for (const UnitComputeResult& u : r.units) {
      hw.unit_times.insert(hw.unit_times.end(), u.profiles.begin(), u.profiles.end());
      names.push_back(u.model);
    }
    hw.sources["unit_times"] = fmt::format(
        "{}: units of {}, compute-stream time per device with {} device(s) computing at once, of the rank "
        "driver's "
        "calls (allocation, zeroing, the unit op incl. bf16->fp32 parameter widening, fp32->bf16 gradient "
        "conversion); fitted over micro-batches {} at seq {}{}",
        by, fmt::join(names, ", "), r.units.front().concurrent_devices,
        fmt::join(plan.units.micro_batches, ","), fmt::join(plan.units.seq_lens, ","),
        plan.units.seq_lens.size() < 2 ? " (one seq length: per_token_ctx_s = 0, valid near that length)"
                                       : "");
    if (r.backend == "cpu") {
      // Efficiency of the FLOP-based fallback (models without unit_times): the largest measured model's
      // decoder FLOP/s at its largest case over the SGEMM rate.
      const UnitComputeResult* big = &r.units.front();
      for (const UnitComputeResult& u : r.units)
        if (u.model == largest.name) big = &u;
      const ModelCard& card = largest;
      const UnitCase* best = nullptr;
      for (const UnitCase& c : big->cases)
        if (c.kind == UnitKind::kDecoder && c.op == "fwd" && (!best || c.B * c.T > best->B * best->T))
          best = &c;
      const UnitFlops f = unit_flops(card, UnitKind::kDecoder, 0, best->B, best->T);
      const double eff = std::clamp(f.forward() / best->seconds.median / hw.gpu.bf16_peak_flops, 1e-3, 1.0);
      hw.gpu.matmul_efficiency = eff;
      hw.gpu.attention_efficiency = eff;
      for (const auto& row : big->fits)
        if (row.kind == UnitKind::kDecoder && row.op == "fwd") hw.gpu.kernel_overhead_s = row.fit.fit.fixed_s;
      const std::string eff_src = fmt::format(
          "{}: {} decoder forward FLOPs / measured time / gpu.bf16_peak_flops at B {} T {} (for models "
          "without "
          "unit_times)",
          by, card.name, best->B, best->T);
      hw.sources["gpu.matmul_efficiency"] = eff_src;
      hw.sources["gpu.attention_efficiency"] = eff_src + "; attention not separated, same value";
      hw.sources["gpu.kernel_overhead_s"] =
          fmt::format("{}: fixed_s of {}'s decoder forward fit", by, card.name);
    }
  }
  hw.validate("slidedp-profile");
}

}  // namespace slidedp::profiler
