/* simd_neon.h - small Advanced SIMD (ARMv8.0) helpers that the NEON kernel
 * files inline into their loops: the exp of the softmaxes with the x86
 * tables' bits, bf16 values widened to fp32, rounded and packed back, the
 * exact decode of E4M3 codes, first-n lane masks, horizontal max / sum,
 * 4 x 4 transposes, the 6 x 16 register tile of the attention tiles; and
 * the 4-lane vector words (DSV_F, dsv_fmadd, ...) that the templates
 * written once for every width use (simd_tmpl.h, mha_tmpl.h,
 * mla_tile_tmpl.h, sa_tmpl.h, pgemm_tmpl.h).  dsv_max is x86 maxps, not FMAX, so the
 * templates give the x86 bits where a NaN or two zeros meet a max.
 * Include only from *_neon.c files (aarch64 builds; CMakeLists.txt leaves
 * them out elsewhere).
 *
 * dsattn_exp128n is dsattn_exp256 of simd_avx2.h (and so dsattn_exp512)
 * on 4 lanes, bit for bit: the same range reduction and Cephes
 * polynomial (simd_tmpl.h), FRINTN for the round to nearest even, FMLA /
 * FMLS for the fused steps, 2^n as two exact power-of-two factors.  The
 * one difference of the instruction sets, FMAX / FMIN returning NaN where
 * maxps returns its second operand, is absorbed by the explicit NaN
 * blend (dsattn_exp128n_cut) or by NaN flowing through (ftz_neg), as on
 * x86.  Linux runs aarch64 with FPCR.FZ = 0 (subnormals kept), as x86
 * runs without FTZ / DAZ; tests/test_vmath.c holds the bits to the x86
 * tables' through a hash of a fixed grid. */
#ifndef DSATTN_SIMD_NEON_H
#define DSATTN_SIMD_NEON_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DSATTN_NEON_AI static inline __attribute__((always_inline))

/* The vector words of simd_tmpl.h (and of the *_tmpl.h kernel templates)
 * on 4 lanes; simd_avx2.h defines the same words on 8, simd_avx512.h on 16. */
#define DSV_F float32x4_t
#define DSV_I int32x4_t
#define DSV_N 4
#define DSV(name) name##128n
#define DSV_AI DSATTN_NEON_AI
#define dsv_load(p) vld1q_f32(p)
#define dsv_store(p, v) vst1q_f32((p), (v))
#define dsv_set1(f) vdupq_n_f32(f)
#define dsv_zero() vdupq_n_f32(0.0f)
#define dsv_add(a, b) vaddq_f32((a), (b))
#define dsv_sub(a, b) vsubq_f32((a), (b))
#define dsv_mul(a, b) vmulq_f32((a), (b))
/* x86 maxps: a > b ? a : b, so b when either is NaN and for two zeros
 * (FMAX would return NaN / +0); the templates' bits depend on it */
#define dsv_max(a, b) dsattn_max_x86_128n((a), (b))
#define dsv_fmadd(a, b, c) vfmaq_f32((c), (a), (b))    /* a * b + c, one rounding */
#define dsv_fnmadd(a, b, c) vfmsq_f32((c), (a), (b))   /* c - a * b, one rounding */
#define dsv_round(a) vrndnq_f32(a)                      /* to nearest, ties to even */
#define dsv_casti(a) vreinterpretq_s32_f32(a)
#define dsv_castf(a) vreinterpretq_f32_s32(a)
#define dsv_i_set1(i) vdupq_n_s32(i)
#define dsv_i_add(a, b) vaddq_s32((a), (b))
#define dsv_i_and(a, b) vandq_s32((a), (b))
#define dsv_i_srli(a, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), (n)))
#define dsv_div(a, b) vdivq_f32((a), (b))
#define dsv_sel_eq(a, b, x, y) vbslq_f32(vceqq_f32((a), (b)), (y), (x))   /* a == b ? y : x */
#define dsv_tr(r) dsattn_tr4_128n(r)          /* defined below */
#define dsv_rbf16x(a) dsattn_rbf16x_128n(a)   /* defined below */

DSATTN_NEON_AI float32x4_t dsattn_max_x86_128n(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

#include "simd_tmpl.h"

/* 2^n for integral n in [-126, 127], exactly: (n + 127) << 23 */
DSATTN_NEON_AI float32x4_t dsattn_pow2i_128n(int32x4_t n)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23));
}

/* exp of lanes already clamped to [lo, 88.72]: the polynomial and 2^n as
 * 2^(n >> 1) * 2^(n - (n >> 1)), two normal factors, one rounding that
 * matters (simd_avx2.h dsattn_exp256_core) */
DSATTN_NEON_AI float32x4_t dsattn_exp128n_core(float32x4_t xc)
{
    float32x4_t n;
    const float32x4_t p = dsattn_exp_poly128n(xc, &n);
    const int32x4_t ni = vcvtq_s32_f32(n);            /* n is integral already */
    const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    return vmulq_f32(vmulq_f32(p, dsattn_pow2i_128n(n1)), dsattn_pow2i_128n(n2));
}

/* exp with every lane below `lo` exactly 0; NaN lanes return x */
DSATTN_NEON_AI float32x4_t dsattn_exp128n_cut(float32x4_t x, float lo)
{
    const float32x4_t vlo = vdupq_n_f32(lo), hi = vdupq_n_f32(88.72283935546875f);
    const uint32x4_t tiny = vcltq_f32(x, vlo);
    const uint32x4_t num = vceqq_f32(x, x);           /* not NaN */
    float32x4_t y = dsattn_exp128n_core(vminq_f32(vmaxq_f32(x, vlo), hi));
    y = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), tiny));
    return vbslq_f32(num, y, x);
}

DSATTN_NEON_AI float32x4_t dsattn_exp128n(float32x4_t x) { return dsattn_exp128n_cut(x, -104.0f); }

/* the attention softmaxes' exp: 0 below 2^-100 (x < -69.3), no subnormal */
DSATTN_NEON_AI float32x4_t dsattn_exp128n_ftz(float32x4_t x) { return dsattn_exp128n_cut(x, -69.3f); }

/* dsattn_exp128n_ftz for x <= 0 or NaN (x - max in a softmax) with fewer
 * operations, the same bits: n in [-100, 0], 2^n one normal factor; a NaN
 * lane stays NaN (FMAX returns it; any NaN, the lane's own where the
 * multiply passes its first operand's). */
DSATTN_NEON_AI float32x4_t dsattn_exp128n_ftz_neg(float32x4_t x)
{
    const float32x4_t vlo = vdupq_n_f32(-69.3f);
    const uint32x4_t tiny = vcltq_f32(x, vlo);
    float32x4_t n;
    const float32x4_t p = dsattn_exp_poly128n(vmaxq_f32(vlo, x), &n);
    const float32x4_t y = vmulq_f32(p, dsattn_pow2i_128n(vcvtq_s32_f32(n)));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), tiny));
}

/* 4 bf16 values (8 bytes at p) -> fp32, exactly */
DSATTN_NEON_AI float32x4_t dsattn_bf16x4_128n(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* 8 bf16 values -> fp32: the first 4 and the last 4 */
DSATTN_NEON_AI float32x4_t dsattn_bf16lo_128n(uint16x8_t h)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
}
DSATTN_NEON_AI float32x4_t dsattn_bf16hi_128n(uint16x8_t h)
{
    return vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
}

/* the top 16 bits of 8 lanes (4 + 4), in lane order: bf16 bits of values
 * already rounded to bf16 */
DSATTN_NEON_AI uint16x8_t dsattn_bf16pack_128n(float32x4_t a, float32x4_t b)
{
    return vcombine_u16(vshrn_n_u32(vreinterpretq_u32_f32(a), 16),
                        vshrn_n_u32(vreinterpretq_u32_f32(b), 16));
}

/* all-ones in the first n lanes (n <= 4) */
DSATTN_NEON_AI uint32x4_t dsattn_mask128n(size_t n)
{
    static const uint32_t src[8] = { ~0u, ~0u, ~0u, ~0u, 0, 0, 0, 0 };
    return vld1q_u32(src + 4 - (n > 4 ? 4 : n));
}

/* 8 E4M3 codes -> 8 exact floats: sign to bit 15 and the magnitude bits
 * to 13..7 make an fp16 number equal to the value times 2^-8, subnormals
 * included; FCVTL makes it fp32 and an exact * 256 restores it.  NaN
 * codes (0x7f / 0xff) -> NaN when nan != 0 (else +-480: only for weights
 * known to hold none). */
DSATTN_NEON_AI void dsattn_e4m3x8_128n(uint8x8_t c, float32x4_t *f0, float32x4_t *f1, const int nan)
{
    const int16x8_t w = vreinterpretq_s16_u16(vshll_n_u8(c, 8));     /* code in the high byte */
    const uint16x8_t h = vandq_u16(vreinterpretq_u16_s16(vshrq_n_s16(w, 1)), vdupq_n_u16(0xBF80));
    float32x4_t a = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))), 256.0f);
    float32x4_t b = vmulq_n_f32(vcvt_high_f32_f16(vreinterpretq_f16_u16(h)), 256.0f);
    if (nan) {
        const int16x8_t m = vmovl_s8(vreinterpret_s8_u8(
            vceq_u8(vand_u8(c, vdup_n_u8(0x7f)), vdup_n_u8(0x7f))));
        const float32x4_t q = vdupq_n_f32(__builtin_nanf(""));
        a = vbslq_f32(vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(m))), q, a);
        b = vbslq_f32(vreinterpretq_u32_s32(vmovl_high_s16(m)), q, b);
    }
    *f0 = a;
    *f1 = b;
}

/* 4 E4M3 codes at w (any alignment) widened to 16-bit lanes 0..3 (4..7
 * repeat them) */
DSATTN_NEON_AI uint16x8_t dsattn_codes4_128n(const uint8_t *w)
{
    uint32_t u;
    memcpy(&u, w, 4);
    return vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(u)));
}

/* codes widened to 16 bits -> the fp16 bits s.0eeee.mmm0000000, which
 * are exactly 2^-8 times the code's value (NaN codes give +-480 / 256) */
DSATTN_NEON_AI uint16x8_t dsattn_e4m3_h_128n(uint16x8_t b)
{
    const int16x8_t w = vshrq_n_s16(vreinterpretq_s16_u16(vshlq_n_u16(b, 8)), 1);
    return vandq_u16(vreinterpretq_u16_s16(w), vdupq_n_u16(0xbf80));
}

/* fp16 bits of lanes 0..3 -> fp32, exactly */
DSATTN_NEON_AI float32x4_t dsattn_h4_128n(uint16x8_t h)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
}

/* all-ones in lanes 0..3 whose code (widened to 16 bits) is a NaN code */
DSATTN_NEON_AI uint32x4_t dsattn_e4m3_nan4_128n(uint16x8_t b)
{
    const uint16x8_t n = vceqq_u16(vandq_u16(b, vdupq_n_u16(0x7f)), vdupq_n_u16(0x7f));
    return vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(vreinterpretq_s16_u16(n))));
}

/* the horizontal max in x86's order and semantics (the last steps of
 * simd_avx2.h's dsattn_hmax256: maxps of lanes (0, 2) and (1, 3), then of
 * the two), so a NaN lane gives what it gives there, as dsv_max does */
DSATTN_NEON_AI float dsattn_hmax128n(float32x4_t v)
{
    const float32x4_t m = dsattn_max_x86_128n(v, vextq_f32(v, v, 2));
    const float a = vgetq_lane_f32(m, 0), b = vgetq_lane_f32(m, 1);
    return a > b ? a : b;
}

/* the horizontal sum in a fixed order: (v0 + v2) + (v1 + v3) */
DSATTN_NEON_AI float dsattn_hsum128n(float32x4_t v)
{
    const float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

/* dsattn_round_bf16 on 4 lanes, NaN lanes included: RNE, a NaN -> the
 * quiet NaN with its top bits (dsattn_rbf16_128n, simd_tmpl.h, leaves NaN
 * lanes to the caller) */
DSATTN_NEON_AI float32x4_t dsattn_rbf16x_128n(float32x4_t x)
{
    const uint32x4_t u = vreinterpretq_u32_f32(x), hi = vdupq_n_u32(0xffff0000u);
    const uint32x4_t qn = vandq_u32(vorrq_u32(u, vdupq_n_u32(0x00400000u)), hi);
    return vbslq_f32(vceqq_f32(x, x), dsattn_rbf16_128n(x), vreinterpretq_f32_u32(qn));
}

/* r[i] lane j  ->  r[j] lane i */
DSATTN_NEON_AI void dsattn_tr4_128n(float32x4_t r[4])
{
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* 12 rows of 4 columns (r[i] = row i) -> 4 columns of a 12-row tile, 12
 * floats a column (o[c*12 + i] = row i, column c): three 4 x 4
 * transposes.  r is overwritten. */
DSATTN_NEON_AI void dsattn_store12x4_128n(float32x4_t r[12], float *o)
{
    dsattn_tr4_128n(r);
    dsattn_tr4_128n(r + 4);
    dsattn_tr4_128n(r + 8);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        vst1q_f32(o + (size_t)c * 12, r[c]);
        vst1q_f32(o + (size_t)c * 12 + 4, r[4 + c]);
        vst1q_f32(o + (size_t)c * 12 + 8, r[8 + c]);
    }
}

/* The 6 x 16 register tile of simd_avx2.h (dsattn_acc6x16_*_256) on 4-lane
 * vectors: up to 6 rows of 16 lanes (24 accumulators of the 32 registers),
 * a row's 16 lanes read from b (4 loads), one broadcast of a per row and
 * step (LD1R).  For rows i < nr (nr <= 6, a constant):
 *   load:  acc[i] = c[i*ldc + 0..15] * alpha[0..15];
 *   fma:   acc[i] += sum_{k<kc} a[k*ak + i*ai] * b[k*ldb + 0..15], each
 *          lane one FMA chain over k in order - the chains of the x86
 *          tiles, so the same bits; pf > 0 prefetches the a of step k + pf;
 *   store: c[i*ldc + 0..15] = acc[i].
 * The MLA scores and PV, the sparse-attention QK / PV and the prefill GEMM
 * run on it (through the dsv_acc6x16 words at the end of this file, in
 * mla_tile_tmpl.h, sa_tmpl.h and pgemm_tmpl.h). */
DSATTN_NEON_AI void dsattn_acc6x16_load_128n(float32x4_t acc[6][4], const int nr, const float *c,
                                             size_t ldc, const float *alpha)
{
    float32x4_t al[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) al[v] = vld1q_f32(alpha + 4 * v);
#pragma GCC unroll 6
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[i][v] = vmulq_f32(vld1q_f32(c + (size_t)i * ldc + 4 * v), al[v]);
}

DSATTN_NEON_AI void dsattn_acc6x16_zero_128n(float32x4_t acc[6][4])
{
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[i][v] = vdupq_n_f32(0.0f);
}

DSATTN_NEON_AI void dsattn_acc6x16_fma_128n(float32x4_t acc[6][4], const int nr, const float *a,
                                            size_t ak, size_t ai, const float *b, size_t ldb,
                                            size_t kc, const size_t pf)
{
    for (size_t k = 0; k < kc; k++) {
        if (pf) __builtin_prefetch(a + (k + pf) * ak, 0, 3);
        const float *bk = b + k * ldb;
        const float32x4_t b0 = vld1q_f32(bk), b1 = vld1q_f32(bk + 4);
        const float32x4_t b2 = vld1q_f32(bk + 8), b3 = vld1q_f32(bk + 12);
#pragma GCC unroll 6
        for (int i = 0; i < nr; i++) {
            const float32x4_t av = vld1q_dup_f32(a + k * ak + (size_t)i * ai);
            acc[i][0] = vfmaq_f32(acc[i][0], av, b0);
            acc[i][1] = vfmaq_f32(acc[i][1], av, b1);
            acc[i][2] = vfmaq_f32(acc[i][2], av, b2);
            acc[i][3] = vfmaq_f32(acc[i][3], av, b3);
        }
    }
}

DSATTN_NEON_AI void dsattn_acc6x16_store_128n(float32x4_t acc[6][4], const int nr, float *c,
                                              size_t ldc)
{
#pragma GCC unroll 6
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) vst1q_f32(c + (size_t)i * ldc + 4 * v, acc[i][v]);
}

/* The whole tile over a packed [kc][12] operand (rows 0..5 of a 12-row
 * tile), as dsattn_tile6x16_256:
 *   c[r*ldc + j] = (first ? 0 : c[r*ldc + j]) + sum_{k<kc} a[k*12 + r] * b[k*ldb + j] */
DSATTN_NEON_AI void dsattn_tile6x16_128n(const float *a, const float *b, size_t ldb, size_t kc,
                                         float *c, size_t ldc, int first)
{
    float32x4_t acc[6][4];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[i][v] = first ? vdupq_n_f32(0.0f) : vld1q_f32(c + (size_t)i * ldc + 4 * v);
    dsattn_acc6x16_fma_128n(acc, 6, a, 12, 1, b, ldb, kc, 0);
    dsattn_acc6x16_store_128n(acc, 6, c, ldc);
}

/* The 6 x 16 tile in the templates' words (as simd_avx2.h) */
#define DSV_TILE6X16 1
#define DSV_ACC6X16(a) float32x4_t a[6][4]
#define dsv_acc6x16_zero dsattn_acc6x16_zero_128n
#define dsv_acc6x16_load dsattn_acc6x16_load_128n
#define dsv_acc6x16_fma dsattn_acc6x16_fma_128n
#define dsv_acc6x16_store dsattn_acc6x16_store_128n
#define dsv_tile6x16 dsattn_tile6x16_128n
#define dsv_store12cols dsattn_store12x4_128n

#endif /* DSATTN_SIMD_NEON_H */
