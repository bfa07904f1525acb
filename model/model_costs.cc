// Unit FLOPs and activation sizes; conventions in model_costs.h.
#include "model/model_costs.h"

#include <algorithm>
#include <variant>

#include "common/units.h"

namespace slidedp {

const char* activation_policy_name(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::kKeep: return "keep";
    case ActivationPolicy::kRecompute: return "recompute";
    case ActivationPolicy::kOffload: return "offload";
  }
  return "?";
}

double causal_pairs(int64_t T, int64_t window) {
  const double t = static_cast<double>(T);
  if (window <= 0 || window >= T) return t * (t + 1.0) / 2.0;
  const double w = static_cast<double>(window);
  return w * (w + 1.0) / 2.0 + (t - w) * w;
}

namespace {

// Qwen3.6 (model-families.md section 3.4): the token mixer's projections (the DeltaNet's four input
// projections and out_proj, or the gated attention's q+gate, k, v, o) and the FFN (the dense SwiGLU,
// or the router, k experts, the shared expert and its gate).
double linear_params_per_token(const Qwen35Family& /*family*/, const ModelCard& c, const LayerShape& s) {
  const double C = static_cast<double>(c.hidden_size);
  double n = 0;
  if (s.linear()) {
    const double vd = static_cast<double>(s.linear_value_dim());
    n += static_cast<double>(s.linear_conv_dim()) * C + vd * C + 2.0 * static_cast<double>(s.linear_v_heads) * C + C * vd;
  } else {
    const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
    n += 2.0 * q * C + 2.0 * kv * C + q * C;
  }
  if (s.moe())
    n += static_cast<double>(s.num_experts) * C +
         static_cast<double>(s.experts_per_token) * 3.0 * static_cast<double>(s.expert_intermediate_size) * C +
         3.0 * static_cast<double>(s.shared_expert_intermediate_size) * C + C;
  else
    n += 3.0 * C * static_cast<double>(s.intermediate_size);
  return n;
}

// Forward FLOPs of one Gated DeltaNet layer's mixer besides its projections, per token: the causal
// depthwise conv (2 k per channel) and the chunked delta-rule scan (chunk Cc = 64, the released
// kernels' and the reference's), per value head with d_k = d_v = d: K_beta K^T and Q K^T (2 Cc d
// each), the two unit-triangular solves for U and W (Cc (d_k + d_v)), P V' (2 Cc d_v), W S, Q S and
// the state update K^T V' (2 d_k d_v each). Linear in T: no T x T term.
double gated_deltanet_flops_per_token(const LayerShape& s) {
  constexpr double kChunk = 64;
  const double dk = static_cast<double>(s.linear_k_dim), dv = static_cast<double>(s.linear_v_dim);
  const double per_head = 4.0 * kChunk * dk + kChunk * (dk + dv) + 2.0 * kChunk * dv + 6.0 * dk * dv;
  return static_cast<double>(s.linear_v_heads) * per_head +
         2.0 * static_cast<double>(s.conv_kernel) * static_cast<double>(s.linear_conv_dim());
}

// Weights a token multiplies with in one decoder layer (norm vectors and scalars excluded): the
// attention projections, the dense MLP, and on MoE layers the router and experts_per_token experts.
double linear_params_per_token(const LlamaFamily& /*family*/, const ModelCard& c, const LayerShape& s) {
  const double C = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
  double n = C * q + C * kv + (s.k_eq_v ? 0.0 : C * kv) + q * C + 3.0 * C * static_cast<double>(s.intermediate_size);
  if (s.moe())
    n += static_cast<double>(s.num_experts) * C +
         static_cast<double>(s.experts_per_token) * 3.0 * static_cast<double>(s.expert_intermediate_size) * C;
  return n;
}

// Gemma 4's layers count as the Llama-style ones: K=V, the window and the experts are in the shape.
double linear_params_per_token(const Gemma4Family& /*family*/, const ModelCard& c, const LayerShape& s) {
  return linear_params_per_token(LlamaFamily{}, c, s);
}

double decoder_linear_params_per_token(const ModelCard& c, const LayerShape& s) {
  return std::visit([&](const auto& f) { return linear_params_per_token(f, c, s); }, c.family());
}

}  // namespace

UnitFlops unit_flops(const ModelCard& c, UnitKind kind, int layer, int64_t sequences, int64_t seq_len) {
  const double tokens = static_cast<double>(sequences) * static_cast<double>(seq_len);
  const double C = static_cast<double>(c.hidden_size);
  UnitFlops f;
  switch (kind) {
    case UnitKind::kEmbedding:
      // A gather forward and a scatter-add backward: no multiply-adds worth counting.
      break;
    case UnitKind::kDecoder: {
      const LayerShape s = c.layer(layer);
      f.forward_matmul = 2.0 * decoder_linear_params_per_token(c, s) * tokens;
      f.mlp_gate_up_matmul = 2.0 * 2.0 * C * static_cast<double>(s.intermediate_size) * tokens;
      const double pairs = static_cast<double>(sequences) * causal_pairs(seq_len, s.window);
      // a Gated DeltaNet layer's scan takes the attention's place (backward charged alike: 2.5x)
      f.forward_attention =
          s.linear() ? gated_deltanet_flops_per_token(s) * tokens : 4.0 * static_cast<double>(s.q_dim()) * pairs;
      f.backward_matmul = 2.0 * f.forward_matmul;
      f.backward_attention = 2.5 * f.forward_attention;
      break;
    }
    case UnitKind::kHead:
      f.forward_matmul = 2.0 * C * static_cast<double>(c.vocab_size) * tokens;
      f.backward_matmul = 2.0 * f.forward_matmul;
      break;
  }
  return f;
}

// SlideFormer's convention, layer by layer: 3x the forward (backward = 2x), 6 FLOPs per token and
// active weight, attention over min(S, window) keys per query (no causal halving), a Gated DeltaNet's
// scan 3x its forward, the head. For a Llama-style card this is SlideFormer's closed form
// 12 B S L H^2 ((1 + kv/heads + S/H) q_dim/H + 1.5 I/H + V/(2 L H)) (the model's tests check it).
double model_flops_per_step(const ModelCard& c, int64_t sequences, int64_t seq_len) {
  const double B = static_cast<double>(sequences), S = static_cast<double>(seq_len);
  double f = 6.0 * B * S * static_cast<double>(c.hidden_size) * static_cast<double>(c.vocab_size);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerShape s = c.layer(l);
    const double keys = s.window > 0 ? std::min(S, static_cast<double>(s.window)) : S;
    f += 6.0 * B * S * decoder_linear_params_per_token(c, s) +
         (s.linear() ? 3.0 * B * S * gated_deltanet_flops_per_token(s)
                     : 12.0 * B * S * keys * static_cast<double>(s.q_dim()));
  }
  return f;
}

namespace {

// Qwen3.6 layers (no unit built yet: an estimate from the reference's forward, section 3.4). Saved
// under `keep`, in bf16 unless noted: the layer input and its norm; a DeltaNet layer's q|k|v before
// and after the conv + SiLU, z, beta and the decay (fp32, per value head), the L2-normed q and k, the
// scan output and the gated norm's output; a gated-attention layer's q+gate and k before their norms,
// v, q and k after norm and RoPE, the attention output and its gated copy, the log-sum-exp (fp32); the
// residual after the mixer and its norm; the dense MLP's gate, up and product, or the router's
// probabilities, k experts' gate, up and product, the shared expert's and its gate, and the routed
// and shared outputs. Transient: the chunk states of one layer's scan (fp32, d_k x d_v per value head
// every 64 tokens; recomputed in backward, as the released kernels do) and the widest gradients.
// An MLP token tile (dense layers, as in the Llama unit) saves none of the MLP's normed input, gate,
// up and product: they live per tile (decoder_mlp_tile_bytes) and backward recomputes them.
LayerActivationBytes activation_bytes_per_token(const Qwen35Family& /*family*/, const ModelCard& c,
                                                const LayerShape& s, int64_t mlp_token_tile) {
  const double C = static_cast<double>(c.hidden_size);
  constexpr double kChunk = 64;
  LayerActivationBytes a;
  a.unit_input = C * kBf16Bytes;
  double elems = 2.0 * C, fp32 = 0, transient = 0;
  if (s.linear()) {
    const double conv = static_cast<double>(s.linear_conv_dim()), vd = static_cast<double>(s.linear_value_dim());
    const double kd = static_cast<double>(s.linear_key_dim()), nv = static_cast<double>(s.linear_v_heads);
    elems += 2.0 * conv + vd + 2.0 * kd + 2.0 * vd;
    fp32 += 2.0 * nv;
    transient +=
        nv * static_cast<double>(s.linear_k_dim) * static_cast<double>(s.linear_v_dim) * kFp32Bytes / kChunk +
        conv * kFp32Bytes;
  } else {
    const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
    elems += 2.0 * q + kv + kv + q + kv + 2.0 * q;
    fp32 += static_cast<double>(s.num_heads);
    transient += (2.0 * q + 2.0 * kv) * kFp32Bytes;
  }
  const bool tiled = mlp_token_tile > 0 && !s.moe();
  elems += tiled ? C : 2.0 * C;
  if (s.moe()) {
    const double k = static_cast<double>(s.experts_per_token), Ie = static_cast<double>(s.expert_intermediate_size);
    const double Is = static_cast<double>(s.shared_expert_intermediate_size);
    elems += static_cast<double>(s.num_experts) + k * 3.0 * Ie + 3.0 * Is + 1.0 + 2.0 * C;
    transient += (k * 2.0 * Ie + 2.0 * Is) * kFp32Bytes;
  } else if (!tiled) {
    elems += 3.0 * static_cast<double>(s.intermediate_size);
    transient += 2.0 * static_cast<double>(s.intermediate_size) * kFp32Bytes;
  }
  a.saved_keep = elems * kBf16Bytes + fp32 * kFp32Bytes;
  a.transient = transient;
  return a;
}

LayerActivationBytes activation_bytes_per_token(const LlamaFamily& /*family*/, const ModelCard& c,
                                                const LayerShape& s, int64_t mlp_token_tile) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(s.intermediate_size);
  const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
  LayerActivationBytes a;
  a.unit_input = C * kBf16Bytes;
  // Saved for backward under `keep`: layer input, normed input, q/k/v after RoPE (and pre-norm q/k
  // for Qwen3), attention output, per-head softmax log-sum-exp (fp32), residual after attention,
  // normed residual, gate and up projections, and the SwiGLU product that feeds down_proj.
  // With an MLP token tile, the normed residual, gate, up and product are per tile, not saved.
  const bool tiled = mlp_token_tile > 0;
  double elems = C + C + q + 2.0 * kv + q + C + (tiled ? 0.0 : C + 3.0 * I);
  if (c.qk_norm) elems += q + kv;
  a.saved_keep = elems * kBf16Bytes + static_cast<double>(s.num_heads) * kFp32Bytes;
  // Peak transient of backward: gradients flowing through the widest tensors (gate/up grads in fp32
  // before the down-projection backward; per tile when tiled) plus the recomputed activations.
  a.transient = (tiled ? 0.0 : 2.0 * I * kFp32Bytes) + (q + 2.0 * kv) * kFp32Bytes;
  return a;
}

// The Llama-style layer's plus: q and k before their norms, v before its norm (the raw k on K=V
// layers is the pre-norm k), the attention block's output before post_attention_layernorm, the MLP's
// output before its post-norm, and the residual before layer_scalar. A MoE layer adds the router's
// normed input and probabilities, the experts' normed input, per token experts_per_token expert
// intermediates (gate, up, product), the experts' combined output and the sum of the two paths
// before post_feedforward_layernorm; its backward holds the routed experts' gate/up gradients.
LayerActivationBytes activation_bytes_per_token(const Gemma4Family& /*family*/, const ModelCard& c,
                                                const LayerShape& s, int64_t mlp_token_tile) {
  LayerActivationBytes a = activation_bytes_per_token(LlamaFamily{}, c, s, mlp_token_tile);
  const double C = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
  double elems = q + kv + (s.k_eq_v ? 0.0 : kv) + C + C + C;
  if (s.moe()) {
    const double routed =
        static_cast<double>(s.experts_per_token) * static_cast<double>(s.expert_intermediate_size);
    elems += C + static_cast<double>(s.num_experts) + C + 3.0 * routed + C + C;
    a.transient += 2.0 * routed * kFp32Bytes;
  }
  a.saved_keep += elems * kBf16Bytes;
  return a;
}

// What PyTorch's autograd holds for a Llama-style layer (the baselines' layers).
LayerActivationBytes torch_activation_bytes_per_token(const LlamaFamily& /*family*/, const ModelCard& c,
                                                      const LayerShape& s) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(s.intermediate_size);
  const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
  const double H = static_cast<double>(s.num_heads), KV = static_cast<double>(s.num_kv_heads);
  LayerActivationBytes a;
  a.unit_input = C * kBf16Bytes;
  double elems = 4.0 * C + 2.0 * q + 2.0 * kv + 3.0 * I;  // x, h1, h, h2; q, att; k, v; gate, up, product
  double rows = 2.0;                                       // 1/rms of the two layer norms
  if (c.qk_norm) elems += q + kv, rows += H + KV;          // q and k before their norms; per-head 1/rms
  a.saved_keep = elems * kBf16Bytes + (H + rows) * kFp32Bytes;  // + log-sum-exp per head
  a.transient = (I + 2.0 * C) * kBf16Bytes;
  return a;
}

// Gemma 4 adds the q/k norms' inputs and 1/rms rows, the sandwich norms (two more inputs and 1/rms
// rows), v's norm, layer_scalar's input; a MoE layer its router and expert inputs and outputs and the
// routed tokens' expert intermediates.
LayerActivationBytes torch_activation_bytes_per_token(const Gemma4Family& /*family*/, const ModelCard& c,
                                                      const LayerShape& s) {
  LayerActivationBytes a = torch_activation_bytes_per_token(LlamaFamily{}, c, s);
  const double C = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(s.q_dim()), kv = static_cast<double>(s.kv_dim());
  const double H = static_cast<double>(s.num_heads), KV = static_cast<double>(s.num_kv_heads);
  double elems = q + kv + 3.0 * C + kv, rows = H + KV + 2.0 + KV;
  if (s.moe())
    elems += 4.0 * C + static_cast<double>(s.num_experts) +
             static_cast<double>(s.experts_per_token) * 3.0 * static_cast<double>(s.expert_intermediate_size),
        rows += 3.0;
  a.saved_keep += elems * kBf16Bytes + rows * kFp32Bytes;
  return a;
}

// Qwen3.6: the baselines are charged the same per-token estimate (their saved tensors are the
// reference's forward too; no separate PyTorch accounting of the hybrid layers yet).
LayerActivationBytes torch_activation_bytes_per_token(const Qwen35Family& family, const ModelCard& c,
                                                      const LayerShape& s) {
  return activation_bytes_per_token(family, c, s, 0);
}

}  // namespace

LayerActivationBytes decoder_activation_bytes_per_token(const ModelCard& c, int layer,
                                                        int64_t mlp_token_tile) {
  const LayerShape s = c.layer(layer);
  return std::visit([&](const auto& f) { return activation_bytes_per_token(f, c, s, mlp_token_tile); },
                    c.family());
}

LayerActivationBytes torch_decoder_activation_bytes_per_token(const ModelCard& c, int layer) {
  const LayerShape s = c.layer(layer);
  return std::visit([&](const auto& f) { return torch_activation_bytes_per_token(f, c, s); }, c.family());
}

double decoder_mlp_tile_bytes(const ModelCard& c, int64_t mlp_token_tile, double tokens) {
  if (mlp_token_tile <= 0) return 0.0;
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double rows = std::min(static_cast<double>(mlp_token_tile), tokens);
  return rows * ((C + 3.0 * I) * 2.0 + 2.0 * I * 4.0);
}

double head_loss_chunk_bytes(const ModelCard& c, int64_t loss_chunk_tokens) {
  // fp32 logits and their gradient for one chunk of tokens.
  return 2.0 * static_cast<double>(loss_chunk_tokens) * static_cast<double>(c.vocab_size) * 4.0;
}

}  // namespace slidedp
