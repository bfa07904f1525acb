// The rank memory account; see memory_account.h. The replay below follows RankDriver::micro_step line
// by line (same order of acquire / alloc / release), so the two read side by side; a Ledger counts the
// live bytes by category and keeps the breakdown at the peak.
#include "model/memory_account.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>

#include "card/shard_range.h"
#include "common/error.h"
#include "model/memory_model.h"
#include "model/q8_segments.h"
#include "model/step_work.h"

namespace slidedp {
namespace {

// Categories, in report order.
enum Category {
  kSlots,
  kTokens,
  kRouterStats,     // MoE: the micro-batch's router statistics
  kHiddenKept,      // unit inputs kept from forward to backward (keep and recompute layers)
  kSavedKept,       // saved state of keep layers
  kHiddenMoving,    // the hidden states a unit reads and writes right now (x, y, dy, dx)
  kOffload,         // offload: inputs being copied out, prefetched inputs
  kUnitScratch,     // saved state being (re)built and the unit's workspace
  kGradients,       // the unit's fp32 gradient and its wire copy
  kDraining,        // the previous unit's wire gradient still draining to the host
  kBackendScratch,  // the backend's own scratch (embedding sort, reduce-scatter staging, shards)
  kSystemBuffers,   // a baseline's own buffers, held all run (SystemDeviceBuffers)
  kCategories
};
const char* category_name(int c) {
  switch (c) {
    case kSlots: return "parameter slots";
    case kTokens: return "token ids and targets (and packed documents' positions)";
    case kRouterStats: return "router statistics (mixture of experts)";
    case kHiddenKept: return "activations: unit inputs kept for backward";
    case kSavedKept: return "activations: saved state of keep layers";
    case kHiddenMoving: return "hidden states in use (x, y, dy, dx)";
    case kOffload: return "activations: offload in flight and prefetched";
    case kUnitScratch: return "unit scratch (saved state rebuilt, workspace)";
    case kGradients: return "gradient of the unit (fp32 + wire copy)";
    case kDraining: return "gradient draining to the host (previous unit)";
    case kBackendScratch: return "backend scratch (sort, reduce-scatter staging, shards)";
    case kSystemBuffers:
      return "the system's own buffers";
  }
  return "?";
}

// Where in the step an allocation happens (formatted only for the peak).
struct Where {
  enum Phase { kForward, kHead, kBackward } phase = kForward;
  int unit = 0;
};
std::string where_text(const Where& w) {
  if (w.phase == Where::kHead) return "the head (fused loss and backward)";
  if (w.unit == 0) return w.phase == Where::kForward ? "the embedding's forward" : "the embedding's backward";
  return fmt::format("{} of layer {}", w.phase == Where::kForward ? "forward" : "backward", w.unit - 1);
}

// Live bytes by category. Ids index a vector (buffers are few and short-lived); the planner evaluates
// this for every candidate, so nothing here allocates per buffer beyond the vector's growth.
class Ledger {
 public:
  Ledger(const RankMemorySpec& spec, size_t buffers) : spec_(spec) { entries_.reserve(buffers); }
  int alloc(Category c, int64_t bytes, const Where& where) {
    if (bytes == 0 && spec_.zero_bytes_take_one) bytes = 1;
    const int64_t need = (bytes + spec_.align_bytes - 1) / spec_.align_bytes * spec_.align_bytes;
    const int id = static_cast<int>(entries_.size());
    entries_.push_back({c, need, true});
    by_[c] += need;
    total_ += need;
    const int64_t held = total_ - by_[kDraining] - in_flight_offload_;
    if (held > driver_peak_) driver_peak_ = held;
    if (total_ > peak_) {
      peak_ = total_;
      std::copy(by_, by_ + kCategories, at_peak_);
      peak_at_ = where;
    }
    return id;
  }
  void release(int id) {
    if (id < 0) return;
    Entry& e = entries_[static_cast<size_t>(id)];
    SLIDEDP_CHECK(e.live, "memory account: released twice");
    e.live = false;
    by_[e.category] -= e.bytes;
    total_ -= e.bytes;
  }
  // The driver has released the buffer; the pipeline keeps it busy a while longer (category `c`).
  int keep_in_flight(int id, Category c) {
    if (id < 0) return -1;
    Entry& e = entries_[static_cast<size_t>(id)];
    by_[e.category] -= e.bytes;
    e.category = c;
    by_[c] += e.bytes;
    if (c == kOffload) in_flight_offload_ += e.bytes;
    return id;
  }
  void release_in_flight(int id) {
    if (id < 0) return;
    const Entry& e = entries_[static_cast<size_t>(id)];
    if (e.category == kOffload) in_flight_offload_ -= e.bytes;
    release(id);
  }
  int64_t driver_peak() const { return driver_peak_; }
  const int64_t* at_peak() const { return at_peak_; }
  const Where& peak_at() const { return peak_at_; }

 private:
  struct Entry {
    Category category;
    int64_t bytes;
    bool live;
  };
  const RankMemorySpec& spec_;
  std::vector<Entry> entries_;
  int64_t by_[kCategories] = {};
  int64_t total_ = 0, peak_ = 0, driver_peak_ = 0, in_flight_offload_ = 0;
  int64_t at_peak_[kCategories] = {};
  Where peak_at_;
};

// The driver's parameter slots: LRU over gpu_buffer_depth buffers, each sized by the unit it holds.
struct Slots {
  struct Slot {
    int unit = -1;
    int id = -1;
    int64_t last_use = -1;
  };
  std::vector<Slot> slots;
  int64_t clock = 0;
  void acquire(Ledger& ledger, int unit, int64_t bytes, const Where& where) {
    for (Slot& s : slots)
      if (s.unit == unit) {
        s.last_use = ++clock;
        return;
      }
    Slot* victim = &slots[0];
    for (Slot& s : slots)
      if (s.last_use < victim->last_use) victim = &s;
    ledger.release(victim->id);
    *victim = Slot{unit, ledger.alloc(kSlots, bytes, where), ++clock};
  }
  void release_all(Ledger& ledger) {
    for (Slot& s : slots) ledger.release(s.id), s = Slot{};
  }
};

std::string system_buffers_name(const SystemDeviceBuffers& s) {
  if (s.sharded_state) return "sharded fp32 master + AdamW m, v + gradient, non-finite count (FSDP2)";
  if (s.fetch_fp32) return "fp32 parameter shard fetched (FSDP offload)";
  if (s.accumulate_on_gpu && s.widen_grad)
    return "gradient round trip's target, gradient cast to fp32 (ZeRO offloads)";
  if (s.widen_grad) return "gradient cast to fp32 for its copy (ZeRO offloads)";
  return "gradient round trip's target (ZeRO offloads)";
}

}  // namespace

int64_t sharded_state_numel(const ModelLayout& layout, const Plan& plan, int unit, int rank) {
  const int64_t n = layout.units.at(static_cast<size_t>(unit)).flat_numel;
  int64_t shard = 0;
  for (int64_t b = 0; b < n; b += plan.chunk_numel)
    shard += shard_range(std::min(n, b + plan.chunk_numel) - b, plan.ranks, rank).size();
  return shard;
}

namespace {

// rank_memory_account's replay of the driver's allocations (executor/rank_driver.cc), micro-step by
// micro-step in the driver's order: its buffers by category in a Ledger, its parameter slots.
class AccountReplay {
 public:
  AccountReplay(const ModelLayout& layout, const Plan& plan, int64_t seq_len, bool tied,
                const RankMemorySpec& spec)
      : layout_(layout),
        plan_(plan),
        spec_(spec),
        tied_(tied),
        U_(layout.num_units()),
        L_(U_ - 2),
        W_(plan.grad_shards()),
        tokens_(plan.micro_batch * seq_len),
        // The driver repeats one allocation pattern every micro-step after the first (only the first
        // releases the slots of the previous step), so three micro-steps reach every peak a longer
        // accumulation does; the replay costs O(units), not O(units x accumulation) (the planner asks
        // for every candidate, up to 2^20 micro-steps).
        micro_steps_(std::min(plan.accum_steps, 3)),
        led_(spec, static_cast<size_t>(16 * U_ * micro_steps_ + 64)),
        offload_in_flight_(static_cast<size_t>(std::max(L_, 1)), -1),
        out_(static_cast<size_t>(U_), -1),
        saved_(static_cast<size_t>(std::max(L_, 1)), -1) {
    slots_.slots.resize(static_cast<size_t>(std::max(1, plan.gpu_buffer_depth)));
  }

  RankMemoryAccount run() {
    system_buffers();
    for (int a = 0; a < micro_steps_; ++a) micro_step(a);
    return account();
  }

 private:
  int64_t numel(int u) const { return layout_.units[static_cast<size_t>(u)].flat_numel; }
  ActivationPolicy policy(int l) const { return plan_.layer_policy(l, L_); }
  void acquire(int u, const Where& where) { slots_.acquire(led_, u, numel(u) * spec_.param_bytes, where); }
  // Wire gradients released by the driver but still draining: the backward of unit u waits for the
  // drain of unit u+2 (two gradient buffers), so at most the latest one is in flight when it allocates.
  void settle_drains(size_t keep) {
    while (draining_.size() > keep) led_.release_in_flight(draining_.front()), draining_.pop_front();
  }
  void system_buffers();
  void micro_step(int a);
  void forward_layer(int u, const Where& where);
  void head(int u, const Where& where);
  void prefetch(int l, const Where& where);
  void backward_layer(int u, bool lookahead);
  void send_grads(int grads, int64_t n, const Where& where);
  RankMemoryAccount account() const;

  const ModelLayout& layout_;
  const Plan& plan_;
  const RankMemorySpec& spec_;
  const bool tied_;
  const int U_, L_, W_;  // W_: the gpu route's shards, every node's ranks
  const int64_t tokens_;
  const int micro_steps_;
  Ledger led_;
  Slots slots_;
  std::deque<int> draining_;
  std::vector<int> offload_in_flight_;  // layer -> input being copied out
  std::vector<int> out_, saved_;        // unit -> its output; layer -> its kept activations
  std::vector<int> prefetched_;         // layer -> its input, back on the device
  int dy_ = -1;
};

// RankDriver::send_grads: the fp32 gradient becomes a wire copy, which drains to the host.
void AccountReplay::send_grads(int grads, int64_t n, const Where& where) {
  const int wire = led_.alloc(kGradients, n * spec_.wire_bytes, where);
  led_.release(grads);
  if (W_ <= 1) {
    draining_.push_back(led_.keep_in_flight(wire, kDraining));
    return;
  }
  // Rank 0's shards (the largest: shard_range gives the remainder to the first ranks) of the unit's
  // full chunks and its last, shorter one; the staging holds one chunk at a time (the largest counts).
  const int64_t chunk = plan_.chunk_numel, full = n / chunk, rest = n % chunk;
  const int64_t shard_total =
      full * shard_range(chunk, W_, 0).size() + (rest > 0 ? shard_range(rest, W_, 0).size() : 0);
  const int shards = led_.alloc(kBackendScratch, std::max<int64_t>(shard_total, 1) * 4, where);
  if (spec_.reduce_scatter_staging && n > 0) {
    const int64_t c = std::min(n, chunk);
    const int64_t staging = W_ > plan_.ranks ? (spec_.wire_bytes == 2 ? c * 4 : 0)
                                             : exchange_received_numel(c, W_, 0) * spec_.wire_bytes;
    if (staging > 0) led_.release(led_.alloc(kBackendScratch, staging, where));
  }
  led_.release(wire);
  draining_.push_back(led_.keep_in_flight(shards, kDraining));
}

// A baseline's own buffers: allocated with its driver, held all run.
void AccountReplay::system_buffers() {
  const Where start{Where::kForward, 0};
  if (spec_.system.sharded_state) {
    for (int u = 0; u < U_; ++u)
      for (int buffer = 0; buffer < 4; ++buffer)  // master, m, v, gradient
        led_.alloc(kSystemBuffers, std::max<int64_t>(sharded_state_numel(layout_, plan_, u, 0), 1) * 4,
                   start);
    led_.alloc(kSystemBuffers, 4, start);  // the gradients' non-finite count, read before the update
  }
  if (spec_.system.fetch_fp32) led_.alloc(kSystemBuffers, fp32_fetch_bytes(layout_, plan_), start);
  if (spec_.system.accumulate_on_gpu)
    led_.alloc(kSystemBuffers, grad_staging_slot_bytes(layout_, plan_, spec_.wire_bytes), start);
  if (spec_.system.widen_grad) led_.alloc(kSystemBuffers, grad_staging_slot_bytes(layout_, plan_, 4), start);
}

void AccountReplay::micro_step(int a) {
  if (a == 0) slots_.release_all(led_);
  const Where first{Where::kForward, 0};
  const int ids = led_.alloc(kTokens, tokens_ * 4, first);
  const int targets = led_.alloc(kTokens, tokens_ * 4, first);
  const int positions = spec_.document_positions ? led_.alloc(kTokens, tokens_ * 4, first) : -1;
  const int router =
      spec_.router_stats_bytes > 0 ? led_.alloc(kRouterStats, spec_.router_stats_bytes, first) : -1;
  dy_ = -1;
  for (int u = 0; u < U_; ++u) {
    const UnitKind kind = layout_.units[static_cast<size_t>(u)].kind;
    const Where where{kind == UnitKind::kHead ? Where::kHead : Where::kForward, u};
    acquire(u, where);
    if (kind == UnitKind::kEmbedding)
      out_[0] = led_.alloc(kHiddenMoving, spec_.decoder.hidden_bytes, where);
    else if (kind == UnitKind::kDecoder)
      forward_layer(u, where);
    else
      head(u, where);
  }
  prefetched_.assign(static_cast<size_t>(std::max(L_, 1)), -1);
  const bool lookahead = backward_delivery_lookahead(plan_);
  for (int u = L_; u >= 1; --u) backward_layer(u, lookahead);
  // The embedding's backward.
  const Where where{Where::kBackward, 0};
  if (!lookahead || L_ == 0) acquire(0, where);
  settle_drains(1);
  const int grads = led_.alloc(kGradients, numel(0) * 4, where);
  if (spec_.embedding_backward_scratch_bytes > 0)
    led_.release(led_.alloc(kBackendScratch, spec_.embedding_backward_scratch_bytes, where));
  led_.release(dy_);
  led_.release(ids);
  led_.release(targets);
  led_.release(positions);
  if (router >= 0) led_.release(router);
  send_grads(grads, numel(0), where);
}

void AccountReplay::forward_layer(int u, const Where& where) {
  const int l = u - 1;
  if (l >= 2 && offload_in_flight_[static_cast<size_t>(l - 2)] >= 0) {  // waits for the offload two back
    led_.release_in_flight(offload_in_flight_[static_cast<size_t>(l - 2)]);
    offload_in_flight_[static_cast<size_t>(l - 2)] = -1;
  }
  out_[static_cast<size_t>(u)] = led_.alloc(kHiddenMoving, spec_.decoder.hidden_bytes, where);
  const int s = led_.alloc(kUnitScratch, spec_.layer_memory(l).saved_bytes, where);
  led_.release(led_.alloc(kUnitScratch, spec_.layer_memory(l).forward_workspace_bytes, where));
  const int x = out_[static_cast<size_t>(u - 1)];
  if (policy(l) == ActivationPolicy::kKeep)
    saved_[static_cast<size_t>(l)] = led_.keep_in_flight(s, kSavedKept);
  else
    led_.release(s);
  if (policy(l) == ActivationPolicy::kOffload) {
    offload_in_flight_[static_cast<size_t>(l)] = led_.keep_in_flight(x, kOffload);
    out_[static_cast<size_t>(u - 1)] = -1;
  } else {
    led_.keep_in_flight(x, kHiddenKept);
  }
}

// The head: fused forward, loss and backward.
void AccountReplay::head(int u, const Where& where) {
  if (tied_) acquire(0, where);
  const int dx = led_.alloc(kHiddenMoving, spec_.decoder.hidden_bytes, where);
  const int grads = led_.alloc(kGradients, numel(u) * 4, where);
  const int tied_grads = tied_ ? led_.alloc(kGradients, numel(0) * 4, where) : -1;
  const int loss = led_.alloc(kBackendScratch, 16, where);
  led_.release(led_.alloc(kUnitScratch, spec_.head.forward_workspace_bytes, where));
  led_.release(out_[static_cast<size_t>(u - 1)]);
  out_[static_cast<size_t>(u - 1)] = -1;
  led_.release(loss);
  send_grads(grads, numel(u), where);
  if (tied_) send_grads(tied_grads, numel(0), where);
  dy_ = dx;
}

void AccountReplay::prefetch(int l, const Where& where) {
  if (l < 0 || policy(l) != ActivationPolicy::kOffload || prefetched_[static_cast<size_t>(l)] >= 0) return;
  if (offload_in_flight_[static_cast<size_t>(l)] >=
      0) {  // the prefetch waits for the offload of the same input
    led_.release_in_flight(offload_in_flight_[static_cast<size_t>(l)]);
    offload_in_flight_[static_cast<size_t>(l)] = -1;
  }
  prefetched_[static_cast<size_t>(l)] = led_.alloc(kOffload, spec_.decoder.hidden_bytes, where);
}

void AccountReplay::backward_layer(int u, bool lookahead) {
  const int l = u - 1;
  const Where where{Where::kBackward, u};
  if (!lookahead || u == L_) acquire(u, where);
  prefetch(l, where);
  prefetch(l - 1, where);
  int x;
  if (policy(l) == ActivationPolicy::kOffload) {
    x = prefetched_[static_cast<size_t>(l)];
    prefetched_[static_cast<size_t>(l)] = -1;
  } else {
    x = out_[static_cast<size_t>(u - 1)];
  }
  int s;
  if (policy(l) == ActivationPolicy::kKeep) {
    s = saved_[static_cast<size_t>(l)];
  } else {
    s = led_.alloc(kUnitScratch, spec_.layer_memory(l).saved_bytes, where);
    led_.release(led_.alloc(kUnitScratch, spec_.layer_memory(l).forward_workspace_bytes, where));
  }
  settle_drains(1);
  const int grads = led_.alloc(kGradients, numel(u) * 4, where);
  const int dx = led_.alloc(kHiddenMoving, spec_.decoder.hidden_bytes, where);
  const int ws = led_.alloc(kUnitScratch, spec_.layer_memory(l).backward_workspace_bytes, where);
  led_.release(x);
  led_.release(s);
  led_.release(ws);
  led_.release(dy_);
  out_[static_cast<size_t>(u - 1)] = -1;
  if (lookahead) acquire(u - 1, where);
  send_grads(grads, numel(u), where);
  dy_ = dx;
}

RankMemoryAccount AccountReplay::account() const {
  RankMemoryAccount acc;
  const int64_t* by = led_.at_peak();
  for (int c = 0; c < kCategories; ++c) {
    if (by[c] <= 0) continue;
    std::string name = category_name(c);
    if (c == kSlots) name = fmt::format("parameter slots ({} deep)", plan_.gpu_buffer_depth);
    if (c == kSystemBuffers) name = system_buffers_name(spec_.system);
    acc.items.push_back({name, static_cast<double>(by[c])});
  }
  acc.driver_peak_bytes = static_cast<double>(led_.driver_peak());
  acc.peak_at = where_text(led_.peak_at());
  if (spec_.runtime_bytes > 0)
    acc.items.push_back(
        {"CUDA context and libraries (hardware profile)", static_cast<double>(spec_.runtime_bytes)});
  // The node's communicator, and across nodes the gpu route's over every node's ranks.
  const int communicators = (plan_.ranks > 1 ? 1 : 0) + (plan_.nodes > 1 && W_ > 1 ? 1 : 0);
  if (spec_.collective_bytes > 0 && communicators > 0)
    acc.items.push_back({communicators > 1
                             ? "NCCL communicator buffers, node and all nodes (hardware profile)"
                             : "NCCL communicator buffers (hardware profile)",
                         static_cast<double>(communicators * spec_.collective_bytes)});
  for (const MemoryItem& i : acc.items) acc.peak_bytes += i.bytes;
  return acc;
}

}  // namespace

RankMemoryAccount rank_memory_account(const ModelLayout& layout, const Plan& plan, int64_t seq_len, bool tied,
                                      const RankMemorySpec& spec) {
  return AccountReplay(layout, plan, seq_len, tied, spec).run();
}

HostMemorySpec host_memory_spec(const ModelLayout& layout, const Plan& plan, System system, bool tied,
                                bool exact_fp32, int64_t hidden_bytes_per_token) {
  const SystemTraits traits = system_traits(system);
  HostMemorySpec s;
  s.hidden_bytes_per_token = hidden_bytes_per_token;
  s.mirror_bytes = exact_fp32 ? 4 : 2;
  s.split_master = can_split_master(system, exact_fp32);
  s.moments = plan.optimizer_states;
  s.accumulate_all = accumulates_every_unit(plan, traits);
  s.accumulate_unit0 = tied;
  if (traits.convert_on_load) s.convert_staging_bytes = std::min(plan.chunk_numel, layout.max_unit_numel()) * s.mirror_bytes;
  s.device_nonfinite_count = traits.gpu_optimizer;
  if ((traits.accumulate_on_gpu && plan.accum_steps > 1) || traits.partition_round_trip)
    s.accum_source_bytes = grad_staging_slot_bytes(layout, plan, s.mirror_bytes);
  s.staged_grad_bytes = staged_grad_bytes(system, s.mirror_bytes);
  return s;
}

int64_t staged_grad_bytes(System system, int64_t wire_bytes) {
  return std::max(wire_bytes, static_cast<int64_t>(system_traits(system).grad_bytes));
}

bool widens_grad_on_device(const Plan& plan, System system, int64_t wire_bytes) {
  return plan.grad_shards() == 1 && staged_grad_bytes(system, wire_bytes) > wire_bytes;
}

int64_t grad_staging_slot_bytes(const ModelLayout& layout, const Plan& plan, int64_t staged_bytes) {
  // A slot never holds more than the largest unit (SlideFormer's 32M-element chunks on a small model).
  const int64_t slot_numel = std::min(plan.chunk_numel, layout.max_unit_numel());
  const int W = plan.grad_shards();
  const int64_t bytes = W > 1 ? (slot_numel + W - 1) / W * 4 : slot_numel * staged_bytes;
  return (bytes + 63) / 64 * 64;
}

int64_t fp32_fetch_bytes(const ModelLayout& layout, const Plan& plan) {
  const int64_t chunk = std::min(plan.chunk_numel, layout.max_unit_numel());
  return (shard_range(chunk, plan.ranks, 0).size() * 4 + 63) / 64 * 64;
}

std::vector<MemoryItem> host_memory_items(const ModelLayout& layout, const Plan& plan, int64_t seq_len,
                                          const HostMemorySpec& spec) {
  const double P = static_cast<double>(layout.total_flat_numel), N = plan.ranks;
  const double emb = static_cast<double>(layout.units.front().flat_numel);
  const double chunk = static_cast<double>(std::min(plan.chunk_numel, layout.max_unit_numel()));
  const double tokens = static_cast<double>(plan.micro_batch * seq_len);
  const int L = layout.num_units() - 2;
  std::vector<MemoryItem> items;
  // Several nodes with a sharded host state: each node holds 1/M of the fp32 master and moments (the
  // delivery mirror stays whole: every node's GPUs need every unit). Across nodes, each node also keeps
  // the reduced fp32 chunk it sends and the one it receives, two chunks in flight.
  const double M = plan.nodes;
  const bool sharded = plan.nodes > 1 && plan.host_state == HostState::kSharded;
  const double own = sharded ? std::ceil(P / M) : P;  // the node's part of the state (the largest part)
  const std::string shard = sharded ? fmt::format(" (1/{} shard)", plan.nodes) : "";
  if (spec.split_master)
    items.push_back(
        {"master weights' low halves (split master: the mirror holds the rest)" + shard, own * 2});
  else
    items.push_back({"fp32 master weights" + shard, own * 4});
  if (spec.moments == OptimizerStates::k8bit) {
    // A byte per element each and two fp32 scales per block (blocks start anew at every segment).
    const double blocks =
        std::ceil(static_cast<double>(q8_model_blocks(layout, plan.chunk_numel, plan.nodes * plan.ranks)) /
                  (sharded ? M : 1.0));
    items.push_back({"8-bit AdamW m and v with their block scales" + shard, own * 2 + blocks * 8});
  } else {
    items.push_back({fmt::format("{} AdamW m and v", optimizer_states_name(spec.moments)) + shard,
                     own * moment_bytes_per_param(spec.moments)});
  }
  if (plan.nodes > 1) items.push_back({"network exchange buffers (pinned)", 2 * 2 * chunk * 4});
  if (sharded) {
    // A checkpoint gathers whole tensors of the node's part while it is written, m and v together
    // after the weights (executor/state_checkpoint.h): the split gives a part at most 1/M of the
    // tensors plus one tensor.
    double largest = 0;
    for (const auto& unit : layout.units)
      for (const auto& t : unit.tensors) largest = std::max(largest, static_cast<double>(t.numel));
    items.push_back({"checkpoint part while saving (m and v of whole tensors)", (std::ceil(P / M) + largest) * 8});
  }
  items.push_back({fmt::format("delivery mirror ({}) (pinned)", spec.mirror_bytes == 2 ? "bf16" : "fp32"),
                   P * static_cast<double>(spec.mirror_bytes)});
  // The accumulator holds what the node updates: its part with a sharded state (the node reduces its
  // ranks' gradients and exchanges them before accumulating), the whole model otherwise.
  const std::string of_part = sharded ? fmt::format(" (1/{} shard)", plan.nodes) : "";
  if (spec.accumulate_all)
    items.push_back({"fp32 gradient accumulator" + of_part, own * 4});
  else if (spec.accumulate_unit0)
    items.push_back({"fp32 tied-embedding gradient accumulator" + of_part, (sharded ? std::ceil(emb / M) : emb) * 4});
  items.push_back({"gradient staging rings (pinned)",
                   N * kGradStagingChunksPerRank *
                       static_cast<double>(grad_staging_slot_bytes(layout, plan, spec.staged_grad_bytes))});
  const double offload = static_cast<double>(plan.policy_counts(L).offload);
  if (offload > 0)
    items.push_back({"offloaded activations (pinned)", N * offload * tokens * static_cast<double>(spec.hidden_bytes_per_token)});
  // two of each (micro-steps alternate): token ids, targets, document positions; the loss
  items.push_back({"token and loss buffers (pinned)", N * 2 * (tokens * 12 + 16)});
  if (spec.convert_staging_bytes > 0)
    items.push_back({"conversion staging (pinned, two per rank)", N * 2 * static_cast<double>(spec.convert_staging_bytes)});
  if (spec.device_nonfinite_count) items.push_back({"gradient check counts (pinned)", N * 4});
  if (spec.accum_source_bytes > 0)
    items.push_back({"gradient round trip's host buffer (pinned, one per rank)",
                     N * static_cast<double>(spec.accum_source_bytes)});
  return items;
}

}  // namespace slidedp
