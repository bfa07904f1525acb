// The routed experts on the GPU; see moe_experts.h. The file reads like kernels/cpu/transformer/
// moe_experts.cc: dispatch (count, scan, stable placement), gather, grouped GEMMs, combine.
#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_experts.h"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// offsets[e + 1] = the slots routed to expert e (one block per expert, a fixed-order block sum).
__global__ void count_kernel(int64_t* offsets, const int32_t* __restrict__ idx, int64_t slots) {
  __shared__ int64_t partial[kThreads];
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  int64_t n = 0;
  for (int64_t i = threadIdx.x; i < slots; i += kThreads) n += idx[i] == e;
  partial[threadIdx.x] = n;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[e + 1] = partial[0];
}

// The exclusive prefix sums of the counts (rows) and of their tiles; E is at most a few hundred.
__global__ void scan_kernel(int64_t* offsets, int32_t* tile_offsets, int32_t E) {
  int64_t rows = 0;
  int32_t tiles = 0;
  for (int32_t e = 0; e < E; ++e) {
    const int64_t count = offsets[e + 1];
    offsets[e] = rows, tile_offsets[e] = tiles;
    rows += count;
    tiles += static_cast<int32_t>(math::grouped_tiles(count, kGroupedTileRows));
  }
  offsets[E] = rows, tile_offsets[E] = tiles;
}

// Expert e's slots in slot order get its rows in order (a stable sort): the block walks the slots
// in chunks, each thread's rank within the chunk from a warp ballot and the warps before it.
__global__ void place_kernel(int32_t* row_of_slot, int32_t* slot_of_row, const int64_t* __restrict__ offsets,
                             const int32_t* __restrict__ idx, int64_t slots) {
  __shared__ int warp_counts[kWarps];
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t next = offsets[e];
  for (int64_t begin = 0; begin < slots; begin += kThreads) {
    const int64_t i = begin + threadIdx.x;
    const bool mine = i < slots && idx[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << lane) - 1u)), chunk = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_counts[w];
      chunk += warp_counts[w];
    }
    if (mine) {
      const int64_t row = next + before;
      row_of_slot[i] = static_cast<int32_t>(row);
      slot_of_row[row] = static_cast<int32_t>(i);
    }
    next += chunk;
    __syncthreads();
  }
}

// rows (R, C) <- src[token of the row] (token = slot / K).
__global__ void gather_kernel(bf16* __restrict__ rows, const bf16* __restrict__ src,
                              const int32_t* __restrict__ slot_of_row, int64_t R, int64_t K, int64_t C) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const bf16* from = src + (slot_of_row[r] / K) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) rows[r * C + c] = from[c];
  }
}

// y[t] = sum_k w[t,k] rows[row of (t,k)], in slot order, fp32; bf16 out.
__global__ void combine_kernel(bf16* __restrict__ y, const bf16* __restrict__ rows,
                               const float* __restrict__ w, const int32_t* __restrict__ row_of_slot,
                               int64_t N, int64_t K, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * C;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += w[t * K + k] * to_f32(rows[row_of_slot[t * K + k] * C + c]);
    y[i] = to_bf16(sum);
  }
}

// dz[t] = sum_k dz_rows[row of (t,k)] in slot order, fp32.
__global__ void combine_backward_kernel(float* __restrict__ dz, const float* __restrict__ dz_rows,
                                        const int32_t* __restrict__ row_of_slot, int64_t N, int64_t K,
                                        int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * C;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += dz_rows[row_of_slot[t * K + k] * C + c];
    dz[i] = sum;
  }
}

// Per sorted row: the routing weight's gradient dw = m . (dy W_down) (out = m W_down^T, so
// dy . out = (dy W_down) . m, without saving out), then dm = w (dy W_down) and the row's output
// gradient times w in place. One block per row; the dot in double, a fixed-order block sum.
__global__ void routing_weight_kernel(float* __restrict__ dw, bf16* __restrict__ dm,
                                      bf16* __restrict__ dy_rows, const float* __restrict__ gm,
                                      const bf16* __restrict__ m, const float* __restrict__ w,
                                      const int32_t* __restrict__ slot_of_row, int64_t R, int64_t Ie,
                                      int64_t C) {
  __shared__ double partial[kWarps];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int32_t slot = slot_of_row[r];
    const float wk = w[slot];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < Ie; i += kThreads) {
      const float g = gm[r * Ie + i];
      acc += static_cast<double>(to_f32(m[r * Ie + i])) * g;
      dm[r * Ie + i] = to_bf16(wk * g);
    }
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double sum = 0;
      for (int v = 0; v < kWarps; ++v) sum += partial[v];
      dw[slot] = static_cast<float>(sum);
    }
    for (int64_t c = threadIdx.x; c < C; c += kThreads)
      dy_rows[r * C + c] = to_bf16(wk * to_f32(dy_rows[r * C + c]));
    __syncthreads();
  }
}

ExpertGroups dispatch(const ExpertDispatch& d, const MoeSpec& s, const int32_t* idx, int64_t N,
                      cudaStream_t st) {
  const int64_t slots = N * s.K;
  const unsigned experts = static_cast<unsigned>(s.E);
  count_kernel<<<experts, kThreads, 0, st>>>(d.offsets, idx, slots);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe count");
  scan_kernel<<<1, 1, 0, st>>>(d.offsets, d.tile_offsets, static_cast<int32_t>(s.E));
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe scan");
  place_kernel<<<experts, kThreads, 0, st>>>(d.row_of_slot, d.slot_of_row, d.offsets, idx, slots);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe place");
  return {d.offsets, d.tile_offsets, static_cast<int32_t>(s.E), slots};
}

void gather(bf16* rows, const bf16* src, const ExpertDispatch& d, int64_t R, int64_t K, int64_t C,
            cudaStream_t st) {
  gather_kernel<<<grid_for(R, 1, 65535), 128, 0, st>>>(rows, src, d.slot_of_row, R, K, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe gather");
}

void activation(const MoeSpec& s, bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t st) {
  if (s.activation == ExpertActivation::kGeluTanh)
    geglu_forward(m, g, u, n, st);
  else
    swiglu_forward(m, g, u, n, st);
}

void activation_backward(const MoeSpec& s, bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u,
                         int64_t n, cudaStream_t st) {
  if (s.activation == ExpertActivation::kGeluTanh)
    geglu_backward(dg, du, dm, g, u, n, st);
  else
    swiglu_backward(dg, du, dm, g, u, n, st);
}

// The packed weights as the grouped GEMMs read them. Expert e's gate rows are gate_up[e] rows
// [0, Ie), its up rows [Ie, 2 Ie), each (Ie, C); down[e] is (C, Ie).
struct ExpertWeights {
  const MoeSpec& s;
  const bf16* gate_up;
  const bf16* down;
  StridedBf16 gate_t() const { return {gate_up, 1, s.C, 2 * s.Ie * s.C}; }  // (C, Ie) view: x Wg^T
  StridedBf16 up_t() const { return {gate_up + s.Ie * s.C, 1, s.C, 2 * s.Ie * s.C}; }
  StridedBf16 down_t() const { return {down, 1, s.Ie, s.C * s.Ie}; }      // (Ie, C) view: m Wd^T
  StridedBf16 gate() const { return {gate_up, s.C, 1, 2 * s.Ie * s.C}; }  // (Ie, C): dg Wg
  StridedBf16 up() const { return {gate_up + s.Ie * s.C, s.C, 1, 2 * s.Ie * s.C}; }
  StridedBf16 down_w() const { return {down, s.Ie, 1, s.C * s.Ie}; }  // (C, Ie): dy Wd
};

void check(const MoeSpec& s, int64_t N) {
  SLIDEDP_CHECK(N >= 0 && s.C > 0 && s.E > 0 && s.K > 0 && s.K <= s.E && s.Ie > 0, "bad MoE spec");
  SLIDEDP_CHECK(N * s.K <= INT32_MAX, "too many routed rows for 32-bit row indices");
}

}  // namespace

void experts_forward(const MoeSpec& s, const bf16* gate_up, const bf16* down, const bf16* z,
                     const int32_t* idx, const float* w, bf16* y, DeviceWorkspace saved, int64_t N,
                     DeviceWorkspace ws, cudaStream_t st) {
  check(s, N);
  if (N == 0) return;
  const int64_t R = N * s.K, C = s.C, Ie = s.Ie;
  Carver saved_carver(saved.data, saved.bytes);
  const ExpertsSaved<bf16> S = carve_experts_saved<bf16>(saved_carver, s, N);
  Carver carver(ws.data, ws.bytes);
  const ExpertsForward<bf16> f = carve_experts_forward<bf16>(carver, s, N);
  const ExpertWeights W{s, gate_up, down};
  const ExpertGroups groups = dispatch(f.d, s, idx, N, st);
  gather(f.rows, z, f.d, R, s.K, C, st);
  const StridedBf16 rows{f.rows, C, 1, 0};
  grouped_gemm_rows(groups, Ie, C, rows, W.gate_t(), S.g, Ie, false, false, st);
  grouped_gemm_rows(groups, Ie, C, rows, W.up_t(), S.u, Ie, false, false, st);
  activation(s, f.m, S.g, S.u, R * Ie, st);
  grouped_gemm_rows(groups, C, Ie, {f.m, Ie, 1, 0}, W.down_t(), f.rows, C, false, false, st);
  combine_kernel<<<grid_for(N * C, kThreads), kThreads, 0, st>>>(y, f.rows, w, f.d.row_of_slot, N, s.K, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe combine");
}

void experts_backward(const MoeSpec& s, const bf16* gate_up, const bf16* down, const bf16* z,
                      const int32_t* idx, const float* w, DeviceWorkspace saved, const bf16* dy, float* dz,
                      float* dw, float* dgate_up, float* ddown, int64_t N, DeviceWorkspace ws,
                      cudaStream_t st) {
  check(s, N);
  if (N == 0) return;
  const int64_t R = N * s.K, C = s.C, Ie = s.Ie;
  Carver saved_carver(saved.data, saved.bytes);
  const ExpertsSaved<bf16> S = carve_experts_saved<bf16>(saved_carver, s, N);
  Carver carver(ws.data, ws.bytes);
  const ExpertsBackward<bf16> b = carve_experts_backward<bf16>(carver, s, N);
  const ExpertWeights W{s, gate_up, down};
  const ExpertGroups groups = dispatch(b.d, s, idx, N, st);
  gather(b.z, z, b.d, R, s.K, C, st);
  gather(b.dy, dy, b.d, R, s.K, C, st);
  activation(s, b.m_du, S.g, S.u, R * Ie, st);
  // gm = dy W_down (fp32), then dw, dm = w gm and dout = w dy
  grouped_gemm_rows(groups, Ie, C, {b.dy, C, 1, 0}, W.down_w(), b.gm_dz, Ie, true, false, st);
  routing_weight_kernel<<<grid_for(R, 1, 65535), kThreads, 0, st>>>(dw, b.dm_dg, b.dy, b.gm_dz, b.m_du, w,
                                                                    b.d.slot_of_row, R, Ie, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe routing weight gradient");
  // dWd_e += dout_e^T m_e
  grouped_gemm_reduce(groups, C, Ie, {b.dy, 1, C, 0}, {b.m_du, Ie, 1, 0}, ddown, C * Ie, Ie, st);
  activation_backward(s, b.dm_dg, b.m_du, b.dm_dg, S.g, S.u, R * Ie, st);  // dm_dg <- dg, m_du <- du
  // input rows' gradients dg Wg + du Wu (fp32), and dWg_e += dg_e^T z_e, dWu_e += du_e^T z_e
  grouped_gemm_rows(groups, C, Ie, {b.dm_dg, Ie, 1, 0}, W.gate(), b.gm_dz, C, true, false, st);
  grouped_gemm_rows(groups, C, Ie, {b.m_du, Ie, 1, 0}, W.up(), b.gm_dz, C, true, true, st);
  const StridedBf16 z_rows{b.z, C, 1, 0};
  grouped_gemm_reduce(groups, Ie, C, {b.dm_dg, 1, Ie, 0}, z_rows, dgate_up, 2 * Ie * C, C, st);
  grouped_gemm_reduce(groups, Ie, C, {b.m_du, 1, Ie, 0}, z_rows, dgate_up + Ie * C, 2 * Ie * C, C, st);
  combine_backward_kernel<<<grid_for(N * C, kThreads), kThreads, 0, st>>>(dz, b.gm_dz, b.d.row_of_slot, N,
                                                                          s.K, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(st, "moe combine backward");
}

}  // namespace slidedp::kernels::cuda
