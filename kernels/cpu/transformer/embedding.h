// Token embedding lookup and its backward, a scatter-add: a token that occurs k times in the batch
// adds k rows of gradient to its embedding row. Token ids come from data files, so an id outside
// [0, V) is bad input (InputError), not an internal bug.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// Throws InputError naming the first position whose id is outside [0, V).
void check_token_ids(const int32_t* tokens, int64_t N, int64_t V);

// x (N, C) = w (V, C)[tokens (N)].
template <typename Real>
void embedding_forward(Real* x, const int32_t* tokens, const Real* w, int64_t N, int64_t C, int64_t V);

// dw (V, C) += scale * scatter of dx (N, C) rows to rows tokens (N), in token order (scale: the
// forward's row scale, Gemma 4's sqrt(C)).
template <typename Real>
void embedding_backward(Real* dw, const int32_t* tokens, const Real* dx, int64_t N, int64_t C, int64_t V,
                        double scale = 1.0);

}  // namespace slidedp::kernels
