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
 * over the same operands, and the NEON form (aarch64) the same sub-tiles
 * on 4-lane vectors.
 *
 * Every output element is one fp32 FMA chain over k in increasing order,
 * so every SIMD tile equals the scalar `ref` tile bit for bit (tested),
 * and a result does not depend on the slicing of k or on the threads.
 * A NaN's sign and payload are not part of that (where two NaNs meet, the
 * operand order of an ISA's multiply or FMA picks one).
 */
#ifndef DSATTN_PGEMM_H
#define DSATTN_PGEMM_H

#include <stddef.h>
#include <stdint.h>

#define DSATTN_PGEMM_MR 12       /* weight rows per tile (= DSATTN_MLA_KT) */
#define DSATTN_PGEMM_NR 32       /* tokens per packed group               */
#define DSATTN_PGEMM_DOT_WORK ((size_t)32 * 8192 * 2 + 64)   /* fp8_bf16's work */

typedef struct dsattn_pgemm_kern {
    const char *name;                  /* "ref", "avx2", "avx512", "avx512-bf16", "neon" */
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

    /* The bf16-dot GEMM (NULL in every table but avx512-bf16, which the
     * CPUs with AVX512-BF16 get: AMD Zen 4/5, Intel Cooper Lake and later).
     * VDPBF16PS multiplies pairs of bf16 numbers into fp32 sums at twice the
     * fp32 FMA's rate.  FP8 weights with power-of-two block scales decode to
     * bf16 numbers exactly, and so do activations that are bf16 numbers
     * (the reference's act_quant: E4M3 times a power of two): every product
     * is then exact, and only the fp32 summation order differs from the FMA
     * paths (as between any two fast paths) - and the instruction treats
     * subnormal results as zero: a product or partial sum below 2^-126 in
     * magnitude is flushed, at most 2K times per output, so an output may
     * be off by up to 2K * 2^-126 more (negligible beside any sum of
     * normal products).  The caller's guard (src/ops/linear.c) keeps every
     * decoded weight a normal bf16 number and every product within 2^100.
     *
     * pack_bf16: n token rows (row t at x + t*ldx, K floats, K % 32 == 0)
     * into xb[t*ldxb + k] as bf16 (callers pad ldxb past K: rows 2^n bytes
     * apart would share L1 sets).  Returns 0 when an element is not a finite
     * bf16 number, or is a subnormal; else *efmin / *efmax are the smallest
     * and largest exponent fields (1..254) of the nonzero elements (255 / 0
     * when all are zero). */
    int (*pack_bf16)(const float *x, size_t ldx, size_t n, size_t K, uint16_t *xb, size_t ldxb,
                     int *efmin, int *efmax);
    /* y[t*ldy + r] = sum_{k<K} w(r, k) * xb[t*ldxb + k] for r < nr, t < n:
     * FP8 row r at w + r*K (no NaN code), its value e4m3 * 2^e where
     * eo[k / bs] = e << 7 (int16; bs % 32 == 0) - the rows of one scale
     * row, their exponents within the guard's range.  work: the calling
     * thread's DSATTN_PGEMM_DOT_WORK bytes (any alignment). */
    void (*fp8_bf16)(const uint8_t *w, size_t K, size_t nr, const int16_t *eo, size_t bs,
                     const uint16_t *xb, size_t ldxb, size_t n, float *y, size_t ldy,
                     void *work);
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
extern const dsattn_pgemm_kern *const dsattn_pgemm_avx512_bf16_ptr;   /* + the bf16-dot GEMM */
extern const dsattn_pgemm_kern *const dsattn_pgemm_neon_ptr;          /* aarch64 builds */

#endif /* DSATTN_PGEMM_H */
