// Naive references of every transformer op: plain loops straight from the formulas, full (T x T)
// attention scores and full (N x V) logits, explicit Jacobians where that is the obvious way.
// Never optimized, never called by the units: the optimized ops are tested against these.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/gated_deltanet.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels::naive {

// out (N, OUT) = in (N, IN) w (OUT, IN)^T + bias (OUT or nullptr)
template <typename Real>
void linear_forward(Real* out, const Real* in, const Real* w, const Real* bias, int64_t N, int64_t IN,
                    int64_t OUT);
// din (N, IN) = dout w; dw (OUT, IN) += dout^T in; dbias += colsum(dout) (nullable)
template <typename Real>
void linear_backward(Real* din, Real* dw, Real* dbias, const Real* dout, const Real* in, const Real* w,
                     int64_t N, int64_t IN, int64_t OUT);

template <typename Real>
void rmsnorm_forward(Real* y, const Real* x, const Real* w, int64_t N, int64_t C, double eps);
// dx (N, C) = J^T dy with the full (C x C) Jacobian of each row; dw (C) += sum dy * xhat.
template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w, int64_t N, int64_t C,
                      double eps);

// x (B, T, nh, hd) rotated in place: angles t * inv_freq[i] from std::cos/sin per element.
template <typename Real>
void rope_forward(Real* x, const std::vector<double>& inv_freq, int64_t B, int64_t T, int64_t nh, int64_t hd);
template <typename Real>
void rope_backward(Real* dx, const std::vector<double>& inv_freq, int64_t B, int64_t T, int64_t nh,
                   int64_t hd);

template <typename Real>
void swiglu_forward(Real* m, const Real* g, const Real* u, int64_t n);
template <typename Real>
void swiglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n);

// Full-matrix causal GQA attention. q (B, T, H, hd), k, v (B, T, KV, hd), out (B, T, H, hd),
// lse (B, H, T) (nullable). Scores q.k x scale (0: 1/sqrt(hd)); window > 0: the query at t sees the
// keys t - window < j <= t.
template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, int64_t B,
                       int64_t T, int64_t H, int64_t KV, int64_t hd, double scale = 0, int64_t window = 0);
// dq, dk, dv overwritten.
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                        double scale = 0, int64_t window = 0);

// Full (N x V) logits, then loss and gradients of grad_scale * loss_sum (dh overwritten, dw +=).
// softcap > 0: logits = softcap * tanh(h W^T / softcap), its Jacobian applied explicitly.
template <typename Real>
LossResult cross_entropy(const Real* h, const Real* w, const int32_t* targets, int64_t N, int64_t C,
                         int64_t V, double grad_scale, Real* dh, Real* dw, double softcap = 0);

// Mixture-of-experts routing in fp64: softmax over E, the K largest probabilities (first index on
// ties, by a stable sort), renormalised. min_gap: the smallest distance between a token's K-th and
// (K+1)-th probability (how far the choice is from flipping; infinity when K == E).
struct Routing {
  std::vector<double> probs, w;
  std::vector<int32_t> idx;
  double min_gap = 0;
};
Routing route_topk(const std::vector<double>& logits, int64_t N, int64_t E, int64_t K);
// y (N, C) = sum_k w[t,k] down_e(act(gate_e z) * up_e z), e = idx[t,k], one token and slot at a time,
// with the experts packed as moe_experts.h says.
std::vector<double> moe_experts(const MoeSpec& s, const std::vector<double>& gate_up, const std::vector<double>& down,
                                const std::vector<double>& z, const std::vector<int32_t>& idx,
                                const std::vector<double>& w, int64_t N);

// The gated delta rule token by token in fp64, as the reference's recurrent form writes it: per value
// head h (key head h / (nv / nk)) and segment, S = 0 at the segment's start, then for every token
// S <- exp(g) S;  delta = b (v - S^T k);  S <- S + k delta^T;  o = S^T q. Layouts as gated_delta_rule.h.
std::vector<double> gated_delta_rule(const DeltaRuleSpec& s, const std::vector<int64_t>& segment_offsets,
                                     const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& g,
                                     const std::vector<double>& b);

// The Gated DeltaNet mixer in fp64 as gated_deltanet.h writes it, step by step with plain loops and
// the token-by-token recurrence above. Weights as DeltaNetWeights (checkpoint layouts); h (N, C).
struct DeltaNetParams {
  std::vector<double> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv, dt_bias, A_log, norm, out_proj;
};
std::vector<double> gated_deltanet(const DeltaNetSpec& s, const std::vector<int64_t>& segment_offsets,
                                   const DeltaNetParams& w, const std::vector<double>& h);

// A whole decoder layer forward from the naive ops (no saved state), for the unit tests.
template <typename Real>
void decoder_forward(const DecoderSpec& spec, const Real* params, const Real* x, Real* y, int64_t B,
                     int64_t T);

}  // namespace slidedp::kernels::naive
