// The per-chunk kernels of the fused linear cross-entropy on the GPU (the GEMMs around them are in
// units.cc). Same contract as kernels/cpu/transformer/cross_entropy.h: per-token losses are summed
// (in double) and unmasked tokens counted; dlogits = grad_scale * (softmax - onehot), so gradients
// are those of grad_scale * loss_sum. Unlike the CPU, a chunk is a run of CONSECUTIVE tokens and
// masked ones (target == -100) stay in it with a zero dlogits row: the device never compacts, and
// the host never reads targets. A target outside [0, V) that is not -100 gives a NaN loss (the
// trainer's non-finite check reports it); ids were validated on the host before upload.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::kernels::cuda {

// For the nc rows of one chunk: logits (nc, V) fp32 in, dlogits (nc, V) bf16 out, loss_rows (nc)
// double out (0 for a masked row), targets (nc). softcap > 0 (Gemma 4's final_logit_softcapping):
// the loss is that of softcap tanh(z / softcap), and dlogits carry its derivative; the logits are
// capped in place (they are the chunk's scratch).
void cross_entropy_chunk(float* logits, __nv_bfloat16* dlogits, double* loss_rows, const int32_t* targets,
                         int64_t nc, int64_t V, double grad_scale, double softcap, cudaStream_t stream);

// out[0] = sum of loss_rows (N) in a fixed order, out[1] = number of targets (N) != -100.
void cross_entropy_finish(double* out, const double* loss_rows, const int32_t* targets, int64_t N,
                          cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
