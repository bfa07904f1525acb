// Non-negative weighted least squares by support enumeration; see fit.h. With p <= 4 columns there
// are at most 16 supports: the NNLS optimum is the unconstrained solution on its own support (KKT),
// so the feasible support solution with the smallest residual is the optimum.
#include "profiler/fit.h"

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <set>

#include "common/error.h"

namespace slidedp::profiler {

LinearFit fit_nonnegative(const std::vector<std::vector<double>>& X, const std::vector<double>& y) {
  const int n = static_cast<int>(y.size());
  SLIDEDP_CHECK(n >= 1 && X.size() == y.size(), "fit: one row per sample");
  const int p = static_cast<int>(X.front().size());
  SLIDEDP_CHECK(p >= 1 && p <= 4, "fit: 1..4 columns");
  Eigen::MatrixXd A(n, p);
  Eigen::VectorXd b(n);
  for (int i = 0; i < n; ++i) {
    SLIDEDP_CHECK(static_cast<int>(X[static_cast<std::size_t>(i)].size()) == p, "fit: ragged rows");
    const double yi = y[static_cast<std::size_t>(i)];
    SLIDEDP_CHECK(std::isfinite(yi) && yi > 0, "fit: samples must be positive and finite");
    // Relative weighting: divide each row and its target by y_i.
    for (int j = 0; j < p; ++j) A(i, j) = X[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] / yi;
    b(i) = 1.0;
  }
  Eigen::VectorXd best = Eigen::VectorXd::Zero(p);
  double best_sse = b.squaredNorm();  // the empty support
  for (int mask = 1; mask < (1 << p); ++mask) {
    std::vector<int> cols;
    for (int j = 0; j < p; ++j)
      if (mask & (1 << j)) cols.push_back(j);
    if (static_cast<int>(cols.size()) > n) continue;
    // Columns scaled to unit norm first: bytes (1e8) next to a constant (1) would otherwise make the
    // rank decision depend on units.
    Eigen::MatrixXd As(n, static_cast<Eigen::Index>(cols.size()));
    Eigen::VectorXd scale(static_cast<Eigen::Index>(cols.size()));
    for (std::size_t k = 0; k < cols.size(); ++k) {
      const auto kk = static_cast<Eigen::Index>(k);
      scale(kk) = A.col(cols[k]).norm();
      if (scale(kk) == 0) scale(kk) = 1;
      As.col(kk) = A.col(cols[k]) / scale(kk);
    }
    // Column-pivoting QR: rank-revealing, so a degenerate support is skipped rather than solved.
    Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(As);
    if (qr.rank() < static_cast<Eigen::Index>(cols.size())) continue;
    Eigen::VectorXd c = qr.solve(b);
    const double sse = (As * c - b).squaredNorm();
    c = c.cwiseQuotient(scale);
    if ((c.array() < 0).any() || !c.allFinite()) continue;
    if (sse < best_sse) {
      best_sse = sse;
      best.setZero();
      for (std::size_t k = 0; k < cols.size(); ++k) best(cols[k]) = c(static_cast<Eigen::Index>(k));
    }
  }
  LinearFit f;
  f.coef.assign(best.data(), best.data() + p);
  const Eigen::VectorXd r = b - A * best;  // (y - fit) / y
  f.rel_residual.assign(r.data(), r.data() + n);
  f.quality.n = n;
  double ss = 0;
  for (int i = 0; i < n; ++i) {
    ss += r(i) * r(i);
    f.quality.max_rel_residual = std::max(f.quality.max_rel_residual, std::abs(r(i)));
  }
  f.quality.rms_rel_residual = std::sqrt(ss / n);
  return f;
}

LatencyBandwidth fit_latency_bandwidth(std::span<const XY> s) {
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (const XY& p : s) {
    X.push_back({1.0, p.x});
    y.push_back(p.y);
  }
  LinearFit f = fit_nonnegative(X, y);
  LatencyBandwidth out;
  out.latency_s = f.coef[0];
  out.quality = f.quality;
  if (f.coef[1] > 0) {
    out.gbps = 1.0 / f.coef[1] / 1e9;
  } else {
    const XY* big = &s.front();
    for (const XY& p : s)
      if (p.x > big->x) big = &p;
    out.gbps = big->x / big->y / 1e9;
    out.resolved = false;
  }
  return out;
}

UnitFit fit_unit_time(std::span<const UnitSample> s) {
  std::set<double> seq_lens;
  for (const UnitSample& u : s) seq_lens.insert(u.seq_len);
  UnitFit out;
  out.ctx_term = seq_lens.size() >= 2;
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (const UnitSample& u : s) {
    if (out.ctx_term)
      X.push_back({1.0, u.tokens, u.tokens * u.seq_len});
    else
      X.push_back({1.0, u.tokens});
    y.push_back(u.seconds);
  }
  LinearFit f = fit_nonnegative(X, y);
  out.fit.fixed_s = f.coef[0];
  out.fit.per_token_s = f.coef[1];
  out.fit.per_token_ctx_s = out.ctx_term ? f.coef[2] : 0.0;
  out.quality = f.quality;
  return out;
}

}  // namespace slidedp::profiler
