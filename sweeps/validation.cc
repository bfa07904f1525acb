// The validation corpus and its report; see validation.h.
#include "sweeps/validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/file_util.h"
#include "common/median.h"
#include "common/provenance.h"
#include "common/table.h"
#include "common/units.h"
#include "common/yaml_reader.h"
#include "model/step_model.h"
#include "model/workload.h"
#include "sweeps/svg_plot.h"
#include "sweeps/sweep_report.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kUnits = {"tokens_per_s", "tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu"};

MeasuredFigure read_measured(const YamlReader& m) {
  MeasuredFigure f;
  for (const std::string& u : kUnits) {
    if (!m.has(u)) continue;
    if (!f.unit.empty())
      throw InputError(m.where(u), fmt::format("give one figure; {} is given too", f.unit));
    f.unit = u;
    f.value = m.number(u, 1e-9, 1e12, u);
  }
  if (f.unit.empty())
    throw InputError(m.where(), fmt::format("missing the measured figure (one of: {})", fmt::join(kUnits, ", ")));
  if (f.unit == "tflops_per_gpu")
    f.flop_formula = m.text("flop_formula", {"megatron", "6n"});
  else if (m.has("flop_formula"))
    throw InputError(m.where("flop_formula"), "only with tflops_per_gpu");
  m.done();
  return f;
}

ValidationPoint read_point_fields(const YamlReader& r, const std::string& spec_dir, const std::set<std::string>& machines,
                                  ValidationPoint p);

// Errors name the entry by its id as well as its place in the file.
ValidationPoint read_point(const YamlReader& r, const std::string& spec_dir, const std::set<std::string>& machines) {
  ValidationPoint p;
  p.id = r.text("id");
  try {
    return read_point_fields(r, spec_dir, machines, std::move(p));
  } catch (const InputError& e) {
    throw InputError("", fmt::format("{} (point {})", e.what(), r.has("id") ? r.text("id") : "?"));
  }
}

ValidationPoint read_point_fields(const YamlReader& r, const std::string& spec_dir, const std::set<std::string>& machines,
                                  ValidationPoint p) {
  p.where = r.where();
  p.source = r.text("source");
  if (p.source.empty()) throw InputError(r.where("source"), "every point names its source");
  p.reading = r.text("reading", {"exact", "plot", "derived"});
  p.reading_tolerance = r.number_or("reading_tolerance", 0.0, 0.0, 1.0, "fraction");
  p.machine = r.text("machine");
  if (!machines.count(p.machine))
    throw InputError(r.where("machine"), fmt::format("'{}' is not a label of `machines`", p.machine));
  p.system = parse_system(r.text("system"), r.where("system"));
  p.model_ref = r.text("model");
  try {
    p.card = load_model_card(resolve_in_spec_dir(p.model_ref, is_model_preset(p.model_ref), spec_dir));
  } catch (const Error& e) {
    throw InputError(r.where("model"), e.what());
  }
  p.precision = r.text("precision", {"fp16", "bf16"});
  p.seq_len = r.integer("seq_len", 1, int64_t{1} << 24);
  p.ranks = static_cast<int>(r.integer("ranks", 1, 4096));
  p.micro_batch = static_cast<int>(r.integer("micro_batch", 1, 1 << 20));
  p.accum = static_cast<int>(r.integer("accum", 1, 1 << 20));
  p.activation_checkpointing = r.text("activation_checkpointing", {"full", "selective", "none"});
  p.measured = read_measured(r.map("measured"));
  p.assumed = r.text_or("assumed", "");
  p.use = r.text("use", {"core", "supplementary"});
  p.calibration = r.text_or("calibration", "", {"compute", "preset"});
  if (p.calibrates_compute() && p.system != System::kFsdp2)
    throw InputError(r.where("calibration"), "only a GPU-resident run (fsdp2) sets its GPU's compute rate");
  r.done();
  return p;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

ValidationSummary summarize(const std::vector<const ValidationRow*>& rows) {
  ValidationSummary s;
  std::vector<double> abs_err, signed_err;
  for (const ValidationRow* r : rows) {
    ++s.points;
    if (!r->feasible) {
      ++s.infeasible;
      continue;
    }
    ++s.predicted;
    abs_err.push_back(std::fabs(r->error));
    signed_err.push_back(r->error);
    if (std::fabs(r->error) >= s.worst_abs_error) s.worst_abs_error = std::fabs(r->error), s.worst_id = r->point->id;
  }
  s.mean_abs_error = mean(abs_err);
  s.median_abs_error = abs_err.empty() ? 0.0 : median(abs_err);
  s.mean_signed_error = mean(signed_err);
  return s;
}

std::string pct(double x) { return fmt::format("{:+.1f}%", 100 * x); }

}  // namespace

ValidationCorpus validation_corpus_from_yaml(const std::string& text, const std::string& origin) {
  ValidationCorpus c;
  c.file = origin;
  c.text = text;
  c.text_hash = fnv1a(text);
  const std::string spec_dir = origin.empty() ? "" : fs::path(origin).parent_path().string();
  YamlReader r = YamlReader::load_string(text, origin);
  c.name = r.text("name");
  if (c.name.empty() || c.name == "." || c.name == ".." || c.name.find_first_of("/\\ ") != std::string::npos)
    throw InputError(r.where("name"), "expected a non-empty name without spaces or slashes (it names the output folder)");
  c.description = r.text_or("description", "");
  std::set<std::string> labels;
  for (const YamlReader& m : r.map_list("machines"))
    for (HardwareVariant& v : read_hardware_entry(m, spec_dir)) {
      if (!labels.insert(v.label).second)
        throw InputError(m.where("label"), fmt::format("two machines are labelled '{}'", v.label));
      c.machines.push_back(std::move(v));
    }
  std::set<std::string> ids;
  for (const YamlReader& pr : r.map_list("points")) {
    ValidationPoint p = read_point(pr, spec_dir, labels);
    if (!ids.insert(p.id).second) throw InputError(pr.where("id"), fmt::format("two points have the id '{}'", p.id));
    c.points.push_back(std::move(p));
  }
  if (c.points.empty()) throw InputError(r.where("points"), "the corpus has no points");
  r.done();
  return c;
}

ValidationCorpus load_validation_corpus(const std::string& path) {
  return validation_corpus_from_yaml(read_text_file(path), path);
}

double flops_per_token(const ModelCard& card, int64_t seq_len, const std::string& formula) {
  if (formula == "6n") return 6.0 * static_cast<double>(card.total_params());
  SLIDEDP_CHECK(formula == "megatron", "unknown FLOP formula " + formula);
  const double L = static_cast<double>(card.num_layers), h = static_cast<double>(card.hidden_size);
  const double s = static_cast<double>(seq_len), V = static_cast<double>(card.vocab_size);
  return 96.0 * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h));
}

double measured_tokens_per_s(const ValidationPoint& p) {
  const MeasuredFigure& m = p.measured;
  const double tokens_per_step = static_cast<double>(p.ranks) * p.micro_batch * p.accum * static_cast<double>(p.seq_len);
  if (m.unit == "tokens_per_s") return m.value;
  if (m.unit == "tokens_per_s_per_gpu") return m.value * p.ranks;
  if (m.unit == "step_time_s") return tokens_per_step / m.value;
  return m.value * 1e12 * p.ranks / flops_per_token(p.card, p.seq_len, m.flop_formula);
}

Plan validation_plan(const ValidationPoint& p) {
  Plan plan;
  plan.ranks = p.ranks;
  plan.micro_batch = p.micro_batch;
  plan.accum_steps = p.accum;
  plan.offload_layers = 0;
  if (p.activation_checkpointing == "full") {
    plan.recompute_layers = Plan::kRest;
    plan.keep_layers = 0;
  } else {  // selective checkpointing recomputes cheap operations only: charged as keeping the layer
    plan.recompute_layers = 0;
    plan.keep_layers = Plan::kRest;
  }
  return plan;
}

namespace {

// The machine a point runs on, with its GPU's calibrated compute rate.
Hardware calibrated(Hardware hw, const std::map<std::string, double>& scale) {
  const auto it = scale.find(hw.gpu.model);
  if (it == scale.end()) return hw;
  hw.gpu.matmul_efficiency = std::min(1.0, hw.gpu.matmul_efficiency * it->second);
  hw.gpu.attention_efficiency = std::min(1.0, hw.gpu.attention_efficiency * it->second);
  return hw;
}

ValidationRow predict_point(const ValidationPoint& p, const Hardware& hw) {
  ValidationRow row;
  row.point = &p;
  row.measured_tokens_per_s = measured_tokens_per_s(p);
  const double tokens_per_step = static_cast<double>(p.ranks) * p.micro_batch * p.accum * static_cast<double>(p.seq_len);
  row.measured_step_s = tokens_per_step / row.measured_tokens_per_s;
  try {
    const Prediction pr = predict_analytical(make_workload(p.card, p.seq_len), hw, validation_plan(p), p.system);
    row.feasible = pr.feasible;
    if (!pr.feasible) row.infeasible_reason = pr.infeasible_reasons.empty() ? "infeasible" : pr.infeasible_reasons.front();
    row.predicted_step_s = pr.step_time_s;
    row.predicted_tokens_per_s = pr.tokens_per_s;
    row.bottleneck = pr.bottleneck;
  } catch (const InputError& e) {
    throw InputError(p.where, fmt::format("point {} cannot be predicted: {}", p.id, e.what()));
  }
  if (row.feasible) row.error = row.predicted_tokens_per_s / row.measured_tokens_per_s - 1.0;
  return row;
}

}  // namespace

ValidationResult run_validation(const ValidationCorpus& corpus) {
  ValidationResult res;
  res.corpus = corpus;
  std::map<std::string, const HardwareVariant*> machine;
  for (const HardwareVariant& v : res.corpus.machines) machine[v.label] = &v;

  // Each GPU model's training compute rate from its GPU-resident runs: the presets' efficiencies come
  // from kernel benchmarks, and a training step reaches less of the peak (normalisations, activation
  // functions, small GEMMs, attention's backward, launch gaps). The factor is refined until the
  // calibration runs' mean log error is 0 (their steps are not all compute); every other run of that
  // GPU is then predicted with it.
  std::map<std::string, double> scale;
  std::map<std::string, std::vector<const ValidationPoint*>> calibration_runs;
  for (const ValidationPoint& p : res.corpus.points)
    if (p.calibrates_compute()) calibration_runs[machine.at(p.machine)->hw.gpu.model].push_back(&p);
  for (int iteration = 0; iteration < 8; ++iteration)
    for (const auto& [gpu, points] : calibration_runs) {
      double log_sum = 0;
      for (const ValidationPoint* p : points) {
        const ValidationRow row = predict_point(*p, calibrated(machine.at(p->machine)->hw, scale));
        log_sum += std::log(row.measured_tokens_per_s / row.predicted_tokens_per_s);
      }
      const double s = scale.count(gpu) ? scale.at(gpu) : 1.0;
      scale[gpu] = s * std::exp(log_sum / static_cast<double>(points.size()));
    }
  for (const auto& [gpu, points] : calibration_runs) {
    ComputeCalibration c{gpu, scale.at(gpu), {}};
    for (const ValidationPoint* p : points) c.from.push_back(p->id);
    res.calibrations.push_back(c);
  }
  // A GPU without a GPU-resident run takes the geometric mean of the others' factors: the gap between
  // kernel benchmarks and training is of the same kind on every GPU measured.
  if (!scale.empty()) {
    double log_sum = 0;
    for (const auto& [gpu, s] : scale) log_sum += std::log(s);
    const double mean_scale = std::exp(log_sum / static_cast<double>(scale.size()));
    std::set<std::string> others;
    for (const HardwareVariant& v : res.corpus.machines)
      if (!scale.count(v.hw.gpu.model)) others.insert(v.hw.gpu.model);
    for (const std::string& gpu : others) {
      scale[gpu] = mean_scale;
      res.calibrations.push_back({gpu, mean_scale, {"the others' geometric mean"}});
    }
  }
  for (const ValidationPoint& p : res.corpus.points)
    res.rows.push_back(predict_point(p, calibrated(machine.at(p.machine)->hw, scale)));

  std::vector<const ValidationRow*> all, core, calibration, held_out;
  std::map<std::string, std::vector<const ValidationRow*>> per_system;
  for (const ValidationRow& r : res.rows) {
    all.push_back(&r);
    const bool apart = !r.point->calibration.empty();
    (apart ? calibration : held_out).push_back(&r);
    if (r.point->use == "core" && !apart) core.push_back(&r);
    if (!apart) per_system[system_name(r.point->system)].push_back(&r);
  }
  res.all = summarize(all);
  res.core = summarize(core);
  res.calibration = summarize(calibration);
  res.held_out = summarize(held_out);
  for (const auto& [name, rows] : per_system) res.by_system.emplace_back(name, summarize(rows));

  // Rankings: points of one machine and workload by more than one system.
  std::map<std::string, std::vector<const ValidationRow*>> groups;
  for (const ValidationRow& r : res.rows) {
    const ValidationPoint& p = *r.point;
    groups[fmt::format("{} | {} | seq {} | {} GPUs | {} tokens/step", p.machine, p.card.name, p.seq_len, p.ranks,
                       static_cast<int64_t>(p.ranks) * p.micro_batch * p.accum * p.seq_len)]
        .push_back(&r);
  }
  for (auto& [key, rows] : groups) {
    std::set<System> systems;
    for (const ValidationRow* r : rows) systems.insert(r->point->system);
    if (systems.size() < 2) continue;
    RankingGroup g;
    g.key = key;
    auto name = [](const ValidationRow* r) { return fmt::format("{} ({})", system_name(r->point->system), r->point->id); };
    std::vector<const ValidationRow*> by_measured = rows, by_predicted = rows;
    std::sort(by_measured.begin(), by_measured.end(),
              [](auto* a, auto* b) { return a->measured_tokens_per_s > b->measured_tokens_per_s; });
    std::sort(by_predicted.begin(), by_predicted.end(),
              [](auto* a, auto* b) { return a->predicted_tokens_per_s > b->predicted_tokens_per_s; });
    for (auto* r : by_measured) g.measured_order.push_back(name(r));
    for (auto* r : by_predicted) g.predicted_order.push_back(name(r));
    g.right = g.measured_order == g.predicted_order;
    res.rankings.push_back(g);
  }
  return res;
}

std::vector<std::string> write_validation_report(const ValidationResult& r, const std::string& dir,
                                                 const std::string& command) {
  fs::create_directories(dir);
  const Provenance& pv = provenance();
  const std::string stamp = fmt::format("{} | corpus {} (fnv1a {}) | git {} | {}", command, r.corpus.file,
                                        hash_hex(r.corpus.text_hash), pv.git_revision, utc_timestamp());
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& text) {
    write_file_atomic((fs::path(dir) / name).string(), text);
    written.push_back(name);
  };

  std::string csv = "# " + stamp + "\n";
  csv += "id,use,machine,system,model,precision,seq_len,ranks,micro_batch,accum,activation_checkpointing,measured_unit,"
         "measured_value,measured_tokens_per_s,predicted_tokens_per_s,error,feasible,bottleneck,reading,source\n";
  for (const ValidationRow& row : r.rows) {
    const ValidationPoint& p = *row.point;
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.4f},{},{},{},\"{}\"\n", p.id, p.use,
                       p.machine, system_name(p.system), p.card.name, p.precision, p.seq_len, p.ranks, p.micro_batch,
                       p.accum, p.activation_checkpointing, p.measured.unit, p.measured.value, row.measured_tokens_per_s,
                       row.predicted_tokens_per_s, row.error, row.feasible ? 1 : 0, row.bottleneck, p.reading, p.source);
  }
  write("points.csv", csv);

  ScatterPlot sc;
  sc.title = "Predicted vs measured tokens/s (published runs)";
  sc.caption = stamp;
  sc.x = {"measured tokens/s (job)", true};
  sc.y = {"predicted tokens/s (step model)", true};
  sc.band = 0.15;
  std::map<std::string, PlotSeries> series;
  for (const ValidationRow& row : r.rows) {
    if (!row.feasible) continue;
    PlotSeries& s = series[system_name(row.point->system)];
    s.name = system_name(row.point->system);
    s.x.push_back(row.measured_tokens_per_s);
    s.y.push_back(row.predicted_tokens_per_s);
    s.labels.push_back(fmt::format("{} {} on {}: {}", row.point->id, row.point->card.name, row.point->machine, pct(row.error)));
  }
  for (auto& [name, s] : series) sc.series.push_back(s);
  write("predicted_vs_measured.svg", svg_scatter(sc));

  std::string md = "# The model against published runs\n\n";
  md += "Produced by: `" + command + "`  \n" +
        fmt::format("corpus `{}` (fnv1a {}), git {}, {}\n\n", r.corpus.file, hash_hex(r.corpus.text_hash), pv.git_revision,
                    utc_timestamp());
  if (!r.corpus.description.empty()) md += r.corpus.description + "\n\n";
  auto summary_line = [](const char* what, const ValidationSummary& s) {
    return fmt::format("| {} | {} | {} | {:.1f}% | {:.1f}% | {:.1f}% ({}) | {} |\n", what, s.points, s.infeasible,
                       100 * s.mean_abs_error, 100 * s.median_abs_error, 100 * s.worst_abs_error, s.worst_id,
                       pct(s.mean_signed_error));
  };
  md += "## Error\n\nError = predicted tokens/s / measured - 1 (positive: the model is optimistic). A point the "
        "model calls infeasible did run: it is counted apart, not in the means.\n\n";
  md += "## Each GPU's training compute rate\n\nThe presets' matmul and attention efficiencies come from kernel "
        "benchmarks. The GPU-resident runs marked `calibration` set, per GPU model, the factor on them that a "
        "training step reaches; every other run of that GPU is predicted with it, and the error below is on "
        "those held-out runs. A GPU without a calibration run keeps its preset's figures.\n\n";
  md += "| GPU | factor on the preset's efficiencies | from |\n|---|---|---|\n";
  for (const ComputeCalibration& c : r.calibrations)
    md += fmt::format("| {} | {:.3f} | {} |\n", c.gpu_model, c.scale, fmt::join(c.from, ", "));
  md += "\n| points | n | called infeasible | mean abs | median abs | worst abs | mean signed |\n|---|---|---|---|---|---|---|\n";
  md += summary_line("held out (all but calibration)", r.held_out);
  md += summary_line("held out, core", r.core);
  for (const auto& [name, s] : r.by_system) md += summary_line(("held out, " + name).c_str(), s);
  md += summary_line("calibration runs (compute and preset)", r.calibration);
  md += summary_line("all", r.all);
  md += "\n![predicted vs measured](predicted_vs_measured.svg)\n\n";
  md += "## Rankings of systems on one machine and workload\n\n";
  if (r.rankings.empty()) md += "No machine and workload has measurements of two systems.\n\n";
  for (const RankingGroup& g : r.rankings)
    md += fmt::format("- {}: measured {}; model {} -- {}\n", g.key, fmt::join(g.measured_order, " > "),
                      fmt::join(g.predicted_order, " > "), g.right ? "right" : "WRONG");
  md += "\n## Points\n\n";
  Table t({"id", "use", "machine", "system", "model", "seq", "GPUs x mb x acc", "measured", "predicted", "error",
           "bottleneck"},
          {"", "", "", "", "", "", "", "tokens/s", "tokens/s", "%", ""});
  for (const ValidationRow& row : r.rows) {
    const ValidationPoint& p = *row.point;
    t.add_row({p.id, p.calibration.empty() ? p.use : "calib. " + p.calibration, p.machine, system_name(p.system), p.card.name, std::to_string(p.seq_len),
               fmt::format("{} x {} x {}", p.ranks, p.micro_batch, p.accum), fmt::format("{:.0f}", row.measured_tokens_per_s),
               row.feasible ? fmt::format("{:.0f}", row.predicted_tokens_per_s) : "infeasible",
               row.feasible ? fmt::format("{:+.1f}", 100 * row.error) : "-", row.feasible ? row.bottleneck : row.infeasible_reason});
  }
  md += "```\n" + t.render() + "```\n\n## Sources\n\n";
  for (const ValidationRow& row : r.rows) {
    const ValidationPoint& p = *row.point;
    md += fmt::format("- {}: {} ({} reading{}){}\n", p.id, p.source, p.reading,
                      p.reading_tolerance > 0 ? fmt::format(", +-{:.1f}%", 100 * p.reading_tolerance) : "",
                      p.assumed.empty() ? "" : "; assumed: " + p.assumed);
  }
  write("README.md", md);

  // The figures CI holds the model to (tests/sweeps/validation_test.cc).
  auto summary = [](const ValidationSummary& s) {
    return nlohmann::json{{"points", s.points},           {"predicted", s.predicted},
                          {"called_infeasible", s.infeasible}, {"mean_abs_error", s.mean_abs_error},
                          {"median_abs_error", s.median_abs_error}, {"worst_abs_error", s.worst_abs_error},
                          {"worst_id", s.worst_id},       {"mean_signed_error", s.mean_signed_error}};
  };
  nlohmann::json j = {{"stamp", stamp},
                      {"all", summary(r.all)},
                      {"held_out", summary(r.held_out)},
                      {"core", summary(r.core)},
                      {"calibration", summary(r.calibration)}};
  for (const ComputeCalibration& c : r.calibrations) j["compute_calibration"][c.gpu_model] = c.scale;
  for (const auto& [name, s] : r.by_system) j["by_system"][name] = summary(s);
  int wrong = 0;
  for (const RankingGroup& g : r.rankings) wrong += g.right ? 0 : 1;
  j["rankings"] = {{"groups", r.rankings.size()}, {"wrong", wrong}};
  write("summary.json", j.dump(2) + "\n");
  return written;
}

}  // namespace slidedp
