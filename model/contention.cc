// Mean-field contention between a rank's host-side streams; see contention.h and docs/MODEL.md.
#include "model/contention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace slidedp {
namespace {

// The phase-level fixed point (solve_contention) stops once no factor moves by more than the
// tolerance: 2-6 iterations, at most the cap (a factor of 1e-4 is about 1e-4 of the step time).
constexpr int kMaxContentionIterations = 16;
constexpr double kContentionTolerance = 1e-4;
constexpr double kContractionWanted = 0.7;  // a change that shrinks less than this halves the step

}  // namespace

// Progressive filling of the duplex link (capacity X) and host memory (HM) among the streams in
// `mask`, whose demands at their standalone rates are duplex[i] and hm[i]; stream i cannot rise
// beyond cap[i] (its own PCIe root complex's share: all ranks' copies in one direction).
void fill_levels(int mask, const double* duplex, const double* hm, const double* cap, double X, double HM,
                 std::array<double, kSharedStreams>& level) {
  double lambda = 0, rem_dx = X, rem_hm = HM;
  int rising = mask;
  while (rising) {
    double load_dx = 0, load_hm = 0, step = 1.0;
    for (int i = 0; i < kSharedStreams; ++i)
      if (rising & (1 << i)) load_dx += duplex[i], load_hm += hm[i], step = std::min(step, cap[i] - lambda);
    if (load_dx > 0) step = std::min(step, rem_dx / load_dx);
    if (load_hm > 0) step = std::min(step, rem_hm / load_hm);
    step = std::max(0.0, step);
    lambda += step;
    rem_dx -= load_dx * step;
    rem_hm -= load_hm * step;
    const bool full_dx = load_dx > 0 && rem_dx <= 1e-12 * X, full_hm = load_hm > 0 && rem_hm <= 1e-12 * HM;
    for (int i = 0; i < kSharedStreams; ++i)
      if ((rising & (1 << i)) &&
          ((full_dx && duplex[i] > 0) || (full_hm && hm[i] > 0) || lambda >= cap[i] * (1 - 1e-12))) {
        level[static_cast<std::size_t>(i)] = lambda;
        rising &= ~(1 << i);
      }
  }
}

PhaseSharing phase_sharing(const StepWork& sw, const PhaseStats& p) {
  const Capacities& c = sw.cap;
  const double N = sw.ranks;
  const double hm_copy = c.emulated ? 2.0 : 1.0;
  const double HM = c.host_mem_Bps, X = c.duplex_Bps;
  const double cpu_rate = c.update_threads;  // thread-seconds per second with no memory limit
  const double hm_cpu = p.cpu_thread_s > 0 ? p.cpu_host_mem_bytes / p.cpu_thread_s : 0.0;  // bytes per thread-s
  // Standalone rates, as the simulator's fair share starts from them: one rank's copy alone on its
  // link (the duplex cap and host memory included; the PCIe root complex is shared by all ranks'
  // copies, a cap on the stream's level), the CPU capped by its own host-memory need.
  const double sh = std::min({c.h2d_alone_Bps, X, HM / hm_copy}), sd = std::min({c.d2h_alone_Bps, X, HM / hm_copy});
  const double sc = hm_cpu > 0 ? std::min(cpu_rate, HM / hm_cpu) : cpu_rate;
  // SlideFormer's conversion: every rank's threads read 4 and write 2 bytes per 4 bytes converted.
  const double conv_rate = N * c.convert_threads_per_rank * c.convert_Bps_per_thread;  // fp32 bytes/s
  const double sv = std::min(conv_rate, HM / 1.5);
  PhaseSharing s;
  s.has_convert = p.convert_busy > 0;
  s.has_cpu_memory = sc * hm_cpu > 0;
  const double duplex[kSharedStreams] = {sh, sd, 0, 0};
  const double hm[kSharedStreams] = {N * sh * hm_copy, N * sd * hm_copy, sc * hm_cpu, s.has_convert ? sv * 1.5 : 0.0};
  const double cap[kSharedStreams] = {std::min(1.0, c.h2d_root_Bps / (N * sh)), std::min(1.0, c.d2h_root_Bps / (N * sd)), 1, 1};
  // The recurrence's unit factor stands for one direction alone on a rank's link with every
  // rank's copy in that direction active (h2d_rate0_, d2h_rate0_), the CPU at all its threads.
  const double h = std::min(c.h2d_link_Bps, c.duplex_Bps), d = std::min(c.d2h_link_Bps, c.duplex_Bps);
  s.standalone = {sh / h, sd / d, sc / cpu_rate, s.has_convert ? sv / conv_rate : 1.0};
  for (int mask = 1; mask < (1 << kSharedStreams); ++mask)
    if (s.has_convert || !(mask & (1 << kSharedConvert)))  // combinations with no conversion weigh 0
      fill_levels(mask, duplex, hm, cap, X, HM, s.level[static_cast<std::size_t>(mask)]);
  return s;
}

// The contention factors of phase `p` (`drains`: the step's last backward, after which the CPU
// drains alone) at the utilizations p's busy times give.
PhaseContention contention_at(const PhaseSharing& s, const PhaseStats& p, bool drains) {
  PhaseContention f;
  // The last backward phase is judged up to its last compute; the drain after it is separate.
  const double T = (drains ? p.gpu_end : p.end) - p.start;
  if (T <= 0) return f;
  const double u[kSharedStreams] = {std::min(1.0, p.h2d_busy / T), std::min(1.0, p.d2h_busy / T),
                                    std::min(1.0, p.cpu_busy / T), std::min(1.0, p.convert_busy / T)};
  // Each stream's expected share given that it is active itself: the combinations that contain
  // it, weighed by the other streams' probabilities.
  const auto expected = [&](int self) {
    // The other streams' combinations and their probabilities, one stream at a time.
    std::array<double, 1 << (kSharedStreams - 1)> weight;
    std::array<int, 1 << (kSharedStreams - 1)> mask;
    weight[0] = 1, mask[0] = 1 << self;
    std::size_t n = 1;
    for (int j = 0; j < kSharedStreams; ++j) {
      if (j == self) continue;
      for (std::size_t t = 0; t < n; ++t) {
        weight[n + t] = weight[t] * u[j];
        mask[n + t] = mask[t] | (1 << j);
        weight[t] *= 1.0 - u[j];
      }
      n *= 2;
    }
    double e = 0;
    for (std::size_t t = 0; t < n; ++t) e += weight[t] * s.level[static_cast<std::size_t>(mask[t])][static_cast<std::size_t>(self)];
    return s.standalone[static_cast<std::size_t>(self)] * e;
  };
  f.h2d = expected(kSharedH2D);
  f.d2h = expected(kSharedD2H);
  f.cpu = s.has_cpu_memory ? expected(kSharedCpu) : s.standalone[kSharedCpu];
  if (s.has_convert) f.convert = expected(kSharedConvert);
  if (drains) f.cpu_drain = s.standalone[kSharedCpu];
  return f;
}

// The phases' statistics if their streams ran at contention factors `f` instead of none (`base`
// is the uncontended run): every stream does the same work at the reduced rate, first what it
// carried over from earlier phases. A phase lasts as long as it did or as long as its copies now
// need, whichever is longer (contention never shortens a phase; the computes wait for the
// copies); the CPU's work that does not fit carries into the next phase, as in the recurrence.
void stretch_phases(const std::vector<PhaseStats>& base, const std::vector<PhaseContention>& f, bool last_drains,
                    std::vector<PhaseStats>& out, const std::vector<long>& micro_repeat) {
  SLIDEDP_CHECK(micro_repeat.empty() || base.size() == 2 * micro_repeat.size(), "two phases per stored micro-step");
  out = base;
  // Work left over from earlier phases, per stream, in seconds at the uncontended rate.
  std::array<double, kSharedStreams> carry{};
  // Phase k's length at factors f: as long as it was, or as long as its copies now need. The copies
  // (and SlideFormer's conversion) feed the computes: they hold the phase, so they never carry.
  const auto length = [&](std::size_t k, const std::array<double, kSharedStreams>& c) {
    const PhaseStats& p = base[k];
    const double end = last_drains && k + 1 == base.size() ? p.gpu_end : p.end;
    const auto need = [&](std::size_t i, double busy, double factor) { return (c[i] + busy) / factor; };
    return std::max({end - p.start, need(kSharedH2D, p.h2d_busy, f[k].h2d), need(kSharedD2H, p.d2h_busy, f[k].d2h),
                     need(kSharedConvert, p.convert_busy, f[k].convert)});
  };
  // The CPU does not hold the phase: its work that does not fit queues on into the next phase.
  const auto stretch = [&](std::size_t k) {
    PhaseStats& p = out[k];
    double& end = last_drains && k + 1 == out.size() ? p.gpu_end : p.end;
    const std::array<double*, kSharedStreams> busy = {&p.h2d_busy, &p.d2h_busy, &p.cpu_busy, &p.convert_busy};
    const std::array<double, kSharedStreams> factor = {f[k].h2d, f[k].d2h, f[k].cpu, f[k].convert};
    const double T = length(k, carry);
    end = p.start + T;
    for (std::size_t i = 0; i < kSharedStreams; ++i) {
      const double b = std::min(T, (carry[i] + *busy[i]) / factor[i]);
      carry[i] = std::max(0.0, carry[i] + *busy[i] - b * factor[i]);
      *busy[i] = b;
    }
  };
  if (micro_repeat.empty()) {
    for (std::size_t k = 0; k < out.size(); ++k) stretch(k);
    return;
  }
  for (std::size_t m = 0; m < micro_repeat.size(); ++m) {
    const std::size_t k = 2 * m;
    if (micro_repeat[m] > 1) {
      // Per phase the CPU's carry goes c -> max(0, c + beta_k), beta_k = its work - T_k x its factor
      // (T_k does not depend on the CPU's carry); per pair c -> max(alpha, c + beta) with
      // alpha = max(0, beta_2), beta = beta_1 + beta_2; after n pairs max(alpha + max(0, (n-1) beta), c + n beta).
      const std::array<double, kSharedStreams> no_carry{};
      const double beta1 = base[k].cpu_busy - length(k, no_carry) * f[k].cpu;
      const double beta2 = base[k + 1].cpu_busy - length(k + 1, no_carry) * f[k + 1].cpu;
      const double alpha = std::max(0.0, beta2), beta = beta1 + beta2;
      const double n = static_cast<double>(micro_repeat[m] - 1);  // repetitions before the last
      carry[kSharedCpu] = std::max(alpha + std::max(0.0, (n - 1) * beta), carry[kSharedCpu] + n * beta);
    }
    stretch(k);
    stretch(k + 1);
  }
}

// Full steps while they contract; the step halves whenever the change does not shrink, since the
// map can oscillate between over- and under-contended. (The earlier scheme re-ran the recurrence for
// each of 4 damped iterations, a step each, and stopped short of the fixed point; solving it here
// is cheaper and agrees better with the simulator, results/model/agreement.md.)
std::vector<PhaseContention> solve_contention(const StepWork& sw, const std::vector<PhaseStats>& phases,
                                              const std::vector<long>& micro_repeat) {
  const std::size_t P = phases.size();
  const auto drains = [&](std::size_t k) { return k + 1 == P && !sw.traits.update_after_backward; };
  std::vector<PhaseSharing> sharing(P);
  std::vector<PhaseContention> f(P), g(P);
  for (std::size_t k = 0; k < P; ++k) {
    sharing[k] = phase_sharing(sw, phases[k]);
    f[k] = contention_at(sharing[k], phases[k], drains(k));
  }
  double step = 1.0, last_change = std::numeric_limits<double>::infinity();
  std::vector<PhaseStats> st;
  for (int it = 1; it < kMaxContentionIterations; ++it) {
    double change = 0;
    stretch_phases(phases, f, !sw.traits.update_after_backward, st, micro_repeat);
    for (std::size_t k = 0; k < P; ++k) {
      g[k] = contention_at(sharing[k], st[k], drains(k));
      change = std::max({change, std::fabs(g[k].h2d - f[k].h2d), std::fabs(g[k].d2h - f[k].d2h),
                         std::fabs(g[k].cpu - f[k].cpu), std::fabs(g[k].convert - f[k].convert)});
    }
    if (change > kContractionWanted * last_change) step *= 0.5;
    last_change = change;
    for (std::size_t k = 0; k < P; ++k) {
      const auto move = [step](double& to, double from) { to = from + step * (to - from); };
      move(g[k].h2d, f[k].h2d);
      move(g[k].d2h, f[k].d2h);
      move(g[k].cpu, f[k].cpu);
      move(g[k].convert, f[k].convert);
    }
    std::swap(f, g);
    if (step * change < kContentionTolerance) break;
  }
  return f;
}

}  // namespace slidedp
