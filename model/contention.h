// Mean-field contention between a rank's host-side streams (H2D copies, D2H copies, the CPU's
// reduction/update, SlideFormer's conversion), phase by phase: the factors by which sharing the
// duplex link, host memory and the PCIe root complex slows each stream, and the fixed point of
// sharing <-> utilization over a step's phases. The step model's recurrence (step_recurrence.cc) runs
// with these factors; docs/MODEL.md section 2 derives them.
#pragma once

#include <array>
#include <vector>

#include "model/step_work.h"

namespace slidedp {

// Mean-field contention: the factor by which a stream's standalone rate is reduced in one phase
// because other streams share the link duplex or host memory with it, weighted by how busy those
// other streams are in that phase (solve_contention).
struct PhaseContention {
  double h2d = 1.0, d2h = 1.0, cpu = 1.0, convert = 1.0;
  // After the step's last backward compute (the drain) the CPU runs with no copies beside it.
  double cpu_drain = 1.0;
};
struct PhaseStats {
  double start = 0, end = 0;
  double gpu_end = 0;  // last compute of the phase
  double h2d_busy = 0, d2h_busy = 0, cpu_busy = 0;  // seconds the stream was busy
  double convert_busy = 0;                            // SlideFormer's per-rank conversion
  double cpu_thread_s = 0, cpu_host_mem_bytes = 0;
};

// Mean-field contention (docs/MODEL.md, section 2). Each stream's rate factor in a phase is the
// expectation, over whether each other stream is active (on with probability its utilization,
// independently), of the share it gets in that state: while a stream runs alone it gets its
// standalone rate, while others overlap it the duplex link and host memory are shared by
// progressive filling, as the simulator shares them (fluid_engine.cc): every active stream rises
// by the same fraction of its standalone rate until a resource saturates; the streams on it stop
// there, the rest rise on. So two copies held to half rate by the duplex link use half their
// host-memory bandwidth, and the CPU gets the rest. (Dividing by the utilization-weighted demand
// instead, the earlier mean field, charges a partial overlap as if it lasted the whole phase;
// taking each stream's share as min(cap / total demand) over both resources charges the CPU for
// copy traffic the duplex link never lets through.)
//
// The streams' demands in a phase do not change with the utilizations, so the share of every
// stream in every combination of active streams is computed once per phase (PhaseSharing) and
// each fixed-point iteration only re-weighs the combinations.
enum SharedStream { kSharedH2D, kSharedD2H, kSharedCpu, kSharedConvert, kSharedStreams };

struct PhaseSharing {
  // level[mask][i]: the fraction of its standalone rate stream i gets while the streams in `mask`
  // (bit i = stream i) are active.
  std::array<std::array<double, kSharedStreams>, 1 << kSharedStreams> level{};
  // Standalone rate over the rate the recurrence's unit factor stands for (host memory may cap a
  // stream running alone); 1 for a stream the phase does not have.
  std::array<double, kSharedStreams> standalone{1, 1, 1, 1};
  bool has_cpu_memory = false, has_convert = false;
};

// Progressive filling of the duplex link (capacity X) and host memory (HM) among the streams in
// `mask` (bit i = stream i), whose demands at their standalone rates are duplex[i] and hm[i];
// stream i cannot rise beyond cap[i] (its PCIe root complex's share). level[i] is what each of them
// gets, as a fraction of its standalone rate; streams outside `mask` are left as they are.
void fill_levels(int mask, const double* duplex, const double* hm, const double* cap, double X, double HM,
                 std::array<double, kSharedStreams>& level);

// The shares of phase `p`'s streams in every combination of active streams.
PhaseSharing phase_sharing(const StepWork& sw, const PhaseStats& p);

// The contention factors of phase `p` (`drains`: the step's last backward, after which the CPU
// drains alone) at the utilizations p's busy times give.
PhaseContention contention_at(const PhaseSharing& s, const PhaseStats& p, bool drains);

// The phases of a step as the recurrence stores them: two per micro-step (forward, backward), where
// `micro_repeat[m]` (when given) says how many consecutive micro-steps the m-th pair stands for: the
// recurrence jumps over the periodic middle of a long accumulation (step_recurrence.cc), whose
// micro-steps are identical. Empty: every pair is one micro-step.
//
// A repeated pair gets one factor per phase, from its stretched statistics at its last repetition:
// the CPU's carry into that repetition is in closed form (per pair c -> max(alpha, c + beta), see
// stretch_phases), the copies never carry. The full model would give the repetitions whose carry
// still drains from the micro-steps before their own factors; the pair's factor is the steady one.

// The phases' statistics if their streams ran at factors `f` instead of none (`base` is the
// uncontended run; `last_drains`: the last phase ends at its last compute, the drain follows).
void stretch_phases(const std::vector<PhaseStats>& base, const std::vector<PhaseContention>& f, bool last_drains,
                    std::vector<PhaseStats>& out, const std::vector<long>& micro_repeat = {});

// The contention factors of every phase: the fixed point of sharing <-> utilization solved on the
// phase level from the uncontended run's `phases`: each iteration stretches them by the current
// factors (stretch_phases) and re-derives the factors (contention_at).
std::vector<PhaseContention> solve_contention(const StepWork& sw, const std::vector<PhaseStats>& phases,
                                              const std::vector<long>& micro_repeat = {});

}  // namespace slidedp
