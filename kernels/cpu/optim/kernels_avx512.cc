// AVX-512 level without AVX512-BF16 instructions (fp32 -> bf16 by integer rounding): used on
// AVX-512 CPUs that lack AVX512_BF16 (Skylake-SP, Cascade Lake, Ice Lake) and, forced, in tests.
// Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -ffp-contract=off.
#include "kernels/cpu/optim/avx512_traits.h"
#include "kernels/cpu/optim/simd_impl.h"

namespace slidedp::kernels::detail {
namespace {
constexpr KernelTable kTable = make_kernel_table<Avx512>();
}  // namespace

const KernelTable& avx512_kernel_table() { return kTable; }

}  // namespace slidedp::kernels::detail
