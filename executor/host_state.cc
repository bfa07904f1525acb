// Host state allocation and loading; see host_state.h.
#include "executor/host_state.h"

#include <cstring>

#include "common/bf16.h"
#include "common/error.h"
#include "kernels/cpu/optim/bf16_convert.h"

namespace slidedp::exec {

HostState::HostState(Backend& backend, const ModelLayout& layout, const HostStateOptions& options)
    : options_(options) {
  SLIDEDP_CHECK(options.chunk_numel > 0);
  const int64_t mbytes = dtype_bytes(options.mirror_dtype);
  units_.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    UnitState& s = units_[u];
    s.numel = layout.units[u].flat_numel;
    s.chunks = num_chunks(s.numel, options.chunk_numel);
    const int64_t f32 = s.numel * 4;
    s.master = backend.alloc_host(f32, false);
    s.exp_avg = backend.alloc_host(f32, false);
    s.exp_avg_sq = backend.alloc_host(f32, false);
    s.mirror = backend.alloc_host(s.numel * mbytes, true);
    host_bytes_ += 3 * f32 + s.numel * mbytes;
    pinned_bytes_ += s.numel * mbytes;
    if (options.accumulate_all || (u == 0 && options.accumulate_unit0)) {
      s.accum = backend.alloc_host(f32, false);
      host_bytes_ += f32;
    }
    for (int64_t k = 0; k < s.chunks; ++k) s.updated.push_back(backend.make_counter(0));
  }
}

std::pair<int64_t, int64_t> HostState::chunk_range(int u, int64_t k) const {
  const UnitState& s = unit(u);
  const int64_t begin = k * options_.chunk_numel;
  return {begin, std::min(s.numel, begin + options_.chunk_numel)};
}

void HostState::write_mirror(int u, int64_t begin, int64_t end) {
  UnitState& s = unit(u);
  const float* src = s.master_f32() + begin;
  if (options_.mirror_dtype == DType::kBF16) {
    kernels::f32_to_bf16(src, reinterpret_cast<bf16_bits*>(s.mirror.ptr) + begin, end - begin);
  } else {
    std::memcpy(reinterpret_cast<float*>(s.mirror.ptr) + begin, src, static_cast<size_t>(end - begin) * 4);
  }
}

void HostState::load_master(std::span<const std::span<const float>> units) {
  SLIDEDP_CHECK(units.size() == units_.size(), "one master buffer per unit");
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = units_[u];
    SLIDEDP_CHECK(static_cast<int64_t>(units[u].size()) == s.numel, "master buffer size differs from the layout");
    std::memcpy(s.master.ptr, units[u].data(), static_cast<size_t>(s.numel) * 4);
    std::memset(s.exp_avg.ptr, 0, static_cast<size_t>(s.numel) * 4);
    std::memset(s.exp_avg_sq.ptr, 0, static_cast<size_t>(s.numel) * 4);
    write_mirror(static_cast<int>(u), 0, s.numel);
  }
}

void HostState::load(std::span<const std::span<const float>> master, std::span<const std::span<const float>> m,
                     std::span<const std::span<const float>> v) {
  load_master(master);
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = units_[u];
    SLIDEDP_CHECK(static_cast<int64_t>(m[u].size()) == s.numel && static_cast<int64_t>(v[u].size()) == s.numel);
    std::memcpy(s.exp_avg.ptr, m[u].data(), static_cast<size_t>(s.numel) * 4);
    std::memcpy(s.exp_avg_sq.ptr, v[u].data(), static_cast<size_t>(s.numel) * 4);
  }
}

void HostState::set_updated(uint64_t steps) {
  for (auto& s : units_)
    for (auto& c : s.updated) c->advance_to(steps);
}

StagingRing::StagingRing(Backend& backend, int slots, int64_t slot_bytes) : slot_bytes_((slot_bytes + 63) / 64 * 64) {
  SLIDEDP_CHECK(slots >= 1 && slot_bytes > 0);
  buffer_ = backend.alloc_host(slot_bytes_ * slots, true);
  for (int i = 0; i < slots; ++i) released_.push_back(backend.make_counter(0));
}

StagingRing::Slot StagingRing::next() {
  const uint64_t n = released_.size();
  Slot s;
  s.index = static_cast<int>(issued_ % n);
  s.generation = issued_ / n;
  s.ptr = buffer_.ptr + s.index * slot_bytes_;
  ++issued_;
  return s;
}

void StagingRing::release(int index) {
  HostCounter& c = released(index);
  c.advance_to(c.value() + 1);
}

int64_t HostState::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

}  // namespace slidedp::exec
