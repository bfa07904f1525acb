// The pacer's fluid sharing against hand counts, with a clock the test drives (no waiting, no wall
// time): a copy alone runs at its link's rate; two ranks' copies share the root complex; a latency
// delays the work; an H2D and a D2H on one link share its duplex limit until the shorter one ends and
// the other speeds up; the update draws host memory from the copies. Every figure follows from
// progressive filling over the machine's resources (model/machine_resources.h).
#include <gtest/gtest.h>

#include "common/error.h"
#include "executor/cpu/pacer.h"

namespace slidedp::exec {
namespace {

Capacities two_ranks() {
  Capacities c;
  c.ranks = 2;
  c.h2d_alone_Bps = c.d2h_alone_Bps = 10e9;
  c.h2d_root_Bps = c.d2h_root_Bps = 15e9;
  c.duplex_Bps = 15e9;
  c.host_mem_Bps = 1e12;
  c.allgather_busbw_Bps = c.reduce_scatter_busbw_Bps = 100e9;
  c.update_threads = 4;
  c.cpu_cores = 8;
  return c;
}

struct Clock {
  double now = 0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

constexpr double kTol = 1e-12;  // relative: the event arithmetic is exact up to a few roundings

TEST(Pacer, ACopyAloneRunsAtItsLinksRate) {
  Clock clock;
  Pacer p(two_ranks(), 1.0, clock.fn());
  const int f = p.begin(p.resources().copy(0, true), 1e9);
  EXPECT_NEAR(p.end_time(f), 0.1, 0.1 * kTol);
}

TEST(Pacer, TwoRanksShareTheRootComplexAndTheScaleStretchesTime) {
  Clock clock;
  Pacer p(two_ranks(), 3.0, clock.fn());
  const int a = p.begin(p.resources().copy(0, true), 1e9);
  const int b = p.begin(p.resources().copy(1, true), 1e9);
  // 15 GB/s for the two together: 7.5 GB/s each, 1 GB in 0.1333 s of target time.
  EXPECT_NEAR(p.end_time(a), 1e9 / 7.5e9, 1e-9);
  EXPECT_NEAR(p.end_time(b), 1e9 / 7.5e9, 1e-9);
  // Half-way (in target time; the clock here runs S = 3 times slower) a third copy on rank 0's D2H
  // side starts: it takes nothing from the H2D root, so the two ends stay.
  clock.now = 3.0 * 0.05;
  const int c = p.begin(p.resources().copy(0, false), 0.0);
  EXPECT_NEAR(p.end_time(a), 1e9 / 7.5e9, 1e-9);
  (void)c;
}

// Late in a long run (a clock of 1e9 target seconds: --time-scale 1e-9 after one second, or days of
// pacing) a small copy lasts less than the clock's rounding (1e-10 s against a spacing of 1.2e-7 s):
// it ends at once instead of an event loop that never moves (it spun forever).
TEST(Pacer, AFlowShorterThanTheClocksRoundingEndsInsteadOfSpinning) {
  Clock clock;
  Pacer p(two_ranks(), 1.0, clock.fn());
  clock.now = 1e9;
  const int f = p.begin(p.resources().copy(0, true), 1.0);
  EXPECT_EQ(p.end_time(f), 1e9);
  p.finish(f);
  EXPECT_EQ(p.flows(), 1);
}

TEST(Pacer, LatencyComesBeforeTheWork) {
  Clock clock;
  Pacer p(two_ranks(), 1.0, clock.fn());
  const int f = p.begin(p.resources().copy(1, false), 1e9, 0.01);
  EXPECT_NEAR(p.end_time(f), 0.11, 1e-9);
  const int g = p.begin({}, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(p.end_time(g), 0.0);  // nothing to do: done at once
}

TEST(Pacer, BothDirectionsShareTheDuplexUntilTheShorterEnds) {
  Clock clock;
  Pacer p(two_ranks(), 1.0, clock.fn());
  const int h = p.begin(p.resources().copy(0, true), 1e9);
  const int d = p.begin(p.resources().copy(0, false), 0.5e9);
  // Duplex 15 GB/s for 10 + 10 standalone: 7.5 each; the D2H ends at 0.5 / 7.5 = 0.0667 s, then the
  // H2D has 0.5 GB left at 10 GB/s: 0.0667 + 0.05 = 0.1167 s.
  EXPECT_NEAR(p.end_time(d), 0.5 / 7.5, 1e-9);
  EXPECT_NEAR(p.end_time(h), 0.5 / 7.5 + 0.05, 1e-9);
}

TEST(Pacer, TheUpdateAndTheCopiesShareHostMemory) {
  Capacities c = two_ranks();
  c.host_mem_Bps = 20e9;
  Clock clock;
  Pacer p(c, 1.0, clock.fn());
  // The update: 1 thread-second reading 5 GB per thread-second; alone it runs on its 4 threads at 4
  // thread-seconds per second, which is exactly host memory's 20 GB/s. The copy alone: 10 GB/s.
  const int u = p.begin(p.resources().cpu(1.0, 5e9), 1.0);
  const int f = p.begin(p.resources().copy(0, true), 1e9);
  // Together they want 30 GB/s of host memory: both run at 2/3 of their speed alone, so the copy
  // ends at 1 / 6.67 = 0.15 s; the update has done 0.4 thread-seconds by then and does the other 0.6
  // alone at 4 per second: 0.30 s.
  EXPECT_NEAR(p.end_time(f), 0.15, 1e-9);
  EXPECT_NEAR(p.end_time(u), 0.30, 1e-9);
}

TEST(Pacer, AFlowPastItsEndCountsAsAnOverrun) {
  Clock clock;
  Pacer p(two_ranks(), 1.0, clock.fn());
  const int f = p.begin(p.resources().copy(0, true), 1e9);  // ends at 0.1
  clock.now = 0.5;                                            // the real work took 0.5 s
  p.finish(f);
  EXPECT_EQ(p.overruns(), 1);
  EXPECT_NEAR(p.overrun_s(), 0.4, 1e-9);
  const int g = p.begin(p.resources().copy(0, true), 0.0);
  p.finish(g);
  EXPECT_EQ(p.overruns(), 1);  // no work: done at once, not late
  EXPECT_EQ(p.flows(), 2);
}

}  // namespace
}  // namespace slidedp::exec
