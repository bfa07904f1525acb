// Shared set-up for executor tests: a tiny Llama/Qwen-style model, a dataset, and TrainOptions with
// the plan knobs the tests vary. Models are small enough that every run takes well under a second.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "card/model_card.h"
#include "executor/trainer.h"
#include "io/default_corpus.h"
#include "model/hardware.h"

namespace slidedp::exec::testing {

// hidden 32, 3 layers, 4 query heads of 8, 2 kv heads, intermediate 64, byte vocabulary.
inline ModelCard tiny_card(bool tied = false, const std::string& type = "llama") {
  std::string y = "name: tiny\nmodel_type: " + type +
                  "\nhidden_size: 32\nnum_hidden_layers: 3\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                  "head_dim: 8\nintermediate_size: 64\nvocab_size: 256\nrope_theta: 10000\n";
  y += tied ? "tie_word_embeddings: true\n" : "tie_word_embeddings: false\n";
  return model_card_from_yaml(y, "tiny");
}

// A tiny Gemma 4 (dense): hidden 32, 3 layers (sliding, sliding, full), window 5, 4 query heads;
// sliding layers 2 KV heads of 8, the global one 1 KV head of 16 with K=V and proportional RoPE; tied
// and softcapped head; byte vocabulary.
inline ModelCard tiny_gemma4_card() {
  return model_card_from_yaml(
      "name: tiny-gemma4\nmodel_type: gemma4\nhidden_size: 32\nnum_hidden_layers: 3\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 48\nvocab_size: 256\n"
      "layer_types: [sliding_attention, sliding_attention, full_attention]\nsliding_window: 5\n"
      "global_head_dim: 16\nnum_global_key_value_heads: 1\nattention_k_eq_v: true\nrope_theta: 10000\n"
      "global_rope_theta: 1000000\nglobal_partial_rotary_factor: 0.25\nfinal_logit_softcapping: 30.0\n",
      "tiny-gemma4");
}

// The same with the 26B-A4B block in miniature: 8 experts, 2 per token, intermediate size 12.
inline ModelCard tiny_gemma4_moe_card() {
  ModelCard c = tiny_gemma4_card();
  c.name = "tiny-gemma4-moe";
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.validate("tiny_gemma4_moe_card");
  return c;
}

// A tiny Qwen3.6: three Gated DeltaNet layers and one gated full-attention layer (the 3:1 schedule),
// partial RoPE on 2 of 8 channels, grouped value heads, untied head.
inline ModelCard tiny_qwen3_5_card() {
  return model_card_from_yaml(
      "name: tiny-qwen3-5\nmodel_type: qwen3_5\nhidden_size: 32\nnum_hidden_layers: 4\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 48\nvocab_size: 256\nrope_theta: 10000000\n"
      "partial_rotary_factor: 0.25\nlinear_num_key_heads: 2\nlinear_num_value_heads: 4\nlinear_key_head_dim: 8\n"
      "linear_value_head_dim: 8\nlinear_conv_kernel_dim: 4\n",
      "tiny-qwen3-5");
}

// The 35B-A3B block in miniature: 8 experts, 2 per token, intermediate size 12, a shared expert of 16.
inline ModelCard tiny_qwen3_5_moe_card() {
  ModelCard c = tiny_qwen3_5_card();
  c.name = "tiny-qwen3-5-moe";
  c.model_type = "qwen3_5_moe";
  c.intermediate_size = 0;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.shared_expert_intermediate_size = 16;
  c.validate("tiny_qwen3_5_moe_card");
  return c;
}

inline TrainOptions tiny_options(int ranks, int micro_batch, int accum, int64_t steps = 3) {
  TrainOptions o;
  o.card = tiny_card();
  o.seq_len = 16;
  o.plan.ranks = ranks;
  o.plan.micro_batch = micro_batch;
  o.plan.accum_steps = accum;
  o.plan.chunk_numel = 1000;  // several chunks per unit, not dividing them evenly
  o.plan.update_threads = 2;
  o.plan.loss_chunk_tokens = 24;
  o.dataset = default_corpus_dataset();
  o.steps = steps;
  o.lr.lr = 3e-3;
  o.device_budget_bytes = int64_t{256} << 20;
  o.update_threads = 2;
  return o;
}

// The first `sequences` sequences of the embedded text at `seq_len` (their shifted targets included),
// plus `tail` tokens more: data of an exact number of sequences.
inline TokenDataset embedded_prefix(int64_t sequences, int64_t seq_len, int64_t tail = 0) {
  const TokenDataset all = default_corpus_dataset();
  std::vector<uint32_t> tokens;
  for (int64_t i = 0; i < sequences * seq_len + 1 + tail; ++i) tokens.push_back(all.token(i));
  return TokenDataset::from_tokens("embedded prefix", tokens, {}, all.vocab_size());
}

// Max |a - b| / (atol + rtol |b|) over every weight; <= 1 means within tolerance.
inline double weight_error(const TrainResult& a, const TrainResult& b, double atol, double rtol) {
  double worst = 0;
  for (size_t u = 0; u < a.master.size(); ++u)
    for (size_t i = 0; i < a.master[u].size(); ++i) {
      const double x = a.master[u][i], y = b.master[u][i];
      worst = std::max(worst, std::fabs(x - y) / (atol + rtol * std::fabs(y)));
    }
  return worst;
}

// The mean loss of steps [begin, end) (0-based) of a run.
inline double mean_loss(const TrainResult& r, int begin, int end) {
  double sum = 0;
  for (int i = begin; i < end; ++i) sum += r.steps[static_cast<size_t>(i)].loss;
  return sum / (end - begin);
}

inline bool bitwise_equal(const TrainResult& a, const TrainResult& b) {
  return a.master == b.master;
}

// `base` (2 ranks) on every parameter and gradient route pair, with every layer kept, and with the
// per-layer policies `mixed` (one per decoder layer): every run's weights and last loss are bitwise the
// same (routes and policies move bytes, never the math).
inline void expect_every_route_and_policy_bitwise(const TrainOptions& base, const std::vector<ActivationPolicy>& mixed) {
  std::vector<TrainResult> results;
  for (ParamRoute pr : {ParamRoute::kReplicated, ParamRoute::kSharded})
    for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
      TrainOptions o = base;
      o.plan.param_route = pr;
      o.plan.grad_route = gr;
      results.push_back(train(o));
    }
  TrainOptions keep = base;
  keep.plan.recompute_layers = 0;
  keep.plan.keep_layers = Plan::kRest;
  results.push_back(train(keep));
  TrainOptions per_layer = keep;
  per_layer.plan.per_layer = mixed;
  results.push_back(train(per_layer));
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(results[0], results[i])) << "variant " << i;
    EXPECT_EQ(results[0].steps.back().loss, results[i].steps.back().loss) << "variant " << i;
  }
}

// The absolute term of expect_ranks_equal_micro_batch_and_accumulation from the worst-case error of
// an fp32 sum in any order, n u per order (u = 2^-24), so 2 n u between two orders, for sums of
// `terms` terms of magnitude up to `magnitude`, times the learning rate (0.1) that turns a gradient
// difference into a weight difference. A bound fitted on one CPU does not hold on another: the BLAS
// picks its blocking (the order of a GEMM's sums) per CPU.
inline double summation_order_atol(int terms, double magnitude) {
  return 0.1 * 2.0 * terms * std::ldexp(1.0, -24) * magnitude;
}

// `ranks` (3 ranks, micro-batch 1, no accumulation) against 1 rank with micro-batch 3 and against 1
// rank with 3 accumulation steps, in exact fp32: the same step within fp32 summation order (the bounds'
// derivation: Pipeline.RanksTimesMicroBatchEqualsOneRankAndAccumulation), `atol` the absolute term.
inline void expect_ranks_equal_micro_batch_and_accumulation(TrainOptions ranks, double atol) {
  ranks.exact_fp32 = true;
  ranks.optimizer.eps = 1.0;
  ranks.lr.lr = 0.1;
  TrainOptions single = ranks;
  single.plan.ranks = 1;
  single.plan.micro_batch = 3;
  TrainOptions accum = ranks;
  accum.plan.ranks = 1;
  accum.plan.accum_steps = 3;
  const TrainResult a = train(ranks), b = train(single), c = train(accum);
  EXPECT_NEAR(a.steps[0].loss, b.steps[0].loss, 1e-6 * std::fabs(b.steps[0].loss));
  EXPECT_LE(weight_error(a, b, atol, 1e-5), 1.0);
  EXPECT_LE(weight_error(a, c, atol, 1e-5), 1.0);
}

// base (6 steps) straight, against 3 steps checkpointed at step 3, then 3 more resumed from it: the
// resumed losses equal steps 4-6 of the straight run and the weights are bitwise the same.
inline void expect_resume_is_bitwise(const TrainOptions& base, const std::string& tag) {
  namespace fs = std::filesystem;
  ASSERT_EQ(base.steps, 6);
  const fs::path root = fs::temp_directory_path() / ("slidedp_resume_" + tag + std::to_string(::getpid()));
  fs::remove_all(root);
  const TrainResult straight = train(base);
  TrainOptions first = base;
  first.steps = 3;
  first.checkpoint_dir = root.string();
  first.checkpoint_every = 3;
  train(first);
  TrainOptions second = base;
  second.steps = 3;
  second.resume_dir = root.string();
  const TrainResult resumed = train(second);
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(resumed.steps[static_cast<size_t>(i)].loss, straight.steps[static_cast<size_t>(3 + i)].loss);
  EXPECT_TRUE(bitwise_equal(resumed, straight));
  fs::remove_all(root);
}

// For paced runs: 16 small layers, so a step's pipeline fill and drain are a small part of it.
inline ModelCard tiny16_card() {
  return model_card_from_yaml(
      "name: tiny16\nmodel_type: llama\nhidden_size: 32\nnum_hidden_layers: 16\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 64\nvocab_size: 256\nrope_theta: 10000\n",
      "tiny16");
}

// The time scale of paced test runs: 20 where this host wakes a sleeping thread within 50 us (the
// usual ~60 us), in proportion above that up to 80 (a busy or throttled VM has shown 200-300 us), so
// the pacer's wake-ups, one per paced operation, stay a small share of the operations' time. A whole
// number, so logs and messages print it exactly.
inline double paced_test_time_scale() {
  double late = 0;
  for (int i = 0; i < 40; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    late += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - 1e-3;
  }
  return std::round(std::clamp(20.0 * (late / 40) / 50e-6, 20.0, 80.0));
}

// A paced target slow enough that this host's real work fits inside its time at a small scale (20):
// the h100-sxm-x4 preset with GPUs of 4 GFLOP/s, and the host links and CPU update rate of the case
// (the same machine as results/executor/targets/*.yaml).
inline Hardware paced_target(double link_gbps, double adamw_params_per_s) {
  Hardware hw = hardware_preset("h100-sxm-x4");
  hw.name = "paced-test";
  hw.gpu.bf16_peak_flops = 4e9;
  hw.gpu.matmul_efficiency = 1.0;
  hw.gpu.attention_efficiency = 1.0;
  hw.gpu.kernel_overhead_s = 0;
  hw.gpu.runtime_bytes = hw.gpu.collective_bytes = 0;
  hw.link = HostLinkSpec{link_gbps, link_gbps, link_gbps, link_gbps, link_gbps, link_gbps, 0.0};
  hw.fabric.latency_s = 0;
  hw.host.mem_bw_gbps = 1000;
  hw.cpu.cores = 4;
  hw.cpu.adamw_params_per_s = {{1, adamw_params_per_s}};
  hw.cpu.reduce_gbps = {{1, 1000}};
  hw.sources.clear();
  return hw;
}

}  // namespace slidedp::exec::testing
