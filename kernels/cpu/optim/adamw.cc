// AdamW entry points: validate the hyper-parameters, derive the fp32 constants once per call (in
// double, like torch's Python-float arithmetic, then rounded), and run the active level's kernel
// on the calling thread or tiled over a ThreadPool.
#include "kernels/cpu/optim/adamw.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "kernels/cpu/optim/dispatch_util.h"
#include "kernels/cpu/optim/kernel_table.h"
#include "kernels/cpu/optim/moment_codes.h"

namespace slidedp::kernels {
namespace {

void require(bool ok, const char* field, const std::string& expected, double value) {
  if (!ok) {
    throw InputError("adamw", std::string(field) + " must be " + expected + ", got " + std::to_string(value));
  }
}

}  // namespace

AdamwConstants adamw_constants(const AdamwHyper& h) {
  validate(h);
  const double steps = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, steps);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, steps);
  AdamwConstants c{};
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  c.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  c.grad_scale = static_cast<float>(h.grad_scale);
  c.clip_coef = static_cast<float>(h.clip_coef);
  return c;
}

namespace {

void check_state(const AdamwState& s, int64_t begin, int64_t end, int64_t tile_numel) {
  detail::check_range(begin, end);
  SLIDEDP_CHECK(!s.exp_avg_q8 || tile_numel % kQ8Block == 0, "8-bit AdamW moments: tiles of whole blocks");
  if (end > begin) {
    const int forms = (s.exp_avg != nullptr && s.exp_avg_sq != nullptr) +
                      (s.exp_avg_bf16 != nullptr && s.exp_avg_sq_bf16 != nullptr) +
                      (s.exp_avg_q8 != nullptr && s.exp_avg_sq_q8 != nullptr && s.exp_avg_scale != nullptr &&
                       s.exp_avg_sq_scale != nullptr);
    SLIDEDP_CHECK(forms == 1, "AdamW moments: both fp32, both bf16 or both 8-bit with their scales");
    SLIDEDP_CHECK(!s.exp_avg_q8 || (begin >= s.q8_origin && (begin - s.q8_origin) % kQ8Block == 0),
                  "8-bit AdamW moments: a range starts on a block boundary");
    SLIDEDP_CHECK(s.remainder ? s.param == nullptr && s.param_bf16 != nullptr : s.param != nullptr,
                  "AdamW master: fp32, or split into a mirror and a remainder");
  }
}

// pool == nullptr: the range form on the calling thread.
template <class G>
void update(ThreadPool* pool, const AdamwState& s, const G* grad, const AdamwHyper& h, int64_t begin,
            int64_t end, int64_t tile_numel) {
  check_state(s, begin, end, tile_numel);
  const AdamwConstants c = adamw_constants(h);
  SLIDEDP_CHECK(grad != nullptr || end == begin, "null gradient");
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, begin, end, tile_numel, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<G, float>) {
      t.adamw_f32(s, grad, c, b, e);
    } else {
      t.adamw_bf16(s, grad, c, b, e);
    }
  });
}

template <class T>
void fused(ThreadPool* pool, const AdamwState& s, const GradSlots<T>& slots, const AdamwHyper& h,
           int64_t begin, int64_t end, int64_t tile_numel) {
  check_state(s, begin, end, tile_numel);
  const detail::SlotArgs<T> a = detail::slot_args(slots, begin, end);
  const AdamwConstants c = adamw_constants(h);
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, begin, end, tile_numel, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      t.reduce_adamw_f32(s, a, c, b, e);
    } else {
      t.reduce_adamw_bf16(s, a, c, b, e);
    }
  });
}

}  // namespace

void validate(const AdamwHyper& h) {
  require(std::isfinite(h.lr) && h.lr >= 0.0, "lr", "finite and >= 0", h.lr);
  require(h.beta1 >= 0.0 && h.beta1 < 1.0, "beta1", "in [0, 1)", h.beta1);
  require(h.beta2 >= 0.0 && h.beta2 < 1.0, "beta2", "in [0, 1)", h.beta2);
  require(std::isfinite(h.eps) && h.eps >= 0.0, "eps", "finite and >= 0", h.eps);
  require(std::isfinite(h.weight_decay) && h.weight_decay >= 0.0, "weight_decay", "finite and >= 0",
          h.weight_decay);
  require(h.step >= 1, "step", ">= 1 (1-based)", static_cast<double>(h.step));
  require(std::isfinite(h.grad_scale), "grad_scale", "finite", h.grad_scale);
  require(std::isfinite(h.clip_coef) && h.clip_coef >= 0.0, "clip_coef", "finite and >= 0", h.clip_coef);
}

double adamw_clip_coef(double grad_sum_squares, double max_norm) {
  if (!std::isfinite(max_norm) || max_norm <= 0.0) {
    throw InputError("adamw", "max_norm must be finite and > 0, got " + std::to_string(max_norm));
  }
  if (!std::isfinite(grad_sum_squares)) {
    throw NumericError("adamw: gradient norm is not finite (sum of squares " +
                       std::to_string(grad_sum_squares) + "); clipping cannot repair it");
  }
  const double coef = max_norm / (std::sqrt(grad_sum_squares) + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

void adamw_update(const AdamwState& state, const float* grad, const AdamwHyper& hyper, int64_t begin,
                  int64_t end) {
  update(nullptr, state, grad, hyper, begin, end, kTileNumel);
}
void adamw_update(const AdamwState& state, const bf16_bits* grad, const AdamwHyper& hyper, int64_t begin,
                  int64_t end) {
  update(nullptr, state, grad, hyper, begin, end, kTileNumel);
}
void reduce_adamw_update(const AdamwState& state, const GradSlots<float>& slots, const AdamwHyper& hyper,
                         int64_t begin, int64_t end) {
  fused(nullptr, state, slots, hyper, begin, end, kTileNumel);
}
void reduce_adamw_update(const AdamwState& state, const GradSlots<bf16_bits>& slots, const AdamwHyper& hyper,
                         int64_t begin, int64_t end) {
  fused(nullptr, state, slots, hyper, begin, end, kTileNumel);
}

void adamw_update(ThreadPool& pool, const AdamwState& state, const float* grad, const AdamwHyper& hyper,
                  int64_t begin, int64_t end, int64_t tile_numel) {
  update(&pool, state, grad, hyper, begin, end, tile_numel);
}
void adamw_update(ThreadPool& pool, const AdamwState& state, const bf16_bits* grad, const AdamwHyper& hyper,
                  int64_t begin, int64_t end, int64_t tile_numel) {
  update(&pool, state, grad, hyper, begin, end, tile_numel);
}
void reduce_adamw_update(ThreadPool& pool, const AdamwState& state, const GradSlots<float>& slots,
                         const AdamwHyper& hyper, int64_t begin, int64_t end, int64_t tile_numel) {
  fused(&pool, state, slots, hyper, begin, end, tile_numel);
}
void reduce_adamw_update(ThreadPool& pool, const AdamwState& state, const GradSlots<bf16_bits>& slots,
                         const AdamwHyper& hyper, int64_t begin, int64_t end, int64_t tile_numel) {
  fused(&pool, state, slots, hyper, begin, end, tile_numel);
}

}  // namespace slidedp::kernels
