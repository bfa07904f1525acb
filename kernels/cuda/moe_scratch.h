// The device buffers of the routed experts on the GPU (kernels/cuda/moe_experts.cu): carve sequences
// the experts run over device memory and the size queries (the memory account, on machines without
// CUDA) over nothing, as unit_scratch.h does for the layers. No CUDA type here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/transformer/moe_experts.h"  // MoeSpec
#include "kernels/cuda/unit_scratch.h"            // Carver

namespace slidedp::kernels::cuda {

// Where each (token, slot) went after the stable sort by expert, and the grouped GEMMs' tiles.
struct ExpertDispatch {
  int64_t* offsets;       // (E + 1) expert e's sorted rows start at offsets[e]
  int32_t* tile_offsets;  // (E + 1) its first grouped-GEMM tile (math::tile_expert)
  int32_t* row_of_slot;   // (N * K), slot = token * K + k
  int32_t* slot_of_row;   // (N * K)
};
inline ExpertDispatch carve_expert_dispatch(Carver& a, const MoeSpec& s, int64_t N) {
  return {a.take<int64_t>(s.E + 1, "expert offsets"), a.take<int32_t>(s.E + 1, "expert tile offsets"),
          a.take<int32_t>(N * s.K, "row of slot"), a.take<int32_t>(N * s.K, "slot of row")};
}

// Saved by forward: every routed row's gate and up projections, sorted rows (as the CPU's).
template <typename Bf16>
struct ExpertsSaved {
  Bf16* g;  // (N*K, Ie)
  Bf16* u;  // (N*K, Ie)
};
template <typename Bf16>
ExpertsSaved<Bf16> carve_experts_saved(Carver& a, const MoeSpec& s, int64_t N) {
  return {a.take<Bf16>(N * s.K * s.Ie, "expert gate"), a.take<Bf16>(N * s.K * s.Ie, "expert up")};
}

// Forward scratch: the gathered inputs, overwritten by the experts' outputs (the down GEMM runs after
// the gate and up GEMMs read them, in stream order), and the activations.
template <typename Bf16>
struct ExpertsForward {
  ExpertDispatch d;
  Bf16* rows;  // (N*K, C)
  Bf16* m;     // (N*K, Ie)
};
template <typename Bf16>
ExpertsForward<Bf16> carve_experts_forward(Carver& a, const MoeSpec& s, int64_t N) {
  ExpertsForward<Bf16> f{};
  f.d = carve_expert_dispatch(a, s, N);
  f.rows = a.take<Bf16>(N * s.K * s.C, "expert rows");
  f.m = a.take<Bf16>(N * s.K * s.Ie, "expert activation");
  return f;
}

// Backward scratch. gm_dz holds dy W_down (fp32, Ie wide) until the routing weights' gradients are
// taken from it, then the inputs' gradients (fp32, C wide).
template <typename Bf16>
struct ExpertsBackward {
  ExpertDispatch d;
  Bf16* z;       // (N*K, C) gathered inputs
  Bf16* dy;      // (N*K, C) gathered output gradients, then times the routing weight
  Bf16* m_du;    // (N*K, Ie) recomputed activation, then du
  Bf16* dm_dg;   // (N*K, Ie) dm, then dg
  float* gm_dz;  // (N*K, max(Ie, C))
};
template <typename Bf16>
ExpertsBackward<Bf16> carve_experts_backward(Carver& a, const MoeSpec& s, int64_t N) {
  const int64_t rows = N * s.K;
  ExpertsBackward<Bf16> b{};
  b.d = carve_expert_dispatch(a, s, N);
  b.z = a.take<Bf16>(rows * s.C, "expert rows");
  b.dy = a.take<Bf16>(rows * s.C, "expert row gradients");
  b.m_du = a.take<Bf16>(rows * s.Ie, "expert activation / du");
  b.dm_dg = a.take<Bf16>(rows * s.Ie, "dm / dg");
  b.gm_dz = a.take<float>(rows * std::max(s.Ie, s.C), "dy W_down / expert input gradients");
  return b;
}

// ---- sizes (bytes), from the sequences above (unit_scratch.cc) ----
int64_t experts_saved_bytes(const MoeSpec& s, int64_t N);
int64_t experts_forward_workspace_bytes(const MoeSpec& s, int64_t N);
int64_t experts_backward_workspace_bytes(const MoeSpec& s, int64_t N);

}  // namespace slidedp::kernels::cuda
