// The run's repetition rounds (profiler/stats.h run_rounds) with fake stages whose cases only stamp
// when they run: every case is warmed before any repetition, round r of every stage finishes before
// round r + 1 of any starts, so one stage's repetitions interleave with another's and a case's
// repetitions span the whole run; the shuffle is seeded; samples come back per stage and case; the
// progress line names the stage and the case and ends at the stages' total estimate.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "profiler/stats.h"

namespace slidedp::profiler {
namespace {

struct Event {
  std::string who;  // "A0", "B2", ...
  bool warm = false;
  double t_s = 0;  // now_s() when it ran
  int seq = 0;     // order of all events
};

// Two stages, A with 2 cases and B with 3; each rep returns {stage index, case index} as outputs.
std::vector<StageCases> fake_stages(std::vector<Event>& log) {
  std::vector<StageCases> stages{{"A", 2.0, {}}, {"B", 6.0, {}}};
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const int n = s == 0 ? 2 : 3;
    for (int i = 0; i < n; ++i) {
      const std::string who = stages[s].name + std::to_string(i);
      Case c;
      c.label = "case " + std::to_string(i);
      c.warm = [&log, who] { log.push_back({who, true, now_s(), static_cast<int>(log.size())}); };
      c.rep = [&log, who, s, i] {
        log.push_back({who, false, now_s(), static_cast<int>(log.size())});
        return std::vector<double>{static_cast<double>(s), static_cast<double>(i)};
      };
      stages[s].cases.push_back(c);
    }
  }
  return stages;
}

std::vector<Event> reps_of(const std::vector<Event>& log, const std::string& who) {
  std::vector<Event> r;
  for (const Event& e : log)
    if (!e.warm && e.who == who) r.push_back(e);
  return r;
}

constexpr int kReps = 4;

TEST(Rounds, EveryCaseIsWarmedBeforeAnyRepetition) {
  std::vector<Event> log;
  std::vector<StageCases> stages = fake_stages(log);
  run_rounds(stages, kReps, 7, nullptr);
  ASSERT_EQ(log.size(), 5u * (kReps + 1));
  for (std::size_t k = 0; k < log.size(); ++k) EXPECT_EQ(log[k].warm, k < 5) << k;
}

TEST(Rounds, RoundsSpanEveryStageSoRepetitionsInterleaveAcrossStages) {
  std::vector<Event> log;
  std::vector<StageCases> stages = fake_stages(log);
  run_rounds(stages, kReps, 7, nullptr);
  // Round r is events [5 + 5r, 10 + 5r): every case of both stages exactly once.
  for (int r = 0; r < kReps; ++r) {
    std::vector<std::string> round;
    for (int k = 0; k < 5; ++k) round.push_back(log[static_cast<std::size_t>(5 + 5 * r + k)].who);
    std::sort(round.begin(), round.end());
    EXPECT_EQ(round, (std::vector<std::string>{"A0", "A1", "B0", "B1", "B2"})) << "round " << r;
  }
  // So between the first and the last repetition of every case of A, every case of B repeated (and
  // the other way round): by the clock, each stage's repetitions are spread over the other's.
  for (const std::string a : {"A0", "A1"}) {
    const std::vector<Event> ra = reps_of(log, a);
    ASSERT_EQ(ra.size(), static_cast<std::size_t>(kReps));
    for (const std::string b : {"B0", "B1", "B2"}) {
      const std::vector<Event> rb = reps_of(log, b);
      ASSERT_EQ(rb.size(), static_cast<std::size_t>(kReps));
      const int inside_a = static_cast<int>(std::count_if(rb.begin(), rb.end(), [&](const Event& e) {
        return e.seq > ra.front().seq && e.seq < ra.back().seq;
      }));
      const int inside_b = static_cast<int>(std::count_if(ra.begin(), ra.end(), [&](const Event& e) {
        return e.seq > rb.front().seq && e.seq < rb.back().seq;
      }));
      // Rounds 1 .. kReps - 2 of the other case fall strictly between a case's first and last.
      EXPECT_GE(inside_a, kReps - 2) << a << " vs " << b;
      EXPECT_GE(inside_b, kReps - 2) << b << " vs " << a;
      EXPECT_LE(rb.front().t_s, ra.back().t_s);
      EXPECT_LE(ra.front().t_s, rb.back().t_s);
    }
  }
}

TEST(Rounds, SamplesComeBackPerStageAndCaseAndTheOrderIsSeeded) {
  std::vector<Event> log1, log2, log3;
  std::vector<StageCases> s1 = fake_stages(log1), s2 = fake_stages(log2), s3 = fake_stages(log3);
  const std::vector<CaseSamples> v = run_rounds(s1, kReps, 7, nullptr);
  run_rounds(s2, kReps, 7, nullptr);
  run_rounds(s3, kReps, 8, nullptr);
  ASSERT_EQ(v.size(), 2u);
  ASSERT_EQ(v[0].size(), 2u);
  ASSERT_EQ(v[1].size(), 3u);
  for (std::size_t s = 0; s < v.size(); ++s)
    for (std::size_t i = 0; i < v[s].size(); ++i) {
      ASSERT_EQ(v[s][i].size(), 2u);  // outputs
      EXPECT_EQ(v[s][i][0], std::vector<double>(kReps, static_cast<double>(s)));
      EXPECT_EQ(v[s][i][1], std::vector<double>(kReps, static_cast<double>(i)));
    }
  auto order = [](const std::vector<Event>& log) {
    std::vector<std::string> o;
    for (const Event& e : log) o.push_back(e.who);
    return o;
  };
  EXPECT_EQ(order(log1), order(log2));
  EXPECT_NE(order(log1), order(log3));  // 4 rounds of 5! orders: a different seed differs
}

TEST(Rounds, ProgressNamesTheStageAndCaseAndEndsAtTheTotalEstimate) {
  std::vector<Event> log;
  std::vector<StageCases> stages = fake_stages(log);
  std::vector<std::pair<double, std::string>> seen;
  run_rounds(stages, kReps, 7,
             [&](double done_s, const std::string& note) { seen.emplace_back(done_s, note); });
  ASSERT_EQ(seen.size(), 5u * (kReps + 1) + 1);
  EXPECT_EQ(seen.front(), (std::pair<double, std::string>{0.0, "A: case 0"}));
  for (std::size_t k = 0; k + 1 < seen.size(); ++k) {
    EXPECT_TRUE(seen[k].second.starts_with("A: case ") || seen[k].second.starts_with("B: case "))
        << seen[k].second;
    EXPECT_LE(seen[k].first, seen[k + 1].first);
  }
  // The stages' estimates, 2 + 6 s, shared by their steps: the last call says all of it is done.
  EXPECT_DOUBLE_EQ(seen.back().first, 8.0);
  EXPECT_EQ(seen.back().second, "");
}

}  // namespace
}  // namespace slidedp::profiler
