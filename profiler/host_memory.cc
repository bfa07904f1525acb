// Host-memory bandwidth stage; see host_memory.h. Copies are cut into 1 MiB tiles over a ThreadPool
// of the measured size (the caller is one of its threads), as the optimizer kernels are; the triad is
// kernels::stream_triad, the same code the optimizer benchmarks compare against. Cases are repeated
// in interleaved rounds (stats.h).
#include "profiler/host_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
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
  std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto pool = [&](int t) -> ThreadPool& {
    auto& p = pools[t];
    if (!p) p = std::make_unique<ThreadPool>(t);
    return *p;
  };
  auto triad = [&](ThreadPool& p, int inner) {
    for (int i = 0; i < inner; ++i)
      kernels::stream_triad(p, a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n);
  };

  std::vector<Case> cases;
  for (int t : o.threads) {
    ThreadPool& p = pool(t);
    cases.push_back(timed_case(fmt::format("copy, {} threads", t), ctx.repeat, [&, t](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) parallel_copy(p, a.data(), b.data(), bytes);
      return std::vector<double>{now_s() - t0};
    }));
    cases.push_back(timed_case(fmt::format("triad, {} threads", t), ctx.repeat, [&](int inner) {
      const double t0 = now_s();
      triad(p, inner);
      return std::vector<double>{now_s() - t0};
    }));
  }
  // Contention: the copy threads run only during their own case's repetitions (started and stopped
  // around each, so they never disturb the other cases), and the copy counter is read around the
  // triad's window. Outputs: triad GB/s, copies GB/s.
  for (const HostMemoryOptions::Mix& mix : o.contention) {
    const int m = mix.dma_threads;
    ThreadPool& p = pool(mix.triad_threads);
    auto inner = std::make_shared<int>(1);
    auto rep = [&, m, inner] {
      DmaThreads dma(m, bytes);
      const int64_t c0 = dma.copied();
      const double t0 = now_s();
      triad(p, *inner);
      const double dt = now_s() - t0;
      const double copied = static_cast<double>(dma.copied() - c0);
      return std::vector<double>{kTriadBytesPerElem * static_cast<double>(n) * *inner / dt / 1e9,
                                 copied / dt / 1e9};
    };
    Case cs;
    cs.label = fmt::format("triad ({} threads) under {} copy threads", mix.triad_threads, m);
    cs.warm = [&, rep, inner] {
      const double t0 = now_s();
      rep();
      *inner = inner_for(ctx.repeat, now_s() - t0);
    };
    cs.rep = rep;
    cases.push_back(cs);
  }

  const auto v = run_interleaved(cases, ctx.repeat.reps, 11, ctx.progress);
  HostMemoryResult res;
  auto record = [&](const std::string& name, nlohmann::json params, std::vector<double> values) {
    return ctx.out.add({"host_memory", name, std::move(params), "GB/s", std::move(values)}).spread();
  };
  auto rates = [](std::vector<double> seconds, double moved) {
    for (double& x : seconds) x = moved / x / 1e9;
    return seconds;
  };
  std::size_t i = 0;
  for (int t : o.threads) {
    HostMemoryResult::ByThreads row;
    row.threads = t;
    row.copy_gbps =
        record("copy_gbps", {{"threads", t}, {"array_bytes", bytes}}, rates(v[i++][0], 2.0 * bytes));
    row.triad_gbps = record("triad_gbps", {{"threads", t}, {"array_bytes", bytes}},
                            rates(v[i++][0], kTriadBytesPerElem * static_cast<double>(n)));
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
    const auto& out = v[i++];
    std::vector<double> total;
    for (std::size_t k = 0; k < out[0].size(); ++k) total.push_back(out[0][k] + 2.0 * out[1][k]);
    nlohmann::json p = {
        {"dma_threads", mix.dma_threads}, {"triad_threads", mix.triad_threads}, {"array_bytes", bytes}};
    HostMemoryResult::Contention row;
    row.dma_threads = mix.dma_threads;
    row.triad_threads = mix.triad_threads;
    row.triad_gbps = record("triad_under_dma_gbps", p, out[0]);
    row.dma_gbps = record("dma_under_triad_gbps", p, out[1]);
    row.total_gbps = record("total_under_contention_gbps", p, total);
    res.contention.push_back(row);
    if (row.total_gbps.median > res.best_gbps) {
      res.best_gbps = row.total_gbps.median;
      res.best_case =
          fmt::format("triad with {} threads + {} memcpy threads", mix.triad_threads, mix.dma_threads);
    }
  }
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
