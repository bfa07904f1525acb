// Blockwise conversion of 8-bit moments; see q8_moments.h. Built at the baseline ISA: the codes are
// integer operations and one fp32 multiply per element, the same bits at every level.
#include "kernels/cpu/optim/q8_moments.h"

#include <algorithm>

#include "kernels/cpu/optim/moment_codes.h"

namespace slidedp::kernels {

int64_t q8_blocks(int64_t n) { return (n + kQ8Block - 1) / kQ8Block; }

void q8_encode(Moment which, const float* in, int64_t n, uint8_t* codes, float* scales) {
  for (int64_t b = 0; b < n; b += kQ8Block) {
    const int64_t len = std::min(kQ8Block, n - b);
    if (which == Moment::kFirst) {
      encode_q8_block<FirstMomentCode>(in + b, len, codes + b, scales + b / kQ8Block);
    } else {
      encode_q8_block<SecondMomentCode>(in + b, len, codes + b, scales + b / kQ8Block);
    }
  }
}

void q8_decode(Moment which, const uint8_t* codes, const float* scales, int64_t n, float* out) {
  for (int64_t b = 0; b < n; b += kQ8Block) {
    const int64_t len = std::min(kQ8Block, n - b);
    if (which == Moment::kFirst) {
      decode_q8_block<FirstMomentCode>(codes + b, scales[b / kQ8Block], out + b, len);
    } else {
      decode_q8_block<SecondMomentCode>(codes + b, scales[b / kQ8Block], out + b, len);
    }
  }
}

}  // namespace slidedp::kernels
