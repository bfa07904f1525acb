// Token embedding on the GPU, as kernels/cpu/transformer/embedding.h: forward gathers rows of the
// bf16 table; backward scatter-adds the gradient rows into the fp32 gradient table DETERMINISTICALLY:
// (token, position) pairs are radix-sorted (stable), then one block per distinct token adds its rows
// in position order -- the order of the CPU's loop, so with equal inputs the sums are bitwise equal.
// Token ids were validated on the host (the trainer checks the data's vocabulary); the kernels only
// guard memory: an id outside [0, V) gives a NaN row in forward and is skipped in backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::kernels::cuda {

// x (N, C) = w (V, C)[tokens (N)] * scale (EmbeddingSpec::scale: 1, or Gemma 4's bf16 sqrt(C)).
void embedding_forward(__nv_bfloat16* x, const int32_t* tokens, const __nv_bfloat16* w, int64_t N, int64_t C,
                       int64_t V, float scale, cudaStream_t stream);

// Scratch of embedding_backward (sort keys/values and the sort's temporary storage).
int64_t embedding_backward_workspace_bytes(int64_t N, int64_t V);
// dw (V, C) += scale * scatter of dx (N, C) to the rows tokens (N).
void embedding_backward(float* dw, const int32_t* tokens, const __nv_bfloat16* dx, int64_t N, int64_t C, int64_t V,
                        float scale, void* workspace, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
