// The mean-field contention of the step model (model/contention.h): progressive filling against
// hand counts and against the simulator's own fluid engine, the expectation over active streams
// against a naive enumeration, the phase stretch against a hand count, and the solver's result
// against the fixed-point property it promises.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>

#include "model/contention.h"
#include "model/fluid_engine.h"
#include "model/hardware.h"
#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp {
namespace {

constexpr int kAll = (1 << kSharedStreams) - 1;
const double kNoCap[kSharedStreams] = {1, 1, 1, 1};

std::array<double, kSharedStreams> levels(int mask, const double* duplex, const double* hm, const double* cap, double X,
                                          double HM) {
  std::array<double, kSharedStreams> level{-1, -1, -1, -1};
  fill_levels(mask, duplex, hm, cap, X, HM, level);
  return level;
}

TEST(Contention, HostMemorySharedEvenly) {
  // Two streams on host memory only, 60 + 60 against 100: both at 100 / 120.
  const double duplex[] = {0, 0, 0, 0}, hm[] = {0, 60, 60, 0};
  const auto l = levels(0b0110, duplex, hm, kNoCap, 1e30, 100);
  EXPECT_NEAR(l[kSharedD2H], 100.0 / 120.0, 1e-12);
  EXPECT_NEAR(l[kSharedCpu], 100.0 / 120.0, 1e-12);
  EXPECT_EQ(l[kSharedH2D], -1) << "a stream outside the mask is left alone";
}

TEST(Contention, DuplexSaturatesFirstAndTheCpuRisesOn) {
  // H2D and D2H need 40 + 40 of a 50 duplex: both stop at 0.625, using 0.625 * 80 = 50 of host
  // memory; the CPU (100 of host memory alone) rises to its standalone rate in the 950 left.
  const double duplex[] = {40, 40, 0, 0}, hm[] = {40, 40, 100, 0};
  const auto l = levels(0b0111, duplex, hm, kNoCap, 50, 1000);
  EXPECT_NEAR(l[kSharedH2D], 0.625, 1e-12);
  EXPECT_NEAR(l[kSharedD2H], 0.625, 1e-12);
  EXPECT_NEAR(l[kSharedCpu], 1.0, 1e-12);
}

TEST(Contention, RootComplexCapsOneStreamAndFreesHostMemoryForTheOthers) {
  // D2H capped at 0.7 by its root complex: host memory 170 holds D2H 100 and CPU 100 up to 0.7
  // (140 used); the CPU takes the 30 left, rising by 0.3 to 1.0, which fills host memory exactly.
  const double duplex[] = {0, 50, 0, 0}, hm[] = {0, 100, 100, 0}, cap[] = {1, 0.7, 1, 1};
  const auto l = levels(0b0110, duplex, hm, cap, 1000, 170);
  EXPECT_NEAR(l[kSharedD2H], 0.7, 1e-12);
  EXPECT_NEAR(l[kSharedCpu], 1.0, 1e-12);
  // Without the cap both stop together where host memory fills: 170 / 200.
  const auto free = levels(0b0110, duplex, hm, kNoCap, 1000, 170);
  EXPECT_NEAR(free[kSharedD2H], 0.85, 1e-12);
  EXPECT_NEAR(free[kSharedCpu], 0.85, 1e-12);
}

// The simulator's engine is the reference the analytical shares imitate: give each stream one task
// whose standalone speed is 1 and whose work is the level fill_levels predicts; if the levels are
// the engine's allocation, every task finishes at t = 1 (the set of active tasks never changes).
TEST(Contention, LevelsAreTheFluidEnginesAllocation) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> frac(0.05, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const double X = 100, HM = 200;
    // Demands at the standalone rate, each within the resource alone (standalone speed 1).
    const double duplex[] = {X * frac(rng), X * frac(rng), 0, 0};
    const double hm[] = {HM * frac(rng), HM * frac(rng), HM * frac(rng), trial % 2 ? HM * frac(rng) : 0.0};
    const int mask = 1 + static_cast<int>(rng() % kAll);
    const auto l = levels(mask, duplex, hm, kNoCap, X, HM);

    FluidEngine eng;
    const int dx = eng.add_resource("duplex", X), mem = eng.add_resource("host_mem", HM);
    std::array<int, kSharedStreams> task{};
    for (int i = 0; i < kSharedStreams; ++i) {
      if (!(mask & (1 << i))) continue;
      FluidEngine::Task t;
      t.work = l[static_cast<std::size_t>(i)];
      t.usages = {{eng.add_resource("own" + std::to_string(i), 1.0), 1.0}};
      if (duplex[i] > 0) t.usages.push_back({dx, duplex[i]});
      if (hm[i] > 0) t.usages.push_back({mem, hm[i]});
      task[static_cast<std::size_t>(i)] = eng.add_task(std::move(t));
    }
    eng.run();
    for (int i = 0; i < kSharedStreams; ++i) {
      if (!(mask & (1 << i))) continue;
      EXPECT_NEAR(eng.task(task[static_cast<std::size_t>(i)]).end_s, 1.0, 1e-9)
          << "trial " << trial << " mask " << mask << " stream " << i << " level " << l[static_cast<std::size_t>(i)];
    }
  }
}

// A phase of the given length with the given busy seconds per stream.
PhaseStats phase(double length, double h2d, double d2h, double cpu, double convert = 0) {
  PhaseStats p;
  p.start = 10;
  p.end = p.gpu_end = 10 + length;
  p.h2d_busy = h2d, p.d2h_busy = d2h, p.cpu_busy = cpu, p.convert_busy = convert;
  p.cpu_thread_s = cpu, p.cpu_host_mem_bytes = cpu * 1e9;
  return p;
}

TEST(Contention, ExpectationOverActiveStreamsMatchesAnEnumeration) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 100; ++trial) {
    PhaseSharing s;
    for (auto& row : s.level)
      for (double& v : row) v = unit(rng);
    for (double& v : s.standalone) v = 0.5 + 0.5 * unit(rng);
    s.has_cpu_memory = s.has_convert = true;
    const PhaseStats p = phase(2.0, 2 * unit(rng), 2 * unit(rng), 2 * unit(rng), 2 * unit(rng));
    const PhaseContention f = contention_at(s, p, false);
    const double u[] = {p.h2d_busy / 2, p.d2h_busy / 2, p.cpu_busy / 2, p.convert_busy / 2};
    const double got[] = {f.h2d, f.d2h, f.cpu, f.convert};
    for (int self = 0; self < kSharedStreams; ++self) {
      // Every combination that contains `self`, weighed by the others' on/off probabilities.
      double e = 0;
      for (int mask = 0; mask <= kAll; ++mask) {
        if (!(mask & (1 << self))) continue;
        double pr = 1;
        for (int j = 0; j < kSharedStreams; ++j)
          if (j != self) pr *= (mask & (1 << j)) ? u[j] : 1 - u[j];
        e += pr * s.level[static_cast<std::size_t>(mask)][static_cast<std::size_t>(self)];
      }
      EXPECT_NEAR(got[self], s.standalone[static_cast<std::size_t>(self)] * e, 1e-12) << "stream " << self;
    }
  }
}

TEST(Contention, StretchCarriesTheCpuBacklogAndLetsCopiesHoldThePhase) {
  // Phase 0 (1 s): H2D busy 0.8, CPU 0.6. At H2D factor 0.5 the copies need 1.6 s, so the phase
  // lasts 1.6 s; the CPU at 0.25 needs 2.4 s, does 1.6 s of it (0.4 uncontended seconds) and carries
  // 0.2 into phase 1 (1 s, CPU 0.3 of its own at factor 1): 0.5 s there.
  const std::vector<PhaseStats> base = {phase(1.0, 0.8, 0.0, 0.6), phase(1.0, 0.0, 0.0, 0.3)};
  std::vector<PhaseContention> f(2);
  f[0].h2d = 0.5, f[0].cpu = 0.25;
  std::vector<PhaseStats> out;
  stretch_phases(base, f, /*last_drains=*/false, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0].end - out[0].start, 1.6, 1e-12);
  EXPECT_NEAR(out[0].h2d_busy, 1.6, 1e-12);
  EXPECT_NEAR(out[0].cpu_busy, 1.6, 1e-12);
  EXPECT_NEAR(out[1].end - out[1].start, 1.0, 1e-12) << "the CPU never holds a phase";
  EXPECT_NEAR(out[1].cpu_busy, 0.5, 1e-12);
  // The last phase of a draining step is judged to its last compute.
  stretch_phases(base, f, /*last_drains=*/true, out);
  EXPECT_NEAR(out[1].gpu_end - out[1].start, 1.0, 1e-12);
}

// A pair of phases repeated r times (micro_repeat, the recurrence's jump over the middle
// micro-steps) stretches like the r pairs written out: the CPU's carry after them (closed form) and
// so the phases that follow are the same, and the pair's own statistics are its last repetition's.
// Cases: the CPU keeps up (the carry drains to the steady alpha), falls behind (it grows by beta per
// pair), and one repetition. Reference: the expanded phases, stretched one by one.
TEST(Contention, ARepeatedPairStretchesLikeItsRepetitionsWrittenOut) {
  struct Case {
    double cpu_fwd, cpu_bwd, carry_in;  // the pair's CPU work; CPU work of the phase before it
    long repeat;
  };
  for (const Case& c : {Case{0.2, 0.5, 2.5, 7}, Case{0.9, 1.3, 0.4, 5}, Case{0.1, 0.9, 0.0, 40}, Case{0.3, 0.3, 1.0, 1},
                        Case{0.2, 0.5, 30.0, 9}, Case{0.2, 0.5, 4.6, 9}, Case{0.2, 0.5, 5.2, 9}}) {
    SCOPED_TRACE("cpu " + std::to_string(c.cpu_fwd) + "/" + std::to_string(c.cpu_bwd) + " repeat " +
                 std::to_string(c.repeat));
    const PhaseStats first_f = phase(0.4, 0.2, 0.0, 0.1), first_b = phase(1.0, 0.1, 0.3, c.carry_in);
    const PhaseStats mid_f = phase(0.4, 0.3, 0.05, c.cpu_fwd), mid_b = phase(1.0, 0.4, 0.6, c.cpu_bwd);
    const PhaseStats last_f = phase(0.4, 0.3, 0.05, 0.1), last_b = phase(1.0, 0.4, 0.6, 0.2);
    PhaseContention fw, bw;
    fw.h2d = 0.7, fw.d2h = 0.9, fw.cpu = 0.6;
    bw.h2d = 0.8, bw.d2h = 0.5, bw.cpu = 0.75;
    std::vector<PhaseStats> expanded = {first_f, first_b}, compressed = {first_f, first_b, mid_f, mid_b, last_f, last_b};
    std::vector<PhaseContention> fe = {fw, bw}, fc = {fw, bw, fw, bw, fw, bw};
    for (long r = 0; r < c.repeat; ++r) {
      expanded.insert(expanded.end(), {mid_f, mid_b});
      fe.insert(fe.end(), {fw, bw});
    }
    expanded.insert(expanded.end(), {last_f, last_b});
    fe.insert(fe.end(), {fw, bw});
    std::vector<PhaseStats> out_e, out_c;
    stretch_phases(expanded, fe, /*last_drains=*/true, out_e);
    stretch_phases(compressed, fc, /*last_drains=*/true, out_c, {1, c.repeat, 1});
    const auto same = [](const PhaseStats& a, const PhaseStats& b, const char* what) {
      EXPECT_NEAR(a.end - a.start, b.end - b.start, 1e-12) << what;
      EXPECT_NEAR(a.gpu_end - a.start, b.gpu_end - b.start, 1e-12) << what;
      EXPECT_NEAR(a.h2d_busy, b.h2d_busy, 1e-12) << what;
      EXPECT_NEAR(a.d2h_busy, b.d2h_busy, 1e-12) << what;
      EXPECT_NEAR(a.cpu_busy, b.cpu_busy, 1e-12) << what;
    };
    const std::size_t n = out_e.size();
    same(out_c[2], out_e[n - 4], "the pair's forward = its last repetition's");
    same(out_c[3], out_e[n - 3], "the pair's backward = its last repetition's");
    same(out_c[4], out_e[n - 2], "the forward after the pair");
    same(out_c[5], out_e[n - 1], "the step's last backward");
  }
}

TEST(Contention, SolverReturnsAFixedPoint) {
  // Host-memory-bound phases of a real machine (h200-x8, 6 ranks): a forward with deliveries and
  // some spilled CPU work, a backward with copies both ways and the CPU busy.
  const Hardware hw = hardware_preset("h200-x8");
  const Workload w = make_workload(model_preset("qwen3-14b"), 1024);
  Plan plan;
  plan.ranks = 6;
  plan.accum_steps = 2;
  const StepWork sw = build_step_work(w, hw, plan, System::kSlideDP);
  const std::vector<PhaseStats> phases = {phase(0.4, 0.3, 0.05, 0.1), phase(1.0, 0.4, 0.9, 0.7),
                                          phase(0.4, 0.3, 0.05, 0.2), phase(1.0, 0.4, 0.9, 1.5)};
  const std::vector<PhaseContention> f = solve_contention(sw, phases);
  ASSERT_EQ(f.size(), phases.size());
  std::vector<PhaseStats> stretched;
  stretch_phases(phases, f, !sw.traits.update_after_backward, stretched);
  for (std::size_t k = 0; k < f.size(); ++k) {
    const bool drains = k + 1 == f.size() && !sw.traits.update_after_backward;
    const PhaseContention g = contention_at(phase_sharing(sw, phases[k]), stretched[k], drains);
    EXPECT_NEAR(g.h2d, f[k].h2d, 1e-3) << "phase " << k;
    EXPECT_NEAR(g.d2h, f[k].d2h, 1e-3) << "phase " << k;
    EXPECT_NEAR(g.cpu, f[k].cpu, 1e-3) << "phase " << k;
    // Contention only slows streams down, and this machine's host memory is shared for real.
    EXPECT_GT(f[k].h2d, 0.0);
    EXPECT_LE(f[k].h2d, 1.0 + 1e-12);
    EXPECT_LE(f[k].d2h, 1.0 + 1e-12);
    EXPECT_LE(f[k].cpu, 1.0 + 1e-12);
  }
  EXPECT_LT(f[1].d2h, 0.95) << "the backward's gradient copies share host memory with the CPU";
}

}  // namespace
}  // namespace slidedp
