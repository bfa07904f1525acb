// Sweep outputs; see sweep_report.h. The README is generated in full from the rows (no number in it
// is typed by hand); the spec's text is copied at its end so the file alone says what was swept.
#include "sweeps/sweep_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/provenance.h"
#include "common/table.h"
#include "common/units.h"
#include "io/posix_file.h"
#include "model/expert_routing.h"
#include "sweeps/svg_plot.h"
#include "sweeps/sweep_analysis.h"

namespace slidedp {
namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

// Markdown table cells may not contain '|' (plan summaries do) or newlines.
std::string md(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|')
      o += "\\|";
    else if (c == '\n')
      o += ' ';
    else
      o += c;
  }
  return o;
}

std::string shorten(const std::string& s, std::size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

// File names from labels: lowercase letters, digits, '.', '-'.

std::string g6(double x) { return fmt::format("{:.6g}", x); }
std::string tok_s(double x) { return fmt::format("{:.0f}", x); }

// The second-busiest resource and its utilization, "host_mem 71%".
std::string next_busiest(const Prediction& p) {
  std::vector<std::pair<double, std::string>> v;
  for (const auto& [k, s] : p.busy_s)
    if (k != p.bottleneck) v.push_back({s, k});
  if (v.empty() || p.step_time_s <= 0) return "";
  auto it = std::max_element(v.begin(), v.end());
  return fmt::format("{} {:.0f}%", it->second, 100.0 * it->first / p.step_time_s);
}

std::vector<System> systems_of(const SweepResult& r) {
  std::vector<System> out;
  for (const SweepRow& row : r.rows)
    if (std::find(out.begin(), out.end(), row.point.system) == out.end()) out.push_back(row.point.system);
  return out;
}

bool wants(const SweepSpec& s, const std::string& analysis) {
  return std::find(s.analyses.begin(), s.analyses.end(), analysis) != s.analyses.end();
}

std::string group_title(const SweepRow& r) {
  return fmt::format("{} · {} · seq {} · {} ranks", r.hardware, r.model, format_tokens(r.point.seq_len),
                     r.point.ranks);
}

// ---- sections ----

std::string claims_section(const SweepResult& res) {
  const std::vector<ClaimResult> claims = evaluate_claims(res);
  if (claims.empty()) return "";
  std::string s = "## The paper's claims beside this sweep\n\n";
  s += "The paper's numbers are measurements on real machines; the model's are predictions on the hardware "
       "presets named below (docs/SWEEPS.md discusses where they agree and where not).\n\n";
  Table t({"claim", "paper", "model (this sweep)"}, {"", "", ""});
  for (const ClaimResult& c : claims) {
    std::string scope;
    if (!c.claim.hardware.empty() || !c.claim.model.empty())
      scope = fmt::format(" [{}{}{}]", c.claim.hardware,
                          !c.claim.hardware.empty() && !c.claim.model.empty() ? ", " : "", c.claim.model);
    t.add_row({md(c.claim.claim + scope), md(c.claim.paper), md(c.model)});
  }
  return s + t.render_markdown() + "\n";
}

std::string method_section(const SweepResult& res) {
  std::string s = "## How each point is scored\n\n";
  s += "Every system gets the same tokens per optimizer step and the same GPU memory budget (the GPU's "
       "memory minus a 512 MiB reserve for allocator slack; the CUDA context and NCCL buffers are charged as items of the memory account). ";
  s += "**slidedp**: the planner's plan (`planner::search_plans`, matched batch: routes, chunk size, "
       "activation mix, buffer depth, update threads and batch shape, ranked by the analytical model; an MLP "
       "token tile of 16384, then 4096 tokens only when no untiled plan fits). ";
  s += "**Baselines**: the choices their implementations fix (`plan_for_system`: routes, activation policy, "
       "SlideFormer's 32M-element chunks, two buffer slots; other chunks 32M elements), with every "
       "micro-batch x accumulation split of the step tried under the baseline's own memory model and the "
       "fastest that fits kept; FSDP2 also chooses how many layers keep their activations (the rest "
       "recompute). ";
  s += res.simulated ? "Each chosen plan is then re-scored by the discrete-event simulator, and the figures "
                       "below are the simulator's (points.csv has both).\n\n"
                     : "Figures are the analytical step model's (`--simulate` re-scores every chosen plan "
                       "with the discrete-event simulator).\n\n";
  return s;
}

// With one system (what-if sweeps), the lines compare machines: one table and plot per (grid, model,
// sequence length), a column and a line per machine (and rank count).
std::string machine_throughput_section(const SweepResult& res, const std::string& stamp,
                                       std::vector<SweepFile>& files) {
  struct GroupKey {
    int grid, model;
    int64_t seq;
    auto operator<=>(const GroupKey&) const = default;
  };
  using MachineKey = std::pair<int, int>;  // hardware, ranks
  std::map<GroupKey, std::map<int64_t, std::map<MachineKey, const SweepRow*>>> groups;
  std::map<GroupKey, std::vector<MachineKey>> machines;
  for (const SweepRow& r : res.rows) {
    const GroupKey g{r.point.grid, r.point.model, r.point.seq_len};
    const MachineKey m{r.point.hardware, r.point.ranks};
    groups[g][r.point.tokens_per_step][m] = &r;
    auto& ms = machines[g];
    if (std::find(ms.begin(), ms.end(), m) == ms.end()) ms.push_back(m);
  }
  std::string s = "## Throughput against tokens per step\n\n";
  s += fmt::format(
      "Tokens per second of the whole machine ({}), one column per machine; `-` = does not fit.\n\n",
      res.rows.empty() ? "" : res.rows.front().system);
  for (const auto& [g, by_tokens] : groups) {
    const SweepGrid& grid = res.spec.grids[static_cast<std::size_t>(g.grid)];
    auto label = [&](const MachineKey& m) {
      const std::string& h = grid.hardware[static_cast<std::size_t>(m.first)].label;
      return grid.ranks.size() > 1 ? fmt::format("{} x{}", h, m.second) : h;
    };
    std::vector<std::string> titles = {"tokens/step"}, units = {""};
    for (const MachineKey& m : machines[g]) {
      titles.push_back(label(m));
      units.push_back("tok/s");
    }
    Table t(titles, units);
    std::map<MachineKey, PlotSeries> series;
    for (const auto& [tokens, by_m] : by_tokens) {
      std::vector<std::string> cells = {format_tokens(tokens)};
      for (const MachineKey& m : machines[g]) {
        auto it = by_m.find(m);
        if (it == by_m.end() || !it->second->feasible) {
          cells.push_back("-");
          continue;
        }
        cells.push_back(tok_s(it->second->tokens_per_s()));
        PlotSeries& se = series[m];
        se.name = label(m);
        se.x.push_back(static_cast<double>(tokens));
        se.y.push_back(it->second->tokens_per_s());
        se.labels.push_back(it->second->plan_summary);
      }
      t.add_row(cells);
    }
    const SweepRow* any = by_tokens.begin()->second.begin()->second;
    LinePlot plot;
    plot.title = fmt::format("Throughput: {} · {} · seq {}", grid.name, any->model, format_tokens(g.seq));
    plot.caption = stamp;
    plot.x = {"tokens per step", true};
    plot.y = {"tokens/s", true};
    for (const MachineKey& m : machines[g])
      if (series.count(m)) plot.series.push_back(series[m]);
    const std::string file =
        fmt::format("throughput__{}__{}__seq{}.svg", file_name_slug(grid.name), file_name_slug(any->model), g.seq);
    files.push_back({file, svg_lines(plot)});
    s += fmt::format("### {} · {} · seq {}\n\n{}\n![throughput]({})\n\n", grid.name, any->model,
                     format_tokens(g.seq), t.render_markdown(), file);
  }
  return s;
}

std::string throughput_section(const SweepResult& res, const std::string& stamp,
                               std::vector<SweepFile>& files) {
  const std::vector<System> systems = systems_of(res);
  if (systems.size() == 1) return machine_throughput_section(res, stamp, files);
  struct GroupKey {
    int grid, hardware, model;
    int64_t seq;
    int ranks;
    auto operator<=>(const GroupKey&) const = default;
  };
  std::map<GroupKey, std::map<int64_t, std::map<System, const SweepRow*>>> groups;
  for (const SweepRow& r : res.rows)
    groups[{r.point.grid, r.point.hardware, r.point.model, r.point.seq_len, r.point.ranks}]
          [r.point.tokens_per_step][r.point.system] = &r;
  std::string s = "## Throughput against tokens per step\n\n";
  s += "Tokens per second of the whole machine; `-` = the system cannot fit that point (see points.csv for "
       "why).\n\n";
  for (const auto& [g, by_tokens] : groups) {
    const SweepRow* any = by_tokens.begin()->second.begin()->second;
    std::vector<std::string> titles = {"tokens/step"}, units = {""};
    for (System sys : systems) {
      titles.push_back(system_name(sys));
      units.push_back("tok/s");
    }
    titles.insert(titles.end(), {"SlideDP TFLOP/s/GPU", "SlideDP bottleneck", "SlideDP plan"});
    units.insert(units.end(), {"", "", ""});
    Table t(titles, units);
    LinePlot plot;
    plot.title = fmt::format("Throughput: {}", group_title(*any));
    plot.caption = stamp;
    plot.x = {"tokens per step", true};
    plot.y = {"tokens/s", true};
    std::map<System, PlotSeries> series;
    for (const auto& [tokens, by_sys] : by_tokens) {
      std::vector<std::string> cells = {format_tokens(tokens)};
      for (System sys : systems) {
        auto it = by_sys.find(sys);
        if (it == by_sys.end() || !it->second->feasible) {
          cells.push_back("-");
          continue;
        }
        cells.push_back(tok_s(it->second->tokens_per_s()));
        PlotSeries& se = series[sys];
        se.name = system_name(sys);
        se.x.push_back(static_cast<double>(tokens));
        se.y.push_back(it->second->tokens_per_s());
        se.labels.push_back(it->second->plan_summary);
      }
      auto sd = by_sys.find(System::kSlideDP);
      if (sd != by_sys.end() && sd->second->feasible) {
        cells.push_back(fmt::format("{:.0f}", sd->second->scored().tflops_per_gpu));
        cells.push_back(fmt::format("{} {:.0f}%", sd->second->scored().bottleneck,
                                    100 * sd->second->scored().bottleneck_utilization));
        cells.push_back(md(sd->second->plan_summary));
      } else {
        cells.insert(cells.end(), {"", "", ""});
      }
      t.add_row(cells);
    }
    for (System sys : systems)
      if (series.count(sys)) plot.series.push_back(series[sys]);
    const std::string file = fmt::format("throughput__{}__{}__seq{}__r{}.svg", file_name_slug(any->hardware),
                                         file_name_slug(any->model), g.seq, g.ranks);
    files.push_back({file, svg_lines(plot)});
    s += fmt::format("### {}\n\n{}\n![throughput]({})\n\n", group_title(*any), t.render_markdown(), file);
  }
  return s;
}

std::string speedup_section(const SweepResult& res, const std::string& stamp, std::vector<SweepFile>& files) {
  const std::vector<SpeedupStat> stats = speedup_stats(res.rows);
  if (stats.empty()) return "";
  std::string s = "## SlideDP's speedup over each baseline\n\n";
  s += "Throughput of SlideDP / throughput of the baseline at the same tokens per step; geometric mean over "
       "the points of a group where both fit. A baseline that cannot fit a point is counted, not "
       "averaged.\n\n";
  Table t({"hardware", "model", "seq", "ranks", "baseline", "geomean", "min", "max", "points",
           "baseline cannot fit"},
          {"", "", "", "", "", "x", "x", "x", "", ""});
  // One bar plot per machine: groups are the models (with the sequence length and ranks when a machine
  // has several), bars the baselines; a bar is the geometric mean over that group's points.
  std::map<std::string, BarPlot> plots;
  std::vector<std::string> plot_order;
  std::map<std::string, std::map<std::string, std::size_t>> group_index, bar_index;
  std::map<std::string, std::set<std::pair<int64_t, int>>> shapes;  // per machine: (seq, ranks) seen
  for (const SpeedupStat& st : stats) shapes[st.hardware].insert({st.seq_len, st.ranks});
  auto group_of = [&](const SpeedupStat& st) {
    return shapes[st.hardware].size() > 1
               ? fmt::format("{} {} x{}", st.model, format_tokens(st.seq_len), st.ranks)
               : st.model;
  };
  for (const SpeedupStat& st : stats) {
    t.add_row({st.hardware, st.model, format_tokens(st.seq_len), fmt::format("{}", st.ranks), st.baseline,
               st.points ? fmt::format("{:.2f}", st.geomean) : "-",
               st.points ? fmt::format("{:.2f}", st.min) : "-",
               st.points ? fmt::format("{:.2f}", st.max) : "-", fmt::format("{}", st.points),
               fmt::format("{}", st.baseline_infeasible)});
    if (!plots.count(st.hardware)) {
      plot_order.push_back(st.hardware);
      BarPlot& p = plots[st.hardware];
      p.title = fmt::format("SlideDP speedup over each baseline: {}", st.hardware);
      p.caption = stamp;
      p.y_label = "SlideDP / baseline throughput (geomean)";
      p.reference_line = 1.0;
    }
    BarPlot& p = plots[st.hardware];
    const std::string group = group_of(st);
    if (!group_index[st.hardware].count(group)) {
      group_index[st.hardware][group] = p.groups.size();
      p.groups.push_back(group);
    }
    if (!bar_index[st.hardware].count(st.baseline)) {
      bar_index[st.hardware][st.baseline] = p.bars.size();
      p.bars.push_back(st.baseline);
    }
  }
  for (auto& [h, p] : plots)
    p.values.assign(p.bars.size(), std::vector<double>(p.groups.size(), std::nan("")));
  for (const SpeedupStat& st : stats)
    if (st.points > 0)
      plots[st.hardware].values[bar_index[st.hardware][st.baseline]][group_index[st.hardware][group_of(st)]] =
          st.geomean;
  std::vector<std::string> plot_files;
  for (const std::string& h : plot_order) {
    plot_files.push_back(fmt::format("speedups__{}.svg", file_name_slug(h)));
    files.push_back({plot_files.back(), svg_bars(plots[h])});
  }
  s += t.render_markdown() + "\n";

  // Totals per hardware and over the whole sweep.
  std::set<std::string> hardware;
  for (const SweepRow& r : res.rows) hardware.insert(r.hardware);
  Table tot({"scope", "baseline", "geomean", "min", "max", "points", "baseline cannot fit"},
            {"", "", "x", "x", "x", "", ""});
  std::vector<std::string> scopes(hardware.begin(), hardware.end());
  if (scopes.size() > 1) scopes.push_back("");
  for (const std::string& h : scopes)
    for (const SpeedupStat& st : speedup_totals(res.rows, h, ""))
      tot.add_row(
          {h.empty() ? "all points" : h, st.baseline, st.points ? fmt::format("{:.2f}", st.geomean) : "-",
           st.points ? fmt::format("{:.2f}", st.min) : "-", st.points ? fmt::format("{:.2f}", st.max) : "-",
           fmt::format("{}", st.points), fmt::format("{}", st.baseline_infeasible)});
  s += "Totals (geometric mean over every matched point in scope):\n\n" + tot.render_markdown() + "\n";
  for (const std::string& f : plot_files) s += fmt::format("![speedups]({})\n\n", f);
  return s;
}

std::string bottleneck_section(const SweepResult& res, const std::string& stamp,
                               std::vector<SweepFile>& files) {
  std::string s = "## Which resource binds SlideDP, and the route the planner picks\n\n";
  s += "For SlideDP's chosen plan at each point: the busiest resource (and the next one), the step time not "
       "covered by GPU compute, and the plan. `vs first` compares with the first machine of the grid at the "
       "same model, sequence, ranks setting and batch.\n\n";
  for (std::size_t gi = 0; gi < res.spec.grids.size(); ++gi) {
    const SweepGrid& grid = res.spec.grids[gi];
    std::vector<const SweepRow*> rows;
    for (const SweepRow& r : res.rows)
      if (r.point.grid == static_cast<int>(gi) && r.point.system == System::kSlideDP) rows.push_back(&r);
    if (rows.empty()) continue;
    // The first machine's throughput per (model, seq, ranks slot, batch).
    auto slot = [&](const SweepRow& r) {
      return std::make_tuple(r.point.model, r.point.seq_len, grid.ranks.empty() ? 0 : r.point.ranks,
                             r.point.batch_value);
    };
    std::map<std::tuple<int, int64_t, int, int64_t>, double> first;
    for (const SweepRow* r : rows)
      if (r->point.hardware == 0 && r->feasible) first[slot(*r)] = r->tokens_per_s();
    Table t({"hardware", "ranks", "model", "seq", "tokens/step", "tokens/s", "vs first", "bottleneck", "next",
             "exposed", "routes", "plan"},
            {"", "", "", "", "", "", "", "", "", "%", "", ""});
    GridPlot plot;
    plot.title = fmt::format("Binding resource of SlideDP's plan ({})", grid.name);
    plot.caption = stamp;
    plot.x_label = "model, sequence, tokens per step";
    plot.y_label = "machine";
    // Rows: machines (with the rank count when the grid sweeps it); columns: model, sequence, batch.
    std::map<std::string, std::size_t> col_index;
    std::map<std::pair<int, int>, std::size_t> row_index;
    auto column = [&](const SweepRow& r) {
      return fmt::format("{} {}{}", r.model,
                         grid.seq_lens.size() > 1 ? format_tokens(r.point.seq_len) + " " : "",
                         format_tokens(r.point.tokens_per_step));
    };
    auto row_key = [](const SweepRow& r) { return std::make_pair(r.point.hardware, r.point.ranks); };
    for (const SweepRow* r : rows) {
      if (!col_index.count(column(*r))) {
        col_index[column(*r)] = plot.columns.size();
        plot.columns.push_back(column(*r));
      }
      if (!row_index.count(row_key(*r))) {
        row_index[row_key(*r)] = plot.rows.size();
        plot.rows.push_back(grid.ranks.size() > 1 ? fmt::format("{} x{}", r->hardware, r->point.ranks)
                                                  : r->hardware);
      }
    }
    plot.cells.assign(plot.rows.size(), std::vector<std::string>(plot.columns.size()));
    for (const SweepRow* r : rows) {
      const std::string col = column(*r);
      if (!r->feasible) {
        t.add_row({r->hardware, fmt::format("{}", r->point.ranks), r->model, format_tokens(r->point.seq_len),
                   format_tokens(r->point.tokens_per_step), "-", "", "does not fit", "", "", "",
                   md(shorten(r->infeasible_reason, 160))});
        plot.cells[row_index[row_key(*r)]][col_index[col]] = "does not fit";
        continue;
      }
      const Prediction& p = r->scored();
      auto f = first.find(slot(*r));
      const std::string vs = f == first.end() ? "" : fmt::format("{:.2f}x", r->tokens_per_s() / f->second);
      t.add_row(
          {r->hardware, fmt::format("{}", r->point.ranks), r->model, format_tokens(r->point.seq_len),
           format_tokens(r->point.tokens_per_step), tok_s(r->tokens_per_s()), vs,
           fmt::format("{} {:.0f}%", p.bottleneck, 100 * p.bottleneck_utilization), next_busiest(p),
           fmt::format("{:.1f}", 100 * p.exposed_s / p.step_time_s),
           fmt::format("{}/{}", param_route_name(r->plan.param_route), grad_route_name(r->plan.grad_route)),
           md(r->plan_summary)});
      plot.cells[row_index[row_key(*r)]][col_index[col]] = p.bottleneck;
    }
    const std::string file = fmt::format("bottlenecks__{}.svg", file_name_slug(grid.name));
    files.push_back({file, svg_grid(plot)});
    s += fmt::format("### {}\n\n{}\n![bottlenecks]({})\n\n", grid.name, t.render_markdown(), file);
  }
  return s;
}

std::string compute_bound_section(const SweepResult& res) {
  std::string s = "## Where streaming hides behind compute\n\n";
  s += "For SlideDP's chosen plans, per machine, model and sequence length: the smallest swept tokens per step "
       "from which every larger swept point is bound by GPU compute, and what binds just below it (with the "
       "share of the step not covered by GPU compute there). `never` means the largest swept point is still "
       "bound elsewhere.\n\n";
  Table t({"grid", "hardware", "ranks", "model", "seq", "compute-bound from", "tokens/s there", "below it",
           "binds below", "exposed below", "smallest point", "its tokens/s", "binds there"},
          {"", "", "", "", "", "tokens/step", "", "tokens/step", "", "%", "tokens/step", "", ""});
  for (const ComputeBound& c : compute_bound_thresholds(res.rows))
    t.add_row({c.grid, c.hardware, fmt::format("{}", c.ranks), c.model, format_tokens(c.seq_len),
               c.from_tokens > 0 ? format_tokens(c.from_tokens) : "never",
               c.from_tokens > 0 ? tok_s(c.tokens_per_s_from) : "-",
               c.below_tokens > 0 ? format_tokens(c.below_tokens) : "-", c.below_binding,
               c.below_tokens > 0 ? fmt::format("{:.1f}", 100 * c.below_exposed_share) : "-",
               format_tokens(c.smallest_tokens), tok_s(c.smallest_tokens_per_s), c.smallest_binding});
  return s + t.render_markdown() + "\n";
}

// For grids that deliver only routed experts: how many experts a micro-batch hits, the expectation the
// step work uses (from the router's marginals) beside a direct sampling of the same router.
std::string expert_hits_section(const SweepResult& res) {
  std::set<std::tuple<int64_t, int64_t, double>> routers;
  for (const SweepGrid& g : res.spec.grids)
    if (g.expert_aware_delivery)
      for (const ModelCard& m : g.models)
        if (m.moe()) routers.insert({m.num_experts, m.num_experts_per_tok, g.router_skew});
  if (routers.empty()) return "";
  std::string s = "## Experts a micro-batch routes to\n\n";
  s += "Expert-aware delivery moves only the experts some token of the rank's micro-batch is routed to. The "
       "router is modelled by its experts' popularity (a Zipf law of the given skew; 0 = uniform), each token "
       "choosing its experts independently (model/expert_routing.h). `expected` is what the step work uses, "
       "1 - (1 - pi_e)^N averaged over experts with the marginals pi_e (exact k/E when uniform, else sampled "
       "from 200k tokens); `sampled` is the mean over 200 draws of N tokens of the fraction actually hit.\n\n";
  Table t({"experts", "top-k", "skew", "tokens per micro-batch", "expected hit", "sampled hit"}, {"", "", "", "", "%", "%"});
  for (const auto& [e, k, skew] : routers) {
    const RouterModel r{e, k, skew};
    const std::vector<double>& pi = router_marginals(r);
    for (int64_t n : {1, 4, 16, 64, 256, 1024, 4096, 16384})
      t.add_row({fmt::format("{}", e), fmt::format("{}", k), fmt::format("{:g}", skew), format_tokens(n),
                 fmt::format("{:.2f}", 100 * expected_hit_fraction(pi, static_cast<double>(n))),
                 fmt::format("{:.2f}", 100 * sampled_hit_fraction(r, n, 200, 0xface + static_cast<uint64_t>(n)))});
  }
  return s + t.render_markdown() + "\n";
}

std::string longest_section(const SweepResult& res, const std::string& stamp, std::vector<SweepFile>& files) {
  const std::vector<LongestFit> fits = longest_fits(res.rows);
  std::string s = "## Longest sequence each system fits\n\n";
  s += "Over the swept sequence lengths: the longest that fits the GPU and host budgets, the throughput "
       "there, and why the next length does not fit.\n\n";
  Table t({"hardware", "model", "ranks", "batch", "system", "longest", "tokens/s there", "plan",
           "next length", "why not"},
          {"", "", "", "", "", "tokens", "", "", "tokens", ""});
  for (const LongestFit& f : fits)
    t.add_row({f.hardware, f.model, fmt::format("{}", f.ranks), fmt::format("{}", f.batch_value), f.system,
               f.longest_seq ? format_tokens(f.longest_seq) : "none",
               f.longest_seq ? tok_s(f.tokens_per_s) : "-", md(f.plan),
               f.first_failing_seq ? format_tokens(f.first_failing_seq) : "", md(shorten(f.why, 240))});
  s += t.render_markdown() + "\n";
  // One plot per (hardware, model): tokens/s against sequence length, per system.
  std::map<std::pair<std::string, std::string>, std::map<std::string, PlotSeries>> plots;
  std::vector<std::pair<std::string, std::string>> order;
  for (const SweepRow& r : res.rows) {
    const auto key = std::make_pair(r.hardware, r.model);
    if (!plots.count(key)) order.push_back(key);
    PlotSeries& se = plots[key][r.system];
    se.name = r.system;
    if (!r.feasible) continue;
    se.x.push_back(static_cast<double>(r.point.seq_len));
    se.y.push_back(r.tokens_per_s());
    se.labels.push_back(r.plan_summary);
  }
  for (const auto& key : order) {
    LinePlot plot;
    plot.title = fmt::format("Throughput against sequence length: {} · {}", key.first, key.second);
    plot.caption = stamp;
    plot.x = {"sequence length (tokens)", true};
    plot.y = {"tokens/s", true};
    for (System sys : systems_of(res))
      if (plots[key].count(system_name(sys)) && !plots[key][system_name(sys)].x.empty())
        plot.series.push_back(plots[key][system_name(sys)]);
    const std::string file = fmt::format("seq_len__{}__{}.svg", file_name_slug(key.first), file_name_slug(key.second));
    files.push_back({file, svg_lines(plot)});
    s += fmt::format("![throughput against sequence length]({})\n\n", file);
  }
  return s;
}

std::string scaling_section(const SweepResult& res, const std::string& stamp, std::vector<SweepFile>& files) {
  const std::vector<ScalingPoint> pts = scaling_points(res);
  if (pts.empty()) return "";
  std::string s = "## Scaling with the number of GPUs\n\n";
  s += "Weak scaling: sequences per rank fixed, so the step grows with the ranks; strong scaling: tokens per "
       "step fixed. Speedup and efficiency are relative to the smallest GPU count swept (efficiency = "
       "speedup x base GPUs / GPUs).\n\n";
  const bool nodes = std::any_of(pts.begin(), pts.end(), [](const ScalingPoint& p) { return p.nodes > 1; });
  if (nodes)
    s += "Across nodes, GPUs = nodes x ranks; host RAM is per node (the chosen plan's host state: replicated, "
         "or sharded 1/nodes of the fp32 master and moments per node).\n\n";
  Table t({"hardware", "model", "seq", "kind", "batch", "system", "nodes", "GPUs", "host state", "host RAM/node",
           "tokens/s", "speedup", "efficiency", "bottleneck"},
          {"", "", "", "", "", "", "", "", "", "GiB", "", "x", "%", ""});
  // One plot per (machine, weak/strong, sequence length, batch), a line per (system, model): few
  // enough lines for the plot's palette and legend.
  using PlotKey = std::tuple<std::string, bool, int64_t, int64_t>;
  std::map<PlotKey, std::map<std::string, PlotSeries>> plots;
  std::vector<PlotKey> order;
  auto batch_text = [](const ScalingPoint& p) {
    return p.weak ? fmt::format("{} seq/rank", p.batch_value) : format_tokens(p.batch_value) + " tok/step";
  };
  for (const ScalingPoint& p : pts) {
    t.add_row({p.hardware, p.model, format_tokens(p.seq_len), p.weak ? "weak" : "strong", batch_text(p),
               p.system, fmt::format("{}", p.nodes), fmt::format("{}", p.ranks), p.host_state.empty() ? "-" : p.host_state,
               p.host_gib > 0 ? fmt::format("{:.0f}", p.host_gib) : "-", p.tokens_per_s > 0 ? tok_s(p.tokens_per_s) : "-",
               p.speedup > 0 ? fmt::format("{:.2f}", p.speedup) : "-",
               p.efficiency > 0 ? fmt::format("{:.1f}", 100 * p.efficiency) : "-", p.bottleneck});
    const PlotKey key{p.hardware, p.weak, p.seq_len, p.batch_value};
    if (!plots.count(key)) order.push_back(key);
    const std::string name = fmt::format("{} {}", p.system, p.model);
    PlotSeries& se = plots[key][name];
    se.name = name;
    if (p.efficiency > 0) {
      se.x.push_back(p.ranks);
      se.y.push_back(100 * p.efficiency);
    }
  }
  s += t.render_markdown() + "\n";
  for (const PlotKey& key : order) {
    const auto& [hardware, weak, seq, batch] = key;
    LinePlot plot;
    const std::string batch_label =
        weak ? fmt::format("{} seq/rank", batch) : format_tokens(batch) + " tok/step";
    plot.title = fmt::format("{} scaling: {} · seq {} · {}", weak ? "Weak" : "Strong", hardware,
                             format_tokens(seq), batch_label);
    plot.caption = stamp;
    plot.x = {"GPUs (nodes x ranks)", true};
    plot.y = {"efficiency (%)", false};
    for (auto& [name, se] : plots[key])
      if (!se.x.empty()) plot.series.push_back(se);
    const std::string file =
        fmt::format("scaling__{}__{}__seq{}__{}.svg", file_name_slug(hardware), weak ? "weak" : "strong", seq,
                    weak ? fmt::format("{}seq", batch) : format_tokens(batch));
    files.push_back({file, svg_lines(plot)});
    s += fmt::format("![scaling]({})\n\n", file);
  }
  return s;
}

// When the sweep re-scored with the simulator: how far the two views are apart per system, and the
// speedup totals by each, so a conclusion that depends on which view is used is visible.
std::string simulator_section(const SweepResult& res) {
  if (!res.simulated) return "";
  std::string s = "## Simulator cross-check\n\n";
  s += "Every chosen plan was scored by both views of the step model. Step time of the simulator / the "
       "analytical model, per system (plans were chosen by the analytical model):\n\n";
  Table t({"system", "points", "median", "min", "max"}, {"", "", "sim/model", "sim/model", "sim/model"});
  for (System sys : systems_of(res)) {
    std::vector<double> r;
    for (const SweepRow& row : res.rows)
      if (row.point.system == sys && row.feasible && row.simulated && row.predicted.step_time_s > 0)
        r.push_back(row.simulated->step_time_s / row.predicted.step_time_s);
    if (r.empty()) continue;
    std::sort(r.begin(), r.end());
    t.add_row({system_name(sys), fmt::format("{}", r.size()), fmt::format("{:.3f}", r[r.size() / 2]),
               fmt::format("{:.3f}", r.front()), fmt::format("{:.3f}", r.back())});
  }
  s += t.render_markdown() + "\n";
  const auto too_large = std::count_if(res.rows.begin(), res.rows.end(), [](const SweepRow& r) { return r.too_large_to_simulate; });
  if (too_large > 0)
    s += fmt::format("{} points were not simulated: the simulator cannot hold their steps (SimulatorOptions::max_tasks); "
                     "they are scored by the analytical model alone.\n\n",
                     too_large);
  const std::vector<SpeedupStat> sim = speedup_totals(res.rows, "", ""),
                                 ana = speedup_totals(res.rows, "", "", Figure::kAnalytical);
  Table sp({"baseline", "geomean by the simulator", "geomean by the analytical model", "points"},
           {"", "x", "x", ""});
  for (std::size_t i = 0; i < sim.size() && i < ana.size(); ++i)
    sp.add_row({sim[i].baseline, sim[i].points ? fmt::format("{:.2f}", sim[i].geomean) : "-",
                ana[i].points ? fmt::format("{:.2f}", ana[i].geomean) : "-",
                fmt::format("{}", sim[i].points)});
  s += "SlideDP's speedup over each baseline, all points, by each view:\n\n" + sp.render_markdown() + "\n";
  return s;
}

std::string infeasible_section(const SweepResult& res) {
  std::vector<const SweepRow*> bad;
  for (const SweepRow& r : res.rows)
    if (!r.feasible) bad.push_back(&r);
  if (bad.empty()) return "";
  std::string s = fmt::format("## Points that do not fit ({})\n\n", bad.size());
  Table t({"hardware", "model", "seq", "ranks", "tokens/step", "system", "why"},
          {"", "", "", "", "", "", ""});
  for (const SweepRow* r : bad)
    t.add_row({r->hardware, r->model, format_tokens(r->point.seq_len), fmt::format("{}", r->point.ranks),
               format_tokens(r->point.tokens_per_step), r->system, md(shorten(r->infeasible_reason, 300))});
  return s + t.render_markdown() + "\n";
}

std::string machines_section(const SweepResult& res) {
  std::string s = "## Machines\n\n";
  Table t({"grid", "label", "from", "GPUs", "overrides"}, {"", "", "", "", ""});
  for (const SweepGrid& g : res.spec.grids)
    for (const HardwareVariant& hv : g.hardware)
      t.add_row({g.name, hv.label, hv.base, fmt::format("{}x {}", hv.hw.gpu.count, hv.hw.gpu.model),
                 md(hv.overrides.empty() ? "-" : fmt::format("{}", fmt::join(hv.overrides, ", ")))});
  return s + t.render_markdown() + "\n";
}

}  // namespace

std::string sweep_stamp(const SweepResult& res, const std::string& command) {
  const Provenance& pv = provenance();
  return fmt::format("{} | spec {} (fnv1a {}) | git {} | {} | {}", command,
                     res.spec.file.empty() ? res.spec.name : res.spec.file, hash_hex(res.spec.text_hash),
                     pv.git_revision, pv.cpu_model, utc_timestamp());
}

std::string sweep_plot_stamp(const SweepResult& res, const std::string& command) {
  return fmt::format("{} | spec fnv1a {} | git {} | {}", command, hash_hex(res.spec.text_hash),
                     provenance().git_revision, utc_timestamp().substr(0, 10));
}

std::vector<std::string> sweep_csv_columns() {
  return {"grid",
          "hardware",
          "hardware_base",
          "overrides",
          "model",
          "params_b",
          "seq_len",
          "nodes",
          "ranks",
          "batch_value",
          "tokens_per_step",
          "system",
          "feasible",
          "step_time_s",
          "tokens_per_s",
          "tflops_per_gpu",
          "bottleneck",
          "bottleneck_util",
          "exposed_s",
          "compute_s",
          "stall_s",
          "exposed_tail_s",
          "exposed_head_s",
          "post_update_s",
          "sync_s",
          "gpu_peak_gib",
          "gpu_budget_gib",
          "host_gib",
          "micro_batch",
          "accum_steps",
          "param_route",
          "grad_route",
          "host_state",
          "optimizer_states",
          "clip",
          "chunk_numel",
          "offload_layers",
          "recompute_layers",
          "keep_layers",
          "buffer_depth",
          "update_threads",
          "plan",
          "sim_step_time_s",
          "sim_tokens_per_s",
          "sim_bottleneck",
          "candidates",
          "infeasible_reason",
          "eval_s"};
}

std::vector<std::string> sweep_csv_cells(const SweepRow& r) {
  std::vector<std::string> c = {r.grid,
                                r.hardware,
                                r.hardware_base,
                                r.overrides,
                                r.model,
                                fmt::format("{:.3f}", r.params / 1e9),
                                fmt::format("{}", r.point.seq_len),
                                fmt::format("{}", r.point.nodes),
                                fmt::format("{}", r.point.ranks),
                                fmt::format("{}", r.point.batch_value),
                                fmt::format("{}", r.point.tokens_per_step),
                                r.system,
                                r.feasible ? "1" : "0"};
  if (r.feasible) {
    const Prediction& p = r.predicted;
    const Breakdown& b = p.breakdown;
    const Plan::PolicyCounts pc = r.plan.policy_counts(r.num_layers);
    c.insert(c.end(), {g6(p.step_time_s),
                       fmt::format("{:.1f}", p.tokens_per_s),
                       fmt::format("{:.2f}", p.tflops_per_gpu),
                       p.bottleneck,
                       fmt::format("{:.4f}", p.bottleneck_utilization),
                       g6(p.exposed_s),
                       g6(b.compute_s),
                       g6(b.stall_s),
                       g6(b.exposed_tail_s),
                       g6(b.exposed_head_s),
                       g6(b.post_update_s),
                       g6(b.sync_s),
                       fmt::format("{:.3f}", p.memory.gpu_peak_bytes / kGiB),
                       fmt::format("{:.3f}", p.memory.gpu_budget_bytes / kGiB),
                       fmt::format("{:.1f}", p.memory.host_bytes / kGiB),
                       fmt::format("{}", r.plan.micro_batch),
                       fmt::format("{}", r.plan.accum_steps),
                       param_route_name(r.plan.param_route),
                       grad_route_name(r.plan.grad_route),
                       host_state_name(r.plan.host_state),
                       optimizer_states_name(r.plan.optimizer_states),
                       r.plan.verify_updates ? "1" : "0",
                       fmt::format("{}", r.plan.chunk_numel),
                       fmt::format("{}", pc.offload),
                       fmt::format("{}", pc.recompute),
                       fmt::format("{}", pc.keep),
                       fmt::format("{}", r.plan.gpu_buffer_depth),
                       fmt::format("{}", r.plan.update_threads),
                       r.plan_summary});
    if (r.simulated)
      c.insert(c.end(), {g6(r.simulated->step_time_s), fmt::format("{:.1f}", r.simulated->tokens_per_s),
                         r.simulated->bottleneck});
    else
      c.insert(c.end(), {"", "", ""});
  } else {
    c.insert(c.end(), sweep_csv_columns().size() - c.size() - 3, "");
  }
  c.push_back(fmt::format("{}", r.candidates));
  c.push_back(r.infeasible_reason);
  c.push_back(fmt::format("{:.4f}", r.eval_s));
  return c;
}

std::string sweep_csv(const SweepResult& res, const std::string& stamp) {
  std::string csv = "# " + stamp + "\n";
  csv += fmt::format("{}\n", fmt::join(sweep_csv_columns(), ","));
  for (const SweepRow& r : res.rows) {
    std::vector<std::string> cells = sweep_csv_cells(r);
    for (std::string& c : cells) c = csv_field(c);
    csv += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return csv;
}

std::vector<SweepFile> render_sweep_report(const SweepResult& res, const std::string& command) {
  const std::string stamp = sweep_plot_stamp(res, command);
  const Provenance& pv = provenance();
  std::vector<SweepFile> files;
  files.push_back({"points.csv", sweep_csv(res, sweep_stamp(res, command))});
  int feasible = 0;
  for (const SweepRow& r : res.rows) feasible += r.feasible ? 1 : 0;

  std::string readme = fmt::format("# Sweep: {}\n\n", res.spec.name);
  std::string description = res.spec.description;
  while (!description.empty() && std::isspace(static_cast<unsigned char>(description.back())))
    description.pop_back();
  if (!description.empty()) readme += description + "\n\n";
  readme += fmt::format("Produced by `{}` from `{}` (spec fnv1a {}), git {}, {} ({} cores), {}.  \n", command,
                        res.spec.file.empty() ? res.spec.name : res.spec.file, hash_hex(res.spec.text_hash),
                        pv.git_revision, pv.cpu_model, pv.cpu_count, utc_timestamp());
  readme +=
      fmt::format("{} points ({} fit) in {} ({} per point on one core), scored by the {}.\n\n",
                  res.rows.size(), feasible, format_seconds(res.wall_s),
                  format_seconds(res.rows.empty() ? 0 : res.wall_s / static_cast<double>(res.rows.size())),
                  res.simulated ? "analytical model, then re-scored by the discrete-event simulator"
                                : "analytical step model");
  readme += claims_section(res);
  readme += method_section(res);
  readme += machines_section(res);
  if (wants(res.spec, kAnalysisThroughput)) readme += throughput_section(res, stamp, files);
  if (wants(res.spec, kAnalysisSpeedups)) readme += speedup_section(res, stamp, files);
  if (wants(res.spec, kAnalysisBottlenecks)) readme += bottleneck_section(res, stamp, files);
  if (wants(res.spec, kAnalysisLongestSequence)) readme += longest_section(res, stamp, files);
  if (wants(res.spec, kAnalysisScaling)) readme += scaling_section(res, stamp, files);
  if (wants(res.spec, kAnalysisComputeBound)) readme += compute_bound_section(res);
  readme += expert_hits_section(res);
  readme += simulator_section(res);
  readme += infeasible_section(res);
  readme +=
      "## Files\n\n`points.csv`: every point (system, chosen plan, step time and its breakdown, bottleneck, "
      "memory, why a point does not fit), one row each";
  for (const SweepFile& f : files)
    if (f.name != "points.csv") readme += ", `" + f.name + "`";
  readme += ".\n\n## Spec\n\n```yaml\n" + res.spec.text +
            (res.spec.text.empty() || res.spec.text.back() == '\n' ? "" : "\n") + "```\n";
  files.insert(files.begin(), {"README.md", readme});
  return files;
}

std::vector<std::string> write_sweep_report(const SweepResult& res, const std::string& dir,
                                            const std::string& command) {
  namespace fs = std::filesystem;
  check_output_folder_target({"--out", dir});
  const std::vector<SweepFile> files = render_sweep_report(res, command);
  std::vector<std::string> names;
  for (const SweepFile& f : files) names.push_back(f.name);
  fs::path target = fs::path(dir);
  if (!target.has_filename()) target = target.parent_path();
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    // An existing folder keeps everything that is not this report's (notes, other runs' files,
    // sub-folders): each of the report's files is replaced atomically, README.md last, so a kill
    // leaves the old README beside some new files, never a README naming files that are not there.
    for (const SweepFile& f : files)
      if (f.name != "README.md") write_file_atomic((target / f.name).string(), f.content);
    for (const SweepFile& f : files)
      if (f.name == "README.md") write_file_atomic((target / f.name).string(), f.content);
    return names;
  }
  // A new folder is written whole beside its place and published in one step: a full disk or a kill
  // leaves nothing, never a README without its points.
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent, ec);
  if (ec) throw IoError(parent.string(), "cannot create folder: " + ec.message());
  remove_stale_temp_dirs(parent.string(), target.filename().string());
  const std::string tmp = make_temp_dir_beside(target.string());
  try {
    for (const SweepFile& f : files) write_file_atomic((fs::path(tmp) / f.name).string(), f.content);
    publish_dir(tmp, target.string(), /*replace=*/false);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return names;
}

nlohmann::json sweep_summary_json(const SweepResult& res, const std::vector<std::string>& files,
                                  const std::string& dir) {
  nlohmann::json j;
  j["spec"] = res.spec.name;
  j["spec_file"] = res.spec.file;
  j["spec_fnv1a"] = hash_hex(res.spec.text_hash);
  j["git_revision"] = provenance().git_revision;
  j["points"] = res.rows.size();
  int feasible = 0;
  for (const SweepRow& r : res.rows) feasible += r.feasible ? 1 : 0;
  j["feasible_points"] = feasible;
  j["wall_s"] = res.wall_s;
  j["method"] = res.simulated ? "simulator" : "analytical";
  nlohmann::json claims = nlohmann::json::array();
  for (const ClaimResult& c : evaluate_claims(res))
    claims.push_back({{"claim", c.claim.claim},
                      {"paper", c.claim.paper},
                      {"metric", c.claim.metric},
                      {"model", c.model},
                      {"low", c.low},
                      {"high", c.high}});
  j["claims"] = claims;
  nlohmann::json sp = nlohmann::json::array();
  for (const SpeedupStat& s : speedup_totals(res.rows, "", ""))
    sp.push_back({{"baseline", s.baseline},
                  {"geomean", s.geomean},
                  {"min", s.min},
                  {"max", s.max},
                  {"points", s.points},
                  {"baseline_infeasible", s.baseline_infeasible}});
  j["speedups"] = sp;
  j["out"] = dir;
  j["files"] = files;
  return j;
}

void refuse_foreign_report_folder(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::is_empty(dir, ec)) return;
  const fs::path readme = fs::path(dir) / "README.md";
  if (fs::is_regular_file(readme, ec) && read_text_file(readme.string()).substr(0, 4096).find("slidedp-sweep") != std::string::npos)
    return;
  throw InputError(flag, fmt::format("'{}' holds files that are not a slidedp-sweep report; the report would replace "
                                     "its README.md and points.csv: give a new or empty folder",
                                     dir));
}

std::string file_name_slug(const std::string& s) {
  std::string o;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '.' || c == '-')
      o += static_cast<char>(std::tolower(u));
    else if (!o.empty() && o.back() != '-')
      o += '-';
  }
  while (!o.empty() && o.back() == '-') o.pop_back();
  return o;
}

}  // namespace slidedp
