// The host updater; see updater.h for the contract. One thread takes jobs in arrival order and runs
// each over the thread pool; bookkeeping happens under mutex_, kernel work outside it.
#include "executor/updater.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "card/shard_range.h"
#include "common/error.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::exec {

Updater::Updater(HostState& state, std::vector<StagingRing*> rings, ThreadPool& pool, RunControl& control,
                 const UpdaterConfig& config)
    : state_(state),
      rings_(std::move(rings)),
      pool_(pool),
      control_(control),
      config_(config),
      verify_(!config.device_optimizer && (needs_update_after_backward(config.optimizer) ||
                                           config.update_after_backward || config.verify_updates)) {
  SLIDEDP_CHECK(static_cast<int>(rings_.size()) == config.ranks, "one staging ring per rank");
  SLIDEDP_CHECK(config.no_decay_ranges.empty() || static_cast<int>(config.no_decay_ranges.size()) == state.num_units(),
                "no-decay ranges: one list per unit");
  skipped_steps_.store(config.skipped_steps_before);
  SLIDEDP_CHECK(!config.serial_accumulation || (verify_ && config.route == GradRoute::kCpu),
                "serial accumulation is MegaTrain's: the cpu route with the update after the backward");
  // Accumulation jobs per chunk and micro-step: one per rank's shard (gpu route) or per rank (serial).
  const int64_t per_chunk = config.route == GradRoute::kGpu || config.serial_accumulation ? config.ranks : 1;
  for (int u = 0; u < state.num_units(); ++u) expected_chunks_ += state.unit(u).chunks;
  expected_accumulations_ = expected_chunks_ * config.accum_steps * per_chunk;
  if (config.tied) expected_accumulations_ += state.unit(0).chunks * config.accum_steps * per_chunk;
  SLIDEDP_CHECK(!config.device_optimizer || (config.optimizer.clip_grad_norm <= 0 &&
                                              config.optimizer.on_nonfinite == NonFinitePolicy::kAbort),
                "the device optimizer neither clips nor skips");
  if (config.device_optimizer) expected_chunks_ = expected_accumulations_ = 0;
  if (verify_ && !config.norm_pass_after_backward) {
    std::vector<int64_t> held, writes;
    for (int u = 0; u < state.num_units(); ++u) {
      held.push_back(state.unit(u).own_numel);
      const int parts = config.tied && u == 0 ? 2 : 1;  // the tied head adds into the embedding's
      writes.push_back(int64_t{config.accum_steps} * parts * (config.serial_accumulation ? config.ranks : 1));
    }
    norm_.emplace(held, writes);
  }
  if (config.link) {
    SLIDEDP_CHECK((config.route == GradRoute::kCpu || config.sharded_state) && !config.serial_accumulation &&
                      !config.device_optimizer && !config.pacing,
                  "multi-node: SlideDP's placement, unpaced; the gpu route with a sharded state");
    nodes_ = config.link->nodes();
    node_ = config.link->node();
    std::vector<int64_t> chunks;
    for (int u = 0; u < state.num_units(); ++u) chunks.push_back(state.unit(u).chunks);
    tags_.emplace(std::move(chunks), config.accum_steps);
    if (tags_->max_tag() >= config.link->backend_tag_base())
      throw InputError("plan: chunk_numel",
                       fmt::format("{} chunks x {} micro-steps need more MPI tags than this MPI has ({}): use larger chunks",
                                   expected_chunks_, config.accum_steps, config.link->max_tag()));
    waker_ = std::make_shared<UpdaterWaker>([this] {
      { std::lock_guard<std::mutex> lock(mutex_); }
      cv_.notify_all();
    });
  }
  thread_ = std::thread([this] { loop(); });
}

Updater::~Updater() {
  if (waker_) waker_->detach();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Updater::begin_step(int64_t step, double lr) {
  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_[step];
  info.lr = lr;
  info.chunks_left = expected_chunks_;
  info.accumulations_left = expected_accumulations_;
  info.outcome.step = step;
  if (nodes_ > 1) {
    // Every other node's losses of this step, posted before any can be sent.
    const size_t n = static_cast<size_t>(2 * config_.ranks * config_.accum_steps);
    for (int p = 0; p < nodes_; ++p) {
      if (p == node_) continue;
      // Owned by the transfer too: it may complete after an aborted run dropped the step.
      auto l = std::make_shared<std::vector<double>>(n, 0.0);
      config_.link->recv(p, tags_->tag(CrossNodeKind::kLoss, step, 0, 0, 0, 0), reinterpret_cast<std::byte*>(l->data()),
                         static_cast<int64_t>(n * 8), fmt::format("the losses of step {}", step + 1),
                         [this, step, p, l, w = waker_] { w->call([&] { take_remote_losses(step, p, *l); }); });
    }
  }
  if (info.loss_sums.empty()) {
    const size_t slots = static_cast<size_t>(nodes_ * config_.ranks * config_.accum_steps);
    info.loss_sums.assign(slots, 0.0), info.counts.assign(slots, 0.0);
  }
}

void Updater::allow_updates_through(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  allowed_step_ = std::max(allowed_step_, step);
  if (nodes_ > 1)
    for (auto& [s, info] : steps_)
      if (s <= allowed_step_ && info.local_losses == config_.ranks * config_.accum_steps) post_losses(s);
  cv_.notify_all();
}

void Updater::take_remote_losses(int64_t step, int node, const std::vector<double>& l) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = steps_.find(step);
  if (found == steps_.end()) return;
  StepInfo& info = found->second;
  for (int m = 0; m < config_.accum_steps; ++m)
    for (int r = 0; r < config_.ranks; ++r) {
      const size_t i = static_cast<size_t>(m * config_.ranks + r);
      const size_t g = static_cast<size_t>(m * nodes_ * config_.ranks + node * config_.ranks + r);
      info.loss_sums[g] = l[2 * i];
      info.counts[g] = l[2 * i + 1];
      if (!std::isfinite(l[2 * i]) && info.loss_finite) {
        info.loss_finite = false;
        info.outcome.skipped_reason = fmt::format("non-finite loss ({}) on rank {} of node {}", l[2 * i], r, node);
      }
    }
  info.losses += config_.ranks * config_.accum_steps;
}

void Updater::report_loss(int64_t step, int micro, int rank, double loss_sum, double count) {
  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(step);
  ++info.losses;
  ++info.local_losses;
  // Global rank order (node j's ranks follow node j-1's): the step's loss sums as one node's would.
  const size_t i = static_cast<size_t>(micro * nodes_ * config_.ranks + node_ * config_.ranks + rank);
  info.loss_sums[i] = loss_sum;
  info.counts[i] = count;
  if (!std::isfinite(loss_sum)) {
    info.loss_finite = false;
    if (info.outcome.skipped_reason.empty())
      info.outcome.skipped_reason = nodes_ > 1 ? fmt::format("non-finite loss ({}) on rank {} of node {}", loss_sum, rank, node_)
                                               : fmt::format("non-finite loss ({}) on rank {}", loss_sum, rank);
  }
  if (nodes_ > 1 && info.local_losses == config_.ranks * config_.accum_steps && allowed_step_ >= step) post_losses(step);
  if (config_.device_optimizer) finish_device_step(info, step);
  cv_.notify_all();
}

void Updater::device_step_done(int64_t step, int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  SLIDEDP_CHECK(config_.device_optimizer, "device_step_done without the device optimizer");
  StepInfo& info = steps_.at(step);
  ++info.devices_done;
  (void)rank;
  finish_device_step(info, step);
  cv_.notify_all();
}

void Updater::device_grads_nonfinite(int64_t step, int rank, uint32_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(step);
  if (info.loss_finite) {
    info.loss_finite = false;
    info.outcome.skipped_reason =
        fmt::format("non-finite gradient ({} element{} of rank {}'s shard)", count, count == 1 ? "" : "s", rank);
  }
}

void Updater::finish_device_step(StepInfo& info, int64_t step) {
  if (info.devices_done < config_.ranks || info.losses < config_.ranks * config_.accum_steps) return;
  // The devices have updated already: a non-finite loss cannot be skipped any more, only reported.
  if (!info.loss_finite)
    control_.fail(std::make_exception_ptr(NumericError(fmt::format("step {}: {}; stopping", step + 1,
                                                                   info.outcome.skipped_reason))));
  info.done = true;
}

kernels::AdamwHyper Updater::step_hyper(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  return hyper(step, steps_.at(step).lr, 1.0);
}

void Updater::for_decay_ranges(int unit, int64_t b, int64_t e, const kernels::AdamwHyper& h,
                               const std::function<void(int64_t, int64_t, const kernels::AdamwHyper&)>& fn) const {
  by_decay(unit, b, e, h, fn);
}

void Updater::arrive(const ChunkArrival& a) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = steps_.find(a.step);
  SLIDEDP_CHECK(it != steps_.end(), "gradient of step " + std::to_string(a.step) + " before begin_step");
  StepInfo& info = it->second;
  const bool last_micro = a.micro == config_.accum_steps - 1;
  auto make_job = [&](std::vector<ChunkArrival> parts, int written_rank) {
    Job job;
    job.step = a.step;
    job.micro = a.micro;
    job.part = a.part;
    job.unit = a.unit;
    job.chunk = a.chunk;
    job.begin = a.begin;
    job.end = a.end;
    job.parts = std::move(parts);
    job.lr = info.lr;
    const bool update = a.part == GradPart::kOwn && last_micro && !verify_;
    job.kind = update ? Job::kUpdate : Job::kAccumulate;
    // The chunk (or shard) accumulator is overwritten by its first contribution of the step.
    int& written = info.written[{a.unit, a.chunk * (config_.ranks + 1) + written_rank + 1}];
    job.first_write = written == 0;
    job.order = written;
    ++written;
    if (nodes_ > 1 && config_.route == GradRoute::kCpu) expect_cross(job);
    if (nodes_ > 1 && config_.route == GradRoute::kGpu && update) {
      // The reduce-scatter spanned every node: this shard is summed already. The chunk's other
      // nodes' updated mirror parts may land once its first shard is here (every rank of every node
      // has computed this unit's gradient, so no delivery of it for this step is left).
      auto& x = info.mirror_in[{a.unit, a.chunk}];
      if (!x) x = std::make_shared<CrossNodeSum>(), expect_mirror(job, x);
    }
    jobs_.push_back(std::move(job));
  };
  if (config_.route == GradRoute::kGpu) {
    make_job({a}, a.rank);  // a reduced shard: independent of the other ranks' shards
  } else if (config_.serial_accumulation) {
    // One job per rank, queued in rank order (the single updater thread runs them in queue order):
    // rank r's gradient is added once ranks 0..r-1 have been queued, whatever order they landed in.
    const auto key = std::make_tuple(a.micro, a.unit, a.chunk, static_cast<int>(a.part));
    auto& parts = info.pending[key];
    parts.push_back(a);
    int& next = info.serial_next[key];
    for (bool found = true; found && next < config_.ranks;) {
      found = false;
      for (auto p = parts.begin(); p != parts.end(); ++p)
        if (p->rank == next) {
          make_job({*p}, -1);  // every rank adds into the one accumulator
          parts.erase(p);
          ++next, found = true;
          break;
        }
    }
    if (next == config_.ranks) info.pending.erase(key), info.serial_next.erase(key);
  } else {
    auto& parts = info.pending[{a.micro, a.unit, a.chunk, static_cast<int>(a.part)}];
    parts.push_back(a);
    if (static_cast<int>(parts.size()) < config_.ranks) return;
    std::vector<ChunkArrival> all = std::move(parts);
    info.pending.erase({a.micro, a.unit, a.chunk, static_cast<int>(a.part)});
    std::sort(all.begin(), all.end(), [](const ChunkArrival& x, const ChunkArrival& y) { return x.rank < y.rank; });
    make_job(std::move(all), -1);
  }
  cv_.notify_all();
}

StepOutcome Updater::wait_step(int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  control_.wait(lock, cv_, [&] { return steps_.at(step).done; });
  StepInfo& info = steps_.at(step);
  StepOutcome out = info.outcome;
  for (size_t i = 0; i < info.loss_sums.size(); ++i) {
    out.loss_sum += info.loss_sums[i];
    out.target_count += info.counts[i];
  }
  steps_.erase(step);
  return out;
}

void Updater::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // The first job whose prerequisites hold. Accumulations are always ready; an update waits for
      // the checkpoint gate and every rank's loss of its step, and must never block the queue: the
      // accumulations it waits behind may be what frees the staging slots other ranks need.
      auto ready = [&] {
        for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
          if (job_ready(*it)) return it;
        return jobs_.end();
      };
      auto it = jobs_.end();
      cv_.wait_for(lock, RunControl::kPollInterval, [&] { return stop_ || (it = ready()) != jobs_.end(); });
      if (stop_) return;
      if (it == jobs_.end() || control_.aborted()) continue;
      job = std::move(*it);
      jobs_.erase(it);
      ++running_;
    }
    try {
      run_job(job);
    } catch (const Aborted&) {
    } catch (...) {
      control_.fail(std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --running_;
    }
    cv_.notify_all();
  }
}

void Updater::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  control_.wait(lock, cv_, [&] { return running_ == 0; });
}

bool Updater::job_ready(const Job& job) const {
  auto info = steps_.find(job.step);
  const bool losses = info != steps_.end() && info->second.losses >= nodes_ * config_.ranks * config_.accum_steps;
  const bool gate = allowed_step_ >= job.step && losses;
  if (job.kind == Job::kVerifyPass) return gate;  // it updates: behind the checkpoint gate
  if (!job.cross) return job.kind == Job::kAccumulate || gate;
  switch (job.stage) {
    // Behind the checkpoint gate too, so that nodes stopping after step s never leave a transfer of
    // step s+1 on the wire (only receives, which the link cancels).
    case Job::kChain: return (node_ == 0 || job.cross->partial_in.load()) && allowed_step_ >= job.step;
    case Job::kApply: {
      // Contributions to one accumulator apply in the order they were made (as on one node).
      auto a = info->second.applied.find({job.unit, job.chunk * (config_.ranks + 1)});
      const int applied = a == info->second.applied.end() ? 0 : a->second;
      return job.cross->result_in.load() && applied == job.order && (job.kind == Job::kAccumulate || gate);
    }
    case Job::kAwaitMirror: return job.cross->mirror_shards_in.load() == nodes_ - 1;
  }
  return false;
}

kernels::AdamwHyper Updater::hyper(int64_t step, double lr, double clip_coef) const {
  kernels::AdamwHyper h;
  h.lr = lr;
  h.beta1 = config_.optimizer.beta1;
  h.beta2 = config_.optimizer.beta2;
  h.eps = config_.optimizer.eps;
  h.weight_decay = config_.optimizer.weight_decay;
  // Bias correction counts the updates applied to the state: a skipped step applied none. Skips
  // happen only in verify mode, where step s's verify pass runs after step s-1's has finished (its
  // deliveries wait for every chunk of s-1), so the count is final whenever this is read.
  h.step = step + 1 - skipped_steps_.load();
  h.grad_scale = 1.0;  // the head already scaled the loss gradient by 1 / global unmasked targets
  h.clip_coef = clip_coef;
  return h;
}

// A job's flow on the target's CPU threads and host memory, begun when the job starts; the job holds
// its results (ring slots, chunk counters) until the flow ends (hold_paced), as the target's slower
// update would. -1 without pacing.
int Updater::begin_paced(const Job& job) const {
  if (!config_.pacing) return -1;
  const ChunkArrival& a = job.parts.front();
  // A job of one rank's gradient (serial accumulation) is that rank's share of the unit's host work.
  const double rank_share = config_.serial_accumulation ? 1.0 / config_.ranks : 1.0;
  // The step's last contribution to a chunk: the fused update, or in verify mode the accumulation
  // whose blocks' squares are summed (the step model's cpu_last_* of the unit).
  const bool last = job.kind == Job::kUpdate ||
                    (verify_ && job.micro == config_.accum_steps - 1 && job.part == GradPart::kOwn);
  const PacedWork p = config_.pacing->update(job.unit, a.end - a.begin, last, rank_share);
  return config_.pacing->pacer().begin(p.usages, p.work, p.delay_s);
}

void Updater::hold_paced(int flow) const {
  if (flow >= 0) config_.pacing->pacer().finish(flow);
}

template <class Fn>
void Updater::by_decay(int unit, int64_t b, int64_t e, const kernels::AdamwHyper& h, Fn&& fn) const {
  if (config_.no_decay_ranges.empty()) return fn(b, e, h);
  kernels::AdamwHyper none = h;
  none.weight_decay = 0.0;
  for_each_decay_piece(config_.no_decay_ranges[static_cast<size_t>(unit)], b, e,
                       [&](int64_t pb, int64_t pe, bool decays) { fn(pb, pe, decays ? h : none); });
}

void Updater::run_job(Job& job) {
  const double start = config_.clock ? config_.clock() : 0.0;
  const char* what = "";
  bool next_stage = false;  // multi-node: back into the queue for its next stage
  if (job.cross && job.stage == Job::kChain) {
    chain(job), what = "chain sum", next_stage = true;
  } else if (job.cross && job.stage == Job::kApply) {
    what = job.kind == Job::kUpdate ? "adamw" : "reduce";
    next_stage = apply_cross(job);
  } else if (job.cross) {
    std::lock_guard<std::mutex> lock(mutex_);
    finish_chunk(steps_.at(job.step), job.unit, job.chunk, job.step);  // every node's mirror shard is here
    return;
  } else {
    switch (job.kind) {
      case Job::kAccumulate: accumulate(job), what = "reduce"; break;
      case Job::kUpdate: update(job), what = "adamw"; break;
      case Job::kVerifyPass: verify_pass(job.step), what = "verify+adamw"; break;
    }
  }
  if (config_.on_job)
    config_.on_job(what, job.unit, job.chunk, job.step, start,
                   job.done_s >= 0 ? job.done_s : config_.clock ? config_.clock() : 0.0);
  if (next_stage) {
    job.done_s = -1;
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
}


Updater::GradInput Updater::ring_input(const Job& job) const {
  GradInput in;
  in.dtype = job.parts.front().dtype;
  for (const auto& a : job.parts) in.slots.push_back(a.data);
  in.begin = job.parts.front().begin;
  in.end = job.parts.front().end;
  return in;
}

void Updater::release_slots(const Job& job) {
  for (const auto& a : job.parts) rings_[static_cast<size_t>(a.rank)]->release(a.slot);
}

void Updater::accumulate(Job& job) {
  const int flow = begin_paced(job);
  accumulate_input(job, ring_input(job));
  hold_paced(flow);
  if (config_.clock) job.done_s = config_.clock();
  release_slots(job);
  accumulated(job.step);
}

void Updater::accumulate_input(Job& job, const GradInput& in) {
  const int64_t n = in.end - in.begin;
  float* acc = state_.unit(job.unit).accum_f32();
  SLIDEDP_CHECK(acc != nullptr, "unit " + std::to_string(job.unit) + " has no gradient accumulator");
  acc += state_.unit(job.unit).local(in.begin);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ptrs;
    for (const std::byte* p : in.slots) ptrs.push_back(reinterpret_cast<const T*>(p));
    if (job.first_write) {
      kernels::GradSlots<T> slots{std::span<const T* const>(ptrs), 1.0f, nullptr};
      kernels::reduce_grads(pool_, slots, acc, 0, n);
    } else {
      pool_.parallel_for_range(0, n, kernels::kTileNumel, [&](int64_t tb, int64_t te) {
        kernels::reduce_grads_accumulate(std::span<const T* const>(ptrs), 1.0f, acc, tb, te);
      });
    }
  };
  if (in.dtype == DType::kBF16) run(bf16_bits{});
  else run(float{});
  if (norm_) {
    const int64_t lb = state_.unit(job.unit).local(in.begin);
    norm_->added(pool_, job.unit, state_.unit(job.unit).accum_f32(), lb, lb + n);
  }
}

void Updater::accumulated(int64_t step) {
  if (!verify_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(step);
  if (--info.accumulations_left == 0) {
    Job v;
    v.kind = Job::kVerifyPass;
    v.step = step;
    jobs_.push_front(std::move(v));  // nothing else of this step can be pending
    cv_.notify_all();
  }
}

void Updater::update(Job& job) {
  const int flow = begin_paced(job);
  update_input(job, ring_input(job));
  hold_paced(flow);
  if (config_.clock) job.done_s = config_.clock();
  release_slots(job);

  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(job.step);
  if (config_.route == GradRoute::kGpu) {
    int& done = info.shards_done[{job.unit, job.chunk}];
    if (++done < config_.ranks) return;
  }
  if (nodes_ > 1) {
    // gpu route across nodes: every shard of this node's part is updated; the chunk is released once
    // the other nodes' parts have landed too.
    send_mirror_and_await(job.step, job.micro, job.part, job.unit, job.chunk, info.mirror_in.at({job.unit, job.chunk}));
    return;
  }
  finish_chunk(info, job.unit, job.chunk, job.step);
}

void Updater::update_input(Job& job, const GradInput& in) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const StepInfo& info = steps_.at(job.step);
    if (!info.loss_finite)
      throw NumericError(fmt::format("step {}: {}; stopping (use --on-nonfinite skip to skip such steps)", job.step + 1,
                                     info.outcome.skipped_reason));
  }
  UnitState& u = state_.unit(job.unit);
  const int64_t b = in.begin, n = in.end - in.begin;
  bool has_accum;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int written_rank = config_.route == GradRoute::kGpu ? job.parts.front().rank : -1;
    has_accum = steps_.at(job.step).written[{job.unit, job.chunk * (config_.ranks + 1) + written_rank + 1}] > 1;
  }
  kernels::AdamwState st = state_.adamw_state(job.unit, b);
  const kernels::AdamwHyper h = hyper(job.step, job.lr, 1.0);
  state_.set_rounding_seeds(st, job.unit, h.step);
  const float* acc = has_accum ? u.accum_f32() + u.local(b) : nullptr;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ptrs;
    for (const std::byte* p : in.slots) ptrs.push_back(reinterpret_cast<const T*>(p));
    kernels::GradSlots<T> slots{std::span<const T* const>(ptrs), 1.0f, acc};
    if (config_.optimizer.check_grads) {
      const double ss = kernels::reduce_grads_sum_squares(pool_, slots, 0, n);
      if (!std::isfinite(ss))
        throw NumericError(fmt::format("step {}: non-finite gradient in unit {} chunk {} (elements {}..{}); stopping "
                                       "(use --on-nonfinite skip to skip such steps)",
                                       job.step + 1, job.unit, job.chunk, b, b + n));
    }
    // Pieces are offsets into the chunk (the slots and the state pointers start at element b).
    by_decay(job.unit, b, b + n, h, [&](int64_t pb, int64_t pe, const kernels::AdamwHyper& ph) {
      state_.for_each_update_piece(job.unit, b, st, pb, pe,
                                   [&](int64_t qb, int64_t qe, const kernels::AdamwState& qs) {
                                     kernels::reduce_adamw_update(pool_, qs, slots, ph, qb - b, qe - b);
                                   });
    });
  };
  if (in.dtype == DType::kBF16) run(bf16_bits{});
  else run(float{});
  state_.write_fp32_mirror(job.unit, b, n);
}

ShardRange Updater::own_range(int64_t n) const {
  return state_.node_part(n, node_);
}

// Posts this job's receives (under mutex_, when its local gradients are complete): the partial sum
// from the previous node, the result from the last, and for a sharded update the other nodes'
// updated mirror shards -- safe to land now, as every local delivery of this chunk for this step
// has been done (its gradients exist).
void Updater::expect_cross(Job& job) {
  auto x = std::make_shared<CrossNodeSum>();
  job.cross = x;
  const int64_t n = job.end - job.begin;
  const int part = static_cast<int>(job.part);
  auto tag = [&](CrossNodeKind k) { return tags_->tag(k, job.step, job.micro, part, job.unit, job.chunk); };
  const std::string key = fmt::format("unit {} chunk {} (micro-step {}{}) of step {}", job.unit, job.chunk, job.micro,
                                      job.part == GradPart::kTiedHead ? ", tied head" : "", job.step + 1);
  x->partial.resize(static_cast<size_t>(n));
  if (node_ > 0)
    config_.link->recv(node_ - 1, tag(CrossNodeKind::kPartial), reinterpret_cast<std::byte*>(x->partial.data()), n * 4,
                       "the partial gradient sum of " + key, [x, w = waker_] { w->call([&] { x->partial_in = true; }); });
  if (node_ < nodes_ - 1) {
    // Sharded: this node's shard, from the last node. Replicated: the whole sum travels on along the
    // chain (last node -> 0 -> 1 -> ... -> M-2), each node forwarding it once, so every node's
    // network carries about what a ring all-reduce's would, 8 bytes per parameter.
    const bool forward = !config_.sharded_state && node_ < nodes_ - 2;
    const int from = config_.sharded_state || node_ == 0 ? nodes_ - 1 : node_ - 1;
    x->result.resize(static_cast<size_t>(own_range(n).size()));
    config_.link->recv(from, tag(CrossNodeKind::kResult), reinterpret_cast<std::byte*>(x->result.data()),
                       own_range(n).size() * 4, "the gradient sum of " + key,
                       [this, x, forward, n, t = tag(CrossNodeKind::kResult), key, w = waker_] {
                         w->call([&] {
                           if (forward)
                             config_.link->send(node_ + 1, t, reinterpret_cast<const std::byte*>(x->result.data()), n * 4,
                                                "the gradient sum of " + key, [x] {});
                           x->result_in = true;
                         });
                       });
  }
  if (config_.sharded_state && job.kind == Job::kUpdate) expect_mirror(job, x);
}

// The other nodes' updated mirror parts of the job's chunk, straight into the mirror.
void Updater::expect_mirror(const Job& job, const std::shared_ptr<CrossNodeSum>& x) {
  const auto [b, e] = state_.chunk_range(job.unit, job.chunk);
  UnitState& u = state_.unit(job.unit);
  const int64_t eb = dtype_bytes(state_.mirror_dtype());
  const int64_t tag = tags_->tag(CrossNodeKind::kMirror, job.step, job.micro, static_cast<int>(job.part), job.unit, job.chunk);
  const std::string what = fmt::format("the updated weights of unit {} chunk {} of step {}", job.unit, job.chunk, job.step + 1);
  for (int p = 0; p < nodes_; ++p) {
    if (p == node_) continue;
    const ShardRange s = state_.node_part(e - b, p);
    config_.link->recv(p, tag, u.mirror.ptr + (b + s.begin) * eb, s.size() * eb, what,
                       [x, w = waker_] { w->call([&] { x->mirror_shards_in.fetch_add(1); }); });
  }
}

// Sends this node's updated part of a chunk and queues the job that releases the chunk once the
// other nodes' parts (counted in x) have landed. Under mutex_.
void Updater::send_mirror_and_await(int64_t step, int micro, GradPart part, int unit, int64_t chunk,
                                    std::shared_ptr<CrossNodeSum> x) {
  Job await;
  await.step = step, await.micro = micro, await.part = part, await.unit = unit, await.chunk = chunk;
  await.kind = Job::kUpdate;
  await.stage = Job::kAwaitMirror;
  await.cross = std::move(x);
  send_mirror(await);
  jobs_.push_back(std::move(await));
  cv_.notify_all();
}

// This node's updated part of the job's chunk to every other node.
void Updater::send_mirror(const Job& job) {
  const auto [b, e] = state_.chunk_range(job.unit, job.chunk);
  const ShardRange own = own_range(e - b);
  const UnitState& u = state_.unit(job.unit);
  const int64_t eb = dtype_bytes(state_.mirror_dtype());
  for (int p = 0; p < nodes_; ++p) {
    if (p == node_) continue;
    config_.link->send(p, tags_->tag(CrossNodeKind::kMirror, job.step, job.micro, static_cast<int>(job.part), job.unit, job.chunk),
                       u.mirror.ptr + (b + own.begin) * eb, own.size() * eb,
                       fmt::format("the updated weights of unit {} chunk {} of step {}", job.unit, job.chunk, job.step + 1),
                       [keep = job.cross] {});
  }
}

void Updater::chain(Job& job) {
  CrossNodeSum& x = *job.cross;
  const int64_t n = job.end - job.begin;
  const GradInput in = ring_input(job);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ptrs;
    for (const std::byte* p : in.slots) ptrs.push_back(reinterpret_cast<const T*>(p));
    if (node_ == 0) {
      kernels::GradSlots<T> slots{std::span<const T* const>(ptrs), 1.0f, nullptr};
      kernels::reduce_grads(pool_, slots, x.partial.data(), 0, n);
    } else {
      add_slots_in_order(pool_, std::span<const T* const>(ptrs), x.partial.data(), n);
    }
  };
  if (in.dtype == DType::kBF16) run(bf16_bits{});
  else run(float{});
  if (config_.clock) job.done_s = config_.clock();
  release_slots(job);
  job.parts.clear();

  const int part = static_cast<int>(job.part);
  auto bytes = [&](int64_t k) { return reinterpret_cast<const std::byte*>(x.partial.data() + k); };
  const std::string key = fmt::format("unit {} chunk {} of step {}", job.unit, job.chunk, job.step + 1);
  if (node_ < nodes_ - 1) {
    config_.link->send(node_ + 1, tags_->tag(CrossNodeKind::kPartial, job.step, job.micro, part, job.unit, job.chunk),
                       bytes(0), n * 4, "the partial gradient sum of " + key, [keep = job.cross] {});
  } else {
    // The last node holds the sum: node 0 gets it whole (to pass on), or every node its shard.
    for (int p = 0; p < (config_.sharded_state ? nodes_ - 1 : 1); ++p) {
      const ShardRange s = state_.node_part(n, p);
      config_.link->send(p, tags_->tag(CrossNodeKind::kResult, job.step, job.micro, part, job.unit, job.chunk),
                         bytes(s.begin), s.size() * 4, "the gradient sum of " + key, [keep = job.cross] {});
    }
    x.result_in = true;
  }
  job.stage = Job::kApply;
}

bool Updater::apply_cross(Job& job) {
  CrossNodeSum& x = *job.cross;
  const int64_t n = job.end - job.begin;
  const ShardRange own = own_range(n);
  GradInput in;
  in.dtype = DType::kF32;
  in.slots = {reinterpret_cast<const std::byte*>(node_ == nodes_ - 1 ? x.partial.data() + own.begin : x.result.data())};
  in.begin = job.begin + own.begin;
  in.end = job.begin + own.end;
  if (job.kind == Job::kAccumulate) {
    accumulate_input(job, in);
  } else {
    update_input(job, in);
  }
  if (config_.clock) job.done_s = config_.clock();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++steps_.at(job.step).applied[{job.unit, job.chunk * (config_.ranks + 1)}];
    cv_.notify_all();
  }
  if (job.kind == Job::kAccumulate) {
    accumulated(job.step);
    return false;
  }
  if (!config_.sharded_state) {
    std::lock_guard<std::mutex> lock(mutex_);
    finish_chunk(steps_.at(job.step), job.unit, job.chunk, job.step);
    return false;
  }
  // Sharded: this node's updated mirror shard to every other node; the chunk is released once theirs
  // have landed here too.
  send_mirror(job);
  job.stage = Job::kAwaitMirror;
  return true;
}

void Updater::post_losses(int64_t step) {
  StepInfo& info = steps_.at(step);
  if (info.losses_posted) return;
  info.losses_posted = true;
  auto mine = std::make_shared<std::vector<double>>();
  for (int m = 0; m < config_.accum_steps; ++m)
    for (int r = 0; r < config_.ranks; ++r) {
      const size_t g = static_cast<size_t>(m * nodes_ * config_.ranks + node_ * config_.ranks + r);
      mine->push_back(info.loss_sums[g]);
      mine->push_back(info.counts[g]);
    }
  for (int p = 0; p < nodes_; ++p)
    if (p != node_)
      config_.link->send(p, tags_->tag(CrossNodeKind::kLoss, step, 0, 0, 0, 0),
                         reinterpret_cast<const std::byte*>(mine->data()), static_cast<int64_t>(mine->size() * 8),
                         fmt::format("the losses of step {}", step + 1), [mine] {});
}

void Updater::finish_chunk(StepInfo& info, int unit, int64_t chunk, int64_t step) {
  state_.unit(unit).updated[static_cast<size_t>(chunk)]->advance_to(static_cast<uint64_t>(step + 1));
  if (--info.chunks_left == 0) {
    info.done = true;
    cv_.notify_all();
  }
}

void Updater::verify_pass(int64_t step) {
  // Global gradient norm over every unit's accumulated gradient (deterministic order). A sharded
  // state's nodes each hold a part: they exchange their sums and add them in node order.
  double sumsq = 0;
  if (norm_) {
    sumsq = norm_->take_sum();
  } else {
    for (int u = 0; u < state_.num_units(); ++u)
      sumsq += kernels::sum_squares(pool_, state_.unit(u).accum_f32(), state_.unit(u).own_numel);
  }
  if (config_.sharded_state) sumsq = sum_over_nodes(step, sumsq);
  bool finite;
  std::string reason;
  double lr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    StepInfo& info = steps_.at(step);
    lr = info.lr;
    info.outcome.grad_norm = std::sqrt(sumsq);
    finite = info.loss_finite && std::isfinite(sumsq);
    if (!std::isfinite(sumsq) && info.outcome.skipped_reason.empty()) info.outcome.skipped_reason = "non-finite gradient";
    reason = info.outcome.skipped_reason;
  }
  if (!finite) {
    if (config_.optimizer.on_nonfinite == NonFinitePolicy::kAbort)
      throw NumericError(fmt::format("step {}: {}; stopping", step + 1, reason));
    // Skip: the state is untouched; release the next step's deliveries all the same.
    std::lock_guard<std::mutex> lock(mutex_);
    StepInfo& info = steps_.at(step);
    info.outcome.skipped = true;
    skipped_steps_.fetch_add(1);  // before any chunk is released: the next step's updates see it
    for (int u = 0; u < state_.num_units(); ++u)
      for (int64_t k = 0; k < state_.unit(u).chunks; ++k) finish_chunk(info, u, k, step);
    return;
  }
  const double clip = config_.optimizer.clip_grad_norm > 0
                          ? kernels::adamw_clip_coef(sumsq, config_.optimizer.clip_grad_norm)
                          : 1.0;
  const kernels::AdamwHyper h = hyper(step, lr, clip);
  // Unit 0 first: the next step's forward needs it first.
  for (int u = 0; u < state_.num_units(); ++u) {
    UnitState& s = state_.unit(u);
    for (int64_t k = 0; k < s.chunks; ++k) {
      // Plain variables, not a structured binding: the lambda below captures b (clang before 16 cannot).
      const auto [chunk_begin, chunk_end] = state_.chunk_range(u, k);
      const int64_t b = chunk_begin, e = chunk_end;
      // Paced: this chunk's share of the target's update after the backward.
      int flow = -1;
      if (config_.pacing) {
        const PacedWork p = config_.pacing->post_backward_update();
        const double share = static_cast<double>(e - b) / static_cast<double>(state_.total_numel());
        flow = config_.pacing->pacer().begin(p.usages, p.work * share, 0.0);
      }
      // This node's part of the chunk (the whole chunk unless sharded across nodes).
      const ShardRange own = state_.node_part(e - b, node_);
      const int64_t ob = b + own.begin, oe = b + own.end;
      kernels::AdamwState st = state_.adamw_state(u, ob);
      state_.set_rounding_seeds(st, u, h.step);
      by_decay(u, ob, oe, h, [&](int64_t pb, int64_t pe, const kernels::AdamwHyper& ph) {
        state_.for_each_update_piece(
            u, ob, st, pb, pe, [&](int64_t qb, int64_t qe, const kernels::AdamwState& qs) {
              kernels::adamw_update(pool_, qs, s.accum_f32() + s.local(ob), ph, qb - ob, qe - ob);
            });
      });
      state_.write_fp32_mirror(u, ob, oe - ob);
      hold_paced(flow);
      std::lock_guard<std::mutex> lock(mutex_);
      if (!config_.sharded_state) {
        finish_chunk(steps_.at(step), u, k, step);
        continue;
      }
      // Sharded: the updated part to every other node; the chunk is released once theirs are here.
      auto x = std::make_shared<CrossNodeSum>();
      Job key;
      key.step = step, key.micro = config_.accum_steps - 1, key.unit = u, key.chunk = k;
      expect_mirror(key, x);
      send_mirror_and_await(step, config_.accum_steps - 1, GradPart::kOwn, u, k, x);
    }
  }
}

double Updater::sum_over_nodes(int64_t step, double mine) {
  const std::vector<std::byte> all = config_.link->all_gather(
      reinterpret_cast<const std::byte*>(&mine), sizeof(double),
      fmt::format("the gradient's sum of squares of step {}", step + 1),
      tags_->tag(CrossNodeKind::kNorm, step, 0, 0, 0, 0), &control_);
  double total = 0;
  for (int p = 0; p < nodes_; ++p) {
    double v;
    std::memcpy(&v, all.data() + p * sizeof(double), sizeof(double));
    total += v;
  }
  return total;
}

}  // namespace slidedp::exec
