// The profile run; see profile.h. Layout: scale presets, option checks, the run (calibration,
// estimate, stages), then the Hardware profile built from the results with a source per value.
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

namespace slidedp::profiler {
namespace {

constexpr int64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

// The CPU backend's default device budget (executor/trainer.cc): the emulated "GPU memory".
constexpr int64_t kCpuBackendDeviceBudget = 16 * GiB;

double load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

std::vector<int64_t> geometric(int64_t from, int64_t to, int64_t factor) {
  std::vector<int64_t> v;
  for (int64_t s = from; s <= to; s *= factor) v.push_back(s);
  return v;
}

// Everything a scale decides: sizes and repetitions of every stage.
struct StagePlan {
  RepeatPolicy repeat;
  HostMemoryOptions host;
  CpuUpdateOptions update;
  BackendLinkOptions links;
  GpuMeasureOptions gpu;
  UnitComputeOptions units;
  int64_t sgemm_n = 1024;
};

// `model_params`: flat parameters of the largest model (its host state sizes the working sets).
StagePlan plan_for(const ProfileOptions& o, int cores, const std::vector<int>& threads, int64_t llc,
                   int64_t model_params) {
  StagePlan p;
  const int ranks = o.ranks;
  std::set<int> dma{1, std::min(ranks, cores)};
  auto mixes = [&] {
    std::vector<HostMemoryOptions::Mix> m;
    for (int d : dma) m.push_back({d, std::max(1, cores - d)});
    return m;
  };
  p.host.threads = threads;
  p.update.threads = threads;
  p.update.reduce_slots = std::max(2, ranks);
  p.units.micro_batches = o.micro_batches;
  p.units.seq_lens = {o.seq_len};
  switch (o.scale) {
    case ProfileScale::kSmoke:
      p.repeat = {2, 0.002, 64};
      p.host.array_bytes = 1 * MiB;
      p.host.dram_bytes = 1 * MiB;
      p.host.contention = {{1, 1}};
      p.update.numel = 64 * KiB;
      p.update.chunk_numels = {16 * KiB, 64 * KiB};
      p.update.slots = {1, 2};
      p.links.sizes = {64 * KiB, 256 * KiB};
      p.links.region_bytes = 1 * MiB;
      p.links.collective_sizes = {64 * KiB, 256 * KiB};
      p.units.seq_lens = {std::min<int64_t>(o.seq_len, 16)};
      p.units.micro_batches = {1, 2};
      p.sgemm_n = 128;
      p.gpu.sizes = {64 * KiB, 1 * MiB};
      p.gpu.collective_sizes = {64 * KiB, 1 * MiB};
      p.gpu.pageable_bytes = 1 * MiB;
      p.gpu.gemm_n = 1024;
      p.gpu.hbm_bytes = 16 * MiB;
      break;
    case ProfileScale::kQuick:
      p.repeat = {3, 0.02, 1 << 14};
      p.host.array_bytes = std::max(64 * MiB, 2 * llc);
      p.host.dram_bytes = std::max(256 * MiB, 8 * llc);
      p.host.contention = mixes();
      p.host.contention.resize(1);
      p.update.numel = 8 * MiB;
      p.update.chunk_numels = {1 * MiB, 8 * MiB};
      p.update.slots = {1, 2, 4};
      p.links.sizes = {64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB};
      p.links.region_bytes = std::max(64 * MiB, 2 * llc);
      p.links.collective_sizes = {1 * MiB, 16 * MiB, 64 * MiB};
      p.sgemm_n = 1024;
      p.gpu.sizes = {64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB};
      p.gpu.collective_sizes = {1 * MiB, 16 * MiB, 256 * MiB};
      p.gpu.gemm_n = 4096;
      p.gpu.hbm_bytes = 256 * MiB;
      break;
    case ProfileScale::kFull:
      p.repeat = {5, 0.05, 1 << 14};
      p.host.array_bytes = std::max(256 * MiB, 8 * llc);
      p.host.dram_bytes = p.host.array_bytes;
      p.host.contention = mixes();
      p.update.numel = 32 * MiB;
      p.update.chunk_numels = {64 * KiB, 1 * MiB, 32 * MiB};
      p.update.slots = {1, 2, 4, 8};
      p.links.sizes = geometric(64 * KiB, 256 * MiB, 4);
      p.links.region_bytes = std::max(256 * MiB, 4 * llc);
      p.links.collective_sizes = geometric(64 * KiB, 256 * MiB, 4);
      // The context term needs a second sequence length; half of T keeps the cost down.
      if (o.seq_len >= 32) p.units.seq_lens = {o.seq_len / 2, o.seq_len};
      p.sgemm_n = 2048;
      p.gpu.sizes = geometric(64 * KiB, 1 * GiB, 4);
      p.gpu.collective_sizes = geometric(64 * KiB, 1 * GiB, 4);
      break;
  }
  if (o.reps > 0) p.repeat.reps = o.reps;

  // Working sets follow the model's host state when it is smaller than the DRAM-sized defaults: the
  // executor's copies, reductions and updates of a small model run in the cache, and the profile
  // should say how fast that is. Large models are unaffected (their state exceeds the defaults).
  if (o.model_working_set && o.scale != ProfileScale::kSmoke) {
    const int64_t P = model_params;
    p.host.array_bytes = std::min(p.host.array_bytes, std::max(1 * MiB, P * 4));  // fp32 master-sized
    p.update.numel = std::min(p.update.numel, std::max(64 * KiB, P));
    const int64_t region = std::min(p.links.region_bytes, std::max(256 * KiB, P * 2));  // bf16 mirror
    if (region < p.links.region_bytes) {
      p.links.region_bytes = region;
      p.links.sizes = geometric(16 * KiB, region, 4);
      if (p.links.sizes.back() != region) p.links.sizes.push_back(region);
      p.links.collective_sizes = p.links.sizes;
    }
  }
  // The written tables are for the plan's chunk size (default: the plan default), within the update.
  const int64_t chunk = std::min(o.chunk_numel > 0 ? o.chunk_numel : 32 * MiB, p.update.numel);
  std::vector<int64_t> chunks;
  for (int64_t c : p.update.chunk_numels)
    if (c < p.update.numel) chunks.push_back(c);
  chunks.push_back(p.update.numel);
  p.update.chunk_numels = chunks;
  p.update.table_chunk_numel = chunk;
  return p;
}

void check_options(const ProfileOptions& o) {
  if (o.seq_len < 1 || o.seq_len > (int64_t{1} << 20)) throw InputError("--seq", "must be in [1, 1048576]");
  if (o.models.empty()) throw InputError("--model", "needs at least one model");
  if (o.chunk_numel < 0) throw InputError("--chunk-numel", "must be positive");
  if (o.micro_batches.empty()) throw InputError("--micro-batches", "needs at least one micro-batch size");
  for (int64_t b : o.micro_batches)
    if (b < 1 || b > 4096) throw InputError("--micro-batches", fmt::format("{} is not in [1, 4096]", b));
  if (o.ranks < 1 || o.ranks > 64) throw InputError("--ranks", "must be in [1, 64]");
  for (int t : o.threads)
    if (t < 1 || t > ThreadPool::kMaxThreads)
      throw InputError("--threads", fmt::format("{} is not a thread count", t));
  if (o.reps < 0 || o.reps > 1000) throw InputError("--reps", "must be in [0, 1000]");
  for (const ModelCard& c : o.models)
    if (c.max_position_embeddings > 0 && o.seq_len > c.max_position_embeddings)
      throw InputError("--seq", fmt::format("{} exceeds {}'s max_position_embeddings ({})", o.seq_len, c.name,
                                            c.max_position_embeddings));
}

// Single-thread memcpy GB/s over 2 x LLC: the yardstick of the duration estimate (not recorded).
double calibrate_copy_gbps(int64_t llc) {
  const int64_t bytes = std::max(8 * MiB, 2 * llc);
  HostArray a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_s();
    std::memcpy(a.data(), b.data(), static_cast<std::size_t>(bytes));
    best = std::max(best, static_cast<double>(bytes) / (now_s() - t0) / 1e9);
  }
  return best;
}

std::string g3(double v) { return fmt::format("{:.3g}", v); }
std::string pct(const Spread& s) { return fmt::format("{:.1f}%", 100 * s.relative()); }

LinkCurve curve_or_alone(const BackendLinkResult& l, const std::string& mode, const std::string& dir) {
  if (const LinkCurve* c = l.find(mode, dir)) return *c;
  return *l.find("alone", dir);
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

std::vector<int> default_thread_counts(int cores) {
  std::vector<int> t;
  for (int c = 1; c < cores; c *= 2) t.push_back(c);
  t.push_back(cores);
  return t;
}

NetworkPlan network_plan(const ProfileOptions& o) {
  NetworkPlan p;
  p.reps = o.reps > 0 ? o.reps : o.scale == ProfileScale::kSmoke ? 2 : o.scale == ProfileScale::kQuick ? 3 : 5;
  p.latency_round_trips = o.scale == ProfileScale::kSmoke ? 20 : 200;
  p.sizes = o.scale == ProfileScale::kSmoke   ? std::vector<int64_t>{int64_t{1} << 16, int64_t{1} << 20}
            : o.scale == ProfileScale::kQuick ? std::vector<int64_t>{int64_t{1} << 20, int64_t{16} << 20}
                                              : std::vector<int64_t>{int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20};
  return p;
}

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
  const ModelCard* largest = &options.models.front();
  for (const ModelCard& c : options.models)
    if (make_model_layout(c).total_flat_numel > make_model_layout(*largest).total_flat_numel) largest = &c;
  const int64_t model_params = make_model_layout(*largest).total_flat_numel;
  StagePlan plan = plan_for(options, r.cores, threads, llc, model_params);
  r.working_set = fmt::format(
      "{}: host-memory arrays {}, update {} elements, copy region {} ({} has {} parameters; last-level cache "
      "{})",
      options.model_working_set && options.scale != ProfileScale::kSmoke
          ? "model-sized where smaller than DRAM-sized"
          : "scale defaults",
      format_bytes(static_cast<double>(plan.host.array_bytes)), plan.update.numel,
      format_bytes(static_cast<double>(plan.links.region_bytes)), largest->name,
      format_count(static_cast<double>(model_params)), format_bytes(static_cast<double>(llc)));

  // ---- which backend ----
  GpuInventory inv;
  if (!options.cpu_backend) inv = probe_gpus();
  if (options.cpu_backend) {
    r.gpu_note = "--cpu-backend given: profiling the CPU backend (emulated devices)";
  } else if (inv.count == 0) {
    r.gpu_note =
        fmt::format("no GPU ({}): profiling the CPU backend (emulated devices) instead", inv.why_none);
  }
  r.backend = r.gpu_note.empty() ? "cuda" : "cpu";
  say(r.gpu_note.empty() ? fmt::format("{} x {} found: profiling the GPUs", inv.count, inv.model)
                         : r.gpu_note);

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
    bo.devices = devices;
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
  // Devices computing at once for the unit times: as many as the cores hold at the backend's threads
  // per device (more would be oversubscription, which the model charges through cpu.cores itself).
  plan.units.concurrent_devices =
      r.backend == "cpu" ? std::min(devices, std::max(1, r.cores / r.threads_per_device)) : devices;
  plan.units.also_alone = plan.units.concurrent_devices > 1;
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
  if (backend) {
    // On a GPU the CPU-rate estimate of the units is a generous upper bound.
    const double rate = r.backend == "cpu" ? gflops : 100e3;
    for (const ModelCard& c : options.models)
      r.stages.push_back({"units " + c.name, estimate_unit_compute_s(c, plan.units, plan.repeat, rate)});
  }
  for (const PlannedStage& st : r.stages) r.expected_s += st.estimate_s;
  say(fmt::format(
      "{} run on {} ({} cores, load {:.2f}): expected about {} ({})", profile_scale_name(options.scale),
      provenance().cpu_model, r.cores, r.load_before, format_seconds(r.expected_s), [&] {
        std::string t;
        for (const PlannedStage& p : r.stages)
          t += fmt::format("{}{} {}", t.empty() ? "" : ", ", p.name, format_seconds(p.estimate_s));
        return t;
      }()));
  say("working sets " + r.working_set);
  {
    // Every stage's buffers stay allocated for the whole run, since its cases take part in every
    // round: model-sized they are a few MiB, DRAM-sized they add up (say so before allocating).
    const auto& u = plan.update;
    const int max_slots = std::max(*std::max_element(u.slots.begin(), u.slots.end()), u.reduce_slots);
    const double host_b = 3.0 * static_cast<double>(plan.host.array_bytes);
    const double update_b = static_cast<double>(u.numel) * (4 * 4 + 2 + 2 * max_slots);
    const double links_b =
        r.backend == "cpu" ? 4.0 * static_cast<double>(plan.links.region_bytes) * devices : 0.0;
    say(fmt::format("held for the whole run: {} (host memory {}, cpu update {}, links {}) + unit inputs",
                    format_bytes(host_b + update_b + links_b), format_bytes(host_b), format_bytes(update_b),
                    format_bytes(links_b)));
  }

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

  // ---- the Hardware profile ----
  Hardware& hw = r.hw;
  const std::string by = fmt::format("measured by slidedp-profile {} ({} run, median of {} repetitions)",
                                     r.date, profile_scale_name(options.scale), plan.repeat.reps);
  const Provenance& prov = provenance();
  const int64_t ram = physical_ram_bytes();
  std::string host = prov.host;
  std::replace_if(
      host.begin(), host.end(),
      [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)) && ch != '-'; }, '-');
  auto table_of = [&](auto get) {
    std::vector<RatePoint> t;
    for (const auto& row : r.cpu_update.by_threads) t.push_back({row.threads, get(row)});
    std::sort(t.begin(), t.end(),
              [](const RatePoint& a, const RatePoint& b) { return a.threads < b.threads; });
    return t;
  };
  hw.cpu.model = prov.cpu_model;
  hw.cpu.cores = r.cores;
  hw.cpu.adamw_params_per_s = table_of([](const auto& row) { return row.adamw_params_per_s.median; });
  hw.cpu.reduce_gbps = table_of([](const auto& row) { return row.reduce_gbps; });
  hw.cpu.convert_gbps_per_thread = r.cpu_update.convert_gbps_per_thread.median;
  hw.host.mem_bw_gbps = r.host_memory.best_gbps;
  hw.host.ram_bytes = ram;
  hw.sources["cpu.adamw_params_per_s"] = fmt::format(
      "{}: kernels::reduce_adamw_update with one bf16 gradient slot and the bf16 mirror over {} elements in "
      "chunks of "
      "{}, per thread count",
      by, plan.update.numel, r.cpu_update.table_chunk_numel);
  hw.sources["cpu.reduce_gbps"] = fmt::format(
      "{}: bf16 input bytes/s of each extra gradient slot in the fused reduce + AdamW, the slope of a "
      "least-squares "
      "fit of seconds vs slots {} (the model's (slots-1) x 2n / rate term); the standalone "
      "kernels::reduce_grads "
      "rate is in the measured notes",
      by, fmt::join(plan.update.slots, ","));
  hw.sources["cpu.convert_gbps_per_thread"] = by + ": kernels::f32_to_bf16 on one thread, fp32 input bytes/s";
  hw.sources["cpu.cores"] = "sched_getaffinity of the profiling process";
  hw.sources["host.mem_bw_gbps"] = fmt::format(
      "{}: highest host-memory rate of any case ({}); STREAM counting", by, r.host_memory.best_case);
  if (r.host_memory.dram_bytes > 0 && !r.host_memory.by_threads.empty()) {
    const auto& all = r.host_memory.by_threads.back();
    hw.sources["host.mem_bw_gbps"] += fmt::format(
        "; in DRAM ({} buffers, {} threads): read {:.1f}, non-temporal write {:.1f}, copy {:.1f} GB/s",
        format_bytes(static_cast<double>(r.host_memory.dram_bytes)), all.threads, all.dram_read_gbps.median,
        all.dram_write_gbps.median, all.dram_copy_gbps.median);
  }
  hw.sources["host.ram_bytes"] = "sysconf(_SC_PHYS_PAGES) x page size";
  if (r.network) {
    const NetworkResult& n = *r.network;
    hw.network.nic_gbps = n.best_gbps;
    hw.network.latency_s = n.latency_us.median * 1e-6;
    hw.sources["network.nic_gbps"] = fmt::format(
        "{}: node 0 -> node 1 through SlideDP's MPI link (executor/node_link.h), {} messages of {} back to back, "
        "median {} GB/s (spread {}); {} processes on {}: on one host this is the MPI transport between processes, "
        "not a NIC",
        by, network_plan(options).messages, format_bytes(static_cast<double>(n.by_size.back().bytes)), g3(n.best_gbps),
        pct(n.by_size.back().gbps), n.nodes, host);
    hw.sources["network.latency_us"] = fmt::format(
        "{}: half an 8-byte round trip through the link (its progress thread polls every 50 us while waiting), "
        "median {} us (spread {})",
        by, g3(n.latency_us.median), pct(n.latency_us));
  }

  auto fit_source = [&](const LinkCurve& c, const std::string& what) {
    return fmt::format(
        "{}: {} fitted to latency + bytes / bandwidth over {} sizes {}..{} (rms residual {:.1f}%){}", by,
        what, c.points.size(), format_bytes(static_cast<double>(c.points.front().bytes)),
        format_bytes(static_cast<double>(c.points.back().bytes)), 100 * c.fit.quality.rms_rel_residual,
        c.fit.resolved ? "" : "; noise hid the size dependence: the largest size's rate");
  };
  const LinkCurve h_alone = curve_or_alone(r.links, "alone", "h2d"),
                  d_alone = curve_or_alone(r.links, "alone", "d2h");
  const LinkCurve h_all = curve_or_alone(r.links, "all", "h2d"),
                  d_all = curve_or_alone(r.links, "all", "d2h");
  const LinkCurve h_bi = curve_or_alone(r.links, "bidir", "h2d"),
                  d_bi = curve_or_alone(r.links, "bidir", "d2h");
  hw.link.h2d_gbps = h_alone.fit.gbps;
  hw.link.d2h_gbps = d_alone.fit.gbps;
  hw.link.h2d_all_gbps = h_all.fit.gbps;
  hw.link.d2h_all_gbps = d_all.fit.gbps;
  hw.link.h2d_bidir_gbps = h_bi.fit.gbps;
  hw.link.d2h_bidir_gbps = d_bi.fit.gbps;
  hw.link.latency_s = 0.5 * (h_alone.fit.latency_s + d_alone.fit.latency_s);

  if (r.backend == "cpu") {
    const int N = devices;
    hw.name = fmt::format("cpu-backend-{}", host);
    hw.description =
        fmt::format("CPU backend on {} ({} cores), {} emulated devices; {}", prov.cpu_model, r.cores, N, by);
    hw.gpu.model = "emulated (CPU threads)";
    hw.gpu.count = N;
    hw.gpu.emulated_on_host = true;
    hw.gpu.host_threads_per_device = r.threads_per_device;
    hw.gpu.mem_bytes = std::min(kCpuBackendDeviceBudget, ram / (N + 1));
    hw.gpu.bf16_peak_flops = r.sgemm_gflops.median * 1e9;
    // hbm: the host memory an emulated device's elementwise work streams through, at its threads.
    double hbm = 0;
    for (const auto& row : r.host_memory.by_threads)
      if (row.threads <= r.threads_per_device) hbm = std::max(hbm, row.triad_gbps.median);
    hw.gpu.hbm_gbps = hbm > 0 ? hbm : r.host_memory.by_threads.front().triad_gbps.median;
    hw.host.pinned_limit_bytes = ram;
    hw.sources["gpu.count"] = fmt::format("--ranks {}: emulated devices of the CPU backend", N);
    hw.sources["gpu.emulated_on_host"] =
        "CPU backend: device compute and copies run on this host's cores and memory";
    hw.sources["gpu.host_threads_per_device"] =
        fmt::format("the CPU backend's BLAS threads per device, max(1, {} cores / {} devices)", r.cores, N);
    hw.sources["gpu.mem_bytes"] =
        fmt::format("the CPU backend's default device budget (16 GiB), capped at RAM / (devices + 1) = {}",
                    format_bytes(static_cast<double>(ram / (N + 1))));
    hw.sources["gpu.bf16_peak_flops"] = fmt::format(
        "{}: fp32 SGEMM {}^3 through kernels::gemm at {} BLAS threads (the CPU backend computes in fp32)", by,
        plan.sgemm_n, r.threads_per_device);
    hw.sources["gpu.hbm_gbps"] =
        fmt::format("{}: triad GB/s at {} threads (a device's elementwise work)", by, r.threads_per_device);
    hw.sources["host.pinned_limit_bytes"] = "CPU backend: host buffers are not page-locked; the limit is RAM";
    const std::string copies = "CPU backend: copy_h2d / copy_d2h = memcpy on the device's stream thread";
    hw.sources["host_link.h2d_gbps"] = fit_source(h_alone, copies + ", one device alone");
    hw.sources["host_link.d2h_gbps"] = fit_source(d_alone, copies + ", one device alone");
    hw.sources["host_link.h2d_all_gbps"] =
        fit_source(h_all, fmt::format("{}, all {} devices at once, per device", copies, N));
    hw.sources["host_link.d2h_all_gbps"] =
        fit_source(d_all, fmt::format("{}, all {} devices at once, per device", copies, N));
    hw.sources["host_link.h2d_bidir_gbps"] =
        fit_source(h_bi, "both directions on every device at once, per device");
    hw.sources["host_link.d2h_bidir_gbps"] =
        fit_source(d_bi, "both directions on every device at once, per device");
    hw.sources["host_link.latency_us"] =
        by + ": mean fitted latency of the alone h2d and d2h curves (stream dispatch + memcpy start)";
    if (N > 1) {
      const LinkCurve* ag = r.links.find("all_gather", "");
      const LinkCurve* rs = r.links.find("reduce_scatter", "");
      // The CPU backend's collectives are memcpy / fp32 sums between the emulated devices' memory on
      // the comm streams: a direct path that does not use the h2d / d2h streams, so not via_host
      // (which would charge the links for the collective's bytes too).
      hw.fabric.kind = "pcie_p2p";
      hw.fabric.allgather_busbw_gbps = ag->fit.gbps;
      hw.fabric.reduce_scatter_busbw_gbps = rs->fit.gbps;
      hw.fabric.latency_s = 0.5 * (ag->fit.latency_s + rs->fit.latency_s);
      hw.sources["fabric.kind"] =
          "CPU backend: collectives copy between emulated devices' memory on the comm streams, not through "
          "the h2d/d2h "
          "streams; pcie_p2p is the model's kind for a direct path";
      hw.sources["fabric.allgather_busbw_gbps"] = fit_source(
          *ag, fmt::format("Backend::all_gather (bf16) on {} devices, bus bandwidth S (N-1)/N / t", N));
      hw.sources["fabric.reduce_scatter_busbw_gbps"] = fit_source(
          *rs,
          fmt::format("Backend::reduce_scatter (bf16 in, fp32 sum out) on {} devices, bus bandwidth", N));
      hw.sources["fabric.latency_us"] = by + ": mean fitted latency of the two collectives";
    } else {
      hw.fabric.kind = "none";
      hw.sources["fabric.kind"] = "--ranks 1: one emulated device, no collectives";
    }
  } else {
    hw.name = fmt::format("{}-x{}-{}", inv.model, inv.count, host);
    std::replace(hw.name.begin(), hw.name.end(), ' ', '-');
    hw.description = fmt::format("{} x {} on {}; {}", inv.count, inv.model, prov.cpu_model, by);
    hw.gpu.model = inv.model;
    hw.gpu.count = inv.count;
    hw.gpu.mem_bytes = inv.mem_bytes;
    hw.gpu.bf16_peak_flops = r.gpu.bf16_gemm_tflops.median * 1e12;
    hw.gpu.hbm_gbps = r.gpu.hbm_gbps.median;
    hw.host.pinned_limit_bytes = ram;
    hw.sources["gpu.bf16_peak_flops"] =
        fmt::format("{}: cuBLAS bf16 GEMM {}^3 with fp32 accumulation on GPU 0 (achieved, not datasheet)", by,
                    plan.gpu.gemm_n);
    hw.sources["gpu.hbm_gbps"] = by + ": device-to-device cudaMemcpyAsync, read + write bytes";
    hw.sources["gpu.mem_bytes"] = "cudaGetDeviceProperties totalGlobalMem of GPU 0";
    hw.gpu.runtime_bytes = inv.runtime_bytes;
    hw.sources["gpu.runtime_bytes"] =
        "cudaMemGetInfo of GPU 0 once its context exists, before any allocation (total - free; includes other "
        "processes' memory)";
    if (r.gpu.collective_bytes >= 0) {
      hw.gpu.collective_bytes = r.gpu.collective_bytes;
      hw.sources["gpu.collective_bytes"] = "cudaMemGetInfo of GPU 0 before and after ncclCommInitAll over every GPU";
    } else {
      hw.gpu.collective_bytes = default_collective_bytes(hw.gpu, r.gpu.fabric_kind);
      hw.sources["gpu.collective_bytes"] = "one GPU: no communicator (default_collective_bytes)";
    }
    hw.sources["host.pinned_limit_bytes"] =
        "RAM (not measured: page-locking limits depend on the system's settings)";
    hw.sources["host_link.h2d_gbps"] =
        fit_source(h_alone, "pinned cudaMemcpyAsync H2D, one GPU alone (mean over GPUs)");
    hw.sources["host_link.d2h_gbps"] =
        fit_source(d_alone, "pinned cudaMemcpyAsync D2H, one GPU alone (mean over GPUs)");
    hw.sources["host_link.h2d_all_gbps"] = fit_source(h_all, "pinned H2D on every GPU at once, per GPU");
    hw.sources["host_link.d2h_all_gbps"] = fit_source(d_all, "pinned D2H on every GPU at once, per GPU");
    hw.sources["host_link.h2d_bidir_gbps"] = fit_source(h_bi, "H2D and D2H on every GPU at once, per GPU");
    hw.sources["host_link.d2h_bidir_gbps"] = fit_source(d_bi, "H2D and D2H on every GPU at once, per GPU");
    hw.sources["host_link.latency_us"] =
        by + ": mean fitted latency of the alone H2D and D2H curves (CUDA events)";
    if (inv.count > 1) {
      const LinkCurve* ag = r.links.find("all_gather", "");
      const LinkCurve* rs = r.links.find("reduce_scatter", "");
      hw.fabric.kind = r.gpu.fabric_kind;
      hw.fabric.allgather_busbw_gbps = ag->fit.gbps;
      hw.fabric.reduce_scatter_busbw_gbps = rs->fit.gbps;
      hw.fabric.latency_s = 0.5 * (ag->fit.latency_s + rs->fit.latency_s);
      hw.sources["fabric.kind"] = "cudaDeviceCanAccessPeer / NVLink query between every pair";
      hw.sources["fabric.allgather_busbw_gbps"] =
          fit_source(*ag, "ncclAllGather (bf16), nccl-tests bus bandwidth");
      hw.sources["fabric.reduce_scatter_busbw_gbps"] =
          fit_source(*rs, "ncclReduceScatter (bf16, sum), nccl-tests bus bandwidth");
      hw.sources["fabric.latency_us"] = by + ": mean fitted latency of the two collectives";
    } else {
      hw.fabric.kind = "none";
    }
  }

  if (!r.units.empty()) {
    std::vector<std::string> names;
    for (const UnitComputeResult& u : r.units) {
      hw.unit_times.insert(hw.unit_times.end(), u.profiles.begin(), u.profiles.end());
      names.push_back(u.model);
    }
    hw.sources["unit_times"] = fmt::format(
        "{}: units of {}, compute-stream time per device with {} device(s) computing at once, of the rank "
        "driver's "
        "calls (allocation, zeroing, the unit op incl. bf16->fp32 parameter widening, fp32->bf16 gradient "
        "conversion); fitted over micro-batches {} at seq {}{}",
        by, fmt::join(names, ", "), r.units.front().concurrent_devices,
        fmt::join(plan.units.micro_batches, ","), fmt::join(plan.units.seq_lens, ","),
        plan.units.seq_lens.size() < 2 ? " (one seq length: per_token_ctx_s = 0, valid near that length)"
                                       : "");
    if (r.backend == "cpu") {
      // Efficiency of the FLOP-based fallback (models without unit_times): the largest measured model's
      // decoder FLOP/s at its largest case over the SGEMM rate.
      const UnitComputeResult* big = &r.units.front();
      for (const UnitComputeResult& u : r.units)
        if (u.model == largest->name) big = &u;
      const ModelCard& card = *largest;
      const UnitCase* best = nullptr;
      for (const UnitCase& c : big->cases)
        if (c.kind == UnitKind::kDecoder && c.op == "fwd" && (!best || c.B * c.T > best->B * best->T))
          best = &c;
      const UnitFlops f = unit_flops(card, UnitKind::kDecoder, 0, best->B, best->T);
      const double eff = std::clamp(f.forward() / best->seconds.median / hw.gpu.bf16_peak_flops, 1e-3, 1.0);
      hw.gpu.matmul_efficiency = eff;
      hw.gpu.attention_efficiency = eff;
      for (const auto& row : big->fits)
        if (row.kind == UnitKind::kDecoder && row.op == "fwd") hw.gpu.kernel_overhead_s = row.fit.fit.fixed_s;
      const std::string eff_src = fmt::format(
          "{}: {} decoder forward FLOPs / measured time / gpu.bf16_peak_flops at B {} T {} (for models "
          "without "
          "unit_times)",
          by, card.name, best->B, best->T);
      hw.sources["gpu.matmul_efficiency"] = eff_src;
      hw.sources["gpu.attention_efficiency"] = eff_src + "; attention not separated, same value";
      hw.sources["gpu.kernel_overhead_s"] =
          fmt::format("{}: fixed_s of {}'s decoder forward fit", by, card.name);
    }
  }
  hw.validate("slidedp-profile");
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
      << fmt::format("{} {} +- {}", g3(s.median), m.unit, pct(s));
  }
  e << YAML::EndMap;
  e << YAML::Key << "fits" << YAML::Value << YAML::BeginMap;
  for (const LinkCurve& c : r.links.links)
    e << YAML::Key << fmt::format("links.{}.{}", c.mode, c.direction) << YAML::Value
      << fmt::format("latency {} us, {} GB/s; rms residual {:.1f}%, max {:.1f}%", g3(c.fit.latency_s * 1e6),
                     g3(c.fit.gbps), 100 * c.fit.quality.rms_rel_residual,
                     100 * c.fit.quality.max_rel_residual);
  for (const LinkCurve& c : r.links.collectives)
    e << YAML::Key << fmt::format("fabric.{}", c.mode) << YAML::Value
      << fmt::format("latency {} us, busbw {} GB/s; rms residual {:.1f}%, max {:.1f}%",
                     g3(c.fit.latency_s * 1e6), g3(c.fit.gbps), 100 * c.fit.quality.rms_rel_residual,
                     100 * c.fit.quality.max_rel_residual);
  for (const auto& row : r.cpu_update.by_threads)
    e << YAML::Key << fmt::format("cpu.reduce_slots.threads_{}", row.threads) << YAML::Value
      << fmt::format(
             "{} GB/s per extra slot; rms residual {:.1f}%; standalone reduce_grads ({} slots) {} GB/s",
             g3(row.reduce_gbps), 100 * row.slot_fit.rms_rel_residual, r.cpu_update.reduce_slots,
             g3(row.reduce_standalone_gbps.median));
  for (const UnitComputeResult& u : r.units)
    for (const auto& row : u.fits)
      e << YAML::Key << fmt::format("units.{}.{}.{}", u.model, unit_kind_name(row.kind), row.op)
        << YAML::Value
        << fmt::format("{} samples; rms residual {:.1f}%, max {:.1f}%", row.fit.quality.n,
                       100 * row.fit.quality.rms_rel_residual, 100 * row.fit.quality.max_rel_residual);
  e << YAML::EndMap;
  e << YAML::EndMap << YAML::EndMap;
  return text + e.c_str() + "\n";
}

}  // namespace slidedp::profiler
