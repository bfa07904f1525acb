// Fused chunked linear cross-entropy; see cross_entropy.h.
#include "kernels/cpu/transformer/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cpu/transformer/blas.h"

namespace slidedp::kernels {
namespace {

template <typename Real>
struct Scratch {
  int64_t* rows;  // (chunk) token index of each chunk row
  Real* hc;       // (chunk, C) gathered hidden states
  Real* logits;   // (chunk, V) logits, then dlogits in place
  Real* dhc;      // (chunk, C) hidden-state gradient of the chunk (with_grad only)
};

int64_t rows_per_chunk(int64_t N, int64_t chunk_tokens) {
  return std::max<int64_t>(1, std::min(chunk_tokens, N));
}

template <typename Real>
Scratch<Real> carve(Arena& a, int64_t N, int64_t C, int64_t V, int64_t chunk_tokens, bool with_grad) {
  const int64_t chunk = rows_per_chunk(N, chunk_tokens);
  Scratch<Real> s;
  s.rows = a.take<int64_t>(chunk);
  s.hc = a.take<Real>(chunk * C);
  s.logits = a.take<Real>(chunk * V);
  s.dhc = with_grad ? a.take<Real>(chunk * C) : nullptr;
  return s;
}

}  // namespace

int64_t count_unmasked_targets(const int32_t* targets, int64_t N, int64_t V) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    if (targets[n] < 0 || targets[n] >= V)
      throw InputError("targets: position " + std::to_string(n), "target " + std::to_string(targets[n]) +
                                                                     " is outside [0, " + std::to_string(V) +
                                                                     ") and is not the ignore index -100");
    ++count;
  }
  return count;
}

template <typename Real>
int64_t fused_cross_entropy_workspace_bytes(int64_t N, int64_t C, int64_t V, int64_t chunk_tokens,
                                            bool with_grad) {
  Arena a;
  carve<Real>(a, N, C, V, chunk_tokens, with_grad);
  return a.high_water_bytes();
}

template <typename Real>
LossResult fused_linear_cross_entropy(const Real* h, const Real* w, const int32_t* targets, int64_t N,
                                      int64_t C, int64_t V, int64_t chunk_tokens, double grad_scale, Real* dh,
                                      Real* dw, Workspace ws, double softcap) {
  SLIDEDP_CHECK(chunk_tokens > 0, "loss_chunk_tokens must be positive");
  SLIDEDP_CHECK(softcap >= 0 && std::isfinite(softcap), "the logit softcap must be finite and >= 0");
  const Real cap = static_cast<Real>(softcap);
  const bool with_grad = dh != nullptr;
  SLIDEDP_CHECK(!with_grad || dw != nullptr, "dw is required with dh");
  Arena arena(ws);
  const Scratch<Real> s = carve<Real>(arena, N, C, V, chunk_tokens, with_grad);
  const int64_t chunk = rows_per_chunk(N, chunk_tokens);
  count_unmasked_targets(targets, N, V);  // validates before any output is touched
  if (with_grad) std::fill(dh, dh + N * C, Real(0));

  LossResult result;
  const Real scale = static_cast<Real>(grad_scale);
  int64_t next = 0;  // next token to look at
  while (true) {
    // gather the next chunk of unmasked tokens, in token order
    int64_t nc = 0;
    for (; next < N && nc < chunk; ++next) {
      if (targets[next] == kIgnoreIndex) continue;
      s.rows[nc] = next;
      std::copy(h + next * C, h + (next + 1) * C, s.hc + nc * C);
      ++nc;
    }
    if (nc == 0) break;

    // logits (nc, V) = hc (nc, C) W^T
    gemm<Real>(false, true, nc, V, C, Real(1), s.hc, C, w, C, Real(0), s.logits, V);
    for (int64_t r = 0; r < nc; ++r) {
      Real* row = s.logits + r * V;  // (V)
      if (softcap > 0)
        for (int64_t c = 0; c < V; ++c) row[c] = cap * std::tanh(row[c] / cap);
      const int32_t target = targets[s.rows[r]];
      const Real target_logit = row[target];
      const Real mx = *std::max_element(row, row + V);
      // one exp per logit: e = exp(logit - max) is summed (in double) and, with gradients, kept in
      // place so that softmax = e / sum needs no second exp
      double sum = 0.0;
      if (with_grad) {
        for (int64_t c = 0; c < V; ++c) {
          row[c] = std::exp(row[c] - mx);
          sum += row[c];
        }
      } else {
        for (int64_t c = 0; c < V; ++c) sum += std::exp(row[c] - mx);
      }
      const double lse = static_cast<double>(mx) + std::log(sum);
      result.loss_sum += lse - static_cast<double>(target_logit);
      ++result.num_tokens;
      if (with_grad && softcap > 0) {
        // d/dz of cap tanh(z / cap) is 1 - tanh^2 = 1 - (logit / cap)^2, and the capped logit is
        // log(e) + max: capped logits lie in [-cap, cap], so e >= exp(-2 cap) never underflows for
        // the caps in use (30: e >= 8.8e-27) and no second (chunk x V) buffer is needed.
        const Real factor = static_cast<Real>(grad_scale / sum);
        for (int64_t c = 0; c < V; ++c) {
          const Real t = (std::log(row[c]) + mx) / cap;
          row[c] = (row[c] * factor - (c == target ? scale : Real(0))) * (Real(1) - t * t);
        }
      } else if (with_grad) {  // dlogits = grad_scale * (softmax - onehot), in place
        const Real factor = static_cast<Real>(grad_scale / sum);
        for (int64_t c = 0; c < V; ++c) row[c] *= factor;
        row[target] -= scale;
      }
    }
    if (!with_grad) continue;
    // dhc (nc, C) = dlogits (nc, V) W (V, C), scattered back to the token rows
    gemm<Real>(false, false, nc, C, V, Real(1), s.logits, V, w, C, Real(0), s.dhc, C);
    for (int64_t r = 0; r < nc; ++r) std::copy(s.dhc + r * C, s.dhc + (r + 1) * C, dh + s.rows[r] * C);
    // dW (V, C) += dlogits^T (V, nc) hc (nc, C)
    gemm<Real>(true, false, V, C, nc, Real(1), s.logits, V, s.hc, C, Real(1), dw, C);
  }
  return result;
}

template int64_t fused_cross_entropy_workspace_bytes<float>(int64_t, int64_t, int64_t, int64_t, bool);
template int64_t fused_cross_entropy_workspace_bytes<double>(int64_t, int64_t, int64_t, int64_t, bool);
template LossResult fused_linear_cross_entropy<float>(const float*, const float*, const int32_t*, int64_t,
                                                      int64_t, int64_t, int64_t, double, float*, float*,
                                                      Workspace, double);
template LossResult fused_linear_cross_entropy<double>(const double*, const double*, const int32_t*, int64_t,
                                                       int64_t, int64_t, int64_t, double, double*, double*,
                                                       Workspace, double);

}  // namespace slidedp::kernels
