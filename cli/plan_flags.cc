// Shared plan flags; see plan_flags.h.
#include "cli/plan_flags.h"

#include <fmt/format.h>

#include <sstream>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/units.h"

namespace slidedp {

void PlanFlags::add_to(CLI::App& app, bool with_workload) {
  app.add_option("--plan", plan_file, "Plan YAML file (slidedp-plan writes one); flags below override it");
  if (with_workload) {
    app.add_option("--model", model, "Model preset name (e.g. qwen3-14b), card YAML, config.json or HF model folder");
    app.add_option("--hardware", hardware, "Hardware preset name (e.g. h100-sxm-x4) or profile YAML from slidedp-profile");
    app.add_option("--seq", seq_len, "Sequence length in tokens")->check(integer_in(1, int64_t{1} << 24));
  }
  app.add_option("--nodes", nodes, "Nodes, each a host like the hardware profile's (slidedp-run: one process per node, launched by mpirun -np NODES)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--host-state", host_state, "Host state across nodes: replicated | sharded (1/nodes of the fp32 state per node)")
      ->check(CLI::IsMember({"replicated", "sharded"}));
  app.add_option("--optimizer-states", optimizer_states,
                 "AdamW's moments on the host: fp32 (default) | bf16 (4 instead of 8 bytes per parameter, "
                 "rounded stochastically) | 8bit (2.03: a byte each plus an fp32 scale per block of 256, as "
                 "bitsandbytes' 8-bit Adam); the last two are lossy: they change the numerics, and neither "
                 "goes with --exact or a baseline")
      ->check(CLI::IsMember({"fp32", "bf16", "8bit"}));
  app.add_option("--ranks", ranks, "Data-parallel ranks (GPUs) per node")->check(integer_in(1, 4096));
  app.add_option("--micro-batch", micro_batch, "Sequences per rank per micro-step")->check(integer_in(1, 1 << 20));
  app.add_option("--accum", accum_steps, "Micro-steps (gradient accumulation) per optimizer step")->check(integer_in(1, 1 << 20));
  app.add_option("--param-route", param_route, "Parameter delivery: replicated | sharded")
      ->check(CLI::IsMember({"replicated", "sharded"}));
  app.add_option("--grad-route", grad_route, "Gradient reduction: cpu | gpu")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--chunk-numel", chunk_numel, "Elements per transfer/reduction/update chunk")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));  // as plan YAML's chunk_numel
  app.add_option("--activation", activation,
                 "Activation policy counts over decoder layers in order, e.g. offload:4,recompute:rest "
                 "or offload:2,recompute:10,keep:rest");
  app.add_option("--depth", depth, "GPU parameter buffer depth (slots per rank)")->check(integer_in(1, kMaxBufferDepth));
  app.add_option("--update-threads", update_threads, "CPU threads for reduction + AdamW (0 = all free cores)")
      ->check(integer_in(0, 1024));
  app.add_option("--mlp-token-tile", mlp_token_tile,
                 "Token rows per MLP tile of every decoder layer (0 = the whole micro-batch at once)")
      ->check(integer_in(0, int64_t{1} << 30));
  app.add_option("--gpu-mem-budget", gpu_mem_budget,
                 "GPU memory budget per rank, bytes or with a unit (70GiB); default: GPU memory minus the plan's reserve (512 MiB; the CUDA context and NCCL buffers are charged from the hardware profile)");
}

void apply_activation_spec(const std::string& spec, Plan& plan) {
  plan.per_layer.clear();
  plan.offload_layers = 0;
  plan.recompute_layers = 0;
  plan.keep_layers = 0;
  bool rest_seen = false;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto pos = item.find_first_of(":=");
    if (pos == std::string::npos) throw InputError("--activation", fmt::format("'{}' should look like offload:4", item));
    std::string name = item.substr(0, pos), value = item.substr(pos + 1);
    int count = Plan::kRest;
    if (value != "rest") {
      try {
        count = std::stoi(value);
      } catch (...) {
        throw InputError("--activation", fmt::format("'{}' is not a layer count or 'rest'", value));
      }
      if (count < 0) throw InputError("--activation", "layer counts must be non-negative");
    } else {
      if (rest_seen) throw InputError("--activation", "only one policy can take 'rest'");
      rest_seen = true;
    }
    if (name == "offload") {
      if (count == Plan::kRest) throw InputError("--activation", "'rest' is only allowed for recompute or keep");
      plan.offload_layers = count;
    } else if (name == "recompute") {
      plan.recompute_layers = count;
    } else if (name == "keep") {
      plan.keep_layers = count;
    } else {
      throw InputError("--activation", fmt::format("'{}' is not a policy (offload, recompute, keep)", name));
    }
  }
  if (!rest_seen) {
    // Whatever is not named keeps its activations only if keep was not given; default remainder:
    // recompute, the safe choice.
    if (plan.keep_layers == 0) plan.keep_layers = Plan::kRest;
    else if (plan.recompute_layers == 0) plan.recompute_layers = Plan::kRest;
  }
}

PlanFile PlanFlags::resolve() const {
  PlanFile f;
  if (!plan_file.empty()) f = load_plan_file(plan_file);
  if (!model.empty()) f.model = model;
  if (!hardware.empty()) f.hardware = hardware;
  if (seq_len) f.seq_len = *seq_len;
  Plan& p = f.plan;
  if (nodes) p.nodes = *nodes;
  if (host_state) p.host_state = parse_host_state(*host_state, "--host-state");
  if (optimizer_states) p.optimizer_states = parse_optimizer_states(*optimizer_states, "--optimizer-states");
  if (ranks) p.ranks = *ranks;
  if (micro_batch) p.micro_batch = *micro_batch;
  if (accum_steps) p.accum_steps = *accum_steps;
  if (param_route) p.param_route = parse_param_route(*param_route, "--param-route");
  if (grad_route) p.grad_route = parse_grad_route(*grad_route, "--grad-route");
  if (chunk_numel) p.chunk_numel = *chunk_numel;
  if (activation) apply_activation_spec(*activation, p);
  if (depth) p.gpu_buffer_depth = *depth;
  if (update_threads) p.update_threads = *update_threads;
  if (mlp_token_tile) p.mlp_token_tile = *mlp_token_tile;
  if (gpu_mem_budget) {
    p.gpu_mem_budget_bytes = budget_bytes_flag(*gpu_mem_budget, "--gpu-mem-budget");
  }
  return f;
}

}  // namespace slidedp
