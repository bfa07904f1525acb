// The pacer; see pacer.h. The fluid state is the simulator's (progressive filling over the machine's
// resources), advanced in real time: between two events (a flow starts flowing, a flow ends) every
// rate is constant, so advancing to a target time t walks those events in order.
#include "executor/cpu/pacer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace slidedp::exec {
namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A waiter re-evaluates at least this often (wall seconds), in case rates changed without a wake-up;
// below the minimum a wait is not worth a sleep: the flow is taken as ended (a few microseconds early
// at most).
constexpr double kMaxWaitS = 0.05;
constexpr double kMinWaitS = 2e-6;
// A flow that was done this long (wall seconds) before its owner asked counts as an overrun: below
// it, the difference is the wake-up latency of the waiting thread, not the real work.
constexpr double kOverrunSlackS = 200e-6;

}  // namespace

Pacer::Pacer(const Capacities& target, double time_scale, std::function<double()> wall_clock)
    : res_(target), scale_(time_scale), wall_(wall_clock ? std::move(wall_clock) : std::function<double()>(wall_s)),
      origin_wall_s_(wall_()) {
  SLIDEDP_CHECK(time_scale > 0 && std::isfinite(time_scale), "the time scale must be positive");
}

double Pacer::now_t() const { return (wall_() - origin_wall_s_) / scale_; }

void Pacer::reallocate(std::vector<Flow>& flows, double t) const {
  std::vector<const Usages*> usages;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < flows.size(); ++i) {
    Flow& f = flows[i];
    f.rate = 0;
    if (f.live && f.end_t < 0 && f.start_t <= t && f.remaining > 0) {
      usages.push_back(&f.usages);
      which.push_back(i);
    }
  }
  std::vector<double> rate;
  progressive_fill(res_.capacity, usages, rate);
  for (std::size_t k = 0; k < which.size(); ++k) flows[which[k]].rate = rate[k];
}

// A flow whose end lies closer to the clock than the clock's rounding can resolve (a tiny work at a
// late clock) ends now: otherwise the next event is the clock itself and no loop would move. Returns
// whether any did.
bool Pacer::end_unresolvable(std::vector<Flow>& flows, double clock) {
  bool any = false;
  for (Flow& f : flows)
    if (f.live && f.end_t < 0 && f.start_t <= clock && f.rate > 0 && clock + f.remaining / f.rate <= clock)
      f.remaining = 0, f.end_t = clock, any = true;
  return any;
}

void Pacer::advance(std::vector<Flow>& flows, double& clock, double t) const {
  // Also when the clock does not move (t == clock): a flow due within the clock's rounding ends now.
  reallocate(flows, clock);
  end_unresolvable(flows, clock);
  while (clock < t) {
    reallocate(flows, clock);
    end_unresolvable(flows, clock);
    double next = t;
    for (const Flow& f : flows) {
      if (!f.live || f.end_t >= 0) continue;
      if (f.start_t > clock) next = std::min(next, f.start_t);
      else if (f.rate > 0) next = std::min(next, clock + f.remaining / f.rate);
    }
    const double dt = next - clock;
    for (Flow& f : flows) {
      if (!f.live || f.end_t >= 0 || f.start_t > clock || f.rate <= 0) continue;
      f.remaining -= f.rate * dt;
      if (f.remaining <= 1e-9 * f.rate + 1e-300) f.remaining = 0, f.end_t = next;
    }
    // A flow whose delay ends with nothing to flow is done when it starts.
    for (Flow& f : flows)
      if (f.live && f.end_t < 0 && f.start_t <= next && f.remaining <= 0) f.end_t = std::max(f.start_t, clock);
    clock = next;
  }
}

double Pacer::end_time(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return end_time_locked(id, now_t());
}

double Pacer::end_time_locked(int id, double now) const {
  std::vector<Flow> flows = flows_;
  double clock = clock_t_;
  advance(flows, clock, std::max(clock, now));
  const Flow& f = flows.at(static_cast<std::size_t>(id));
  SLIDEDP_CHECK(f.live, "end_time of a flow that is not running");
  while (f.end_t < 0) {
    // Run forward to the next event: the earliest start or end among the flows.
    reallocate(flows, clock);
    if (end_unresolvable(flows, clock) && f.end_t >= 0) break;
    double next = std::numeric_limits<double>::infinity();
    for (const Flow& g : flows) {
      if (!g.live || g.end_t >= 0) continue;
      if (g.start_t > clock) next = std::min(next, g.start_t);
      else if (g.rate > 0) next = std::min(next, clock + g.remaining / g.rate);
    }
    SLIDEDP_CHECK(std::isfinite(next), "a paced flow can never finish (a resource of capacity 0)");
    advance(flows, clock, next);
  }
  return f.end_t;
}

int Pacer::begin(const Usages& usages, double work, double delay_s) {
  SLIDEDP_CHECK(work >= 0 && delay_s >= 0 && std::isfinite(work) && std::isfinite(delay_s), "bad paced work");
  SLIDEDP_CHECK(work == 0 || !usages.empty(), "paced work must draw from some resource");
  std::lock_guard<std::mutex> lock(mutex_);
  const double t = now_t();
  advance_locked(t);
  int id;
  if (free_.empty()) {
    id = static_cast<int>(flows_.size());
    flows_.emplace_back();
  } else {
    id = free_.back();
    free_.pop_back();
  }
  Flow& f = flows_[static_cast<std::size_t>(id)];
  f = Flow{};
  f.usages = usages;
  f.remaining = work;
  f.start_t = t + delay_s;
  f.live = true;
  if (work <= 0 && delay_s <= 0) f.end_t = t;
  cv_.notify_all();  // the others' rates change
  return id;
}

void Pacer::finish(int id) {
  std::unique_lock<std::mutex> lock(mutex_);
  // By index, never by reference: begin() on another thread may grow flows_ while this one waits.
  const auto k = static_cast<std::size_t>(id);
  SLIDEDP_CHECK(k < flows_.size() && flows_[k].live, "finish of a flow that is not running");
  double t = now_t();
  advance_locked(t);
  if (flows_[k].end_t >= 0 && (t - flows_[k].end_t) * scale_ > kOverrunSlackS) {
    ++overruns_;
    overrun_s_ += (t - flows_[k].end_t) * scale_;
  }
  while (flows_[k].end_t < 0 && !cancelled_) {
    // When it ends if no other flow starts (a new flow wakes every waiter to look again).
    const double until_t = end_time_locked(id, t);
    const double wait_s = std::min((until_t - t) * scale_, kMaxWaitS);
    if (wait_s > kMinWaitS) cv_.wait_for(lock, std::chrono::duration<double>(wait_s));
    t = std::max(now_t(), std::min(until_t, now_t() + kMinWaitS / scale_));
    advance_locked(t);
  }
  flows_[k].live = false;
  free_.push_back(id);
  ++finished_;
  cv_.notify_all();
}

void Pacer::cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  cv_.notify_all();
}

int64_t Pacer::flows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

int64_t Pacer::overruns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overruns_;
}

double Pacer::overrun_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overrun_s_;
}

}  // namespace slidedp::exec
