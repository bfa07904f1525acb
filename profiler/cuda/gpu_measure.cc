// The GPU measurements of gpu.h with the CUDA runtime, NCCL and cuBLAS (built with
// SLIDEDP_ENABLE_CUDA only). Host API calls only, no device code, so the file is plain C++ that links
// the CUDA libraries. Copies and collectives are timed with CUDA events around K back-to-back
// operations per stream, all participants queued before the first synchronization, so "all" and
// "bidir" cases overlap on the hardware. Every measurement is a case of the run's rounds (stats.h
// run_rounds), so its repetitions span the whole run like the host stages'. Every CUDA / NCCL / cuBLAS call goes through the project's one
// check (SLIDEDP_CUDA_CHECK: RuntimeError with the call, the library's error and the location).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/shard_exchange.h"
#include "profiler/gpu.h"

namespace slidedp::profiler {
namespace {

// Owning wrappers, so an exception mid-measurement frees what was allocated.
struct DeviceMem {
  int device = 0;
  void* p = nullptr;
  DeviceMem(int dev, int64_t bytes) : device(dev) {
    SLIDEDP_CUDA_CHECK(cudaSetDevice(dev));
    SLIDEDP_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(std::max<int64_t>(bytes, 256))));
    SLIDEDP_CUDA_CHECK(cudaMemset(p, 0, static_cast<std::size_t>(std::max<int64_t>(bytes, 256))));
    // The memset runs on the legacy stream, which the non-blocking measurement streams do not wait for.
    SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  ~DeviceMem() {
    cudaSetDevice(device);
    cudaFree(p);
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  std::byte* b() const { return static_cast<std::byte*>(p); }
};
struct PinnedMem {
  void* p = nullptr;
  explicit PinnedMem(int64_t bytes) {
    SLIDEDP_CUDA_CHECK(
        cudaHostAlloc(&p, static_cast<std::size_t>(std::max<int64_t>(bytes, 256)), cudaHostAllocPortable));
    std::memset(p, 1, static_cast<std::size_t>(std::max<int64_t>(bytes, 256)));
  }
  ~PinnedMem() { cudaFreeHost(p); }
  PinnedMem(const PinnedMem&) = delete;
  PinnedMem& operator=(const PinnedMem&) = delete;
  std::byte* b() const { return static_cast<std::byte*>(p); }
};
struct StreamPair {
  int device = 0;
  cudaStream_t s = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  explicit StreamPair(int dev) : device(dev) {
    SLIDEDP_CUDA_CHECK(cudaSetDevice(dev));
    SLIDEDP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    SLIDEDP_CUDA_CHECK(cudaEventCreate(&start));
    SLIDEDP_CUDA_CHECK(cudaEventCreate(&end));
  }
  ~StreamPair() {
    cudaSetDevice(device);
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaStreamDestroy(s);
  }
  StreamPair(const StreamPair&) = delete;
  StreamPair& operator=(const StreamPair&) = delete;
  double elapsed_s() const {
    float ms = 0;
    SLIDEDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    return ms * 1e-3;
  }
};

struct PerGpu {
  std::unique_ptr<DeviceMem> dev_in, dev_out;
  std::unique_ptr<PinnedMem> host_out, host_in;
  std::unique_ptr<StreamPair> h2d, d2h;
};

void sync_all(int n) {
  for (int g = 0; g < n; ++g) {
    SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
    SLIDEDP_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

LatencyBandwidth fit_points(const LinkCurve& c, double x_scale) {
  std::vector<XY> xy;
  for (const auto& p : c.points) xy.push_back({static_cast<double>(p.bytes) * x_scale, p.seconds.median});
  return fit_latency_bandwidth(xy);
}

}  // namespace

GpuInventory probe_gpus() {
  kernels::cuda::prepare_cuda_environment();  // before the first CUDA call, or it has no effect
  GpuInventory g;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    g.why_none = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return g;
  }
  if (n == 0) {
    g.why_none = "no CUDA device visible";
    return g;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    g.why_none = "cudaGetDeviceProperties failed on device 0";
    return g;
  }
  g.count = n;
  g.model = prop.name;
  g.mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(0) == cudaSuccess && cudaFree(nullptr) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    g.runtime_bytes = static_cast<int64_t>(total_b - free_b);  // the context exists, nothing of ours yet
  return g;
}

namespace {

// Everything the cases touch, held by them for the run's rounds (stats.h run_rounds) and freed
// when the last case goes: buffers, streams, the cuBLAS handle and the NCCL communicators.
struct GpuState {
  int n = 0;
  std::vector<PerGpu> G;
  std::vector<std::byte> pageable;
  std::unique_ptr<DeviceMem> hbm_a, hbm_b, gemm_a, gemm_b, gemm_c;
  std::unique_ptr<StreamPair> hbm_stream, gemm_stream;
  cublasHandle_t cublas = nullptr;
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<DeviceMem>> send, recv, sums;  // sums: the reduce-scatter's fp32 shard
  std::vector<std::unique_ptr<StreamPair>> coll_streams;
  ~GpuState() {
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    if (cublas) cublasDestroy(cublas);
  }

  // Each GPU's link buffers and streams, the pageable source, device 0's copy and GEMM operands.
  void allocate(const GpuMeasureOptions& o, int64_t max_size, int64_t pageable_bytes);
  // The fabric, probed once (untimed): NVLink when every pair has peer access with native atomics.
  std::string fabric_kind() const;
  // The communicators and the collectives' buffers; returns the device memory NCCL took on GPU 0.
  int64_t init_collectives(const GpuMeasureOptions& o);
};

void GpuState::allocate(const GpuMeasureOptions& o, int64_t max_size, int64_t pageable_bytes) {
  G.resize(static_cast<std::size_t>(n));
  for (int g = 0; g < n; ++g) {
    PerGpu& p = G[static_cast<std::size_t>(g)];
    p.dev_in = std::make_unique<DeviceMem>(g, max_size);
    p.dev_out = std::make_unique<DeviceMem>(g, max_size);
    p.host_out = std::make_unique<PinnedMem>(max_size);
    p.host_in = std::make_unique<PinnedMem>(max_size);
    p.h2d = std::make_unique<StreamPair>(g);
    p.d2h = std::make_unique<StreamPair>(g);
  }
  pageable.assign(static_cast<std::size_t>(pageable_bytes), std::byte{1});
  hbm_a = std::make_unique<DeviceMem>(0, o.hbm_bytes);
  hbm_b = std::make_unique<DeviceMem>(0, o.hbm_bytes);
  hbm_stream = std::make_unique<StreamPair>(0);
  const int64_t N = o.gemm_n;
  gemm_a = std::make_unique<DeviceMem>(0, N * N * 2);
  gemm_b = std::make_unique<DeviceMem>(0, N * N * 2);
  gemm_c = std::make_unique<DeviceMem>(0, N * N * 2);
  gemm_stream = std::make_unique<StreamPair>(0);
  SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
  SLIDEDP_CUDA_CHECK(cublasCreate(&cublas));
  SLIDEDP_CUDA_CHECK(cublasSetStream(cublas, gemm_stream->s));
  // Random operands, written on the GEMM's own stream: on zeros tensor cores run about 13% faster
  // (cuda-review D10), which would overstate the peak every compute estimate divides by.
  kernels::cuda::fill_uniform_bf16(static_cast<kernels::cuda::bf16*>(gemm_a->p), N * N, 1, -1.0f, 1.0f,
                                   gemm_stream->s);
  kernels::cuda::fill_uniform_bf16(static_cast<kernels::cuda::bf16*>(gemm_b->p), N * N, 2, -1.0f, 1.0f,
                                   gemm_stream->s);
}

std::string GpuState::fabric_kind() const {
  std::string kind = n > 1 ? "nvlink" : "none";
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0, atomics = 0;
      SLIDEDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        kind = "via_host";
        continue;
      }
      // Native atomics between peers are an NVLink property (PCIe peer access lacks them); a
      // heuristic without NVML, stated in the profile's sources.
      SLIDEDP_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b));
      if (!atomics && kind == "nvlink") kind = "pcie_p2p";
    }
  return kind;
}

int64_t GpuState::init_collectives(const GpuMeasureOptions& o) {
  int64_t max_coll = 0;
  for (int64_t s : o.collective_sizes) max_coll = std::max(max_coll, s);
  comms.resize(static_cast<std::size_t>(n));
  size_t free_before = 0, free_after = 0, total_b = 0;
  SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
  SLIDEDP_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_b));
  SLIDEDP_CUDA_CHECK(ncclCommInitAll(comms.data(), n, nullptr));
  SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
  SLIDEDP_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_b));
  for (int g = 0; g < n; ++g) {
    send.push_back(std::make_unique<DeviceMem>(g, max_coll));
    recv.push_back(std::make_unique<DeviceMem>(g, max_coll));
    sums.push_back(std::make_unique<DeviceMem>(g, 2 * max_coll / n + 256));
    coll_streams.push_back(std::make_unique<StreamPair>(g));
  }
  return static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
}

struct Part {
  int gpu;
  char kind;  // 'h' h2d, 'd' d2h
};
// A way of using the links: one GPU alone, every GPU at once, both directions at once.
struct Mode {
  std::string name, label;  // "alone" | "all" | "bidir"; "gpu 2" | "all"
  std::vector<Part> parts;
  std::vector<char> kinds;  // the curves of the mode (bidir has two)
};

std::vector<Mode> link_modes(int n) {
  std::vector<Mode> modes;
  const auto add_mode = [&](std::string name, std::string label, std::vector<Part> parts) {
    Mode m{std::move(name), std::move(label), std::move(parts), {}};
    for (const Part& p : m.parts)
      if (std::find(m.kinds.begin(), m.kinds.end(), p.kind) == m.kinds.end()) m.kinds.push_back(p.kind);
    modes.push_back(std::move(m));
  };
  for (char k : {'h', 'd'})
    for (int g = 0; g < n; ++g) add_mode("alone", "gpu " + std::to_string(g), {{g, k}});
  if (n == 1) {
    add_mode("bidir", "gpu 0", {{0, 'h'}, {0, 'd'}});
    return modes;
  }
  std::vector<Part> ah, ad, bi;
  for (int g = 0; g < n; ++g) {
    ah.push_back({g, 'h'});
    ad.push_back({g, 'd'});
    bi.push_back({g, 'h'});
    bi.push_back({g, 'd'});
  }
  add_mode("all", "all", ah);
  add_mode("all", "all", ad);
  add_mode("bidir", "all", bi);
  return modes;
}

// K copies of `bytes` per participant of `m`; the mean span per direction over its participants.
Case link_case(const std::shared_ptr<GpuState>& st, const Mode& m, int64_t bytes,
               const RepeatPolicy& repeat) {
  return timed_case(
      m.name + " " + m.label + " " + std::to_string(bytes), repeat,
      [st, parts = m.parts, kinds = m.kinds, bytes](int K) {
        for (const Part& p : parts) {
          PerGpu& g = st->G[static_cast<std::size_t>(p.gpu)];
          StreamPair& sp = p.kind == 'h' ? *g.h2d : *g.d2h;
          SLIDEDP_CUDA_CHECK(cudaSetDevice(p.gpu));
          SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
          for (int k = 0; k < K; ++k) {
            if (p.kind == 'h')
              SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(g.dev_in->p, g.host_out->p, static_cast<std::size_t>(bytes),
                                                 cudaMemcpyHostToDevice, sp.s));
            else
              SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(g.host_in->p, g.dev_out->p, static_cast<std::size_t>(bytes),
                                                 cudaMemcpyDeviceToHost, sp.s));
          }
          SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
        }
        sync_all(st->n);
        std::vector<double> out;
        for (char k : kinds) {
          double sum = 0;
          int cnt = 0;
          for (const Part& p : parts) {
            if (p.kind != k) continue;
            PerGpu& g = st->G[static_cast<std::size_t>(p.gpu)];
            sum += (k == 'h' ? *g.h2d : *g.d2h).elapsed_s();
            ++cnt;
          }
          out.push_back(sum / cnt);
        }
        return out;
      });
}

Case h2d_case(const std::shared_ptr<GpuState>& st, bool pinned, int64_t bytes, const RepeatPolicy& repeat) {
  return timed_case(pinned ? "pinned h2d" : "pageable h2d", repeat, [st, pinned, bytes](int K) {
    PerGpu& g = st->G[0];
    SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(g.h2d->start, g.h2d->s));
    for (int k = 0; k < K; ++k)
      SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(g.dev_in->p,
                                         pinned ? g.host_out->p : static_cast<void*>(st->pageable.data()),
                                         static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, g.h2d->s));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(g.h2d->end, g.h2d->s));
    SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(g.h2d->s));
    return std::vector<double>{g.h2d->elapsed_s()};
  });
}

Case hbm_case(const std::shared_ptr<GpuState>& st, int64_t bytes, const RepeatPolicy& repeat) {
  return timed_case("device memory bandwidth", repeat, [st, bytes](int K) {
    StreamPair& sp = *st->hbm_stream;
    SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
    for (int k = 0; k < K; ++k)
      SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(st->hbm_a->p, st->hbm_b->p, static_cast<std::size_t>(bytes),
                                         cudaMemcpyDeviceToDevice, sp.s));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
    SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(sp.s));
    return std::vector<double>{sp.elapsed_s()};
  });
}

Case gemm_case(const std::shared_ptr<GpuState>& st, int64_t N, const RepeatPolicy& repeat) {
  return timed_case("bf16 GEMM", repeat, [st, N](int K) {
    StreamPair& sp = *st->gemm_stream;
    const float alpha = 1.0f, beta = 0.0f;
    const int n32 = static_cast<int>(N);
    SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
    for (int k = 0; k < K; ++k)
      SLIDEDP_CUDA_CHECK(cublasGemmEx(st->cublas, CUBLAS_OP_N, CUBLAS_OP_N, n32, n32, n32, &alpha, st->gemm_a->p,
                                      CUDA_R_16BF, n32, st->gemm_b->p, CUDA_R_16BF, n32, &beta, st->gemm_c->p,
                                      CUDA_R_16BF, n32, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
    SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(sp.s));
    return std::vector<double>{sp.elapsed_s()};
  });
}

// K all-gathers, or K reduce-scatters as the CUDA backend runs them within a node (the all-to-all of
// bf16 shards, then the rank-order fp32 sum on each GPU), of `bytes` on every GPU at once.
void enqueue_collective(GpuState& st, bool gather, int64_t bytes, int K) {
  const int ranks = st.n;
  const std::size_t shard = static_cast<std::size_t>(bytes / 2 / ranks);  // bf16 per rank
  std::vector<kernels::cuda::ShardExchangePlan> plans;
  for (int g = 0; g < ranks; ++g) plans.push_back(kernels::cuda::shard_exchange_plan(bytes / 2, ranks, g));
  for (int k = 0; k < K; ++k) {
    SLIDEDP_CUDA_CHECK(ncclGroupStart());
    for (int g = 0; g < ranks; ++g) {
      const auto gi = static_cast<std::size_t>(g);
      if (gather)
        SLIDEDP_CUDA_CHECK(ncclAllGather(st.send[gi]->b() + gi * shard * 2, st.recv[gi]->p, shard,
                                         ncclBfloat16, st.comms[gi], st.coll_streams[gi]->s));
      else
        kernels::cuda::exchange_shards(st.send[gi]->b(), 2, plans[gi], st.recv[gi]->b(), st.comms[gi],
                                       st.coll_streams[gi]->s);
    }
    SLIDEDP_CUDA_CHECK(ncclGroupEnd());
    if (gather) continue;
    for (int g = 0; g < ranks; ++g) {
      const auto gi = static_cast<std::size_t>(g);
      SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
      kernels::cuda::sum_received_shards(st.send[gi]->b(), st.recv[gi]->b(), true, plans[gi], g, ranks,
                                         static_cast<float*>(st.sums[gi]->p), st.coll_streams[gi]->s);
    }
  }
}

Case collective_case(const std::shared_ptr<GpuState>& st, bool gather, int64_t bytes,
                     const RepeatPolicy& repeat) {
  return timed_case(std::string(gather ? "all_gather " : "reduce_scatter ") + std::to_string(bytes), repeat,
                    [st, gather, bytes](int K) {
                      const int ranks = st->n;
                      for (int g = 0; g < ranks; ++g) {
                        SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
                        StreamPair& sp = *st->coll_streams[static_cast<std::size_t>(g)];
                        SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
                      }
                      enqueue_collective(*st, gather, bytes, K);
                      for (int g = 0; g < ranks; ++g) {
                        SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
                        StreamPair& sp = *st->coll_streams[static_cast<std::size_t>(g)];
                        SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
                      }
                      sync_all(ranks);
                      double sum = 0;
                      for (int g = 0; g < ranks; ++g)
                        sum += st->coll_streams[static_cast<std::size_t>(g)]->elapsed_s();
                      return std::vector<double>{sum / ranks};
                    });
}

// Links: each mode's curves over the sizes; "alone" is the mean over GPUs of each size's median.
// Reads vals from `i` on.
void add_link_curves(GpuMeasurements& res, const std::vector<Mode>& modes, const std::vector<int64_t>& sizes,
                     const CaseSamples& vals, std::size_t& i, Measurements& out) {
  std::vector<LinkCurve> alone_h, alone_d;
  for (const Mode& m : modes) {
    std::vector<LinkCurve> curves;
    for (char k : m.kinds) {
      LinkCurve c;
      c.mode = m.name;
      c.direction = k == 'h' ? "h2d" : "d2h";
      c.devices = static_cast<int>(
          std::count_if(m.parts.begin(), m.parts.end(), [&](const Part& p) { return p.kind == k; }));
      curves.push_back(c);
    }
    for (int64_t bytes : sizes) {
      for (std::size_t k = 0; k < curves.size(); ++k) {
        const nlohmann::json params = {{"bytes", bytes},
                                       {"mode", m.name},
                                       {"direction", curves[k].direction},
                                       {"devices", curves[k].devices},
                                       {"gpus", m.label},
                                       {"pinned", true}};
        curves[k].points.push_back(
            {bytes, out.add({"links", curves[k].direction + "_s", params, "s", vals[i][k]}).spread()});
      }
      ++i;
    }
    if (m.name == "alone") {
      (m.kinds.front() == 'h' ? alone_h : alone_d).push_back(curves.front());
      continue;
    }
    for (LinkCurve& c : curves) {
      c.fit = fit_points(c, 1.0);
      res.links.push_back(c);
    }
  }
  for (std::vector<LinkCurve>* per_gpu : {&alone_h, &alone_d}) {
    LinkCurve mean = per_gpu->front();
    for (std::size_t p = 0; p < mean.points.size(); ++p) {
      double s = 0;
      for (const LinkCurve& c : *per_gpu) s += c.points[p].seconds.median;
      mean.points[p].seconds.median = s / static_cast<double>(per_gpu->size());
    }
    mean.fit = fit_points(mean, 1.0);
    res.links.insert(res.links.begin() + (per_gpu == &alone_h ? 0 : 1), mean);
  }
}

// Pageable vs pinned, device memory, GEMM: seconds per operation into rates. Reads vals from `i` on.
void add_rates(GpuMeasurements& res, const GpuMeasureOptions& o, int64_t pageable_bytes,
               const CaseSamples& vals, std::size_t& i, Measurements& out) {
  const auto rates = [](std::vector<double> seconds, double work) {
    for (double& x : seconds) x = work / x;
    return seconds;
  };
  const double pb = static_cast<double>(pageable_bytes);
  res.pinned_h2d_gbps = out.add({"links",
                                 "pinned_h2d_gbps",
                                 {{"bytes", pageable_bytes}, {"gpu", 0}},
                                 "GB/s",
                                 rates(vals[i++][0], pb / 1e9)})
                            .spread();
  res.pageable_h2d_gbps = out.add({"links",
                                   "pageable_h2d_gbps",
                                   {{"bytes", pageable_bytes}, {"gpu", 0}},
                                   "GB/s",
                                   rates(vals[i++][0], pb / 1e9)})
                              .spread();
  res.hbm_gbps = out.add({"gpu",
                          "hbm_gbps",
                          {{"bytes", o.hbm_bytes}, {"gpu", 0}},
                          "GB/s",
                          rates(vals[i++][0], 2.0 * static_cast<double>(o.hbm_bytes) / 1e9)})
                     .spread();
  const double gemm_n = static_cast<double>(o.gemm_n);
  res.bf16_gemm_tflops = out.add({"gpu",
                                  "bf16_gemm_tflops",
                                  {{"n", o.gemm_n}, {"gpu", 0}},
                                  "TFLOP/s",
                                  rates(vals[i++][0], 2.0 * gemm_n * gemm_n * gemm_n / 1e12)})
                             .spread();
}

// The collectives' curves, with nccl-tests' bus bandwidth (each port moves S (N-1)/N bytes). Reads
// vals from `i` on.
void add_collectives(GpuMeasurements& res, const GpuMeasureOptions& o, int n, const CaseSamples& vals,
                     std::size_t& i, Measurements& out) {
  for (const char* what : {"all_gather", "reduce_scatter"}) {
    LinkCurve c;
    c.mode = what;
    c.devices = n;
    for (int64_t bytes : o.collective_sizes)
      c.points.push_back({bytes, out.add({"fabric",
                                          std::string(what) + "_s",
                                          {{"bytes", bytes}, {"devices", n}, {"dtype", "bf16"}},
                                          "s",
                                          vals[i++][0]})
                                     .spread()});
    c.fit = fit_points(c, static_cast<double>(n - 1) / n);
    res.collectives.push_back(c);
  }
}

}  // namespace

PreparedStage<GpuMeasurements> prepare_gpus(const GpuMeasureOptions& o, StageContext& ctx) {
  auto st = std::make_shared<GpuState>();
  SLIDEDP_CUDA_CHECK(cudaGetDeviceCount(&st->n));
  const int n = st->n;
  SLIDEDP_CHECK(n >= 1, "prepare_gpus without a device");
  int64_t max_size = 0;
  for (int64_t s : o.sizes) max_size = std::max(max_size, s);
  const int64_t pageable_bytes = std::min(o.pageable_bytes, max_size);
  st->allocate(o, max_size, pageable_bytes);
  const std::string fabric_kind = st->fabric_kind();
  const bool collectives = n > 1 && !o.collective_sizes.empty();
  const int64_t collective_bytes = collectives ? st->init_collectives(o) : -1;

  // The cases: one per (link mode, size), pageable and pinned, device memory, GEMM, and one per
  // (collective, size). Copies and collectives are K back-to-back operations per stream between
  // two events, all participants queued before the first synchronization.
  auto modes = std::make_shared<const std::vector<Mode>>(link_modes(n));
  PreparedStage<GpuMeasurements> stage;
  for (const Mode& m : *modes)
    for (int64_t bytes : o.sizes) stage.cases.push_back(link_case(st, m, bytes, ctx.repeat));
  const std::size_t link_cases = stage.cases.size();
  for (bool pinned : {true, false}) stage.cases.push_back(h2d_case(st, pinned, pageable_bytes, ctx.repeat));
  stage.cases.push_back(hbm_case(st, o.hbm_bytes, ctx.repeat));
  stage.cases.push_back(gemm_case(st, o.gemm_n, ctx.repeat));
  const std::size_t collective_cases = stage.cases.size();
  if (collectives)
    for (const bool gather : {true, false})
      for (int64_t bytes : o.collective_sizes)
        stage.cases.push_back(collective_case(st, gather, bytes, ctx.repeat));

  stage.finish = [o, n, modes, link_cases, collective_cases, collectives, collective_bytes, fabric_kind, pageable_bytes,
                  &out = ctx.out](const CaseSamples& vals) {
    GpuMeasurements res;
    res.count = n;
    res.collective_bytes = collective_bytes;
    res.fabric_kind = fabric_kind;
    std::size_t i = 0;
    add_link_curves(res, *modes, o.sizes, vals, i, out);
    SLIDEDP_CHECK(i == link_cases);
    add_rates(res, o, pageable_bytes, vals, i, out);
    SLIDEDP_CHECK(i == collective_cases);
    if (collectives) add_collectives(res, o, n, vals, i, out);
    SLIDEDP_CHECK(i == vals.size());
    return res;
  };
  return stage;
}

}  // namespace slidedp::profiler
