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
#include "common/cli_parse.h"
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

// Every flag of slidedp-profile, with its --help text.
struct ProfileFlags {
  bool quick = false, smoke = false, json = false, quiet = false, cpu_backend = false, no_db = false,
       kernels = false;
  std::vector<std::string> models{"slidedp-tiny"};
  std::string working_set = "model";
  int64_t chunk_numel = 0;
  std::string out = "profile.yaml", db = "runs/runs.db", micro = "1,2,4,8", threads;
  int64_t seq = 128;
  int ranks = 2, reps = 0;
  double node_timeout = 120;

  void add_to(CLI::App& app);
};

void ProfileFlags::add_to(CLI::App& app) {
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
  app.add_option("--node-timeout", node_timeout,
                 "Under mpirun (the network stage): seconds a process waits for another before it fails naming it")
      ->check(finite_in(0.1, 1e6, "seconds"));
}

// The profile and the run log are written after minutes of measuring: their targets are checked first.
void check_outputs(const ProfileFlags& f) {
  if (f.quick && f.smoke) throw InputError("--quick/--smoke", "choose one");
  check_output_file_target({"--out", f.out});
  if (!f.no_db) check_output_file_target({"--db", f.db});
  refuse_overlapping_outputs({{"--out", f.out}, {"--db", f.no_db ? "" : f.db}});
  std::vector<NamedPath> model_files;
  for (const std::string& m : f.models)
    if (path_exists(m)) model_files.push_back({"--model", m});
  for (const NamedPath& o : {NamedPath{"--out", f.out}, NamedPath{"--db", f.no_db ? "" : f.db}}) {
    refuse_output_over_inputs(o, model_files);
    refuse_output_in_checkpoints(o);
  }
}

profiler::ProfileOptions profile_options(const ProfileFlags& f, int argc, char** argv) {
  profiler::ProfileOptions o;
  o.scale = f.smoke   ? profiler::ProfileScale::kSmoke
            : f.quick ? profiler::ProfileScale::kQuick
                      : profiler::ProfileScale::kFull;
  for (const std::string& m : f.models) o.models.push_back(load_model_card(m));
  o.chunk_numel = f.chunk_numel;
  o.model_working_set = f.working_set == "model";
  o.seq_len = f.seq;
  o.micro_batches = parse_list<int64_t>(f.micro, "--micro-batches");
  o.ranks = f.ranks;
  if (!f.threads.empty()) o.threads = parse_list<int>(f.threads, "--threads");
  o.reps = f.reps;
  o.cpu_backend = f.cpu_backend;
  o.kernels = f.kernels;
  o.command_line = command_line(argc, argv);
  return o;
}

// The profile as measured, and the run that logged it (no log with --no-db).
struct LoggedProfile {
  profiler::ProfileResult result;
  std::optional<runlog::RunLog> log;
  int64_t run_id = 0;
};

// Runs the profile and writes it; the run log gets its samples, or the error that ended it.
LoggedProfile run_logged(const profiler::ProfileOptions& o, const ProfileFlags& f) {
  LoggedProfile p;
  if (!f.no_db) {
    p.log.emplace(runlog::RunLog::open(f.db));
    runlog::RunInfo info;
    info.kind = runlog::RunKind::kProfile;
    info.command_line = o.command_line;
    info.model_name = o.models.front().name;
    info.seq_len = o.seq_len;
    info.notes_json = nlohmann::json{{"scale", profiler::profile_scale_name(o.scale)}, {"out", f.out}}.dump();
    p.run_id = p.log->begin_run(info);
  }
  try {
    p.result = profiler::run_profile(o);
    write_file_atomic(f.out, profiler::profile_yaml(p.result));
  } catch (const Error& e) {
    if (p.log) {
      p.log->log_error(p.run_id, {e.kind() == ErrorKind::kInput ? "input"
                                  : e.kind() == ErrorKind::kIo  ? "io"
                                                                : "runtime",
                                  e.what(), std::nullopt, std::nullopt});
      p.log->end_run(p.run_id, runlog::RunStatus::kFailed);
    }
    throw;
  }
  if (p.log) {
    p.log->log_profile_samples(p.run_id, p.result.measurements.samples());
    p.log->end_run(p.run_id, runlog::RunStatus::kFinished);
  }
  return p;
}

void print_report(const LoggedProfile& p, const ProfileFlags& f) {
  const profiler::ProfileResult& r = p.result;
  if (f.json) {
    nlohmann::json j = profiler::profile_json(r);
    j["out"] = f.out;
    if (p.log) j["db"] = {{"path", f.db}, {"run_id", p.run_id}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << profiler::profile_tables(r, false);
  std::cout << fmt::format("wrote {} ({} backend{}) in {} (expected {})", f.out, r.backend,
                           r.gpu_note.empty() ? "" : ", no GPU", format_seconds(r.elapsed_s),
                           format_seconds(r.expected_s));
  if (p.log)
    std::cout << fmt::format("; {} raw samples in {} (run {})", r.measurements.samples().size(), f.db,
                             p.run_id);
  std::cout << "\n";
}

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
  ProfileFlags f;
  f.add_to(app);
  if (const std::optional<int> done = parse_command_line(app, argc, argv)) return *done;
  check_outputs(f);
  profiler::ProfileOptions o = profile_options(f, argc, argv);
  // Under an MPI launcher: the network stage between process 0 and 1; only process 0 profiles the rest.
  if (exec::launched_by_mpi()) {
    g_link = exec::make_mpi_link(0, f.node_timeout);
    // Every process must be started alike (only process 0 writes): a flag given to one process only
    // would make the processes measure different stages and wait for each other until the timeout.
    exec::check_nodes_agree(*g_link, exec::options_to_agree(app, {"--json", "--quiet"}));
    o.link = g_link.get();
    if (g_link->node() != 0) {
      profiler::measure_network(*g_link, profiler::network_plan(o));
      return 0;
    }
  }
  o.progress = !f.quiet;  // process 0 alone reports
  if (!f.quiet) o.log = [](const std::string& m) { fmt::print(stderr, "slidedp-profile: {}\n", m); };
  print_report(run_logged(o, f), f);
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
