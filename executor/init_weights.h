// Deterministic random initialization of a model's flat unit buffers (for training from scratch and
// for tests): matrices ~ N(0, std^2) (std 0.02, as Hugging Face's initializer_range), RMSNorm weights
// 1, biases 0, padding 0. The generator is our own (splitmix64 + Box-Muller), so the same seed gives
// the same weights on every platform and standard library.
#pragma once

#include <cstdint>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp::exec {

std::vector<std::vector<float>> init_random_weights(const ModelLayout& layout, uint64_t seed, double std = 0.02);

}  // namespace slidedp::exec
