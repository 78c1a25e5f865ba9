/* simd_neon.h - small Advanced SIMD (ARMv8.0) helpers that the NEON kernel
 * files inline into their loops: the exp of the softmaxes with the x86
 * tables' bits, bf16 values widened to fp32 and packed back, the exact
 * decode of E4M3 codes, first-n lane masks, horizontal max / sum; and the
 * 4-lane vector words (DSV_F, dsv_fmadd, ...) that the templates written
 * once for every width use (simd_tmpl.h, mha_tmpl.h).  Include only from
 * *_neon.c files (aarch64 builds; CMakeLists.txt leaves them out
 * elsewhere).
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
#define dsv_max(a, b) vmaxq_f32((a), (b))
#define dsv_fmadd(a, b, c) vfmaq_f32((c), (a), (b))    /* a * b + c, one rounding */
#define dsv_fnmadd(a, b, c) vfmsq_f32((c), (a), (b))   /* c - a * b, one rounding */
#define dsv_round(a) vrndnq_f32(a)                      /* to nearest, ties to even */
#define dsv_casti(a) vreinterpretq_s32_f32(a)
#define dsv_castf(a) vreinterpretq_f32_s32(a)
#define dsv_i_set1(i) vdupq_n_s32(i)
#define dsv_i_add(a, b) vaddq_s32((a), (b))
#define dsv_i_and(a, b) vandq_s32((a), (b))
#define dsv_i_srli(a, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), (n)))

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

DSATTN_NEON_AI float dsattn_hmax128n(float32x4_t v) { return vmaxvq_f32(v); }

/* the horizontal sum in a fixed order: (v0 + v2) + (v1 + v3) */
DSATTN_NEON_AI float dsattn_hsum128n(float32x4_t v)
{
    const float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

#endif /* DSATTN_SIMD_NEON_H */
