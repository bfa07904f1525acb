// How fast is the CPU transformer math against the machine's own BLAS? The run first measures the
// SGEMM peak (square and the layer's largest projection shape), then one decoder layer of a
// Qwen2.5-0.5B-class shape forward + backward, and reports its GFLOP/s as a fraction of that peak
// together with the exact working set of the unit. FLOPs are model/model_costs.h's unit_flops()
// (GEMMs 2x in backward, flash attention 2.5x since it recomputes the scores), so the planner's
// numbers and these agree on the work.
//   bench_kernels_transformer --benchmark_counters_tabular=true [--blas_threads=N]
// --blas_threads (default: all hardware threads) also sets the attention worker threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/working_set.h"
#include "model/model_costs.h"

namespace slidedp::kernels {
namespace {

double g_sgemm_peak_gflops = 0;  // best SGEMM rate of this run
int64_t g_threads = 1;           // BLAS threads = attention worker threads (one rank owns the machine)

// Qwen2.5-0.5B (config.json numbers): hidden 896, 14 heads, 2 kv heads, head_dim 64,
// intermediate 4864, vocab 151936, q/k/v bias, tied embeddings.
ModelCard qwen25_05b() {
  ModelCard c;
  c.name = "qwen2.5-0.5b";
  c.model_type = "qwen2";
  c.hidden_size = 896;
  c.num_layers = 24;
  c.num_heads = 14;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 4864;
  c.vocab_size = 151936;
  c.max_position_embeddings = 32768;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.validate("bench");
  return c;
}

void fill(float* p, int64_t n, float scale, uint32_t seed) {
  uint32_t s = seed;  // xorshift: cheap, deterministic, no allocation
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    p[i] = scale * (static_cast<float>(s % 20001) / 10000.0f - 1.0f);
  }
}

// SGEMM; the best rate of the run is the peak the layer is compared with.
void BM_SgemmPeak(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  AlignedBuffer a(M * K * 4), b(K * N * 4), c(M * N * 4);
  fill(a.as<float>(), M * K, 1, 1);
  fill(b.as<float>(), K * N, 1, 2);
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm<float>(false, true, M, N, K, 1.0f, a.as<float>(), K, b.as<float>(), K, 0.0f, c.as<float>(), N);
    benchmark::ClobberMemory();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gflops = 2.0 * M * N * K * 1e-9 * static_cast<double>(st.iterations()) / seconds;
  g_sgemm_peak_gflops = std::max(g_sgemm_peak_gflops, gflops);
  st.counters["GFLOP/s"] = gflops;
  st.counters["blas_threads"] = blas_threads();
}

struct LayerSetup {
  ModelCard card = qwen25_05b();
  ModelLayout layout = make_model_layout(card);
  DecoderSpec spec;
  int64_t B, T;
  AlignedBuffer params, grads, x, y, dy, dx, saved, fws, bws;
  LayerSetup(int64_t b, int64_t t, int64_t tile) : B(b), T(t) {
    spec = make_decoder_spec(card, layout.units[1]);
    spec.attn_tile = tile;
    spec.threads = g_threads;
    const int64_t n = spec.flat_numel, h = B * T * spec.C;
    params = AlignedBuffer(n * 4);
    grads = AlignedBuffer(n * 4);
    fill(params.as<float>(), n, 0.03f, 3);
    for (const TensorSpec& ts : layout.units[1].tensors)  // norms near 1, as in a trained model
      if (ts.name.find("norm") != std::string::npos)
        std::fill_n(params.as<float>() + ts.offset, ts.numel, 1.0f);
    std::memset(grads.data(), 0, static_cast<size_t>(n * 4));
    x = AlignedBuffer(h * 4);
    y = AlignedBuffer(h * 4);
    dy = AlignedBuffer(h * 4);
    dx = AlignedBuffer(h * 4);
    fill(x.as<float>(), h, 1, 4);
    fill(dy.as<float>(), h, 1e-3f, 5);
    saved = AlignedBuffer(decoder_saved_bytes<float>(spec, B, T));
    fws = AlignedBuffer(decoder_forward_workspace_bytes<float>(spec, B, T));
    bws = AlignedBuffer(decoder_backward_workspace_bytes<float>(spec, B, T));
  }
  void forward() {
    decoder_forward(spec, params.as<float>(), x.as<float>(), y.as<float>(), saved.workspace(), B, T,
                    fws.workspace());
  }
  void backward() {
    decoder_backward(spec, params.as<float>(), x.as<float>(), saved.workspace(), dy.as<float>(),
                     dx.as<float>(), grads.as<float>(), B, T, bws.workspace());
  }
};

double sgemm_peak() {
  if (g_sgemm_peak_gflops > 0) return g_sgemm_peak_gflops;
  // filtered run without BM_SgemmPeak: measure a square 2048 SGEMM here
  const int64_t n = 2048;
  AlignedBuffer a(n * n * 4), b(n * n * 4), c(n * n * 4);
  fill(a.as<float>(), n * n, 1, 1);
  fill(b.as<float>(), n * n, 1, 2);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm<float>(false, true, n, n, n, 1.0f, a.as<float>(), n, b.as<float>(), n, 0.0f, c.as<float>(), n);
    best = std::max(best, 2.0 * n * n * n * 1e-9 /
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return g_sgemm_peak_gflops = best;
}

void layer_counters(benchmark::State& st, const LayerSetup& s, double flops, double seconds) {
  const double gflops = flops * 1e-9 * static_cast<double>(st.iterations()) / seconds;
  const UnitWorkingSet ws = decoder_working_set<float>(s.spec, s.B, s.T);
  st.counters["GFLOP/s"] = gflops;
  st.counters["sgemm_peak"] = sgemm_peak();
  st.counters["pct_peak"] = 100.0 * gflops / sgemm_peak();
  st.counters["peak_MiB"] = static_cast<double>(ws.peak_bytes()) / (1 << 20);
  st.counters["saved_MiB"] = static_cast<double>(ws.saved_bytes) / (1 << 20);
  st.counters["bws_MiB"] = static_cast<double>(ws.backward_workspace_bytes) / (1 << 20);
  st.counters["params_MiB"] = static_cast<double>(ws.param_scratch_bytes) / (1 << 20);
  st.counters["threads"] = static_cast<double>(s.spec.threads);
}

// One decoder layer, forward then backward (the `keep` policy's work per micro-batch).
void BM_DecoderLayerFwdBwd(benchmark::State& st) {
  LayerSetup s(st.range(0), st.range(1), st.range(2));
  const UnitFlops f = unit_flops(s.card, UnitKind::kDecoder, 0, s.B, s.T);
  s.forward();  // warm: page in every buffer once
  s.backward();
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    s.forward();
    s.backward();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  layer_counters(st, s, f.forward() + f.backward(), seconds);
}

void BM_DecoderLayerForward(benchmark::State& st) {
  LayerSetup s(st.range(0), st.range(1), st.range(2));
  const UnitFlops f = unit_flops(s.card, UnitKind::kDecoder, 0, s.B, s.T);
  s.forward();
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    s.forward();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  layer_counters(st, s, f.forward(), seconds);
}

void BM_DecoderLayerBackward(benchmark::State& st) {
  LayerSetup s(st.range(0), st.range(1), st.range(2));
  const UnitFlops f = unit_flops(s.card, UnitKind::kDecoder, 0, s.B, s.T);
  s.forward();
  s.backward();
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    s.backward();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  layer_counters(st, s, f.backward(), seconds);
}

// Flash attention alone, forward + backward: time grows as T^2, scratch does not. Args: T, tile,
// head_dim (64: Qwen2.5-0.5B's 14 heads / 2 kv heads; 128: 8B-class heads, 8 of them / 2 kv heads).
void BM_AttentionFwdBwd(benchmark::State& st) {
  const int64_t T = st.range(0), hd = st.range(2), H = hd == 64 ? 14 : 8;
  const AttentionShape s{1, T, H, 2, hd, st.range(1), g_threads};
  const int64_t nq = T * s.H * s.hd, nk = T * s.KV * s.hd;
  AlignedBuffer q(nq * 4), k(nk * 4), v(nk * 4), o(nq * 4), lse(s.H * T * 4), dq(nq * 4), dk(nk * 4),
      dv(nk * 4), dout(nq * 4);
  fill(q.as<float>(), nq, 1, 6);
  fill(k.as<float>(), nk, 1, 7);
  fill(v.as<float>(), nk, 1, 8);
  fill(dout.as<float>(), nq, 1, 9);
  AlignedBuffer fws(attention_forward_workspace_bytes<float>(s)),
      bws(attention_backward_workspace_bytes<float>(s));
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    attention_forward(o.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), s,
                      fws.workspace());
    attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(), q.as<float>(),
                       k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(), s, bws.workspace());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // causal pairs T(T+1)/2, 4*hd FLOPs each forward, 2.5x that backward
  const double flops = 3.5 * 4.0 * s.hd * s.H * (static_cast<double>(T) * (T + 1) / 2);
  st.counters["GFLOP/s"] = flops * 1e-9 * static_cast<double>(st.iterations()) / seconds;
  st.counters["pct_peak"] = 100.0 * st.counters["GFLOP/s"] / sgemm_peak();
  st.counters["scratch_KiB"] = static_cast<double>(attention_forward_workspace_bytes<float>(s) +
                                                   attention_backward_workspace_bytes<float>(s)) /
                               1024;
  st.counters["scores_if_full_MiB"] = static_cast<double>(T) * T * s.H * 4 / (1 << 20);
}

// The head: final norm + fused chunked cross-entropy with both gradients (tied vocab 151936).
void BM_HeadFusedCrossEntropy(benchmark::State& st) {
  const ModelCard card = qwen25_05b();
  const ModelLayout layout = make_model_layout(card);
  HeadSpec spec = make_head_spec(card, layout.units.back());
  spec.loss_chunk_tokens = st.range(1);
  const int64_t B = 1, T = st.range(0), N = B * T, C = spec.C, V = spec.V;
  AlignedBuffer params(spec.flat_numel * 4), grads(spec.flat_numel * 4), w(V * C * 4), dw(V * C * 4),
      x(N * C * 4), dx(N * C * 4), ws(head_workspace_bytes<float>(spec, B, T, true));
  std::fill_n(params.as<float>(), spec.flat_numel, 1.0f);
  std::memset(grads.data(), 0, static_cast<size_t>(spec.flat_numel * 4));
  std::memset(dw.data(), 0, static_cast<size_t>(V * C * 4));
  fill(w.as<float>(), V * C, 0.02f, 10);
  fill(x.as<float>(), N * C, 1, 11);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    const LossResult r =
        head_forward_backward(spec, params.as<float>(), w.as<float>(), x.as<float>(), targets.data(), B, T,
                              1.0 / N, dx.as<float>(), grads.as<float>(), dw.as<float>(), ws.workspace());
    benchmark::DoNotOptimize(r.loss_sum);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double flops = 3 * 2.0 * N * V * C;  // logits, dh, dW
  st.counters["GFLOP/s"] = flops * 1e-9 * static_cast<double>(st.iterations()) / seconds;
  st.counters["pct_peak"] = 100.0 * st.counters["GFLOP/s"] / sgemm_peak();
  st.counters["ws_MiB"] = static_cast<double>(ws.bytes()) / (1 << 20);
  st.counters["logits_if_full_MiB"] = static_cast<double>(N) * V * 4 / (1 << 20);
}

}  // namespace
}  // namespace slidedp::kernels

using slidedp::kernels::BM_AttentionFwdBwd;
using slidedp::kernels::BM_DecoderLayerBackward;
using slidedp::kernels::BM_DecoderLayerForward;
using slidedp::kernels::BM_DecoderLayerFwdBwd;
using slidedp::kernels::BM_HeadFusedCrossEntropy;
using slidedp::kernels::BM_SgemmPeak;

// SGEMM peak: square 2048 and the layer's widest projections (N tokens x 4864 x 896, x 896 x 4864).
BENCHMARK(BM_SgemmPeak)
    ->Args({2048, 2048, 2048})
    ->Args({1024, 4864, 896})
    ->Args({1024, 896, 4864})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
// Layer: B, T, attention tile.
BENCHMARK(BM_DecoderLayerFwdBwd)
    ->Args({2, 512, 64})
    ->Args({1, 2048, 64})
    ->Args({1, 2048, 128})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK(BM_DecoderLayerForward)->Args({2, 512, 64})->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_DecoderLayerBackward)->Args({2, 512, 64})->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_AttentionFwdBwd)
    ->Args({512, 64, 64})
    ->Args({2048, 64, 64})
    ->Args({8192, 64, 64})
    ->Args({2048, 128, 64})
    ->Args({2048, 64, 128})
    ->Args({2048, 32, 128})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
BENCHMARK(BM_HeadFusedCrossEntropy)->Args({256, 128})->Unit(benchmark::kMillisecond)->MinTime(1.0);

int main(int argc, char** argv) {
  // --blas_threads=N (default: all hardware threads, i.e. one rank owning the machine)
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--blas_threads=", 15) == 0) {
      threads = std::atoi(argv[i] + 15);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  slidedp::kernels::set_blas_threads(threads);
  slidedp::kernels::g_threads = threads;
  benchmark::AddCustomContext("blas", slidedp::kernels::blas_description());
  benchmark::AddCustomContext("blas_threads", std::to_string(slidedp::kernels::blas_threads()));
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
