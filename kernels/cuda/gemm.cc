// cuBLASLt GEMMs in the row-major convention; see gemm.h.
//
// Row-major to column-major: a row-major (r x c) matrix with stride ld is the column-major (c x r)
// matrix with the same stride, i.e. its transpose. So D = op(A) op(B) (row-major, M x N) is computed
// as the column-major product D^T (N x M) = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is
// our A, with m = N, n = M, k = K and the same transpose flags.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace slidedp::kernels::cuda {
namespace {

// Largest power of two (<= 256) that divides the address: what cuBLASLt's alignment preferences mean.
int64_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  int64_t align = 1;
  while (align < 256 && a % static_cast<uintptr_t>(align * 2) == 0) align *= 2;
  return align;
}

using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t,
                           int64_t, int64_t, int64_t, bool>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLASLt's (column-major) view
  cublasLtMatmulAlgo_t algo{};
};

}  // namespace

struct GemmContext::Impl {
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;
  std::map<PlanKey, Plan> plans;

  const Plan& plan(const GemmArgs& g) {
    const int64_t ldc = g.ldc > 0 ? g.ldc : g.ldd;
    const void* C = g.C != nullptr ? g.C : g.D;
    const PlanKey key{g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, ldc, g.ldd, g.out_f32,
                      alignment_of(g.A), alignment_of(g.B), alignment_of(C), alignment_of(g.D), g.beta != 0.0f};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;

    Plan p;
    const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
    const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
    const uint64_t m = static_cast<uint64_t>(g.N), n = static_cast<uint64_t>(g.M), k = static_cast<uint64_t>(g.K);
    const cudaDataType_t out_type = g.out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    SLIDEDP_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // Stored (pre-op) shapes, column-major: op N stores (rows of the product) x k, op T the transpose.
    SLIDEDP_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, op_a == CUBLAS_OP_N ? m : k,
                                                  op_a == CUBLAS_OP_N ? k : m, g.ldb));
    SLIDEDP_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, op_b == CUBLAS_OP_N ? k : n,
                                                  op_b == CUBLAS_OP_N ? n : k, g.lda));
    SLIDEDP_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, m, n, ldc));
    SLIDEDP_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.d, out_type, m, n, g.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    SLIDEDP_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = static_cast<uint64_t>(kGemmWorkspaceBytes);
    SLIDEDP_CUDA_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t align_a = static_cast<uint32_t>(alignment_of(g.B)), align_b = static_cast<uint32_t>(alignment_of(g.A));
    const uint32_t align_c = static_cast<uint32_t>(alignment_of(C)), align_d = static_cast<uint32_t>(alignment_of(g.D));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                            sizeof(align_a)));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                            sizeof(align_b)));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                            sizeof(align_c)));
    SLIDEDP_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                            sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    SLIDEDP_CUDA_CHECK(st);
    if (found == 0)
      throw RuntimeError(fmt::format("cuBLASLt has no algorithm for the bf16 GEMM M={} N={} K={} trans_a={} trans_b={} "
                                     "lda={} ldb={} ldd={} out={}",
                                     g.M, g.N, g.K, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldd, g.out_f32 ? "fp32" : "bf16"));
    p.algo = result.algo;
    return plans.emplace(key, p).first->second;
  }
};

GemmContext::GemmContext() : impl_(std::make_unique<Impl>()) { SLIDEDP_CUDA_CHECK(cublasLtCreate(&impl_->handle)); }

GemmContext::~GemmContext() {
  for (auto& [key, p] : impl_->plans) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cublasLtDestroy(impl_->handle);
}

void GemmContext::run(const GemmArgs& g, void* workspace, cudaStream_t stream) {
  SLIDEDP_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "negative GEMM size");
  if (g.M == 0 || g.N == 0) return;
  SLIDEDP_CHECK(g.K > 0 || g.beta == 1.0f, "GEMM with K = 0 must accumulate (beta = 1)");
  if (g.K == 0) {
    // D = beta * C with beta = 1: a no-op when C is D.
    SLIDEDP_CHECK(g.C == nullptr || g.C == g.D, "GEMM with K = 0 and C != D");
    return;
  }
  SLIDEDP_CHECK(g.A != nullptr && g.B != nullptr && g.D != nullptr && workspace != nullptr, "GEMM with a null buffer");
  SLIDEDP_CHECK(g.lda >= (g.trans_a ? g.M : g.K) && g.ldb >= (g.trans_b ? g.K : g.N) && g.ldd >= g.N,
                "GEMM leading dimension smaller than the row length");
  const Plan& p = impl_->plan(g);
  const void* C = g.C != nullptr ? g.C : g.D;
  SLIDEDP_CUDA_CHECK(cublasLtMatmul(impl_->handle, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, C, p.c, g.D, p.d,
                                    &p.algo, workspace, static_cast<size_t>(kGemmWorkspaceBytes), stream));
  if (sync_after_launch()) SLIDEDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace slidedp::kernels::cuda
