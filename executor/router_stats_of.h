// The router statistics of a unit operation's micro-batch (kernels/cpu/transformer/router_aux_loss.h)
// as a view of its buffer, for every backend's MoE units: none for dense models (no buffer).
#pragma once

#include <optional>

#include "common/error.h"
#include "executor/backend.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/router_aux_loss.h"

namespace slidedp::exec {

inline std::optional<kernels::RouterStats> router_stats_of(const kernels::ModelSpecs& s,
                                                           const UnitOpArgs& a) {
  if (a.router_stats.bytes == 0) return std::nullopt;
  SLIDEDP_CHECK(a.router_stats.bytes >= kernels::router_stats_bytes(a.B, s.moe_experts()),
                "router statistics too small");
  return kernels::router_stats_view(a.router_stats.ptr, a.B, s.moe_experts(), s.moe_layers() * a.T,
                                    a.router_aux_weight);
}

}  // namespace slidedp::exec
