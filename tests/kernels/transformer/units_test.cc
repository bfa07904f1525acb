// The units the executor calls: decoder layer (Llama with llama3 RoPE scaling, Qwen2 bias, Qwen3
// q/k norm; GQA; q_dim != hidden), head and embedding, and the whole unstreamed model step.
// Forward against the naive composition, every gradient against finite differences (fp64),
// recompute bitwise, accumulation, padding, working set linear in T, re-entrancy under threads.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <variant>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/bf16_params.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/reference_ops.h"
#include "kernels/cpu/transformer/working_set.h"
#include "tests/kernels/transformer/decoder_test_util.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels {
namespace {

using test::all_close;
using test::check_finite_differences;
using test::dot;
using test::random_unit_params;
using test::random_vector;
using test::tiny_card;

constexpr double kTol64 = 1e-12;  // fp64 vs fp64 naive: summation order only (see ops_test.cc)
// fp32 decoder vs fp64 naive: ~6e-8 rounding per op over chains of ~10 ops with sums of <= 32
// terms; 1e-4 on O(1) outputs is ~100x that and far below any real bug.
constexpr double kTol32 = 1e-4;

using test::DecoderRun;
using test::Layer;
using test::run_decoder;

class DecoderLayerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderLayerTest, SpecOffsetsComeFromTheLayout) {
  const Layer l(GetParam());
  const UnitLayout& u = l.layout.units[1];
  EXPECT_EQ(l.spec.q_w, u.at("self_attn.q_proj.weight").offset);
  EXPECT_EQ(l.spec.down_w, u.at("mlp.down_proj.weight").offset);
  EXPECT_EQ(l.spec.q_b != kAbsent, l.card.attention_bias);
  EXPECT_EQ(l.spec.k_norm != kAbsent, l.card.qk_norm);
  EXPECT_EQ(l.spec.flat_numel, u.flat_numel);
  EXPECT_NE(l.spec.q_dim(), l.spec.C);  // the tiny cards have q_dim 32 != hidden 12, like Qwen3-32B
}

TEST(DecoderSpec, DefaultAttentionTileKeepsTileGemmsSingleThreaded) {
  ModelCard c = tiny_card("llama", false);
  for (const auto& [hd, tile] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {64, 64}, {128, 32}, {256, 32}}) {
    c.head_dim = hd;
    const ModelLayout layout = make_model_layout(c);
    EXPECT_EQ(make_decoder_spec(c, layout.units[1]).attn_tile, tile) << "head_dim " << hd;
  }
}

TEST_P(DecoderLayerTest, ForwardMatchesNaiveComposition) {
  Layer l(GetParam());
  l.spec.threads = 3;  // threaded attention inside the unit
  const int64_t B = 2, T = 7;
  auto x = random_vector<double>(B * T * l.spec.C, 101, -2, 2);
  std::vector<double> y_ref(x.size());
  naive::decoder_forward(l.spec, l.params.data(), x.data(), y_ref.data(), B, T);
  const auto r = run_decoder<double>(l.spec, l.params, x, {}, B, T);
  EXPECT_TRUE(all_close(r.y, y_ref, kTol64, kTol64, "y fp64"));
  std::vector<float> pf(l.params.begin(), l.params.end()), xf(x.begin(), x.end());
  const auto rf = run_decoder<float>(l.spec, pf, xf, {}, B, T);
  EXPECT_TRUE(all_close(rf.y, y_ref, kTol32, kTol32, "y fp32"));
}

TEST_P(DecoderLayerTest, BackwardMatchesFiniteDifferencesForInputAndEveryParameter) {
  Layer l(GetParam());
  expect_decoder_gradients_match_finite_differences(l, 2, 5, 102, 103, "");
}

TEST_P(DecoderLayerTest, GradientsAccumulateAndPaddingStaysUntouched) {
  const Layer l(GetParam());
  const int64_t B = 1, T = 6;
  auto x = random_vector<double>(B * T * l.spec.C, 104, -2, 2);
  auto dy = random_vector<double>(B * T * l.spec.C, 105);
  const auto once = run_decoder<double>(l.spec, l.params, x, dy, B, T);
  // a second micro-batch into the same buffer, which starts at 0.5 everywhere (padding included)
  std::vector<double> grads(l.params.size(), 0.5), dx(x.size());
  AlignedBuffer bws(decoder_backward_workspace_bytes<double>(l.spec, B, T));
  for (int i = 0; i < 2; ++i)
    decoder_backward(l.spec, l.params.data(), x.data(), once.saved.workspace(), dy.data(), dx.data(),
                     grads.data(), B, T, bws.workspace());
  const auto pad = test::padding_mask(l.layout.units[1]);
  std::vector<double> expect(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) expect[i] = 0.5 + 2 * once.grads[i];
  EXPECT_TRUE(all_close(grads, expect, kTol64, kTol64, "0.5 + 2 g"));
  int64_t padding = 0;
  for (size_t i = 0; i < grads.size(); ++i)
    if (pad[i]) {
      ++padding;
      EXPECT_EQ(grads[i], 0.5) << "padding element " << i << " was written";
    }
  EXPECT_GT(padding, 0);
  EXPECT_EQ(dx, once.dx);  // dx is overwritten, not accumulated
}

template <typename Real>
void expect_recompute_bitwise(const Layer& l, int64_t B, int64_t T) {
  std::vector<Real> p(l.params.begin(), l.params.end());
  auto xd = random_vector<double>(B * T * l.spec.C, 106, -2, 2);
  std::vector<Real> x(xd.begin(), xd.end()), y(x.size());
  const int64_t saved_bytes = decoder_saved_bytes<Real>(l.spec, B, T);
  AlignedBuffer saved(saved_bytes), again(saved_bytes);
  AlignedBuffer ws(decoder_forward_workspace_bytes<Real>(l.spec, B, T));
  // Different fills: a tensor that recompute failed to write would keep 0xA5 and differ.
  std::memset(saved.data(), 0x00, static_cast<size_t>(saved_bytes));
  std::memset(again.data(), 0xA5, static_cast<size_t>(saved_bytes));
  decoder_forward(l.spec, p.data(), x.data(), y.data(), saved.workspace(), B, T, ws.workspace());
  std::memset(ws.data(), 0x5A, static_cast<size_t>(ws.bytes()));  // stale scratch must not matter
  decoder_recompute(l.spec, p.data(), x.data(), again.workspace(), B, T, ws.workspace());
  const auto pieces = decoder_saved_layout<Real>(l.spec, B, T);
  EXPECT_EQ(pieces.size(), l.spec.qk_norm ? 16u : 12u);
  for (const ArenaPiece& t : pieces)
    EXPECT_EQ(std::memcmp(saved.data() + t.offset_bytes, again.data() + t.offset_bytes,
                          static_cast<size_t>(t.bytes)),
              0)
        << "saved tensor " << t.name << " differs after recompute";
}

TEST_P(DecoderLayerTest, RecomputeReproducesSavedStateBitwise) {
  const Layer l(GetParam(), 4);
  expect_recompute_bitwise<float>(l, 2, 11);
  expect_recompute_bitwise<double>(l, 2, 11);
  expect_recompute_bitwise<float>(l, 1, 1);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderLayerTest, ::testing::Values("llama", "qwen2", "qwen3", "mistral"));

TEST(DecoderLayer, RecomputeBitwiseAtAMidSizeShapeWithMultithreadedBlas) {
  // Large enough that OpenBLAS runs its threaded level-3 path on the projections.
  ModelCard c = tiny_card("qwen3", false);
  c.hidden_size = 128;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 256;
  c.num_layers = 1;
  const ModelLayout layout = make_model_layout(c);
  DecoderSpec s = make_decoder_spec(c, layout.units[1]);
  s.attn_tile = 32;
  Layer l("qwen3");
  l.card = c;
  l.layout = layout;
  l.spec = s;
  l.params = random_unit_params(layout.units[1], 107);
  expect_recompute_bitwise<float>(l, 2, 100);
}

TEST(DecoderLayer, WorkingSetIsLinearInT) {
  // Qwen2.5-0.5B-like layer. peak(T) is a sum of terms proportional to T plus tile-sized constants;
  // the second difference f(3T) - 2 f(2T) + f(T) cancels both and leaves 2 c T^2 of any c T^2 term
  // (up to 64-byte alignment rounding of each buffer, < 64 bytes x 40 buffers).
  ModelCard c = tiny_card("qwen2", false);
  c.hidden_size = 896;
  c.num_heads = 14;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 4864;
  c.vocab_size = 151936;
  c.num_layers = 1;
  const ModelLayout layout = make_model_layout(c);
  const DecoderSpec s = make_decoder_spec(c, layout.units[1]);
  for (int64_t T : {512, 4096, 32768}) {
    const int64_t p1 = decoder_working_set<float>(s, 1, T).peak_bytes();
    const int64_t p2 = decoder_working_set<float>(s, 1, 2 * T).peak_bytes();
    const int64_t p3 = decoder_working_set<float>(s, 1, 3 * T).peak_bytes();
    EXPECT_LE(std::abs(p3 - 2 * p2 + p1), 64 * 40) << "T=" << T;
  }
  // And the saved state is what the comment in llama_layer.cc lists: per token 3C + 2(H+KV)hd +
  // 2I + H + 2 values (no qk_norm), i.e. 56.6 KiB per token for this shape in fp32.
  const int64_t per_token = (3 * 896 + 2 * (14 + 2) * 64 + 2 * 4864 + 14 + 2) * 4;
  EXPECT_NEAR(static_cast<double>(decoder_saved_bytes<float>(s, 1, 4096)),
              static_cast<double>(per_token * 4096), 64.0 * 20);
}

TEST(DecoderLayerDeathTest, UndersizedBuffersAbortWithTheNeededSize) {
  // A workspace or saved buffer smaller than its query is a caller bug: abort, naming the sizes.
  const Layer l("llama");
  const int64_t B = 1, T = 4;
  std::vector<double> x(B * T * l.spec.C, 0.5), y(x.size());
  AlignedBuffer saved(decoder_saved_bytes<double>(l.spec, B, T));
  AlignedBuffer ws(decoder_forward_workspace_bytes<double>(l.spec, B, T));
  EXPECT_DEATH(decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T,
                               Workspace{ws.data(), ws.bytes() - 1}),
               "workspace too small");
  EXPECT_DEATH(decoder_forward(l.spec, l.params.data(), x.data(), y.data(),
                               Workspace{saved.data(), saved.bytes() - 1}, B, T, ws.workspace()),
               "workspace too small");
  EXPECT_DEATH(
      decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T, Workspace{}),
      "workspace too small");
}

TEST(DecoderLayer, ConcurrentCallsAreReentrant) {
  // The executor runs N ranks as N threads over the same spec and params; each has its own buffers.
  const Layer l("qwen3");
  std::vector<float> p(l.params.begin(), l.params.end());
  const int64_t B = 2, T = 9;
  std::vector<std::vector<float>> xs, dys;
  for (int i = 0; i < 4; ++i) {
    auto x = random_vector<float>(B * T * l.spec.C, 200 + i, -2, 2);
    auto dy = random_vector<float>(B * T * l.spec.C, 300 + i);
    xs.push_back(x);
    dys.push_back(dy);
  }
  std::vector<DecoderRun<float>> serial, parallel(4);
  for (int i = 0; i < 4; ++i) serial.push_back(run_decoder<float>(l.spec, p, xs[i], dys[i], B, T));
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) parallel[i] = run_decoder<float>(l.spec, p, xs[i], dys[i], B, T);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(serial[i].y, parallel[i].y);
    EXPECT_EQ(serial[i].dx, parallel[i].dx);
    EXPECT_EQ(serial[i].grads, parallel[i].grads);
  }
}

// ---- head ----------------------------------------------------------------------------------------

TEST(HeadUnit, GradientsMatchFiniteDifferences) {
  const ModelCard card = tiny_card("llama", false);
  const ModelLayout layout = make_model_layout(card);
  HeadSpec s = make_head_spec(card, layout.units.back());
  s.loss_chunk_tokens = 4;
  const int64_t B = 2, T = 5, N = B * T;
  auto params = random_unit_params(layout.units.back(), 110);
  auto x = random_vector<double>(N * s.C, 111, -2, 2);
  const std::vector<int32_t> targets = {1, 22, kIgnoreIndex, 5, 0, 7, kIgnoreIndex, 9, 9, 3};
  const double scale = 1.0 / 8;
  std::vector<double> dx(N * s.C), grads(params.size(), 0.0);
  AlignedBuffer ws(head_workspace_bytes<double>(s, B, T, true));
  auto lm = [&] { return params.data() + s.lm_head_w; };
  const LossResult r =
      head_forward_backward(s, params.data(), lm(), x.data(), targets.data(), B, T, scale, dx.data(),
                            grads.data(), grads.data() + s.lm_head_w, ws.workspace());
  EXPECT_EQ(r.num_tokens, 8);
  auto loss = [&] {
    return scale * head_forward_backward(s, params.data(), lm(), x.data(), targets.data(), B, T, scale,
                                         static_cast<double*>(nullptr), static_cast<double*>(nullptr),
                                         static_cast<double*>(nullptr), ws.workspace())
                       .loss_sum;
  };
  EXPECT_TRUE(check_finite_differences(x, dx, loss, "head dx"));
  EXPECT_TRUE(check_finite_differences(params, grads, loss, "head dparams (norm + lm_head)"));
}

// ---- whole model ---------------------------------------------------------------------------------

class ModelStepTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ModelStepTest, EveryGradientMatchesFiniteDifferences) {
  const auto [type, tied] = GetParam();
  ModelCard card = tiny_card(type, tied);
  const ModelLayout layout = make_model_layout(card);
  ModelSpecs specs = make_model_specs(card, layout);
  for (LayerSpec& l : specs.layers)
    if (auto* d = std::get_if<DecoderSpec>(&l)) d->attn_tile = 2;
  specs.head.loss_chunk_tokens = 3;
  const int64_t B = 2, T = 4;
  std::vector<std::vector<double>> params, grads;
  for (const auto& u : layout.units) {
    params.push_back(random_unit_params(u, 120 + u.index));
    grads.emplace_back(u.flat_numel, 0.0);
  }
  const std::vector<int32_t> tokens = {3, 7, 7, 22, 0, 1, 14, 3};
  const std::vector<int32_t> targets = {7, 7, 22, kIgnoreIndex, 1, 14, 3, 5};
  const double scale = 1.0 / 7;
  auto step = [&](bool with_grads) {
    std::vector<const double*> p;
    std::vector<double*> g;
    std::vector<std::vector<double>> scratch;
    for (size_t u = 0; u < params.size(); ++u) {
      p.push_back(params[u].data());
      if (with_grads) {
        g.push_back(grads[u].data());
      } else {
        scratch.emplace_back(params[u].size(), 0.0);
        g.push_back(scratch.back().data());
      }
    }
    return model_forward_backward<double>(specs, p, g, tokens.data(), targets.data(), B, T, scale);
  };
  const LossResult r = step(true);
  EXPECT_EQ(r.num_tokens, 7);
  auto loss = [&] { return scale * step(false).loss_sum; };
  for (size_t u = 0; u < params.size(); ++u)
    EXPECT_TRUE(check_finite_differences(params[u], grads[u], loss, "unit " + std::to_string(u)));
  EXPECT_EQ(layout.units.back().find("lm_head.weight") == nullptr, tied);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, ModelStepTest,
                         ::testing::Combine(::testing::Values("llama", "qwen2", "qwen3"), ::testing::Bool()));

TEST(Bf16Params, WidenIsExact) {
  const std::vector<bf16_bits> src = {0x3f80, 0xbf80, 0x0000, 0x8000, 0x7f80, 0x3e4d, 0x0001};
  std::vector<float> f(src.size());
  std::vector<double> d(src.size());
  widen_bf16(src.data(), f.data(), static_cast<int64_t>(src.size()));
  widen_bf16(src.data(), d.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(f[i], bf16_to_float(src[i]));
    EXPECT_EQ(d[i], static_cast<double>(bf16_to_float(src[i])));
  }
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -1.0f);
}

}  // namespace
}  // namespace slidedp::kernels
