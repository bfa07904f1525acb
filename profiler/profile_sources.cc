// Where every value of a measured profile came from; see profile_sources.h. The branches follow
// assemble_profile's: the CPU backend, GPUs, and what only some runs measure.
#include "profiler/profile_sources.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/host_memory.h"
#include "common/provenance.h"
#include "common/units.h"
#include "profiler/profile_assembly.h"
#include "profiler/stats.h"

namespace slidedp::profiler {

std::map<std::string, std::string> profile_sources(const ProfileResult& r, const StagePlan& plan,
                                                   const ModelCard& largest, int devices, const GpuInventory& inv) {
  std::map<std::string, std::string> s;
  const std::string by = measured_by(r, plan);
  s["cpu.adamw_params_per_s"] = fmt::format(
      "{}: kernels::reduce_adamw_update with one bf16 gradient slot and the bf16 mirror over {} elements in "
      "chunks of {}, per thread count",
      by, plan.update.numel, r.cpu_update.table_chunk_numel);
  s["cpu.reduce_gbps"] = fmt::format(
      "{}: bf16 input bytes/s of each extra gradient slot in the fused reduce + AdamW, the slope of a "
      "least-squares fit of seconds vs slots {} (the model's (slots-1) x 2n / rate term); the standalone "
      "kernels::reduce_grads rate is in the measured notes",
      by, fmt::join(plan.update.slots, ","));
  s["cpu.convert_gbps_per_thread"] = by + ": kernels::f32_to_bf16 on one thread, fp32 input bytes/s";
  s["cpu.cores"] = "sched_getaffinity of the profiling process";
  s["host.mem_bw_gbps"] =
      fmt::format("{}: highest host-memory rate of any case ({}); STREAM counting", by, r.host_memory.best_case);
  if (r.host_memory.dram_bytes > 0 && !r.host_memory.by_threads.empty()) {
    const auto& all = r.host_memory.by_threads.back();
    s["host.mem_bw_gbps"] += fmt::format(
        "; in DRAM ({} buffers, {} threads): read {:.1f}, non-temporal write {:.1f}, copy {:.1f} GB/s",
        format_bytes(static_cast<double>(r.host_memory.dram_bytes)), all.threads, all.dram_read_gbps.median,
        all.dram_write_gbps.median, all.dram_copy_gbps.median);
  }
  s["host.ram_bytes"] = "sysconf(_SC_PHYS_PAGES) x page size";
  if (r.network) {
    const NetworkResult& n = *r.network;
    s["network.nic_gbps"] = fmt::format(
        "{}: node 0 -> node 1 through SlideDP's MPI link (executor/node_link.h), {} messages of {} back to back, "
        "median {} GB/s (spread {}); {} processes on {}: on one host this is the MPI transport between processes, "
        "not a NIC",
        by, network_plan(r.options).messages, format_bytes(static_cast<double>(n.by_size.back().bytes)),
        sig3(n.best_gbps), spread_percent(n.by_size.back().gbps), n.nodes, host_label());
    s["network.latency_us"] = fmt::format(
        "{}: half an 8-byte round trip through the link (its progress thread polls every 50 us while waiting), "
        "median {} us (spread {})",
        by, sig3(n.latency_us.median), spread_percent(n.latency_us));
  }

  const auto fit_source = [&](const LinkCurve& c, const std::string& what) {
    return fmt::format(
        "{}: {} fitted to latency + bytes / bandwidth over {} sizes {}..{} (rms residual {:.1f}%){}", by, what,
        c.points.size(), format_bytes(static_cast<double>(c.points.front().bytes)),
        format_bytes(static_cast<double>(c.points.back().bytes)), 100 * c.fit.quality.rms_rel_residual,
        c.fit.resolved ? "" : "; noise hid the size dependence: the largest size's rate");
  };
  // The three link cases of both directions; "{}" in a description stands for H2D or D2H.
  const auto link_sources = [&](const std::string& alone, const std::string& all, const std::string& bidir) {
    for (const char* dir : {"h2d", "d2h"}) {
      const std::string d = dir, upper = d == "h2d" ? "H2D" : "D2H";
      const auto text = [&](const std::string& what) { return fmt::format(fmt::runtime(what), upper); };
      s["host_link." + d + "_gbps"] = fit_source(curve_or_alone(r.links, "alone", d), text(alone));
      s["host_link." + d + "_all_gbps"] = fit_source(curve_or_alone(r.links, "all", d), text(all));
      s["host_link." + d + "_bidir_gbps"] = fit_source(curve_or_alone(r.links, "bidir", d), text(bidir));
    }
  };
  const auto fabric_sources = [&](const std::string& allgather, const std::string& reduce_scatter) {
    s["fabric.allgather_busbw_gbps"] = fit_source(*r.links.find("all_gather", ""), allgather);
    s["fabric.reduce_scatter_busbw_gbps"] = fit_source(*r.links.find("reduce_scatter", ""), reduce_scatter);
    s["fabric.latency_us"] = by + ": mean fitted latency of the two collectives";
  };

  if (r.backend == "cpu") {
    const int N = devices;
    s["gpu.count"] = fmt::format("--ranks {}: emulated devices of the CPU backend", N);
    s["gpu.emulated_on_host"] = "CPU backend: device compute and copies run on this host's cores and memory";
    s["gpu.host_threads_per_device"] =
        fmt::format("the CPU backend's BLAS threads per device, max(1, {} cores / {} devices)", r.cores, N);
    s["gpu.mem_bytes"] =
        fmt::format("the CPU backend's default device budget (16 GiB), capped at RAM / (devices + 1) = {}",
                    format_bytes(static_cast<double>(physical_ram_bytes() / (N + 1))));
    s["gpu.bf16_peak_flops"] = fmt::format(
        "{}: fp32 SGEMM {}^3 through kernels::gemm at {} BLAS threads (the CPU backend computes in fp32)", by,
        plan.sgemm_n, r.threads_per_device);
    s["gpu.hbm_gbps"] =
        fmt::format("{}: triad GB/s at {} threads (a device's elementwise work)", by, r.threads_per_device);
    s["host.pinned_limit_bytes"] = "CPU backend: host buffers are not page-locked; the limit is RAM";
    const std::string copies = "CPU backend: copy_h2d / copy_d2h = memcpy on the device's stream thread";
    link_sources(copies + ", one device alone", fmt::format("{}, all {} devices at once, per device", copies, N),
                 "both directions on every device at once, per device");
    s["host_link.latency_us"] =
        by + ": mean fitted latency of the alone h2d and d2h curves (stream dispatch + memcpy start)";
    if (N > 1) {
      s["fabric.kind"] =
          "CPU backend: collectives copy between emulated devices' memory on the comm streams, not through the "
          "h2d/d2h streams; pcie_p2p is the model's kind for a direct path";
      // t: the collective's spans as the executor's timeline records them (from the rendezvous to this
      // device's own copies or sums; profiler/backend_links.cc).
      fabric_sources(
          fmt::format("Backend::all_gather (bf16) on {} devices, bus bandwidth S (N-1)/N / t, t its timeline span", N),
          fmt::format("Backend::reduce_scatter (bf16 in, fp32 sum out) on {} devices, bus bandwidth, t its timeline span",
                      N));
    } else {
      s["fabric.kind"] = "--ranks 1: one emulated device, no collectives";
    }
  } else {
    s["gpu.bf16_peak_flops"] = fmt::format(
        "{}: cuBLAS bf16 GEMM {}^3 with fp32 accumulation on GPU 0 (achieved, not datasheet)", by, plan.gpu.gemm_n);
    s["gpu.hbm_gbps"] = by + ": device-to-device cudaMemcpyAsync, read + write bytes";
    s["gpu.mem_bytes"] = "cudaGetDeviceProperties totalGlobalMem of GPU 0";
    s["gpu.runtime_bytes"] =
        "cudaMemGetInfo of GPU 0 once its context exists, before any allocation (total - free; includes other "
        "processes' memory)";
    s["gpu.collective_bytes"] = r.gpu.collective_bytes >= 0
                                    ? "cudaMemGetInfo of GPU 0 before and after ncclCommInitAll over every GPU"
                                    : "one GPU: no communicator (default_collective_bytes)";
    s["host.pinned_limit_bytes"] = "RAM (not measured: page-locking limits depend on the system's settings)";
    link_sources("pinned cudaMemcpyAsync {}, one GPU alone (mean over GPUs)", "pinned {} on every GPU at once, per GPU",
                 "H2D and D2H on every GPU at once, per GPU");
    s["host_link.latency_us"] = by + ": mean fitted latency of the alone H2D and D2H curves (CUDA events)";
    if (inv.count > 1) {
      s["fabric.kind"] = "cudaDeviceCanAccessPeer / NVLink query between every pair";
      fabric_sources("ncclAllGather (bf16), nccl-tests bus bandwidth",
                     "ncclReduceScatter (bf16, sum), nccl-tests bus bandwidth");
    }
  }

  if (!r.units.empty()) {
    std::vector<std::string> names;
    for (const UnitComputeResult& u : r.units) names.push_back(u.model);
    s["unit_times"] = fmt::format(
        "{}: units of {}, compute-stream time per device with {} device(s) computing at once, of the rank "
        "driver's calls (allocation, zeroing, the unit op incl. bf16->fp32 parameter widening, fp32->bf16 "
        "gradient conversion); fitted over micro-batches {} at seq {}{}",
        by, fmt::join(names, ", "), r.units.front().concurrent_devices, fmt::join(plan.units.micro_batches, ","),
        fmt::join(plan.units.seq_lens, ","),
        plan.units.seq_lens.size() < 2 ? " (one seq length: per_token_ctx_s = 0, valid near that length)" : "");
    if (r.backend == "cpu") {
      const FallbackCase f = fallback_case(r, largest);
      const std::string eff = fmt::format(
          "{}: {} decoder forward FLOPs / measured time / gpu.bf16_peak_flops at B {} T {} (for models without "
          "unit_times)",
          by, largest.name, f.forward->B, f.forward->T);
      s["gpu.matmul_efficiency"] = eff;
      s["gpu.attention_efficiency"] = eff + "; attention not separated, same value";
      s["gpu.kernel_overhead_s"] = fmt::format("{}: fixed_s of {}'s decoder forward fit", by, largest.name);
    }
  }
  return s;
}

}  // namespace slidedp::profiler
