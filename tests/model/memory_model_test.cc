// The memory account and the memory model against hand counts for one small model and plan.
#include <gtest/gtest.h>

#include "model/memory_model.h"
#include "model/memory_account.h"
#include "model/model_costs.h"
#include "model/unit_memory.h"
#include "tests/model/tiny_card.h"

namespace slidedp {
namespace {

double item(const std::vector<MemoryItem>& items, const std::string& prefix) {
  for (const auto& i : items)
    if (i.name.rfind(prefix, 0) == 0) return i.bytes;
  return 0;
}

// The account's replay against a hand count: a tiny layout (embedding 16384 elements, two decoder
// layers of 36992, head 16448), one rank, depth 2, layer 0 recomputed and layer 1 kept, with round unit
// sizes (hidden 100 B, saved 1000, forward scratch 300, backward 500, head 400) and no rounding, so
// every step of the replay can be followed by hand (the numbers in the comments are the live bytes).
TEST(MemoryAccount, ReplayMatchesAHandCount) {
  ModelCard c = tiny_card();
  const ModelLayout layout = make_model_layout(c);
  ASSERT_EQ(layout.units[0].flat_numel, 16384);
  ASSERT_EQ(layout.units[1].flat_numel, 36992);
  ASSERT_EQ(layout.units[3].flat_numel, 16448);
  Plan p;
  p.micro_batch = 2;
  p.recompute_layers = 1;
  p.keep_layers = Plan::kRest;
  p.gpu_buffer_depth = 2;
  RankMemorySpec s;
  s.decoder = {100, 1000, 300, 500};
  s.head = {100, 0, 400, 0};
  s.align_bytes = 1;
  s.zero_bytes_take_one = false;
  const RankMemoryAccount a = rank_memory_account(layout, p, 32, false, s);
  // Forward: tokens 2 x 64 x 4 = 512; slots of units 0 and 1 (32768 + 73984), then 1 and 2, then 2 and
  // the head (73984 + 32896); the head's dx, fp32 gradient (65792), loss, scratch; its wire copy
  // (32896) drains. Backward of layer 1 (slot resident): its fp32 gradient 147968 and wire 73984.
  // Backward of layer 0: the head's slot gives way to layer 0's; the head's wire has drained, layer
  // 1's still drains; fp32 gradient 147968 + wire 73984 on top: the peak, 444516 bytes.
  EXPECT_DOUBLE_EQ(a.peak_bytes, 444516);
  EXPECT_EQ(a.peak_at, "backward of layer 0");
  EXPECT_DOUBLE_EQ(item(a.items, "parameter slots (2 deep)"), 2 * 73984.0);
  EXPECT_DOUBLE_EQ(item(a.items, "token ids and targets"), 512);
  EXPECT_DOUBLE_EQ(item(a.items, "hidden states in use"), 100);  // layer 0's dx
  EXPECT_DOUBLE_EQ(item(a.items, "gradient of the unit"), 147968.0 + 73984);
  EXPECT_DOUBLE_EQ(item(a.items, "gradient draining"), 73984);
  // Without what drains, the driver itself holds at most 444516 - 73984 bytes.
  EXPECT_DOUBLE_EQ(a.driver_peak_bytes, 370532);
  double sum = 0;
  for (const auto& i : a.items) sum += i.bytes;
  EXPECT_DOUBLE_EQ(sum, a.peak_bytes);
  // The runtime's memory is added as stated (one communicator only when there are collectives).
  s.runtime_bytes = 7;
  s.collective_bytes = 11;
  EXPECT_DOUBLE_EQ(rank_memory_account(layout, p, 32, false, s).peak_bytes, 444516 + 7);
  p.ranks = 2;
  EXPECT_GE(rank_memory_account(layout, p, 32, false, s).peak_bytes, 444516 + 7 + 11);
}

TEST(MemoryModel, HostItemsForATinyModel) {
  // hidden 64, 2 layers, 4 heads of 16, 2 kv heads, intermediate 128, vocab 256, untied.
  ModelCard c = tiny_card();
  Workload w = make_workload(c, 32);
  Hardware hw = hardware_preset("h100-sxm-x4");
  Plan p;
  p.ranks = 2;
  p.micro_batch = 2;
  p.accum_steps = 2;
  p.offload_layers = 1;
  p.recompute_layers = 1;
  p.keep_layers = 0;
  p.gpu_buffer_depth = 2;
  p.chunk_numel = 1024;
  MemoryEstimate m = estimate_memory(w, hw, p, System::kSlideDP);
  const double P = 16384 + 2 * 36992 + 16448;
  // split master's low halves 2P, m and v 8P, bf16 mirror 2P, fp32 accumulator 4P (accum 2), staging rings of
  // 2 ranks x 8 chunks x 1024 x 2 bytes, offloaded inputs 2 ranks x 1 layer x 64 tokens x 64 x 2, token
  // buffers 2 ranks x 2 x (64 x 8 + 16).
  EXPECT_DOUBLE_EQ(item(m.host_items, "master weights' low halves"), 2 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "fp32 AdamW"), 8 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "delivery mirror (bf16)"), 2 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "fp32 gradient accumulator"), 4 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "gradient staging rings"), 2.0 * 8 * 1024 * 2);
  EXPECT_DOUBLE_EQ(item(m.host_items, "offloaded activations"), 2.0 * 64 * 64 * 2);
  EXPECT_DOUBLE_EQ(item(m.host_items, "token and loss buffers"), 2.0 * 2 * (64 * 12 + 16));
  EXPECT_DOUBLE_EQ(m.host_bytes, 16 * P + 2.0 * 8 * 1024 * 2 + 2.0 * 64 * 64 * 2 + 2.0 * 2 * (64 * 12 + 16));
  double sum = 0;
  for (const auto& i : m.gpu_items) sum += i.bytes;
  EXPECT_DOUBLE_EQ(m.gpu_peak_bytes, sum);
  EXPECT_TRUE(m.fits_gpu());
}

// The MLP token tile shrinks the CUDA units as they carve it: the saved state loses 1/rms, h2, gate and
// up (each a 256-byte-aligned piece); the account's peak falls with it. The baselines ignore the tile.
TEST(MemoryModel, MlpTokenTileShrinksTheUnitsAndThePeak) {
  ModelCard c = tiny_card();  // C 64, I 128
  Workload w = make_workload(c, 32);
  Hardware hw = hardware_preset("h100-sxm-x4");
  Plan p;
  p.micro_batch = 2;  // 64 tokens
  p.recompute_layers = 0;
  p.keep_layers = Plan::kRest;
  p.loss_chunk_tokens = 8;
  Plan t = p;
  t.mlp_token_tile = 24;
  UnitMemoryOptions o;
  const UnitMemory a = unit_memory(c, w.layout, UnitKind::kDecoder, 2, 32, o);
  o.mlp_token_tile = 24;
  const UnitMemory b = unit_memory(c, w.layout, UnitKind::kDecoder, 2, 32, o);
  EXPECT_EQ(a.saved_bytes - b.saved_bytes, 256 + 64 * 64 * 2 + 2 * 64 * 128 * 2);
  EXPECT_LT(estimate_memory(w, hw, t, System::kSlideDP).gpu_peak_bytes, estimate_memory(w, hw, p, System::kSlideDP).gpu_peak_bytes);
  EXPECT_DOUBLE_EQ(estimate_memory(w, hw, t, System::kSlideFormerDP).gpu_peak_bytes,
                   estimate_memory(w, hw, p, System::kSlideFormerDP).gpu_peak_bytes);
}

TEST(MemoryModel, OverBudgetPlanSaysWhyWithNumbers) {
  Workload w = make_workload(model_preset("qwen3-14b"), 8192);
  Hardware hw = hardware_preset("rtx4090-x4");
  Plan p;
  p.ranks = 4;
  p.micro_batch = 8;
  p.recompute_layers = 0;
  p.keep_layers = Plan::kRest;  // keep every activation: far over 24 GB
  MemoryEstimate m = estimate_memory(w, hw, p, System::kSlideDP);
  ASSERT_FALSE(m.fits_gpu());
  auto v = m.violations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("exceeds the budget"), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("activations: saved state of keep layers"), std::string::npos) << v[0];
  // A tighter explicit budget is honoured.
  p.keep_layers = 0;
  p.recompute_layers = Plan::kRest;
  p.micro_batch = 1;
  p.gpu_mem_budget_bytes = int64_t{1} << 30;
  EXPECT_FALSE(estimate_memory(w, hw, p, System::kSlideDP).fits_gpu());
}

}  // namespace
}  // namespace slidedp
