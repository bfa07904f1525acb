// slidedp-sweep measured, small: a matched-batch point per system on a made-up slow machine (so this
// host's work fits the paced time at scale 20): every system is measured in the target's seconds and
// agrees with the simulator's prediction for its own plan; the report is written. Wall-clock ratios: runs alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "sweeps/measured_sweep.h"
#include "sweeps/sweep_spec.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

TEST(MeasuredSweep, RunsEverySystemItCanAndAgreesWithTheModel) {
  const SweepSpec spec = sweep_spec_from_yaml(R"(
name: measured_test
analyses: [speedups]
grids:
  - name: slow
    hardware:
      - preset: h100-sxm-x4
        label: slow-h100
        overrides:
          gpu: {bf16_peak_flops: 4.0e+9, matmul_efficiency: 1.0, attention_efficiency: 1.0, kernel_overhead_s: 0}
          host_link: {h2d_gbps: 0.2, d2h_gbps: 0.2, h2d_all_gbps: 0.2, d2h_all_gbps: 0.2, h2d_bidir_gbps: 0.2, d2h_bidir_gbps: 0.2, latency_us: 0}
          cpu: {adamw_params_per_s: {1: 2.0e+7}, reduce_gbps: {1: 50}}
    models: [slidedp-tiny]
    seq_lens: [16]
    tokens_per_step: [64]
    ranks: [2]
    systems: [slidedp, slideformer-dp, megatrain, zero-offload, fsdp2]
)",
                                              "test");
  MeasuredOptions o;
  o.steps = 4;
  o.warmup = 1;
  o.time_scale = exec::testing::paced_test_time_scale();  // 20, more on a host slow to wake threads
  const MeasuredSweep s = run_measured_sweep(spec, o);
  ASSERT_EQ(s.points.size(), 5u);
  for (const MeasuredPoint& m : s.points) {
    ASSERT_TRUE(m.ran) << m.row.system << ": " << m.not_run;
    EXPECT_EQ(m.time_scale, o.time_scale);
    // Each system's paced run against the simulator's prediction of the same plan and system: paced
    // runs agree within 4-9% (results/executor/bench.md, results/fidelity/paced); 30% for the pacer's
    // latency at this small scale.
    EXPECT_NEAR(m.step_s / m.predicted_step_s(), 1.0, 0.3) << m.row.system << " " << m.row.plan_summary;
  }
  // The measured rows carry the measurements.
  const SweepResult rows = s.measured_as_rows();
  for (std::size_t i = 0; i < rows.rows.size(); ++i) EXPECT_DOUBLE_EQ(rows.rows[i].tokens_per_s(), s.points[i].tokens_per_s);
  const fs::path dir = fs::temp_directory_path() / ("slidedp_measured_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto files = write_measured_report(s, dir.string(), "test");
  for (const char* f : {"points.csv", "README.md", "measured_vs_predicted.svg"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace slidedp
