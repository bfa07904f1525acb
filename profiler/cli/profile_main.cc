// slidedp-profile: measures what host-resident training depends on, on the machine at hand, and writes
// a hardware profile (the model's schema) the model, planner and sweeps read. Says once when there is
// no GPU and profiles the CPU backend instead; shows progress; prints tables or --json; stores every
// repetition of every case in the SQLite run log.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "card/model_card.h"
#include "common/cli_checks.h"
#include "common/cli_main.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/units.h"
#include "executor/node_link.h"
#include "executor/node_state.h"
#include "profiler/profile.h"
#include "profiler/report.h"
#include "runlog/interrupt.h"
#include "runlog/run_log.h"

namespace slidedp {
namespace {

template <class T>
std::vector<T> parse_list(const std::string& text, const std::string& flag) {
  std::vector<T> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(static_cast<T>(v));
    } catch (const std::exception&) {
      throw InputError(flag, fmt::format("'{}' is not a comma-separated list of positive integers", text));
    }
  }
  if (out.empty()) throw InputError(flag, "needs at least one value");
  return out;
}

// Under an MPI launcher: the link to the other processes (outlives profile_main so that an error on
// one ends them all, see main).
std::unique_ptr<exec::NodeLink> g_link;

int profile_main(int argc, char** argv) {
  CLI::App app{
      "slidedp-profile: measure this machine and write a hardware profile (the schema of\n"
      "model/presets/hardware/*.yaml) for slidedp-predict, slidedp-plan and slidedp-sweep. Measures host\n"
      "memory (copy, triad, under DMA-like copies), the CPU update and reduction kernels, and either the\n"
      "GPUs (pinned copies alone / all / both directions, NCCL collectives, unit compute) or, with no GPU,\n"
      "the CPU backend's emulated devices (memcpy copies, shared-memory collectives, unit compute).\n"
      "Every value is the median of repeated measurements; the spread is reported next to it.\n"
      "Under `mpirun -np 2` (or more) it also measures the network between process 0 and process 1 through\n"
      "SlideDP's MPI link (network.nic_gbps, network.latency_us); process 0 writes the profile."};
  bool quick = false, smoke = false, json = false, quiet = false, cpu_backend = false, no_db = false,
       kernels = false;
  std::vector<std::string> models{"slidedp-tiny"};
  std::string working_set = "model";
  int64_t chunk_numel = 0;
  std::string out = "profile.yaml", db = "runs/runs.db", micro = "1,2,4,8", threads;
  int64_t seq = 128;
  int ranks = 2, reps = 0;
  app.add_flag("--quick", quick, "Smaller sizes and 3 repetitions: under a minute on a 2-core machine");
  app.add_flag("--smoke", smoke,
               "Tiny sizes and 2 repetitions, a few seconds: checks the whole pipeline (tests); the numbers "
               "describe nothing");
  app.add_option("--model", models,
                 "Models whose unit times are measured (comma-separated or repeated): preset names "
                 "(slidedp-predict --list-presets) or model card / config.json files; written as unit_times "
                 "entries under each card's name")
      ->delimiter(',');
  app.add_option(
      "--chunk-numel", chunk_numel,
      "Chunk size (elements) the CPU rate tables are written for: the plans' chunk_numel (default: "
      "the plan default, 32M, capped at the update's working set)");
  app.add_option(
         "--working-set", working_set,
         "model: memory, update and copy working sets as large as the largest model's host state when "
         "that is smaller than the DRAM-sized default (a small model runs in the cache in the executor "
         "too); dram: always the DRAM-sized default")
      ->check(CLI::IsMember({"model", "dram"}));
  app.add_option("--seq", seq,
                 "Sequence length T of the unit times (a full run also measures T/2 to fit the "
                 "per-token-per-context term)");
  app.add_option("--micro-batches", micro, "Comma-separated micro-batch sizes B of the unit times");
  app.add_option(
      "--ranks", ranks,
      "CPU backend: emulated devices (gpu.count; the copies, collectives and units run with this many "
      "devices, each with max(1, cores / ranks) BLAS threads, as slidedp-run does)");
  app.add_option("--threads", threads,
                 "Comma-separated CPU thread counts for memory and update rates (default 1, "
                 "2, 4, ..., all available cores)");
  app.add_option("--reps", reps, "Repetitions per case (default: 2 smoke, 3 quick, 5 full)");
  app.add_flag("--cpu-backend", cpu_backend, "Profile the CPU backend even when a GPU is present");
  app.add_flag("--kernels", kernels,
               "GPU only: after the unit times, run each unit operation once more with CUPTI's activity "
               "records and write each kernel's time and calls beside it (measurements units/*_kernel_s; "
               "libcupti must be loadable)");
  app.add_option("--out", out, "Where to write the hardware profile YAML");
  app.add_option("--db", db, "SQLite run log for the raw samples (every repetition; created if missing)");
  app.add_flag("--no-db", no_db, "Do not write the run log");
  app.add_flag("--json", json, "Print one JSON object (profile, measurements, fits) instead of the tables");
  app.add_flag("-q,--quiet", quiet, "No progress line and no messages on stderr");
  double node_timeout = 120;
  app.add_option("--node-timeout", node_timeout,
                 "Under mpirun (the network stage): seconds a process waits for another before it fails naming it")
      ->check(finite_in(0.1, 1e6, "seconds"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(ErrorKind::kInput);
  }
  if (quick && smoke) throw InputError("--quick/--smoke", "choose one");
  // Written after minutes of measuring: checked first.
  check_output_file_target({"--out", out});
  if (!no_db) check_output_file_target({"--db", db});
  refuse_overlapping_outputs({{"--out", out}, {"--db", no_db ? "" : db}});
  std::vector<NamedPath> model_files;
  for (const std::string& m : models)
    if (path_exists(m)) model_files.push_back({"--model", m});
  for (const NamedPath& o : {NamedPath{"--out", out}, NamedPath{"--db", no_db ? "" : db}}) {
    refuse_output_over_inputs(o, model_files);
    refuse_output_in_checkpoints(o);
  }

  profiler::ProfileOptions o;
  o.scale = smoke   ? profiler::ProfileScale::kSmoke
            : quick ? profiler::ProfileScale::kQuick
                    : profiler::ProfileScale::kFull;
  for (const std::string& m : models) o.models.push_back(load_model_card(m));
  o.chunk_numel = chunk_numel;
  o.model_working_set = working_set == "model";
  o.seq_len = seq;
  o.micro_batches = parse_list<int64_t>(micro, "--micro-batches");
  o.ranks = ranks;
  if (!threads.empty()) o.threads = parse_list<int>(threads, "--threads");
  o.reps = reps;
  o.cpu_backend = cpu_backend;
  o.kernels = kernels;
  o.command_line = command_line(argc, argv);
  // Under an MPI launcher: the network stage between process 0 and 1; only process 0 profiles the rest.
  if (exec::launched_by_mpi()) {
    g_link = exec::make_mpi_link(0, node_timeout);
    // Every process must be started alike (only process 0 writes): a flag given to one process only
    // would make the processes measure different stages and wait for each other until the timeout.
    exec::check_nodes_agree(*g_link, exec::options_to_agree(app, {"--json", "--quiet"}));
    o.link = g_link.get();
    if (g_link->node() != 0) {
      profiler::measure_network(*g_link, profiler::network_plan(o));
      return 0;
    }
  }
  o.progress = !quiet;
  if (!quiet) o.log = [](const std::string& m) { fmt::print(stderr, "slidedp-profile: {}\n", m); };

  std::optional<runlog::RunLog> log;
  int64_t run_id = 0;
  if (!no_db) {
    log.emplace(runlog::RunLog::open(db));
    runlog::RunInfo info;
    info.kind = runlog::RunKind::kProfile;
    info.command_line = o.command_line;
    info.model_name = o.models.front().name;
    info.seq_len = o.seq_len;
    info.notes_json = nlohmann::json{{"scale", profiler::profile_scale_name(o.scale)}, {"out", out}}.dump();
    run_id = log->begin_run(info);
  }
  profiler::ProfileResult r;
  try {
    r = profiler::run_profile(o);
    write_file_atomic(out, profiler::profile_yaml(r));
  } catch (const Error& e) {
    if (log) {
      log->log_error(run_id, {e.kind() == ErrorKind::kInput ? "input"
                              : e.kind() == ErrorKind::kIo  ? "io"
                                                            : "runtime",
                              e.what(), std::nullopt, std::nullopt});
      log->end_run(run_id, runlog::RunStatus::kFailed);
    }
    throw;
  }
  if (log) {
    log->log_profile_samples(run_id, r.measurements.samples());
    log->end_run(run_id, runlog::RunStatus::kFinished);
  }
  if (json) {
    nlohmann::json j = profiler::profile_json(r);
    j["out"] = out;
    if (log) j["db"] = {{"path", db}, {"run_id", run_id}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << profiler::profile_tables(r, false);
    std::cout << fmt::format("wrote {} ({} backend{}) in {} (expected {})", out, r.backend,
                             r.gpu_note.empty() ? "" : ", no GPU", format_seconds(r.elapsed_s),
                             format_seconds(r.expected_s));
    if (log)
      std::cout << fmt::format("; {} raw samples in {} (run {})", r.measurements.samples().size(), db,
                               run_id);
    std::cout << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  slidedp::runlog::end_runs_on_stop_signal();  // the profile's run ends logged interrupted on SIGINT/SIGTERM
  const int rc = slidedp::run_cli("slidedp-profile", [&] { return slidedp::profile_main(argc, argv); });
  if (slidedp::g_link && rc != 0) slidedp::g_link->abort_all(rc);
  slidedp::g_link.reset();
  return rc;
}
