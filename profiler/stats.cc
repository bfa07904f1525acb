// Medians, spreads and the repeat loop; see stats.h.
#include "profiler/stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "common/error.h"

namespace slidedp::profiler {

Spread summarize(std::vector<double> v) {
  SLIDEDP_CHECK(!v.empty(), "summarize: no values");
  std::sort(v.begin(), v.end());
  Spread s;
  s.n = static_cast<int>(v.size());
  s.min = v.front();
  s.max = v.back();
  const std::size_t h = v.size() / 2;
  s.median = v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int inner_for(const RepeatPolicy& policy, double seconds) {
  if (!(seconds > 0)) return policy.max_inner;
  const double k = std::ceil(policy.min_rep_s / seconds);
  return static_cast<int>(std::clamp(k, 1.0, static_cast<double>(policy.max_inner)));
}

std::vector<double> repeat_timed(const RepeatPolicy& policy, const std::function<double(int)>& body) {
  SLIDEDP_CHECK(policy.reps >= 1);
  const int inner = inner_for(policy, body(1));  // warm-up: first touch, caches, thread start-up
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(policy.reps));
  for (int r = 0; r < policy.reps; ++r) out.push_back(body(inner) / inner);
  return out;
}

std::vector<std::vector<double>> repeat_timed_multi(const RepeatPolicy& policy,
                                                    const std::function<std::vector<double>(int)>& body) {
  SLIDEDP_CHECK(policy.reps >= 1);
  const std::vector<double> warm = body(1);
  SLIDEDP_CHECK(!warm.empty());
  const int inner = inner_for(policy, *std::max_element(warm.begin(), warm.end()));
  std::vector<std::vector<double>> out(warm.size());
  for (int r = 0; r < policy.reps; ++r) {
    const std::vector<double> v = body(inner);
    SLIDEDP_CHECK(v.size() == out.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i].push_back(v[i] / inner);
  }
  return out;
}

Case timed_case(std::string label, const RepeatPolicy& policy, std::function<std::vector<double>(int)> body) {
  auto inner = std::make_shared<int>(1);
  Case c;
  c.label = std::move(label);
  c.warm = [policy, body, inner] {
    const std::vector<double> w = body(1);
    SLIDEDP_CHECK(!w.empty());
    *inner = inner_for(policy, *std::max_element(w.begin(), w.end()));
  };
  c.rep = [body, inner] {
    std::vector<double> v = body(*inner);
    for (double& x : v) x /= *inner;
    return v;
  };
  return c;
}

std::vector<std::vector<std::vector<double>>> run_interleaved(
    std::vector<Case>& cases, int reps, uint64_t seed,
    const std::function<void(double, const std::string&)>& progress) {
  SLIDEDP_CHECK(reps >= 1);
  const double steps = static_cast<double>(cases.size()) * (reps + 1);
  double done = 0;
  auto tick = [&](const Case& c) {
    if (progress) progress(done / steps, c.label);
    ++done;
  };
  for (Case& c : cases) {
    tick(c);
    c.warm();
  }
  std::vector<std::vector<std::vector<double>>> out(cases.size());
  std::vector<std::size_t> order(cases.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int r = 0; r < reps; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t i : order) {
      tick(cases[i]);
      const std::vector<double> v = cases[i].rep();
      if (out[i].empty()) out[i].resize(v.size());
      SLIDEDP_CHECK(v.size() == out[i].size(), "a case changed its number of outputs");
      for (std::size_t k = 0; k < v.size(); ++k) out[i][k].push_back(v[k]);
    }
  }
  if (progress) progress(1.0, "");
  return out;
}

}  // namespace slidedp::profiler
