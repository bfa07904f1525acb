// AdamW's 8-bit moments (moment_codes.h) to and from fp32, outside the update: checkpoints hold the
// moments in fp32, and a run loads them into whichever form it holds. A span is cut into blocks of
// kQ8Block from its first element, the last one short. Decoding then encoding a span whose blocks are
// the ones the codes were made with gives back the same codes and scales, bit for bit.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

enum class Moment { kFirst, kSecond };  // m (signed code) or v (unsigned)

int64_t q8_blocks(int64_t n);  // scales of a span of n elements: ceil(n / kQ8Block)

// (n,) fp32 -> (n,) codes and (q8_blocks(n),) scales, as the update encodes a block.
void q8_encode(Moment which, const float* in, int64_t n, uint8_t* codes, float* scales);
// (n,) codes and their scales -> (n,) fp32, as the update decodes a block.
void q8_decode(Moment which, const uint8_t* codes, const float* scales, int64_t n, float* out);

}  // namespace slidedp::kernels
