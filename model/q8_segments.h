// Where AdamW's 8-bit moments (--optimizer-states 8bit) start their blocks. A block's scale is its
// largest value after the update, so one kernel call must update a whole block: every unit is cut into
// segments at each boundary an update range can have (a tensor's first and one-past-last element,
// where weight-decay groups change; a chunk's edges; within a chunk, each of the nodes x ranks shards
// the gpu route and a sharded host state cut it into), and each segment into blocks of kQ8Block from
// its start, the last one short. The cut depends on the layout, the chunk size and nodes x ranks
// only, so every route, activation policy and decay setting updates the same blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "card/unit_layout.h"

namespace slidedp {

// Sorted distinct segment boundaries of `unit`, 0 and flat_numel included; shard_pieces = nodes x ranks.
std::vector<int64_t> q8_segment_bounds(const UnitLayout& unit, int64_t chunk_numel, int shard_pieces);

// Scales one moment needs for the segments inside [begin, end), which starts and ends on boundaries.
int64_t q8_blocks_in(const std::vector<int64_t>& bounds, int64_t begin, int64_t end);

// Scales one moment needs for a whole model.
int64_t q8_model_blocks(const ModelLayout& layout, int64_t chunk_numel, int shard_pieces);

}  // namespace slidedp
