// Helpers on a Prediction that the analytical model and the simulator share; see prediction.h.
#include "model/prediction.h"

namespace slidedp {

void add_sync_term(Prediction& p, double factor) {
  if (factor == 1.0) return;
  const double extra = p.step_time_s * (factor - 1.0);
  p.step_time_s += extra;
  p.breakdown.sync_s += extra;
  p.critical_path_s *= factor;
}

void add_bottleneck_and_throughput(Prediction& p, double tokens_per_step, double model_flops_per_step, int gpus) {
  for (const auto& [name, busy] : p.busy_s) {
    const double u = busy / p.step_time_s;
    if (u > p.bottleneck_utilization) {
      p.bottleneck_utilization = u;
      p.bottleneck = name;
    }
  }
  p.tokens_per_step = tokens_per_step;
  p.tokens_per_s = p.tokens_per_step / p.step_time_s;
  p.tflops_per_gpu = model_flops_per_step / p.step_time_s / gpus / 1e12;
}

}  // namespace slidedp
