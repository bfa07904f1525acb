// The backend interface: what the executor's pipeline needs from "a set of GPUs" (DESIGN section 5).
// A Backend owns one Device per rank; a Device has a byte-budgeted memory arena, four in-order
// streams (compute, h2d, d2h, comm), events, host counters that streams can wait on, async copies,
// the unit operations of the transformer (forward / recompute / backward of embedding, decoder and
// head units) and takes part in collectives. The CPU backend (executor/cpu/) emulates all of it with
// threads and memcpy; the CUDA backend implements it with streams, cuBLASLt, our kernels and NCCL.
// No CUDA type appears here (STYLE habit 2).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/shard_range.h"
#include "card/unit_layout.h"
#include "kernels/cpu/optim/adamw.h"
#include "model/memory_account.h"
#include "model/unit_memory.h"

namespace slidedp::exec {

enum class DType { kBF16, kF32, kI32, kF64 };
inline int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kBF16: return 2;
    case DType::kF32: return 4;
    case DType::kI32: return 4;
    case DType::kF64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);

// Device memory. `ptr` is a device address (host memory on the CPU backend); only the backend
// dereferences it.
struct DeviceBuffer {
  std::byte* ptr = nullptr;
  int64_t bytes = 0;
  int64_t id = -1;  // allocation id (for accounting and messages)
  explicit operator bool() const { return id >= 0; }
};

// Host memory the backend can copy to and from asynchronously (pinned on CUDA).
struct HostBuffer {
  std::byte* ptr = nullptr;
  int64_t bytes = 0;
  std::shared_ptr<void> owner;  // frees it
};

// A point in a stream. Streams wait on events; the host can wait too.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;
  // Blocks until done (throws Aborted when the run aborts).
  virtual void wait_host() const = 0;
};
using EventPtr = std::shared_ptr<Event>;

// A monotonically increasing 64-bit counter in host memory: the host advances it, streams wait for it
// to reach a value (CUDA: stream-ordered wait on a pinned word). The updater publishes how many
// optimizer steps each chunk has received through these.
class HostCounter {
 public:
  virtual ~HostCounter() = default;
  virtual uint64_t value() const = 0;
  virtual void advance_to(uint64_t value) = 0;  // never decreases
};

// What a recorded span is, for the measured timeline and per-resource busy times.
struct SpanTag {
  const char* category = "";  // "compute" | "h2d" | "d2h" | "fabric" | ...
  int unit = -1;
  int chunk = -1;
  int step = -1;
  const char* what = "";      // "fwd", "bwd", "recompute+bwd", "params", "grad", "offload", ...
  bool eval = false;          // an evaluation's work (executor/evaluation.h): `step` is the weights'
  int element_bytes = 0;      // a copy of elements the model charges (model/copy_bytes.h): bytes of each
};

// An in-order queue of work on one device.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual const char* name() const = 0;
  virtual EventPtr record() = 0;
  virtual void wait(const EventPtr& event) = 0;  // later work waits for `event` (null: no-op)
  virtual void wait_counter(HostCounter& counter, uint64_t value) = 0;
  virtual void copy_h2d(const DeviceBuffer& dst, int64_t dst_offset, const std::byte* src, int64_t bytes,
                        const SpanTag& tag) = 0;
  virtual void copy_d2h(std::byte* dst, const DeviceBuffer& src, int64_t src_offset, int64_t bytes,
                        const SpanTag& tag) = 0;
  // Runs `fn` on a host thread once the work before it in this stream is done, in order. An exception
  // from fn fails the run.
  virtual void host_fn(std::function<void()> fn) = 0;
};

// Arguments of one unit operation (only the fields the operation reads are set). Buffers are device
// memory; offsets are in elements of the buffer's dtype.
struct UnitOpArgs {
  int unit = 0;             // index in execution order (0 = embedding, L+1 = head)
  int64_t B = 0, T = 0;     // sequences and tokens per sequence of this micro-step
  DeviceBuffer params;      // the unit's flat parameters, param dtype (Device::param_dtype)
  DeviceBuffer lm_head_params;  // head: buffer holding the lm_head weight (its own or unit 0's)
  int64_t lm_head_offset = 0;
  DeviceBuffer tokens;      // embedding: (B, T) int32
  DeviceBuffer targets;     // head: (B, T) int32, kIgnoreIndex masked
  DeviceBuffer positions;   // decoder: (B, T) int32 document positions of packed documents
                            // (kernels/cpu/transformer/attention.h); empty: one document per sequence
  DeviceBuffer x;           // unit input (B, T, C), activation dtype
  DeviceBuffer y;           // forward output (B, T, C)
  DeviceBuffer saved;       // decoder: saved state (saved_bytes)
  DeviceBuffer dy;          // backward: gradient of the output (B, T, C)
  DeviceBuffer dx;          // backward / head: gradient of the input (B, T, C)
  DeviceBuffer grads;       // the unit's flat fp32 gradient, accumulated (+=)
  DeviceBuffer lm_head_grads;  // head: fp32 buffer receiving the lm_head gradient (+=)
  int64_t lm_head_grad_offset = 0;
  DeviceBuffer workspace;   // scratch of workspace_bytes
  DeviceBuffer loss;        // head: 2 doubles, (loss sum, unmasked count), overwritten
  double grad_scale = 1.0;  // head: multiplies dlogits (1 / global unmasked targets)
  // MoE models: the micro-batch's router statistics (kernels/cpu/transformer/router_aux_loss.h,
  // zeroed before its first layer): decoder forwards add to them, decoder backwards and the head
  // read them. router_aux_weight = d loss / d (one sequence's load-balancing loss); 0: off.
  DeviceBuffer router_stats;
  double router_aux_weight = 0;
  int step = -1;            // for the measured timeline
  bool eval = false;        // an evaluation's operation (the timeline keeps it out of the steps)
};

// The measured timeline's tag of a unit operation on the compute stream (every backend's).
inline SpanTag compute_span_tag(const UnitOpArgs& a, const char* what) {
  SpanTag t;
  t.category = "compute";
  t.unit = a.unit;
  t.step = a.step;
  t.what = what;
  t.eval = a.eval;
  return t;
}

// FSDP2's optimizer on the device (executor --system fsdp2): AdamW over elements [offset, offset + n)
// of this rank's sharded fp32 state, in kernels/cpu/optim/adamw.h's exact per-element arithmetic.
struct DeviceAdamwArgs {
  DeviceBuffer param, exp_avg, exp_avg_sq, grad;  // fp32, indexed alike
  int64_t offset = 0, n = 0;                      // elements
  kernels::AdamwHyper hyper;
  int unit = -1;  // for the measured timeline
  int step = -1;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int rank() const = 0;
  virtual Stream& compute() = 0;
  virtual Stream& h2d() = 0;
  virtual Stream& d2h() = 0;
  virtual Stream& comm() = 0;

  // Memory arena with a byte budget. alloc blocks while deferred frees are pending and would make
  // room; throws InfeasibleError (with the numbers) when the request can never fit.
  virtual DeviceBuffer alloc(int64_t bytes, const char* what) = 0;
  // Frees `buffer` once `after` is done (null: now). Stream-ordered, like cudaFreeAsync.
  virtual void release(const DeviceBuffer& buffer, const EventPtr& after) = 0;
  virtual int64_t budget_bytes() const = 0;
  virtual int64_t in_use_bytes() const = 0;     // allocated and not yet given back (deferred frees count)
  virtual int64_t high_water_bytes() const = 0;
  // The most bytes allocated and not yet released at once, a deferred free counting as released at
  // its release() call: what the allocation order alone holds, independent of stream timing (the
  // memory account's driver_peak_bytes, model/memory_account.h).
  virtual int64_t held_high_water_bytes() const = 0;
  // What the memory account needs of this backend for micro-batches of (B, T): its units' memory, the
  // allocator's rounding and the scratch its operations allocate on their own.
  virtual RankMemorySpec memory_spec(int64_t B, int64_t T) const = 0;

  // Dtypes of this backend: delivered parameters, activations, gradients on the wire to the host.
  virtual DType param_dtype() const = 0;
  virtual DType activation_dtype() const = 0;

  // Unit operations, enqueued on compute(). unit_memory answers from model/unit_memory.h.
  virtual UnitMemory unit_memory(UnitKind kind, int64_t B, int64_t T) const = 0;
  virtual void forward(const UnitOpArgs& args) = 0;    // embedding, decoder; head = fused fwd + bwd
  virtual void recompute(const UnitOpArgs& args) = 0;  // decoder: refill `saved` from x
  virtual void backward(const UnitOpArgs& args) = 0;   // embedding, decoder
  // Elementwise helpers on compute(): zero bytes; convert n fp32 values to the wire dtype.
  virtual void zero(const DeviceBuffer& buffer, int64_t offset_bytes, int64_t bytes) = 0;
  // `on`: another of this device's streams to run it on (null: compute()).
  virtual void convert_fp32(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst, int64_t dst_offset,
                            DType dst_dtype, int64_t n, Stream* on = nullptr) = 0;
  // n bf16 values widened to fp32, on `on` (DeepSpeed's cast of a bf16 gradient before its copy to
  // the host's fp32 buffer).
  virtual void widen_bf16(const DeviceBuffer& src, int64_t src_offset, const DeviceBuffer& dst,
                          int64_t dst_offset, int64_t n, Stream& on) = 0;
  // dst[dst_offset + i] += src[src_offset + i], n fp32 values (FSDP2's gradient accumulation).
  virtual void add_fp32(const DeviceBuffer& dst, int64_t dst_offset, const DeviceBuffer& src, int64_t src_offset,
                        int64_t n) = 0;
  // FSDP2's AdamW, on compute().
  virtual void adamw(const DeviceAdamwArgs& args) = 0;
  // On the compute stream: adds the number of NaN and infinite values among src's fp32 elements
  // [offset, offset + n) to the uint32 at the start of `count` (device memory): the non-finite check
  // of a gradient the device's own optimizer is about to apply.
  virtual void count_nonfinite_fp32(const DeviceBuffer& src, int64_t offset, int64_t n, const DeviceBuffer& count) = 0;
};

// Timeline spans measured by a backend (start and end relative to the backend's epoch).
struct MeasuredSpan {
  int rank = -1;  // -1: host
  std::string stream;
  SpanTag tag;
  double start_s = 0, end_s = 0;
  // A copy's bytes over the host link, 0 for other work. On a GPU the bytes it copied; on the CPU
  // backend paced at a target, the bytes the target moves (weighed by model/copy_bytes.h, as the
  // pacer holds the copy for them), unpaced the bytes it copied.
  double bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int num_devices() const = 0;
  virtual Device& device(int rank) = 0;
  virtual HostBuffer alloc_host(int64_t bytes, bool pinned) = 0;
  // The bytes alloc_host has given out so far, all and pinned (what the host memory account charges).
  struct HostBytes {
    int64_t total = 0, pinned = 0;
  };
  virtual HostBytes host_bytes_allocated() const = 0;
  // Registers existing host memory for fast async copies (cudaHostRegister on CUDA; no-op on CPU).
  virtual void register_host(std::byte* ptr, int64_t bytes) = 0;
  virtual std::unique_ptr<HostCounter> make_counter(uint64_t initial) = 0;

  // Collectives, called by every rank in the same order on its comm stream (NCCL semantics).
  // all_gather: `buffer` holds `count` elements of `dtype` starting at `offset`; rank r owns
  // shard_range(count, ranks, r) and after the call every rank holds all of them.
  virtual void all_gather(int rank, const DeviceBuffer& buffer, int64_t offset, int64_t count, DType dtype,
                          const SpanTag& tag) = 0;
  // reduce_scatter: `input` holds `count` elements of `in_dtype` at `in_offset` on every rank; rank r
  // receives the fp32 sum over ranks of its shard_range into `output` at element `out_offset` (across
  // nodes, BackendOptions::cross_node: over every node's ranks, rank r being node * N + r). Within a
  // node both backends sum in rank order 0, 1, ... (bitwise equal to the cpu route; CUDA exchanges
  // the pieces in `in_dtype` and sums them on the GPU). Across nodes the CUDA backend runs NCCL's
  // ring reduce-scatter in fp32, whose order is deterministic for a fixed communicator and algorithm
  // but not rank order: there the gpu route matches the cpu route to fp32 rounding only.
  virtual void reduce_scatter(int rank, const DeviceBuffer& input, int64_t in_offset, DType in_dtype, int64_t count,
                              const DeviceBuffer& output, int64_t out_offset, const SpanTag& tag) = 0;

  // Measured timeline (when tracing is on). trace_clock_s() is the time base of the spans, so host
  // work (the updater) can be recorded on the same timeline.
  virtual void set_tracing(bool on) = 0;
  virtual bool tracing() const = 0;
  virtual double trace_clock_s() const = 0;
  virtual void add_span(const MeasuredSpan& span) = 0;
  virtual std::vector<MeasuredSpan> take_spans() = 0;
  // Blocks until every stream of every device is idle (throws Aborted on abort).
  virtual void synchronize() = 0;
  // Like synchronize, but also after an abort (queued work is then dropped, and every wait inside
  // running work gives up), so host memory can be freed safely. Never throws.
  virtual void quiesce() = 0;
};

}  // namespace slidedp::exec
