// The one door to BLAS for the CPU transformer math: row-major GEMM on float or double through
// OpenBLAS (cblas_sgemm / cblas_dgemm), never a hand-rolled loop. Also the BLAS thread count.
//
// Thread-safety facts of Debian 12's OpenBLAS (libopenblas0-pthread 0.3.21, the variant pkg-config
// selects) that the executor's N emulated devices rely on:
//  * cblas_?gemm is re-entrant: packing buffers come from a locked allocator (blas_memory_alloc),
//    there is no per-call global state, so N application threads may call it concurrently.
//  * The thread count is ONE process-wide number (openblas_set_num_threads sets blas_cpu_number);
//    0.3.21 has no per-caller setting. Change it only while no GEMM is running.
//  * A GEMM that OpenBLAS decides to run multithreaded (M*N*K above 4 * 65536 and threads > 1) goes
//    through the level-3 thread server, and concurrent multithreaded calls from different
//    application threads are serialized on a process-wide mutex (ChangeLog: "Accesses to
//    parallelized level3 functions from multiple callers are now serialized to avoid thread races
//    (unless using OpenMP)"). Single-threaded calls take no lock.
// Hence: N ranks on C cores -> set_blas_threads(max(1, C / N)); with N >= 2 ranks per core budget,
// use 1 so the ranks' GEMMs run truly in parallel instead of queueing on that mutex.
#pragma once

#include <cstdint>
#include <string>

namespace slidedp::kernels {

// C (M, N) = alpha * op(A) * op(B) + beta * C, all row-major. op(A) is (M, K): A is stored (M, K)
// with row stride lda, or (K, M) when trans_a. op(B) is (K, N): B is (K, N) or (N, K) when trans_b.
// beta == 0 overwrites C (NaN in C does not leak through). K == 0 scales C by beta.
template <typename Real>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, Real alpha, const Real* A, int64_t lda,
          const Real* B, int64_t ldb, Real beta, Real* C, int64_t ldc);

// OpenBLAS runs a GEMM on one thread when M*N*K <= GEMM_MULTITHREAD_THRESHOLD (4, Debian's
// build: openblas_config.h) * 65536 (SMP_THRESHOLD_MIN in interface/gemm.c), or when its thread
// count is 1. Such calls take no lock, so our own worker threads may issue them concurrently.
inline constexpr int64_t kBlasSingleThreadMaxMnk = 4 * 65536;
bool gemm_runs_single_threaded(int64_t M, int64_t N, int64_t K);

// Process-wide BLAS thread count (see the facts above). threads >= 1.
void set_blas_threads(int threads);
int blas_threads();
// "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen MAX_THREADS=64; core Zen; parallel=pthreads", for reports.
std::string blas_description();

}  // namespace slidedp::kernels
