// Lossy AdamW moments (Plan::optimizer_states, --optimizer-states bf16 | 8bit) in training runs:
//  * the rounding noise is a function of the unit element, the AdamW step and the unit, never of how
//    the work is cut: every parameter and gradient route and activation policy gives the same bits,
//    and a run resumed from its checkpoint continues bit for bit (the checkpoint holds the moments
//    widened to fp32, exactly, and records "bf16");
//  * against fp32 moments (the reference), the run trains the same within a bound: over 30 steps of
//    the tiny model the mean loss of the last 10 steps differs by less than 5% of what the fp32 run's
//    loss fell over the run (bf16 m and v are within one bf16 step, 2^-8 relative, of their fp32
//    values, unbiased; a run that did not train, or trained with moments off by more, fails);
//  * host state is 4 bytes per parameter smaller; a checkpoint moves between the formats (widened or
//    rounded on load); lossy states are refused with --exact and for a baseline;
//  * 8-bit blockwise moments likewise: the same bits on every route and policy (the blocks are cut
//    where any route's ranges can start, model/q8_segments.h), a bitwise resume (decoding and
//    re-encoding a block gives back its codes), training within a bound of fp32 moments, 6 bytes per
//    parameter less plus 8 per block, the host memory account to the byte, conversions on resume.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"
#include "executor/trainer.h"
#include "io/checkpoint.h"
#include "model/memory_account.h"
#include "model/q8_segments.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

namespace fs = std::filesystem;
using testing::tiny_options;

TrainOptions bf16_states(TrainOptions o) {
  o.plan.optimizer_states = OptimizerStates::kBf16;
  return o;
}
TrainOptions q8_states(TrainOptions o) {
  o.plan.optimizer_states = OptimizerStates::k8bit;
  return o;
}

TEST(OptimizerStates, Bf16MomentsGiveTheSameBitsOnEveryRouteAndPolicy) {
  TrainOptions o = bf16_states(tiny_options(2, 1, 2, 3));
  o.plan.recompute_layers = Plan::kRest;
  testing::expect_every_route_and_policy_bitwise(
      o, {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep});
}

TEST(OptimizerStates, Bf16MomentsResumeBitwise) {
  testing::expect_resume_is_bitwise(bf16_states(tiny_options(2, 1, 1, 6)), "bf16_states");
}

// 30 steps of the tiny model with `format` moments train within 5% of what the fp32 run's loss fell
// over the last 10 steps (the bound each format's test states), and are not the fp32 run.
void expect_trains_as_fp32_moments_do(OptimizerStates format) {
  TrainOptions o = tiny_options(2, 2, 1, 30);
  o.lr.lr = 3e-3;
  TrainOptions lossy = o;
  lossy.plan.optimizer_states = format;
  const TrainResult fp32 = train(o), other = train(lossy);
  const double fell = fp32.steps.front().loss - testing::mean_loss(fp32, 20, 30);
  ASSERT_GT(fell, 0.5) << "the reference run must train for the comparison to mean anything";
  const double gap = std::fabs(testing::mean_loss(other, 20, 30) - testing::mean_loss(fp32, 20, 30));
  EXPECT_LT(gap, 0.05 * fell) << "fp32 " << testing::mean_loss(fp32, 20, 30) << ", "
                              << optimizer_states_name(format) << " " << testing::mean_loss(other, 20, 30);
  EXPECT_FALSE(testing::bitwise_equal(fp32, other)) << "the lossy run must not be the fp32 run";
}

TEST(OptimizerStates, Bf16MomentsTrainAsFp32MomentsDo) {
  expect_trains_as_fp32_moments_do(OptimizerStates::kBf16);
}

TEST(OptimizerStates, Bf16MomentsTakeFourBytesPerParameterLess) {
  TrainOptions o = tiny_options(1, 1, 1, 1);
  o.card = testing::tiny_card(true);
  const TrainResult fp32 = train(o), bf16 = train(bf16_states(o));
  const auto P = static_cast<int64_t>(make_model_layout(o.card).total_flat_numel);
  EXPECT_EQ(fp32.host_state_bytes - bf16.host_state_bytes, 4 * P);
}

// A bf16 run's checkpoint says so; it resumes with fp32 moments (widened, exactly) and an fp32 run's
// resumes with bf16 ones (rounded to nearest): both run on.
TEST(OptimizerStates, CheckpointsRecordTheFormatAndConvertOnResume) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_states_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions first = bf16_states(tiny_options(2, 1, 1, 2));
  first.checkpoint_dir = (root / "bf16").string();
  first.checkpoint_every = 2;
  train(first);
  const std::string dir = resolve_checkpoint_dir(first.checkpoint_dir);
  EXPECT_NE(read_text_file(dir + "/trainer_state.json").find("\"optimizer_states\": \"bf16\""),
            std::string::npos);
  TrainOptions widened = tiny_options(2, 1, 1, 2);
  widened.resume_dir = first.checkpoint_dir;
  EXPECT_EQ(train(widened).steps.size(), 2u);
  TrainOptions fp32_first = tiny_options(2, 1, 1, 2);
  fp32_first.checkpoint_dir = (root / "fp32").string();
  fp32_first.checkpoint_every = 2;
  train(fp32_first);
  EXPECT_EQ(read_text_file(resolve_checkpoint_dir(fp32_first.checkpoint_dir) + "/trainer_state.json")
                .find("optimizer_states"),
            std::string::npos);
  TrainOptions rounded = bf16_states(tiny_options(2, 1, 1, 2));
  rounded.resume_dir = fp32_first.checkpoint_dir;
  EXPECT_EQ(train(rounded).steps.size(), 2u);
  fs::remove_all(root);
}

TEST(OptimizerStates, LossyStatesAreRefusedWithExactAndForABaseline) {
  for (OptimizerStates f : {OptimizerStates::kBf16, OptimizerStates::k8bit}) {
    TrainOptions exact = tiny_options(1, 1, 1, 1);
    exact.plan.optimizer_states = f;
    exact.exact_fp32 = true;
    EXPECT_THROW(train(exact), InputError);
    TrainOptions baseline = exact;
    baseline.exact_fp32 = false;
    baseline.system = System::kZeroOffload;
    EXPECT_THROW(train(baseline), InputError);
  }
}

// Two ranks and chunks of 1,000 elements (tiny_options): blocks start at chunk, shard and tensor
// edges, most of them short.
TrainOptions q8_tiny(int accum, int steps) { return q8_states(tiny_options(2, 1, accum, steps)); }

TEST(OptimizerStates, EightBitMomentsGiveTheSameBitsOnEveryRouteAndPolicy) {
  for (int accum : {1, 2}) {
    SCOPED_TRACE(accum);
    TrainOptions o = q8_tiny(accum, 3);
    o.plan.recompute_layers = Plan::kRest;
    testing::expect_every_route_and_policy_bitwise(
        o, {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep});
  }
}

TEST(OptimizerStates, EightBitMomentsResumeBitwise) {
  testing::expect_resume_is_bitwise(q8_tiny(1, 6), "q8_states");
}

// The same bound as bf16's, though 8-bit codes are coarser (within 2^-4 of each value, nearest with 3
// fraction bits, against bf16's 2^-8): a run that trained with moments off by more, or did not train,
// fails it (the deliberate break of storing v with m's scales gives a loss of 5.3 against 3.3).
TEST(OptimizerStates, EightBitMomentsTrainAsFp32MomentsDo) {
  expect_trains_as_fp32_moments_do(OptimizerStates::k8bit);
}

// 8 bytes of fp32 m and v become 2 bytes of codes per parameter and two fp32 scales per block; the
// blocks are at least P / 256 and at most one more per segment. The host memory account agrees to
// the byte (it is what refuses a run over the host's RAM).
TEST(OptimizerStates, EightBitMomentsTakeSixBytesPerParameterLessPlusTheirScales) {
  TrainOptions o = q8_tiny(1, 1);
  o.card = testing::tiny_card(true);
  TrainOptions plain = o;
  plain.plan.optimizer_states = OptimizerStates::kFp32;
  const TrainResult fp32 = train(plain), q8 = train(o);
  const ModelLayout layout = make_model_layout(o.card);
  const auto P = static_cast<int64_t>(layout.total_flat_numel);
  const int64_t blocks = q8_model_blocks(layout, o.plan.chunk_numel, o.plan.ranks);
  int64_t segments = 0;
  for (const UnitLayout& u : layout.units)
    segments += static_cast<int64_t>(q8_segment_bounds(u, o.plan.chunk_numel, 2).size()) - 1;
  EXPECT_GE(blocks * 256, P);
  EXPECT_LE(blocks, P / 256 + segments);
  EXPECT_EQ(fp32.host_state_bytes - q8.host_state_bytes, 6 * P - 8 * blocks);
  const HostMemorySpec spec =
      host_memory_spec(layout, o.plan, o.system, o.card.tie_word_embeddings, false, o.card.hidden_size * 4);
  double total = 0;
  for (const MemoryItem& i : host_memory_items(layout, o.plan, o.seq_len, spec)) total += i.bytes;
  EXPECT_EQ(total, static_cast<double>(q8.host_allocated.total));
}

// An 8-bit run's checkpoint says so and resumes with fp32 or bf16 moments; fp32 and bf16 runs'
// resume with 8-bit ones (encoded on load), and so does one cut into other blocks (other chunks).
TEST(OptimizerStates, EightBitCheckpointsConvertOnResume) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_q8_states_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto save = [&](TrainOptions o, const std::string& name) {
    o.checkpoint_dir = (root / name).string();
    o.checkpoint_every = 2;
    train(o);
    return o.checkpoint_dir;
  };
  const std::string q8_dir = save(q8_tiny(1, 2), "q8");
  EXPECT_NE(read_text_file(resolve_checkpoint_dir(q8_dir) + "/trainer_state.json")
                .find("\"optimizer_states\": \"8bit\""),
            std::string::npos);
  for (OptimizerStates into : {OptimizerStates::kFp32, OptimizerStates::kBf16}) {
    TrainOptions o = tiny_options(2, 1, 1, 2);
    o.plan.optimizer_states = into;
    o.resume_dir = q8_dir;
    EXPECT_EQ(train(o).steps.size(), 2u);
  }
  for (const std::string& from : {save(tiny_options(2, 1, 1, 2), "fp32"),
                                  save(bf16_states(tiny_options(2, 1, 1, 2)), "bf16"), q8_dir}) {
    TrainOptions o = q8_tiny(1, 2);
    o.plan.chunk_numel = 3000;
    o.resume_dir = from;
    EXPECT_EQ(train(o).steps.size(), 2u) << from;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace slidedp::exec
