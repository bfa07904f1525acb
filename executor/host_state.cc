// Host state allocation and loading; see host_state.h.
#include "executor/host_state.h"

#include <algorithm>
#include <cstring>

#include "card/shard_range.h"
#include "common/bf16.h"
#include "common/error.h"
#include "common/split_master.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/q8_moments.h"
#include "kernels/cpu/optim/stochastic_rounding.h"
#include "model/q8_segments.h"

namespace slidedp::exec {

HostState::HostState(Backend& backend, const ModelLayout& layout, const HostStateOptions& options)
    : options_(options) {
  SLIDEDP_CHECK(options.chunk_numel > 0);
  SLIDEDP_CHECK(
      !(options.split_master || options.mirror_ties_toward_zero) || options.mirror_dtype == DType::kBF16,
      "a split master and its mirror rule need a bf16 mirror");
  if (options_.split_master) options_.mirror_ties_toward_zero = true;
  const int64_t mbytes = dtype_bytes(options.mirror_dtype);
  units_.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    UnitState& s = units_[u];
    s.numel = layout.units[u].flat_numel;
    s.chunks = num_chunks(s.numel, options.chunk_numel);
    s.chunk_numel = options.chunk_numel;
    s.own_numel = s.numel;
    if (options.shards > 1) {
      s.own_numel = 0;
      for (int64_t k = 0; k < s.chunks; ++k) {
        const int64_t b = k * options.chunk_numel, e = std::min(s.numel, b + options.chunk_numel);
        const ShardRange r = node_part(e - b, options.shard);
        s.own.push_back({b + r.begin, b + r.end});
        s.own_offset.push_back(s.own_numel);
        s.own_numel += r.size();
      }
    }
    const int64_t f32 = s.own_numel * 4;
    if (options.split_master) {
      s.remainder = backend.alloc_host(s.own_numel * 2, false);
    } else {
      s.master = backend.alloc_host(f32, false);
    }
    const int64_t moment = options.moments == OptimizerStates::kFp32   ? f32
                           : options.moments == OptimizerStates::kBf16 ? s.own_numel * 2
                                                                       : s.own_numel;
    s.exp_avg = backend.alloc_host(moment, false);
    s.exp_avg_sq = backend.alloc_host(moment, false);
    if (options.moments == OptimizerStates::k8bit) allocate_q8_scales(backend, layout.units[u], s);
    s.mirror = backend.alloc_host(s.numel * mbytes, true);
    host_bytes_ += (options.split_master ? s.own_numel * 2 : f32) + 2 * moment + s.numel * mbytes;
    pinned_bytes_ += s.numel * mbytes;
    if (options.accumulate_all || (u == 0 && options.accumulate_unit0)) {
      s.accum = backend.alloc_host(f32, false);  // this node's shard, as master
      host_bytes_ += f32;
    }
    for (int64_t k = 0; k < s.chunks; ++k) s.updated.push_back(backend.make_counter(0));
  }
}

// Scales for the segments this node holds (a sharded state's parts are unions of segments).
void HostState::allocate_q8_scales(Backend& backend, const UnitLayout& layout, UnitState& s) {
  s.q8_bounds = q8_segment_bounds(layout, options_.chunk_numel, options_.update_pieces);
  int64_t blocks = 0;
  for (size_t k = 0; k + 1 < s.q8_bounds.size(); ++k) {
    const int64_t b = s.q8_bounds[k], e = s.q8_bounds[k + 1];
    bool held = s.own.empty();
    for (const ShardRange& r : s.own) held = held || (b >= r.begin && e <= r.end);
    s.q8_scale_offset.push_back(held ? blocks : -1);
    if (held) blocks += kernels::q8_blocks(e - b);
  }
  if (blocks == 0) return;  // nothing held (an empty unit)
  s.m_scale = backend.alloc_host(blocks * 4, false);
  s.v_scale = backend.alloc_host(blocks * 4, false);
  host_bytes_ += 8 * blocks;
}

size_t HostState::q8_segment_at(const UnitState& s, int64_t begin) {
  const auto it = std::lower_bound(s.q8_bounds.begin(), s.q8_bounds.end(), begin);
  SLIDEDP_CHECK(it != s.q8_bounds.end() && *it == begin,
                "8-bit moments: an update range starts on a segment boundary");
  const auto k = static_cast<size_t>(it - s.q8_bounds.begin());
  SLIDEDP_CHECK(k + 1 == s.q8_bounds.size() || s.q8_scale_offset[k] >= 0,
                "8-bit moments: a segment this node holds");
  return k;
}

std::pair<int64_t, int64_t> HostState::chunk_range(int u, int64_t k) const {
  const UnitState& s = unit(u);
  const int64_t begin = k * options_.chunk_numel;
  return {begin, std::min(s.numel, begin + options_.chunk_numel)};
}

namespace {

// fn(begin, end, scale_offset) for each 8-bit segment of unit `s` this node holds.
template <class Fn>
void for_each_held_segment(const UnitState& s, Fn&& fn) {
  for (size_t k = 0; k + 1 < s.q8_bounds.size(); ++k)
    if (s.q8_scale_offset[k] >= 0) fn(s.q8_bounds[k], s.q8_bounds[k + 1], s.q8_scale_offset[k]);
}

// Copies the elements of `whole` (a unit's flat values) this node holds into `dst`.
void copy_own(const UnitState& s, const float* whole, float* dst) {
  if (s.own.empty()) return (void)std::memcpy(dst, whole, static_cast<size_t>(s.numel) * 4);
  for (size_t k = 0; k < s.own.size(); ++k)
    std::memcpy(dst + s.own_offset[k], whole + s.own[k].begin, static_cast<size_t>(s.own[k].size()) * 4);
}

// Moment `which` of unit `s` (0: m, 1: v): its values in the held format, its 8-bit blocks' scales
// (8-bit moments only) and its code.
struct HeldMoment {
  std::byte* values;
  float* scales;
  kernels::Moment code;
};
HeldMoment held_moment(const UnitState& s, int which) {
  return which == 0 ? HeldMoment{s.exp_avg.ptr, s.m_scale_f32(), kernels::Moment::kFirst}
                    : HeldMoment{s.exp_avg_sq.ptr, s.v_scale_f32(), kernels::Moment::kSecond};
}

}  // namespace

void HostState::load_master(std::span<const std::span<const float>> units) {
  SLIDEDP_CHECK(units.size() == units_.size(), "one master buffer per unit");
  for (size_t u = 0; u < units_.size(); ++u) load_unit_master(static_cast<int>(u), units[u]);
}

void HostState::load_unit_master(int u, std::span<const float> whole) {
  UnitState& s = unit(u);
  SLIDEDP_CHECK(static_cast<int64_t>(whole.size()) == s.numel, "master buffer size differs from the layout");
  // +0.0 in fp32, bf16 and the 8-bit codes alike (and their scales)
  for (HostBuffer* b : {&s.exp_avg, &s.exp_avg_sq, &s.m_scale, &s.v_scale})
    if (b->ptr) std::memset(b->ptr, 0, static_cast<size_t>(b->bytes));
  // The whole mirror, from the whole input (a sharded master holds only part of it).
  if (options_.mirror_ties_toward_zero) {
    auto* mirror = reinterpret_cast<bf16_bits*>(s.mirror.ptr);
    if (options_.split_master && s.own.empty())  // the whole unit held: mirror and remainder in one pass
      return kernels::f32_to_split(whole.data(), mirror, s.remainder_u16(), s.numel);
    kernels::f32_to_split(whole.data(), mirror, nullptr, s.numel);
    if (!options_.split_master) return copy_own(s, whole.data(), s.master_f32());
    for (const ShardRange& r : held_ranges(u))  // a node's part: its remainders (and their mirror again)
      kernels::f32_to_split(whole.data() + r.begin, mirror + r.begin, s.remainder_u16() + s.local(r.begin),
                            r.size());
    return;
  }
  copy_own(s, whole.data(), s.master_f32());
  if (options_.mirror_dtype == DType::kBF16) {
    kernels::f32_to_bf16(whole.data(), reinterpret_cast<bf16_bits*>(s.mirror.ptr), s.numel);
  } else {
    std::memcpy(s.mirror.ptr, whole.data(), static_cast<size_t>(s.numel) * 4);
  }
}

std::vector<ShardRange> HostState::held_ranges(int u) const {
  const UnitState& s = unit(u);
  if (s.own.empty()) return {ShardRange{0, s.numel}};
  return s.own;
}

kernels::AdamwState HostState::adamw_state(int u, int64_t b) const {
  const UnitState& s = unit(u);
  kernels::AdamwState st;
  if (options_.split_master) {
    st.remainder = s.remainder_u16() + s.local(b);
  } else {
    st.param = s.master_f32() + s.local(b);
  }
  st.mirror_ties_toward_zero = options_.mirror_ties_toward_zero;
  if (options_.moments == OptimizerStates::kBf16) {
    st.exp_avg_bf16 = reinterpret_cast<bf16_bits*>(s.exp_avg.ptr) + s.local(b);
    st.exp_avg_sq_bf16 = reinterpret_cast<bf16_bits*>(s.exp_avg_sq.ptr) + s.local(b);
    st.moment_index_base = b;  // the unit's element index: the same noise on any node or chunking
  } else if (options_.moments == OptimizerStates::k8bit) {
    st.exp_avg_q8 = reinterpret_cast<uint8_t*>(s.exp_avg.ptr) + s.local(b);  // scales: for_each_update_piece
    st.exp_avg_sq_q8 = reinterpret_cast<uint8_t*>(s.exp_avg_sq.ptr) + s.local(b);
  } else {
    st.exp_avg = s.m_f32() + s.local(b);
    st.exp_avg_sq = s.v_f32() + s.local(b);
  }
  st.param_bf16 = options_.mirror_dtype == DType::kBF16 ? reinterpret_cast<bf16_bits*>(s.mirror.ptr) + b : nullptr;
  return st;
}

void HostState::write_fp32_mirror(int u, int64_t b, int64_t n) const {
  if (options_.mirror_dtype != DType::kF32) return;
  const UnitState& s = unit(u);
  std::memcpy(reinterpret_cast<float*>(s.mirror.ptr) + b, s.master_f32() + s.local(b), static_cast<size_t>(n) * 4);
}

std::span<const float> HostState::master_values(int u, std::vector<float>& out) const {
  const UnitState& s = unit(u);
  if (!options_.split_master) return {s.master_f32(), static_cast<size_t>(s.own_numel)};
  out.resize(static_cast<size_t>(s.own_numel));
  const auto* mirror = reinterpret_cast<const bf16_bits*>(s.mirror.ptr);
  for (const ShardRange& r : held_ranges(u))
    for (int64_t i = r.begin; i < r.end; ++i)
      out[static_cast<size_t>(s.local(i))] = join_master(mirror[i], s.remainder_u16()[s.local(i)]);
  return out;
}

std::span<const float> HostState::moment_values(int u, int which, std::vector<float>& out) const {
  const UnitState& s = unit(u);
  const HeldMoment m = held_moment(s, which);
  if (options_.moments == OptimizerStates::kFp32)
    return {reinterpret_cast<const float*>(m.values), static_cast<size_t>(s.own_numel)};
  out.resize(static_cast<size_t>(s.own_numel));
  if (options_.moments == OptimizerStates::kBf16) {
    kernels::bf16_to_f32(reinterpret_cast<const bf16_bits*>(m.values), out.data(), s.own_numel);
    return out;
  }
  for_each_held_segment(s, [&](int64_t sb, int64_t se, int64_t scale_offset) {
    kernels::q8_decode(m.code, reinterpret_cast<const uint8_t*>(m.values) + s.local(sb),
                       m.scales + scale_offset, se - sb, out.data() + s.local(sb));
  });
  return out;
}

void HostState::set_moment_values(int u, int which, std::span<const float> values) {
  UnitState& s = unit(u);
  SLIDEDP_CHECK(static_cast<int64_t>(values.size()) == s.own_numel, "moment values: one per held element");
  const HeldMoment m = held_moment(s, which);
  if (options_.moments == OptimizerStates::kFp32) {
    std::memcpy(m.values, values.data(), values.size() * 4);
  } else if (options_.moments == OptimizerStates::kBf16) {
    kernels::f32_to_bf16(values.data(), reinterpret_cast<bf16_bits*>(m.values), s.own_numel);
  } else {
    for_each_held_segment(s, [&](int64_t sb, int64_t se, int64_t scale_offset) {
      kernels::q8_encode(m.code, values.data() + s.local(sb), se - sb,
                         reinterpret_cast<uint8_t*>(m.values) + s.local(sb), m.scales + scale_offset);
    });
  }
}

void HostState::set_rounding_seeds(kernels::AdamwState& st, int u, int64_t step) const {
  if (options_.moments != OptimizerStates::kBf16) return;
  st.m_seed = kernels::moment_seed(step, u, 0);
  st.v_seed = kernels::moment_seed(step, u, 1);
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
