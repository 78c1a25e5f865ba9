/* kernels_neon.c - the `neon` kernel table: ARMv8.0 Advanced SIMD
 * (aarch64 builds only; CMakeLists.txt leaves this file out elsewhere and
 * absent.c then makes dsattn_kernels_neon_ptr NULL).
 *
 * SIMD entries: the four decode GEMVs (fp32, bf16, FP8 E4M3 with block
 * scales, FP4 E2M1 with UE8M0 scales; gemv_fp8_finite is gemv_fp8).  They
 * accumulate in fp32 with FMA, four lanes by two accumulators, in their own
 * order, and are tested against the scalar reference with the bounds of
 * the x86 tables (tests/test_kernels.c).  Decoding is exact: bf16 is a
 * 16-bit shift, E4M3 codes go through numfmt.h's table (so a NaN code gives
 * a NaN output with no extra tracking), E2M1 codes through a byte table of
 * 2x their values, the half folded into the power-of-two scale.
 *
 * Every other entry (packed-row dots and axpys, row decoders, the bf16 row
 * tiles, act_quant) is the scalar reference's, called through
 * dsattn_kernels_ref: correct everywhere, not yet a NEON form.  Speed on
 * ARM hardware has not been measured (docs/kernels.md).
 */
#include "kernels.h"

#include "numfmt.h"

#include <arm_neon.h>

static inline float hsum2(float32x4_t a, float32x4_t b) { return vaddvq_f32(vaddq_f32(a, b)); }

static void gemv_f32_neon(const float *W, const float *x, float *y, size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const float *w = W + r * k;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        size_t i = 0;
        for (; i + 8 <= k; i += 8) {
            a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
            a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
        }
        if (i + 4 <= k) {
            a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
            i += 4;
        }
        float t = 0.0f;
        for (; i < k; i++) t += w[i] * x[i];
        y[r] = hsum2(a0, a1) + t;
    }
}

static inline float32x4_t bf16x4(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static void gemv_bf16_neon(const uint16_t *W, const float *x, float *y, size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint16_t *w = W + r * k;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        size_t i = 0;
        for (; i + 8 <= k; i += 8) {
            a0 = vfmaq_f32(a0, bf16x4(w + i), vld1q_f32(x + i));
            a1 = vfmaq_f32(a1, bf16x4(w + i + 4), vld1q_f32(x + i + 4));
        }
        if (i + 4 <= k) {
            a0 = vfmaq_f32(a0, bf16x4(w + i), vld1q_f32(x + i));
            i += 4;
        }
        float t = 0.0f;
        for (; i < k; i++) t += dsattn_bf16_to_f32(w[i]) * x[i];
        y[r] = hsum2(a0, a1) + t;
    }
}

static inline float32x4_t e4m3x4(const uint8_t *c)
{
    const float v[4] = { dsattn_e4m3_to_f32(c[0]), dsattn_e4m3_to_f32(c[1]),
                         dsattn_e4m3_to_f32(c[2]), dsattn_e4m3_to_f32(c[3]) };
    return vld1q_f32(v);
}

/* Per row, per scale block along k: the weight times its block's scale
 * (one fp32 rounding), FMA into the accumulators. */
static void gemv_fp8_neon(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                          const float *x, float *y, size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * k;
        const float *sc = scale + (r / bs) * ldsc;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        float t = 0.0f;
        for (size_t b0 = 0; b0 < k; b0 += bs) {
            const size_t end = b0 + bs < k ? b0 + bs : k;
            const float s = sc[b0 / bs];
            size_t i = b0;
            for (; i + 8 <= end; i += 8) {
                a0 = vfmaq_f32(a0, vmulq_n_f32(e4m3x4(w + i), s), vld1q_f32(x + i));
                a1 = vfmaq_f32(a1, vmulq_n_f32(e4m3x4(w + i + 4), s), vld1q_f32(x + i + 4));
            }
            if (i + 4 <= end) {
                a0 = vfmaq_f32(a0, vmulq_n_f32(e4m3x4(w + i), s), vld1q_f32(x + i));
                i += 4;
            }
            for (; i < end; i++) t += dsattn_e4m3_to_f32(w[i]) * s * x[i];
        }
        y[r] = hsum2(a0, a1) + t;
    }
}

/* 2 x the E2M1 value of each code (all integers; code 8 is -0 -> 0, which
 * adds the same as -0.0 into a sum that starts at +0) */
static const int8_t e2m1_x2[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

static inline float32x4_t s8lo_f32(int16x8_t v) { return vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))); }
static inline float32x4_t s8hi_f32(int16x8_t v) { return vcvtq_f32_s32(vmovl_high_s16(v)); }

static void gemv_fp4_neon(const uint8_t *W, const uint8_t *scale, const float *x, float *y,
                          size_t rows, size_t k)
{
    const int8x16_t lut = vld1q_s8(e2m1_x2);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * (k / 2);
        const uint8_t *sc = scale + r * (k / 32);
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        for (size_t g = 0; g < k / 32; g++) {
            const float s = 0.5f * dsattn_ue8m0_to_f32(sc[g]);   /* exact: a power of two */
            const uint8x16_t b = vld1q_u8(w + g * 16);
            const uint8x16_t lo = vandq_u8(b, vdupq_n_u8(15)), hi = vshrq_n_u8(b, 4);
            /* element order: even elements in the low nibbles */
            const int8x16_t c0 = vqtbl1q_s8(lut, vzip1q_u8(lo, hi));
            const int8x16_t c1 = vqtbl1q_s8(lut, vzip2q_u8(lo, hi));
            const int16x8_t h[4] = { vmovl_s8(vget_low_s8(c0)), vmovl_high_s8(c0),
                                     vmovl_s8(vget_low_s8(c1)), vmovl_high_s8(c1) };
            const float *xg = x + g * 32;
            for (int j = 0; j < 4; j++) {
                a0 = vfmaq_f32(a0, vmulq_n_f32(s8lo_f32(h[j]), s), vld1q_f32(xg + 8 * j));
                a1 = vfmaq_f32(a1, vmulq_n_f32(s8hi_f32(h[j]), s), vld1q_f32(xg + 8 * j + 4));
            }
        }
        y[r] = hsum2(a0, a1);
    }
}

/* ==== Entries without a NEON form: the scalar reference's ============== */

#define REF(name) (*dsattn_kernels_ref.name)

static float dot_f32_r(const float *a, const float *b, size_t n) { return REF(dot_f32)(a, b, n); }
static void mdot_f32_r(const float *q, size_t ldq, size_t nh, const float *v, size_t n, float *out)
{ REF(mdot_f32)(q, ldq, nh, v, n, out); }
static void maxpy_f32_r(const float *p, size_t nh, const float *v, size_t n, float *acc, size_t lda)
{ REF(maxpy_f32)(p, nh, v, n, acc, lda); }
static void deq_fp4e4m3_r(const uint8_t *row, size_t d, float *out) { REF(dequant_fp4e4m3_row)(row, d, out); }
static void deq_fp8ue8m0_r(const uint8_t *row, size_t d, float *out) { REF(dequant_fp8ue8m0_row)(row, d, out); }
static void deq_fp4ue8m0_r(const uint8_t *row, size_t d, float *out) { REF(dequant_fp4ue8m0_row)(row, d, out); }
static void mdot_fp4e4m3_r(const float *q, size_t ldq, size_t nh, const uint8_t *row, size_t d, float *out)
{ REF(mdot_fp4e4m3)(q, ldq, nh, row, d, out); }
static void mdot_fp4e4m3_rows_r(const float *q, size_t ldq, size_t nh, const uint8_t *const *rows,
                                size_t nr, size_t d, float *out, size_t ldo)
{ REF(mdot_fp4e4m3_rows)(q, ldq, nh, rows, nr, d, out, ldo); }
static void maxpy_fp4e4m3_r(const float *p, size_t nh, const uint8_t *row, size_t d, float *acc,
                            size_t lda)
{ REF(maxpy_fp4e4m3)(p, nh, row, d, acc, lda); }
static void maxpy_fp4e4m3_rows_r(const float *p, size_t ldp, size_t nh, const uint8_t *const *rows,
                                 size_t nr, size_t d, float *acc, size_t lda)
{ REF(maxpy_fp4e4m3_rows)(p, ldp, nh, rows, nr, d, acc, lda); }
static void mdot_fp4ue8m0_r(const float *q, size_t ldq, size_t nh, const uint8_t *row, size_t d, float *out)
{ REF(mdot_fp4ue8m0)(q, ldq, nh, row, d, out); }
static void mdot_fp8ue8m0_r(const float *q, size_t ldq, size_t nh, const uint8_t *row, size_t d, float *out)
{ REF(mdot_fp8ue8m0)(q, ldq, nh, row, d, out); }
static void maxpy_fp8ue8m0_r(const float *p, size_t nh, const uint8_t *row, size_t d, float *acc,
                             size_t lda)
{ REF(maxpy_fp8ue8m0)(p, nh, row, d, acc, lda); }
static void cvt_bf16_f32_r(const uint16_t *src, size_t n, float *out) { REF(cvt_bf16_f32)(src, n, out); }
static void mdot_bf16_rows_r(const float *q, size_t ldq, size_t nh, const uint16_t *rows, size_t ldr,
                             size_t nr, size_t k, float *out, size_t ldo)
{ REF(mdot_bf16_rows)(q, ldq, nh, rows, ldr, nr, k, out, ldo); }

static const dsattn_kernels kernels_neon = {
    .name      = "neon",
    .gemv_f32  = gemv_f32_neon,
    .gemv_bf16 = gemv_bf16_neon,
    .gemv_fp8  = gemv_fp8_neon,
    .gemv_fp8_finite = gemv_fp8_neon,   /* the LUT decode needs no NaN tracking */
    .gemv_fp4  = gemv_fp4_neon,
    /* scalar reference entries */
    .act_quant_fp8_pow2   = dsattn_act_quant_fp8_pow2_ref,
    .dot_f32              = dot_f32_r,
    .mdot_f32             = mdot_f32_r,
    .maxpy_f32            = maxpy_f32_r,
    .dequant_fp4e4m3_row  = deq_fp4e4m3_r,
    .dequant_fp8ue8m0_row = deq_fp8ue8m0_r,
    .dequant_fp4ue8m0_row = deq_fp4ue8m0_r,
    .mdot_fp4e4m3         = mdot_fp4e4m3_r,
    .mdot_fp4e4m3_rows    = mdot_fp4e4m3_rows_r,
    .maxpy_fp4e4m3        = maxpy_fp4e4m3_r,
    .maxpy_fp4e4m3_rows   = maxpy_fp4e4m3_rows_r,
    .mdot_fp4ue8m0        = mdot_fp4ue8m0_r,
    .mdot_fp8ue8m0        = mdot_fp8ue8m0_r,
    .maxpy_fp8ue8m0       = maxpy_fp8ue8m0_r,
    .cvt_bf16_f32         = cvt_bf16_f32_r,
    .mdot_bf16_rows       = mdot_bf16_rows_r,
};

const dsattn_kernels *const dsattn_kernels_neon_ptr = &kernels_neon;
