// Target pacing; see target_pacing.h. Every figure comes from build_step_work for the run's system on
// the target, the same numbers the analytical model and the simulator schedule.
#include "executor/target_pacing.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/seconds_since.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/layer_dispatch.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/model_step.h"

namespace slidedp::exec {
namespace {

void require(bool ok, const std::string& origin, const std::string& key, const std::string& what) {
  if (!ok) throw InputError(origin + ": " + key, what + " (pacing needs it)");
}

}  // namespace

TargetPacing::TargetPacing(const Workload& w, const Hardware& target, const Plan& plan, double time_scale,
                           System system)
    : target_name_(target.name) {
  if (!(time_scale >= kMinTimeScale && time_scale <= kMaxTimeScale))
    throw InputError("--time-scale", fmt::format("must be a number from {:g} to {:g} (got {:g}{})", kMinTimeScale,
                                                 kMaxTimeScale, time_scale,
                                                 time_scale > kMaxTimeScale ? ": the target is too slow to pace here"
                                                                            : ""));
  if (target.gpu.emulated_on_host)
    throw InputError(target.name + ": gpu.emulated_on_host",
                     "the target is itself the CPU backend; emulate a machine with GPUs (e.g. h100-sxm-x4)");
  sw_ = build_step_work(w, target, plan, system);
  const Capacities& c = sw_.cap;
  require(c.h2d_alone_Bps > 0 && c.d2h_alone_Bps > 0, target.name, "host_link", "positive h2d_gbps and d2h_gbps");
  require(c.h2d_root_Bps > 0 && c.d2h_root_Bps > 0 && c.duplex_Bps > 0, target.name, "host_link",
          "positive rates with all links busy and in both directions");
  require(c.host_mem_Bps > 0, target.name, "host.mem_bw_gbps", "a positive host-memory bandwidth");
  require(c.adamw_params_per_thread_s > 0 && c.reduce_Bps_per_thread > 0, target.name, "cpu",
          "positive adamw_params_per_s and reduce_gbps");
  require(plan.ranks < 2 || (c.allgather_busbw_Bps > 0 && c.reduce_scatter_busbw_Bps > 0), target.name, "fabric",
          "positive all-gather and reduce-scatter bus bandwidths for more than one rank");
  pacer_ = std::make_unique<Pacer>(c, time_scale);
}

PacedWork TargetPacing::post_backward_update() const {
  PacedWork p;
  p.usages = pacer_->resources().cpu(sw_.post_update_thread_s, sw_.post_update_host_mem_bytes);
  p.work = sw_.post_update_thread_s;
  return p;
}

namespace {

// This host's time for a decoder layer's forward, its backward, and the head's fused pass, with the
// CPU backend's kernels on one thread (parameters and inputs are small constants: only time matters).
struct HostPassTimes {
  double decoder_fwd_s = 0, decoder_bwd_s = 0, head_s = 0;
};
HostPassTimes time_host_passes(const Workload& w, const Plan& plan) {
  kernels::ModelSpecs s = kernels::make_model_specs(w.model, w.layout);
  s.head.loss_chunk_tokens = plan.loss_chunk_tokens;
  s.set_mlp_token_tile(plan.mlp_token_tile);
  s.set_threads(1);
  kernels::set_blas_threads(1);
  const int64_t B = plan.micro_batch, T = w.seq_len, N = B * T, C = s.embedding.C;
  auto filled = [](int64_t n, float v) {
    std::vector<float> b(static_cast<size_t>(std::max<int64_t>(n, 1)), v);
    return b;
  };
  auto aligned = [](int64_t bytes) {
    kernels::AlignedBuffer b(std::max<int64_t>(bytes, 64));
    std::memset(b.data(), 0, static_cast<size_t>(b.bytes()));
    return b;
  };
  HostPassTimes t;
  if (w.model.num_layers > 0) {
    // layer 0 stands for every layer (Gemma 4's differ; the ratio below is taken over every unit)
    const int64_t n = kernels::layer_flat_numel(s, 0);
    std::vector<float> p = filled(n, 0.01f), g = filled(n, 0.0f);
    std::vector<float> x = filled(N * C, 0.1f), y = filled(N * C, 0.0f), dx = filled(N * C, 0.0f);
    kernels::AlignedBuffer saved = aligned(kernels::layer_saved_bytes<float>(s, 0, B, T));
    kernels::AlignedBuffer ws = aligned(std::max(kernels::layer_forward_workspace_bytes<float>(s, 0, B, T),
                                                 kernels::layer_backward_workspace_bytes<float>(s, 0, B, T)));
    auto t0 = std::chrono::steady_clock::now();
    kernels::layer_forward<float>(s, 0, p.data(), x.data(), y.data(), saved.workspace(), B, T, ws.workspace());
    t.decoder_fwd_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    kernels::layer_backward<float>(s, 0, p.data(), x.data(), saved.workspace(), y.data(), dx.data(), g.data(), B, T,
                                   ws.workspace());
    t.decoder_bwd_s = seconds_since(t0);
  }
  {
    std::vector<float> p = filled(s.head.flat_numel, 1.0f), g = filled(s.head.flat_numel, 0.0f);
    std::vector<float> lm = filled(s.embedding.V * C, 0.01f), lg = filled(s.embedding.V * C, 0.0f);
    std::vector<float> x = filled(N * C, 0.1f), dx = filled(N * C, 0.0f);
    std::vector<int32_t> targets(static_cast<size_t>(std::max<int64_t>(N, 1)), 1);
    kernels::AlignedBuffer ws = aligned(kernels::head_workspace_bytes<float>(s.head, B, T, true));
    const auto t0 = std::chrono::steady_clock::now();
    kernels::head_forward_backward<float>(s.head, p.data(), lm.data(), x.data(), targets.data(), B, T, 1.0, dx.data(),
                                          g.data(), lg.data(), ws.workspace());
    t.head_s = seconds_since(t0);
  }
  return t;
}

}  // namespace

double TargetPacing::measured_time_scale(const Workload& w, const Hardware& target, const Plan& plan,
                                         System system) {
  const StepWork t = build_step_work(w, target, plan, system);
  const HostPassTimes h = time_host_passes(w, plan);
  double ratio = 1.0;
  for (const UnitWork& u : t.units) {
    if (u.kind == UnitKind::kDecoder) {
      if (u.fwd_s > 0) ratio = std::max(ratio, h.decoder_fwd_s / u.fwd_s);
      if (u.bwd_s > 0) ratio = std::max(ratio, h.decoder_bwd_s / u.bwd_s);
    } else if (u.kind == UnitKind::kHead && u.fwd_s > 0) {
      ratio = std::max(ratio, h.head_s / u.fwd_s);
    }
  }
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double share = std::max(1.0, (plan.ranks + 1.0) / cores);
  return std::max(kMinTimeScale, 1.5 * share * ratio);  // a target slower than this host: pace at the floor
}

PacedWork TargetPacing::compute(int rank, int unit, const std::string& op) const {
  const UnitWork& u = sw_.units.at(static_cast<std::size_t>(unit));
  PacedWork p;
  p.usages = pacer_->resources().compute(rank);
  if (op == "fwd") p.work = u.fwd_s;
  else if (op == "bwd") p.work = u.bwd_s;
  else if (op == "recompute") {
    // StepWork zeroes the recompute of kept layers; a recompute the executor runs is a forward's worth.
    p.work = u.recompute_s > 0 ? u.recompute_s : u.fwd_s;
  } else {
    SLIDEDP_CHECK(false, "unknown unit pass " + op);
  }
  return p;
}

PacedWork TargetPacing::device_update(int rank, int64_t elements) const {
  PacedWork p;
  p.usages = pacer_->resources().compute(rank);
  double total = 0;  // parameters of all units; each rank updates 1/ranks of them in post_gpu_s
  for (const UnitWork& u : sw_.units) total += static_cast<double>(u.numel);
  const double per_rank = total / std::max(1, sw_.cap.ranks);
  p.work = per_rank > 0 ? sw_.post_gpu_s * static_cast<double>(elements) / per_rank : 0.0;
  return p;
}

PacedWork TargetPacing::copy(int rank, bool h2d, double bytes) const {
  PacedWork p;
  p.usages = pacer_->resources().copy(rank, h2d);
  p.work = bytes;
  p.delay_s = sw_.cap.link_latency_s;
  return p;
}

PacedWork TargetPacing::copy(int rank, bool h2d, CopyKind kind, double elements) const {
  return copy(rank, h2d, elements * target_bytes_per_element(sw_.traits, kind));
}

PacedWork TargetPacing::collective(int rank, bool all_gather, double bytes_per_port) const {
  PacedWork p;
  p.usages = pacer_->resources().collective_port(
      rank, all_gather ? sw_.cap.allgather_busbw_Bps : sw_.cap.reduce_scatter_busbw_Bps);
  p.work = bytes_per_port;
  p.delay_s = sw_.cap.fabric_latency_s;
  return p;
}

PacedWork TargetPacing::update(int unit, int64_t elements, bool last_micro, double rank_share) const {
  const UnitWork& u = sw_.units.at(static_cast<std::size_t>(unit));
  const double share = u.numel > 0 ? rank_share * static_cast<double>(elements) / static_cast<double>(u.numel) : 0.0;
  PacedWork p;
  const double thread_s = (last_micro ? u.cpu_last_thread_s : u.cpu_accum_thread_s) * share;
  const double host_mem = (last_micro ? u.cpu_last_host_mem_bytes : u.cpu_accum_host_mem_bytes) * share;
  p.usages = pacer_->resources().cpu(thread_s, host_mem);
  p.work = thread_s;
  p.delay_s = sw_.traits.barriers_per_chunk * sw_.cap.link_latency_s;
  return p;
}

PacedWork TargetPacing::convert(int rank, int unit, int64_t elements) const {
  const UnitWork& u = sw_.units.at(static_cast<std::size_t>(unit));
  PacedWork p;
  if (u.deliver_convert_thread_s <= 0 || u.numel <= 0) return p;
  const double share = static_cast<double>(elements) / static_cast<double>(u.numel);
  // Host-memory traffic of the conversion itself: the delivery's, less the DMA's read of the result
  // (a real target's copy reads host memory once).
  const double host_mem = u.deliver_host_mem_bytes - u.deliver_h2d_bytes;
  p.usages = pacer_->resources().conversion(rank, host_mem / u.deliver_convert_thread_s);
  p.work = u.deliver_convert_thread_s * share;
  return p;
}

}  // namespace slidedp::exec
