// The updater's exchange with the other nodes of a multi-node run (plan.nodes > 1, cpu gradient
// route). Node j's ranks are the global ranks j*N .. j*N + N-1, and the cross-node sum keeps the one
// order a single node of M*N ranks uses, rank by rank, so M nodes x N ranks give bitwise the weights
// of one node with M*N ranks:
//   1. chain: node 0 sums its ranks' gradients of a chunk in rank order into an fp32 partial sum and
//      sends it to node 1; node j adds its own ranks' gradients, in rank order, to the partial it
//      received (each addition rounded once, exactly as the single node's running sum) and passes it
//      on; node M-1 then holds the sum.
//   2. result: replicated: node M-1 sends the sum to node 0, which passes it to node 1, and so on to
//      node M-2, so each node sends about 8 bytes per parameter per step, as a ring all-reduce would;
//      every node then runs the same update. Sharded: node M-1 sends node j its shard of the sum;
//      node j updates its 1/M of the chunk's master and AdamW state and sends its updated mirror
//      shard to every node.
// The chain costs M-1 network hops per chunk in sequence; the chunks' exchanges overlap each other,
// the backward and the updates.
// Every transfer is keyed by (step, micro-step, gradient part, unit, chunk) in its MPI tag, so the
// nodes may take their jobs in any order.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/bf16.h"
#include "common/thread_pool.h"
#include "executor/node_link.h"
#include "model/plan.h"

namespace slidedp::exec {

// One key's transfers: the partial sum from the previous node and the result from the last one.
struct CrossNodeSum {
  std::vector<float> partial;  // the chain's running sum (received, then added to and passed on)
  std::vector<float> result;   // the sum (replicated) or this node's shard of it (sharded)
  std::atomic<bool> partial_in{false}, result_in{false};
  std::atomic<int> mirror_shards_in{0};  // sharded: other nodes' updated mirror shards received
};

// Wakes the updater from the link's progress thread, and stops doing so once the updater is gone.
class UpdaterWaker {
 public:
  explicit UpdaterWaker(std::function<void()> wake) : wake_(std::move(wake)) {}
  void wake() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (wake_) wake_();
  }
  // Runs fn (then wakes the updater) only while the updater exists.
  void call(const std::function<void()>& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!wake_) return;
    fn();
    wake_();
  }
  void detach() {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_ = nullptr;
  }

 private:
  std::mutex mutex_;
  std::function<void()> wake_;
};

// Transfer kinds, each its own range of tags.
enum class CrossNodeKind { kPartial = 0, kResult = 1, kMirror = 2, kLoss = 3, kNorm = 4 };

// Tags of one run: distinct for every (kind, step mod 4, micro-step, part, unit, chunk).
class CrossNodeTags {
 public:
  // chunks_per_unit: every unit's chunk count; parts: 2 (own, tied head's contribution).
  CrossNodeTags(std::vector<int64_t> chunks_per_unit, int accum_steps);
  int64_t tag(CrossNodeKind kind, int64_t step, int micro, int part, int unit, int64_t chunk) const;
  int64_t max_tag() const;  // the largest tag() can return

 private:
  std::vector<int64_t> chunk_base_;  // per unit: chunks of the units before it
  int64_t chunks_ = 0;
  int accum_steps_ = 1;
};

// partial[i] += slot_r[i] for r = 0, 1, ... in order, i in [0, n): the chain step of a node after
// node 0, each addition rounded once (the same bits as the single node's running sum).
void add_slots_in_order(ThreadPool& pool, std::span<const bf16_bits* const> slots, float* partial, int64_t n);
void add_slots_in_order(ThreadPool& pool, std::span<const float* const> slots, float* partial, int64_t n);

}  // namespace slidedp::exec
