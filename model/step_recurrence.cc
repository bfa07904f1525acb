// The step model's recurrence; see step_recurrence.h, step_model.h and docs/MODEL.md for the derivation.
//
// The recurrence follows one rank (all ranks do the same work at the same time; shared resources
// are accounted for through the effective per-rank link rates, the per-phase link bounds, the host
// work's queue across phases and, at contention fidelity, per-phase sharing factors). Streams:
//   gpu    - compute, in order: forward 0..U-1, backward U-2..0 per micro-step
//   h2d    - parameter deliveries (into D slots, LRU) and offloaded-activation prefetches
//   d2h    - activation offloads and gradient chunks
//   cpu    - reduction + AdamW of each unit's chunks, FIFO (units arrive in backward order)
// A delivery waits for its slot to be released (the compute that last used it) and, for the first
// unit of the next step, for that unit's chunks to be updated (synchronous semantics).
#include "model/step_recurrence.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "model/contention.h"
#include "model/regime_jump.h"

namespace slidedp {
namespace {

struct Slot {
  int unit = -1;
  double free_at = 0;  // end of the last compute that used it
  long last_use = -1;  // use counter: the victim is the least recently used (same rule as the simulator)
};

// Per-phase demand on the host-wide resources, for the phase bounds.
struct PhaseDemand {
  double h2d_bytes = 0;  // per rank
  double d2h_bytes = 0;  // per rank
  double host_mem_bytes = 0;
  double cpu_update_thread_s = 0;
  double cpu_core_thread_s = 0;
};


// Per-unit constants of the recurrence's inner loop.
struct UnitConst {
  double chunks = 1, grad_chunks = 1, inv_chunks = 1, inv_grad_chunks = 1;
  double h2d_bytes = 0, h2d_latency_s = 0, allgather_s = 0;
  double reduce_scatter_s = 0, grad_d2h_bytes = 0, grad_latency_s = 0;
  double reduce_scatter_nic_s = 0;  // several nodes, gpu route: the reduce-scatter's time on the network
};

// What every pass of one evaluation shares (built once, the passes differ only in latencies and
// contention): the runs of identical units and per-run constants with and without latencies.
struct RecurrenceSetup {
  const StepWork& sw;
  std::vector<char> same_as_prev;        // unit u has the same work as unit u - 1
  std::vector<int> run_end, run_start;   // the last / first unit of u's run of identical units
  std::vector<int> run_of;               // index of u's run (its constants are the run's)

  RecurrenceCounters counters;

  explicit RecurrenceSetup(const StepWork& work) : sw(work) {
    const std::size_t U = sw.units.size();
    same_as_prev.assign(U, 0);
    run_end.assign(U, 0);
    run_start.assign(U, 0);
    run_of.assign(U, 0);
    int runs = 0;
    for (std::size_t u = 0; u < U; ++u) {
      same_as_prev[u] = u > 0 && same_work(sw.units[u], sw.units[u - 1]);
      run_start[u] = same_as_prev[u] ? run_start[u - 1] : static_cast<int>(u);
      run_of[u] = same_as_prev[u] ? runs - 1 : runs++;
    }
    for (std::size_t k = U; k-- > 0;) run_end[k] = k + 1 < U && same_as_prev[k + 1] ? run_end[k + 1] : static_cast<int>(k);
  }

  // Constants of the inner loop (divisions hoisted out of it), one per run, built on first use.
  const std::vector<UnitConst>& unit_const(bool latencies) {
    std::vector<UnitConst>& out = unit_const_[latencies ? 1 : 0];
    if (!out.empty() || sw.units.empty()) return out;
    const Capacities& c = sw.cap;
    const double lat = latencies ? 1.0 : 0.0;
    const double inv_ag = 1.0 / c.allgather_busbw_Bps, inv_rs = 1.0 / c.reduce_scatter_busbw_Bps;
    for (std::size_t u = 0; u < sw.units.size(); ++u) {
      if (same_as_prev[u]) continue;
      const UnitWork& w = sw.units[u];
      UnitConst k;
      k.chunks = static_cast<double>(w.chunks);
      k.grad_chunks = static_cast<double>(w.grad_chunks);
      k.inv_chunks = 1.0 / k.chunks;
      k.inv_grad_chunks = 1.0 / k.grad_chunks;
      k.h2d_bytes = w.deliver_h2d_bytes + w.tied_h2d_bytes;
      k.h2d_latency_s = lat * k.chunks * c.link_latency_s;
      const double ag = w.deliver_allgather_bytes + w.tied_allgather_bytes;
      k.allgather_s = ag > 0 ? ag * inv_ag + lat * k.chunks * c.fabric_latency_s : 0.0;
      k.reduce_scatter_s = w.grad_reduce_scatter_bytes > 0
                               ? w.grad_reduce_scatter_bytes * inv_rs + lat * k.grad_chunks * c.fabric_latency_s
                               : 0.0;
      if (w.grad_nic_bytes > 0) {
        // Across nodes the ring runs through the ports and the network at once: the slower one paces
        // it, and every chunk pays the network's hops.
        const double nic_s = w.grad_nic_bytes / c.nic_Bps + lat * k.grad_chunks * (c.nodes - 1) * c.nic_latency_s;
        k.reduce_scatter_nic_s = nic_s;
        k.reduce_scatter_s = std::max(k.reduce_scatter_s, nic_s);
      }
      k.grad_d2h_bytes = w.grad_d2h_bytes + w.tied_grad_d2h_bytes;
      k.grad_latency_s = lat * k.grad_chunks * c.link_latency_s;
      out.push_back(k);
    }
    return out;
  }

 private:
  std::vector<UnitConst> unit_const_[2];  // [latencies], per run
};

class Recurrence {
  // The regime jump's state (save_state): 33 scalars and 3 per slot.
  static constexpr std::size_t kStateFixed = 33;
  friend class ::slidedp::RegimeJump;

 public:
  // `jump`: jump over the periodic regime of runs of identical layers (exact up to rounding; false
  // runs every unit, the reference the tests compare the jumps against).
  Recurrence(const StepWork& sw, RecurrenceSetup& setup, bool latencies,
             const std::vector<PhaseContention>& contention, bool jump)
      : sw_(sw),
        setup_(setup),
        unit_const_(&setup.unit_const(latencies)),
        c_(sw.cap),
        lat_(latencies ? 1.0 : 0.0),
        h2d_rate0_(std::min(sw.cap.h2d_link_Bps, sw.cap.duplex_Bps)),
        d2h_rate0_(std::min(sw.cap.d2h_link_Bps, sw.cap.duplex_Bps)),
        contention_(contention) {
    slots_.resize(static_cast<std::size_t>(std::max(1, sw.buffer_depth)));
    offload_end_.resize(sw.units.size());
    grad_done_.resize(sw.units.size());
    bwd_end_.resize(sw.units.size());
    // The jump's state must fit its fixed-size buffers (depth <= 10); deeper buffers run every unit.
    state_size_ = kStateFixed + 3 * slots_.size();
    state_padded_ = (state_size_ + 3) / 4 * 4;
    // The network's queue is not part of the jump state: plans over several nodes run every layer.
    jump_ = jump && state_padded_ <= kJumpStateMax && sw.cap.nodes == 1;
    jump_micro_ = jump;
    regime_ = RegimeJump(state_padded_);
    set_contention(contention, {});
  }

  // Two steps: the first starts cold, the second starts the way every later one does (its first
  // delivery gated by the previous step's updates), so the second's period is the steady state.
  RunResult run() {
    step();
    return step();
  }

  // One more step with new contention factors, from where the previous step ended: one per phase of
  // a step whose pairs of phases stand for `micro_repeat` micro-steps each (contention.h).
  RunResult step_with(const std::vector<PhaseContention>& contention, const std::vector<long>& micro_repeat) {
    set_contention(contention, micro_repeat);
    return step();
  }

  // The same recurrence from here on with or without per-copy and per-collective latencies.
  void set_latencies(bool latencies) {
    lat_ = latencies ? 1.0 : 0.0;
    unit_const_ = &setup_.unit_const(latencies);
  }

 private:
  RunResult step() {
    reset_counters();
    const long A = sw_.accum_steps;
    first_compute_ = -1;
    micro_history_ = 0;
    int m = 0;  // the pair of phases micro-step a is stored in
    for (long a = 0; a < A; ++a, ++m) {
      micro_repeat_.push_back(1);
      run_micro_step(a, m);
      if (jump_micro_) a = jump_micro_after(a, m);
    }
    // ---- step boundary ----
    const SystemTraits& tr = sw_.traits;
    RunResult r;
    const UnitWork& u0 = sw_.units.front();
    const double last_compute = gpu_;
    double next_compute = 0;
    if (!tr.update_after_backward) {
      // The last backward's link bound and the host queue (the drain of the updates included).
      double drain_end = std::max(gpu_, cpu_);
      queue_host_work(backward_demand_, backward_start_);
      const double bound_end = std::max(backward_start_ + link_need(backward_demand_), host_queue_end());
      close_phase(backward_start_, drain_end);
      // The first chunk of unit 0 can leave once it is updated; the last one after the last update.
      double slot = lru_slot().free_at;
      next_gate_first_ = cpu0_start_ + cpu0_s_ / static_cast<double>(u0.grad_chunks);
      next_gate_end_ = cpu0_end_;
      double end = std::max(deliver_chain_probe(u0, std::max(slot, next_gate_first_)),
                            next_gate_end_ + delivery_time(u0) / static_cast<double>(u0.chunks));
      next_compute = std::max({gpu_, end, bound_end});
      gpu_ = std::max(gpu_, bound_end);  // the next step's compute cannot start before the bound either
      r.breakdown.exposed_tail_s = std::max(0.0, cpu0_end_ - last_compute);
      r.breakdown.exposed_head_s = next_compute - std::max(last_compute, cpu0_end_);
    } else {
      // The update after backward needs every gradient summed (several nodes: exchanged and added).
      double post_start = std::max({gpu_, cpu_, d2h_, exchanged_});
      PhaseDemand post;
      double post_cpu = 0;
      if (sw_.post_update_thread_s > 0) {
        post_cpu = sw_.post_update_thread_s / c_.update_threads;
        post.host_mem_bytes = sw_.post_update_host_mem_bytes;
        post.cpu_update_thread_s = sw_.post_update_thread_s;
        post_cpu = std::max(post_cpu, post.host_mem_bytes / c_.host_mem_Bps);
        cpu_update_thread_s_ += sw_.post_update_thread_s;
        host_mem_bytes_ += sw_.post_update_host_mem_bytes;
      }
      double upload = 0;
      if (sw_.post_upload_h2d_bytes > 0) {
        // The update is done and nothing else moves: the upload has the link to itself (the
        // backward's contention factor, still in h2d_rate_, does not apply).
        upload += copy_time(sw_.post_upload_h2d_bytes, h2d_rate0_, 1);
        h2d_bytes_ += sw_.post_upload_h2d_bytes;
        host_mem_bytes_ += sw_.ranks * sw_.post_upload_h2d_bytes;
      }
      if (sw_.post_allgather_bytes > 0) {
        double t = sw_.post_allgather_bytes / c_.allgather_busbw_Bps + lat_ * c_.fabric_latency_s;
        upload += t;
        fabric_s_ += t;
      }
      if (sw_.post_gather_nic_bytes > 0) {
        // The norm's exchange, then the updated mirror's all-gather.
        const double t = sw_.post_gather_nic_bytes / c_.nic_Bps + lat_ * 2.0 * (c_.nodes - 1) * c_.nic_latency_s;
        upload += t;
        network_s_ += t;
      }
      if (tr.update_in_layer_order) {
        next_compute = release_in_layer_order(post_start, post_cpu, upload, post, last_compute, r);
      } else {
        double post_end = post_start + post_cpu + upload + sw_.post_gpu_s;
        compute_ += sw_.post_gpu_s;
        double first = 0;
        if (tr.stream_params) first = delivery_time(u0);
        if (tr.gpu_sharded_state)
          first = u0.deliver_allgather_bytes / c_.allgather_busbw_Bps + lat_ * c_.fabric_latency_s;
        next_compute = post_end + first;
        next_gate_first_ = post_end;
        next_gate_end_ = 0;
        r.breakdown.exposed_tail_s = std::max(0.0, post_start - last_compute);
        r.breakdown.post_update_s = post_end - post_start - sw_.post_gpu_s;
        r.breakdown.exposed_head_s = first;
      }
    }
    r.first_compute_s = first_compute_;
    r.step_s = next_compute - first_compute_;
    r.breakdown.compute_s = compute_;
    r.breakdown.stall_s = r.step_s - r.breakdown.compute_s - r.breakdown.exposed_tail_s -
                          r.breakdown.exposed_head_s - r.breakdown.post_update_s;
    r.h2d_bytes = h2d_bytes_;
    r.d2h_bytes = d2h_bytes_;
    r.fabric_s = fabric_s_;
    r.network_s = network_s_;
    r.h2d_copies = h2d_copies_;
    r.d2h_copies = d2h_copies_;
    r.host_mem_bytes = host_mem_bytes_;
    r.cpu_update_thread_s = cpu_update_thread_s_;
    r.cpu_core_thread_s = cpu_core_thread_s_;
    r.compute_s = compute_;
    r.phases = phases_;
    r.micro_repeat = micro_repeat_;
    return r;
  }

  // Micro-step a (forward, then backward) into the pair of phases m.
  void run_micro_step(long a, int m) {
    const int U = static_cast<int>(sw_.units.size());
    const long A = sw_.accum_steps;
    const SystemTraits& tr = sw_.traits;
    last_ = a == A - 1;
    micro_ = a;
    phases_.resize(std::max(phases_.size(), static_cast<std::size_t>(2 * m + 2)));
    if (a == 0) invalidate_slots();  // parameters changed since the previous step
    // ---- forward ----
    set_phase(2 * m, a, 0);
    begin_phase(-1.0);
    std::fill(offload_end_.begin(), offload_end_.end(), 0.0);
    // The previous step's update in layer order gates this forward unit by unit (no jump over runs:
    // the gates move the regime) and shares its host.
    gated_ = a == 0 && !unit_gates_.empty();
    if (gated_) {
      PhaseStats& p = stats();
      p.cpu_busy += carried_cpu_s_;
      p.cpu_thread_s += carried_.cpu_update_thread_s;
      p.cpu_host_mem_bytes += carried_.host_mem_bytes;
      queue_host_work(carried_, carried_start_);
    }
    for (int u = 0; u < U; ++u) {
      forward_unit(u);
      if (jump_ && !gated_) u = jump_after(u, +1);
    }
    if (a == 0) forward_host_mem_bytes_ = demand_.host_mem_bytes;
    if (gated_) unit_gates_.clear(), gated_ = false;
    // A phase cannot end before the links carried its transfers: the bound delays the GPU
    // (max-plus, so the whole model stays monotone in every capacity). Host work queues on.
    gpu_ = std::max(gpu_, phase_start_ + link_need(demand_));
    queue_host_work(demand_, phase_start_);
    close_phase(phase_start_, gpu_);
    // ---- backward ----
    set_phase(2 * m + 1, a, 1);
    begin_phase(gpu_);
    std::fill(grad_done_.begin(), grad_done_.end(), 0.0);
    std::fill(bwd_end_.begin(), bwd_end_.end(), 0.0);
    for (int u = U - 2; u >= 0; --u) {
      backward_unit(u);
      if (jump_) u = jump_after(u, -1);
    }
    if (!last_ || tr.update_after_backward) {
      gpu_ = std::max(gpu_, phase_start_ + link_need(demand_));
      queue_host_work(demand_, phase_start_);
      // An update after backward needs every gradient reduced: the host queue has drained.
      if (last_) gpu_ = std::max(gpu_, host_queue_end());
      close_phase(phase_start_, gpu_);
    } else {
      backward_demand_ = demand_, backward_start_ = phase_start_;
    }
  }

  // The update after the backward releases each unit to the next step's deliveries as it is done,
  // unit 0 first (SlideDP's clipping): unit u's chunks are updated in its share of the update's time
  // (by elements), its first chunk leaving after 1/chunks of it. The next step's forward waits unit
  // by unit; the update's host work overlaps that forward (queued from post_start, and counted in its
  // first phase's utilizations). Returns the next step's first compute.
  double release_in_layer_order(double post_start, double post_cpu, double gather, const PhaseDemand& post,
                                double last_compute, RunResult& r) {
    const UnitWork& u0 = sw_.units.front();
    double elements = 0;
    for (const UnitWork& w : sw_.units) elements += static_cast<double>(w.numel);
    const double total = std::max(post_cpu, shared_update_s(post.host_mem_bytes)) + gather;
    unit_gates_.assign(sw_.units.size(), {0.0, 0.0});
    double t = post_start;
    for (std::size_t u = 0; u < sw_.units.size(); ++u) {
      const UnitWork& w = sw_.units[u];
      const double d = elements > 0 ? total * static_cast<double>(w.numel) / elements : 0.0;
      unit_gates_[u] = {t + d / static_cast<double>(w.chunks), t + d};
      t += d;
    }
    cpu_ = std::max(cpu_, post_start + post_cpu);
    carried_ = post;
    carried_start_ = post_start;
    carried_cpu_s_ = post_cpu;
    const double gate_end = unit_gates_.front().second;
    const double slot = lru_slot().free_at;
    const double end = std::max(deliver_chain_probe(u0, std::max(slot, unit_gates_.front().first)),
                                gate_end + delivery_time(u0) / static_cast<double>(u0.chunks));
    const double next_compute = std::max(gpu_, end);
    r.breakdown.exposed_tail_s = std::max(0.0, post_start - last_compute);
    r.breakdown.post_update_s = gate_end - post_start;
    r.breakdown.exposed_head_s = next_compute - gate_end;
    return next_compute;
  }

  // The update's host-memory time beside the next forward's own host traffic F (its deliveries and
  // offloads, as this step's first forward had them), by progressive filling of bandwidth B: the
  // update (U bytes) ends at t = U/B + (the forward's bytes moved by then)/B. Spreading F over the
  // forward's compute time T, t = U / (B - F/T) while t < T; past T all of F shares: (U + F) / B.
  // T is compute, not the forward's measured length, so that the time depends on the plan's batch
  // shape and activations only: the planner's bounds relax chunks and latencies and must stay below.
  double shared_update_s(double update_bytes) const {
    const double B = c_.host_mem_Bps, F = forward_host_mem_bytes_;
    double T = 0;
    for (const UnitWork& w : sw_.units) T += w.fwd_s;
    const double all = (update_bytes + F) / B;
    if (all >= T || T <= 0) return all;
    return update_bytes / (B - F / T);
  }

  void begin_phase(double phase_start) {
    demand_ = PhaseDemand{};
    if (phase_start >= 0) std::swap(demand_, head_demand_);  // a backward: the head's gradients
    phase_start_ = phase_start;
    regime_.reset();
  }

  // Forward of unit u on the rank's compute stream, with its parameter delivery and offload.
  void forward_unit(int u) {
    ++setup_.counters.unit_visits;
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    // The step's first delivery: chunk k of unit 0 leaves once the previous step updated it.
    double ready = gated_ ? use_params(u, unit_gates_[static_cast<std::size_t>(u)].first, demand_,
                                       unit_gates_[static_cast<std::size_t>(u)].second)
                   : (micro_ == 0 && u == 0) ? use_params(u, next_gate_first_, demand_, next_gate_end_)
                                             : use_params(u, 0.0, demand_);
    double start = std::max(gpu_, ready);
    if (u >= 2) start = std::max(start, offload_end_[static_cast<std::size_t>(u - 2)]);
    if (first_compute_ < 0) first_compute_ = start;
    if (phase_start_ < 0) phase_start_ = start;
    gpu_ = start + w.fwd_s;
    compute_ += w.fwd_s;
    release(u, gpu_);
    if (w.tied_h2d_bytes > 0) release(0, gpu_);
    if (w.act_offload_bytes > 0) {
      double dt = copy_time(w.act_offload_bytes, d2h_rate_, 1);
      stats().d2h_busy += dt;
      double t = std::max(d2h_, start) + dt;
      d2h_ = t;
      offload_end_[static_cast<std::size_t>(u)] = t;
      d2h_bytes_ += w.act_offload_bytes;
      demand_.d2h_bytes += w.act_offload_bytes;
      demand_.host_mem_bytes += sw_.ranks * w.act_offload_bytes * hm_per_copy();
    }
    // The fused loss produced the head's gradients: they leave now, as the forward ends, so their
    // host-wide work counts in the backward's bound (head_demand_, added when it begins).
    if (w.kind == UnitKind::kHead) grads(u, last_, head_demand_, /*extra_gate=*/0.0);
  }

  // Recompute + backward of unit u, with its delivery, the prefetch of its offloaded input and
  // the departure of its gradients.
  void backward_unit(int u) {
    ++setup_.counters.unit_visits;
    const int U = static_cast<int>(sw_.units.size());
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    double ready = use_params(u, 0.0, demand_);
    if (w.act_offload_bytes > 0) {
      // Prefetch of the offloaded input, 2 deep: its buffer frees when backward of u+2 ends.
      double gate = u + 2 < U ? bwd_end_[static_cast<std::size_t>(u + 2)] : 0.0;
      double dt = copy_time(w.act_offload_bytes, h2d_rate_, 1);
      stats().h2d_busy += dt;
      double t = std::max(h2d_, gate) + dt;
      h2d_ = t;
      h2d_bytes_ += w.act_offload_bytes;
      demand_.h2d_bytes += w.act_offload_bytes;
      demand_.host_mem_bytes += sw_.ranks * w.act_offload_bytes * hm_per_copy();
      ready = std::max(ready, t);
    }
    double start = std::max(gpu_, ready);
    // Two gradient slots: unit u's gradient buffer is the one unit u+2 drained.
    if (u + 2 <= U - 1) start = std::max(start, grad_done_[static_cast<std::size_t>(u + 2)]);
    if (refetches(w)) {
      // DeepSpeed ZeRO-3: the recompute's forward hook released the parameters; the backward gathers
      // them again into a slot freed when the recompute ends.
      gpu_ = start + w.recompute_s;
      forget_slot(u, gpu_);
      start = std::max(gpu_, use_params(u, 0.0, demand_));
      gpu_ = start + w.bwd_s;
    } else {
      gpu_ = start + w.recompute_s + w.bwd_s;
    }
    compute_ += w.recompute_s + w.bwd_s;
    bwd_end_[static_cast<std::size_t>(u)] = gpu_;
    release(u, gpu_);
    if (u == 0 && last_ && (!sw_.traits.update_after_backward || sw_.traits.update_in_layer_order))
      begin_drain();
    grad_done_[static_cast<std::size_t>(u)] = grads(u, last_, demand_, 0.0);
  }

  // The step's last compute has ended: the CPU's backlog, timed at the backward's rate, runs at
  // the drain's from here on (no copies beside it), and so does the work still to come.
  void begin_drain() {
    const double ratio = cpu_factor_ / cpu_drain_;
    if (cpu_ > gpu_) {
      const double left = cpu_ - gpu_;
      stats().cpu_busy += std::min(left, stats().cpu_busy) * (ratio - 1);
      cpu_ = gpu_ + left * ratio;
    }
    retime_queued_exchanges(ratio);
    cpu_factor_ = cpu_drain_;
  }

  // ---- The regime jump's target (regime_jump.h) ----
  // Its state: 21 stream times and totals, 6 phase busy times, 3 per slot, 6 look-back entries.
  std::array<double, 6> stream_times() const { return {gpu_, h2d_, d2h_, cpu_, fabric_free_, convert_}; }
  void run_unit(int u, int dir) {
    if (dir > 0) {
      forward_unit(u);
    } else {
      backward_unit(u);
    }
  }

  // The state after unit u (processed in direction dir); slots in least-recently-used order.
  void save_state(JumpState& x, int u, int dir) const {
    std::size_t i = 0;
    const auto put = [&](double v) { x[i++] = v; };
    for (double v : {gpu_, h2d_, d2h_, cpu_, fabric_free_, convert_, static_cast<double>(use_counter_), compute_,
                     h2d_bytes_, d2h_bytes_, fabric_s_, h2d_copies_, d2h_copies_, host_mem_bytes_,
                     cpu_update_thread_s_, cpu_core_thread_s_, demand_.h2d_bytes, demand_.d2h_bytes,
                     demand_.host_mem_bytes, demand_.cpu_update_thread_s, demand_.cpu_core_thread_s})
      put(v);
    const PhaseStats& p = phases_[static_cast<std::size_t>(phase_)];
    for (double v : {p.h2d_busy, p.d2h_busy, p.cpu_busy, p.convert_busy, p.cpu_thread_s, p.cpu_host_mem_bytes}) put(v);
    // Slots by last use (insertion sort of a handful of indices).
    std::array<int, kJumpStateMax> order;
    const int D = static_cast<int>(slots_.size());
    for (int k = 0; k < D; ++k) {
      int m = k;
      for (; m > 0 && slots_[static_cast<std::size_t>(order[m - 1])].last_use > slots_[static_cast<std::size_t>(k)].last_use; --m)
        order[m] = order[m - 1];
      order[m] = k;
    }
    for (int k = 0; k < D; ++k) {
      const Slot& sl = slots_[static_cast<std::size_t>(order[k])];
      put(sl.unit), put(sl.free_at), put(static_cast<double>(sl.last_use));
    }
    // The look-back entries the next units read (u - 2 forward, u + 2 backward).
    const auto at = [](const std::vector<double>& v, int k) { return v[static_cast<std::size_t>(k)]; };
    if (dir > 0) {
      put(at(offload_end_, u)), put(at(offload_end_, u - 1));
      put(0), put(0), put(0), put(0);
    } else {
      put(at(bwd_end_, u)), put(at(bwd_end_, u + 1)), put(at(grad_done_, u)), put(at(grad_done_, u + 1));
      put(0), put(0);
    }
    while (i < state_padded_) put(0);  // the comparison runs over groups of four
  }

  // Sets the state to x + n d: the state after unit j = u + dir n if x is the state after unit u
  // and d one layer's change (save_state's layout). n = 0 restores x.
  void load_state(const JumpState& x, const JumpState& d, int n, int u, int dir) {
    std::size_t i = 0;
    const double nd = n;
    const auto next = [&] {
      const double v = x[i] + nd * d[i];
      ++i;
      return v;
    };
    gpu_ = next(), h2d_ = next(), d2h_ = next(), cpu_ = next(), fabric_free_ = next(), convert_ = next();
    use_counter_ = static_cast<long>(std::floor(next() + 0.5));
    compute_ = next(), h2d_bytes_ = next(), d2h_bytes_ = next(), fabric_s_ = next(), h2d_copies_ = next();
    d2h_copies_ = next(), host_mem_bytes_ = next(), cpu_update_thread_s_ = next(), cpu_core_thread_s_ = next();
    demand_.h2d_bytes = next(), demand_.d2h_bytes = next(), demand_.host_mem_bytes = next();
    demand_.cpu_update_thread_s = next(), demand_.cpu_core_thread_s = next();
    PhaseStats& p = stats();
    p.h2d_busy = next(), p.d2h_busy = next(), p.cpu_busy = next(), p.convert_busy = next();
    p.cpu_thread_s = next(), p.cpu_host_mem_bytes = next();
    for (Slot& sl : slots_) {  // any order: only last_use orders them
      sl.unit = static_cast<int>(std::floor(next() + 0.5));  // whole numbers, exact in a double
      sl.free_at = next();
      sl.last_use = static_cast<long>(std::floor(next() + 0.5));
    }
    // Look-back arrays: the two entries the next units read. (Entries between u and j keep what
    // they held; nothing reads them again.)
    const int j = u + dir * n;
    const auto set = [&](std::vector<double>& v, std::size_t at) {
      v[static_cast<std::size_t>(j)] = x[at] + nd * d[at];
      v[static_cast<std::size_t>(j - dir)] = x[at + 1] + nd * d[at + 1];
    };
    if (dir > 0) {
      set(offload_end_, i);
    } else {
      set(bwd_end_, i);
      set(grad_done_, i + 2);
    }
  }

  // Called after unit u was processed in direction dir; returns the last unit processed (u, or the
  // end of a verified jump).
  int jump_after(int u, int dir) {
    const int U = static_cast<int>(sw_.units.size());
    // The maps of units u - dir .. j must be the same: identical units, and the loops' index tests
    // (forward reads u - 2 from u >= 2 on; backward reads u + 2 up to U - 3) constant over them.
    const int prev = u - dir;
    const bool eligible = dir > 0 ? prev >= 2 && setup_.same_as_prev[static_cast<std::size_t>(u)]
                                  : prev <= U - 3 && setup_.same_as_prev[static_cast<std::size_t>(prev)];
    // The run of identical units ahead: u + dir .. last. (Backward never jumps onto unit 0, whose
    // update gates the next step; it is never identical to a decoder layer anyway.)
    const int last = dir > 0 ? setup_.run_end[static_cast<std::size_t>(u)]
                             : std::max(1, setup_.run_start[static_cast<std::size_t>(u)]);
    return regime_.after_unit(*this, u, dir, eligible, last, setup_.counters);
  }

  // ---- The jump over the periodic middle of the micro-steps ----
  // Micro-steps 1 .. A-2 apply the same map to the recurrence's state (the first starts the step,
  // the last updates), a max-plus map like a layer's (regime_jump.h): once two consecutive ones
  // changed the state by the same d, the state after n more is x + n d while every max keeps its
  // branch, which a run of the target micro-step from x + (n-1) d verifies (a failure bisects, as
  // RegimeJump does). The jumped micro-steps' phases are the last one's, repeated (micro_repeat_).
  // With contention factors, a jump stays within micro-steps that share theirs.

  // The state after the micro-step stored in pair m: stream times, host queues, totals, the pair's
  // phases and what they spilled into the next, the slots in least-recently-used order.
  void save_micro(std::vector<double>& x, int m) const {
    x.clear();
    for (double v : {gpu_, h2d_, d2h_, cpu_, fabric_free_, convert_, network_, exchanged_, queue_host_mem_, queue_cpu_update_,
                     queue_cpu_cores_, static_cast<double>(use_counter_), compute_, h2d_bytes_, d2h_bytes_, fabric_s_,
                     h2d_copies_, d2h_copies_, network_s_, host_mem_bytes_, cpu_update_thread_s_, cpu_core_thread_s_,
                     cpu0_start_, cpu0_end_, cpu0_s_})
      x.push_back(v);
    for (std::size_t k = 2 * static_cast<std::size_t>(m); k < 2 * static_cast<std::size_t>(m) + 3; ++k) {
      const PhaseStats& p = phases_[k];
      for (double v : {p.start, p.end, p.gpu_end, p.h2d_busy, p.d2h_busy, p.cpu_busy, p.convert_busy, p.cpu_thread_s,
                       p.cpu_host_mem_bytes})
        x.push_back(v);
    }
    std::vector<const Slot*> order;
    for (const Slot& sl : slots_) order.push_back(&sl);
    std::sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) { return a->last_use < b->last_use; });
    for (const Slot* sl : order) {
      x.push_back(sl->unit);
      x.push_back(sl->free_at);
      x.push_back(static_cast<double>(sl->last_use));
    }
  }

  // Sets the state to x + n d (save_micro's layout) with its phases in pair m.
  void load_micro(const std::vector<double>& x, const std::vector<double>& d, long n, int m) {
    std::size_t i = 0;
    const double nd = static_cast<double>(n);
    const auto next = [&] {
      const double v = x[i] + nd * d[i];
      ++i;
      return v;
    };
    const auto whole = [&] { return std::floor(next() + 0.5); };  // exact in a double
    gpu_ = next(), h2d_ = next(), d2h_ = next(), cpu_ = next(), fabric_free_ = next(), convert_ = next();
    network_ = next(), exchanged_ = next(), queue_host_mem_ = next(), queue_cpu_update_ = next(), queue_cpu_cores_ = next();
    use_counter_ = static_cast<long>(whole());
    compute_ = next(), h2d_bytes_ = next(), d2h_bytes_ = next(), fabric_s_ = next(), h2d_copies_ = next();
    d2h_copies_ = next(), network_s_ = next(), host_mem_bytes_ = next(), cpu_update_thread_s_ = next();
    cpu_core_thread_s_ = next(), cpu0_start_ = next(), cpu0_end_ = next(), cpu0_s_ = next();
    phases_.resize(2 * static_cast<std::size_t>(m) + 3);
    for (std::size_t k = 2 * static_cast<std::size_t>(m); k < phases_.size(); ++k) {
      PhaseStats& p = phases_[k];
      p.start = next(), p.end = next(), p.gpu_end = next(), p.h2d_busy = next(), p.d2h_busy = next();
      p.cpu_busy = next(), p.convert_busy = next(), p.cpu_thread_s = next(), p.cpu_host_mem_bytes = next();
    }
    for (Slot& sl : slots_) {  // any order: only last_use orders them
      sl.unit = static_cast<int>(whole());
      sl.free_at = next();
      sl.last_use = static_cast<long>(whole());
    }
  }

  // Called after micro-step a ran into pair m; returns the last micro-step done (a, or the end of a
  // verified jump, whose micro-steps pair m then stands for).
  long jump_micro_after(long a, int m) {
    const long A = sw_.accum_steps;
    if (a > A - 2) return a;
    // The states after the last three micro-steps (a ring): a-2, a-1, a.
    std::vector<double>& now = micro_x_[micro_history_ % 3];
    save_micro(now, m);
    ++micro_history_;
    // The maps of micro-steps a-1 and a must be the middle one's, with the same factors.
    if (micro_history_ < 3 || a < 2 || !same_factors(a - 1, a)) return a;
    const std::vector<double>& prev = micro_x_[(micro_history_ - 2) % 3];
    const std::vector<double>& prev2 = micro_x_[(micro_history_ - 3) % 3];
    micro_d_.resize(now.size());
    for (std::size_t i = 0; i < now.size(); ++i) {
      micro_d_[i] = now[i] - prev[i];
      if (!same_delta(micro_d_[i], prev[i] - prev2[i], now[i])) return a;
    }
    // The last micro-step that may be reached: the step's last middle one, with a's factors.
    long last = A - 2;
    if (!contention_.empty())  // factors change only where the factors' step starts another pair
      last = std::min(last, contention_micro_end_.empty() ? a : contention_micro_end_[contention_pair(a)] - 1);
    const long n = last - a;
    if (n < 2) return a;
    const std::vector<double> x = now;
    std::vector<double> y;
    long good = 0, bad = n + 1, try_n = n;
    int attempts = 0;
    while (bad - good > 1 && attempts < kMaxMicroAttempts) {
      ++attempts;
      ++setup_.counters.micro_verifications;
      load_micro(x, micro_d_, try_n - 1, m);
      run_micro_step(a + try_n, m + 1);
      save_micro(y, m + 1);
      bool follows = y.size() == x.size();
      for (std::size_t i = 0; follows && i < x.size(); ++i)
        follows = same_delta(y[i] - x[i] - static_cast<double>(try_n - 1) * micro_d_[i], micro_d_[i], y[i]);
      (follows ? good : bad) = try_n;
      try_n = (good + bad) / 2;
    }
    micro_history_ = 0;
    load_micro(x, micro_d_, good, m);
    if (good == 0) return a;
    micro_repeat_[static_cast<std::size_t>(m)] += good;
    ++setup_.counters.micro_jumps;
    setup_.counters.micro_steps_jumped += good;
    return a + good;
  }

  bool same_factors(long a, long b) const {
    return contention_.empty() || contention_pair(a) == contention_pair(b);
  }
  // Verifications per jump: bisection over up to 2^24 micro-steps, then stop trying.
  static constexpr int kMaxMicroAttempts = 24;

  void reset_counters() {
    queue_host_mem_ = queue_cpu_update_ = queue_cpu_cores_ = 0;
    h2d_bytes_ = d2h_bytes_ = fabric_s_ = h2d_copies_ = d2h_copies_ = network_s_ = 0;
    host_mem_bytes_ = cpu_update_thread_s_ = cpu_core_thread_s_ = compute_ = 0;
    phases_.clear();
    micro_repeat_.clear();
  }

  // The next step's first delivery, as a probe: stream times are not advanced.
  double deliver_chain_probe(const UnitWork& w, double gate) {
    double h2d = h2d_, fabric = fabric_free_, conv = convert_;
    PhaseStats saved = stats();
    double end = deliver_chain(w, gate);
    h2d_ = h2d, fabric_free_ = fabric, convert_ = conv;
    stats() = saved;
    return end;
  }

  // Factors of micro-step a's forward (which = 0) or backward (1), a counted over the whole step.
  PhaseContention factors(long a, int which) const {
    if (contention_.empty()) return PhaseContention{};
    const std::size_t m = contention_pair(a);
    const std::size_t k = 2 * m + static_cast<std::size_t>(which);
    return k < contention_.size() ? contention_[k] : PhaseContention{};
  }
  // The pair of phases of the factors' step that micro-step a belongs to (micro_repeat's runs).
  std::size_t contention_pair(long a) const {
    if (contention_micro_end_.empty()) return static_cast<std::size_t>(a);
    return static_cast<std::size_t>(std::upper_bound(contention_micro_end_.begin(), contention_micro_end_.end(), a) -
                                    contention_micro_end_.begin());
  }
  void set_contention(const std::vector<PhaseContention>& contention, const std::vector<long>& micro_repeat) {
    contention_ = contention;
    contention_micro_end_.clear();
    long end = 0;
    for (long r : micro_repeat) contention_micro_end_.push_back(end += r);
  }

  // Phase k of the stored phases, micro-step a's forward or backward (`which`).
  void set_phase(int k, long a, int which) {
    phase_ = k;
    next_factors_ = which == 0 ? factors(a, 1) : factors(a + 1, 0);
    const PhaseContention f = factors(a, which);
    h2d_rate_ = h2d_rate0_ * f.h2d;
    d2h_rate_ = d2h_rate0_ * f.d2h;
    inv_h2d_rate_ = 1.0 / h2d_rate_;
    inv_d2h_rate_ = 1.0 / d2h_rate_;
    cpu_factor_ = f.cpu;
    convert_factor_ = f.convert;
    cpu_drain_ = f.cpu_drain;
  }
  void close_phase(double start, double end) {
    PhaseStats& p = phases_[static_cast<std::size_t>(phase_)];
    p.start = start;
    p.end = end;
    p.gpu_end = gpu_;
    // Work a phase issued that its streams are still doing when it ends (the head's gradients
    // leave as the forward ends) overlaps the next phase, not this one: the utilizations that
    // set the sharing factors count it there. Each stream is in order, so what is left of it is
    // at most the time from the phase's end to when the stream frees.
    // Every phase but the step's last has a next one.
    const bool step_end = last_ && phase_ % 2 == 1;
    if (!step_end) {
      if (phases_.size() < static_cast<std::size_t>(phase_) + 2) phases_.resize(static_cast<std::size_t>(phase_) + 2);
      PhaseStats& next = phases_[static_cast<std::size_t>(phase_) + 1];
      // A stream's backlog at the phase end was timed at this phase's rate; it runs at the next
      // phase's (the CPU's accumulation spilling into the next forward shares host memory with
      // that forward's deliveries, not with this backward's gradients).
      if (!contention_.empty()) {
        const PhaseContention& next_f = next_factors_;
        const auto retime = [end](double& stream_free, double& busy, double ratio) {
          if (stream_free <= end) return;
          const double left = stream_free - end;
          busy += std::min(left, busy) * (ratio - 1);
          stream_free = end + left * ratio;
        };
        retime(cpu_, p.cpu_busy, cpu_factor_ / next_f.cpu);
        retime(h2d_, p.h2d_busy, h2d_rate_ / (h2d_rate0_ * next_f.h2d));
        retime(d2h_, p.d2h_busy, d2h_rate_ / (d2h_rate0_ * next_f.d2h));
      }
      const auto spill = [end](double& busy, double& next_busy, double stream_free) {
        const double left = std::clamp(stream_free - end, 0.0, busy);
        busy -= left;
        next_busy += left;
      };
      spill(p.h2d_busy, next.h2d_busy, h2d_);
      spill(p.d2h_busy, next.d2h_busy, d2h_);
      spill(p.cpu_busy, next.cpu_busy, cpu_);
      spill(p.convert_busy, next.convert_busy, convert_);
    }
  }
  PhaseStats& stats() { return phases_[static_cast<std::size_t>(phase_)]; }
  double hm_per_copy() const { return c_.emulated ? 2.0 : 1.0; }

  double copy_time(double bytes, double rate, double copies) {
    return bytes / rate + lat_ * copies * c_.link_latency_s;
  }

  const UnitConst& konst(const UnitWork& w) const {
    return (*unit_const_)[static_cast<std::size_t>(setup_.run_of[static_cast<std::size_t>(w.index)])];
  }

  double delivery_time(const UnitWork& w) const {
    const UnitConst& k = konst(w);
    double h2d = k.h2d_bytes * inv_h2d_rate_ + k.h2d_latency_s;
    return pipelined_time({w.deliver_convert_thread_s / (c_.convert_threads_per_rank * convert_factor_), h2d, k.allgather_s},
                          k.chunks);
  }

  // Chunk-pipelined stages, each on its own in-order stream: stage i may start a chunk when its
  // stream is free and stage i-1 finished that chunk. Returns the end of the last stage. Streams
  // with zero work are skipped (they neither wait nor delay).
  struct Stage {
    double* stream_free;
    double duration;
  };
  static double chain(std::initializer_list<Stage> stages, double inv_chunks, double gate, double* first_chunk_out = nullptr) {
    double prev_first = gate, prev_end = gate;
    for (const Stage& st : stages) {
      if (st.duration <= 0) continue;
      double start = std::max(*st.stream_free, prev_first);
      const double per_chunk = st.duration * inv_chunks;
      double end = std::max(start + st.duration, prev_end + per_chunk);
      prev_first = start + per_chunk;
      prev_end = end;
      *st.stream_free = end;
    }
    if (first_chunk_out) *first_chunk_out = prev_first;
    return prev_end;
  }

  // One delivery of unit w to this rank, starting no earlier than `gate`; returns when it is usable.
  // `tied_resident`: a tied head whose embedding is still in a slot moves only its own parameters.
  double deliver_chain(const UnitWork& w, double gate, bool tied_resident = false) {
    const UnitConst& k = konst(w);
    double h2d = (k.h2d_bytes - (tied_resident ? w.tied_h2d_bytes : 0.0)) * inv_h2d_rate_ + k.h2d_latency_s;
    stats().h2d_busy += h2d;
    const double conv = w.deliver_convert_thread_s / (c_.convert_threads_per_rank * convert_factor_);
    stats().convert_busy += conv;
    double allgather = k.allgather_s;
    if (tied_resident && w.tied_allgather_bytes > 0)
      allgather = w.deliver_allgather_bytes > 0
                      ? w.deliver_allgather_bytes / c_.allgather_busbw_Bps + lat_ * k.chunks * c_.fabric_latency_s
                      : 0.0;
    return chain({{&convert_, conv}, {&h2d_, h2d}, {&fabric_free_, allgather}}, k.inv_chunks, gate);
  }

  Slot& lru_slot() {
    return *std::min_element(slots_.begin(), slots_.end(),
                             [](const Slot& a, const Slot& b) { return a.last_use < b.last_use; });
  }

  // Puts unit `u` in a slot without a delivery of its own: a tied head reads the embedding from a
  // slot of its own, as the executor delivers it (its bytes travel with the head's, which wait for
  // both slots), evicting the least recently used unit. Returns when that slot is free, or -1 when u
  // was resident (then not delivered again).
  double occupy_slot(int u) {
    ++use_counter_;
    for (auto& s : slots_)
      if (s.unit == u) {
        s.last_use = use_counter_;
        return -1.0;
      }
    Slot& slot = lru_slot();
    slot.unit = u;
    slot.last_use = use_counter_;
    return slot.free_at;
  }

  bool refetches(const UnitWork& w) const {
    return sw_.traits.refetch_for_recompute && w.policy == ActivationPolicy::kRecompute && w.recompute_s > 0;
  }

  // Drops unit u from its slot, free from t: its next use delivers it again.
  void forget_slot(int u, double t) {
    for (auto& s : slots_)
      if (s.unit == u) {
        s.unit = -1;
        s.last_use = -1;
        s.free_at = t;
      }
  }

  void invalidate_slots() {
    for (auto& s : slots_) s.unit = -1;
  }

  // Makes unit u's parameters available; returns when they are. Accounts traffic into `ph`.
  double use_params(int u, double gate, PhaseDemand& ph, double gate_end = 0.0) {
    ++use_counter_;
    for (auto& s : slots_)
      if (s.unit == u) {
        s.last_use = use_counter_;
        return gate;  // still resident
      }
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    Slot& slot = lru_slot();
    slot.unit = u;
    slot.last_use = use_counter_;
    const double tied_slot = w.tied_h2d_bytes > 0 ? occupy_slot(0) : 0.0;
    const bool tied_resident = tied_slot < 0;  // the embedding is not delivered again
    const double slot_free = std::max(slot.free_at, tied_slot);
    const SystemTraits& tr = sw_.traits;
    if (tr.params_resident) return gate;
    if (tr.gpu_sharded_state) {
      double t = std::max(fabric_free_, slot_free) + w.deliver_allgather_bytes / c_.allgather_busbw_Bps +
                 lat_ * c_.fabric_latency_s;
      fabric_s_ += t - std::max(fabric_free_, slot_free);
      fabric_free_ = t;
      return t;
    }
    const double gate_all = std::max(slot_free, gate);
    double end = deliver_chain(w, gate_all, tied_resident);
    const double chunks = static_cast<double>(w.chunks);
    if (gate_end > 0) end = std::max(end, gate_end + delivery_time(w) / chunks);
    const double tied_h2d = tied_resident ? 0.0 : w.tied_h2d_bytes;
    h2d_bytes_ += w.deliver_h2d_bytes + tied_h2d;
    d2h_bytes_ += w.deliver_d2h_bytes;
    ph.h2d_bytes += w.deliver_h2d_bytes + tied_h2d;
    ph.d2h_bytes += w.deliver_d2h_bytes;
    h2d_copies_ += chunks;
    double ag = w.deliver_allgather_bytes + (tied_resident ? 0.0 : w.tied_allgather_bytes);
    if (ag > 0) fabric_s_ += ag / c_.allgather_busbw_Bps + lat_ * chunks * c_.fabric_latency_s;
    double hm = sw_.ranks * (w.deliver_host_mem_bytes + (tied_resident ? 0.0 : w.tied_host_mem_bytes));
    ph.host_mem_bytes += hm;
    host_mem_bytes_ += hm;
    double conv = sw_.ranks * w.deliver_convert_thread_s;
    ph.cpu_core_thread_s += conv;
    cpu_core_thread_s_ += conv;
    if (c_.emulated) {
      double copy_threads = sw_.ranks * (w.deliver_h2d_bytes + tied_h2d) / c_.h2d_link_Bps;
      ph.cpu_core_thread_s += copy_threads;
      cpu_core_thread_s_ += copy_threads;
    }
    return end;
  }

  void release(int u, double t) {
    for (auto& s : slots_)
      if (s.unit == u) s.free_at = t;
  }

  // Gradients of unit u leave the rank after its backward (gpu_ = its end); returns when the
  // rank's gradient buffer is drained. Also schedules the CPU reduction/update.
  double grads(int u, bool last, PhaseDemand& ph, double extra_gate) {
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    const SystemTraits& tr = sw_.traits;
    const UnitConst& k = konst(w);
    const double chunks = k.grad_chunks;
    const double rs = k.reduce_scatter_s;
    fabric_s_ += rs;
    network_s_ += k.reduce_scatter_nic_s;
    // ZeRO-Offload with accumulation and ZeRO-3's round trip: only the last micro-step's gradient
    // leaves by the D2H queue.
    const bool roundtrip = w.accum_in_h2d_bytes > 0;
    const bool trip = w.trip_out_d2h_bytes > 0;
    const double d2h_bytes = (roundtrip || trip) && !last ? 0.0 : k.grad_d2h_bytes;
    const double d2h = d2h_bytes > 0 ? d2h_bytes * inv_d2h_rate_ + k.grad_latency_s : 0.0;
    stats().d2h_busy += d2h;
    double gate = std::max(gpu_, extra_gate);
    if (tr.shared_grad_buffer) gate = std::max(gate, cpu_);  // waits for the previous unit's update
    double first_chunk = gate;
    double end;
    if (k.reduce_scatter_nic_s > 0) {
      // Across nodes the collective needs the node's network as well as the ports, and shares it
      // fairly with what the network still carries when it starts (the gathers of updated mirrors,
      // B seconds of it): both at half rate until the shorter is done, so the collective takes
      // min(nic, B) longer and the network's work ends nic later than it would have.
      const double nic = k.reduce_scatter_nic_s;
      const double start = std::max(fabric_free_, gate);
      const double backlog = std::max(0.0, network_ - start);
      end = chain({{&fabric_free_, std::max(rs, nic + std::min(nic, backlog))}, {&d2h_, d2h}}, k.inv_grad_chunks, gate,
                  &first_chunk);
      network_ = reduce_scatter_network_end_ = std::max(network_, start) + nic;
    } else if (roundtrip) {
      double rs_first = gate;
      const double rs_end = chain({{&fabric_free_, rs}}, k.inv_grad_chunks, gate, &rs_first);
      gpu_ = accumulate_on_gpu(w, k, last, rs_first, rs_end, ph);
      end = chain({{&d2h_, d2h}}, k.inv_grad_chunks, gpu_, &first_chunk);
    } else if (trip) {
      end = partition_round_trip(w, k, gate, rs, d2h, &first_chunk, ph);
    } else {
      end = chain({{&fabric_free_, rs}, {&d2h_, d2h}}, k.inv_grad_chunks, gate, &first_chunk);
    }
    d2h_bytes_ += d2h_bytes;
    ph.d2h_bytes += d2h_bytes;
    if (d2h_bytes > 0) d2h_copies_ += chunks;  // (the round trips count their own)
    double hm_copy = sw_.ranks * d2h_bytes * hm_per_copy();
    ph.host_mem_bytes += hm_copy;
    host_mem_bytes_ += hm_copy;
    // CPU work (all ranks' chunks reduced together).
    double thread_s = last ? w.cpu_last_thread_s : w.cpu_accum_thread_s;
    double hm = last ? w.cpu_last_host_mem_bytes : w.cpu_accum_host_mem_bytes;
    double cpu_s = thread_s / (c_.update_threads * cpu_factor_);
    stats().cpu_busy += cpu_s;
    stats().cpu_thread_s += thread_s;
    stats().cpu_host_mem_bytes += hm;
    if (tr.barriers_per_chunk > 0) cpu_s += lat_ * tr.barriers_per_chunk * chunks * c_.link_latency_s;
    double cpu_start = std::max(cpu_, first_chunk);
    double cpu_end = std::max(cpu_start + cpu_s, end + cpu_s * k.inv_grad_chunks);
    if (thread_s > 0) cpu_ = cpu_end;
    if (c_.nodes > 1 && thread_s > 0) cpu_end = across_nodes(w, k, last, cpu_start, cpu_s, cpu_end, ph);
    ph.cpu_update_thread_s += thread_s;
    ph.host_mem_bytes += hm;
    cpu_update_thread_s_ += thread_s;
    host_mem_bytes_ += hm;
    if (u == 0) {
      cpu0_start_ = cpu_start;
      cpu0_end_ = cpu_end;
      cpu0_s_ = cpu_s;
    }
    return end;
  }

  // ZeRO-3's round trip of unit w's partition after its reduction on DeepSpeed's reduce stream, beside
  // compute: each chunk out, back in and, on the last micro-step, out again as fp32 (`d2h`, its time),
  // one copy after the other, the stream held by the D2H queue; the copy in shares the H2D link (its
  // bytes are in the phase's demand) without a place in the queue of deliveries, so it is charged at
  // the link's own rate, not the queue's share.
  // Returns the end of the last copy.
  double partition_round_trip(const UnitWork& w, const UnitConst& k, double gate, double rs, double d2h,
                              double* first_chunk, PhaseDemand& ph) {
    const double out_s = w.trip_out_d2h_bytes * inv_d2h_rate_ + lat_ * k.grad_chunks * c_.link_latency_s;
    const double in_s = copy_time(w.trip_in_h2d_bytes, h2d_rate0_, k.grad_chunks);
    const double end =
        chain({{&fabric_free_, rs}, {&d2h_, out_s + in_s + d2h}}, k.inv_grad_chunks, gate, first_chunk);
    stats().d2h_busy += out_s;
    stats().h2d_busy += in_s;
    d2h_bytes_ += w.trip_out_d2h_bytes;
    h2d_bytes_ += w.trip_in_h2d_bytes;
    ph.d2h_bytes += w.trip_out_d2h_bytes;
    ph.h2d_bytes += w.trip_in_h2d_bytes;
    d2h_copies_ += k.grad_chunks;
    h2d_copies_ += k.grad_chunks;
    const double hm = sw_.ranks * (w.trip_out_d2h_bytes + w.trip_in_h2d_bytes) * hm_per_copy();
    ph.host_mem_bytes += hm;
    host_mem_bytes_ += hm;
    return end;
  }

  // ZeRO-Offload's fp16 accumulation of unit w's partition, on the compute stream after its reduction
  // (rs_first: its first chunk reduced, rs_end: its last): the sum so far back in and added on every
  // micro-step but the first, the new sum out on every one but the last. One stream carries both
  // copies and the add, chunk after chunk, so they overlap neither each other nor compute. Returns
  // when the compute stream is free again.
  double accumulate_on_gpu(const UnitWork& w, const UnitConst& k, bool last, double rs_first, double rs_end,
                           PhaseDemand& ph) {
    const double in_bytes = micro_ > 0 ? w.accum_in_h2d_bytes : 0.0;
    const double out_bytes = last ? 0.0 : w.accum_out_d2h_bytes;
    // At a direction's own rate, not the phase's mean-field share: one stream carries both copies one
    // after the other, so they never share the link's duplex with each other.
    const double in_s = in_bytes > 0 ? copy_time(in_bytes, h2d_rate0_, k.grad_chunks) : 0.0;
    const double out_s = out_bytes > 0 ? copy_time(out_bytes, d2h_rate0_, k.grad_chunks) : 0.0;
    const double add_s = micro_ > 0 ? w.accum_add_gpu_s : 0.0;
    const double total = in_s + add_s + out_s;
    // The copies share each link with what its queue carries meanwhile (deliveries, offloads): they
    // do not wait for it, and the queue's later work moves back by their time on it.
    const double start = std::max(gpu_, rs_first);
    const double end = std::max(start + total, rs_end + total * k.inv_grad_chunks);
    if (in_s > 0) h2d_ = std::max(h2d_, start) + in_s;
    if (out_s > 0) d2h_ = std::max(d2h_, start + in_s + add_s) + out_s;
    stats().h2d_busy += in_s;
    stats().d2h_busy += out_s;
    compute_ += add_s;
    h2d_bytes_ += in_bytes;
    d2h_bytes_ += out_bytes;
    ph.h2d_bytes += in_bytes;
    ph.d2h_bytes += out_bytes;
    if (in_s > 0) h2d_copies_ += k.grad_chunks;
    if (out_s > 0) d2h_copies_ += k.grad_chunks;
    const double hm = sw_.ranks * (in_bytes + out_bytes) * hm_per_copy();
    ph.host_mem_bytes += hm;
    host_mem_bytes_ += hm;
    return end;
  }

  // Several nodes, every micro-step: after the node's reduction (cpu_start .. reduce_end, chunk by
  // chunk) each chunk is exchanged over the network (a queue of its own), then added up and
  // accumulated, or on the last micro-step updated, on the CPU, and with a sharded state its updated
  // mirror all-gathered. The CPU works on the next unit while the network carries this one; the unit
  // counts as updated when its last chunk's after-exchange work (and gather) is done. Returns that
  // time; the CPU queue (cpu_) advances by the after-exchange work only, so the next unit's reduction
  // is not held behind this unit's exchange.
  double across_nodes(const UnitWork& w, const UnitConst& k, bool last, double cpu_start, double reduce_s,
                      double reduce_end, PhaseDemand& ph) {
    const double inv = k.inv_grad_chunks, chunks = k.grad_chunks;
    const double lat = lat_ * w.nic_messages / 2 * c_.nic_latency_s;  // per chunk and exchange
    // (The gpu route exchanged nothing here: its reduce-scatter spanned the nodes.)
    const double xchg = w.nic_exchange_bytes > 0 ? w.nic_exchange_bytes / c_.nic_Bps + chunks * lat : 0.0;
    const double gather_bytes = last ? w.nic_gather_bytes : 0.0;
    const double gather = gather_bytes > 0 ? gather_bytes / c_.nic_Bps + chunks * lat : 0.0;
    const double after_thread_s = last ? w.cpu_after_exchange_thread_s : w.cpu_accum_after_exchange_thread_s;
    const double after_hm = last ? w.cpu_after_exchange_host_mem_bytes : w.cpu_accum_after_exchange_host_mem_bytes;
    const double after_s = after_thread_s / (c_.update_threads * cpu_factor_);
    stats().cpu_busy += after_s;
    stats().cpu_thread_s += after_thread_s;
    stats().cpu_host_mem_bytes += after_hm;
    const double hm = after_hm + w.nic_host_mem_bytes + 2.0 * gather_bytes;
    ph.cpu_update_thread_s += after_thread_s;
    ph.host_mem_bytes += hm;
    cpu_update_thread_s_ += after_thread_s;
    host_mem_bytes_ += hm;
    network_s_ += xchg + gather;
    // The last micro-step's exchanges queued before the step's last compute: the drain re-times them.
    if (last && w.index > 0 && !sw_.traits.update_after_backward) {
      if (queued_.empty()) queue_network_start_ = network_, queue_exchanged_start_ = exchanged_;
      queued_.push_back({reduce_scatter_network_end_, cpu_start, reduce_s, reduce_end, xchg, after_s, gather, inv});
    }
    const ExchangeTiming t = time_exchange(network_, cpu_start, reduce_s, reduce_end, xchg, after_s, gather, inv);
    cpu_ += after_s;
    network_ = t.network_free;
    exchanged_ = std::max(exchanged_, t.done);
    return t.done;
  }

  // One unit's exchange on the network and the CPU work after it, from when the network is free and
  // when the unit's reduction runs (cpu_start .. reduce_end, reduce_s long, chunk by chunk: `inv` is
  // 1 / chunks). The exchange starts with the first reduced chunk and ends no earlier than the last
  // one plus a chunk's; the after-exchange work follows it and shares the CPU with the reductions; a
  // sharded state's gather of the updated mirror follows that on the network. Returns when the
  // network is free again and when the unit is done.
  struct ExchangeTiming {
    double network_free, done;
  };
  static ExchangeTiming time_exchange(double network, double cpu_start, double reduce_s, double reduce_end,
                                      double xchg, double after_s, double gather, double inv) {
    const double x_start = std::max(network, cpu_start + reduce_s * inv);
    const double x_end = std::max(x_start + xchg, reduce_end + xchg * inv);
    const double a_end = std::max({x_end + after_s * inv, reduce_end + after_s, x_start + xchg * inv + after_s});
    if (gather <= 0) return {x_end, a_end};
    const double g_start = std::max(x_end, x_start + xchg * inv + after_s * inv);
    const double done = std::max(g_start + gather, a_end + gather * inv);
    return {done, done};
  }

  // The exchanges the last micro-step queued before its last compute were timed with the CPU at the
  // backward's contention rate. From the drain on the CPU runs at the drain's (begin_drain re-times
  // its backlog), so each queued exchange is timed again behind its unit's re-timed reduction; the
  // network's occupancy by anything else (the gpu route's reduce-scatter across nodes) stays.
  void retime_queued_exchanges(double ratio) {
    if (queued_.empty()) return;
    auto at_drain = [&](double t) { return t > gpu_ ? gpu_ + (t - gpu_) * ratio : t; };
    double network = queue_network_start_, exchanged = queue_exchanged_start_;
    for (const QueuedExchange& q : queued_) {
      network = std::max(network, q.reduce_scatter_end);  // the gpu route's own occupancy, GPU-timed
      const double start = at_drain(q.cpu_start), end = at_drain(q.reduce_end);
      const double reduce_s = at_drain(q.cpu_start + q.reduce_s) - start;
      const double after_s = at_drain(q.reduce_end + q.after_s) - end;
      const ExchangeTiming t = time_exchange(network, start, reduce_s, end, q.xchg, after_s, q.gather, q.inv);
      network = t.network_free;
      exchanged = std::max(exchanged, t.done);
    }
    network_ = network;
    exchanged_ = exchanged;
    queued_.clear();
  }

  // The shortest time in which the host links can carry a phase's transfers: the GPU cannot end
  // the phase before (its computes consume the deliveries; the gradient slots hold the rest).
  double link_need(const PhaseDemand& d) const {
    const double N = sw_.ranks;
    return std::max({d.h2d_bytes / c_.h2d_link_Bps, d.d2h_bytes / c_.d2h_link_Bps, (d.h2d_bytes + d.d2h_bytes) / c_.duplex_Bps,
                     N * d.h2d_bytes / c_.h2d_root_Bps, N * d.d2h_bytes / c_.d2h_root_Bps});
  }

  // Host memory and the CPU may lag behind the GPU (a micro-step's accumulation runs on during the
  // next forward), so their work is a queue across the step's phases rather than a bound on each
  // phase: a phase's work starts no earlier than its first compute and after the earlier phases'
  // work on the same resource; the step cannot end before the queue drains. (A bound per phase
  // would hold the GPU until each phase's CPU work is done, which the simulator does not.)
  void queue_host_work(const PhaseDemand& d, double phase_start) {
    const auto add = [phase_start](double& q, double need) { q = std::max(q, phase_start) + need; };
    add(queue_host_mem_, d.host_mem_bytes / c_.host_mem_Bps);
    add(queue_cpu_update_, d.cpu_update_thread_s / c_.update_threads);
    add(queue_cpu_cores_, d.cpu_core_thread_s / c_.cpu_cores);
  }
  double host_queue_end() const { return std::max({queue_host_mem_, queue_cpu_update_, queue_cpu_cores_}); }

  const StepWork& sw_;
  RecurrenceSetup& setup_;
  const std::vector<UnitConst>* unit_const_;
  bool jump_ = false;
  const Capacities& c_;
  double lat_;
  double h2d_rate0_, d2h_rate0_;  // one direction alone on a rank's link (root share and duplex cap applied)
  double h2d_rate_ = 0, d2h_rate_ = 0, cpu_factor_ = 1, convert_factor_ = 1;  // the current phase's rates
  double inv_h2d_rate_ = 0, inv_d2h_rate_ = 0;
  std::vector<double> offload_end_, grad_done_, bwd_end_;
  double cpu_drain_ = 1;
  std::vector<PhaseContention> contention_;   // per phase of the factors' step (none: all 1)
  std::vector<long> contention_micro_end_;     // its pairs' last micro-step + 1 (empty: one each)
  PhaseContention next_factors_;               // the next phase's factors
  std::vector<PhaseStats> phases_;             // per pair of phases run (2 per micro-step)
  std::vector<long> micro_repeat_;             // micro-steps each pair stands for
  int phase_ = 0;
  std::vector<Slot> slots_;
  long use_counter_ = 0;
  double gpu_ = 0, h2d_ = 0, d2h_ = 0, cpu_ = 0, fabric_free_ = 0, convert_ = 0;
  double network_ = 0;    // several nodes: when this node's network is free
  double exchanged_ = 0;  // several nodes: when every exchange so far has been added up on the CPU
  // Several nodes: the last micro-step's exchanges as queued before the drain (across_nodes' inputs).
  struct QueuedExchange {
    double reduce_scatter_end, cpu_start, reduce_s, reduce_end, xchg, after_s, gather, inv;
  };
  double queue_network_start_ = 0, queue_exchanged_start_ = 0;  // network_ and exchanged_ at the first queued exchange
  double reduce_scatter_network_end_ = 0;  // several nodes, gpu route: when its latest reduce-scatter left the network
  std::vector<QueuedExchange> queued_;
  double cpu0_start_ = 0, cpu0_end_ = 0, cpu0_s_ = 0;
  double next_gate_first_ = 0, next_gate_end_ = 0;  // gating of the next step's first delivery
  // Update in layer order: per unit, when its first chunk and its last are updated (the next step's
  // forward waits on them), and the update's host work, carried into that forward.
  std::vector<std::pair<double, double>> unit_gates_;
  bool gated_ = false;
  PhaseDemand carried_;
  double carried_start_ = 0, carried_cpu_s_ = 0;
  double forward_host_mem_bytes_ = 0;  // the first forward's own host-memory traffic (deliveries, offloads)
  // The phase being run.
  int micro_ = 0;
  bool last_ = false;  // the step's last micro-step
  double first_compute_ = -1, phase_start_ = -1;
  PhaseDemand demand_, head_demand_;
  double queue_host_mem_ = 0, queue_cpu_update_ = 0, queue_cpu_cores_ = 0;  // host work's queue (ends)
  // The regime jump over runs of identical units (off for deep buffers and several nodes).
  RegimeJump regime_;
  // The jump over the middle micro-steps: the states after the last three, one's change.
  bool jump_micro_ = false;
  int micro_history_ = 0;
  std::vector<double> micro_x_[3], micro_d_;
  std::size_t state_size_ = 0, state_padded_ = 0;
  PhaseDemand backward_demand_;
  double backward_start_ = 0;
  double h2d_bytes_ = 0, d2h_bytes_ = 0, fabric_s_ = 0, h2d_copies_ = 0, d2h_copies_ = 0, network_s_ = 0;
  double host_mem_bytes_ = 0, cpu_update_thread_s_ = 0, cpu_core_thread_s_ = 0, compute_ = 0;
};

}  // namespace

Passes run_passes(const StepWork& sw, ModelFidelity fidelity, bool jump, RecurrenceCounters& counters) {
  RecurrenceSetup setup(sw);
  Passes out;
  std::vector<PhaseContention> none;
  Recurrence rec(sw, setup, true, none, jump);
  out.critical = rec.run();
  if (fidelity != ModelFidelity::kCriticalPath) {
    Recurrence no_latency = rec;
    no_latency.set_latencies(false);
    out.no_latency = no_latency.step_with(none, {});
    const std::vector<long>& pairs = out.critical.micro_repeat;
    out.contended = rec.step_with(solve_contention(sw, out.critical.phases, pairs), pairs);
  }
  counters = setup.counters;
  return out;
}

}  // namespace slidedp
