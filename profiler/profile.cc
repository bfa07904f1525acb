// The profile run; see profile.h: which backend, calibration and the duration estimate, the network
// stage, then every other stage's cases run together in rounds. The sizes come from stage_plan.h, the
// Hardware profile from profile_assembly.h.
#include "profiler/profile.h"

#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <set>

#include "common/error.h"
#include "common/host_memory.h"
#include "common/progress.h"
#include "common/provenance.h"
#include "common/thread_pool.h"
#include "common/units.h"
#include "executor/backend_registry.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/run_control.h"
#include "kernels/cpu/transformer/blas.h"
#include "model/model_costs.h"
#include "profiler/profile_assembly.h"
#include "profiler/stage_plan.h"

namespace slidedp::profiler {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

double load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

// Single-thread memcpy GB/s over 2 x LLC: the yardstick of the duration estimate (not recorded).
double calibrate_copy_gbps(int64_t llc) {
  const int64_t bytes = std::max(8 * kMiB, 2 * llc);
  HostArray a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_s();
    std::memcpy(a.data(), b.data(), static_cast<std::size_t>(bytes));
    best = std::max(best, static_cast<double>(bytes) / (now_s() - t0) / 1e9);
  }
  return best;
}

}  // namespace

const char* profile_scale_name(ProfileScale s) {
  switch (s) {
    case ProfileScale::kSmoke:
      return "smoke";
    case ProfileScale::kQuick:
      return "quick";
    case ProfileScale::kFull:
      return "full";
  }
  return "?";
}

namespace {

// The model with the most parameters: the working sets are sized by it.
const ModelCard& largest_model(const std::vector<ModelCard>& models) {
  const ModelCard* largest = &models.front();
  for (const ModelCard& c : models)
    if (make_model_layout(c).total_flat_numel > make_model_layout(*largest).total_flat_numel) largest = &c;
  return *largest;
}

std::string working_set_text(const ProfileOptions& options, const StagePlan& plan, const ModelCard& largest,
                             int64_t model_params, int64_t llc) {
  return fmt::format(
      "{}: host-memory arrays {}, update {} elements, copy region {} ({} has {} parameters; last-level cache "
      "{})",
      options.model_working_set && options.scale != ProfileScale::kSmoke
          ? "model-sized where smaller than DRAM-sized"
          : "scale defaults",
      format_bytes(static_cast<double>(plan.host.array_bytes)), plan.update.numel,
      format_bytes(static_cast<double>(plan.links.region_bytes)), largest.name,
      format_count(static_cast<double>(model_params)), format_bytes(static_cast<double>(llc)));
}

// The GPUs (or, without any or with --cpu-backend, the CPU backend's emulated devices) to profile.
GpuInventory choose_backend(const ProfileOptions& options, ProfileResult& r,
                            const std::function<void(const std::string&)>& say) {
  GpuInventory inv;
  if (!options.cpu_backend) inv = probe_gpus();
  if (options.cpu_backend) {
    r.gpu_note = "--cpu-backend given: profiling the CPU backend (emulated devices)";
  } else if (inv.count == 0) {
    r.gpu_note =
        fmt::format("no GPU ({}): profiling the CPU backend (emulated devices) instead", inv.why_none);
  }
  r.backend = r.gpu_note.empty() ? "cuda" : "cpu";
  if (options.kernels && r.backend != "cuda")
    throw InputError("--kernels", "times the GPU's kernels (CUPTI), but " + r.gpu_note);
  say(r.gpu_note.empty() ? fmt::format("{} x {} found: profiling the GPUs", inv.count, inv.model)
                         : r.gpu_note);
  return inv;
}

// Each stage's expected seconds (r.stages, r.expected_s) and the unit stage's device count.
void estimate_stages(const ProfileOptions& options, ProfileResult& r, StagePlan& plan, int devices,
                     bool units, double copy_gbps, double gflops) {
  // Devices computing at once for the unit times: as many as the cores hold at the backend's threads
  // per device (more would be oversubscription, which the model charges through cpu.cores itself).
  plan.units.concurrent_devices =
      r.backend == "cpu" ? std::min(devices, std::max(1, r.cores / r.threads_per_device)) : devices;
  plan.units.also_alone = plan.units.concurrent_devices > 1;
  plan.units.kernel_breakdown = options.kernels;
  r.stages.push_back({"host memory", estimate_host_memory_s(plan.host, plan.repeat, copy_gbps)});
  r.stages.push_back({"cpu update", estimate_cpu_update_s(plan.update, plan.repeat, copy_gbps)});
  if (r.backend == "cpu") {
    r.stages.push_back(
        {"links + fabric", estimate_backend_links_s(plan.links, devices, plan.repeat, copy_gbps)});
  } else {
    double bytes = 0;
    for (int64_t s : plan.gpu.sizes) bytes += static_cast<double>(s);
    r.stages.push_back(
        {"gpu links + fabric", (plan.repeat.reps + 1) * (8.0 * bytes / 20e9 + 0.5 * plan.gpu.sizes.size())});
  }
  if (units) {
    // On a GPU the CPU-rate estimate of the units is a generous upper bound.
    const double rate = r.backend == "cpu" ? gflops : 100e3;
    for (const ModelCard& c : options.models)
      r.stages.push_back({"units " + c.name, estimate_unit_compute_s(c, plan.units, plan.repeat, rate)});
  }
  for (const PlannedStage& st : r.stages) r.expected_s += st.estimate_s;
}

std::string stage_estimates_text(const ProfileResult& r) {
  std::string t;
  for (const PlannedStage& p : r.stages)
    t += fmt::format("{}{} {}", t.empty() ? "" : ", ", p.name, format_seconds(p.estimate_s));
  return t;
}

// What the stages hold for the whole run (their cases take part in every round).
std::string held_bytes_text(const StagePlan& plan, const std::string& backend, int devices) {
  const auto& u = plan.update;
  const int max_slots = std::max(*std::max_element(u.slots.begin(), u.slots.end()), u.reduce_slots);
  const double host_b = 3.0 * static_cast<double>(plan.host.array_bytes);
  const double update_b = static_cast<double>(u.numel) * (4 * 4 + 2 + 2 * max_slots);
  const double links_b =
      backend == "cpu" ? 4.0 * static_cast<double>(plan.links.region_bytes) * devices : 0.0;
  return fmt::format("held for the whole run: {} (host memory {}, cpu update {}, links {}) + unit inputs",
                     format_bytes(host_b + update_b + links_b), format_bytes(host_b), format_bytes(update_b),
                     format_bytes(links_b));
}

}  // namespace

ProfileResult run_profile(const ProfileOptions& options) {
  check_options(options);
  ProfileResult r;
  r.options = options;
  auto say = [&](const std::string& m) {
    if (options.log) options.log(m);
  };
  r.date = utc_timestamp();
  r.load_before = load_average_1m();
  const double t_start = now_s();
  r.cores = ThreadPool::available_cpus();
  std::vector<int> threads = options.threads.empty() ? default_thread_counts(r.cores) : options.threads;
  const int64_t llc = last_level_cache_bytes();
  const ModelCard& largest = largest_model(options.models);
  const int64_t model_params = make_model_layout(largest).total_flat_numel;
  StagePlan plan = plan_for(options, r.cores, threads, llc, model_params);
  r.working_set = working_set_text(options, plan, largest, model_params, llc);

  const GpuInventory inv = choose_backend(options, r, say);

  Measurements& out = r.measurements;
  StageContext base{out, plan.repeat, {}};
  exec::RunControl control;
  const int devices = r.backend == "cpu" ? options.ranks : inv.count;
  const bool cuda_backend_built = std::ranges::count(exec::available_backends(), std::string("cuda")) > 0;
  // A backend set up for one model (the unit operations are per model). Every model's backend exists
  // for the whole run, since every model's unit cases take part in every round.
  auto make_backend_for = [&](const ModelCard& card,
                              const ModelLayout& layout) -> std::unique_ptr<exec::Backend> {
    if (r.backend == "cpu") {
      exec::CpuBackendOptions bo;
      bo.devices = devices;
      bo.device_budget_bytes = kCpuBackendDeviceBudget;
      return exec::make_cpu_backend(card, layout, bo, control);  // sets BLAS threads = cores / devices
    }
    if (!cuda_backend_built) return nullptr;
    exec::BackendOptions bo;
    bo.devices = devices;       // one per GPU
    bo.collectives = devices > 1;  // the fabric stage measures all-gather and reduce-scatter
    bo.kernel_activity = options.kernels;
    return exec::make_backend("cuda", card, layout, bo, control);
  };
  std::deque<ModelLayout> layouts;  // per model; a deque so references stay valid
  std::vector<std::unique_ptr<exec::Backend>> backends;
  for (const ModelCard& card : options.models) {
    layouts.push_back(make_model_layout(card));
    backends.push_back(make_backend_for(card, layouts.back()));
  }
  exec::Backend* backend = backends.front().get();  // the links' (null: no backend for units either)
  if (r.backend == "cpu") r.threads_per_device = kernels::blas_threads();

  // ---- calibration and the estimate ----
  const double copy_gbps = calibrate_copy_gbps(llc);
  double gflops = 0;
  if (r.backend == "cpu") {
    r.sgemm_gflops = measure_sgemm_gflops(plan.sgemm_n, base);
    gflops = r.sgemm_gflops.median;
  }
  estimate_stages(options, r, plan, devices, backend != nullptr, copy_gbps, gflops);
  say(fmt::format("{} run on {} ({} cores, load {:.2f}): expected about {} ({})",
                  profile_scale_name(options.scale), provenance().cpu_model, r.cores, r.load_before,
                  format_seconds(r.expected_s), stage_estimates_text(r)));
  say("working sets " + r.working_set);
  // Every stage's buffers stay allocated for the whole run, since its cases take part in every
  // round: model-sized they are a few MiB, DRAM-sized they add up (say so before allocating).
  say(held_bytes_text(plan, r.backend, devices));

  // The network stage first and alone: node 1 waits for nothing else (it runs only this stage).
  if (options.link) {
    say(fmt::format("network: node 0 <-> node 1 of {} processes", options.link->nodes()));
    r.network = measure_network(*options.link, network_plan(options));
  }

  // ---- the stages ----
  // Every stage first builds its cases (allocations, first touch, untimed input chains); then the
  // run's rounds (stats.h run_rounds): round r of every stage's cases, shuffled together, before round
  // r + 1 of any, so each case's repetitions span the whole run; then each stage computes its results
  // from its samples, in stage order. The GPU stage (CUDA builds) takes part like the others.
  Progress progress("slidedp-profile", r.expected_s, "s", options.progress);
  double before = 0;
  std::size_t si = 0;
  std::vector<StageCases> rounds;
  // Builds stage si's cases (their state is held by the cases until the rounds are destroyed).
  auto prepare = [&](auto make) {
    const PlannedStage& st = r.stages[si++];
    progress.update(before, st.name + ": preparing");
    auto prepared = make();
    rounds.push_back({st.name, st.estimate_s, std::move(prepared.cases)});
    return std::move(prepared.finish);
  };
  auto finish_host = prepare([&] { return prepare_host_memory(plan.host, base); });
  auto finish_update = prepare([&] { return prepare_cpu_update(plan.update, base); });
  std::function<BackendLinkResult(const CaseSamples&)> finish_links;
  std::function<GpuMeasurements(const CaseSamples&)> finish_gpus;
  if (r.backend == "cpu") {
    finish_links = prepare([&] { return prepare_backend_links(*backend, plan.links, base); });
  } else {
    finish_gpus = prepare([&] { return prepare_gpus(plan.gpu, base); });
  }
  std::vector<std::function<UnitComputeResult(const CaseSamples&)>> finish_units;
  if (backend)
    for (std::size_t m = 0; m < options.models.size(); ++m)
      finish_units.push_back(prepare([&] {
        return prepare_unit_compute(*backends[m], options.models[m], layouts[m], plan.units, base);
      }));

  {
    const std::vector<CaseSamples> samples =
        run_rounds(rounds, plan.repeat.reps, 11,
                   [&](double done_s, const std::string& note) { progress.update(before + done_s, note); });
    std::size_t k = 0;
    r.host_memory = finish_host(samples[k++]);
    r.cpu_update = finish_update(samples[k++]);
    if (finish_links) r.links = finish_links(samples[k++]);
    if (finish_gpus) {
      r.gpu = finish_gpus(samples[k++]);
      r.links.links = r.gpu.links;
      r.links.collectives = r.gpu.collectives;
    }
    for (auto& finish : finish_units) r.units.push_back(finish(samples[k++]));
  }
  // The stages' buffers go before the backends they were allocated on.
  rounds.clear();
  finish_host = nullptr;
  finish_update = nullptr;
  finish_links = nullptr;
  finish_gpus = nullptr;
  finish_units.clear();
  backend = nullptr;
  backends.clear();
  progress.finish();
  r.elapsed_s = now_s() - t_start;
  r.load_after = load_average_1m();

  assemble_profile(r, plan, largest, devices, inv);
  return r;
}

std::string profile_yaml(const ProfileResult& r) {
  std::string text = hardware_to_yaml(r.hw);
  // The notes: how the values were measured and how much they moved, for a reader deciding whether a
  // re-run differs. The hardware reader skips this section.
  YAML::Emitter e;
  e.SetDoublePrecision(6);
  e << YAML::BeginMap << YAML::Key << "measured" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "date" << YAML::Value << r.date;
  e << YAML::Key << "command" << YAML::Value << r.options.command_line;
  e << YAML::Key << "scale" << YAML::Value << profile_scale_name(r.options.scale);
  e << YAML::Key << "backend" << YAML::Value << r.backend;
  if (!r.gpu_note.empty()) e << YAML::Key << "gpu_note" << YAML::Value << r.gpu_note;
  const Provenance& p = provenance();
  e << YAML::Key << "host" << YAML::Value << p.host;
  e << YAML::Key << "cpu" << YAML::Value << fmt::format("{} ({} cores available)", p.cpu_model, r.cores);
  e << YAML::Key << "build" << YAML::Value
    << fmt::format("slidedp {} {} {} {}", p.version, p.git_revision, p.build_type, p.compiler);
  e << YAML::Key << "load_average_1m" << YAML::Value
    << fmt::format("{:.2f} before, {:.2f} after", r.load_before, r.load_after);
  e << YAML::Key << "duration_s" << YAML::Value
    << fmt::format("{:.1f} (expected {:.1f})", r.elapsed_s, r.expected_s);
  std::vector<std::string> names;
  for (const ModelCard& c : r.options.models) names.push_back(c.name);
  e << YAML::Key << "models" << YAML::Value << fmt::format("{}", fmt::join(names, ", "));
  e << YAML::Key << "working_set" << YAML::Value << r.working_set;
  // Spread of every measured case: median, and (max - min) / median over the repetitions.
  e << YAML::Key << "spread" << YAML::Value << YAML::BeginMap;
  for (const Measurement& m : r.measurements.all()) {
    const Spread s = m.spread();
    e << YAML::Key << fmt::format("{} {}", m.key(), m.params.dump()) << YAML::Value
      << fmt::format("{} {} +- {}", sig3(s.median), m.unit, spread_percent(s));
  }
  e << YAML::EndMap;
  e << YAML::Key << "fits" << YAML::Value << YAML::BeginMap;
  for (const LinkCurve& c : r.links.links)
    e << YAML::Key << fmt::format("links.{}.{}", c.mode, c.direction) << YAML::Value
      << fmt::format("latency {} us, {} GB/s; rms residual {:.1f}%, max {:.1f}%", sig3(c.fit.latency_s * 1e6),
                     sig3(c.fit.gbps), 100 * c.fit.quality.rms_rel_residual,
                     100 * c.fit.quality.max_rel_residual);
  for (const LinkCurve& c : r.links.collectives)
    e << YAML::Key << fmt::format("fabric.{}", c.mode) << YAML::Value
      << fmt::format("latency {} us, busbw {} GB/s; rms residual {:.1f}%, max {:.1f}%",
                     sig3(c.fit.latency_s * 1e6), sig3(c.fit.gbps), 100 * c.fit.quality.rms_rel_residual,
                     100 * c.fit.quality.max_rel_residual);
  for (const auto& row : r.cpu_update.by_threads)
    e << YAML::Key << fmt::format("cpu.reduce_slots.threads_{}", row.threads) << YAML::Value
      << fmt::format(
             "{} GB/s per extra slot; rms residual {:.1f}%; standalone reduce_grads ({} slots) {} GB/s",
             sig3(row.reduce_gbps), 100 * row.slot_fit.rms_rel_residual, r.cpu_update.reduce_slots,
             sig3(row.reduce_standalone_gbps.median));
  for (const UnitComputeResult& u : r.units)
    for (const auto& row : u.fits)
      e << YAML::Key << fmt::format("units.{}.{}.{}", u.model, unit_label(row.kind, row.layer_type), row.op)
        << YAML::Value
        << fmt::format("{} samples; rms residual {:.1f}%, max {:.1f}%", row.fit.quality.n,
                       100 * row.fit.quality.rms_rel_residual, 100 * row.fit.quality.max_rel_residual);
  e << YAML::EndMap;
  e << YAML::EndMap << YAML::EndMap;
  return text + e.c_str() + "\n";
}

}  // namespace slidedp::profiler
