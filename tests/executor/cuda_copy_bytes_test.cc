// One source of the bytes a copy moves, on a GPU (label gpu; skipped with the reason where no GPU
// is visible): the CUDA backend's copies, as their spans report them (the bytes each cudaMemcpyAsync
// moved, MeasuredSpan::bytes), add up per step to the host-link bytes the step model charges for the
// same plan. The CPU backend's counterparts (copy_bytes_test.cc) check the pacer's weighing and the
// CPU backend's own copies in the same wire dtypes; this one checks that the real copies are the
// model's elements in the model's dtypes: bf16 parameters, gradients and offloaded activations, FSDP
// offload's fp32 parameters, the gpu route's fp32 shard, the ZeRO offloads' fp32 partitions (one rank:
// widened on the device) and round trips. The gpu route's ZeRO offloads move their exact fp32 sums
// between micro-steps where DeepSpeed moves 16 bits: the closed surplus of link_bytes.h.
#include <gtest/gtest.h>

#include "executor/cuda/cuda_backend.h"
#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"
#include "tests/executor/link_bytes.h"

namespace slidedp::exec {
namespace {

using testing::Case;

// One GPU per rank (NCCL).
void expect_copies_are_the_models(const Case& c) {
  SCOPED_TRACE(c.name);
  TrainOptions o = testing::case_options(testing::tiny_card(), c);
  o.backend = "cuda";
  const Hardware target = testing::paced_target(10.0, 1.5e7);
  testing::LinkBytes expected = testing::model_link_bytes_per_step(o, target);
  expected.d2h += testing::exact_sum_surplus_per_step(o, target).d2h;
  testing::expect_span_bytes_are_the_models(train(o), o, expected);
}

TEST(CudaCopyBytes, CopiesMoveWhatTheModelCharges) {
  if (cuda_visible_devices() == 0)
    GTEST_SKIP()
        << "no CUDA GPU visible (cuda_visible_devices() == 0): this GPU test runs only where a GPU is";
  for (const Case& c :
       {Case{"slidedp cpu route", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kCpu, false, false,
             1},
        Case{"slidedp offload", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kCpu, true, false, 1},
        Case{"fsdp-offload", System::kFsdpOffload, ParamRoute::kReplicated, GradRoute::kCpu, false, false, 1},
        Case{"zero-offload", System::kZeroOffload, ParamRoute::kReplicated, GradRoute::kGpu, false, false, 1},
        Case{"zero3-offload", System::kZero3Offload, ParamRoute::kSharded, GradRoute::kGpu, false, false, 1}})
    expect_copies_are_the_models(c);
}

// The gpu route needs two ranks, one GPU each (with one rank the executor and the model both take
// the cpu route).
TEST(CudaCopyBytes, TheGpuRoutesShardMovesWhatTheModelCharges) {
  if (cuda_visible_devices() < 2)
    GTEST_SKIP() << "fewer than two CUDA GPUs visible (" << cuda_visible_devices()
                 << "): the gpu route's shard needs two ranks, one GPU each";
  for (const Case& c :
       {Case{"slidedp gpu route", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kGpu},
        Case{"zero-offload", System::kZeroOffload}, Case{"zero3-offload", System::kZero3Offload}})
    expect_copies_are_the_models(c);
}

}  // namespace
}  // namespace slidedp::exec
