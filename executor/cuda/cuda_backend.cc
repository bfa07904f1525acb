// CUDA backend; see cuda_backend.h. Layout of this file: device guard and driver entry points, host
// counters, events, tracing, streams, device memory and unit operations, collectives, the backend.
//
// Threads. The pipeline calls a device from its rank's driver thread, the trainer's main thread
// and the updater; none of them is ours to pin to a GPU, so every entry point that touches a device
// makes it current for the call (DeviceGuard) instead of relying on a per-thread cudaSetDevice.
// Host functions (Stream::host_fn) run on CUDA's callback thread: they must not call CUDA, and an
// exception there goes to RunControl::fail.
// Aborts. Work already queued on a GPU cannot be dropped, so after an abort quiesce() releases
// everything it could be stuck on: every host counter is raised past every value a stream waits
// for, and the NCCL communicators are aborted; then the streams drain.
#include "executor/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <variant>

#include "card/shard_range.h"
#include "common/error.h"
#include "common/units.h"
#include "executor/block_cache.h"
#include "executor/cuda/counter_wait.h"
#include "executor/cuda/cupti_activity.h"
#include "executor/device_budget.h"
#include "executor/kernel_activity.h"
#include "executor/router_stats_of.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemma4_unit.h"
#include "kernels/cuda/qwen3_5_unit.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/shard_exchange.h"
#include "kernels/cuda/units.h"

namespace slidedp::exec {

int cuda_visible_devices() { return kernels::cuda::device_count(); }

namespace {

namespace kc = kernels::cuda;
using Clock = std::chrono::steady_clock;

// An optional's value as a pointer (null when empty), for an argument of the same statement.
template <typename T>
const T* opt_ptr(const std::optional<T>& o) {
  return o ? &*o : nullptr;
}

// ---- device guard and driver entry points -----------------------------------------------------------

// Makes `device` current for the scope, restoring the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    SLIDEDP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) SLIDEDP_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Driver-API functions reached through the runtime (no link dependency on libcuda, so binaries start
// where there is no driver, as in CI).
struct DriverApi {
  using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  WaitValue64 wait_value64 = nullptr;
  WaitValue32 wait_value32 = nullptr;
  DeviceGet device_get = nullptr;
  DeviceGetAttribute device_get_attribute = nullptr;

  static const DriverApi& get() {
    static const DriverApi api = [] {
      DriverApi a;
      auto load = [](const char* name) -> void* {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
          cudaGetLastError();
          return nullptr;
        }
        return fn;
      };
      a.wait_value64 = reinterpret_cast<WaitValue64>(load("cuStreamWaitValue64"));
      a.wait_value32 = reinterpret_cast<WaitValue32>(load("cuStreamWaitValue32"));
      a.device_get = reinterpret_cast<DeviceGet>(load("cuDeviceGet"));
      a.device_get_attribute = reinterpret_cast<DeviceGetAttribute>(load("cuDeviceGetAttribute"));
      return a;
    }();
    return api;
  }
};

// How streams of a device wait on host counters. value64 is the design (one stream memory operation
// on the 64-bit word); value32 waits on its low half, which is exact while a counter moves less than
// 2^31 past a waited value (steps and ring generations do); the polling kernel is for drivers
// without stream memory operations. SLIDEDP_CUDA_COUNTER_WAIT=value64|value32|kernel overrides.
enum class CounterWait { kValue64, kValue32, kKernel };

const char* counter_wait_name(CounterWait w) {
  switch (w) {
    case CounterWait::kValue64: return "cuStreamWaitValue64";
    case CounterWait::kValue32: return "cuStreamWaitValue32";
    case CounterWait::kKernel: return "polling kernel";
  }
  return "?";
}

CounterWait choose_counter_wait(int device) {
  const DriverApi& api = DriverApi::get();
  if (const char* env = std::getenv("SLIDEDP_CUDA_COUNTER_WAIT")) {
    if (std::strcmp(env, "kernel") == 0) return CounterWait::kKernel;
    if (std::strcmp(env, "value32") == 0 && api.wait_value32) return CounterWait::kValue32;
    if (std::strcmp(env, "value64") == 0 && api.wait_value64) return CounterWait::kValue64;
    throw InputError("SLIDEDP_CUDA_COUNTER_WAIT",
                     fmt::format("'{}' is not one of value64, value32, kernel (or the driver lacks it)", env));
  }
  int supports64 = 0;
  if (api.device_get && api.device_get_attribute) {
    CUdevice dev = 0;
    SLIDEDP_CUDA_CHECK(api.device_get(&dev, device));
    SLIDEDP_CUDA_CHECK(api.device_get_attribute(&supports64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
  }
  if (supports64 != 0 && api.wait_value64) return CounterWait::kValue64;
  if (api.wait_value32) return CounterWait::kValue32;
  return CounterWait::kKernel;
}

// Polls `ready` until true, yielding then sleeping briefly; checks the run's abort flag on every
// iteration (RunControl's poll interval is the upper bound of the reaction time).
template <class Ready>
void poll_until(const RunControl& control, Ready ready) {
  int spins = 0;
  while (!ready()) {
    control.check();
    if (++spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 200));
    }
  }
}

// ---- host counters ---------------------------------------------------------------------------------

class CudaCounter;

// Pinned, mapped words for counters (portable: every GPU may wait on them), handed out from 4 KiB
// slabs, and the registry of live counters that quiesce() releases after an abort. Shared by the
// counters, so it outlives whichever of them and the backend goes last.
class CounterPool {
 public:
  ~CounterPool() {
    for (void* slab : slabs_) cudaFreeHost(slab);
  }
  struct Word {
    uint64_t* host = nullptr;
    uint64_t* device = nullptr;  // the same word's device address
  };
  Word take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      void* slab = nullptr;
      SLIDEDP_CUDA_CHECK(cudaHostAlloc(&slab, kSlabBytes, cudaHostAllocPortable | cudaHostAllocMapped));
      std::memset(slab, 0, kSlabBytes);
      slabs_.push_back(slab);
      for (size_t i = 0; i < kSlabBytes / sizeof(uint64_t); ++i) {
        Word w;
        w.host = static_cast<uint64_t*>(slab) + i;
        void* dev = nullptr;
        SLIDEDP_CUDA_CHECK(cudaHostGetDevicePointer(&dev, w.host, 0));
        w.device = static_cast<uint64_t*>(dev);
        free_.push_back(w);
      }
    }
    Word w = free_.back();
    free_.pop_back();
    return w;
  }
  void give_back(Word w) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(w);
  }
  void add(CudaCounter* c) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(c);
  }
  void remove(CudaCounter* c) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(c);
  }
  void release_all_waits();

 private:
  static constexpr size_t kSlabBytes = 4096;
  std::mutex mutex_;
  std::vector<void*> slabs_;
  std::vector<Word> free_;
  std::set<CudaCounter*> live_;
};

class CudaCounter final : public HostCounter {
 public:
  CudaCounter(std::shared_ptr<CounterPool> pool, uint64_t initial) : pool_(std::move(pool)), word_(pool_->take()) {
    std::atomic_ref<uint64_t>(*word_.host).store(initial, std::memory_order_release);
    pool_->add(this);
  }
  ~CudaCounter() override {
    pool_->remove(this);
    pool_->give_back(word_);
  }
  uint64_t value() const override { return std::atomic_ref<uint64_t>(*word_.host).load(std::memory_order_acquire); }
  void advance_to(uint64_t v) override {
    std::atomic_ref<uint64_t> word(*word_.host);
    uint64_t cur = word.load(std::memory_order_acquire);
    // Release order: everything the host wrote before (the bf16 mirror, a consumed staging slot) is
    // visible to a stream that sees the new value.
    while (v > cur && !word.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
    }
  }
  // A stream is about to wait for `v`: remembered so an abort can release every wait.
  void note_wait(uint64_t v) {
    uint64_t cur = max_waited_.load(std::memory_order_relaxed);
    while (v > cur && !max_waited_.compare_exchange_weak(cur, v)) {
    }
  }
  // Raises the counter to the largest value any stream waited for (64- and 32-bit waits both end).
  void release_waits() { advance_to(max_waited_.load()); }
  const uint64_t* device_word() const { return word_.device; }

 private:
  std::shared_ptr<CounterPool> pool_;
  CounterPool::Word word_;
  std::atomic<uint64_t> max_waited_{0};
};

void CounterPool::release_all_waits() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (CudaCounter* c : live_) c->release_waits();
}

// ---- events ----------------------------------------------------------------------------------------

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaEvent_t event, const RunControl& control) : event_(event), control_(control) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }  // safe while still pending: freed when it completes
  bool done() const override {
    const cudaError_t r = cudaEventQuery(event_);
    if (r == cudaErrorNotReady) return false;
    SLIDEDP_CUDA_CHECK(r);
    return true;
  }
  void wait_host() const override {
    poll_until(control_, [&] { return done(); });
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
  const RunControl& control_;
};

// ---- tracing ---------------------------------------------------------------------------------------

// Spans come from timing events recorded around each traced operation; they are resolved into
// seconds lazily in take() (only spans whose stop event completed; the rest wait for the next call).
// Each device has an epoch event recorded, and waited for, at a known host time, so device times
// land on the host's trace clock.
// GPU spans on the host's clock. Each device has an epoch: a CUDA event recorded on an idle stream
// and synchronized, paired with the host time right after. A span's start is the epoch's host time
// plus the elapsed time from the epoch event; its length comes from its own start and stop events
// (about 0.5 us resolution). cudaEventElapsedTime returns float milliseconds, whose resolution decays
// with the distance from the epoch (62 us at 10 minutes), and the GPU's clock drifts from the
// host's, so the epoch is renewed once it is kEpochMaxAgeS old: float ms then resolve 4 us or better,
// and drift is corrected at every renewal.
class Tracer {
 public:
  static constexpr double kEpochMaxAgeS = 60.0;

  Tracer() : epoch_(Clock::now()) {}
  ~Tracer() {
    for (auto& p : pending_) p.destroy();
    for (auto& [device, e] : device_epochs_) {
      cudaEventDestroy(e.event);
      cudaStreamDestroy(e.stream);
    }
  }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set(bool on) { on_.store(on); }
  double now() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }

  // Called once per device at start-up.
  void add_device(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (device_epochs_.count(device)) return;  // ranks sharing a GPU share its epoch
    }
    DeviceGuard guard(device);
    DeviceEpoch e;
    SLIDEDP_CUDA_CHECK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
    anchor(e);
    std::lock_guard<std::mutex> lock(mutex_);
    device_epochs_[device] = e;
  }
  void add_pending(int device, int rank, const char* stream, const SpanTag& tag, cudaEvent_t start,
                   cudaEvent_t stop, double bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(Pending{device, rank, stream, tag, start, stop, bytes});
  }
  void add(const MeasuredSpan& span) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.push_back(span);
  }
  std::vector<MeasuredSpan> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    // The list is taken whole first: spans still running go back, finished ones are destroyed as
    // they are read, and on an error the unread rest goes back (never a destroyed event twice).
    std::deque<Pending> work = std::exchange(pending_, {});
    while (!work.empty()) {
      Pending p = work.front();
      work.pop_front();
      const cudaError_t r = cudaEventQuery(p.stop);
      if (r == cudaErrorNotReady) {
        pending_.push_back(p);
        continue;
      }
      try {
        SLIDEDP_CUDA_CHECK(r);
        const DeviceEpoch& e = device_epochs_.at(p.device);
        float from_epoch_ms = 0, length_ms = 0;
        SLIDEDP_CUDA_CHECK(cudaEventElapsedTime(&from_epoch_ms, e.event, p.start));
        SLIDEDP_CUDA_CHECK(cudaEventElapsedTime(&length_ms, p.start, p.stop));
        const double start_s = e.host_s + from_epoch_ms * 1e-3;
        done_.push_back(MeasuredSpan{p.rank, p.stream, p.tag, start_s, start_s + length_ms * 1e-3, p.bytes});
        p.destroy();
      } catch (...) {
        p.destroy();
        for (Pending& rest : work) pending_.push_back(rest);
        throw;
      }
    }
    renew_old_epochs();
    return std::exchange(done_, {});
  }

 private:
  struct Pending {
    int device, rank;
    const char* stream;
    SpanTag tag;
    cudaEvent_t start, stop;
    double bytes;  // a copy's (MeasuredSpan::bytes)
    void destroy() {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  };
  struct DeviceEpoch {
    cudaEvent_t event = nullptr;
    cudaStream_t stream = nullptr;  // idle: an event recorded there completes at once
    double host_s = 0;
  };
  // Records e's event on its idle stream, waits for it, and pairs it with the host's time (the
  // device must be current).
  void anchor(DeviceEpoch& e) {
    cudaEvent_t event = nullptr;
    SLIDEDP_CUDA_CHECK(cudaEventCreate(&event));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(event, e.stream));
    SLIDEDP_CUDA_CHECK(cudaEventSynchronize(event));
    const double host_s = now();
    if (e.event != nullptr) cudaEventDestroy(e.event);
    e.event = event;
    e.host_s = host_s;
  }
  void renew_old_epochs() {
    for (auto& [device, e] : device_epochs_)
      if (now() - e.host_s > kEpochMaxAgeS) {
        DeviceGuard guard(device);
        anchor(e);
      }
  }

  Clock::time_point epoch_;
  std::atomic<bool> on_{false};
  std::mutex mutex_;
  std::map<int, DeviceEpoch> device_epochs_;
  std::deque<Pending> pending_;
  std::vector<MeasuredSpan> done_;
};

// ---- streams ---------------------------------------------------------------------------------------

struct HostCall {
  std::function<void()> fn;
  RunControl* control;
};

// Runs on CUDA's callback thread, in stream order. Skipped after an abort, like the CPU backend's
// dropped work; exceptions fail the run.
void CUDART_CB run_host_call(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  if (call->control->aborted()) return;
  try {
    call->fn();
  } catch (const Aborted&) {
  } catch (...) {
    call->control->fail(std::current_exception());
  }
}

class CudaStream final : public Stream {
 public:
  // `urgent`: the device's highest priority, so the block scheduler starts this stream's kernels
  // before queued ones of normal streams (the comm stream's NCCL and reduction kernels, whose
  // deliveries the next units wait for, would otherwise queue behind large GEMMs; cuda-review D19).
  CudaStream(const char* name, int rank, int device, CounterWait wait_mode, RunControl& control, Tracer& tracer,
             bool urgent = false)
      : name_(name), rank_(rank), device_(device), wait_mode_(wait_mode), control_(control), tracer_(tracer) {
    DeviceGuard guard(device_);
    int least = 0, greatest = 0;
    SLIDEDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SLIDEDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, urgent ? greatest : least));
  }
  ~CudaStream() override {
    DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return name_; }
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

  EventPtr record() override {
    DeviceGuard guard(device_);
    cudaEvent_t e = nullptr;
    SLIDEDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SLIDEDP_CUDA_CHECK(cudaEventRecord(e, stream_));
    return std::make_shared<CudaEvent>(e, control_);
  }
  void wait(const EventPtr& event) override {
    if (!event) return;
    DeviceGuard guard(device_);
    SLIDEDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<const CudaEvent&>(*event).get(), 0));
  }
  void wait_counter(HostCounter& counter, uint64_t value) override {
    auto& c = static_cast<CudaCounter&>(counter);
    c.note_wait(value);
    DeviceGuard guard(device_);
    const auto addr = reinterpret_cast<CUdeviceptr>(c.device_word());
    switch (wait_mode_) {
      case CounterWait::kValue64:
        SLIDEDP_CUDA_CHECK(DriverApi::get().wait_value64(reinterpret_cast<CUstream>(stream_), addr, value,
                                                         CU_STREAM_WAIT_VALUE_GEQ));
        break;
      case CounterWait::kValue32:
        SLIDEDP_CUDA_CHECK(DriverApi::get().wait_value32(reinterpret_cast<CUstream>(stream_), addr,
                                                         static_cast<cuuint32_t>(value), CU_STREAM_WAIT_VALUE_GEQ));
        break;
      case CounterWait::kKernel:
        cuda_detail::enqueue_counter_wait_kernel(c.device_word(), value, stream_);
        break;
    }
  }
  void copy_h2d(const DeviceBuffer& dst, int64_t dst_offset, const std::byte* src, int64_t bytes,
                const SpanTag& tag) override {
    SLIDEDP_CHECK(dst_offset >= 0 && dst_offset + bytes <= dst.bytes, "copy_h2d past the end of the buffer");
    std::byte* d = dst.ptr + dst_offset;
    traced(
        tag,
        [&] {
          SLIDEDP_CUDA_CHECK(
              cudaMemcpyAsync(d, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
        },
        static_cast<double>(bytes));
  }
  void copy_d2h(std::byte* dst, const DeviceBuffer& src, int64_t src_offset, int64_t bytes,
                const SpanTag& tag) override {
    SLIDEDP_CHECK(src_offset >= 0 && src_offset + bytes <= src.bytes, "copy_d2h past the end of the buffer");
    const std::byte* s = src.ptr + src_offset;
    traced(
        tag,
        [&] {
          SLIDEDP_CUDA_CHECK(
              cudaMemcpyAsync(dst, s, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
        },
        static_cast<double>(bytes));
  }
  void host_fn(std::function<void()> fn) override {
    DeviceGuard guard(device_);
    auto* call = new HostCall{std::move(fn), &control_};
    const cudaError_t r = cudaLaunchHostFunc(stream_, run_host_call, call);
    if (r != cudaSuccess) delete call;
    SLIDEDP_CUDA_CHECK(r);
  }

  // Enqueues `launch` (which issues work on this stream) between two timing events when tracing;
  // `bytes`: a copy's, for its span.
  template <class Launch>
  void traced(const SpanTag& tag, Launch launch, double bytes = 0) {
    DeviceGuard guard(device_);
    if (!tracer_.on()) {
      launch();
      return;
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    try {  // the events are the tracer's once added; until then a throw must not leak them
      SLIDEDP_CUDA_CHECK(cudaEventCreate(&start));
      SLIDEDP_CUDA_CHECK(cudaEventCreate(&stop));
      SLIDEDP_CUDA_CHECK(cudaEventRecord(start, stream_));
      launch();
      SLIDEDP_CUDA_CHECK(cudaEventRecord(stop, stream_));
    } catch (...) {
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
      throw;
    }
    tracer_.add_pending(device_, rank_, name_, tag, start, stop, bytes);
  }

  // Blocks until the stream is idle; throws Aborted if the run aborts first.
  void synchronize() {
    EventPtr e = record();
    e->wait_host();
  }
  // Blocks until idle regardless of aborts (callers first release what the stream may wait on).
  void drain() noexcept {
    DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
  }

 private:
  const char* name_;
  int rank_, device_;
  CounterWait wait_mode_;
  RunControl& control_;
  Tracer& tracer_;
  cudaStream_t stream_ = nullptr;
};

// ---- device ----------------------------------------------------------------------------------------

int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

struct SharedMath {
  ModelCard card;
  ModelLayout layout;
  kernels::ModelSpecs specs;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int rank, int gpu, int64_t budget, const SharedMath& math, RunControl& control, Tracer& tracer)
      : rank_(rank),
        gpu_(gpu),
        math_(math),
        wait_mode_(choose_counter_wait(gpu)),
        compute_("compute", rank, gpu, wait_mode_, control, tracer),
        h2d_("h2d", rank, gpu, wait_mode_, control, tracer),
        d2h_("d2h", rank, gpu, wait_mode_, control, tracer),
        comm_("comm", rank, gpu, wait_mode_, control, tracer, /*urgent=*/true),
        blocks_(rank, cuda_driver(gpu)),
        budget_(rank, budget, blocks_) {
    DeviceGuard guard(gpu_);
    gemm_ = std::make_unique<kc::GemmContext>();
    tracer.add_device(gpu_);
  }
  ~CudaDevice() override {
    DeviceGuard guard(gpu_);
    cudaDeviceSynchronize();  // then budget_ gives its live blocks to blocks_, which frees them all
  }

  int rank() const override { return rank_; }
  int gpu() const { return gpu_; }
  CounterWait counter_wait() const { return wait_mode_; }
  Stream& compute() override { return compute_; }
  Stream& h2d() override { return h2d_; }
  Stream& d2h() override { return d2h_; }
  Stream& comm() override { return comm_; }
  CudaStream& comm_stream() { return comm_; }
  // One of this device's streams (null: compute).
  CudaStream& own(Stream* s) {
    for (CudaStream* c : {&compute_, &h2d_, &d2h_, &comm_})
      if (s == nullptr ? c == &compute_ : s == c) return *c;
    SLIDEDP_CHECK(false, "a stream of another device");
    return compute_;
  }

  void synchronize() {
    for (CudaStream* s : {&compute_, &h2d_, &d2h_, &comm_}) s->synchronize();
  }
  void drain() noexcept {
    for (CudaStream* s : {&compute_, &h2d_, &d2h_, &comm_}) s->drain();
  }

  // ---- memory: the budget (executor/device_budget.h) over cached cudaMalloc blocks ----
  // The budget counts each buffer's block (256-aligned request, or a cached block up to 25% larger
  // that fits the room); blocks_ keeps blocks in use plus idle ones within the budget.
  DeviceBuffer alloc(int64_t bytes, const char* what) override {
    SLIDEDP_CHECK(bytes >= 0);
    return budget_.alloc(align256(std::max<int64_t>(bytes, 1)), bytes, what);
  }
  void release(const DeviceBuffer& buffer, const EventPtr& after) override { budget_.release(buffer, after); }
  int64_t budget_bytes() const override { return budget_.budget_bytes(); }
  int64_t in_use_bytes() const override { return budget_.in_use_bytes(); }
  int64_t high_water_bytes() const override { return budget_.high_water_bytes(); }
  int64_t held_high_water_bytes() const override { return budget_.held_high_water_bytes(); }

  DType param_dtype() const override { return DType::kBF16; }
  DType activation_dtype() const override { return DType::kBF16; }

  // The arena's part of the account: the CUDA context and NCCL's buffers live outside the budget.
  RankMemorySpec memory_spec(int64_t B, int64_t T) const override {
    RankMemorySpec m;
    m.decoder = unit_memory(UnitKind::kDecoder, B, T);
    m.head = unit_memory(UnitKind::kHead, B, T);
    if (!math_.card.uniform_layers())
      m.decoder_by_layer = decoder_unit_memories(math_.card, math_.layout, B, T, memory_options());
    m.param_bytes = m.wire_bytes = 2;
    m.align_bytes = 256;  // alloc() rounds to 256 bytes and an empty request to one block
    m.zero_bytes_take_one = true;
    {
      DeviceGuard guard(gpu_);  // CUB sizes its sort scratch for the current device
      m.embedding_backward_scratch_bytes = kc::embedding_backward_workspace_bytes(math_.specs.embedding, B, T);
    }
    m.reduce_scatter_staging = true;
    m.router_stats_bytes = router_stats_bytes(math_.card, B);
    return m;
  }

  // ---- unit operations ----
  UnitMemory unit_memory(UnitKind kind, int64_t B, int64_t T) const override {
    return slidedp::unit_memory(math_.card, math_.layout, kind, B, T, memory_options());
  }

  void forward(const UnitOpArgs& a) override {
    const UnitKind kind = math_.layout.units[static_cast<size_t>(a.unit)].kind;
    const kc::UnitContext ctx = context();
    const auto& s = math_.specs;
    compute_.traced(tag(a, "fwd"), [&] {
      switch (kind) {
        case UnitKind::kEmbedding:
          kc::embedding_forward(ctx, s.embedding, bf(a.params), i32(a.tokens), a.B, a.T, bf(a.y));
          break;
        case UnitKind::kDecoder:
          std::visit(
              [&](const auto& spec) {
                kc::layer_forward(with_positions(ctx, a), spec, bf(a.params), bf(a.x), bf(a.y), ws(a.saved),
                                  a.B, a.T, ws(a.workspace), opt_ptr(router_stats_of(s, a)));
              },
              layer_spec(a));
          break;
        case UnitKind::kHead: {
          const kc::bf16* lm = s.head.tied ? bf(a.lm_head_params) + a.lm_head_offset : bf(a.params) + s.head.lm_head_w;
          double* loss = reinterpret_cast<double*>(a.loss.ptr);
          kc::head_forward_backward(ctx, s.head, bf(a.params), lm, bf(a.x), i32(a.targets), a.B, a.T, a.grad_scale,
                                    bf(a.dx), f32(a.grads), f32(a.lm_head_grads) + a.lm_head_grad_offset, loss,
                                    ws(a.workspace));
          // the load-balancing loss joins the loss sum in its units, as on the CPU backend
          if (const auto router = router_stats_of(s, a))
            kc::router_aux_loss_add(loss, *router, a.B, s.moe_experts(), 1.0 / a.grad_scale, ctx.stream);
          break;
        }
      }
    });
  }

  void recompute(const UnitOpArgs& a) override {
    const kc::UnitContext ctx = context();
    compute_.traced(tag(a, "recompute"), [&] {
      std::visit(
          [&](const auto& spec) {
            kc::layer_recompute(with_positions(ctx, a), spec, bf(a.params), bf(a.x), ws(a.saved), a.B, a.T,
                                ws(a.workspace));
          },
          layer_spec(a));
    });
  }

  void backward(const UnitOpArgs& a) override {
    const UnitKind kind = math_.layout.units[static_cast<size_t>(a.unit)].kind;
    const kc::UnitContext ctx = context();
    const auto& s = math_.specs;
    if (kind == UnitKind::kEmbedding) {
      DeviceGuard guard(gpu_);  // the scratch size query asks the current device
      // The sort scratch of the deterministic scatter-add: small (about 24 bytes per token), taken
      // here because the executor gives the embedding no workspace.
      DeviceBuffer scratch = alloc(kc::embedding_backward_workspace_bytes(s.embedding, a.B, a.T), "embedding sort scratch");
      compute_.traced(tag(a, "bwd"), [&] {
        kc::embedding_backward(ctx, s.embedding, i32(a.tokens), bf(a.dy), f32(a.grads), a.B, a.T, ws(scratch));
      });
      release(scratch, compute_.record());
      return;
    }
    SLIDEDP_CHECK(kind == UnitKind::kDecoder, "backward of the head is fused into its forward");
    compute_.traced(tag(a, "bwd"), [&] {
      std::visit(
          [&](const auto& spec) {
            kc::layer_backward(with_positions(ctx, a), spec, bf(a.params), bf(a.x), ws(a.saved), bf(a.dy),
                               bf(a.dx), f32(a.grads), a.B, a.T, ws(a.workspace),
                               opt_ptr(router_stats_of(s, a)));
          },
          layer_spec(a));
    });
  }

  void zero(const DeviceBuffer& buffer, int64_t offset_bytes, int64_t bytes) override {
    SLIDEDP_CHECK(offset_bytes >= 0 && offset_bytes + bytes <= buffer.bytes);
    DeviceGuard guard(gpu_);
    SLIDEDP_CUDA_CHECK(cudaMemsetAsync(buffer.ptr + offset_bytes, 0, static_cast<size_t>(bytes), compute_.get()));
  }

  void convert_fp32(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst, int64_t dst_offset,
                    DType dst_dtype, int64_t n, Stream* on) override {
    SLIDEDP_CHECK((src_offset + n) * 4 <= src.bytes && (dst_offset + n) * dtype_bytes(dst_dtype) <= dst.bytes);
    DeviceGuard guard(gpu_);
    cudaStream_t stream = own(on).get();
    const float* s = reinterpret_cast<const float*>(src.ptr) + src_offset;
    if (dst_dtype == DType::kBF16) {
      kc::f32_to_bf16(s, reinterpret_cast<kc::bf16*>(dst.ptr) + dst_offset, n, stream);
    } else {
      SLIDEDP_CHECK(dst_dtype == DType::kF32);
      SLIDEDP_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<float*>(dst.ptr) + dst_offset, s, static_cast<size_t>(n) * 4,
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }

  void widen_bf16(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst, int64_t dst_offset,
                  int64_t n, Stream& on) override {
    SLIDEDP_CHECK((src_offset + n) * 2 <= src.bytes && (dst_offset + n) * 4 <= dst.bytes);
    DeviceGuard guard(gpu_);
    kc::bf16_to_f32(reinterpret_cast<const kc::bf16*>(src.ptr) + src_offset,
                    reinterpret_cast<float*>(dst.ptr) + dst_offset, n, own(&on).get());
  }

  void add_fp32(const DeviceBuffer& dst, int64_t dst_offset, const DeviceBuffer& src, int64_t src_offset,
                int64_t n) override {
    SLIDEDP_CHECK((dst_offset + n) * 4 <= dst.bytes && (src_offset + n) * 4 <= src.bytes);
    DeviceGuard guard(gpu_);
    kc::add_f32(reinterpret_cast<float*>(dst.ptr) + dst_offset, reinterpret_cast<const float*>(src.ptr) + src_offset, n,
                compute_.get());
  }

  void count_nonfinite_fp32(const DeviceBuffer& src, int64_t offset, int64_t n, const DeviceBuffer& count) override {
    SLIDEDP_CHECK((offset + n) * 4 <= src.bytes && count.bytes >= 4, "non-finite count outside its buffers");
    DeviceGuard guard(gpu_);
    kc::count_nonfinite_f32(reinterpret_cast<const float*>(src.ptr) + offset, n,
                            reinterpret_cast<unsigned int*>(count.ptr), compute_.get());
  }

  void adamw(const DeviceAdamwArgs& a) override {
    for (const DeviceBuffer* b : {&a.param, &a.exp_avg, &a.exp_avg_sq, &a.grad})
      SLIDEDP_CHECK((a.offset + a.n) * 4 <= b->bytes, "device AdamW range outside its buffer");
    const kernels::AdamwConstants c = kernels::adamw_constants(a.hyper);
    SpanTag t;
    t.category = "compute";
    t.unit = a.unit;
    t.step = a.step;
    t.what = "adamw";
    auto at = [&](const DeviceBuffer& b) { return reinterpret_cast<float*>(b.ptr) + a.offset; };
    compute_.traced(t, [&] { kc::adamw(at(a.param), at(a.exp_avg), at(a.exp_avg_sq), at(a.grad), a.n, c, compute_.get()); });
  }

 private:
  // cudaMalloc / cudaFree on this device for the block cache (executor/block_cache.h).
  static BlockCache::Driver cuda_driver(int gpu) {
    BlockCache::Driver d;
    d.allocate = [gpu](int64_t bytes) -> std::byte* {
      DeviceGuard guard(gpu);
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear it: the cache frees idle blocks and may retry
        return nullptr;
      }
      SLIDEDP_CUDA_CHECK(e);
      return static_cast<std::byte*>(p);
    };
    d.free = [gpu](std::byte* p) {
      DeviceGuard guard(gpu);
      cudaFree(p);
    };
    d.describe = [gpu] {
      DeviceGuard guard(gpu);
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return fmt::format("GPU {} has {} free of {}", gpu, format_bytes(static_cast<double>(free_b)),
                         format_bytes(static_cast<double>(total_b)));
    };
    return d;
  }

  kc::UnitContext context() const {
    kc::UnitContext c;
    c.gemm = gemm_.get();
    c.stream = compute_.get();
    return c;
  }
  // A decoder operation's context: the micro-batch's document positions of packed sequences.
  static kc::UnitContext with_positions(kc::UnitContext c, const UnitOpArgs& a) {
    c.positions = a.positions.bytes > 0 ? reinterpret_cast<const int32_t*>(a.positions.ptr) : nullptr;
    return c;
  }
  SpanTag tag(const UnitOpArgs& a, const char* what) const { return compute_span_tag(a, what); }
  UnitMemoryOptions memory_options() const {
    UnitMemoryOptions o;
    o.code = UnitCode::kCuda;
    o.loss_chunk_tokens = math_.specs.head.loss_chunk_tokens;
    o.mlp_token_tile = math_.specs.mlp_token_tile;
    return o;
  }
  // The layer spec of a decoder unit (unit u holds layer u - 1), of the model's family.
  const kernels::LayerSpec& layer_spec(const UnitOpArgs& a) const { return math_.specs.layer(a.unit - 1); }
  static kc::bf16* bf(const DeviceBuffer& b) { return reinterpret_cast<kc::bf16*>(b.ptr); }
  static float* f32(const DeviceBuffer& b) { return reinterpret_cast<float*>(b.ptr); }
  static const int32_t* i32(const DeviceBuffer& b) { return reinterpret_cast<const int32_t*>(b.ptr); }
  static kc::DeviceWorkspace ws(const DeviceBuffer& b) { return kc::DeviceWorkspace{b.ptr, b.bytes}; }

  int rank_, gpu_;
  const SharedMath& math_;
  CounterWait wait_mode_;
  CudaStream compute_, h2d_, d2h_, comm_;
  std::unique_ptr<kc::GemmContext> gemm_;
  // Last, so they go first (after the destructor's device synchronize): budget_ gives its live blocks
  // to blocks_, then blocks_ frees every block.
  BlockCache blocks_;
  DeviceBudget budget_;
};

// The layer shapes the CUDA kernels take, checked before any GPU is looked for, so every machine
// says it naming the config key: the router's warp argmax holds at most kRouterMaxExperts experts, the
// Gated DeltaNet's per-head passes at most 256 channels a head.
void check_cuda_shapes(const ModelCard& card) {
  for (int l = 0; l < card.num_layers; ++l) {
    const LayerShape s = card.layer(l);
    if (s.moe() && s.num_experts > kc::kRouterMaxExperts)
      throw InputError(card.name + ": num_experts", fmt::format("{} experts; the CUDA router takes at most {}",
                                                                s.num_experts, kc::kRouterMaxExperts));
    if (s.linear() && (s.linear_k_dim > 256 || s.linear_v_dim > 256))
      throw InputError(card.name + ": linear_key_head_dim / linear_value_head_dim",
                       fmt::format("{} / {}; the CUDA Gated DeltaNet takes head dims up to 256", s.linear_k_dim,
                                   s.linear_v_dim));
  }
}

// ---- backend ---------------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelCard& card, const ModelLayout& layout, const BackendOptions& opt, RunControl& control)
      : control_(control), counters_(std::make_shared<CounterPool>()) {
    SLIDEDP_CHECK(opt.devices >= 1);
    if (opt.exact_fp32)
      throw InputError("--exact", "the CUDA backend delivers and computes in bf16; the exact fp32 mode is CPU-only");
    check_cuda_shapes(card);
    gpus_ = cuda_visible_devices();
    if (gpus_ == 0) throw RuntimeError("the CUDA backend found no GPU (cudaGetDeviceCount reports none or fails)");
    const int per_gpu = (opt.devices + gpus_ - 1) / gpus_;
    if (per_gpu > kernels::cuda::kMaxRanksPerGpu)
      throw InputError("ranks", fmt::format("{} ranks on {} GPUs put {} on one GPU: their {} streams need more hardware queues "
                                            "than CUDA gives a process ({}); at most {} ranks per GPU",
                                            opt.devices, gpus_, per_gpu, kernels::cuda::kStreamsPerRank * per_gpu,
                                            kernels::cuda::kMaxConnections, kernels::cuda::kMaxRanksPerGpu));
    math_.card = card;
    math_.layout = layout;
    math_.specs = kernels::make_model_specs(card, layout);
    math_.specs.head.loss_chunk_tokens = opt.loss_chunk_tokens;
    math_.specs.set_mlp_token_tile(opt.mlp_token_tile);
    // Unless told, each rank gets its GPU's share of the memory minus the plan's reserve (the
    // smallest GPU in use sets it, so every rank has the same budget, as the plan assumes).
    int64_t budget = opt.device_budget_bytes;
    if (budget <= 0) {
      int64_t smallest = 0;
      for (int g = 0; g < std::min(gpus_, opt.devices); ++g) {
        const int64_t total = kc::device_total_bytes(g);
        smallest = smallest == 0 ? total : std::min(smallest, total);
      }
      budget = default_gpu_budget_bytes(smallest, opt.device_reserve_bytes, per_gpu);
    }
    for (int r = 0; r < opt.devices; ++r)
      devices_.push_back(std::make_unique<CudaDevice>(r, r % gpus_, budget, math_, control, tracer_));
    cross_node_ = opt.cross_node;
    if (opt.collectives) create_communicators(budget);
    if (opt.kernel_activity) {
      cupti_ = std::make_unique<CuptiActivity>();
      for (auto& d : devices_)
        for (Stream* s : {&d->compute(), &d->h2d(), &d->d2h(), &d->comm()})
          cupti_streams_.push_back({static_cast<uint32_t>(d->gpu()), cupti_->stream_id(static_cast<CudaStream*>(s)->get()),
                                    d->rank(), s->name()});
      cupti_clock_ = ActivityClock{cupti_->timestamp_ns(), tracer_.now()};
    }
  }

  ~CudaBackend() override {
    quiesce();
    if (!comms_aborted_)
      for (const auto* set : {&comms_, &world_comms_})
        for (ncclComm_t c : *set)
          if (c != nullptr) ncclCommDestroy(c);
    devices_.clear();
    for (auto& [ptr, bytes] : registered_) cudaHostUnregister(ptr);
  }

  std::string name() const override { return "cuda"; }
  int num_devices() const override { return static_cast<int>(devices_.size()); }
  std::string describe() const {
    std::string s;
    for (const auto& d : devices_)
      s += fmt::format("rank {}: GPU {} {}, counter waits by {}\n", d->rank(), d->gpu(),
                       kc::device_description(d->gpu()), counter_wait_name(d->counter_wait()));
    return s;
  }
  Device& device(int rank) override { return *devices_.at(static_cast<size_t>(rank)); }

  HostBytes host_bytes_allocated() const override { return {host_bytes_.load(), pinned_bytes_.load()}; }

  HostBuffer alloc_host(int64_t bytes, bool pinned) override {
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 64));
    host_bytes_ += bytes;
    if (pinned) pinned_bytes_ += bytes;
    if (pinned) {
      void* p = nullptr;
      const cudaError_t r = cudaHostAlloc(&p, n, cudaHostAllocPortable);
      if (r == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        throw InfeasibleError(fmt::format("cannot pin {} of host memory (cudaHostAlloc failed)",
                                          format_bytes(static_cast<double>(bytes))));
      }
      SLIDEDP_CUDA_CHECK(r);
      std::memset(p, 0, n);
      return HostBuffer{static_cast<std::byte*>(p), bytes, std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); })};
    }
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
    if (!p) throw RuntimeError(fmt::format("out of host memory allocating {}", format_bytes(static_cast<double>(bytes))));
    std::memset(p, 0, n);
    return HostBuffer{p, bytes, std::shared_ptr<void>(p, [](void* q) { std::free(q); })};
  }

  void register_host(std::byte* ptr, int64_t bytes) override {
    SLIDEDP_CUDA_CHECK(cudaHostRegister(ptr, static_cast<size_t>(bytes), cudaHostRegisterPortable));
    std::lock_guard<std::mutex> lock(mutex_);
    registered_.emplace_back(ptr, bytes);
  }

  std::unique_ptr<HostCounter> make_counter(uint64_t initial) override {
    return std::make_unique<CudaCounter>(counters_, initial);
  }

  // all_gather in place. Equal shards: one ncclAllGather (rank r's shard already sits at r * shard).
  // Unequal shards (count % ranks != 0): one grouped ncclBroadcast per rank of its shard, in place.
  void all_gather(int rank, const DeviceBuffer& buffer, int64_t offset, int64_t count, DType dtype,
                  const SpanTag& tag) override {
    const int ranks = num_devices();
    const int64_t esize = dtype_bytes(dtype);
    SLIDEDP_CHECK((offset + count) * esize <= buffer.bytes, "all_gather past the end of the buffer");
    ncclComm_t comm = communicator(comms_, rank);
    CudaDevice& dev = *devices_[static_cast<size_t>(rank)];
    std::byte* base = buffer.ptr + offset * esize;
    cudaStream_t stream = dev.comm_stream().get();
    dev.comm_stream().traced(tag, [&] {
      if (count % ranks == 0) {
        const size_t shard = static_cast<size_t>(count / ranks * esize);
        SLIDEDP_CUDA_CHECK(ncclAllGather(base + rank * shard, base, shard, ncclUint8, comm, stream));
      } else {
        SLIDEDP_CUDA_CHECK(ncclGroupStart());
        for (int r = 0; r < ranks; ++r) {
          const ShardRange s = shard_range(count, ranks, r);
          std::byte* p = base + s.begin * esize;
          SLIDEDP_CUDA_CHECK(ncclBroadcast(p, p, static_cast<size_t>(s.size() * esize), ncclUint8, r, comm, stream));
        }
        SLIDEDP_CUDA_CHECK(ncclGroupEnd());
      }
    });
  }

  // reduce_scatter: the fp32 sum, in rank order, of every rank's piece of this rank's shard. Within a
  // node the pieces travel in the input dtype (an all-to-all through NCCL point-to-point calls) and
  // are summed on this GPU in rank order, so the result is bitwise the cpu route's
  // (shard_exchange_plan.h). Across nodes (cross_node_) the node's network carries a ring
  // reduce-scatter on the communicator of every node's GPUs (rank node * N + rank): a bf16 input is
  // widened to fp32 first, and NCCL adds in its ring order, so the result matches the cpu route to
  // fp32 rounding; unequal shards take one grouped ncclReduce per rank.
  void reduce_scatter(int rank, const DeviceBuffer& input, int64_t in_offset, DType in_dtype, int64_t count,
                      const DeviceBuffer& output, int64_t out_offset, const SpanTag& tag) override {
    const int N = num_devices();
    const int ranks = cross_node_ ? cross_node_->nodes() * N : N;
    const int me = cross_node_ ? cross_node_->node() * N + rank : rank;
    const int64_t esize = dtype_bytes(in_dtype);
    SLIDEDP_CHECK(in_dtype == DType::kBF16 || in_dtype == DType::kF32, "reduce_scatter input must be bf16 or fp32");
    SLIDEDP_CHECK((in_offset + count) * esize <= input.bytes, "reduce_scatter input past the end");
    const ShardRange mine = shard_range(count, ranks, me);
    SLIDEDP_CHECK((out_offset + mine.size()) * 4 <= output.bytes, "reduce_scatter output too small");
    ncclComm_t comm = cross_node_ ? communicator(world_comms_, rank) : communicator(comms_, rank);
    CudaDevice& dev = *devices_[static_cast<size_t>(rank)];
    CudaStream& cs = dev.comm_stream();
    float* out = reinterpret_cast<float*>(output.ptr) + out_offset;
    const std::byte* in = input.ptr + in_offset * esize;
    if (!cross_node_) {
      const kc::ShardExchangePlan plan = kc::shard_exchange_plan(count, ranks, me);
      DeviceBuffer received;
      if (plan.received_numel > 0) received = dev.alloc(plan.received_numel * esize, "reduce-scatter receive staging");
      cs.traced(tag, [&] {
        kc::exchange_shards(in, esize, plan, received.ptr, comm, cs.get());
        kc::sum_received_shards(in, received.ptr, in_dtype == DType::kBF16, plan, me, ranks, out, cs.get());
      });
      if (received) dev.release(received, cs.record());
      return;
    }
    DeviceBuffer wide;  // (count) fp32 copy of a bf16 input
    const float* send = reinterpret_cast<const float*>(in);
    if (in_dtype == DType::kBF16) {
      wide = dev.alloc(count * 4, "reduce-scatter fp32 staging");
      send = reinterpret_cast<const float*>(wide.ptr);
    }
    cs.traced(tag, [&] {
      if (in_dtype == DType::kBF16)
        kc::bf16_to_f32(reinterpret_cast<const kc::bf16*>(in), reinterpret_cast<float*>(wide.ptr), count, cs.get());
      if (count % ranks == 0) {
        SLIDEDP_CUDA_CHECK(ncclReduceScatter(send, out, static_cast<size_t>(count / ranks), ncclFloat32, ncclSum, comm,
                                             cs.get()));
      } else {
        SLIDEDP_CUDA_CHECK(ncclGroupStart());
        for (int r = 0; r < ranks; ++r) {
          const ShardRange s = shard_range(count, ranks, r);
          float* recv = r == me ? out : const_cast<float*>(send + s.begin);  // ignored off the root
          SLIDEDP_CUDA_CHECK(
              ncclReduce(send + s.begin, recv, static_cast<size_t>(s.size()), ncclFloat32, ncclSum, r, comm, cs.get()));
        }
        SLIDEDP_CUDA_CHECK(ncclGroupEnd());
      }
    });
    if (wide) dev.release(wide, cs.record());
  }

  void set_tracing(bool on) override { tracer_.set(on); }
  bool tracing() const override { return tracer_.on(); }
  double trace_clock_s() const override { return tracer_.now(); }
  void add_span(const MeasuredSpan& s) override { tracer_.add(s); }
  std::vector<MeasuredSpan> take_spans() override {
    std::vector<MeasuredSpan> spans = tracer_.take();
    if (cupti_) {  // each kernel, copy and memset on the timeline, under the span that launched it
      AttributedActivities k = attribute_activities(cupti_->take(), cupti_streams_, cupti_clock_, spans, cupti_names_);
      spans.insert(spans.end(), k.spans.begin(), k.spans.end());
    }
    return spans;
  }

  void synchronize() override {
    for (auto& d : devices_) d->synchronize();
  }

  void quiesce() override {
    if (control_.aborted()) {
      // Nothing queued may wait forever: counters reach every waited value, NCCL stops its kernels.
      counters_->release_all_waits();
      std::lock_guard<std::mutex> lock(comm_mutex_);
      if (!comms_.empty() && !comms_aborted_) {
        for (const auto* set : {&comms_, &world_comms_})
          for (ncclComm_t c : *set)
            if (c != nullptr) ncclCommAbort(c);
        comms_aborted_ = true;
      }
    }
    for (auto& d : devices_) d->drain();
  }

 private:
  std::atomic<int64_t> host_bytes_{0}, pinned_bytes_{0};  // what alloc_host gave out
  // Every rank's communicator, created together before the first step (a plan with collectives),
  // so their device buffers (channels x peers x protocols: hundreds of MB to GBs per rank) are taken
  // before the arenas fill, and a GPU that then cannot hold the arena's budget is refused now, with
  // the measured NCCL bytes, instead of running out of memory in the middle of a step.
  void create_communicators(int64_t budget) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    const int ranks = num_devices();
    if (ranks > gpus_)
      throw InfeasibleError(fmt::format(
          "{} ranks share {} GPU(s): the sharded parameter route and the gpu gradient route need one GPU per rank "
          "(NCCL); use the replicated route and the cpu gradient route",
          ranks, gpus_));
    std::vector<int> devs;
    std::vector<size_t> free_before;
    for (auto& d : devices_) {
      devs.push_back(d->gpu());
      DeviceGuard guard(d->gpu());
      size_t free = 0, total = 0;
      SLIDEDP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      free_before.push_back(free);
    }
    comms_.assign(static_cast<size_t>(ranks), nullptr);
    {
      int current = 0;
      SLIDEDP_CUDA_CHECK(cudaGetDevice(&current));  // NCCL's init visits every device
      struct Restore {
        int device;
        ~Restore() { cudaSetDevice(device); }
      } restore{current};
      SLIDEDP_CUDA_CHECK(ncclCommInitAll(comms_.data(), ranks, devs.data()));
      if (cross_node_) create_world_communicators(devs);
      open_connections(devs);
    }
    for (size_t r = 0; r < devices_.size(); ++r) {
      DeviceGuard guard(devs[r]);
      size_t free = 0, total = 0;
      SLIDEDP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      const int64_t nccl = static_cast<int64_t>(free_before[r]) - static_cast<int64_t>(free);
      if (static_cast<int64_t>(free) < budget)
        throw InfeasibleError(fmt::format(
            "GPU {}: NCCL's communicator took {:.2f} GiB; {:.2f} GiB remain free, less than the device budget of "
            "{:.2f} GiB per rank (lower --device-budget, or raise the hardware profile's gpu.collective_bytes so the "
            "planner charges it)",
            devs[r], nccl / 1073741824.0, static_cast<double>(free) / 1073741824.0, budget / 1073741824.0));
    }
  }

  // NCCL opens a peer's point-to-point connection (and, with runtime connection, a collective
  // algorithm's) at its first transfer, taking device buffers then. One byte exchanged between every
  // pair of ranks (the gpu route's shard exchange) and one all-gather (the sharded delivery) open
  // them now, so the free memory measured next counts them. An algorithm NCCL picks only for larger
  // messages may still connect later.
  void open_connections(const std::vector<int>& devs) {
    const int ranks = num_devices();
    std::vector<DeviceScratch> bytes;
    for (int r = 0; r < ranks; ++r) bytes.emplace_back(devs[static_cast<size_t>(r)], 3 * int64_t{ranks});
    SLIDEDP_CUDA_CHECK(ncclGroupStart());
    for (int r = 0; r < ranks; ++r) {
      const auto ri = static_cast<size_t>(r);
      SLIDEDP_CUDA_CHECK(cudaSetDevice(devs[ri]));
      std::byte* base = bytes[ri].ptr;
      cudaStream_t stream = devices_[ri]->comm_stream().get();
      kc::exchange_shards(base, 1, kc::shard_exchange_plan(ranks, ranks, r), base + ranks, comms_[ri], stream);
      std::byte* gathered = base + 2 * ranks;  // apart from the exchange's bytes: a group may run both at once
      SLIDEDP_CUDA_CHECK(ncclAllGather(gathered + r, gathered, 1, ncclUint8, comms_[ri], stream));
    }
    SLIDEDP_CUDA_CHECK(ncclGroupEnd());
    for (int r = 0; r < ranks; ++r) {
      SLIDEDP_CUDA_CHECK(cudaSetDevice(devs[static_cast<size_t>(r)]));
      SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(devices_[static_cast<size_t>(r)]->comm_stream().get()));
    }
  }

  // A few bytes of device memory outside the arena, for the connection warm-up.
  struct DeviceScratch {
    int device = 0;
    std::byte* ptr = nullptr;
    DeviceScratch(int dev, int64_t n) : device(dev) {
      SLIDEDP_CUDA_CHECK(cudaSetDevice(dev));
      SLIDEDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), static_cast<size_t>(n)));
    }
    DeviceScratch(DeviceScratch&& o) noexcept : device(o.device), ptr(std::exchange(o.ptr, nullptr)) {}
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    DeviceScratch& operator=(DeviceScratch&&) = delete;
    ~DeviceScratch() {
      if (ptr == nullptr) return;
      cudaSetDevice(device);
      cudaFree(ptr);
    }
  };

  // The gpu route across nodes: one communicator over every node's GPUs. Node 0's unique id reaches
  // every node over MPI (the link's blocking all-gather, which every node calls here, in the same
  // place of its start-up); each node then joins with its GPUs as ranks node * N .. node * N + N-1.
  void create_world_communicators(const std::vector<int>& devs) {
    NodeLink& link = *cross_node_;
    const int N = num_devices();
    ncclUniqueId id{};
    if (link.node() == 0) SLIDEDP_CUDA_CHECK(ncclGetUniqueId(&id));
    const std::vector<std::byte> ids =
        link.all_gather(reinterpret_cast<const std::byte*>(&id), sizeof(id), "node 0's NCCL unique id");
    std::memcpy(&id, ids.data(), sizeof(id));  // node 0's
    world_comms_.assign(static_cast<size_t>(N), nullptr);
    SLIDEDP_CUDA_CHECK(ncclGroupStart());
    for (int r = 0; r < N; ++r) {
      SLIDEDP_CUDA_CHECK(cudaSetDevice(devs[static_cast<size_t>(r)]));
      SLIDEDP_CUDA_CHECK(ncclCommInitRank(&world_comms_[static_cast<size_t>(r)], link.nodes() * N, id, link.node() * N + r));
    }
    SLIDEDP_CUDA_CHECK(ncclGroupEnd());
  }

  // The communicator of `rank` in `set` (create_communicators made them all).
  ncclComm_t communicator(const std::vector<ncclComm_t>& set, int rank) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (comms_aborted_) throw Aborted{};
    SLIDEDP_CHECK(!set.empty(), "a collective ran, but the backend was built without collectives (BackendOptions)");
    return set.at(static_cast<size_t>(rank));
  }

  RunControl& control_;
  int gpus_ = 0;
  SharedMath math_;
  Tracer tracer_;
  std::shared_ptr<CounterPool> counters_;
  std::vector<std::unique_ptr<CudaDevice>> devices_;
  // --trace-kernels: CUPTI's records, the executor's streams by CUPTI id, the two clocks' pairing,
  // and the kernel names the spans' tags point at.
  std::unique_ptr<CuptiActivity> cupti_;
  std::vector<ActivityStream> cupti_streams_;
  ActivityClock cupti_clock_;
  std::set<std::string> cupti_names_;
  std::mutex mutex_;
  std::vector<std::pair<std::byte*, int64_t>> registered_;
  std::mutex comm_mutex_;
  std::vector<ncclComm_t> comms_;        // the node's GPUs
  std::vector<ncclComm_t> world_comms_;  // every node's GPUs (the gpu route across nodes)
  NodeLink* cross_node_ = nullptr;
  bool comms_aborted_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelCard& card, const ModelLayout& layout,
                                           const BackendOptions& options, RunControl& control) {
  // The GPUs are not counted yet (counting starts CUDA): as if every rank shared one.
  kernels::cuda::prepare_cuda_environment(options.devices);
  return std::make_unique<CudaBackend>(card, layout, options, control);
}

std::string describe_cuda_backend(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->describe() : std::string();
}

}  // namespace slidedp::exec
