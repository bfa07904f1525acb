// Discrete-event simulator; see simulator.h. The graph builder below issues, per micro-step and unit,
// the same operations the executor issues, in the same stream order:
//   forward  : deliveries (H2D chunks, then all-gather collectives) -> offload of the unit input ->
//              compute; the head's fused loss then sends its gradients like a backward unit
//   backward : deliveries + offloaded-input prefetch -> recompute/backward -> reduce-scatter
//              collectives -> D2H gradient chunks -> host CPU reduction/AdamW per chunk (FIFO)
//   boundary : the next step's first delivery waits for the update of each chunk it carries
// Parameter slots are reused LRU with the same rule as the analytical model.
#include "model/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/intervals.h"
#include "model/fluid_engine.h"
#include "model/machine_resources.h"
#include "model/memory_model.h"

namespace slidedp {
namespace {

enum Tag { kCompute = 1, kH2D, kD2H, kFabric, kCpu, kConvert, kPostCompute, kNetwork };

struct Slot {
  int unit = -1;
  int last_compute = -1;  // task that last used it
  long last_use = -1;     // use counter for LRU
};

SimulationTooLarge too_large(const StepWork& sw, std::int64_t max_tasks) {
  std::int64_t chunks = 0;
  for (const UnitWork& u : sw.units) chunks = std::max({chunks, u.chunks, u.grad_chunks});
  return SimulationTooLarge(fmt::format(
      "the simulator cannot hold this step: its graph passes {} tasks ({} micro-steps x {} units, {} ranks, chunks "
      "per unit up to {}); use the analytical model (--method analytical), or fewer micro-steps or larger chunks",
      max_tasks, sw.accum_steps, sw.units.size(), sw.ranks, chunks));
}

class GraphBuilder {
 public:
  GraphBuilder(const StepWork& sw, bool latencies, bool timeline, std::int64_t max_tasks)
      : sw_(sw), c_(sw.cap), lat_(latencies ? 1.0 : 0.0), timeline_(timeline), N_(sw.ranks), res_(sw.cap),
        max_tasks_(max_tasks) {
    SLIDEDP_CHECK(sw.cap.ranks == N_, "capacities describe another rank count");
    for (std::size_t i = 0; i < res_.names.size(); ++i) eng_.add_resource(res_.names[i], res_.capacity[i]);
    gpu_ = res_.gpu, h2d_ = res_.h2d, d2h_ = res_.d2h, duplex_ = res_.duplex, fabric_ = res_.fabric;
    convert_ = res_.convert;
    h2d_root_ = res_.h2d_root, d2h_root_ = res_.d2h_root, host_mem_ = res_.host_mem;
    cpu_update_ = res_.cpu_update, cpu_cores_ = res_.cpu_cores;
    gpu_last_.assign(static_cast<std::size_t>(N_), -1);
    h2d_last_ = d2h_last_ = fabric_last_ = convert_last_ = trip_last_ = gpu_last_;
    slots_.assign(static_cast<std::size_t>(N_), std::vector<Slot>(static_cast<std::size_t>(std::max(1, sw.buffer_depth))));
    const std::size_t U = sw.units.size();
    update_prev_.assign(U, {});
    update_cur_.assign(U, {});
    drain_.assign(static_cast<std::size_t>(N_), std::vector<int>(U, -1));
  }

  // Builds `steps` full steps plus the next step's first delivery and compute (the probe). The last
  // full step is the measured one: every step but the first starts the way the steady state does.
  void build(int steps) {
    measured_step_ = steps - 1;
    for (int s = 0; s < steps; ++s) {
      step_ = s;
      for (int a = 0; a < sw_.accum_steps; ++a) micro_step(a, a == sw_.accum_steps - 1);
      if (sw_.traits.update_after_backward) post_phase();
      update_prev_ = update_cur_;
      for (auto& v : update_cur_) v.clear();
    }
    step_ = steps;
    probe();
  }

  FluidEngine& engine() { return eng_; }
  int first_compute() const { return first_compute_; }
  int probe_compute() const { return probe_compute_; }
  int last_compute_of_first_step() const { return last_compute_step0_; }
  int unit0_last_update() const { return unit0_last_update_; }
  int post_first() const { return post_first_; }
  int post_last() const { return post_last_; }
  const std::vector<int>& step0_tasks() const { return step0_tasks_; }
  int resource_gpu(int r) const { return gpu_[static_cast<std::size_t>(r)]; }
  int resource_h2d(int r) const { return h2d_[static_cast<std::size_t>(r)]; }
  int resource_d2h(int r) const { return d2h_[static_cast<std::size_t>(r)]; }
  int resource_duplex(int r) const { return duplex_[static_cast<std::size_t>(r)]; }
  int resource_fabric(int r) const { return fabric_[static_cast<std::size_t>(r)]; }
  int h2d_root() const { return h2d_root_; }
  int d2h_root() const { return d2h_root_; }
  int host_mem() const { return host_mem_; }
  int cpu_update() const { return cpu_update_; }
  int cpu_cores() const { return cpu_cores_; }
  int network() const { return res_.network; }
  const std::vector<std::string>& tracks() const { return tracks_; }

 private:
  double hm_per_copy() const { return c_.emulated ? 2.0 : 1.0; }

  int track(const std::string& name) {
    if (!timeline_) return -1;
    auto it = track_ids_.find(name);
    if (it != track_ids_.end()) return it->second;
    tracks_.push_back(name);
    track_ids_[name] = static_cast<int>(tracks_.size()) - 1;
    return static_cast<int>(tracks_.size()) - 1;
  }

  int add(FluidEngine::Task t) {
    if (eng_.num_tasks() >= max_tasks_) throw too_large(sw_, max_tasks_);
    int id = eng_.add_task(std::move(t));
    if (step_ == measured_step_) step0_tasks_.push_back(id);
    return id;
  }

  static void dep(std::vector<int>& deps, int id) {
    if (id >= 0) deps.push_back(id);
  }

  // Adds `t` after `deps` and `after` (the previous task of its stream; -1: none) with its tag, on
  // the timeline track track_name() when a timeline is recorded (names are built only then).
  template <class TrackName>
  int add_after(FluidEngine::Task t, std::vector<int> deps, int after, int tag, TrackName track_name,
                const std::string& label) {
    dep(deps, after);
    t.deps = std::move(deps);
    t.tag = tag;
    if (timeline_) {
      t.track = track(track_name());
      t.label = label;
    }
    return add(std::move(t));
  }

  std::string unit_name(int u) const {
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    if (w.kind == UnitKind::kEmbedding) return "emb";
    if (w.kind == UnitKind::kHead) return "head";
    return fmt::format("L{}", w.index - 1);
  }

  // `queued`: the copy takes its place in the rank's queue of its direction; else it is another
  // stream's, sharing the link but waiting only for `deps`.
  int copy_task(int r, bool h2d, double bytes, std::vector<int> deps, const std::string& label,
                bool queued = true) {
    FluidEngine::Task t;
    t.work = bytes;
    t.delay_s = lat_ * c_.link_latency_s;
    const std::size_t k = static_cast<std::size_t>(r);
    t.usages = res_.copy(r, h2d);
    if (!queued)
      return add_after(
          std::move(t), std::move(deps), -1, h2d ? kH2D : kD2H,
          [&] { return fmt::format("rank {} / {}", r, h2d ? "h2d" : "d2h"); }, label);
    const int id = add_after(std::move(t), std::move(deps), (h2d ? h2d_last_ : d2h_last_)[k], h2d ? kH2D : kD2H,
                             [&] { return fmt::format("rank {} / {}", r, h2d ? "h2d" : "d2h"); }, label);
    (h2d ? h2d_last_ : d2h_last_)[k] = id;
    return id;
  }

  // One collective over all ranks' fabric ports: `bytes` per port, after `deps`.
  // `nic_bytes` (several nodes, the gpu route's reduce-scatter): what of it crosses this node's
  // network; the ring runs through the ports and the network at once, so the slower one paces it.
  int collective(double bytes, double busbw, std::vector<int> deps, const std::string& label, double nic_bytes = 0) {
    FluidEngine::Task t;
    t.work = bytes > 0 ? bytes : nic_bytes;
    t.delay_s = lat_ * c_.fabric_latency_s;
    if (bytes > 0) t.usages = res_.collective(busbw);
    if (nic_bytes > 0) {
      t.delay_s = (bytes > 0 ? t.delay_s : 0.0) + lat_ * (c_.nodes - 1) * c_.nic_latency_s;
      t.usages.push_back({res_.network, nic_bytes / t.work});
    }
    for (int r = 0; r < N_; ++r) dep(deps, fabric_last_[static_cast<std::size_t>(r)]);
    const int id = add_after(std::move(t), std::move(deps), -1, kFabric, [] { return std::string("fabric"); }, label);
    for (auto& f : fabric_last_) f = id;
    return id;
  }

  int compute_task(int r, double seconds, std::vector<int> deps, const std::string& label, int tag = kCompute) {
    FluidEngine::Task t;
    t.work = seconds;
    t.usages = res_.compute(r);
    const int id = add_after(std::move(t), std::move(deps), gpu_last_[static_cast<std::size_t>(r)], tag,
                             [&] { return fmt::format("rank {} / gpu", r); }, label);
    gpu_last_[static_cast<std::size_t>(r)] = id;
    return id;
  }

  int cpu_task(double thread_s, double host_mem_bytes, double delay, std::vector<int> deps, const std::string& label) {
    FluidEngine::Task t;
    t.work = thread_s;
    t.delay_s = delay;
    t.usages = res_.cpu(thread_s, host_mem_bytes);
    cpu_last_ = add_after(std::move(t), std::move(deps), cpu_last_, kCpu, [] { return std::string("host / cpu update"); },
                          label);
    return cpu_last_;
  }

  // Makes unit u resident on every rank; returns per rank the task its compute must wait for (-1 when
  // resident). `gate` (per chunk) holds tasks the delivery must wait for (updates of the last step).
  std::vector<int> deliver(int u, const std::string& phase) {
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    const SystemTraits& tr = sw_.traits;
    std::vector<int> ready(static_cast<std::size_t>(N_), -1);
    // Residency is identical on every rank; decide on rank 0's slots.
    bool resident = false;
    for (const Slot& s : slots_[0])
      if (s.unit == u) resident = true;
    ++use_counter_;
    if (resident) {
      for (auto& rank_slots : slots_)
        for (Slot& s : rank_slots)
          if (s.unit == u) s.last_use = use_counter_;
      return ready;
    }
    std::size_t victim = 0;
    for (std::size_t i = 1; i < slots_[0].size(); ++i)
      if (slots_[0][i].last_use < slots_[0][victim].last_use) victim = i;
    std::vector<int> slot_dep(static_cast<std::size_t>(N_));
    for (int r = 0; r < N_; ++r) {
      Slot& s = slots_[static_cast<std::size_t>(r)][victim];
      slot_dep[static_cast<std::size_t>(r)] = s.last_compute;
      s.unit = u;
      s.last_use = use_counter_;
    }
    // A tied head reads the embedding from a slot of its own, as the executor delivers it (its bytes
    // travel with the head's below): that slot's occupant is evicted, and the copy waits for its
    // last reader too.
    bool tied_resident = false;  // then the embedding is not delivered again
    const std::vector<int> tied_slot_dep =
        w.tied_h2d_bytes > 0 ? occupy_slot(0, &tied_resident) : std::vector<int>(static_cast<std::size_t>(N_), -1);
    const int chunks = static_cast<int>(w.chunks);
    const std::vector<int>& gates = update_prev_[static_cast<std::size_t>(u)];
    if (tr.params_resident) {
      // Parameters live on the GPU; the new ones arrive with the previous step's post phase (upload
      // and all-gather), which the first use of a unit in a step must wait for.
      if (!gates.empty())
        for (auto& x : ready) x = gates.back();
      return ready;
    }
    std::vector<int> tied_gate;
    if (w.tied_h2d_bytes > 0 && !update_prev_.front().empty()) tied_gate.push_back(update_prev_.front().back());
    if (tr.gpu_sharded_state) {
      for (int k = 0; k < chunks; ++k) {
        std::vector<int> deps;
        for (int r = 0; r < N_; ++r) {
          dep(deps, slot_dep[static_cast<std::size_t>(r)]);
          dep(deps, tied_slot_dep[static_cast<std::size_t>(r)]);
        }
        if (!gates.empty()) dep(deps, gates.back());  // the previous step's GPU optimizer
        int id = collective(w.deliver_allgather_bytes / chunks, c_.allgather_busbw_Bps, deps,
                            fmt::format("all-gather {} c{}", unit_name(u), k));
        for (auto& x : ready) x = id;
      }
      return ready;
    }
    std::vector<std::vector<int>> h2d_chunk(static_cast<std::size_t>(N_), std::vector<int>(static_cast<std::size_t>(chunks)));
    for (int r = 0; r < N_; ++r) {
      const std::size_t rk = static_cast<std::size_t>(r);
      for (int k = 0; k < chunks; ++k) {
        std::vector<int> deps;
        dep(deps, slot_dep[rk]);
        dep(deps, tied_slot_dep[rk]);
        if (!gates.empty()) dep(deps, gates[std::min<std::size_t>(static_cast<std::size_t>(k), gates.size() - 1)]);
        for (int g : tied_gate) dep(deps, g);
        if (w.deliver_convert_thread_s > 0) {
          FluidEngine::Task t;
          t.work = w.deliver_convert_thread_s / chunks;
          t.usages = res_.conversion(r, (w.deliver_host_mem_bytes - w.deliver_h2d_bytes * hm_per_copy()) / w.deliver_convert_thread_s);
          convert_last_[rk] =
              add_after(std::move(t), deps, convert_last_[rk], kConvert, [&] { return fmt::format("rank {} / convert", r); },
                        timeline_ ? fmt::format("convert {} c{}", unit_name(u), k) : std::string());
          deps.push_back(convert_last_[rk]);
        }
        h2d_chunk[rk][static_cast<std::size_t>(k)] =
            copy_task(r, true, (w.deliver_h2d_bytes + (tied_resident ? 0.0 : w.tied_h2d_bytes)) / chunks, deps,
                      fmt::format("{} {} c{}", phase, unit_name(u), k));
        ready[rk] = h2d_chunk[rk][static_cast<std::size_t>(k)];
      }
    }
    const double ag = w.deliver_allgather_bytes + (tied_resident ? 0.0 : w.tied_allgather_bytes);
    if (ag > 0) {
      for (int k = 0; k < chunks; ++k) {
        std::vector<int> deps;
        for (int r = 0; r < N_; ++r) deps.push_back(h2d_chunk[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]);
        int id = collective(ag / chunks, c_.allgather_busbw_Bps, deps, fmt::format("all-gather {} c{}", unit_name(u), k));
        for (auto& x : ready) x = id;
      }
    }
    return ready;
  }

  bool refetches(const UnitWork& w) const {
    return sw_.traits.refetch_for_recompute && w.policy == ActivationPolicy::kRecompute && w.recompute_s > 0;
  }

  // Drops unit u from its slot on every rank (keeping the slot's last compute, which the next
  // delivery into it waits for): its next use delivers it again.
  void forget_slot(int u) {
    for (auto& rank_slots : slots_)
      for (Slot& s : rank_slots)
        if (s.unit == u) {
          s.unit = -1;
          s.last_use = -1;
        }
  }

  // Puts unit `u` in a slot on every rank without a delivery of its own (a tied head's embedding):
  // refreshed where resident, else in the least recently used slot. Returns per rank the compute the
  // slot's previous occupant last ran (-1: none, or resident); `was_resident` says which.
  std::vector<int> occupy_slot(int u, bool* was_resident) {
    std::vector<int> evicted(static_cast<std::size_t>(N_), -1);
    ++use_counter_;
    bool resident = false;
    for (const Slot& s : slots_[0])
      if (s.unit == u) resident = true;
    *was_resident = resident;
    std::size_t victim = 0;
    for (std::size_t i = 1; i < slots_[0].size(); ++i)
      if (slots_[0][i].last_use < slots_[0][victim].last_use) victim = i;
    for (int r = 0; r < N_; ++r)
      for (std::size_t i = 0; i < slots_[static_cast<std::size_t>(r)].size(); ++i) {
        Slot& s = slots_[static_cast<std::size_t>(r)][i];
        if (resident ? s.unit != u : i != victim) continue;
        if (!resident) evicted[static_cast<std::size_t>(r)] = s.last_compute;
        s.unit = u;
        s.last_use = use_counter_;
      }
    return evicted;
  }

  void note_compute(int u, const std::vector<int>& ids) {
    const bool tied = sw_.units[static_cast<std::size_t>(u)].tied_h2d_bytes > 0;
    for (int r = 0; r < N_; ++r)
      for (Slot& s : slots_[static_cast<std::size_t>(r)])
        if (s.unit == u || (tied && s.unit == 0)) s.last_compute = ids[static_cast<std::size_t>(r)];
    if (step_ == measured_step_) {
      if (first_compute_ < 0) first_compute_ = ids[0];
      last_compute_step0_ = ids[0];
    }
  }

  // Gradients of unit u leave every rank after `computed` (per rank); the CPU reduces/updates.
  void grads(int u, bool last, const std::vector<int>& computed) {
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    const SystemTraits& tr = sw_.traits;
    const int chunks = static_cast<int>(w.grad_chunks);
    std::vector<int> rs(static_cast<std::size_t>(chunks), -1);
    if (w.grad_reduce_scatter_bytes > 0 || w.grad_nic_bytes > 0) {
      for (int k = 0; k < chunks; ++k) {
        rs[static_cast<std::size_t>(k)] = collective(w.grad_reduce_scatter_bytes / chunks, c_.reduce_scatter_busbw_Bps,
                                                     computed, fmt::format("reduce-scatter {} c{}", unit_name(u), k),
                                                     w.grad_nic_bytes / chunks);
      }
    }
    // ZeRO-Offload with accumulation and ZeRO-3's round trip: only the last micro-step's gradient
    // leaves by the D2H queue.
    const bool roundtrip = w.accum_in_h2d_bytes > 0;
    const bool trip = w.trip_out_d2h_bytes > 0;
    const double d2h_bytes = (roundtrip || trip) && !last ? 0.0 : w.grad_d2h_bytes + w.tied_grad_d2h_bytes;
    std::vector<std::vector<int>> arrived(static_cast<std::size_t>(chunks));
    for (int r = 0; r < N_; ++r) {
      const std::size_t rk = static_cast<std::size_t>(r);
      int lastd = -1;
      for (int k = 0; k < chunks; ++k) {
        std::vector<int> deps;
        deps.push_back(computed[rk]);
        dep(deps, rs[static_cast<std::size_t>(k)]);
        if (k == 0 && tr.shared_grad_buffer) dep(deps, cpu_last_);
        if (roundtrip) deps = {accumulate_on_gpu(r, u, k, last, std::move(deps))};
        if (trip) {
          // ZeRO-3: the partition out and back in, then (last micro-step) out as fp32, one copy after
          // the other on the reduce stream; the copy in is not in the H2D queue of deliveries.
          const double chunks_d = static_cast<double>(chunks);
          dep(deps, trip_last_[rk]);
          const int out = copy_task(r, false, w.trip_out_d2h_bytes / chunks_d, deps,
                                    fmt::format("partition out {} c{}", unit_name(u), k));
          trip_last_[rk] = copy_task(r, true, w.trip_in_h2d_bytes / chunks_d, {out},
                                     fmt::format("partition in {} c{}", unit_name(u), k), /*queued=*/false);
          deps = {trip_last_[rk]};
        }
        if (d2h_bytes > 0) {
          lastd = copy_task(r, false, d2h_bytes / chunks, deps, fmt::format("grad {} c{}", unit_name(u), k));
          if (trip) trip_last_[rk] = lastd;
        } else if (trip) {
          lastd = deps.front();
        } else {
          lastd = rs[static_cast<std::size_t>(k)] >= 0 ? rs[static_cast<std::size_t>(k)] : computed[rk];
        }
        arrived[static_cast<std::size_t>(k)].push_back(lastd);
      }
      drain_[rk][static_cast<std::size_t>(u)] = lastd;
    }
    const double thread_s = last ? w.cpu_last_thread_s : w.cpu_accum_thread_s;
    const double hm = last ? w.cpu_last_host_mem_bytes : w.cpu_accum_host_mem_bytes;
    if (thread_s <= 0) return;
    const double delay = lat_ * tr.barriers_per_chunk * c_.link_latency_s;
    const bool across_nodes = c_.nodes > 1;  // every micro-step is summed across nodes
    std::vector<int> reduced;
    for (int k = 0; k < chunks; ++k) {
      int id = cpu_task(thread_s / chunks, hm / chunks, delay, arrived[static_cast<std::size_t>(k)],
                        fmt::format("{} {} c{}", across_nodes ? "reduce" : last && !tr.update_after_backward ? "adamw" : "reduce",
                                    unit_name(u), k));
      if (across_nodes) {
        reduced.push_back(id);
        continue;
      }
      if (last) update_cur_[static_cast<std::size_t>(u)].push_back(id);
      if (last && u == 0 && step_ == measured_step_) unit0_last_update_ = id;
    }
    if (!across_nodes) return;
    // The CPU reduces the next unit while the network exchanges this one: this unit's exchanges start
    // now, its after-exchange work is queued behind the next unit's reductions (flush_exchanges).
    flush_exchanges();
    // (The gpu route exchanges nothing here: its reduce-scatter spanned the nodes.)
    for (int k = 0; k < chunks; ++k)
      pending_.push_back({u, k,
                          w.nic_exchange_bytes > 0
                              ? network_task(w.nic_exchange_bytes / chunks, w.nic_messages / 2, {reduced[static_cast<std::size_t>(k)]},
                                             fmt::format("exchange {} c{}", unit_name(u), k))
                              : reduced[static_cast<std::size_t>(k)],
                          last});
    pending_chunks_ = chunks;
  }

  // ZeRO-Offload's fp16 accumulation of chunk k of unit u's partition on rank r, on the compute
  // stream after `deps` (its backward and reduction): the sum so far back in and added on every
  // micro-step but the first, the new sum out on every one but the last, in that order and holding the
  // stream (the next compute waits for the copy out). Returns the last task.
  int accumulate_on_gpu(int r, int u, int k, bool last, std::vector<int> deps) {
    const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
    const double chunks = static_cast<double>(w.grad_chunks);
    dep(deps, gpu_last_[static_cast<std::size_t>(r)]);
    int id = -1;
    if (micro_ > 0) {
      id = copy_task(r, true, w.accum_in_h2d_bytes / chunks, deps, fmt::format("accum in {} c{}", unit_name(u), k));
      id = compute_task(r, w.accum_add_gpu_s / chunks, {id}, fmt::format("accum add {} c{}", unit_name(u), k));
      deps = {id};
    }
    if (!last) {
      id = copy_task(r, false, w.accum_out_d2h_bytes / chunks, deps, fmt::format("accum out {} c{}", unit_name(u), k));
      id = compute_task(r, 0.0, {id}, fmt::format("wait accum out {} c{}", unit_name(u), k));
    }
    return id;
  }

  // One exchange between nodes (the network runs them one after another, as the CPU its tasks).
  int network_task(double bytes, double messages, std::vector<int> deps, const std::string& label) {
    FluidEngine::Task t;
    t.work = bytes;
    t.delay_s = lat_ * messages * c_.nic_latency_s;
    const double hm_per_byte = bytes > 0 ? 2.0 : 0.0;  // DMA read of what is sent, write of what arrives
    t.usages = res_.network_exchange(hm_per_byte);
    network_last_ = add_after(std::move(t), std::move(deps), network_last_, kNetwork,
                              [] { return std::string("node / network"); }, label);
    return network_last_;
  }

  // The work after each pending exchange: adding what arrived and accumulating it, or on the last
  // micro-step AdamW on the owned part, then (a sharded host state) the all-gather of the updated
  // bf16 mirror, which the next delivery waits for.
  void flush_exchanges() {
    for (const Pending& pe : pending_) {
      const UnitWork& w = sw_.units[static_cast<std::size_t>(pe.unit)];
      const double n = static_cast<double>(pending_chunks_);
      const bool update = pe.last && !sw_.traits.update_after_backward;
      int id = pe.last ? cpu_task(w.cpu_after_exchange_thread_s / n, w.cpu_after_exchange_host_mem_bytes / n, 0.0,
                                  {pe.exchange}, fmt::format("{} {} c{}", update ? "adamw" : "accumulate", unit_name(pe.unit), pe.chunk))
                       : cpu_task(w.cpu_accum_after_exchange_thread_s / n, w.cpu_accum_after_exchange_host_mem_bytes / n,
                                  0.0, {pe.exchange}, fmt::format("accumulate {} c{}", unit_name(pe.unit), pe.chunk));
      if (!pe.last) continue;
      if (w.nic_gather_bytes > 0)
        id = network_task(w.nic_gather_bytes / n, w.nic_messages / 2, {id}, fmt::format("gather {} c{}", unit_name(pe.unit), pe.chunk));
      update_cur_[static_cast<std::size_t>(pe.unit)].push_back(id);
      if (pe.unit == 0 && step_ == measured_step_) unit0_last_update_ = id;
    }
    pending_.clear();
  }

  void micro_step(int a, bool last) {
    const int U = static_cast<int>(sw_.units.size());
    micro_ = a;
    if (a == 0)
      for (auto& rank_slots : slots_)
        for (Slot& s : rank_slots) s.unit = -1;  // parameters changed since the last step
    std::vector<std::vector<int>> offload_done(static_cast<std::size_t>(N_), std::vector<int>(static_cast<std::size_t>(U), -1));
    // Forward.
    for (int u = 0; u < U; ++u) {
      const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
      std::vector<int> ready = deliver(u, "params");
      std::vector<int> ids(static_cast<std::size_t>(N_));
      for (int r = 0; r < N_; ++r) {
        const std::size_t rk = static_cast<std::size_t>(r);
        std::vector<int> deps;
        dep(deps, ready[rk]);
        if (u >= 2) dep(deps, offload_done[rk][static_cast<std::size_t>(u - 2)]);
        if (w.act_offload_bytes > 0) {
          // The unit input (produced by the previous compute) goes to host memory.
          std::vector<int> odeps;
          dep(odeps, gpu_last_[rk]);
          offload_done[rk][static_cast<std::size_t>(u)] =
              copy_task(r, false, w.act_offload_bytes, odeps, fmt::format("offload {}", unit_name(u)));
        }
        ids[rk] = compute_task(r, w.fwd_s, deps, fmt::format("fwd {}", unit_name(u)));
      }
      note_compute(u, ids);
      if (w.kind == UnitKind::kHead) grads(u, last, ids);
    }
    // Backward.
    std::vector<std::vector<int>> bwd_done(static_cast<std::size_t>(N_), std::vector<int>(static_cast<std::size_t>(U), -1));
    for (int u = U - 2; u >= 0; --u) {
      const UnitWork& w = sw_.units[static_cast<std::size_t>(u)];
      std::vector<int> ready = deliver(u, "params");
      std::vector<int> ids(static_cast<std::size_t>(N_));
      for (int r = 0; r < N_; ++r) {
        const std::size_t rk = static_cast<std::size_t>(r);
        std::vector<int> deps;
        dep(deps, ready[rk]);
        if (w.act_offload_bytes > 0) {
          std::vector<int> pdeps;
          if (u + 2 < U) dep(pdeps, bwd_done[rk][static_cast<std::size_t>(u + 2)]);
          deps.push_back(copy_task(r, true, w.act_offload_bytes, pdeps, fmt::format("prefetch {}", unit_name(u))));
        }
        if (u + 2 <= U - 1) dep(deps, drain_[rk][static_cast<std::size_t>(u + 2)]);
        if (refetches(w)) {
          ids[rk] = compute_task(r, w.recompute_s, deps, fmt::format("recompute {}", unit_name(u)));
        } else {
          ids[rk] = compute_task(r, w.recompute_s + w.bwd_s, deps,
                                 fmt::format("{}bwd {}", w.recompute_s > 0 ? "recompute+" : "", unit_name(u)));
        }
        bwd_done[rk][static_cast<std::size_t>(u)] = ids[rk];
      }
      note_compute(u, ids);
      if (refetches(w)) {
        // DeepSpeed ZeRO-3: the recompute's forward hook released the parameters; the backward
        // gathers them again into a slot freed when the recompute ends.
        forget_slot(u);
        const std::vector<int> again = deliver(u, "params again");
        for (int r = 0; r < N_; ++r) {
          const std::size_t rk = static_cast<std::size_t>(r);
          std::vector<int> deps;
          dep(deps, again[rk]);
          dep(deps, ids[rk]);
          ids[rk] = compute_task(r, w.bwd_s, deps, fmt::format("bwd {}", unit_name(u)));
          bwd_done[rk][static_cast<std::size_t>(u)] = ids[rk];
        }
        note_compute(u, ids);
      }
      grads(u, last, ids);
    }
    flush_exchanges();
  }

  void post_phase() {
    std::vector<int> deps;
    for (int r = 0; r < N_; ++r) dep(deps, gpu_last_[static_cast<std::size_t>(r)]);
    for (int r = 0; r < N_; ++r) dep(deps, d2h_last_[static_cast<std::size_t>(r)]);
    if (sw_.traits.update_in_layer_order) return update_in_layer_order(deps);
    int last = -1;
    if (sw_.post_update_thread_s > 0) {
      last = cpu_task(sw_.post_update_thread_s, sw_.post_update_host_mem_bytes, 0.0, deps, "optimizer step");
      if (step_ == measured_step_) post_first_ = last;
    }
    if (sw_.post_gather_nic_bytes > 0)  // the norm's exchange, then the updated mirror's all-gather
      last = network_task(sw_.post_gather_nic_bytes, 2.0 * (c_.nodes - 1), {last}, "gather params");
    if (sw_.post_upload_h2d_bytes > 0) {
      std::vector<int> up;
      for (int r = 0; r < N_; ++r) {
        std::vector<int> d;
        dep(d, last);
        up.push_back(copy_task(r, true, sw_.post_upload_h2d_bytes, d, "upload partition"));
      }
      last = up.back();
      if (sw_.post_allgather_bytes > 0) last = collective(sw_.post_allgather_bytes, c_.allgather_busbw_Bps, up, "all-gather params");
    }
    if (sw_.post_gpu_s > 0) {
      // Every rank updates its own shard on its own GPU, all at once; the next step's use of the
      // parameters waits for all of them (a task with no work joins them).
      FluidEngine::Task join;
      for (int r = 0; r < N_; ++r) {
        std::vector<int> d;
        dep(d, last);
        int id = compute_task(r, sw_.post_gpu_s, d, "gpu optimizer", kPostCompute);
        if (r == 0 && step_ == measured_step_ && post_first_ < 0) post_first_ = id;
        join.deps.push_back(id);
      }
      last = add(std::move(join));
    }
    if (step_ == measured_step_) post_last_ = last;
    for (auto& v : update_cur_) v.assign(1, last);
  }

  // The update after the backward chunk by chunk, unit 0 first, each chunk's share of the update's
  // work by elements (then, across nodes with a sharded state, its share of the updated mirror's
  // gather): the next step's delivery of a chunk waits for its own update only.
  void update_in_layer_order(const std::vector<int>& deps) {
    double elements = 0;
    for (const UnitWork& w : sw_.units) elements += static_cast<double>(w.numel);
    std::vector<int> after = deps;
    for (std::size_t u = 0; u < sw_.units.size(); ++u) {
      const UnitWork& w = sw_.units[u];
      const double share =
          elements > 0 ? static_cast<double>(w.numel) / elements / static_cast<double>(w.chunks) : 0.0;
      update_cur_[u].clear();
      for (int64_t k = 0; k < w.chunks; ++k) {
        int id = cpu_task(sw_.post_update_thread_s * share, sw_.post_update_host_mem_bytes * share, 0.0,
                          after, fmt::format("adamw {} c{}", unit_name(static_cast<int>(u)), k));
        after.clear();
        if (step_ == measured_step_ && post_first_ < 0) post_first_ = id;
        if (sw_.post_gather_nic_bytes > 0)
          id = network_task(sw_.post_gather_nic_bytes * share, 2.0 * (c_.nodes - 1), {id},
                            fmt::format("gather {} c{}", unit_name(static_cast<int>(u)), k));
        update_cur_[u].push_back(id);
      }
    }
    // The breakdown's serial part: until unit 0 is updated (the next step's first compute needs it).
    if (step_ == measured_step_) post_last_ = update_cur_.front().back();
  }

  void probe() {
    for (auto& rank_slots : slots_)
      for (Slot& s : rank_slots) s.unit = -1;
    std::vector<int> ready = deliver(0, "params");
    std::vector<int> deps;
    dep(deps, ready[0]);
    probe_compute_ = compute_task(0, sw_.units.front().fwd_s, deps, "fwd emb (next step)");
  }

  const StepWork& sw_;
  const Capacities& c_;
  double lat_;
  bool timeline_;
  int N_;
  FluidEngine eng_;
  std::vector<int> gpu_, h2d_, d2h_, duplex_, fabric_, convert_;
  int h2d_root_ = -1, d2h_root_ = -1, host_mem_ = -1, cpu_update_ = -1, cpu_cores_ = -1;
  MachineResources res_;
  std::int64_t max_tasks_;
  std::vector<int> gpu_last_, h2d_last_, d2h_last_, fabric_last_, convert_last_;
  std::vector<int> trip_last_;  // ZeRO-3's reduce stream: the last copy of a partition's round trip
  int micro_ = 0;  // the micro-step being scheduled
  int cpu_last_ = -1;
  int network_last_ = -1;
  struct Pending {
    int unit, chunk, exchange;
    bool last;  // the step's last micro-step
  };
  std::vector<Pending> pending_;
  int pending_chunks_ = 1;
  std::vector<std::vector<Slot>> slots_;
  long use_counter_ = 0;
  std::vector<std::vector<int>> update_prev_, update_cur_;
  std::vector<std::vector<int>> drain_;
  int step_ = 0;
  int measured_step_ = 0;
  int first_compute_ = -1, probe_compute_ = -1, last_compute_step0_ = -1, unit0_last_update_ = -1;
  int post_first_ = -1, post_last_ = -1;
  std::vector<int> step0_tasks_;
  std::vector<std::string> tracks_;
  std::map<std::string, int> track_ids_;
};

struct RunOutcome {
  double step_s = 0;
  Breakdown breakdown;
  std::map<std::string, double> busy;
  std::map<std::string, double> span_busy;
};

RunOutcome run_graph(GraphBuilder& g, const StepWork& sw, int steps) {
  FluidEngine& e = g.engine();
  e.run();
  RunOutcome out;
  const double t0 = e.task(g.first_compute()).start_s;
  const double t1 = e.task(g.probe_compute()).start_s;
  // Start times above are when dependencies completed; compute actually begins then (the GPU stream
  // is part of the dependencies), so these are the compute start times.
  (void)steps;
  out.step_s = t1 - t0;
  // Breakdown of the first step on rank 0.
  double compute = 0;
  for (int id : g.step0_tasks()) {
    const auto& t = e.task(id);
    if ((t.tag == kCompute || t.tag == kPostCompute) && t.usages.front().resource == g.resource_gpu(0)) compute += t.end_s - t.start_s;
  }
  const double last_compute = e.task(g.last_compute_of_first_step()).end_s;
  Breakdown& b = out.breakdown;
  b.compute_s = compute;
  if (!sw.traits.update_after_backward) {
    double upd = g.unit0_last_update() >= 0 ? e.task(g.unit0_last_update()).end_s : last_compute;
    b.exposed_tail_s = std::max(0.0, upd - last_compute);
    b.exposed_head_s = (t0 + out.step_s) - std::max(last_compute, upd);
  } else {
    double post_start = g.post_first() >= 0 ? e.task(g.post_first()).start_s : last_compute;
    double post_end = g.post_last() >= 0 ? e.task(g.post_last()).end_s : last_compute;
    b.exposed_tail_s = std::max(0.0, post_start - last_compute);
    double post_gpu = sw.post_gpu_s;
    b.post_update_s = std::max(0.0, post_end - std::max(post_start, last_compute)) - post_gpu;
    b.exposed_head_s = (t0 + out.step_s) - std::max(post_end, last_compute);
  }
  b.stall_s = out.step_s - b.compute_s - b.exposed_tail_s - b.exposed_head_s - b.post_update_s;
  // Busy time of each resource over the first step's tasks.
  // Span busy: the union of the spans of rank 0's tasks per resource (what a timeline shows).
  {
    std::map<std::string, std::vector<std::pair<double, double>>> iv;
    for (int id : g.step0_tasks()) {
      const auto& t = e.task(id);
      if (t.usages.empty() && t.tag != kFabric) continue;
      const int front = t.usages.empty() ? -1 : t.usages.front().resource;
      const std::pair<double, double> span{t.start_s, t.end_s};
      if ((t.tag == kCompute || t.tag == kPostCompute) && front == g.resource_gpu(0)) iv[resource::kGpuCompute].push_back(span);
      if (t.tag == kH2D && front == g.resource_h2d(0)) iv[resource::kH2D].push_back(span);
      if (t.tag == kD2H && front == g.resource_d2h(0)) iv[resource::kD2H].push_back(span);
      if (t.tag == kFabric) iv[resource::kFabric].push_back(span);
      if (t.tag == kCpu) iv[resource::kCpuUpdate].push_back(span);
      if (t.tag == kNetwork) iv[resource::kNetwork].push_back(span);
    }
    for (auto& [k, v] : iv) out.span_busy[k] = union_length(std::move(v));
  }
  // Latencies are paid per copy and per collective: counted as busy time of the rank-0 link/port.
  std::map<int, double> used;
  double h2d_latency = 0, d2h_latency = 0, fabric_latency = 0, network_latency = 0;
  for (int id : g.step0_tasks()) {
    const auto& t = e.task(id);
    for (const auto& u : t.usages) used[u.resource] += u.per_work * t.work;
    if (t.usages.empty()) continue;
    int front = t.usages.front().resource;
    if (t.tag == kH2D && front == g.resource_h2d(0)) h2d_latency += t.delay_s;
    if (t.tag == kD2H && front == g.resource_d2h(0)) d2h_latency += t.delay_s;
    if (t.tag == kFabric) fabric_latency += t.delay_s;
    if (t.tag == kNetwork) network_latency += t.delay_s;
  }
  auto busy = [&](int r, double cap) { return used.count(r) ? used[r] / cap : 0.0; };
  const Capacities& c = sw.cap;
  out.busy[resource::kGpuCompute] = busy(g.resource_gpu(0), 1.0);
  out.busy[resource::kH2D] = busy(g.resource_h2d(0), c.h2d_link_Bps) + h2d_latency;
  out.busy[resource::kD2H] = busy(g.resource_d2h(0), c.d2h_link_Bps) + d2h_latency;
  out.busy[resource::kDuplex] = busy(g.resource_duplex(0), c.duplex_Bps);
  out.busy[resource::kH2DRoot] = busy(g.h2d_root(), c.h2d_root_Bps);
  out.busy[resource::kD2HRoot] = busy(g.d2h_root(), c.d2h_root_Bps);
  out.busy[resource::kHostMem] = busy(g.host_mem(), c.host_mem_Bps);
  out.busy[resource::kCpuUpdate] = busy(g.cpu_update(), c.update_threads);
  out.busy[resource::kCpuCores] = busy(g.cpu_cores(), c.cpu_cores);
  if (sw.ranks > 1) out.busy[resource::kFabric] = busy(g.resource_fabric(0), c.allgather_busbw_Bps) + fabric_latency;
  if (c.nodes > 1) out.busy[resource::kNetwork] = busy(g.network(), c.nic_Bps) + network_latency;
  return out;
}

}  // namespace

Simulation simulate_step_work(const StepWork& sw, const SimulatorOptions& options) {
  SLIDEDP_CHECK(options.steps >= 1);
  // At least one compute per rank, unit and pass (forward; backward but the head's): a step that
  // passes the limit on those alone is refused before anything is built.
  const double computes = static_cast<double>(options.steps) * sw.accum_steps * sw.ranks *
                          (2.0 * static_cast<double>(sw.units.size()) - 1.0);
  if (computes > static_cast<double>(options.max_tasks)) throw too_large(sw, options.max_tasks);
  Simulation sim;
  GraphBuilder g(sw, true, options.record_timeline, options.max_tasks);
  g.build(options.steps);
  RunOutcome with = run_graph(g, sw, options.steps);
  sim.tasks = g.engine().num_tasks();
  Prediction& p = sim.prediction;
  p.method = "simulator";
  p.step_time_s = with.step_s;
  p.breakdown = with.breakdown;
  p.busy_s = with.busy;
  p.span_busy_s = with.span_busy;
  if (options.measure_sync) {
    GraphBuilder g0(sw, false, false, options.max_tasks);
    g0.build(options.steps);
    RunOutcome without = run_graph(g0, sw, options.steps);
    p.breakdown = without.breakdown;
    p.breakdown.sync_s = with.step_s - without.step_s;
  }
  add_sync_term(p, sw.cap.sync_factor);
  for (const auto& [name, busy] : p.busy_s) p.lower_bound_s = std::max(p.lower_bound_s, busy);
  add_bottleneck_and_throughput(p, static_cast<double>(sw.tokens_per_step), sw.model_flops_per_step,
                                sw.ranks * sw.cap.nodes);
  p.exposed_s = p.step_time_s - p.busy_s[resource::kGpuCompute];
  if (options.record_timeline) {
    const FluidEngine& e = g.engine();
    for (int i = 0; i < e.num_tasks(); ++i) {
      const auto& t = e.task(i);
      if (t.track < 0) continue;
      static const char* kCategory[] = {"", "compute", "h2d", "d2h", "fabric", "cpu", "convert", "compute", "network"};
      sim.timeline.push_back({g.tracks()[static_cast<std::size_t>(t.track)], t.label, kCategory[t.tag], t.start_s, t.end_s});
    }
  }
  return sim;
}

Simulation simulate(const Workload& w, const Hardware& hw, const Plan& plan, System system,
                    const SimulatorOptions& options) {
  StepWork sw = build_step_work(w, hw, plan, system);
  Simulation sim = simulate_step_work(sw, options);
  sim.prediction.system = system_name(system);
  sim.prediction.memory = estimate_memory(w, hw, plan, system);
  sim.prediction.infeasible_reasons = sim.prediction.memory.violations();
  sim.prediction.feasible = sim.prediction.infeasible_reasons.empty();
  return sim;
}

}  // namespace slidedp
