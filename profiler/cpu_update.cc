// CPU update and reduction stage; see cpu_update.h. One set of buffers (fp32 master, m, v, bf16
// mirror, the largest number of bf16 slots) is allocated once and held by the cases for the run's
// rounds (stats.h run_rounds); every case walks it chunk by chunk.
#include "profiler/cpu_update.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/bf16.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "model/copy_bytes.h"

namespace slidedp::profiler {
namespace {

// The reduction's rate is in bytes of the gradient the host reads: what the step model charges per
// element of a rank's gradient (model/copy_bytes.h), which is the bf16 the slots here hold.
double grad_bytes() {
  const double bytes = target_bytes_per_element(system_traits(System::kSlideDP), CopyKind::kGrad);
  SLIDEDP_CHECK(bytes == sizeof(bf16_bits),
                "the profiler's gradient slots are bf16; the step model charges other bytes");
  return bytes;
}

// Deterministic, well-scaled values (no denormals, no zeros in v): what a real gradient looks like
// to the arithmetic units.
void fill_values(float* p, int64_t n, float scale, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
}

}  // namespace

namespace {

// The buffers and pools every case walks, shared by the cases until the run ends.
struct CpuUpdateState {
  int64_t n = 0;
  HostArray param, m, v, mirror, out;  // fp32 master, moments; bf16 mirror; fp32 reduction output
  std::vector<HostArray> slot_bufs;    // bf16 gradient slots, (n,) each
  kernels::AdamwHyper hyper;
  int64_t table_chunk = 0;
  std::vector<const bf16_bits*> reduce_ptrs;  // the standalone reduction's slots
  std::vector<std::unique_ptr<ThreadPool>> pools;

  std::vector<const bf16_bits*> slot_ptrs(int count, int64_t offset) const {
    std::vector<const bf16_bits*> p;
    for (int s = 0; s < count; ++s)
      p.push_back(slot_bufs[static_cast<std::size_t>(s)].as<bf16_bits>() + offset);
    return p;
  }
  // One fused reduce + AdamW pass over all n elements, chunk by chunk, like the updater: one call
  // per chunk (slots, state and mirror offset to the chunk), each call parallel over the pool.
  void fused_pass(ThreadPool& pool, int slots, int64_t chunk) {
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      kernels::AdamwState st{param.as<float>() + b, m.as<float>() + b, v.as<float>() + b,
                             mirror.as<bf16_bits>() + b};
      std::vector<const bf16_bits*> ptrs = slot_ptrs(slots, b);
      kernels::GradSlots<bf16_bits> gs{std::span<const bf16_bits* const>(ptrs), 1.0f, nullptr};
      kernels::reduce_adamw_update(pool, st, gs, hyper, 0, e - b);
    }
  }

  // Every buffer at n = o.numel, filled with well-scaled values; the slots hold bf16 gradients.
  void allocate(const CpuUpdateOptions& o);
};

void CpuUpdateState::allocate(const CpuUpdateOptions& o) {
  n = o.numel;
  const int max_slots = std::max(*std::max_element(o.slots.begin(), o.slots.end()), o.reduce_slots);
  param = HostArray(n * 4, 0);
  m = HostArray(n * 4, 0);
  v = HostArray(n * 4, 0);
  mirror = HostArray(n * 2, 0);
  out = HostArray(n * 4, 0);
  fill_values(param.as<float>(), n, 0.1f, 1);
  fill_values(m.as<float>(), n, 1e-3f, 2);
  fill_values(v.as<float>(), n, 1e-6f, 3);
  for (int64_t i = 0; i < n; ++i) v.as<float>()[i] = std::abs(v.as<float>()[i]) + 1e-8f;
  {
    std::vector<float> tmp(static_cast<std::size_t>(n));
    for (int s = 0; s < max_slots; ++s) {
      fill_values(tmp.data(), n, 1e-2f, 10 + static_cast<uint64_t>(s));
      slot_bufs.emplace_back(n * 2, 0);
      kernels::f32_to_bf16(tmp.data(), slot_bufs.back().as<bf16_bits>(), n);
    }
  }
}

}  // namespace

PreparedStage<CpuUpdateResult> prepare_cpu_update(const CpuUpdateOptions& o, StageContext& ctx) {
  auto st = std::make_shared<CpuUpdateState>();
  const int64_t n = o.numel;
  st->allocate(o);
  st->hyper.lr = 1e-4;
  st->hyper.step = 10;
  auto passes = [&](std::string label, std::function<void()> pass) {
    return timed_case(std::move(label), ctx.repeat, [pass](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) pass();
      return std::vector<double>{now_s() - t0};
    });
  };

  const int64_t table_chunk = o.table_chunk_numel > 0 ? o.table_chunk_numel : o.chunk_numels.back();
  st->table_chunk = table_chunk;
  std::vector<int64_t> chunks = o.chunk_numels;  // AdamW by chunk size, the table's chunk among them
  if (std::find(chunks.begin(), chunks.end(), table_chunk) == chunks.end()) chunks.push_back(table_chunk);
  std::sort(chunks.begin(), chunks.end());
  st->reduce_ptrs = st->slot_ptrs(o.reduce_slots, 0);

  // ---- the cases ----
  std::vector<Case> cases;
  for (int t : o.threads) {
    st->pools.push_back(std::make_unique<ThreadPool>(t));
    ThreadPool* pool = st->pools.back().get();
    for (int64_t chunk : chunks)
      cases.push_back(passes(fmt::format("AdamW, {} threads, chunk {}", t, chunk),
                             [st, pool, chunk] { st->fused_pass(*pool, 1, chunk); }));
    for (int slots : o.slots)
      cases.push_back(passes(fmt::format("reduce + AdamW, {} threads, {} slots", t, slots),
                             [st, pool, slots] { st->fused_pass(*pool, slots, st->table_chunk); }));
    // Standalone N-way reduction (what accumulation over micro-steps runs).
    cases.push_back(passes(fmt::format("reduce {} slots, {} threads", o.reduce_slots, t), [st, pool] {
      const kernels::GradSlots<bf16_bits> gs{std::span<const bf16_bits* const>(st->reduce_ptrs), 1.0f,
                                             nullptr};
      for (int64_t b = 0; b < st->n; b += st->table_chunk)
        kernels::reduce_grads(*pool, gs, st->out.as<float>(), b, std::min(st->n, b + st->table_chunk));
    }));
  }
  // fp32 -> bf16 conversion on one thread (SlideFormer's per-load step, and the CPU backend's
  // gradient wire conversion).
  cases.push_back(passes("fp32 -> bf16 conversion, 1 thread", [st] {
    kernels::f32_to_bf16(st->param.as<float>(), st->mirror.as<bf16_bits>(), st->n);
  }));

  PreparedStage<CpuUpdateResult> stage;
  stage.cases = std::move(cases);
  stage.finish = [o, n, chunks, table_chunk, &out = ctx.out](const CaseSamples& vals) {
    CpuUpdateResult res;
    res.table_chunk_numel = table_chunk;
    res.reduce_slots = o.reduce_slots;
    // ---- results ----
    std::size_t i = 0;
    for (int t : o.threads) {
      CpuUpdateResult::ByThreads row;
      row.threads = t;
      for (int64_t chunk : chunks) {
        std::vector<double> r = vals[i++][0];
        for (double& x : r) x = static_cast<double>(n) / x;
        const Spread sp = out.add({"cpu_update",
                                   "adamw_params_per_s",
                                   {{"threads", t}, {"chunk_numel", chunk}, {"slots", 1}, {"numel", n}},
                                   "params/s",
                                   r})
                              .spread();
        if (chunk == table_chunk) row.adamw_params_per_s = sp;
      }
      // Slot sweep at the table chunk size: seconds per pass vs extra slots.
      std::vector<std::vector<double>> X;
      std::vector<double> y;
      for (int slots : o.slots) {
        const std::vector<double>& sec = vals[i++][0];
        out.add({"cpu_update",
                 "reduce_adamw_s",
                 {{"threads", t}, {"chunk_numel", table_chunk}, {"slots", slots}, {"numel", n}},
                 "s",
                 sec});
        X.push_back({1.0, static_cast<double>(slots - 1)});
        y.push_back(summarize(sec).median);
      }
      if (o.slots.size() >= 2) {
        LinearFit f = fit_nonnegative(X, y);
        row.slot_fit = f.quality;
        // slope = seconds per extra slot per pass = n x grad_bytes() / rate.
        row.reduce_gbps = f.coef[1] > 0 ? static_cast<double>(n) * grad_bytes() / f.coef[1] / 1e9 : 0.0;
      }
      std::vector<double> rs = vals[i++][0];
      for (double& x : rs) x = o.reduce_slots * grad_bytes() * static_cast<double>(n) / x / 1e9;
      row.reduce_standalone_gbps =
          out.add({"cpu_update",
                   "reduce_grads_gbps",
                   {{"threads", t}, {"slots", o.reduce_slots}, {"chunk_numel", table_chunk}, {"numel", n}},
                   "GB/s",
                   rs})
              .spread();
      if (row.reduce_gbps <= 0) row.reduce_gbps = row.reduce_standalone_gbps.median;
      res.by_threads.push_back(row);
    }
    std::vector<double> cs = vals[i++][0];
    for (double& x : cs) x = 4.0 * static_cast<double>(n) / x / 1e9;
    res.convert_gbps_per_thread =
        out.add({"cpu_update", "convert_gbps_per_thread", {{"threads", 1}, {"numel", n}}, "GB/s", cs})
            .spread();
    return res;
  };
  return stage;
}

double estimate_cpu_update_s(const CpuUpdateOptions& o, const RepeatPolicy& rp, double copy_gbps) {
  // A fused pass moves about 28 B/param plus 2 per extra slot, near memcpy speed on one thread.
  double total = 0;
  const double n = static_cast<double>(o.numel);
  auto pass = [&](double bytes_per) { return std::max(rp.min_rep_s, n * bytes_per / (copy_gbps * 1e9)); };
  for (std::size_t t = 0; t < o.threads.size(); ++t) {
    total += static_cast<double>(o.chunk_numels.size()) * (rp.reps + 1) * pass(28);
    for (int s : o.slots) total += (rp.reps + 1) * pass(28 + 2.0 * (s - 1));
    total += (rp.reps + 1) * pass(2.0 * o.reduce_slots + 8);
  }
  total += (rp.reps + 1) * pass(6);
  return total + n * (16 + 2.0 * 4) / (copy_gbps * 1e9) * 4;  // allocation, fill
}

}  // namespace slidedp::profiler
