// The decoder layer's MLP token tile (DecoderSpec::mlp_token_tile): the tiled MLP must give the
// untiled layer's output, input gradient and every parameter gradient up to summation order, for
// tiles that do not divide the token count; its gradients must match finite differences; recompute
// stays bitwise; and the working set it reports is smaller and exactly what the kernel carves.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/llama_layer.h"
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

// fp64, tiled vs untiled: the same operations on the same values; only the order in which the
// weight gradients (and the post-norm weight gradient) sum over tokens changes (tile by tile instead
// of one GEMM over all rows), and BLAS may block a GEMM of fewer rows differently. Each of those sums
// has <= 14 terms of O(1), so the difference is a few ulps (~1e-15 relative); 1e-10 leaves 10^5 of
// headroom while a skipped or doubled row, or a stale tile buffer, shows up as O(1e-2..1).
constexpr double kTiledTol64 = 1e-10;
// fp32, tiled vs untiled: the same argument with fp32's 6e-8 ulp; 2e-5 as in ops_test.cc.
constexpr double kTiledTol32 = 2e-5;

using test::Layer;
using test::run_decoder;
constexpr uint64_t kParamSeed = 300;

class MlpTileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlpTileTest, TiledEqualsUntiledUpToSummationOrder) {
  Layer l(GetParam(), 3, kParamSeed);
  l.spec.threads = 2;
  const int64_t B = 2, T = 7;  // N = 14 token rows
  const auto x = random_vector<double>(B * T * l.spec.C, 301, -2, 2);
  const auto dy = random_vector<double>(B * T * l.spec.C, 302);
  const auto ref = run_decoder<double>(l.spec, l.params, x, dy, B, T);
  const std::vector<float> pf(l.params.begin(), l.params.end()), xf(x.begin(), x.end()), dyf(dy.begin(), dy.end());
  const auto ref32 = run_decoder<float>(l.spec, pf, xf, dyf, B, T);
  // 4 and 5 do not divide 14 (a short last tile), 1 is a row at a time, 14 one tile, 100 > N.
  for (int64_t tile : {1, 4, 5, 14, 100}) {
    DecoderSpec s = l.spec;
    s.mlp_token_tile = tile;
    const std::string at = " (tile " + std::to_string(tile) + ")";
    const auto got = run_decoder<double>(s, l.params, x, dy, B, T);
    EXPECT_TRUE(all_close(got.y, ref.y, kTiledTol64, kTiledTol64, "y" + at));
    EXPECT_TRUE(all_close(got.dx, ref.dx, kTiledTol64, kTiledTol64, "dx" + at));
    EXPECT_TRUE(all_close(got.grads, ref.grads, kTiledTol64, kTiledTol64, "dparams" + at));
    const auto got32 = run_decoder<float>(s, pf, xf, dyf, B, T);
    EXPECT_TRUE(all_close(got32.y, ref32.y, kTiledTol32, kTiledTol32, "y fp32" + at));
    EXPECT_TRUE(all_close(got32.dx, ref32.dx, kTiledTol32, kTiledTol32, "dx fp32" + at));
    EXPECT_TRUE(all_close(got32.grads, ref32.grads, kTiledTol32, kTiledTol32, "dparams fp32" + at));
  }
}

TEST_P(MlpTileTest, TiledGradientsMatchFiniteDifferences) {
  Layer l(GetParam(), 3, kParamSeed);
  l.spec.mlp_token_tile = 3;  // N = 10: tiles of 3, 3, 3, 1
  expect_decoder_gradients_match_finite_differences(l, 2, 5, 303, 304, " (tiled MLP)");
}

TEST_P(MlpTileTest, RecomputeIsBitwiseAndGradientsAccumulate) {
  Layer l(GetParam(), 3, kParamSeed);
  l.spec.mlp_token_tile = 4;
  const int64_t B = 1, T = 9;
  const auto x = random_vector<double>(B * T * l.spec.C, 305, -2, 2);
  const auto dy = random_vector<double>(B * T * l.spec.C, 306);
  const int64_t bytes = decoder_saved_bytes<double>(l.spec, B, T);
  AlignedBuffer saved(bytes), again(bytes);
  AlignedBuffer fws(decoder_forward_workspace_bytes<double>(l.spec, B, T));
  AlignedBuffer bws(decoder_backward_workspace_bytes<double>(l.spec, B, T));
  std::memset(saved.data(), 0x00, static_cast<size_t>(bytes));
  std::memset(again.data(), 0xA5, static_cast<size_t>(bytes));
  std::vector<double> y(x.size());
  decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T, fws.workspace());
  decoder_recompute(l.spec, l.params.data(), x.data(), again.workspace(), B, T, fws.workspace());
  const auto pieces = decoder_saved_layout<double>(l.spec, B, T);
  EXPECT_EQ(pieces.size(), l.spec.qk_norm ? 12u : 8u);  // no rstd2, h2, g, u
  for (const ArenaPiece& t : pieces)
    EXPECT_EQ(std::memcmp(saved.data() + t.offset_bytes, again.data() + t.offset_bytes, static_cast<size_t>(t.bytes)),
              0)
        << "saved tensor " << t.name << " differs after recompute";
  // Backward from the recomputed state, twice into one buffer: 2x one backward, dx overwritten.
  std::vector<double> g1(l.params.size(), 0.0), g2(l.params.size(), 0.0), dx1(x.size()), dx2(x.size());
  decoder_backward(l.spec, l.params.data(), x.data(), saved.workspace(), dy.data(), dx1.data(), g1.data(), B, T,
                   bws.workspace());
  for (int i = 0; i < 2; ++i)
    decoder_backward(l.spec, l.params.data(), x.data(), again.workspace(), dy.data(), dx2.data(), g2.data(), B, T,
                     bws.workspace());
  for (double& g : g1) g *= 2;
  EXPECT_TRUE(all_close(g2, g1, 1e-14, 1e-14, "accumulated gradients"));  // x + x vs 2x: exact up to 1 ulp
  EXPECT_EQ(dx1, dx2);
}

INSTANTIATE_TEST_SUITE_P(Families, MlpTileTest, ::testing::Values("llama", "qwen2", "qwen3", "mistral"));

// A Qwen3-14B layer (C 5120, I 17408, 40 heads, 8 kv heads, hd 128) at 256K tokens, measured only.
DecoderSpec qwen3_14b_spec() {
  ModelCard c = tiny_card("qwen3", false);
  c.hidden_size = 5120;
  c.num_heads = 40;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 17408;
  c.num_layers = 1;
  c.vocab_size = 151936;
  c.max_position_embeddings = 1 << 20;
  const ModelLayout layout = make_model_layout(c);
  return make_decoder_spec(c, layout.units[1]);
}

TEST(MlpTile, WorkingSetDropsTheFullSequenceMlpTerms) {
  const DecoderSpec untiled = qwen3_14b_spec();
  DecoderSpec tiled = untiled;
  tiled.mlp_token_tile = 4096;
  const int64_t T = 262144, N = T, C = untiled.C, I = untiled.I, R = 4096;
  const UnitWorkingSet a = decoder_working_set<float>(untiled, 1, T);
  const UnitWorkingSet b = decoder_working_set<float>(tiled, 1, T);
  // Saved: no rstd2 (N), h2 (N, C), g and u (N, I), up to 64-byte alignment of the 4 buffers.
  EXPECT_NEAR(static_cast<double>(a.saved_bytes - b.saved_bytes), static_cast<double>(N * (1 + C + 2 * I) * 4),
              4 * 64.0);
  // Forward scratch: untiled the MLP part is m (N, I); tiled one tile of rstd2, h2, g, u and m.
  EXPECT_LT(b.forward_workspace_bytes, a.forward_workspace_bytes);
  EXPECT_LE(b.forward_workspace_bytes, a.forward_workspace_bytes - N * I * 4 + R * (1 + C + 3 * I) * 4 + 8 * 64);
  // Backward scratch: the MLP part (2 N I untiled, R (1 + C + 4 I) tiled) shares bytes with the
  // attention part, which is larger once the MLP is tiled.
  EXPECT_LT(b.backward_workspace_bytes, a.backward_workspace_bytes);
  EXPECT_LT(b.peak_bytes(), a.peak_bytes());
  // The whole-sequence MLP is about half of this layer's fp32 peak at 256K (per token, backward:
  // 3 hidden states 15360 + saved 68698 + dh 5120 + MLP gradients 2I = 34816 values untiled; tiled
  // saved 28761 and the attention gradients 13352 instead: about 124K vs 63K values).
  EXPECT_LT(static_cast<double>(b.peak_bytes()), 0.55 * static_cast<double>(a.peak_bytes()))
      << "untiled " << a.peak_bytes() << " tiled " << b.peak_bytes();
}

TEST(MlpTile, ReportedBytesAreExactlyWhatTheKernelCarves) {
  // Exact from both sides: the kernel runs in buffers of exactly the reported sizes, and aborts with
  // one byte less (the last piece of each carve ends at the reported high-water mark).
  Layer l("qwen3", 3, kParamSeed);
  l.spec.mlp_token_tile = 5;
  const int64_t B = 2, T = 6;
  const auto x = random_vector<double>(B * T * l.spec.C, 307, -2, 2);
  const auto dy = random_vector<double>(B * T * l.spec.C, 308);
  std::vector<double> y(x.size()), dx(x.size()), grads(l.params.size(), 0.0);
  AlignedBuffer saved(decoder_saved_bytes<double>(l.spec, B, T));
  AlignedBuffer fws(decoder_forward_workspace_bytes<double>(l.spec, B, T));
  AlignedBuffer bws(decoder_backward_workspace_bytes<double>(l.spec, B, T));
  decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T, fws.workspace());
  decoder_backward(l.spec, l.params.data(), x.data(), saved.workspace(), dy.data(), dx.data(), grads.data(), B, T,
                   bws.workspace());
  EXPECT_DEATH(decoder_forward(l.spec, l.params.data(), x.data(), y.data(), Workspace{saved.data(), saved.bytes() - 1},
                               B, T, fws.workspace()),
               "workspace too small");
  EXPECT_DEATH(decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T,
                               Workspace{fws.data(), fws.bytes() - 1}),
               "workspace too small");
  EXPECT_DEATH(decoder_backward(l.spec, l.params.data(), x.data(), saved.workspace(), dy.data(), dx.data(),
                                grads.data(), B, T, Workspace{bws.data(), bws.bytes() - 1}),
               "workspace too small");
  // And the working set is built from these same queries.
  const UnitWorkingSet w = decoder_working_set<double>(l.spec, B, T);
  EXPECT_EQ(w.saved_bytes, saved.bytes());
  EXPECT_EQ(w.forward_workspace_bytes, fws.bytes());
  EXPECT_EQ(w.backward_workspace_bytes, bws.bytes());
}

}  // namespace
}  // namespace slidedp::kernels
