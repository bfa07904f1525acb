// Real-time pacing of the CPU backend to a target machine: an operation's work is really done, then
// held until the target would have finished it, with time stretched by a scale S. Operations are
// flows on the target's resources (model/machine_resources.h: per-rank GPU, links and duplex, fabric
// ports; the PCIe root complex, host memory, the CPU update threads), sharing them by progressive
// filling (model/fluid_engine.h), the simulator's rule: a copy slows down while the optimizer
// saturates host memory, two ranks' H2D copies share the root complex, and so on. The fluid state
// advances exactly, flow by flow, whenever a flow starts or a waiter looks at it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "model/machine_resources.h"

namespace slidedp::exec {

class Pacer {
 public:
  using Usages = MachineResources::Usages;
  // `time_scale` S > 0: one second of the target lasts S seconds here. `wall_clock` (seconds, any
  // origin): the steady clock unless a test drives time itself.
  Pacer(const Capacities& target, double time_scale, std::function<double()> wall_clock = {});

  const MachineResources& resources() const { return res_; }
  double time_scale() const { return scale_; }

  // Starts a flow now: `delay_s` target seconds of latency, then `work` units drawing `usages` per
  // unit. Returns its id for finish(). A flow with no work and no delay finishes at once.
  int begin(const Usages& usages, double work, double delay_s = 0);
  // Blocks until the flow is done on the target's clock. When it already is (the real operation
  // took longer than the target would), that is counted as an overrun.
  void finish(int flow);
  // Ends every wait in finish() now and every later one at once (an aborted run: a paced wait can
  // last hours of wall time at a large scale). Thread-safe.
  void cancel();

  // The target time at which `flow` ends if no other flow starts (the fluid state run forward from
  // now); for tests of the sharing, which need no waiting.
  double end_time(int flow) const;

  int64_t flows() const;     // flows finished
  int64_t overruns() const;  // of those, flows whose real work outlasted their paced time
  double overrun_s() const;  // the wall seconds by which they did, together

 private:
  struct Flow {
    Usages usages;
    double remaining = 0;    // work still to flow
    double start_t = 0;      // target time at which the work begins to flow (after the delay)
    double end_t = -1;       // target time at which it finished (-1: not yet)
    double rate = 0;
    bool live = false;
  };
  double now_t() const;  // the target's clock: wall seconds since construction / S
  void advance_locked(double t) { advance(flows_, clock_t_, t); }
  static bool end_unresolvable(std::vector<Flow>& flows, double clock);  // see pacer.cc
  // Brings every flow to target time t, event by event (a flow starts flowing, a flow ends).
  void advance(std::vector<Flow>& flows, double& clock, double t) const;
  void reallocate(std::vector<Flow>& flows, double t) const;  // rates of the flows flowing at t
  double end_time_locked(int flow, double now) const;
  bool cancelled_ = false;  // under mutex_

  MachineResources res_;
  double scale_;
  std::function<double()> wall_;
  double origin_wall_s_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Flow> flows_;           // by id; finished slots are reused
  std::vector<int> free_;
  double clock_t_ = 0;                // the fluid state is exact up to this target time
  int64_t finished_ = 0, overruns_ = 0;
  double overrun_s_ = 0;
};

}  // namespace slidedp::exec
