// The plan: how one training step runs. The planner writes it, the executor runs it, the model
// predicts it, a person can edit it. Routes change how bytes travel, never the math or the state
// layout (../docs/ARCHITECTURE.md, "Routes").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_costs.h"
#include "model/optimizer_states.h"

namespace slidedp {

enum class ParamRoute { kReplicated, kSharded };  // every rank DMAs the unit | 1/N each + all-gather
enum class GradRoute { kCpu, kGpu };  // per-rank host slots summed by CPU | reduce-scatter on GPU
// Where the authoritative host state lives across nodes: whole on every node, or 1/M on each.
enum class HostState { kReplicated, kSharded };
const char* param_route_name(ParamRoute r);
const char* host_state_name(HostState s);
const char* grad_route_name(GradRoute r);

// The deepest parameter buffer a plan may ask for (slots per rank; the planner searches up to 64).
inline constexpr int kMaxBufferDepth = 1024;

struct Plan {
  // Nodes of the cluster, each a host like the hardware profile's with `ranks` GPUs. With more than
  // one, each node reduces its ranks' gradients, the nodes exchange the reduced fp32 chunks over the
  // network (all-reduce when the host state is replicated, reduce-scatter when sharded), and with a
  // sharded state each node updates its 1/M and all-gathers the updated bf16 mirror.
  int nodes = 1;
  HostState host_state = HostState::kReplicated;
  OptimizerStates optimizer_states = OptimizerStates::kFp32;  // SlideDP's; the baselines keep fp32
  int ranks = 1;  // per node
  int micro_batch = 1;   // sequences per rank per micro-step
  int accum_steps = 1;   // micro-steps per optimizer step
  ParamRoute param_route = ParamRoute::kReplicated;
  GradRoute grad_route = GradRoute::kCpu;
  int64_t chunk_numel = int64_t{1} << 25;  // elements per transfer / reduction / update grain
  // Activation policy over decoder layers, in layer order: the first `offload_layers` offload, the
  // next `recompute_layers` recompute, the last `keep_layers` keep. Exactly one of recompute/keep is
  // kRest (all remaining layers). Offloading the first layers gives their prefetch the most time: they
  // are the last ones backward needs. A non-empty `per_layer` overrides the counts.
  static constexpr int kRest = -1;
  int offload_layers = 0;
  int recompute_layers = kRest;
  int keep_layers = 0;
  std::vector<ActivationPolicy> per_layer;
  int gpu_buffer_depth = 2;      // parameter slots per rank (2 = double buffering)
  int update_threads = 0;        // CPU threads for reduction + AdamW; 0 = all free cores
  int64_t loss_chunk_tokens = 4096;  // tokens per fused cross-entropy chunk
  // Token rows per MLP tile of every decoder layer; 0 = the whole micro-batch at once. A tile keeps
  // gate/up/SwiGLU intermediates at tile x intermediate_size instead of B*T x intermediate_size and
  // recomputes gate/up in backward (kernels/cpu/transformer/unit_spec.h, DecoderSpec::mlp_token_tile).
  int64_t mlp_token_tile = 0;
  int64_t gpu_mem_budget_bytes = 0;  // 0 = the GPU's memory minus gpu_mem_reserve_bytes
  // Allocator slack and fragmentation; the CUDA context and NCCL buffers are the hardware profile's
  // (gpu.runtime_bytes, gpu.collective_bytes) and items of the memory account.
  int64_t gpu_mem_reserve_bytes = int64_t{512} << 20;
  // Gradient clipping or skipping non-finite steps needs the global gradient before any update, so
  // chunks are accumulated during backward and all updated after it (docs/EXECUTOR.md).
  bool verify_updates = false;

  // The gpu gradient route cuts each chunk's reduced gradient into one shard per rank of every node
  // (its reduce-scatter spans the nodes); 1: the cpu route, or a single rank.
  int grad_shards() const { return grad_route == GradRoute::kGpu ? nodes * ranks : 1; }
  int64_t global_batch_sequences() const {
    return static_cast<int64_t>(nodes) * ranks * micro_batch * accum_steps;
  }
  // The policy of decoder layer `layer` of `num_layers`.
  ActivationPolicy layer_policy(int layer, int num_layers) const;
  // Counts per policy over `num_layers` decoder layers: {offload, recompute, keep}.
  struct PolicyCounts {
    int offload = 0, recompute = 0, keep = 0;
  };
  PolicyCounts policy_counts(int num_layers) const;
  // A one-line summary: "4 ranks x mb 2 x acc 1 | sharded/cpu | chunk 32M | act o4/r36/k0 | depth 2".
  std::string summary(int num_layers) const;
  // Throws InputError naming `origin` for inconsistent values (per_layer length, ...).
  void validate(int num_layers, const std::string& origin) const;
};

// A plan file: the plan plus, optionally, the workload and hardware it was made for, so that
// `slidedp-run --plan plan.yaml` and `slidedp-predict --plan plan.yaml` need nothing else.
struct PlanFile {
  Plan plan;
  std::string model;     // model name or path ("" = not stated)
  std::string hardware;  // hardware name or path ("" = not stated)
  int64_t seq_len = 0;   // 0 = not stated
  std::string system = "slidedp";
  std::string origin;  // the file it came from ("" when built from flags)
  std::string plan_source() const { return origin.empty() ? "plan" : origin; }
};

Plan plan_from_yaml_reader(const class YamlReader& r);  // reads plan keys from a map (strict)
PlanFile plan_file_from_yaml(const std::string& yaml_text, const std::string& origin);
PlanFile load_plan_file(const std::string& path);
std::string plan_file_to_yaml(const PlanFile& file);
std::string plan_to_yaml(const Plan& plan);

// Whether the backward delivers unit u-1 before it sends unit u's gradient: when both travel on the
// comm stream (sharded delivery's all-gather, the gpu route's reduce-scatter), the next layer's
// all-gather must not queue behind this layer's reduce-scatter, or the backward never overlaps
// communication. The rank driver and the memory account both follow it.
bool backward_delivery_lookahead(const Plan& plan);

ParamRoute parse_param_route(const std::string& s, const std::string& where);
GradRoute parse_grad_route(const std::string& s, const std::string& where);
HostState parse_host_state(const std::string& s, const std::string& where);
ActivationPolicy parse_activation_policy(const std::string& s, const std::string& where);

}  // namespace slidedp
