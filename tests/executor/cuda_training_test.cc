// A tiny model trained 20 steps on the CUDA backend follows the CPU backend's loss curve (label gpu;
// skipped with the reason where no GPU is visible). Both start from the same weights and see the
// same data; the CPU computes in fp32 from the bf16 parameters, the GPU in bf16 activations with
// fp32 accumulation. At step 1 the difference is the bf16 forward alone (~1e-3 relative); afterwards
// Adam amplifies small gradient differences into different (equally good) trajectories, slowly. 3e-2
// relative per step over 20 steps bounds that drift and still fails a backend whose loss stalls,
// diverges, or is off by a constant factor (a wrong grad_scale or a dropped term).
#include <gtest/gtest.h>

#include <cmath>

#include "executor/cuda/cuda_backend.h"
#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

TEST(CudaTraining, TinyModelFollowsTheCpuLossCurveFor20Steps) {
  if (cuda_visible_devices() == 0)
    GTEST_SKIP() << "no CUDA GPU visible (cuda_visible_devices() == 0): this GPU test runs only where a GPU is";
  TrainOptions cpu = testing::tiny_options(1, 8, 1, 20);
  cpu.seq_len = 32;
  cpu.lr.lr = 1e-2;
  TrainOptions gpu = cpu;
  gpu.backend = "cuda";
  const TrainResult a = train(cpu), b = train(gpu);
  ASSERT_EQ(a.steps.size(), 20u);
  ASSERT_EQ(b.steps.size(), 20u);
  EXPECT_NEAR(b.steps[0].loss, a.steps[0].loss, 2e-3 * a.steps[0].loss) << "step 1 sees identical weights";
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_TRUE(std::isfinite(b.steps[i].loss));
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 3e-2 * a.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(b.steps[i].tokens, a.steps[i].tokens);
  }
  EXPECT_LT(b.steps.back().loss, b.steps.front().loss - 0.5) << "the CUDA run must learn";
}

}  // namespace
}  // namespace slidedp::exec
