// Memory estimate; see memory_model.h. Each item's formula is next to it.
#include "model/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/units.h"
#include "model/model_costs.h"
#include "model/step_work.h"

namespace slidedp {
namespace {

constexpr double kWorkspaceBytes = 256.0 * (1 << 20);  // GEMM workspaces, small kernel buffers

double sum_items(const std::vector<MemoryItem>& items) {
  double s = 0;
  for (const auto& i : items) s += i.bytes;
  return s;
}

}  // namespace

std::vector<std::string> MemoryEstimate::violations() const {
  std::vector<std::string> out;
  if (gpu_peak_bytes > gpu_budget_bytes) {
    std::string top;
    auto items = gpu_items;
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    for (std::size_t i = 0; i < std::min<std::size_t>(3, items.size()); ++i)
      top += fmt::format("{}{} {}", i ? ", " : "", items[i].name, format_bytes(items[i].bytes));
    out.push_back(fmt::format("GPU memory: peak {} per rank exceeds the budget {} by {} (largest: {})",
                              format_bytes(gpu_peak_bytes), format_bytes(gpu_budget_bytes),
                              format_bytes(gpu_peak_bytes - gpu_budget_bytes), top));
  }
  if (host_bytes > host_ram_bytes)
    out.push_back(fmt::format("host RAM: {} needed, {} available (short by {})", format_bytes(host_bytes),
                              format_bytes(host_ram_bytes), format_bytes(host_bytes - host_ram_bytes)));
  if (host_pinned_bytes > host_pinned_limit_bytes)
    out.push_back(fmt::format("pinned host memory: {} needed, limit {}", format_bytes(host_pinned_bytes),
                              format_bytes(host_pinned_limit_bytes)));
  return out;
}

double gpu_budget_bytes(const Plan& plan, const Hardware& hw) {
  if (plan.gpu_mem_budget_bytes > 0) return static_cast<double>(plan.gpu_mem_budget_bytes);
  return std::max(0.0, static_cast<double>(hw.gpu.mem_bytes - plan.gpu_mem_reserve_bytes));
}

namespace {

// The units' memory for (model, B, T, options): the planner asks for the same few shapes hundreds of
// thousands of times, and building the kernels' specs each time dominated its search. Keyed by every
// input the carve sequences read; a few entries per thread suffice.
struct UnitMemoryKey {
  int64_t C, L, H, KV, hd, I, V, B, T, tile, loss_chunk, experts, window, global_hd;
  int64_t top_k, expert_I, shared_I, global_kv, linear_heads;  // MoE and the hybrid families' layers
  std::string model_type;
  std::vector<AttentionKind> layer_types;
  bool qk_norm, bias, tied, k_eq_v;
  UnitCode code;
  int threads;
  bool operator==(const UnitMemoryKey&) const = default;
};

std::pair<UnitMemory, UnitMemory> decoder_and_head_memory(const Workload& w, const UnitMemoryOptions& o, int64_t B,
                                                          int64_t T) {
  const ModelCard& c = w.model;
  const UnitMemoryKey key{c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                          c.vocab_size, B, T, o.mlp_token_tile, o.loss_chunk_tokens, c.num_experts,
                          c.sliding_window, c.global_head_dim, c.num_experts_per_tok, c.moe_intermediate_size,
                          c.shared_expert_intermediate_size, c.num_global_kv_heads, c.linear_num_value_heads,
                          c.model_type, c.layer_types, c.qk_norm, c.attention_bias,
                          c.tie_word_embeddings, c.attention_k_eq_v, o.code, o.cpu_threads};
  thread_local std::vector<std::pair<UnitMemoryKey, std::pair<UnitMemory, UnitMemory>>> cache;
  for (const auto& [k, v] : cache)
    if (k == key) return v;
  std::pair<UnitMemory, UnitMemory> v{unit_memory(c, w.layout, UnitKind::kDecoder, B, T, o),
                                      unit_memory(c, w.layout, UnitKind::kHead, B, T, o)};
  if (cache.size() >= 64) cache.erase(cache.begin());
  cache.emplace_back(key, v);
  return v;
}

// The account of a SlideDP plan, remembered by what it depends on: the planner varies knobs the
// account does not read (update threads, the parameter route, chunks on the cpu route) across tens
// of thousands of candidates that share their memory.
struct AccountKey {
  std::array<int64_t, 30> v{};
  bool operator==(const AccountKey&) const = default;
};
struct AccountKeyHash {
  size_t operator()(const AccountKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t x : k.v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

const RankMemoryAccount& cached_account(const Workload& w, const Plan& p, const RankMemorySpec& s) {
  const int L = static_cast<int>(w.model.num_layers);
  const int grad_shards = p.grad_shards();
  const bool gpu_route = grad_shards > 1;
  // Layer policies: the counts (offload first, recompute, keep last), or a hash of an explicit list.
  const Plan::PolicyCounts pc = p.policy_counts(L);
  uint64_t per_layer = 0;
  for (ActivationPolicy a : p.per_layer) per_layer = (per_layer ^ static_cast<uint64_t>(a)) * 1099511628211ull + 1;
  if (!s.decoder_by_layer.empty())
    for (const UnitLayout& u : w.layout.units) per_layer = (per_layer ^ static_cast<uint64_t>(u.flat_numel)) * 1099511628211ull + 5;
  for (const UnitMemory& m : s.decoder_by_layer)
    for (int64_t b : {m.saved_bytes, m.forward_workspace_bytes, m.backward_workspace_bytes})
      per_layer = (per_layer ^ static_cast<uint64_t>(b)) * 1099511628211ull + 3;
  const AccountKey key{{w.layout.total_flat_numel, w.layout.units.front().flat_numel, w.layout.units.back().flat_numel,
                        w.layout.units.size() > 2 ? w.layout.units[1].flat_numel : 0, L, w.model.tie_word_embeddings,
                        w.seq_len, p.micro_batch, p.accum_steps, p.ranks, grad_shards, gpu_route ? p.chunk_numel : 0,
                        p.gpu_buffer_depth, s.decoder.hidden_bytes, s.decoder.saved_bytes,
                        s.decoder.forward_workspace_bytes, s.decoder.backward_workspace_bytes,
                        s.head.forward_workspace_bytes, s.param_bytes, s.wire_bytes, s.align_bytes,
                        s.zero_bytes_take_one, s.embedding_backward_scratch_bytes, s.reduce_scatter_staging,
                        s.runtime_bytes, s.collective_bytes, pc.offload, pc.recompute, pc.keep,
                        static_cast<int64_t>(per_layer)}};
  thread_local std::unordered_map<AccountKey, RankMemoryAccount, AccountKeyHash> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 4096) cache.clear();
  return cache.emplace(key, rank_memory_account(w.layout, p, w.seq_len, w.model.tie_word_embeddings, s))
      .first->second;
}

}  // namespace

RankMemorySpec rank_memory_spec(const Workload& w, const Hardware& hw, const Plan& p) {
  UnitMemoryOptions o;
  o.code = hw.gpu.emulated_on_host ? UnitCode::kCpu : UnitCode::kCuda;
  o.loss_chunk_tokens = p.loss_chunk_tokens;
  o.mlp_token_tile = p.mlp_token_tile;
  o.cpu_threads = hw.gpu.host_threads_per_device;
  const int64_t B = p.micro_batch, T = w.seq_len;
  RankMemorySpec s;
  std::tie(s.decoder, s.head) = decoder_and_head_memory(w, o, B, T);
  if (!w.model.uniform_layers()) s.decoder_by_layer = decoder_unit_memories(w.model, w.layout, B, T, o);
  s.param_bytes = s.wire_bytes = 2;
  const bool cuda = o.code == UnitCode::kCuda;
  s.align_bytes = cuda ? 256 : 64;
  s.zero_bytes_take_one = cuda;
  s.embedding_backward_scratch_bytes = embedding_backward_scratch_estimate(o.code, B * T);
  s.router_stats_bytes = router_stats_bytes(w.model, B);
  s.document_positions = w.packed_documents;
  s.reduce_scatter_staging = cuda;
  s.runtime_bytes = hw.gpu.runtime_bytes;
  s.collective_bytes = hw.gpu.collective_bytes;
  return s;
}

namespace {

// What the baselines' memory is sized by (their layers are PyTorch's; SlideDP's own memory is the
// account's, from its units).
struct BaselineSizes {
  double N = 1, D = 1, tokens = 0, P = 0;
  double max_unit = 0;    // the largest unit, with the tied embedding the head reads
  double max_window = 0;  // the largest window of D consecutive units
  double max_grad = 0;    // the fp32 gradient of the unit in backward + the bf16 one still draining
  // Per token: layers of different shapes (Gemma 4's sliding and global layers) are charged the mean
  // for kept and recomputed layers (the policies' counts multiply it), the largest for one layer's
  // working set.
  LayerActivationBytes act, act_max;
  Plan::PolicyCounts pc;
};

BaselineSizes baseline_sizes(const Workload& w, const Plan& p) {
  const ModelCard& card = w.model;
  const int L = static_cast<int>(card.num_layers);
  const auto& units = w.layout.units;
  BaselineSizes s;
  s.N = p.ranks;
  s.D = p.gpu_buffer_depth;
  s.tokens = static_cast<double>(p.micro_batch) * static_cast<double>(w.seq_len);
  s.P = static_cast<double>(w.layout.total_flat_numel);
  s.act = s.act_max = torch_decoder_activation_bytes_per_token(card, 0);
  if (!card.uniform_layers()) {
    s.act = {};
    for (int l = 0; l < L; ++l) {
      const LayerActivationBytes a = torch_decoder_activation_bytes_per_token(card, l);
      s.act.saved_keep += a.saved_keep / L, s.act.unit_input += a.unit_input / L,
          s.act.transient += a.transient / L;
      s.act_max.saved_keep = std::max(s.act_max.saved_keep, a.saved_keep);
      s.act_max.transient = std::max(s.act_max.transient, a.transient);
    }
  }
  const double emb_numel = static_cast<double>(units.front().flat_numel);
  auto unit_numel = [&](std::size_t i) {
    double n = static_cast<double>(units[i].flat_numel);
    if (units[i].reads_tied_embedding) n += emb_numel;
    return n;
  };
  for (std::size_t i = 0; i < units.size(); ++i) {
    s.max_unit = std::max(s.max_unit, unit_numel(i));
    double win = 0;
    for (std::size_t j = i; j < std::min(units.size(), i + static_cast<std::size_t>(s.D)); ++j)
      win += unit_numel(j);
    s.max_window = std::max(s.max_window, win);
  }
  for (std::size_t i = 0; i + 1 < units.size(); ++i)
    s.max_grad = std::max(s.max_grad, unit_numel(i) * kFp32Bytes + unit_numel(i + 1) * kBf16Bytes);
  s.max_grad = std::max(s.max_grad, unit_numel(units.size() - 1) * kFp32Bytes);
  s.pc = p.policy_counts(L);
  return s;
}

// A baseline's GPU buffers of its own (slots, gradients, shards) by what its code allocates.
void add_baseline_buffers(MemoryEstimate& m, System system, const Plan& p, const BaselineSizes& s) {
  auto gpu = [&](const std::string& name, double bytes) {
    if (bytes > 0) m.gpu_items.push_back({name, bytes});
  };
  const double N = s.N, P = s.P, max_unit = s.max_unit;
  switch (system) {
    case System::kSlideDP:
      break;  // the memory account
    case System::kMegaTrain:
      gpu(fmt::format("parameter slots ({} deep, bf16)", p.gpu_buffer_depth), s.max_window * kBf16Bytes);
      if (p.param_route == ParamRoute::kSharded && N > 1)
        gpu("all-gather shard staging", max_unit * kBf16Bytes / N);
      gpu("gradient buffers (fp32 unit + bf16 draining)", s.max_grad);
      if (p.grad_route == GradRoute::kGpu && N > 1)
        gpu("reduce-scatter buffers (bf16)", max_unit * kBf16Bytes * (1.0 + 1.0 / N));
      break;
    case System::kSlideFormerDP:
      // Slots sized by the largest unit, each holding bf16 params and bf16 grads (its gradients go to
      // the host in bf16 straight from the slot).
      gpu("unit slots sized by the largest unit (bf16 params + grads)", s.D * max_unit * 2.0 * kBf16Bytes);
      break;
    case System::kZeroOffload:
      // With the optimizer on the CPU the reduced gradients leave for the host bucket by bucket: the GPU
      // holds the bucket being reduced (DeepSpeed's reduce_bucket_size, 5e8 elements by default), not
      // the partition; the ZeRO-Offload paper trains 13B on one 32 GB V100, whose 26 GB of fp16
      // parameters would leave no room for a 26 GB gradient partition.
      gpu("resident bf16 parameters", P * kBf16Bytes);
      gpu("gradient bucket being reduced and offloaded (bf16)", std::min(P / N, 5e8) * kBf16Bytes);
      gpu("gradient of the unit in backward (fp32)", max_unit * kFp32Bytes);
      // With accumulation the fp16 sum comes back into a buffer of the largest parameter's size
      // (stage2.py v0.3.0 L342-344); a unit bounds it.
      if (p.accum_steps > 1) gpu("fp16 gradient sum copied back in (largest unit)", max_unit * kBf16Bytes);
      break;
    case System::kFsdp2:
      gpu("sharded fp32 params + grads + AdamW m, v", P * 16.0 / N);
      gpu("unsharded bf16 units (prefetch 2)", 2.0 * max_unit * kBf16Bytes);
      gpu("unsharded unit gradient (fp32)", max_unit * kFp32Bytes);
      break;
    case System::kZero3Offload:
      // Parameters live on the host: the layer gathered now and the one prefetched, the layer's
      // gradient and its reduce-scatter bucket.
      gpu("gathered bf16 parameters (unit + prefetch)", 2.0 * max_unit * kBf16Bytes);
      gpu("gradient of the unit in backward (bf16) + reduce-scatter bucket", 2.0 * max_unit * kBf16Bytes);
      break;
    case System::kFsdpOffload:
      gpu("fp32 shard copied from the host (unit + prefetch)", 2.0 * max_unit * kFp32Bytes / N);
      gpu("unsharded bf16 units (prefetch 2)", 2.0 * max_unit * kBf16Bytes);
      gpu("unsharded unit gradient (fp32)", max_unit * kFp32Bytes);
      break;
  }
}

// A baseline's activations on the GPU, by policy, and one unit's working set.
void add_baseline_activations(MemoryEstimate& m, const Workload& w, System system, const Plan& p,
                              const BaselineSizes& s) {
  auto gpu = [&](const std::string& name, double bytes) {
    if (bytes > 0) m.gpu_items.push_back({name, bytes});
  };
  const ModelCard& card = w.model;
  const double tokens = s.tokens;
  double act_recompute = s.pc.recompute * s.act.unit_input * tokens;
  if (system == System::kMegaTrain) {
    // MegaTrain checkpoints every K = 4th layer input and recomputes from there. Its GPU holds one
    // layer's saved state at a time, not the block's four: its README reports about 40 GB on the GPU
    // for Qwen2.5-32B at 96 x 1024 tokens (DLYuanGod/MegaTrain README, commits 1123036..2a9f977), where
    // four layers' saved state alone would take about 60 GB.
    act_recompute = std::ceil(static_cast<double>(card.num_layers) / 4.0) * s.act.unit_input * tokens;
  }
  // Working set of one unit: a recomputed layer's saved state and its backward transient, or the
  // head's loss chunk with the hidden state, its norm and their gradients.
  const double layer_ws = (s.act_max.saved_keep + s.act_max.transient) * tokens;
  const double head_ws =
      head_loss_chunk_bytes(card, std::min<int64_t>(p.loss_chunk_tokens, static_cast<int64_t>(tokens))) +
      card.hidden_size * (kBf16Bytes + kFp32Bytes) * 2.0 * tokens;
  gpu("activations: keep layers", s.pc.keep * s.act.saved_keep * tokens);
  gpu("activations: recompute layers (unit inputs)", act_recompute);
  gpu("activations: offload prefetch buffers", s.pc.offload > 0 ? 2.0 * s.act.unit_input * tokens : 0.0);
  gpu("working set of one unit", std::max(layer_ws, head_ws));
  gpu("workspace", kWorkspaceBytes);
}

// A baseline's host memory by what its code allocates (pinned where it pins).
void add_baseline_host(MemoryEstimate& m, System system, const Plan& p, const BaselineSizes& s) {
  auto host = [&](const std::string& name, double bytes, bool pinned) {
    if (bytes <= 0) return;
    m.host_items.push_back({name + (pinned ? " (pinned)" : ""), bytes});
    m.host_bytes += bytes;
    if (pinned) m.host_pinned_bytes += bytes;
  };
  const double N = s.N, P = s.P, max_unit = s.max_unit;
  switch (system) {
    case System::kSlideDP:
    case System::kFsdp2:
      break;
    case System::kSlideFormerDP:
      host("fp32 master weights (/dev/shm)", P * kFp32Bytes, false);
      host("fp32 Adam moments (rank 0)", P * 2.0 * kFp32Bytes, false);
      host("pinned bf16 staging per rank (largest unit)", N * max_unit * kBf16Bytes, true);
      host("pinned bf16 gradient rows per rank (largest unit)", N * max_unit * kBf16Bytes, true);
      host("offloaded activations", N * s.pc.offload * s.act.unit_input * s.tokens, true);
      break;
    case System::kZeroOffload:
      host("fp32 master weights", P * kFp32Bytes, false);
      host("fp32 Adam moments", P * 2.0 * kFp32Bytes, false);
      host("fp32 gradients", P * kFp32Bytes, true);
      host("bf16 parameter upload buffer", P * kBf16Bytes, true);
      // async_accumulate_grad_in_cpu_via_gpu's pinned fp16 sum of each rank's partition (L811-814).
      if (p.accum_steps > 1) host("fp16 gradient sum between micro-steps", P * kBf16Bytes, true);
      break;
    case System::kMegaTrain:
      host("fp32 master weights", P * kFp32Bytes, false);
      host("fp32 Adam moments", P * 2.0 * kFp32Bytes, false);
      host("shared flat bf16 weights (registered)", P * kBf16Bytes, true);
      host("fp32 gradient accumulator (shared, locked)", P * kFp32Bytes, false);
      host("pinned gradient slabs", N * 2.0 * max_unit * kBf16Bytes, true);
      break;
    case System::kZero3Offload:
      host("fp32 master weights", P * kFp32Bytes, false);
      host("fp32 Adam moments", P * 2.0 * kFp32Bytes, false);
      host("bf16 parameter partitions", P * kBf16Bytes, true);
      host("fp32 gradient partitions", P * kFp32Bytes, true);
      // The reduced 16-bit partitions' round trip lands here (stage3.py grad_partitions_flat_buffer,
      // on the host when the optimizer is offloaded, pinned with pin_memory).
      host("16-bit gradient partitions (round trip)", P * kBf16Bytes, true);
      break;
    case System::kFsdpOffload:
      host("fp32 parameter shards (the master)", P * kFp32Bytes, true);
      host("fp32 AdamW moments", P * 2.0 * kFp32Bytes, false);
      host("fp32 gradient shards", P * kFp32Bytes, true);
      break;
  }
}

// SlideDP's host memory: the items the executor allocates (model/memory_account.h).
void add_slidedp_host(MemoryEstimate& m, const Workload& w, const Hardware& hw, const Plan& p) {
  const ModelCard& card = w.model;
  const int64_t act_bytes = hw.gpu.emulated_on_host ? 4 : 2;  // the offloaded inputs' dtype
  const HostMemorySpec spec = host_memory_spec(w.layout, p, System::kSlideDP, card.tie_word_embeddings,
                                               /*exact_fp32=*/false, card.hidden_size * act_bytes);
  for (const MemoryItem& i : host_memory_items(w.layout, p, w.seq_len, spec)) {
    const bool pinned = i.name.find("(pinned)") != std::string::npos;
    m.host_items.push_back(i);
    m.host_bytes += i.bytes;
    if (pinned) m.host_pinned_bytes += i.bytes;
  }
}

}  // namespace

MemoryEstimate estimate_memory(const Workload& w, const Hardware& hw, const Plan& plan_in, System system) {
  const Plan p = plan_for_system(plan_in, system, w.model);
  MemoryEstimate m;
  m.gpu_budget_bytes = gpu_budget_bytes(p, hw);
  m.host_ram_bytes = static_cast<double>(hw.host.ram_bytes);
  m.host_pinned_limit_bytes = static_cast<double>(hw.host.pinned_limit_bytes);
  if (system == System::kSlideDP) {
    m.gpu_items = cached_account(w, p, rank_memory_spec(w, hw, p)).items;
    add_slidedp_host(m, w, hw, p);
  } else {
    const BaselineSizes s = baseline_sizes(w, p);
    add_baseline_buffers(m, system, p, s);
    add_baseline_activations(m, w, system, p, s);
    add_baseline_host(m, system, p, s);
  }
  m.gpu_peak_bytes = sum_items(m.gpu_items);
  const double P = static_cast<double>(w.layout.total_flat_numel);
  m.host_bytes_per_param = P > 0 ? m.host_bytes / P : 0;
  return m;
}

}  // namespace slidedp
