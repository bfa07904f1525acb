// The measured matched-batch sweep; see measured_sweep.h.
#include "sweeps/measured_sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "common/error.h"
#include "common/file_util.h"
#include "common/median.h"
#include "common/provenance.h"
#include "common/seconds_since.h"
#include "common/table.h"
#include "common/units.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "io/default_corpus.h"
#include "sweeps/svg_plot.h"
#include "sweeps/sweep_analysis.h"
#include "sweeps/sweep_report.h"

namespace slidedp {
namespace {

MeasuredPoint measure(const SweepSpec& spec, const SweepRow& row, const MeasuredOptions& o) {
  MeasuredPoint m;
  m.row = row;
  if (!row.feasible) {
    m.not_run = "no plan fits: " + row.infeasible_reason;
    return m;
  }
  const System system = row.point.system;
  const SweepGrid& g = spec.grids[static_cast<std::size_t>(row.point.grid)];
  const Hardware& hw = g.hardware[static_cast<std::size_t>(row.point.hardware)].hw;
  const ModelCard& card = g.models[static_cast<std::size_t>(row.point.model)];
  const Workload w = make_workload(card, row.point.seq_len);
  exec::TrainOptions t;
  t.card = card;
  t.seq_len = row.point.seq_len;
  t.plan = row.plan;  // after plan_for_system, which the trainer applies again (idempotent)
  t.system = system;
  t.dataset = default_corpus_dataset();
  t.steps = o.steps;
  t.lr.lr = 1e-3;
  t.backend = o.backend;
  if (o.backend == "cpu") {
    t.emulate = hw;
    t.time_scale = o.time_scale > 0 ? o.time_scale : exec::TargetPacing::measured_time_scale(w, hw, row.plan, system);
    // The emulated devices hold what the plan puts on the target's GPUs; this host's RAM is the limit.
    t.device_budget_bytes = static_cast<int64_t>(std::min(row.scored().memory.gpu_budget_bytes, 16.0 * (int64_t{1} << 30)));
  } else {
    t.device_budget_bytes = static_cast<int64_t>(row.scored().memory.gpu_budget_bytes);
  }
  const exec::TrainResult r = exec::train(t);
  std::vector<double> steps;
  for (std::size_t i = static_cast<std::size_t>(o.warmup); i < r.steps.size(); ++i) steps.push_back(r.steps[i].wall_s);
  m.ran = true;
  m.time_scale = o.backend == "cpu" ? r.time_scale : 1.0;
  m.step_s = median(steps) / m.time_scale;
  m.tokens_per_s = m.step_s > 0 ? static_cast<double>(row.point.tokens_per_step) / m.step_s : 0.0;
  m.paced_ops = r.paced_ops;
  m.paced_overruns = r.paced_overruns;
  return m;
}

}  // namespace

SweepResult MeasuredSweep::measured_as_rows() const {
  SweepResult r = modelled;
  for (std::size_t i = 0; i < points.size(); ++i) {
    SweepRow& row = r.rows[i];
    const MeasuredPoint& m = points[i];
    if (!m.ran) {
      row.feasible = false;
      row.infeasible_reason = m.not_run;
      continue;
    }
    Prediction p = row.scored();
    p.step_time_s = m.step_s;
    p.tokens_per_s = m.tokens_per_s;
    row.simulated = p;
  }
  return r;
}

MeasuredSweep run_measured_sweep(const SweepSpec& spec, const MeasuredOptions& o) {
  if (o.steps <= o.warmup) throw InputError("--steps", "must exceed the warm-up steps");
  if (o.backend != "cpu" && o.backend != "cuda") throw InputError("--backend", "cpu or cuda, not '" + o.backend + "'");
  if (o.backend != "cpu" && o.time_scale > 0) throw InputError("--time-scale", "only for the paced CPU backend");
  const auto t0 = std::chrono::steady_clock::now();
  MeasuredSweep s;
  s.backend = o.backend;
  SweepRunOptions ro;
  ro.simulate = true;  // the pacing shares resources as the simulator does: compare with it
  s.modelled = run_sweep(spec, ro);
  const int total = static_cast<int>(s.modelled.rows.size());
  for (int i = 0; i < total; ++i) {
    s.points.push_back(measure(spec, s.modelled.rows[static_cast<std::size_t>(i)], o));
    if (o.progress) o.progress(i + 1, total, s.points.back());
  }
  s.wall_s = seconds_since(t0);
  return s;
}

namespace {

std::string measured_points_csv(const MeasuredSweep& s, const std::string& stamp) {
  std::string csv = "# " + stamp + "\n";
  csv += "hardware,model,seq_len,ranks,tokens_per_step,system,plan,ran,not_run,predicted_step_s,measured_step_s,error,"
         "predicted_tokens_per_s,measured_tokens_per_s,predicted_bottleneck,time_scale,paced_ops,paced_overruns\n";
  for (const MeasuredPoint& m : s.points) {
    const SweepRow& r = m.row;
    csv += fmt::format("{},{},{},{},{},{},\"{}\",{},\"{}\",{:.6g},{:.6g},{:.4f},{:.6g},{:.6g},{},{:.4g},{},{}\n", r.hardware,
                       r.model, r.point.seq_len, r.point.ranks, r.point.tokens_per_step, r.system, r.plan_summary,
                       m.ran ? 1 : 0, m.not_run, r.feasible ? m.predicted_step_s() : 0.0, m.step_s, m.error(),
                       r.tokens_per_s(), m.tokens_per_s, r.feasible ? r.scored().bottleneck : "", m.time_scale,
                       m.paced_ops, m.paced_overruns);
  }
  return csv;
}

// The model's error per system and hardware.
Table error_table(const MeasuredSweep& s) {
  std::map<std::pair<std::string, std::string>, std::vector<double>> errors;  // (hardware, system) -> |error|
  for (const MeasuredPoint& m : s.points)
    if (m.ran) errors[{m.row.hardware, m.row.system}].push_back(std::fabs(m.error()));
  Table err({"hardware", "system", "points", "MAPE", "worst"}, {"", "", "", "%", "%"});
  for (const auto& [key, v] : errors) {
    double sum = 0;
    for (double e : v) sum += e;
    err.add_row({key.first, key.second, std::to_string(v.size()), fmt::format("{:.1f}", 100 * sum / v.size()),
                 fmt::format("{:.1f}", 100 * *std::max_element(v.begin(), v.end()))});
  }
  return err;
}

// The modelled rows with the systems that did not run marked infeasible: the model on exactly the
// measured cases.
SweepResult modelled_where_measured(const MeasuredSweep& s) {
  SweepResult same = s.modelled;
  for (std::size_t i = 0; i < same.rows.size(); ++i)
    if (!s.points[i].ran) same.rows[i].feasible = false;
  return same;
}

const SpeedupStat* find_baseline(const std::vector<SpeedupStat>& v, const std::string& baseline) {
  for (const SpeedupStat& x : v)
    if (x.baseline == baseline) return &x;
  return nullptr;
}

// SlideDP's speedups, measured beside modelled, over the baselines that ran.
Table speedup_table(const MeasuredSweep& s, const SweepResult& meas, const std::set<std::string>& hardware,
                    const std::set<std::string>& ran_systems) {
  Table sp({"hardware", "baseline", "points", "measured", "modelled (same points)", "modelled (all points)"},
           {"", "", "", "geomean x", "geomean x", "geomean x"});
  const SweepResult same = modelled_where_measured(s);
  for (const std::string& h : hardware) {
    const auto measured = speedup_totals(meas.rows, h, "");
    const auto modelled_same = speedup_totals(same.rows, h, "");
    for (const SpeedupStat& st : speedup_totals(s.modelled.rows, h, "")) {
      const SpeedupStat* me = find_baseline(measured, st.baseline);
      const SpeedupStat* ms = find_baseline(modelled_same, st.baseline);
      const bool ran = ran_systems.count(st.baseline) > 0;
      sp.add_row({h, st.baseline, ran && me ? std::to_string(me->points) : "0",
                  ran && me && me->points ? fmt::format("{:.2f} ({:.2f}-{:.2f})", me->geomean, me->min, me->max) : "not run",
                  ran && ms && ms->points ? fmt::format("{:.2f}", ms->geomean) : "-",
                  st.points ? fmt::format("{:.2f}", st.geomean) : "-"});
    }
  }
  return sp;
}

std::string measured_vs_predicted_svg(const MeasuredSweep& s, const std::string& command) {
  ScatterPlot sc;
  sc.title = s.backend == "cpu" ? "Matched batch: predicted vs measured step time (paced CPU backend, target seconds)"
                                 : "Matched batch: predicted vs measured step time (" + s.backend + " backend)";
  sc.caption = sweep_plot_stamp(s.modelled, command);
  sc.x = {"measured step time (s)", true};
  sc.y = {"predicted step time (s, simulator)", true};
  std::map<std::string, PlotSeries> by_system;
  for (const MeasuredPoint& m : s.points) {
    if (!m.ran) continue;
    PlotSeries& ps = by_system[m.row.system];
    ps.name = m.row.system;
    ps.x.push_back(m.step_s);
    ps.y.push_back(m.predicted_step_s());
    ps.labels.push_back(fmt::format("{} {} {} tokens: {}", m.row.hardware, m.row.model,
                                    format_tokens(m.row.point.tokens_per_step), m.row.plan_summary));
  }
  for (auto& [name, ps] : by_system) sc.series.push_back(ps);
  return svg_scatter(sc);
}

// Hardware `h`'s measured and modelled speedups as bars; empty when no baseline ran there.
std::string speedup_bars_svg(const MeasuredSweep& s, const SweepResult& meas, const std::string& h,
                             const std::set<std::string>& ran_systems, const std::string& command) {
  BarPlot bp;
  bp.title = fmt::format("SlideDP's measured speedup over each baseline, {} ({})", h,
                         s.backend == "cpu" ? "paced" : s.backend + " backend");
  bp.caption = sweep_plot_stamp(s.modelled, command);
  bp.y_label = "tokens/s ratio (geomean)";
  bp.bars = {"measured", "modelled"};
  std::vector<double> measured_v, modelled_v;
  const auto ms = speedup_totals(modelled_where_measured(s).rows, h, "");
  for (const SpeedupStat& st : speedup_totals(meas.rows, h, "")) {
    if (!ran_systems.count(st.baseline) || st.points == 0) continue;
    bp.groups.push_back(st.baseline);
    measured_v.push_back(st.geomean);
    const SpeedupStat* m = find_baseline(ms, st.baseline);
    modelled_v.push_back(m ? m->geomean : 0.0);
  }
  bp.values = {measured_v, modelled_v};
  bp.reference_line = 1.0;
  return bp.groups.empty() ? "" : svg_bars(bp);
}

// How the points were measured, for the README's first paragraph.
std::string how_measured(const MeasuredSweep& s) {
  int ran = 0, overruns = 0;
  int64_t ops = 0;
  for (const MeasuredPoint& m : s.points) ran += m.ran, overruns += static_cast<int>(m.paced_overruns), ops += m.paced_ops;
  std::string md;
  if (s.backend == "cpu")
    md += fmt::format(
        "{} points; {} ran on the executor, each on the CPU backend paced at the model's costs for its hardware "
        "with the system's own data movement (`slidedp-run --emulate HW --system S`), each plan at its own measured "
        "time scale, the median of the measured steps divided by it; {} of {} paced operations ran over their "
        "time. The paced durations come from the model: the comparison checks the executor's scheduling against "
        "the model's, not the model's costs. ",
        s.points.size(), ran, overruns, ops);
  else
    md += fmt::format(
        "{} points; {} ran on the executor's {} backend on this machine's GPUs with the system's own data movement "
        "(`slidedp-run --backend {} --system S`), the median of the measured steps. ",
        s.points.size(), ran, s.backend, s.backend);
  md += fmt::format(
      "Every plan is the one the model chose for its system at that many tokens per step (as `slidedp-sweep "
      "run --simulate`); the prediction beside each measurement is the simulator's. What a paced measurement "
      "checks and cannot check: docs/EXECUTOR.md (paced emulation).\n\n");
  return md;
}

Table every_point_table(const MeasuredSweep& s) {
  Table pts({"hardware", "tokens", "system", "plan", "predicted", "measured", "error", "scale"},
            {"", "", "", "", "ms", "ms", "%", ""});
  for (const MeasuredPoint& m : s.points)
    pts.add_row({m.row.hardware, format_tokens(m.row.point.tokens_per_step), m.row.system,
                 m.row.feasible ? m.row.plan_summary : "-",
                 m.row.feasible ? fmt::format("{:.2f}", 1e3 * m.predicted_step_s()) : "-",
                 m.ran ? fmt::format("{:.2f}", 1e3 * m.step_s) : m.not_run,
                 m.ran ? fmt::format("{:+.1f}", 100 * m.error()) : "-",
                 m.ran ? fmt::format("{:.0f}", m.time_scale) : "-"});
  return pts;
}

std::string measured_readme(const MeasuredSweep& s, const SweepResult& meas, const Table& sp,
                            const std::string& command) {
  const SweepResult& mod = s.modelled;
  const Provenance& pv = provenance();
  std::string md = "# Matched batch, measured: " + mod.spec.name + "\n\n";
  md += "Produced by: `" + command + "`  \n" +
        fmt::format("spec {} (hash {}), git {}, {} ({} cores), {}, {}\n\n", mod.spec.file,
                    hash_hex(mod.spec.text_hash), pv.git_revision, pv.cpu_model, pv.cpu_count,
                    utc_timestamp(), format_seconds(s.wall_s));
  md += how_measured(s);
  md += "## SlideDP's speedup, measured and modelled\n\n```\n" + sp.render() + "```\n\n";
  const auto claims_measured = evaluate_claims(meas);
  const auto claims_modelled = evaluate_claims(mod);
  if (!claims_measured.empty()) {
    md += "## The paper's claims\n\n| claim | paper | measured here | modelled |\n|---|---|---|---|\n";
    for (std::size_t i = 0; i < claims_measured.size(); ++i)
      md += fmt::format("| {} | {} | {} | {} |\n", claims_measured[i].claim.claim, claims_measured[i].claim.paper,
                        claims_measured[i].model, claims_modelled[i].model);
    md += "\n(Baselines the executor does not run count as points they cannot fit in the measured column.)\n\n";
  }
  md += "## The model against the measurements\n\n```\n" + error_table(s).render() + "```\n\n";
  md += "## Every point\n\n```\n" + every_point_table(s).render() + "```\n\n";
  md += "Files: `points.csv`, `measured_vs_predicted.svg`, `speedups_measured__<hardware>.svg`.\n\n";
  md += "The spec:\n\n```yaml\n" + mod.spec.text + "```\n";
  return md;
}

}  // namespace

std::vector<std::string> write_measured_report(const MeasuredSweep& s, const std::string& dir,
                                               const std::string& command) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const SweepResult meas = s.measured_as_rows();
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& text) {
    write_file_atomic((fs::path(dir) / name).string(), text);
    written.push_back(name);
  };
  write("points.csv", measured_points_csv(s, sweep_stamp(s.modelled, command)));
  std::set<std::string> ran_systems;
  for (const MeasuredPoint& m : s.points)
    if (m.ran) ran_systems.insert(m.row.system);
  std::set<std::string> hardware;
  for (const SweepRow& r : s.modelled.rows) hardware.insert(r.hardware);
  const Table sp = speedup_table(s, meas, hardware, ran_systems);
  write("measured_vs_predicted.svg", measured_vs_predicted_svg(s, command));
  for (const std::string& h : hardware)
    if (const std::string svg = speedup_bars_svg(s, meas, h, ran_systems, command); !svg.empty())
      write(fmt::format("speedups_measured__{}.svg", file_name_slug(h)), svg);
  write("README.md", measured_readme(s, meas, sp, command));
  return written;
}

}  // namespace slidedp
