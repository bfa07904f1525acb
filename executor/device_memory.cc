// Per-rank device memory of a plan on a backend; see device_memory.h. The items follow what the rank
// driver allocates: parameter slots, gradient buffers of two units, activations by policy, and the
// largest transient working set of one unit.
#include "executor/device_memory.h"

#include <algorithm>

namespace slidedp::exec {

std::vector<MemoryItem> device_memory_items(const Device& device, const ModelLayout& layout, const Plan& plan,
                                            int64_t seq_len, bool tied) {
  const int64_t B = plan.micro_batch, T = seq_len;
  const int U = layout.num_units(), L = U - 2;
  const double pb = static_cast<double>(dtype_bytes(device.param_dtype()));
  const UnitMemory dec = device.unit_memory(UnitKind::kDecoder, B, T);
  const UnitMemory head = device.unit_memory(UnitKind::kHead, B, T);
  const double hidden = static_cast<double>(dec.hidden_bytes);
  auto numel = [&](int u) {
    double n = static_cast<double>(layout.units[static_cast<size_t>(u)].flat_numel);
    if (layout.units[static_cast<size_t>(u)].reads_tied_embedding) n += static_cast<double>(layout.units[0].flat_numel);
    return n;
  };
  double window = 0, largest = 0;
  for (int u = 0; u < U; ++u) {
    double w = 0;
    for (int v = u; v < std::min(U, u + plan.gpu_buffer_depth); ++v) w += numel(v);
    window = std::max(window, w);
    largest = std::max(largest, static_cast<double>(layout.units[static_cast<size_t>(u)].flat_numel));
  }
  Plan::PolicyCounts pc = plan.policy_counts(L);
  std::vector<MemoryItem> items;
  items.push_back({"parameter slots", window * pb});
  // fp32 gradient of the unit in backward, its wire copy, and the previous unit's wire copy draining;
  // tied: the head also holds the embedding-sized lm_head gradient.
  double grads = largest * (4.0 + 2.0 * 2.0);
  if (tied) grads += static_cast<double>(layout.units[0].flat_numel) * 4.0;
  items.push_back({"gradient buffers", grads});
  items.push_back({"activations: unit inputs kept (keep + recompute)", (pc.keep + pc.recompute + 1) * hidden});
  items.push_back({"activations: saved (keep)", pc.keep * static_cast<double>(dec.saved_bytes)});
  if (pc.offload > 0) items.push_back({"activations: offload prefetch", 2.0 * hidden});
  const double fwd = hidden + static_cast<double>(dec.saved_bytes + dec.forward_workspace_bytes);
  const double bwd = 2.0 * hidden + static_cast<double>(dec.saved_bytes + std::max(dec.backward_workspace_bytes, dec.forward_workspace_bytes));
  const double hd = hidden + static_cast<double>(head.forward_workspace_bytes);
  items.push_back({"working set of one unit", std::max({fwd, bwd, hd})});
  items.push_back({"token ids and targets", 2.0 * 2.0 * static_cast<double>(B * T) * 4.0});
  // Backend-internal scratch: the gpu route widens each chunk's wire gradient to fp32 before the
  // reduce-scatter (CUDA); the embedding backward sorts (token, position) pairs (CUDA, ~24 B/token).
  if (plan.grad_route == GradRoute::kGpu && plan.ranks > 1)
    items.push_back({"reduce-scatter fp32 staging", static_cast<double>(plan.chunk_numel) * 4.0});
  items.push_back({"embedding backward sort scratch", 24.0 * static_cast<double>(B * T)});
  return items;
}

double device_memory_peak(const std::vector<MemoryItem>& items) {
  double s = 0;
  for (const auto& i : items) s += i.bytes;
  return s;
}

}  // namespace slidedp::exec
