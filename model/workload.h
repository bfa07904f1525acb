// The workload: which model, how long the sequences are. The global batch follows from the plan
// (ranks x micro-batch x accumulation sequences of seq_len tokens).
#pragma once

#include <cstdint>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp {

struct Workload {
  ModelCard model;
  int64_t seq_len = 2048;  // T
  ModelLayout layout;      // derived from model; fill with make_workload()
  // What-if for MoE models (expert_routing.h): deliver to a rank only the experts its micro-batch
  // routes to, and send back only their gradients, under a router whose expert popularity follows a
  // Zipf law of this skew (0: uniform). The host still updates every expert (their AdamW moments
  // decay), so CPU work is unchanged. Off: every expert travels every micro-step, as SlideDP does.
  bool expert_aware_delivery = false;
  double router_skew = 0.0;
  // Packed documents whose boundaries reset attention, RoPE and recurrent state (slidedp-run
  // --document-end): each micro-batch carries the tokens' document positions to the device. The
  // costs are charged as if every sequence were one document (the upper bound).
  bool packed_documents = false;
};

Workload make_workload(const ModelCard& model, int64_t seq_len);

}  // namespace slidedp
