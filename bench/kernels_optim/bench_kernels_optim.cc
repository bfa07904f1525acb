// bench_kernels_optim: params/s and GB/s of the CPU optimizer kernels next to the host-memory
// roofline measured by this binary in the same run, at 16M, 64M and 256M elements (every buffer
// several times the last-level cache), on 1 and all threads. GB/s counts the bytes each kernel must
// move (reads + writes; write-allocate reads not counted), from the per-element splits in kBytes*
// below. The roofline of a kernel is the time DRAM needs for its bytes at this run's own probe rates
// (kernels/cpu/optim/stream_bandwidth.h, over buffers of the same size and thread count): the
// largest of reads / read GB/s, writes / non-temporal write GB/s and (reads + writes) / the faster of
// the copy and in-place update probes' GB/s (each moves reads and writes at once: the memory's shared
// limit for both, to separate buffers or in place as AdamW writes),
// and each kernel's "of roofline" is that time over its measured time. The STREAM triad is kept as one
// more kernel (its own roofline applies to it too). --summary_csv=PATH writes the summary with
// provenance (date, git revision, CPU, SIMD level).
//
//   build/bin/bench_kernels_optim [--sizes=16M,64M,256M] [--summary_csv=results/...csv]
//                                 [google benchmark flags, e.g. --benchmark_filter=adamw]
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/provenance.h"
#include "common/q8_block.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/q8_moments.h"
#include "kernels/cpu/optim/simd_level.h"
#include "kernels/cpu/optim/stream_bandwidth.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "kernels/cpu/optim/triad.h"

namespace slidedp::kernels {
namespace {

// Bytes per element each kernel must read and write.
struct Bytes {
  double read, write;
  double total() const { return read + write; }
};
constexpr Bytes kBytesRead{4, 0};                                   // the read probe over an fp32 array
constexpr Bytes kBytesWrite{0, 4};                                  // the non-temporal write probe
constexpr Bytes kBytesCopy{4, 4};                                   // the copy probe over fp32 arrays
constexpr Bytes kBytesTriad{4 + 4, 4};                              // b, c -> a
constexpr Bytes kBytesAdamwBf16Grad{4 + 2 + 4 + 4, 4 + 4 + 4 + 2};  // p g m v -> p m v mirror = 28
constexpr Bytes kBytesAdamwFp32Grad{4 + 4 + 4 + 4, 4 + 4 + 4 + 2};  // = 30
constexpr Bytes kBytesAdamwFp32GradNoMirror{4 + 4 + 4 + 4, 4 + 4 + 4};  // torch's work = 28
// The split master (common/split_master.h): mirror and remainder read and written in place of p and
// the mirror: mirror r g m v -> mirror r m v = 24.
constexpr Bytes kBytesAdamwSplitBf16Grad{2 + 2 + 2 + 4 + 4, 2 + 2 + 4 + 4};
// The split master with bf16 moments (stochastically rounded): mirror r g m v -> mirror r m v = 18.
constexpr Bytes kBytesAdamwSplitBf16Moments{2 + 2 + 2 + 2 + 2, 2 + 2 + 2 + 2};
// The split master with 8-bit moments: a byte each and two fp32 scales per block of 256, read and
// written: mirror r g m v -> mirror r m v = 14.06.
constexpr Bytes kBytesAdamwSplitQ8Moments{2 + 2 + 2 + 1 + 1 + 8.0 / kQ8Block, 2 + 2 + 1 + 1 + 8.0 / kQ8Block};
constexpr int kSlots = 4;                                               // ranks of the reduction cases
constexpr Bytes kBytesReduceBf16{2.0 * kSlots, 4};                      // N bf16 slots -> fp32 = 12
constexpr Bytes kBytesFusedBf16{4 + 2.0 * kSlots + 4 + 4, 4 + 4 + 4 + 2};  // = 34
constexpr Bytes kBytesToBf16{4, 2};
constexpr Bytes kBytesToF32{2, 4};
constexpr Bytes kBytesSumSquaresF32{4, 0};

// A host array, 2 MiB aligned with transparent huge pages requested (fewer TLB misses for every
// kernel alike, including the triad), first touched by the pool that will use it.
template <class T>
struct HostArray {
  T* data = nullptr;
  size_t bytes = 0;
  HostArray(ThreadPool& pool, int64_t n, T value) {
    constexpr size_t kAlign = size_t{2} << 20;
    bytes = (static_cast<size_t>(n) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    data = static_cast<T*>(std::aligned_alloc(kAlign, bytes));
    if (data == nullptr) throw std::bad_alloc();
    madvise(data, bytes, MADV_HUGEPAGE);  // advice only; failure just means 4 KiB pages
    pool.parallel_for_range(0, n, kTileNumel,
                            [&](int64_t b, int64_t e) { std::fill(data + b, data + e, value); });
  }
  ~HostArray() { std::free(data); }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
};

int all_threads() { return ThreadPool::available_cpus(); }

ThreadPool& pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// All buffers of one size, shared by every kernel so that runs of different kernels can be
// interleaved (--benchmark_enable_random_interleaving, which spreads machine-load changes evenly over
// the triad and the kernels) without re-allocating. Reallocated only when the size changes, so run
// one size per invocation when interleaving (scripts/bench_kernels_optim.sh does). Values keep every
// kernel on its common path (normal numbers, no NaN, no subnormals) however often they run: the
// triad writes g32 = m + v / 2, reductions write g32 from the slots, AdamW keeps m ~ g and v ~ g^2.
struct Workspace {
  int64_t n = -1;
  std::unique_ptr<HostArray<float>> p, m, v, g32;     // (n,) fp32: master, moments, fp32 grad/output
  std::vector<std::unique_ptr<HostArray<bf16_bits>>> slot;  // kSlots x (n,) bf16 per-rank gradients
  std::unique_ptr<HostArray<bf16_bits>> mirror;       // (n,) bf16 delivery mirror
  std::unique_ptr<HostArray<uint16_t>> remainder;     // (n,) split master's low halves (with `mirror`)
  std::unique_ptr<HostArray<bf16_bits>> m16, v16;     // (n,) bf16 moments
  std::unique_ptr<HostArray<uint8_t>> m8, v8;         // (n,) 8-bit moments' codes
  std::unique_ptr<HostArray<float>> m_scale, v_scale;  // (n / 256,) their blocks' scales
  std::vector<const bf16_bits*> slot_ptrs;

  AdamwState state(bool with_mirror) const {
    return AdamwState{p->data, m->data, v->data, with_mirror ? mirror->data : nullptr};
  }
  AdamwState split_state() const {
    AdamwState s{nullptr, m->data, v->data, mirror->data};
    s.remainder = remainder->data;
    return s;
  }
  AdamwState split_bf16_moments_state() const {
    AdamwState s{nullptr, nullptr, nullptr, mirror->data};
    s.remainder = remainder->data;
    s.exp_avg_bf16 = m16->data;
    s.exp_avg_sq_bf16 = v16->data;
    s.m_seed = 1, s.v_seed = 2;
    return s;
  }
  AdamwState split_q8_moments_state() const {
    AdamwState s{nullptr, nullptr, nullptr, mirror->data};
    s.remainder = remainder->data;
    s.exp_avg_q8 = m8->data, s.exp_avg_sq_q8 = v8->data;
    s.exp_avg_scale = m_scale->data, s.exp_avg_sq_scale = v_scale->data;
    return s;
  }
};

Workspace& workspace(int64_t n) {
  static Workspace ws;
  if (ws.n != n) {
    ws = Workspace{};
    ThreadPool& pool = pool_of(all_threads());
    ws.p = std::make_unique<HostArray<float>>(pool, n, 0.5f);
    ws.m = std::make_unique<HostArray<float>>(pool, n, 0.01f);
    ws.v = std::make_unique<HostArray<float>>(pool, n, 1e-4f);
    ws.g32 = std::make_unique<HostArray<float>>(pool, n, 0.02f);
    for (int k = 0; k < kSlots; ++k) {
      ws.slot.push_back(
          std::make_unique<HostArray<bf16_bits>>(pool, n, float_to_bf16(0.01f * static_cast<float>(k + 1))));
      ws.slot_ptrs.push_back(ws.slot.back()->data);
    }
    ws.mirror = std::make_unique<HostArray<bf16_bits>>(pool, n, bf16_bits{0});
    ws.remainder = std::make_unique<HostArray<uint16_t>>(pool, n, uint16_t{0});
    ws.m16 = std::make_unique<HostArray<bf16_bits>>(pool, n, float_to_bf16(0.01f));
    ws.v16 = std::make_unique<HostArray<bf16_bits>>(pool, n, float_to_bf16(1e-4f));
    // Codes of 1.0 (moment_codes.h) with scales 0.01 and 1e-4: m ~ g and v ~ g^2 as above.
    ws.m8 = std::make_unique<HostArray<uint8_t>>(pool, n, uint8_t{120});
    ws.v8 = std::make_unique<HostArray<uint8_t>>(pool, n, uint8_t{248});
    ws.m_scale = std::make_unique<HostArray<float>>(pool, q8_blocks(n), 0.01f);
    ws.v_scale = std::make_unique<HostArray<float>>(pool, q8_blocks(n), 1e-4f);
    ws.n = n;
  }
  return ws;
}

struct Case {
  std::string kernel;
  Bytes bytes;
  int order;  // registration order: the summary lists rows in it, whatever order they ran in
};
std::map<std::string, Case> g_cases;  // benchmark name -> case

void set_counters(benchmark::State& state, int64_t n, Bytes bytes) {
  const double bytes_per_element = bytes.total();
  const double elements = static_cast<double>(n) * static_cast<double>(state.iterations());
  state.counters["params_per_s"] = benchmark::Counter(elements, benchmark::Counter::kIsRate);
  state.counters["bytes_per_s"] = benchmark::Counter(elements * bytes_per_element, benchmark::Counter::kIsRate,
                                                     benchmark::Counter::kIs1000);
}

AdamwHyper bench_hyper() {
  AdamwHyper h;
  h.lr = 1e-4;
  h.step = 10;
  return h;
}

// Runs `call` as the timed body and reports the counters of `bytes` per element.
template <class Call>
void run(benchmark::State& state, int64_t n, Bytes bytes, const Call& call) {
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  set_counters(state, n, bytes);
}

void bench_read(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  unsigned char x = 0;
  run(state, n, kBytesRead, [&] {
    x ^= stream_read(pool, w.m->data, n * 4);
    benchmark::DoNotOptimize(x);
  });
}

// Writes the fp32 output buffer the triad and the reductions write (their values do not matter to
// the kernels that read it next: the triad and reductions overwrite it, AdamW's fp32-gradient cases
// read it, and 0x3C bytes are 0.0115 as fp32, a normal gradient).
void bench_write(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesWrite, [&] { stream_write_nontemporal(pool, w.g32->data, n * 4, 0x3C); });
}

void bench_copy(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesCopy, [&] { stream_copy(pool, w.g32->data, w.m->data, n * 4); });
}

// XOR 0x01 into every byte of the fp32 output buffer: applied an odd or even number of times it
// leaves each float finite and positive (it toggles bit 1 of the exponent and low mantissa bits),
// so AdamW's fp32-gradient cases still read normal gradients.
void bench_update(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesCopy, [&] { stream_update(pool, w.g32->data, n * 4, 0x01); });
}

void bench_triad(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesTriad, [&] { stream_triad(pool, w.g32->data, w.m->data, w.v->data, 0.5f, n); });
}

void bench_adamw_bf16(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesAdamwBf16Grad,
      [&] { adamw_update(pool, w.state(true), w.slot[0]->data, bench_hyper(), 0, n); });
}

// The mirror holds whatever the other AdamW cases left (0 or values near 0.5): a normal master either
// way, as the remainder is 0 at first.
void bench_adamw_split(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesAdamwSplitBf16Grad,
      [&] { adamw_update(pool, w.split_state(), w.slot[0]->data, bench_hyper(), 0, n); });
}

void bench_adamw_split_bf16_moments(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesAdamwSplitBf16Moments,
      [&] { adamw_update(pool, w.split_bf16_moments_state(), w.slot[0]->data, bench_hyper(), 0, n); });
}

void bench_adamw_split_q8_moments(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesAdamwSplitQ8Moments,
      [&] { adamw_update(pool, w.split_q8_moments_state(), w.slot[0]->data, bench_hyper(), 0, n); });
}

void bench_adamw_fp32(benchmark::State& state, int64_t n, int threads, bool mirror) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, mirror ? kBytesAdamwFp32Grad : kBytesAdamwFp32GradNoMirror,
      [&] { adamw_update(pool, w.state(mirror), w.g32->data, bench_hyper(), 0, n); });
}

void bench_reduce_bf16(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesReduceBf16,
      [&] { reduce_grads(pool, GradSlots<bf16_bits>{w.slot_ptrs, 0.25f, nullptr}, w.g32->data, 0, n); });
}

void bench_fused_bf16(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesFusedBf16, [&] {
    reduce_adamw_update(pool, w.state(true), GradSlots<bf16_bits>{w.slot_ptrs, 0.25f, nullptr}, bench_hyper(),
                        0, n);
  });
}

void bench_to_bf16(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesToBf16, [&] { f32_to_bf16(pool, w.p->data, w.mirror->data, n); });
}

void bench_to_f32(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  run(state, n, kBytesToF32, [&] { bf16_to_f32(pool, w.slot[0]->data, w.g32->data, n); });
}

void bench_sum_squares(benchmark::State& state, int64_t n, int threads) {
  Workspace& w = workspace(n);
  ThreadPool& pool = pool_of(threads);
  double total = 0;
  run(state, n, kBytesSumSquaresF32, [&] {
    total += sum_squares(pool, w.g32->data, n);
    benchmark::DoNotOptimize(total);
  });
}

std::string size_label(int64_t n) {
  if (n % (int64_t{1} << 20) == 0) return std::to_string(n >> 20) + "M";
  return std::to_string(n);
}

void register_all(const std::vector<int64_t>& sizes) {
  std::vector<int> thread_counts = {1};
  if (all_threads() > 1) thread_counts.push_back(all_threads());
  using Fn = void (*)(benchmark::State&, int64_t, int);
  struct Kernel {
    const char* name;
    Bytes bytes;
    Fn fn;
  };
  const Kernel kernels[] = {
      {"read", kBytesRead, bench_read},
      {"write_nontemporal", kBytesWrite, bench_write},
      {"copy", kBytesCopy, bench_copy},
      {"update_inplace", kBytesCopy, bench_update},
      {"triad", kBytesTriad, bench_triad},
      {"adamw_bf16grad_mirror", kBytesAdamwBf16Grad, bench_adamw_bf16},
      {"adamw_bf16grad_split_master", kBytesAdamwSplitBf16Grad, bench_adamw_split},
      {"adamw_bf16grad_split_bf16_moments", kBytesAdamwSplitBf16Moments, bench_adamw_split_bf16_moments},
      {"adamw_bf16grad_split_8bit_moments", kBytesAdamwSplitQ8Moments, bench_adamw_split_q8_moments},
      {"adamw_fp32grad_mirror", kBytesAdamwFp32Grad,
       [](benchmark::State& s, int64_t n, int t) { bench_adamw_fp32(s, n, t, true); }},
      {"adamw_fp32grad_nomirror", kBytesAdamwFp32GradNoMirror,
       [](benchmark::State& s, int64_t n, int t) { bench_adamw_fp32(s, n, t, false); }},
      {"reduce_4xbf16", kBytesReduceBf16, bench_reduce_bf16},
      {"fused_reduce_4xbf16_adamw", kBytesFusedBf16, bench_fused_bf16},
      {"f32_to_bf16", kBytesToBf16, bench_to_bf16},
      {"bf16_to_f32", kBytesToF32, bench_to_f32},
      {"sum_squares_f32", kBytesSumSquaresF32, bench_sum_squares},
  };
  for (int64_t n : sizes) {
    for (const Kernel& k : kernels) {
      for (int t : thread_counts) {
        const std::string name = std::string(k.name) + "/" + size_label(n) + "/threads:" + std::to_string(t);
        g_cases[name] = Case{k.name, k.bytes, static_cast<int>(g_cases.size())};
        Fn fn = k.fn;
        benchmark::RegisterBenchmark(name.c_str(), [fn, n, t](benchmark::State& s) { fn(s, n, t); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// Console output as usual, plus the roofline summary at the end (and optionally a CSV of it).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  // Colors only on a terminal, so logs piped to a file stay plain text.
  explicit SummaryReporter(std::string csv_path)
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular), csv_path_(std::move(csv_path)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      auto it = g_cases.find(r.run_name.function_name);
      if (it == g_cases.end()) continue;
      Row& row = rows_[r.run_name.function_name];
      if (row.from_median && !median) continue;
      row.from_median = median;
      row.seconds = median ? r.GetAdjustedRealTime() / 1e3  // milliseconds per iteration
                           : r.real_accumulated_time / static_cast<double>(r.iterations);
      if (order_.empty() || order_.back() != r.run_name.function_name) {
        if (std::find(order_.begin(), order_.end(), r.run_name.function_name) == order_.end()) {
          order_.push_back(r.run_name.function_name);
        }
      }
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    const Provenance& prov = provenance();
    const std::string date = utc_timestamp();
    std::FILE* out = stdout;
    std::fprintf(out, "\nRoofline summary (%s, simd %s, %s)\n", prov.cpu_model.c_str(),
                 simd_description().c_str(), date.c_str());
    std::fprintf(out, "%-28s %6s %7s %8s %12s %9s %12s %11s\n", "kernel", "size", "threads", "B/elem",
                 "Gparams/s", "GB/s", "roofline G/s", "of roofline");
    std::fprintf(out, "%-28s %6s %7s %8s\n", "", "", "", "(r+w)");
    std::string csv =
        "date_utc,git_revision,host,cpu_model,simd,kernel,numel,threads,read_bytes_per_element,"
        "write_bytes_per_element,seconds_per_call,params_per_s,gb_per_s,dram_read_gb_per_s,"
        "dram_write_gb_per_s,dram_copy_gb_per_s,dram_update_gb_per_s,roofline_params_per_s,fraction_of_roofline\n";
    std::sort(order_.begin(), order_.end(),
              [](const std::string& a, const std::string& b) { return g_cases.at(a).order < g_cases.at(b).order; });
    for (const std::string& name : order_) {
      const Case& c = g_cases.at(name);
      const Row& row = rows_.at(name);
      // name = kernel/size/threads:T
      const size_t a = name.find('/'), b = name.rfind("/threads:");
      const std::string size = name.substr(a + 1, b - a - 1);
      const std::string threads = name.substr(b + 9);
      const int64_t numel = parse_size(size);
      const double params_per_s = static_cast<double>(numel) / row.seconds;
      const double gbps = params_per_s * c.bytes.total() / 1e9;
      // This run's DRAM rates at the same size and thread count (GB/s; 0 when a probe was filtered out).
      auto probe = [&](const char* kernel, double bytes_per_element) {
        auto t = rows_.find(std::string(kernel) + "/" + size + "/threads:" + threads);
        return t == rows_.end() ? 0.0 : static_cast<double>(numel) / t->second.seconds * bytes_per_element / 1e9;
      };
      const double read_gbps = probe("read", kBytesRead.read), write_gbps = probe("write_nontemporal", kBytesWrite.write);
      const double copy_gbps = probe("copy", kBytesCopy.total());
      const double update_gbps = probe("update_inplace", kBytesCopy.total());
      const double mixed_gbps = std::max(copy_gbps, update_gbps);
      double roofline = 0;  // params/s
      if ((c.bytes.read == 0 || read_gbps > 0) && (c.bytes.write == 0 || write_gbps > 0) && mixed_gbps > 0) {
        const double s_per_param = std::max({c.bytes.read > 0 ? c.bytes.read / (read_gbps * 1e9) : 0.0,
                                             c.bytes.write > 0 ? c.bytes.write / (write_gbps * 1e9) : 0.0,
                                             c.bytes.total() / (mixed_gbps * 1e9)});
        roofline = s_per_param > 0 ? 1.0 / s_per_param : 0.0;
      }
      const double frac = roofline > 0 ? params_per_s / roofline : 0.0;
      std::fprintf(out, "%-28s %6s %7s %4.0f+%-3.0f %12.3f %9.1f %12.3f %10.0f%%\n", c.kernel.c_str(), size.c_str(),
                   threads.c_str(), c.bytes.read, c.bytes.write, params_per_s / 1e9, gbps, roofline / 1e9, 100 * frac);
      char line[1024];
      std::snprintf(line, sizeof(line), "%s,%s,%s,\"%s\",%s,%s,%lld,%s,%.0f,%.0f,%.6g,%.6g,%.4g,%.4g,%.4g,%.4g,%.4g,%.6g,%.4f\n",
                    date.c_str(), prov.git_revision.c_str(), prov.host.c_str(), prov.cpu_model.c_str(),
                    simd_description().c_str(), c.kernel.c_str(), static_cast<long long>(numel), threads.c_str(),
                    c.bytes.read, c.bytes.write, row.seconds, params_per_s, gbps, read_gbps, write_gbps, copy_gbps, update_gbps, roofline, frac);
      csv += line;
    }
    if (!csv_path_.empty()) {
      std::ofstream f(csv_path_);
      f << csv;
      if (!f) {
        std::fprintf(stderr, "bench_kernels_optim: cannot write %s\n", csv_path_.c_str());
      } else {
        std::fprintf(out, "summary written to %s\n", csv_path_.c_str());
      }
    }
  }

  static int64_t parse_size(const std::string& s) {
    if (!s.empty() && s.back() == 'M') return std::stoll(s.substr(0, s.size() - 1)) << 20;
    return std::stoll(s);
  }

 private:
  struct Row {
    double seconds = 0;  // real time of one call
    bool from_median = false;
  };
  std::string csv_path_;
  std::map<std::string, Row> rows_;
  std::vector<std::string> order_;
};

}  // namespace
}  // namespace slidedp::kernels

int main(int argc, char** argv) {
  using namespace slidedp::kernels;
  std::vector<int64_t> sizes = {int64_t{16} << 20, int64_t{64} << 20, int64_t{256} << 20};
  std::string csv_path;
  // Our flags first; the rest goes to Google Benchmark.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--summary_csv=", 0) == 0) {
      csv_path = arg.substr(14);
    } else if (arg.rfind("--sizes=", 0) == 0) {
      sizes.clear();
      std::string list = arg.substr(8);
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string item = list.substr(pos, comma - pos);
        if (!item.empty()) sizes.push_back(SummaryReporter::parse_size(item));
        pos = comma + 1;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 1;
  const slidedp::Provenance& prov = slidedp::provenance();
  benchmark::AddCustomContext("slidedp_git_revision", prov.git_revision);
  benchmark::AddCustomContext("slidedp_build_type", prov.build_type);
  benchmark::AddCustomContext("slidedp_simd", simd_description());
  benchmark::AddCustomContext("slidedp_all_threads", std::to_string(all_threads()));
  benchmark::AddCustomContext("cpu_model", prov.cpu_model);
  register_all(sizes);
  SummaryReporter reporter(csv_path);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
