// Parameters arrive as bf16 (the host's delivery mirror); the CPU math runs on their exact fp32 (or
// fp64) values. The backend widens a unit's flat buffer once per use into a compute-type scratch of
// the same layout (unit_working_set() reports its size as param_scratch_bytes).
#pragma once

#include <cstdint>

#include "common/bf16.h"

namespace slidedp::kernels {

// dst (n) = exact value of src (n). Padding elements (zeros) stay zeros.
template <typename Real>
void widen_bf16(const bf16_bits* src, Real* dst, int64_t n);

}  // namespace slidedp::kernels
