// The grouped GEMM kernel; see grouped_gemm.h. A 64 x 64 output tile per block of four warps (each
// 32 x 32 as 2 x 2 WMMA 16x16x16 bf16 fragments), k in steps of 32 staged through shared memory with
// zero fill past the edges. Operands are read by strides, coalesced along whichever index is
// contiguous, so one kernel serves the forward (x W^T), the input gradient (dy W) and the weight
// gradient (dy^T x) without transposed copies.
#include <cuda_runtime.h>
#include <mma.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm.h"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kBM = static_cast<int>(kGroupedTileRows), kBN = 64, kBK = 32, kThreads = 128;
// Padded shared-memory rows: WMMA wants leading dimensions in multiples of 8 (bf16) / 4 (fp32) and
// 32-byte aligned fragment pointers, which these give; the padding staggers the banks.
constexpr int kLdA = kBK + 8, kLdB = kBN + 8, kLdC = kBN + 4;

struct Problem {
  bool reduce = false;  // false: rows grouped by expert; true: k grouped by expert (weight gradients)
  int32_t E = 0;
  const int64_t* offsets = nullptr;
  const int32_t* tile_offsets = nullptr;
  int64_t M = 0, N = 0, K = 0;  // rows mode: N, K; reduce mode: M, N (k is the expert's rows)
  int64_t m_tiles = 0;          // reduce mode: tiles along M per expert
  StridedBf16 A, B;
  void* D = nullptr;
  int64_t ldd = 0, d_expert_stride = 0;
  bool out_f32 = false, accumulate = false;
};

// tile (i, j) = src[i * rs + j * cs] for i < rows_left, j < cols_left, else 0.
template <int R, int C, int Ld>
__device__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* src, int64_t rs, int64_t cs,
                          int64_t rows_left, int64_t cols_left) {
  const bool cols_fast = cs == 1 || rs != 1;  // consecutive threads walk the contiguous index
  for (int l = threadIdx.x; l < R * C; l += kThreads) {
    const int i = cols_fast ? l / C : l % R;
    const int j = cols_fast ? l % C : l / R;
    __nv_bfloat16 v = __float2bfloat16_rn(0.0f);
    if (i < rows_left && j < cols_left) v = src[i * rs + j * cs];
    tile[i * Ld + j] = v;
  }
}

__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(Problem p) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 as[kBM * kLdA];
  __shared__ __align__(32) __nv_bfloat16 bs[kBK * kLdB];
  __shared__ __align__(32) float cs[kBM * kLdC];

  int64_t e, m0, m_left, k_begin, k_end;
  if (!p.reduce) {
    e = math::tile_expert(p.tile_offsets, p.E, blockIdx.x);
    if (e < 0) return;  // past the last tile: the grid is an upper bound
    m0 = p.offsets[e] + (static_cast<int64_t>(blockIdx.x) - p.tile_offsets[e]) * kBM;
    m_left = p.offsets[e + 1] - m0;
    k_begin = 0, k_end = p.K;
  } else {
    e = static_cast<int64_t>(blockIdx.x) / p.m_tiles;
    m0 = (static_cast<int64_t>(blockIdx.x) % p.m_tiles) * kBM;
    m_left = p.M - m0;
    k_begin = p.offsets[e], k_end = p.offsets[e + 1];
    if (k_begin == k_end) return;  // no rows: nothing to add
  }
  const int64_t n0 = blockIdx.y * int64_t{kBN};
  const __nv_bfloat16* a = p.A.ptr + m0 * p.A.row_stride;
  const __nv_bfloat16* b = p.B.ptr + e * p.B.expert_stride + n0 * p.B.col_stride;

  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kBK) {
    load_tile<kBM, kBK, kLdA>(as, a + k0 * p.A.col_stride, p.A.row_stride, p.A.col_stride, m_left,
                              k_end - k0);
    load_tile<kBK, kBN, kLdB>(bs, b + k0 * p.B.row_stride, p.B.row_stride, p.B.col_stride, k_end - k0,
                              p.N - n0);
    __syncthreads();
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], as + (wm * 32 + i * 16) * kLdA + kk, kLdA);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], bs + kk * kLdB + wn * 32 + j * 16, kLdB);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wm * 32 + i * 16) * kLdC + wn * 32 + j * 16, acc[i][j], kLdC,
                              wmma::mem_row_major);
  __syncthreads();
  const int64_t d_base = e * p.d_expert_stride + m0 * p.ldd + n0;
  for (int l = threadIdx.x; l < kBM * kBN; l += kThreads) {
    const int i = l / kBN, j = l % kBN;
    if (i >= m_left || n0 + j >= p.N) continue;
    const int64_t at = d_base + i * p.ldd + j;
    const float v = cs[i * kLdC + j];
    if (p.out_f32) {
      float* d = static_cast<float*>(p.D) + at;
      *d = p.accumulate ? *d + v : v;
    } else {
      static_cast<__nv_bfloat16*>(p.D)[at] = __float2bfloat16_rn(v);
    }
  }
}

void launch(const Problem& p, int64_t x_tiles, const char* what, cudaStream_t stream) {
  const int64_t y_tiles = (p.N + kBN - 1) / kBN;
  SLIDEDP_CHECK(x_tiles < (int64_t{1} << 31) && y_tiles < 65536, std::string(what) + ": grid too large");
  if (x_tiles == 0 || y_tiles == 0) return;
  grouped_gemm_kernel<<<dim3(static_cast<unsigned>(x_tiles), static_cast<unsigned>(y_tiles)), kThreads, 0,
                        stream>>>(p);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, what);
}

}  // namespace

void grouped_gemm_rows(const ExpertGroups& g, int64_t N, int64_t K, const StridedBf16& A,
                       const StridedBf16& B, void* D, int64_t ldd, bool out_f32, bool accumulate,
                       cudaStream_t stream) {
  SLIDEDP_CHECK(g.E > 0 && g.rows >= 0 && N > 0 && K > 0 && ldd >= N, "grouped_gemm_rows: bad shape");
  SLIDEDP_CHECK(A.expert_stride == 0, "grouped_gemm_rows: A is indexed by sorted row");
  SLIDEDP_CHECK(out_f32 || !accumulate, "grouped_gemm_rows: accumulates into fp32 only");
  if (g.rows == 0) return;
  Problem p;
  p.E = g.E, p.offsets = g.offsets, p.tile_offsets = g.tile_offsets;
  p.N = N, p.K = K, p.A = A, p.B = B;
  p.D = D, p.ldd = ldd, p.out_f32 = out_f32, p.accumulate = accumulate;
  // each expert wastes at most one partial tile
  launch(p, math::grouped_tiles(g.rows, kBM) + g.E, "grouped_gemm_rows", stream);
}

void grouped_gemm_reduce(const ExpertGroups& g, int64_t M, int64_t N, const StridedBf16& A,
                         const StridedBf16& B, float* D, int64_t d_expert_stride, int64_t ldd,
                         cudaStream_t stream) {
  SLIDEDP_CHECK(g.E > 0 && M > 0 && N > 0 && ldd >= N, "grouped_gemm_reduce: bad shape");
  SLIDEDP_CHECK(B.expert_stride == 0 && A.expert_stride == 0,
                "grouped_gemm_reduce: A and B are indexed by sorted row");
  if (g.rows == 0) return;
  Problem p;
  p.reduce = true;
  p.E = g.E, p.offsets = g.offsets;
  p.M = M, p.N = N, p.A = A, p.B = B;
  p.m_tiles = math::grouped_tiles(M, kBM);
  p.D = D, p.ldd = ldd, p.d_expert_stride = d_expert_stride, p.out_f32 = true, p.accumulate = true;
  launch(p, g.E * p.m_tiles, "grouped_gemm_reduce", stream);
}

}  // namespace slidedp::kernels::cuda
