// A fluid (flow-level) discrete-event engine: tasks with an amount of work, a per-unit-of-work usage
// of each resource they touch, and precedence. Active tasks share every resource by weighted max-min
// fairness: each gets the same fraction of the speed it would have alone (progressive filling), so a
// DMA that needs a link and host memory slows down when the optimizer saturates host memory, exactly
// as much as the optimizer does. Streams (CUDA-like in-order queues) are precedence chains.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slidedp {

class FluidEngine {
 public:
  struct Usage {
    int resource = 0;
    double per_work = 0;  // resource units consumed per unit of the task's work
  };
  struct Task {
    double work = 0;     // bytes, thread-seconds or seconds, whatever the usages are per
    double delay_s = 0;  // fixed latency paid before the work flows (the task holds its stream)
    std::vector<Usage> usages;
    std::vector<int> deps;
    // Reporting.
    int track = -1;      // timeline track id (-1: not recorded)
    std::string label;
    int tag = 0;         // caller's classification (compute, copy, update, ...)
    // Results.
    double start_s = -1;  // when all deps were done
    double end_s = -1;
  };

  int add_resource(const std::string& name, double capacity);
  int add_task(Task task);  // returns its id; deps must refer to earlier tasks
  Task& task(int id) { return tasks_[static_cast<std::size_t>(id)]; }
  const Task& task(int id) const { return tasks_[static_cast<std::size_t>(id)]; }
  int num_tasks() const { return static_cast<int>(tasks_.size()); }
  const std::string& resource_name(int r) const { return resources_[static_cast<std::size_t>(r)].name; }
  int num_resources() const { return static_cast<int>(resources_.size()); }
  // Work done on each resource (resource units), and its busy time = work / capacity.
  double resource_busy_s(int r) const;

  // Runs every task to completion. Aborts (SLIDEDP_CHECK) on a dependency cycle or a task that can
  // never progress (zero-capacity resource).
  void run();

 private:
  struct Resource {
    std::string name;
    double capacity = 0;
    double used = 0;  // total resource units consumed
  };
  void allocate_rates(const std::vector<int>& active, std::vector<double>& rate);

  std::vector<Resource> resources_;
  std::vector<Task> tasks_;
  std::vector<double> capacity_;                       // allocate_rates' scratch, reused
  std::vector<const std::vector<Usage>*> flow_usages_;
};

// Weighted max-min fairness by progressive filling: every unfrozen flow runs at lambda times its
// standalone speed (the speed its tightest resource allows it alone); lambda rises until a resource
// saturates, the flows on it freeze, and so on. rate[i]: flow i's work per second. Shared by the
// simulator and the CPU backend's pacing (executor/cpu/pacer.h), so both share resources alike.
void progressive_fill(const std::vector<double>& capacity, const std::vector<const std::vector<FluidEngine::Usage>*>& flows,
                      std::vector<double>& rate);

}  // namespace slidedp
