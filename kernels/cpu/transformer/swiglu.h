// The gated SiLU of Llama/Qwen/Mistral MLPs: m = silu(g) * u, silu(x) = x * sigmoid(x), applied
// elementwise between gate_proj/up_proj and down_proj.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// m (n) = silu(g (n)) * u (n). m may alias neither input. `threads` workers split the elements
// (results do not depend on the count).
template <typename Real>
void swiglu_forward(Real* m, const Real* g, const Real* u, int64_t n, int64_t threads = 1);

// From dm (n): dg = dm * u * silu'(g), du = dm * silu(g), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
// Overwrites dg and du. dg may alias dm (each element is read before it is written).
template <typename Real>
void swiglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n,
                     int64_t threads = 1);

}  // namespace slidedp::kernels
