// A whole model's forward + backward on the CPU, unit after unit, unstreamed, with the `keep`
// policy: the reference the streamed executor must reproduce ("the streamed model equals an
// unstreamed run of the same backend"), and the driver of the golden-file test. It shows the call
// sequence the executor runs, including the tied-embedding wiring of the head.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/layer_spec.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

struct ModelSpecs {
  EmbeddingSpec embedding;
  std::vector<LayerSpec> layers;  // one per decoder layer, of the model's family
  HeadSpec head;
  int64_t num_layers = 0;
  // The CPU tunables every layer was given (set_threads, set_mlp_token_tile), for whoever sizes the
  // same units again.
  int64_t threads = 1;
  int64_t mlp_token_tile = 0;
  const LayerSpec& layer(int64_t l) const { return layers.at(static_cast<size_t>(l)); }
  // Layers with a routed MoE block and their experts (the router statistics' shape; 0: dense).
  int64_t moe_layers() const;
  int64_t moe_experts() const;
  // The CPU tunables of every layer: worker threads and the MLP token tile (throws InputError naming
  // mlp_token_tile for a family that does not tile its MLP).
  void set_threads(int64_t threads);
  void set_mlp_token_tile(int64_t rows);
};

ModelSpecs make_model_specs(const ModelCard& card, const ModelLayout& layout);

// params[u], grads[u], u = 0 .. L+1: every unit's flat buffer in the compute type (layout order).
// tokens, targets (B, T). grads are accumulated (+=): the gradient of grad_scale x (loss sum) +
// router_aux_coef x (the mean over the B sequences of the router's load-balancing loss,
// router_aux_loss.h). Returns the head's (loss sum, count) and the load-balancing loss's sum.
// positions (B, T): the document positions of packed sequences (attention.h), or null.
template <typename Real>
LossResult model_forward_backward(const ModelSpecs& specs, std::span<const Real* const> params,
                                  std::span<Real* const> grads, const int32_t* tokens, const int32_t* targets,
                                  int64_t B, int64_t T, double grad_scale, double router_aux_coef = 0,
                                  const int32_t* positions = nullptr);

}  // namespace slidedp::kernels
