// What `slidedp-sweep run` writes: points.csv (every point, every number), README.md (the paper's
// claims beside the model's values, then one section per analysis) and SVG plots (throughput vs
// tokens per step per system, speedup bars, a bottleneck map per grid, longest sequence, scaling).
// Every file starts with the same provenance stamp: command, spec file and hash, git revision, date.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sweeps/sweep_runner.h"

namespace slidedp {

struct SweepFile {
  std::string name;  // relative to the output folder
  std::string content;
};

// The stamp every file carries (one line): command, spec file and hash, git revision, CPU, date.
std::string sweep_stamp(const SweepResult& result, const std::string& command);

// A report goes into a new folder, an empty one, or one holding an earlier report of slidedp-sweep (its
// README.md says so): its files there are replaced, the rest kept. Any other non-empty folder is
// refused, naming `flag`: the report's README.md or points.csv would replace the user's own.
void refuse_foreign_report_folder(const std::string& dir, const std::string& flag);

// A label as a part of a file name: lower-case letters, digits, '.' and '-', every other run of
// characters one '-' ("H100 x8/what-if" -> "h100-x8-what-if"); always embedded in a longer name.
std::string file_name_slug(const std::string& label);
// The shorter stamp of plot captions (they are one line of a fixed-width SVG): command, spec hash, git.
std::string sweep_plot_stamp(const SweepResult& result, const std::string& command);

// Columns of points.csv, in order; rows with the same values give the same text (for goldens),
// except the timing column eval_s.
std::vector<std::string> sweep_csv_columns();
std::vector<std::string> sweep_csv_cells(const SweepRow& row);
std::string sweep_csv(const SweepResult& result, const std::string& stamp);

// Every file of the report, in memory (tests inspect them without touching the disk).
std::vector<SweepFile> render_sweep_report(const SweepResult& result, const std::string& command);
// Renders and writes them into `dir` (created), atomically per file. Returns the names written.
std::vector<std::string> write_sweep_report(const SweepResult& result, const std::string& dir,
                                            const std::string& command);

// A short machine-readable summary: counts, run time, claims, speedup totals, files.
nlohmann::json sweep_summary_json(const SweepResult& result, const std::vector<std::string>& files,
                                  const std::string& dir);

}  // namespace slidedp
