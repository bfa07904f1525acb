// The host state to and from checkpoint folders (io/checkpoint.h) without a whole copy of it: a resume
// streams each unit from the mapped files straight into the state, and a state sharded across nodes is
// saved by every node writing its part of the folder.
#pragma once

#include <string>

#include "executor/host_state.h"
#include "executor/node_link.h"
#include "io/checkpoint.h"
#include "io/hf_model.h"

namespace slidedp::exec {

// Sets the state (master, m, v and the mirror) from a checkpoint of the same layout, written by any
// number of nodes: this node reads the elements of m and v it holds, and each unit's whole master
// (the mirror is whole on every node), one unit at a time.
void load_host_state(const CheckpointReader& checkpoint, HostState& state);

// Saves a state sharded across the link's nodes as one checkpoint folder under root_dir, in one part
// per node: the nodes exchange their shards so that each holds whole tensors of its part (as much
// host memory again as its shard, for the duration of the write), write them, and node 0 publishes
// the folder once every part is on disk. Called by every node. Returns the folder (on every node);
// when any node fails, every node throws (throw_if_any_node_failed) and no folder is published.
// The nodes must share the file system of root_dir.
std::string save_sharded_checkpoint(NodeLink& link, const HostState& state, const ModelCard& card,
                                    const TrainerState& trainer_state, const std::string& root_dir, int keep_last);

// Saves the final weights of a state sharded across the link's nodes as a Hugging Face model folder
// (io/hf_model.h) in one part per node, the same way: no node holds more than its part of the
// weights. Called by every node; returns `dir`.
std::string save_sharded_model(NodeLink& link, const HostState& state, const ModelCard& card, const std::string& dir,
                               const HfSaveOptions& options);

}  // namespace slidedp::exec
