#include "executor/step_loop.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "common/intervals.h"
#include "executor/lr_schedule.h"
#include "executor/node_state.h"
#include "executor/state_checkpoint.h"
#include "io/checkpoint.h"

namespace slidedp::exec {
namespace {

// Multi-node: node 0's record of a step gets every node's phase totals and sampled spans, each
// tagged with its node (the run log's phases.node); the other nodes send theirs.
void gather_node_phases(NodeLink& link, TrainStep& rec) {
  nlohmann::json j = {{"t", nlohmann::json::array()}, {"s", nlohmann::json::array()}};
  for (const PhaseTotal& t : rec.totals)
    j["t"].push_back({t.rank.value_or(-1), t.category, t.busy_s, t.count, t.bytes.value_or(-1.0)});
  for (const PhaseSpan& p : rec.spans)
    j["s"].push_back({p.rank.value_or(-1), p.category, p.name, p.unit.value_or(-1), p.chunk.value_or(-1),
                      p.start_s, p.end_s});
  const std::vector<std::string> all = gather_text(link, j.dump(), 0);
  if (link.node() != 0) return;
  for (PhaseTotal& t : rec.totals) t.node = 0;
  for (PhaseSpan& p : rec.spans) p.node = 0;
  auto opt = [](int64_t v) { return v < 0 ? std::nullopt : std::optional<int>(static_cast<int>(v)); };
  for (int n = 1; n < link.nodes(); ++n) {
    const nlohmann::json theirs = nlohmann::json::parse(all[static_cast<size_t>(n)]);
    for (const auto& t : theirs["t"]) {
      const double bytes = t[4];
      rec.totals.push_back(PhaseTotal{rec.step, opt(t[0]), t[1], t[2], t[3], n,
                                      bytes < 0 ? std::nullopt : std::optional<double>(bytes)});
    }
    for (const auto& p : theirs["s"]) {
      const int64_t chunk = p[4];
      rec.spans.push_back(PhaseSpan{rec.step, opt(p[0]), p[1], p[2], opt(p[3]),
                                    chunk < 0 ? std::nullopt : std::optional<int64_t>(chunk), p[5], p[6], n});
    }
  }
}

// Per-rank, per-category busy time (and the copies' bytes) of step `s` (and its spans when sampled) from
// the timeline.
void summarize_step(const std::vector<MeasuredSpan>& spans, int64_t s, bool keep_spans, TrainStep& rec) {
  struct Group {
    std::vector<std::pair<double, double>> intervals;
    double bytes = 0;
  };
  std::map<std::pair<int, std::string>, Group> by;
  double t0 = 1e300;
  for (const MeasuredSpan& sp : spans) {
    if (sp.tag.step != s || sp.tag.eval) continue;  // an evaluation's work is no step's
    Group& g = by[{sp.rank, sp.tag.category}];
    g.intervals.push_back({sp.start_s, sp.end_s});
    g.bytes += sp.bytes;
    t0 = std::min(t0, sp.start_s);
  }
  for (auto& [key, g] : by) {
    PhaseTotal t;
    t.step = s + 1;
    if (key.first >= 0) t.rank = key.first;
    t.category = key.second;
    t.count = static_cast<int64_t>(g.intervals.size());
    t.busy_s = union_length(g.intervals);
    if (t.category == "h2d" || t.category == "d2h") t.bytes = g.bytes;  // copies: their bytes, even 0
    if (key.first <= 0) rec.busy_s[key.second] = t.busy_s;
    if (key.first == 0 && t.bytes) rec.copied_bytes[key.second] = *t.bytes;
    rec.totals.push_back(t);
  }
  if (!keep_spans) return;
  for (const MeasuredSpan& sp : spans) {
    if (sp.tag.step != s || sp.tag.eval) continue;
    PhaseSpan p;
    p.step = s + 1;
    if (sp.rank >= 0) p.rank = sp.rank;
    p.category = sp.tag.category;
    p.name = sp.tag.what;
    if (sp.tag.unit >= 0) p.unit = sp.tag.unit;
    if (sp.tag.chunk >= 0) p.chunk = sp.tag.chunk;
    p.start_s = sp.start_s - t0;
    p.end_s = sp.end_s - t0;
    rec.spans.push_back(p);
  }
}

}  // namespace

void StepPermits::permit(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  permitted_ = std::max(permitted_, step);
  cv_.notify_all();
}

void StepPermits::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  cv_.notify_all();
}

bool StepPermits::wait(int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  control_.wait(lock, cv_, [&] { return permitted_ >= step || finished_; });
  return permitted_ >= step;
}

StepLoop::StepLoop(const StepLoopParts& parts, TrainResult& result)
    : p_(parts),
      result_(result),
      first_(result.start_step),
      last_(result.start_step + parts.options.steps),
      permits_(parts.control) {}

StepLoop::~StepLoop() {
  if (threads_.empty()) return;
  p_.control.fail(std::make_exception_ptr(Aborted{}));
  shutdown();
}

// After which steps the held-out data is evaluated: every eval_every-th and the last.
bool StepLoop::eval_after(int64_t s) const {
  const TrainOptions& o = p_.options;
  return p_.eval_sampler && (s + 1 == last_ || (o.eval_every > 0 && (s + 1) % o.eval_every == 0));
}

// Waits for the evaluation the ranks report as `id`, adds every node's and reports it.
void StepLoop::collect_eval(int64_t after_step, int64_t id) {
  const auto t0 = std::chrono::steady_clock::now();
  EvalLoss e = p_.eval_tally->wait(id);
  if (p_.shape.link) e = sum_over_nodes(*p_.shape.link, e, &p_.control);
  EvalPoint point;
  point.step = after_step;
  point.loss = e.loss();
  point.tokens = static_cast<int64_t>(e.tokens);
  point.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result_.evals.push_back(point);
  if (p_.options.on_eval) p_.options.on_eval(point);
}

void StepLoop::start_rank_threads() {
  for (int r = 0; r < p_.shape.ranks; ++r) {
    threads_.emplace_back([this, r] {
      RankDriver& driver = *p_.drivers[static_cast<size_t>(r)];
      try {
        for (int64_t s = first_; s < last_; ++s) {
          if (!permits_.wait(s)) return;
          driver.issue_step(s);
          if (eval_after(s)) {
            driver.issue_eval(s + 1, s, *p_.eval_sampler, *p_.eval_tally);
            p_.eval_tally->wait_rank(s, r);  // the next step's work starts after the evaluation's
          }
        }
        // No step to run: the evaluation of the starting weights (a model or a checkpoint).
        if (first_ == last_ && p_.eval_sampler) {
          driver.issue_eval(first_, first_ - 1, *p_.eval_sampler, *p_.eval_tally);
          p_.eval_tally->wait_rank(first_ - 1, r);
        }
      } catch (const Aborted&) {
      } catch (...) {
        p_.control.fail(std::current_exception());
      }
    });
  }
}

void StepLoop::announce(int64_t s) {
  p_.updater.begin_step(s, lr_at(p_.options.lr, s + 1));
  permits_.permit(s);
}

void StepLoop::join_ranks() {
  permits_.finish();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void StepLoop::shutdown() {
  if (p_.pacing) p_.pacing->pacer().cancel();  // a paced wait would hold the streams for its whole length
  join_ranks();
  p_.backend.quiesce();
}

TrainStep StepLoop::record(int64_t s, const StepOutcome& out, double wall_s) {
  const TrainOptions& o = p_.options;
  TrainStep rec;
  rec.step = s + 1;
  rec.loss = out.loss();
  rec.tokens = static_cast<int64_t>(out.target_count);
  rec.wall_s = wall_s;
  rec.lr = lr_at(o.lr, s + 1);
  rec.grad_norm = out.grad_norm;
  rec.skipped = out.skipped;
  rec.skipped_reason = out.skipped_reason;
  if (o.trace) {
    std::vector<MeasuredSpan> more = p_.backend.take_spans();
    spans_.insert(spans_.end(), more.begin(), more.end());
    summarize_step(spans_, s, o.sample_spans_every > 0 && (s + 1) % o.sample_spans_every == 0, rec);
  }
  if (p_.shape.link) gather_node_phases(*p_.shape.link, rec);
  return rec;
}

// Written while the gate holds back step s+1's updates: the state is exactly step s's.
void StepLoop::checkpoint(int64_t s, const TrainStep& rec) {
  const TrainOptions& o = p_.options;
  TrainerState ts;
  ts.optimizer_step = s + 1;
  ts.adamw_step = s + 1 - p_.updater.skipped_steps();
  ts.lr_schedule_step = s + 1;
  ts.lr_schedule_json = lr_schedule_to_json(o.lr);
  ts.learning_rate = rec.lr;
  ts.data_cursor = p_.sampler.cursor_at_step(s + 1);
  ts.metadata_json = o.metadata_json;
  ts.optimizer_states = p_.shape.plan.optimizer_states;
  if (p_.shape.sharded_nodes) {
    // Every node writes its part of one folder; none holds the whole state.
    result_.last_checkpoint =
        save_sharded_checkpoint(*p_.shape.link, p_.state, o.card, ts, o.checkpoint_dir, o.keep_checkpoints);
    return;
  }
  if (p_.shape.node != 0) return;
  CheckpointData cd;
  cd.card = o.card;
  // A split master and lossy moments, widened to fp32 while they are written.
  const int U = p_.shape.units;
  std::vector<std::array<std::vector<float>, 3>> widened(static_cast<size_t>(U));
  for (int u = 0; u < U; ++u) {
    auto& w = widened[static_cast<size_t>(u)];
    cd.master.push_back(p_.state.master_values(u, w[0]));
    cd.adam_m.push_back(p_.state.moment_values(u, 0, w[1]));
    cd.adam_v.push_back(p_.state.moment_values(u, 1, w[2]));
  }
  cd.state = ts;
  result_.last_checkpoint = save_checkpoint(o.checkpoint_dir, cd, o.keep_checkpoints);
}

void StepLoop::step_through(const std::function<void(const TrainStep&)>& on_step) {
  const TrainOptions& o = p_.options;
  NodeLink* link = p_.shape.link;
  auto t_prev = std::chrono::steady_clock::now();
  for (int64_t s = first_; s < last_; ++s) {
    if (s + 1 < last_) announce(s + 1);  // drivers may start the next step's forward right away
    const StepOutcome out = p_.updater.wait_step(s);
    const auto t_now = std::chrono::steady_clock::now();
    const TrainStep rec = record(s, out, std::chrono::duration<double>(t_now - t_prev).count());
    t_prev = t_now;
    // The step is reported (and logged by the caller) before its checkpoint is published: a kill
    // between the two then leaves a logged step whose checkpoint is missing (the resume repeats it
    // under a new run), never a checkpoint whose step the log has lost.
    result_.steps.push_back(rec);
    if (on_step) on_step(rec);
    // A stop request ends the run after this step (with a checkpoint when checkpointing).
    bool stop_now = o.stop && o.stop->load() && s + 1 < last_;
    if (link) stop_now = any_node(*link, stop_now);  // every node stops after the same step
    // The run stops cleanly from here (the checkpoint below is written whatever the grace); only an
    // interrupt ends it sooner, once the file being written is complete.
    if (stop_now || s + 1 == last_) p_.interrupts.stop_taken();
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && (s + 1) % o.checkpoint_every == 0) || s + 1 == last_ || stop_now))
      checkpoint(s, rec);
    // The evaluation after this step, once the step is logged and checkpointed (a stop during it
    // loses nothing). The ranks start step s+1 only after it: its time does not include it.
    if (eval_after(s)) {
      collect_eval(s + 1, s);
      t_prev = std::chrono::steady_clock::now();
    }
    if (stop_now) {
      result_.stopped_early = true;  // step s+1 may be in flight; its updates stay behind the gate
      return;
    }
    p_.updater.allow_updates_through(s + 1);
  }
}

void StepLoop::run(const std::function<void(const TrainStep&)>& on_step) {
  start_rank_threads();
  try {
    if (first_ < last_) {
      p_.updater.allow_updates_through(first_);
      announce(first_);
    } else if (p_.eval_sampler) {
      collect_eval(first_, first_ - 1);
    }
    step_through(on_step);
    if (result_.stopped_early) {
      // Step `last` may already be in flight: its updates are held by the gate. Abort it quietly.
      p_.control.fail(std::make_exception_ptr(Aborted{}));
      shutdown();
    } else {
      join_ranks();
      p_.backend.synchronize();
    }
  } catch (const Aborted&) {
    shutdown();
    p_.control.rethrow_if_failed();
    throw RuntimeError("training aborted without a recorded error");
  } catch (...) {
    p_.control.fail(std::current_exception());
    shutdown();
    throw;
  }
  if (!result_.stopped_early) p_.control.rethrow_if_failed();
  if (p_.options.trace) {
    if (!result_.stopped_early)
      p_.updater.wait_idle();  // the last update's span is recorded after its step is done
    std::vector<MeasuredSpan> more = p_.backend.take_spans();
    spans_.insert(spans_.end(), more.begin(), more.end());
    result_.spans = std::move(spans_);
  }
}

}  // namespace slidedp::exec
