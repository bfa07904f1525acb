// Working memory of the transformer math comes from the caller, never from malloc inside a kernel:
// the executor sizes one buffer per unit from a query function and accounts for it like device
// memory. Arena hands out 64-byte-aligned pieces of such a buffer in LIFO order. Built over a null
// buffer it only measures: every size query runs the very allocation sequence the kernel runs, so
// the reported size and the used size cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace slidedp::kernels {

inline constexpr int64_t kArenaAlignBytes = 64;  // a cache line; also the widest SIMD load

// A caller-provided block of scratch bytes (host memory for the CPU backend).
struct Workspace {
  std::byte* data = nullptr;
  int64_t bytes = 0;
};

// One take() of a tracing arena: where it landed, for layouts that name their pieces.
struct ArenaPiece {
  std::string name;
  int64_t offset_bytes = 0;
  int64_t bytes = 0;
};

class Arena {
 public:
  // Measuring arena: take() returns nullptr and only counts.
  Arena() = default;
  // Allocating arena over a caller block (a null block of 0 bytes serves calls that need none).
  explicit Arena(Workspace ws) : base_(ws.data), capacity_(ws.bytes), measuring_(false) {
    SLIDEDP_CHECK(ws.bytes >= 0 && (ws.data != nullptr || ws.bytes == 0),
                  "workspace has bytes but no memory");
    SLIDEDP_CHECK(reinterpret_cast<uintptr_t>(base_) % kArenaAlignBytes == 0,
                  "workspace must be 64-byte aligned");
  }

  bool measuring() const { return measuring_; }

  // n elements of U, 64-byte aligned, uninitialized. Aborts when the workspace is too small: the
  // caller sized it with the matching *_bytes() query, so overflow is a bug, not bad input.
  // `name` is recorded when tracing (see trace()).
  template <typename U>
  U* take(int64_t n, const char* name = "") {
    SLIDEDP_CHECK(n >= 0, "negative allocation");
    const int64_t start = align_up(used_);
    used_ = start + n * static_cast<int64_t>(sizeof(U));
    if (used_ > high_water_) high_water_ = used_;
    if (tracing_) trace_.push_back(ArenaPiece{name, start, n * static_cast<int64_t>(sizeof(U))});
    if (measuring_) return nullptr;
    SLIDEDP_CHECK(used_ <= capacity_, "workspace too small: need " + std::to_string(used_) + " bytes, have " +
                                          std::to_string(capacity_));
    return reinterpret_cast<U*>(base_ + start);
  }

  // A nested workspace of `bytes` bytes for a callee that builds its own Arena.
  Workspace take_workspace(int64_t bytes) {
    std::byte* p = take<std::byte>(bytes);
    return Workspace{p, bytes};
  }

  // LIFO release: everything taken after mark() is given back by release(mark).
  int64_t mark() const { return used_; }
  void release(int64_t mark) {
    SLIDEDP_CHECK(mark >= 0 && mark <= used_, "release past the current top");
    used_ = mark;
  }

  int64_t high_water_bytes() const { return high_water_; }

  // Record every later take (name, offset, bytes).
  void enable_trace() { tracing_ = true; }
  const std::vector<ArenaPiece>& trace() const { return trace_; }

  static int64_t align_up(int64_t bytes) {
    return (bytes + kArenaAlignBytes - 1) / kArenaAlignBytes * kArenaAlignBytes;
  }

 private:
  std::byte* base_ = nullptr;
  int64_t capacity_ = 0;
  bool measuring_ = true;
  int64_t used_ = 0;
  int64_t high_water_ = 0;
  bool tracing_ = false;
  std::vector<ArenaPiece> trace_;
};

// The bytes a carve sequence takes: carve(arena) run on a measuring arena (the *_bytes() queries).
template <typename Carve>
int64_t measured_bytes(const Carve& carve) {
  Arena a;
  carve(a);
  return a.high_water_bytes();
}

// Owning, 64-byte-aligned, uninitialized host bytes (for tests, benchmarks and the CPU backend).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes)
      : bytes_(bytes),
        data_(static_cast<std::byte*>(std::aligned_alloc(
            kArenaAlignBytes, static_cast<size_t>(Arena::align_up(bytes > 0 ? bytes : 1))))) {
    SLIDEDP_CHECK(data_ != nullptr, "out of host memory: " + std::to_string(bytes) + " bytes");
  }
  std::byte* data() const { return data_.get(); }
  int64_t bytes() const { return bytes_; }
  Workspace workspace() const { return Workspace{data_.get(), bytes_}; }
  template <typename U>
  U* as() const {
    return reinterpret_cast<U*>(data_.get());
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  int64_t bytes_ = 0;
  std::unique_ptr<std::byte, Free> data_;
};

}  // namespace slidedp::kernels
