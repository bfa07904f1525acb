// Host state <-> checkpoint folders; see state_checkpoint.h.
#include "executor/state_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>

#include "card/shard_range.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "executor/node_state.h"
#include "io/hf_model.h"
#include "io/unit_tensors.h"

namespace slidedp::exec {

namespace fs = std::filesystem;

void load_host_state(const CheckpointReader& checkpoint, HostState& state) {
  const ModelLayout& layout = checkpoint.layout();
  SLIDEDP_CHECK(layout.num_units() == state.num_units(), "load_host_state: the checkpoint's layout differs");
  ThreadPool pool(load_threads());
  std::vector<float> whole;
  using Part = CheckpointReader::Part;
  for (int u = 0; u < state.num_units(); ++u) {
    const UnitState& us = state.unit(u);
    SLIDEDP_CHECK(layout.units[static_cast<size_t>(u)].flat_numel == us.numel, "load_host_state: unit size differs");
    whole.resize(static_cast<size_t>(us.numel));
    const int64_t tiles = (us.numel + kReadTileElems - 1) / kReadTileElems;
    pool.parallel_for(tiles, [&](int64_t i) {
      const int64_t b = i * kReadTileElems;
      checkpoint.read(Part::kMaster, u, b, std::min(us.numel, b + kReadTileElems), whole.data() + b);
    });
    state.load_unit_master(u, whole);
    const std::vector<ShardRange> held = state.held_ranges(u);
    // Lossy moments: read in fp32, then rounded or encoded (exact for a run's own in the same blocks).
    const bool lossy = state.moments() != OptimizerStates::kFp32;
    std::vector<float> moment;
    for (Part part : {Part::kExpAvg, Part::kExpAvgSq}) {
      const int which = part == Part::kExpAvg ? 0 : 1;
      if (lossy) moment.resize(static_cast<size_t>(us.own_numel));
      float* to = lossy ? moment.data() : which == 0 ? us.m_f32() : us.v_f32();
      pool.parallel_for(static_cast<int64_t>(held.size()), [&](int64_t k) {
        const ShardRange r = held[static_cast<size_t>(k)];
        if (r.size() > 0) checkpoint.read(part, u, r.begin, r.end, to + us.local(r.begin));
      });
      if (lossy) state.set_moment_values(u, which, moment);
    }
  }
}

namespace {

// This node's part of a folder: whole tensors, gathered from every node's shards.
struct PartTensors {
  std::vector<std::array<std::vector<float>, 3>> values;  // per tensor of the part: master, m, v
  std::vector<TensorStateView> views() const {
    std::vector<TensorStateView> out;
    for (const auto& v : values) out.push_back({v[0], v[1], v[2]});
    return out;
  }
  std::vector<std::span<const float>> masters() const {
    std::vector<std::span<const float>> out;
    for (const auto& v : values) out.emplace_back(v[0]);
    return out;
  }
};

// Every piece (a tensor's elements inside one node's shard of one chunk) goes from the node holding it
// to the node whose part holds the tensor. Both sides walk the same order, so one tag serves all
// (MPI matches a pair's messages of one tag in posting order).
// `kinds`: which of master (0), m (1) and v (2) to move.
PartTensors exchange_part_tensors(NodeLink& link, const HostState& state, const ModelLayout& layout,
                                  const TensorSplit& split, std::initializer_list<int> kinds) {
  const int M = link.nodes(), me = link.node();
  const int64_t tag = link.reserved_tag(3);
  PartTensors part;
  TransferCount done;
  int posted = 0;
  // A split master and bf16 moments are widened to fp32 for the exchange (the sends read them until the end).
  const bool moves_master = std::find(kinds.begin(), kinds.end(), 0) != kinds.end();
  const bool moves_moments = std::find(kinds.begin(), kinds.end(), 1) != kinds.end();
  std::vector<std::array<std::vector<float>, 3>> rebuilt(static_cast<size_t>(state.num_units()));
  for (int u = 0; u < state.num_units(); ++u) {
    const UnitState& us = state.unit(u);
    // Sent until done.wait below: a split master and bf16 moments widened to fp32 for the exchange.
    auto& widened = rebuilt[static_cast<size_t>(u)];
    const float* held[3] = {moves_master ? state.master_values(u, widened[0]).data() : nullptr,
                            moves_moments ? state.moment_values(u, 0, widened[1]).data() : nullptr,
                            moves_moments ? state.moment_values(u, 1, widened[2]).data() : nullptr};
    const UnitLayout& unit = layout.units[static_cast<size_t>(u)];
    for (size_t t = 0; t < unit.tensors.size(); ++t) {
      const TensorSpec& spec = unit.tensors[t];
      const int q = split.part_of[static_cast<size_t>(u)][t];
      std::array<std::vector<float>, 3>* into = nullptr;
      if (q == me) {
        part.values.emplace_back();
        for (int i : kinds) part.values.back()[static_cast<size_t>(i)].resize(static_cast<size_t>(spec.numel));
        into = &part.values.back();
      }
      for (int64_t k = 0; k < us.chunks; ++k) {
        const auto [b, e] = state.chunk_range(u, k);
        if (e <= spec.offset || b >= spec.offset + spec.numel) continue;
        for (int p = 0; p < M; ++p) {
          const ShardRange s = state.node_part(e - b, p);
          const int64_t lo = std::max(b + s.begin, spec.offset), hi = std::min(b + s.end, spec.offset + spec.numel);
          if (lo >= hi || (p != me && q != me)) continue;
          const int64_t bytes = (hi - lo) * 4;
          for (int i : kinds) {
            // The vector's buffer stays put when part.values grows (a move keeps it).
            float* dst = into ? (*into)[static_cast<size_t>(i)].data() + (lo - spec.offset) : nullptr;
            const std::string what = fmt::format("node {}'s elements {}..{} of {} for the checkpoint", p, lo - spec.offset,
                                                 hi - spec.offset, spec.name);
            if (p == me && q == me) {
              std::memcpy(dst, held[i] + us.local(lo), static_cast<size_t>(bytes));
            } else if (q == me) {
              link.recv(p, tag, reinterpret_cast<std::byte*>(dst), bytes, what, done.one());
              ++posted;
            } else {
              link.send(q, tag, reinterpret_cast<const std::byte*>(held[i] + us.local(lo)), bytes, what, done.one());
              ++posted;
            }
          }
        }
      }
    }
  }
  done.wait(link, posted);
  return part;
}

// A folder written in parts, one per node: node 0 begins it (returning the temp folder every node
// writes into), each node writes its part, node 0 finishes it; a failure anywhere fails every node
// and leaves no folder. `write_part` runs its collective exchange before anything that can fail on
// one node only.
std::string write_in_parts(NodeLink& link, const std::string& what, const std::function<std::string()>& begin,
                           const std::function<void(const std::string& tmp)>& write_part,
                           const std::function<std::string(const std::string& tmp)>& finish,
                           const std::function<void(const std::string& tmp)>& abandon) {
  const int me = link.node();
  std::string tmp;
  std::exception_ptr failed;
  if (me == 0) {
    try {
      tmp = begin();
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // Until the folder is published, any way out of here (another node's failure, an interrupted
  // collective, an abandoned write) takes node 0's temp folder with it.
  const std::string created = me == 0 && !failed ? tmp : std::string();
  try {
    throw_if_any_node_failed(link, failed, "starting " + what);
    tmp = all_gather_text(link, me == 0 ? tmp : std::string(), "the folder of " + what)[0];
    // A node that cannot see node 0's folder would write its part elsewhere: refuse before the exchange.
    if (!fs::is_directory(tmp))
      failed = std::make_exception_ptr(IoError(tmp, fmt::format("node {} cannot see the folder node 0 created: the nodes of a "
                                                                "run must share the folder's file system",
                                                                me)));
    throw_if_any_node_failed(link, failed, "opening " + what);
    try {
      write_part(tmp);
    } catch (...) {
      failed = std::current_exception();
    }
    throw_if_any_node_failed(link, failed, "writing " + what);
  } catch (...) {
    if (!created.empty()) abandon(created);
    throw;
  }
  std::string final_dir;
  if (me == 0) {
    try {
      final_dir = finish(tmp);
    } catch (...) {
      abandon(tmp);
      failed = std::current_exception();
    }
  }
  throw_if_any_node_failed(link, failed, "publishing " + what);
  return all_gather_text(link, final_dir, "the published " + what)[0];
}

}  // namespace

std::string save_sharded_checkpoint(NodeLink& link, const HostState& state, const ModelCard& card,
                                    const TrainerState& trainer_state, const std::string& root_dir, int keep_last) {
  const ModelLayout layout = make_model_layout(card);
  const TensorSplit split = split_tensors_evenly(layout, link.nodes());
  return write_in_parts(
      link, fmt::format("checkpoint {}", trainer_state.optimizer_step),
      [&] { return begin_checkpoint(root_dir, trainer_state); },
      [&](const std::string& tmp) {
        // The weights, then the moments: a node holds at most 8 bytes per parameter of its part at once.
        for (auto kinds : {std::initializer_list<int>{0}, std::initializer_list<int>{1, 2}}) {
          const PartTensors part = exchange_part_tensors(link, state, layout, split, kinds);
          write_checkpoint_part(tmp, layout, split, link.node(), part.views(), trainer_state.optimizer_step);
        }
      },
      [&](const std::string& tmp) { return finish_checkpoint(tmp, root_dir, card, split, trainer_state, keep_last); },
      abandon_checkpoint);
}

std::string save_sharded_model(NodeLink& link, const HostState& state, const ModelCard& card, const std::string& dir,
                               const HfSaveOptions& options) {
  const ModelLayout layout = make_model_layout(card);
  const TensorSplit split = split_tensors_evenly(layout, link.nodes());
  return write_in_parts(
      link, "the model folder " + dir, [&] { return begin_hf_model_save(dir, card, options); },
      [&](const std::string& tmp) {
        const PartTensors part = exchange_part_tensors(link, state, layout, split, {0});
        write_hf_model_part(tmp, layout, split, link.node(), part.masters(), options.dtype, options.poll);
      },
      [&](const std::string& tmp) {
        finish_hf_model_save(tmp, dir, layout, split, options.dtype);
        return dir;
      },
      [](const std::string& tmp) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      });
}

}  // namespace slidedp::exec
