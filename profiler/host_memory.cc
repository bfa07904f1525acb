// Host-memory bandwidth stage; see host_memory.h. Copies are cut into 1 MiB tiles over a ThreadPool
// of the measured size (the caller is one of its threads), as the optimizer kernels are; the triad is
// kernels::stream_triad, the same code the optimizer benchmarks compare against. The cases run in the
// run's rounds (stats.h run_rounds), so the arrays and pools live in state the cases share.
#include "profiler/host_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "common/thread_pool.h"
#include "kernels/cpu/optim/stream_bandwidth.h"
#include "kernels/cpu/optim/triad.h"

namespace slidedp::profiler {
namespace {

constexpr int64_t kCopyTile = int64_t{1} << 20;
volatile unsigned char g_read_sink = 0;  // where the DRAM read's result goes, so it is computed
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

PreparedStage<HostMemoryResult> prepare_host_memory(const HostMemoryOptions& o, StageContext& ctx) {
  // What the cases touch, shared by them until the run ends: three arrays of the working set and a
  // pool per thread count.
  struct State {
    int64_t n = 0, bytes = 0;  // fp32 elements and bytes per array
    HostArray a, b, c;
    HostArray dram_src, dram_dst;  // the DRAM cases' buffers
    std::map<int, std::unique_ptr<ThreadPool>> pools;
    ThreadPool& pool(int t) {
      auto& p = pools[t];
      if (!p) p = std::make_unique<ThreadPool>(t);
      return *p;
    }
    void triad(ThreadPool& p, int inner) const {
      for (int i = 0; i < inner; ++i)
        kernels::stream_triad(p, a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n);
    }
  };
  auto st = std::make_shared<State>();
  st->n = o.array_bytes / 4;
  st->bytes = st->n * 4;
  const int64_t n = st->n, bytes = st->bytes;
  st->a = HostArray(bytes, 0);
  st->b = HostArray(bytes, 0);
  st->c = HostArray(bytes, 0);
  std::fill_n(st->b.as<float>(), n, 1.0f);
  std::fill_n(st->c.as<float>(), n, 2.0f);

  const int64_t dram = o.dram_bytes;
  if (dram > 0) {
    st->dram_src = HostArray(dram, 1);
    st->dram_dst = HostArray(dram, 0);
  }

  std::vector<Case> cases;
  for (int t : o.threads) {
    ThreadPool* p = &st->pool(t);
    cases.push_back(timed_case(fmt::format("copy, {} threads", t), ctx.repeat, [st, p](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) parallel_copy(*p, st->a.data(), st->b.data(), st->bytes);
      return std::vector<double>{now_s() - t0};
    }));
    cases.push_back(timed_case(fmt::format("triad, {} threads", t), ctx.repeat, [st, p](int inner) {
      const double t0 = now_s();
      st->triad(*p, inner);
      return std::vector<double>{now_s() - t0};
    }));
    if (dram <= 0) continue;
    cases.push_back(timed_case(fmt::format("DRAM read, {} threads", t), ctx.repeat, [st, p, dram](int inner) {
      const double t0 = now_s();
      unsigned char x = 0;
      for (int i = 0; i < inner; ++i) x ^= kernels::stream_read(*p, st->dram_src.data(), dram);
      g_read_sink = x;
      return std::vector<double>{now_s() - t0};
    }));
    cases.push_back(timed_case(fmt::format("DRAM write (non-temporal), {} threads", t), ctx.repeat, [st, p, dram](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) kernels::stream_write_nontemporal(*p, st->dram_dst.data(), dram, static_cast<unsigned char>(i));
      return std::vector<double>{now_s() - t0};
    }));
    cases.push_back(timed_case(fmt::format("DRAM copy, {} threads", t), ctx.repeat, [st, p, dram](int inner) {
      const double t0 = now_s();
      for (int i = 0; i < inner; ++i) kernels::stream_copy(*p, st->dram_dst.data(), st->dram_src.data(), dram);
      return std::vector<double>{now_s() - t0};
    }));
  }
  // Contention: the copy threads (and their buffers) exist only during their own case's repetitions
  // (started and stopped around each, so they never disturb the other cases), and the copy counter is
  // read around the triad's window. Outputs: triad GB/s, copies GB/s.
  for (const HostMemoryOptions::Mix& mix : o.contention) {
    const int m = mix.dma_threads;
    ThreadPool* p = &st->pool(mix.triad_threads);
    auto inner = std::make_shared<int>(1);
    auto rep = [st, p, m, inner] {
      DmaThreads dma(m, st->bytes);
      const int64_t c0 = dma.copied();
      const double t0 = now_s();
      st->triad(*p, *inner);
      const double dt = now_s() - t0;
      const double copied = static_cast<double>(dma.copied() - c0);
      return std::vector<double>{kTriadBytesPerElem * static_cast<double>(st->n) * *inner / dt / 1e9,
                                 copied / dt / 1e9};
    };
    Case cs;
    cs.label = fmt::format("triad ({} threads) under {} copy threads", mix.triad_threads, m);
    cs.warm = [rep, inner, policy = ctx.repeat] {
      const double t0 = now_s();
      rep();
      *inner = inner_for(policy, now_s() - t0);
    };
    cs.rep = rep;
    cases.push_back(cs);
  }

  PreparedStage<HostMemoryResult> stage;
  stage.cases = std::move(cases);
  stage.finish = [o, n, bytes, dram, &out = ctx.out](const CaseSamples& v) {
    HostMemoryResult res;
    res.dram_bytes = dram;
    auto record = [&](const std::string& name, nlohmann::json params, std::vector<double> values) {
      return out.add({"host_memory", name, std::move(params), "GB/s", std::move(values)}).spread();
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
      if (dram > 0) {
        const nlohmann::json p = {{"threads", t}, {"buffer_bytes", dram}};
        row.dram_read_gbps = record("dram_read_gbps", p, rates(v[i++][0], static_cast<double>(dram)));
        row.dram_write_gbps = record("dram_write_nontemporal_gbps", p, rates(v[i++][0], static_cast<double>(dram)));
        row.dram_copy_gbps = record("dram_copy_gbps", p, rates(v[i++][0], 2.0 * static_cast<double>(dram)));
      }
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
      const auto& both = v[i++];  // triad GB/s, copies GB/s
      std::vector<double> total;
      for (std::size_t k = 0; k < both[0].size(); ++k) total.push_back(both[0][k] + 2.0 * both[1][k]);
      nlohmann::json p = {
          {"dma_threads", mix.dma_threads}, {"triad_threads", mix.triad_threads}, {"array_bytes", bytes}};
      HostMemoryResult::Contention row;
      row.dma_threads = mix.dma_threads;
      row.triad_threads = mix.triad_threads;
      row.triad_gbps = record("triad_under_dma_gbps", p, both[0]);
      row.dma_gbps = record("dma_under_triad_gbps", p, both[1]);
      row.total_gbps = record("total_under_contention_gbps", p, total);
      res.contention.push_back(row);
      if (row.total_gbps.median > res.best_gbps) {
        res.best_gbps = row.total_gbps.median;
        res.best_case =
            fmt::format("triad with {} threads + {} memcpy threads", mix.triad_threads, mix.dma_threads);
      }
    }
    return res;
  };
  return stage;
}

double estimate_host_memory_s(const HostMemoryOptions& o, const RepeatPolicy& rp, double copy_gbps) {
  const double bytes = static_cast<double>(o.array_bytes);
  const double per = std::max(rp.min_rep_s, 3.0 * bytes / (copy_gbps * 1e9));
  const double cases = static_cast<double>(o.threads.size() * 2 + o.contention.size());
  // + first touch of 3 arrays and 2 per copy thread.
  int dma = 0;
  for (const auto& m : o.contention) dma += m.dma_threads;
  const double setup = (3.0 + 2.0 * dma) * bytes / (copy_gbps * 1e9);
  // The DRAM cases: read, write, copy (about 1, 1 and 2 buffers' traffic) per thread count.
  const double dram = static_cast<double>(o.dram_bytes);
  const double dram_per = std::max(rp.min_rep_s, 2.0 * dram / (copy_gbps * 1e9));
  const double dram_s = o.dram_bytes > 0 ? 3.0 * o.threads.size() * (rp.reps + 1) * dram_per + 2.0 * dram / (copy_gbps * 1e9) : 0.0;
  return cases * (rp.reps + 1) * per + setup + dram_s;
}

}  // namespace slidedp::profiler
