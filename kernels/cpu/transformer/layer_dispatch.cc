// Family dispatch of the decoder layer; see layer_dispatch.h.
#include "kernels/cpu/transformer/layer_dispatch.h"

#include <variant>

#include "kernels/cpu/transformer/layer_spec.h"

namespace slidedp::kernels {

int64_t layer_flat_numel(const ModelSpecs& s, int layer) {
  return std::visit([](const auto& spec) { return layer_flat_numel(spec); }, s.layer(layer));
}

template <typename Real>
int64_t layer_saved_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  return std::visit([&](const auto& spec) { return layer_saved_bytes<Real>(spec, B, T); }, s.layer(layer));
}

template <typename Real>
int64_t layer_forward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  return std::visit([&](const auto& spec) { return layer_forward_workspace_bytes<Real>(spec, B, T); },
                    s.layer(layer));
}

template <typename Real>
int64_t layer_backward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T) {
  return std::visit([&](const auto& spec) { return layer_backward_workspace_bytes<Real>(spec, B, T); },
                    s.layer(layer));
}

template <typename Real>
void layer_forward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  std::visit([&](const auto& spec) { layer_forward(spec, params, x, y, saved, B, T, ws, router, positions); },
             s.layer(layer));
}

template <typename Real>
void layer_recompute(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions) {
  std::visit([&](const auto& spec) { layer_recompute(spec, params, x, saved, B, T, ws, positions); },
             s.layer(layer));
}

template <typename Real>
void layer_backward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved,
                    const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* router, const int32_t* positions) {
  std::visit(
      [&](const auto& spec) {
        layer_backward(spec, params, x, saved, dy, dx, grads, B, T, ws, router, positions);
      },
      s.layer(layer));
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
