// The memory account (model/memory_account.h) against the executor that it describes:
//  * its replay of the rank driver's allocation order equals what the driver really holds: the CPU
//    backend's held-bytes high-water mark (allocations minus releases, in program order, so the
//    comparison is exact and independent of timing), for a grid of plans over every route pair,
//    activation policy, depth, MLP tile, accumulation and rank count, tied and untied;
//  * a run whose device budget is the account's peak runs (the account is not too small) and its
//    arena's high-water mark lies between 90% and 100% of that peak (the account is not padded);
//  * the planner's estimate (estimate_memory on the CPU backend's hardware) equals the executor's
//    up-front account for every preset model and a grid of plans, within 1%.
#include "model/memory_account.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "executor/backend_registry.h"
#include "executor/run_control.h"
#include "executor/trainer.h"
#include "model/memory_model.h"
#include "model/workload.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

using testing::tiny_options;

struct Case {
  int ranks, micro_batch, accum, depth;
  ParamRoute param_route;
  GradRoute grad_route;
  int offload, recompute;  // the rest keep
  int64_t mlp_tile;
  bool tied;
  bool wide = false;   // a wide model at a short sequence: gradients and slots, not activations, peak
  bool exact = false;  // fp32 delivery: no compute copy of the parameters in the unit scratch
};

std::string describe(const Case& c) {
  return fmt::format("ranks {} mb {} acc {} depth {} {}/{} offload {} recompute {} tile {} {}{}{}", c.ranks,
                     c.micro_batch, c.accum, c.depth, c.param_route == ParamRoute::kSharded ? "sharded" : "replicated",
                     c.grad_route == GradRoute::kGpu ? "gpu" : "cpu", c.offload, c.recompute, c.mlp_tile,
                     c.tied ? "tied" : "untied", c.wide ? " wide" : "", c.exact ? " exact" : "");
}

TrainOptions options_for(const Case& c) {
  TrainOptions o = tiny_options(c.ranks, c.micro_batch, c.accum, 1);
  o.card = testing::tiny_card(c.tied);
  if (c.wide) {
    o.card = model_card_from_yaml(std::string("name: wide\nmodel_type: qwen2\nhidden_size: 256\nnum_hidden_layers: 2\n"
                                              "num_attention_heads: 4\nnum_key_value_heads: 2\nintermediate_size: 512\n"
                                              "vocab_size: 512\ntie_word_embeddings: ") +
                                      (c.tied ? "true\n" : "false\n"),
                                  "wide");
    o.seq_len = 4;
  }
  o.exact_fp32 = c.exact;
  o.plan.gpu_buffer_depth = c.depth;
  o.plan.param_route = c.param_route;
  o.plan.grad_route = c.grad_route;
  o.plan.offload_layers = c.offload;
  o.plan.recompute_layers = c.recompute;
  o.plan.keep_layers = Plan::kRest;
  o.plan.mlp_token_tile = c.mlp_tile;
  return o;
}

const Case kCases[] = {
    {1, 2, 1, 2, ParamRoute::kReplicated, GradRoute::kCpu, 0, 0, 0, false},
    {2, 1, 2, 2, ParamRoute::kSharded, GradRoute::kCpu, 1, 1, 0, false},
    {2, 2, 1, 3, ParamRoute::kReplicated, GradRoute::kGpu, 0, 3, 0, true},
    {3, 1, 1, 2, ParamRoute::kSharded, GradRoute::kGpu, 2, 0, 8, false},
    {3, 2, 2, 4, ParamRoute::kReplicated, GradRoute::kCpu, 3, 0, 0, true},
    {2, 2, 1, 1, ParamRoute::kSharded, GradRoute::kCpu, 1, 2, 0, false},
    {1, 3, 2, 5, ParamRoute::kReplicated, GradRoute::kCpu, 0, 1, 16, true},
    {1, 1, 1, 2, ParamRoute::kReplicated, GradRoute::kCpu, 0, 1, 0, false, true, true},
    {2, 1, 2, 3, ParamRoute::kSharded, GradRoute::kGpu, 1, 0, 0, true, true, false},
    {3, 2, 1, 2, ParamRoute::kReplicated, GradRoute::kGpu, 0, 2, 0, false, true, true},
    {2, 1, 1, 2, ParamRoute::kSharded, GradRoute::kCpu, 0, 0, 0, true, true, true},
    // more micro-steps than the replay walks (it stops at three: the pattern repeats)
    {2, 1, 6, 2, ParamRoute::kSharded, GradRoute::kGpu, 1, 1, 0, false},
    {1, 2, 5, 3, ParamRoute::kReplicated, GradRoute::kCpu, 0, 2, 0, true},
};

// The replay equals the driver: exactly, because both count the same aligned requests in the same order.
TEST(MemoryAccount, ReplayEqualsWhatTheRankDriverHolds) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const TrainResult r = train(options_for(c));
    ASSERT_FALSE(r.device_held_high_water_bytes.empty());
    EXPECT_EQ(static_cast<double>(r.device_held_high_water_bytes[0]), r.device_account.driver_peak_bytes)
        << "the account peaks at " << r.device_account.peak_at;
    // The in-flight allowance is what the pipeline keeps busy beyond the driver's own buffers.
    EXPECT_GE(r.device_account.peak_bytes, r.device_account.driver_peak_bytes);
  }
}

// The same for Gemma 4's layers of two shapes (each sized by its own carve code, per layer), dense
// and with the mixture-of-experts block.
TEST(MemoryAccount, ReplayEqualsWhatTheRankDriverHoldsForGemma4) {
  int compared = 0;
  for (const ModelCard& card : {testing::tiny_gemma4_card(), testing::tiny_gemma4_moe_card()})
    for (const Case& c : kCases) {
      if (c.mlp_tile > 0 || c.depth < 2 || c.wide) continue;  // untiled; tied head needs two slots
      SCOPED_TRACE(card.name + ", " + describe(c));
      TrainOptions o = options_for(c);
      o.card = card;
      const TrainResult r = train(o);
      ASSERT_FALSE(r.device_held_high_water_bytes.empty());
      EXPECT_EQ(static_cast<double>(r.device_held_high_water_bytes[0]), r.device_account.driver_peak_bytes)
          << "the account peaks at " << r.device_account.peak_at;
      ++compared;
    }
  EXPECT_GE(compared, 8);
}

// Every system the executor runs: the baselines' own buffers (FSDP2's device state, FSDP offload's fp32
// fetch, ZeRO-Offload's gradient sum copied back in) are charged as their drivers allocate them, so the
// replay still equals what the driver holds, exactly, for every family.
TEST(MemoryAccount, ReplayEqualsWhatTheRankDriverHoldsForEverySystem) {
  int compared = 0;
  for (const ModelCard& card :
       {testing::tiny_card(true), testing::tiny_gemma4_moe_card(), testing::tiny_qwen3_5_card()})
    for (System system : {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload, System::kMegaTrain,
                          System::kFsdp2, System::kZero3Offload, System::kFsdpOffload})
      for (int accum : {1, 2}) {
        TrainOptions o = tiny_options(2, 1, accum, 1);
        o.card = card;
        o.system = system;
        SCOPED_TRACE(fmt::format("{} {} accumulation {}", card.name, system_name(system), accum));
        const TrainResult r = train(o);
        ASSERT_FALSE(r.device_held_high_water_bytes.empty());
        EXPECT_EQ(static_cast<double>(r.device_held_high_water_bytes[0]), r.device_account.driver_peak_bytes)
            << "the account peaks at " << r.device_account.peak_at;
        ++compared;
      }
  EXPECT_EQ(compared, 42);
}

// One rank: the ZeRO offloads' gradient leaves as fp32 through a chunk buffer it is widened into on the
// device (besides their round trip's scratch target), charged as the driver allocates it.
TEST(MemoryAccount, ReplayEqualsWhatTheRankDriverHoldsForTheZeroOffloadsOnOneRank) {
  for (System system : {System::kZeroOffload, System::kZero3Offload})
    for (int accum : {1, 2}) {
      TrainOptions o = tiny_options(1, 1, accum, 1);
      o.system = system;
      SCOPED_TRACE(fmt::format("{} accumulation {}", system_name(system), accum));
      const TrainResult r = train(o);
      ASSERT_FALSE(r.device_held_high_water_bytes.empty());
      EXPECT_EQ(static_cast<double>(r.device_held_high_water_bytes[0]), r.device_account.driver_peak_bytes)
          << "the account peaks at " << r.device_account.peak_at;
      const auto& items = r.device_account.items;
      EXPECT_TRUE(std::any_of(items.begin(), items.end(), [](const MemoryItem& i) {
        return i.name.find("cast to fp32") != std::string::npos;
      })) << "no widened-gradient buffer charged";
    }
}

// Budget = the account's peak: the run completes (the arena never needs more than the account), and the
// arena really fills it: its high-water mark (deferred frees counted until their stream gets there) is at
// least 90% of the peak. 90% leaves room for the in-flight allowance, which the streams' timing may not
// use to the byte.
TEST(MemoryAccount, RunsWithinItsPeakAndFillsIt) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    TrainOptions probe = options_for(c);
    probe.steps = 0;  // only the up-front account
    const double peak = train(probe).device_account.peak_bytes;
    TrainOptions o = options_for(c);
    o.steps = 2;
    o.device_budget_bytes = static_cast<int64_t>(peak);
    const TrainResult r = train(o);
    ASSERT_EQ(r.steps.size(), 2u);
    for (int64_t hw : r.device_high_water_bytes) {
      EXPECT_LE(static_cast<double>(hw), peak);
      EXPECT_GE(static_cast<double>(hw), 0.9 * peak);
    }
  }
}

// The planner's view (estimate_memory for the CPU backend's hardware) equals the executor's up-front
// account (the same function over the live backend's units) within 1%, for every preset model and a
// grid of plans. Only the device is built: no host state, so 70B models cost nothing here.
TEST(MemoryAccount, PlannerEqualsTheExecutorsAccountForEveryPreset) {
  Hardware hw = hardware_preset("cpu-dev");
  hw.gpu.host_threads_per_device = 1;  // as the trainer builds the CPU backend
  int64_t compared = 0;
  for (const std::string& name : model_preset_names()) {
    SCOPED_TRACE(name);
    const ModelCard card = model_preset(name);
    const ModelLayout layout = make_model_layout(card);
    for (const Case& c : kCases) {
      Plan p;
      p.ranks = c.ranks;
      p.micro_batch = c.micro_batch;
      p.accum_steps = c.accum;
      p.gpu_buffer_depth = c.depth;
      p.param_route = c.param_route;
      p.grad_route = c.grad_route;
      p.offload_layers = c.offload;
      p.recompute_layers = c.recompute;
      p.keep_layers = Plan::kRest;
      p.mlp_token_tile = c.mlp_tile;
      p.chunk_numel = int64_t{1} << 22;
      if (card.tie_word_embeddings && p.gpu_buffer_depth < 2) continue;  // the trainer refuses it
      if (card.hybrid_layers() && p.mlp_token_tile > 0) continue;  // Gemma 4 and Qwen3.6 have no MLP tile
      const int64_t T = 256;
      const MemoryEstimate planned = estimate_memory(make_workload(card, T), hw, p, System::kSlideDP);
      RunControl control;
      BackendOptions bo;
      bo.devices = 1;
      bo.loss_chunk_tokens = p.loss_chunk_tokens;
      bo.mlp_token_tile = p.mlp_token_tile;
      auto backend = make_backend("cpu", card, layout, bo, control);
      const RankMemoryAccount account = rank_memory_account(layout, p, T, card.tie_word_embeddings,
                                                            backend->device(0).memory_spec(p.micro_batch, T));
      EXPECT_NEAR(planned.gpu_peak_bytes, account.peak_bytes, 0.01 * account.peak_bytes) << describe(c);
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);
}

// The host side of the one account: host_memory_items (what the model charges for SlideDP's host
// memory and what the trainer checks against RAM before allocating) equals, byte for byte, what the
// backend's alloc_host gave out over the whole run, all and pinned, for every system, every family
// and the plan features that add buffers (accumulation, clipping, offload, sharded delivery, the gpu
// route, fp32 delivery). Before, the trainer checked 12 bytes per parameter and the staging, mirror and
// accumulator were nobody's sum.
TEST(MemoryAccount, HostItemsAreWhatTheExecutorAllocatesForEverySystemAndFamily) {
  struct Family {
    const char* name;
    ModelCard card;
  };
  const std::vector<Family> families = {{"llama tied", testing::tiny_card(true)},
                                        {"qwen3", testing::tiny_card(false, "qwen3")},
                                        {"gemma4 moe", testing::tiny_gemma4_moe_card()},
                                        {"qwen3.6", testing::tiny_qwen3_5_card()},
                                        {"qwen3.6 moe", testing::tiny_qwen3_5_moe_card()}};
  int compared = 0;
  for (const Family& f : families)
    for (System system : {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload, System::kMegaTrain,
                          System::kFsdp2, System::kZero3Offload, System::kFsdpOffload})
      for (int variant = 0; variant < 3; ++variant) {
        TrainOptions o = tiny_options(2, 2, variant == 1 ? 2 : 1, 1);
        o.card = f.card;
        o.system = system;
        if (variant == 1) o.plan.offload_layers = 1, o.plan.grad_route = GradRoute::kGpu;
        if (variant == 2) {
          o.plan.param_route = ParamRoute::kSharded;
          if (system != System::kFsdp2) o.optimizer.clip_grad_norm = 1.0;
          o.exact_fp32 = true;
        }
        SCOPED_TRACE(fmt::format("{} {} variant {}", f.name, system_name(system), variant));
        const TrainResult r = train(o);
        const ModelLayout layout = make_model_layout(o.card);
        Plan p = plan_for_system(o.plan, o.system, o.card);
        p.verify_updates = o.optimizer.clip_grad_norm > 0;
        const HostMemorySpec spec =
            host_memory_spec(layout, p, o.system, o.card.tie_word_embeddings, o.exact_fp32, o.card.hidden_size * 4);
        double total = 0, pinned = 0;
        for (const MemoryItem& i : host_memory_items(layout, p, o.seq_len, spec)) {
          total += i.bytes;
          if (i.name.find("(pinned") != std::string::npos) pinned += i.bytes;
        }
        EXPECT_EQ(total, static_cast<double>(r.host_allocated.total));
        EXPECT_EQ(pinned, static_cast<double>(r.host_allocated.pinned));
        ++compared;
      }
  EXPECT_EQ(compared, 105);
}

// A run whose host memory exceeds the RAM it may use is refused before it allocates, naming the
// largest items; one byte more RAM and it runs.
TEST(MemoryAccount, ARunOverTheHostsRamIsRefusedNamingItsLargestItems) {
  TrainOptions o = tiny_options(2, 2, 2, 1);
  const ModelLayout layout = make_model_layout(o.card);
  const HostMemorySpec spec = host_memory_spec(layout, o.plan, o.system, o.card.tie_word_embeddings, false,
                                               o.card.hidden_size * 4);
  double total = 4.0 * static_cast<double>(layout.total_flat_numel);  // the initial weights while they load
  for (const MemoryItem& i : host_memory_items(layout, o.plan, o.seq_len, spec)) total += i.bytes;
  o.host_ram_bytes = static_cast<int64_t>(total) - 1;
  try {
    train(o);
    ADD_FAILURE() << "a run over the host's RAM was accepted";
  } catch (const InfeasibleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("host memory"), std::string::npos) << what;
    EXPECT_NE(what.find("fp32 AdamW m and v"), std::string::npos) << what;  // the largest item
  }
  o.host_ram_bytes = static_cast<int64_t>(total);
  EXPECT_EQ(train(o).steps.size(), 1u);
}

// The pinned part of the account against --host-pinned-limit: one byte under it is refused before
// anything is allocated, naming the largest pinned item; at the limit it runs. A run under a limit
// that counted every item (pinned or not) would be refused at the state's size.
TEST(MemoryAccount, ARunOverThePinnedLimitIsRefusedNamingItsLargestPinnedItems) {
  TrainOptions o = tiny_options(2, 2, 2, 1);
  o.plan.offload_layers = 1;  // offload buffers are pinned too
  const ModelLayout layout = make_model_layout(o.card);
  const HostMemorySpec spec = host_memory_spec(layout, o.plan, o.system, o.card.tie_word_embeddings, false,
                                               o.card.hidden_size * 4);
  double pinned = 0, largest = 0;
  std::string largest_name;
  for (const MemoryItem& i : host_memory_items(layout, o.plan, o.seq_len, spec))
    if (i.name.find("(pinned") != std::string::npos) {
      pinned += i.bytes;
      if (i.bytes > largest) largest = i.bytes, largest_name = i.name;
    }
  ASSERT_GT(pinned, 0.0);
  o.host_pinned_limit_bytes = static_cast<int64_t>(pinned) - 1;
  try {
    train(o);
    ADD_FAILURE() << "a run over the pinned limit was accepted";
  } catch (const InfeasibleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("page-locks"), std::string::npos) << what;
    EXPECT_NE(what.find(largest_name), std::string::npos) << what;
  }
  o.host_pinned_limit_bytes = static_cast<int64_t>(pinned);
  EXPECT_EQ(train(o).steps.size(), 1u);
}

}  // namespace
}  // namespace slidedp::exec
