// Resolving a SearchSpec into value lists; see search_space.h. The default grids are chosen so the
// space covers what matters (every route, chunks from 1/64 of a layer to a whole unit, activation
// counts on a grid of about 20 values, all batch shapes of the goal) without a blind product over
// layers.
#include "planner/search_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/units.h"
#include "model/step_work.h"

namespace slidedp::planner {
namespace {

template <typename T>
std::vector<T> sorted_unique(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::vector<int> powers_of_two_up_to(int64_t limit) {
  std::vector<int> out;
  for (int64_t v = 1; v <= limit && v <= (int64_t{1} << 20); v *= 2) out.push_back(static_cast<int>(v));
  return out;
}

std::vector<BatchShape> matched_shapes(const SearchSpec& spec, int64_t seq_len) {
  const int64_t per_step = static_cast<int64_t>(spec.nodes) * spec.ranks * seq_len;
  const int64_t n = spec.global_batch_tokens;
  if (n <= 0) throw InputError("--global-batch-tokens", "must be positive");
  if (n % per_step != 0) {
    const int64_t lo = n / per_step * per_step, hi = lo + per_step;
    throw InputError(
        "--global-batch-tokens",
        fmt::format("{} is not a multiple of nodes x ranks x seq = {} x {} x {} = {} tokens (nearest: {}{})", n,
                    spec.nodes, spec.ranks, seq_len, per_step, lo > 0 ? fmt::format("{} or ", lo) : "", hi));
  }
  // Every divisor of the per-rank sequence count is a micro-batch; the rest is accumulation. Divisors
  // come in pairs (d, per_rank / d), so sqrt(per_rank) trials find them all: 2^20 at 2^40 tokens.
  const int64_t per_rank = n / per_step;
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= per_rank / d; ++d)
    if (per_rank % d == 0) {
      divisors.push_back(d);
      if (d != per_rank / d) divisors.push_back(per_rank / d);
    }
  std::sort(divisors.begin(), divisors.end());
  std::vector<BatchShape> out;
  for (int64_t mb : divisors) {
    const int64_t acc = per_rank / mb;
    if (spec.max_micro_batch > 0 && mb > spec.max_micro_batch) continue;
    if (spec.max_accum_steps > 0 && acc > spec.max_accum_steps) continue;
    if (acc > (int64_t{1} << 20) || mb > (int64_t{1} << 30)) continue;  // the plan's own limits
    out.push_back({static_cast<int>(mb), static_cast<int>(acc)});
  }
  if (out.empty())
    throw InputError(
        "--max-micro-batch/--max-accum",
        fmt::format("no micro-batch x accumulation gives {} sequences per rank within the limits", per_rank));
  return out;
}

std::vector<BatchShape> free_shapes(const SearchSpec& spec, int64_t seq_len) {
  int64_t cap = spec.max_global_batch_tokens;
  if (spec.objective == Objective::kMinTimeToTokens) {
    if (spec.token_budget_tokens <= 0) throw InputError("--token-budget", "must be positive");
  }
  const int64_t per_step = static_cast<int64_t>(spec.nodes) * spec.ranks * seq_len;
  if (cap < per_step)
    throw InputError("--max-global-batch-tokens",
                     fmt::format("{} tokens is less than one sequence per rank ({} x {} x {} = {})", cap,
                                 spec.nodes, spec.ranks, seq_len, per_step));
  // Powers of two: a free batch has no divisibility constraint, and doubling is the grain at which
  // step time and memory change enough to matter.
  const int64_t per_rank = cap / per_step;
  std::vector<BatchShape> out;
  for (int mb : powers_of_two_up_to(per_rank)) {
    if (spec.max_micro_batch > 0 && mb > spec.max_micro_batch) continue;
    for (int acc : powers_of_two_up_to(per_rank / mb)) {
      if (spec.max_accum_steps > 0 && acc > spec.max_accum_steps) continue;
      out.push_back({mb, acc});
    }
  }
  if (out.empty()) throw InputError("--max-micro-batch/--max-accum", "no batch shape within the limits");
  return out;
}

}  // namespace

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::kMatchedBatch:
      return "matched-batch";
    case Objective::kMaxThroughput:
      return "max-throughput";
    case Objective::kMinTimeToTokens:
      return "time-to-tokens";
  }
  return "?";
}

std::vector<int> default_layer_counts(int num_layers) {
  // Every count for small models; otherwise 16 even steps plus 1, 2, 4 (offloading or keeping just a
  // few layers is where the first gains are).
  std::vector<int> out;
  if (num_layers <= 16) {
    for (int i = 0; i <= num_layers; ++i) out.push_back(i);
    return out;
  }
  for (int i = 0; i <= 16; ++i)
    out.push_back(static_cast<int>(std::lround(static_cast<double>(i) * num_layers / 16.0)));
  for (int i : {1, 2, 4}) out.push_back(i);
  return sorted_unique(out);
}

std::vector<int64_t> default_chunk_numels(const ModelLayout& layout) {
  int64_t max_unit = 1, layer = 0;
  for (const UnitLayout& u : layout.units) {
    max_unit = std::max(max_unit, u.flat_numel);
    if (u.kind == UnitKind::kDecoder) layer = std::max(layer, u.flat_numel);
  }
  if (layer == 0) layer = max_unit;
  // Powers of two from 1/64 of a layer (finer chunks only add per-copy latency) to the largest unit,
  // plus whole-layer fractions (1, 1/2, 1/4, 1/8: chunks that cut every layer evenly).
  std::vector<int64_t> out;
  const int64_t lo = std::max<int64_t>(4096, layer / 64);
  for (int64_t p = 1; p <= max_unit; p *= 2)
    if (p >= lo) out.push_back(p);
  for (int64_t f : {1, 2, 4, 8}) {
    int64_t c = (layer + f - 1) / f;
    c = (c + kTensorAlignElems - 1) / kTensorAlignElems * kTensorAlignElems;
    if (c >= 1) out.push_back(c);
  }
  out = sorted_unique(out);
  // Two sizes that cut every unit into the same number of chunks give the same work and the same
  // step time; the smaller one needs less host staging memory, so the larger is never better.
  auto counts = [&](int64_t c) {
    std::vector<int64_t> n;
    for (const UnitLayout& u : layout.units) n.push_back(num_chunks(u.flat_numel, c));
    return n;
  };
  std::vector<int64_t> kept;
  std::vector<int64_t> last;
  for (int64_t c : out) {
    std::vector<int64_t> n = counts(c);
    if (kept.empty() || n != last) kept.push_back(c);
    last = std::move(n);
  }
  return kept;
}

int64_t SearchSpace::per_shape_mix() const {
  return static_cast<int64_t>(routes.size()) * static_cast<int64_t>(depths.size()) *
         static_cast<int64_t>(threads.size()) * static_cast<int64_t>(chunks.size());
}

int64_t SearchSpace::size() const {
  return static_cast<int64_t>(shapes.size()) * static_cast<int64_t>(mixes.size()) * per_shape_mix();
}

int64_t SearchSpace::tokens_per_step(const BatchShape& s) const {
  return static_cast<int64_t>(nodes) * ranks * s.micro_batch * s.accum_steps * seq_len;
}

double SearchSpace::score_factor(const BatchShape& s) const {
  const double tokens = static_cast<double>(tokens_per_step(s));
  switch (objective) {
    case Objective::kMatchedBatch:
      return 1.0;
    case Objective::kMaxThroughput:
      return 1.0 / tokens;
    case Objective::kMinTimeToTokens:
      return std::ceil(static_cast<double>(token_budget_tokens) / tokens);
  }
  return 1.0;
}

double SearchSpace::score(double step_time_s, const BatchShape& s) const {
  return step_time_s * score_factor(s);
}

Plan SearchSpace::plan(const CandidateIndex& i) const {
  Plan p;
  const BatchShape& s = shapes.at(static_cast<std::size_t>(i.shape));
  const ActivationMix& m = mixes.at(static_cast<std::size_t>(i.mix));
  p.nodes = nodes;
  p.host_state = host_state;
  p.optimizer_states = optimizer_states;
  p.verify_updates = verify_updates;
  p.ranks = ranks;
  p.micro_batch = s.micro_batch;
  p.accum_steps = s.accum_steps;
  p.param_route = routes.at(static_cast<std::size_t>(i.route)).first;
  p.grad_route = routes.at(static_cast<std::size_t>(i.route)).second;
  p.chunk_numel = chunks.at(static_cast<std::size_t>(i.chunk));
  p.offload_layers = m.offload;
  p.recompute_layers = num_layers - m.offload - m.keep;
  p.keep_layers = Plan::kRest;
  p.gpu_buffer_depth = depths.at(static_cast<std::size_t>(i.depth));
  const int t = threads.at(static_cast<std::size_t>(i.thread));
  p.update_threads = t == free_threads ? 0 : t;
  p.loss_chunk_tokens = loss_chunk_tokens;
  p.mlp_token_tile = mlp_token_tile;
  p.gpu_mem_budget_bytes = gpu_mem_budget_bytes;
  p.gpu_mem_reserve_bytes = gpu_mem_reserve_bytes;
  return p;
}

SearchSpace make_search_space(const Workload& w, const Hardware& hw, const SearchSpec& spec) {
  SearchSpace sp;
  const int L = static_cast<int>(w.model.num_layers);
  sp.num_layers = L;
  sp.nodes = spec.nodes;
  sp.host_state = spec.host_states.empty() ? HostState::kReplicated : spec.host_states.front();
  sp.optimizer_states = spec.optimizer_states;
  sp.verify_updates = spec.verify_updates;
  sp.ranks = spec.ranks;
  sp.objective = spec.objective;
  sp.seq_len = w.seq_len;
  sp.token_budget_tokens = spec.token_budget_tokens;
  sp.gpu_mem_budget_bytes = spec.gpu_mem_budget_bytes;
  sp.gpu_mem_reserve_bytes = spec.gpu_mem_reserve_bytes;
  sp.loss_chunk_tokens = spec.loss_chunk_tokens;
  if (spec.ranks < 1) throw InputError("--ranks", "must be at least 1");
  if (spec.nodes < 1) throw InputError("--nodes", "must be at least 1");
  if (spec.nodes > 1 && hw.network.nic_gbps <= 0)
    throw InputError("--nodes", fmt::format("{} nodes, but {} describes no network between nodes (hardware key "
                                            "network.nic_gbps)", spec.nodes, hw.name));
  if (!hw.gpu.emulated_on_host && spec.ranks > hw.gpu.count)
    throw InputError("--ranks",
                     fmt::format("{} ranks but {} has {} GPUs", spec.ranks, hw.name, hw.gpu.count));
  if (spec.gpu_mem_budget_bytes < 0) throw InputError("--gpu-mem-budget", "must not be negative");
  if (spec.gpu_mem_reserve_bytes < 0) throw InputError("--gpu-mem-reserve", "must not be negative");
  if (spec.gpu_mem_budget_bytes == 0 && spec.gpu_mem_reserve_bytes >= hw.gpu.mem_bytes)
    throw InputError("--gpu-mem-reserve",
                     fmt::format("the reserve {} leaves nothing of the GPU's {}",
                                 format_bytes(static_cast<double>(spec.gpu_mem_reserve_bytes)),
                                 format_bytes(static_cast<double>(hw.gpu.mem_bytes))));
  if (spec.loss_chunk_tokens < 1) throw InputError("loss_chunk_tokens", "must be at least 1");

  // ---- batch shapes ----
  if (!spec.batch_shapes.empty()) {
    for (const BatchShape& s : spec.batch_shapes) {
      if (s.micro_batch < 1 || s.accum_steps < 1)
        throw InputError("batch_shapes", "micro-batch and accumulation must be >= 1");
      if (spec.objective == Objective::kMatchedBatch &&
          static_cast<int64_t>(spec.nodes) * spec.ranks * s.micro_batch * s.accum_steps * w.seq_len !=
              spec.global_batch_tokens)
        throw InputError("batch_shapes",
                         fmt::format("micro-batch {} x accumulation {} does not give {} tokens per step",
                                     s.micro_batch, s.accum_steps, spec.global_batch_tokens));
      sp.shapes.push_back(s);
    }
  } else {
    sp.shapes = spec.objective == Objective::kMatchedBatch ? matched_shapes(spec, w.seq_len)
                                                           : free_shapes(spec, w.seq_len);
  }
  std::sort(sp.shapes.begin(), sp.shapes.end(), [](const BatchShape& a, const BatchShape& b) {
    return a.micro_batch != b.micro_batch ? a.micro_batch < b.micro_batch : a.accum_steps < b.accum_steps;
  });
  sp.shapes.erase(std::unique(sp.shapes.begin(), sp.shapes.end()), sp.shapes.end());

  // ---- activation mixes ----
  std::vector<int> counts = spec.layer_counts.empty() ? default_layer_counts(L) : spec.layer_counts;
  for (int c : counts)
    if (c < 0 || c > L)
      throw InputError("layer_counts", fmt::format("{} is not a layer count of a {}-layer model", c, L));
  counts = sorted_unique(counts);
  for (int k : counts)
    for (int m : counts)
      if (k + m <= L) sp.mixes.push_back({k, m});
  if (sp.mixes.empty()) throw InputError("layer_counts", "no offload/keep pair fits the model's layers");

  // ---- routes ----
  // Across nodes the gpu gradient route's reduce-scatter spans every node's GPUs and leaves each node
  // only its part of the sum: a sharded host state's placement, not a replicated one's.
  const bool gpu_route_across_nodes = spec.nodes > 1 && sp.host_state == HostState::kSharded;
  if (spec.ranks == 1) {
    // With one rank every route moves the same bytes: keep one so equal plans are not counted twice
    // (across nodes the gpu gradient route differs: NCCL over the nodes' GPUs instead of the hosts).
    sp.routes.push_back({ParamRoute::kReplicated, GradRoute::kCpu});
    if (gpu_route_across_nodes && (spec.grad_routes.empty() || std::count(spec.grad_routes.begin(), spec.grad_routes.end(), GradRoute::kGpu)))
      sp.routes.push_back({ParamRoute::kReplicated, GradRoute::kGpu});
    sp.notes.push_back(gpu_route_across_nodes ? "1 rank per node: the parameter routes are the same, only replicated is searched"
                                              : "1 rank: every route is the same, only replicated/cpu is searched");
  } else {
    std::vector<ParamRoute> pr = spec.param_routes.empty()
                                     ? std::vector<ParamRoute>{ParamRoute::kReplicated, ParamRoute::kSharded}
                                     : spec.param_routes;
    std::vector<GradRoute> gr = spec.grad_routes.empty()
                                    ? std::vector<GradRoute>{GradRoute::kCpu, GradRoute::kGpu}
                                    : spec.grad_routes;
    if (spec.nodes > 1 && !gpu_route_across_nodes && std::count(gr.begin(), gr.end(), GradRoute::kGpu)) {
      gr.erase(std::remove(gr.begin(), gr.end(), GradRoute::kGpu), gr.end());
      sp.notes.push_back("replicated host state across nodes: only the cpu gradient route (the gpu route's reduce-scatter "
                         "over every node leaves each node only its part of the sum)");
    }
    for (ParamRoute p : sorted_unique(pr))
      for (GradRoute g : sorted_unique(gr)) sp.routes.push_back({p, g});
  }
  if (sp.routes.empty())
    throw InputError("grad_routes", "gpu: across nodes the gpu gradient route needs host_state sharded");

  // ---- chunks, depths, threads ----
  sp.chunks = spec.chunk_numels.empty() ? default_chunk_numels(w.layout) : sorted_unique(spec.chunk_numels);
  for (int64_t c : sp.chunks)
    if (c < 1) throw InputError("chunk_numels", "chunk sizes must be at least 1 element");
  const int units = w.layout.num_units();
  sp.depths = spec.buffer_depths.empty() ? std::vector<int>{1, 2, 3, 4} : sorted_unique(spec.buffer_depths);
  for (int d : sp.depths)
    if (d < 1 || d > 64) throw InputError("buffer_depths", "depths must be 1..64");
  // A depth beyond the number of units holds nothing more.
  sp.depths.erase(std::remove_if(sp.depths.begin(), sp.depths.end(), [&](int d) { return d > units; }),
                  sp.depths.end());
  if (sp.depths.empty()) sp.depths.push_back(units);

  Plan probe;
  probe.ranks = spec.ranks;
  probe.update_threads = 0;
  sp.free_threads = resolve_update_threads(probe, hw);
  std::vector<int> threads;
  if (spec.update_threads.empty()) {
    // All free cores, half and a quarter: fewer update threads leave host-memory bandwidth to the
    // copies, which wins when the links, not the CPU, are the bottleneck.
    for (int div : {1, 2, 4}) threads.push_back(std::max(1, (sp.free_threads + div - 1) / div));
  } else {
    for (int t : spec.update_threads) {
      if (t < 0) throw InputError("update_threads", "must not be negative");
      threads.push_back(t == 0 ? sp.free_threads : t);
    }
  }
  threads = sorted_unique(threads);
  std::reverse(threads.begin(), threads.end());
  sp.threads = threads;

  sp.notes.push_back(fmt::format("activation grid: offload and keep counts from {{{}}} (recompute the rest)",
                                 fmt::join(counts, ",")));
  return sp;
}

}  // namespace slidedp::planner
