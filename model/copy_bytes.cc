#include "model/copy_bytes.h"

namespace slidedp {

double target_bytes_per_element(const SystemTraits& traits, CopyKind kind) {
  switch (kind) {
    case CopyKind::kParams: return traits.param_fetch_bytes;
    case CopyKind::kGrad: return traits.grad_bytes;
    case CopyKind::kGradShard: return traits.grad_shard_bytes;
    case CopyKind::kActivation: return 2.0;  // bf16 activations on the GPU
    case CopyKind::kGradAccum: return 2.0;   // DeepSpeed's pinned accumulator has the parameters' fp16 dtype
  }
  return 0;
}

std::optional<CopyKind> copy_kind_of(std::string_view what) {
  if (what == "params" || what == "params shard" || what == "params fp32" || what == "params shard fp32") return CopyKind::kParams;
  if (what == "grad" || what == "grad fp32") return CopyKind::kGrad;
  if (what == "grad shard") return CopyKind::kGradShard;
  if (what == "offload" || what == "prefetch") return CopyKind::kActivation;
  if (what == "grad accum in" || what == "grad accum out" || what == "grad shard accum in" || what == "grad shard accum out")
    return CopyKind::kGradAccum;
  return std::nullopt;
}

}  // namespace slidedp
