// Speed of the step model, the planner's inner loop: plan evaluations per second for an 80-layer
// model (Qwen2.5-72B) on 4 and 8 GPUs, at both fidelities, and the simulator's time for one step of
// 4 ranks with 8 chunks per layer. Targets (issue 2): >= 100,000 evaluations/s on one core;
// simulator < 50 ms per step.
#include <benchmark/benchmark.h>

#include "model/simulator.h"
#include "model/step_model.h"

namespace slidedp {
namespace {

struct Setup {
  Workload w = make_workload(model_preset("qwen2.5-72b"), 4096);
  Hardware hw;
  Plan plan;
  explicit Setup(const char* hw_name, int ranks) : hw(hardware_preset(hw_name)) {
    plan.ranks = ranks;
    plan.param_route = ParamRoute::kSharded;
    plan.chunk_numel = (w.model.decoder_layer_params() + 7) / 8;  // 8 chunks per layer
    plan.offload_layers = 8;
  }
};

void BM_Analytical(benchmark::State& state, const char* hw_name, int ranks, ModelFidelity fidelity) {
  Setup s(hw_name, ranks);
  StepWork sw = build_step_work(s.w, s.hw, s.plan, System::kSlideDP);
  for (auto _ : state) benchmark::DoNotOptimize(evaluate_step_work(sw, fidelity).step_time_s);
  state.SetItemsProcessed(state.iterations());
  state.counters["plans_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // How much of the recurrence one evaluation runs: unit visits with the jumps over the periodic
  // regime, and without them (every layer of every pass).
  RecurrenceCounters jumped, full;
  evaluate_step_work(sw, fidelity, true, &jumped);
  evaluate_step_work(sw, fidelity, false, &full);
  state.counters["unit_visits"] = static_cast<double>(jumped.unit_visits);
  state.counters["visits_no_jumps"] = static_cast<double>(full.unit_visits);
}

// One evaluation at gradient accumulation `accum` (contention fidelity, 4 ranks): the jump over the
// middle micro-steps keeps its cost flat in the accumulation; micro_steps_run is what it ran of them.
void BM_AnalyticalAccumulation(benchmark::State& state, int accum) {
  Setup s("h100-sxm-x4", 4);
  s.plan.accum_steps = accum;
  StepWork sw = build_step_work(s.w, s.hw, s.plan, System::kSlideDP);
  for (auto _ : state) benchmark::DoNotOptimize(evaluate_step_work(sw, ModelFidelity::kContention).step_time_s);
  state.counters["plans_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  RecurrenceCounters done;
  evaluate_step_work(sw, ModelFidelity::kContention, true, &done);
  state.counters["micro_steps_jumped"] = static_cast<double>(done.micro_steps_jumped);
  state.counters["micro_verifications"] = static_cast<double>(done.micro_verifications);
  state.counters["unit_visits"] = static_cast<double>(done.unit_visits);
}

// Building the per-unit work is part of evaluating a new plan in the planner.
void BM_BuildAndEvaluate(benchmark::State& state, ModelFidelity fidelity) {
  Setup s("h100-sxm-x4", 4);
  for (auto _ : state) {
    StepWork sw = build_step_work(s.w, s.hw, s.plan, System::kSlideDP);
    benchmark::DoNotOptimize(evaluate_step_work(sw, fidelity).step_time_s);
  }
  state.counters["plans_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Simulator(benchmark::State& state, const char* hw_name, int ranks) {
  Setup s(hw_name, ranks);
  StepWork sw = build_step_work(s.w, s.hw, s.plan, System::kSlideDP);
  SimulatorOptions opt;
  opt.record_timeline = false;
  opt.measure_sync = false;
  int tasks = 0;
  for (auto _ : state) {
    Simulation sim = simulate_step_work(sw, opt);
    tasks = sim.tasks;
    benchmark::DoNotOptimize(sim.prediction.step_time_s);
  }
  // Two full steps are simulated (the first warms the pipeline up): report simulated steps per
  // second of CPU time; 1000 / steps_per_s is the milliseconds per step.
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * opt.steps, benchmark::Counter::kIsRate);
  state.counters["tasks"] = tasks;
}

BENCHMARK_CAPTURE(BM_Analytical, contention_72b_4gpu, "h100-sxm-x4", 4, ModelFidelity::kContention);
BENCHMARK_CAPTURE(BM_Analytical, critical_path_72b_4gpu, "h100-sxm-x4", 4, ModelFidelity::kCriticalPath);
BENCHMARK_CAPTURE(BM_Analytical, contention_72b_8gpu, "h100-sxm-x8", 8, ModelFidelity::kContention);
BENCHMARK_CAPTURE(BM_Analytical, critical_path_72b_8gpu, "h100-sxm-x8", 8, ModelFidelity::kCriticalPath);
BENCHMARK_CAPTURE(BM_AnalyticalAccumulation, accum_1, 1);
BENCHMARK_CAPTURE(BM_AnalyticalAccumulation, accum_64, 64);
BENCHMARK_CAPTURE(BM_AnalyticalAccumulation, accum_262144, 262144);
BENCHMARK_CAPTURE(BM_BuildAndEvaluate, contention, ModelFidelity::kContention);
BENCHMARK_CAPTURE(BM_BuildAndEvaluate, critical_path, ModelFidelity::kCriticalPath);
BENCHMARK_CAPTURE(BM_Simulator, step_72b_4ranks_8chunks, "h100-sxm-x4", 4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slidedp

BENCHMARK_MAIN();
