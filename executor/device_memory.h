// The device memory a plan needs on a given backend, from that backend's exact buffer sizes: what the
// trainer checks before the first step, so a plan that cannot fit is rejected up front with the
// numbers instead of failing half-way. (The model's memory_model.h estimates the same for any
// hardware; this one is exact for the backend at hand, e.g. fp32 activations on the CPU backend.)
#pragma once

#include <string>
#include <vector>

#include "executor/backend.h"
#include "model/memory_model.h"
#include "model/plan.h"

namespace slidedp::exec {

// Peak bytes per rank, itemized like the model's estimate.
std::vector<MemoryItem> device_memory_items(const Device& device, const ModelLayout& layout, const Plan& plan,
                                            int64_t seq_len, bool tied);
double device_memory_peak(const std::vector<MemoryItem>& items);

}  // namespace slidedp::exec
