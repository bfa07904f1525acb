// slidedp-profile's engine: plans the stages for a scale (smoke / quick / full), estimates how long
// they take, runs them (host memory, CPU update, then either the GPUs' links, fabric and units, or,
// with no GPU, the CPU backend's copies, collectives and units), and turns the measurements into a
// Hardware profile of the model/hardware.h schema, every value with its source. The CLI, the tests
// and the results all go through run_profile.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "model/hardware.h"
#include "profiler/backend_links.h"
#include "profiler/cpu_update.h"
#include "profiler/gpu.h"
#include "profiler/host_memory.h"
#include "profiler/measurement.h"
#include "profiler/network.h"
#include "profiler/unit_compute.h"

namespace slidedp::profiler {

// smoke: tiny sizes, a few seconds, for tests (the numbers describe nothing); quick: under a minute on
// a 2-core machine; full: the sizes and repetitions the results are recorded with.
enum class ProfileScale { kSmoke, kQuick, kFull };
const char* profile_scale_name(ProfileScale s);

struct ProfileOptions {
  ProfileScale scale = ProfileScale::kFull;
  // Models whose unit times are measured (unit_times entries under each card's name). The largest one's
  // host state also sizes the working sets (see model_working_set).
  std::vector<ModelCard> models;
  int64_t seq_len = 128;                           // T of the unit times (full also measures T/2)
  std::vector<int64_t> micro_batches{1, 2, 4, 8};  // B of the unit times
  int ranks = 2;                                   // CPU backend: emulated devices
  std::vector<int> threads;                        // CPU thread counts; empty: 1, 2, 4, ..., cores
  int reps = 0;                                    // repetitions per case; 0: by scale (2 / 3 / 5)
  // Chunk size (elements) of the written CPU rate tables: the plan's chunk_numel the profile is for.
  // 0: the plan default (32M), capped at the update's working set.
  int64_t chunk_numel = 0;
  // Size the memory, update and copy working sets like the models' host state when that is smaller
  // than the scale's DRAM-sized default: a small model's state, copies and updates sit in the cache
  // in the executor too. false: always DRAM-sized (the machine, not the model).
  bool model_working_set = true;
  bool cpu_backend = false;  // profile the CPU backend even with a GPU present
  // Per-kernel GPU times of every unit operation (CUPTI; one more untimed run of each operation).
  // The CUDA backend's: refused when the run would profile the CPU backend.
  bool kernels = false;
  std::string command_line;  // recorded in the sources and notes
  // Where messages go (expected duration, "no GPU", stage changes); null: silent.
  std::function<void(const std::string&)> log;
  bool progress = false;  // a progress line on stderr
  // Under an MPI launcher: the link to the other processes; the network stage runs first, between
  // node 0 (this run) and node 1 (which runs only that stage: serve_network_stage). Null: no network.
  exec::NodeLink* link = nullptr;
};

// The network stage's sizes and repetitions for a scale.
NetworkPlan network_plan(const ProfileOptions& options);

// One stage of the plan and its estimated seconds.
struct PlannedStage {
  std::string name;
  double estimate_s = 0;
};

struct ProfileResult {
  ProfileOptions options;
  std::string backend;                     // "cpu" (emulated devices) | "cuda"
  std::string gpu_note;                    // why the CPU backend was profiled ("" when GPUs were)
  std::string date;                        // UTC, ISO-8601
  double load_before = 0, load_after = 0;  // 1-minute load average around the run
  double expected_s = 0, elapsed_s = 0;
  std::vector<PlannedStage> stages;
  int cores = 1;
  int threads_per_device = 1;

  Measurements measurements;
  HostMemoryResult host_memory;
  CpuUpdateResult cpu_update;
  BackendLinkResult links;               // CPU backend copies and collectives, or the GPUs' (converted)
  GpuMeasurements gpu;                   // when backend == "cuda"
  std::vector<UnitComputeResult> units;  // one per model (empty: no backend to run units on)
  std::optional<NetworkResult> network;  // under an MPI launcher
  std::string working_set;               // how the working sets were sized, for the notes
  Spread sgemm_gflops;

  Hardware hw;  // the profile
};

// Runs every stage. Throws InputError for bad options (named), RuntimeError for failures while
// measuring.
ProfileResult run_profile(const ProfileOptions& options);

// The profile YAML: hardware_to_yaml(hw) and a `measured:` section (free-form notes the hardware
// reader skips): date, command, load, scale, spreads and fit residuals.
std::string profile_yaml(const ProfileResult& r);

// CPU thread counts 1, 2, 4, ... up to `cores`, with `cores` itself last.
std::vector<int> default_thread_counts(int cores);

}  // namespace slidedp::profiler
