// The gated delta rule (kernels/cpu/transformer/gated_delta_rule.h) on the GPU: Qwen3.6's Gated
// DeltaNet token mixer. One block per (sequence, value head) runs the tokens in order; each thread
// owns a column of the head's state S (dk x dv, in shared memory), and the column recurrence of
// kernels/cuda/device_math.h makes the columns independent, so a token costs 3 dk multiply-adds per
// thread and one barrier. The state restarts at every document start of a packed sequence (position
// 0 in `positions`), as the CPU's segments do. fp32 inputs and outputs: the recurrence is where
// rounding would accumulate over thousands of tokens.
//
// Backward runs the tokens in reverse. It needs each token's entry state: the forward's states every
// kDeltaChunk tokens are kept in the workspace (as the CPU keeps its chunk-entry states), each chunk
// re-runs from its checkpoint leaving sub-checkpoints every kDeltaSubChunk tokens in the block's
// scratch, and each token re-runs at most kDeltaSubChunk - 1 tokens from its sub-checkpoint: about
// three forward passes of work for the exact gradient, at the memory of one state per 64 tokens.
// The gradients of q and k are summed over the value heads sharing a key head in head order
// afterwards, so everything is deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scratch_sizes.h"  // kDeltaChunk, kDeltaSubChunk, delta_rule_backward_workspace_bytes

namespace slidedp::kernels::cuda {

struct DeltaRuleShape {
  int64_t B = 0, T = 0;                // sequences, tokens per sequence
  int64_t nk = 0, nv = 0;              // key heads, value heads (nv a multiple of nk)
  int64_t dk = 0, dv = 0;              // head dims: dk <= 256, dv <= 1024
  const int32_t* positions = nullptr;  // (B, T) document positions (0 starts a document), or null
};

// Layouts (row-major, N = B*T): q, k (N, nk, dk); v, o (N, nv, dv); g, b (N, nv); as the CPU's.
void delta_rule_forward(const DeltaRuleShape& s, const float* q, const float* k, const float* v,
                        const float* g, const float* b, float* o, cudaStream_t stream);

// workspace: delta_rule_backward_workspace_bytes(B, T, nv, dk, dv) bytes. From do_: dq, dk, dv, dg, db
// overwritten.
void delta_rule_backward(const DeltaRuleShape& s, const float* q, const float* k, const float* v,
                         const float* g, const float* b, const float* do_, float* dq, float* dk, float* dv,
                         float* dg, float* db, void* workspace, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
