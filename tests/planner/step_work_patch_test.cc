// The planner's WorkPatcher against build_step_work: every variant of activation mix, depth and chunk
// it derives must equal, field for field and bit for bit, what the model builds from scratch. If the
// model starts to use one of these knobs elsewhere, this test fails instead of the search drifting.
#include "planner/step_work_patch.h"

#include <gtest/gtest.h>

#include <random>

#include "model/step_model.h"

namespace slidedp::planner {
namespace {

void expect_same_work(const StepWork& a, const StepWork& b, const std::string& what) {
  SCOPED_TRACE(what);
  const Capacities &x = a.cap, &y = b.cap;
  EXPECT_EQ(x.ranks, y.ranks);
  EXPECT_EQ(x.h2d_link_Bps, y.h2d_link_Bps);
  EXPECT_EQ(x.d2h_link_Bps, y.d2h_link_Bps);
  EXPECT_EQ(x.h2d_alone_Bps, y.h2d_alone_Bps);
  EXPECT_EQ(x.d2h_alone_Bps, y.d2h_alone_Bps);
  EXPECT_EQ(x.h2d_root_Bps, y.h2d_root_Bps);
  EXPECT_EQ(x.d2h_root_Bps, y.d2h_root_Bps);
  EXPECT_EQ(x.duplex_Bps, y.duplex_Bps);
  EXPECT_EQ(x.host_mem_Bps, y.host_mem_Bps);
  EXPECT_EQ(x.cpu_cores, y.cpu_cores);
  EXPECT_EQ(x.update_threads, y.update_threads);
  EXPECT_EQ(x.adamw_params_per_thread_s, y.adamw_params_per_thread_s);
  EXPECT_EQ(x.reduce_Bps_per_thread, y.reduce_Bps_per_thread);
  EXPECT_EQ(x.convert_Bps_per_thread, y.convert_Bps_per_thread);
  EXPECT_EQ(x.allgather_busbw_Bps, y.allgather_busbw_Bps);
  EXPECT_EQ(x.reduce_scatter_busbw_Bps, y.reduce_scatter_busbw_Bps);
  EXPECT_EQ(x.link_latency_s, y.link_latency_s);
  EXPECT_EQ(x.fabric_latency_s, y.fabric_latency_s);
  EXPECT_EQ(x.fabric_via_host, y.fabric_via_host);
  EXPECT_EQ(x.emulated, y.emulated);
  EXPECT_EQ(x.host_threads_per_device, y.host_threads_per_device);
  EXPECT_EQ(x.gpu_hbm_Bps, y.gpu_hbm_Bps);
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.accum_steps, b.accum_steps);
  EXPECT_EQ(a.buffer_depth, b.buffer_depth);
  EXPECT_EQ(a.tokens_per_rank_micro, b.tokens_per_rank_micro);
  EXPECT_EQ(a.tokens_per_step, b.tokens_per_step);
  EXPECT_EQ(a.model_flops_per_step, b.model_flops_per_step);
  EXPECT_EQ(a.post_update_thread_s, b.post_update_thread_s);
  EXPECT_EQ(a.post_update_host_mem_bytes, b.post_update_host_mem_bytes);
  EXPECT_EQ(a.post_upload_h2d_bytes, b.post_upload_h2d_bytes);
  EXPECT_EQ(a.post_allgather_bytes, b.post_allgather_bytes);
  EXPECT_EQ(a.post_gpu_s, b.post_gpu_s);
  ASSERT_EQ(a.units.size(), b.units.size());
  for (std::size_t i = 0; i < a.units.size(); ++i) {
    SCOPED_TRACE("unit " + std::to_string(i));
    const UnitWork &u = a.units[i], &v = b.units[i];
    EXPECT_EQ(u.kind, v.kind);
    EXPECT_EQ(u.index, v.index);
    EXPECT_EQ(u.numel, v.numel);
    EXPECT_EQ(u.chunks, v.chunks);
    EXPECT_EQ(u.grad_chunks, v.grad_chunks);
    EXPECT_EQ(u.policy, v.policy);
    EXPECT_EQ(u.fwd_s, v.fwd_s);
    EXPECT_EQ(u.bwd_s, v.bwd_s);
    EXPECT_EQ(u.recompute_s, v.recompute_s);
    EXPECT_EQ(u.deliver_h2d_bytes, v.deliver_h2d_bytes);
    EXPECT_EQ(u.deliver_allgather_bytes, v.deliver_allgather_bytes);
    EXPECT_EQ(u.deliver_convert_thread_s, v.deliver_convert_thread_s);
    EXPECT_EQ(u.deliver_host_mem_bytes, v.deliver_host_mem_bytes);
    EXPECT_EQ(u.deliver_d2h_bytes, v.deliver_d2h_bytes);
    EXPECT_EQ(u.tied_h2d_bytes, v.tied_h2d_bytes);
    EXPECT_EQ(u.tied_allgather_bytes, v.tied_allgather_bytes);
    EXPECT_EQ(u.tied_host_mem_bytes, v.tied_host_mem_bytes);
    EXPECT_EQ(u.grad_reduce_scatter_bytes, v.grad_reduce_scatter_bytes);
    EXPECT_EQ(u.grad_d2h_bytes, v.grad_d2h_bytes);
    EXPECT_EQ(u.tied_grad_d2h_bytes, v.tied_grad_d2h_bytes);
    EXPECT_EQ(u.cpu_last_thread_s, v.cpu_last_thread_s);
    EXPECT_EQ(u.cpu_accum_thread_s, v.cpu_accum_thread_s);
    EXPECT_EQ(u.cpu_last_host_mem_bytes, v.cpu_last_host_mem_bytes);
    EXPECT_EQ(u.cpu_accum_host_mem_bytes, v.cpu_accum_host_mem_bytes);
    EXPECT_EQ(u.act_offload_bytes, v.act_offload_bytes);
  }
}

struct Case {
  const char* model;
  const char* hardware;
  int64_t seq;
  int ranks;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.hardware; }

class WorkPatcherTest : public ::testing::TestWithParam<Case> {};

TEST_P(WorkPatcherTest, VariantsEqualBuildStepWork) {
  const Case c = GetParam();
  const Workload w = make_workload(model_preset(c.model), c.seq);
  const Hardware hw = hardware_preset(c.hardware);
  const int L = static_cast<int>(w.model.num_layers);
  std::mt19937 rng(20261129);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 12; ++trial) {
    Plan base;
    base.ranks = c.ranks;
    base.micro_batch = pick(1, 4);
    base.accum_steps = pick(1, 3);
    base.param_route = pick(0, 1) ? ParamRoute::kSharded : ParamRoute::kReplicated;
    base.grad_route = pick(0, 1) ? GradRoute::kGpu : GradRoute::kCpu;
    base.update_threads = pick(0, 8);
    base.chunk_numel = int64_t{1} << pick(12, 26);
    WorkPatcher wp(w, hw, base);
    StepWork patched;
    for (int v = 0; v < 6; ++v) {
      Plan p = base;
      p.offload_layers = pick(0, L);
      p.recompute_layers = pick(0, L - p.offload_layers);
      p.keep_layers = Plan::kRest;
      p.gpu_buffer_depth = pick(1, 5);
      p.chunk_numel = (int64_t{1} << pick(10, 28)) + pick(0, 3) * 64;
      wp.make(p, patched);
      expect_same_work(patched, build_step_work(w, hw, p, System::kSlideDP), p.summary(L));
      // The chunk alone, on top of an earlier variant.
      const int64_t other = (int64_t{1} << pick(10, 28)) - 64;
      wp.set_chunk(patched, other);
      p.chunk_numel = other;
      expect_same_work(patched, build_step_work(w, hw, p, System::kSlideDP), p.summary(L) + " (set_chunk)");
    }
  }
}

TEST_P(WorkPatcherTest, ComputeBoundIsTheStepsGpuBusyTime) {
  const Case c = GetParam();
  const Workload w = make_workload(model_preset(c.model), c.seq);
  const Hardware hw = hardware_preset(c.hardware);
  const int L = static_cast<int>(w.model.num_layers);
  Plan p;
  p.ranks = c.ranks;
  p.micro_batch = 2;
  p.accum_steps = 2;
  WorkPatcher wp(w, hw, p);
  for (int keep : {0, L / 3, L}) {
    p.offload_layers = 0;
    p.recompute_layers = L - keep;
    p.keep_layers = Plan::kRest;
    StepWork sw;
    wp.make(p, sw);
    const Prediction pred = evaluate_step_work(sw, ModelFidelity::kContention);
    // Same sum in another order: equal to rounding. fp64 sums of ~100 positive terms: 1e-12 relative.
    EXPECT_NEAR(wp.compute_bound_s(keep), pred.busy_s.at(resource::kGpuCompute), 1e-12 * pred.step_time_s);
    EXPECT_LE(wp.compute_bound_s(keep), pred.step_time_s * (1 + 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, WorkPatcherTest,
                         ::testing::Values(Case{"slidedp-tiny", "cpu-dev", 128, 2},
                                           Case{"llama-3.2-1b", "h100-sxm-x4", 2048, 4},
                                           Case{"qwen2.5-7b", "rtx4090-x4", 4096, 4},  // via_host fabric
                                           Case{"qwen3-8b", "a800-x4", 1024, 3},
                                           Case{"llama-3.2-3b", "h200-x8", 4096, 8}),
                         [](const auto& tp) {
                           std::string n = std::string(tp.param.model) + "_" + tp.param.hardware;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace slidedp::planner
