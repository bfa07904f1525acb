// Medians, spreads and the repeat loop; see stats.h.
#include "profiler/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "common/error.h"

namespace slidedp::profiler {

std::string sig3(double v) { return fmt::format("{:.3g}", v); }
std::string spread_percent(const Spread& s) { return fmt::format("{:.1f}%", 100 * s.relative()); }

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

std::vector<CaseSamples> run_rounds(std::vector<StageCases>& stages, int reps, uint64_t seed,
                                    const std::function<void(double, const std::string&)>& progress) {
  SLIDEDP_CHECK(reps >= 1);
  // Every case of the run as (stage, case), with the estimated seconds one of its steps takes.
  struct Ref {
    std::size_t stage, index;
    double step_s;
  };
  std::vector<Ref> all;
  double total_s = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const std::size_t n = stages[s].cases.size();
    total_s += n > 0 ? stages[s].estimate_s : 0.0;
    for (std::size_t i = 0; i < n; ++i)
      all.push_back(
          {s, i, stages[s].estimate_s / static_cast<double>(n * static_cast<std::size_t>(reps + 1))});
  }
  double done_s = 0;
  auto tick = [&](const Ref& ref) {
    if (progress) progress(done_s, stages[ref.stage].name + ": " + stages[ref.stage].cases[ref.index].label);
    done_s += ref.step_s;
  };
  for (const Ref& ref : all) {
    tick(ref);
    stages[ref.stage].cases[ref.index].warm();
  }
  std::vector<CaseSamples> out(stages.size());
  for (std::size_t s = 0; s < stages.size(); ++s) out[s].resize(stages[s].cases.size());
  std::mt19937_64 rng(seed);
  for (int r = 0; r < reps; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    for (const Ref& ref : all) {
      tick(ref);
      const std::vector<double> v = stages[ref.stage].cases[ref.index].rep();
      auto& dst = out[ref.stage][ref.index];
      if (dst.empty()) dst.resize(v.size());
      SLIDEDP_CHECK(v.size() == dst.size(), "a case changed its number of outputs");
      for (std::size_t k = 0; k < v.size(); ++k) dst[k].push_back(v[k]);
    }
  }
  if (progress) progress(total_s, "");
  return out;
}

}  // namespace slidedp::profiler
