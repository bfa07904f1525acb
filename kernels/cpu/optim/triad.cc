// STREAM-like triad entry points (the bandwidth reference of the optimizer benchmarks).
#include "kernels/cpu/optim/triad.h"

#include "kernels/cpu/optim/dispatch_util.h"
#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels {
namespace {

void triad(ThreadPool* pool, float* a, const float* b, const float* c, float q, int64_t n,
           int64_t tile_numel) {
  detail::check_range(0, n);
  SLIDEDP_CHECK((a != nullptr && b != nullptr && c != nullptr) || n == 0, "null triad buffer");
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, 0, n, tile_numel,
                    [&](int64_t lo, int64_t hi) { t.triad(a + lo, b + lo, c + lo, q, hi - lo); });
}

}  // namespace

void stream_triad(float* a, const float* b, const float* c, float q, int64_t n) {
  triad(nullptr, a, b, c, q, n, kTileNumel);
}
void stream_triad(ThreadPool& pool, float* a, const float* b, const float* c, float q, int64_t n,
                  int64_t tile_numel) {
  triad(&pool, a, b, c, q, n, tile_numel);
}

}  // namespace slidedp::kernels
