// Embedding gather / scatter-add; see embedding.h.
#include "kernels/cpu/transformer/embedding.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace slidedp::kernels {

void check_token_ids(const int32_t* tokens, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V)
      throw InputError(
          "token ids: position " + std::to_string(n),
          "id " + std::to_string(tokens[n]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

template <typename Real>
void embedding_forward(Real* x, const int32_t* tokens, const Real* w, int64_t N, int64_t C, int64_t V) {
  check_token_ids(tokens, N, V);
  for (int64_t n = 0; n < N; ++n) {
    const Real* row = w + static_cast<int64_t>(tokens[n]) * C;  // (C)
    std::copy(row, row + C, x + n * C);
  }
}

template <typename Real>
void embedding_backward(Real* dw, const int32_t* tokens, const Real* dx, int64_t N, int64_t C, int64_t V,
                        double scale) {
  check_token_ids(tokens, N, V);
  const Real s = static_cast<Real>(scale);
  for (int64_t n = 0; n < N; ++n) {
    Real* row = dw + static_cast<int64_t>(tokens[n]) * C;  // (C)
    const Real* g = dx + n * C;                            // (C)
    if (scale == 1.0) {
      for (int64_t c = 0; c < C; ++c) row[c] += g[c];
    } else {
      for (int64_t c = 0; c < C; ++c) row[c] += s * g[c];
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t);
template void embedding_backward<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t, double);
template void embedding_backward<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t,
                                          double);

}  // namespace slidedp::kernels
