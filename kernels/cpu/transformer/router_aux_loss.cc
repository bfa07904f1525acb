// The router's load-balancing loss; see router_aux_loss.h. Sums run in a fixed order (tokens, then
// experts) on the calling thread: the statistics are O(tokens x E) per layer, beside the experts'
// O(tokens x K x C x Ie) GEMMs.
#include "kernels/cpu/transformer/router_aux_loss.h"

#include "common/error.h"

namespace slidedp::kernels {

int64_t router_stats_bytes(int64_t B, int64_t E) { return 2 * B * E * static_cast<int64_t>(sizeof(double)); }

RouterStats router_stats_view(void* buffer, int64_t B, int64_t E, int64_t rows, double weight) {
  SLIDEDP_CHECK(buffer != nullptr && rows > 0, "router statistics need a buffer and rows");
  RouterStats st;
  st.counts = static_cast<double*>(buffer);
  st.prob_sums = st.counts + B * E;
  st.rows = rows;
  st.weight = weight;
  return st;
}

template <typename Real>
void router_stats_add(const RouterStats& st, const Real* probs, const int32_t* idx, int64_t B, int64_t T,
                      int64_t E, int64_t K) {
  for (int64_t b = 0; b < B; ++b) {
    double* c = st.counts + b * E;
    double* s = st.prob_sums + b * E;
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      for (int64_t k = 0; k < K; ++k) c[idx[t * K + k]] += 1.0;
      for (int64_t e = 0; e < E; ++e) s[e] += static_cast<double>(probs[t * E + e]);
    }
  }
}

double router_aux_loss_sum(const RouterStats& st, int64_t B, int64_t E) {
  const double R = static_cast<double>(st.rows);
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += st.counts[b * E + e] * st.prob_sums[b * E + e];
    total += static_cast<double>(E) * dot / (R * R);
  }
  return total;
}

template <typename Real>
void router_aux_backward(Real* dlogits, const Real* probs, const RouterStats& st, int64_t B, int64_t T, int64_t E) {
  if (st.weight == 0) return;
  const double R = static_cast<double>(st.rows);
  const double scale = st.weight * static_cast<double>(E) / (R * R);
  for (int64_t b = 0; b < B; ++b) {
    const double* c = st.counts + b * E;
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      const Real* p = probs + t * E;
      double mean = 0;  // sum_j p_j g_j
      for (int64_t e = 0; e < E; ++e) mean += static_cast<double>(p[e]) * scale * c[e];
      Real* d = dlogits + t * E;
      for (int64_t e = 0; e < E; ++e) d[e] += static_cast<Real>(static_cast<double>(p[e]) * (scale * c[e] - mean));
    }
  }
}

#define SLIDEDP_INSTANTIATE(Real)                                                                             \
  template void router_stats_add<Real>(const RouterStats&, const Real*, const int32_t*, int64_t, int64_t,     \
                                       int64_t, int64_t);                                                     \
  template void router_aux_backward<Real>(Real*, const Real*, const RouterStats&, int64_t, int64_t, int64_t);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
