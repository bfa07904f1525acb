// slidedp-plan: turns a hardware profile, a model and a goal into the plan the executor runs. Searches
// routes, chunk sizes, activation policies, batch shape, buffer depth and update threads under the
// memory budgets, prints the top K with one line on why the winner wins, writes the winner as a plan
// file; --refine K runs the top K on this machine's CPU backend and keeps the measured best.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "card/model_card.h"
#include "common/cli_checks.h"
#include "common/cli_main.h"
#include "common/cli_parse.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/units.h"
#include "model/hardware.h"
#include "planner/refine.h"
#include "planner/report.h"
#include "planner/search.h"
#include "runlog/interrupt.h"

namespace slidedp::planner {
namespace {

// slidedp-plan's flags: their values with defaults, and their registration (the --help text).
struct PlanCliFlags {
  std::string hardware, model, out, maximize, db = "runs/runs.db", data;
  int64_t seq = 0;
  int ranks = 0, nodes = 1, top = 5, refine = 0, max_mb = 0, max_acc = 0;
  std::optional<std::string> host_state;
  int64_t refine_steps = 8;
  std::optional<int64_t> global_batch, token_budget;
  int64_t max_global_batch = int64_t{1} << 20;
  std::optional<std::string> budget, reserve, param_route, grad_route;
  std::vector<int64_t> chunks;
  std::vector<int> depths, threads;
  bool json = false, exhaustive = false, no_sim = false, no_db = false, allow_lossy_states = false,
       clip = false;
  std::optional<std::string> list;
  int refine_rounds = 2;

  void add_to(CLI::App& app) {
    add_search_flags(app);
    add_output_flags(app);
  }

 private:
  // The workload, the goal and the space searched.
  void add_search_flags(CLI::App& app) {
    app.add_option("--hardware", hardware, "Hardware preset name (e.g. h100-sxm-x8) or profile YAML")
        ->required();
    app.add_option("--model", model,
                   "Model preset name (e.g. qwen2.5-72b), card YAML, config.json or HF model folder")
        ->required();
    app.add_option("--seq", seq, "Sequence length in tokens")->required()->check(CLI::PositiveNumber);
    app.add_option("--ranks", ranks, "Data-parallel ranks (GPUs) per node")
        ->required()
        ->check(CLI::PositiveNumber);
    app.add_option(
           "--nodes", nodes,
           "Nodes like this machine, joined by its network (hardware key network.nic_gbps); the host state's "
           "placement across them is searched too. slidedp-run runs such a plan under mpirun, one process "
           "per node; --refine measures on this node alone and refuses it")
        ->check(CLI::Range(1, 4096));
    app.add_option("--host-state", host_state,
                   "Only this host state placement across nodes: replicated | sharded")
        ->check(CLI::IsMember({"replicated", "sharded"}));
    app.add_flag(
        "--allow-lossy-states", allow_lossy_states,
        "Let the plan hold AdamW's moments in bf16 (4 instead of 8 bytes per parameter, rounded "
        "stochastically) or 8-bit blocks (2.03; both change the numerics): each taken over the more exact "
        "one "
        "only where that does not fit or it is at least 2% faster per token; the explanation says which");
    app.add_flag(
        "--clip", clip,
        "A run that clips its gradient norm or skips non-finite steps (slidedp-run --clip-grad-norm, "
        "--on-nonfinite skip): the update follows the backward and overlaps the next step's forward "
        "unit by unit (plans are scored so; the written plan says verify_updates)");
    auto* g = app.add_option("--global-batch-tokens", global_batch,
                             "Matched batch: tokens per optimizer step, fixed (= nodes x ranks x micro-batch "
                             "x accumulation x seq)")
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    auto* m = app.add_option("--maximize", maximize, "Free batch: maximize this (throughput)")
                  ->check(CLI::IsMember({"throughput"}));
    auto* b = app.add_option("--token-budget", token_budget,
                             "Free batch: minimize the time to train this many tokens");
    g->excludes(m)->excludes(b);
    m->excludes(b);
    app.add_option("--max-global-batch-tokens", max_global_batch,
                   "Free batch: the largest tokens per step considered")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--max-micro-batch", max_mb, "Largest micro-batch considered (0: memory decides)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--max-accum", max_acc, "Largest accumulation considered (0: no limit)")
        ->check(CLI::NonNegativeNumber);
    app.add_option(
        "--gpu-mem-budget", budget,
        "GPU memory budget per rank, bytes or with a unit (70GiB); default: GPU memory minus the reserve");
    app.add_option(
        "--gpu-mem-reserve", reserve,
        "GPU memory kept free for allocator slack and fragmentation when no budget is given (default 512MiB; "
        "the CUDA context and NCCL buffers are items of the memory account, from the hardware profile)");
    app.add_option("--param-route", param_route, "Only this parameter route: replicated | sharded")
        ->check(CLI::IsMember({"replicated", "sharded"}));
    app.add_option("--grad-route", grad_route, "Only this gradient route: cpu | gpu")
        ->check(CLI::IsMember({"cpu", "gpu"}));
    app.add_option("--chunk-numel", chunks,
                   "Only these chunk sizes (elements; repeat the flag or give several)");
    app.add_option("--depth", depths, "Only these GPU buffer depths");
    app.add_option("--update-threads", threads, "Only these update thread counts (0 = all free cores)");
  }

  // How many plans are shown and how they are scored, refined, logged and written.
  void add_output_flags(CLI::App& app) {
    app.add_option("--top", top, "Plans to show and re-score with the simulator")->check(CLI::PositiveNumber);
    app.add_flag("--no-simulator", no_sim, "Rank by the analytical model only (no simulator re-scoring)");
    app.add_option(
           "--list", list,
           "plans: the K best plans (default); families: the best plan of K different batch-shape/route/"
           "activation families (slower; the default with --refine, so the measured plans differ)")
        ->check(CLI::IsMember({"plans", "families"}));
    app.add_flag("--exhaustive", exhaustive,
                 "Score every feasible candidate (no pruning; slow, for checking the search)");
    app.add_option(
           "--refine", refine,
           "Run the top K plans for a few steps on this machine's CPU backend and keep the measured best "
           "(a model that fits this machine; on a profile of real GPUs the runs are paced at its ratios, "
           "as slidedp-run --emulate)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--refine-steps", refine_steps,
                   "Optimizer steps per refined plan and round (the first 2 are warm-up)")
        ->check(CLI::PositiveNumber);
    app.add_option("--refine-rounds", refine_rounds,
                   "Rounds of refinement runs, in alternating candidate order so drift favors no one")
        ->check(CLI::PositiveNumber);
    app.add_option("--data", data, "Token file for --refine (default: the embedded text, byte-tokenized)");
    app.add_option("--db", db, "Run log for --refine runs (created if missing)");
    app.add_flag("--no-db", no_db, "Do not log --refine runs");
    app.add_option("--out", out, "Write the chosen plan here (default: print it)");
    app.add_flag("--json", json, "Print one JSON object instead of the readable report");
  }
};

// Outputs are checked before the search (a refined search runs for minutes): never onto an input.
void check_outputs(const PlanCliFlags& f) {
  check_output_file_target({"--out", f.out});
  refuse_output_in_checkpoints({"--out", f.out});
  refuse_output_over_inputs(
      {"--out", f.out}, {{"--hardware", is_folder(f.hardware) || path_exists(f.hardware) ? f.hardware : ""},
                         {"--model", path_exists(f.model) ? f.model : ""},
                         {"--data", f.data}});
  if (!f.db.empty() && f.refine > 0) check_output_file_target({"--db", f.db});
  if (f.nodes > 1 && f.refine > 0)
    throw InputError("--refine", "measures plans on this machine, which runs one node; drop --nodes or --refine");
}

SearchSpec search_spec_from(const PlanCliFlags& f) {
  SearchSpec spec;
  spec.ranks = f.ranks;
  spec.nodes = f.nodes;
  if (f.host_state) spec.host_states = {parse_host_state(*f.host_state, "--host-state")};
  spec.allow_lossy_states = f.allow_lossy_states;
  spec.verify_updates = f.clip;
  if (f.global_batch) {
    spec.objective = Objective::kMatchedBatch;
    spec.global_batch_tokens = *f.global_batch;
  } else if (!f.maximize.empty()) {
    spec.objective = Objective::kMaxThroughput;
  } else if (f.token_budget) {
    spec.objective = Objective::kMinTimeToTokens;
    spec.token_budget_tokens = *f.token_budget;
  } else {
    throw InputError(
        "",
        "give the goal: --global-batch-tokens N (matched batch), --maximize throughput, or --token-budget N");
  }
  spec.max_global_batch_tokens = f.max_global_batch;
  spec.max_micro_batch = f.max_mb;
  spec.max_accum_steps = f.max_acc;
  if (f.budget) spec.gpu_mem_budget_bytes = budget_bytes_flag(*f.budget, "--gpu-mem-budget");
  if (f.reserve) spec.gpu_mem_reserve_bytes = parse_bytes_flag(*f.reserve, "--gpu-mem-reserve");
  if (f.param_route) spec.param_routes = {parse_param_route(*f.param_route, "--param-route")};
  if (f.grad_route) spec.grad_routes = {parse_grad_route(*f.grad_route, "--grad-route")};
  spec.chunk_numels = f.chunks;
  spec.buffer_depths = f.depths;
  spec.update_threads = f.threads;
  return spec;
}

// --refine K: the top K run on this machine's CPU backend; the measured best is kept.
std::optional<RefineResult> refine_if_asked(const PlanCliFlags& f, const Workload& w, const Hardware& hw,
                                            const SearchResult& r, int argc, char** argv) {
  if (f.refine <= 0) return std::nullopt;
  RefineOptions ro;
  ro.candidates = f.refine;
  ro.steps = f.refine_steps;
  ro.rounds = f.refine_rounds;
  ro.db_path = f.no_db ? "" : f.db;
  ro.command_line = command_line(argc, argv);
  ro.model_name = f.model;
  ro.data_path = f.data;
  if (!f.json) ro.on_progress = [](const std::string& line) { fmt::print(stderr, "refine: {}\n", line); };
  return refine_plans(w, hw, r, ro);
}

std::string goal_text(const SearchSpec& spec) {
  switch (spec.objective) {
    case Objective::kMatchedBatch:
      return fmt::format("matched batch of {} tokens per step", spec.global_batch_tokens);
    case Objective::kMaxThroughput:
      return fmt::format("maximum tokens/s (up to {} tokens per step)", spec.max_global_batch_tokens);
    case Objective::kMinTimeToTokens:
      return fmt::format("least time to {} tokens", spec.token_budget_tokens);
  }
  return "";
}

// What the search found, the written plan and, with --refine, what was measured.
struct PlanOutcome {
  const PlanCliFlags& flags;
  const Workload& workload;
  const Hardware& hardware;
  const SearchSpec& spec;
  const SearchResult& search;
  const std::optional<RefineResult>& refined;
  const PlanFile& chosen;
  const std::string& yaml;
};

void print_json(const PlanOutcome& p) {
  nlohmann::json j = search_result_to_json(p.search);
  j["model"] = p.workload.model.name;
  j["hardware"] = p.hardware.name;
  j["chosen_plan_yaml"] = p.yaml;
  j["clip"] = p.flags.clip;
  if (p.refined) j["refine"] = refine_to_json(*p.refined, static_cast<int>(p.workload.model.num_layers));
  if (!p.flags.out.empty()) j["out"] = p.flags.out;
  std::cout << j.dump(2) << "\n";
}

void print_report(const PlanOutcome& p) {
  const PlanCliFlags& f = p.flags;
  const int L = static_cast<int>(p.workload.model.num_layers);
  fmt::print("{} ({}) on {} | seq {} | {} ranks | {}\n\n", p.workload.model.name,
             p.workload.model.params_summary(), p.hardware.name, f.seq, f.ranks, goal_text(p.spec));
  if (f.clip)
    std::cout << "planned for clipping (--clip): every step time below has the update after the backward, "
                 "overlapping the next step's forward layer by layer\n";
  std::cout << render_top_table(p.search) << "\n"
            << explain_choice(p.search) << "\n"
            << render_search_stats(p.search) << "\n";
  if (p.refined) std::cout << "\nmeasured on this machine (CPU backend):\n" << render_refine(*p.refined, L);
  if (!f.out.empty()) {
    fmt::print(
        "\nwrote {} ({}); run it with slidedp-run --plan {}, check it with slidedp-predict --plan {}\n",
        f.out, candidate_summary(p.chosen.plan, L), f.out, f.out);
  } else {
    fmt::print("\nchosen plan:\n{}", p.yaml);
  }
}

int plan_main(int argc, char** argv) {
  CLI::App app{
      "slidedp-plan: search routes, chunk sizes, activation policies and batch shape for a model on a "
      "machine,\n"
      "under GPU and host memory budgets; print the top plans and why the winner wins; write it as a plan "
      "file\n"
      "that slidedp-run --plan and slidedp-predict --plan accept."};
  PlanCliFlags f;
  f.add_to(app);
  if (const std::optional<int> done = parse_command_line(app, argc, argv)) return *done;
  check_outputs(f);
  const SearchSpec spec = search_spec_from(f);
  const Workload w = make_workload(load_model_card(f.model), f.seq);
  const Hardware hw = load_hardware(f.hardware);
  SearchOptions so;
  so.top_k = std::max(f.top, f.refine);
  so.rescore_with_simulator = !f.no_sim;
  so.exhaustive = f.exhaustive;
  so.distinct_families = f.list ? *f.list == "families" : f.refine > 0;
  const SearchResult r = search_plans(w, hw, spec, so);
  const std::optional<RefineResult> refined = refine_if_asked(f, w, hw, r, argc, argv);
  PlanFile chosen = best_plan_file(r, f.model, f.hardware, f.seq);
  if (refined) chosen.plan = refined->chosen_run().plan;
  const std::string yaml = plan_file_to_yaml(chosen);
  if (!f.out.empty()) write_file_atomic(f.out, yaml);
  const PlanOutcome outcome{f, w, hw, spec, r, refined, chosen, yaml};
  if (f.json)
    print_json(outcome);
  else
    print_report(outcome);
  return 0;
}

}  // namespace
}  // namespace slidedp::planner

int main(int argc, char** argv) {
  slidedp::runlog::end_runs_on_stop_signal();  // --refine's runs end logged interrupted on SIGINT/SIGTERM
  return slidedp::run_cli("slidedp-plan", [&] { return slidedp::planner::plan_main(argc, argv); });
}
