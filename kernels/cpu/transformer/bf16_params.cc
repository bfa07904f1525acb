// bf16 -> fp32/fp64 widening of flat parameter buffers; exact (bf16 is a truncated fp32).
#include "kernels/cpu/transformer/bf16_params.h"

namespace slidedp::kernels {

template <typename Real>
void widen_bf16(const bf16_bits* src, Real* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Real>(bf16_to_float(src[i]));
}

template void widen_bf16<float>(const bf16_bits*, float*, int64_t);
template void widen_bf16<double>(const bf16_bits*, double*, int64_t);

}  // namespace slidedp::kernels
