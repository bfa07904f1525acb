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

}  // namespace slidedp
