// Jumping the periodic regime of a run of identical units (docs/MODEL.md section 2, "jumping the
// periodic regime"): a speed-up of the step model's recurrence, never a change of its result.
//
// Over a run of identical decoder layers the recurrence's per-unit map F is piecewise affine with
// unit slopes: every stream time is a max of other times plus constants. Once the stream times moved
// alike over two consecutive units, the whole state x is taken after this unit and the next; d is
// their difference. While every max takes the branch it took for d, the state after n more layers is
// x + n d, and each compared difference is affine in the layer index, so it keeps its sign between
// two points where it has the same sign. The jump to layer j is verified by running j for real from
// x + (j - u - 1) d: a branch that changed anywhere in between is changed there too, and the verified
// step shows a different d (which also catches a d that was not yet the regime's). A failed
// verification bisects for the last layer that follows the regime. An 80-layer model then costs a
// few layers per phase, not 80.
//
// The jump knows nothing of what the state means. Its target (the recurrence, step_recurrence.cc)
// provides, as members the template calls directly (the planner's inner loop has no virtual calls):
//   std::array<double, 6> stream_times() const;                // the cheap watch
//   void save_state(JumpState& x, int u, int dir) const;       // the state after unit u, zero-padded
//   void load_state(const JumpState& x, const JumpState& d, int n, int u, int dir);  // x + n d
//   void run_unit(int u, int dir);                             // the map F for unit u
// evaluate_step_work(..., jump_regime = false) runs every unit instead; tests/model/regime_jump_test.cc
// holds the two to the same result on random plans.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdlib>

#include "model/step_model.h"

namespace slidedp {

// Two per-step changes of one state component are the same up to rounding of its magnitude:
// same_delta, or delta_excess <= 0. Shared by the jump over layers (below) and over micro-steps
// (step_recurrence.cc).
inline double delta_excess(double a, double b, double magnitude) {
  return std::fabs(a - b) - 1e-12 * (std::fabs(magnitude) + std::fabs(a) + std::fabs(b));
}
inline bool same_delta(double a, double b, double magnitude) { return delta_excess(a, b, magnitude) <= 0; }

// Fixed-size state buffers: a target whose state does not fit runs every unit.
constexpr std::size_t kJumpStateMax = 64;
using JumpState = std::array<double, kJumpStateMax>;

class RegimeJump {
 public:
  // `state_padded`: the target's state size rounded up to a multiple of 4 (<= kJumpStateMax).
  explicit RegimeJump(std::size_t state_padded = 0) : n_state_(state_padded) {}

  // A new phase: nothing watched, the attempt budget full again.
  void reset() {
    history_ = 0;
    attempts_ = 0;
    armed_ = false;
  }

  // Called after unit u was processed in direction dir (+1 forward, -1 backward). `eligible`: the
  // maps of units u - dir .. u are the same (identical units, the loop's index tests constant);
  // `last`: the last unit of the run of identical units ahead. Returns the last unit processed: u,
  // or the end of a verified jump, with the target's state there.
  template <class Target>
  int after_unit(Target& t, int u, int dir, bool eligible, int last, RecurrenceCounters& counters) {
    if (!eligible || attempts_ >= kMaxAttempts) {
      history_ = 0;
      armed_ = false;
      return u;
    }
    if (!armed_) {
      // Watch the stream times (cheap): once two consecutive units moved them alike, take the
      // whole state here and after the next unit, and try the jump with that change.
      keys_[history_ % 3] = t.stream_times();
      const std::array<double, 6>& k = keys_[history_ % 3];
      ++history_;
      if (history_ < 3) return u;
      const std::array<double, 6>& k1 = keys_[(history_ - 2) % 3];
      const std::array<double, 6>& k0 = keys_[(history_ - 3) % 3];
      bool settled = true;
      for (std::size_t i = 0; i < k.size(); ++i) settled &= same_delta(k[i] - k1[i], k1[i] - k0[i], k[i]);
      if (!settled) return u;
      t.save_state(hist_[0], u, dir);
      armed_ = true;
      return u;
    }
    armed_ = false;
    history_ = 0;
    JumpState& x = hist_[1];
    t.save_state(x, u, dir);
    for (std::size_t i = 0; i < n_state_; ++i) d_[i] = x[i] - hist_[0][i];
    const int n = std::abs(last - u);
    // Bisection for the last layer of the run that follows the regime: `good` layers past u are
    // verified (the state there is x + good d), the regime breaks at or before `bad`.
    int good = 0, bad = n + 1, try_n = n;
    while (bad - good > kMinJump && attempts_ < kMaxAttempts) {
      ++attempts_;
      ++counters.verifications;
      const int j = u + dir * try_n;
      t.load_state(x, d_, try_n - 1, u, dir);
      t.run_unit(j, dir);
      t.save_state(y_, j, dir);
      // How far past its tolerance the worst component is: four running maxima, so the
      // comparisons do not wait on each other (the state is padded with zeros to a multiple of 4).
      double worst4[4] = {0, 0, 0, 0};
      const double steps = try_n - 1;
      for (std::size_t i = 0; i < n_state_; i += 4)
        for (std::size_t l = 0; l < 4; ++l)
          worst4[l] = std::max(worst4[l], delta_excess(y_[i + l] - (x[i + l] + steps * d_[i + l]), d_[i + l], y_[i + l]));
      const double worst = std::max(std::max(worst4[0], worst4[1]), std::max(worst4[2], worst4[3]));
      if (worst <= 0) {
        good = try_n;
      } else {
        bad = try_n;
      }
      try_n = (good + bad) / 2;
    }
    if (good < kMinJump) {
      t.load_state(x, d_, 0, u, dir);  // nothing worth the jump: back to unit u
      return u;
    }
    t.load_state(x, d_, good, u, dir);
    history_ = 0;
    ++counters.jumps;
    counters.layers_jumped += good;
    return u + dir * good;
  }

 private:
  // Verifications per phase: a phase whose regime keeps breaking stops trying.
  static constexpr int kMaxAttempts = 24;
  // A verification (save, load, one unit, compare) costs about what five units do: shorter jumps
  // and finer bisection do not pay.
  static constexpr int kMinJump = 6;

  std::size_t n_state_ = 0;
  JumpState hist_[2]{}, d_{}, y_{};  // the state after two consecutive units, one unit's change, a verified state
  std::array<double, 6> keys_[3]{};   // stream times after the last three units
  int history_ = 0, attempts_ = 0;
  bool armed_ = false;  // hist_[0] holds the state after the previous unit
};

}  // namespace slidedp
