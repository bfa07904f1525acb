// Memory of one unit's forward/backward for given B, T, in the compute type: what the executor's
// memory accounting (and the planner's memory model) needs. Every number comes from the same carve
// code the kernels run, so it is exact, not an estimate. Parameters and gradients are listed apart
// from the peaks because the executor holds them in its own slots (depth-buffered, streamed).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

struct UnitWorkingSet {
  int64_t param_scratch_bytes = 0;  // compute-type copy of the unit's flat params (bf16 delivery)
  int64_t grad_bytes = 0;           // the unit's flat gradient buffer (tied lm_head: in unit 0)
  int64_t hidden_bytes = 0;         // one (B, T, C) hidden-state buffer
  int64_t saved_bytes = 0;          // forward's saved state (kept under `keep`, rebuilt by recompute)
  int64_t forward_workspace_bytes = 0;
  int64_t backward_workspace_bytes = 0;
  // Live during the unit's forward: x + y + saved + forward scratch (+ token ids for the embedding).
  int64_t forward_peak_bytes = 0;
  // Live during its backward: x + dy + dx + saved + backward scratch (the head: x + dx + scratch).
  int64_t backward_peak_bytes = 0;
  int64_t peak_bytes() const { return std::max(forward_peak_bytes, backward_peak_bytes); }
};

template <typename Real>
UnitWorkingSet embedding_working_set(const EmbeddingSpec& spec, int64_t B, int64_t T);
template <typename Real>
UnitWorkingSet decoder_working_set(const DecoderSpec& spec, int64_t B, int64_t T);
template <typename Real>
UnitWorkingSet head_working_set(const HeadSpec& spec, int64_t B, int64_t T);

}  // namespace slidedp::kernels
