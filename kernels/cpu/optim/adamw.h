// AdamW on one chunk of host-resident fp32 state, with torch.optim.AdamW semantics (decoupled weight
// decay, bias correction, eps outside the sqrt), writing the bf16 delivery mirror in the same pass.
// Per element, in this exact order of fp32 operations (so every SIMD level gives the same bits):
//   g = (grad * grad_scale) * clip_coef
//   m = fma(m, beta1, g * (1 - beta1));        v = fma(v, beta2, (g * g) * (1 - beta2))
//   denom = fma(sqrt(v), 1 / sqrt(1 - beta2^step), eps)
//   p = fma(-lr / (1 - beta1^step), m / denom, p * (1 - lr * weight_decay));   mirror = bf16_rne(p)
// Bytes per parameter: bf16 grad: read 4 (p) + 2 (g) + 4 (m) + 4 (v), write 4 + 4 + 4 + 2 = 28;
// fp32 grad: 30; without the mirror subtract 2; a split master (below) reads mirror and remainder (2 + 2)
// for p and writes them for p and the mirror: 26 and 28. bf16 moments move 8 bytes fewer, 8-bit ones
// 12 fewer plus 16 per block of 256 (the scales read and written): a split master's 14.06 and 16.06.
#pragma once

#include <cstdint>
#include <span>

#include "common/bf16.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels {

// Hyper-parameters of one update call (any chunk, any order: nothing is carried between calls).
// Doubles, like torch's Python floats; the kernel derives fp32 constants once per call.
struct AdamwHyper {
  double lr = 1e-3;            // >= 0, finite
  double beta1 = 0.9;          // [0, 1)
  double beta2 = 0.999;        // [0, 1)
  double eps = 1e-8;           // >= 0, finite
  double weight_decay = 1e-2;  // >= 0, finite; decoupled: p *= 1 - lr * weight_decay
  int64_t step = 1;            // 1-based count of updates applied to this chunk including this one
  double grad_scale = 1.0;     // finite; multiplies the gradient (1/ranks, 1/tokens, loss-scale undo)
  double clip_coef = 1.0;      // finite, >= 0; global-norm clip multiplier (adamw_clip_coef)
};

// Throws InputError naming the field ("adamw: beta1 ...") when a value is outside its range above.
void validate(const AdamwHyper& hyper);

// The fp32 constants of one AdamW call, derived once (in double, then rounded) from a validated
// AdamwHyper; every kernel, the CUDA one included (kernels/cuda/adamw.h), uses exactly these.
struct AdamwConstants {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float decay;                      // 1 - lr * weight_decay
  float neg_step_size;              // -lr / (1 - beta1^step)
  float inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^step)
  float grad_scale;
  float clip_coef;
};
AdamwConstants adamw_constants(const AdamwHyper& hyper);  // validates

// torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (sqrt(sum_squares) + 1e-6)).
// sum_squares is the global sum of squared (already grad_scale-d) gradient elements; a NaN or Inf
// sum throws NumericError (torch's error_if_nonfinite) since clipping cannot repair it.
double adamw_clip_coef(double grad_sum_squares, double max_norm);

// One chunk's optimizer state. All buffers are host memory indexed by the same element offsets
// (the chunk's), so a [begin, end) range addresses the same parameters in each.
//
// The master either is `param` (fp32), or is split (common/split_master.h): `param` null, the master is
// the pair (param_bf16, remainder), read and written, so it costs 4 bytes per parameter with its mirror
// instead of 6 and the update moves 2 bytes fewer (reads 2 + 2, writes 2 + 2 instead of 4, 4 + 2).
// The split's mirror rounds exact ties toward zero (split_master.h says why); `mirror_ties_toward_zero`
// gives an fp32 master's mirror the same rule, so the two forms' runs can be compared bit for bit.
struct AdamwState {
  float* param = nullptr;           // (numel,) fp32 master weights, read and written; null when split
  float* exp_avg = nullptr;         // (numel,) fp32 first moment m, read and written
  float* exp_avg_sq = nullptr;      // (numel,) fp32 second moment v, read and written
  bf16_bits* param_bf16 = nullptr;  // (numel,) bf16 delivery mirror, written; nullptr: not written
  uint16_t* remainder = nullptr;    // (numel,) split master's low halves, read and written; null: fp32 master
  bool mirror_ties_toward_zero = false;  // an fp32 master's mirror rounds ties as the split's does
  // bf16 moments (lossy, opt-in): m and v held in bf16 (exp_avg and exp_avg_sq null), computed in fp32
  // and stored with stochastic rounding (stochastic_rounding.h): element i's noise is
  // rounding_noise(seed, moment_index_base + i), seed m_seed for m and v_seed for v.
  bf16_bits* exp_avg_bf16 = nullptr;
  bf16_bits* exp_avg_sq_bf16 = nullptr;
  uint32_t m_seed = 0, v_seed = 0;
  int64_t moment_index_base = 0;
  // 8-bit moments (lossy, opt-in; exp_avg and exp_avg_sq null): one byte per element each
  // (moment_codes.h) and one fp32 scale per block of kQ8Block elements, block j being elements
  // [q8_origin + j * kQ8Block, ...) with scales exp_avg_scale[j] and exp_avg_sq_scale[j]. Each block is
  // decoded, updated in fp32 and encoded with its new scales, so a call's range must start on a block
  // boundary and cover whole blocks but its last, which is short only where the caller's blocks are
  // (HostState cuts every unit into such segments).
  uint8_t* exp_avg_q8 = nullptr;
  uint8_t* exp_avg_sq_q8 = nullptr;
  float* exp_avg_scale = nullptr;
  float* exp_avg_sq_scale = nullptr;
  int64_t q8_origin = 0;
};

// Range forms: update elements [begin, end) on the calling thread. grad is the chunk's (numel,)
// gradient, indexed like the state. Buffers must not overlap each other.
void adamw_update(const AdamwState& state, const float* grad, const AdamwHyper& hyper, int64_t begin,
                  int64_t end);
void adamw_update(const AdamwState& state, const bf16_bits* grad, const AdamwHyper& hyper, int64_t begin,
                  int64_t end);

// Fused N-way reduction + AdamW: the reduced gradient is computed per element in registers and never
// written. Bitwise equal to reduce_grads(slots, tmp, begin, end) followed by
// adamw_update(state, tmp, hyper, begin, end).
void reduce_adamw_update(const AdamwState& state, const GradSlots<float>& slots, const AdamwHyper& hyper,
                         int64_t begin, int64_t end);
void reduce_adamw_update(const AdamwState& state, const GradSlots<bf16_bits>& slots, const AdamwHyper& hyper,
                         int64_t begin, int64_t end);

// Parallel forms: [begin, end) cut into tiles of tile_numel elements over `pool` (the caller works
// too). Same bits as the range form for any pool size and tile size.
void adamw_update(ThreadPool& pool, const AdamwState& state, const float* grad, const AdamwHyper& hyper,
                  int64_t begin, int64_t end, int64_t tile_numel = kTileNumel);
void adamw_update(ThreadPool& pool, const AdamwState& state, const bf16_bits* grad, const AdamwHyper& hyper,
                  int64_t begin, int64_t end, int64_t tile_numel = kTileNumel);
void reduce_adamw_update(ThreadPool& pool, const AdamwState& state, const GradSlots<float>& slots,
                         const AdamwHyper& hyper, int64_t begin, int64_t end,
                         int64_t tile_numel = kTileNumel);
void reduce_adamw_update(ThreadPool& pool, const AdamwState& state, const GradSlots<bf16_bits>& slots,
                         const AdamwHyper& hyper, int64_t begin, int64_t end,
                         int64_t tile_numel = kTileNumel);

}  // namespace slidedp::kernels
