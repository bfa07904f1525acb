// One forward (and, given dy, one backward) of a decoder-layer unit with a spec per layer (Gemma 4,
// Qwen3.6): buffers sized by the unit's own queries, scratch filled with garbage first so a read of
// unwritten scratch shows, the saved state kept for recompute checks.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/router_aux_loss.h"

namespace slidedp::kernels::test {

template <typename Real>
struct LayerRun {
  std::vector<Real> y, dx, grads;
  AlignedBuffer saved;
};

// The unit's five entry points for one Real, e.g. {&qwen3_5_saved_bytes<float>, ...}.
template <typename Real, typename Spec>
struct LayerUnit {
  int64_t (*saved_bytes)(const Spec&, int64_t, int64_t);
  int64_t (*forward_workspace_bytes)(const Spec&, int64_t, int64_t);
  int64_t (*backward_workspace_bytes)(const Spec&, int64_t, int64_t);
  // The MoE families' units also take the router statistics (router_aux_loss.h) and every unit the
  // document positions (attention.h); none here.
  void (*forward)(const Spec&, const Real*, const Real*, Real*, Workspace, int64_t, int64_t, Workspace,
                  const RouterStats*, const int32_t*);
  void (*backward)(const Spec&, const Real*, const Real*, Workspace, const Real*, Real*, Real*, int64_t, int64_t,
                   Workspace, const RouterStats*, const int32_t*);
};

template <typename Real, typename Spec>
LayerRun<Real> run_layer(const LayerUnit<Real, Spec>& unit, const Spec& s, const std::vector<Real>& p,
                         const std::vector<Real>& x, const std::vector<Real>& dy, int64_t B, int64_t T) {
  LayerRun<Real> r;
  r.y.assign(x.size(), Real(0));
  r.saved = AlignedBuffer(unit.saved_bytes(s, B, T));
  AlignedBuffer fws(unit.forward_workspace_bytes(s, B, T));
  std::memset(fws.data(), 0x7f, static_cast<size_t>(fws.bytes()));
  unit.forward(s, p.data(), x.data(), r.y.data(), r.saved.workspace(), B, T, fws.workspace(), nullptr, nullptr);
  if (dy.empty()) return r;
  r.dx.assign(x.size(), Real(0));
  r.grads.assign(p.size(), Real(0));
  AlignedBuffer bws(unit.backward_workspace_bytes(s, B, T));
  std::memset(bws.data(), 0x7f, static_cast<size_t>(bws.bytes()));
  unit.backward(s, p.data(), x.data(), r.saved.workspace(), dy.data(), r.dx.data(), r.grads.data(), B, T,
                bws.workspace(), nullptr, nullptr);
  return r;
}

}  // namespace slidedp::kernels::test
