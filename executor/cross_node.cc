// Tags and the chain's addition for the cross-node gradient sum; see cross_node.h.
#include "executor/cross_node.h"

#include "common/error.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::exec {

namespace {
constexpr int kKinds = 5, kStepsInFlight = 4, kParts = 2;
}

CrossNodeTags::CrossNodeTags(std::vector<int64_t> chunks_per_unit, int accum_steps) : accum_steps_(accum_steps) {
  for (int64_t c : chunks_per_unit) chunk_base_.push_back(chunks_), chunks_ += c;
}

int64_t CrossNodeTags::tag(CrossNodeKind kind, int64_t step, int micro, int part, int unit, int64_t chunk) const {
  const int64_t key = ((static_cast<int64_t>(micro) * kParts + part) * chunks_) + chunk_base_.at(static_cast<size_t>(unit)) + chunk;
  const int64_t per_step = static_cast<int64_t>(accum_steps_) * kParts * chunks_;
  return ((step % kStepsInFlight) * per_step + key) * kKinds + static_cast<int>(kind);
}

int64_t CrossNodeTags::max_tag() const {
  return static_cast<int64_t>(kStepsInFlight) * accum_steps_ * kParts * chunks_ * kKinds - 1;
}

namespace {

template <class T>
void add_in_order(ThreadPool& pool, std::span<const T* const> slots, float* partial, int64_t n) {
  pool.parallel_for_range(0, n, kernels::kTileNumel, [&](int64_t tb, int64_t te) {
    // One slot at a time over the tile: fma(slot, 1, partial) is slot + partial rounded once.
    for (const T* s : slots) kernels::reduce_grads_accumulate(std::span<const T* const>(&s, 1), 1.0f, partial, tb, te);
  });
}

}  // namespace

void add_slots_in_order(ThreadPool& pool, std::span<const bf16_bits* const> slots, float* partial, int64_t n) {
  add_in_order(pool, slots, partial, n);
}
void add_slots_in_order(ThreadPool& pool, std::span<const float* const> slots, float* partial, int64_t n) {
  add_in_order(pool, slots, partial, n);
}

}  // namespace slidedp::exec
