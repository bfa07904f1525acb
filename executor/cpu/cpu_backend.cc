// CPU backend; see cpu_backend.h. Layout of this file: tracing, events and counters, streams (one
// worker thread each), device memory, unit operations, collectives, the backend.
#include "executor/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "card/shard_range.h"
#include "common/bf16.h"
#include "common/error.h"
#include "common/units.h"
#include "executor/device_budget.h"
#include "executor/router_stats_of.h"
#include "executor/target_pacing.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/bf16_params.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/embedding_unit.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/layer_dispatch.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/router_aux_loss.h"
#include "model/copy_bytes.h"

namespace slidedp::exec {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kF32: return "fp32";
    case DType::kI32: return "int32";
    case DType::kF64: return "fp64";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;
int64_t align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// ---- tracing ---------------------------------------------------------------------------------------

class Tracer {
 public:
  Tracer() : epoch_(Clock::now()) {}
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set(bool on) { on_.store(on); }
  double now() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }
  void add(int rank, const std::string& stream, const SpanTag& tag, double start, double end,
           double bytes = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.push_back({rank, stream, tag, start, end, bytes});
  }
  std::vector<MeasuredSpan> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(spans_, {});
  }

 private:
  Clock::time_point epoch_;
  std::atomic<bool> on_{false};
  std::mutex mutex_;
  std::vector<MeasuredSpan> spans_;
};

// ---- events and counters ---------------------------------------------------------------------------

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(const RunControl& control) : control_(control) {}
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    cv_.notify_all();
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void wait_host() const override {
    std::unique_lock<std::mutex> lock(mutex_);
    control_.wait(lock, cv_, [&] { return done_; });
  }

 private:
  const RunControl& control_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
};

class CpuCounter final : public HostCounter {
 public:
  CpuCounter(uint64_t initial, const RunControl& control) : value_(initial), control_(control) {}
  uint64_t value() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return value_;
  }
  void advance_to(uint64_t v) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (v > value_) value_ = v;
    cv_.notify_all();
  }
  void wait_at_least(uint64_t v) const {
    std::unique_lock<std::mutex> lock(mutex_);
    control_.wait(lock, cv_, [&] { return value_ >= v; });
  }

 private:
  uint64_t value_;
  const RunControl& control_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
};

// ---- streams ---------------------------------------------------------------------------------------

class CpuStream final : public Stream {
 public:
  // `pacing` (may be null): hold each operation until the target machine would have finished it; a
  // copy the model charges is paced by its elements (the bytes here over its tag's element size) at
  // the bytes per element the target moves.
  CpuStream(std::string name, int rank, RunControl& control, Tracer& tracer, const TargetPacing* pacing)
      : name_(std::move(name)), rank_(rank), control_(control), tracer_(tracer), pacing_(pacing) {
    worker_ = std::thread([this] { loop(); });
  }
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  const char* name() const override { return name_.c_str(); }

  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
      ++pending_;
    }
    cv_.notify_all();
  }

  // Runs `fn` as a traced span when tracing is on; with pacing, the span lasts until the target
  // would be done with `paced` (the work itself is done first, in full).
  void enqueue_traced(const SpanTag& tag, std::function<void()> fn, std::optional<PacedWork> paced = std::nullopt) {
    enqueue_span(tag, std::move(fn), std::move(paced), 0.0);
  }
  // A copy of `bytes` here: its span carries the bytes the target moves when paced (the pacer's
  // work), else `bytes`.
  void enqueue_copy(const SpanTag& tag, std::function<void()> fn, int64_t bytes, bool h2d) {
    std::optional<PacedWork> paced = paced_copy(h2d, bytes, tag);
    const double span_bytes = paced ? paced->work : static_cast<double>(bytes);
    enqueue_span(tag, std::move(fn), std::move(paced), span_bytes);
  }
  void enqueue_span(const SpanTag& tag, std::function<void()> fn, std::optional<PacedWork> paced,
                    double bytes) {
    if (!pacing_) paced.reset();
    enqueue([this, tag, fn = std::move(fn), paced = std::move(paced), bytes] {
      const double start = tracer_.on() ? tracer_.now() : 0.0;
      const int flow = paced ? pacing_->pacer().begin(paced->usages, paced->work, paced->delay_s) : -1;
      fn();
      if (flow >= 0) pacing_->pacer().finish(flow);
      if (tracer_.on()) tracer_.add(rank_, name_, tag, start, tracer_.now(), bytes);
    });
  }

  // A collective's span on this rank is its fabric work: from the rendezvous (every rank has
  // arrived) to the end of this rank's own copies or sums. `fn` calls `started()` and `done()` there.
  // The waits around it, for the other ranks to arrive and then to finish reading this rank's
  // buffer, are synchronisation (the model's collective starts when all ranks are ready and takes
  // the fabric's time), not fabric time.
  using CollectiveStamp = std::function<void()>;
  void enqueue_collective(const SpanTag& tag,
                          std::function<void(const CollectiveStamp& started, const CollectiveStamp& done)> fn) {
    enqueue([this, tag, fn = std::move(fn)] {
      double start = tracer_.on() ? tracer_.now() : 0.0, end = -1.0;
      fn([&] {
        if (tracer_.on()) start = tracer_.now();
      },
         [&] {
           if (tracer_.on()) end = tracer_.now();
         });
      if (tracer_.on()) tracer_.add(rank_, name_, tag, start, end >= 0 ? end : tracer_.now());
    });
  }

  EventPtr record() override {
    auto e = std::make_shared<CpuEvent>(control_);
    enqueue([e] { e->set(); });
    return e;
  }
  void wait(const EventPtr& event) override {
    if (!event) return;
    enqueue([event] { event->wait_host(); });
  }
  void wait_counter(HostCounter& counter, uint64_t value) override {
    auto* c = static_cast<CpuCounter*>(&counter);
    enqueue([c, value] { c->wait_at_least(value); });
  }
  void copy_h2d(const DeviceBuffer& dst, int64_t dst_offset, const std::byte* src, int64_t bytes,
                const SpanTag& tag) override {
    SLIDEDP_CHECK(dst_offset >= 0 && dst_offset + bytes <= dst.bytes, "copy_h2d past the end of the buffer");
    std::byte* d = dst.ptr + dst_offset;
    enqueue_copy(
        tag, [d, src, bytes] { std::memcpy(d, src, static_cast<size_t>(bytes)); }, bytes, true);
  }
  void copy_d2h(std::byte* dst, const DeviceBuffer& src, int64_t src_offset, int64_t bytes,
                const SpanTag& tag) override {
    SLIDEDP_CHECK(src_offset >= 0 && src_offset + bytes <= src.bytes, "copy_d2h past the end of the buffer");
    const std::byte* s = src.ptr + src_offset;
    enqueue_copy(
        tag, [dst, s, bytes] { std::memcpy(dst, s, static_cast<size_t>(bytes)); }, bytes, false);
  }
  void host_fn(std::function<void()> fn) override { enqueue(std::move(fn)); }

  // Blocks until everything queued so far has run (or the run aborts).
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    control_.wait(lock, idle_cv_, [&] { return pending_ == 0; });
  }
  // Blocks until idle, also after an abort (queued tasks are then skipped, running ones give up).
  void quiesce() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  // A copy of `bytes` here, paced at what the target moves: the elements counted with this backend's
  // sizes (parameters and their gradients as delivered: bf16, or fp32 with --exact; the gpu route's
  // shards and activations in fp32), weighed by the step model's bytes per element; what the model
  // does not charge (token ids, the loss) as it is.
  std::optional<PacedWork> paced_copy(bool h2d, int64_t bytes, const SpanTag& tag) const {
    if (!pacing_) return std::nullopt;
    const std::optional<CopyKind> kind = copy_kind_of(tag.what);
    if (!kind) return pacing_->copy(rank_, h2d, static_cast<double>(bytes));
    SLIDEDP_CHECK(tag.element_bytes > 0,
                  std::string("a copy the model charges has no element size: ") + tag.what);
    return pacing_->copy(rank_, h2d, *kind, static_cast<double>(bytes) / tag.element_bytes);
  }

  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      // After an abort the remaining work is dropped: nothing it produces can be used.
      if (!control_.aborted()) {
        try {
          task();
        } catch (const Aborted&) {
        } catch (...) {
          control_.fail(std::current_exception());
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      idle_cv_.notify_all();
    }
  }

  std::string name_;
  int rank_;
  RunControl& control_;
  Tracer& tracer_;
  const TargetPacing* pacing_;
  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  int64_t pending_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

// ---- collectives -----------------------------------------------------------------------------------

// Rendezvous of the N ranks' parts of one collective call, identified by its sequence number (every
// rank issues collectives in the same order). Two phases: all arrive (inputs readable), all finish
// (inputs may be reused).
class CpuComm {
 public:
  CpuComm(int ranks, const RunControl& control) : ranks_(ranks), control_(control) {}

  int64_t next_sequence(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (seq_.empty()) seq_.assign(static_cast<size_t>(ranks_), 0);
    return seq_[static_cast<size_t>(rank)]++;
  }

  // Publishes this rank's pointer for call `seq`; returns every rank's once all have arrived.
  std::vector<const std::byte*> arrive(int64_t seq, int rank, const std::byte* ptr) {
    std::unique_lock<std::mutex> lock(mutex_);
    State& s = calls_[seq];
    if (s.ptrs.empty()) s.ptrs.assign(static_cast<size_t>(ranks_), nullptr);
    s.ptrs[static_cast<size_t>(rank)] = ptr;
    ++s.arrived;
    cv_.notify_all();
    control_.wait(lock, cv_, [&] { return calls_[seq].arrived == ranks_; });
    return calls_[seq].ptrs;
  }

  // Waits until every rank finished reading the others' buffers.
  void finish(int64_t seq) {
    std::unique_lock<std::mutex> lock(mutex_);
    State& s = calls_[seq];
    ++s.finished;
    cv_.notify_all();
    control_.wait(lock, cv_, [&] { return calls_[seq].finished == ranks_; });
    if (++calls_[seq].left == ranks_) calls_.erase(seq);
  }

 private:
  struct State {
    std::vector<const std::byte*> ptrs;
    int arrived = 0, finished = 0, left = 0;
  };
  int ranks_;
  const RunControl& control_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int64_t> seq_;
  std::map<int64_t, State> calls_;
};

// ---- device ----------------------------------------------------------------------------------------

struct SharedMath {
  ModelCard card;
  ModelLayout layout;
  kernels::ModelSpecs specs;
  bool exact = false;
  const TargetPacing* pacing = nullptr;  // null: run at this host's speed
};

class CpuDevice final : public Device {
 public:
  CpuDevice(int rank, int64_t budget, const SharedMath& math, RunControl& control, Tracer& tracer)
      : rank_(rank),
        math_(math),
        compute_("compute", rank, control, tracer, math.pacing),
        h2d_("h2d", rank, control, tracer, math.pacing),
        d2h_("d2h", rank, control, tracer, math.pacing),
        comm_("comm", rank, control, tracer, math.pacing),
        blocks_(rank),
        budget_(rank, budget, blocks_) {}

  int rank() const override { return rank_; }
  Stream& compute() override { return compute_; }
  Stream& h2d() override { return h2d_; }
  Stream& d2h() override { return d2h_; }
  Stream& comm() override { return comm_; }
  CpuStream& comm_stream() { return comm_; }
  CpuStream& compute_stream() { return compute_; }

  void synchronize() {
    for (CpuStream* s : {&compute_, &h2d_, &d2h_, &comm_}) s->synchronize();
  }
  void quiesce() {
    for (CpuStream* s : {&compute_, &h2d_, &d2h_, &comm_}) s->quiesce();
  }

  // ---- memory: the budget (executor/device_budget.h) over 64-byte-aligned host blocks ----
  DeviceBuffer alloc(int64_t bytes, const char* what) override {
    SLIDEDP_CHECK(bytes >= 0);
    return budget_.alloc(align64(bytes), bytes, what);
  }
  void release(const DeviceBuffer& buffer, const EventPtr& after) override { budget_.release(buffer, after); }
  int64_t budget_bytes() const override { return budget_.budget_bytes(); }
  int64_t in_use_bytes() const override { return budget_.in_use_bytes(); }
  int64_t high_water_bytes() const override { return budget_.high_water_bytes(); }
  int64_t held_high_water_bytes() const override { return budget_.held_high_water_bytes(); }

  DType param_dtype() const override { return math_.exact ? DType::kF32 : DType::kBF16; }
  DType activation_dtype() const override { return DType::kF32; }

  RankMemorySpec memory_spec(int64_t B, int64_t T) const override {
    RankMemorySpec m;
    m.decoder = unit_memory(UnitKind::kDecoder, B, T);
    m.head = unit_memory(UnitKind::kHead, B, T);
    if (!math_.card.uniform_layers()) m.decoder_by_layer = decoder_unit_memories(math_.card, math_.layout, B, T, memory_options());
    m.router_stats_bytes = router_stats_bytes(math_.card, B);
    m.param_bytes = m.wire_bytes = dtype_bytes(param_dtype());
    m.align_bytes = 64;  // alloc() rounds to 64 bytes; an empty request takes none
    m.zero_bytes_take_one = false;
    return m;  // the emulated devices' operations allocate nothing of their own
  }

  // ---- unit operations ----
  UnitMemory unit_memory(UnitKind kind, int64_t B, int64_t T) const override {
    return slidedp::unit_memory(math_.card, math_.layout, kind, B, T, memory_options());
  }

  void forward(const UnitOpArgs& a) override {
    const UnitKind kind = math_.layout.units[static_cast<size_t>(a.unit)].kind;
    compute_.enqueue_traced(tag(a, "fwd"), [this, a, kind] {
      const auto& s = math_.specs;
      switch (kind) {
        case UnitKind::kEmbedding:
          embedding_gather(a);
          break;
        case UnitKind::kDecoder: {
          const int layer = a.unit - 1;
          kernels::Arena arena(ws(a.workspace));
          const float* p = params_f32(a.params, kernels::layer_flat_numel(s, layer), arena);
          const std::optional<kernels::RouterStats> router = router_stats_of(s, a);
          kernels::layer_forward<float>(s, layer, p, f32(a.x), f32(a.y), ws(a.saved), a.B, a.T, rest(arena, a.workspace),
                                        (router ? &*router : nullptr), positions(a));
          break;
        }
        case UnitKind::kHead: {
          kernels::Arena arena(ws(a.workspace));
          const float* p = params_f32(a.params, s.head.flat_numel, arena);
          const float* lm = nullptr;
          if (s.head.tied) {
            lm = params_f32_at(a.lm_head_params, a.lm_head_offset, s.embedding.V * s.embedding.C, arena);
          } else {
            lm = p + s.head.lm_head_w;
          }
          float* lm_grad = f32(a.lm_head_grads) + a.lm_head_grad_offset;
          kernels::LossResult r = kernels::head_forward_backward<float>(
              s.head, p, lm, f32(a.x), i32(a.targets), a.B, a.T, a.grad_scale, f32(a.dx), f32(a.grads), lm_grad,
              rest(arena, a.workspace));
          double* out = reinterpret_cast<double*>(a.loss.ptr);
          // The load-balancing loss joins the loss sum in its units (the sum is divided by the
          // step's targets, 1 / grad_scale): the logged loss is the objective the gradients follow.
          const std::optional<kernels::RouterStats> router = router_stats_of(s, a);
          const double aux = router ? a.router_aux_weight * kernels::router_aux_loss_sum(*router, a.B, s.moe_experts()) : 0.0;
          out[0] = r.loss_sum + aux / a.grad_scale;
          out[1] = static_cast<double>(r.num_tokens);
          break;
        }
      }
    }, paced_compute(a, "fwd"));
  }

  void recompute(const UnitOpArgs& a) override {
    compute_.enqueue_traced(tag(a, "recompute"), [this, a] {
      const auto& s = math_.specs;
      const int layer = a.unit - 1;
      kernels::Arena arena(ws(a.workspace));
      const float* p = params_f32(a.params, kernels::layer_flat_numel(s, layer), arena);
      kernels::layer_recompute<float>(s, layer, p, f32(a.x), ws(a.saved), a.B, a.T, rest(arena, a.workspace),
                                      positions(a));
    }, paced_compute(a, "recompute"));
  }

  void backward(const UnitOpArgs& a) override {
    const UnitKind kind = math_.layout.units[static_cast<size_t>(a.unit)].kind;
    compute_.enqueue_traced(tag(a, "bwd"), [this, a, kind] {
      const auto& s = math_.specs;
      if (kind == UnitKind::kEmbedding) {
        kernels::embedding_unit_backward<float>(s.embedding, i32(a.tokens), f32(a.dy), f32(a.grads), a.B, a.T);
        return;
      }
      SLIDEDP_CHECK(kind == UnitKind::kDecoder, "backward of the head is fused into its forward");
      const int layer = a.unit - 1;
      kernels::Arena arena(ws(a.workspace));
      const float* p = params_f32(a.params, kernels::layer_flat_numel(s, layer), arena);
      const std::optional<kernels::RouterStats> router = router_stats_of(s, a);
      kernels::layer_backward<float>(s, layer, p, f32(a.x), ws(a.saved), f32(a.dy), f32(a.dx), f32(a.grads), a.B,
                                     a.T, rest(arena, a.workspace), (router ? &*router : nullptr), positions(a));
    }, paced_compute(a, "bwd"));
  }

  void zero(const DeviceBuffer& buffer, int64_t offset_bytes, int64_t bytes) override {
    SLIDEDP_CHECK(offset_bytes >= 0 && offset_bytes + bytes <= buffer.bytes);
    std::byte* p = buffer.ptr + offset_bytes;
    compute_.enqueue([p, bytes] { std::memset(p, 0, static_cast<size_t>(bytes)); });
  }

  void convert_fp32(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst, int64_t dst_offset,
                    DType dst_dtype, int64_t n, Stream* on) override {
    SLIDEDP_CHECK((src_offset + n) * 4 <= src.bytes && (dst_offset + n) * dtype_bytes(dst_dtype) <= dst.bytes);
    CpuStream& stream = own(on);
    const float* s = reinterpret_cast<const float*>(src.ptr) + src_offset;
    if (dst_dtype == DType::kBF16) {
      bf16_bits* d = reinterpret_cast<bf16_bits*>(dst.ptr) + dst_offset;
      stream.enqueue([s, d, n] { kernels::f32_to_bf16(s, d, n); });
    } else {
      SLIDEDP_CHECK(dst_dtype == DType::kF32);
      float* d = reinterpret_cast<float*>(dst.ptr) + dst_offset;
      stream.enqueue([s, d, n] { std::memcpy(d, s, static_cast<size_t>(n) * 4); });
    }
  }

  void widen_bf16(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst, int64_t dst_offset,
                  int64_t n, Stream& on) override {
    SLIDEDP_CHECK((src_offset + n) * 2 <= src.bytes && (dst_offset + n) * 4 <= dst.bytes);
    const bf16_bits* s = reinterpret_cast<const bf16_bits*>(src.ptr) + src_offset;
    float* d = f32(dst) + dst_offset;
    own(&on).enqueue([s, d, n] { kernels::bf16_to_f32(s, d, n); });
  }

  void add_fp32(const DeviceBuffer& dst, int64_t dst_offset, const DeviceBuffer& src, int64_t src_offset,
                int64_t n) override {
    SLIDEDP_CHECK((dst_offset + n) * 4 <= dst.bytes && (src_offset + n) * 4 <= src.bytes);
    float* d = f32(dst) + dst_offset;
    const float* x = f32(src) + src_offset;
    compute_.enqueue([d, x, n] {
      for (int64_t i = 0; i < n; ++i) d[i] += x[i];
    });
  }

  void count_nonfinite_fp32(const DeviceBuffer& src, int64_t offset, int64_t n, const DeviceBuffer& count) override {
    SLIDEDP_CHECK((offset + n) * 4 <= src.bytes && count.bytes >= 4, "non-finite count outside its buffers");
    const float* x = f32(src) + offset;
    auto* out = reinterpret_cast<uint32_t*>(count.ptr);
    compute_.enqueue([x, n, out] {
      uint32_t bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += std::isfinite(x[i]) ? 0u : 1u;
      *out += bad;
    });
  }

  void adamw(const DeviceAdamwArgs& a) override {
    for (const DeviceBuffer* b : {&a.param, &a.exp_avg, &a.exp_avg_sq, &a.grad})
      SLIDEDP_CHECK((a.offset + a.n) * 4 <= b->bytes, "device AdamW range outside its buffer");
    const kernels::AdamwHyper h = a.hyper;
    kernels::AdamwState st;
    st.param = f32(a.param) + a.offset;
    st.exp_avg = f32(a.exp_avg) + a.offset;
    st.exp_avg_sq = f32(a.exp_avg_sq) + a.offset;
    const float* g = f32(a.grad) + a.offset;
    const int64_t n = a.n;
    SpanTag t;
    t.category = "compute";
    t.unit = a.unit;
    t.step = a.step;
    t.what = "adamw";
    std::optional<PacedWork> paced;
    if (math_.pacing) paced = math_.pacing->device_update(rank_, n);
    compute_.enqueue_traced(t, [st, g, h, n] { kernels::adamw_update(st, g, h, 0, n); }, paced);
  }

 private:
  // One of this device's streams (null: compute).
  CpuStream& own(Stream* s) {
    for (CpuStream* c : {&compute_, &h2d_, &d2h_, &comm_})
      if (s == nullptr ? c == &compute_ : s == c) return *c;
    SLIDEDP_CHECK(false, "a stream of another device");
    return compute_;
  }

  std::optional<PacedWork> paced_compute(const UnitOpArgs& a, const char* op) const {
    if (!math_.pacing) return std::nullopt;
    return math_.pacing->compute(rank_, a.unit, op);
  }

  SpanTag tag(const UnitOpArgs& a, const char* what) const { return compute_span_tag(a, what); }
  static float* f32(const DeviceBuffer& b) { return reinterpret_cast<float*>(b.ptr); }
  static const int32_t* i32(const DeviceBuffer& b) { return reinterpret_cast<const int32_t*>(b.ptr); }
  static const int32_t* positions(const UnitOpArgs& a) { return a.positions.bytes > 0 ? i32(a.positions) : nullptr; }
  static kernels::Workspace ws(const DeviceBuffer& b) { return kernels::Workspace{b.ptr, b.bytes}; }
  // The part of the workspace the arena has not handed out (64-byte aligned).
  static kernels::Workspace rest(kernels::Arena& arena, const DeviceBuffer& b) {
    const int64_t used = kernels::Arena::align_up(arena.mark());
    return kernels::Workspace{b.ptr + used, b.bytes - used};
  }
  // How model/unit_memory.h sizes this backend's units.
  UnitMemoryOptions memory_options() const {
    UnitMemoryOptions o;
    o.code = UnitCode::kCpu;
    o.exact_fp32 = math_.exact;
    o.loss_chunk_tokens = math_.specs.head.loss_chunk_tokens;
    o.mlp_token_tile = math_.specs.mlp_token_tile;
    o.cpu_threads = static_cast<int>(math_.specs.threads);
    return o;
  }
  // The unit's parameters as fp32: the buffer itself in exact mode, else widened into the arena.
  const float* params_f32(const DeviceBuffer& p, int64_t n, kernels::Arena& arena) const {
    return params_f32_at(p, 0, n, arena);
  }
  const float* params_f32_at(const DeviceBuffer& p, int64_t offset, int64_t n, kernels::Arena& arena) const {
    if (math_.exact) return reinterpret_cast<const float*>(p.ptr) + offset;
    float* dst = arena.take<float>(n, "params fp32");
    kernels::widen_bf16<float>(reinterpret_cast<const bf16_bits*>(p.ptr) + offset, dst, n);
    return dst;
  }
  // Embedding forward straight from the delivered rows (no widening of the whole table).
  void embedding_gather(const UnitOpArgs& a) const {
    const auto& e = math_.specs.embedding;
    const int32_t* tok = i32(a.tokens);
    float* x = f32(a.y);  // the embedding's output is the first hidden state
    for (int64_t i = 0; i < a.B * a.T; ++i) {
      const int32_t id = tok[i];
      if (id < 0 || id >= e.V)
        throw InputError("tokens", fmt::format("token id {} at position {} is outside the vocabulary [0, {})", id, i, e.V));
      if (math_.exact) {
        std::memcpy(x + i * e.C, reinterpret_cast<const float*>(a.params.ptr) + e.weight + id * e.C,
                    static_cast<size_t>(e.C) * 4);
      } else {
        kernels::widen_bf16<float>(reinterpret_cast<const bf16_bits*>(a.params.ptr) + e.weight + id * e.C, x + i * e.C, e.C);
      }
    }
    kernels::scale_embedding_rows(e, x, a.B * a.T);
  }

  // The emulated device memory: 64-byte-aligned host blocks, allocated and freed with the buffers.
  struct HostBlocks final : DeviceBlocks {
    explicit HostBlocks(int device_rank) : rank(device_rank) {}
    Block take(const Request& r) override {
      auto* p = static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(std::max<int64_t>(r.bytes, 64))));
      if (!p)
        throw RuntimeError(fmt::format("rank {}: out of host memory allocating {} for {}", rank,
                                       format_bytes(static_cast<double>(r.bytes)), r.what));
      return Block{p, r.bytes};
    }
    void give(const Block& block) override { std::free(block.ptr); }
    int rank;
  };

  int rank_;
  const SharedMath& math_;
  CpuStream compute_, h2d_, d2h_, comm_;
  HostBlocks blocks_;
  DeviceBudget budget_;  // after blocks_, which it gives its blocks back to
};

// ---- backend ---------------------------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelCard& card, const ModelLayout& layout, const CpuBackendOptions& opt, RunControl& control)
      : control_(control), comm_(opt.devices, control) {
    SLIDEDP_CHECK(opt.devices >= 1);
    math_.card = card;
    math_.layout = layout;
    math_.specs = kernels::make_model_specs(card, layout);
    math_.specs.head.loss_chunk_tokens = opt.loss_chunk_tokens;
    math_.specs.set_mlp_token_tile(opt.mlp_token_tile);
    math_.exact = opt.exact_fp32;
    math_.pacing = opt.pacing.get();
    pacing_ = opt.pacing;
    cross_node_ = opt.cross_node;
    const int threads = opt.blas_threads > 0 ? opt.blas_threads : 1;
    kernels::set_blas_threads(threads);
    math_.specs.set_threads(threads);
    for (int r = 0; r < opt.devices; ++r)
      devices_.push_back(std::make_unique<CpuDevice>(r, opt.device_budget_bytes, math_, control, tracer_));
  }
  ~CpuBackend() override {
    // Streams drain (or drop work after an abort) before memory goes away.
    devices_.clear();
  }

  std::string name() const override { return "cpu"; }
  int num_devices() const override { return static_cast<int>(devices_.size()); }
  Device& device(int rank) override { return *devices_.at(static_cast<size_t>(rank)); }

  HostBuffer alloc_host(int64_t bytes, bool pinned) override {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(align64(std::max<int64_t>(bytes, 64)))));
    if (!p) throw RuntimeError(fmt::format("out of host memory allocating {}", format_bytes(static_cast<double>(bytes))));
    host_bytes_ += bytes;
    if (pinned) pinned_bytes_ += bytes;
    std::memset(p, 0, static_cast<size_t>(bytes));
    return HostBuffer{p, bytes, std::shared_ptr<void>(p, [](void* q) { std::free(q); })};
  }
  HostBytes host_bytes_allocated() const override { return {host_bytes_.load(), pinned_bytes_.load()}; }
  void register_host(std::byte*, int64_t) override {}
  std::unique_ptr<HostCounter> make_counter(uint64_t initial) override {
    return std::make_unique<CpuCounter>(initial, control_);
  }

  void all_gather(int rank, const DeviceBuffer& buffer, int64_t offset, int64_t count, DType dtype,
                  const SpanTag& tag) override {
    const int64_t seq = comm_.next_sequence(rank);
    const int ranks = num_devices();
    const int64_t esize = dtype_bytes(dtype);
    std::byte* base = buffer.ptr + offset * esize;
    SLIDEDP_CHECK((offset + count) * esize <= buffer.bytes, "all_gather past the end of the buffer");
    devices_[static_cast<size_t>(rank)]->comm_stream().enqueue_collective(tag, [this, seq, rank, ranks, base, count, esize](const auto& started, const auto& done) {
      std::vector<const std::byte*> ptrs = comm_.arrive(seq, rank, base);
      started();
      // Paced from the rendezvous on: the target's all-gather moves (N-1)/N of the bf16 buffer per port.
      const int flow = begin_collective(rank, true, count, ranks);
      for (int r = 0; r < ranks; ++r) {
        if (r == rank) continue;
        ShardRange s = shard_range(count, ranks, r);
        std::memcpy(base + s.begin * esize, ptrs[static_cast<size_t>(r)] + s.begin * esize, static_cast<size_t>(s.size() * esize));
      }
      if (flow >= 0) math_.pacing->pacer().finish(flow);
      done();
      comm_.finish(seq);
    });
  }

  void reduce_scatter(int rank, const DeviceBuffer& input, int64_t in_offset, DType in_dtype, int64_t count,
                      const DeviceBuffer& output, int64_t out_offset, const SpanTag& tag) override {
    const int64_t seq = comm_.next_sequence(rank);
    const int ranks = num_devices();
    const int64_t esize = dtype_bytes(in_dtype);
    SLIDEDP_CHECK((in_offset + count) * esize <= input.bytes, "reduce_scatter input past the end");
    const std::byte* in = input.ptr + in_offset * esize;
    float* out = reinterpret_cast<float*>(output.ptr) + out_offset;
    if (cross_node_) {
      const ShardRange global = shard_range(count, cross_node_->nodes() * ranks, cross_node_->node() * ranks + rank);
      SLIDEDP_CHECK((out_offset + global.size()) * 4 <= output.bytes, "reduce_scatter output too small");
      devices_[static_cast<size_t>(rank)]->comm_stream().enqueue_collective(tag, [this, seq, rank, in, in_dtype, out, count, tag](const auto& started, const auto& done) {
        std::vector<const std::byte*> ptrs = comm_.arrive(seq, rank, in);
        started();
        reduce_scatter_across_nodes(seq, rank, ptrs, in_dtype, count, out, tag);
        done();
        comm_.finish(seq);
      });
      return;
    }
    const ShardRange mine = shard_range(count, ranks, rank);
    SLIDEDP_CHECK((out_offset + mine.size()) * 4 <= output.bytes, "reduce_scatter output too small");
    devices_[static_cast<size_t>(rank)]->comm_stream().enqueue_collective(tag, [this, seq, rank, ranks, in, in_dtype, mine, out, count](const auto& started, const auto& done) {
      std::vector<const std::byte*> ptrs = comm_.arrive(seq, rank, in);
      started();
      const int flow = begin_collective(rank, false, count, ranks);
      // Sum in rank order, in fp32, with the host reduction's own kernel (SIMD; the updater sums per-rank
      // slots with it), so the gpu and cpu gradient routes give bitwise identical results.
      auto reduce = [&](auto element) {
        using T = decltype(element);
        std::vector<const T*> shard(static_cast<size_t>(ranks));
        for (int r = 0; r < ranks; ++r)
          shard[static_cast<size_t>(r)] = reinterpret_cast<const T*>(ptrs[static_cast<size_t>(r)]) + mine.begin;
        kernels::GradSlots<T> slots{std::span<const T* const>(shard), 1.0f, nullptr};
        kernels::reduce_grads(slots, out, 0, mine.size());
      };
      if (in_dtype == DType::kBF16) reduce(bf16_bits{});
      else reduce(float{});
      if (flow >= 0) math_.pacing->pacer().finish(flow);
      done();
      comm_.finish(seq);
    });
  }

  // The reduce-scatter over every node's ranks, as one node of M x N ranks sums (rank order, fp32):
  // the sum of global shard g runs as a chain through the nodes in order, each adding its ranks'
  // inputs in rank order (node 0 starts it), and the last node sends it to the node of rank g. Local
  // rank r carries the chains of the shards g = o * N + r of every node o, so the node's ranks work in
  // parallel and each node sends about 4 bytes per element, as the host route's chain does.
  void reduce_scatter_across_nodes(int64_t seq, int rank, const std::vector<const std::byte*>& ptrs, DType in_dtype,
                                   int64_t count, float* out, const SpanTag& tag) {
    NodeLink& link = *cross_node_;
    const int N = num_devices(), M = link.nodes(), me = link.node();
    // Tags of this call: distinct per (call, local rank, owner node, kind) within the backend's range;
    // a pair of nodes posts one tag's messages in call order, so the range may wrap.
    const int64_t range = link.reserved_tag(0) - link.backend_tag_base();
    const int64_t calls = std::max<int64_t>(1, range / (2 * static_cast<int64_t>(N) * M));
    auto tag_of = [&](int owner, int kind) {
      return link.backend_tag_base() + (((seq % calls) * N + rank) * M + owner) * 2 + kind;
    };
    const std::string what = fmt::format("the reduce-scatter of unit {} chunk {} (step {}, rank {})", tag.unit, tag.chunk,
                                         tag.step + 1, rank);
    // Owned by the transfers too, so one completing after a failed wait touches memory that exists.
    auto sums = std::make_shared<std::vector<std::vector<float>>>(static_cast<size_t>(M));
    auto shard = [&](int owner) { return shard_range(count, M * N, owner * N + rank); };
    for (int o = 0; o < M; ++o) (*sums)[static_cast<size_t>(o)].resize(static_cast<size_t>(shard(o).size()));
    auto bytes_of = [&](int o) { return reinterpret_cast<std::byte*>((*sums)[static_cast<size_t>(o)].data()); };
    auto size_of = [&](int o) { return shard(o).size() * 4; };
    auto keep = [sums] {};
    TransferCount partials;
    if (me > 0)
      for (int o = 0; o < M; ++o)
        link.recv(me - 1, tag_of(o, 0), bytes_of(o), size_of(o), "the partial sum of " + what,
                  [sums, one = partials.one()] { one(); });
    TransferCount result;
    if (me < M - 1) {
      auto r = std::make_shared<std::vector<float>>(static_cast<size_t>(shard(me).size()));
      link.recv(M - 1, tag_of(me, 1), reinterpret_cast<std::byte*>(r->data()), size_of(me), "the sum of " + what,
                [r, one = result.one()] { one(); });
      partials.wait(link, me > 0 ? M : 0, &control_);
      add_ranks(me, ptrs, in_dtype, *sums, count, rank);
      for (int o = 0; o < M; ++o) link.send(me + 1, tag_of(o, 0), bytes_of(o), size_of(o), "the partial sum of " + what, keep);
      result.wait(link, 1, &control_);
      std::memcpy(out, r->data(), static_cast<size_t>(size_of(me)));
      return;
    }
    partials.wait(link, M, &control_);
    add_ranks(me, ptrs, in_dtype, *sums, count, rank);
    for (int o = 0; o < M - 1; ++o) link.send(o, tag_of(o, 1), bytes_of(o), size_of(o), "the sum of " + what, keep);
    std::memcpy(out, bytes_of(me), static_cast<size_t>(size_of(me)));
  }

  // Adds this node's ranks' inputs, in rank order, to every owner's partial sum (node 0: starts them).
  void add_ranks(int node, const std::vector<const std::byte*>& ptrs, DType in_dtype, std::vector<std::vector<float>>& sums,
                 int64_t count, int rank) const {
    const int N = num_devices(), M = static_cast<int>(sums.size());
    auto add = [&](auto element) {
      using T = decltype(element);
      for (int o = 0; o < M; ++o) {
        const ShardRange s = shard_range(count, M * N, o * N + rank);
        std::vector<const T*> inputs;
        for (const std::byte* p : ptrs) inputs.push_back(reinterpret_cast<const T*>(p) + s.begin);
        float* partial = sums[static_cast<size_t>(o)].data();
        if (node == 0) {
          kernels::reduce_grads(kernels::GradSlots<T>{std::span<const T* const>(inputs), 1.0f, nullptr}, partial, 0, s.size());
        } else {
          // One input at a time: fma(input, 1, partial) rounds each addition once, as one node's running sum.
          for (const T* i : inputs) kernels::reduce_grads_accumulate(std::span<const T* const>(&i, 1), 1.0f, partial, 0, s.size());
        }
      }
    };
    if (in_dtype == DType::kBF16) add(bf16_bits{});
    else add(float{});
  }

  // A paced collective's flow for one rank's port: (N-1)/N of `count` bf16 elements (-1: not paced).
  int begin_collective(int rank, bool all_gather, int64_t count, int ranks) const {
    if (!math_.pacing) return -1;
    const double per_port = static_cast<double>(count) * 2.0 * (ranks - 1) / ranks;
    const PacedWork p = math_.pacing->collective(rank, all_gather, per_port);
    return math_.pacing->pacer().begin(p.usages, p.work, p.delay_s);
  }

  void set_tracing(bool on) override { tracer_.set(on); }
  bool tracing() const override { return tracer_.on(); }
  double trace_clock_s() const override { return tracer_.now(); }
  void add_span(const MeasuredSpan& s) override {
    tracer_.add(s.rank, s.stream, s.tag, s.start_s, s.end_s, s.bytes);
  }
  std::vector<MeasuredSpan> take_spans() override { return tracer_.take(); }
  void synchronize() override {
    for (auto& d : devices_) d->synchronize();
  }
  void quiesce() override {
    for (auto& d : devices_) d->quiesce();
  }

 private:
  RunControl& control_;
  std::atomic<int64_t> host_bytes_{0}, pinned_bytes_{0};  // what alloc_host gave out
  SharedMath math_;
  std::shared_ptr<const TargetPacing> pacing_;  // keeps math_.pacing alive
  Tracer tracer_;
  CpuComm comm_;
  NodeLink* cross_node_ = nullptr;  // reduce_scatter spans every node's ranks
  std::vector<std::unique_ptr<CpuDevice>> devices_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelCard& card, const ModelLayout& layout,
                                          const CpuBackendOptions& options, RunControl& control) {
  return std::make_unique<CpuBackend>(card, layout, options, control);
}

}  // namespace slidedp::exec
