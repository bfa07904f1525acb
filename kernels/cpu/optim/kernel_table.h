// Private to kernels/cpu/optim: the table of kernel entry points each SIMD level provides, the fp32
// constants of one AdamW call, and helpers shared by every level. Included by translation units
// compiled with different target flags, so everything defined here has internal linkage (an inline
// function with external linkage would be merged by the linker, and the AVX-512 copy could end up
// called on a CPU without AVX-512).
#pragma once

#include <cstdint>

#include "common/bf16.h"
#include "kernels/cpu/optim/adamw.h"

namespace slidedp::kernels::detail {

using kernels::AdamwConstants;  // adamw.h

// Slot pointers as the kernels see them: `num` pointers, each indexed by chunk element offset.
template <class T>
struct SlotArgs {
  const T* const* ptr;
  int num;
  float scale;
  const float* accum;  // nullable
};

// One level's kernels. Element-wise entries run over [begin, end) of chunk-indexed buffers (or
// [0, n) of plain pointers); *_block entries sum squares of at most kSumSquaresBlock elements
// with the 16-lane order of sum_squares.h.
struct KernelTable {
  void (*adamw_f32)(const AdamwState& s, const float* grad, const AdamwConstants& c, int64_t begin,
                    int64_t end);
  void (*adamw_bf16)(const AdamwState& s, const bf16_bits* grad, const AdamwConstants& c, int64_t begin,
                     int64_t end);
  void (*reduce_adamw_f32)(const AdamwState& s, const SlotArgs<float>& slots, const AdamwConstants& c,
                           int64_t begin, int64_t end);
  void (*reduce_adamw_bf16)(const AdamwState& s, const SlotArgs<bf16_bits>& slots, const AdamwConstants& c,
                            int64_t begin, int64_t end);
  void (*reduce_f32)(const SlotArgs<float>& slots, float* out, int64_t begin, int64_t end);
  void (*reduce_bf16)(const SlotArgs<bf16_bits>& slots, float* out, int64_t begin, int64_t end);
  double (*reduce_sum_squares_block_f32)(const SlotArgs<float>& slots, int64_t begin, int64_t end);
  double (*reduce_sum_squares_block_bf16)(const SlotArgs<bf16_bits>& slots, int64_t begin, int64_t end);
  double (*sum_squares_block_f32)(const float* x, int64_t n);
  double (*sum_squares_block_bf16)(const bf16_bits* x, int64_t n);
  void (*f32_to_bf16)(const float* in, bf16_bits* out, int64_t n);
  void (*bf16_to_f32)(const bf16_bits* in, float* out, int64_t n);
  void (*f32_to_split)(const float* in, bf16_bits* mirror, uint16_t* remainder,
                       int64_t n);  // remainder nullable
  void (*triad)(float* a, const float* b, const float* c, float q, int64_t n);
};

// Tables of each level. The SIMD ones exist only when built for x86-64 with a compiler that knows
// the flags (SLIDEDP_OPTIM_HAVE_*), and may only be called on CPUs that cpu_simd_support() allows.
const KernelTable& scalar_kernel_table();
#if SLIDEDP_OPTIM_HAVE_AVX2
const KernelTable& avx2_kernel_table();
#endif
#if SLIDEDP_OPTIM_HAVE_AVX512
const KernelTable& avx512_kernel_table();
#endif
#if SLIDEDP_OPTIM_HAVE_AVX512_BF16
const KernelTable& avx512_bf16_kernel_table();
#endif

// The table of the active level (simd_level.cc).
const KernelTable& active_kernel_table();

namespace {

// The fixed pairwise combination of the 16 double lanes of a sum-of-squares block.
[[maybe_unused]] double combine_16_lanes(double lanes[16]) {
  for (int width = 8; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
}

}  // namespace

}  // namespace slidedp::kernels::detail
