// The GPU measurements of gpu.h with the CUDA runtime, NCCL and cuBLAS (built with
// SLIDEDP_ENABLE_CUDA only). Host API calls only, no device code, so the file is plain C++ that links
// the CUDA libraries. Copies and collectives are timed with CUDA events around K back-to-back
// operations per stream, all participants queued before the first synchronization, so "all" and
// "bidir" cases overlap on the hardware. Every CUDA / NCCL / cuBLAS call goes through the project's one
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
  return g;
}

GpuMeasurements measure_gpus(const GpuMeasureOptions& o, StageContext& ctx) {
  GpuMeasurements res;
  SLIDEDP_CUDA_CHECK(cudaGetDeviceCount(&res.count));
  const int n = res.count;
  SLIDEDP_CHECK(n >= 1, "measure_gpus without a device");
  int64_t max_size = 0;
  for (int64_t s : o.sizes) max_size = std::max(max_size, s);
  std::vector<PerGpu> G(static_cast<std::size_t>(n));
  for (int g = 0; g < n; ++g) {
    PerGpu& p = G[static_cast<std::size_t>(g)];
    p.dev_in = std::make_unique<DeviceMem>(g, max_size);
    p.dev_out = std::make_unique<DeviceMem>(g, max_size);
    p.host_out = std::make_unique<PinnedMem>(max_size);
    p.host_in = std::make_unique<PinnedMem>(max_size);
    p.h2d = std::make_unique<StreamPair>(g);
    p.d2h = std::make_unique<StreamPair>(g);
  }
  const double cases = static_cast<double>(o.sizes.size() * (n + 3) + o.collective_sizes.size() * 2 + 3);
  double done = 0;

  // ---- host links: participants (gpu, 'h' | 'd'), K copies each between two events ----
  struct Part {
    int gpu;
    char kind;
  };
  auto run_copies = [&](const std::vector<Part>& parts, int64_t bytes, int K) {
    for (const Part& p : parts) {
      PerGpu& g = G[static_cast<std::size_t>(p.gpu)];
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
    sync_all(n);
  };
  // Measures one mode over every size: a curve per direction present in `parts`.
  auto measure_mode = [&](const std::string& mode, const std::vector<Part>& parts,
                          const std::string& gpu_label) {
    std::vector<char> kinds;
    for (const Part& p : parts)
      if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
    std::vector<LinkCurve> curves;
    for (char k : kinds) {
      LinkCurve c;
      c.mode = mode;
      c.direction = k == 'h' ? "h2d" : "d2h";
      c.devices = static_cast<int>(
          std::count_if(parts.begin(), parts.end(), [&](const Part& p) { return p.kind == k; }));
      curves.push_back(c);
    }
    for (int64_t bytes : o.sizes) {
      ctx.report(done / cases, mode + " " + gpu_label + " " + std::to_string(bytes));
      std::vector<std::vector<double>> v = repeat_timed_multi(ctx.repeat, [&](int inner) {
        run_copies(parts, bytes, inner);
        std::vector<double> out;
        for (char k : kinds) {
          double sum = 0;
          int cnt = 0;
          for (const Part& p : parts) {
            if (p.kind != k) continue;
            PerGpu& g = G[static_cast<std::size_t>(p.gpu)];
            sum += (k == 'h' ? *g.h2d : *g.d2h).elapsed_s();
            ++cnt;
          }
          out.push_back(sum / cnt);
        }
        return out;
      });
      for (std::size_t i = 0; i < kinds.size(); ++i) {
        nlohmann::json params = {{"bytes", bytes},
                                 {"mode", mode},
                                 {"direction", curves[i].direction},
                                 {"devices", curves[i].devices},
                                 {"gpus", gpu_label},
                                 {"pinned", true}};
        curves[i].points.push_back(
            {bytes, ctx.out.add({"links", curves[i].direction + "_s", params, "s", v[i]}).spread()});
      }
      ++done;
    }
    return curves;
  };
  // Alone: every GPU by itself; the curve is the mean over GPUs of each size's median.
  for (char k : {'h', 'd'}) {
    std::vector<LinkCurve> per_gpu;
    for (int g = 0; g < n; ++g)
      per_gpu.push_back(measure_mode("alone", {{g, k}}, "gpu " + std::to_string(g)).front());
    LinkCurve mean = per_gpu.front();
    for (std::size_t i = 0; i < mean.points.size(); ++i) {
      double s = 0;
      for (const LinkCurve& c : per_gpu) s += c.points[i].seconds.median;
      mean.points[i].seconds.median = s / n;
    }
    mean.fit = fit_points(mean, 1.0);
    res.links.push_back(mean);
  }
  if (n > 1) {
    std::vector<Part> ah, ad, bi;
    for (int g = 0; g < n; ++g) {
      ah.push_back({g, 'h'});
      ad.push_back({g, 'd'});
      bi.push_back({g, 'h'});
      bi.push_back({g, 'd'});
    }
    for (const auto& [mode, parts] : {std::pair{"all", ah}, std::pair{"all", ad}, std::pair{"bidir", bi}})
      for (LinkCurve& c : measure_mode(mode, parts, "all")) {
        c.fit = fit_points(c, 1.0);
        res.links.push_back(c);
      }
  } else {
    for (LinkCurve& c : measure_mode("bidir", {{0, 'h'}, {0, 'd'}}, "gpu 0")) {
      c.fit = fit_points(c, 1.0);
      res.links.push_back(c);
    }
  }

  // ---- pageable vs pinned, once, GPU 0 ----
  {
    ctx.report(done / cases, "pageable vs pinned");
    const int64_t bytes = std::min(o.pageable_bytes, max_size);
    std::vector<std::byte> pageable(static_cast<std::size_t>(bytes), std::byte{1});
    PerGpu& g = G[0];
    SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
    for (bool pinned : {true, false}) {
      std::vector<double> t = repeat_timed(ctx.repeat, [&](int inner) {
        SLIDEDP_CUDA_CHECK(cudaEventRecord(g.h2d->start, g.h2d->s));
        for (int k = 0; k < inner; ++k)
          SLIDEDP_CUDA_CHECK(
              cudaMemcpyAsync(g.dev_in->p, pinned ? g.host_out->p : static_cast<void*>(pageable.data()),
                              static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, g.h2d->s));
        SLIDEDP_CUDA_CHECK(cudaEventRecord(g.h2d->end, g.h2d->s));
        SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(g.h2d->s));
        return g.h2d->elapsed_s();
      });
      for (double& x : t) x = static_cast<double>(bytes) / x / 1e9;
      const Spread s = ctx.out
                           .add({"links",
                                 pinned ? "pinned_h2d_gbps" : "pageable_h2d_gbps",
                                 {{"bytes", bytes}, {"gpu", 0}},
                                 "GB/s",
                                 t})
                           .spread();
      (pinned ? res.pinned_h2d_gbps : res.pageable_h2d_gbps) = s;
    }
    ++done;
  }

  // ---- device memory and bf16 GEMM on GPU 0 ----
  {
    ctx.report(done / cases, "device memory bandwidth");
    SLIDEDP_CUDA_CHECK(cudaSetDevice(0));
    DeviceMem a(0, o.hbm_bytes), b(0, o.hbm_bytes);
    StreamPair sp(0);
    std::vector<double> t = repeat_timed(ctx.repeat, [&](int inner) {
      SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
      for (int k = 0; k < inner; ++k)
        SLIDEDP_CUDA_CHECK(
            cudaMemcpyAsync(a.p, b.p, static_cast<std::size_t>(o.hbm_bytes), cudaMemcpyDeviceToDevice, sp.s));
      SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
      SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(sp.s));
      return sp.elapsed_s();
    });
    for (double& x : t) x = 2.0 * static_cast<double>(o.hbm_bytes) / x / 1e9;
    res.hbm_gbps = ctx.out.add({"gpu", "hbm_gbps", {{"bytes", o.hbm_bytes}, {"gpu", 0}}, "GB/s", t}).spread();
    ++done;
  }
  {
    ctx.report(done / cases, "bf16 GEMM");
    const int64_t N = o.gemm_n;
    DeviceMem A(0, N * N * 2), B(0, N * N * 2), C(0, N * N * 2);
    StreamPair sp(0);
    cublasHandle_t h = nullptr;
    SLIDEDP_CUDA_CHECK(cublasCreate(&h));
    std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> guard(
        h, [](cublasHandle_t x) { cublasDestroy(x); });
    SLIDEDP_CUDA_CHECK(cublasSetStream(h, sp.s));
    const float alpha = 1.0f, beta = 0.0f;
    const int n32 = static_cast<int>(N);
    std::vector<double> t = repeat_timed(ctx.repeat, [&](int inner) {
      SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.start, sp.s));
      for (int k = 0; k < inner; ++k)
        SLIDEDP_CUDA_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n32, n32, n32, &alpha, A.p, CUDA_R_16BF,
                                        n32, B.p, CUDA_R_16BF, n32, &beta, C.p, CUDA_R_16BF, n32,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      SLIDEDP_CUDA_CHECK(cudaEventRecord(sp.end, sp.s));
      SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(sp.s));
      return sp.elapsed_s();
    });
    for (double& x : t) x = 2.0 * static_cast<double>(N) * N * N / x / 1e12;
    res.bf16_gemm_tflops =
        ctx.out.add({"gpu", "bf16_gemm_tflops", {{"n", N}, {"gpu", 0}}, "TFLOP/s", t}).spread();
    ++done;
  }

  // ---- fabric: peer access and NCCL collectives ----
  res.fabric_kind = n > 1 ? "nvlink" : "none";
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0, atomics = 0;
      SLIDEDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        res.fabric_kind = "via_host";
        continue;
      }
      // Native atomics between peers are an NVLink property (PCIe peer access lacks them); a
      // heuristic without NVML, stated in the profile's sources.
      SLIDEDP_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b));
      if (!atomics && res.fabric_kind == "nvlink") res.fabric_kind = "pcie_p2p";
    }
  if (n > 1 && !o.collective_sizes.empty()) {
    int64_t max_coll = 0;
    for (int64_t s : o.collective_sizes) max_coll = std::max(max_coll, s);
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
    SLIDEDP_CUDA_CHECK(ncclCommInitAll(comms.data(), n, nullptr));
    std::vector<std::unique_ptr<DeviceMem>> send, recv;
    std::vector<std::unique_ptr<StreamPair>> streams;
    for (int g = 0; g < n; ++g) {
      send.push_back(std::make_unique<DeviceMem>(g, max_coll));
      recv.push_back(std::make_unique<DeviceMem>(g, max_coll));
      streams.push_back(std::make_unique<StreamPair>(g));
    }
    for (const char* what : {"all_gather", "reduce_scatter"}) {
      const bool gather = std::string(what) == "all_gather";
      LinkCurve c;
      c.mode = what;
      c.devices = n;
      for (int64_t bytes : o.collective_sizes) {
        ctx.report(done / cases, std::string(what) + " " + std::to_string(bytes));
        const std::size_t shard = static_cast<std::size_t>(bytes / 2 / n);  // bf16 elements per rank
        std::vector<double> t = repeat_timed(ctx.repeat, [&](int inner) {
          for (int g = 0; g < n; ++g) {
            SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
            SLIDEDP_CUDA_CHECK(cudaEventRecord(streams[static_cast<std::size_t>(g)]->start,
                                               streams[static_cast<std::size_t>(g)]->s));
          }
          for (int k = 0; k < inner; ++k) {
            SLIDEDP_CUDA_CHECK(ncclGroupStart());
            for (int g = 0; g < n; ++g) {
              const auto gi = static_cast<std::size_t>(g);
              if (gather)
                SLIDEDP_CUDA_CHECK(ncclAllGather(send[gi]->b() + gi * shard * 2, recv[gi]->p, shard,
                                                 ncclBfloat16, comms[gi], streams[gi]->s));
              else
                SLIDEDP_CUDA_CHECK(ncclReduceScatter(send[gi]->p, recv[gi]->p, shard, ncclBfloat16, ncclSum,
                                                     comms[gi], streams[gi]->s));
            }
            SLIDEDP_CUDA_CHECK(ncclGroupEnd());
          }
          double sum = 0;
          for (int g = 0; g < n; ++g) {
            SLIDEDP_CUDA_CHECK(cudaSetDevice(g));
            SLIDEDP_CUDA_CHECK(cudaEventRecord(streams[static_cast<std::size_t>(g)]->end,
                                               streams[static_cast<std::size_t>(g)]->s));
          }
          sync_all(n);
          for (int g = 0; g < n; ++g) sum += streams[static_cast<std::size_t>(g)]->elapsed_s();
          return sum / n;
        });
        c.points.push_back({bytes, ctx.out
                                       .add({"fabric",
                                             std::string(what) + "_s",
                                             {{"bytes", bytes}, {"devices", n}, {"dtype", "bf16"}},
                                             "s",
                                             t})
                                       .spread()});
        ++done;
      }
      // nccl-tests' bus bandwidth: each port moves S (N-1)/N bytes.
      c.fit = fit_points(c, static_cast<double>(n - 1) / n);
      res.collectives.push_back(c);
    }
    for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  }
  ctx.report(1.0, "");
  return res;
}

}  // namespace slidedp::profiler
