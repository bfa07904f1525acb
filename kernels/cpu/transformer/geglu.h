// The gated GELU of Gemma's MLPs and experts: m = gelu_tanh(g) * u, with transformers'
// gelu_pytorch_tanh, gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), applied
// elementwise between gate_proj/up_proj and down_proj. The SwiGLU twin is swiglu.h.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// m (n) = gelu_tanh(g (n)) * u (n). m may alias neither input. `threads` workers split the elements
// (results do not depend on the count).
template <typename Real>
void geglu_forward(Real* m, const Real* g, const Real* u, int64_t n, int64_t threads = 1);

// From dm (n): dg = dm * u * gelu'(g), du = dm * gelu(g). Overwrites dg and du. dg may alias dm
// (each element is read before it is written).
template <typename Real>
void geglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n,
                    int64_t threads = 1);

// gelu_pytorch_tanh of one value and its derivative (the naive references use these too).
template <typename Real>
Real gelu_tanh(Real x);
template <typename Real>
Real gelu_tanh_derivative(Real x);

}  // namespace slidedp::kernels
