// Packed documents (attention.h's `positions`): a sequence packed from several documents computes
// exactly what each document computes alone. The reference is the same kernels run on each document
// as its own sequence (no positions), so the test checks the masking, the RoPE position restart
// (bitwise, on its own: attention scores only see position differences) and the DeltaNet's state and
// conv-window reset, not the layers' math (their own tests do that).
// Tolerances: fp64 throughout; packed and separate runs sum the same terms in a different grouping
// (a weight gradient adds every token's share in one GEMM instead of one per document), so they agree
// to rounding: 1e-12 absolute on O(1) values. Each test also shows that the packed run WITHOUT the
// positions differs from the documents run alone by far more, so it would catch the reset missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/rope.h"
#include "tests/kernels/transformer/test_util.h"
#include "tests/kernels/transformer/tiny_cards.h"

namespace slidedp::kernels::test {
namespace {

constexpr double kTol = 1e-12;

// The positions (T) of documents of the given lengths, laid end to end.
std::vector<int32_t> document_positions(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> pos;
  for (int64_t n : lengths)
    for (int64_t t = 0; t < n; ++t) pos.push_back(static_cast<int32_t>(t));
  return pos;
}

// Largest |a - b|.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct AttentionRun {
  std::vector<double> out, lse, dq, dk, dv;
};

// Attention forward + backward of one batch (B sequences of T) with the given positions (or none).
AttentionRun run_attention(const AttentionShape& shape, const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v, const std::vector<double>& dout) {
  const AttentionShape& s = shape;
  AttentionRun r;
  r.out.assign(q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.H * s.T), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  AlignedBuffer fws(attention_forward_workspace_bytes<double>(s)), bws(attention_backward_workspace_bytes<double>(s));
  attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), s, fws.workspace());
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(), r.out.data(),
                     r.lse.data(), s, bws.workspace());
  return r;
}

// Rows [t0, t0 + n) of a (T, width) buffer.
std::vector<double> rows(const std::vector<double>& x, int64_t width, int64_t t0, int64_t n) {
  return {x.begin() + t0 * width, x.begin() + (t0 + n) * width};
}

// One packed sequence of documents vs each document alone; window 0 (causal) or a sliding window
// shorter than the documents, so both bounds cut the key range; tile 4 so documents start and end
// inside tiles and span several.
void expect_attention_packs(int64_t window) {
  const std::vector<int64_t> docs = {9, 1, 4, 13};
  const int64_t T = 27, H = 4, KV = 2, hd = 6;
  const std::vector<int32_t> pos = document_positions(docs);
  const auto q = random_vector<double>(T * H * hd, 11, -1.5, 1.5);
  const auto k = random_vector<double>(T * KV * hd, 12, -1.5, 1.5);
  const auto v = random_vector<double>(T * KV * hd, 13);
  const auto dout = random_vector<double>(T * H * hd, 14);
  AttentionShape packed{1, T, H, KV, hd, 4, 2};
  packed.window = window;
  packed.positions = pos.data();
  const AttentionRun p = run_attention(packed, q, k, v, dout);
  int64_t t0 = 0;
  for (int64_t n : docs) {
    AttentionShape alone{1, n, H, KV, hd, 4, 2};
    alone.window = window;
    const AttentionRun a = run_attention(alone, rows(q, H * hd, t0, n), rows(k, KV * hd, t0, n),
                                         rows(v, KV * hd, t0, n), rows(dout, H * hd, t0, n));
    const std::string at = "document at " + std::to_string(t0);
    EXPECT_TRUE(all_close(rows(p.out, H * hd, t0, n), a.out, kTol, kTol, "out, " + at));
    EXPECT_TRUE(all_close(rows(p.dq, H * hd, t0, n), a.dq, kTol, kTol, "dq, " + at));
    EXPECT_TRUE(all_close(rows(p.dk, KV * hd, t0, n), a.dk, kTol, kTol, "dk, " + at));
    EXPECT_TRUE(all_close(rows(p.dv, KV * hd, t0, n), a.dv, kTol, kTol, "dv, " + at));
    for (int64_t h = 0; h < H; ++h)
      EXPECT_TRUE(all_close(p.lse.data() + h * T + t0, a.lse.data() + h * n, n, kTol, kTol, "lse, " + at));
    t0 += n;
  }
  packed.positions = nullptr;  // the same sequence read as one document
  const AttentionRun joined = run_attention(packed, q, k, v, dout);
  EXPECT_GT(max_diff(joined.out, p.out), 1e-3) << "the documents must matter to this test";
}

TEST(PackedDocuments, AttentionOfAPackedSequenceEqualsItsDocumentsAlone) { expect_attention_packs(0); }

TEST(PackedDocuments, SlidingWindowAttentionOfAPackedSequenceEqualsItsDocumentsAlone) { expect_attention_packs(3); }

// RoPE restarts with each document: the rotated rows of a packed sequence are bitwise those of its
// documents alone (the same table rows). Attention scores depend only on position differences, so
// the model tests below cannot see this; this one can.
TEST(PackedDocuments, RopeOfAPackedSequenceEqualsItsDocumentsAloneBitwise) {
  const std::vector<int64_t> docs = {5, 1, 11};
  const int64_t T = 17, nh = 3, hd = 8, half = hd / 2;
  const std::vector<int32_t> pos = document_positions(docs);
  const std::vector<double> inv_freq = rope_inv_freq(hd, 10000.0, RopeScaling{});
  std::vector<double> cos(T * half), sin(T * half);
  rope_tables<double>(cos.data(), sin.data(), inv_freq, T);
  const auto x = random_vector<double>(T * nh * hd, 21);
  for (bool backward : {false, true}) {
    std::vector<double> packed = x;
    if (backward)
      rope_backward<double>(packed.data(), cos.data(), sin.data(), 1, T, nh, hd, pos.data());
    else
      rope_forward<double>(packed.data(), cos.data(), sin.data(), 1, T, nh, hd, pos.data());
    int64_t t0 = 0;
    for (int64_t n : docs) {
      std::vector<double> alone = rows(x, nh * hd, t0, n);
      if (backward)
        rope_backward<double>(alone.data(), cos.data(), sin.data(), 1, n, nh, hd);
      else
        rope_forward<double>(alone.data(), cos.data(), sin.data(), 1, n, nh, hd);
      EXPECT_EQ(rows(packed, nh * hd, t0, n), alone) << "document at " << t0 << (backward ? " backward" : "");
      t0 += n;
    }
  }
}

// Positions come from the sampler, so a bad one is a bug: an internal check stops the process.
TEST(PackedDocuments, BadPositionsStopTheProcess) {
  const std::vector<int32_t> good = {0, 1, 2, 0, 1, 0};
  check_document_positions(good.data(), 2, 3);
  const std::vector<int32_t> skips = {0, 1, 3, 0, 1, 2};
  EXPECT_DEATH(check_document_positions(skips.data(), 2, 3), "document positions");
  const std::vector<int32_t> late_start = {0, 1, 2, 1, 2, 3};  // the second sequence must start at 0
  EXPECT_DEATH(check_document_positions(late_start.data(), 2, 3), "document positions");
}

struct ModelRun {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

// A whole tiny model's loss sum and gradients on one sequence of tokens.
ModelRun run_model(const ModelSpecs& specs, const ModelLayout& layout, const std::vector<std::vector<double>>& params,
                   const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                   const std::vector<int32_t>* positions) {
  ModelRun r;
  std::vector<const double*> p;
  std::vector<double*> g;
  for (const auto& u : layout.units) r.grads.emplace_back(u.flat_numel, 0.0);
  for (size_t u = 0; u < params.size(); ++u) {
    p.push_back(params[u].data());
    g.push_back(r.grads[u].data());
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  r.loss = model_forward_backward<double>(specs, p, g, tokens.data(), targets.data(), 1, T, 1.0, 0.0,
                                          positions != nullptr ? positions->data() : nullptr)
               .loss_sum;
  return r;
}

// Packed: the documents end to end, the target after each document's last token ignored (it belongs
// to the next document). Alone: each document with its own last target ignored. The loss sums and
// the gradients (summed over the documents) agree.
void expect_model_packs(const ModelCard& card) {
  const ModelLayout layout = make_model_layout(card);
  const ModelSpecs specs = make_model_specs(card, layout);
  std::vector<std::vector<double>> params;
  for (const auto& u : layout.units) params.push_back(random_unit_params(u, 900 + static_cast<uint64_t>(u.index)));
  const std::vector<int64_t> docs = {6, 1, 9};
  const std::vector<int32_t> tokens = {3, 7, 7, 22, 0, 1, 14, 3, 5, 9, 9, 2, 18, 6, 11, 4};
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(8);
  const std::vector<int32_t> pos = document_positions(docs);
  for (int64_t t = 0; t + 1 < T; ++t)
    if (pos[static_cast<size_t>(t + 1)] == 0) targets[static_cast<size_t>(t)] = kIgnoreIndex;
  const ModelRun packed = run_model(specs, layout, params, tokens, targets, &pos);

  ModelRun alone;
  for (const auto& u : layout.units) alone.grads.emplace_back(u.flat_numel, 0.0);
  int64_t t0 = 0;
  for (int64_t n : docs) {
    const std::vector<int32_t> doc_tokens(tokens.begin() + t0, tokens.begin() + t0 + n);
    const std::vector<int32_t> doc_targets(targets.begin() + t0, targets.begin() + t0 + n);
    const ModelRun d = run_model(specs, layout, params, doc_tokens, doc_targets, nullptr);
    alone.loss += d.loss;
    for (size_t u = 0; u < d.grads.size(); ++u)
      for (size_t i = 0; i < d.grads[u].size(); ++i) alone.grads[u][i] += d.grads[u][i];
    t0 += n;
  }
  EXPECT_NEAR(packed.loss, alone.loss, kTol * 100) << card.name;  // a sum of 15 O(3) losses
  for (size_t u = 0; u < packed.grads.size(); ++u)
    EXPECT_TRUE(all_close(packed.grads[u], alone.grads[u], 1e-11, 1e-11, card.name + " unit " + std::to_string(u)));

  const ModelRun joined = run_model(specs, layout, params, tokens, targets, nullptr);
  EXPECT_GT(std::abs(joined.loss - alone.loss), 1e-4) << card.name << ": the documents must matter to this test";
}

TEST(PackedDocuments, Qwen3ModelOnPackedDocumentsEqualsItsDocumentsAlone) {
  expect_model_packs(tiny_card("qwen3", true));
}

TEST(PackedDocuments, LlamaModelWithScaledRopeOnPackedDocumentsEqualsItsDocumentsAlone) {
  expect_model_packs(tiny_card("llama", false));
}

TEST(PackedDocuments, Gemma4MoeModelOnPackedDocumentsEqualsItsDocumentsAlone) { expect_model_packs(tiny_gemma4(true)); }

TEST(PackedDocuments, Qwen36MoeModelOnPackedDocumentsEqualsItsDocumentsAlone) {
  // Gated DeltaNet layers: the recurrent state and the conv window restart with every document
  expect_model_packs(tiny_qwen(true));
}

TEST(PackedDocuments, Qwen36DenseModelOnPackedDocumentsEqualsItsDocumentsAlone) { expect_model_packs(tiny_qwen(false)); }

}  // namespace
}  // namespace slidedp::kernels::test
