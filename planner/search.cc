// Branch and bound over the plan space; see search.h for the levels and their bounds. The search and
// the exhaustive enumeration share the memory checks and the scoring, so they can differ only in what
// they skip.
#include "planner/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <queue>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/seconds_since.h"
#include "common/units.h"
#include "model/memory_model.h"
#include "model/simulator.h"
#include "model/step_model.h"
#include "planner/step_work_patch.h"

namespace slidedp::planner {
namespace {

// Bounds are sums taken in another order than the model's own (the compute bound), so they may exceed
// the exact value by a few ulps; a node is cut only when its bound is above the threshold by more.
constexpr double kRoundingSlack = 1e-9;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A scored candidate, light enough to keep thousands of.
struct Scored {
  double score = 0;
  double gpu_peak_bytes = 0;
  double step_s = 0;
  CandidateIndex index;
};
bool scored_order(const Scored& a, const Scored& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.gpu_peak_bytes != b.gpu_peak_bytes) return a.gpu_peak_bytes < b.gpu_peak_bytes;
  return a.index < b.index;
}

// The result of checking one (shape, mix, route, depth) against the budgets. GPU memory does not
// depend on chunk or threads; host memory grows with the chunk (the gradient staging ring), so the
// chunks that fit are a prefix [0, chunk_fit) of the ascending chunk list.
struct MemoryCheck {
  const char* failed = nullptr;  // reason for every chunk, or nullptr
  double gpu_peak_bytes = 0;
  int chunk_fit = 0;       // chunks [0, chunk_fit) fit the host
  int chunk_ram_fail = 0;  // chunks [chunk_ram_fail, C) exceed host RAM; [chunk_fit, that) only pinned
};

class Searcher {
 public:
  Searcher(const Workload& w, const Hardware& hw, const SearchSpace& sp, const SearchOptions& o)
      : w_(w), hw_(hw), sp_(sp), opt_(o), top_k_(std::max(1, o.top_k)) {
    const std::size_t n = sp.shapes.size() * sp.routes.size() * sp.threads.size();
    patchers_.resize(n);
    compute_patchers_.resize(sp.shapes.size());
    stats_.space_size = sp.size();
    SLIDEDP_CHECK(sp.shapes.size() < 32768 && sp.mixes.size() < 65536 && sp.routes.size() < 65536 &&
                      sp.depths.size() < 65536 && sp.num_layers < 65536,
                  "search space too large for the planner's keys");
  }

  SearchResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    if (opt_.exhaustive)
      enumerate_all();
    else
      branch_and_bound();
    stats_.search_s = seconds_since(t0);
    return finish();
  }

 private:
  // ---------------------------------------------------------------------------------------------
  // Shared pieces.

  bool needs_fabric(int route) const {
    const auto& r = sp_.routes[static_cast<std::size_t>(route)];
    return sp_.ranks > 1 && (r.first == ParamRoute::kSharded || r.second == GradRoute::kGpu);
  }
  bool fabric_missing(int route) const { return needs_fabric(route) && hw_.fabric.kind == "none"; }

  const WorkPatcher& patcher(int shape, int route, int thread) {
    const std::size_t k =
        (static_cast<std::size_t>(shape) * sp_.routes.size() + static_cast<std::size_t>(route)) *
            sp_.threads.size() +
        static_cast<std::size_t>(thread);
    if (!patchers_[k]) {
      Plan p = sp_.plan({shape, 0, route, 0, thread, 0});
      patchers_[k] = std::make_unique<WorkPatcher>(w_, hw_, p);
    }
    return *patchers_[k];
  }

  // GPU compute does not depend on routes or threads: one patcher per shape on the plain route.
  double compute_bound(int shape, int mix) {
    auto& cp = compute_patchers_[static_cast<std::size_t>(shape)];
    if (!cp) {
      Plan p = sp_.plan({shape, 0, 0, 0, 0, 0});
      p.param_route = ParamRoute::kReplicated;
      p.grad_route = GradRoute::kCpu;
      cp = std::make_unique<WorkPatcher>(w_, hw_, p);
    }
    return cp->compute_bound_s(sp_.mixes[static_cast<std::size_t>(mix)].keep);
  }

  void note_miss(const char* why, double excess, const MemoryEstimate& e, const Plan& p) {
    auto it = miss_excess_.find(why);
    if (it != miss_excess_.end() && it->second <= excess) return;
    miss_excess_[why] = excess;
    std::string text;
    for (const std::string& v : e.violations()) {
      const bool match = (why == std::string(reason::kGpuMemory) && v.rfind("GPU", 0) == 0) ||
                         (why == std::string(reason::kHostRam) && v.rfind("host RAM", 0) == 0) ||
                         (why == std::string(reason::kHostPinned) && v.rfind("pinned", 0) == 0);
      if (match) text = v;
    }
    closest_[why] = fmt::format("{} -- {}", p.summary(sp_.num_layers), text);
  }

  // First violated budget of an estimate, in the order GPU, host RAM, pinned; records the closest miss.
  const char* violated(const MemoryEstimate& e, const Plan& p) {
    if (!e.fits_gpu()) {
      note_miss(reason::kGpuMemory, e.gpu_peak_bytes - e.gpu_budget_bytes, e, p);
      return reason::kGpuMemory;
    }
    if (e.host_bytes > e.host_ram_bytes) {
      note_miss(reason::kHostRam, e.host_bytes - e.host_ram_bytes, e, p);
      return reason::kHostRam;
    }
    if (e.host_pinned_bytes > e.host_pinned_limit_bytes) {
      note_miss(reason::kHostPinned, e.host_pinned_bytes - e.host_pinned_limit_bytes, e, p);
      return reason::kHostPinned;
    }
    return nullptr;
  }

  MemoryEstimate estimate(const Plan& p) {
    ++stats_.memory_estimates;
    return estimate_memory(w_, hw_, p, System::kSlideDP);
  }

  // Checks (shape, mix, route, depth); with `bisect`, finds the chunk boundaries by bisection (host
  // memory is monotone in the chunk), else estimates every chunk (the exhaustive reference).
  MemoryCheck check_memory(int shape, int mix, int route, int depth, bool bisect) {
    MemoryCheck mc;
    const int C = static_cast<int>(sp_.chunks.size());
    Plan p = sp_.plan({shape, mix, route, depth, 0, 0});
    MemoryEstimate e = estimate(p);
    mc.gpu_peak_bytes = e.gpu_peak_bytes;
    if (const char* why = violated(e, p)) {
      mc.failed = why;
      return mc;
    }
    auto at = [&](int c) {
      p.chunk_numel = sp_.chunks[static_cast<std::size_t>(c)];
      return estimate(p);
    };
    if (!bisect) {
      mc.chunk_fit = mc.chunk_ram_fail = C;
      for (int c = 1; c < C; ++c) {
        MemoryEstimate ec = at(c);
        const char* why = violated(ec, p);
        if (why && mc.chunk_fit == C) mc.chunk_fit = c;
        if (why == reason::kHostRam && mc.chunk_ram_fail == C) mc.chunk_ram_fail = c;
      }
      return mc;
    }
    // Smallest c in [lo, C] for which `fails(c)` holds (fails is monotone: false... then true...).
    auto first_failing = [&](int lo, auto fails) {
      int hi = C;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (fails(mid))
          hi = mid;
        else
          lo = mid + 1;
      }
      return lo;
    };
    MemoryEstimate last = at(C - 1);
    if (!violated(last, p)) {
      mc.chunk_fit = mc.chunk_ram_fail = C;
      return mc;
    }
    mc.chunk_fit = first_failing(1, [&](int c) { return violated(at(c), p) != nullptr; });
    mc.chunk_ram_fail = first_failing(mc.chunk_fit, [&](int c) {
      MemoryEstimate ec = at(c);
      return ec.host_bytes > ec.host_ram_bytes;
    });
    return mc;
  }

  // Counts the host-infeasible chunks of a (shape, mix, route, depth), for every thread count.
  void count_chunk_failures(const MemoryCheck& mc) {
    const int C = static_cast<int>(sp_.chunks.size());
    const int64_t T = static_cast<int64_t>(sp_.threads.size());
    if (mc.chunk_ram_fail < C) stats_.infeasible[reason::kHostRam] += T * (C - mc.chunk_ram_fail);
    if (mc.chunk_fit < mc.chunk_ram_fail)
      stats_.infeasible[reason::kHostPinned] += T * (mc.chunk_ram_fail - mc.chunk_fit);
  }

  double evaluate(const StepWork& sw, ModelFidelity f) {
    if (f == ModelFidelity::kCriticalPath)
      ++stats_.bound_evaluations;
    else
      ++stats_.evaluated;
    const Prediction p = evaluate_step_work(sw, f);
    return f == ModelFidelity::kCriticalPath ? p.step_time_s : ranked_step_time_s(p);
  }

  // Keeps the K best, or with distinct families the best of K different families. The cut rule is the
  // same either way: a candidate above the K-th score can neither enter the list nor improve the entry
  // of its family (that entry scores at most the K-th score).
  void offer(const Scored& s) {
    if (opt_.distinct_families) {
      auto [it, fresh] = family_best_.try_emplace(family(s.index), s.score);
      if (!fresh) it->second = std::min(it->second, s.score);
      auto same = std::find_if(top_.begin(), top_.end(), [&](const Scored& t) {
        return t.index.shape == s.index.shape && t.index.mix == s.index.mix && t.index.route == s.index.route;
      });
      if (same != top_.end()) {
        if (!scored_order(s, *same)) return;
        top_.erase(same);
      }
    }
    if (top_.size() == static_cast<std::size_t>(top_k_) && !scored_order(s, top_.back())) return;
    top_.insert(std::upper_bound(top_.begin(), top_.end(), s, scored_order), s);
    if (top_.size() > static_cast<std::size_t>(top_k_)) top_.pop_back();
  }
  double threshold() const {
    return top_.size() < static_cast<std::size_t>(top_k_) ? kInf : top_.back().score;
  }
  // True when no candidate under a node with this bound can enter the top K.
  bool cut(double bound) const { return bound * (1.0 - kRoundingSlack) > threshold(); }

  // ---------------------------------------------------------------------------------------------
  // Exhaustive enumeration: the reference the search is tested against.

  void enumerate_all() {
    StepWork sw;
    const int S = static_cast<int>(sp_.shapes.size()), M = static_cast<int>(sp_.mixes.size());
    const int R = static_cast<int>(sp_.routes.size()), D = static_cast<int>(sp_.depths.size());
    const int T = static_cast<int>(sp_.threads.size()), C = static_cast<int>(sp_.chunks.size());
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m)
        for (int r = 0; r < R; ++r)
          for (int d = 0; d < D; ++d) {
            if (fabric_missing(r)) {
              stats_.infeasible[reason::kGpuFabric] += static_cast<int64_t>(T) * C;
              continue;
            }
            MemoryCheck mc = check_memory(s, m, r, d, /*bisect=*/false);
            if (mc.failed) {
              stats_.infeasible[mc.failed] += static_cast<int64_t>(T) * C;
              continue;
            }
            count_chunk_failures(mc);
            for (int t = 0; t < T; ++t)
              for (int c = 0; c < mc.chunk_fit; ++c) {
                CandidateIndex i{s, m, r, d, t, c};
                patcher(s, r, t).make(sp_.plan(i), sw);
                const double step = evaluate(sw, ModelFidelity::kContention);
                offer({sp_.score(step, sp_.shapes[static_cast<std::size_t>(s)]), mc.gpu_peak_bytes, step, i});
              }
          }
  }

  // ---------------------------------------------------------------------------------------------
  // Branch and bound. A node fixes a prefix of the dimensions in the order (shape, mix), route,
  // depth, threads, chunk; its key is a lower bound on the score of every candidate below it.

  enum Level : int { kShapeMix = 1, kRoute, kDepth, kThread, kChunk };
  struct Node {
    CandidateIndex index;
    int level = kShapeMix;
    double key = 0;
    // kRoute: the check of the smallest depth; from kDepth on: the node's own depth.
    int chunk_fit = 0;  // chunks [0, chunk_fit) fit the host
    double gpu_peak_bytes = 0;
    // The largest relaxed critical path above (and at) this node: a candidate's own critical path below
    // it must not be smaller (checked: stats.relaxation_violations).
    double relaxed_cp = 0;
  };
  struct QEntry {
    double key;
    int level;
    int64_t id;
    bool operator>(const QEntry& o) const {
      if (key != o.key) return key > o.key;
      if (level != o.level) return level < o.level;  // deeper first on ties: incumbents sooner
      return id > o.id;
    }
  };

  static int64_t family(const CandidateIndex& i) { return pack(i.shape, i.mix, i.route, 0); }
  // With distinct families, a node whose family is fixed (from the route on) is also cut when it cannot
  // beat the best its family has already scored: it could only replace that family's entry.
  bool family_cut(const Node& n) const {
    if (!opt_.distinct_families || n.level < kRoute) return false;
    auto it = family_best_.find(family(n.index));
    return it != family_best_.end() && n.key * (1.0 - kRoundingSlack) > it->second;
  }

  int64_t candidates_below(const Node& n) const {
    const int64_t D = static_cast<int64_t>(sp_.depths.size()), T = static_cast<int64_t>(sp_.threads.size());
    const int64_t C = static_cast<int64_t>(sp_.chunks.size());
    switch (n.level) {
      case kShapeMix:
        return sp_.per_shape_mix();
      case kRoute:
        return D * T * C - T * (C - n.chunk_fit);  // the smallest depth's host failures are counted
      case kDepth:
        return T * n.chunk_fit;
      case kThread:
        return n.chunk_fit;
      default:
        return 1;
    }
  }

  void push(const Node& n) {
    if (cut(n.key) || family_cut(n)) {
      stats_.pruned += candidates_below(n);
      return;
    }
    nodes_.push_back(n);
    queue_.push({n.key, n.level, static_cast<int64_t>(nodes_.size() - 1)});
  }

  // Memos of GPU-infeasible points: GPU memory only grows with keep layers (at a fixed offload count),
  // with the micro-batch (at a fixed mix) and with depth, so one infeasible point implies many.
  // One key from four small indices (16 bits each; the constructor checks the space fits).
  static int64_t pack(int a, int b, int c, int d) {
    return ((static_cast<int64_t>(a) * 65536 + b) * 65536 + c) * 65536 + d;
  }
  bool implied_gpu_infeasible(int s, int m, int r, int d) const {
    const ActivationMix& mix = sp_.mixes[static_cast<std::size_t>(m)];
    auto k = min_bad_keep_.find(pack(s, mix.offload, r, d));
    if (k != min_bad_keep_.end() && mix.keep >= k->second) return true;
    auto b = min_bad_mb_.find(pack(m, r, d, 0));
    return b != min_bad_mb_.end() && sp_.shapes[static_cast<std::size_t>(s)].micro_batch >= b->second;
  }
  void remember_gpu_infeasible(int s, int m, int r, int d) {
    const ActivationMix& mix = sp_.mixes[static_cast<std::size_t>(m)];
    const int mb = sp_.shapes[static_cast<std::size_t>(s)].micro_batch;
    // Larger depths are implied too: record the point at every depth from d up.
    for (int dd = d; dd < static_cast<int>(sp_.depths.size()); ++dd) {
      auto [k, new_k] = min_bad_keep_.try_emplace(pack(s, mix.offload, r, dd), mix.keep);
      if (!new_k) k->second = std::min(k->second, mix.keep);
      auto [b, new_b] = min_bad_mb_.try_emplace(pack(m, r, dd, 0), mb);
      if (!new_b) b->second = std::min(b->second, mb);
    }
  }

  // Checks GPU and host memory of (shape, mix, route, depth) and every larger depth. Returns false
  // (after counting this depth and all larger ones as infeasible) when it does not fit at all.
  bool fits(const CandidateIndex& i, MemoryCheck& mc) {
    const int64_t D = static_cast<int64_t>(sp_.depths.size()), T = static_cast<int64_t>(sp_.threads.size());
    const int64_t C = static_cast<int64_t>(sp_.chunks.size());
    const int64_t rest = (D - i.depth) * T * C;  // this depth and every larger one
    if (implied_gpu_infeasible(i.shape, i.mix, i.route, i.depth)) {
      stats_.infeasible[reason::kGpuMemory] += rest;
      stats_.infeasible_by_monotonicity += rest;
      return false;
    }
    mc = check_memory(i.shape, i.mix, i.route, i.depth, /*bisect=*/true);
    if (!mc.failed) {
      count_chunk_failures(mc);
      return true;
    }
    // GPU memory grows with the depth; host memory does not depend on it: either way every larger
    // depth fails the same way.
    if (mc.failed == reason::kGpuMemory) remember_gpu_infeasible(i.shape, i.mix, i.route, i.depth);
    stats_.infeasible[mc.failed] += rest;
    stats_.infeasible_by_monotonicity += rest - T * C;
    return false;
  }

  // Per unit, the least CPU time over the thread counts (thread-seconds / threads), per (shape, route);
  // and the same of the update after the backward (clipping).
  struct ThreadRelax {
    std::vector<double> last_s, accum_s, after_exchange_s, accum_after_exchange_s;
    double post_s = kInf;
  };
  const ThreadRelax& thread_relax(int s, int r) {
    auto& slot = thread_relax_[static_cast<std::size_t>(s) * sp_.routes.size() + static_cast<std::size_t>(r)];
    if (!slot) {
      slot = std::make_unique<ThreadRelax>();
      const std::size_t U = static_cast<std::size_t>(w_.layout.num_units());
      slot->last_s.assign(U, kInf);
      slot->accum_s.assign(U, kInf);
      slot->after_exchange_s.assign(U, kInf);
      slot->accum_after_exchange_s.assign(U, kInf);
      for (int t = 0; t < static_cast<int>(sp_.threads.size()); ++t) {
        const StepWork& b = patcher(s, r, t).all_offload();
        slot->post_s = std::min(slot->post_s, b.post_update_thread_s / b.cap.update_threads);
        for (std::size_t u = 0; u < U; ++u) {
          slot->last_s[u] = std::min(slot->last_s[u], b.units[u].cpu_last_thread_s / b.cap.update_threads);
          slot->accum_s[u] = std::min(slot->accum_s[u], b.units[u].cpu_accum_thread_s / b.cap.update_threads);
          slot->after_exchange_s[u] =
              std::min(slot->after_exchange_s[u], b.units[u].cpu_after_exchange_thread_s / b.cap.update_threads);
          slot->accum_after_exchange_s[u] = std::min(slot->accum_after_exchange_s[u],
                                                     b.units[u].cpu_accum_after_exchange_thread_s / b.cap.update_threads);
        }
      }
    }
    return *slot;
  }

  // Work whose critical path bounds every candidate below a node. The finest chunk and no per-copy
  // latencies: more chunks pipeline better and cost only latency. The deepest buffer when the depth is
  // free: LRU is a stack algorithm, so more slots only turn deliveries into hits. When the threads are
  // free, each unit's CPU work at its fastest thread count on one "thread" of unit speed: its time is
  // the least over the thread counts and its thread-seconds no more than any of theirs.
  // Sets the node's key from the relaxed critical path of its parent's key and this relaxation.
  void relaxed_bound(Node& n, bool depth_free, bool threads_free) {
    CandidateIndex i = n.index;
    i.chunk = 0;
    if (depth_free) i.depth = static_cast<int>(sp_.depths.size()) - 1;
    if (threads_free) i.thread = 0;
    patcher(i.shape, i.route, i.thread).make(sp_.plan(i), work_);
    work_.cap.link_latency_s = 0;
    work_.cap.fabric_latency_s = 0;
    work_.cap.nic_latency_s = 0;
    if (threads_free && sp_.threads.size() > 1) {
      const ThreadRelax& tr = thread_relax(i.shape, i.route);
      work_.cap.update_threads = 1;
      work_.post_update_thread_s = tr.post_s;
      for (std::size_t u = 0; u < work_.units.size(); ++u) {
        work_.units[u].cpu_last_thread_s = tr.last_s[u];
        work_.units[u].cpu_accum_thread_s = tr.accum_s[u];
        work_.units[u].cpu_after_exchange_thread_s = tr.after_exchange_s[u];
        work_.units[u].cpu_accum_after_exchange_thread_s = tr.accum_after_exchange_s[u];
      }
    }
    const double f = sp_.score_factor(sp_.shapes[static_cast<std::size_t>(i.shape)]);
    const double cp = f * evaluate(work_, ModelFidelity::kCriticalPath);
    n.relaxed_cp = std::max(n.relaxed_cp, cp);
    n.key = std::max(n.key, cp);
  }

  void branch_and_bound() {
    const int S = static_cast<int>(sp_.shapes.size()), M = static_cast<int>(sp_.mixes.size());
    thread_relax_.resize(sp_.shapes.size() * sp_.routes.size());
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m) {
        Node n;
        n.index = {s, m, 0, 0, 0, 0};
        n.key = sp_.score(compute_bound(s, m), sp_.shapes[static_cast<std::size_t>(s)]);
        push(n);
      }
    while (!queue_.empty()) {
      const QEntry q = queue_.top();
      if (cut(q.key)) break;
      queue_.pop();
      const Node& n = nodes_[static_cast<std::size_t>(q.id)];
      if (family_cut(n)) {  // its family improved since it was queued
        stats_.pruned += candidates_below(n);
        continue;
      }
      ++stats_.nodes_expanded;
      expand(n);
    }
    // Whatever is left can no longer reach the top K.
    while (!queue_.empty()) {
      stats_.pruned += candidates_below(nodes_[static_cast<std::size_t>(queue_.top().id)]);
      queue_.pop();
    }
  }

  void expand(const Node n) {  // by value: expanding appends to nodes_
    const int64_t T = static_cast<int64_t>(sp_.threads.size()), C = static_cast<int64_t>(sp_.chunks.size());
    const int64_t D = static_cast<int64_t>(sp_.depths.size());
    switch (n.level) {
      case kShapeMix:
        for (int r = 0; r < static_cast<int>(sp_.routes.size()); ++r) {
          if (fabric_missing(r)) {
            stats_.infeasible[reason::kGpuFabric] += D * T * C;
            continue;
          }
          Node c = n;
          c.level = kRoute;
          c.index.route = r;
          // The smallest depth first: if it does not fit, no depth does, and no bound is needed.
          MemoryCheck mc;
          if (!fits(c.index, mc)) continue;
          c.chunk_fit = mc.chunk_fit;
          c.gpu_peak_bytes = mc.gpu_peak_bytes;
          relaxed_bound(c, /*depth_free=*/true, /*threads_free=*/true);
          push(c);
        }
        break;
      case kRoute:
        for (int d = 0; d < static_cast<int>(D); ++d) {
          Node c = n;
          c.level = kDepth;
          c.index.depth = d;
          if (d > 0) {
            MemoryCheck mc;
            if (!fits(c.index, mc)) break;
            c.chunk_fit = mc.chunk_fit;
            c.gpu_peak_bytes = mc.gpu_peak_bytes;
          }
          relaxed_bound(c, /*depth_free=*/false, /*threads_free=*/true);
          push(c);
        }
        break;
      case kDepth:
        for (int t = 0; t < static_cast<int>(T); ++t) {
          Node c = n;
          c.level = kThread;
          c.index.thread = t;
          if (T > 1) relaxed_bound(c, /*depth_free=*/false, /*threads_free=*/false);
          push(c);
        }
        break;
      case kThread: {
        const double f = sp_.score_factor(sp_.shapes[static_cast<std::size_t>(n.index.shape)]);
        const WorkPatcher& wp = patcher(n.index.shape, n.index.route, n.index.thread);
        wp.make(sp_.plan(n.index), work_);
        for (int ch = 0; ch < n.chunk_fit; ++ch) {
          Node c = n;
          c.level = kChunk;
          c.index.chunk = ch;
          wp.set_chunk(work_, sp_.chunks[static_cast<std::size_t>(ch)]);
          const double cp = f * evaluate(work_, ModelFidelity::kCriticalPath);
          if (cp < n.relaxed_cp * (1.0 - kRoundingSlack)) ++stats_.relaxation_violations;
          c.key = std::max(n.key, cp);
          push(c);
        }
        break;
      }
      default: {
        const CandidateIndex& i = n.index;
        patcher(i.shape, i.route, i.thread).make(sp_.plan(i), work_);
        const double step = evaluate(work_, ModelFidelity::kContention);
        const double score = sp_.score(step, sp_.shapes[static_cast<std::size_t>(i.shape)]);
        if (score < n.key * (1.0 - kRoundingSlack)) ++stats_.bound_violations;
        offer({score, n.gpu_peak_bytes, step, i});
      }
    }
  }

  // ---------------------------------------------------------------------------------------------

  SearchResult finish() {
    SearchResult res;
    res.space = sp_;
    res.closest_miss = closest_;
    if (top_.empty()) {
      res.stats = stats_;
      throw InfeasibleError(no_plan_message());
    }
    for (const Scored& s : top_) {
      Candidate c;
      c.index = s.index;
      c.plan = sp_.plan(s.index);
      c.predicted = predict_analytical(w_, hw_, c.plan, System::kSlideDP);
      c.ranked_step_s = ranked_step_time_s(c.predicted);
      // The search scored a patched copy of the work; the model's own entry point must agree exactly.
      SLIDEDP_CHECK(c.ranked_step_s == s.step_s,
                    fmt::format("planner: patched work scores {} but predict_analytical {} for {}", s.step_s,
                                c.ranked_step_s, c.plan.summary(sp_.num_layers)));
      c.score = s.score;
      res.top.push_back(std::move(c));
    }
    if (opt_.rescore_with_simulator) {
      const auto t0 = std::chrono::steady_clock::now();
      SimulatorOptions so;
      so.record_timeline = false;
      so.measure_sync = false;
      // The simulations are independent: one thread each, as many at once as the machine has cores.
      const std::size_t n = res.top.size();
      const std::size_t width =
          std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), static_cast<unsigned>(n)));
      // The simulations run at once share the one graph budget, so re-scoring never holds more than a
      // single simulation may; a candidate whose step does not fit keeps its analytical score.
      so.max_tasks = std::max<std::int64_t>(1, opt_.max_simulated_tasks / static_cast<std::int64_t>(width));
      std::vector<std::optional<Prediction>> sims(n);
      std::vector<std::exception_ptr> errors(n);
      std::atomic<std::size_t> next{0};
      std::atomic<std::int64_t> too_large{0};
      auto worker = [&] {
        for (std::size_t i = next++; i < n; i = next++) {
          try {
            sims[i] = simulate(w_, hw_, res.top[i].plan, System::kSlideDP, so).prediction;
          } catch (const SimulationTooLarge&) {
            ++too_large;
          } catch (...) {
            errors[i] = std::current_exception();
          }
        }
      };
      std::vector<std::thread> pool;
      for (std::size_t t = 1; t < width; ++t) pool.emplace_back(worker);
      worker();
      for (std::thread& t : pool) t.join();
      for (std::size_t i = 0; i < n; ++i)
        if (errors[i]) std::rethrow_exception(errors[i]);
      // One candidate the simulator cannot hold: none is re-scored, so the ranking stays one model's.
      stats_.simulations_too_large = too_large;
      for (std::size_t i = 0; i < n && too_large == 0; ++i) {
        Candidate& c = res.top[i];
        c.simulated = std::move(sims[i]);
        c.simulated->memory = c.predicted.memory;
        c.simulated_score =
            sp_.score(c.simulated->step_time_s, sp_.shapes[static_cast<std::size_t>(c.index.shape)]);
        ++stats_.simulations;
      }
      std::stable_sort(res.top.begin(), res.top.end(), [](const Candidate& a, const Candidate& b) {
        if (a.final_score() != b.final_score()) return a.final_score() < b.final_score();
        return model_order(a, b);
      });
      stats_.rescore_s = seconds_since(t0);
    }
    res.stats = stats_;
    return res;
  }

  std::string no_plan_message() const {
    std::string msg =
        fmt::format("no plan for {} on {} fits ({} ranks, seq {}, {} candidates):", w_.model.name, hw_.name,
                    sp_.ranks, sp_.seq_len, stats_.space_size);
    for (const auto& [why, count] : stats_.infeasible) {
      msg += fmt::format("\n  {}: {} candidates", why, count);
      auto it = closest_.find(why);
      if (it != closest_.end()) msg += fmt::format("; closest: {}", it->second);
      if (why == std::string(reason::kGpuFabric))
        msg += fmt::format(" ({} has no GPU fabric; only replicated/cpu can run)", hw_.name);
    }
    return msg;
  }

  const Workload& w_;
  const Hardware& hw_;
  const SearchSpace& sp_;
  SearchOptions opt_;
  int top_k_;
  SearchStats stats_;
  std::vector<std::unique_ptr<WorkPatcher>> patchers_;          // per (shape, route, thread)
  std::vector<std::unique_ptr<WorkPatcher>> compute_patchers_;  // per shape
  std::vector<Scored> top_;                                     // sorted, at most top_k_
  std::map<std::string, double> miss_excess_;
  std::map<std::string, std::string> closest_;
  std::vector<Node> nodes_;
  std::priority_queue<QEntry, std::vector<QEntry>, std::greater<QEntry>> queue_;
  std::vector<std::unique_ptr<ThreadRelax>> thread_relax_;  // per (shape, route)
  StepWork work_;                                           // scratch work of the node being expanded
  std::unordered_map<int64_t, int> min_bad_keep_, min_bad_mb_;
  std::unordered_map<int64_t, double> family_best_;  // distinct families: best score per family so far
};

}  // namespace

double ranked_step_time_s(const Prediction& p) { return std::max(p.step_time_s, p.critical_path_s); }

int64_t SearchStats::infeasible_total() const {
  int64_t n = 0;
  for (const auto& [why, count] : infeasible) n += count;
  return n;
}

bool model_order(const Candidate& a, const Candidate& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.predicted.memory.gpu_peak_bytes != b.predicted.memory.gpu_peak_bytes)
    return a.predicted.memory.gpu_peak_bytes < b.predicted.memory.gpu_peak_bytes;
  return a.index < b.index;
}

SearchResult search_space(const Workload& w, const Hardware& hw, const SearchSpace& space,
                          const SearchOptions& options) {
  return Searcher(w, hw, space, options).run();
}

namespace {
SearchResult search_one_placement(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                                  const SearchOptions& options);
SearchResult search_placements(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                               const SearchOptions& options);
}  // namespace

namespace {

// One moment format's search: its best plans, or why none fits.
struct FormatSearch {
  OptimizerStates format;
  std::optional<SearchResult> found;
  std::string miss;  // the InfeasibleError's text when nothing fits
};

// The format taken, from the most to the least exact: each over the one before only where that one
// does not fit or it is at least kLossyStatesMinGain faster per token. Returns its index in
// `searches` and the explanation the planner prints (empty: fp32, and no lossy format came close).
std::pair<size_t, std::string> choose_states(const std::vector<FormatSearch>& searches) {
  std::optional<size_t> chosen;
  std::string why, misses;
  for (size_t i = 0; i < searches.size(); ++i) {
    const FormatSearch& f = searches[i];
    const char* name = optimizer_states_name(f.format);
    if (!f.found) {
      misses += fmt::format("{}{}: {}", misses.empty() ? "" : "; ", name, f.miss);
      continue;
    }
    if (!chosen) {
      chosen = i;
      if (f.format != OptimizerStates::kFp32)
        why = fmt::format("AdamW's moments in {} (allowed): no plan with more exact moments fits ({})", name,
                          misses);
      continue;
    }
    const SearchResult& held = *searches[*chosen].found;
    const double gain = 1.0 - f.found->best().final_score() / held.best().final_score();
    const char* held_name = optimizer_states_name(held.best().plan.optimizer_states);
    if (gain >= kLossyStatesMinGain) {
      why = fmt::format(
          "AdamW's moments in {} (allowed): {:.1f}% less time per token than the best plan with {} moments",
          name, 100 * gain, held_name);
      chosen = i;
    } else if (why.empty() || held.best().plan.optimizer_states == OptimizerStates::kFp32) {
      why += fmt::format("{}{} (allowed) would gain {:.1f}%",
                         why.empty() ? fmt::format("AdamW's moments in {}: ", held_name) : ", ", name,
                         100 * gain);
    }
  }
  SLIDEDP_CHECK(chosen.has_value(), "choose_states: no format fits");
  if (searches[*chosen].found->best().plan.optimizer_states == OptimizerStates::kFp32)
    why += fmt::format(", under the {:.0f}% that a lossy format must", 100 * kLossyStatesMinGain);
  return {*chosen, why};
}

}  // namespace

SearchResult search_plans(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                          const SearchOptions& options) {
  if (!spec.allow_lossy_states) return search_placements(w, hw, spec, options);
  std::vector<FormatSearch> searches;
  for (OptimizerStates format : {OptimizerStates::kFp32, OptimizerStates::kBf16, OptimizerStates::k8bit}) {
    SearchSpec one = spec;
    one.optimizer_states = format;
    FormatSearch& f = searches.emplace_back(FormatSearch{format, std::nullopt, ""});
    try {
      f.found = search_placements(w, hw, one, options);
    } catch (const InfeasibleError& e) {
      const bool any_fits = std::any_of(searches.begin(), searches.end(),
                                        [](const FormatSearch& s) { return s.found.has_value(); });
      if (format == OptimizerStates::k8bit && !any_fits) throw;  // nothing fits: the last format's error
      f.miss = e.what();
    }
  }
  auto [chosen, why] = choose_states(searches);
  SearchResult r = std::move(*searches[chosen].found);
  r.optimizer_states_reason = why;
  return r;
}

namespace {
SearchResult search_placements(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                               const SearchOptions& options) {
  // Several nodes: the host state's placement is one more choice; each is searched on its own and
  // the best plans of both are merged (the spaces are otherwise identical).
  std::vector<HostState> states = spec.host_states;
  if (states.empty()) states = spec.nodes > 1 ? std::vector<HostState>{HostState::kReplicated, HostState::kSharded}
                                              : std::vector<HostState>{HostState::kReplicated};
  if (states.size() == 1) {
    SearchSpec one = spec;
    one.host_states = states;
    return search_one_placement(w, hw, one, options);
  }
  std::optional<SearchResult> merged;
  std::optional<InfeasibleError> last_error;
  for (HostState hs : states) {
    SearchSpec one = spec;
    one.host_states = {hs};
    try {
      SearchResult r = search_one_placement(w, hw, one, options);
      r.space.notes.push_back(fmt::format("host state {}: {} candidates", host_state_name(hs), r.stats.space_size));
      if (!merged) {
        merged = std::move(r);
        continue;
      }
      for (Candidate& c : r.top) merged->top.push_back(std::move(c));
      merged->stats.space_size += r.stats.space_size;
      merged->stats.pruned += r.stats.pruned;
      merged->stats.evaluated += r.stats.evaluated;
      merged->stats.simulations += r.stats.simulations;
      merged->stats.simulations_too_large += r.stats.simulations_too_large;
      for (const auto& [k, v] : r.stats.infeasible) merged->stats.infeasible[k] += v;
      for (const std::string& n : r.space.notes) merged->space.notes.push_back(n);
    } catch (const InfeasibleError& e) {
      last_error = e;
    }
  }
  if (!merged) throw *last_error;
  std::stable_sort(merged->top.begin(), merged->top.end(),
                   [](const Candidate& a, const Candidate& b) { return a.final_score() < b.final_score(); });
  if (static_cast<int>(merged->top.size()) > options.top_k) merged->top.resize(static_cast<std::size_t>(options.top_k));
  return *merged;
}

SearchResult search_one_placement(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                                  const SearchOptions& options) {
  SearchSpace space = make_search_space(w, hw, spec);
  for (int64_t t : spec.mlp_token_tiles)
    if (t < 0) throw InputError("mlp_token_tiles", "tiles must be 0 (untiled) or a number of tokens");
  // Families whose units have no MLP token tile (Gemma 4, Qwen3.6) and mixture-of-experts layers:
  // untiled only.
  static const std::vector<int64_t> kUntiled = {0};
  const std::vector<int64_t>& tiles = !w.model.mlp_token_tiles() || w.model.moe() ? kUntiled
                                      : spec.mlp_token_tiles.empty()              ? kDefaultMlpTokenTiles
                                                                                  : spec.mlp_token_tiles;
  // Each tile only when nothing fit with the ones before: the space is the same, only the MLP's
  // memory (and its backward FLOPs) change. The last tile's infeasibility is what is reported.
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    space.mlp_token_tile = tiles[i];
    if (i > 0)
      space.notes.push_back(fmt::format("no plan fit with MLP token tile {}; searched again with {}", tiles[i - 1],
                                        tiles[i]));
    try {
      return search_space(w, hw, space, options);
    } catch (const InfeasibleError&) {
      if (i + 1 == tiles.size()) throw;
    }
  }
  SLIDEDP_CHECK(false, "search_plans: no MLP token tile to search");
  return {};
}
}  // namespace

}  // namespace slidedp::planner
