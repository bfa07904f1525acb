// The ONE authoritative training state, in host memory: per unit, flat fp32 master weights, AdamW m
// and v, the delivery mirror (bf16, or fp32 in exact mode) that every rank's H2D copies read, and an
// fp32 gradient accumulator where one is needed. With a split master (common/split_master.h) the fp32
// master is held as the bf16 mirror plus a 16-bit remainder, bit for bit: 12 bytes per parameter with
// the mirror instead of 14. Allocated once, laid out exactly like the unit's
// parameters (card/unit_layout.h). Per chunk, a host counter says how many optimizer steps the chunk
// has received; deliveries of step s wait for it to reach s (synchronous data-parallel semantics).
// Also the per-rank gradient staging rings the D2H copies land in.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "card/shard_range.h"
#include "card/unit_layout.h"
#include "executor/backend.h"
#include "kernels/cpu/optim/adamw.h"
#include "model/plan.h"

namespace slidedp::exec {

struct UnitState {
  int64_t numel = 0;   // flat elements
  int64_t chunks = 1;  // ceil(numel / chunk_numel)
  int64_t chunk_numel = 0;
  // master, m, v and the accumulator hold this node's shard of every chunk, chunk after chunk (the
  // whole unit unless the state is sharded across nodes); the mirror is always whole.
  HostBuffer master, exp_avg,
      exp_avg_sq;  // fp32 (master empty when split; m and v bf16 or 8-bit when so held)
  // 8-bit moments: the unit's segment boundaries (model/q8_segments.h), per segment where its blocks'
  // scales start in m_scale and v_scale (-1: a segment this node does not hold), and the scales.
  std::vector<int64_t> q8_bounds, q8_scale_offset;
  HostBuffer m_scale, v_scale;
  HostBuffer remainder;                    // split master: the low 16 bits of every held element
  HostBuffer mirror;                       // param dtype, pinned: what deliveries copy
  HostBuffer accum;                        // fp32 gradient accumulator (empty when not needed)
  std::vector<std::unique_ptr<HostCounter>> updated;  // per chunk: optimizer steps applied
  std::vector<ShardRange> own;  // sharded: per chunk, the unit's elements this node holds
  std::vector<int64_t> own_offset;  // sharded: per chunk, where they start in master, m, v, accum
  int64_t own_numel = 0;        // elements held of master, m, v (numel unless sharded)

  // Where unit element i (one this node holds) lives in master, m, v and the accumulator; elements
  // of one chunk's shard are contiguous.
  int64_t local(int64_t i) const {
    if (own.empty()) return i;
    const size_t k = static_cast<size_t>(i / chunk_numel);
    return own_offset[k] + (i - own[k].begin);
  }
  float* master_f32() const { return reinterpret_cast<float*>(master.ptr); }  // null when split
  uint16_t* remainder_u16() const { return reinterpret_cast<uint16_t*>(remainder.ptr); }
  float* m_f32() const { return reinterpret_cast<float*>(exp_avg.ptr); }  // fp32 moments only
  float* v_f32() const { return reinterpret_cast<float*>(exp_avg_sq.ptr); }
  float* accum_f32() const { return reinterpret_cast<float*>(accum.ptr); }
  float* m_scale_f32() const { return reinterpret_cast<float*>(m_scale.ptr); }
  float* v_scale_f32() const { return reinterpret_cast<float*>(v_scale.ptr); }
};

struct HostStateOptions {
  int64_t chunk_numel = int64_t{1} << 25;
  DType mirror_dtype = DType::kBF16;
  bool accumulate_all = false;   // an fp32 accumulator for every unit (accumulation, clipping, skip)
  bool accumulate_unit0 = false; // tied embeddings: unit 0 collects the head's contribution first
  // Sharded across nodes: this node holds node_range(chunk, shards, shard_ranks, shard) of every
  // chunk's master, m, v and accumulator (card/shard_range.h); host memory for them falls by `shards`.
  int shard = 0, shards = 1;
  int shard_ranks = 1;  // ranks per node
  // The fp32 master held as the bf16 mirror plus a 16-bit remainder (needs a bf16 mirror), and the
  // mirror's rounding: exact ties toward zero with a split master (the only rule that keeps it exact),
  // or, when set, with an fp32 master too (so the two can be compared bit for bit); else to nearest
  // even, as torch's cast.
  bool split_master = false;
  bool mirror_ties_toward_zero = false;
  // AdamW's m and v in fp32, in bf16 rounded stochastically, or in 8-bit blocks (kernels/cpu/optim/adamw.h).
  OptimizerStates moments = OptimizerStates::kFp32;
  // 8-bit moments: the pieces a chunk's update may be cut into (nodes x ranks: the gpu route's shards).
  int update_pieces = 1;
};

class HostState {
 public:
  HostState(Backend& backend, const ModelLayout& layout, const HostStateOptions& options);

  // Sets the master weights (one (flat_numel,) fp32 span per unit; a sharded state keeps its shards),
  // zeroes m and v, writes the whole mirror from them.
  void load_master(std::span<const std::span<const float>> units);
  // load_master for one unit: `whole` is its (flat_numel,) fp32 master.
  void load_unit_master(int u, std::span<const float> whole);
  // The elements of unit u this node holds of master, m and v, chunk by chunk (the whole unit unless
  // sharded); element i of them is at UnitState::local(i).
  std::vector<ShardRange> held_ranges(int u) const;
  // AdamW's view of unit u from element b on (one this node holds): master, m, v, and the bf16 mirror
  // the update writes as it goes (null with an fp32 mirror: write_fp32_mirror after the update).
  kernels::AdamwState adamw_state(int u, int64_t b) const;
  // An fp32 mirror (exact mode) of elements [b, b + n) of unit u, copied from the updated master.
  void write_fp32_mirror(int u, int64_t b, int64_t n) const;
  // The fp32 master of the elements of unit u this node holds, in UnitState::local order (the held
  // buffer itself unless split; a split master is rebuilt, bit for bit, into `out`).
  std::span<const float> master_values(int u, std::vector<float>& out) const;
  bool split_master() const { return options_.split_master; }
  // AdamW's first (which 0) or second (1) moment of the elements of unit u this node holds, in fp32
  // (the held buffer itself when fp32; bf16 ones widened, exactly, and 8-bit ones decoded into `out`).
  std::span<const float> moment_values(int u, int which, std::vector<float>& out) const;
  // Sets them from fp32 values in UnitState::local order (bf16 ones rounded to nearest: exact for
  // values a bf16 run wrote).
  void set_moment_values(int u, int which, std::span<const float> values);
  OptimizerStates moments() const { return options_.moments; }
  // Calls fn(piece_begin, piece_end, piece_state) for the pieces of [begin, end) one kernel call may
  // update: with 8-bit moments one per segment, the state `st` (made by adamw_state(u, base)) given the
  // segment's scales and block origin; otherwise [begin, end) with `st` itself.
  template <class Fn>
  void for_each_update_piece(int u, int64_t base, const kernels::AdamwState& st, int64_t begin, int64_t end,
                             Fn&& fn) const {
    if (options_.moments != OptimizerStates::k8bit) return fn(begin, end, st);
    const UnitState& s = unit(u);
    for (size_t k = q8_segment_at(s, begin); k + 1 < s.q8_bounds.size() && s.q8_bounds[k] < end; ++k) {
      SLIDEDP_CHECK(s.q8_bounds[k + 1] <= end && s.q8_scale_offset[k] >= 0,
                    "8-bit moments: an update range ends on a segment boundary, inside what this node holds");
      kernels::AdamwState piece = st;
      piece.exp_avg_scale = s.m_scale_f32() + s.q8_scale_offset[k];
      piece.exp_avg_sq_scale = s.v_scale_f32() + s.q8_scale_offset[k];
      piece.q8_origin = s.q8_bounds[k] - base;
      fn(s.q8_bounds[k], s.q8_bounds[k + 1], piece);
    }
  }
  // The update's rounding seeds of unit u at AdamW step `step` (bf16 moments).
  void set_rounding_seeds(kernels::AdamwState& st, int u, int64_t step) const;
  // Every chunk's counter to `steps` (after a resume at optimizer step `steps`).
  void set_updated(uint64_t steps);

  int num_units() const { return static_cast<int>(units_.size()); }
  int64_t total_numel() const;  // every unit's flat elements together
  UnitState& unit(int u) { return units_.at(static_cast<size_t>(u)); }
  const UnitState& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int64_t chunk_numel() const { return options_.chunk_numel; }
  DType mirror_dtype() const { return options_.mirror_dtype; }
  // [begin, end) elements of chunk k of unit u.
  std::pair<int64_t, int64_t> chunk_range(int u, int64_t k) const;
  // Nodes holding a part of every chunk (1 unless sharded across nodes), and the part of a chunk of
  // `count` elements node p holds (offsets into the chunk).
  int nodes() const { return options_.shards; }
  ShardRange node_part(int64_t count, int p) const {
    return options_.shards > 1 ? node_range(count, options_.shards, options_.shard_ranks, p) : ShardRange{0, count};
  }
  int64_t host_bytes() const { return host_bytes_; }
  int64_t pinned_bytes() const { return pinned_bytes_; }

 private:
  static size_t q8_segment_at(const UnitState& s, int64_t begin);  // the segment starting at `begin`
  void allocate_q8_scales(Backend& backend, const UnitLayout& layout, UnitState& s);

  HostStateOptions options_;
  std::vector<UnitState> units_;
  int64_t host_bytes_ = 0, pinned_bytes_ = 0;
};

// A rank's ring of host staging slots for gradient chunks. The i-th chunk a rank sends (in issue
// order, the same on every rank) uses slot i % slots and may be written once the slot was released
// i / slots times; the updater releases a slot when it has consumed it.
class StagingRing {
 public:
  struct Slot {
    int index = 0;
    uint64_t generation = 0;  // releases needed before it is free for this use
    std::byte* ptr = nullptr;
  };
  StagingRing(Backend& backend, int slots, int64_t slot_bytes);
  // The next slot in issue order (called by the rank's driver thread only).
  Slot next();
  HostCounter& released(int index) { return *released_.at(static_cast<size_t>(index)); }
  void release(int index);  // the updater is done with the slot's current contents
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t bytes() const { return buffer_.bytes; }

 private:
  int64_t slot_bytes_;
  HostBuffer buffer_;
  std::vector<std::unique_ptr<HostCounter>> released_;
  uint64_t issued_ = 0;
};

}  // namespace slidedp::exec
