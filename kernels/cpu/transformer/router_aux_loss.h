// The optional load-balancing loss of a mixture-of-experts router (Switch Transformer's, in the form
// of transformers' load_balancing_loss_func, which pools every MoE layer's router rows):
//
//   aux = E * sum_e f_e P_e,   f_e = c_e / R,  P_e = s_e / R
//
// c_e the top-k assignments to expert e and s_e the sum of its softmax probability over the R pooled
// rows (MoE layers x tokens). SlideDP pools per SEQUENCE, over every MoE layer and the sequence's T
// tokens, and the training loss adds coefficient x the mean of aux over the step's sequences: that
// is the reference's number for a micro-batch of one sequence, and unlike a pool per micro-batch it
// does not depend on how the plan splits the step over ranks and micro-batches (every plan trains
// the same objective; docs/TRANSFORMER_MATH.md).
//
// Each MoE layer's forward adds its rows to (c, s) of their sequence; after every layer's forward of
// the micro-batch, backward adds the loss's gradient to the router logits. The counts are not
// differentiable (top-k), so dL/dp[t,e] = weight * E * c_e / R^2 for the tokens of a sequence, and
// through the softmax dlogit[t,e] += p[t,e] (g_e - sum_j p[t,j] g_j).
#pragma once

#include <cstdint>

namespace slidedp::kernels {

struct RouterStats {
  double* counts = nullptr;     // (B, E) top-k assignments of each sequence, over every MoE layer
  double* prob_sums = nullptr;  // (B, E) their softmax probabilities, summed likewise
  int64_t rows = 0;             // R: MoE layers x T, the rows pooled per sequence
  double weight = 0;            // d loss / d aux of each sequence (0: statistics only, no gradient)
};

// Bytes of the statistics of B sequences over E experts: counts then probability sums.
int64_t router_stats_bytes(int64_t B, int64_t E);
// The statistics laid out in a zeroed buffer of router_stats_bytes(B, E) bytes.
RouterStats router_stats_view(void* buffer, int64_t B, int64_t E, int64_t rows, double weight);

// Adds one MoE layer's rows: probs (B*T, E), idx (B*T, K) as router_topk_forward writes them.
template <typename Real>
void router_stats_add(const RouterStats& st, const Real* probs, const int32_t* idx, int64_t B, int64_t T,
                      int64_t E, int64_t K);

// sum over the B sequences of aux (unweighted), from complete statistics.
double router_aux_loss_sum(const RouterStats& st, int64_t B, int64_t E);

// dlogits (B*T, E) += the gradient of weight * sum_b aux_b through one layer's softmax probs.
template <typename Real>
void router_aux_backward(Real* dlogits, const Real* probs, const RouterStats& st, int64_t B, int64_t T, int64_t E);

}  // namespace slidedp::kernels
