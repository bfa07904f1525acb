// The embedding unit over the flat parameter / gradient buffers; see embedding_unit.h.
#include "kernels/cpu/transformer/embedding_unit.h"

#include "kernels/cpu/transformer/embedding.h"

#include <vector>

namespace slidedp::kernels {

template <typename Real>
void embedding_unit_forward(const EmbeddingSpec& spec, const Real* params, const int32_t* tokens, int64_t B,
                            int64_t T, Real* x) {
  embedding_forward(x, tokens, params + spec.weight, B * T, spec.C, spec.V);
  if (spec.scale != 1.0) {
    const Real scale = static_cast<Real>(spec.scale);
    for (int64_t i = 0; i < B * T * spec.C; ++i) x[i] *= scale;
  }
}

template <typename Real>
void embedding_unit_backward(const EmbeddingSpec& spec, const int32_t* tokens, const Real* dx, Real* grads,
                             int64_t B, int64_t T) {
  if (spec.scale == 1.0) {
    embedding_backward(grads + spec.weight, tokens, dx, B * T, spec.C, spec.V);
    return;
  }
  std::vector<Real> scaled(dx, dx + B * T * spec.C);
  const Real scale = static_cast<Real>(spec.scale);
  for (Real& v : scaled) v *= scale;
  embedding_backward(grads + spec.weight, tokens, scaled.data(), B * T, spec.C, spec.V);
}

template void embedding_unit_forward<float>(const EmbeddingSpec&, const float*, const int32_t*, int64_t,
                                            int64_t, float*);
template void embedding_unit_forward<double>(const EmbeddingSpec&, const double*, const int32_t*, int64_t,
                                             int64_t, double*);
template void embedding_unit_backward<float>(const EmbeddingSpec&, const int32_t*, const float*, float*,
                                             int64_t, int64_t);
template void embedding_unit_backward<double>(const EmbeddingSpec&, const int32_t*, const double*, double*,
                                              int64_t, int64_t);

}  // namespace slidedp::kernels
