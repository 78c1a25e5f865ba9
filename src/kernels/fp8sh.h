/* fp8sh.h - the scalar half of the exponent-shift FP8 GEMVs' x arrangement
 * (kernels_avx2.c and kernels_avx512.c, the *-expshift tables).
 *
 * Those GEMVs decode an E4M3 code as its value times 2^-120 and put the
 * 2^120 into x: each element of x is multiplied by its block scale and by
 * 2^K.  The vector side arranges x once per pass into the decode's order,
 * unscaled, with the largest |x| of every 32-element group (a group lies in
 * one scale block, as bs % 32 == 0); this planner then gives, per scale row,
 * each group's scale and K, from which the vector side forms
 * (x * scale) * 2^K - the same two roundings, so the same bits, as scaling
 * first and arranging after.  K = 120 makes the products the fp16 decode's
 * own; where the largest |x * scale| is 2^7 or more, K = 126 minus its
 * exponent keeps every arranged element finite, and the row sums are
 * multiplied back by 2^(120 - K). */
#ifndef DSATTN_FP8SH_H
#define DSATTN_FP8SH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* *pk = 2^K and *unscale = 2^(120 - K) for the largest product big (finite,
 * >= 0): K = 120, or 126 minus big's exponent where big >= 2^7.  Returns 1. */
static inline int dsattn_fp8sh_pow2(float big, float *pk, float *unscale)
{
    int K = 120;
    if (big >= 0x1p7f) {                            /* normal: its exponent */
        uint32_t u;
        memcpy(&u, &big, 4);
        K = 126 - ((int)(u >> 23) - 127);
    }
    const uint32_t pu = (uint32_t)(K + 127) << 23, uu = (uint32_t)(120 - K + 127) << 23;
    memcpy(pk, &pu, 4);
    memcpy(unscale, &uu, 4);
    return 1;
}

/* Groups g < ng of x from element k0 (k0 % 32 == 0) against scale row sc
 * (blocks of bs elements, bs % 32 == 0), bm[g] = max |x| of group g (finite):
 * sg[g] = the group's scale, *pk = 2^K, *unscale = 2^(120 - K).  Returns 0
 * if some |x| * |scale| is inf or NaN (an inf or NaN scale, or a product
 * that overflows): the caller then takes the fp16 decode.  max |x * s| is
 * bm * |s| exactly, rounding being monotone. */
static inline int dsattn_fp8sh_plan(const float *bm, size_t ng, const float *sc, size_t bs,
                                    size_t k0, float *sg, float *pk, float *unscale)
{
    size_t blk = k0 / bs, left = bs - k0 % bs;      /* elements left in blk */
    float big = 0.0f;
    for (size_t g = 0; g < ng; g++) {
        const float s = sc[blk];
        if ((left -= 32) == 0) { blk++; left = bs; }
        const float p = bm[g] * (s < 0.0f ? -s : s);
        if (!(p < __builtin_inff())) return 0;      /* inf, or NaN (0 * inf too) */
        if (p > big) big = p;
        sg[g] = s;
    }
    return dsattn_fp8sh_pow2(big, pk, unscale);
}

#endif /* DSATTN_FP8SH_H */
