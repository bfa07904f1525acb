// The embedding unit over the flat parameter / gradient buffers; see embedding_unit.h.
#include "kernels/cpu/transformer/embedding_unit.h"

#include "kernels/cpu/transformer/embedding.h"

namespace slidedp::kernels {

template <typename Real>
void embedding_unit_forward(const EmbeddingSpec& spec, const Real* params, const int32_t* tokens, int64_t B,
                            int64_t T, Real* x) {
  embedding_forward(x, tokens, params + spec.weight, B * T, spec.C, spec.V);
  scale_embedding_rows(spec, x, B * T);
}

template <typename Real>
void scale_embedding_rows(const EmbeddingSpec& spec, Real* x, int64_t rows) {
  if (spec.scale == 1.0) return;
  const Real scale = static_cast<Real>(spec.scale);
  for (int64_t i = 0; i < rows * spec.C; ++i) x[i] *= scale;
}

template <typename Real>
void embedding_unit_backward(const EmbeddingSpec& spec, const int32_t* tokens, const Real* dx, Real* grads,
                             int64_t B, int64_t T) {
  embedding_backward(grads + spec.weight, tokens, dx, B * T, spec.C, spec.V, spec.scale);
}

template void scale_embedding_rows<float>(const EmbeddingSpec&, float*, int64_t);
template void scale_embedding_rows<double>(const EmbeddingSpec&, double*, int64_t);
template void embedding_unit_forward<float>(const EmbeddingSpec&, const float*, const int32_t*, int64_t,
                                            int64_t, float*);
template void embedding_unit_forward<double>(const EmbeddingSpec&, const double*, const int32_t*, int64_t,
                                             int64_t, double*);
template void embedding_unit_backward<float>(const EmbeddingSpec&, const int32_t*, const float*, float*,
                                             int64_t, int64_t);
template void embedding_unit_backward<double>(const EmbeddingSpec&, const int32_t*, const double*, double*,
                                              int64_t, int64_t);

}  // namespace slidedp::kernels
