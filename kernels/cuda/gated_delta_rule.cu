// The gated delta rule's kernels; see gated_delta_rule.h. The per-column math is device_math.h's
// (tested on the CPU against the CPU's chunked form); here are the loops, the barriers and where the
// states live. A state in shared memory or in the scratch has rows of dv + 1 floats: a thread per
// column walks a column conflict-free, and a thread per row (the row phase) walks a row conflict-free.
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gated_delta_rule.h"

namespace slidedp::kernels::cuda {
namespace {

struct Args {
  DeltaRuleShape s;
  const float *q, *k, *v, *g, *b, *dout;
  float* o;
  float *checkpoints, *scratch, *dq_heads, *dk_heads, *dv, *dg, *db;
};

// One (sequence, value head) block's view of the inputs.
struct Head {
  const Args& a;
  int64_t seq, h, kh, ld;
  __device__ int64_t row(int64_t t) const { return seq * a.s.T + t; }
  __device__ bool starts(int64_t t) const {
    return t == 0 || (a.s.positions != nullptr && a.s.positions[row(t)] == 0);
  }
  __device__ const float* key(const float* base, int64_t t) const {
    return base + (row(t) * a.s.nk + kh) * a.s.dk;
  }
  __device__ int64_t gate(int64_t t) const { return row(t) * a.s.nv + h; }
  __device__ int64_t value(int64_t t) const { return (row(t) * a.s.nv + h) * a.s.dv; }
  __device__ int64_t state_floats() const { return a.s.dk * ld; }
};

__device__ void fill(float* x, int64_t n, float v) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) x[e] = v;
}
__device__ void copy(float* dst, const float* src, int64_t n) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
}

// k and q of token t into shared memory; the caller synchronises.
__device__ void load_kq(const Head& hd, int64_t t, float* kv, float* qv) {
  const float* k = hd.key(hd.a.k, t);
  const float* q = hd.key(hd.a.q, t);
  for (int64_t i = threadIdx.x; i < hd.a.s.dk; i += blockDim.x) kv[i] = k[i], qv[i] = q[i];
}

// S (shared) from the raw state before token t_begin to the one before t_end (restarting at
// document starts); o written when given.
__device__ void advance(const Head& hd, float* S, float* kv, float* qv, int64_t t_begin, int64_t t_end,
                        float* o) {
  const Args& a = hd.a;
  for (int64_t t = t_begin; t < t_end; ++t) {
    if (hd.starts(t)) fill(S, hd.state_floats(), 0.0f);
    load_kq(hd, t, kv, qv);
    __syncthreads();
    const int64_t j = threadIdx.x;
    if (j < a.s.dv) {
      const float out = math::delta_column_forward(S + j, hd.ld, a.s.dk, kv, qv, expf(a.g[hd.gate(t)]),
                                                   a.b[hd.gate(t)], a.v[hd.value(t) + j]);
      if (o != nullptr) o[hd.value(t) + j] = out;
    }
    __syncthreads();
  }
}

__global__ void forward_kernel(Args a) {
  extern __shared__ float smem[];
  const Head hd{a, blockIdx.x, blockIdx.y, blockIdx.y / (a.s.nv / a.s.nk), a.s.dv + 1};
  float* S = smem;
  float* kv = S + hd.state_floats();
  float* qv = kv + a.s.dk;
  fill(S, hd.state_floats(), 0.0f);
  advance(hd, S, kv, qv, 0, a.s.T, a.o);
}

// The sum of one float per thread over the block, in a fixed order (warps, then warp results in order).
__device__ float block_sum(float x, float* partials) {
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0;
  for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) total += partials[w];
  __syncthreads();
  return total;
}

__global__ void backward_kernel(Args a) {
  extern __shared__ float smem[];
  const Head hd{a, blockIdx.x, blockIdx.y, blockIdx.y / (a.s.nv / a.s.nk), a.s.dv + 1};
  const int64_t dk = a.s.dk, dv = a.s.dv, T = a.s.T, ld = hd.ld, state = hd.state_floats();
  float* S = smem;
  float* kv = S + state;
  float* qv = kv + dk;
  float* dO = qv + dk;
  auto* cols = reinterpret_cast<math::DeltaColumnGrad<float>*>(dO + dv);
  float* partials = reinterpret_cast<float*>(cols + dv);  // 64 floats: two block sums
  const int64_t chunks = (T + kDeltaChunk - 1) / kDeltaChunk, subs = kDeltaChunk / kDeltaSubChunk;
  const int64_t unpadded = dk * dv;
  auto checkpoint = [&](int64_t c) {
    return a.checkpoints + ((hd.seq * chunks + c) * a.s.nv + hd.h) * unpadded;
  };
  float* sub = a.scratch + (hd.seq * a.s.nv + hd.h) * (subs + 1) * state;
  float* dS = sub + subs * state;
  auto store_unpadded = [&](float* dst) {
    for (int64_t e = threadIdx.x; e < unpadded; e += blockDim.x) dst[e] = S[(e / dv) * ld + e % dv];
  };
  auto load_unpadded = [&](const float* src) {
    for (int64_t e = threadIdx.x; e < unpadded; e += blockDim.x) S[(e / dv) * ld + e % dv] = src[e];
  };

  // the forward again, keeping the state entering every chunk
  fill(S, state, 0.0f);
  for (int64_t c = 0; c < chunks; ++c) {
    __syncthreads();
    store_unpadded(checkpoint(c));
    __syncthreads();  // advance may restart S at a document start
    advance(hd, S, kv, qv, c * kDeltaChunk, std::min(T, (c + 1) * kDeltaChunk), nullptr);
  }
  fill(dS, state, 0.0f);
  const int64_t j = threadIdx.x;
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t t0 = c * kDeltaChunk, t1 = std::min(T, t0 + kDeltaChunk);
    __syncthreads();
    load_unpadded(checkpoint(c));
    for (int64_t i = 0; t0 + i * kDeltaSubChunk < t1; ++i) {
      __syncthreads();
      copy(sub + i * state, S, state);
      advance(hd, S, kv, qv, t0 + i * kDeltaSubChunk, std::min(t1, t0 + (i + 1) * kDeltaSubChunk), nullptr);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const int64_t from = t0 + (t - t0) / kDeltaSubChunk * kDeltaSubChunk;
      __syncthreads();
      copy(S, sub + (from - t0) / kDeltaSubChunk * state, state);
      advance(hd, S, kv, qv, from, t, nullptr);  // S: the raw state before t
      if (hd.starts(t)) fill(S, state, 0.0f);
      load_kq(hd, t, kv, qv);
      const float ga = expf(a.g[hd.gate(t)]), beta = a.b[hd.gate(t)];
      if (j < dv) dO[j] = a.dout[hd.value(t) + j];
      __syncthreads();
      // column phase: what every row needs of every column
      if (j < dv)
        cols[j] =
            math::delta_column_grad(S + j, dS + j, ld, dk, kv, qv, ga, beta, a.v[hd.value(t) + j], dO[j]);
      __syncthreads();
      // row phase: this value head's dq and dk rows
      if (j < dk) {
        float dq_i, dk_i;
        math::delta_row_grads(S + j * ld, dS + j * ld, dv, kv[j], qv[j], ga, beta, dO, cols, &dq_i, &dk_i);
        const int64_t at = (hd.row(t) * a.s.nv + hd.h) * dk + j;
        a.dq_heads[at] = dq_i, a.dk_heads[at] = dk_i;
      }
      __syncthreads();
      // column phase: dS one token back, and this column's parts of da and db
      float da_j = 0, db_j = 0;
      if (j < dv) {
        const math::DeltaColumnGrad<float> cg = cols[j];
        da_j = math::delta_column_step_back(S + j, dS + j, ld, dk, kv, qv, ga, beta, dO[j], cg);
        db_j = (a.v[hd.value(t) + j] - ga * cg.ks) * cg.ddelta;
        a.dv[hd.value(t) + j] = beta * cg.ddelta;
        if (hd.starts(t))  // the state before a document start is zero, not the previous document's
          for (int64_t i = 0; i < dk; ++i) dS[i * ld + j] = 0.0f;
      }
      const float da = block_sum(da_j, partials), db = block_sum(db_j, partials + 32);
      if (threadIdx.x == 0) a.dg[hd.gate(t)] = da * ga, a.db[hd.gate(t)] = db;
    }
  }
}

// dq[row, kh] = sum over the value heads h of key head kh, in order, of dq_heads[row, h].
__global__ void sum_heads_kernel(float* __restrict__ out, const float* __restrict__ heads, int64_t N,
                                 int64_t nk, int64_t group, int64_t dk) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * nk * dk;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % dk, kh = (e / dk) % nk, row = e / (dk * nk);
    float sum = 0;
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) sum += heads[(row * nk * group + h) * dk + i];
    out[e] = sum;
  }
}

int threads_for(const DeltaRuleShape& s) { return static_cast<int>((std::max(s.dk, s.dv) + 31) / 32 * 32); }

void check(const DeltaRuleShape& s) {
  SLIDEDP_CHECK(s.B >= 0 && s.T >= 0 && s.nk > 0 && s.nv > 0 && s.nv % s.nk == 0,
                "delta rule: bad head counts");
  SLIDEDP_CHECK(s.dk > 0 && s.dk <= 256 && s.dv > 0 && s.dv <= 1024,
                "delta rule: needs dk <= 256 and dv <= 1024");
  SLIDEDP_CHECK(s.B <= 65535 * 1024 && s.nv <= 65535, "delta rule: grid too large");
}

// Opts the kernel into `bytes` of dynamic shared memory, or says why the GPU cannot give them.
template <auto Kernel>
void allow_shared(int64_t bytes, const char* what) {
  const int optin = max_shared_optin_bytes(current_device());
  if (bytes > optin)
    throw InputError(what, "the head's state needs " + std::to_string(bytes) +
                               " bytes of shared memory; this GPU gives " + std::to_string(optin));
  allow_dynamic_shared<Kernel>(static_cast<int>(bytes));
}

int64_t forward_shared_bytes(const DeltaRuleShape& s) { return (s.dk * (s.dv + 1) + 2 * s.dk) * 4; }
int64_t backward_shared_bytes(const DeltaRuleShape& s) {
  return forward_shared_bytes(s) + (s.dv + 3 * s.dv + 64) * 4;  // dO, the column records, two block sums
}

}  // namespace

void delta_rule_forward(const DeltaRuleShape& s, const float* q, const float* k, const float* v,
                        const float* g, const float* b, float* o, cudaStream_t stream) {
  check(s);
  if (s.B * s.T == 0) return;
  Args a{};
  a.s = s, a.q = q, a.k = k, a.v = v, a.g = g, a.b = b, a.o = o;
  const int64_t shared = forward_shared_bytes(s);
  allow_shared<forward_kernel>(shared, "delta rule forward");
  forward_kernel<<<dim3(static_cast<unsigned>(s.B), static_cast<unsigned>(s.nv)), threads_for(s), shared,
                   stream>>>(a);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "delta_rule_forward");
}

void delta_rule_backward(const DeltaRuleShape& s, const float* q, const float* k, const float* v,
                         const float* g, const float* b, const float* do_, float* dq, float* dk, float* dv,
                         float* dg, float* db, void* workspace, cudaStream_t stream) {
  check(s);
  const int64_t N = s.B * s.T;
  if (N == 0) return;
  Args a{};
  a.s = s, a.q = q, a.k = k, a.v = v, a.g = g, a.b = b, a.dout = do_;
  const int64_t state = s.dk * s.dv, blocks = s.B * s.nv;
  a.checkpoints = static_cast<float*>(workspace);
  a.scratch = a.checkpoints + blocks * ((s.T + kDeltaChunk - 1) / kDeltaChunk) * state;
  a.dq_heads = a.scratch + blocks * (kDeltaChunk / kDeltaSubChunk + 1) * s.dk * (s.dv + 1);
  a.dk_heads = a.dq_heads + N * s.nv * s.dk;
  a.dv = dv, a.dg = dg, a.db = db;
  const int64_t shared = backward_shared_bytes(s);
  allow_shared<backward_kernel>(shared, "delta rule backward");
  backward_kernel<<<dim3(static_cast<unsigned>(s.B), static_cast<unsigned>(s.nv)), threads_for(s), shared,
                    stream>>>(a);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "delta_rule_backward");
  const int64_t group = s.nv / s.nk;
  sum_heads_kernel<<<grid_for(N * s.nk * s.dk, 256), 256, 0, stream>>>(dq, a.dq_heads, N, s.nk, group, s.dk);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "delta_rule_backward dq");
  sum_heads_kernel<<<grid_for(N * s.nk * s.dk, 256), 256, 0, stream>>>(dk, a.dk_heads, N, s.nk, group, s.dk);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "delta_rule_backward dk");
}

}  // namespace slidedp::kernels::cuda
