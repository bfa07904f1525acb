// bf16 <-> fp32 bulk conversion entry points: the active level's kernel on the calling thread or
// tiled over a ThreadPool (element-wise, so any tiling gives the same bits).
#include "kernels/cpu/optim/bf16_convert.h"

#include "kernels/cpu/optim/dispatch_util.h"
#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels {
namespace {

void to_bf16(ThreadPool* pool, const float* in, bf16_bits* out, int64_t n, int64_t tile_numel) {
  detail::check_range(0, n);
  SLIDEDP_CHECK((in != nullptr && out != nullptr) || n == 0, "null conversion buffer");
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, 0, n, tile_numel,
                    [&](int64_t b, int64_t e) { t.f32_to_bf16(in + b, out + b, e - b); });
}

void to_f32(ThreadPool* pool, const bf16_bits* in, float* out, int64_t n, int64_t tile_numel) {
  detail::check_range(0, n);
  SLIDEDP_CHECK((in != nullptr && out != nullptr) || n == 0, "null conversion buffer");
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, 0, n, tile_numel,
                    [&](int64_t b, int64_t e) { t.bf16_to_f32(in + b, out + b, e - b); });
}

}  // namespace

void f32_to_split(const float* in, bf16_bits* mirror, uint16_t* remainder, int64_t n) {
  detail::check_range(0, n);
  SLIDEDP_CHECK((in != nullptr && mirror != nullptr) || n == 0, "null conversion buffer");
  detail::active_kernel_table().f32_to_split(in, mirror, remainder, n);
}

void f32_to_bf16(const float* in, bf16_bits* out, int64_t n) { to_bf16(nullptr, in, out, n, kTileNumel); }
void bf16_to_f32(const bf16_bits* in, float* out, int64_t n) { to_f32(nullptr, in, out, n, kTileNumel); }
void f32_to_bf16(ThreadPool& pool, const float* in, bf16_bits* out, int64_t n, int64_t tile_numel) {
  to_bf16(&pool, in, out, n, tile_numel);
}
void bf16_to_f32(ThreadPool& pool, const bf16_bits* in, float* out, int64_t n, int64_t tile_numel) {
  to_f32(&pool, in, out, n, tile_numel);
}

}  // namespace slidedp::kernels
