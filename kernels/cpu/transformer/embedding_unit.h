// Unit 0: token embedding. Forward gathers rows of model.embed_tokens.weight; backward scatter-adds
// the gradient of the hidden state into the flat gradient buffer (accumulating). Nothing is saved:
// backward needs only the token ids, which the executor holds for the step.
// Tied embeddings: the head also reads this weight and accumulates into this gradient (see
// head_unit.h); both add into the same buffer, so the embedding's reduction must wait for both.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

// x (B, T, C) = embed_tokens[tokens (B, T)]. Throws InputError for an id outside [0, V).
template <typename Real>
void embedding_unit_forward(const EmbeddingSpec& spec, const Real* params, const int32_t* tokens, int64_t B,
                            int64_t T, Real* x);

// x (rows, C) *= the spec's row scale (Gemma 4's sqrt(C) in bf16; nothing when it is 1): the forward's
// last step, for callers that gather the rows themselves.
template <typename Real>
void scale_embedding_rows(const EmbeddingSpec& spec, Real* x, int64_t rows);

// grads (flat) += scatter of dx (B, T, C) to the rows of tokens (times the row scale).
template <typename Real>
void embedding_unit_backward(const EmbeddingSpec& spec, const int32_t* tokens, const Real* dx, Real* grads,
                             int64_t B, int64_t T);

}  // namespace slidedp::kernels
