// The grouped GEMMs of a mixture-of-experts block on the GPU: one launch multiplies every expert's
// rows by that expert's weights (or, for weight gradients, reduces every expert's rows into that
// expert's gradient), with the per-expert row counts read from DEVICE memory. The router decides the
// counts on the GPU; reading them on the host would stall the stream once per MoE layer and op, so
// the grid is sized from a host-known bound and each tile finds its expert (math::tile_expert).
// bf16 operands, fp32 accumulation on tensor cores (WMMA, sm_80+); each output element is computed
// by one tile in a fixed k order, so results are deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::kernels::cuda {

// A bf16 operand by strides (elements): element (i, j) of the product's view is
// ptr[i * row_stride + j * col_stride + e * expert_stride]. A transpose is swapped strides.
struct StridedBf16 {
  const __nv_bfloat16* ptr = nullptr;
  int64_t row_stride = 0, col_stride = 0;
  int64_t expert_stride = 0;  // between experts' weights; 0 for buffers indexed by sorted row
};

// Sorted rows grouped by expert, in device memory (moe_experts.cu's dispatch writes them): expert e
// owns rows [offsets[e], offsets[e+1]) and kGroupedTileRows-row tiles from tile_offsets[e].
struct ExpertGroups {
  const int64_t* offsets = nullptr;       // (E + 1)
  const int32_t* tile_offsets = nullptr;  // (E + 1), tile_offsets[E] the tiles in all
  int32_t E = 0;
  int64_t rows = 0;  // offsets[E], known on the host (tokens x experts per token)
};

inline constexpr int64_t kGroupedTileRows = 64;

// D (rows, N) = A (rows, K) op(B_e) (K, N) for the rows of each expert e, fp32 accumulation; D
// row-major (leading dimension ldd), fp32 or bf16, overwritten or accumulated (fp32 only).
// A.expert_stride must be 0.
void grouped_gemm_rows(const ExpertGroups& g, int64_t N, int64_t K, const StridedBf16& A,
                       const StridedBf16& B, void* D, int64_t ldd, bool out_f32, bool accumulate,
                       cudaStream_t stream);

// D_e (M, N) += op(A) (M, rows_e) op(B) (rows_e, N) for every expert e: the reduction over that
// expert's rows (weight gradients). D_e = D + e * d_expert_stride, fp32, leading dimension ldd;
// experts without rows stay untouched.
void grouped_gemm_reduce(const ExpertGroups& g, int64_t M, int64_t N, const StridedBf16& A,
                         const StridedBf16& B, float* D, int64_t d_expert_stride, int64_t ldd,
                         cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
