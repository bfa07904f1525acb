// Per-unit work of a step; see step_work.h. Byte and FLOP formulas are written out where they are
// used so a reader can check them against docs/MODEL.md.
#include "model/step_work.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "common/units.h"
#include "model/copy_bytes.h"
#include "model/expert_routing.h"
#include "model/model_costs.h"

namespace slidedp {
namespace {

// Parameters of decoder layer `layer` that expert-aware delivery leaves on the host for a micro-batch
// of `tokens` tokens: the experts no token is expected to route to (0 when off or dense).
double unrouted_expert_params(const Workload& w, int layer, int64_t tokens) {
  if (!w.expert_aware_delivery || layer < 0) return 0.0;
  const LayerShape s = w.model.layer(layer);
  if (!s.moe()) return 0.0;
  const RouterModel r{s.num_experts, s.experts_per_token, w.router_skew};
  const double miss = 1.0 - expected_hit_fraction(router_marginals(r), static_cast<double>(tokens));
  const double per_expert = 3.0 * static_cast<double>(s.expert_intermediate_size) * static_cast<double>(w.model.hidden_size);
  return miss * static_cast<double>(s.num_experts) * per_expert;
}

}  // namespace

bool same_work(const UnitWork& a, const UnitWork& b) {
  // Byte-wise over every field but the index, skipping the padding after `policy` (the model
  // evaluates this for every unit of every plan, so it must be cheap). Bit-equal doubles are
  // equal values; 0.0 against -0.0 compares unequal, which only costs a jump.
  static_assert(sizeof(UnitWork) == 304 && offsetof(UnitWork, index) == 4 && offsetof(UnitWork, numel) == 8 &&
                    offsetof(UnitWork, policy) == 32 && offsetof(UnitWork, fwd_s) == 40,
                "UnitWork changed: update same_work");
  const auto* pa = reinterpret_cast<const unsigned char*>(&a);
  const auto* pb = reinterpret_cast<const unsigned char*>(&b);
  return a.kind == b.kind && a.policy == b.policy &&
         std::memcmp(pa + offsetof(UnitWork, numel), pb + offsetof(UnitWork, numel), offsetof(UnitWork, policy) - offsetof(UnitWork, numel)) == 0 &&
         std::memcmp(pa + offsetof(UnitWork, fwd_s), pb + offsetof(UnitWork, fwd_s), sizeof(UnitWork) - offsetof(UnitWork, fwd_s)) == 0;
}

int resolve_update_threads(const Plan& plan, const Hardware& hw) {
  // The executor's default pool has one thread per core. On the CPU backend those threads share the
  // cores with the emulated devices; the model charges that through the shared cpu_cores resource.
  if (plan.update_threads > 0) return plan.update_threads;
  return hw.cpu.cores;
}

SystemTraits system_traits(System system) {
  SystemTraits t;
  switch (system) {
    case System::kSlideDP:
      t.adamw_host_bytes_per_param = 26.0;  // the split master
      break;
    case System::kSlideFormerDP:
      t.convert_on_load = true;
      t.shared_grad_buffer = true;
      t.barriers_per_chunk = 2;
      t.cpu_optimizer = CpuOptimizer::kDeepSpeed;  // DeepSpeed-derived CPU Adam (baselines.md)
      break;
    case System::kZeroOffload:
      t.stream_params = false;
      t.params_resident = true;
      t.update_after_backward = true;
      t.upload_after_update = true;
      // The last micro-step's partition leaves as fp32 (stage2.py v0.3.0 L869-881, `.float()` before
      // the copy); earlier ones leave as the fp16 accumulator (accumulate_on_gpu).
      t.grad_shard_bytes = kFp32Bytes;
      t.grad_bytes = kFp32Bytes;
      t.accumulate_on_gpu = true;
      t.cpu_optimizer = CpuOptimizer::kDeepSpeed;
      t.update_on_all_cores = true;
      break;
    case System::kMegaTrain:
      t.lock_serialized_accumulation = true;
      t.update_after_backward = true;
      t.cpu_optimizer = CpuOptimizer::kDeepSpeed;  // DeepSpeed's CPUAdam (baselines.md)
      break;
    case System::kZero3Offload:
      t.update_after_backward = true;
      t.refetch_for_recompute = true;
      // The boundary's partition leaves as fp32 (stage3.py _offload_grad_partition_at_boundary: cast
      // on the GPU, then the copy), one rank's too (its partition is the whole model).
      t.grad_shard_bytes = kFp32Bytes;
      t.grad_bytes = kFp32Bytes;
      t.partition_round_trip = true;
      t.cpu_optimizer = CpuOptimizer::kDeepSpeed;
      t.update_on_all_cores = true;
      break;
    case System::kFsdpOffload:
      t.update_after_backward = true;
      t.param_fetch_bytes = 4.0;  // the fp32 shard, cast to bf16 on the GPU before the all-gather
      t.grad_shard_bytes = 4.0;   // the reduced shard, cast to the fp32 parameter's dtype, to the host
      t.cpu_optimizer = CpuOptimizer::kTorch;
      t.update_on_all_cores = true;
      break;
    case System::kFsdp2:
      t.stream_params = false;
      t.gpu_sharded_state = true;
      t.update_after_backward = true;
      t.gpu_optimizer = true;
      break;
  }
  return t;
}

Plan plan_for_system(const Plan& plan, System system, const ModelCard& card) {
  Plan p = plan;
  const int L = static_cast<int>(card.num_layers);
  // The baselines' implementations run each layer's MLP over the whole micro-batch at once, and hold
  // fp32 moments.
  if (system != System::kSlideDP) p.mlp_token_tile = 0, p.optimizer_states = OptimizerStates::kFp32;
  switch (system) {
    case System::kSlideDP:
      break;
    case System::kSlideFormerDP:
      // Replicated delivery, rank-0 CPU reduction, 32M-element chunks, every layer's input offloaded
      // (the last layer keeps its input on the GPU), two unit slots.
      p.param_route = ParamRoute::kReplicated;
      p.grad_route = GradRoute::kCpu;
      p.chunk_numel = int64_t{32} << 20;
      p.per_layer.assign(static_cast<std::size_t>(L), ActivationPolicy::kOffload);
      if (L > 0) p.per_layer.back() = ActivationPolicy::kRecompute;
      p.gpu_buffer_depth = 2;
      break;
    case System::kZeroOffload:
      // ZeRO-2 + CPU offload with activation checkpointing of every layer.
      p.param_route = ParamRoute::kReplicated;
      p.grad_route = GradRoute::kGpu;
      p.per_layer.assign(static_cast<std::size_t>(L), ActivationPolicy::kRecompute);
      break;
    case System::kMegaTrain:
      // Every worker streams full weights; recompute every K = 4 layers (checkpoint every 4th input).
      p.param_route = ParamRoute::kReplicated;
      p.grad_route = GradRoute::kCpu;
      p.per_layer.assign(static_cast<std::size_t>(L), ActivationPolicy::kRecompute);
      p.gpu_buffer_depth = 2;
      break;
    case System::kFsdp2:
      p.param_route = ParamRoute::kSharded;
      p.grad_route = GradRoute::kGpu;
      break;
    case System::kZero3Offload:
      // Partitions fetched and all-gathered per layer (stage3 prefetch one layer ahead), gradients
      // reduce-scattered, every layer checkpointed (HF gradient checkpointing, as the corpus' runs).
      p.param_route = ParamRoute::kSharded;
      p.grad_route = GradRoute::kGpu;
      p.per_layer.assign(static_cast<std::size_t>(L), ActivationPolicy::kRecompute);
      p.gpu_buffer_depth = 2;
      break;
    case System::kFsdpOffload: {
      // FSDP's unit is a decoder layer: unshard before forward and again before backward (prefetch
      // one ahead). Activation checkpointing is the run's; FSDP's CPU offload does not move
      // activations, so a layer the plan would offload is recomputed instead.
      std::vector<ActivationPolicy> policies;
      for (int l = 0; l < L; ++l) {
        const ActivationPolicy a = plan.layer_policy(l, L);
        policies.push_back(a == ActivationPolicy::kOffload ? ActivationPolicy::kRecompute : a);
      }
      p.per_layer = policies;
      p.param_route = ParamRoute::kSharded;
      p.grad_route = GradRoute::kGpu;
      p.gpu_buffer_depth = 2;
      break;
    }
  }
  return p;
}

UnitComputeTimes unit_compute_times(const Workload& w, const Hardware& hw, UnitKind kind, int layer,
                                    int64_t sequences, int64_t mlp_token_tile) {
  UnitComputeTimes t;
  const double tokens = static_cast<double>(sequences * w.seq_len);
  const UnitFlops f = unit_flops(w.model, kind, layer, sequences, w.seq_len);
  // A tiled MLP saves nothing: backward runs the gate and up projections again (one more time for a
  // kept layer), and a recomputed layer's recompute stops before the MLP (the same total for it).
  auto tile_mlp = [&](double gate_up_s) {
    if (kind != UnitKind::kDecoder || mlp_token_tile <= 0) return;
    t.bwd_s += gate_up_s;
    t.recompute_s = std::max(0.0, t.recompute_s - gate_up_s);
  };
  // Measured times: per layer type for a model whose decoder layers differ.
  std::optional<AttentionKind> layer_type;
  if (kind == UnitKind::kDecoder && !w.model.uniform_layers()) layer_type = w.model.layer(layer).attention;
  if (const UnitTimeProfile* m = hw.find_unit_time(w.model.name, kind, layer_type)) {
    t.fwd_s = m->forward.eval(tokens, static_cast<double>(w.seq_len));
    t.bwd_s = m->backward.eval(tokens, static_cast<double>(w.seq_len));
    t.recompute_s = m->recompute.eval(tokens, static_cast<double>(w.seq_len));
    // Measured times have no per-GEMM split: the gate/up share of the forward by FLOPs.
    tile_mlp(f.forward() > 0 ? t.fwd_s * f.mlp_gate_up_matmul / f.forward() : 0.0);
    return t;
  }
  const double mm = hw.gpu.bf16_peak_flops * hw.gpu.matmul_efficiency;
  const double attn = hw.gpu.bf16_peak_flops * hw.gpu.attention_efficiency;
  const double hbm = hw.gpu.hbm_gbps * 1e9;
  const double C = static_cast<double>(w.model.hidden_size);
  double elementwise_fwd = 0, elementwise_bwd = 0;
  switch (kind) {
    case UnitKind::kEmbedding:
      // Gather (read + write a bf16 row per token); backward zeroes and scatter-adds an fp32 grad.
      elementwise_fwd = tokens * C * kBf16Bytes * 2.0 / hbm;
      elementwise_bwd =
          (static_cast<double>(w.model.embedding_params()) * kFp32Bytes + tokens * C * kFp32Bytes * 2.0) /
          hbm;
      break;
    case UnitKind::kDecoder: {
      // Norms, RoPE, SwiGLU, residuals: each saved activation is written once and read about once.
      const double act = decoder_activation_bytes_per_token(w.model, layer).saved_keep * tokens;
      elementwise_fwd = 2.0 * act / hbm;
      elementwise_bwd = 4.0 * act / hbm;
      if (!hw.gpu.fused_attention) {
        // Unfused attention: per query, heads x keys 16-bit scores written by QK^T, read and written by
        // the (fused) masked softmax and by the dropout: five passes of 2 bytes forward (Megatron-LM's
        // GPT-2 path); backward reads and writes them about twice as often.
        const LayerShape s = w.model.layer(layer);
        const double keys = s.window > 0 ? std::min<double>(static_cast<double>(s.window), static_cast<double>(w.seq_len))
                                         : static_cast<double>(w.seq_len);
        const double scores = tokens * static_cast<double>(s.num_heads) * keys * 10.0;
        elementwise_fwd += scores / hbm;
        elementwise_bwd += 2.0 * scores / hbm;
      }
      break;
    }
    case UnitKind::kHead:
      elementwise_fwd = tokens * static_cast<double>(w.model.vocab_size) * kFp32Bytes * 2.0 / hbm;
      break;
  }
  const double overhead = hw.gpu.kernel_overhead_s;
  t.fwd_s = f.forward_matmul / mm + f.forward_attention / attn + elementwise_fwd + overhead;
  t.bwd_s = f.backward_matmul / mm + f.backward_attention / attn + elementwise_bwd + overhead;
  if (kind == UnitKind::kHead) {
    // The fused loss computes the head's gradients during the forward pass.
    t.fwd_s += t.bwd_s - overhead;
    t.bwd_s = 0;
  }
  t.recompute_s = t.fwd_s;
  // (The recomputed tile's norm and SwiGLU passes are elementwise work on tile-sized buffers; they
  // are not charged, like the untiled backward's SwiGLU recompute.)
  tile_mlp(f.mlp_gate_up_matmul / mm);
  return t;
}

namespace {

// build_step_work's parts: the plan's checks, the machine's capacities, each unit's work (compute,
// deliveries, gradients, host work, the exchange across nodes, offload) and the work after the
// backward. Reads the workload, the hardware and the plan as the system runs it; fills `sw`.
class StepWorkBuilder {
 public:
  StepWorkBuilder(const Workload& w, const Hardware& hw, const Plan& plan_in, System system)
      : w_(w), hw_(hw), system_(system), p_(plan_for_system(plan_in, system, w.model)) {}

  StepWork build() {
    set_traits();
    check_plan();
    set_capacities();
    set_step_shape();
    for (const UnitLayout& ul : w_.layout.units) sw_.units.push_back(unit(ul));
    set_after_backward();
    return std::move(sw_);
  }

 private:
  // Bytes over one rank's link, on its fabric port, and host-memory traffic, of delivering `bytes`
  // of bf16 parameters by the plan's parameter route.
  struct Delivery {
    double h2d = 0, allgather = 0, d2h = 0, host_mem = 0;
  };

  void set_traits();
  void check_plan() const;
  void set_capacities();
  void set_step_shape();
  UnitWork unit(const UnitLayout& ul) const;
  Delivery deliver(double bytes, double fetch) const;
  void set_delivery(const UnitLayout& ul, double moved, UnitWork& u) const;
  void set_gradients(const UnitLayout& ul, double moved, UnitWork& u) const;
  void set_host_work(const UnitLayout& ul, UnitWork& u) const;
  void set_work_across_nodes(const UnitLayout& ul, UnitWork& u) const;
  void set_after_backward();

  // Gradient bytes the host reads per parameter: every rank's gradient as it arrives, or the one
  // reduced shard, each weighing what its copy does (model/copy_bytes.h).
  double grad_in_bytes() const {
    return p_.grad_shards() > 1
               ? target_bytes_per_element(sw_.traits, CopyKind::kGradShard)
               : static_cast<double>(N_) * target_bytes_per_element(sw_.traits, CopyKind::kGrad);
  }
  double tied_numel(const UnitLayout& ul) const {
    return ul.reads_tied_embedding ? static_cast<double>(w_.layout.units.front().flat_numel) : 0.0;
  }

  const Workload& w_;
  const Hardware& hw_;
  const System system_;
  const Plan p_;
  StepWork sw_;
  int N_ = 1, M_ = 1, A_ = 1;
  std::vector<RatePoint> optimizer_rates_;
  // Host-memory bytes moved per byte copied: a DMA reads (H2D) or writes (D2H) host memory once; an
  // emulated device's memcpy reads and writes host memory.
  double hm_per_copy_byte_ = 1;
  double fanin_ = 0;                         // (N-1)/N
  double adamw_rate_ = 0, reduce_rate_ = 0;  // per update thread: parameters/s, bytes/s
};

void StepWorkBuilder::set_traits() {
  sw_.traits = system_traits(system_);
  // Clipping (or skipping): the update needs the global norm, so it follows the backward; SlideDP
  // releases each unit as it is updated (executor/updater.h, verify mode).
  if (system_ == System::kSlideDP && p_.verify_updates)
    sw_.traits.update_after_backward = sw_.traits.update_in_layer_order = true;
  // Lossy moments: m and v read and written in their own bytes instead of fp32's 8 together.
  sw_.traits.adamw_host_bytes_per_param -= 2.0 * (8.0 - moment_bytes_per_param(p_.optimizer_states));
}

void StepWorkBuilder::check_plan() const {
  p_.validate(static_cast<int>(w_.model.num_layers), "plan");
  const int N = p_.ranks;
  if (!hw_.gpu.emulated_on_host && N > hw_.gpu.count)
    throw InputError("plan: ranks", fmt::format("{} ranks but {} has {} GPUs", N, hw_.name, hw_.gpu.count));
  const bool needs_fabric = N > 1 && (p_.param_route == ParamRoute::kSharded ||
                                      p_.grad_route == GradRoute::kGpu || !sw_.traits.stream_params);
  if (needs_fabric && hw_.fabric.kind == "none")
    throw InputError(
        "plan", fmt::format("{} has no GPU fabric; use param_route replicated and grad_route cpu", hw_.name));
  const int M = p_.nodes;
  if (M <= 1) return;
  if (system_ != System::kSlideDP)
    throw InputError("plan: nodes", fmt::format("{} runs on one node here; multi-node plans are SlideDP's",
                                                system_name(system_)));
  if (hw_.network.nic_gbps <= 0)
    throw InputError(
        "plan: nodes",
        fmt::format("{} nodes, but {} describes no network between nodes (hardware key network.nic_gbps)", M,
                    hw_.name));
  if (p_.grad_route == GradRoute::kGpu && p_.host_state != HostState::kSharded)
    throw InputError(
        "plan: host_state",
        "replicated: the gpu route's reduce-scatter over every node's ranks leaves each node only its part "
        "of the sum, which host_state: sharded updates where it lands (or reduce on the hosts: grad_route: "
        "cpu)");
}

void StepWorkBuilder::set_capacities() {
  const Hardware& hw = hw_;
  const int N = N_ = p_.ranks;
  Capacities& c = sw_.cap;
  c.ranks = N;
  const int links = hw.gpu.emulated_on_host ? N : hw.gpu.count;
  c.h2d_alone_Bps = hw.link.h2d_gbps * 1e9;
  c.d2h_alone_Bps = hw.link.d2h_gbps * 1e9;
  c.h2d_root_Bps = links * hw.link.h2d_all_gbps * 1e9;
  c.d2h_root_Bps = links * hw.link.d2h_all_gbps * 1e9;
  c.h2d_link_Bps = std::min(c.h2d_alone_Bps, c.h2d_root_Bps / N);
  c.d2h_link_Bps = std::min(c.d2h_alone_Bps, c.d2h_root_Bps / N);
  c.duplex_Bps = (hw.link.h2d_bidir_gbps + hw.link.d2h_bidir_gbps) * 1e9;
  c.host_mem_Bps = hw.host.mem_bw_gbps * 1e9;
  c.cpu_cores = hw.cpu.cores;
  c.update_threads = resolve_update_threads(p_, hw);
  if (sw_.traits.update_threads_override > 0) c.update_threads = sw_.traits.update_threads_override;
  if (system_ == System::kSlideFormerDP || system_ == System::kMegaTrain) {
    // One process does the host-side reduction/update (rank 0, or the lock holder): it gets one
    // rank's share of the cores.
    c.update_threads = std::max(1.0, std::floor(static_cast<double>(hw.cpu.cores) / N));
  }
  optimizer_rates_ = sw_.traits.cpu_optimizer == CpuOptimizer::kSlideDP
                         ? hw.cpu.slidedp_rates(p_.optimizer_states)
                         : hw.cpu.optimizer_rates(sw_.traits.cpu_optimizer);
  c.adamw_params_per_thread_s = CpuSpec::interpolate(optimizer_rates_, c.update_threads) / c.update_threads;
  c.reduce_Bps_per_thread = CpuSpec::interpolate(hw.cpu.reduce_gbps, c.update_threads) * 1e9 / c.update_threads;
  c.convert_Bps_per_thread = hw.cpu.convert_gbps_per_thread * 1e9;
  // One process per rank (torchrun), each converting with its share of the cores.
  c.convert_threads_per_rank = std::max(1.0, std::floor(static_cast<double>(hw.cpu.cores) / N));
  c.allgather_busbw_Bps = std::max(1.0, hw.fabric.allgather_busbw_gbps * 1e9);
  c.reduce_scatter_busbw_Bps = std::max(1.0, hw.fabric.reduce_scatter_busbw_gbps * 1e9);
  c.link_latency_s = hw.link.latency_s;
  c.fabric_latency_s = hw.fabric.latency_s;
  c.fabric_via_host = hw.fabric.via_host();
  c.emulated = hw.gpu.emulated_on_host;
  c.host_threads_per_device = hw.gpu.host_threads_per_device;
  c.gpu_hbm_Bps = hw.gpu.hbm_gbps * 1e9;
  c.sync_factor = hw.sync.factor(N);
  M_ = p_.nodes;
  c.nodes = M_;
  if (M_ > 1) {
    c.nic_Bps = hw.network.nic_gbps * 1e9;
    c.nic_latency_s = hw.network.latency_s;
  }
}

void StepWorkBuilder::set_step_shape() {
  const ModelCard& card = w_.model;
  sw_.ranks = N_;
  sw_.accum_steps = p_.accum_steps;
  sw_.buffer_depth = p_.gpu_buffer_depth;
  sw_.tokens_per_rank_micro = static_cast<int64_t>(p_.micro_batch) * w_.seq_len;
  sw_.tokens_per_step = p_.global_batch_sequences() * w_.seq_len;
  sw_.model_flops_per_step = model_flops_per_step(card, p_.global_batch_sequences(), w_.seq_len);
  hm_per_copy_byte_ = sw_.cap.emulated ? 2.0 : 1.0;
  fanin_ = static_cast<double>(N_ - 1) / N_;
  adamw_rate_ = sw_.cap.adamw_params_per_thread_s;
  reduce_rate_ = sw_.cap.reduce_Bps_per_thread;
  A_ = p_.accum_steps;
}

// `fetch`: bytes per bf16 byte of what is copied from the host's copy of the parameters (FSDP's
// offloaded fp32 shard: 2); what the GPUs exchange after that is bf16.
StepWorkBuilder::Delivery StepWorkBuilder::deliver(double bytes, double fetch) const {
  const int N = N_;
  Delivery d;
  if (sw_.traits.params_resident) return d;
  if (sw_.traits.gpu_sharded_state) {
    d.allgather = bytes * fanin_;
    return d;
  }
  if (p_.param_route == ParamRoute::kReplicated || N == 1) {
    d.h2d = bytes * fetch;
  } else {
    d.h2d = bytes / N * fetch;
    d.allgather = bytes * fanin_;
    if (sw_.cap.fabric_via_host) {
      // No peer path: the shard goes out to host memory and the others' shards come back in.
      d.d2h = bytes / N;
      d.h2d += bytes * fanin_;
    }
  }
  d.host_mem = (d.h2d + d.d2h) * hm_per_copy_byte_;
  return d;
}

UnitWork StepWorkBuilder::unit(const UnitLayout& ul) const {
  const int L = static_cast<int>(w_.model.num_layers);
  UnitWork u;
  u.kind = ul.kind;
  u.index = ul.index;
  u.numel = ul.flat_numel;
  u.chunks = num_chunks(u.numel, p_.chunk_numel);
  u.grad_chunks = u.chunks;
  if (ul.reads_tied_embedding)
    u.grad_chunks += num_chunks(w_.layout.units.front().flat_numel, p_.chunk_numel);
  u.policy = ul.kind == UnitKind::kDecoder ? p_.layer_policy(ul.layer, L) : ActivationPolicy::kKeep;
  const UnitComputeTimes t =
      unit_compute_times(w_, hw_, ul.kind, ul.layer, p_.micro_batch, p_.mlp_token_tile);
  u.fwd_s = t.fwd_s;
  u.bwd_s = t.bwd_s;
  u.recompute_s = u.policy == ActivationPolicy::kKeep ? 0.0 : t.recompute_s;
  if (system_ == System::kFsdp2 && ul.kind == UnitKind::kDecoder)
    u.recompute_s = p_.layer_policy(ul.layer, L) == ActivationPolicy::kKeep ? 0.0 : t.recompute_s;
  // Expert-aware what-if: the experts no token of the micro-batch routes to stay on the host.
  const double moved =
      static_cast<double>(u.numel) -
      (ul.kind == UnitKind::kDecoder ? unrouted_expert_params(w_, ul.layer, sw_.tokens_per_rank_micro) : 0.0);
  set_delivery(ul, moved, u);
  set_gradients(ul, moved, u);
  set_host_work(ul, u);
  if (M_ > 1) set_work_across_nodes(ul, u);
  if (u.policy == ActivationPolicy::kOffload)
    // The layer input's elements (unit_input is counted in bf16), weighed as the copy is paced.
    u.act_offload_bytes = decoder_activation_bytes_per_token(w_.model, ul.layer).unit_input / kBf16Bytes *
                          target_bytes_per_element(sw_.traits, CopyKind::kActivation) *
                          static_cast<double>(sw_.tokens_per_rank_micro);
  return u;
}

void StepWorkBuilder::set_delivery(const UnitLayout& ul, double moved, UnitWork& u) const {
  const double n = static_cast<double>(u.numel);
  const double bytes = moved * kBf16Bytes;
  const double fetch = target_bytes_per_element(sw_.traits, CopyKind::kParams) / kBf16Bytes;
  const Delivery d = deliver(bytes, fetch);
  u.deliver_h2d_bytes = d.h2d;
  u.deliver_allgather_bytes = d.allgather;
  u.deliver_d2h_bytes = d.d2h;
  u.deliver_host_mem_bytes = d.host_mem;
  if (sw_.traits.convert_on_load) {
    // SlideFormer converts the fp32 master to bf16 into pinned staging on each rank's CPU thread:
    // read 4 B, write 2 B per parameter, then the DMA reads the 2 B.
    u.deliver_convert_thread_s = n * kFp32Bytes / sw_.cap.convert_Bps_per_thread;
    u.deliver_host_mem_bytes += n * (kFp32Bytes + kBf16Bytes);
  }
  if (!ul.reads_tied_embedding) return;
  const double emb_bytes = tied_numel(ul) * kBf16Bytes;
  const Delivery e = deliver(emb_bytes, fetch);
  u.tied_h2d_bytes = e.h2d;
  u.tied_allgather_bytes = e.allgather;
  u.tied_host_mem_bytes = e.host_mem;
  if (sw_.traits.convert_on_load) u.tied_host_mem_bytes += emb_bytes / kBf16Bytes * (kFp32Bytes + kBf16Bytes);
}

// The gpu route's reduce-scatter within a node exchanges the bf16 gradient's shards: (N-1)/N of it
// over each rank's port. Across nodes it spans every node's ranks (W = M x N) and the sums travel in
// fp32 (the executors add exact fp32 partial sums: CUDA widens for NCCL's ring over every node's
// GPUs, the CPU backend chains the nodes): a ring sends (W-1)/W of the chunk from every rank, over
// its port or, on the one edge per node that leaves it, over the node's network.
void StepWorkBuilder::set_gradients(const UnitLayout& ul, double moved, UnitWork& u) const {
  const int N = N_;
  const SystemTraits& traits = sw_.traits;
  const int W = p_.grad_shards();
  const bool gpu_reduce = W > 1;
  const double ring = (W - 1.0) / W;
  auto rs_port_bytes = [&](double elems) {
    if (N <= 1) return 0.0;
    return W > N ? elems * kFp32Bytes * ring : elems * kBf16Bytes * fanin_;
  };
  auto rs_nic_bytes = [&](double elems) { return W > N ? elems * kFp32Bytes * ring : 0.0; };
  if (traits.gpu_sharded_state) {
    u.grad_reduce_scatter_bytes = N > 1 ? moved * kBf16Bytes * fanin_ : 0;
  } else if (gpu_reduce) {
    u.grad_reduce_scatter_bytes = rs_port_bytes(moved);
    u.grad_nic_bytes = rs_nic_bytes(moved);
    u.grad_d2h_bytes = moved * target_bytes_per_element(traits, CopyKind::kGradShard) / W;
  } else {
    u.grad_d2h_bytes = moved * target_bytes_per_element(traits, CopyKind::kGrad);
  }
  if (ul.reads_tied_embedding && !traits.gpu_sharded_state) {
    const double emb = tied_numel(ul);
    u.tied_grad_d2h_bytes = emb * (gpu_reduce ? target_bytes_per_element(traits, CopyKind::kGradShard) / W
                                              : target_bytes_per_element(traits, CopyKind::kGrad));
    u.grad_reduce_scatter_bytes += gpu_reduce ? rs_port_bytes(emb) : 0;
    u.grad_nic_bytes += gpu_reduce ? rs_nic_bytes(emb) : 0;
  }
  if (traits.accumulate_on_gpu && A_ > 1) {
    // DeepSpeed's round trip of the fp16 sum: this rank's partition (the tied head's contribution
    // too), in and out as the micro-step says; the add reads both fp16 operands and writes one.
    const double elems = (moved + tied_numel(ul)) / W;
    u.accum_in_h2d_bytes = elems * target_bytes_per_element(traits, CopyKind::kGradAccum);
    u.accum_out_d2h_bytes = u.accum_in_h2d_bytes;
    u.accum_add_gpu_s = elems * 3.0 * kBf16Bytes / sw_.cap.gpu_hbm_Bps;
  }
  if (traits.partition_round_trip) {
    // This rank's partition of the unit (the tied head's contribution too) in the 16-bit gradient
    // dtype (DeepSpeed's gradient_accumulation_dtype, the model's by default).
    const double elems = (moved + tied_numel(ul)) / W;
    u.trip_out_d2h_bytes = elems * target_bytes_per_element(traits, CopyKind::kGradAccum);
    u.trip_in_h2d_bytes = u.trip_out_d2h_bytes;
  }
}

void StepWorkBuilder::set_host_work(const UnitLayout& ul, UnitWork& u) const {
  const SystemTraits& traits = sw_.traits;
  const double n = static_cast<double>(u.numel);
  const double a = adamw_rate_, r = reduce_rate_;
  const double in_bytes = grad_in_bytes();
  if (traits.gpu_sharded_state || traits.accumulate_on_gpu || traits.partition_round_trip) {
    return;  // nothing on the host (the ZeRO offloads' gradients are DMA targets only)
  } else if (traits.update_after_backward) {
    // Grads are accumulated on the host each micro-step; the update happens after backward.
    u.cpu_accum_thread_s = n * in_bytes / r;
    u.cpu_accum_host_mem_bytes = n * (in_bytes + 2.0 * kFp32Bytes);
    u.cpu_last_thread_s = u.cpu_accum_thread_s;
    u.cpu_last_host_mem_bytes = u.cpu_accum_host_mem_bytes;
    if (traits.update_in_layer_order) {
      // SlideDP sums the norm's squares as each block of the last micro-step's sum completes
      // (executor/grad_norm_blocks.h): the accumulator read once more.
      u.cpu_last_thread_s += n * kFp32Bytes / r;
      u.cpu_last_host_mem_bytes += n * kFp32Bytes;
    }
  } else {
    // Fused reduce + AdamW on the last micro-step: the input bytes beyond AdamW's own bf16 gradient are read
    // in the same pass; with accumulation the fp32 accumulator is read too.
    u.cpu_last_thread_s = n / a + n * (in_bytes - kBf16Bytes) / r + (A_ > 1 ? n * kFp32Bytes / r : 0.0);
    u.cpu_last_host_mem_bytes =
        n * (traits.adamw_host_bytes_per_param + in_bytes - kBf16Bytes + (A_ > 1 ? kFp32Bytes : 0.0));
    // Earlier micro-steps add their reduced gradient into the fp32 accumulator.
    u.cpu_accum_thread_s = n * in_bytes / r;
    u.cpu_accum_host_mem_bytes = n * (in_bytes + 2.0 * kFp32Bytes);
  }
  if (ul.reads_tied_embedding) {
    // The head's contribution to the tied embedding gradient is accumulated on the host until the
    // embedding's own gradient arrives at the end of backward.
    const double e = tied_numel(ul);
    const double work = e * in_bytes / r;
    const double hm = e * (in_bytes + 2.0 * kFp32Bytes);
    u.cpu_last_thread_s += work;
    u.cpu_accum_thread_s += work;
    u.cpu_last_host_mem_bytes += hm;
    u.cpu_accum_host_mem_bytes += hm;
  }
}

void StepWorkBuilder::set_work_across_nodes(const UnitLayout& ul, UnitWork& u) const {
  const int M = M_;
  const double n = static_cast<double>(u.numel);
  const double a = adamw_rate_, r = reduce_rate_;
  if (p_.grad_shards() > 1) {
    // The gpu route: the reduce-scatter summed every node's ranks already (grad_nic_bytes). Each
    // node updates the part its sharded state holds, its ranks' shards (1/M of each chunk), as one
    // node updates its whole chunk, then all-gathers the updated bf16 mirror.
    for (double* v : {&u.cpu_last_thread_s, &u.cpu_accum_thread_s, &u.cpu_last_host_mem_bytes,
                      &u.cpu_accum_host_mem_bytes})
      *v /= M;
    // (Verify mode: the update, and so the gather, follow the backward: post_gather_nic_bytes.)
    u.nic_gather_bytes = sw_.traits.update_after_backward ? 0.0 : (M - 1.0) / M * n * kBf16Bytes;
    u.nic_messages = 2.0 * (M - 1);
    return;
  }
  // Every micro-step (the executor sums each one across nodes in global rank order, so that M
  // nodes train what one node of M x N ranks does): the node reduces its ranks' gradients into one
  // fp32 chunk, exchanges it (ring all-reduce: 2 (M-1)/M of it out and in; reduce-scatter:
  // (M-1)/M) and adds what arrives. Earlier micro-steps add the sum into the fp32 accumulator of
  // the part the node owns; the last runs AdamW on it with the accumulator (verify mode: adds it
  // too; the update follows the backward), and a sharded state all-gathers the updated bf16
  // mirror. Host memory: the exchanges are DMA reads and writes of host buffers.
  const double in_bytes = grad_in_bytes();
  const double frac = (M - 1.0) / M;
  const bool sharded = p_.host_state == HostState::kSharded;
  const double owned = sharded ? n / M : n;
  const double tied_e = tied_numel(ul);
  u.cpu_last_thread_s = n * in_bytes / r + tied_e * in_bytes / r;
  u.cpu_last_host_mem_bytes = n * (in_bytes + kFp32Bytes) + tied_e * (in_bytes + 2.0 * kFp32Bytes);
  u.cpu_accum_thread_s = u.cpu_last_thread_s;
  u.cpu_accum_host_mem_bytes = u.cpu_last_host_mem_bytes;
  const bool verify = sw_.traits.update_after_backward;
  u.nic_exchange_bytes = (sharded ? 1.0 : 2.0) * frac * n * kFp32Bytes;
  u.nic_gather_bytes = sharded && !verify ? frac * n * kBf16Bytes : 0.0;
  u.nic_messages = 2.0 * (M - 1);  // ring steps: the all-reduce's two phases, or reduce-scatter + all-gather
  u.nic_host_mem_bytes = 2.0 * u.nic_exchange_bytes;
  const double combine = frac * n;  // fp32 partial sums added on arrival
  // Adding the sum into the accumulator: read both, write one.
  u.cpu_accum_after_exchange_thread_s = combine * kFp32Bytes / r + owned * kFp32Bytes / r;
  u.cpu_accum_after_exchange_host_mem_bytes = combine * 3.0 * kFp32Bytes + owned * 3.0 * kFp32Bytes;
  if (verify) {
    u.cpu_after_exchange_thread_s = u.cpu_accum_after_exchange_thread_s;
    u.cpu_after_exchange_host_mem_bytes = u.cpu_accum_after_exchange_host_mem_bytes;
  } else {
    u.cpu_after_exchange_thread_s =
        combine * kFp32Bytes / r + owned / a + (A_ > 1 ? owned * kFp32Bytes / r : 0.0);
    u.cpu_after_exchange_host_mem_bytes =
        combine * 3.0 * kFp32Bytes + owned * (sw_.traits.adamw_host_bytes_per_param + kFp32Bytes -
                                              kBf16Bytes + (A_ > 1 ? kFp32Bytes : 0.0));
  }
}

// System-level work after backward.
void StepWorkBuilder::set_after_backward() {
  const SystemTraits& traits = sw_.traits;
  const Capacities& c = sw_.cap;
  const int N = N_, M = M_;
  const double P = static_cast<double>(w_.layout.total_flat_numel);
  if (traits.update_after_backward && !traits.gpu_optimizer) {
    // Optimizer over all parameters with the updater's threads (ZeRO-Offload: each rank's process
    // updates its partition, so all cores work; MegaTrain: one process).
    const double threads = traits.update_on_all_cores ? static_cast<double>(hw_.cpu.cores) : c.update_threads;
    // (SlideDP in verify mode and MegaTrain update with their own pool; the ZeRO and FSDP offloads with
    // every core, each rank's process its partition.)
    const double rate = CpuSpec::interpolate(optimizer_rates_, threads);
    // Expressed in thread-seconds of the update pool, so that work / update_threads = P / rate.
    // A state sharded across nodes: each node updates its part (the global norm's sums, 8 bytes per
    // node, cross the network first), then all-gathers the updated bf16 mirror.
    const bool sharded_nodes = M > 1 && p_.host_state == HostState::kSharded;
    const double owned = sharded_nodes ? P / M : P;
    sw_.post_update_thread_s = owned / rate * c.update_threads;
    // SlideDP's update reads the fp32 accumulator (4 bytes) where the fused kernel's count has a bf16
    // gradient (2); its norm was summed during the backward. The baselines keep their charge: the
    // fused count plus 4 bytes of gradient.
    const double grad_read = traits.update_in_layer_order ? kFp32Bytes - kBf16Bytes : kFp32Bytes;
    sw_.post_update_host_mem_bytes = owned * (traits.adamw_host_bytes_per_param + grad_read);
    if (sharded_nodes) sw_.post_gather_nic_bytes = (M - 1.0) / M * P * kBf16Bytes;
    if (traits.upload_after_update) {
      sw_.post_upload_h2d_bytes = P * kBf16Bytes / N;
      sw_.post_allgather_bytes = N > 1 ? P * kBf16Bytes * fanin_ : 0.0;
    }
  }
  if (traits.gpu_optimizer) {
    // FSDP2's AdamW on the GPU over this rank's shard: read p, g, m, v (fp32), write p, m, v.
    sw_.post_gpu_s = P / N * 28.0 / c.gpu_hbm_Bps;
  }
}

}  // namespace

StepWork build_step_work(const Workload& w, const Hardware& hw, const Plan& plan, System system) {
  return StepWorkBuilder(w, hw, plan, system).build();
}

}  // namespace slidedp
