// Least-squares fits of the profiler (Eigen): latency + bytes / bandwidth for copies and collectives,
// time vs tokens (and tokens x seq_len) for units, time vs extra gradient slots for the fused
// reduction. All coefficients are physical quantities that cannot be negative, so the fit is
// non-negative least squares, solved exactly by trying every support (at most 2^3 of them). Samples
// are weighted by 1 / y, so a 64 KiB copy counts as much as a 256 MiB one: the fit minimizes
// relative error, and residuals are reported relative to the measurement.
#pragma once

#include <span>
#include <vector>

#include "model/hardware.h"

namespace slidedp::profiler {

struct FitQuality {
  int n = 0;                    // samples
  double rms_rel_residual = 0;  // sqrt(mean(((y - fit) / y)^2))
  double max_rel_residual = 0;  // max |y - fit| / y
};

struct LinearFit {
  std::vector<double> coef;          // >= 0, one per column of X
  std::vector<double> rel_residual;  // (y - fit) / y per sample
  FitQuality quality;
};

// min sum_i ((y_i - X_i . coef) / y_i)^2 subject to coef >= 0. X is row-major (n rows of p
// columns, p <= 4), y > 0. Aborts on malformed input (a bug in the caller).
LinearFit fit_nonnegative(const std::vector<std::vector<double>>& X, const std::vector<double>& y);

// seconds = latency_s + bytes / (gbps * 1e9), from (bytes, seconds) pairs.
struct XY {
  double x = 0, y = 0;
};
struct LatencyBandwidth {
  double latency_s = 0;
  double gbps = 0;
  // false when noise hid the size dependence (the fit's slope was 0): gbps is then the rate of the
  // largest size and latency_s the fit's (all of the time), so the profile stays usable and says so.
  bool resolved = true;
  FitQuality quality;
};
LatencyBandwidth fit_latency_bandwidth(std::span<const XY> bytes_seconds);

// Unit compute: seconds = fixed_s + per_token_s * tokens + per_token_ctx_s * tokens * seq_len. The
// context term is fitted only when the samples cover at least two sequence lengths (otherwise it is
// collinear with the per-token term and left at 0).
struct UnitSample {
  double tokens = 0, seq_len = 0, seconds = 0;
};
struct UnitFit {
  TimeFit fit;
  bool ctx_term = false;
  FitQuality quality;
};
UnitFit fit_unit_time(std::span<const UnitSample> samples);

}  // namespace slidedp::profiler
