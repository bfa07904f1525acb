// Per-unit working sets from the kernels' own size queries; see working_set.h.
#include "kernels/cpu/transformer/working_set.h"

#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/llama_layer.h"

namespace slidedp::kernels {

template <typename Real>
UnitWorkingSet embedding_working_set(const EmbeddingSpec& s, int64_t B, int64_t T) {
  const int64_t R = sizeof(Real);
  UnitWorkingSet w;
  w.param_scratch_bytes = s.flat_numel * R;
  w.grad_bytes = s.flat_numel * R;
  w.hidden_bytes = B * T * s.C * R;
  w.forward_peak_bytes = B * T * static_cast<int64_t>(sizeof(int32_t)) + w.hidden_bytes;   // tokens, x
  w.backward_peak_bytes = B * T * static_cast<int64_t>(sizeof(int32_t)) + w.hidden_bytes;  // tokens, dx
  return w;
}

template <typename Real>
UnitWorkingSet decoder_working_set(const DecoderSpec& s, int64_t B, int64_t T) {
  const int64_t R = sizeof(Real);
  UnitWorkingSet w;
  w.param_scratch_bytes = s.flat_numel * R;
  w.grad_bytes = s.flat_numel * R;
  w.hidden_bytes = B * T * s.C * R;
  w.saved_bytes = decoder_saved_bytes<Real>(s, B, T);
  w.forward_workspace_bytes = decoder_forward_workspace_bytes<Real>(s, B, T);
  w.backward_workspace_bytes = decoder_backward_workspace_bytes<Real>(s, B, T);
  w.forward_peak_bytes = 2 * w.hidden_bytes + w.saved_bytes + w.forward_workspace_bytes;
  w.backward_peak_bytes = 3 * w.hidden_bytes + w.saved_bytes + w.backward_workspace_bytes;
  return w;
}

template <typename Real>
UnitWorkingSet head_working_set(const HeadSpec& s, int64_t B, int64_t T) {
  const int64_t R = sizeof(Real);
  UnitWorkingSet w;
  w.param_scratch_bytes = s.flat_numel * R;
  w.grad_bytes = s.flat_numel * R;
  w.hidden_bytes = B * T * s.C * R;
  w.forward_workspace_bytes = head_workspace_bytes<Real>(s, B, T, false);
  w.backward_workspace_bytes = head_workspace_bytes<Real>(s, B, T, true);
  const int64_t targets = B * T * static_cast<int64_t>(sizeof(int32_t));
  w.forward_peak_bytes = w.hidden_bytes + targets + w.forward_workspace_bytes;        // x, loss only
  w.backward_peak_bytes = 2 * w.hidden_bytes + targets + w.backward_workspace_bytes;  // x, dx (fused)
  return w;
}

template UnitWorkingSet embedding_working_set<float>(const EmbeddingSpec&, int64_t, int64_t);
template UnitWorkingSet embedding_working_set<double>(const EmbeddingSpec&, int64_t, int64_t);
template UnitWorkingSet decoder_working_set<float>(const DecoderSpec&, int64_t, int64_t);
template UnitWorkingSet decoder_working_set<double>(const DecoderSpec&, int64_t, int64_t);
template UnitWorkingSet head_working_set<float>(const HeadSpec&, int64_t, int64_t);
template UnitWorkingSet head_working_set<double>(const HeadSpec&, int64_t, int64_t);

}  // namespace slidedp::kernels
