// Family dispatch of the decoder layer; see layer_dispatch.h.
#include "kernels/cpu/transformer/layer_dispatch.h"

#include "kernels/cpu/transformer/decoder_layer.h"
#include "kernels/cpu/transformer/gemma4_layer.h"
#include "kernels/cpu/transformer/qwen3_5_layer.h"

namespace slidedp::kernels {
namespace {

const Gemma4LayerSpec& gemma4_spec(const ModelSpecs& s, int layer) {
  return s.gemma4_layers.at(static_cast<size_t>(layer));
}

const Qwen35LayerSpec& qwen_spec(const ModelSpecs& s, int layer) {
  return s.qwen3_5_layers.at(static_cast<size_t>(layer));
}

}  // namespace

int64_t layer_flat_numel(const ModelSpecs& s, int layer) {
  if (s.qwen3_5()) return qwen_spec(s, layer).flat_numel;
  return s.gemma4() ? gemma4_spec(s, layer).flat_numel : s.decoder.flat_numel;
}

template <typename Real>
int64_t layer_saved_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  if (s.qwen3_5()) return qwen3_5_saved_bytes<Real>(qwen_spec(s, layer), B, T);
  return s.gemma4() ? gemma4_saved_bytes<Real>(gemma4_spec(s, layer), B, T) : decoder_saved_bytes<Real>(s.decoder, B, T);
}

template <typename Real>
int64_t layer_forward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  if (s.qwen3_5()) return qwen3_5_forward_workspace_bytes<Real>(qwen_spec(s, layer), B, T);
  return s.gemma4() ? gemma4_forward_workspace_bytes<Real>(gemma4_spec(s, layer), B, T)
                    : decoder_forward_workspace_bytes<Real>(s.decoder, B, T);
}

template <typename Real>
int64_t layer_backward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  if (s.qwen3_5()) return qwen3_5_backward_workspace_bytes<Real>(qwen_spec(s, layer), B, T);
  return s.gemma4() ? gemma4_backward_workspace_bytes<Real>(gemma4_spec(s, layer), B, T)
                    : decoder_backward_workspace_bytes<Real>(s.decoder, B, T);
}

template <typename Real>
void layer_forward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  if (s.qwen3_5())
    qwen3_5_forward(qwen_spec(s, layer), params, x, y, saved, B, T, ws, router, positions);
  else if (s.gemma4())
    gemma4_forward(gemma4_spec(s, layer), params, x, y, saved, B, T, ws, router, positions);
  else
    decoder_forward(s.decoder, params, x, y, saved, B, T, ws, positions);
}

template <typename Real>
void layer_recompute(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions) {
  if (s.qwen3_5())
    qwen3_5_recompute(qwen_spec(s, layer), params, x, saved, B, T, ws, positions);
  else if (s.gemma4())
    gemma4_recompute(gemma4_spec(s, layer), params, x, saved, B, T, ws, positions);
  else
    decoder_recompute(s.decoder, params, x, saved, B, T, ws, positions);
}

template <typename Real>
void layer_backward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved,
                    const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* router, const int32_t* positions) {
  if (s.qwen3_5())
    qwen3_5_backward(qwen_spec(s, layer), params, x, saved, dy, dx, grads, B, T, ws, router, positions);
  else if (s.gemma4())
    gemma4_backward(gemma4_spec(s, layer), params, x, saved, dy, dx, grads, B, T, ws, router, positions);
  else
    decoder_backward(s.decoder, params, x, saved, dy, dx, grads, B, T, ws, positions);
}

#define SLIDEDP_INSTANTIATE(Real)                                                                              \
  template int64_t layer_saved_bytes<Real>(const ModelSpecs&, int, int64_t, int64_t);                          \
  template int64_t layer_forward_workspace_bytes<Real>(const ModelSpecs&, int, int64_t, int64_t);              \
  template int64_t layer_backward_workspace_bytes<Real>(const ModelSpecs&, int, int64_t, int64_t);             \
  template void layer_forward<Real>(const ModelSpecs&, int, const Real*, const Real*, Real*, Workspace, int64_t, \
                                    int64_t, Workspace, const RouterStats*, const int32_t*);                   \
  template void layer_recompute<Real>(const ModelSpecs&, int, const Real*, const Real*, Workspace, int64_t,    \
                                      int64_t, Workspace, const int32_t*);                                     \
  template void layer_backward<Real>(const ModelSpecs&, int, const Real*, const Real*, Workspace, const Real*, \
                                     Real*, Real*, int64_t, int64_t, Workspace, const RouterStats*,            \
                                     const int32_t*);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
