// Target pacing; see target_pacing.h. Every figure comes from build_step_work for SlideDP on the
// target, the same numbers the analytical model and the simulator schedule.
#include "executor/target_pacing.h"

#include <fmt/format.h>

#include <cmath>

#include "common/error.h"

namespace slidedp::exec {
namespace {

void require(bool ok, const std::string& origin, const std::string& key, const std::string& what) {
  if (!ok) throw InputError(origin + ": " + key, what + " (pacing needs it)");
}

}  // namespace

TargetPacing::TargetPacing(const Workload& w, const Hardware& target, const Plan& plan, double time_scale)
    : target_name_(target.name) {
  if (!(time_scale > 0) || !std::isfinite(time_scale))
    throw InputError("--time-scale", fmt::format("{} must be a positive number", time_scale));
  if (target.gpu.emulated_on_host)
    throw InputError(target.name + ": gpu.emulated_on_host",
                     "the target is itself the CPU backend; emulate a machine with GPUs (e.g. h100-sxm-x4)");
  sw_ = build_step_work(w, target, plan, System::kSlideDP);
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

double TargetPacing::suggest_time_scale(const Workload& w, const Hardware& target, const Hardware& host,
                                        const Plan& plan) {
  const StepWork t = build_step_work(w, target, plan, System::kSlideDP);
  Plan host_plan = plan;
  host_plan.update_threads = 0;
  Hardware h = host;
  h.gpu.count = std::max(h.gpu.count, plan.ranks);
  const StepWork m = build_step_work(w, h, host_plan, System::kSlideDP);
  double ratio = 1.0;
  for (std::size_t u = 0; u < t.units.size(); ++u) {
    if (t.units[u].fwd_s > 0) ratio = std::max(ratio, m.units[u].fwd_s / t.units[u].fwd_s);
    if (t.units[u].bwd_s > 0) ratio = std::max(ratio, m.units[u].bwd_s / t.units[u].bwd_s);
  }
  return 2.0 * ratio;
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

PacedWork TargetPacing::copy(int rank, bool h2d, double target_bytes) const {
  PacedWork p;
  p.usages = pacer_->resources().copy(rank, h2d);
  p.work = target_bytes;
  p.delay_s = sw_.cap.link_latency_s;
  return p;
}

PacedWork TargetPacing::collective(bool all_gather, double bytes_per_port) const {
  PacedWork p;
  p.usages = pacer_->resources().collective(all_gather ? sw_.cap.allgather_busbw_Bps : sw_.cap.reduce_scatter_busbw_Bps);
  p.work = bytes_per_port;
  p.delay_s = sw_.cap.fabric_latency_s;
  return p;
}

PacedWork TargetPacing::update(int unit, int64_t elements, bool last_micro) const {
  const UnitWork& u = sw_.units.at(static_cast<std::size_t>(unit));
  const double share = u.numel > 0 ? static_cast<double>(elements) / static_cast<double>(u.numel) : 0.0;
  PacedWork p;
  const double thread_s = (last_micro ? u.cpu_last_thread_s : u.cpu_accum_thread_s) * share;
  const double host_mem = (last_micro ? u.cpu_last_host_mem_bytes : u.cpu_accum_host_mem_bytes) * share;
  p.usages = pacer_->resources().cpu(thread_s, host_mem);
  p.work = thread_s;
  return p;
}

}  // namespace slidedp::exec
