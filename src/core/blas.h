/* blas.h - the BLAS boundary: which OpenBLAS kernels run, and the one GEMM
 * shape prefill needs.
 *
 * Debian's DYNAMIC_ARCH OpenBLAS picks its kernels from cpuid when the
 * shared library loads, before main().  On CPUs it does not recognise it
 * falls back to generic SSE3 kernels (several times slower); the cure is
 * OPENBLAS_CORETYPE in the environment *before* the load, hence a re-exec.
 * The library itself never re-execs: only the mains of the CLI and of the
 * test runner call dsattn_blas_reexec_coretype(), so the choice is made in
 * one place for every program the project runs (scripts set nothing).
 */
#ifndef DSATTN_BLAS_H
#define DSATTN_BLAS_H

#include <stddef.h>

#include "dsattn.h"

/* OpenBLAS's runtime core name ("SkylakeX", "Haswell", "Prescott", ...), or
 * "none" in a build without CBLAS. */
const char *dsattn_blas_corename(void);

/* Call first thing in main().  Both settings below are read by the shared
 * libraries when they load, before main(), hence a re-exec.  Unless
 * $DSATTN_BLAS_REEXEC is set: when $OPENBLAS_CORETYPE is unset and the CPU
 * runs AVX-512 (F/BW/VL/DQ), set OPENBLAS_CORETYPE=SkylakeX; when
 * $OMP_WAIT_POLICY is unset, set OMP_WAIT_POLICY=active; if either was set,
 * set DSATTN_BLAS_REEXEC=1 and execv /proc/self/exe with the same argv.
 * Why active waiting: a decode step opens ~600 short parallel regions, and
 * with libgomp's default (spin briefly, then sleep) one busy process on
 * either core made a V4.1 step 2-6x slower (dsattn bench v41: 707 ms vs
 * 305 ms under a busy loop; 592 ms with "passive").  Returns (doing
 * nothing else) when no re-exec is needed or the exec failed; the marker
 * makes a loop impossible.  Set the variables yourself to choose otherwise. */
void dsattn_blas_reexec_coretype(char **argv);

/* The same with a choice of the two settings (the CLI takes both; the test
 * runner only the core type: its suites gain nothing from active waiting,
 * and spinning threads slow a machine that runs several suites at once). */
#define DSATTN_REEXEC_CORETYPE    1u
#define DSATTN_REEXEC_WAIT_ACTIVE 2u
void dsattn_blas_reexec(char **argv, unsigned what);

/* C[M, N] = A[M, K] . B[N, K]^T, all row-major: A rows are tokens, B is a
 * weight in torch Linear layout [out, in].  lda >= K, ldb >= K, ldc >= N.
 * cblas_sgemm (fp32, OpenBLAS's threads); the scalar fallback (double
 * accumulation, one rounding) runs when the build has no CBLAS or a size
 * exceeds cblas's int.  INVALID_ARG on NULL pointers or short strides. */
dsattn_status dsattn_sgemm_rowmajor(size_t M, size_t N, size_t K, const float *A,
                                    size_t lda, const float *B, size_t ldb, float *C,
                                    size_t ldc);

/* C[M, N] = A[M, K] . op(B) + beta * C, row-major, alpha 1; op(B) is B^T
 * (B stored [N, K], ldb >= K) when b_trans, else B (stored [K, N], ldb >=
 * N).  For the small GEMMs inside attention: OpenBLAS runs on at most
 * n_threads threads.  Its OpenMP build is single-threaded inside an active
 * parallel region but otherwise takes the calling thread's
 * omp_get_max_threads(), which is not the context's thread count, so this
 * sets that (thread-local) ICV around the call and puts it back.  Sizes are
 * the caller's own (trusted); beyond cblas's int range, or in a build
 * without CBLAS, a scalar loop runs instead. */
void dsattn_sgemm_small(int n_threads, int b_trans, size_t M, size_t N, size_t K,
                        const float *A, size_t lda, const float *B, size_t ldb,
                        float beta, float *C, size_t ldc);

/* The scalar fallback itself (also the reference the tests compare with). */
void dsattn_sgemm_rowmajor_ref(size_t M, size_t N, size_t K, const float *A,
                               size_t lda, const float *B, size_t ldb, float *C,
                               size_t ldc);

#endif /* DSATTN_BLAS_H */
