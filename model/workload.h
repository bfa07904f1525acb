// The workload: which model, how long the sequences are. The global batch follows from the plan
// (ranks x micro-batch x accumulation sequences of seq_len tokens).
#pragma once

#include <cstdint>

#include "model/model_card.h"
#include "model/unit_layout.h"

namespace slidedp {

struct Workload {
  ModelCard model;
  int64_t seq_len = 2048;  // T
  ModelLayout layout;      // derived from model; fill with make_workload()
};

Workload make_workload(const ModelCard& model, int64_t seq_len);

}  // namespace slidedp
