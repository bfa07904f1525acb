// The memory model against a hand count for one small model and plan.
#include <gtest/gtest.h>

#include "model/memory_model.h"
#include "model/model_costs.h"
#include "tests/model/tiny_card.h"

namespace slidedp {
namespace {

double item(const std::vector<MemoryItem>& items, const std::string& prefix) {
  for (const auto& i : items)
    if (i.name.rfind(prefix, 0) == 0) return i.bytes;
  return 0;
}

TEST(MemoryModel, HandCountForATinyModel) {
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

  // Units (elements, 64-aligned tensors): embedding 256*64 = 16384; a decoder layer: norms 64 + 64,
  // q 64*64 = 4096, k 32*64 = 2048, v 2048, o 4096, gate/up/down 3*8192 = 24576 -> 36992; head: norm
  // 64 + lm_head 16384 = 16448.
  ASSERT_EQ(w.layout.units[1].flat_numel, 36992);
  ASSERT_EQ(w.layout.units[3].flat_numel, 16448);
  const double P = 16384 + 2 * 36992 + 16448;
  // Parameter slots: the largest window of 2 consecutive units, bf16: L0 + L1 = 73984 elements.
  EXPECT_DOUBLE_EQ(item(m.gpu_items, "parameter slots"), 2.0 * (36992 + 36992));
  // Gradient buffers: max over consecutive pairs of fp32(unit) + bf16(next): L0 (36992*4) + L1 (2*36992).
  EXPECT_DOUBLE_EQ(item(m.gpu_items, "gradient buffers"), 36992.0 * 4 + 36992.0 * 2);
  // Activations, tokens = 2 x 32 = 64: one recompute layer keeps its input (64 x 64 x 2 bytes); the
  // offload layer needs 2 prefetch buffers of the same size.
  EXPECT_DOUBLE_EQ(item(m.gpu_items, "activations: recompute"), 64.0 * 64 * 2);
  EXPECT_DOUBLE_EQ(item(m.gpu_items, "activations: offload"), 2.0 * 64 * 64 * 2);
  EXPECT_DOUBLE_EQ(item(m.gpu_items, "activations: keep"), 0.0);
  // Host: fp32 master 4P, m and v 8P, bf16 mirror 2P, fp32 accumulator 4P (accum 2), staging ring of
  // 2 ranks x 8 chunks x 1024 x 2 bytes, offloaded inputs: 2 ranks x 1 layer x 64 tokens x 64 x 2.
  EXPECT_DOUBLE_EQ(item(m.host_items, "fp32 master"), 4 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "fp32 AdamW"), 8 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "bf16 delivery mirror"), 2 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "fp32 gradient accumulator"), 4 * P);
  EXPECT_DOUBLE_EQ(item(m.host_items, "gradient staging ring"), 2.0 * 8 * 1024 * 2);
  EXPECT_DOUBLE_EQ(item(m.host_items, "offloaded activations"), 2.0 * 64 * 64 * 2);
  EXPECT_DOUBLE_EQ(m.host_bytes, 18 * P + 2.0 * 8 * 1024 * 2 + 2.0 * 64 * 64 * 2);
  double sum = 0;
  for (const auto& i : m.gpu_items) sum += i.bytes;
  EXPECT_DOUBLE_EQ(m.gpu_peak_bytes, sum);
  EXPECT_TRUE(m.fits_gpu());
}

TEST(MemoryModel, MlpTokenTileReplacesTheWholeSequenceMlpTermsByOneTile) {
  // Same tiny model: C 64, I 128, q 64, kv 32, 4 heads; 2 x 32 = 64 tokens per micro-batch.
  ModelCard c = tiny_card();
  Workload w = make_workload(c, 32);
  Hardware hw = hardware_preset("h100-sxm-x4");
  Plan p;
  p.micro_batch = 2;
  p.recompute_layers = 0;
  p.keep_layers = Plan::kRest;
  p.loss_chunk_tokens = 8;  // so that a decoder layer, not the head's loss chunk, is the largest unit
  Plan t = p;
  t.mlp_token_tile = 24;  // does not divide 64
  const MemoryEstimate a = estimate_memory(w, hw, p, System::kSlideDP);
  const MemoryEstimate b = estimate_memory(w, hw, t, System::kSlideDP);
  // Saved per token: untiled C+C+q+2kv+q+C+C+3I = 4*64 + 2*64 + 64 + 384 = 832 bf16 + 4 heads fp32;
  // tiled without h2 (C) and gate/up/product (3I): 832 - 64 - 384 = 384.
  EXPECT_DOUBLE_EQ(item(a.gpu_items, "activations: keep"), 2 * 64 * (832 * 2 + 16.0));
  EXPECT_DOUBLE_EQ(item(b.gpu_items, "activations: keep"), 2 * 64 * (384 * 2 + 16.0));
  // Working set: the per-token transient loses 2I fp32 (1024 B); one tile of 24 rows adds
  // (C + 3I) bf16 + 2I fp32 = 896 + 1024 bytes per row; saved loses 448 values (896 B) per token.
  const double per_token_drop = (448 * 2 + 2 * 128 * 4) * 64.0;
  const double tile_bytes = 24 * ((64 + 3 * 128) * 2 + 2 * 128 * 4.0);
  EXPECT_DOUBLE_EQ(item(a.gpu_items, "working set") - item(b.gpu_items, "working set"), per_token_drop - tile_bytes);
  // Baselines ignore the tile (their implementations run the MLP over the whole micro-batch).
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
  EXPECT_NE(v[0].find("activations: keep"), std::string::npos) << v[0];
  // A tighter explicit budget is honoured.
  p.keep_layers = 0;
  p.recompute_layers = Plan::kRest;
  p.micro_batch = 1;
  p.gpu_mem_budget_bytes = int64_t{1} << 30;
  EXPECT_FALSE(estimate_memory(w, hw, p, System::kSlideDP).fits_gpu());
}

}  // namespace
}  // namespace slidedp
