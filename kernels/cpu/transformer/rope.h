// Rotary position embeddings as in transformers' Llama/Qwen/Mistral: the pair (i, i + hd/2) of each
// head is rotated by the angle pos * inv_freq[i] (rotate_half convention, not interleaved pairs).
// inv_freq = 1 / theta^(2i/hd), then rope_scaling: "llama3" exactly as transformers'
// _compute_llama3_parameters (divide long wavelengths by factor, keep short ones, interpolate the
// band between), "linear" divides every frequency by factor. Frequencies and angles are computed in
// double and rounded once to the compute type (transformers computes them in fp32; the difference
// is rounding only). Positions are 0 .. T-1 in every sequence, or each token's position in its
// document when the sequences are packed documents (attention.h's `positions`).
#pragma once

#include <cstdint>
#include <vector>

#include "card/model_card.h"

namespace slidedp::kernels {

// (hd/2) inverse frequencies after the card's rope_scaling.
std::vector<double> rope_inv_freq(const ModelCard& card);
// A layer shape's head_dim / 2 entries as Gemma 4 rotates them, without rope_scaling: the first
// rope_angles entries theta^(-2i/hd) with the whole head_dim in the exponent, the rest 0, so those
// channel pairs are not rotated ("proportional" RoPE, _compute_proportional_rope_parameters; on its
// sliding layers every entry rotates).
std::vector<double> proportional_rope_inv_freq(const LayerShape& s);
// The same from the raw numbers (for tests and tools that have no card).
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

// cos, sin (T, hd/2): cos(t * inv_freq[i]), sin(t * inv_freq[i]).
template <typename Real>
void rope_tables(Real* cos, Real* sin, const std::vector<double>& inv_freq, int64_t T);

// In place on x (B, T, nh, hd): x[i] <- x[i] cos - x[i+h] sin, x[i+h] <- x[i+h] cos + x[i] sin, the
// angles of table row t, or of row positions[b, t] (B, T) when given.
template <typename Real>
void rope_forward(Real* x, const Real* cos, const Real* sin, int64_t B, int64_t T, int64_t nh, int64_t hd,
                  const int32_t* positions = nullptr);

// In place on dx (B, T, nh, hd): the transposed rotation (rotation by -angle).
template <typename Real>
void rope_backward(Real* dx, const Real* cos, const Real* sin, int64_t B, int64_t T, int64_t nh, int64_t hd,
                   const int32_t* positions = nullptr);

}  // namespace slidedp::kernels
