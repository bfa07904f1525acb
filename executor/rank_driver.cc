// One rank's driver; see rank_driver.h. The body of micro_step() reads top to bottom as the pipeline.
#include "executor/rank_driver.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "card/shard_range.h"
#include "common/error.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "model/memory_account.h"

namespace slidedp::exec {

RankDriver::RankDriver(Backend& backend, HostState& state, Updater& updater, StagingRing& ring,
                       const SequenceSampler& sampler, const ModelLayout& layout, const DriverConfig& config)
    : backend_(backend),
      device_(backend.device(config.rank)),
      state_(state),
      updater_(updater),
      ring_(ring),
      sampler_(sampler),
      layout_(layout),
      config_(config) {
  U_ = layout.num_units();
  L_ = U_ - 2;
  B_ = config.plan.micro_batch;
  slots_.resize(static_cast<size_t>(std::max(1, config.plan.gpu_buffer_depth)));
  const int64_t tokens = B_ * config.seq_len;
  for (int i = 0; i < 2; ++i) {
    data_host_[i] = backend.alloc_host(3 * tokens * 4, true);  // token ids, targets, document positions
    loss_host_[i] = backend.alloc_host(16, true);
  }
  mem_ = device_.memory_spec(B_, config.seq_len);
  mem_.document_positions = sampler.document_end().has_value();
  const int64_t hidden = mem_.decoder.hidden_bytes;
  for (int l = 0; l < L_; ++l)
    if (config.plan.layer_policy(l, L_) == ActivationPolicy::kOffload)
      offload_host_[l] = backend.alloc_host(hidden, true);
  if (config.convert_on_load) {
    SLIDEDP_CHECK(config.plan.param_route == ParamRoute::kReplicated || config.ranks == 1,
                  "conversion on load is SlideFormer's replicated delivery");
    const int64_t bytes = std::min(state.chunk_numel(), layout.max_unit_numel()) * dtype_bytes(device_.param_dtype());
    for (HostBuffer& b : convert_staging_) b = backend.alloc_host(bytes, true);
  }
  // The baselines read an fp32 master (FSDP's state and fetch, SlideFormer's conversion).
  SLIDEDP_CHECK(
      !state.split_master() || !(config.device_optimizer || config.fetch_fp32 || config.convert_on_load),
      "a baseline's driver needs an fp32 master");
  if (config.device_optimizer) load_state();
  if (config.fetch_fp32) fetch_fp32_ = alloc(fp32_fetch_bytes(layout, config.plan), "fp32 parameter shard fetched (FSDP offload)");
  if (config.widen_grad)
    widened_ = alloc(grad_staging_slot_bytes(layout, config.plan, 4), "gradient cast to fp32 (ZeRO-Offload)");
  if (config.accumulate_on_gpu || config.partition_round_trip) {
    const int64_t bytes = grad_staging_slot_bytes(layout, config.plan, dtype_bytes(config.wire_dtype));
    accum_source_ = backend.alloc_host(bytes, true);
    accum_target_ = alloc(bytes, "gradient round trip's target (ZeRO offloads)");
  }
}

void RankDriver::load_state() {
  Stream& h2d = device_.h2d();
  for (int u = 0; u < U_; ++u) {
    const UnitState& us = state_.unit(u);
    Shard sh;
    for (int64_t k = 0; k < us.chunks; ++k) {
      auto [b, e] = state_.chunk_range(u, k);
      sh.offset.push_back(sh.numel);
      sh.numel += shard_range(e - b, config_.ranks, config_.rank).size();
    }
    SLIDEDP_CHECK(sh.numel == sharded_state_numel(layout_, config_.plan, u, config_.rank),
                  "the device shard differs from the memory account's");
    const int64_t bytes = std::max<int64_t>(sh.numel, 1) * 4;
    sh.master = alloc(bytes, "sharded fp32 master (FSDP2)");
    sh.exp_avg = alloc(bytes, "sharded AdamW m (FSDP2)");
    sh.exp_avg_sq = alloc(bytes, "sharded AdamW v (FSDP2)");
    sh.grad = alloc(bytes, "sharded fp32 gradient (FSDP2)");
    shards_.push_back(sh);
    for_each_chunk_shard(u, [&](int64_t k, int64_t b, ShardRange r, int64_t offset) {
      const int64_t off = offset * 4, n = r.size() * 4;
      const SpanTag t = tag("h2d", "load state", -1, u, k);
      h2d.copy_h2d(sh.master, off, reinterpret_cast<const std::byte*>(us.master_f32() + b + r.begin), n, t);
      h2d.copy_h2d(sh.exp_avg, off, reinterpret_cast<const std::byte*>(us.m_f32() + b + r.begin), n, t);
      h2d.copy_h2d(sh.exp_avg_sq, off, reinterpret_cast<const std::byte*>(us.v_f32() + b + r.begin), n, t);
    });
  }
  nonfinite_count_ = alloc(4, "non-finite gradient count (FSDP2)");
  nonfinite_seen_ = backend_.alloc_host(4, true);
  device_updated_ = h2d.record();
  device_.compute().wait(device_updated_);
  grad_contributions_.assign(static_cast<size_t>(U_), 0);
}

void RankDriver::store_state() {
  if (!config_.device_optimizer) return;
  Stream& d2h = device_.d2h();
  d2h.wait(device_.compute().record());
  for (int u = 0; u < U_; ++u) {
    const UnitState& us = state_.unit(u);
    const Shard& sh = shards_[static_cast<size_t>(u)];
    for_each_chunk_shard(u, [&](int64_t k, int64_t b, ShardRange r, int64_t offset) {
      const int64_t off = offset * 4, n = r.size() * 4;
      const SpanTag t = tag("d2h", "store state", -1, u, k);
      d2h.copy_d2h(reinterpret_cast<std::byte*>(us.master_f32() + b + r.begin), sh.master, off, n, t);
      d2h.copy_d2h(reinterpret_cast<std::byte*>(us.m_f32() + b + r.begin), sh.exp_avg, off, n, t);
      d2h.copy_d2h(reinterpret_cast<std::byte*>(us.v_f32() + b + r.begin), sh.exp_avg_sq, off, n, t);
    });
  }
  d2h.record()->wait_host();
}

RankDriver::~RankDriver() = default;

SpanTag RankDriver::tag(const char* category, const char* what, int64_t step, int unit, int64_t chunk,
                        int64_t element_bytes) const {
  SpanTag t;
  t.element_bytes = static_cast<int>(element_bytes);
  t.category = category;
  t.what = what;
  t.step = static_cast<int>(step);
  t.unit = unit;
  t.chunk = static_cast<int>(chunk);
  t.eval = evaluating_;
  return t;
}

void RankDriver::issue_step(int64_t step) {
  for (int a = 0; a < config_.plan.accum_steps; ++a) micro_step(step, a);
}

void RankDriver::release_all() {
  for (Slot& s : slots_) {
    if (s.unit >= 0 || s.buffer.id >= 0) release(s.buffer, nullptr);
    s = Slot{};
  }
  for (Shard& sh : shards_)
    for (const DeviceBuffer* b : {&sh.master, &sh.exp_avg, &sh.exp_avg_sq, &sh.grad}) release(*b, nullptr);
  shards_.clear();
}

void RankDriver::forget(int unit, const EventPtr& last_use) {
  for (Slot& s : slots_)
    if (s.unit == unit) {
      release(s.buffer, last_use);
      s = Slot{};
    }
}

void RankDriver::mark_use(int unit, const EventPtr& e) {
  for (Slot& s : slots_)
    if (s.unit == unit) {
      s.last_use = e;
      s.last_use_seq = ++use_seq_;
    }
}

// Parameters of `unit` on this device: still resident in a slot, or delivered into the least
// recently used one, chunk by chunk, each chunk once the updater has applied the previous step to it.
RankDriver::Delivered RankDriver::acquire(int64_t step, int unit) {
  for (Slot& s : slots_)
    if (s.unit == unit) {
      s.last_use_seq = ++use_seq_;
      if (!s.stale) return {s.buffer, nullptr};
      // Resident parameters of the previous step: overwritten once their last reader is done.
      s.stale = false;
      device_.h2d().wait(s.last_use);
      return {s.buffer, deliver(step, unit, s.buffer)};
    }
  Slot* victim = &slots_[0];
  for (Slot& s : slots_)
    if (s.last_use_seq < victim->last_use_seq) victim = &s;
  SLIDEDP_CHECK(!config_.resident_params || victim->unit < 0, "resident parameters need a slot per unit");
  if (victim->buffer.id >= 0) release(victim->buffer, victim->last_use);
  const UnitState& us = state_.unit(unit);
  DeviceBuffer buf = alloc(us.numel * dtype_bytes(device_.param_dtype()), "parameter slot");
  *victim = Slot{unit, buf, nullptr, ++use_seq_};
  return {buf, deliver(step, unit, buf)};
}

EventPtr RankDriver::deliver(int64_t step, int unit, const DeviceBuffer& buf) {
  const UnitState& us = state_.unit(unit);
  const int64_t pbytes = dtype_bytes(device_.param_dtype());
  const bool sharded = (config_.plan.param_route == ParamRoute::kSharded || config_.resident_params) && config_.ranks > 1;
  Stream& h2d = device_.h2d();
  if (config_.device_optimizer) {
    // FSDP2: this rank's shard, cast from its fp32 master on the comm stream (so the cast and the
    // all-gather run ahead of the compute, as FSDP2's prefetch does), then the others' shards.
    Stream& comm = device_.comm();
    comm.wait(device_updated_);  // the previous step's AdamW of these shards
    const Shard& sh = shards_[static_cast<size_t>(unit)];
    for_each_chunk_shard(unit, [&](int64_t k, int64_t b, ShardRange r, int64_t offset) {
      device_.convert_fp32(sh.master, offset, buf, b + r.begin, device_.param_dtype(), r.size(), &comm);
      if (config_.ranks > 1) {
        const int64_t e = state_.chunk_range(unit, k).second;
        backend_.all_gather(config_.rank, buf, b, e - b, device_.param_dtype(), tag("fabric", "all-gather", step, unit, k));
      }
    });
    return comm.record();
  }
  // The updater's pass after the backward ends with the last unit's last chunk (updater.cc).
  if (config_.whole_update_gate) h2d.wait_counter(*state_.unit(U_ - 1).updated.back(), static_cast<uint64_t>(step));
  for (int64_t k = 0; k < us.chunks; ++k) {
    auto [b, e] = state_.chunk_range(unit, k);
    h2d.wait_counter(*us.updated[static_cast<size_t>(k)], static_cast<uint64_t>(step));
    if (config_.convert_on_load) {
      // This rank converts the chunk from the fp32 master into its staging buffer, then copies it.
      Stream& conv = device_.comm();
      conv.wait_counter(*us.updated[static_cast<size_t>(k)], static_cast<uint64_t>(step));
      const int sb = static_cast<int>(convert_counter_++ % 2);
      conv.wait(staging_copied_[sb]);  // the buffer's previous copy has read it
      std::byte* staging = convert_staging_[sb].ptr;
      const float* src = us.master_f32() + b;
      const int64_t n = e - b;
      const bool to_bf16 = device_.param_dtype() == DType::kBF16;
      const TargetPacing* pacing = config_.pacing;
      const int rank = config_.rank;
      Backend* backend = &backend_;
      const SpanTag span_tag = tag("convert", "fp32->bf16", step, unit, k);
      conv.host_fn([=] {
        const double t0 = backend->tracing() ? backend->trace_clock_s() : 0.0;
        int flow = -1;
        if (pacing) {
          const PacedWork w = pacing->convert(rank, unit, n);
          flow = pacing->pacer().begin(w.usages, w.work, w.delay_s);
        }
        if (to_bf16) kernels::f32_to_bf16(src, reinterpret_cast<bf16_bits*>(staging), n);
        else std::memcpy(staging, src, static_cast<size_t>(n) * 4);
        if (flow >= 0) pacing->pacer().finish(flow);
        if (backend->tracing()) backend->add_span({rank, "convert", span_tag, t0, backend->trace_clock_s()});
      });
      h2d.wait(conv.record());
      h2d.copy_h2d(buf, b * pbytes, staging, n * pbytes, tag("h2d", "params", step, unit, k, pbytes));
      staging_copied_[sb] = h2d.record();
    } else if (config_.fetch_fp32) {
      // FSDP offload: the fp32 shard over the link, cast on the device, then the all-gather.
      const ShardRange s = shard_range(e - b, config_.ranks, config_.rank);
      Stream& comm = device_.comm();
      h2d.copy_h2d(fetch_fp32_, 0, reinterpret_cast<const std::byte*>(us.master_f32() + b + s.begin),
                   s.size() * 4, tag("h2d", sharded ? "params shard fp32" : "params fp32", step, unit, k, 4));
      comm.wait(h2d.record());
      device_.convert_fp32(fetch_fp32_, 0, buf, b + s.begin, device_.param_dtype(), s.size(), &comm);
      h2d.wait(comm.record());  // the next chunk's copy reuses the buffer
      if (sharded)
        backend_.all_gather(config_.rank, buf, b, e - b, device_.param_dtype(), tag("fabric", "all-gather", step, unit, k));
    } else if (!sharded) {
      h2d.copy_h2d(buf, b * pbytes, us.mirror.ptr + b * pbytes, (e - b) * pbytes,
                   tag("h2d", "params", step, unit, k, pbytes));
    } else {
      ShardRange s = shard_range(e - b, config_.ranks, config_.rank);
      h2d.copy_h2d(buf, (b + s.begin) * pbytes, us.mirror.ptr + (b + s.begin) * pbytes, s.size() * pbytes,
                   tag("h2d", "params shard", step, unit, k, pbytes));
      device_.comm().wait(h2d.record());
      backend_.all_gather(config_.rank, buf, b, e - b, device_.param_dtype(), tag("fabric", "all-gather", step, unit, k));
    }
  }
  return sharded || config_.fetch_fp32 ? device_.comm().record() : h2d.record();
}

EventPtr RankDriver::send_grads(int64_t step, int micro, int unit, GradPart part, const DeviceBuffer& grads,
                                int64_t numel) {
  const DType wire = config_.wire_dtype;
  const int64_t wb = dtype_bytes(wire);
  DeviceBuffer wirebuf = alloc(numel * wb, "gradient (wire dtype)");
  device_.convert_fp32(grads, 0, wirebuf, 0, wire, numel);
  EventPtr converted = device_.compute().record();
  release(grads, converted);
  const int64_t chunk = state_.chunk_numel();
  const int64_t chunks = num_chunks(numel, chunk);
  Stream& d2h = device_.d2h();
  const int rank = config_.rank;
  Updater* updater = &updater_;
  if (config_.device_optimizer) return send_grads_to_shard(step, unit, wirebuf, converted, numel);
  const bool last_micro = micro == config_.plan.accum_steps - 1;
  // ZeRO-Offload's accumulation: the sum leaves from the compute stream on all but the last micro-step.
  const bool sum_out = config_.accumulate_on_gpu && !last_micro;
  // ZeRO-3's round trip: on all but the last micro-step the gradient that leaves stands for the
  // partition's copy out.
  const bool trip_out = config_.partition_round_trip && !last_micro;
  Stream& out = sum_out ? device_.compute() : d2h;
  if (!config_.gpu_route()) {
    out.wait(converted);
    // SlideFormer's one shared gradient buffer: unit u's gradient leaves once unit u+1 is updated
    // (on the last micro-step, the one that updates).
    if (config_.shared_grad_buffer && last_micro && part == GradPart::kOwn && unit + 1 < U_) {
      const UnitState& next = state_.unit(unit + 1);
      for (const auto& counter : next.updated) d2h.wait_counter(*counter, static_cast<uint64_t>(step + 1));
    }
    const bool widen = config_.widen_grad && !sum_out && !trip_out;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t b = k * chunk, e = std::min(numel, b + chunk);
      if (config_.accumulate_on_gpu) sum_back_in(step, micro, unit, k, (e - b) * wb, "grad accum in", out);
      if (config_.partition_round_trip && last_micro)
        partition_trip(step, last_micro, unit, k, (e - b) * wb, "grad accum out", "grad accum in", out);
      StagingRing::Slot slot = ring_.next();
      out.wait_counter(ring_.released(slot.index), slot.generation);
      if (widen) {
        device_.widen_bf16(wirebuf, b, widened_, 0, e - b, out);
        out.copy_d2h(slot.ptr, widened_, 0, (e - b) * 4, tag("d2h", "grad fp32", step, unit, k, 4));
      } else {
        out.copy_d2h(slot.ptr, wirebuf, b * wb, (e - b) * wb,
                     tag("d2h", sum_out || trip_out ? "grad accum out" : "grad", step, unit, k, wb));
      }
      if (trip_out)
        partition_trip(step, last_micro, unit, k, (e - b) * wb, "grad accum out", "grad accum in", out);
      ChunkArrival a{
          step, micro, unit, k, part, rank, slot.index, slot.ptr, b, e, widen ? DType::kF32 : wire};
      out.host_fn([updater, a] { updater->arrive(a); });
    }
    EventPtr drained = out.record();
    release(wirebuf, drained);
    return drained;
  }
  // gpu route: reduce-scatter each chunk among ranks (fp32 sum in rank order), then this rank's shard.
  int64_t shard_total = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t b = k * chunk, e = std::min(numel, b + chunk);
    shard_total += config_.grad_shard(e - b).size();
  }
  DeviceBuffer shards = alloc(std::max<int64_t>(shard_total, 1) * 4, "reduced gradient shards");
  Stream& comm = device_.comm();
  comm.wait(converted);
  int64_t off = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t b = k * chunk, e = std::min(numel, b + chunk);
    const ShardRange s = config_.grad_shard(e - b);
    backend_.reduce_scatter(rank, wirebuf, b, wire, e - b, shards, off, tag("fabric", "reduce-scatter", step, unit, k));
    out.wait(comm.record());
    if (config_.accumulate_on_gpu)
      sum_back_in(step, micro, unit, k, s.size() * wb, "grad shard accum in", out);
    if (config_.partition_round_trip && last_micro)
      partition_trip(step, last_micro, unit, k, s.size() * wb, "grad shard accum out", "grad shard accum in",
                     out);
    StagingRing::Slot slot = ring_.next();
    out.wait_counter(ring_.released(slot.index), slot.generation);
    out.copy_d2h(slot.ptr, shards, off * 4, s.size() * 4,
                 tag("d2h", sum_out || trip_out ? "grad shard accum out" : "grad shard", step, unit, k, 4));
    if (trip_out)
      partition_trip(step, last_micro, unit, k, s.size() * wb, "grad shard accum out", "grad shard accum in",
                     out);
    ChunkArrival a{step,       micro,    unit,        k,         part,       rank,
                   slot.index, slot.ptr, b + s.begin, b + s.end, DType::kF32};
    out.host_fn([updater, a] { updater->arrive(a); });
    off += s.size();
  }
  release(wirebuf, comm.record());
  EventPtr drained = out.record();
  release(shards, drained);
  return drained;
}

// ZeRO-3's round trip of a chunk's partition (`bytes`, the 16-bit partition's), on `out`: on the last
// micro-step its copy out and back in before the fp32 gradient leaves; on the others the gradient
// leaving stands for the copy out and this is the copy back in after it. The executor keeps its
// exact fp32 sum on the host, so these move DeepSpeed's bytes between scratch buffers.
void RankDriver::partition_trip(int64_t step, bool last_micro, int unit, int64_t k, int64_t bytes,
                                const char* out_what, const char* in_what, Stream& out) {
  if (last_micro)
    out.copy_d2h(accum_source_.ptr, accum_target_, 0, bytes,
                 tag("d2h", out_what, step, unit, k, dtype_bytes(config_.wire_dtype)));
  out.copy_h2d(accum_target_, 0, accum_source_.ptr, bytes,
               tag("h2d", in_what, step, unit, k, dtype_bytes(config_.wire_dtype)));
}

// ZeRO-Offload's copy of the gradient sum so far back to the device, on every micro-step but the
// first, on the compute stream once the chunk is reduced (`bytes`: what the chunk's copy out moves).
// The gradient leaving next (by `out`) waits for it, as DeepSpeed's add of it comes first.
void RankDriver::sum_back_in(int64_t step, int micro, int unit, int64_t k, int64_t bytes, const char* what, Stream& out) {
  if (micro == 0) return;
  Stream& compute = device_.compute();
  if (&out != &compute) compute.wait(device_.comm().record());
  compute.copy_h2d(accum_target_, 0, accum_source_.ptr, bytes,
                   tag("h2d", what, step, unit, k, dtype_bytes(config_.wire_dtype)));
  if (&out != &compute) out.wait(compute.record());
}

void RankDriver::invalidate_parameters() {
  // The parameters changed since the last step: nothing resident can be reused as it is.
  for (Slot& s : slots_) {
    if (config_.resident_params) {
      s.stale = s.unit >= 0;
      continue;
    }
    if (s.unit >= 0) forget(s.unit, s.last_use);
  }
}

RankDriver::DeviceBatch RankDriver::upload_batch(int64_t step, const FillBatch& fill) {
  const int64_t tokens = B_ * config_.seq_len;
  Stream& h2d = device_.h2d();
  DeviceBatch d;
  d.parity = static_cast<int>(micro_counter_++ % 2);
  if (data_copied_[d.parity]) data_copied_[d.parity]->wait_host();  // the buffer's last copy has run
  std::byte* host = data_host_[d.parity].ptr;
  auto* host_ids = reinterpret_cast<int32_t*>(host);
  const bool documents = sampler_.document_end().has_value();
  fill(std::span<int32_t>(host_ids, tokens), std::span<int32_t>(host_ids + tokens, tokens),
       documents ? std::span<int32_t>(host_ids + 2 * tokens, tokens) : std::span<int32_t>());
  d.ids = alloc(tokens * 4, "token ids");
  d.targets = alloc(tokens * 4, "targets");
  h2d.copy_h2d(d.ids, 0, host, tokens * 4, tag("h2d", "tokens", step, -1));
  h2d.copy_h2d(d.targets, 0, host + tokens * 4, tokens * 4, tag("h2d", "targets", step, -1));
  if (documents) {
    d.positions = alloc(tokens * 4, "document positions");
    h2d.copy_h2d(d.positions, 0, host + 2 * tokens * 4, tokens * 4, tag("h2d", "positions", step, -1));
  }
  data_copied_[d.parity] = h2d.record();
  device_.compute().wait(data_copied_[d.parity]);
  return d;
}

RankDriver::HeadCall RankDriver::run_head(int64_t step, const Delivered& p, const DeviceBuffer& x,
                                          const DeviceBuffer& targets, double grad_scale,
                                          const DeviceBuffer& router_stats, double router_aux_weight) {
  Device& dev = device_;
  Stream& compute = dev.compute();
  const int u = U_ - 1;
  const UnitLayout& ul = layout_.units[static_cast<size_t>(u)];
  DeviceBuffer lm_params = p.buffer;
  int64_t lm_offset = ul.find("lm_head.weight") ? ul.find("lm_head.weight")->offset : 0;
  if (config_.tied) {
    Delivered e = acquire(step, 0);
    compute.wait(e.ready);
    lm_params = e.buffer;
    lm_offset = layout_.embedding_weight().offset;
  }
  HeadCall h;
  UnitOpArgs& args = h.args;
  args.unit = u, args.step = static_cast<int>(step), args.B = B_, args.T = config_.seq_len,
  args.params = p.buffer;
  args.lm_head_params = lm_params, args.lm_head_offset = lm_offset;
  args.x = x;
  args.targets = targets;
  args.dx = alloc(mem_.decoder.hidden_bytes, "gradient of hidden state");
  const int64_t head_numel = state_.unit(u).numel;
  args.grads = alloc(head_numel * 4, "head gradient");
  dev.zero(args.grads, 0, head_numel * 4);
  if (config_.tied) {
    h.tied_grads = alloc(state_.unit(0).numel * 4, "tied embedding gradient");
    dev.zero(h.tied_grads, 0, state_.unit(0).numel * 4);
    args.lm_head_grads = h.tied_grads, args.lm_head_grad_offset = lm_offset;
  } else {
    args.lm_head_grads = args.grads, args.lm_head_grad_offset = lm_offset;
  }
  args.loss = alloc(16, "loss");
  args.workspace = alloc(mem_.head.forward_workspace_bytes, "workspace");
  args.grad_scale = grad_scale;
  args.router_stats = router_stats, args.router_aux_weight = router_aux_weight;
  args.eval = evaluating_;
  dev.forward(args);
  h.done = compute.record();
  mark_use(u, h.done);
  if (config_.tied) mark_use(0, h.done);
  release(args.workspace, h.done);
  release(args.x, h.done);
  return h;
}

void RankDriver::loss_to_host(int parity, int64_t step, const DeviceBuffer& loss, const EventPtr& done,
                              std::function<void(double sum, double count)> report) {
  Stream& d2h = device_.d2h();
  if (loss_copied_[parity]) loss_copied_[parity]->wait_host();
  d2h.wait(done);
  d2h.copy_d2h(loss_host_[parity].ptr, loss, 0, 16, tag("d2h", "loss", step, U_ - 1));
  release(loss, d2h.record());
  const double* lh = reinterpret_cast<const double*>(loss_host_[parity].ptr);
  d2h.host_fn([report = std::move(report), lh] { report(lh[0], lh[1]); });
  loss_copied_[parity] = d2h.record();  // after the report: the host buffer is free again
}

void RankDriver::micro_step(int64_t step, int a) {
  const Plan& plan = config_.plan;
  if (a == 0) invalidate_parameters();
  MicroStep m;
  m.step = step;
  m.micro = a;
  // This rank's (B, T) inputs, targets and (packed documents) positions of micro-step a.
  m.batch = upload_batch(step, [&](std::span<int32_t> in, std::span<int32_t> tg, std::span<int32_t> pos) {
    sampler_.fill_micro_batch(step, a, global_rank(), config_.nodes * config_.ranks, B_, in, tg, pos);
  });
  if (mem_.router_stats_bytes > 0) {
    m.router_stats = alloc(mem_.router_stats_bytes, "router statistics");
    device_.zero(m.router_stats, 0, mem_.router_stats_bytes);
  }
  const double step_sequences = static_cast<double>(B_) * plan.accum_steps * config_.ranks * config_.nodes;
  m.router_aux_weight = config_.router_aux_loss_coef / step_sequences;
  m.out.resize(static_cast<size_t>(U_));
  m.saved.resize(static_cast<size_t>(std::max(L_, 1)));
  m.offloaded.resize(static_cast<size_t>(std::max(L_, 1)));

  for (int u = 0; u < U_; ++u) {
    const Delivered p = acquire(step, u);
    device_.compute().wait(p.ready);
    const UnitKind kind = layout_.units[static_cast<size_t>(u)].kind;
    if (kind == UnitKind::kEmbedding)
      forward_embedding(m, u, p);
    else if (kind == UnitKind::kDecoder)
      forward_layer(m, u, p);
    else
      forward_head(m, u, p);
  }
  const bool lookahead = backward_delivery_lookahead(plan);
  std::optional<Delivered> ahead;  // unit u-1, delivered before unit u's gradient left (lookahead)
  for (int u = L_; u >= 1; --u) {
    const Delivered p = ahead ? *std::exchange(ahead, std::nullopt) : acquire(step, u);
    prefetch_input(m, u - 1);
    prefetch_input(m, u - 2);  // two deep: the next layer's input is on its way while this one computes
    const DeviceBuffer grads = backward_layer(m, u, p);
    if (lookahead) ahead = acquire(step, u - 1);  // its all-gather goes ahead of this reduce-scatter
    drain_[u] = send_grads(step, a, u, GradPart::kOwn, grads, state_.unit(u).numel);
  }
  backward_embedding(m, ahead ? *std::exchange(ahead, std::nullopt) : acquire(step, 0));
  drain_.clear();
  if (config_.device_optimizer && a == plan.accum_steps - 1) device_update(step);
}

void RankDriver::forward_embedding(MicroStep& m, int u, const Delivered& p) {
  UnitOpArgs args;
  args.unit = u, args.step = static_cast<int>(m.step), args.B = B_, args.T = config_.seq_len,
  args.params = p.buffer;
  args.tokens = m.batch.ids;
  args.y = m.out[0] = alloc(mem_.decoder.hidden_bytes, "hidden state");
  device_.forward(args);
  mark_use(u, device_.compute().record());
}

void RankDriver::forward_layer(MicroStep& m, int u, const Delivered& p) {
  Stream& compute = device_.compute();
  Stream& d2h = device_.d2h();
  const int64_t hidden = mem_.decoder.hidden_bytes;
  const int l = u - 1;
  const ActivationPolicy policy = config_.plan.layer_policy(l, L_);
  if (l >= 2 && m.offloaded[static_cast<size_t>(l - 2)])
    compute.wait(m.offloaded[static_cast<size_t>(l - 2)]);
  UnitOpArgs args;
  args.unit = u, args.step = static_cast<int>(m.step), args.B = B_, args.T = config_.seq_len,
  args.params = p.buffer;
  args.x = m.out[static_cast<size_t>(u - 1)];
  args.y = m.out[static_cast<size_t>(u)] = alloc(hidden, "hidden state");
  args.saved = alloc(mem_.layer_memory(l).saved_bytes, "saved activations");
  args.workspace = alloc(mem_.layer_memory(l).forward_workspace_bytes, "workspace");
  args.router_stats = m.router_stats, args.router_aux_weight = m.router_aux_weight;
  args.positions = m.batch.positions;
  device_.forward(args);
  EventPtr done = compute.record();
  mark_use(u, done);
  release(args.workspace, done);
  if (policy == ActivationPolicy::kKeep)
    m.saved[static_cast<size_t>(l)] = args.saved;
  else
    release(args.saved, done);  // recompute later from the unit input
  if (policy != ActivationPolicy::kOffload) return;
  d2h.wait(done);
  // The host buffer is free once the previous micro-step's prefetch of it has run.
  d2h.wait(offload_read_[l]);
  d2h.copy_d2h(offload_host_.at(l).ptr, args.x, 0, hidden,
               tag("d2h", "offload", m.step, u, -1, dtype_bytes(device_.activation_dtype())));
  m.offloaded[static_cast<size_t>(l)] = d2h.record();
  release(args.x, m.offloaded[static_cast<size_t>(l)]);
  m.out[static_cast<size_t>(u - 1)] = DeviceBuffer{};
}

// The head: final norm + lm_head + fused loss, forward and backward in one pass.
void RankDriver::forward_head(MicroStep& m, int u, const Delivered& p) {
  const int64_t step = m.step;
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, sampler_.step_num_targets(step)));
  HeadCall head = run_head(step, p, m.out[static_cast<size_t>(u - 1)], m.batch.targets, scale, m.router_stats,
                           m.router_aux_weight);
  m.out[static_cast<size_t>(u - 1)] = DeviceBuffer{};
  // The loss (sum, count) goes to the host first, so the updater sees it before any gradient.
  Updater* updater = &updater_;
  loss_to_host(m.batch.parity, step, head.args.loss, head.done,
               [updater, step, a = m.micro, rank = config_.rank](double sum, double count) {
                 updater->report_loss(step, a, rank, sum, count);
               });
  EventPtr drained = send_grads(step, m.micro, u, GradPart::kOwn, head.args.grads, state_.unit(u).numel);
  if (config_.tied)
    drained = send_grads(step, m.micro, 0, GradPart::kTiedHead, head.tied_grads, state_.unit(0).numel);
  drain_[u] = drained;
  m.dy = head.args.dx;
}

void RankDriver::prefetch_input(MicroStep& m, int l) {
  if (l < 0 || config_.plan.layer_policy(l, L_) != ActivationPolicy::kOffload || m.prefetched.count(l))
    return;
  Stream& h2d = device_.h2d();
  const int64_t hidden = mem_.decoder.hidden_bytes;
  DeviceBuffer x = alloc(hidden, "prefetched hidden state");
  h2d.wait(m.offloaded[static_cast<size_t>(l)]);  // the forward's offload of this input has landed
  h2d.copy_h2d(x, 0, offload_host_.at(l).ptr, hidden,
               tag("h2d", "prefetch", m.step, l + 1, -1, dtype_bytes(device_.activation_dtype())));
  m.prefetched[l] = {x, h2d.record()};
  offload_read_[l] = m.prefetched[l].second;
}

DeviceBuffer RankDriver::backward_layer(MicroStep& m, int u, Delivered p) {
  Stream& compute = device_.compute();
  const int64_t step = m.step;
  const int l = u - 1;
  const ActivationPolicy policy = config_.plan.layer_policy(l, L_);
  compute.wait(p.ready);
  UnitOpArgs args;
  args.unit = u, args.step = static_cast<int>(step), args.B = B_, args.T = config_.seq_len,
  args.params = p.buffer;
  args.positions = m.batch.positions;  // recompute and backward
  if (policy == ActivationPolicy::kOffload) {
    compute.wait(m.prefetched[l].second);
    args.x = m.prefetched[l].first;
    m.prefetched.erase(l);
  } else {
    args.x = m.out[static_cast<size_t>(u - 1)];
  }
  if (policy == ActivationPolicy::kKeep) {
    args.saved = m.saved[static_cast<size_t>(l)];
  } else {
    args.saved = alloc(mem_.layer_memory(l).saved_bytes, "saved activations (recomputed)");
    args.workspace = alloc(mem_.layer_memory(l).forward_workspace_bytes, "workspace");
    device_.recompute(args);
    release(args.workspace, compute.record());
    if (config_.refetch_for_recompute) {
      // The recompute's forward hook released the parameters; the backward gathers them again.
      forget(u, compute.record());
      p = acquire(step, u);
      compute.wait(p.ready);
      args.params = p.buffer;
    }
  }
  // Two gradient buffers: this unit's reuses the one unit u+2 drained.
  if (drain_.count(u + 2)) compute.wait(drain_[u + 2]);
  const int64_t numel = state_.unit(u).numel;
  args.grads = alloc(numel * 4, "unit gradient");
  device_.zero(args.grads, 0, numel * 4);
  args.dy = m.dy;
  args.dx = alloc(mem_.decoder.hidden_bytes, "gradient of hidden state");
  args.workspace = alloc(mem_.layer_memory(l).backward_workspace_bytes, "workspace");
  args.router_stats = m.router_stats, args.router_aux_weight = m.router_aux_weight;
  device_.backward(args);
  if (step == config_.inject_throw_step && u == config_.inject_throw_unit)
    compute.host_fn([r = config_.rank, u] {
      throw RuntimeError(fmt::format("injected fault: rank {} failed in the backward of unit {}", r, u));
    });
  if (step == config_.inject_nan_step && u == config_.inject_nan_unit) {
    // Fault injection (CPU backend tests): a NaN in this rank's gradient, written in stream order
    // right after the backward that produced it.
    DeviceBuffer g = args.grads;
    compute.host_fn([g] { reinterpret_cast<float*>(g.ptr)[0] = std::numeric_limits<float>::quiet_NaN(); });
  }
  EventPtr done = compute.record();
  mark_use(u, done);
  release(args.x, done);
  release(args.saved, done);
  release(args.workspace, done);
  release(m.dy, done);
  m.out[static_cast<size_t>(u - 1)] = DeviceBuffer{};
  m.dy = args.dx;
  return args.grads;
}

// The embedding: scatter-add of the gradient into the rows of this micro-batch's tokens.
void RankDriver::backward_embedding(MicroStep& m, const Delivered& p) {
  Stream& compute = device_.compute();
  compute.wait(p.ready);
  if (drain_.count(2)) compute.wait(drain_[2]);
  const int64_t numel = state_.unit(0).numel;
  UnitOpArgs args;
  args.unit = 0, args.step = static_cast<int>(m.step), args.B = B_, args.T = config_.seq_len,
  args.params = p.buffer;
  args.tokens = m.batch.ids, args.dy = m.dy;
  args.grads = alloc(numel * 4, "embedding gradient");
  device_.zero(args.grads, 0, numel * 4);
  device_.backward(args);
  EventPtr done = compute.record();
  mark_use(0, done);
  release(m.dy, done);
  release(m.batch.ids, done);
  release(m.batch.targets, done);
  if (m.batch.positions) release(m.batch.positions, done);
  if (m.router_stats.bytes > 0) release(m.router_stats, done);
  drain_[0] = send_grads(m.step, m.micro, 0, GradPart::kOwn, args.grads, numel);
}

// FSDP2: each chunk reduce-scattered (fp32 sums in rank order, as the gpu route), then added into
// the unit's shard accumulator on the compute stream; the step's first contribution overwrites it.
// Returns the event after which the wire buffer is free.
EventPtr RankDriver::send_grads_to_shard(int64_t step, int unit, const DeviceBuffer& wirebuf, const EventPtr& converted,
                                         int64_t numel) {
  const Shard& sh = shards_[static_cast<size_t>(unit)];
  const int64_t chunk = state_.chunk_numel();
  DeviceBuffer reduced = alloc(std::max<int64_t>(sh.numel, 1) * 4, "reduced gradient shards");
  Stream& comm = device_.comm();
  comm.wait(converted);
  for (int64_t k = 0; k * chunk < numel; ++k) {
    const int64_t b = k * chunk, e = std::min(numel, b + chunk);
    backend_.reduce_scatter(config_.rank, wirebuf, b, config_.wire_dtype, e - b, reduced, sh.offset[static_cast<size_t>(k)],
                            tag("fabric", "reduce-scatter", step, unit, k));
  }
  EventPtr scattered = comm.record();
  release(wirebuf, scattered);
  Stream& compute = device_.compute();
  compute.wait(scattered);
  int& contributions = grad_contributions_[static_cast<size_t>(unit)];
  if (contributions++ == 0) device_.convert_fp32(reduced, 0, sh.grad, 0, DType::kF32, sh.numel);
  else device_.add_fp32(sh.grad, 0, reduced, 0, sh.numel);
  release(reduced, compute.record());
  return scattered;
}

// FSDP2: AdamW on this rank's shards once every gradient of the step is in, on the compute stream
// (the next step's casts wait for it), then the report to the updater.
void RankDriver::device_update(int64_t step) {
  Stream& compute = device_.compute();
  Updater* updater = &updater_;
  // Every system checks a gradient before applying it: this rank's non-finite elements are counted and
  // handed to the updater in stream order, before the update reports the step done, so a non-finite
  // gradient stops the run at its own step and is never saved.
  device_.zero(nonfinite_count_, 0, 4);
  for (int u = 0; u < U_; ++u) {
    const Shard& sh = shards_[static_cast<size_t>(u)];
    device_.count_nonfinite_fp32(sh.grad, 0, sh.numel, nonfinite_count_);
  }
  compute.copy_d2h(nonfinite_seen_.ptr, nonfinite_count_, 0, 4, tag("d2h", "non-finite count", step, -1));
  const auto* seen = reinterpret_cast<const uint32_t*>(nonfinite_seen_.ptr);
  compute.host_fn([updater, step, seen, r = config_.rank] {
    if (*seen > 0) updater->device_grads_nonfinite(step, r, *seen);
  });
  const kernels::AdamwHyper h = updater_.step_hyper(step);
  for (int u = 0; u < U_; ++u) {
    const Shard& sh = shards_[static_cast<size_t>(u)];
    for_each_chunk_shard(u, [&](int64_t, int64_t b, ShardRange r, int64_t offset) {
      // Weight decay by element of the unit: shard element i is unit element b + r.begin + i.
      updater_.for_decay_ranges(u, b + r.begin, b + r.end, h, [&](int64_t pb, int64_t pe, const kernels::AdamwHyper& ph) {
        DeviceAdamwArgs args;
        args.param = sh.master, args.exp_avg = sh.exp_avg, args.exp_avg_sq = sh.exp_avg_sq, args.grad = sh.grad;
        args.offset = offset + (pb - b - r.begin);
        args.n = pe - pb;
        args.hyper = ph;
        args.unit = u;
        args.step = static_cast<int>(step);
        device_.adamw(args);
      });
    });
  }
  std::fill(grad_contributions_.begin(), grad_contributions_.end(), 0);
  device_updated_ = compute.record();
  compute.host_fn([updater, step, r = config_.rank] { updater->device_step_done(step, r); });
}

}  // namespace slidedp::exec
