// How many of a MoE layer's experts a micro-batch touches, for what-if studies of expert-aware
// delivery (send only the experts some token of the micro-batch is routed to).
//
// A router is modelled by its experts' popularity: each token picks experts_per_token distinct
// experts by sampling without replacement with probabilities proportional to 1 / rank^skew (skew 0:
// uniform; a Zipf law otherwise), independently of the other tokens. An expert e is then selected by
// one token with a marginal probability pi_e (sum over e: experts_per_token), and hit by at least one
// of N tokens with probability 1 - (1 - pi_e)^N. For the uniform router pi_e = k / E exactly; for a
// skewed one the marginals have no closed form and are measured by sampling.
#pragma once

#include <cstdint>
#include <vector>

namespace slidedp {

struct RouterModel {
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  double skew = 0.0;  // Zipf exponent of the experts' popularity (0: uniform)
};

// Each expert's probability of being among one token's choices (sums to experts_per_token), from
// `samples` sampled tokens (the uniform router's exact k / E when skew is 0).
std::vector<double> expert_selection_probabilities(const RouterModel& router, int64_t samples, uint64_t seed);

// The marginals the model uses: exact for a uniform router, else sampled from 200k tokens with a fixed
// seed (a marginal of k / E = 1/16 within about 1%: relative standard error sqrt((1 - pi) / (pi n))),
// remembered per router, since the planner asks for the same few thousands of times.
const std::vector<double>& router_marginals(const RouterModel& router);

// Expected fraction of experts hit by `tokens` independent tokens, from the marginals.
double expected_hit_fraction(const std::vector<double>& selection_probabilities, double tokens);

// Mean over `trials` of the fraction of experts that `tokens` sampled tokens hit: the measurement the
// expectation above is checked against.
double sampled_hit_fraction(const RouterModel& router, int64_t tokens, int trials, uint64_t seed);

}  // namespace slidedp
