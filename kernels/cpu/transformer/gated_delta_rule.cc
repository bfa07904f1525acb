// The chunked gated delta rule on the CPU; see gated_delta_rule.h for the math. Per chunk the work is
// a handful of small GEMMs (chunk x head dim) and two triangular substitutions (chunk^2 x dv).
#include "kernels/cpu/transformer/gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/parallel.h"

namespace slidedp::kernels {
namespace {

void check_spec(const DeltaRuleSpec& s, DeltaRuleSegments seg) {
  SLIDEDP_CHECK(s.nk > 0 && s.nv > 0 && s.nv % s.nk == 0, "delta rule: value heads must be a multiple of key heads");
  SLIDEDP_CHECK(s.dk > 0 && s.dv > 0 && s.chunk > 0 && s.threads > 0, "delta rule: bad spec");
  SLIDEDP_CHECK(seg.count >= 0 && (seg.count == 0 || seg.offsets != nullptr), "delta rule: no segments");
  if (seg.count > 0) SLIDEDP_CHECK(seg.offsets[0] == 0, "delta rule: segments must start at row 0");
  for (int64_t i = 0; i < seg.count; ++i)
    SLIDEDP_CHECK(seg.offsets[i + 1] >= seg.offsets[i], "delta rule: segment offsets must not decrease");
}

int64_t max_chunks(const DeltaRuleSpec& s, DeltaRuleExtent e) { return (e.longest + s.chunk - 1) / s.chunk; }

int64_t workers(const DeltaRuleSpec& s, DeltaRuleExtent e) {
  return std::max<int64_t>(1, std::min(s.threads, e.count * s.nk));
}

// One worker's buffers for one chunk (C = spec chunk, L <= C the chunk's rows).
template <typename Real>
struct ChunkScratch {
  Real *gamma, *decay_in, *decay_out;  // (C): running sum of g, exp(gamma_t), exp(gamma_last - gamma_t)
  Real *D, *KK, *QK;                   // (C, C): exp(gamma_t - gamma_s) for s <= t (0 above), K K^T, Q K^T
  Real *M, *Delta;                     // (C, dv): K S0, then the chunk's Delta
  Real *Ke;                            // (C, dk): rows of K times decay_out
  Real *S;                             // (dk, dv): the running state
};

template <typename Real>
ChunkScratch<Real> carve_chunk(Arena& a, const DeltaRuleSpec& s) {
  const int64_t C = s.chunk;
  ChunkScratch<Real> x;
  x.gamma = a.take<Real>(C, "gamma");
  x.decay_in = a.take<Real>(C, "exp gamma");
  x.decay_out = a.take<Real>(C, "exp(gamma_last - gamma)");
  x.D = a.take<Real>(C * C, "decay matrix");
  x.KK = a.take<Real>(C * C, "K K^T");
  x.QK = a.take<Real>(C * C, "Q K^T");
  x.M = a.take<Real>(C * s.dv, "K S0");
  x.Delta = a.take<Real>(C * s.dv, "Delta");
  x.Ke = a.take<Real>(C * s.dk, "decayed K");
  x.S = a.take<Real>(s.dk * s.dv, "state");
  return x;
}

template <typename Real>
struct BackwardScratch {
  ChunkScratch<Real> f;
  Real* states;                     // (chunks, dk, dv): the state entering each chunk
  Real *dDelta, *dR, *QS0, *KdS;    // (C, dv)
  Real *dP, *dQK, *dA, *dD, *dKK;   // (C, C)
  Real *ddecay_in, *ddecay_out, *dgamma;  // (C)
  Real *dS, *dS0;                   // (dk, dv)
  Real* tmp;                        // (C, max(dk, dv))
};

template <typename Real>
BackwardScratch<Real> carve_backward(Arena& a, const DeltaRuleSpec& s, int64_t chunks) {
  const int64_t C = s.chunk;
  BackwardScratch<Real> x;
  x.f = carve_chunk<Real>(a, s);
  x.states = a.take<Real>(chunks * s.dk * s.dv, "chunk entry states");
  x.dDelta = a.take<Real>(C * s.dv, "dDelta");
  x.dR = a.take<Real>(C * s.dv, "dR");
  x.QS0 = a.take<Real>(C * s.dv, "Q S0");
  x.KdS = a.take<Real>(C * s.dv, "K dS");
  x.dP = a.take<Real>(C * C, "dP");
  x.dQK = a.take<Real>(C * C, "d(Q K^T)");
  x.dA = a.take<Real>(C * C, "dA");
  x.dD = a.take<Real>(C * C, "dD");
  x.dKK = a.take<Real>(C * C, "d(K K^T)");
  x.ddecay_in = a.take<Real>(C, "d exp gamma");
  x.ddecay_out = a.take<Real>(C, "d exp(gamma_last - gamma)");
  x.dgamma = a.take<Real>(C, "dgamma");
  x.dS = a.take<Real>(s.dk * s.dv, "dS");
  x.dS0 = a.take<Real>(s.dk * s.dv, "dS0");
  x.tmp = a.take<Real>(C * std::max(s.dk, s.dv), "row scratch");
  return x;
}

// One head's rows of one chunk. Strides are between consecutive tokens.
template <typename Real>
struct ChunkView {
  const Real *q, *k, *v, *g, *b;
  int64_t ldk, ldv, ldg;  // nk * dk, nv * dv, nv
  int64_t L;
};

template <typename Real>
ChunkView<Real> chunk_view(const DeltaRuleSpec& s, const Real* q, const Real* k, const Real* v, const Real* g,
                           const Real* b, int64_t row, int64_t L, int64_t h) {
  const int64_t j = h / (s.nv / s.nk);
  return {q + (row * s.nk + j) * s.dk,
          k + (row * s.nk + j) * s.dk,
          v + (row * s.nv + h) * s.dv,
          g + row * s.nv + h,
          b + row * s.nv + h,
          s.nk * s.dk,
          s.nv * s.dv,
          s.nv,
          L};
}

// Everything a chunk's output, next state and gradient are made of, from its rows and entering state:
// the decays, K K^T, Q K^T, M = K S0 and Delta (forward substitution through I + A).
template <typename Real>
void chunk_quantities(const DeltaRuleSpec& s, const ChunkView<Real>& c, const Real* S0, const ChunkScratch<Real>& x) {
  const int64_t L = c.L, dk = s.dk, dv = s.dv;
  Real run = 0;
  for (int64_t t = 0; t < L; ++t) {
    run += c.g[t * c.ldg];
    x.gamma[t] = run;
    x.decay_in[t] = std::exp(run);
  }
  for (int64_t t = 0; t < L; ++t) {
    x.decay_out[t] = std::exp(x.gamma[L - 1] - x.gamma[t]);
    for (int64_t u = 0; u < L; ++u) x.D[t * L + u] = u <= t ? std::exp(x.gamma[t] - x.gamma[u]) : Real(0);
  }
  gemm<Real>(false, false, L, dv, dk, 1, c.k, c.ldk, S0, dv, 0, x.M, dv);
  gemm<Real>(false, true, L, L, dk, 1, c.k, c.ldk, c.k, c.ldk, 0, x.KK, L);
  gemm<Real>(false, true, L, L, dk, 1, c.q, c.ldk, c.k, c.ldk, 0, x.QK, L);
  for (int64_t t = 0; t < L; ++t) {
    const Real bt = c.b[t * c.ldg], at = x.decay_in[t];
    Real* d = x.Delta + t * dv;
    const Real* vt = c.v + t * c.ldv;
    const Real* mt = x.M + t * dv;
    for (int64_t i = 0; i < dv; ++i) d[i] = bt * (vt[i] - at * mt[i]);
    for (int64_t u = 0; u < t; ++u) {
      const Real a = bt * x.D[t * L + u] * x.KK[t * L + u];
      const Real* du = x.Delta + u * dv;
      for (int64_t i = 0; i < dv; ++i) d[i] -= a * du[i];
    }
  }
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < dk; ++i) x.Ke[t * dk + i] = x.decay_out[t] * c.k[t * c.ldk + i];
}

// S <- exp(gamma_last) S + Ke^T Delta (after chunk_quantities with S0 = S).
template <typename Real>
void advance_state(const DeltaRuleSpec& s, int64_t L, const ChunkScratch<Real>& x) {
  const Real keep = x.decay_in[L - 1];
  for (int64_t i = 0; i < s.dk * s.dv; ++i) x.S[i] *= keep;
  gemm<Real>(true, false, s.dk, s.dv, L, 1, x.Ke, s.dk, x.Delta, s.dv, 1, x.S, s.dv);
}

// o rows of the chunk = diag(exp gamma) Q S0 + ((Q K^T) o D) Delta. Leaves (Q K^T) o D in QK.
template <typename Real>
void chunk_output(const DeltaRuleSpec& s, const ChunkView<Real>& c, const Real* S0, const ChunkScratch<Real>& x,
                  Real* o) {
  const int64_t L = c.L, dv = s.dv;
  gemm<Real>(false, false, L, dv, s.dk, 1, c.q, c.ldk, S0, dv, 0, o, c.ldv);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < dv; ++i) o[t * c.ldv + i] *= x.decay_in[t];
  for (int64_t i = 0; i < L * L; ++i) x.QK[i] *= x.D[i];
  gemm<Real>(false, false, L, dv, L, 1, x.QK, L, x.Delta, dv, 1, o, c.ldv);
}

template <typename Real>
Real dot(const Real* a, const Real* b, int64_t n) {
  Real acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Gradient of one chunk: from dO (rows of do_) and x.dS (the loss's gradient in the state leaving the
// chunk), accumulates dq, dk rows of the chunk's key head, writes dv, dg, db rows of its value head
// and leaves the gradient in the entering state in x.dS0. x.f holds chunk_quantities(S0).
template <typename Real>
void chunk_backward(const DeltaRuleSpec& s, const ChunkView<Real>& c, const Real* S0, const Real* dO, Real* dq,
                    Real* dk, Real* dv, Real* dg, Real* db, const BackwardScratch<Real>& x) {
  const ChunkScratch<Real>& f = x.f;
  const int64_t L = c.L, Dk = s.dk, Dv = s.dv, ldo = c.ldv;
  // Output: O = diag(exp gamma) Q S0 + P Delta, P = QK o D.
  Real* P = f.QK;
  for (int64_t i = 0; i < L * L; ++i) x.dQK[i] = P[i];  // keep Q K^T for dD below
  for (int64_t i = 0; i < L * L; ++i) P[i] *= f.D[i];
  gemm<Real>(true, false, L, Dv, L, 1, P, L, dO, ldo, 0, x.dDelta, Dv);
  gemm<Real>(false, true, L, L, Dv, 1, dO, ldo, f.Delta, Dv, 0, x.dP, L);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t u = 0; u < L; ++u) {
      const int64_t i = t * L + u;
      x.dD[i] = u <= t ? x.dP[i] * x.dQK[i] : Real(0);
      x.dQK[i] = u <= t ? x.dP[i] * f.D[i] : Real(0);
    }
  gemm<Real>(false, false, L, Dk, L, 1, x.dQK, L, c.k, c.ldk, 1, dq, c.ldk);
  gemm<Real>(true, false, L, Dk, L, 1, x.dQK, L, c.q, c.ldk, 1, dk, c.ldk);
  // dQ += diag(exp gamma) dO S0^T; dS0 = Q^T diag(exp gamma) dO + exp(gamma_last) dS;
  // d exp(gamma_t) = (Q S0)_t . dO_t.
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < Dv; ++i) x.tmp[t * Dv + i] = f.decay_in[t] * dO[t * ldo + i];
  gemm<Real>(false, true, L, Dk, Dv, 1, x.tmp, Dv, S0, Dv, 1, dq, c.ldk);
  for (int64_t i = 0; i < Dk * Dv; ++i) x.dS0[i] = f.decay_in[L - 1] * x.dS[i];
  gemm<Real>(true, false, Dk, Dv, L, 1, c.q, c.ldk, x.tmp, Dv, 1, x.dS0, Dv);
  gemm<Real>(false, false, L, Dv, Dk, 1, c.q, c.ldk, S0, Dv, 0, x.QS0, Dv);
  for (int64_t t = 0; t < L; ++t) x.ddecay_in[t] = dot(x.QS0 + t * Dv, dO + t * ldo, Dv);
  const Real ddecay_last = dot(S0, x.dS, Dk * Dv);
  // State leaving: exp(gamma_last) S0 + Ke^T Delta.
  gemm<Real>(false, false, L, Dv, Dk, 1, f.Ke, Dk, x.dS, Dv, 1, x.dDelta, Dv);
  gemm<Real>(false, true, L, Dk, Dv, 1, f.Delta, Dv, x.dS, Dv, 0, x.tmp, Dk);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < Dk; ++i) dk[t * c.ldk + i] += f.decay_out[t] * x.tmp[t * Dk + i];
  gemm<Real>(false, false, L, Dv, Dk, 1, c.k, c.ldk, x.dS, Dv, 0, x.KdS, Dv);
  for (int64_t t = 0; t < L; ++t) x.ddecay_out[t] = dot(x.KdS + t * Dv, f.Delta + t * Dv, Dv);
  // (I + A) Delta = R: back substitution through the transpose, dR = (I + A)^-T dDelta.
  for (int64_t t = L - 1; t >= 0; --t) {
    Real* r = x.dR + t * Dv;
    std::copy(x.dDelta + t * Dv, x.dDelta + (t + 1) * Dv, r);
    for (int64_t u = t + 1; u < L; ++u) {
      const Real a = c.b[u * c.ldg] * f.D[u * L + t] * f.KK[u * L + t];
      const Real* ru = x.dR + u * Dv;
      for (int64_t i = 0; i < Dv; ++i) r[i] -= a * ru[i];
    }
  }
  // R_t = b_t (v_t - exp(gamma_t) M_t), M = K S0.
  for (int64_t t = 0; t < L; ++t) {
    const Real bt = c.b[t * c.ldg], at = f.decay_in[t];
    const Real* r = x.dR + t * Dv;
    const Real* vt = c.v + t * c.ldv;
    const Real* mt = f.M + t * Dv;
    Real dbt = 0, dat = 0;
    for (int64_t i = 0; i < Dv; ++i) {
      dv[t * ldo + i] = bt * r[i];
      dbt += r[i] * (vt[i] - at * mt[i]);
      dat -= r[i] * mt[i];
      x.tmp[t * Dv + i] = -bt * at * r[i];  // dM
    }
    db[t * c.ldg] = dbt;
    x.ddecay_in[t] += bt * dat;
  }
  gemm<Real>(false, true, L, Dk, Dv, 1, x.tmp, Dv, S0, Dv, 1, dk, c.ldk);
  gemm<Real>(true, false, Dk, Dv, L, 1, c.k, c.ldk, x.tmp, Dv, 1, x.dS0, Dv);
  // A_tu = b_t D_tu (k_t . k_u), u < t; dA = -dR Delta^T on the strict lower triangle.
  gemm<Real>(false, true, L, L, Dv, -1, x.dR, Dv, f.Delta, Dv, 0, x.dA, L);
  for (int64_t t = 0; t < L; ++t) {
    const Real bt = c.b[t * c.ldg];
    Real dbt = 0;
    for (int64_t u = 0; u < L; ++u) {
      const int64_t i = t * L + u;
      if (u < t) {
        dbt += x.dA[i] * f.D[i] * f.KK[i];
        x.dKK[i] = x.dA[i] * bt * f.D[i];
        x.dD[i] += x.dA[i] * bt * f.KK[i];
      } else {
        x.dKK[i] = 0;
      }
    }
    db[t * c.ldg] += dbt;
  }
  gemm<Real>(false, false, L, Dk, L, 1, x.dKK, L, c.k, c.ldk, 1, dk, c.ldk);
  gemm<Real>(true, false, L, Dk, L, 1, x.dKK, L, c.k, c.ldk, 1, dk, c.ldk);
  // gamma feeds D (both indices), exp(gamma_t), exp(gamma_last - gamma_t) and exp(gamma_last).
  for (int64_t t = 0; t < L; ++t) x.dgamma[t] = x.ddecay_in[t] * f.decay_in[t] - x.ddecay_out[t] * f.decay_out[t];
  Real last = ddecay_last * f.decay_in[L - 1];
  for (int64_t t = 0; t < L; ++t) last += x.ddecay_out[t] * f.decay_out[t];
  x.dgamma[L - 1] += last;
  for (int64_t t = 0; t < L; ++t)
    for (int64_t u = 0; u <= t; ++u) {
      const Real w = x.dD[t * L + u] * f.D[t * L + u];
      x.dgamma[t] += w;
      x.dgamma[u] -= w;
    }
  // gamma is the running sum of g: dg_t = sum over u >= t of dgamma_u.
  Real acc = 0;
  for (int64_t t = L - 1; t >= 0; --t) {
    acc += x.dgamma[t];
    dg[t * c.ldg] = acc;
  }
}

}  // namespace

DeltaRuleExtent extent_of(DeltaRuleSegments seg) {
  DeltaRuleExtent e;
  e.count = seg.count;
  for (int64_t i = 0; i < seg.count; ++i) e.longest = std::max(e.longest, seg.offsets[i + 1] - seg.offsets[i]);
  e.rows = seg.count == 0 ? 0 : seg.offsets[seg.count];
  return e;
}

DeltaRuleExtent packed_documents_extent(int64_t B, int64_t T) { return {B * T, B * T, T}; }

template <typename Real>
int64_t delta_rule_forward_workspace_bytes(const DeltaRuleSpec& s, DeltaRuleExtent e) {
  check_spec(s, DeltaRuleSegments{});
  return measured_bytes([&](Arena& a) {
    for (int64_t w = 0; w < workers(s, e); ++w) carve_chunk<Real>(a, s);
  });
}

template <typename Real>
int64_t delta_rule_backward_workspace_bytes(const DeltaRuleSpec& s, DeltaRuleExtent e) {
  check_spec(s, DeltaRuleSegments{});
  const int64_t chunks = max_chunks(s, e);
  return measured_bytes([&](Arena& a) {
    for (int64_t w = 0; w < workers(s, e); ++w) carve_backward<Real>(a, s, chunks);
  });
}

template <typename Real>
void delta_rule_forward(const DeltaRuleSpec& s, DeltaRuleSegments seg, const Real* q, const Real* k, const Real* v,
                        const Real* g, const Real* b, Real* o, Workspace ws) {
  check_spec(s, seg);
  Arena arena(ws);
  std::vector<ChunkScratch<Real>> scratch;
  for (int64_t w = 0; w < workers(s, extent_of(seg)); ++w) scratch.push_back(carve_chunk<Real>(arena, s));
  const int64_t r = s.nv / s.nk;
  for_each_item(seg.count * s.nk, s.threads, [&](int64_t item, int64_t w) {
    const ChunkScratch<Real>& x = scratch[static_cast<size_t>(w)];
    const int64_t i = item / s.nk, j = item % s.nk;
    const int64_t begin = seg.offsets[i], end = seg.offsets[i + 1];
    for (int64_t h = j * r; h < (j + 1) * r; ++h) {
      std::fill(x.S, x.S + s.dk * s.dv, Real(0));
      for (int64_t row = begin; row < end; row += s.chunk) {
        const int64_t L = std::min(s.chunk, end - row);
        const ChunkView<Real> c = chunk_view(s, q, k, v, g, b, row, L, h);
        chunk_quantities(s, c, x.S, x);
        chunk_output(s, c, x.S, x, o + (row * s.nv + h) * s.dv);
        advance_state(s, L, x);
      }
    }
  });
}

template <typename Real>
void delta_rule_backward(const DeltaRuleSpec& s, DeltaRuleSegments seg, const Real* q, const Real* k, const Real* v,
                         const Real* g, const Real* b, const Real* do_, Real* dq, Real* dk, Real* dv, Real* dg,
                         Real* db, Workspace ws) {
  check_spec(s, seg);
  Arena arena(ws);
  const int64_t chunks = max_chunks(s, extent_of(seg));
  std::vector<BackwardScratch<Real>> scratch;
  for (int64_t w = 0; w < workers(s, extent_of(seg)); ++w) scratch.push_back(carve_backward<Real>(arena, s, chunks));
  const int64_t r = s.nv / s.nk, state = s.dk * s.dv;
  for_each_item(seg.count * s.nk, s.threads, [&](int64_t item, int64_t w) {
    const BackwardScratch<Real>& x = scratch[static_cast<size_t>(w)];
    const int64_t i = item / s.nk, j = item % s.nk;
    const int64_t begin = seg.offsets[i], end = seg.offsets[i + 1];
    for (int64_t row = begin; row < end; ++row) {
      std::fill_n(dq + (row * s.nk + j) * s.dk, s.dk, Real(0));
      std::fill_n(dk + (row * s.nk + j) * s.dk, s.dk, Real(0));
    }
    for (int64_t h = j * r; h < (j + 1) * r; ++h) {
      std::fill(x.f.S, x.f.S + state, Real(0));
      int64_t n = 0;
      for (int64_t row = begin; row < end; row += s.chunk, ++n) {
        const int64_t L = std::min(s.chunk, end - row);
        std::copy(x.f.S, x.f.S + state, x.states + n * state);
        chunk_quantities(s, chunk_view(s, q, k, v, g, b, row, L, h), x.f.S, x.f);
        advance_state(s, L, x.f);
      }
      std::fill(x.dS, x.dS + state, Real(0));
      for (int64_t c = n - 1; c >= 0; --c) {
        const int64_t row = begin + c * s.chunk, L = std::min(s.chunk, end - row);
        const ChunkView<Real> view = chunk_view(s, q, k, v, g, b, row, L, h);
        const Real* S0 = x.states + c * state;
        chunk_quantities(s, view, S0, x.f);
        const int64_t kr = (row * s.nk + j) * s.dk, vr = (row * s.nv + h) * s.dv;
        chunk_backward(s, view, S0, do_ + vr, dq + kr, dk + kr, dv + vr, dg + row * s.nv + h, db + row * s.nv + h, x);
        std::copy(x.dS0, x.dS0 + state, x.dS);
      }
    }
  });
}

#define SLIDEDP_DELTA_RULE(Real)                                                                                    \
  template int64_t delta_rule_forward_workspace_bytes<Real>(const DeltaRuleSpec&, DeltaRuleExtent);                 \
  template int64_t delta_rule_backward_workspace_bytes<Real>(const DeltaRuleSpec&, DeltaRuleExtent);                \
  template void delta_rule_forward<Real>(const DeltaRuleSpec&, DeltaRuleSegments, const Real*, const Real*,         \
                                         const Real*, const Real*, const Real*, Real*, Workspace);                  \
  template void delta_rule_backward<Real>(const DeltaRuleSpec&, DeltaRuleSegments, const Real*, const Real*,        \
                                          const Real*, const Real*, const Real*, const Real*, Real*, Real*, Real*,  \
                                          Real*, Real*, Workspace);
SLIDEDP_DELTA_RULE(float)
SLIDEDP_DELTA_RULE(double)
#undef SLIDEDP_DELTA_RULE

}  // namespace slidedp::kernels
