// Random SlideDP plans for the model's statistical tests (analytical vs simulator, jumps vs the
// full recurrence): one draw over every plan dimension, so every test samples the same space.
#pragma once

#include <algorithm>
#include <random>

#include "card/model_card.h"
#include "model/hardware.h"
#include "model/plan.h"

namespace slidedp {

struct RandomPlanRanges {
  int max_chunk_shift = 2;  // chunks of a layer / 2^0 .. 2^max_chunk_shift (at least 1M elements)
  int min_depth = 2, max_depth = 3;
};

inline Plan random_plan(std::mt19937_64& rng, const Hardware& hw, const ModelCard& card, RandomPlanRanges r = {}) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Plan p;
  p.ranks = pick(1, std::min(hw.gpu.count, 8));
  p.micro_batch = 1 << pick(0, 2);
  p.accum_steps = pick(1, 3);
  p.param_route = pick(0, 1) ? ParamRoute::kSharded : ParamRoute::kReplicated;
  p.grad_route = pick(0, 1) ? GradRoute::kGpu : GradRoute::kCpu;
  if (hw.fabric.kind == "none") p.param_route = ParamRoute::kReplicated, p.grad_route = GradRoute::kCpu;
  p.chunk_numel = std::max<int64_t>(1 << 20, card.decoder_layer_params() >> pick(0, r.max_chunk_shift));
  const int L = static_cast<int>(card.num_layers);
  p.offload_layers = pick(0, L / 2);
  p.recompute_layers = Plan::kRest;
  p.keep_layers = pick(0, L - p.offload_layers);
  p.gpu_buffer_depth = pick(r.min_depth, r.max_depth);
  return p;
}

}  // namespace slidedp
