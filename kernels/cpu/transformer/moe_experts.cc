// Router top-k and the grouped expert GEMMs on the CPU; see moe_experts.h. The carve functions are
// the single source of the buffer sizes, as in llama_layer.cc.
#include "kernels/cpu/transformer/moe_experts.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/geglu.h"
#include "kernels/cpu/transformer/linear.h"
#include "kernels/cpu/transformer/parallel.h"
#include "kernels/cpu/transformer/swiglu.h"

namespace slidedp::kernels {
namespace {

void check_spec(const MoeSpec& s, int64_t N) {
  SLIDEDP_CHECK(N >= 0, "negative token count");
  SLIDEDP_CHECK(s.C > 0 && s.E > 0 && s.K > 0 && s.K <= s.E && s.Ie > 0, "bad MoE spec");
  SLIDEDP_CHECK(N * s.K <= INT32_MAX, "too many routed rows for 32-bit row indices");
}

// Which sorted row holds each (token, slot) and back, and where each expert's rows start. A counting
// sort, stable in slot order, so the grouping depends on idx alone.
struct Dispatch {
  int64_t* offsets;      // (E + 1)
  int32_t* row_of_slot;  // (N * K), slot = t * K + k
  int32_t* slot_of_row;  // (N * K)
  int64_t* cursor;       // (E) next free row of each expert while sorting
};

Dispatch carve_dispatch(Arena& a, const MoeSpec& s, int64_t N) {
  return {a.take<int64_t>(s.E + 1, "expert offsets"), a.take<int32_t>(N * s.K, "row of slot"),
          a.take<int32_t>(N * s.K, "slot of row"), a.take<int64_t>(s.E, "expert cursor")};
}

void build_dispatch(const Dispatch& d, const int32_t* idx, int64_t E, int64_t slots) {
  std::fill(d.offsets, d.offsets + E + 1, int64_t{0});
  for (int64_t i = 0; i < slots; ++i) {
    SLIDEDP_CHECK(idx[i] >= 0 && idx[i] < E, "expert index out of range");
    ++d.offsets[idx[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) d.offsets[e + 1] += d.offsets[e];
  std::copy(d.offsets, d.offsets + E, d.cursor);
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t row = d.cursor[idx[i]]++;
    d.row_of_slot[i] = static_cast<int32_t>(row);
    d.slot_of_row[row] = static_cast<int32_t>(i);
  }
}

// rows (sorted order) <- src[token of the row]
template <typename Real>
void gather_rows(Real* rows, const Real* src, const Dispatch& d, int64_t slots, int64_t K, int64_t C,
                 int64_t threads) {
  for_each_slice(slots, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const Real* from = src + (d.slot_of_row[r] / K) * C;
      std::copy(from, from + C, rows + r * C);
    }
  });
}

template <typename Real>
void activation_forward(const MoeSpec& s, Real* m, const Real* g, const Real* u, int64_t n) {
  if (s.activation == ExpertActivation::kGeluTanh)
    geglu_forward(m, g, u, n);
  else
    swiglu_forward(m, g, u, n);
}

template <typename Real>
void activation_backward(const MoeSpec& s, Real* dg, Real* du, const Real* dm, const Real* g, const Real* u,
                         int64_t n) {
  if (s.activation == ExpertActivation::kGeluTanh)
    geglu_backward(dg, du, dm, g, u, n);
  else
    swiglu_backward(dg, du, dm, g, u, n);
}

template <typename Real>
struct SavedRows {
  Real* g;  // (N*K, Ie) gate projections, sorted rows
  Real* u;  // (N*K, Ie) up projections
};
template <typename Real>
SavedRows<Real> carve_saved(Arena& a, const MoeSpec& s, int64_t N) {
  return {a.take<Real>(N * s.K * s.Ie, "expert gate"), a.take<Real>(N * s.K * s.Ie, "expert up")};
}

// Forward scratch: the dispatch, the gathered inputs (overwritten by each expert's output rows: an
// expert reads its input rows before it writes the output rows), the activations.
template <typename Real>
struct ForwardScratch {
  Dispatch d;
  Real* rows;  // (N*K, C)
  Real* m;     // (N*K, Ie)
};
template <typename Real>
ForwardScratch<Real> carve_forward(Arena& a, const MoeSpec& s, int64_t N) {
  ForwardScratch<Real> f;
  f.d = carve_dispatch(a, s, N);
  f.rows = a.take<Real>(N * s.K * s.C, "expert rows");
  f.m = a.take<Real>(N * s.K * s.Ie, "expert activation");
  return f;
}

template <typename Real>
struct BackwardScratch {
  Dispatch d;
  Real* z;   // (N*K, C) gathered inputs
  Real* dy;  // (N*K, C) gathered output gradients, weighted in place, then the inputs' gradients
  Real* m;   // (N*K, Ie) recomputed activation, then du
  Real* gm;  // (N*K, Ie) dy W_down, then dm, then dg
};
template <typename Real>
BackwardScratch<Real> carve_backward(Arena& a, const MoeSpec& s, int64_t N) {
  BackwardScratch<Real> b;
  b.d = carve_dispatch(a, s, N);
  b.z = a.take<Real>(N * s.K * s.C, "expert rows");
  b.dy = a.take<Real>(N * s.K * s.C, "expert row gradients");
  b.m = a.take<Real>(N * s.K * s.Ie, "expert activation");
  b.gm = a.take<Real>(N * s.K * s.Ie, "expert activation gradient");
  return b;
}

}  // namespace

template <typename Real>
void router_topk_forward(Real* probs, int32_t* idx, Real* w, const Real* logits, int64_t N, int64_t E,
                         int64_t K) {
  SLIDEDP_CHECK(E > 0 && K > 0 && K <= E, "top-k needs 0 < K <= E");
  for (int64_t t = 0; t < N; ++t) {
    const Real* l = logits + t * E;
    Real* p = probs + t * E;
    const Real mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<Real>(std::exp(static_cast<double>(l[e] - mx)) / sum);
    int32_t* chosen = idx + t * K;
    double top = 0;
    for (int64_t k = 0; k < K; ++k) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (std::find(chosen, chosen + k, static_cast<int32_t>(e)) != chosen + k) continue;
        if (best < 0 || p[e] > p[best]) best = static_cast<int32_t>(e);  // strict: ties keep the lower index
      }
      chosen[k] = best;
      top += p[best];
    }
    for (int64_t k = 0; k < K; ++k) w[t * K + k] = static_cast<Real>(p[chosen[k]] / top);
  }
}

template <typename Real>
void router_topk_backward(Real* dlogits, const Real* dw, const Real* probs, const int32_t* idx, int64_t N,
                          int64_t E, int64_t K) {
  for (int64_t t = 0; t < N; ++t) {
    const Real* p = probs + t * E;
    const int32_t* chosen = idx + t * K;
    const Real* g = dw + t * K;
    // w_k = p_k / sum_j p_j = exp(l_k) / sum_j exp(l_j) over the chosen j: the softmax's normaliser
    // cancels, so w is a softmax over the chosen logits alone. dl_k = w_k (dw_k - sum_j dw_j w_j),
    // and the unchosen logits get none.
    double top = 0;
    for (int64_t k = 0; k < K; ++k) top += p[chosen[k]];
    double coupling = 0;
    for (int64_t k = 0; k < K; ++k) coupling += g[k] * (p[chosen[k]] / top);
    Real* d = dlogits + t * E;
    std::fill(d, d + E, Real(0));
    for (int64_t k = 0; k < K; ++k) d[chosen[k]] = static_cast<Real>(p[chosen[k]] / top * (g[k] - coupling));
  }
}

template <typename Real>
int64_t experts_saved_bytes(const MoeSpec& s, int64_t N) {
  return measured_bytes([&](Arena& a) { carve_saved<Real>(a, s, N); });
}

template <typename Real>
int64_t experts_forward_workspace_bytes(const MoeSpec& s, int64_t N) {
  return measured_bytes([&](Arena& a) { carve_forward<Real>(a, s, N); });
}

template <typename Real>
int64_t experts_backward_workspace_bytes(const MoeSpec& s, int64_t N) {
  return measured_bytes([&](Arena& a) { carve_backward<Real>(a, s, N); });
}

template <typename Real>
void experts_forward(const MoeSpec& s, const Real* gate_up, const Real* down, const Real* z,
                     const int32_t* idx, const Real* w, Real* y, Workspace saved, int64_t N, Workspace ws) {
  check_spec(s, N);
  const int64_t C = s.C, K = s.K, Ie = s.Ie, slots = N * K;
  Arena saved_arena(saved);
  const SavedRows<Real> S = carve_saved<Real>(saved_arena, s, N);
  Arena arena(ws);
  const ForwardScratch<Real> f = carve_forward<Real>(arena, s, N);
  build_dispatch(f.d, idx, s.E, slots);
  gather_rows(f.rows, z, f.d, slots, K, C, s.threads);
  for_each_item(s.E, s.threads, [&](int64_t e, int64_t) {
    const int64_t begin = f.d.offsets[e], rows = f.d.offsets[e + 1] - begin;
    if (rows == 0) return;
    const Real* wg = gate_up + e * 2 * Ie * C;
    Real* in_out = f.rows + begin * C;
    Real* g = S.g + begin * Ie;
    Real* u = S.u + begin * Ie;
    Real* m = f.m + begin * Ie;
    linear_forward(g, in_out, wg, static_cast<const Real*>(nullptr), rows, C, Ie, false);
    linear_forward(u, in_out, wg + Ie * C, static_cast<const Real*>(nullptr), rows, C, Ie, false);
    activation_forward(s, m, g, u, rows * Ie);
    linear_forward(in_out, m, down + e * C * Ie, static_cast<const Real*>(nullptr), rows, Ie, C, false);
  });
  // each token sums its slots in slot order
  for_each_slice(N, s.threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Real* out = y + t * C;
      for (int64_t k = 0; k < K; ++k) {
        const Real wk = w[t * K + k];
        const Real* row = f.rows + static_cast<int64_t>(f.d.row_of_slot[t * K + k]) * C;
        if (k == 0)
          for (int64_t c = 0; c < C; ++c) out[c] = wk * row[c];
        else
          for (int64_t c = 0; c < C; ++c) out[c] += wk * row[c];
      }
    }
  });
}

template <typename Real>
void experts_backward(const MoeSpec& s, const Real* gate_up, const Real* down, const Real* z,
                      const int32_t* idx, const Real* w, Workspace saved, const Real* dy, Real* dz, Real* dw,
                      Real* dgate_up, Real* ddown, int64_t N, Workspace ws) {
  check_spec(s, N);
  const int64_t C = s.C, K = s.K, Ie = s.Ie, slots = N * K;
  Arena saved_arena(saved);
  const SavedRows<Real> S = carve_saved<Real>(saved_arena, s, N);
  Arena arena(ws);
  const BackwardScratch<Real> b = carve_backward<Real>(arena, s, N);
  build_dispatch(b.d, idx, s.E, slots);
  gather_rows(b.z, z, b.d, slots, K, C, s.threads);
  gather_rows(b.dy, dy, b.d, slots, K, C, s.threads);
  for_each_item(s.E, s.threads, [&](int64_t e, int64_t) {
    const int64_t begin = b.d.offsets[e], rows = b.d.offsets[e + 1] - begin;
    if (rows == 0) return;
    const Real* wg = gate_up + e * 2 * Ie * C;
    const Real* wd = down + e * C * Ie;
    Real* dwg = dgate_up + e * 2 * Ie * C;
    const Real* zr = b.z + begin * C;
    Real* dyr = b.dy + begin * C;
    const Real* g = S.g + begin * Ie;
    const Real* u = S.u + begin * Ie;
    Real* m = b.m + begin * Ie;
    Real* gm = b.gm + begin * Ie;
    activation_forward(s, m, g, u, rows * Ie);
    // out = m Wd^T, so dy . out = (dy Wd) . m: the routing weight's gradient without saving out
    gemm(false, false, rows, Ie, C, Real(1), dyr, C, wd, Ie, Real(0), gm, Ie);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t slot = b.d.slot_of_row[begin + r];
      double acc = 0;
      for (int64_t i = 0; i < Ie; ++i) acc += static_cast<double>(m[r * Ie + i]) * gm[r * Ie + i];
      dw[slot] = static_cast<Real>(acc);
      const Real wk = w[slot];
      for (int64_t i = 0; i < Ie; ++i) gm[r * Ie + i] *= wk;  // dm = w (dy Wd)
      for (int64_t c = 0; c < C; ++c) dyr[r * C + c] *= wk;   // d out = w dy
    }
    gemm(true, false, C, Ie, rows, Real(1), dyr, C, m, Ie, Real(1), ddown + e * C * Ie,
         Ie);                                            // dWd += dout^T m
    activation_backward(s, gm, m, gm, g, u, rows * Ie);  // gm <- dg, m <- du
    linear_backward(dyr, dwg, static_cast<Real*>(nullptr), gm, zr, wg, rows, C, Ie, false);
    linear_backward(dyr, dwg + Ie * C, static_cast<Real*>(nullptr), m, zr, wg + Ie * C, rows, C, Ie, true);
  });
  for_each_slice(N, s.threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Real* out = dz + t * C;
      for (int64_t k = 0; k < K; ++k) {
        const Real* row = b.dy + static_cast<int64_t>(b.d.row_of_slot[t * K + k]) * C;
        if (k == 0)
          std::copy(row, row + C, out);
        else
          for (int64_t c = 0; c < C; ++c) out[c] += row[c];
      }
    }
  });
}

#define SLIDEDP_INSTANTIATE(Real)                                                                            \
  template void router_topk_forward<Real>(Real*, int32_t*, Real*, const Real*, int64_t, int64_t, int64_t);   \
  template void router_topk_backward<Real>(Real*, const Real*, const Real*, const int32_t*, int64_t,         \
                                           int64_t, int64_t);                                                \
  template int64_t experts_saved_bytes<Real>(const MoeSpec&, int64_t);                                       \
  template int64_t experts_forward_workspace_bytes<Real>(const MoeSpec&, int64_t);                           \
  template int64_t experts_backward_workspace_bytes<Real>(const MoeSpec&, int64_t);                          \
  template void experts_forward<Real>(const MoeSpec&, const Real*, const Real*, const Real*, const int32_t*, \
                                      const Real*, Real*, Workspace, int64_t, Workspace);                    \
  template void experts_backward<Real>(const MoeSpec&, const Real*, const Real*, const Real*,                \
                                       const int32_t*, const Real*, Workspace, const Real*, Real*, Real*,    \
                                       Real*, Real*, int64_t, Workspace);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
