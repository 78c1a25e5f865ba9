/* pgemm.c - the scalar table of pgemm.h.
 *
 * The `ref` tile is the plain loop of the contract: one fmaf chain per
 * output over k in order, the cross-check the SIMD tiles must equal bit
 * for bit (tests/test_pgemm.c).  Not here: the SIMD tables
 * (pgemm_avx2.c, pgemm_avx512.c), the driver (src/ops/linear.c).
 */
#include "pgemm.h"

#include "numfmt.h"

#include <math.h>
#include <string.h>

static void pack_b_ref(const float *x, size_t ldx, size_t nt, size_t K, float *bp)
{
    for (size_t k = 0; k < K; k++)
        for (size_t t = 0; t < DSATTN_PGEMM_NR; t++)
            bp[k * DSATTN_PGEMM_NR + t] = t < nt ? x[t * ldx + k] : 0.0f;
}

static void tile_ref(const float *a, const float *b, size_t kc, int nw, float *c, size_t ldc,
                     int first)
{
    for (size_t r = 0; r < DSATTN_PGEMM_MR; r++)
        for (size_t j = 0; j < (size_t)nw; j++) {
            float acc = first ? 0.0f : c[r * ldc + j];
            for (size_t k = 0; k < kc; k++)
                acc = fmaf(a[k * DSATTN_PGEMM_MR + r], b[k * DSATTN_PGEMM_NR + j], acc);
            c[r * ldc + j] = acc;
        }
}

static void tile_fp8_ref(const uint8_t *w, size_t K, const float *const *sc, size_t bs,
                         size_t nr, int finite, float *a)
{
    (void)finite;                        /* one decode serves both */
    for (size_t k = 0; k < K; k++)
        for (size_t r = 0; r < DSATTN_PGEMM_MR; r++)
            a[k * DSATTN_PGEMM_MR + r] =
                r < nr ? dsattn_e4m3_to_f32(w[r * K + k]) * sc[r][k / bs] : 0.0f;
}

const dsattn_pgemm_kern dsattn_pgemm_ref = {
    .name = "ref", .pack_b = pack_b_ref, .tile = tile_ref, .tile_fp8 = tile_fp8_ref};
