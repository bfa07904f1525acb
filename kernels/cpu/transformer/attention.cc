// Flash-style causal GQA attention on the CPU; see attention.h for the contract.
#include "kernels/cpu/transformer/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/parallel.h"

namespace slidedp::kernels {
namespace {

void check_shape(const AttentionShape& s) {
  SLIDEDP_CHECK(s.B >= 0 && s.T >= 0 && s.H > 0 && s.KV > 0 && s.hd > 0 && s.tile > 0 && s.threads > 0,
                "bad attention shape");
  SLIDEDP_CHECK(s.H % s.KV == 0, "query heads must be a multiple of key/value heads");
  SLIDEDP_CHECK(s.window >= 0 && s.scale >= 0 && std::isfinite(s.scale), "bad attention window or scale");
  if (s.positions != nullptr) check_document_positions(s.positions, s.B, s.T);
}

template <typename Real>
struct ForwardScratch {
  Real* S;    // (tile, tile) scores, then probabilities, of one query tile x key tile
  Real* acc;  // (tile, hd) unnormalized output of the query tile
  Real* m;    // (tile) running row max
  Real* l;    // (tile) running row sum of exp(score - m)
};

// One scratch set per worker thread.
template <typename Real>
std::vector<ForwardScratch<Real>> carve_forward(Arena& a, const AttentionShape& s) {
  std::vector<ForwardScratch<Real>> per_worker;
  for (int64_t w = 0; w < s.threads; ++w) {
    ForwardScratch<Real> f;
    f.S = a.take<Real>(s.tile * s.tile);
    f.acc = a.take<Real>(s.tile * s.hd);
    f.m = a.take<Real>(s.tile);
    f.l = a.take<Real>(s.tile);
    per_worker.push_back(f);
  }
  return per_worker;
}

template <typename Real>
struct BackwardScratch {
  Real* P;   // (tile, tile) recomputed probabilities
  Real* dS;  // (tile, tile) dP, then dS = P * (dP - D)
  Real* dK;  // (tile, hd) key-tile gradient, summed over the query heads of its group
  Real* dV;  // (tile, hd)
};

template <typename Real>
struct BackwardScratchAll {
  Real* D;  // (B, H, T) rowsum(dout * out): the softmax-Jacobian term of each row (shared)
  std::vector<BackwardScratch<Real>> per_worker;
};

template <typename Real>
BackwardScratchAll<Real> carve_backward(Arena& a, const AttentionShape& s) {
  BackwardScratchAll<Real> all;
  all.D = a.take<Real>(s.B * s.H * s.T);
  for (int64_t w = 0; w < s.threads; ++w) {
    BackwardScratch<Real> b;
    b.P = a.take<Real>(s.tile * s.tile);
    b.dS = a.take<Real>(s.tile * s.tile);
    b.dK = a.take<Real>(s.tile * s.hd);
    b.dV = a.take<Real>(s.tile * s.hd);
    all.per_worker.push_back(b);
  }
  return all;
}

// Workers that actually run: s.threads when every tile GEMM (M*N*K = tile^2 * hd at most) stays
// single-threaded inside OpenBLAS, else 1 -- concurrent threaded GEMMs serialize on OpenBLAS's
// level-3 mutex and its thread server (measured: 20-30x slower on 2 cores), while one worker
// issuing threaded GEMMs in turn still uses every core. Scratch is carved for s.threads regardless,
// so the size queries do not depend on the BLAS thread count.
int64_t active_workers(const AttentionShape& s) {
  return gemm_runs_single_threaded(s.tile, s.tile, s.hd) ? s.threads : 1;
}

// The first key each query row of one sequence may see: causal always; with a window, keys
// > row - window; with documents, keys of the row's own document (it starts at row - position).
// Non-decreasing in the row, so a query tile's first row bounds the whole tile.
struct KeyFloor {
  int64_t window = 0;
  const int32_t* pos = nullptr;  // (T) this sequence's document positions, or null
  int64_t T = 0;
  int64_t at(int64_t row) const {
    int64_t lo = window > 0 ? row - window + 1 : 0;
    if (pos != nullptr) lo = std::max<int64_t>(lo, row - pos[row]);
    return std::max<int64_t>(lo, 0);
  }
  // One past the last query row that sees key `key`: the window's end and its document's end.
  int64_t rows_end(int64_t key) const {
    int64_t end = window > 0 ? std::min(T, key + window) : T;
    if (pos != nullptr) {
      int64_t r = key + 1;
      while (r < end && pos[r] != 0) ++r;
      end = r;
    }
    return end;
  }
};

KeyFloor key_floor(const AttentionShape& s, int64_t b) {
  return {s.window, s.positions != nullptr ? s.positions + b * s.T : nullptr, s.T};
}

// The keys of tile [j0, j0 + nj) that query row `row` may see, as a range [lo, hi) of tile columns.
struct Visible {
  int64_t lo, hi;
  bool empty() const { return hi <= lo; }
};
inline Visible visible_keys(int64_t row, int64_t j0, int64_t nj, const KeyFloor& floor) {
  const int64_t hi = std::clamp<int64_t>(row - j0 + 1, 0, nj);
  const int64_t lo = std::clamp<int64_t>(floor.at(row) - j0, 0, nj);
  return {lo, hi};
}

// The first key tile any row of [i0, ...) can see.
inline int64_t first_key_tile(int64_t i0, const KeyFloor& floor, int64_t tile) {
  return floor.at(i0) / tile * tile;
}

double score_scale(const AttentionShape& s) {
  return s.scale > 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.hd));
}

}  // namespace

void check_document_positions(const int32_t* positions, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* p = positions + b * T;
    for (int64_t t = 0; t < T; ++t) {
      const bool ok = t == 0 ? p[t] == 0 : p[t] == 0 || p[t] == p[t - 1] + 1;
      SLIDEDP_CHECK(ok, "document positions must start at 0 and count up by 1 inside each document");
    }
  }
}

int64_t attention_tile_for(int64_t head_dim) {
  int64_t tile = 64;
  while (tile > 8 && tile * tile * head_dim > kBlasSingleThreadMaxMnk) tile /= 2;
  return tile;
}

template <typename Real>
int64_t attention_forward_workspace_bytes(const AttentionShape& s) {
  Arena a;
  carve_forward<Real>(a, s);
  return a.high_water_bytes();
}

template <typename Real>
int64_t attention_backward_workspace_bytes(const AttentionShape& s) {
  Arena a;
  carve_backward<Real>(a, s);
  return a.high_water_bytes();
}

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const AttentionShape& s, Workspace ws) {
  check_shape(s);
  Arena arena(ws);
  const std::vector<ForwardScratch<Real>> scratch = carve_forward<Real>(arena, s);
  const int64_t B = s.B, T = s.T, H = s.H, KV = s.KV, hd = s.hd, tile = s.tile;
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd;
  const Real scale = static_cast<Real>(score_scale(s));
  const Real neg_inf = -std::numeric_limits<Real>::infinity();

  // one item = one (b, h): all its query tiles
  for_each_item(B * H, active_workers(s), [&](int64_t item, int64_t worker) {
    const ForwardScratch<Real>& f = scratch[static_cast<size_t>(worker)];
    const int64_t b = item / H, h = item % H, g = h / group;
    const KeyFloor floor = key_floor(s, b);
    for (int64_t i0 = 0; i0 < T; i0 += tile) {
      const int64_t mi = std::min(tile, T - i0);
      const Real* Q = q + ((b * T + i0) * H + h) * hd;  // (mi, hd), row stride ldq
      std::fill(f.m, f.m + mi, neg_inf);
      std::fill(f.l, f.l + mi, Real(0));
      std::fill(f.acc, f.acc + mi * hd, Real(0));
      const int64_t last_row = i0 + mi - 1;
      for (int64_t j0 = first_key_tile(i0, floor, tile); j0 <= last_row; j0 += tile) {
        const int64_t nj = std::min(tile, last_row + 1 - j0);  // keys past the last row are all masked
        const Real* K = k + ((b * T + j0) * KV + g) * hd;      // (nj, hd), row stride ldk
        const Real* V = v + ((b * T + j0) * KV + g) * hd;      // (nj, hd), row stride ldk
        // S (mi, nj) = scale * Q K^T
        gemm<Real>(false, true, mi, nj, hd, scale, Q, ldq, K, ldk, Real(0), f.S, tile);
        // online softmax: rescale what was accumulated by exp(m_old - m_new), add this tile
        for (int64_t r = 0; r < mi; ++r) {
          Real* Sr = f.S + r * tile;
          const Visible vis = visible_keys(i0 + r, j0, nj, floor);
          if (vis.empty()) {  // a row that sees no key of this tile contributes nothing
            std::fill(Sr, Sr + nj, Real(0));
            continue;
          }
          Real mx = f.m[r];
          for (int64_t c = vis.lo; c < vis.hi; ++c) mx = std::max(mx, Sr[c]);
          const Real corr = std::exp(f.m[r] - mx);  // exp(-inf) = 0 on the first visible tile
          Real sum = 0;
          for (int64_t c = vis.lo; c < vis.hi; ++c) {
            Sr[c] = std::exp(Sr[c] - mx);
            sum += Sr[c];
          }
          std::fill(Sr, Sr + vis.lo, Real(0));
          std::fill(Sr + vis.hi, Sr + nj, Real(0));
          f.l[r] = f.l[r] * corr + sum;
          f.m[r] = mx;
          Real* acc_r = f.acc + r * hd;
          for (int64_t d = 0; d < hd; ++d) acc_r[d] *= corr;
        }
        // acc (mi, hd) += P (mi, nj) V (nj, hd)
        gemm<Real>(false, false, mi, hd, nj, Real(1), f.S, tile, V, ldk, Real(1), f.acc, hd);
      }
      for (int64_t r = 0; r < mi; ++r) {
        Real* o = out + ((b * T + i0 + r) * H + h) * hd;  // (hd)
        const Real inv_l = Real(1) / f.l[r];
        for (int64_t d = 0; d < hd; ++d) o[d] = f.acc[r * hd + d] * inv_l;
        lse[(b * H + h) * T + i0 + r] = f.m[r] + std::log(f.l[r]);
      }
    }
  });
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const AttentionShape& s,
                        Workspace ws) {
  check_shape(s);
  Arena arena(ws);
  const BackwardScratchAll<Real> scratch = carve_backward<Real>(arena, s);
  const int64_t B = s.B, T = s.T, H = s.H, KV = s.KV, hd = s.hd, tile = s.tile;
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd;
  const Real scale = static_cast<Real>(score_scale(s));

  // D[b, h, t] = dout . out over hd: d(softmax)/d(score) folds into dS = P * (dP - D).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const Real* o = out + ((b * T + t) * H + h) * hd;
        const Real* dO = dout + ((b * T + t) * H + h) * hd;
        Real acc = 0;
        for (int64_t d = 0; d < hd; ++d) acc += dO[d] * o[d];
        scratch.D[(b * H + h) * T + t] = acc;
      }
  std::fill(dq, dq + B * T * H * hd, Real(0));

  // One item = one (b, kv head g): it owns dk, dv of that head and the dq rows of the group's query
  // heads, so items never write the same memory. Inside, the key tile is outermost: dK, dV of a tile
  // are complete after one sweep over the query rows that see it (rows >= j0) of every head of the
  // group; dQ rows collect their share from every key tile.
  for_each_item(B * KV, active_workers(s), [&](int64_t item, int64_t worker) {
    const BackwardScratch<Real>& w = scratch.per_worker[static_cast<size_t>(worker)];
    const int64_t b = item / KV, g = item % KV;
    const KeyFloor floor = key_floor(s, b);
    for (int64_t j0 = 0; j0 < T; j0 += tile) {
      const int64_t nj = std::min(tile, T - j0);
      const Real* K = k + ((b * T + j0) * KV + g) * hd;  // (nj, hd), row stride ldk
      const Real* V = v + ((b * T + j0) * KV + g) * hd;  // (nj, hd), row stride ldk
      std::fill(w.dK, w.dK + nj * hd, Real(0));
      std::fill(w.dV, w.dV + nj * hd, Real(0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const Real* lse_h = lse + (b * H + h) * T;      // (T)
        const Real* D_h = scratch.D + (b * H + h) * T;  // (T)
        // query rows < j0 see none of these keys, nor rows past the last key's window or document
        const int64_t rows_end = floor.rows_end(j0 + nj - 1);
        for (int64_t i0 = j0; i0 < rows_end; i0 += tile) {
          const int64_t mi = std::min(tile, T - i0);
          const Real* Q = q + ((b * T + i0) * H + h) * hd;      // (mi, hd), row stride ldq
          const Real* dO = dout + ((b * T + i0) * H + h) * hd;  // (mi, hd), row stride ldq
          Real* dQ = dq + ((b * T + i0) * H + h) * hd;          // (mi, hd), row stride ldq
          // P (mi, nj) = exp(scale * Q K^T - lse), zero where masked
          gemm<Real>(false, true, mi, nj, hd, scale, Q, ldq, K, ldk, Real(0), w.P, tile);
          for (int64_t r = 0; r < mi; ++r) {
            Real* Pr = w.P + r * tile;
            const Visible vis = visible_keys(i0 + r, j0, nj, floor);
            if (vis.empty()) {  // past the window or in a later document: sees none of these keys
              std::fill(Pr, Pr + nj, Real(0));
              continue;
            }
            const Real l = lse_h[i0 + r];
            for (int64_t c = vis.lo; c < vis.hi; ++c) Pr[c] = std::exp(Pr[c] - l);
            std::fill(Pr, Pr + vis.lo, Real(0));
            std::fill(Pr + vis.hi, Pr + nj, Real(0));
          }
          // dV (nj, hd) += P^T dO
          gemm<Real>(true, false, nj, hd, mi, Real(1), w.P, tile, dO, ldq, Real(1), w.dV, hd);
          // dP (mi, nj) = dO V^T, then dS = P * (dP - D)
          gemm<Real>(false, true, mi, nj, hd, Real(1), dO, ldq, V, ldk, Real(0), w.dS, tile);
          for (int64_t r = 0; r < mi; ++r) {
            const Real Dr = D_h[i0 + r];
            Real* dSr = w.dS + r * tile;
            const Real* Pr = w.P + r * tile;
            for (int64_t c = 0; c < nj; ++c) dSr[c] = Pr[c] * (dSr[c] - Dr);
          }
          // dQ (mi, hd) += scale * dS K ;  dK (nj, hd) += scale * dS^T Q
          gemm<Real>(false, false, mi, hd, nj, scale, w.dS, tile, K, ldk, Real(1), dQ, ldq);
          gemm<Real>(true, false, nj, hd, mi, scale, w.dS, tile, Q, ldq, Real(1), w.dK, hd);
        }
      }
      for (int64_t c = 0; c < nj; ++c) {
        std::copy(w.dK + c * hd, w.dK + (c + 1) * hd, dk + ((b * T + j0 + c) * KV + g) * hd);
        std::copy(w.dV + c * hd, w.dV + (c + 1) * hd, dv + ((b * T + j0 + c) * KV + g) * hd);
      }
    }
  });
}

template int64_t attention_forward_workspace_bytes<float>(const AttentionShape&);
template int64_t attention_forward_workspace_bytes<double>(const AttentionShape&);
template int64_t attention_backward_workspace_bytes<float>(const AttentionShape&);
template int64_t attention_backward_workspace_bytes<double>(const AttentionShape&);
template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&, Workspace);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionShape&, Workspace);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionShape&,
                                        Workspace);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const AttentionShape&, Workspace);

}  // namespace slidedp::kernels
