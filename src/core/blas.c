/* blas.c - OpenBLAS core-type insurance, its core name, and the row-major
 * sgemm wrapper prefill uses (see blas.h for the why).
 *
 * Deliberately not here: process-wide OpenBLAS thread settings (a context's
 * thread count reaches OpenBLAS only through the calling thread's OpenMP
 * ICV, see dsattn_sgemm_small) and any re-exec from library code.
 */
#include "blas.h"

#include "internal.h"
#include "cpu.h"
#include "port.h"

#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<cblas.h>)
#include <cblas.h>
#define DSATTN_HAVE_CBLAS 1
#endif
#endif

const char *dsattn_blas_corename(void)
{
#ifdef DSATTN_HAVE_CBLAS
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
#else
    return "none";
#endif
}

void dsattn_blas_reexec(char **argv, unsigned what)
{
    if (!argv || !argv[0] || getenv("DSATTN_BLAS_REEXEC")) return;
    const int core = (what & DSATTN_REEXEC_CORETYPE) && !getenv("OPENBLAS_CORETYPE") &&
                     dsattn_cpu_has_avx512();
    const int wait = (what & DSATTN_REEXEC_WAIT_ACTIVE) && !getenv("OMP_WAIT_POLICY");
    if (!core && !wait) return;
    /* The marker first: whatever happens next, the child cannot loop. */
    if (setenv("DSATTN_BLAS_REEXEC", "1", 1) != 0) return;
    if (core && setenv("OPENBLAS_CORETYPE", "SkylakeX", 1) != 0) return;
    if (wait && setenv("OMP_WAIT_POLICY", "active", 1) != 0) return;
    dsattn_port_reexec_self(argv);
    /* exec failed (no /proc?, no re-exec on this OS): run on with what the libraries picked, and
     * leave the environment as we found it for our children */
    if (core) unsetenv("OPENBLAS_CORETYPE");
    if (wait) unsetenv("OMP_WAIT_POLICY");
}

void dsattn_blas_reexec_coretype(char **argv)
{
    dsattn_blas_reexec(argv, DSATTN_REEXEC_CORETYPE | DSATTN_REEXEC_WAIT_ACTIVE);
}

void dsattn_sgemm_rowmajor_ref(size_t M, size_t N, size_t K, const float *A,
                               size_t lda, const float *B, size_t ldb, float *C,
                               size_t ldc)
{
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            const float *a = A + m * lda, *b = B + n * ldb;
            double acc = 0.0;
            for (size_t k = 0; k < K; k++) acc += (double)a[k] * (double)b[k];
            C[m * ldc + n] = (float)acc;
        }
}

dsattn_status dsattn_sgemm_rowmajor(size_t M, size_t N, size_t K, const float *A,
                                    size_t lda, const float *B, size_t ldb, float *C,
                                    size_t ldc)
{
    if (M == 0 || N == 0) return DSATTN_OK;
    if (!C || ldc < N || ((!A || !B || lda < K || ldb < K) && K > 0))
        return DSATTN_ERR_INVALID_ARG;
    if (K == 0) {
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) C[m * ldc + n] = 0.0f;
        return DSATTN_OK;
    }
#ifdef DSATTN_HAVE_CBLAS
    if (M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX &&
        ldb <= INT_MAX && ldc <= INT_MAX) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K,
                    1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)ldc);
        return DSATTN_OK;
    }
#endif
    dsattn_sgemm_rowmajor_ref(M, N, K, A, lda, B, ldb, C, ldc);
    return DSATTN_OK;
}

static int fits_int(size_t v) { return v <= INT_MAX; }

void dsattn_sgemm_small(int n_threads, int b_trans, size_t M, size_t N, size_t K,
                        const float *A, size_t lda, const float *B, size_t ldb,
                        float beta, float *C, size_t ldc)
{
    if (M == 0 || N == 0) return;
#ifdef DSATTN_HAVE_CBLAS
    if (fits_int(M) && fits_int(N) && fits_int(K) && fits_int(lda) && fits_int(ldb) &&
        fits_int(ldc)) {
        const int outer = omp_in_parallel(), prev = omp_get_max_threads();
        if (!outer) omp_set_num_threads(n_threads > 0 ? n_threads : 1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans,
                    (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C,
                    (int)ldc);
        if (!outer) omp_set_num_threads(prev);
        return;
    }
#else
    (void)n_threads;
#endif
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (size_t k = 0; k < K; k++)
                acc += (double)A[m * lda + k] *
                       (double)(b_trans ? B[n * ldb + k] : B[k * ldb + n]);
            float c = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
            C[m * ldc + n] = (float)(acc + (double)c);
        }
}
