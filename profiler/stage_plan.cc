// Stage sizes per scale and the option checks; see stage_plan.h.
#include "profiler/stage_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "common/error.h"
#include "common/thread_pool.h"

namespace slidedp::profiler {
namespace {

constexpr int64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

std::vector<int64_t> geometric(int64_t from, int64_t to, int64_t factor) {
  std::vector<int64_t> v;
  for (int64_t s = from; s <= to; s *= factor) v.push_back(s);
  return v;
}

}  // namespace

StagePlan plan_for(const ProfileOptions& o, int cores, const std::vector<int>& threads, int64_t llc,
                   int64_t model_params) {
  StagePlan p;
  const int ranks = o.ranks;
  std::set<int> dma{1, std::min(ranks, cores)};
  auto mixes = [&] {
    std::vector<HostMemoryOptions::Mix> m;
    for (int d : dma) m.push_back({d, std::max(1, cores - d)});
    return m;
  };
  p.host.threads = threads;
  p.update.threads = threads;
  p.update.reduce_slots = std::max(2, ranks);
  p.units.micro_batches = o.micro_batches;
  p.units.seq_lens = {o.seq_len};
  switch (o.scale) {
    case ProfileScale::kSmoke:
      p.repeat = {2, 0.002, 64};
      p.host.array_bytes = 1 * MiB;
      p.host.dram_bytes = 1 * MiB;
      p.host.contention = {{1, 1}};
      p.update.numel = 64 * KiB;
      p.update.chunk_numels = {16 * KiB, 64 * KiB};
      p.update.slots = {1, 2};
      p.links.sizes = {64 * KiB, 256 * KiB};
      p.links.region_bytes = 1 * MiB;
      p.links.collective_sizes = {64 * KiB, 256 * KiB};
      p.units.seq_lens = {std::min<int64_t>(o.seq_len, 16)};
      p.units.micro_batches = {1, 2};
      p.sgemm_n = 128;
      p.gpu.sizes = {64 * KiB, 1 * MiB};
      p.gpu.collective_sizes = {64 * KiB, 1 * MiB};
      p.gpu.pageable_bytes = 1 * MiB;
      p.gpu.gemm_n = 1024;
      p.gpu.hbm_bytes = 16 * MiB;
      break;
    case ProfileScale::kQuick:
      p.repeat = {3, 0.02, 1 << 14};
      p.host.array_bytes = std::max(64 * MiB, 2 * llc);
      p.host.dram_bytes = std::max(256 * MiB, 8 * llc);
      p.host.contention = mixes();
      p.host.contention.resize(1);
      p.update.numel = 8 * MiB;
      p.update.chunk_numels = {1 * MiB, 8 * MiB};
      p.update.slots = {1, 2, 4};
      p.links.sizes = {64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB};
      p.links.region_bytes = std::max(64 * MiB, 2 * llc);
      p.links.collective_sizes = {1 * MiB, 16 * MiB, 64 * MiB};
      p.sgemm_n = 1024;
      p.gpu.sizes = {64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB};
      p.gpu.collective_sizes = {1 * MiB, 16 * MiB, 256 * MiB};
      p.gpu.gemm_n = 4096;
      p.gpu.hbm_bytes = 256 * MiB;
      break;
    case ProfileScale::kFull:
      p.repeat = {5, 0.05, 1 << 14};
      p.host.array_bytes = std::max(256 * MiB, 8 * llc);
      p.host.dram_bytes = p.host.array_bytes;
      p.host.contention = mixes();
      p.update.numel = 32 * MiB;
      p.update.chunk_numels = {64 * KiB, 1 * MiB, 32 * MiB};
      p.update.slots = {1, 2, 4, 8};
      p.links.sizes = geometric(64 * KiB, 256 * MiB, 4);
      p.links.region_bytes = std::max(256 * MiB, 4 * llc);
      p.links.collective_sizes = geometric(64 * KiB, 256 * MiB, 4);
      // The context term needs a second sequence length; half of T keeps the cost down.
      if (o.seq_len >= 32) p.units.seq_lens = {o.seq_len / 2, o.seq_len};
      p.sgemm_n = 2048;
      p.gpu.sizes = geometric(64 * KiB, 1 * GiB, 4);
      p.gpu.collective_sizes = geometric(64 * KiB, 1 * GiB, 4);
      break;
  }
  if (o.reps > 0) p.repeat.reps = o.reps;

  // Working sets follow the model's host state when it is smaller than the DRAM-sized defaults: the
  // executor's copies, reductions and updates of a small model run in the cache, and the profile
  // should say how fast that is. Large models are unaffected (their state exceeds the defaults).
  if (o.model_working_set && o.scale != ProfileScale::kSmoke) {
    const int64_t P = model_params;
    p.host.array_bytes = std::min(p.host.array_bytes, std::max(1 * MiB, P * 4));  // fp32 master-sized
    p.update.numel = std::min(p.update.numel, std::max(64 * KiB, P));
    const int64_t region = std::min(p.links.region_bytes, std::max(256 * KiB, P * 2));  // bf16 mirror
    if (region < p.links.region_bytes) {
      p.links.region_bytes = region;
      p.links.sizes = geometric(16 * KiB, region, 4);
      if (p.links.sizes.back() != region) p.links.sizes.push_back(region);
      p.links.collective_sizes = p.links.sizes;
    }
  }
  // The written tables are for the plan's chunk size (default: the plan default), within the update.
  const int64_t chunk = std::min(o.chunk_numel > 0 ? o.chunk_numel : 32 * MiB, p.update.numel);
  std::vector<int64_t> chunks;
  for (int64_t c : p.update.chunk_numels)
    if (c < p.update.numel) chunks.push_back(c);
  chunks.push_back(p.update.numel);
  p.update.chunk_numels = chunks;
  p.update.table_chunk_numel = chunk;
  return p;
}

void check_options(const ProfileOptions& o) {
  if (o.seq_len < 1 || o.seq_len > (int64_t{1} << 20)) throw InputError("--seq", "must be in [1, 1048576]");
  if (o.models.empty()) throw InputError("--model", "needs at least one model");
  if (o.chunk_numel < 0) throw InputError("--chunk-numel", "must be positive");
  if (o.micro_batches.empty()) throw InputError("--micro-batches", "needs at least one micro-batch size");
  for (int64_t b : o.micro_batches)
    if (b < 1 || b > 4096) throw InputError("--micro-batches", fmt::format("{} is not in [1, 4096]", b));
  if (o.ranks < 1 || o.ranks > 64) throw InputError("--ranks", "must be in [1, 64]");
  for (int t : o.threads)
    if (t < 1 || t > ThreadPool::kMaxThreads)
      throw InputError("--threads", fmt::format("{} is not a thread count", t));
  if (o.reps < 0 || o.reps > 1000) throw InputError("--reps", "must be in [0, 1000]");
  if (o.kernels && o.cpu_backend)
    throw InputError("--kernels", "times the GPU's kernels (CUPTI); the CPU backend (--cpu-backend) has none");
  for (const ModelCard& c : o.models)
    if (c.max_position_embeddings > 0 && o.seq_len > c.max_position_embeddings)
      throw InputError("--seq", fmt::format("{} exceeds {}'s max_position_embeddings ({})", o.seq_len, c.name,
                                            c.max_position_embeddings));
}

std::vector<int> default_thread_counts(int cores) {
  std::vector<int> t;
  for (int c = 1; c < cores; c *= 2) t.push_back(c);
  t.push_back(cores);
  return t;
}

NetworkPlan network_plan(const ProfileOptions& o) {
  NetworkPlan p;
  p.reps = o.reps > 0 ? o.reps : o.scale == ProfileScale::kSmoke ? 2 : o.scale == ProfileScale::kQuick ? 3 : 5;
  p.latency_round_trips = o.scale == ProfileScale::kSmoke ? 20 : 200;
  p.sizes = o.scale == ProfileScale::kSmoke   ? std::vector<int64_t>{int64_t{1} << 16, int64_t{1} << 20}
            : o.scale == ProfileScale::kQuick ? std::vector<int64_t>{int64_t{1} << 20, int64_t{16} << 20}
                                              : std::vector<int64_t>{int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20};
  return p;
}

}  // namespace slidedp::profiler
