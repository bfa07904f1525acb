// The host updater; see updater.h for the contract. One thread takes jobs in arrival order and runs
// each over the thread pool; bookkeeping happens under mutex_, kernel work outside it.
#include "executor/updater.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

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
      verify_(!config.device_optimizer &&
              (config.optimizer.clip_grad_norm > 0 || config.optimizer.on_nonfinite == NonFinitePolicy::kSkip ||
               config.update_after_backward)) {
  SLIDEDP_CHECK(static_cast<int>(rings_.size()) == config.ranks, "one staging ring per rank");
  SLIDEDP_CHECK(config.no_decay_ranges.empty() || static_cast<int>(config.no_decay_ranges.size()) == state.num_units(),
                "no-decay ranges: one list per unit");
  skipped_steps_.store(config.skipped_steps_before);
  SLIDEDP_CHECK(!config.serial_accumulation || (verify_ && config.route == GradRouteKind::kCpu),
                "serial accumulation is MegaTrain's: the cpu route with the update after the backward");
  // Accumulation jobs per chunk and micro-step: one per rank's shard (gpu route) or per rank (serial).
  const int64_t per_chunk = config.route == GradRouteKind::kGpu || config.serial_accumulation ? config.ranks : 1;
  for (int u = 0; u < state.num_units(); ++u) expected_chunks_ += state.unit(u).chunks;
  expected_accumulations_ = expected_chunks_ * config.accum_steps * per_chunk;
  if (config.tied) expected_accumulations_ += state.unit(0).chunks * config.accum_steps * per_chunk;
  SLIDEDP_CHECK(!config.device_optimizer || (config.optimizer.clip_grad_norm <= 0 &&
                                              config.optimizer.on_nonfinite == NonFinitePolicy::kAbort),
                "the device optimizer neither clips nor skips");
  if (config.device_optimizer) expected_chunks_ = expected_accumulations_ = 0;
  thread_ = std::thread([this] { loop(); });
}

Updater::~Updater() {
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
}

void Updater::allow_updates_through(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  allowed_step_ = std::max(allowed_step_, step);
  cv_.notify_all();
}

void Updater::report_loss(int64_t step, int micro, int rank, double loss_sum, double count) {
  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(step);
  ++info.losses;
  const size_t slots = static_cast<size_t>(config_.ranks * config_.accum_steps);
  if (info.loss_sums.empty()) info.loss_sums.assign(slots, 0.0), info.counts.assign(slots, 0.0);
  info.loss_sums[static_cast<size_t>(micro * config_.ranks + rank)] = loss_sum;
  info.counts[static_cast<size_t>(micro * config_.ranks + rank)] = count;
  if (!std::isfinite(loss_sum)) {
    info.loss_finite = false;
    if (info.outcome.skipped_reason.empty())
      info.outcome.skipped_reason = fmt::format("non-finite loss ({}) on rank {}", loss_sum, rank);
  }
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
    job.unit = a.unit;
    job.chunk = a.chunk;
    job.parts = std::move(parts);
    job.lr = info.lr;
    const bool update = a.part == GradPart::kOwn && last_micro && !verify_;
    job.kind = update ? Job::kUpdate : Job::kAccumulate;
    // The chunk (or shard) accumulator is overwritten by its first contribution of the step.
    int& written = info.written[{a.unit, a.chunk * (config_.ranks + 1) + written_rank + 1}];
    job.first_write = written == 0;
    ++written;
    jobs_.push_back(std::move(job));
  };
  if (config_.route == GradRouteKind::kGpu) {
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
        for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
          if (it->kind == Job::kAccumulate) return it;
          auto info = steps_.find(it->step);
          const bool losses = info != steps_.end() && info->second.losses >= config_.ranks * config_.accum_steps;
          if (allowed_step_ >= it->step && losses) return it;
        }
        return jobs_.end();
      };
      auto it = jobs_.end();
      cv_.wait_for(lock, RunControl::kPollInterval, [&] { return stop_ || (it = ready()) != jobs_.end(); });
      if (stop_) return;
      if (it == jobs_.end() || control_.aborted()) continue;
      job = std::move(*it);
      jobs_.erase(it);
    }
    try {
      run_job(job);
    } catch (const Aborted&) {
    } catch (...) {
      control_.fail(std::current_exception());
    }
  }
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
  const PacedWork p = config_.pacing->update(job.unit, a.end - a.begin, job.kind == Job::kUpdate, rank_share);
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
  switch (job.kind) {
    case Job::kAccumulate: accumulate(job), what = "reduce"; break;
    case Job::kUpdate: update(job), what = "adamw"; break;
    case Job::kVerifyPass: verify_pass(job.step), what = "verify+adamw"; break;
  }
  if (config_.on_job)
    config_.on_job(what, job.unit, job.chunk, job.step, start,
                   job.done_s >= 0 ? job.done_s : config_.clock ? config_.clock() : 0.0);
}

namespace {

template <class T>
std::vector<const T*> slot_ptrs(const std::vector<ChunkArrival>& parts) {
  std::vector<const T*> p;
  for (const auto& a : parts) p.push_back(reinterpret_cast<const T*>(a.data));
  return p;
}

}  // namespace

void Updater::accumulate(Job& job) {
  const int flow = begin_paced(job);
  const ChunkArrival& first = job.parts.front();
  const int64_t b = first.begin, n = first.end - first.begin;
  float* acc = state_.unit(job.unit).accum_f32();
  SLIDEDP_CHECK(acc != nullptr, "unit " + std::to_string(job.unit) + " has no gradient accumulator");
  acc += b;
  const DType dt = config_.route == GradRouteKind::kGpu ? DType::kF32 : config_.wire_dtype;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ptrs = slot_ptrs<T>(job.parts);
    if (job.first_write) {
      kernels::GradSlots<T> slots{std::span<const T* const>(ptrs), 1.0f, nullptr};
      kernels::reduce_grads(pool_, slots, acc, 0, n);
    } else {
      pool_.parallel_for_range(0, n, kernels::kTileNumel, [&](int64_t tb, int64_t te) {
        kernels::reduce_grads_accumulate(std::span<const T* const>(ptrs), 1.0f, acc, tb, te);
      });
    }
  };
  if (dt == DType::kBF16) run(bf16_bits{});
  else run(float{});
  hold_paced(flow);
  if (config_.clock) job.done_s = config_.clock();
  for (const auto& a : job.parts) rings_[static_cast<size_t>(a.rank)]->release(a.slot);
  if (verify_) {
    std::lock_guard<std::mutex> lock(mutex_);
    StepInfo& info = steps_.at(job.step);
    if (--info.accumulations_left == 0) {
      Job v;
      v.kind = Job::kVerifyPass;
      v.step = job.step;
      jobs_.push_front(std::move(v));  // nothing else of this step can be pending
      cv_.notify_all();
    }
  }
}

void Updater::update(Job& job) {
  const int flow = begin_paced(job);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const StepInfo& info = steps_.at(job.step);
    if (!info.loss_finite)
      throw NumericError(fmt::format("step {}: {}; stopping (use --on-nonfinite skip to skip such steps)", job.step + 1,
                                     info.outcome.skipped_reason));
  }
  UnitState& u = state_.unit(job.unit);
  const ChunkArrival& first = job.parts.front();
  const int64_t b = first.begin, n = first.end - first.begin;
  bool has_accum;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int written_rank = config_.route == GradRouteKind::kGpu ? first.rank : -1;
    has_accum = steps_.at(job.step).written[{job.unit, job.chunk * (config_.ranks + 1) + written_rank + 1}] > 1;
  }
  kernels::AdamwState st;
  st.param = u.master_f32() + b;
  st.exp_avg = u.m_f32() + b;
  st.exp_avg_sq = u.v_f32() + b;
  st.param_bf16 = state_.mirror_dtype() == DType::kBF16 ? reinterpret_cast<bf16_bits*>(u.mirror.ptr) + b : nullptr;
  const kernels::AdamwHyper h = hyper(job.step, job.lr, 1.0);
  const float* acc = has_accum ? u.accum_f32() + b : nullptr;
  const DType dt = config_.route == GradRouteKind::kGpu ? DType::kF32 : config_.wire_dtype;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ptrs = slot_ptrs<T>(job.parts);
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
      kernels::reduce_adamw_update(pool_, st, slots, ph, pb - b, pe - b);
    });
  };
  if (dt == DType::kBF16) run(bf16_bits{});
  else run(float{});
  if (state_.mirror_dtype() == DType::kF32)
    std::memcpy(reinterpret_cast<float*>(u.mirror.ptr) + b, st.param, static_cast<size_t>(n) * 4);
  hold_paced(flow);
  if (config_.clock) job.done_s = config_.clock();
  for (const auto& a : job.parts) rings_[static_cast<size_t>(a.rank)]->release(a.slot);

  std::lock_guard<std::mutex> lock(mutex_);
  StepInfo& info = steps_.at(job.step);
  if (config_.route == GradRouteKind::kGpu) {
    int& done = info.shards_done[{job.unit, job.chunk}];
    if (++done < config_.ranks) return;
  }
  finish_chunk(info, job.unit, job.chunk, job.step);
}

void Updater::finish_chunk(StepInfo& info, int unit, int64_t chunk, int64_t step) {
  state_.unit(unit).updated[static_cast<size_t>(chunk)]->advance_to(static_cast<uint64_t>(step + 1));
  if (--info.chunks_left == 0) {
    info.done = true;
    cv_.notify_all();
  }
}

void Updater::verify_pass(int64_t step) {
  // Global gradient norm over every unit's accumulated gradient (deterministic order).
  double sumsq = 0;
  for (int u = 0; u < state_.num_units(); ++u) sumsq += kernels::sum_squares(pool_, state_.unit(u).accum_f32(), state_.unit(u).numel);
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
      auto [b, e] = state_.chunk_range(u, k);
      // Paced: this chunk's share of the target's update after the backward.
      int flow = -1;
      if (config_.pacing) {
        const PacedWork p = config_.pacing->post_backward_update();
        const double share = static_cast<double>(e - b) / static_cast<double>(state_.total_numel());
        flow = config_.pacing->pacer().begin(p.usages, p.work * share, 0.0);
      }
      kernels::AdamwState st;
      st.param = s.master_f32() + b;
      st.exp_avg = s.m_f32() + b;
      st.exp_avg_sq = s.v_f32() + b;
      st.param_bf16 = state_.mirror_dtype() == DType::kBF16 ? reinterpret_cast<bf16_bits*>(s.mirror.ptr) + b : nullptr;
      by_decay(u, b, e, h, [&](int64_t pb, int64_t pe, const kernels::AdamwHyper& ph) {
        kernels::adamw_update(pool_, st, s.accum_f32() + b, ph, pb - b, pe - b);
      });
      if (state_.mirror_dtype() == DType::kF32)
        std::memcpy(reinterpret_cast<float*>(s.mirror.ptr) + b, st.param, static_cast<size_t>(e - b) * 4);
      hold_paced(flow);
      std::lock_guard<std::mutex> lock(mutex_);
      finish_chunk(steps_.at(step), u, k, step);
    }
  }
}

}  // namespace slidedp::exec
