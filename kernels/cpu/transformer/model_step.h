// A whole model's forward + backward on the CPU, unit after unit, unstreamed, with the `keep`
// policy: the reference the streamed executor must reproduce ("the streamed model equals an
// unstreamed run of the same backend"), and the driver of the golden-file test. It shows the call
// sequence the executor runs, including the tied-embedding wiring of the head.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/gemma4_layer.h"
#include "kernels/cpu/transformer/qwen3_5_layer.h"
#include "kernels/cpu/transformer/unit_spec.h"
#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp::kernels {

struct ModelSpecs {
  EmbeddingSpec embedding;
  DecoderSpec decoder;  // the Llama family: shared by all layers
  std::vector<Gemma4LayerSpec> gemma4_layers;  // Gemma 4: one per layer (decoder unused)
  std::vector<Qwen35LayerSpec> qwen3_5_layers;  // Qwen3.5 / 3.6: one per layer (decoder unused)
  HeadSpec head;
  int64_t num_layers = 0;
  bool gemma4() const { return !gemma4_layers.empty(); }
  bool qwen3_5() const { return !qwen3_5_layers.empty(); }
  // Layers with a routed MoE block and their experts (the router statistics' shape; 0: dense).
  int64_t moe_layers() const;
  int64_t moe_experts() const;
  // The CPU tunables of every layer: worker threads and the MLP token tile (Llama family only).
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
