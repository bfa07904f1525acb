// Flash-style causal GQA attention on the GPU; see attention.h for the contract. Layout of this file:
// the reference kernels (one warp per row), the tensor-core kernels (WMMA, 64 x 64 tiles, 4 warps
// of 16 rows each), then the dispatch.
//
// Tensor-core tiles live in shared memory with padded rows (bank spread; every WMMA pointer stays
// 32-byte aligned). WMMA accumulator fragments have an unspecified element layout, so every
// row-wise step (masking, online softmax, rescaling the output by exp(m_old - m_new)) goes through
// a shared-memory copy of the tile; each warp touches only its own 16 rows, so those steps need
// __syncwarp, and only the tile loads shared by the block need __syncthreads.
// Scores are handled in the log2 domain (s * scale * log2(e)) so exp2f does the exponentials; the
// saved lse is converted back to the natural log of the CPU's contract.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_tiles.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"

namespace slidedp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using math::kLog2e;

// ---- reference kernels ----------------------------------------------------------------------------

constexpr int kRefMaxPerLane = 16;  // head_dim <= 32 * 16 = 512
constexpr int kRefWarps = 8;       // rows per block

// One warp per (b, h, query row i): lanes own dims lane, lane + 32, ...; for each visible key a
// warp-reduced dot product and an online-softmax update, exactly the CPU's per-row recurrence.
__global__ void attention_forward_reference_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                                                   const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                   const bf16* __restrict__ v, const int32_t* __restrict__ pos,
                                                   int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                                   float scale, int64_t window) {
  const int64_t row_id = blockIdx.x * int64_t{kRefWarps} + threadIdx.x / 32;  // (b * H + h) * T + i
  const int lane = threadIdx.x % 32;
  if (row_id >= B * H * T) return;
  const int64_t i = row_id % T, bh = row_id / T, h = bh % H, b = bh / H, g = h / (H / KV);
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;  // this sequence's document positions
  const bf16* qr = q + ((b * T + i) * H + h) * hd;  // (hd)
  float qv[kRefMaxPerLane], acc[kRefMaxPerLane];
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    qv[j] = d < hd ? to_f32(qr[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t t = math::key_floor(i, ps, T, window); t <= i; ++t) {
    const bf16* kr = k + ((b * T + t) * KV + g) * hd;  // (hd)
    const bf16* vr = v + ((b * T + t) * KV + g) * hd;  // (hd)
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kRefMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) dot += qv[j] * to_f32(kr[d]);
    }
    const float s = warp_sum(dot) * scale;
    float corr, p;
    math::online_softmax_add(s, &m, &l, &corr, &p);
#pragma unroll
    for (int j = 0; j < kRefMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) acc[j] = acc[j] * corr + p * to_f32(vr[d]);
    }
  }
  bf16* orow = out + ((b * T + i) * H + h) * hd;  // (hd)
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < hd) orow[d] = to_bf16(acc[j] / l);
  }
  if (lane == 0) lse[(b * H + h) * T + i] = m + logf(l);
}

// D (B, H, T) = rowsum(dout * out): one warp per (b, t, h) row.
__global__ void attention_d_kernel(float* __restrict__ D, const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                   int64_t B, int64_t T, int64_t H, int64_t hd) {
  const int64_t row_id = blockIdx.x * int64_t{kRefWarps} + threadIdx.x / 32;  // (b * T + t) * H + h
  const int lane = threadIdx.x % 32;
  if (row_id >= B * T * H) return;
  const int64_t h = row_id % H, bt = row_id / H, t = bt % T, b = bt / T;
  const bf16* o = out + row_id * hd;
  const bf16* dO = dout + row_id * hd;
  float acc = 0.0f;
  for (int64_t d = lane; d < hd; d += 32) acc += to_f32(dO[d]) * to_f32(o[d]);
  acc = warp_sum(acc);
  if (lane == 0) D[(b * H + h) * T + t] = acc;
}

// dq row (b, h, i): sum over visible keys of dS * k, dS = P * (dP - D), P = exp(scale q.k - lse).
__global__ void attention_dq_reference_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout,
                                              const bf16* __restrict__ q, const bf16* __restrict__ k,
                                              const bf16* __restrict__ v, const float* __restrict__ lse,
                                              const float* __restrict__ D, const int32_t* __restrict__ pos,
                                              int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float scale,
                                              int64_t window) {
  const int64_t row_id = blockIdx.x * int64_t{kRefWarps} + threadIdx.x / 32;  // (b * H + h) * T + i
  const int lane = threadIdx.x % 32;
  if (row_id >= B * H * T) return;
  const int64_t i = row_id % T, bh = row_id / T, h = bh % H, b = bh / H, g = h / (H / KV);
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;
  const bf16* qr = q + ((b * T + i) * H + h) * hd;
  const bf16* dOr = dout + ((b * T + i) * H + h) * hd;
  float qv[kRefMaxPerLane], dov[kRefMaxPerLane], acc[kRefMaxPerLane];
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    qv[j] = d < hd ? to_f32(qr[d]) : 0.0f;
    dov[j] = d < hd ? to_f32(dOr[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  const float l = lse[row_id], Di = D[row_id];
  for (int64_t t = math::key_floor(i, ps, T, window); t <= i; ++t) {
    const bf16* kr = k + ((b * T + t) * KV + g) * hd;
    const bf16* vr = v + ((b * T + t) * KV + g) * hd;
    float s = 0.0f, dp = 0.0f;
#pragma unroll
    for (int j = 0; j < kRefMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) {
        s += qv[j] * to_f32(kr[d]);
        dp += dov[j] * to_f32(vr[d]);
      }
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    const float p = math::attention_prob(s, scale, l);
    const float ds = math::attention_ds(p, dp, Di);
#pragma unroll
    for (int j = 0; j < kRefMaxPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) acc[j] += ds * to_f32(kr[d]);
    }
  }
  bf16* dqr = dq + ((b * T + i) * H + h) * hd;
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < hd) dqr[d] = to_bf16(acc[j] * scale);
  }
}

// dk, dv row (b, g, key t): sums over the group's query heads and the queries i >= t that see it.
__global__ void attention_dkv_reference_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                               const bf16* __restrict__ dout, const bf16* __restrict__ q,
                                               const bf16* __restrict__ k, const bf16* __restrict__ v,
                                               const float* __restrict__ lse, const float* __restrict__ D,
                                               const int32_t* __restrict__ pos, int64_t B, int64_t T, int64_t H,
                                               int64_t KV, int64_t hd, float scale, int64_t window) {
  const int64_t row_id = blockIdx.x * int64_t{kRefWarps} + threadIdx.x / 32;  // (b * KV + g) * T + t
  const int lane = threadIdx.x % 32;
  if (row_id >= B * KV * T) return;
  const int64_t t = row_id % T, bg = row_id / T, g = bg % KV, b = bg / KV, group = H / KV;
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;
  const bf16* kr = k + ((b * T + t) * KV + g) * hd;
  const bf16* vr = v + ((b * T + t) * KV + g) * hd;
  float kv[kRefMaxPerLane], vv[kRefMaxPerLane], dk_acc[kRefMaxPerLane], dv_acc[kRefMaxPerLane];
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    kv[j] = d < hd ? to_f32(kr[d]) : 0.0f;
    vv[j] = d < hd ? to_f32(vr[d]) : 0.0f;
    dk_acc[j] = dv_acc[j] = 0.0f;
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i = t, end = math::window_rows_end(t, T, window); i < end; ++i) {
      if (!math::key_visible(t, i, T, ps, window)) continue;  // a later document's query (the whole warp)
      const bf16* qr = q + ((b * T + i) * H + h) * hd;
      const bf16* dOr = dout + ((b * T + i) * H + h) * hd;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int j = 0; j < kRefMaxPerLane; ++j) {
        const int64_t d = lane + 32 * j;
        if (d < hd) {
          s += to_f32(qr[d]) * kv[j];
          dp += to_f32(dOr[d]) * vv[j];
        }
      }
      s = warp_sum(s);
      dp = warp_sum(dp);
      const int64_t stat = (b * H + h) * T + i;
      const float p = math::attention_prob(s, scale, lse[stat]);
      const float ds = math::attention_ds(p, dp, D[stat]);
#pragma unroll
      for (int j = 0; j < kRefMaxPerLane; ++j) {
        const int64_t d = lane + 32 * j;
        if (d < hd) {
          dv_acc[j] += p * to_f32(dOr[d]);
          dk_acc[j] += ds * to_f32(qr[d]);
        }
      }
    }
  }
  bf16* dkr = dk + ((b * T + t) * KV + g) * hd;
  bf16* dvr = dv + ((b * T + t) * KV + g) * hd;
#pragma unroll
  for (int j = 0; j < kRefMaxPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < hd) {
      dkr[d] = to_bf16(dk_acc[j] * scale);
      dvr[d] = to_bf16(dv_acc[j]);
    }
  }
}

// ---- tensor-core kernels ---------------------------------------------------------------------------

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [row0, row0 + 64) of a (T, stride) bf16 matrix into a (64, LDB) shared tile, zeros past T.
template <int HD>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t stride, int64_t row0, int64_t T) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += blockDim.x) {
    const int r = idx / kChunks, ch = idx % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < T) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride + ch * 8);
    *reinterpret_cast<uint4*>(dst + r * TcDims<HD>::LDB + ch * 8) = val;
  }
}

// (16 x 64) fp32 at `out` (ld LDS) = A (16 x HD, row-major, ld LDB) B^T, B given as 64 rows of HD
// (ld LDB): the score tile of 16 rows against a 64-row tile.
template <int HD>
__device__ __forceinline__ void rows_times_tile_t(float* out, const bf16* a, const bf16* b) {
  constexpr int LDB = TcDims<HD>::LDB, LDS = TcDims<HD>::LDS;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * 16, LDB);
      wmma::load_matrix_sync(fb, b + n * 16 * LDB + kk * 16, LDB);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, LDS, wmma::mem_row_major);
  }
}

// Writes a (16 x HD) result held as HD/16 fragments to global rows (row stride `stride`), scaled,
// through the warp's (16 x LDS) fp32 staging area; rows >= T are skipped.
template <int HD>
__device__ __forceinline__ void store_rows(FragAcc (&acc)[HD / 16], float scale, float* staging, bf16* dst,
                                           int64_t stride, int64_t row0, int64_t T) {
  constexpr int LDS = TcDims<HD>::LDS;
  const int lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
#pragma unroll
    for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= scale;
    wmma::store_matrix_sync(staging, acc[n], LDS, wmma::mem_row_major);
    __syncwarp();
    if (row0 + r < T) {
      const float* src = staging + r * LDS + half * 8;
      __align__(16) bf16 packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = to_bf16(src[e]);
      *reinterpret_cast<uint4*>(dst + (row0 + r) * stride + n * 16 + half * 8) = *reinterpret_cast<const uint4*>(packed);
    }
    __syncwarp();
  }
}

// Grid (query tiles, B * H); the tile with the most keys runs first.
template <int HD>
__global__ void __launch_bounds__(kTcThreads) attention_forward_tc_kernel(bf16* __restrict__ out,
                                                                           float* __restrict__ lse,
                                                                           const bf16* __restrict__ q,
                                                                           const bf16* __restrict__ k,
                                                                           const bf16* __restrict__ v,
                                                                           const int32_t* __restrict__ pos, int64_t T,
                                                                           int64_t H, int64_t KV, float scale_log2,
                                                                           int64_t window) {
#if __CUDA_ARCH__ >= 800
  using Dm = TcDims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);                                        // (64, LDB)
  bf16* sK = reinterpret_cast<bf16*>(smem + Dm::kTileBytes);                       // (64, LDB)
  bf16* sV = reinterpret_cast<bf16*>(smem + 2 * Dm::kTileBytes);                   // (64, LDB)
  float* sS = reinterpret_cast<float*>(smem + 3 * Dm::kTileBytes);                 // (64, LDS)
  bf16* sP = reinterpret_cast<bf16*>(smem + 3 * Dm::kTileBytes + Dm::kScoreBytes);  // (64, LDP)
  float* sO = reinterpret_cast<float*>(smem + 3 * Dm::kTileBytes + Dm::kScoreBytes + Dm::kProbBytes);  // (64, LDO)

  const int64_t tiles = (T + kTile - 1) / kTile;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * kTile;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  const int64_t row = i0 + warp * 16 + r;  // this lane's query row (two lanes per row)
  const int64_t qstride = H * HD, kstride = KV * HD;
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;  // this sequence's document positions
  const bf16* qb = q + (b * T * H + h) * HD;
  const bf16* kb = k + (b * T * KV + g) * HD;
  const bf16* vb = v + (b * T * KV + g) * HD;

  load_tile<HD>(sQ, qb, qstride, i0, T);
  float* sOw = sO + warp * 16 * Dm::LDO;  // this warp's 16 rows
  float* sSw = sS + warp * 16 * Dm::LDS;
  bf16* sPw = sP + warp * 16 * Dm::LDP;
  for (int idx = lane; idx < 16 * HD; idx += 32) sOw[(idx / HD) * Dm::LDO + idx % HD] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // running max (log2 domain) and sum of this row

  // Key tiles before the first row's document or window hold no key any row of this tile sees.
  for (int64_t j0 = math::key_floor(i0, ps, T, window) / kTile * kTile; j0 <= i0; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous k, v tiles
    load_tile<HD>(sK, kb, kstride, j0, T);
    load_tile<HD>(sV, vb, kstride, j0, T);
    __syncthreads();
    // S (16 x 64) = Q_w K^T
    rows_times_tile_t<HD>(sSw, sQ + warp * 16 * Dm::LDB, sK);
    __syncwarp();
    // online softmax over this lane's 32 columns of its row
    float s[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      const int64_t key = j0 + half * 32 + t;
      s[t] = math::key_visible(key, row, T, ps, window) ? sSw[r * Dm::LDS + half * 32 + t] * scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, s[t]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float corr = math::online_softmax_tile_log2(tile_max, &m);  // m stays -inf before the row's document
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      const float p = math::tile_weight_log2(s[t], m);
      sum += p;
      sPw[r * Dm::LDP + half * 32 + t] = to_bf16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    float* orow = sOw + r * Dm::LDO + half * (HD / 2);
#pragma unroll 8
    for (int t = 0; t < HD / 2; ++t) orow[t] *= corr;
    __syncwarp();
    // O_w (16 x HD) += P_w (16 x 64) V (64 x HD)
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      FragAcc acc;
      wmma::load_matrix_sync(acc, sOw + n * 16, Dm::LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fa;
        FragBRow fb;
        wmma::load_matrix_sync(fa, sPw + kk * 16, Dm::LDP);
        wmma::load_matrix_sync(fb, sV + kk * 16 * Dm::LDB + n * 16, Dm::LDB);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sOw + n * 16, acc, Dm::LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (row < T) {
    const float inv_l = 1.0f / l;
    const float* orow = sOw + r * Dm::LDO + half * (HD / 2);
    bf16* dst = out + ((b * T + row) * H + h) * HD + half * (HD / 2);
#pragma unroll
    for (int t = 0; t < HD / 2; t += 8) {
      __align__(16) bf16 packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = to_bf16(orow[t + e] * inv_l);
      *reinterpret_cast<uint4*>(dst + t) = *reinterpret_cast<const uint4*>(packed);
    }
    if (half == 0) lse[(b * H + h) * T + row] = math::lse_from_log2(m, l);
  }
#else
  __trap();  // built for an architecture without these tensor-core instructions: fail, never garbage
#endif
}

// dQ of one query tile: grid (query tiles, B * H).
template <int HD>
__global__ void __launch_bounds__(kTcThreads) attention_dq_tc_kernel(bf16* __restrict__ dq,
                                                                      const bf16* __restrict__ dout,
                                                                      const bf16* __restrict__ q,
                                                                      const bf16* __restrict__ k,
                                                                      const bf16* __restrict__ v,
                                                                      const float* __restrict__ lse,
                                                                      const float* __restrict__ D,
                                                                      const int32_t* __restrict__ pos, int64_t T, int64_t H,
                                                                      int64_t KV, float scale, int64_t window) {
#if __CUDA_ARCH__ >= 800
  using Dm = TcDims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = reinterpret_cast<bf16*>(smem + Dm::kTileBytes);
  bf16* sK = reinterpret_cast<bf16*>(smem + 2 * Dm::kTileBytes);
  bf16* sV = reinterpret_cast<bf16*>(smem + 3 * Dm::kTileBytes);
  float* sS = reinterpret_cast<float*>(smem + 4 * Dm::kTileBytes);                      // (64, LDS)
  float* sdP = reinterpret_cast<float*>(smem + 4 * Dm::kTileBytes + Dm::kScoreBytes);   // (64, LDS)
  bf16* sdS = reinterpret_cast<bf16*>(smem + 4 * Dm::kTileBytes + 2 * Dm::kScoreBytes);  // (64, LDP)

  const int64_t tiles = (T + kTile - 1) / kTile;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * kTile;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  const int64_t row = i0 + warp * 16 + r;
  const int64_t qstride = H * HD, kstride = KV * HD;
  const float scale_log2 = scale * kLog2e;
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;
  load_tile<HD>(sQ, q + (b * T * H + h) * HD, qstride, i0, T);
  load_tile<HD>(sdO, dout + (b * T * H + h) * HD, qstride, i0, T);
  const float lse_r = row < T ? lse[(b * H + h) * T + row] * kLog2e : 0.0f;
  const float D_r = row < T ? D[(b * H + h) * T + row] : 0.0f;
  float* sSw = sS + warp * 16 * Dm::LDS;
  float* sdPw = sdP + warp * 16 * Dm::LDS;
  bf16* sdSw = sdS + warp * 16 * Dm::LDP;

  FragAcc acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int64_t j0 = math::key_floor(i0, ps, T, window) / kTile * kTile; j0 <= i0; j0 += kTile) {
    __syncthreads();
    load_tile<HD>(sK, k + (b * T * KV + g) * HD, kstride, j0, T);
    load_tile<HD>(sV, v + (b * T * KV + g) * HD, kstride, j0, T);
    __syncthreads();
    rows_times_tile_t<HD>(sSw, sQ + warp * 16 * Dm::LDB, sK);    // S = Q K^T
    rows_times_tile_t<HD>(sdPw, sdO + warp * 16 * Dm::LDB, sV);  // dP = dO V^T
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      const int c = half * 32 + t;
      const int64_t key = j0 + c;
      const bool visible = math::key_visible(key, row, T, ps, window) && row < T;
      const float p = visible ? math::attention_prob_log2(sSw[r * Dm::LDS + c], scale_log2, lse_r) : 0.0f;
      sdSw[r * Dm::LDP + c] = to_bf16(math::attention_ds(p, sdPw[r * Dm::LDS + c], D_r));
    }
    __syncwarp();
    // dQ_w (16 x HD) += dS_w (16 x 64) K (64 x HD)
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fa;
        FragBRow fb;
        wmma::load_matrix_sync(fa, sdSw + kk * 16, Dm::LDP);
        wmma::load_matrix_sync(fb, sK + kk * 16 * Dm::LDB + n * 16, Dm::LDB);
        wmma::mma_sync(acc[n], fa, fb, acc[n]);
      }
    }
  }
  store_rows<HD>(acc, scale, sSw, dq + (b * T * H + h) * HD, qstride, i0 + warp * 16, T);
#else
  __trap();  // built for an architecture without these tensor-core instructions: fail, never garbage
#endif
}

// dK, dV of one key tile of kv head g: grid (key tiles, B * KV); the first tiles have the most work.
template <int HD>
__global__ void __launch_bounds__(kTcThreads) attention_dkv_tc_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                                                       const bf16* __restrict__ dout,
                                                                       const bf16* __restrict__ q,
                                                                       const bf16* __restrict__ k,
                                                                       const bf16* __restrict__ v,
                                                                       const float* __restrict__ lse,
                                                                       const float* __restrict__ D,
                                                                       const int32_t* __restrict__ pos, int64_t T,
                                                                       int64_t H, int64_t KV, float scale, int64_t window) {
#if __CUDA_ARCH__ >= 800
  using Dm = TcDims<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = reinterpret_cast<bf16*>(smem + Dm::kTileBytes);
  bf16* sQ = reinterpret_cast<bf16*>(smem + 2 * Dm::kTileBytes);
  bf16* sdO = reinterpret_cast<bf16*>(smem + 3 * Dm::kTileBytes);
  unsigned char* rest = smem + 4 * Dm::kTileBytes;
  float* sSt = reinterpret_cast<float*>(rest);                                        // (64 keys, LDS)
  float* sdPt = reinterpret_cast<float*>(rest + Dm::kScoreBytes);                     // (64 keys, LDS)
  bf16* sPt = reinterpret_cast<bf16*>(rest + 2 * Dm::kScoreBytes);                    // (64 keys, LDP)
  bf16* sdSt = reinterpret_cast<bf16*>(rest + 2 * Dm::kScoreBytes + Dm::kProbBytes);  // (64 keys, LDP)
  float* sLse = reinterpret_cast<float*>(rest + 2 * Dm::kScoreBytes + 2 * Dm::kProbBytes);  // (64) log2 domain
  float* sD = sLse + align128(kTile * 4) / 4;                                                // (64)

  const int64_t j0 = blockIdx.x * int64_t{kTile};
  const int64_t bg = blockIdx.y, b = bg / KV, g = bg % KV, group = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  const int64_t key = j0 + warp * 16 + r;  // this lane's key row
  const int64_t qstride = H * HD, kstride = KV * HD;
  const float scale_log2 = scale * kLog2e;
  const int32_t* ps = pos != nullptr ? pos + b * T : nullptr;
  load_tile<HD>(sK, k + (b * T * KV + g) * HD, kstride, j0, T);
  load_tile<HD>(sV, v + (b * T * KV + g) * HD, kstride, j0, T);
  float* sStw = sSt + warp * 16 * Dm::LDS;
  float* sdPtw = sdPt + warp * 16 * Dm::LDS;
  bf16* sPtw = sPt + warp * 16 * Dm::LDP;
  bf16* sdStw = sdSt + warp * 16 * Dm::LDP;

  FragAcc dk_acc[HD / 16], dv_acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    // query tiles below j0 see none of these keys, nor those past the tile's last key's window
    const int64_t rows_end = math::window_rows_end(j0 + kTile - 1, T, window);
    for (int64_t i0 = j0; i0 < rows_end; i0 += kTile) {
      __syncthreads();
      load_tile<HD>(sQ, q + (b * T * H + h) * HD, qstride, i0, T);
      load_tile<HD>(sdO, dout + (b * T * H + h) * HD, qstride, i0, T);
      if (threadIdx.x < kTile) {
        const int64_t qi = i0 + threadIdx.x;
        sLse[threadIdx.x] = qi < T ? lse[(b * H + h) * T + qi] * kLog2e : 0.0f;
        sD[threadIdx.x] = qi < T ? D[(b * H + h) * T + qi] : 0.0f;
      }
      __syncthreads();
      rows_times_tile_t<HD>(sStw, sK + warp * 16 * Dm::LDB, sQ);    // S^T = K_w Q^T
      rows_times_tile_t<HD>(sdPtw, sV + warp * 16 * Dm::LDB, sdO);  // dP^T = V_w dO^T
      __syncwarp();
#pragma unroll
      for (int t = 0; t < 32; ++t) {
        const int c = half * 32 + t;
        const int64_t qi = i0 + c;
        const bool visible = math::key_visible(key, qi, T, ps, window) && qi < T;
        const float p = visible ? math::attention_prob_log2(sStw[r * Dm::LDS + c], scale_log2, sLse[c]) : 0.0f;
        sPtw[r * Dm::LDP + c] = to_bf16(p);
        sdStw[r * Dm::LDP + c] = to_bf16(math::attention_ds(p, sdPtw[r * Dm::LDS + c], sD[c]));
      }
      __syncwarp();
      // dV_w += P^T_w (16 x 64) dO (64 x HD);  dK_w += dS^T_w (16 x 64) Q (64 x HD)
#pragma unroll
      for (int n = 0; n < HD / 16; ++n) {
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          FragA fa;
          FragBRow fb;
          wmma::load_matrix_sync(fa, sPtw + kk * 16, Dm::LDP);
          wmma::load_matrix_sync(fb, sdO + kk * 16 * Dm::LDB + n * 16, Dm::LDB);
          wmma::mma_sync(dv_acc[n], fa, fb, dv_acc[n]);
          wmma::load_matrix_sync(fa, sdStw + kk * 16, Dm::LDP);
          wmma::load_matrix_sync(fb, sQ + kk * 16 * Dm::LDB + n * 16, Dm::LDB);
          wmma::mma_sync(dk_acc[n], fa, fb, dk_acc[n]);
        }
      }
    }
  }
  store_rows<HD>(dk_acc, scale, sStw, dk + (b * T * KV + g) * HD, kstride, j0 + warp * 16, T);
  store_rows<HD>(dv_acc, 1.0f, sStw, dv + (b * T * KV + g) * HD, kstride, j0 + warp * 16, T);
#else
  __trap();  // built for an architecture without these tensor-core instructions: fail, never garbage
#endif
}

// ---- dispatch --------------------------------------------------------------------------------------

void check_shape(const AttentionShape& s) {
  SLIDEDP_CHECK(s.B >= 0 && s.T >= 0 && s.H > 0 && s.KV > 0 && s.hd > 0 && s.hd % 2 == 0 && s.H % s.KV == 0,
                "bad attention shape");
  SLIDEDP_CHECK(s.hd <= 32 * kRefMaxPerLane, "attention: head_dim above 512 is not supported on CUDA");
  SLIDEDP_CHECK(s.window >= 0 && s.scale >= 0 && std::isfinite(s.scale), "attention: bad window or scale");
}

unsigned ref_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRefWarps - 1) / kRefWarps); }


template <int HD>
void forward_tc(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionShape& s,
                cudaStream_t stream) {
  const int bytes = TcDims<HD>::kFwdBytes;
  allow_dynamic_shared<attention_forward_tc_kernel<HD>>(bytes);
  const dim3 grid(static_cast<unsigned>((s.T + kTile - 1) / kTile), static_cast<unsigned>(s.B * s.H));
  const float scale_log2 = attention_scale(s) * kLog2e;
  attention_forward_tc_kernel<HD><<<grid, kTcThreads, bytes, stream>>>(out, lse, q, k, v, s.positions, s.T, s.H, s.KV,
                                                                        scale_log2, s.window);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_forward (tensor cores)");
}

template <int HD>
void backward_tc(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                 const float* lse, const float* D, const AttentionShape& s, float scale, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((s.T + kTile - 1) / kTile);
  allow_dynamic_shared<attention_dq_tc_kernel<HD>>(TcDims<HD>::kDqBytes);
  attention_dq_tc_kernel<HD><<<dim3(tiles, static_cast<unsigned>(s.B * s.H)), kTcThreads, TcDims<HD>::kDqBytes, stream>>>(
      dq, dout, q, k, v, lse, D, s.positions, s.T, s.H, s.KV, scale, s.window);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_backward dq (tensor cores)");
  allow_dynamic_shared<attention_dkv_tc_kernel<HD>>(TcDims<HD>::kDkvBytes);
  attention_dkv_tc_kernel<HD><<<dim3(tiles, static_cast<unsigned>(s.B * s.KV)), kTcThreads, TcDims<HD>::kDkvBytes,
                                stream>>>(dk, dv, dout, q, k, v, lse, D, s.positions, s.T, s.H, s.KV, scale, s.window);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_backward dk/dv (tensor cores)");
}

// Shared memory a block of the current device may opt into (H100/H200 227 KB, A100 163 KB, Ada
// 99 KB: head_dim 128 tiles do not fit on Ada, which then takes the reference path).
int max_shared_optin() { return max_shared_optin_bytes(current_device()); }

bool tc_forward_fits(int64_t hd) {
  return (hd == 64 ? TcDims<64>::kFwdBytes : TcDims<128>::kFwdBytes) <= max_shared_optin();
}
bool tc_backward_fits(int64_t hd) {
  const int need = hd == 64 ? std::max(TcDims<64>::kDqBytes, TcDims<64>::kDkvBytes)
                            : std::max(TcDims<128>::kDqBytes, TcDims<128>::kDkvBytes);
  return need <= max_shared_optin();
}

}  // namespace

bool attention_tensor_core_supports(int64_t hd) { return hd == 64 || hd == 128; }

float attention_scale(const AttentionShape& s) {
  return static_cast<float>(s.scale > 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.hd)));
}

AttentionImpl resolve_attention_impl(AttentionImpl requested, int64_t hd, const char* override) {
  if (requested == AttentionImpl::kAuto && override != nullptr) {
    if (std::strcmp(override, "reference") == 0)
      requested = AttentionImpl::kReference;
    else if (std::strcmp(override, "tensor_core") == 0)
      requested = AttentionImpl::kTensorCore;
    else if (std::strcmp(override, "auto") != 0 && override[0] != '\0')
      throw InputError("SLIDEDP_CUDA_ATTENTION", std::string("'") + override + "' is none of reference, tensor_core, auto");
  }
  if (requested == AttentionImpl::kTensorCore && !attention_tensor_core_supports(hd))
    throw InputError("SLIDEDP_CUDA_ATTENTION", "the tensor-core attention needs head_dim 64 or 128");
  if (requested == AttentionImpl::kAuto)
    return attention_tensor_core_supports(hd) ? AttentionImpl::kTensorCore : AttentionImpl::kReference;
  return requested;
}

AttentionImpl resolve_attention_impl(AttentionImpl requested, int64_t hd) {
  static const std::string env = [] {
    const char* v = std::getenv("SLIDEDP_CUDA_ATTENTION");
    return std::string(v != nullptr ? v : "");
  }();
  return resolve_attention_impl(requested, hd, env.c_str());
}

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionShape& s,
                       AttentionImpl impl, cudaStream_t stream) {
  check_shape(s);
  if (s.B * s.T == 0) return;
  SLIDEDP_CHECK(s.B * s.H <= 65535 && s.B * s.KV <= 65535, "attention: B * heads above 65535");
  AttentionImpl chosen = resolve_attention_impl(impl, s.hd);
  if (chosen == AttentionImpl::kTensorCore && !tc_forward_fits(s.hd)) chosen = AttentionImpl::kReference;
  switch (chosen) {
    case AttentionImpl::kTensorCore:
      if (s.hd == 64) return forward_tc<64>(out, lse, q, k, v, s, stream);
      return forward_tc<128>(out, lse, q, k, v, s, stream);
    default: {
      attention_forward_reference_kernel<<<ref_blocks(s.B * s.H * s.T), kRefWarps * 32, 0, stream>>>(
          out, lse, q, k, v, s.positions, s.B, s.T, s.H, s.KV, s.hd, attention_scale(s), s.window);
      SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_forward (reference)");
    }
  }
}

int64_t attention_backward_workspace_bytes(const AttentionShape& s) { return attention_backward_workspace_bytes(s.B, s.H, s.T); }

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, const AttentionShape& s, AttentionImpl impl,
                        void* workspace, cudaStream_t stream) {
  check_shape(s);
  if (s.B * s.T == 0) return;
  SLIDEDP_CHECK(s.B * s.H <= 65535 && s.B * s.KV <= 65535, "attention: B * heads above 65535");
  auto* D = static_cast<float*>(workspace);  // (B, H, T)
  attention_d_kernel<<<ref_blocks(s.B * s.T * s.H), kRefWarps * 32, 0, stream>>>(D, dout, out, s.B, s.T, s.H, s.hd);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_backward D");
  const float scale = attention_scale(s);
  AttentionImpl chosen = resolve_attention_impl(impl, s.hd);
  if (chosen == AttentionImpl::kTensorCore && !tc_backward_fits(s.hd)) chosen = AttentionImpl::kReference;
  switch (chosen) {
    case AttentionImpl::kTensorCore:
      if (s.hd == 64) return backward_tc<64>(dq, dk, dv, dout, q, k, v, lse, D, s, scale, stream);
      return backward_tc<128>(dq, dk, dv, dout, q, k, v, lse, D, s, scale, stream);
    default:
      attention_dq_reference_kernel<<<ref_blocks(s.B * s.H * s.T), kRefWarps * 32, 0, stream>>>(
          dq, dout, q, k, v, lse, D, s.positions, s.B, s.T, s.H, s.KV, s.hd, scale, s.window);
      SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_backward dq (reference)");
      attention_dkv_reference_kernel<<<ref_blocks(s.B * s.KV * s.T), kRefWarps * 32, 0, stream>>>(
          dk, dv, dout, q, k, v, lse, D, s.positions, s.B, s.T, s.H, s.KV, s.hd, scale, s.window);
      SLIDEDP_CUDA_CHECK_LAUNCH(stream, "attention_backward dk/dv (reference)");
  }
}

}  // namespace slidedp::kernels::cuda
