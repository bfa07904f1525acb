// The per-element and per-row math of the CUDA kernels, and the index maps of their reductions, as
// functions both nvcc (device code) and the host compiler (CPU tests, CI) compile. A kernel is then a
// loop that calls these; tests/kernels/cuda/device_math_test.cc runs the same functions on the CPU
// against the CPU units (kernels/cpu/transformer), so what CI checks and what the GPU runs differ
// only in launch and memory. Plain float arithmetic in the order the kernels use; C math functions
// (expf, sqrt, log, sincos via sin/cos) that exist on both sides.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define SLIDEDP_HD __host__ __device__ __forceinline__
#else
#define SLIDEDP_HD inline
#endif

namespace slidedp::kernels::cuda::math {

// ---- activations ----

SLIDEDP_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// SwiGLU: m = silu(g) * u.
SLIDEDP_HD float swiglu(float g, float u) { return g * sigmoid(g) * u; }

// Its gradients from dm: du = dm silu(g), dg = dm u silu'(g), silu'(g) = s (1 + g (1 - s)).
SLIDEDP_HD void swiglu_grads(float g, float u, float dm, float* dg, float* du) {
  const float s = sigmoid(g);
  const float silu = g * s;
  *du = dm * silu;
  *dg = dm * u * (s * (1.0f + g * (1.0f - s)));
}

// GeGLU (Gemma 4's MLPs and experts): m = gelu_tanh(g) u, with gelu_pytorch_tanh,
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in the CPU unit's float order.
inline constexpr float kSqrt2OverPi = 0.79788456080286535588f;
inline constexpr float kGeluCubic = 0.044715f;

SLIDEDP_HD float gelu_tanh(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

// d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
SLIDEDP_HD float gelu_tanh_derivative(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

SLIDEDP_HD float geglu(float g, float u) { return gelu_tanh(g) * u; }

// From dm: du = dm gelu(g), dg = dm u gelu'(g).
SLIDEDP_HD void geglu_grads(float g, float u, float dm, float* dg, float* du) {
  *du = dm * gelu_tanh(g);
  *dg = dm * u * gelu_tanh_derivative(g);
}

// ---- RoPE ----

// cos and sin of pos * inv_freq, computed in double and rounded once (as the CPU's rope_tables).
SLIDEDP_HD void rope_cos_sin(int64_t pos, double inv_freq, float* c, float* s) {
  const double angle = static_cast<double>(pos) * inv_freq;
  *c = static_cast<float>(cos(angle));
  *s = static_cast<float>(sin(angle));
}

// Rotates the pair (x1, x2) by the angle (sign +1) or back (sign -1): rotate_half convention.
SLIDEDP_HD void rope_rotate(float* x1, float* x2, float c, float s, float sign) {
  const float a = *x1, b = *x2, si = sign * s;
  *x1 = a * c - b * si;
  *x2 = b * c + a * si;
}

// ---- RMSNorm ----

// 1 / sqrt(mean of squares + eps) from the row's sum of squares, in double, rounded once.
SLIDEDP_HD float rmsnorm_rstd(float sum_squares, int64_t C, double eps) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(sum_squares) / static_cast<double>(C) + eps));
}

SLIDEDP_HD float rmsnorm_out(float w, float x, float rstd) { return w * (x * rstd); }

// One element's share of the row's dot (w dy) . xhat.
SLIDEDP_HD float rmsnorm_dot_term(float w, float dy, float x, float rstd) { return (w * dy) * (x * rstd); }

// dx = rstd (w dy - xhat mean_dot), mean_dot = the row's dot / C.
SLIDEDP_HD float rmsnorm_dx(float w, float dy, float x, float rstd, float mean_dot) {
  const float xhat = x * rstd;
  return rstd * (w * dy - xhat * mean_dot);
}

// ---- warp reductions ----

inline constexpr int kWarpSize = 32;

// The butterfly of __shfl_xor_sync (offsets 16, 8, 4, 2, 1) over 32 lane values, in place: every lane
// ends with the same sum, added in the order the device adds it. The device's warp_sum is this
// loop with the exchange done by shuffles.
template <typename T>
SLIDEDP_HD void warp_butterfly_sum(T* lanes) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    T next[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) next[l] = lanes[l] + lanes[l ^ o];
    for (int l = 0; l < kWarpSize; ++l) lanes[l] = next[l];
  }
}

// ---- cross-entropy (one row of logits) ----

// dlogit of column c: grad_scale softmax - grad_scale at the target, with factor = grad_scale / sum
// of exp(logit - max) (fp32, as cross_entropy.cc).
SLIDEDP_HD float cross_entropy_dlogit(float logit, float row_max, float factor, bool is_target, float grad_scale) {
  float g = expf(logit - row_max) * factor;
  if (is_target) g -= grad_scale;
  return g;
}

// The row's loss: log-sum-exp - the target's logit, in double.
SLIDEDP_HD double cross_entropy_row_loss(float row_max, double sum_exp, float target_logit) {
  return static_cast<double>(row_max) + log(sum_exp) - static_cast<double>(target_logit);
}

// ---- deterministic column sums in row segments (norm-weight and bias gradients) ----

// Rows [s * rows_per_segment, min(N, (s + 1) * rows_per_segment)) form segment s; each segment's
// column sums land in their own partial row, and a second pass adds the partials in segment order,
// so the result never depends on the launch.
SLIDEDP_HD int64_t segment_count(int64_t N, int64_t rows_per_segment) {
  return (N + rows_per_segment - 1) / rows_per_segment;
}

// gridDim.y is at most 65535: block y handles segments y, y + grid_y, y + 2 grid_y, ...
inline constexpr int64_t kMaxGridY = 65535;
SLIDEDP_HD unsigned segment_grid_y(int64_t segments) {
  return static_cast<unsigned>(segments < kMaxGridY ? (segments > 0 ? segments : 1) : kMaxGridY);
}

// ---- attention ----

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The causal mask of every kernel: query `row` sees key `key` of a sequence of T tokens.
SLIDEDP_HD bool causal_visible(int64_t key, int64_t row, int64_t T) { return key <= row && key < T; }

// The reference kernels' per-key online softmax (natural domain): with score s, the running max m
// and sum l move on; corr rescales what was accumulated (0 at the first key, m = -inf) and p weighs
// this key's value.
SLIDEDP_HD void online_softmax_add(float s, float* m, float* l, float* corr, float* p) {
  const float m_new = fmaxf(*m, s);
  *corr = expf(*m - m_new);
  *p = expf(s - m_new);
  *l = *l * *corr + *p;
  *m = m_new;
}

// The tensor-core kernels' per-tile step (log2 domain, scores already times scale log2(e)): the new
// running max after a tile whose visible maximum is tile_max, and the factor exp2(m_old - m_new)
// for what was accumulated. The tile's weights are then exp2(s - m), summed into l * corr + sum.
SLIDEDP_HD float online_softmax_tile_log2(float tile_max, float* m) {
  const float m_new = fmaxf(*m, tile_max);
  // A row that has seen no visible key yet (packed documents: the tiles before its document) stays
  // at -inf with nothing accumulated.
  const float corr = m_new == -INFINITY ? 1.0f : exp2f(*m - m_new);
  *m = m_new;
  return corr;
}

// A key's weight exp2(s - m) in the tile; a masked key (s = -inf) weighs 0 even while m is -inf.
SLIDEDP_HD float tile_weight_log2(float s, float m) { return s == -INFINITY ? 0.0f : exp2f(s - m); }

// Packed documents: a query row sees only the keys of its own document, which starts at
// row - pos[row] (pos: the sequence's (T) positions inside their documents, 0 where one starts;
// null: one document per sequence). Non-decreasing in the row, so a query tile's first row bounds
// the keys the whole tile needs. Rows past T (a tile's padding) keep every earlier key.
SLIDEDP_HD int64_t document_key_floor(int64_t row, const int32_t* pos, int64_t T) {
  return pos != nullptr && row < T ? row - pos[row] : 0;
}
SLIDEDP_HD bool document_visible(int64_t key, int64_t row, int64_t T, const int32_t* pos) {
  return causal_visible(key, row, T) && key >= document_key_floor(row, pos, T);
}

// The saved log-sum-exp in the CPU's natural-log contract from the log2-domain max and sum.
SLIDEDP_HD float lse_from_log2(float m, float l) { return (m + log2f(l)) * kLn2; }

// Backward: a visible pair's probability recomputed from its raw score q.k and the row's saved lse,
// in the natural domain (reference kernels) or the log2 domain (tensor-core kernels: scale_log2 =
// scale log2(e), lse_log2 = lse log2(e)).
SLIDEDP_HD float attention_prob(float qk, float scale, float lse) { return expf(qk * scale - lse); }
SLIDEDP_HD float attention_prob_log2(float qk, float scale_log2, float lse_log2) { return exp2f(qk * scale_log2 - lse_log2); }

// dS = P (dP - D): the softmax's Jacobian applied to dP = dO . v, with D = rowsum(dO * O) = sum_j P dP.
// dq = scale sum_keys dS k, dk = scale sum_queries dS q, dv = sum_queries P dO.
SLIDEDP_HD float attention_ds(float p, float dp, float D) { return p * (dp - D); }

// Sliding-window attention (Gemma 4's sliding layers): the query at `row` sees keys
// row - window < key <= row (window 0: every earlier key). The first key a row may see, which is
// non-decreasing in the row, so a tile of queries starting at i0 skips every key tile that ends at
// or before key_floor(i0): the cost is linear in the window, not in T.
SLIDEDP_HD int64_t window_key_floor(int64_t row, int64_t window) {
  return window > 0 && row - window + 1 > 0 ? row - window + 1 : 0;
}
SLIDEDP_HD bool window_visible(int64_t key, int64_t row, int64_t T, int64_t window) {
  return causal_visible(key, row, T) && key >= window_key_floor(row, window);
}
// The first key tile (of `tile` keys) a query tile starting at row i0 must visit.
SLIDEDP_HD int64_t window_first_key_tile(int64_t i0, int64_t window, int64_t tile) {
  return window_key_floor(i0, window) / tile * tile;
}

// Every mask at once, as the kernels apply it: causal, the row's document and the window. Both
// floors are non-decreasing in the row, so a query tile's first row bounds the keys of the tile.
SLIDEDP_HD int64_t key_floor(int64_t row, const int32_t* pos, int64_t T, int64_t window) {
  const int64_t d = document_key_floor(row, pos, T), w = window_key_floor(row, window);
  return d > w ? d : w;
}
SLIDEDP_HD bool key_visible(int64_t key, int64_t row, int64_t T, const int32_t* pos, int64_t window) {
  return causal_visible(key, row, T) && key >= key_floor(row, pos, T, window);
}
// One past the last query row the window lets see `key` (T without a window): the dK/dV kernels stop
// there, so their cost is linear in the window too.
SLIDEDP_HD int64_t window_rows_end(int64_t key, int64_t T, int64_t window) {
  return window > 0 && key + window < T ? key + window : T;
}

// ---- logit softcap (Gemma 4's final_logit_softcapping) ----
// logit = cap tanh(z / cap); its derivative 1 - tanh^2 from the capped logit itself.
SLIDEDP_HD float softcap(float z, float cap) { return cap * tanhf(z / cap); }
SLIDEDP_HD float softcap_derivative(float capped, float cap) {
  const float t = capped / cap;
  return 1.0f - t * t;
}

// ---- mixture-of-experts router: the top K of a softmax row, renormalised ----
// Whether expert a (probability pa) ranks before expert b: the higher probability, ties to the lower
// index (the CPU's scan in index order with a strict comparison). The kernel's warp argmax reduces
// (probability, expert) pairs with it, so any reduction order picks the CPU's expert.
SLIDEDP_HD bool topk_before(float pa, int32_t ea, float pb, int32_t eb) { return pa > pb || (pa == pb && ea < eb); }
// A chosen expert's weight p_k / top (top: the chosen probabilities' sum, in double) and its logit's
// gradient: the weights are a softmax over the chosen logits alone, so dl_k = w_k (dw_k - coupling)
// with coupling = sum_j dw_j w_j; the unchosen logits get none.
SLIDEDP_HD double router_weight(float p, double top) { return static_cast<double>(p) / top; }
SLIDEDP_HD double router_dlogit(double w, float dw, double coupling) { return w * (static_cast<double>(dw) - coupling); }

// ---- the gpu route's reduce-scatter: a rank's shard summed over the ranks ----
// In the host reduction's order (kernels/cpu/optim/grad_reduce.h): ((g0 + g1) + g2) + ..., so the gpu
// route's reduced gradient is bitwise the cpu route's. `load(r)` is rank r's element, widened to fp32.
template <typename Load>
SLIDEDP_HD float sum_in_rank_order(int ranks, Load load) {
  float acc = load(0);
  for (int r = 1; r < ranks; ++r) acc += load(r);
  return acc;
}

// Where rank `me` keeps the shard `peer` sent it: the other ranks' pieces back to back in rank order.
SLIDEDP_HD int received_slot(int peer, int me) { return peer < me ? peer : peer - 1; }

// Element i of rank me's reduced shard of n elements: its own piece from `own`, peer r's from
// `received` (slot received_slot(r, me), n elements each), widened by `widen`, summed in rank order.
template <typename T, typename Widen>
SLIDEDP_HD float reduced_shard_element(const T* own, const T* received, int me, int ranks, int64_t n, int64_t i,
                                       Widen widen) {
  return sum_in_rank_order(ranks, [&](int r) { return widen(r == me ? own[i] : received[received_slot(r, me) * n + i]); });
}

// ---- deterministic pseudo-random values (the profiler's GEMM operands) ----
// splitmix64 (Steele, Lea, Flood 2014) of seed + i: every index gets its own well-mixed 64-bit value,
// the same on the host and the device, in any launch shape.
SLIDEDP_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i's value, uniform in [lo, hi) on a 2^-24 grid (the top 24 bits: exact in fp32).
SLIDEDP_HD float uniform_at(uint64_t seed, int64_t i, float lo, float hi) {
  const float u = static_cast<float>(splitmix64(seed + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

// ---- grouped expert GEMM: which expert a tile of the grid computes ----
// Rows sorted by expert (expert e owns rows [offsets[e], offsets[e+1])) are cut into tiles of `rows`
// rows that never straddle two experts: expert e gets ceil(count_e / rows) tiles, numbered from
// tile_offsets[e] (an exclusive prefix sum over experts, tile_offsets[E] the total). The grid is
// launched for an upper bound known on the host (total rows / rows + E); a tile past the total does
// nothing.
SLIDEDP_HD int64_t grouped_tiles(int64_t count, int64_t rows) { return (count + rows - 1) / rows; }

// The expert that owns grid tile `tile`, or -1 past the last: the last e with tile_offsets[e] <= tile
// (experts without rows own no tile, so the search skips them). Binary search over E + 1 offsets.
SLIDEDP_HD int32_t tile_expert(const int32_t* tile_offsets, int32_t E, int64_t tile) {
  if (tile < 0 || tile >= tile_offsets[E]) return -1;
  int32_t lo = 0, hi = E;  // invariant: tile_offsets[lo] <= tile < tile_offsets[hi]
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (tile_offsets[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// ---- gated delta rule (Qwen3.6's Gated DeltaNet): one column of a value head's state ----
// kernels/cpu/transformer/gated_delta_rule.h's recurrence, S_t = a (I - b k k^T) S_{t-1} + b k v^T,
// o_t = S_t^T q, acts on each column j of S (dk x dv) separately: with kS = k . S[:, j],
//   delta_j = b (v_j - a kS),   S[:, j] <- a S[:, j] + delta_j k,   o_j = q . S[:, j].
// The GPU kernel gives a column to a thread and runs the tokens of a segment in order; s points at
// S[0][j] of a row-major state whose rows are `stride` apart.
template <typename Real>
SLIDEDP_HD Real delta_column_forward(Real* s, int64_t stride, int64_t dk, const Real* k, const Real* q, Real a, Real b,
                                     Real v) {
  Real ks = 0;
  for (int64_t i = 0; i < dk; ++i) ks += k[i] * s[i * stride];
  const Real delta = b * (v - a * ks);
  Real o = 0;
  for (int64_t i = 0; i < dk; ++i) {
    s[i * stride] = a * s[i * stride] + delta * k[i];
    o += q[i] * s[i * stride];
  }
  return o;
}

// What a column's backward through one token needs of the others: with G = dS_t[:, j] + q do_j,
//   ddelta_j = k . G,  kS_j = k . S_{t-1}[:, j],  delta_j = b (v_j - a kS_j).
template <typename Real>
struct DeltaColumnGrad {
  Real ks, delta, ddelta;
};
template <typename Real>
SLIDEDP_HD DeltaColumnGrad<Real> delta_column_grad(const Real* s_prev, const Real* ds, int64_t stride, int64_t dk,
                                                   const Real* k, const Real* q, Real a, Real b, Real v, Real dout) {
  DeltaColumnGrad<Real> c{0, 0, 0};
  for (int64_t i = 0; i < dk; ++i) {
    c.ks += k[i] * s_prev[i * stride];
    c.ddelta += k[i] * (ds[i * stride] + q[i] * dout);
  }
  c.delta = b * (v - a * c.ks);
  return c;
}
// The token's gradients from every column's DeltaColumnGrad (sums over columns in index order):
//   dq_i = sum_j S_t[i][j] do_j                     (S_t = a S_{t-1} + k delta^T)
//   dk_i = sum_j G[i][j] delta_j - a b S_{t-1}[i][j] ddelta_j
//   da   = sum_j S_{t-1}[:, j] . G[:, j] - b kS_j ddelta_j,   db = sum_j (v_j - a kS_j) ddelta_j,
//   dv_j = b ddelta_j,   dS_{t-1}[:, j] = a G[:, j] - a b ddelta_j k.
// Row i of dq and dk (a kernel gives rows to threads too): row pointers step 1 along j.
template <typename Real>
SLIDEDP_HD void delta_row_grads(const Real* s_prev_row, const Real* ds_row, int64_t dv, Real k_i, Real q_i, Real a,
                                Real b, const Real* dout, const DeltaColumnGrad<Real>* cols, Real* dq_i, Real* dk_i) {
  Real dq = 0, dkv = 0;
  for (int64_t j = 0; j < dv; ++j) {
    const Real s_t = a * s_prev_row[j] + k_i * cols[j].delta;
    const Real g = ds_row[j] + q_i * dout[j];
    dq += s_t * dout[j];
    dkv += g * cols[j].delta - a * b * s_prev_row[j] * cols[j].ddelta;
  }
  *dq_i = dq, *dk_i = dkv;
}
// Column j's part of da (summed over columns in order by the caller), and dS_{t-1}[:, j] in place of dS_t[:, j].
template <typename Real>
SLIDEDP_HD Real delta_column_step_back(const Real* s_prev, Real* ds, int64_t stride, int64_t dk, const Real* k,
                                       const Real* q, Real a, Real b, Real dout, DeltaColumnGrad<Real> c) {
  Real da = -b * c.ks * c.ddelta;
  for (int64_t i = 0; i < dk; ++i) {
    const Real g = ds[i * stride] + q[i] * dout;
    da += s_prev[i * stride] * g;
    ds[i * stride] = a * g - a * b * c.ddelta * k[i];
  }
  return da;
}

// ---- embedding backward ----
// The scatter-add in a fixed order: positions are sorted by token (a stable sort, so each token's
// positions stay in position order) and each run of one token adds its rows in that order, as the
// CPU unit's loop over positions does, so the sums are bitwise the CPU's.

// The sort key of a position: its token id, or V for an invalid one (sorted last, never added).
SLIDEDP_HD int32_t embedding_sort_key(int32_t id, int64_t V) {
  return (id >= 0 && id < V) ? id : static_cast<int32_t>(V);
}

// Whether sorted index i starts a run of a valid token (the block that owns the run adds it).
SLIDEDP_HD bool embedding_run_starts(const int32_t* keys, int64_t i, int64_t V) {
  return keys[i] < V && (i == 0 || keys[i - 1] != keys[i]);
}

// One past the run that starts at sorted index i.
SLIDEDP_HD int64_t embedding_run_end(const int32_t* keys, int64_t i, int64_t N) {
  int64_t end = i + 1;
  while (end < N && keys[end] == keys[i]) ++end;
  return end;
}

}  // namespace slidedp::kernels::cuda::math
