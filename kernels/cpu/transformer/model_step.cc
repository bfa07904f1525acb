// Unstreamed whole-model step: embedding -> L decoder layers -> head, then backward in reverse.
#include "kernels/cpu/transformer/model_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <variant>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/embedding_unit.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/layer_dispatch.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/router_aux_loss.h"

namespace slidedp::kernels {

namespace {

// The card's family picks the layer spec's alternative (layer_spec.h): each family's make_layer_spec.
LayerSpec layer_spec_for(const ModelCard& card, const UnitLayout& unit) {
  return std::visit([&](const auto& family) -> LayerSpec { return make_layer_spec(family, card, unit); },
                    card.family());
}

}  // namespace

ModelSpecs make_model_specs(const ModelCard& card, const ModelLayout& layout) {
  SLIDEDP_CHECK(layout.num_units() == card.num_layers + 2, "layout does not match the card");
  ModelSpecs s;
  s.num_layers = card.num_layers;
  s.embedding = make_embedding_spec(card, layout.units.front());
  for (int64_t l = 0; l < card.num_layers; ++l)
    s.layers.push_back(layer_spec_for(card, layout.units[static_cast<size_t>(l) + 1]));
  s.head = make_head_spec(card, layout.units.back());
  return s;
}

int64_t ModelSpecs::moe_layers() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers)
    n += std::visit([](const auto& spec) { return layer_moe_experts(spec); }, l) > 0;
  return n;
}

int64_t ModelSpecs::moe_experts() const {
  for (const LayerSpec& l : layers)
    if (const int64_t E = std::visit([](const auto& spec) { return layer_moe_experts(spec); }, l); E > 0)
      return E;
  return 0;
}

void ModelSpecs::set_threads(int64_t t) {
  threads = t;
  for (LayerSpec& l : layers) std::visit([t](auto& spec) { layer_set_threads(spec, t); }, l);
}

void ModelSpecs::set_mlp_token_tile(int64_t rows) {
  for (LayerSpec& l : layers)
    if (!std::visit([rows](auto& spec) { return layer_set_mlp_token_tile(spec, rows); }, l))
      throw InputError("mlp_token_tile",
                       "MLP token tiles are built for the Llama family's layers only; use 0");
  mlp_token_tile = rows;
}

template <typename Real>
LossResult model_forward_backward(const ModelSpecs& s, std::span<const Real* const> params,
                                  std::span<Real* const> grads, const int32_t* tokens, const int32_t* targets,
                                  int64_t B, int64_t T, double grad_scale, double router_aux_coef,
                                  const int32_t* positions) {
  const int64_t L = s.num_layers, N = B * T, C = s.embedding.C;
  SLIDEDP_CHECK(static_cast<int64_t>(params.size()) == L + 2 && static_cast<int64_t>(grads.size()) == L + 2,
                "need one params and one grads buffer per unit");
  const int64_t hidden_bytes = N * C * static_cast<int64_t>(sizeof(Real));

  // hidden[u] = input of unit u+1 (the output of unit u), kept for backward under `keep`.
  std::vector<AlignedBuffer> hidden;
  for (int64_t u = 0; u <= L; ++u) hidden.emplace_back(hidden_bytes);
  std::vector<AlignedBuffer> saved;
  int64_t ws_bytes = head_workspace_bytes<Real>(s.head, B, T, true);
  for (int l = 0; l < L; ++l) {
    saved.emplace_back(layer_saved_bytes<Real>(s, l, B, T));
    ws_bytes = std::max({ws_bytes, layer_forward_workspace_bytes<Real>(s, l, B, T),
                         layer_backward_workspace_bytes<Real>(s, l, B, T)});
  }
  AlignedBuffer ws(ws_bytes);
  AlignedBuffer grad_a(hidden_bytes), grad_b(hidden_bytes);
  const int64_t E = s.moe_experts();
  AlignedBuffer router_buffer(E > 0 ? router_stats_bytes(B, E) : 0);
  std::fill_n(router_buffer.data(), router_buffer.bytes(), std::byte{0});
  RouterStats router_stats;
  const RouterStats* router = nullptr;
  if (E > 0) {
    router_stats = router_stats_view(router_buffer.data(), B, E, s.moe_layers() * T,
                                     router_aux_coef / static_cast<double>(B));
    router = &router_stats;
  }

  // forward
  embedding_unit_forward(s.embedding, params[0], tokens, B, T, hidden[0].as<Real>());
  for (int l = 0; l < L; ++l)
    layer_forward(s, l, params[l + 1], hidden[l].as<Real>(), hidden[l + 1].as<Real>(), saved[l].workspace(), B, T,
                  ws.workspace(), router, positions);

  // head: tied -> lm_head is unit 0's embed_tokens weight and its gradient goes to unit 0's grads
  const Real* lm_w = s.head.tied ? params[0] + s.embedding.weight : params[L + 1] + s.head.lm_head_w;
  Real* lm_g = s.head.tied ? grads[0] + s.embedding.weight : grads[L + 1] + s.head.lm_head_w;
  Real* dy = grad_a.as<Real>();
  Real* dx = grad_b.as<Real>();
  LossResult loss = head_forward_backward(s.head, params[L + 1], lm_w, hidden[L].as<Real>(), targets, B,
                                                T, grad_scale, dy, grads[L + 1], lm_g, ws.workspace());

  // backward
  for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
    layer_backward(s, l, params[l + 1], hidden[l].as<Real>(), saved[l].workspace(), dy, dx, grads[l + 1], B, T,
                   ws.workspace(), router, positions);
    std::swap(dy, dx);
  }
  embedding_unit_backward(s.embedding, tokens, dy, grads[0], B, T);
  if (router != nullptr) loss.router_aux_sum = router_aux_loss_sum(*router, B, E);
  return loss;
}

template LossResult model_forward_backward<float>(const ModelSpecs&, std::span<const float* const>,
                                                  std::span<float* const>, const int32_t*, const int32_t*,
                                                  int64_t, int64_t, double, double, const int32_t*);
template LossResult model_forward_backward<double>(const ModelSpecs&, std::span<const double* const>,
                                                   std::span<double* const>, const int32_t*, const int32_t*,
                                                   int64_t, int64_t, double, double, const int32_t*);

}  // namespace slidedp::kernels
