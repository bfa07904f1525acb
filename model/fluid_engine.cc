// Fluid engine; see fluid_engine.h.
#include "model/fluid_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace slidedp {

int FluidEngine::add_resource(const std::string& name, double capacity) {
  SLIDEDP_CHECK(capacity > 0 && std::isfinite(capacity), "resource " + name + " needs a positive capacity");
  resources_.push_back({name, capacity, 0});
  return static_cast<int>(resources_.size()) - 1;
}

int FluidEngine::add_task(Task task) {
  const int id = static_cast<int>(tasks_.size());
  for (int d : task.deps) SLIDEDP_CHECK(d >= 0 && d < id, "a task may only depend on earlier tasks");
  SLIDEDP_CHECK(task.work >= 0 && task.delay_s >= 0);
  SLIDEDP_CHECK(task.work == 0 || !task.usages.empty(), "a task with work must use some resource");
  tasks_.push_back(std::move(task));
  return id;
}

double FluidEngine::resource_busy_s(int r) const {
  const Resource& res = resources_[static_cast<std::size_t>(r)];
  return res.used / res.capacity;
}

void progressive_fill(const std::vector<double>& capacity, const std::vector<const std::vector<FluidEngine::Usage>*>& flows,
                      std::vector<double>& rate) {
  using Usage = FluidEngine::Usage;
  const std::size_t R = capacity.size();
  std::vector<double> remaining(capacity);
  std::vector<double> standalone(flows.size());
  for (std::size_t i = 0; i < flows.size(); ++i) {
    double s = std::numeric_limits<double>::infinity();
    for (const Usage& u : *flows[i])
      if (u.per_work > 0) s = std::min(s, capacity[static_cast<std::size_t>(u.resource)] / u.per_work);
    standalone[i] = s;
  }
  std::vector<char> frozen(flows.size(), 0);
  std::vector<double> lambda(flows.size(), 0.0);
  std::size_t unfrozen = flows.size();
  double lambda_now = 0;
  std::vector<double> load(R);
  while (unfrozen > 0) {
    std::fill(load.begin(), load.end(), 0.0);
    for (std::size_t i = 0; i < flows.size(); ++i) {
      if (frozen[i]) continue;
      for (const Usage& u : *flows[i]) load[static_cast<std::size_t>(u.resource)] += u.per_work * standalone[i];
    }
    // How much further lambda can rise before the first resource saturates (capped at 1 = alone).
    double step = 1.0 - lambda_now;
    int binding = -1;
    for (std::size_t r = 0; r < R; ++r) {
      if (load[r] <= 0) continue;
      double s = remaining[r] / load[r];
      if (s < step) {
        step = s;
        binding = static_cast<int>(r);
      }
    }
    step = std::max(0.0, step);
    lambda_now += step;
    for (std::size_t r = 0; r < R; ++r) remaining[r] -= load[r] * step;
    if (binding < 0) {
      for (std::size_t i = 0; i < flows.size(); ++i)
        if (!frozen[i]) lambda[i] = lambda_now, frozen[i] = 1;
      break;
    }
    // Freeze every flow that uses a saturated resource.
    for (std::size_t i = 0; i < flows.size(); ++i) {
      if (frozen[i]) continue;
      bool saturated = false;
      for (const Usage& u : *flows[i])
        if (u.per_work > 0 && remaining[static_cast<std::size_t>(u.resource)] <= 1e-12 * capacity[static_cast<std::size_t>(u.resource)])
          saturated = true;
      if (saturated) {
        lambda[i] = lambda_now;
        frozen[i] = 1;
        --unfrozen;
      }
    }
  }
  rate.resize(flows.size());
  for (std::size_t i = 0; i < flows.size(); ++i) rate[i] = lambda[i] * standalone[i];
}

void FluidEngine::allocate_rates(const std::vector<int>& active, std::vector<double>& rate) {
  if (capacity_.size() != resources_.size()) {
    capacity_.resize(resources_.size());
    for (std::size_t r = 0; r < resources_.size(); ++r) capacity_[r] = resources_[r].capacity;
  }
  flow_usages_.resize(active.size());
  for (std::size_t i = 0; i < active.size(); ++i) flow_usages_[i] = &tasks_[static_cast<std::size_t>(active[i])].usages;
  progressive_fill(capacity_, flow_usages_, rate);
}

void FluidEngine::run() {
  const std::size_t T = tasks_.size();
  std::vector<int> pending_deps(T, 0);
  std::vector<std::vector<int>> dependents(T);
  for (std::size_t i = 0; i < T; ++i) {
    pending_deps[i] = static_cast<int>(tasks_[i].deps.size());
    for (int d : tasks_[i].deps) dependents[static_cast<std::size_t>(d)].push_back(static_cast<int>(i));
  }
  std::vector<double> remaining_work(T), delay_left(T);
  std::vector<int> active;  // tasks started (delay or flowing), not finished
  double now = 0;
  std::size_t done = 0;
  auto start = [&](int id) {
    Task& t = tasks_[static_cast<std::size_t>(id)];
    t.start_s = now;
    remaining_work[static_cast<std::size_t>(id)] = t.work;
    delay_left[static_cast<std::size_t>(id)] = t.delay_s;
    active.push_back(id);
  };
  for (std::size_t i = 0; i < T; ++i)
    if (pending_deps[i] == 0) start(static_cast<int>(i));

  std::vector<int> flowing;
  std::vector<double> rate;
  while (done < T) {
    SLIDEDP_CHECK(!active.empty(), "fluid engine: tasks left but none can start (dependency cycle?)");
    // Tasks past their delay share the resources.
    flowing.clear();
    for (int id : active)
      if (delay_left[static_cast<std::size_t>(id)] <= 0 && remaining_work[static_cast<std::size_t>(id)] > 0)
        flowing.push_back(id);
    rate.assign(flowing.size(), 0.0);
    allocate_rates(flowing, rate);
    // Next event: a delay running out, or a flowing task finishing.
    double dt = std::numeric_limits<double>::infinity();
    for (int id : active) {
      std::size_t k = static_cast<std::size_t>(id);
      if (delay_left[k] > 0) dt = std::min(dt, delay_left[k]);
      else if (remaining_work[k] <= 0) dt = 0;
    }
    for (std::size_t i = 0; i < flowing.size(); ++i) {
      SLIDEDP_CHECK(rate[i] > 0, "fluid engine: task '" + tasks_[static_cast<std::size_t>(flowing[i])].label +
                                     "' cannot progress");
      dt = std::min(dt, remaining_work[static_cast<std::size_t>(flowing[i])] / rate[i]);
    }
    SLIDEDP_CHECK(std::isfinite(dt));
    now += dt;
    for (std::size_t i = 0; i < flowing.size(); ++i) {
      std::size_t k = static_cast<std::size_t>(flowing[i]);
      double w = std::min(remaining_work[k], rate[i] * dt);
      remaining_work[k] -= w;
      if (remaining_work[k] <= 1e-9 * std::max(1.0, tasks_[k].work)) remaining_work[k] = 0;
      for (const Usage& u : tasks_[k].usages) resources_[static_cast<std::size_t>(u.resource)].used += u.per_work * w;
    }
    std::vector<int> finished;
    for (int id : active) {
      std::size_t k = static_cast<std::size_t>(id);
      if (delay_left[k] > 0) {
        delay_left[k] -= dt;
        if (delay_left[k] <= 1e-15) delay_left[k] = 0;
        if (delay_left[k] > 0) continue;
      }
      if (remaining_work[k] <= 0) finished.push_back(id);
    }
    // Flush finished tasks and start the ones they release.
    for (int id : finished) {
      tasks_[static_cast<std::size_t>(id)].end_s = now;
      ++done;
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](int id) { return tasks_[static_cast<std::size_t>(id)].end_s >= 0; }),
                 active.end());
    for (int id : finished)
      for (int next : dependents[static_cast<std::size_t>(id)])
        if (--pending_deps[static_cast<std::size_t>(next)] == 0) start(next);
  }
}

}  // namespace slidedp
