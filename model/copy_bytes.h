// What one element of each copy the executor makes weighs on the target machine: the one source of
// the link bytes the step model charges (step_work.cc) and of the bytes the CPU backend's pacer holds
// a copy for (executor/target_pacing.h). The executor's own element sizes may differ from the
// target's (the CPU backend keeps activations and the gpu route's shards in fp32, --exact delivers
// fp32), so it counts elements and the target weighs them.
#pragma once

#include <optional>
#include <string_view>

#include "model/step_work.h"

namespace slidedp {

enum class CopyKind {
  kParams,      // a unit's parameters, or this rank's shard of them, host -> GPU
  kGrad,        // a rank's gradient of a unit, GPU -> host (the cpu route)
  kGradShard,   // the reduced gradient shard of the gpu route, GPU -> host
  kActivation,  // an offloaded unit input: out in the forward, back in the backward
  kGradAccum,   // ZeRO-Offload's fp16 gradient sum between micro-steps, out and back in
};

// Bytes per element on the target for `traits`' system.
double target_bytes_per_element(const SystemTraits& traits, CopyKind kind);

// The kind of a copy by the executor's span tag (`SpanTag::what`); nullopt for copies the model does
// not charge (token ids, the loss, counters), which the pacer moves as they are.
std::optional<CopyKind> copy_kind_of(std::string_view what);

}  // namespace slidedp
