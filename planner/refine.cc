// Measured refinement of the top plans on the CPU backend; see refine.h. Each candidate is a real
// training run (exec::train) of `steps` optimizer steps from the same random initialization and data
// order, so the candidates differ only in their plan.
#include "planner/refine.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"
#include "common/host_memory.h"
#include "common/median.h"
#include "common/table.h"
#include "common/units.h"
#include "executor/step_record.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "io/default_corpus.h"
#include "io/token_dataset.h"
#include "model/step_work.h"
#include "planner/report.h"
#include "runlog/run_log.h"

namespace slidedp::planner {
namespace {

// Host bytes a candidate needs on the CPU backend: the host state plus every emulated device's
// memory, which lives in host RAM too.
double machine_bytes(const Candidate& c) {
  return c.predicted.memory.host_bytes + c.plan.ranks * c.predicted.memory.gpu_peak_bytes;
}

}  // namespace

double kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y) {
  SLIDEDP_CHECK(x.size() == y.size(), "kendall_tau_b: samples of different length");
  double concordant = 0, discordant = 0, ties_x = 0, ties_y = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = i + 1; j < x.size(); ++j) {
      const int dx = (x[i] > x[j]) - (x[i] < x[j]);
      const int dy = (y[i] > y[j]) - (y[i] < y[j]);
      if (dx == 0 && dy == 0) continue;
      if (dx == 0)
        ties_x += 1;
      else if (dy == 0)
        ties_y += 1;
      else if (dx == dy)
        concordant += 1;
      else
        discordant += 1;
    }
  const double denom = std::sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y));
  return denom > 0 ? (concordant - discordant) / denom : std::numeric_limits<double>::quiet_NaN();
}

namespace {

// The top K candidates as runs to measure; one that cannot fit this machine's RAM is marked failed
// (all of them failing is an error naming the model).
std::vector<RefinedRun> candidate_runs(const Workload& w, const SearchResult& search,
                                       const RefineOptions& o) {
  const double ram = static_cast<double>(physical_ram_bytes()), usable = ram * o.host_ram_fraction;
  const int K = std::min<int>(o.candidates, static_cast<int>(search.top.size()));
  std::vector<RefinedRun> runs;
  for (int i = 0; i < K; ++i) {
    const Candidate& c = search.top[static_cast<std::size_t>(i)];
    RefinedRun r;
    r.predicted_rank = i + 1;
    r.plan = c.plan;
    r.predicted_step_s = c.simulated ? c.simulated->step_time_s : c.predicted.step_time_s;
    r.predicted_score = c.final_score();
    if (usable > 0 && machine_bytes(c) > usable)
      r.failed = fmt::format(
          "needs {} of host memory (host state + {} emulated devices), this machine has {} ({}% usable)",
          format_bytes(machine_bytes(c)), c.plan.ranks, format_bytes(ram),
          static_cast<int>(std::lround(100 * o.host_ram_fraction)));
    runs.push_back(r);
  }
  if (std::all_of(runs.begin(), runs.end(), [](const RefinedRun& r) { return !r.failed.empty(); }))
    throw InfeasibleError(fmt::format(
        "--refine runs plans for real on this machine's CPU backend, which holds the host state and every "
        "emulated "
        "device in host RAM; {} {}. Refinement applies to models that fit this machine (small models such as "
        "slidedp-tiny or llama-3.2-1b); plan {} without --refine",
        w.model.name, runs.front().failed, w.model.name));
  return runs;
}

// The run log's common fields of the refinement and of each run.
runlog::RunInfo refine_run_info(const Workload& w, const Hardware& hw, const RefineOptions& o) {
  runlog::RunInfo info;
  info.command_line = o.command_line;
  info.backend = "cpu";
  info.hardware_name = hw.name;
  info.hardware_yaml = hardware_to_yaml(hw);
  info.model_name = w.model.name;
  info.seq_len = w.seq_len;
  info.system = "slidedp";
  return info;
}

// The refinement's own row: the objective and the candidates with their predictions.
int64_t begin_refinement(runlog::RunLog& log, const Workload& w, const Hardware& hw,
                         const SearchResult& search, const RefineOptions& o,
                         const std::vector<RefinedRun>& runs) {
  runlog::RunInfo info = refine_run_info(w, hw, o);
  info.kind = runlog::RunKind::kRefine;
  info.plan_summary = fmt::format("refine top {} of {} candidates", runs.size(), search.stats.space_size);
  nlohmann::json notes;
  notes["objective"] = objective_name(search.space.objective);
  notes["candidates"] = nlohmann::json::array();
  for (const RefinedRun& r : runs)
    notes["candidates"].push_back({{"predicted_rank", r.predicted_rank},
                                   {"plan", candidate_summary(r.plan, search.space.num_layers)},
                                   {"predicted_step_s", r.predicted_step_s}});
  info.notes_json = notes.dump();
  return log.begin_run(info);
}

// What every measured run shares.
struct RefineContext {
  const Workload& w;
  const Hardware& hw;
  const SearchResult& search;
  const RefineOptions& o;
  const TokenDataset& data;
  runlog::RunLog* log;  // null: not logged
  int64_t parent_run_id;
  bool paced;
};

// A run's row in the log: its plan, round and predictions.
int64_t begin_candidate_run(const RefineContext& ctx, RefinedRun& r, const Candidate& c, int round) {
  runlog::RunInfo info = refine_run_info(ctx.w, ctx.hw, ctx.o);
  info.kind = runlog::RunKind::kTrain;
  info.parent_run_id = ctx.parent_run_id;
  info.plan_yaml = plan_to_yaml(r.plan);
  info.plan_summary = r.plan.summary(ctx.search.space.num_layers);
  nlohmann::json notes = {{"refine_predicted_rank", r.predicted_rank}, {"refine_round", round}};
  if (ctx.paced) notes["emulate"] = ctx.hw.name, notes["time_scale"] = r.time_scale;
  info.notes_json = notes.dump();
  const int64_t run_id = ctx.log->begin_run(info);
  r.run_ids.push_back(run_id);
  ctx.log->log_prediction(run_id, runlog::prediction_record(c.predicted));
  if (c.simulated) ctx.log->log_prediction(run_id, runlog::prediction_record(*c.simulated));
  return run_id;
}

// One measured run of candidate `c` (one round), its steps after the warm-up added to `measured`; a
// refusal by the executor marks the candidate failed.
void run_candidate(const RefineContext& ctx, RefinedRun& r, const Candidate& c, int round,
                   std::vector<double>& measured) {
  const RefineOptions& o = ctx.o;
  exec::TrainOptions t;
  t.card = ctx.w.model;
  t.seq_len = ctx.w.seq_len;
  t.plan = r.plan;
  t.backend = "cpu";
  // The model's thread count for this plan (all free cores = cores not emulating devices), not the
  // executor's default of every core, so the run is the plan the model scored.
  t.update_threads = resolve_update_threads(r.plan, ctx.hw);
  t.dataset = ctx.data;
  t.data_seed = o.data_seed;
  t.steps = o.steps;
  if (ctx.paced) t.emulate = ctx.hw, t.time_scale = r.time_scale;
  const int64_t run_id = ctx.log ? begin_candidate_run(ctx, r, c, round) : -1;
  int64_t seen = 0;
  try {
    exec::train(t, [&](const exec::TrainStep& s) {
      const double step_s = s.wall_s / r.time_scale;  // the target's seconds when paced
      r.step_wall_s.push_back(step_s);
      if (++seen > o.warmup_steps) measured.push_back(step_s);
      // (What this run should take here: the prediction times the scale.)
      if (ctx.log) ctx.log->log_step(run_id, exec::step_record(s, r.predicted_step_s * r.time_scale));
    });
  } catch (const Error& e) {
    // One candidate that the executor refuses (its own memory accounting, a failure while running)
    // must not stop the others: record it and go on. Bad input (a token file that does not fit the
    // model) and I/O errors concern every candidate: those stop the refinement.
    const bool candidate_specific = e.kind() != ErrorKind::kInput && e.kind() != ErrorKind::kIo;
    if (ctx.log) {
      runlog::ErrorRecord er;
      er.kind = e.kind() == ErrorKind::kInfeasible ? "infeasible" : "error";
      er.message = e.what();
      ctx.log->log_error(run_id, er);
      ctx.log->end_run(run_id, runlog::RunStatus::kFailed);
      if (!candidate_specific) ctx.log->end_run(ctx.parent_run_id, runlog::RunStatus::kFailed);
    }
    if (!candidate_specific) throw;
    r.failed = e.what();
    if (o.on_progress) o.on_progress(fmt::format("candidate {}: failed: {}", r.predicted_rank, r.failed));
    return;
  }
  if (ctx.log) ctx.log->end_run(run_id, runlog::RunStatus::kFinished);
}

// Each run's median step, tokens/s and score; the measured best chosen; Kendall's tau of the
// predicted against the measured scores.
void choose_measured_best(RefineResult& res, const SearchResult& search, const RefineOptions& o,
                          const std::vector<std::vector<double>>& measured_steps) {
  const int L = search.space.num_layers;
  for (std::size_t i = 0; i < res.runs.size(); ++i) {
    RefinedRun& r = res.runs[i];
    if (!r.failed.empty()) continue;
    r.measured_step_s = median(measured_steps[i]);
    const BatchShape shape{r.plan.micro_batch, r.plan.accum_steps};
    r.measured_tokens_per_s = static_cast<double>(search.space.tokens_per_step(shape)) / r.measured_step_s;
    r.measured_score = search.space.score(r.measured_step_s, shape);
    if (o.on_progress)
      o.on_progress(fmt::format("candidate {}: {} measured {} per step ({:.0f} tokens/s), predicted {}",
                                r.predicted_rank, candidate_summary(r.plan, L),
                                format_seconds(r.measured_step_s), r.measured_tokens_per_s,
                                format_seconds(r.predicted_step_s)));
  }
  std::vector<double> predicted, measured;
  double best_tps = 0;
  for (std::size_t i = 0; i < res.runs.size(); ++i) {
    const RefinedRun& r = res.runs[i];
    if (!r.failed.empty()) continue;
    predicted.push_back(r.predicted_score);
    measured.push_back(r.measured_score);
    if (res.chosen < 0 || r.measured_score < res.runs[static_cast<std::size_t>(res.chosen)].measured_score)
      res.chosen = static_cast<int>(i);
    best_tps = std::max(best_tps, r.measured_tokens_per_s);
  }
  if (res.chosen < 0)
    throw RuntimeError(fmt::format("--refine: none of the {} candidates ran; first failure: {}",
                                   res.runs.size(), res.runs.front().failed));
  res.kendall_tau = kendall_tau_b(predicted, measured);
  res.chosen_over_best_tokens_per_s = res.chosen_run().measured_tokens_per_s / best_tps;
}

}  // namespace

RefineResult refine_plans(const Workload& w, const Hardware& hw, const SearchResult& search,
                          const RefineOptions& o) {
  // A profile of real GPUs is reached by pacing this machine's runs to its ratios.
  const bool paced = !hw.gpu.emulated_on_host;
  if (o.candidates < 1) throw InputError("--refine", "must be at least 1");
  if (o.rounds < 1) throw InputError("--refine-rounds", "must be at least 1");
  if (o.steps <= o.warmup_steps)
    throw InputError("--refine-steps", fmt::format("must exceed the {} warm-up steps", o.warmup_steps));
  RefineResult res;
  res.db_path = o.db_path;
  res.runs = candidate_runs(w, search, o);
  const TokenDataset data = o.data_path.empty() ? default_corpus_dataset() : TokenDataset::open(o.data_path);
  if (data.vocab_size() > w.model.vocab_size)
    throw InputError(o.data_path.empty() ? "--data" : o.data_path,
                     fmt::format("token vocabulary {} exceeds {}'s vocab_size {}", data.vocab_size(),
                                 w.model.name, w.model.vocab_size));
  std::optional<runlog::RunLog> log;
  if (!o.db_path.empty()) {
    log.emplace(runlog::RunLog::open(o.db_path));
    res.parent_run_id = begin_refinement(*log, w, hw, search, o, res.runs);
  }
  const RefineContext ctx{w, hw, search, o, data, log ? &*log : nullptr, res.parent_run_id, paced};
  if (paced)
    for (RefinedRun& r : res.runs)
      if (r.failed.empty())
        r.time_scale =
            o.time_scale > 0 ? o.time_scale : exec::TargetPacing::measured_time_scale(w, hw, r.plan);
  // Rounds in alternating order, so that slow drift of the host favours no candidate.
  std::vector<std::vector<double>> measured_steps(res.runs.size());
  for (int round = 0; round < o.rounds; ++round)
    for (std::size_t k = 0; k < res.runs.size(); ++k) {
      const std::size_t i = round % 2 == 0 ? k : res.runs.size() - 1 - k;
      if (res.runs[i].failed.empty())
        run_candidate(ctx, res.runs[i], search.top[i], round, measured_steps[i]);
    }
  if (log) log->end_run(res.parent_run_id, runlog::RunStatus::kFinished);
  choose_measured_best(res, search, o, measured_steps);
  return res;
}

std::string render_refine(const RefineResult& r, int L) {
  Table t({"pred #", "meas #", "plan", "predicted", "measured", "meas/pred", "tokens/s", "runs"},
          {"", "", "", "s", "s", "", "", ""});
  // Measured rank among the runs that ran.
  std::vector<int> order;
  for (std::size_t i = 0; i < r.runs.size(); ++i)
    if (r.runs[i].failed.empty()) order.push_back(static_cast<int>(i));
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return r.runs[static_cast<std::size_t>(a)].measured_score <
           r.runs[static_cast<std::size_t>(b)].measured_score;
  });
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const RefinedRun& x = r.runs[i];
    if (!x.failed.empty()) {
      t.add_row({std::to_string(x.predicted_rank), "-", candidate_summary(x.plan, L),
                 fmt::format("{:.4f}", x.predicted_step_s), "-", "-", "-", "failed: " + x.failed});
      continue;
    }
    const int meas =
        static_cast<int>(std::find(order.begin(), order.end(), static_cast<int>(i)) - order.begin()) + 1;
    t.add_row({std::to_string(x.predicted_rank), std::to_string(meas), candidate_summary(x.plan, L),
               fmt::format("{:.4f}", x.predicted_step_s), fmt::format("{:.4f}", x.measured_step_s),
               fmt::format("{:.2f}", x.measured_step_s / x.predicted_step_s),
               fmt::format("{:.0f}", x.measured_tokens_per_s),
               x.run_ids.empty() ? "-" : fmt::format("{}", fmt::join(x.run_ids, ","))});
  }
  std::string out = t.render();
  const RefinedRun& c = r.chosen_run();
  out += fmt::format(
      "\nchosen: the measured best, predicted #{}, {:.0f} tokens/s = {:.1f}% of the best measured",
      c.predicted_rank, c.measured_tokens_per_s, 100.0 * r.chosen_over_best_tokens_per_s);
  out += std::isnan(r.kendall_tau)
             ? "; Kendall tau n/a (fewer than two runs)"
             : fmt::format("; predicted vs measured order: Kendall tau-b {:.2f}", r.kendall_tau);
  if (r.parent_run_id >= 0) out += fmt::format("\nlogged to {} (refine run {})", r.db_path, r.parent_run_id);
  return out + "\n";
}

nlohmann::json refine_to_json(const RefineResult& r, int L) {
  nlohmann::json j;
  j["chosen"] = r.chosen;
  j["kendall_tau"] = std::isnan(r.kendall_tau) ? nlohmann::json(nullptr) : nlohmann::json(r.kendall_tau);
  j["chosen_over_best_tokens_per_s"] = r.chosen_over_best_tokens_per_s;
  if (r.parent_run_id >= 0) j["parent_run_id"] = r.parent_run_id, j["db"] = r.db_path;
  j["runs"] = nlohmann::json::array();
  for (const RefinedRun& x : r.runs) {
    nlohmann::json e;
    e["predicted_rank"] = x.predicted_rank;
    e["plan"] = candidate_summary(x.plan, L);
    e["predicted_step_s"] = x.predicted_step_s;
    if (x.failed.empty()) {
      e["measured_step_s"] = x.measured_step_s;
      e["measured_tokens_per_s"] = x.measured_tokens_per_s;
      e["step_wall_s"] = x.step_wall_s;
      e["run_ids"] = x.run_ids;
    } else {
      e["failed"] = x.failed;
    }
    j["runs"].push_back(e);
  }
  return j;
}

}  // namespace slidedp::planner
