/* pgemm.h - the register-tiled GEMM of the prefill projections.
 *
 * A prefill Linear (src/ops/linear.c) multiplies a weight of R rows by a
 * chunk of n tokens (a prefill chunk, or the rows of a batched decode).  The fast path decodes 12 weight rows at a time into
 * a tile of mla_kernels.h's key layout (k-major, 12 rows interleaved:
 * a[k*12 + r], built by its tile_rows), packs the activations once per
 * call into groups of 32 tokens (k-major: b[k*32 + j]), and runs one
 * 12 x 32 tile per (row tile, token group, k slice).  The AVX-512 form
 * holds it in registers (the MLA score tile, 24 FMAs per 14 loads); the
 * AVX2 form, with 16 registers, runs it as 6 x 16 and 12 x 8 sub-tiles
 * over the same operands.
 *
 * Every output element is one fp32 FMA chain over k in increasing order,
 * so every SIMD tile equals the scalar `ref` tile bit for bit (tested),
 * and a result does not depend on the slicing of k or on the threads.
 */
#ifndef DSATTN_PGEMM_H
#define DSATTN_PGEMM_H

#include <stddef.h>
#include <stdint.h>

#define DSATTN_PGEMM_MR 12       /* weight rows per tile (= DSATTN_MLA_KT) */
#define DSATTN_PGEMM_NR 32       /* tokens per packed group               */

typedef struct dsattn_pgemm_kern {
    const char *name;                             /* "ref", "avx2", "avx512" */
    /* Pack nt <= 32 token rows (row t at x + t*ldx, K floats) into one
     * group bp [K][32]: bp[k*32 + t] = x[t*ldx + k], tokens nt..31 zero. */
    void (*pack_b)(const float *x, size_t ldx, size_t nt, size_t K, float *bp);
    /* c[r*ldc + j] = (first ? 0 : c[r*ldc + j]) + sum_{k<kc} a[k*12 + r] * b[k*32 + j]
     * for r < 12, j < nw (nw = 8, 16, 24 or 32), as fmaf(a, b, acc) in k
     * order.  A form may also write columns nw..31 the same way (the
     * AVX-512 tile works in 16-token vectors): c's rows hold 32 floats. */
    void (*tile)(const float *a, const float *b, size_t kc, int nw, float *c, size_t ldc,
                 int first);
    /* nr <= 12 FP8 rows of K codes (row r at w + r*K, its block scales at
     * sc[r]) decoded into one weight tile: a[k*12 + r] = e4m3(w[r*K + k]) *
     * sc[r][k / bs] (the values of wdequant.h's rows), rows nr..11 zero.
     * bs % 16 == 0 and K % 16 == 0.  finite: the caller knows the codes
     * hold no NaN (dsattn_weight.finite), so the decode may skip that case. */
    void (*tile_fp8)(const uint8_t *w, size_t K, const float *const *sc, size_t bs, size_t nr,
                     int finite, float *a);
} dsattn_pgemm_kern;

/* The fast tile_fp8 forms' choice of decode: 1 when the codes are finite
 * and every block scale s of the nr rows has 256 s finite (or s itself
 * infinite), so the decode may give e / 256 and fold the x256 into the
 * scale, (e / 256) * (256 s) being e * s rounded once; 0: the exact decode
 * times s. */
static inline int dsattn_pgemm_cheap(const float *const *sc, size_t nr, size_t K, size_t bs,
                                     int finite)
{
    int cheap = finite;
    for (size_t r = 0; r < nr && cheap; r++) {
        if (r > 0 && sc[r] == sc[r - 1]) continue;      /* rows of one scale block */
        for (size_t b = 0; b < (K + bs - 1) / bs && cheap; b++)
            cheap = !__builtin_isinf(256.0f * sc[r][b]) || __builtin_isinf(sc[r][b]);
    }
    return cheap;
}

extern const dsattn_pgemm_kern dsattn_pgemm_ref;
/* NULL when the build has no such path (absent.c, or the compiler's) */
extern const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr;
extern const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr;

#endif /* DSATTN_PGEMM_H */
