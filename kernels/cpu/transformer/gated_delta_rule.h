// The gated delta rule, the token mixer at the heart of Qwen3.6's Gated DeltaNet layers. Per value
// head h (reading key head j = h / (nv / nk)), a state S of (dk, dv) starts at zero at the start of
// every segment (a document of a packed sequence) and, token by token,
//
//   S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,   a_t = exp(g_t),   o_t = S_t^T q_t
//
// (q, k already L2-normalised and q scaled by dk^-1/2 by the caller; g <= 0 in the model, any value
// here). Computed in chunks of C tokens (64, as the reference's chunked form): with
// gamma = the running sum of g inside a chunk, D_ts = exp(gamma_t - gamma_s) (t >= s) and S0 the
// state entering the chunk,
//
//   Delta = (I + A)^-1 diag(b) (V - diag(exp gamma) K S0),  A_ts = b_t D_ts k_t.k_s (s < t)
//   O     = diag(exp gamma) Q S0 + ((Q K^T) o D) Delta        (o: elementwise, lower incl. diagonal)
//   S_C   = exp(gamma_last) S0 + (diag(exp(gamma_last - gamma)) K)^T Delta
//
// Only differences gamma_t - gamma_s with t >= s are exponentiated, so nothing overflows however fast
// a state decays. The unit-triangular systems are solved by substitution (no inverse is formed).
// The backward runs the chunks in reverse with the exact gradient of these formulas; it recomputes
// the chunk-entry states from the inputs (kept in its workspace, not saved by the forward).
//
// Deterministic: work items are (segment, key head) pairs; the value heads of one key head run in
// order inside an item (they share dq and dk rows), so results are bitwise independent of threads.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"

namespace slidedp::kernels {

struct DeltaRuleSpec {
  int64_t nk = 0, nv = 0;  // key heads, value heads (a multiple of nk)
  int64_t dk = 0, dv = 0;  // key and value head dims
  int64_t chunk = 64;      // tokens per chunk: changes rounding only, never the math
  int64_t threads = 1;     // workers over (segment, key head) items
};

// Rows [seg[i], seg[i+1]) for i < num_segments are one segment; seg[0] = 0 and seg[num_segments] = N.
// Layouts (row-major): q, k (N, nk, dk); v, o (N, nv, dv); g, b (N, nv).
struct DeltaRuleSegments {
  const int64_t* offsets = nullptr;
  int64_t count = 0;
};

// What a workspace is sized for: `count` segments over `rows` rows, none longer than `longest`. The
// workspace of an extent fits every segmentation within it (more segments and longer ones only grow
// it), so one size serves micro-batches whose documents differ.
struct DeltaRuleExtent {
  int64_t rows = 0, count = 0, longest = 0;
};
DeltaRuleExtent extent_of(DeltaRuleSegments seg);
// Every way of cutting B sequences of T rows into documents (up to B*T segments, none over T rows).
DeltaRuleExtent packed_documents_extent(int64_t B, int64_t T);

template <typename Real>
int64_t delta_rule_forward_workspace_bytes(const DeltaRuleSpec& s, DeltaRuleExtent e);
template <typename Real>
int64_t delta_rule_backward_workspace_bytes(const DeltaRuleSpec& s, DeltaRuleExtent e);

// o overwritten.
template <typename Real>
void delta_rule_forward(const DeltaRuleSpec& s, DeltaRuleSegments seg, const Real* q, const Real* k, const Real* v,
                        const Real* g, const Real* b, Real* o, Workspace ws);

// From do_: dq, dk, dv, dg, db overwritten.
template <typename Real>
void delta_rule_backward(const DeltaRuleSpec& s, DeltaRuleSegments seg, const Real* q, const Real* k, const Real* v,
                         const Real* g, const Real* b, const Real* do_, Real* dq, Real* dk, Real* dv, Real* dg,
                         Real* db, Workspace ws);

}  // namespace slidedp::kernels
