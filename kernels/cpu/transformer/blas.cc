// OpenBLAS behind the gemm() template; see blas.h for the thread-safety contract.
#include "kernels/cpu/transformer/blas.h"

#include <cblas.h>

#include <climits>

#include "common/error.h"

namespace slidedp::kernels {
namespace {

// cblas takes blasint (32-bit in Debian's LP64 build): each dimension and stride must fit.
blasint as_blasint(int64_t v, const char* what) {
  SLIDEDP_CHECK(v >= 0 && v <= INT_MAX, std::string("BLAS argument out of range: ") + what);
  return static_cast<blasint>(v);
}

template <typename Real>
void scale_c(int64_t M, int64_t N, Real beta, Real* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == Real(0) ? Real(0) : beta * C[i * ldc + j];
}

}  // namespace

template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              as_blasint(M, "M"), as_blasint(N, "N"), as_blasint(K, "K"), alpha, A, as_blasint(lda, "lda"), B,
              as_blasint(ldb, "ldb"), beta, C, as_blasint(ldc, "ldc"));
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                  int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              as_blasint(M, "M"), as_blasint(N, "N"), as_blasint(K, "K"), alpha, A, as_blasint(lda, "lda"), B,
              as_blasint(ldb, "ldb"), beta, C, as_blasint(ldc, "ldc"));
}

bool gemm_runs_single_threaded(int64_t M, int64_t N, int64_t K) {
  return M * N * K <= kBlasSingleThreadMaxMnk || openblas_get_num_threads() == 1;
}

void set_blas_threads(int threads) {
  SLIDEDP_CHECK(threads >= 1, "BLAS thread count must be >= 1");
  openblas_set_num_threads(threads);
}

int blas_threads() { return openblas_get_num_threads(); }

std::string blas_description() {
  const int parallel = openblas_get_parallel();
  const char* mode = parallel == 0 ? "sequential" : parallel == 1 ? "pthreads" : "openmp";
  return std::string(openblas_get_config()) + "; core " + openblas_get_corename() + "; parallel=" + mode;
}

}  // namespace slidedp::kernels
