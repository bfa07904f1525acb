// The CUDA backend's primitives (label gpu; every test needing a GPU skips with the reason where
// none is visible): copies through pinned memory in stream order, host counters holding a stream
// back in each wait mode (cuStreamWaitValue64, ...32, polling kernel), host functions in order with
// an exception failing the run, the arena's budget and stream-ordered deferred frees, quiesce after
// an abort releasing streams stuck on counters, collectives (with 2+ GPUs), tracing on the host's
// clock, and the errors for what the backend cannot do.
#include "executor/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "card/shard_range.h"
#include "common/bf16.h"
#include "common/error.h"
#include "model/memory_model.h"
#include "model/workload.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

#define SLIDEDP_REQUIRE_GPU()                                                                                 \
  do {                                                                                                        \
    if (cuda_visible_devices() == 0)                                                                          \
      GTEST_SKIP() << "no CUDA GPU visible (cuda_visible_devices() == 0): this GPU test runs only where a GPU " \
                      "is";                                                                                   \
  } while (0)

using namespace std::chrono_literals;

struct Rig {
  ModelCard card = testing::tiny_card();
  ModelLayout layout = make_model_layout(card);
  RunControl control;
  std::unique_ptr<Backend> backend;
  explicit Rig(int devices = 1, int64_t budget = int64_t{64} << 20, bool collectives = false) {
    BackendOptions o;
    o.devices = devices;
    o.device_budget_bytes = budget;
    o.collectives = collectives;
    backend = make_cuda_backend(card, layout, o, control);
  }
  ~Rig() {
    if (backend) backend->quiesce();
  }
};

SpanTag tag(const char* category, const char* what) {
  SpanTag t;
  t.category = category;
  t.what = what;
  return t;
}

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) & 0xff);
  return v;
}

// The memory account the executor charges on this backend equals the planner's for an H100 preset's
// CUDA units (computed without a GPU from the same carve sequences), up to the embedding's sort
// scratch, which only the device sizes exactly (the model estimates it), and the runtime items the
// arena does not hold (context, NCCL: the profile's). Within 1% for plans over routes and policies.
TEST(CudaBackend, MemoryAccountEqualsThePlannersForTheCudaUnits) {
  SLIDEDP_REQUIRE_GPU();
  Rig rig;
  Hardware hw = hardware_preset("h100-sxm-x4");
  hw.gpu.runtime_bytes = hw.gpu.collective_bytes = 0;  // outside the arena
  for (const char* act : {"recompute", "keep", "offload"}) {
    for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
      SCOPED_TRACE(std::string(act) + (gr == GradRoute::kGpu ? " gpu route" : " cpu route"));
      Plan p;
      p.ranks = 2;
      p.micro_batch = 2;
      p.grad_route = gr;
      p.chunk_numel = 4096;
      p.offload_layers = std::string(act) == "offload" ? 2 : 0;
      p.keep_layers = std::string(act) == "keep" ? Plan::kRest : 0;
      p.recompute_layers = std::string(act) == "keep" ? 0 : Plan::kRest;
      const int64_t T = 16;
      const RankMemoryAccount executor = rank_memory_account(rig.layout, p, T, rig.card.tie_word_embeddings,
                                                             rig.backend->device(0).memory_spec(p.micro_batch, T));
      const double planned = estimate_memory(make_workload(rig.card, T), hw, p, System::kSlideDP).gpu_peak_bytes;
      EXPECT_NEAR(planned, executor.peak_bytes, 0.01 * executor.peak_bytes);
    }
  }
}

TEST(CudaBackend, ExactFp32IsRejectedAndNoGpuIsAClearError) {
  ModelCard card = testing::tiny_card();
  ModelLayout layout = make_model_layout(card);
  RunControl control;
  BackendOptions o;
  o.exact_fp32 = true;
  EXPECT_THROW(make_cuda_backend(card, layout, o, control), InputError);
  if (cuda_visible_devices() == 0) {
    o.exact_fp32 = false;
    try {
      make_cuda_backend(card, layout, o, control);
      FAIL() << "expected a RuntimeError without a GPU";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("no GPU"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaBackend, CopiesRoundTripThroughPinnedMemoryInStreamOrder) {
  SLIDEDP_REQUIRE_GPU();
  Rig s;
  Device& d = s.backend->device(0);
  const int64_t n = (int64_t{3} << 20) + 7;
  HostBuffer src = s.backend->alloc_host(n, true), dst = s.backend->alloc_host(n, true);
  const auto data = pattern(static_cast<size_t>(n), 3);
  std::memcpy(src.ptr, data.data(), data.size());
  DeviceBuffer buf = d.alloc(n, "test buffer");
  d.h2d().copy_h2d(buf, 0, src.ptr, n, tag("h2d", "test"));
  d.d2h().wait(d.h2d().record());
  d.d2h().copy_d2h(dst.ptr, buf, 0, n, tag("d2h", "test"));
  d.d2h().record()->wait_host();
  EXPECT_EQ(std::memcmp(dst.ptr, data.data(), data.size()), 0);
  d.release(buf, nullptr);
  EXPECT_EQ(d.in_use_bytes(), 0);
}

TEST(CudaBackend, ACounterHoldsAStreamBackUntilTheHostAdvancesItInEveryWaitMode) {
  SLIDEDP_REQUIRE_GPU();
  for (const char* mode : {"value64", "value32", "kernel"}) {
    SCOPED_TRACE(mode);
    setenv("SLIDEDP_CUDA_COUNTER_WAIT", mode, 1);
    Rig s;
    unsetenv("SLIDEDP_CUDA_COUNTER_WAIT");
    Device& d = s.backend->device(0);
    auto counter = s.backend->make_counter(0);
    const int64_t n = 4096;
    HostBuffer src = s.backend->alloc_host(n, true), dst = s.backend->alloc_host(n, true);
    const auto data = pattern(n, 5);
    std::memcpy(src.ptr, data.data(), n);
    DeviceBuffer buf = d.alloc(n, "test buffer");
    d.h2d().wait_counter(*counter, 1);
    d.h2d().copy_h2d(buf, 0, src.ptr, n, tag("h2d", "test"));
    d.d2h().wait(d.h2d().record());
    d.d2h().copy_d2h(dst.ptr, buf, 0, n, tag("d2h", "test"));
    EventPtr done = d.d2h().record();
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(done->done()) << "the stream ran past a counter wait that was not satisfied";
    EXPECT_EQ(counter->value(), 0u);
    counter->advance_to(1);
    done->wait_host();
    EXPECT_EQ(std::memcmp(dst.ptr, data.data(), n), 0);
    counter->advance_to(0);  // never decreases
    EXPECT_EQ(counter->value(), 1u);
    d.release(buf, nullptr);
  }
}

TEST(CudaBackend, HostFunctionsRunInStreamOrderAndAnExceptionFailsTheRun) {
  SLIDEDP_REQUIRE_GPU();
  Rig s;
  Stream& st = s.backend->device(0).compute();
  std::vector<int> order;
  std::mutex m;
  for (int i = 0; i < 3; ++i)
    st.host_fn([&, i] {
      std::lock_guard<std::mutex> lock(m);
      order.push_back(i);
    });
  st.record()->wait_host();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  st.host_fn([] { throw RuntimeError("injected host function failure"); });
  st.host_fn([&] {
    std::lock_guard<std::mutex> lock(m);
    order.push_back(99);  // skipped: the run failed before it
  });
  // The callbacks run on CUDA's thread: wait (bounded) for the failure to be recorded.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!s.control.aborted() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(s.control.aborted()) << "the host function's exception did not fail the run";
  s.backend->quiesce();
  {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_EQ(order.size(), 3u);
  }
  try {
    s.control.rethrow_if_failed();
    FAIL() << "expected the host function's error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("injected host function failure"), std::string::npos);
  }
}

TEST(CudaBackend, TheBudgetHoldsAndAnAllocationWaitsForAStreamOrderedFree) {
  SLIDEDP_REQUIRE_GPU();
  Rig s(1, int64_t{4} << 20);
  Device& d = s.backend->device(0);
  EXPECT_THROW(d.alloc(int64_t{5} << 20, "too big"), InfeasibleError);
  DeviceBuffer a = d.alloc(int64_t{3} << 20, "a");
  EXPECT_THROW(d.alloc(int64_t{2} << 20, "no room, nothing pending"), InfeasibleError);
  auto counter = s.backend->make_counter(0);
  d.compute().wait_counter(*counter, 1);
  d.release(a, d.compute().record());  // freed once the stream passes the counter
  std::atomic<bool> got{false};
  auto waiter = std::async(std::launch::async, [&] {
    DeviceBuffer b = d.alloc(int64_t{2} << 20, "b");
    got = true;
    return b;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got.load()) << "alloc must wait for the pending free";
  counter->advance_to(1);
  DeviceBuffer b = waiter.get();
  EXPECT_TRUE(got.load());
  // b reuses a's idle 3 MiB block (block_cache.h: a cached block up to 1 MiB larger that fits the
  // room), and the budget counts the block it holds, not the 2 MiB asked for (device_budget.h).
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(d.in_use_bytes(), int64_t{3} << 20);
  EXPECT_EQ(d.high_water_bytes(), int64_t{3} << 20);
  d.release(b, nullptr);
}

TEST(CudaBackend, QuiesceAfterAnAbortReleasesStreamsStuckOnCounters) {
  SLIDEDP_REQUIRE_GPU();
  Rig s;
  Device& d = s.backend->device(0);
  auto counter = s.backend->make_counter(0);
  HostBuffer src = s.backend->alloc_host(1024, true);
  DeviceBuffer buf = d.alloc(1024, "buf");
  d.h2d().wait_counter(*counter, 5);
  d.h2d().copy_h2d(buf, 0, src.ptr, 1024, tag("h2d", "stuck"));
  d.compute().wait(d.h2d().record());
  s.control.fail(std::make_exception_ptr(RuntimeError("another rank failed")));
  EXPECT_THROW(s.backend->synchronize(), Aborted);
  auto q = std::async(std::launch::async, [&] { s.backend->quiesce(); });
  ASSERT_EQ(q.wait_for(20s), std::future_status::ready) << "quiesce hung on a stream waiting for a counter";
  d.release(buf, nullptr);
}

TEST(CudaBackend, TracingRecordsSpansOnTheHostTraceClock) {
  SLIDEDP_REQUIRE_GPU();
  Rig s;
  s.backend->set_tracing(true);
  Device& d = s.backend->device(0);
  HostBuffer src = s.backend->alloc_host(int64_t{8} << 20, true);
  DeviceBuffer buf = d.alloc(int64_t{8} << 20, "buf");
  const double before = s.backend->trace_clock_s();
  SpanTag t = tag("h2d", "params");
  t.unit = 3;
  t.step = 1;
  d.h2d().copy_h2d(buf, 0, src.ptr, int64_t{8} << 20, t);
  s.backend->synchronize();
  const double after = s.backend->trace_clock_s();
  const std::vector<MeasuredSpan> spans = s.backend->take_spans();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].stream, "h2d");
  EXPECT_STREQ(spans[0].tag.category, "h2d");
  EXPECT_EQ(spans[0].tag.unit, 3);
  EXPECT_GT(spans[0].end_s, spans[0].start_s);
  // device times are mapped onto the host clock: inside the host interval, give or take 1 ms
  EXPECT_GE(spans[0].start_s, before - 1e-3);
  EXPECT_LE(spans[0].end_s, after + 1e-3);
  d.release(buf, nullptr);
}

// Rank r's shard of `count` bf16 values holds r + (i % 5) at element i: exact in bf16 and fp32.
TEST(CudaBackend, AllGatherAndReduceScatterWithEqualAndUnequalShards) {
  SLIDEDP_REQUIRE_GPU();
  const int gpus = cuda_visible_devices();
  if (gpus < 2) GTEST_SKIP() << "collectives need 2 GPUs, " << gpus << " visible";
  const int ranks = std::min(gpus, 4);
  Rig s(ranks, int64_t{64} << 20, true);
  for (int64_t count : {int64_t{4096} * ranks, int64_t{4096} * ranks + 3}) {
    SCOPED_TRACE(count);
    std::vector<DeviceBuffer> bufs, outs;
    std::vector<HostBuffer> host;
    for (int r = 0; r < ranks; ++r) {
      Device& d = s.backend->device(r);
      bufs.push_back(d.alloc(count * 2, "gather buffer"));
      outs.push_back(d.alloc(count * 4, "reduced shard"));
      host.push_back(s.backend->alloc_host(count * 4, true));
      auto* h = reinterpret_cast<bf16_bits*>(host.back().ptr);
      for (int64_t i = 0; i < count; ++i) h[i] = float_to_bf16(static_cast<float>(r + i % 5));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        Device& d = s.backend->device(r);
        const ShardRange mine = shard_range(count, ranks, r);
        // all_gather: each rank uploads its shard only
        d.h2d().copy_h2d(bufs[r], mine.begin * 2, host[r].ptr + mine.begin * 2, mine.size() * 2, tag("h2d", "shard"));
        d.comm().wait(d.h2d().record());
        s.backend->all_gather(r, bufs[r], 0, count, DType::kBF16, tag("fabric", "all-gather"));
        d.d2h().wait(d.comm().record());
        d.d2h().copy_d2h(host[r].ptr + count * 2, bufs[r], 0, count * 2, tag("d2h", "gathered"));
        d.d2h().record()->wait_host();
        // reduce_scatter of every rank's full (bf16) vector
        d.h2d().copy_h2d(bufs[r], 0, host[r].ptr, count * 2, tag("h2d", "full"));
        d.comm().wait(d.h2d().record());
        s.backend->reduce_scatter(r, bufs[r], 0, DType::kBF16, count, outs[r], 0, tag("fabric", "reduce-scatter"));
        d.d2h().wait(d.comm().record());
        d.d2h().copy_d2h(host[r].ptr, outs[r], 0, mine.size() * 4, tag("d2h", "shard"));
        d.d2h().record()->wait_host();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) {
      const auto* gathered = reinterpret_cast<const bf16_bits*>(host[r].ptr + count * 2);
      for (int64_t i = 0; i < count; ++i) {
        const int owner = [&] {
          for (int q = 0; q < ranks; ++q)
            if (i < shard_range(count, ranks, q).end) return q;
          return ranks - 1;
        }();
        ASSERT_EQ(bf16_to_float(gathered[i]), static_cast<float>(owner + i % 5)) << "rank " << r << " element " << i;
      }
      const ShardRange mine = shard_range(count, ranks, r);
      const auto* reduced = reinterpret_cast<const float*>(host[r].ptr);
      for (int64_t i = 0; i < mine.size(); ++i) {
        const int64_t e = mine.begin + i;
        const float expect = static_cast<float>(ranks * (e % 5) + ranks * (ranks - 1) / 2);  // small integers: exact
        ASSERT_EQ(reduced[i], expect) << "rank " << r << " element " << e;
      }
      s.backend->device(r).release(bufs[r], nullptr);
      s.backend->device(r).release(outs[r], nullptr);
    }
  }
}

TEST(CudaBackend, RanksSharingAGpuSayWhyCollectivesAreUnavailable) {
  SLIDEDP_REQUIRE_GPU();
  const int gpus = cuda_visible_devices();
  try {  // the communicators are made when the backend is, so the refusal comes before any work
    Rig s(gpus + 1, int64_t{64} << 20, true);
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("share"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slidedp::exec
