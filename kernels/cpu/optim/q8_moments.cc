// Blockwise conversion of 8-bit moments; see q8_moments.h. Built at the baseline ISA: the codes are
// integer operations and one fp32 multiply per element, the same bits at every level.
#include "kernels/cpu/optim/q8_moments.h"

#include <algorithm>

#include "kernels/cpu/optim/moment_codes.h"

namespace slidedp::kernels {

int64_t q8_blocks(int64_t n) { return (n + kQ8Block - 1) / kQ8Block; }

namespace {

// fn(code) with the code type of `which`.
template <class Fn>
void with_code(Moment which, Fn&& fn) {
  if (which == Moment::kFirst) return fn(FirstMomentCode{});
  fn(SecondMomentCode{});
}

}  // namespace

void q8_encode(Moment which, const float* in, int64_t n, uint8_t* codes, float* scales) {
  with_code(which, [&](auto code) {
    for (int64_t b = 0; b < n; b += kQ8Block)
      encode_q8_block<decltype(code)>(in + b, std::min(kQ8Block, n - b), codes + b, scales + b / kQ8Block);
  });
}

void q8_decode(Moment which, const uint8_t* codes, const float* scales, int64_t n, float* out) {
  with_code(which, [&](auto code) {
    for (int64_t b = 0; b < n; b += kQ8Block)
      decode_q8_block<decltype(code)>(codes + b, scales[b / kQ8Block], out + b, std::min(kQ8Block, n - b));
  });
}

}  // namespace slidedp::kernels
