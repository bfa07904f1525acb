// Unit FLOPs and activation sizes; conventions in model_costs.h.
#include "model/model_costs.h"

#include <algorithm>

namespace slidedp {

const char* activation_policy_name(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::kKeep: return "keep";
    case ActivationPolicy::kRecompute: return "recompute";
    case ActivationPolicy::kOffload: return "offload";
  }
  return "?";
}

UnitFlops unit_flops(const ModelCard& c, UnitKind kind, int64_t sequences, int64_t seq_len) {
  const double tokens = static_cast<double>(sequences) * static_cast<double>(seq_len);
  const double C = static_cast<double>(c.hidden_size);
  UnitFlops f;
  switch (kind) {
    case UnitKind::kEmbedding:
      // A gather forward and a scatter-add backward: no multiply-adds worth counting.
      break;
    case UnitKind::kDecoder: {
      const double linear_params = C * c.q_dim() + 2.0 * C * c.kv_dim() + c.q_dim() * C +
                                   3.0 * C * static_cast<double>(c.intermediate_size);
      f.forward_matmul = 2.0 * linear_params * tokens;
      f.mlp_gate_up_matmul = 2.0 * 2.0 * C * static_cast<double>(c.intermediate_size) * tokens;
      const double T = static_cast<double>(seq_len);
      const double pairs = static_cast<double>(sequences) * T * (T + 1.0) / 2.0;
      f.forward_attention = 4.0 * static_cast<double>(c.q_dim()) * pairs;
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

double model_flops_per_step(const ModelCard& c, int64_t sequences, int64_t seq_len) {
  const double B = static_cast<double>(sequences), S = static_cast<double>(seq_len);
  const double L = static_cast<double>(c.num_layers), H = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.num_heads), kv = static_cast<double>(c.num_kv_heads);
  const double I = static_cast<double>(c.intermediate_size), V = static_cast<double>(c.vocab_size);
  const double qratio = static_cast<double>(c.q_dim()) / H;
  return 12.0 * B * S * L * H * H *
         ((1.0 + kv / heads + S / H) * qratio + 1.5 * I / H + V / (2.0 * L * H));
}

LayerActivationBytes decoder_activation_bytes_per_token(const ModelCard& c, int64_t mlp_token_tile) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.q_dim()), kv = static_cast<double>(c.kv_dim());
  constexpr double kBf16 = 2.0, kFp32 = 4.0;
  LayerActivationBytes a;
  a.unit_input = C * kBf16;
  // Saved for backward under `keep`: layer input, normed input, q/k/v after RoPE (and pre-norm q/k
  // for Qwen3), attention output, per-head softmax log-sum-exp (fp32), residual after attention,
  // normed residual, gate and up projections, and the SwiGLU product that feeds down_proj.
  // With an MLP token tile, the normed residual, gate, up and product are per tile, not saved.
  const bool tiled = mlp_token_tile > 0;
  double elems = C + C + q + 2.0 * kv + q + C + (tiled ? 0.0 : C + 3.0 * I);
  if (c.qk_norm) elems += q + kv;
  a.saved_keep = elems * kBf16 + static_cast<double>(c.num_heads) * kFp32;
  // Peak transient of backward: gradients flowing through the widest tensors (gate/up grads in fp32
  // before the down-projection backward; per tile when tiled) plus the recomputed activations.
  a.transient = (tiled ? 0.0 : 2.0 * I * kFp32) + (q + 2.0 * kv) * kFp32;
  return a;
}

LayerActivationBytes torch_decoder_activation_bytes_per_token(const ModelCard& c) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.q_dim()), kv = static_cast<double>(c.kv_dim());
  const double H = static_cast<double>(c.num_heads), KV = static_cast<double>(c.num_kv_heads);
  constexpr double kBf16 = 2.0, kFp32 = 4.0;
  LayerActivationBytes a;
  a.unit_input = C * kBf16;
  double elems = 4.0 * C + 2.0 * q + 2.0 * kv + 3.0 * I;  // x, h1, h, h2; q, att; k, v; gate, up, product
  double rows = 2.0;                                       // 1/rms of the two layer norms
  if (c.qk_norm) elems += q + kv, rows += H + KV;          // q and k before their norms; per-head 1/rms
  a.saved_keep = elems * kBf16 + (H + rows) * kFp32;      // + log-sum-exp per head
  a.transient = (I + 2.0 * C) * kBf16;
  return a;
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
