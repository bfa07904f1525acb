// Command-line flags shared by every tool that takes a plan (slidedp-predict, -plan, -run, -sweep):
// a plan file plus overrides, each flag named like its YAML key. Keeping them in one place keeps
// `--help` and the YAML vocabulary identical across tools.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "model/plan.h"

namespace slidedp {

struct PlanFlags {
  std::string plan_file;
  std::string model;
  std::string hardware;
  std::optional<int64_t> seq_len;
  std::optional<int> nodes, ranks, micro_batch, accum_steps, depth, update_threads;
  std::optional<std::string> host_state, param_route, grad_route, gpu_mem_budget, activation,
      optimizer_states;
  std::optional<int64_t> chunk_numel, mlp_token_tile;

  // Registers the flags; `with_workload` adds --model/--hardware/--seq.
  void add_to(CLI::App& app, bool with_workload = true);
  // The plan file (if any) with every given flag applied on top. Throws InputError.
  PlanFile resolve() const;
};

// "offload:4,recompute:rest" or "offload=4,keep=6" -> counts on the plan (InputError otherwise).
void apply_activation_spec(const std::string& spec, Plan& plan);

}  // namespace slidedp
