// Reading sweep specs; see sweep_spec.h. Hardware overrides are merged onto the preset's own YAML
// (hardware_to_yaml) and read back with hardware_from_yaml, so a what-if machine passes exactly the
// checks a preset does, and an override of a key the preset does not have is an error, not a no-op.
#include "sweeps/sweep_spec.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"

namespace slidedp {
namespace {

// Splits "host.mem_bw_gbps" into {"host", "mem_bw_gbps"}.
std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : key) {
    if (ch == '.') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> map_keys(const YAML::Node& n) {
  std::vector<std::string> out;
  for (const auto& kv : n) out.push_back(kv.first.as<std::string>());
  return out;
}

// A map whose keys are numbers is a rate table (threads -> rate): an override replaces it whole.
bool is_rate_table(const YAML::Node& n) {
  if (!n.IsMap() || n.size() == 0) return false;
  for (const auto& kv : n) {
    double x = 0;
    if (!YAML::convert<double>::decode(kv.first, x)) return false;
  }
  return true;
}

// A rate table as one short line for reports: "{1: 1.4e+08, 16: 2.09e+09}".
std::string table_text(const YAML::Node& table) {
  std::vector<std::string> parts;
  for (const auto& kv : table) {
    double x = 0;
    const bool num = YAML::convert<double>::decode(kv.second, x);
    parts.push_back(
        fmt::format("{}: {}", kv.first.Scalar(), num ? fmt::format("{:.4g}", x) : kv.second.Scalar()));
  }
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}

// Merges `over` onto `base` leaf by leaf; every key must exist in `base`. Records "a.b=value" lines.
void merge_overrides(YAML::Node base, const YAML::Node& over, const std::string& path,
                     const std::string& where, const std::string& preset, std::vector<std::string>& applied) {
  if (!over.IsMap())
    throw InputError(where + (path.empty() ? "" : "." + path), "expected a map of hardware keys");
  // Plain names, each once, as in every record YamlReader reads.
  check_record_keys(over, [&](const std::string& key) {
    const std::string full = path.empty() ? key : key.empty() ? path : path + "." + key;
    return full.empty() ? where : where + "." + full;
  });
  for (const auto& kv : over) {
    const std::string key = kv.first.Scalar();
    const std::string full = path.empty() ? key : path + "." + key;
    if (key == "name" || key == "sources" || key == "unit_times")
      throw InputError(where + "." + full,
                       "cannot be overridden (the variant's label names it; sources are written by the "
                       "sweep; unit times come from a profile)");
    // Const lookup: a non-const operator[] would insert the missing key.
    YAML::Node b = static_cast<const YAML::Node&>(base)[key];
    if (!b || b.IsNull())
      throw InputError(
          where + "." + full,
          fmt::format("no such key in hardware '{}'{}", preset,
                      base.IsMap() ? fmt::format(" (keys here: {})", fmt::join(map_keys(base), ", ")) : ""));
    const YAML::Node& v = kv.second;
    if (b.IsMap() && !is_rate_table(b)) {
      merge_overrides(b, v, full, where, preset, applied);
      continue;
    }
    if (b.IsMap() && !v.IsMap())
      throw InputError(where + "." + full, "expected a table {threads: rate, ...} like the preset's");
    if (!b.IsMap() && !v.IsScalar()) throw InputError(where + "." + full, "expected a single value");
    base[key] = v;
    applied.push_back(fmt::format("{}={}", full, v.IsScalar() ? v.Scalar() : table_text(v)));
  }
}

// Numeric value of a leaf ("host.mem_bw_gbps") of the preset's YAML; throws naming `where`.
YAML::Node find_leaf(YAML::Node root, const std::string& key, const std::string& where,
                     const std::string& preset) {
  YAML::Node n = root;
  for (const std::string& part : split_key(key)) {
    const YAML::Node& cn = n;  // const lookup: a non-const operator[] would insert the key
    if (!cn.IsMap() || !cn[part] || cn[part].IsNull())
      throw InputError(where, fmt::format("'{}' is not a key of hardware '{}'", key, preset));
    n.reset(cn[part]);
  }
  return n;
}

double leaf_number(const YAML::Node& n, const std::string& key, const std::string& where) {
  double x = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, x) || !std::isfinite(x))
    throw InputError(where, fmt::format("'{}' is not a number in the preset", key));
  return x;
}

// Builds the nested override map {a: {b: value}} for a dotted key.
YAML::Node nested_override(const std::string& key, const YAML::Node& value) {
  std::vector<std::string> parts = split_key(key);
  YAML::Node leaf = value;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node m(YAML::NodeType::Map);
    m[*it] = leaf;
    leaf = m;
  }
  return leaf;
}

void merge_into(YAML::Node dst, const YAML::Node& src) {
  for (const auto& kv : src) {
    const std::string k = kv.first.as<std::string>();
    const YAML::Node existing = static_cast<const YAML::Node&>(dst)[k];
    if (existing && existing.IsMap() && kv.second.IsMap() && !is_rate_table(kv.second)) {
      merge_into(existing, kv.second);
    } else {
      dst[k] = kv.second;
    }
  }
}

std::string format_number(double x) {
  // Shortest text that reads back to the same 15 digits.
  std::string s = fmt::format("{:.15g}", x);
  return s;
}

}  // namespace

std::vector<HardwareVariant> read_hardware_entry(const YamlReader& h, const std::string& spec_dir) {
  const std::string base = h.text("preset");
  const std::string resolved = resolve_in_spec_dir(base, is_hardware_preset(base), spec_dir);
  std::string overrides_yaml;
  if (h.has("overrides")) {
    YAML::Node o = h.raw("overrides");
    if (!o.IsMap()) throw InputError(h.where("overrides"), "expected a map of hardware keys");
    overrides_yaml = YAML::Dump(o);
  } else {
    h.skip("overrides");
  }
  const std::string label = h.text_or("label", "");
  if (label.size() > 64) throw InputError(h.where("label"), fmt::format("has {} characters; at most 64 (it names files)", label.size()));
  std::vector<HardwareVariant> out;
  if (auto vary = h.optional_map("vary")) {
    const std::string key = vary->text("key");
    const std::vector<double> values = vary->number_list("values", 0.0, 1e18, "of the key's unit");
    std::vector<std::string> scale_with;
    if (vary->has("scale_with"))
      scale_with = vary->text_list("scale_with");
    else
      vary->skip("scale_with");
    vary->done();
    if (values.empty()) throw InputError(vary->where("values"), "expected at least one value");
    // The preset's own value of the key is the reference the scale_with entries are scaled from.
    const Hardware preset_hw = load_hardware(resolved);
    YAML::Node preset_yaml = YAML::Load(hardware_to_yaml(preset_hw));
    const double ref =
        leaf_number(find_leaf(preset_yaml, key, vary->where("key"), base), key, vary->where("key"));
    if (ref <= 0)
      throw InputError(vary->where("key"),
                       fmt::format("'{}' is {} in the preset; cannot scale by it", key, ref));
    for (const std::string& s : scale_with) find_leaf(preset_yaml, s, vary->where("scale_with"), base);
    for (double v : values) {
      YAML::Node over = overrides_yaml.empty() ? YAML::Node(YAML::NodeType::Map) : YAML::Load(overrides_yaml);
      merge_into(over, nested_override(key, YAML::Node(format_number(v))));
      // Tables and numbers that follow the varied key in proportion (e.g. AdamW rates that are
      // memory-bound estimates of host.mem_bw_gbps in the presets).
      for (const std::string& s : scale_with) {
        YAML::Node leaf = find_leaf(preset_yaml, s, vary->where("scale_with"), base);
        YAML::Node scaled;
        if (leaf.IsMap()) {
          scaled = YAML::Node(YAML::NodeType::Map);
          for (const auto& kv : leaf)
            scaled[kv.first.as<std::string>()] =
                format_number(leaf_number(kv.second, s, vary->where("scale_with")) * v / ref);
        } else {
          scaled = YAML::Node(format_number(leaf_number(leaf, s, vary->where("scale_with")) * v / ref));
        }
        merge_into(over, nested_override(s, scaled));
      }
      std::string l = label.empty() ? fmt::format("{} {}={}", base, key, format_number(v)) : label;
      const auto pos = l.find("{value}");
      if (pos != std::string::npos) l.replace(pos, 7, format_number(v));
      out.push_back(make_hardware_variant(resolved, YAML::Dump(over), l, h.where()));
      out.back().base = base;
    }
  } else {
    out.push_back(make_hardware_variant(resolved, overrides_yaml, label.empty() ? base : label, h.where()));
    out.back().base = base;
  }
  h.done();
  return out;
}

namespace {

template <typename T>
void reject_duplicates(const std::vector<T>& v, const std::string& where) {
  std::vector<T> s = v;
  std::sort(s.begin(), s.end());
  if (std::adjacent_find(s.begin(), s.end()) != s.end()) throw InputError(where, "lists a value twice");
}

std::vector<int64_t> positive_integers(const YamlReader& r, const std::string& key, int64_t max) {
  std::vector<int64_t> out;
  for (double x : r.number_list(key, 1, static_cast<double>(max), "")) {
    if (x != std::floor(x)) throw InputError(r.where(key), fmt::format("{} is not an integer", x));
    out.push_back(static_cast<int64_t>(x));
  }
  if (out.empty()) throw InputError(r.where(key), "expected at least one value");
  reject_duplicates(out, r.where(key));
  return out;
}

SweepGrid read_grid(const YamlReader& g, int index, const std::string& spec_dir) {
  SweepGrid grid;
  grid.name = g.text_or("name", fmt::format("grid{}", index));
  // Names become parts of file names (throughput__<grid>__<model>__seq<s>.svg): long ones would fail
  // when the report is written, after every point.
  if (grid.name.size() > 64) throw InputError(g.where("name"), fmt::format("has {} characters; at most 64", grid.name.size()));
  for (const YamlReader& h : g.map_list("hardware")) {
    for (HardwareVariant& v : read_hardware_entry(h, spec_dir)) grid.hardware.push_back(std::move(v));
  }
  if (grid.hardware.empty()) throw InputError(g.where("hardware"), "expected at least one machine");
  std::vector<std::string> models = g.text_list("models");
  if (models.empty()) throw InputError(g.where("models"), "expected at least one model");
  reject_duplicates(models, g.where("models"));
  for (std::size_t i = 0; i < models.size(); ++i) {
    try {
      grid.models.push_back(load_model_card(resolve_in_spec_dir(models[i], is_model_preset(models[i]), spec_dir)));
    } catch (const Error& e) {
      throw InputError(g.where("models") + fmt::format("[{}]", i), e.what());
    }
  }
  grid.seq_lens = positive_integers(g, "seq_lens", int64_t{1} << 24);
  const bool tokens = g.has("tokens_per_step"), seqs = g.has("sequences_per_rank");
  if (tokens == seqs)
    throw InputError(g.where(),
                     "give exactly one of tokens_per_step (matched batch) and sequences_per_rank (the step "
                     "grows with ranks and seq_lens)");
  if (tokens) {
    grid.batch_mode = BatchMode::kTokensPerStep;
    grid.batch_values = positive_integers(g, "tokens_per_step", int64_t{1} << 40);
    g.skip("sequences_per_rank");
  } else {
    grid.batch_mode = BatchMode::kSequencesPerRank;
    grid.batch_values = positive_integers(g, "sequences_per_rank", int64_t{1} << 20);
    g.skip("tokens_per_step");
  }
  if (g.has("ranks")) {
    for (int64_t r : positive_integers(g, "ranks", 1024)) grid.ranks.push_back(static_cast<int>(r));
  } else {
    g.skip("ranks");
  }
  if (g.has("nodes")) {
    grid.nodes.clear();
    for (int64_t n : positive_integers(g, "nodes", 4096)) grid.nodes.push_back(static_cast<int>(n));
  } else {
    g.skip("nodes");
  }
  std::vector<std::string> systems = g.text_list("systems");
  if (systems.empty()) throw InputError(g.where("systems"), "expected at least one system");
  reject_duplicates(systems, g.where("systems"));
  for (std::size_t i = 0; i < systems.size(); ++i)
    grid.systems.push_back(parse_system(systems[i], g.where("systems") + fmt::format("[{}]", i)));
  grid.expert_aware_delivery = g.text_or("expert_delivery", "all", {"all", "routed"}) == "routed";
  grid.router_skew = g.number_or("router_skew", 0.0, 0.0, 10.0, "");
  if (g.has("router_skew") && !grid.expert_aware_delivery)
    throw InputError(g.where("router_skew"), "only means something with expert_delivery: routed");
  grid.optimizer_states = parse_optimizer_states(
      g.text_or("optimizer_states", "fp32", {"fp32", "bf16", "8bit"}), g.where("optimizer_states"));
  grid.clip = g.boolean_or("clip", false);
  const bool baselines =
      std::any_of(grid.systems.begin(), grid.systems.end(), [](System s) { return s != System::kSlideDP; });
  if (baselines && grid.optimizer_states != OptimizerStates::kFp32)
    throw InputError(g.where("optimizer_states"),
                     "SlideDP's alone: the baselines hold fp32 moments (systems: [slidedp])");
  if (baselines && grid.clip)
    throw InputError(g.where("clip"),
                     "SlideDP's alone: the baselines place their updates their own way (systems: [slidedp])");
  g.done();

  // Every point must be expressible: ranks within each machine, tokens a multiple of ranks x seq_len.
  std::set<std::string> labels;
  for (const HardwareVariant& hv : grid.hardware) {
    if (!labels.insert(hv.label).second)
      throw InputError(g.where("hardware"),
                       fmt::format("two machines are labelled '{}'; give each a label", hv.label));
    const std::vector<int> ranks = grid.ranks.empty() ? std::vector<int>{hv.hw.gpu.count} : grid.ranks;
    const int most_nodes = *std::max_element(grid.nodes.begin(), grid.nodes.end());
    if (most_nodes > 1 && hv.hw.network.nic_gbps <= 0)
      throw InputError(g.where("nodes"), fmt::format("'{}' describes no network between nodes (network.nic_gbps)", hv.label));
    for (int r : ranks) {
      if (!hv.hw.gpu.emulated_on_host && r > hv.hw.gpu.count)
        throw InputError(g.where("ranks"),
                         fmt::format("{} ranks but '{}' has {} GPUs", r, hv.label, hv.hw.gpu.count));
      if (grid.batch_mode != BatchMode::kTokensPerStep) continue;
      for (int64_t seq : grid.seq_lens)
        for (int64_t t : grid.batch_values)
          for (int n : grid.nodes)
            if (t % (n * r * seq) != 0)
              throw InputError(g.where("tokens_per_step"),
                               fmt::format("{} tokens is not a multiple of nodes x ranks x seq_len = {} x {} x {} "
                                           "(machine '{}')", t, n, r, seq, hv.label));
    }
  }
  return grid;
}

PaperClaim read_claim(const YamlReader& c) {
  PaperClaim pc;
  pc.claim = c.text("claim");
  pc.paper = c.text("paper");
  pc.metric = c.text("metric", claim_metric_names());
  pc.hardware = c.text_or("hardware", "");
  pc.model = c.text_or("model", "");
  if (c.has("baselines")) {
    pc.baselines = c.text_list("baselines");
    for (std::size_t i = 0; i < pc.baselines.size(); ++i)
      parse_system(pc.baselines[i], c.where("baselines") + fmt::format("[{}]", i));
  } else {
    c.skip("baselines");
  }
  pc.min_tokens_per_step = c.integer_or("min_tokens_per_step", 0, 0, int64_t{1} << 40);
  c.done();
  return pc;
}

}  // namespace

std::string resolve_in_spec_dir(const std::string& name, bool is_preset, const std::string& spec_dir) {
  if (is_preset) return name;
  std::filesystem::path p(name);
  if (p.is_relative() && !spec_dir.empty() && std::filesystem::exists(std::filesystem::path(spec_dir) / p))
    return (std::filesystem::path(spec_dir) / p).string();
  return name;
}

std::vector<std::string> analysis_names() {
  return {kAnalysisThroughput, kAnalysisSpeedups, kAnalysisBottlenecks, kAnalysisLongestSequence,
          kAnalysisScaling, kAnalysisComputeBound};
}

std::vector<std::string> claim_metric_names() {
  return {"speedup_geomean",          "fsdp2_ratio", "fsdp2_peak_excess",
          "longest_sequence",         "feasible",    "weak_scaling_efficiency",
          "strong_scaling_efficiency"};
}


std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

HardwareVariant make_hardware_variant(const std::string& base, const std::string& overrides_yaml,
                                      const std::string& label, const std::string& where) {
  HardwareVariant v;
  v.label = label;
  v.base = base;
  Hardware preset;
  try {
    preset = load_hardware(base);
  } catch (const Error& e) {
    throw InputError(where + ".preset", e.what());
  }
  if (overrides_yaml.empty() || YAML::Load(overrides_yaml).IsNull()) {
    v.hw = preset;
    v.hw.name = label;
    return v;
  }
  YAML::Node doc = YAML::Load(hardware_to_yaml(preset));
  YAML::Node over;
  try {
    over = YAML::Load(overrides_yaml);
  } catch (const YAML::Exception& e) {
    throw InputError(where + ".overrides", fmt::format("malformed YAML: {}", e.msg));
  }
  merge_overrides(doc, over, "", where + ".overrides", base, v.overrides);
  // The variant's sources say which values the sweep changed.
  for (const std::string& o : v.overrides) {
    const std::string key = o.substr(0, o.find('='));
    doc["sources"][key] = fmt::format("what-if override of {} in a sweep spec ({})", base, where);
  }
  doc["name"] = label;
  v.hw = hardware_from_yaml(YAML::Dump(doc), fmt::format("{} (hardware '{}' with overrides)", where, base));
  return v;
}

SweepSpec sweep_spec_from_yaml(const std::string& text, const std::string& origin) {
  SweepSpec spec;
  spec.file = origin;
  spec.text = text;
  spec.text_hash = fnv1a(text);
  const std::string spec_dir = origin.empty() ? "" : std::filesystem::path(origin).parent_path().string();
  YamlReader r = YamlReader::load_string(text, origin);
  spec.name = r.text("name");
  if (spec.name.empty() || spec.name == "." || spec.name == ".." || spec.name.find_first_of("/\\ ") != std::string::npos)
    throw InputError(r.where("name"),
                     "expected a non-empty name without spaces or slashes, not '.' or '..' (it names the output folder)");
  spec.description = r.text_or("description", "");
  spec.simulate = r.boolean_or("simulate", false);
  if (r.has("analyses")) {
    spec.analyses = r.text_list("analyses");
    const std::vector<std::string> known = analysis_names();
    for (std::size_t i = 0; i < spec.analyses.size(); ++i)
      if (std::find(known.begin(), known.end(), spec.analyses[i]) == known.end())
        throw InputError(
            r.where("analyses") + fmt::format("[{}]", i),
            fmt::format("unknown analysis '{}' (one of: {})", spec.analyses[i], fmt::join(known, ", ")));
    reject_duplicates(spec.analyses, r.where("analyses"));
  } else {
    r.skip("analyses");
    spec.analyses = {kAnalysisThroughput, kAnalysisSpeedups, kAnalysisBottlenecks};
  }
  if (r.has("paper")) {
    for (const YamlReader& c : r.map_list("paper")) spec.claims.push_back(read_claim(c));
  } else {
    r.skip("paper");
  }
  std::vector<YamlReader> grids = r.map_list("grids");
  if (grids.empty()) throw InputError(r.where("grids"), "expected at least one grid");
  for (std::size_t i = 0; i < grids.size(); ++i)
    spec.grids.push_back(read_grid(grids[i], static_cast<int>(i), spec_dir));
  r.done();
  std::set<std::string> names;
  for (const SweepGrid& g : spec.grids)
    if (!names.insert(g.name).second)
      throw InputError(r.where("grids"), fmt::format("two grids are named '{}'", g.name));
  return spec;
}

SweepSpec load_sweep_spec(const std::string& path) {
  return sweep_spec_from_yaml(read_text_file(path), path);
}

std::vector<SweepPoint> expand_points(const SweepSpec& spec) {
  std::vector<SweepPoint> out;
  for (std::size_t gi = 0; gi < spec.grids.size(); ++gi) {
    const SweepGrid& g = spec.grids[gi];
    for (std::size_t hi = 0; hi < g.hardware.size(); ++hi) {
      const std::vector<int> ranks =
          g.ranks.empty() ? std::vector<int>{g.hardware[hi].hw.gpu.count} : g.ranks;
      for (std::size_t mi = 0; mi < g.models.size(); ++mi)
        for (int64_t seq : g.seq_lens)
          for (int n : g.nodes)
            for (int r : ranks)
              for (int64_t b : g.batch_values)
                for (System s : g.systems) {
                  SweepPoint p;
                  p.grid = static_cast<int>(gi);
                  p.hardware = static_cast<int>(hi);
                  p.model = static_cast<int>(mi);
                  p.seq_len = seq;
                  p.nodes = n;
                  p.ranks = r;
                  p.batch_value = b;
                  p.tokens_per_step = g.batch_mode == BatchMode::kTokensPerStep ? b : b * n * r * seq;
                  p.system = s;
                  out.push_back(p);
                }
    }
  }
  return out;
}

}  // namespace slidedp
