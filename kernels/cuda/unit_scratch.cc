// Size queries of the GPU units: the carve sequences of unit_scratch.h and gemma4_scratch.h run over a
// measuring Carver.
// Built in every configuration (no CUDA needed); kernels/cuda/units.cc carves with the same templates.
#include "kernels/cuda/unit_scratch.h"

#include "kernels/cuda/gemma4_scratch.h"
#include "kernels/cuda/qwen3_5_scratch.h"

namespace slidedp::kernels::cuda {
namespace {

struct Bf16Size {  // the size of __nv_bfloat16, without CUDA's header
  uint16_t bits;
};
static_assert(sizeof(Bf16Size) == 2);

// The high-water bytes of one carve sequence over a measuring Carver.
template <class Carve>
int64_t measured(Carve carve) {
  Carver a;
  carve(a);
  return a.high_water();
}

}  // namespace

int64_t decoder_saved_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_saved<Bf16Size>(a, spec, B, T); });
}

int64_t decoder_forward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_forward<Bf16Size>(a, spec, B * T); });
}

int64_t decoder_backward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  Carver a;  // the take sequence of decoder_backward
  carve_backward_common<Bf16Size>(a, spec, B * T);
  const int64_t mark = a.mark();
  if (mlp_tiled(spec))
    carve_mlp_tile<Bf16Size>(a, spec, mlp_tile_rows(spec, B * T), true);
  else
    carve_backward_mlp<Bf16Size>(a, spec, B * T);
  a.release(mark);
  carve_backward_attention<Bf16Size>(a, spec, B, T);
  return a.high_water();
}

int64_t head_workspace_bytes(const HeadSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_head<Bf16Size>(a, spec, B * T); });
}

int64_t gemma4_saved_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_gemma4_saved<Bf16Size>(a, spec, B, T); });
}

int64_t gemma4_forward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_gemma4_forward<Bf16Size>(a, spec, B * T); });
}

int64_t gemma4_backward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  Carver a;  // the take sequence of gemma4_backward
  carve_gemma4_backward_common<Bf16Size>(a, spec, B * T);
  const int64_t mark = a.mark();
  carve_gemma4_backward_mlp<Bf16Size>(a, spec, B * T);
  if (spec.has_moe()) carve_gemma4_backward_moe<Bf16Size>(a, spec, B * T);
  a.release(mark);
  carve_gemma4_backward_attention<Bf16Size>(a, spec, B, T);
  return a.high_water();
}

int64_t experts_saved_bytes(const MoeSpec& s, int64_t N) {
  return measured([&](Carver& a) { carve_experts_saved<Bf16Size>(a, s, N); });
}

int64_t experts_forward_workspace_bytes(const MoeSpec& s, int64_t N) {
  return measured([&](Carver& a) { carve_experts_forward<Bf16Size>(a, s, N); });
}

int64_t experts_backward_workspace_bytes(const MoeSpec& s, int64_t N) {
  return measured([&](Carver& a) { carve_experts_backward<Bf16Size>(a, s, N); });
}

int64_t qwen3_5_saved_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T) {
  return measured([&](Carver& a) { carve_qwen3_5_saved<Bf16Size>(a, spec, B, T); });
}

int64_t qwen3_5_forward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T) {
  Carver a;  // the take sequence of the unit's forward
  a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  const int64_t mark = a.mark();
  carve_qwen3_5_forward_mixer<Bf16Size>(a, spec, B * T);
  a.release(mark);
  carve_qwen3_5_forward_ffn<Bf16Size>(a, spec, B * T);
  return a.high_water();
}

int64_t qwen3_5_backward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T) {
  Carver a;  // the take sequence of the unit's backward
  carve_qwen3_5_backward_common<Bf16Size>(a, spec, B * T);
  const int64_t mark = a.mark();
  carve_qwen3_5_backward_ffn<Bf16Size>(a, spec, B * T);
  a.release(mark);
  if (!spec.linear) {
    carve_qwen3_5_backward_attention<Bf16Size>(a, spec, B, T);
    return a.high_water();
  }
  carve_deltanet_backward_keep<Bf16Size>(a, spec.gdn, B * T);
  const int64_t rule = a.mark();
  carve_deltanet_backward_rule<Bf16Size>(a, spec.gdn, B, T);
  a.release(rule);
  carve_deltanet_backward_conv<Bf16Size>(a, spec.gdn, B * T);
  return a.high_water();
}

}  // namespace slidedp::kernels::cuda
