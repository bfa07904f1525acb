// bench_executor_cuda: the GPU check's benchmark. (1) Host link: H2D / D2H GB/s from pinned memory
// allocated by cudaHostAlloc and from pageable memory registered with cudaHostRegister (the two ways
// the executor can pin its host state), and device-to-device. (2) Training a model card (default
// Llama-3.2-1B shape, random weights) on one GPU through the real executor, once with layer streaming
// (parameter slots of depth 2: every unit comes from host memory every step) and once "resident"
// within a step (one slot per unit, so a unit stays on the GPU from its forward to its backward; the
// slots are dropped when a step begins, so every unit still crosses the link once per step and the
// CPU optimizer still runs: the upper bound streaming is measured against), reporting per step: tokens/s, model TFLOP/s, the busy time of compute, H2D,
// D2H and the CPU update, the exposed time (step time not covered by GPU compute) and the achieved
// H2D / D2H GB/s (bytes of the step's copies over the link's busy time). One fixed-width table with a
// units row (nccl-tests style) plus a CSV with provenance; the PyTorch reference is
// bench/executor_cuda/torch_reference.py. A case whose first loss is not finite or not near ln V
// (random weights predict about uniformly) fails the benchmark: its numbers would not be training.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/provenance.h"
#include "common/table.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/trainer.h"
#include "io/token_dataset.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "model/model_costs.h"

namespace slidedp {
namespace {

using Clock = std::chrono::steady_clock;

// ---- host link -------------------------------------------------------------------------------------

struct LinkRow {
  std::string what;
  double gbps = 0;
};

double time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, int reps) {
  cudaEvent_t a, b;
  SLIDEDP_CUDA_CHECK(cudaEventCreate(&a));
  SLIDEDP_CUDA_CHECK(cudaEventCreate(&b));
  SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));  // warm-up
  SLIDEDP_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  SLIDEDP_CUDA_CHECK(cudaEventRecord(b, stream));
  SLIDEDP_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SLIDEDP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

std::vector<LinkRow> measure_link(int64_t bytes) {
  const size_t n = static_cast<size_t>(bytes);
  cudaStream_t s;
  SLIDEDP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* dev = nullptr;
  void* dev2 = nullptr;
  SLIDEDP_CUDA_CHECK(cudaMalloc(&dev, n));
  SLIDEDP_CUDA_CHECK(cudaMalloc(&dev2, n));
  void* pinned = nullptr;
  SLIDEDP_CUDA_CHECK(cudaHostAlloc(&pinned, n, cudaHostAllocPortable));
  std::memset(pinned, 1, n);
  void* pageable = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  std::memset(pageable, 1, n);
  const auto t0 = Clock::now();
  SLIDEDP_CUDA_CHECK(cudaHostRegister(pageable, n, cudaHostRegisterPortable));
  const double register_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<LinkRow> rows;
  rows.push_back({"H2D cudaHostAlloc", time_copies(dev, pinned, n, cudaMemcpyHostToDevice, s, 5)});
  rows.push_back({"D2H cudaHostAlloc", time_copies(pinned, dev, n, cudaMemcpyDeviceToHost, s, 5)});
  rows.push_back({"H2D cudaHostRegister", time_copies(dev, pageable, n, cudaMemcpyHostToDevice, s, 5)});
  rows.push_back({"D2H cudaHostRegister", time_copies(pageable, dev, n, cudaMemcpyDeviceToHost, s, 5)});
  rows.push_back({"D2D", time_copies(dev2, dev, n, cudaMemcpyDeviceToDevice, s, 5) * 2});  // read + write
  rows.push_back({fmt::format("cudaHostRegister of {:.0f} MiB (GB/s pinned)", bytes / 1048576.0),
                  static_cast<double>(bytes) / register_s / 1e9});
  cudaHostUnregister(pageable);
  std::free(pageable);
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaFree(dev2);
  cudaStreamDestroy(s);
  return rows;
}

// ---- training cases --------------------------------------------------------------------------------

struct CaseResult {
  std::string name;
  int depth = 0;
  int64_t tokens_per_step = 0;
  double step_s = 0, compute_s = 0, h2d_s = 0, d2h_s = 0, update_s = 0, exposed_s = 0;
  double h2d_bytes = 0, d2h_bytes = 0;
  double tokens_per_s = 0, tflops = 0, h2d_gbps = 0, d2h_gbps = 0;
  double peak_device_bytes = 0;
  std::vector<double> losses;
};

CaseResult run_case(const std::string& name, const ModelCard& card, const exec::TrainOptions& base, int depth,
                    int warmup, int measured) {
  exec::TrainOptions o = base;
  o.plan.gpu_buffer_depth = depth;
  o.steps = warmup + measured;
  o.trace = true;
  std::cerr << fmt::format("[bench] {}: depth {}, {} steps ({} warm-up) ...\n", name, depth, o.steps, warmup);
  const auto t0 = Clock::now();
  const exec::TrainResult r = exec::train(o, [&](const exec::TrainStep& s) {
    std::cerr << fmt::format("[bench]   step {} loss {:.4f} {:.3f} s\n", s.step, s.loss, s.wall_s);
  });
  std::cerr << fmt::format("[bench] {} done in {:.1f} s (including initialization)\n", name,
                           std::chrono::duration<double>(Clock::now() - t0).count());
  CaseResult c;
  c.name = name;
  c.depth = depth;
  const int64_t T = o.seq_len;
  for (const exec::TrainStep& s : r.steps) c.losses.push_back(s.loss);
  for (int i = warmup; i < warmup + measured; ++i) {
    const exec::TrainStep& s = r.steps.at(static_cast<size_t>(i));
    auto busy = [&](const char* k) { return s.busy_s.count(k) ? s.busy_s.at(k) : 0.0; };
    c.step_s += s.wall_s / measured;
    c.compute_s += busy("compute") / measured;
    c.h2d_s += busy("h2d") / measured;
    c.d2h_s += busy("d2h") / measured;
    c.update_s += busy("cpu_update") / measured;
    // What rank 0's copies moved (the backend's own count, MeasuredSpan::bytes).
    auto copied = [&](const char* k) { return s.copied_bytes.count(k) ? s.copied_bytes.at(k) : 0.0; };
    c.h2d_bytes += copied("h2d") / measured;
    c.d2h_bytes += copied("d2h") / measured;
    c.tokens_per_step = s.tokens;
  }
  c.tokens_per_s = static_cast<double>(c.tokens_per_step) / c.step_s;
  c.tflops = model_flops_per_step(card, o.plan.global_batch_sequences(), T) / c.step_s / 1e12;
  c.exposed_s = std::max(0.0, c.step_s - c.compute_s);
  c.h2d_gbps = c.h2d_s > 0 ? c.h2d_bytes / c.h2d_s / 1e9 : 0;
  c.d2h_gbps = c.d2h_s > 0 ? c.d2h_bytes / c.d2h_s / 1e9 : 0;
  c.peak_device_bytes = r.device_high_water_bytes.empty() ? 0 : static_cast<double>(r.device_high_water_bytes[0]);
  return c;
}

int run(int argc, char** argv) {
  CLI::App app{"bench_executor_cuda: host link and streamed vs GPU-resident training on one GPU"};
  std::string model = "llama-3.2-1b", out_dir, cases = "streamed,resident";
  int64_t seq = 2048, link_mib = 256, chunk = int64_t{1} << 25;
  int micro_batch = 4, accum = 4, warmup = 1, measured = 2, threads = 0, streamed_depth = 2;
  app.add_option("--model", model, "Model card preset or file");
  app.add_option("--seq", seq, "Sequence length");
  app.add_option("--micro-batch", micro_batch, "Sequences per micro-step");
  app.add_option("--accum", accum, "Micro-steps per optimizer step");
  app.add_option("--warmup", warmup, "Steps not measured");
  app.add_option("--steps", measured, "Measured steps per case");
  app.add_option("--chunk", chunk, "chunk_numel of the plan");
  app.add_option("--threads", threads, "CPU update threads (0: all)");
  app.add_option("--streamed-depth", streamed_depth, "Parameter slots of the streamed case");
  app.add_option("--link-mib", link_mib, "Bytes per link measurement (MiB)");
  app.add_option("--cases", cases, "Comma-separated: streamed, resident");
  app.add_option("--out", out_dir, "Write bench.csv here");
  CLI11_PARSE(app, argc, argv);

  const int gpus = exec::cuda_visible_devices();
  if (gpus == 0) {
    std::cerr << "bench_executor_cuda: no CUDA GPU visible; nothing to measure\n";
    return 2;
  }
  const std::string gpu = kernels::cuda::device_description(0);
  const Provenance& pv = provenance();
  std::cout << fmt::format("# bench_executor_cuda | {} | {} | git {} | {} | {}\n", utc_timestamp(), gpu, pv.git_revision,
                           pv.cpu_model, pv.build_type);

  {
    // How this machine's backend runs (GPU, counter-wait mode), from a throw-away one-rank backend.
    const ModelCard tiny = load_model_card("slidedp-tiny");
    exec::RunControl control;
    exec::BackendOptions bo;
    bo.device_budget_bytes = int64_t{1} << 30;
    auto backend = exec::make_cuda_backend(tiny, make_model_layout(tiny), bo, control);
    std::cout << "# " << exec::describe_cuda_backend(*backend);
  }
  std::vector<LinkRow> link = measure_link(link_mib << 20);
  Table lt({"link", "bandwidth"}, {"", "GB/s"});
  for (const LinkRow& l : link) lt.add_row({l.what, fmt::format("{:.1f}", l.gbps)});
  std::cout << "\n" << lt.render() << std::flush;

  const ModelCard card = load_model_card(model);
  const ModelLayout layout = make_model_layout(card);
  exec::TrainOptions o;
  o.card = card;
  o.backend = "cuda";
  o.seq_len = seq;
  o.plan.ranks = 1;
  o.plan.micro_batch = micro_batch;
  o.plan.accum_steps = accum;
  o.plan.chunk_numel = chunk;
  o.plan.recompute_layers = 0;
  o.plan.keep_layers = Plan::kRest;  // activations stay on the GPU: this measures parameter streaming
  o.plan.loss_chunk_tokens = 4096;
  o.update_threads = threads;
  o.lr.lr = 1e-4;
  size_t free_b = 0, total_b = 0;
  SLIDEDP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  o.device_budget_bytes = static_cast<int64_t>(free_b) - (int64_t{3} << 30);
  {
    // Random tokens: enough for every step without repeating.
    const int64_t n = seq * micro_batch * accum * (warmup + measured + 1) + 1;
    std::mt19937_64 rng(1);
    std::vector<uint32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens) t = static_cast<uint32_t>(rng() % static_cast<uint64_t>(card.vocab_size));
    o.dataset = TokenDataset::from_tokens("random", std::move(tokens), {}, card.vocab_size);
  }

  std::vector<CaseResult> results;
  for (const std::string& name : {std::string("streamed"), std::string("resident")}) {
    if (cases.find(name) == std::string::npos) continue;
    const int depth = name == "streamed" ? streamed_depth : layout.num_units();
    results.push_back(run_case(name, card, o, depth, warmup, measured));
  }

  Table t({"case", "depth", "tokens", "step", "tokens/s", "model", "compute", "h2d", "d2h", "cpu update", "exposed",
           "H2D", "D2H", "H2D", "D2H", "peak mem"},
          {"", "slots", "/step", "s", "", "TFLOP/s", "s", "s", "s", "s", "s", "GB/step", "GB/step", "GB/s", "GB/s", "GiB"});
  for (const CaseResult& c : results)
    t.add_row({c.name, std::to_string(c.depth), std::to_string(c.tokens_per_step), fmt::format("{:.3f}", c.step_s),
               fmt::format("{:.0f}", c.tokens_per_s), fmt::format("{:.1f}", c.tflops), fmt::format("{:.3f}", c.compute_s),
               fmt::format("{:.3f}", c.h2d_s), fmt::format("{:.3f}", c.d2h_s), fmt::format("{:.3f}", c.update_s),
               fmt::format("{:.3f}", c.exposed_s), fmt::format("{:.2f}", c.h2d_bytes / 1e9),
               fmt::format("{:.2f}", c.d2h_bytes / 1e9), fmt::format("{:.1f}", c.h2d_gbps), fmt::format("{:.1f}", c.d2h_gbps),
               fmt::format("{:.1f}", c.peak_device_bytes / 1073741824.0)});
  std::cout << "\n"
            << fmt::format("{} | seq {} | micro-batch {} x accum {} | chunk {} | model FLOPs/token {:.3e}\n", card.name,
                           seq, micro_batch, accum, chunk, model_flops_per_step(card, 1, seq) / static_cast<double>(seq))
            << t.render();
  const CaseResult* st = nullptr;
  const CaseResult* rs = nullptr;
  for (const CaseResult& c : results) (c.name == "streamed" ? st : rs) = &c;
  if (st && rs)
    std::cout << fmt::format("\nstreamed / resident-within-a-step throughput: {:.1f}% (target >= 90%)\n",
                             100.0 * st->tokens_per_s / rs->tokens_per_s);
  int rc = 0;
  const double uniform = std::log(static_cast<double>(card.vocab_size));
  for (const CaseResult& c : results) {
    const double first = c.losses.empty() ? std::nan("") : c.losses.front();
    // Initial weights of std 0.02 give logits within about +-1 of each other: the loss is ln V to
    // well under 1 nat.
    if (!std::isfinite(first) || std::abs(first - uniform) > 1.0) {
      std::cerr << fmt::format("bench_executor_cuda: FAILED: case {} starts at loss {} (expected about ln V = {:.2f})\n",
                               c.name, first, uniform);
      rc = 1;
    }
  }

  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    std::ofstream f(std::filesystem::path(out_dir) / "bench.csv");
    f << "# " << utc_timestamp() << " | " << gpu << " | git " << pv.git_revision << " | " << pv.cpu_model << "\n";
    f << "kind,name,depth,tokens_per_step,step_s,tokens_per_s,model_tflops,compute_s,h2d_s,d2h_s,cpu_update_s,"
         "exposed_s,h2d_bytes,d2h_bytes,h2d_gbps,d2h_gbps,peak_device_bytes,flops_per_token,losses\n";
    for (const LinkRow& l : link) f << "link,\"" << l.what << "\",,,,,,,,,,,,," << l.gbps << ",,,,\n";
    for (const CaseResult& c : results) {
      std::string losses;
      for (double l : c.losses) losses += fmt::format("{}{:.5f}", losses.empty() ? "" : " ", l);
      f << fmt::format("train,{},{},{},{:.5f},{:.1f},{:.2f},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.0f},{:.0f},{:.2f},{:.2f},{:.0f},{:.6e},{}\n",
                       c.name, c.depth, c.tokens_per_step, c.step_s, c.tokens_per_s, c.tflops, c.compute_s, c.h2d_s,
                       c.d2h_s, c.update_s, c.exposed_s, c.h2d_bytes, c.d2h_bytes, c.h2d_gbps, c.d2h_gbps,
                       c.peak_device_bytes, model_flops_per_step(card, 1, seq) / static_cast<double>(seq), losses);
    }
  }
  return rc;
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  try {
    return slidedp::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_executor_cuda: " << e.what() << "\n";
    return 1;
  }
}
