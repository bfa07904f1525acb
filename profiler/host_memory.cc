// Host-memory bandwidth stage; see host_memory.h. Copies are cut into 1 MiB tiles over a ThreadPool
// of the measured size (the caller is one of its threads), as the optimizer kernels are; the triad is
// kernels::stream_triad, the same code the optimizer benchmarks compare against.
#include "profiler/host_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/thread_pool.h"
#include "kernels/cpu/optim/triad.h"

namespace slidedp::profiler {
namespace {

constexpr int64_t kCopyTile = int64_t{1} << 20;
constexpr int64_t kDmaPiece = int64_t{64} << 10;
constexpr double kTriadBytesPerElem = 12.0;  // read b, c; write a (STREAM does not count write-allocate)

void parallel_copy(ThreadPool& pool, std::byte* dst, const std::byte* src, int64_t bytes) {
  pool.parallel_for_range(0, bytes, kCopyTile, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<std::size_t>(e - b));
  });
}

// Copy threads that run until stopped, counting the bytes they copied in 64 KiB pieces (a window of
// a few milliseconds is counted to within a piece per thread). The constructor returns once every
// thread has copied something, so no timed window starts before the copies do.
class DmaThreads {
 public:
  DmaThreads(int threads, int64_t bytes) {
    for (int i = 0; i < threads; ++i) {
      bufs_.emplace_back(bytes, 1);
      bufs_.emplace_back(bytes, 2);
    }
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, i, bytes] {
        std::byte* dst = bufs_[static_cast<std::size_t>(2 * i)].data();
        const std::byte* src = bufs_[static_cast<std::size_t>(2 * i + 1)].data();
        bool announced = false;
        while (!stop_.load(std::memory_order_relaxed)) {
          for (int64_t b = 0; b < bytes && !stop_.load(std::memory_order_relaxed); b += kDmaPiece) {
            const int64_t n = std::min(kDmaPiece, bytes - b);
            std::memcpy(dst + b, src + b, static_cast<std::size_t>(n));
            copied_.fetch_add(n, std::memory_order_relaxed);
            if (!announced) {
              started_.fetch_add(1);
              announced = true;
            }
          }
        }
      });
    }
    while (started_.load() < threads) std::this_thread::yield();
  }
  ~DmaThreads() {
    stop_.store(true);
    for (auto& t : workers_) t.join();
  }
  int64_t copied() const { return copied_.load(std::memory_order_relaxed); }

 private:
  std::vector<HostArray> bufs_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> copied_{0};
  std::atomic<int> started_{0};  // threads that have copied their first piece
};

}  // namespace

HostMemoryResult measure_host_memory(const HostMemoryOptions& o, StageContext& ctx) {
  const int64_t n = o.array_bytes / 4;  // fp32 elements per array
  const int64_t bytes = n * 4;
  HostArray a(bytes, 0), b(bytes, 0), c(bytes, 0);
  std::fill_n(b.as<float>(), n, 1.0f);
  std::fill_n(c.as<float>(), n, 2.0f);
  HostMemoryResult res;
  const double cases = static_cast<double>(o.threads.size() * 2 + o.contention.size());
  double done = 0;
  auto record = [&](const std::string& name, nlohmann::json params, std::vector<double> v) {
    return ctx.out.add({"host_memory", name, std::move(params), "GB/s", std::move(v)}).spread();
  };
  auto rates = [](std::vector<double> seconds, double moved) {
    for (double& s : seconds) s = moved / s / 1e9;
    return seconds;
  };

  for (int t : o.threads) {
    ThreadPool pool(t);
    HostMemoryResult::ByThreads row;
    row.threads = t;
    ctx.report(done / cases, fmt::format("copy, {} threads", t));
    std::vector<double> copy_s = repeat_timed(ctx.repeat, [&](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) parallel_copy(pool, a.data(), b.data(), bytes);
      return now_s() - t0;
    });
    row.copy_gbps = record("copy_gbps", {{"threads", t}, {"array_bytes", bytes}}, rates(copy_s, 2.0 * bytes));
    ++done;
    ctx.report(done / cases, fmt::format("triad, {} threads", t));
    std::vector<double> triad_s = repeat_timed(ctx.repeat, [&](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i)
        kernels::stream_triad(pool, a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n);
      return now_s() - t0;
    });
    row.triad_gbps = record("triad_gbps", {{"threads", t}, {"array_bytes", bytes}},
                            rates(triad_s, kTriadBytesPerElem * n));
    ++done;
    res.by_threads.push_back(row);
    for (auto [gbps, what] :
         {std::pair{row.copy_gbps.median, "copy"}, std::pair{row.triad_gbps.median, "triad"}}) {
      if (gbps > res.best_gbps) {
        res.best_gbps = gbps;
        res.best_case = fmt::format("{} with {} threads", what, t);
      }
    }
  }

  for (const HostMemoryOptions::Mix& mix : o.contention) {
    const int m = mix.dma_threads, t = mix.triad_threads;
    ctx.report(done / cases, fmt::format("triad ({} threads) under {} copy threads", t, m));
    ThreadPool pool(t);
    DmaThreads dma(m, bytes);
    // The same repetition policy, done by hand: each repetition reads the copy counter around it.
    std::vector<double> triad, copy, total;
    auto rep = [&](int inner) {
      const int64_t c0 = dma.copied();
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i)
        kernels::stream_triad(pool, a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n);
      const double dt = now_s() - t0;
      const double copied = static_cast<double>(dma.copied() - c0);
      return std::pair{kTriadBytesPerElem * static_cast<double>(n) * inner / dt / 1e9, copied / dt / 1e9};
    };
    const double warm_t0 = now_s();
    rep(1);
    const int inner = inner_for(ctx.repeat, now_s() - warm_t0);
    for (int r = 0; r < ctx.repeat.reps; ++r) {
      auto [tg, cg] = rep(inner);
      triad.push_back(tg);
      copy.push_back(cg);
      total.push_back(tg + 2.0 * cg);
    }
    nlohmann::json p = {{"dma_threads", m}, {"triad_threads", t}, {"array_bytes", bytes}};
    HostMemoryResult::Contention row;
    row.dma_threads = m;
    row.triad_threads = t;
    row.triad_gbps = record("triad_under_dma_gbps", p, triad);
    row.dma_gbps = record("dma_under_triad_gbps", p, copy);
    row.total_gbps = record("total_under_contention_gbps", p, total);
    res.contention.push_back(row);
    if (row.total_gbps.median > res.best_gbps) {
      res.best_gbps = row.total_gbps.median;
      res.best_case = fmt::format("triad with {} threads + {} memcpy threads", t, m);
    }
    ++done;
  }
  ctx.report(1.0, "");
  return res;
}

double estimate_host_memory_s(const HostMemoryOptions& o, const RepeatPolicy& rp, double copy_gbps) {
  const double bytes = static_cast<double>(o.array_bytes);
  const double per = std::max(rp.min_rep_s, 3.0 * bytes / (copy_gbps * 1e9));
  const double cases = static_cast<double>(o.threads.size() * 2 + o.contention.size());
  // + first touch of 3 arrays and 2 per copy thread.
  int dma = 0;
  for (const auto& m : o.contention) dma += m.dma_threads;
  const double setup = (3.0 + 2.0 * dma) * bytes / (copy_gbps * 1e9);
  return cases * (rp.reps + 1) * per + setup;
}

}  // namespace slidedp::profiler
