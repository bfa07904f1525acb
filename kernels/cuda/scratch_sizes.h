// Scratch sizes of the GPU kernels that take a workspace, and the constants they depend on. Plain C++
// (no CUDA), shared by the kernels (.cu), their carve sequences (unit_scratch.h) and the memory account.
#pragma once

#include <cstdint>

namespace slidedp::kernels::cuda {

// cuBLASLt workspace per GEMM call: 32 MiB is what NVIDIA recommends for Hopper.
inline constexpr int64_t kGemmWorkspaceBytes = int64_t{32} << 20;
// Rows one block reduces into a partial of a norm-weight gradient / of a column sum (the kernels' grids).
inline constexpr int64_t kRmsnormRowsPerSegment = 256;
inline constexpr int64_t kColsumRowsPerSegment = 256;

// rmsnorm_backward's weight gradient: one fp32 partial row per segment of rows.
inline int64_t rmsnorm_backward_workspace_bytes(int64_t N, int64_t C) {
  return (N + kRmsnormRowsPerSegment - 1) / kRmsnormRowsPerSegment * C * static_cast<int64_t>(sizeof(float));
}
// colsum_accumulate (bias gradients): one fp32 partial row per segment.
inline int64_t colsum_workspace_bytes(int64_t N, int64_t C) {
  return (N + kColsumRowsPerSegment - 1) / kColsumRowsPerSegment * C * static_cast<int64_t>(sizeof(float));
}
// attention_backward: D (B, H, T) fp32 = rowsum(dout * out).
inline int64_t attention_backward_workspace_bytes(int64_t B, int64_t H, int64_t T) { return B * H * T * 4; }


// The gated delta rule's backward (gated_delta_rule.h): the checkpoints every kDeltaChunk tokens of
// every (sequence, value head), each block's sub-checkpoints and state gradient, and each value
// head's dq and dk before the sum over the heads sharing a key head.
inline constexpr int64_t kDeltaChunk = 64;
inline constexpr int64_t kDeltaSubChunk = 8;
inline int64_t delta_rule_backward_workspace_bytes(int64_t B, int64_t T, int64_t nv, int64_t dk, int64_t dv) {
  const int64_t state = dk * dv, blocks = B * nv;
  const int64_t checkpoints = blocks * ((T + kDeltaChunk - 1) / kDeltaChunk) * state;
  const int64_t scratch = blocks * (kDeltaChunk / kDeltaSubChunk + 1) * dk * (dv + 1);  // rows padded by one
  const int64_t per_head = 2 * B * T * nv * dk;
  return (checkpoints + scratch + per_head) * static_cast<int64_t>(sizeof(float));
}

// The Gated DeltaNet's gated-norm backward (deltanet_ops.h): each row's weight-gradient terms, then
// their column sum's partials.
inline int64_t deltanet_gated_norm_workspace_bytes(int64_t N, int64_t nv, int64_t dv) {
  return N * nv * dv * static_cast<int64_t>(sizeof(float)) + colsum_workspace_bytes(N * nv, dv);
}

}  // namespace slidedp::kernels::cuda
