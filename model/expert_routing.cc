// Expert hit rates of a modelled router; see expert_routing.h.
#include "model/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/error.h"

namespace slidedp {
namespace {

void check(const RouterModel& r) {
  SLIDEDP_CHECK(r.experts > 0 && r.experts_per_token > 0 && r.experts_per_token <= r.experts,
                "router needs 1 <= experts_per_token <= experts");
  SLIDEDP_CHECK(r.skew >= 0 && std::isfinite(r.skew), "router skew must be finite and >= 0");
}

// One token's choices: the k largest of log(weight) + Gumbel noise, which samples k distinct experts
// without replacement with probabilities proportional to the weights (the Gumbel top-k trick).
class TokenSampler {
 public:
  TokenSampler(const RouterModel& r, uint64_t seed) : r_(r), rng_(seed), keys_(static_cast<size_t>(r.experts)) {
    log_weight_.resize(static_cast<size_t>(r.experts));
    for (int64_t e = 0; e < r.experts; ++e) log_weight_[e] = -r.skew * std::log(static_cast<double>(e + 1));
  }
  // Calls f(e) for each chosen expert.
  template <typename F>
  void sample(F&& f) {
    std::uniform_real_distribution<double> u(std::nextafter(0.0, 1.0), 1.0);
    for (size_t e = 0; e < keys_.size(); ++e) keys_[e] = {log_weight_[e] - std::log(-std::log(u(rng_))), e};
    std::partial_sort(keys_.begin(), keys_.begin() + r_.experts_per_token, keys_.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int64_t i = 0; i < r_.experts_per_token; ++i) f(keys_[static_cast<size_t>(i)].second);
  }

 private:
  RouterModel r_;
  std::mt19937_64 rng_;
  std::vector<double> log_weight_;
  std::vector<std::pair<double, size_t>> keys_;
};

}  // namespace

std::vector<double> expert_selection_probabilities(const RouterModel& r, int64_t samples, uint64_t seed) {
  check(r);
  std::vector<double> p(static_cast<size_t>(r.experts), 0.0);
  if (r.skew == 0.0) {
    std::fill(p.begin(), p.end(), static_cast<double>(r.experts_per_token) / static_cast<double>(r.experts));
    return p;
  }
  SLIDEDP_CHECK(samples > 0, "need at least one sampled token");
  TokenSampler s(r, seed);
  for (int64_t t = 0; t < samples; ++t) s.sample([&](size_t e) { p[e] += 1.0; });
  for (double& x : p) x /= static_cast<double>(samples);
  return p;
}

const std::vector<double>& router_marginals(const RouterModel& r) {
  struct Entry {
    RouterModel router;
    std::vector<double> pi;
  };
  thread_local std::vector<Entry> cache;
  for (const Entry& e : cache)
    if (e.router.experts == r.experts && e.router.experts_per_token == r.experts_per_token && e.router.skew == r.skew)
      return e.pi;
  if (cache.size() >= 16) cache.clear();
  cache.push_back({r, expert_selection_probabilities(r, 200000, 0x5eed)});
  return cache.back().pi;
}

double expected_hit_fraction(const std::vector<double>& pi, double tokens) {
  if (pi.empty()) return 0.0;
  double hit = 0;
  for (double x : pi) hit += 1.0 - std::pow(1.0 - std::min(1.0, x), tokens);
  return hit / static_cast<double>(pi.size());
}

double sampled_hit_fraction(const RouterModel& r, int64_t tokens, int trials, uint64_t seed) {
  check(r);
  SLIDEDP_CHECK(trials > 0 && tokens >= 0, "need trials > 0 and tokens >= 0");
  TokenSampler s(r, seed);
  std::vector<char> hit(static_cast<size_t>(r.experts));
  double sum = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::fill(hit.begin(), hit.end(), 0);
    int64_t distinct = 0;
    for (int64_t t = 0; t < tokens && distinct < r.experts; ++t)
      s.sample([&](size_t e) { distinct += hit[e] == 0, hit[e] = 1; });
    sum += static_cast<double>(distinct) / static_cast<double>(r.experts);
  }
  return sum / trials;
}

}  // namespace slidedp
