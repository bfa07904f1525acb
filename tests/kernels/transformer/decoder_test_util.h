// A decoder layer of the tiny test models and one forward + backward of it: shared by the unit tests
// (units_test.cc) and the MLP-tile tests (mlp_tile_test.cc).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels::test {

// Layer 1 of the family's tiny card (untied), attention tile `tile`, random parameters from `seed`.
struct Layer {
  ModelCard card;
  ModelLayout layout;
  DecoderSpec spec;
  std::vector<double> params;
  explicit Layer(const std::string& type, int64_t tile = 3, uint64_t seed = 100)
      : card(tiny_card(type, false)), layout(make_model_layout(card)) {
    spec = make_decoder_spec(card, layout.units[1]);
    spec.attn_tile = tile;
    params = random_unit_params(layout.units[1], seed);
  }
};

template <typename Real>
struct DecoderRun {
  std::vector<Real> y, dx, grads;
  AlignedBuffer saved;
};

// Forward, then backward when `dy` is given (gradients from zero). The forward scratch starts filled
// with garbage: a kernel that reads scratch it did not write shows up as a wrong result.
template <typename Real>
DecoderRun<Real> run_decoder(const DecoderSpec& s, const std::vector<Real>& p, const std::vector<Real>& x,
                             const std::vector<Real>& dy, int64_t B, int64_t T) {
  DecoderRun<Real> r;
  r.y.assign(x.size(), Real(0));
  r.dx.assign(x.size(), Real(0));
  r.grads.assign(p.size(), Real(0));
  r.saved = AlignedBuffer(decoder_saved_bytes<Real>(s, B, T));
  AlignedBuffer fws(decoder_forward_workspace_bytes<Real>(s, B, T));
  AlignedBuffer bws(decoder_backward_workspace_bytes<Real>(s, B, T));
  std::memset(fws.data(), 0x7F, static_cast<size_t>(fws.bytes()));
  decoder_forward(s, p.data(), x.data(), r.y.data(), r.saved.workspace(), B, T, fws.workspace());
  if (!dy.empty())
    decoder_backward(s, p.data(), x.data(), r.saved.workspace(), dy.data(), r.dx.data(), r.grads.data(), B, T,
                     bws.workspace());
  return r;
}

// Backward of the layer (dx and every parameter) against central finite differences of the scalar
// loss dot(forward(x), r), for a B x T batch drawn from the two seeds; `what` names the case. The
// check perturbs x and the layer's parameters in place and restores them.
inline void expect_decoder_gradients_match_finite_differences(Layer& l, int64_t B, int64_t T, uint64_t x_seed,
                                                              uint64_t r_seed, const std::string& what) {
  auto x = random_vector<double>(B * T * l.spec.C, x_seed, -2, 2);
  const auto r = random_vector<double>(B * T * l.spec.C, r_seed);
  const auto run = run_decoder<double>(l.spec, l.params, x, r, B, T);
  AlignedBuffer saved(decoder_saved_bytes<double>(l.spec, B, T));
  AlignedBuffer fws(decoder_forward_workspace_bytes<double>(l.spec, B, T));
  std::vector<double> y(x.size());
  auto loss = [&] {
    decoder_forward(l.spec, l.params.data(), x.data(), y.data(), saved.workspace(), B, T, fws.workspace());
    return dot(y, r);
  };
  EXPECT_TRUE(check_finite_differences(x, run.dx, loss, "dx" + what));
  EXPECT_TRUE(check_finite_differences(l.params, run.grads, loss, "dparams" + what));
}

}  // namespace slidedp::kernels::test
