// AVX-512 level with AVX512-BF16 conversions (Cooper Lake, Sapphire Rapids, AMD Zen 4/5): the same
// kernels as kernels_avx512.cc, built with -mavx512bf16 added so avx512_traits.h takes its
// vcvtneps2bf16 path. Called only when cpu_simd_support().avx512_bf16.
#include "kernels/cpu/optim/avx512_traits.h"
#include "kernels/cpu/optim/simd_impl.h"

#if !defined(__AVX512BF16__)
#error "kernels_avx512_bf16.cc must be built with -mavx512bf16"
#endif

namespace slidedp::kernels::detail {
namespace {
constexpr KernelTable kTable = make_kernel_table<Avx512>();
}  // namespace

const KernelTable& avx512_bf16_kernel_table() { return kTable; }

}  // namespace slidedp::kernels::detail
