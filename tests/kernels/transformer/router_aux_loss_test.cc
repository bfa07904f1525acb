// The routers' load-balancing loss (kernels/cpu/transformer/router_aux_loss.h): the statistics and
// the loss against a naive loop written from transformers' load_balancing_loss_func (one-hot means
// over the pooled rows), its backward against finite differences of the loss through the softmax,
// and a whole tiny Gemma 4 and Qwen3.6 MoE model (model_forward_backward with the coefficient on)
// against finite differences of cross-entropy + coefficient x the mean load-balancing loss, for
// every parameter of every unit.
#include "kernels/cpu/transformer/router_aux_loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <variant>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "tests/kernels/transformer/test_util.h"
#include "tests/kernels/transformer/tiny_cards.h"

namespace slidedp::kernels::test {
namespace {

constexpr int64_t kB = 3, kT = 5, kE = 6, kK = 2, kLayers = 2;

struct Routing {
  std::vector<double> probs;  // (layers, B*T, E)
  std::vector<int32_t> idx;   // (layers, B*T, K)
  double min_gap = INFINITY;  // smallest gap between the K-th and (K+1)-th probability
};

Routing route(const std::vector<double>& logits) {
  const int64_t N = kB * kT;
  Routing r;
  r.probs.resize(static_cast<size_t>(kLayers * N * kE));
  r.idx.resize(static_cast<size_t>(kLayers * N * kK));
  std::vector<double> w(static_cast<size_t>(N * kK));
  for (int64_t l = 0; l < kLayers; ++l)
    router_topk_forward(r.probs.data() + l * N * kE, r.idx.data() + l * N * kK, w.data(), logits.data() + l * N * kE,
                        N, kE, kK);
  for (int64_t row = 0; row < kLayers * N; ++row) {
    std::vector<double> p(r.probs.begin() + row * kE, r.probs.begin() + (row + 1) * kE);
    std::sort(p.begin(), p.end(), std::greater<>());
    r.min_gap = std::min(r.min_gap, p[kK - 1] - p[kK]);
  }
  return r;
}

// transformers' formula, per sequence: over the rows of every layer, tokens_per_expert (K, E) = mean
// of one_hot(idx), router_prob (E) = mean of probs, aux = E sum(tokens_per_expert * router_prob).
double naive_aux_sum(const Routing& r) {
  const int64_t N = kB * kT, R = kLayers * kT;
  double total = 0;
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<double> tokens_per_expert(static_cast<size_t>(kK * kE), 0.0), router_prob(static_cast<size_t>(kE), 0.0);
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t t = b * kT; t < (b + 1) * kT; ++t)
        for (int64_t e = 0; e < kE; ++e) {
          router_prob[static_cast<size_t>(e)] += r.probs[static_cast<size_t>((l * N + t) * kE + e)] / R;
          for (int64_t k = 0; k < kK; ++k)
            if (r.idx[static_cast<size_t>((l * N + t) * kK + k)] == e) tokens_per_expert[static_cast<size_t>(k * kE + e)] += 1.0 / R;
        }
    double s = 0;
    for (int64_t k = 0; k < kK; ++k)
      for (int64_t e = 0; e < kE; ++e) s += tokens_per_expert[static_cast<size_t>(k * kE + e)] * router_prob[static_cast<size_t>(e)];
    total += kE * s;
  }
  return total;
}

// Logits of a confident router: O(3) spreads keep the top-k choices far from ties.
std::vector<double> random_logits(uint64_t seed) { return random_vector<double>(kLayers * kB * kT * kE, seed, -3.0, 3.0); }

double our_aux_sum(const Routing& r, std::vector<double>& stats, double weight = 0) {
  std::fill(stats.begin(), stats.end(), 0.0);
  const RouterStats st = router_stats_view(stats.data(), kB, kE, kLayers * kT, weight);
  for (int64_t l = 0; l < kLayers; ++l)
    router_stats_add(st, r.probs.data() + l * kB * kT * kE, r.idx.data() + l * kB * kT * kK, kB, kT, kE, kK);
  return router_aux_loss_sum(st, kB, kE);
}

TEST(RouterAuxLoss, StatisticsAndLossMatchTheReferenceFormulaPooledPerSequence) {
  const Routing r = route(random_logits(7));
  std::vector<double> stats(static_cast<size_t>(router_stats_bytes(kB, kE) / 8));
  const double ours = our_aux_sum(r, stats);
  const double naive = naive_aux_sum(r);
  // a handful of O(1) sums in double: 1e-12 relative is ~10^4 roundings of slack
  EXPECT_NEAR(ours, naive, 1e-12 * std::abs(naive));
  // each sequence's counts sum to layers x T x K; its probability sums to layers x T
  for (int64_t b = 0; b < kB; ++b) {
    EXPECT_EQ(std::accumulate(stats.begin() + b * kE, stats.begin() + (b + 1) * kE, 0.0), kLayers * kT * kK);
    EXPECT_NEAR(std::accumulate(stats.begin() + (kB + b) * kE, stats.begin() + (kB + b + 1) * kE, 0.0), kLayers * kT, 1e-12);
  }
  // a perfectly even router gives aux = K per sequence (the loss's minimum)
  Routing even = r;
  std::fill(even.probs.begin(), even.probs.end(), 1.0 / kE);
  for (size_t i = 0; i < even.idx.size(); ++i) even.idx[i] = static_cast<int32_t>(i % kE);
  EXPECT_NEAR(our_aux_sum(even, stats), static_cast<double>(kB * kK), 1e-12);
}

TEST(RouterAuxLoss, BackwardMatchesFiniteDifferencesThroughTheSoftmax) {
  std::vector<double> logits = random_logits(11);
  const Routing r = route(logits);
  ASSERT_GT(r.min_gap, 1e-3) << "finite differences need the top-k choice away from ties";
  const double weight = 0.37;
  std::vector<double> stats(static_cast<size_t>(router_stats_bytes(kB, kE) / 8));
  our_aux_sum(r, stats, weight);
  const RouterStats st = router_stats_view(stats.data(), kB, kE, kLayers * kT, weight);
  const int64_t N = kB * kT;
  std::vector<double> grad(logits.size(), 0.0);
  for (int64_t l = 0; l < kLayers; ++l) router_aux_backward(grad.data() + l * N * kE, r.probs.data() + l * N * kE, st, kB, kT, kE);
  std::vector<double> scratch(stats.size());
  auto loss = [&] { return weight * our_aux_sum(route(logits), scratch); };
  EXPECT_TRUE(check_finite_differences(logits, grad, loss, "router logits"));
  // the loss depends on every sequence's logits (no sequence's gradient is all zero)
  for (int64_t b = 0; b < kB; ++b) {
    double m = 0;
    for (int64_t t = b * kT; t < (b + 1) * kT; ++t)
      for (int64_t e = 0; e < kE; ++e) m = std::max(m, std::abs(grad[static_cast<size_t>(t * kE + e)]));
    EXPECT_GT(m, 1e-4) << "sequence " << b;
  }
  // weight 0: statistics only, no gradient
  std::vector<double> none(logits.size(), 0.0);
  router_aux_backward(none.data(), r.probs.data(), router_stats_view(stats.data(), kB, kE, kLayers * kT, 0.0), kB, kT, kE);
  EXPECT_EQ(max_abs(none), 0.0);
}

// A whole tiny MoE model: every gradient against finite differences of the objective
// scale x (cross-entropy sum) + coef x (mean over the B sequences of aux).
void expect_model_gradients_match(const ModelCard& card, uint64_t seed) {
  const ModelLayout layout = make_model_layout(card);
  ModelSpecs specs = make_model_specs(card, layout);
  const int64_t B = 2, T = 4;
  std::vector<std::vector<double>> params, grads, plain;
  for (const auto& u : layout.units) {
    params.push_back(random_unit_params(u, seed + static_cast<uint64_t>(u.index)));
    grads.emplace_back(u.flat_numel, 0.0);
    plain.emplace_back(u.flat_numel, 0.0);
  }
  // a confident router: its input scaled up, so the top-k choices sit far from ties
  for (int64_t l = 0; l < card.num_layers; ++l) {
    std::vector<double>& p = params[static_cast<size_t>(l + 1)];
    if (const auto* g = std::get_if<Gemma4LayerSpec>(&specs.layer(l))) {
      for (int64_t c = 0; c < g->C; ++c) p[static_cast<size_t>(g->router_scale + c)] *= 12.0;
    } else {
      const auto& q = std::get<Qwen35LayerSpec>(specs.layer(l));
      for (int64_t i = 0; i < q.moe.E * q.C; ++i) p[static_cast<size_t>(q.router_w + i)] *= 6.0;
    }
  }
  const std::vector<int32_t> tokens = {3, 7, 7, 22, 0, 1, 14, 3};
  const std::vector<int32_t> targets = {7, 7, 22, kIgnoreIndex, 1, 14, 3, 5};
  const double scale = 1.0 / 7, coef = 0.8;
  auto step = [&](std::vector<std::vector<double>>* into, double c) {
    std::vector<const double*> p;
    std::vector<double*> g;
    std::vector<std::vector<double>> scratch;
    for (size_t u = 0; u < params.size(); ++u) {
      p.push_back(params[u].data());
      if (into != nullptr) {
        g.push_back((*into)[u].data());
      } else {
        scratch.emplace_back(params[u].size(), 0.0);
        g.push_back(scratch.back().data());
      }
    }
    return model_forward_backward<double>(specs, p, g, tokens.data(), targets.data(), B, T, scale, c);
  };
  const LossResult r = step(&grads, coef);
  step(&plain, 0.0);
  // aux >= K per sequence (its minimum, an even router)
  EXPECT_GE(r.router_aux_sum, static_cast<double>(B * card.num_experts_per_tok) * (1 - 1e-12));
  auto loss = [&] {
    const LossResult x = step(nullptr, coef);
    return scale * x.loss_sum + coef * x.router_aux_sum / static_cast<double>(B);
  };
  for (size_t u = 0; u < params.size(); ++u) {
    std::vector<double> analytic = grads[u];
    // Gemma 4's layer_scalar is a buffer transformers never trains: its gradient is 0 by design, so
    // its own finite difference stands in for it (every other element is compared)
    const auto* gemma4 = u >= 1 && u <= static_cast<size_t>(card.num_layers)
                             ? std::get_if<Gemma4LayerSpec>(&specs.layer(static_cast<int64_t>(u) - 1))
                             : nullptr;
    if (gemma4 != nullptr) {
      const size_t scalar = static_cast<size_t>(gemma4->layer_scalar);
      EXPECT_EQ(analytic[scalar], 0.0);
      analytic[scalar] = central_difference(params[u], scalar, loss);
    }
    EXPECT_TRUE(check_finite_differences(params[u], analytic, loss, card.name + " unit " + std::to_string(u)));
  }
  // the loss reaches the routers: their gradients differ from those without it by far more than rounding
  double diff = 0;
  for (int64_t l = 1; l <= card.num_layers; ++l)
    for (size_t i = 0; i < grads[static_cast<size_t>(l)].size(); ++i)
      diff = std::max(diff, std::abs(grads[static_cast<size_t>(l)][i] - plain[static_cast<size_t>(l)][i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(RouterAuxLoss, WholeGemma4MoeModelMatchesFiniteDifferences) { expect_model_gradients_match(tiny_gemma4(true), 410); }

TEST(RouterAuxLoss, WholeQwen36MoeModelMatchesFiniteDifferences) { expect_model_gradients_match(tiny_qwen(true), 430); }

}  // namespace
}  // namespace slidedp::kernels::test
