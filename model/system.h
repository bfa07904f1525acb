// The systems the model can predict: SlideDP itself and the baselines it is compared against, each
// expressed as the same pipeline with different routes, placements and serialization
// (shared/reference/baselines.md). Choosing a system never changes the workload's math.
#pragma once

#include <string>
#include <vector>

namespace slidedp {

enum class System {
  kSlideDP,        // the plan as given
  kSlideFormerDP,  // replicated delivery with per-rank fp32->bf16 conversion; rank-0 CPU reduce+AdamW
                   // on one process's threads; two barriers per chunk; shared grad buffer serializes
  kZeroOffload,    // bf16 params GPU-resident; GPU reduce-scatter; CPU AdamW of each rank's partition
                   // after backward; upload + all-gather of the new params
  kMegaTrain,      // every rank streams full weights from one host copy; gradients accumulated on the
                   // host under a global lock; one optimizer step after backward
  kFsdp2,          // GPU-resident FSDP2: sharded params/grads/optimizer on GPU, no host traffic
  kZero3Offload,   // DeepSpeed ZeRO-3, parameters and optimizer offloaded to the host: each rank's bf16
                   // partition fetched per layer and all-gathered (forward and backward), gradients
                   // reduce-scattered and copied to the partition's host owner, CPU Adam after backward
  kFsdpOffload,    // FSDP full shard with CPUOffload(offload_params=True): each rank's fp32 shard copied
                   // to the GPU per layer, cast and all-gathered; fp32 gradient shards back to the host;
                   // torch's CPU AdamW over each rank's shard after backward
};

const char* system_name(System s);
System parse_system(const std::string& name, const std::string& where);
std::vector<std::string> system_names();

}  // namespace slidedp
