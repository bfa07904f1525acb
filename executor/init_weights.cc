// Seeded weight initialization; see init_weights.h.
#include "executor/init_weights.h"

#include <cmath>

#include "common/thread_pool.h"

namespace slidedp::exec {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) { return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53; }


}  // namespace

std::vector<std::vector<float>> init_random_weights(const ModelLayout& layout, uint64_t seed, double std) {
  std::vector<std::vector<float>> units;
  std::vector<std::pair<size_t, const TensorSpec*>> work;  // (unit, tensor): independent streams
  for (size_t u = 0; u < layout.units.size(); ++u) {
    units.emplace_back(static_cast<size_t>(layout.units[u].flat_numel), 0.0f);
    for (const TensorSpec& t : layout.units[u].tensors) work.push_back({u, &t});
  }
  // Tensors are filled in parallel; each has its own generator, so the result is the same for any
  // thread count.
  ThreadPool pool(ThreadPool::available_cpus());
  pool.parallel_for(static_cast<int64_t>(work.size()), [&](int64_t w) {
    const TensorSpec& t = *work[static_cast<size_t>(w)].second;
    std::vector<float>& flat = units[work[static_cast<size_t>(w)].first];
    {
      // One independent stream per tensor, keyed by its name: adding a tensor elsewhere does not
      // change this one's values.
      uint64_t state = seed;
      for (char c : t.name) state = state * 1099511628211ull + static_cast<unsigned char>(c);
      float* p = flat.data() + t.offset;
      if (is_norm_weight(t.name) || is_frozen_buffer(t.name)) {  // x * w norms and layer_scalar start at 1
        for (int64_t i = 0; i < t.numel; ++i) p[i] = 1.0f;
      } else if (t.name.ends_with(".bias")) {
        // zeros
      } else {
        for (int64_t i = 0; i < t.numel; i += 2) {
          const double r = std::sqrt(-2.0 * std::log(uniform01(state)));
          const double th = 2.0 * M_PI * uniform01(state);
          p[i] = static_cast<float>(std * r * std::cos(th));
          if (i + 1 < t.numel) p[i + 1] = static_cast<float>(std * r * std::sin(th));
        }
      }
    }
  });
  return units;
}

}  // namespace slidedp::exec
