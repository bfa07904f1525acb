// CUDA-side logic that needs no GPU, so it runs in CI (label kernels): the one error macro names the
// call, the library's error and the place for every library; unit buffer sizes grow linearly in the
// sequence length (the flash attention's point: no T x T buffer anywhere); the attention
// implementation is chosen as documented, with the environment override.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <string>

#include "card/unit_layout.h"
#include "common/error.h"
#include "kernels/cpu/transformer/unit_spec.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/gemma4_scratch.h"
#include "kernels/cuda/moe_scratch.h"
#include "kernels/cuda/qwen3_5_scratch.h"
#include "kernels/cuda/units.h"
#include "model/unit_memory.h"
#include "tests/kernels/transformer/test_util.h"
#include "tests/kernels/transformer/tiny_cards.h"

namespace slidedp::kernels::cuda {
namespace {

template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "(no error thrown)";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// CUDA_DEVICE_MAX_CONNECTIONS (cuda-review D4): unset -> 32; an inherited value is kept only when it
// gives every stream of the GPU's ranks a hardware queue (4 per rank + 4) and CUDA accepts it;
// Megatron's 1, garbage and values above CUDA's 32 are replaced, with the reason.
TEST(CudaEnvironment, MaxConnectionsCoverEveryStreamOrAreReplaced) {
  std::string why;
  EXPECT_EQ(max_connections_setting(nullptr, 4), "32");
  EXPECT_EQ(max_connections_setting("8", 4), "");    // 1 rank: 4 streams + 4
  EXPECT_EQ(max_connections_setting("32", 28), "");  // 7 ranks on one GPU
  EXPECT_EQ(kMaxRanksPerGpu, 7);                     // 8 ranks' 32 streams + 4 pass CUDA's 32
  EXPECT_EQ(max_connections_setting("1", 4, &why), "32");
  expect_contains(why, "1 hardware queues are fewer than the 8");
  EXPECT_EQ(max_connections_setting("8", 8, &why), "32");  // 2 ranks on one GPU need 12
  expect_contains(why, "fewer than the 12");
  EXPECT_EQ(max_connections_setting("64", 4, &why), "32");
  expect_contains(why, "above CUDA's maximum");
  EXPECT_EQ(max_connections_setting("8x", 4, &why), "32");
  expect_contains(why, "not a number");
  EXPECT_EQ(max_connections_setting("", 4, &why), "32");
  // The environment: an inherited 1 becomes 32; a sufficient value stays.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
  prepare_cuda_environment(1);
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "32");
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "16", 1);
  prepare_cuda_environment(2);
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "16");
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

// CUDA_MODULE_LOADING: EAGER, whatever was inherited (lazy loading's first-launch synchronization
// deadlocks against streams waiting on host counters: the first GPU check's two-rank hangs).
TEST(CudaEnvironment, ModuleLoadingIsEager) {
  std::string why;
  EXPECT_EQ(module_loading_setting(nullptr), "EAGER");
  EXPECT_EQ(module_loading_setting("EAGER"), "");
  EXPECT_EQ(module_loading_setting("LAZY", &why), "EAGER");
  expect_contains(why, "first launch");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  prepare_cuda_environment(1);
  EXPECT_STREQ(std::getenv("CUDA_MODULE_LOADING"), "EAGER");
}

TEST(CudaCheck, EveryLibraryErrorNamesTheCallTheMessageAndThePlace) {
  const std::string cuda = error_of([] { SLIDEDP_CUDA_CHECK(cudaErrorInvalidValue); });
  expect_contains(cuda, "CUDA error: cudaErrorInvalidValue failed with cudaErrorInvalidValue");
  expect_contains(cuda, "invalid argument");
  expect_contains(cuda, "host_test.cc:");

  const std::string blas = error_of([] { SLIDEDP_CUDA_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  expect_contains(blas, "cuBLAS error: CUBLAS_STATUS_INVALID_VALUE failed with CUBLAS_STATUS_INVALID_VALUE");
  expect_contains(blas, "host_test.cc:");

  const std::string nccl = error_of([] { SLIDEDP_CUDA_CHECK(ncclInvalidArgument); });
  expect_contains(nccl, "NCCL error: ncclInvalidArgument failed");
  expect_contains(nccl, "invalid argument");

  // Driver and CUPTI strings need the driver / CUPTI loaded; the code and the place are always there.
  const std::string driver = error_of([] { SLIDEDP_CUDA_CHECK(CUDA_ERROR_INVALID_VALUE); });
  expect_contains(driver, "CUDA driver error: CUDA_ERROR_INVALID_VALUE failed with");
  expect_contains(driver, "(1)");
  const std::string cupti = error_of([] { SLIDEDP_CUDA_CHECK(CUPTI_ERROR_INVALID_PARAMETER); });
  expect_contains(cupti, "CUPTI error: CUPTI_ERROR_INVALID_PARAMETER failed");
  expect_contains(cupti, "host_test.cc:");

  EXPECT_NO_THROW(SLIDEDP_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(SLIDEDP_CUDA_CHECK(ncclSuccess));
}

// f(T) = a + b T exactly up to the 256-byte alignment of each piece: second differences vanish
// within (pieces x 256) bytes, for the decoder of every family and the head.
TEST(CudaUnits, BufferSizesGrowLinearlyInTheSequenceLength) {
  for (const std::string type : {"llama", "qwen2", "qwen3"}) {
    const ModelCard card = kernels::test::tiny_card(type, false);
    const ModelLayout layout = make_model_layout(card);
    const DecoderSpec s = make_decoder_spec(card, layout.units[1]);
    HeadSpec h = make_head_spec(card, layout.units.back());
    h.loss_chunk_tokens = 1 << 30;  // chunk = all tokens, so the logits grow with T too
    const int64_t B = 3, T = 4096;
    auto second_difference = [&](auto f) { return std::llabs(f(3 * T) - 2 * f(2 * T) + f(T)); };
    constexpr int64_t kSlack = 64 * 256;  // up to 64 carved pieces, each rounded up to 256 bytes
    EXPECT_LE(second_difference([&](int64_t t) { return decoder_saved_bytes(s, B, t); }), kSlack) << type;
    EXPECT_LE(second_difference([&](int64_t t) { return decoder_forward_workspace_bytes(s, B, t); }), kSlack)
        << type;
    EXPECT_LE(second_difference([&](int64_t t) { return decoder_backward_workspace_bytes(s, B, t); }), kSlack)
        << type;
    EXPECT_LE(second_difference([&](int64_t t) { return head_workspace_bytes(h, B, t); }), kSlack) << type;
    // and the per-token slope is what the buffers say: saved state of 16 pieces at most ~ 2 KiB/token here
    EXPECT_LT(decoder_saved_bytes(s, B, 2 * T) - decoder_saved_bytes(s, B, T), B * T * 1024) << type;
  }
}

// Every decoder layer of a hybrid card on CUDA: its unit's saved, forward and backward bytes grow
// linearly in T, and the memory account charges exactly them. `sizes(spec, B, T)` gives the three;
// `check(spec, l, B, T)` adds the family's own checks.
template <class MakeSpec, class Sizes, class Check>
void expect_layers_charged_their_carve_sizes(const ModelCard& card, MakeSpec make_spec, Sizes sizes,
                                             Check check) {
  const ModelLayout layout = make_model_layout(card);
  const int64_t B = 3, T = 4096;
  constexpr int64_t kSlack = 64 * 256;  // up to 64 carved pieces, each rounded up to 256 bytes
  UnitMemoryOptions o;
  o.code = UnitCode::kCuda;
  const std::vector<UnitMemory> charged = decoder_unit_memories(card, layout, B, T, o);
  ASSERT_EQ(static_cast<int>(charged.size()), card.num_layers);
  for (int l = 0; l < card.num_layers; ++l) {
    const auto s = make_spec(card, layout.units[static_cast<size_t>(l) + 1]);
    const std::array<int64_t, 3> at1 = sizes(s, B, T), at2 = sizes(s, B, 2 * T), at3 = sizes(s, B, 3 * T);
    const UnitMemory& m = charged[static_cast<size_t>(l)];
    const std::array<int64_t, 3> account = {m.saved_bytes, m.forward_workspace_bytes,
                                            m.backward_workspace_bytes};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(std::llabs(at3[i] - 2 * at2[i] + at1[i]), kSlack) << "layer " << l << " buffer " << i;
      EXPECT_EQ(account[i], at1[i]) << "layer " << l << " buffer " << i;
    }
    check(s, l, B, T);
  }
}

// Gemma 4, dense and MoE: a K=V layer saves no v_proj output, an MoE layer adds at least its
// experts' saved rows (gate and up of every routed row).
TEST(CudaUnits, Gemma4LayersAreChargedTheirOwnCarveSizesAndGrowLinearlyInT) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "MoE" : "dense");
    expect_layers_charged_their_carve_sizes(
        kernels::test::tiny_gemma4(moe), make_gemma4_layer_spec,
        [](const Gemma4LayerSpec& s, int64_t B, int64_t T) {
          return std::array<int64_t, 3>{gemma4_saved_bytes(s, B, T), gemma4_forward_workspace_bytes(s, B, T),
                                        gemma4_backward_workspace_bytes(s, B, T)};
        },
        [](const Gemma4LayerSpec& s, int l, int64_t B, int64_t T) {
          if (s.k_eq_v) {
            Gemma4LayerSpec with_v = s;
            with_v.k_eq_v = false;
            EXPECT_EQ(gemma4_saved_bytes(with_v, B, T) - gemma4_saved_bytes(s, B, T), B * T * s.kv_dim() * 2)
                << l;
          }
          if (s.has_moe()) {
            Gemma4LayerSpec dense = s;
            dense.moe = {};
            EXPECT_GE(gemma4_saved_bytes(s, B, T) - gemma4_saved_bytes(dense, B, T),
                      2 * B * T * s.moe.K * s.moe.Ie * 2)
                << l;
            EXPECT_GE(gemma4_backward_workspace_bytes(s, B, T),
                      experts_backward_workspace_bytes(s.moe, B * T))
                << l;
          }
        });
  }
}

// Qwen3.6, every kind (DeltaNet and attention, dense and MoE); the DeltaNet backward's bytes also
// against an independent count.
TEST(CudaUnits, Qwen36LayersAreChargedTheirOwnCarveSizesAndGrowLinearlyInT) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "MoE" : "dense");
    expect_layers_charged_their_carve_sizes(
        kernels::test::tiny_qwen(moe), make_qwen3_5_layer_spec,
        [](const Qwen35LayerSpec& s, int64_t B, int64_t T) {
          return std::array<int64_t, 3>{qwen3_5_saved_bytes(s, B, T),
                                        qwen3_5_forward_workspace_bytes(s, B, T),
                                        qwen3_5_backward_workspace_bytes(s, B, T)};
        },
        [](const Qwen35LayerSpec& s, int l, int64_t B, int64_t T) {
          if (s.linear) {
            // The DeltaNet backward's buffers counted from their description (qwen3_5_scratch.h), not from
            // its carve code: what lives throughout, what the mixer keeps to its end, then the larger of
            // the delta rule's part and the conv's (they share bytes); the feed-forward's part (released
            // before) is smaller here. Each piece is rounded up to 256 bytes at most.
            const DeltaNetSpec& g = s.gdn;
            const int64_t N = B * T, D = g.qkv_dim(), Kd = g.key_dim(), Vd = g.value_dim();
            const int64_t common =
                kGemmWorkspaceBytes + N * s.C * (4 + 4 + 2) + rmsnorm_backward_workspace_bytes(N, s.C);
            const int64_t keep = N * (2 * Kd + Vd + 2 * g.nv) * 4 + N * Vd * 2 + N * Kd * 2 * 4 + N * Vd * 4 +
                                 N * g.nv * (4 + 4 + 2 + 2);
            const int64_t rule = N * Vd * (2 + 4 + 4) + deltanet_gated_norm_workspace_bytes(N, g.nv, g.dv) +
                                 delta_rule_backward_workspace_bytes(B, T, g.nv, g.dk, g.dv);
            const int64_t mixer = keep + std::max(rule, N * D * (4 + 2));
            EXPECT_LE(std::llabs(qwen3_5_backward_workspace_bytes(s, B, T) - (common + mixer)), 32 * 256)
                << l;
          }
        });
  }
}

TEST(CudaAttention, ImplementationChoiceAndEnvironmentOverride) {
  for (const char* unset : {static_cast<const char*>(nullptr), "", "auto"}) {
    EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 64, unset), AttentionImpl::kTensorCore);
    EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 128, unset), AttentionImpl::kTensorCore);
    EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 8, unset), AttentionImpl::kReference);
    EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 96, unset), AttentionImpl::kReference);
    EXPECT_THROW(resolve_attention_impl(AttentionImpl::kTensorCore, 8, unset), InputError);
  }
  EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 64, "reference"), AttentionImpl::kReference);
  EXPECT_EQ(resolve_attention_impl(AttentionImpl::kTensorCore, 64, "reference"), AttentionImpl::kTensorCore)
      << "an explicit request wins";
  EXPECT_EQ(resolve_attention_impl(AttentionImpl::kAuto, 64, "tensor_core"), AttentionImpl::kTensorCore);
  EXPECT_THROW(resolve_attention_impl(AttentionImpl::kAuto, 96, "tensor_core"), InputError) << "a forced path it cannot run";
  try {
    resolve_attention_impl(AttentionImpl::kAuto, 64, "flash");
    ADD_FAILURE() << "an unknown override must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("SLIDEDP_CUDA_ATTENTION"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slidedp::kernels::cuda
