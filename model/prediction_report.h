// Human and machine renderings of a Prediction: a readable breakdown (bottleneck first) and one JSON
// object with stable keys (step_time_s, tokens_per_s, breakdown, busy_s, memory, ...). Every CLI that
// prints predictions uses these, so the formats never drift apart.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/prediction.h"

namespace slidedp {

nlohmann::json prediction_to_json(const Prediction& p);
// `context` is a one-line description printed first (model, hardware, plan summary).
std::string prediction_to_text(const Prediction& p, const std::string& context);

}  // namespace slidedp
