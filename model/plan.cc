// Plan YAML (strict) and helpers; see plan.h.
#include "model/plan.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"
#include "model/workload.h"

namespace slidedp {

const char* param_route_name(ParamRoute r) {
  return r == ParamRoute::kReplicated ? "replicated" : "sharded";
}
const char* grad_route_name(GradRoute r) { return r == GradRoute::kCpu ? "cpu" : "gpu"; }
const char* host_state_name(HostState s) { return s == HostState::kReplicated ? "replicated" : "sharded"; }

HostState parse_host_state(const std::string& s, const std::string& where) {
  if (s == "replicated") return HostState::kReplicated;
  if (s == "sharded") return HostState::kSharded;
  throw InputError(where, fmt::format("'{}' is not a host state placement (replicated, sharded)", s));
}

ParamRoute parse_param_route(const std::string& s, const std::string& where) {
  if (s == "replicated") return ParamRoute::kReplicated;
  if (s == "sharded") return ParamRoute::kSharded;
  throw InputError(where, fmt::format("'{}' is not a parameter route (replicated, sharded)", s));
}

GradRoute parse_grad_route(const std::string& s, const std::string& where) {
  if (s == "cpu") return GradRoute::kCpu;
  if (s == "gpu") return GradRoute::kGpu;
  throw InputError(where, fmt::format("'{}' is not a gradient route (cpu, gpu)", s));
}

ActivationPolicy parse_activation_policy(const std::string& s, const std::string& where) {
  if (s == "keep") return ActivationPolicy::kKeep;
  if (s == "recompute") return ActivationPolicy::kRecompute;
  if (s == "offload") return ActivationPolicy::kOffload;
  throw InputError(where, fmt::format("'{}' is not an activation policy (keep, recompute, offload)", s));
}

ActivationPolicy Plan::layer_policy(int layer, int num_layers) const {
  if (!per_layer.empty()) return per_layer.at(static_cast<std::size_t>(layer));
  int recompute = recompute_layers == kRest ? num_layers - offload_layers - keep_layers : recompute_layers;
  if (layer < offload_layers) return ActivationPolicy::kOffload;
  if (layer < offload_layers + recompute) return ActivationPolicy::kRecompute;
  return ActivationPolicy::kKeep;
}

Plan::PolicyCounts Plan::policy_counts(int num_layers) const {
  PolicyCounts c;
  for (int l = 0; l < num_layers; ++l) {
    switch (layer_policy(l, num_layers)) {
      case ActivationPolicy::kOffload: ++c.offload; break;
      case ActivationPolicy::kRecompute: ++c.recompute; break;
      case ActivationPolicy::kKeep: ++c.keep; break;
    }
  }
  return c;
}

std::string Plan::summary(int num_layers) const {
  PolicyCounts c = policy_counts(num_layers);
  std::string chunk = chunk_numel % (1 << 20) == 0 ? fmt::format("{}M", chunk_numel >> 20)
                                                   : fmt::format("{}", chunk_numel);
  std::string s = fmt::format("{} rank{} x mb {} x acc {} | {}/{} | chunk {} | act o{}/r{}/k{} | depth {}", ranks,
                               ranks > 1 ? "s" : "", micro_batch, accum_steps, param_route_name(param_route),
                               grad_route_name(grad_route), chunk, c.offload, c.recompute, c.keep,
                               gpu_buffer_depth);
  if (mlp_token_tile > 0) s += fmt::format(" | mlp tile {}", mlp_token_tile);
  if (nodes > 1) s = fmt::format("{} nodes ({} host state) x ", nodes, host_state_name(host_state)) + s;
  return s;
}

void Plan::validate(int num_layers, const std::string& origin) const {
  auto where = [&](const std::string& key) { return origin.empty() ? key : origin + ": " + key; };
  if (!per_layer.empty() && static_cast<int>(per_layer.size()) != num_layers)
    throw InputError(where("activation.per_layer"),
                     fmt::format("has {} entries; the model has {} decoder layers", per_layer.size(), num_layers));
  if (per_layer.empty()) {
    int fixed = offload_layers + (recompute_layers == kRest ? 0 : recompute_layers) +
                (keep_layers == kRest ? 0 : keep_layers);
    bool has_rest = recompute_layers == kRest || keep_layers == kRest;
    if (fixed > num_layers || (!has_rest && fixed != num_layers))
      throw InputError(where("activation"),
                       fmt::format("offload {} + recompute {} + keep {} must cover the model's {} decoder "
                                   "layers (use 'rest' for one of recompute/keep)",
                                   offload_layers, recompute_layers == kRest ? "rest" : std::to_string(recompute_layers),
                                   keep_layers == kRest ? "rest" : std::to_string(keep_layers), num_layers));
  }
  // Bounds that keep every count a step multiplies in range (a depth of 1e9 allocated slot records
  // for minutes; an accumulation of 2^31 overflowed the tokens of a step).
  if (gpu_buffer_depth < 1 || gpu_buffer_depth > kMaxBufferDepth)
    throw InputError(where("gpu_buffer_depth"), fmt::format("{} is not from 1 to {}", gpu_buffer_depth, kMaxBufferDepth));
  if (ranks < 1 || ranks > 4096) throw InputError(where("ranks"), fmt::format("{} is not from 1 to 4096", ranks));
  if (micro_batch < 1 || micro_batch > (1 << 20))
    throw InputError(where("micro_batch"), fmt::format("{} is not from 1 to {}", micro_batch, 1 << 20));
  if (accum_steps < 1 || accum_steps > (1 << 20))
    throw InputError(where("accum_steps"), fmt::format("{} is not from 1 to {}", accum_steps, 1 << 20));
  if (nodes < 1) throw InputError(where("nodes"), "must be at least 1");
  if (chunk_numel < 1 || chunk_numel > (int64_t{1} << 40))
    throw InputError(where("chunk_numel"), "must be in 1..2^40 elements");
  if (mlp_token_tile < 0) throw InputError(where("mlp_token_tile"), "must be 0 (no tiling) or a number of tokens");
}

Plan plan_from_yaml_reader(const YamlReader& r) {
  Plan p;
  p.nodes = static_cast<int>(r.integer_or("nodes", 1, 1, 4096));
  p.host_state = parse_host_state(r.text_or("host_state", "replicated"), r.where("host_state"));
  p.optimizer_states =
      parse_optimizer_states(r.text_or("optimizer_states", "fp32"), r.where("optimizer_states"));
  p.ranks = static_cast<int>(r.integer_or("ranks", 1, 1, 4096));
  p.micro_batch = static_cast<int>(r.integer_or("micro_batch", 1, 1, 1 << 20));
  p.accum_steps = static_cast<int>(r.integer_or("accum_steps", 1, 1, 1 << 20));
  p.param_route = parse_param_route(r.text_or("param_route", "replicated"), r.where("param_route"));
  p.grad_route = parse_grad_route(r.text_or("grad_route", "cpu"), r.where("grad_route"));
  p.chunk_numel = r.integer_or("chunk_numel", p.chunk_numel, 1, int64_t{1} << 40);
  if (auto a = r.optional_map("activation")) {
    auto count = [&](const std::string& key, int fallback) {
      if (!a->has(key)) {
        a->skip(key);
        return fallback;
      }
      YAML::Node n = a->raw(key);
      if (n.IsScalar() && n.Scalar() == "rest") return Plan::kRest;
      return static_cast<int>(a->integer(key, 0, 1 << 20));
    };
    p.offload_layers = count("offload", 0);
    p.keep_layers = count("keep", 0);
    p.recompute_layers = count("recompute", p.keep_layers == Plan::kRest ? 0 : Plan::kRest);
    if (p.offload_layers == Plan::kRest)
      throw InputError(a->where("offload"), "'rest' is only allowed for recompute or keep");
    if ((p.recompute_layers == Plan::kRest) == (p.keep_layers == Plan::kRest) &&
        p.recompute_layers == Plan::kRest)
      throw InputError(a->where("keep"), "only one of recompute and keep can be 'rest'");
    if (a->has("per_layer")) {
      for (const std::string& s : a->text_list("per_layer"))
        p.per_layer.push_back(parse_activation_policy(s, a->where("per_layer")));
    } else {
      a->skip("per_layer");
    }
    a->done();
  }
  p.gpu_buffer_depth = static_cast<int>(r.integer_or("gpu_buffer_depth", 2, 1, 64));
  p.update_threads = static_cast<int>(r.integer_or("update_threads", 0, 0, 100000));
  p.loss_chunk_tokens = r.integer_or("loss_chunk_tokens", p.loss_chunk_tokens, 1, int64_t{1} << 40);
  p.mlp_token_tile = r.integer_or("mlp_token_tile", 0, 0, int64_t{1} << 40);
  p.gpu_mem_budget_bytes = r.bytes_or("gpu_mem_budget_bytes", 0);
  p.gpu_mem_reserve_bytes = r.bytes_or("gpu_mem_reserve_bytes", p.gpu_mem_reserve_bytes);
  p.verify_updates = r.boolean_or("verify_updates", false);
  return p;
}

PlanFile plan_file_from_yaml(const std::string& yaml_text, const std::string& origin) {
  YamlReader r = YamlReader::load_string(yaml_text, origin);
  PlanFile f;
  f.model = r.text_or("model", "");
  f.hardware = r.text_or("hardware", "");
  f.seq_len = r.integer_or("seq_len", 0, 0, int64_t{1} << 32);
  f.system = r.text_or("system", "slidedp");
  f.plan = plan_from_yaml_reader(r);
  r.done();
  return f;
}

PlanFile load_plan_file(const std::string& path) {
  PlanFile f = plan_file_from_yaml(read_text_file(path), path);
  f.origin = path;
  return f;
}

namespace {

void emit_plan_keys(YAML::Emitter& e, const Plan& p) {
  if (p.nodes > 1) {
    e << YAML::Key << "nodes" << YAML::Value << p.nodes;
    e << YAML::Key << "host_state" << YAML::Value << host_state_name(p.host_state);
  }
  if (p.optimizer_states != OptimizerStates::kFp32)
    e << YAML::Key << "optimizer_states" << YAML::Value << optimizer_states_name(p.optimizer_states);
  e << YAML::Key << "ranks" << YAML::Value << p.ranks;
  e << YAML::Key << "micro_batch" << YAML::Value << p.micro_batch;
  e << YAML::Key << "accum_steps" << YAML::Value << p.accum_steps;
  e << YAML::Key << "param_route" << YAML::Value << param_route_name(p.param_route);
  e << YAML::Key << "grad_route" << YAML::Value << grad_route_name(p.grad_route);
  e << YAML::Key << "chunk_numel" << YAML::Value << p.chunk_numel;
  e << YAML::Key << "activation" << YAML::Value << YAML::BeginMap;
  if (!p.per_layer.empty()) {
    e << YAML::Key << "per_layer" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (auto a : p.per_layer) e << activation_policy_name(a);
    e << YAML::EndSeq;
  } else {
    auto count = [&](int n) { return n == Plan::kRest ? std::string("rest") : std::to_string(n); };
    e << YAML::Key << "offload" << YAML::Value << p.offload_layers;
    e << YAML::Key << "recompute" << YAML::Value << count(p.recompute_layers);
    e << YAML::Key << "keep" << YAML::Value << count(p.keep_layers);
  }
  e << YAML::EndMap;
  e << YAML::Key << "gpu_buffer_depth" << YAML::Value << p.gpu_buffer_depth;
  e << YAML::Key << "update_threads" << YAML::Value << p.update_threads;
  e << YAML::Key << "loss_chunk_tokens" << YAML::Value << p.loss_chunk_tokens;
  if (p.mlp_token_tile > 0) e << YAML::Key << "mlp_token_tile" << YAML::Value << p.mlp_token_tile;
  if (p.gpu_mem_budget_bytes > 0)
    e << YAML::Key << "gpu_mem_budget_bytes" << YAML::Value << p.gpu_mem_budget_bytes;
  e << YAML::Key << "gpu_mem_reserve_bytes" << YAML::Value << p.gpu_mem_reserve_bytes;
  if (p.verify_updates) e << YAML::Key << "verify_updates" << YAML::Value << true;
}

}  // namespace

std::string plan_to_yaml(const Plan& p) {
  YAML::Emitter e;
  e.SetDoublePrecision(15);  // shortest text that reads back to the same 15 digits (0.7, not 0.69999999999999996)
  e << YAML::BeginMap;
  emit_plan_keys(e, p);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::string plan_file_to_yaml(const PlanFile& f) {
  YAML::Emitter e;
  e.SetDoublePrecision(15);  // shortest text that reads back to the same 15 digits (0.7, not 0.69999999999999996)
  e << YAML::BeginMap;
  if (!f.model.empty()) e << YAML::Key << "model" << YAML::Value << f.model;
  if (!f.hardware.empty()) e << YAML::Key << "hardware" << YAML::Value << f.hardware;
  if (f.seq_len > 0) e << YAML::Key << "seq_len" << YAML::Value << f.seq_len;
  if (f.system != "slidedp") e << YAML::Key << "system" << YAML::Value << f.system;
  emit_plan_keys(e, f.plan);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

Workload make_workload(const ModelCard& model, int64_t seq_len) {
  if (seq_len < 1) throw InputError("seq_len", "must be at least 1");
  Workload w;
  w.model = model;
  w.seq_len = seq_len;
  w.layout = make_model_layout(model);
  return w;
}

bool backward_delivery_lookahead(const Plan& plan) {
  return plan.ranks > 1 && plan.param_route == ParamRoute::kSharded && plan.grad_route == GradRoute::kGpu;
}

}  // namespace slidedp
