/* kernels_neon.c - the `neon` kernel table: ARMv8.0 Advanced SIMD
 * (aarch64 builds only; CMakeLists.txt leaves this file out elsewhere and
 * absent.c then makes dsattn_kernels_neon_ptr NULL).
 *
 * Owns a NEON form of every dsattn_kernels entry (the AVX2 table's SIMD
 * entries, and act_quant_fp8_pow2).
 * Same contract as the x86 tables: fp32 FMA accumulation in its own order,
 * tested against kernels_ref.c with the bounds of tests/test_kernels.c (4
 * lanes), decoders and conversions bit-exact, single-threaded and
 * reentrant, scratch on the stack (at most 4 KB).  Baseline ARMv8.0 only:
 * no fp16 arithmetic, dotprod or bf16 instruction is used (the fp16 -> fp32
 * conversion FCVTL is baseline).  Few kernels, shared by several entries:
 *  - heads_dot: G fp32 rows . one fp32 vector (gemv_f32, dot_f32, mdot_f32
 *    and the fused packed-row dots, which decode a row into an L1 buffer
 *    first);
 *  - maxpy_f32 (also the fused packed-row axpys);
 *  - bf16_tile: heads x bf16 rows (mdot_bf16_rows, gemv_bf16, and
 *    gemv_bf16_m: tokens as heads);
 *  - fp8_gemv_m: FP8 rows x up to 8 tokens (gemv_fp8, gemv_fp8_finite,
 *    gemv_fp8_m);
 *  - gemv_fp4, act_quant_fp8_pow2.
 *
 * Decodes (all exact):
 *  - bf16: a 16-bit left shift (SHLL).
 *  - E2M1: every value is a bf16 number; two 16-entry byte lookups (TBL)
 *    give its high and low byte, a byte zip makes the bf16 words (-0.0 for
 *    code 8, as numfmt.c).
 *  - E4M3 (dsattn_e4m3x8_128n of simd_neon.h, which wdequant_neon.c
 *    shares): sign to bit 15 and the magnitude bits to 13..7 make an fp16
 *    number equal to the value times 2^-8, subnormals included; FCVTL makes
 *    it fp32 and an exact *256 restores it.  NaN codes (0x7f / 0xff) would
 *    come out as +-480, so a compare mask puts NaN there (left out where the
 *    weights are known finite).
 *  - UE8M0 b: bits b << 23, b = 0 -> 2^-127, 255 -> NaN.
 * Speed on ARM hardware has not been measured (docs/kernels.md).
 */
#include "kernels.h"

#include "numfmt.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "simd_neon.h"

#define AI static inline __attribute__((always_inline))

/* Row elements decoded per pass of the fused kernels (4 KB of stack). */
#define RCH 1024

/* ==== Exact decoders ==================================================== */

/* bf16 bytes of the E2M1 values 0 .5 1 1.5 2 3 4 6, then their negatives */
static const uint8_t e2m1_bf16_hi[16] = { 0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                          0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0 };
static const uint8_t e2m1_bf16_lo[16] = { 0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                          0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0 };

/* 16 E2M1 codes (one per byte) -> 16 floats */
AI void e2m1x16(uint8x16_t c, float32x4_t v[4])
{
    const uint8x16_t l = vqtbl1q_u8(vld1q_u8(e2m1_bf16_lo), c);
    const uint8x16_t h = vqtbl1q_u8(vld1q_u8(e2m1_bf16_hi), c);
    const uint16x8_t w0 = vreinterpretq_u16_u8(vzip1q_u8(l, h));
    const uint16x8_t w1 = vreinterpretq_u16_u8(vzip2q_u8(l, h));
    v[0] = dsattn_bf16lo_128n(w0);
    v[1] = dsattn_bf16hi_128n(w0);
    v[2] = dsattn_bf16lo_128n(w1);
    v[3] = dsattn_bf16hi_128n(w1);
}

/* 16 packed bytes (32 codes, even element in the low nibble) -> 32 floats,
 * natural order */
AI void fp4x32(const uint8_t *p, float32x4_t v[8])
{
    const uint8x16_t b = vld1q_u8(p);
    const uint8x16_t lo = vandq_u8(b, vdupq_n_u8(15)), hi = vshrq_n_u8(b, 4);
    e2m1x16(vzip1q_u8(lo, hi), v);
    e2m1x16(vzip2q_u8(lo, hi), v + 4);
}

/* 8 packed bytes -> 16 floats */
AI void fp4x16(const uint8_t *p, float32x4_t v[4])
{
    const uint8x8_t b = vld1_u8(p);
    const uint8x16_t lo = vcombine_u8(vand_u8(b, vdup_n_u8(15)), vdup_n_u8(0));
    const uint8x16_t hi = vcombine_u8(vshr_n_u8(b, 4), vdup_n_u8(0));
    e2m1x16(vzip1q_u8(lo, hi), v);
}

/* ==== fp32 dots: G rows against one vector ============================== */
/* out[g] (+)= q[g*ldq ..] . v, g < G: v loaded once for the G rows; G = 8
 * (16 accumulators of the 32 registers), 4 or 1 with U chains per row. */
AI void heads_dot(const float *q, size_t ldq, const float *v, size_t n, float *out,
                  const int G, const int accumulate)
{
    const int U = G == 1 ? 4 : 2;
    float32x4_t a[16];
#pragma GCC unroll 16
    for (int j = 0; j < G * U; j++) a[j] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 * (size_t)U <= n; i += 4 * (size_t)U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            const float32x4_t vv = vld1q_f32(v + i + 4 * u);
#pragma GCC unroll 8
            for (int g = 0; g < G; g++)
                a[g * U + u] = vfmaq_f32(a[g * U + u], vld1q_f32(q + g * ldq + i + 4 * u), vv);
        }
    }
    for (; i + 4 <= n; i += 4) {
        const float32x4_t vv = vld1q_f32(v + i);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) a[g * U] = vfmaq_f32(a[g * U], vld1q_f32(q + g * ldq + i), vv);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        float32x4_t b = a[g * U];
        for (int u = 1; u < U; u++) b = vaddq_f32(b, a[g * U + u]);
        float s = vaddvq_f32(b);
        for (size_t j = i; j < n; j++) s += q[g * ldq + j] * v[j];
        out[g] = accumulate ? out[g] + s : s;
    }
}

static void mdot_core(const float *q, size_t ldq, size_t nh, const float *v, size_t n,
                      float *out, int accumulate)
{
    size_t h = 0;
    for (; h + 8 <= nh; h += 8) heads_dot(q + h * ldq, ldq, v, n, out + h, 8, accumulate);
    if (h + 4 <= nh) { heads_dot(q + h * ldq, ldq, v, n, out + h, 4, accumulate); h += 4; }
    for (; h < nh; h++) heads_dot(q + h * ldq, ldq, v, n, out + h, 1, accumulate);
}

static void mdot_f32_neon(const float *q, size_t ldq, size_t nh, const float *v, size_t n,
                          float *out)
{
    mdot_core(q, ldq, nh, v, n, out, 0);
}

/* a GEMV is the rows of W against x */
static void gemv_f32_neon(const float *W, const float *x, float *y, size_t rows, size_t k)
{
    mdot_core(W, k, rows, x, k, y, 0);
}

static float dot_f32_neon(const float *a, const float *b, size_t n)
{
    float s;
    heads_dot(a, 0, b, n, &s, 1, 0);
    return s;
}

/* acc[h*ldacc + i] += p[h] * v[i]: v loaded once per 16 elements for all
 * heads; one FMA (one rounding) per element, the scalar tail too. */
static void maxpy_f32_neon(const float *p, size_t nh, const float *v, size_t n, float *acc,
                           size_t ldacc)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float32x4_t v0 = vld1q_f32(v + i), v1 = vld1q_f32(v + i + 4);
        const float32x4_t v2 = vld1q_f32(v + i + 8), v3 = vld1q_f32(v + i + 12);
        for (size_t h = 0; h < nh; h++) {
            float *a = acc + h * ldacc + i;
            const float ph = p[h];
            vst1q_f32(a, vfmaq_n_f32(vld1q_f32(a), v0, ph));
            vst1q_f32(a + 4, vfmaq_n_f32(vld1q_f32(a + 4), v1, ph));
            vst1q_f32(a + 8, vfmaq_n_f32(vld1q_f32(a + 8), v2, ph));
            vst1q_f32(a + 12, vfmaq_n_f32(vld1q_f32(a + 12), v3, ph));
        }
    }
    for (; i + 4 <= n; i += 4) {
        const float32x4_t vv = vld1q_f32(v + i);
        for (size_t h = 0; h < nh; h++) {
            float *a = acc + h * ldacc + i;
            vst1q_f32(a, vfmaq_n_f32(vld1q_f32(a), vv, p[h]));
        }
    }
    for (; i < n; i++)
        for (size_t h = 0; h < nh; h++) acc[h * ldacc + i] = fmaf(p[h], v[i], acc[h * ldacc + i]);
}

/* ==== Packed cache rows ================================================= */


/* Elements [i0, i0 + n) of a row of format fmt -> out, each the fp32
 * product code value * block scale, as numfmt.c's unpack.  i0 and n are
 * multiples of the format's block (16 for DSATTN_ROW_FP4E4M3, else 32). */
AI void dequant_range(const int fmt, const uint8_t *row, size_t d, size_t i0, size_t n,
                      float *out)
{
    float32x4_t v[8];
    size_t i = i0;
    if (fmt == DSATTN_ROW_FP8UE8M0) {
        for (; i < i0 + n; i += 32) {
            const float s = dsattn_ue8m0_bits_f32(row[d + i / 32]);
            for (int j = 0; j < 4; j++) {
                dsattn_e4m3x8_128n(vld1_u8(row + i + 8 * j), &v[2 * j], &v[2 * j + 1], 1);
                vst1q_f32(out + (i - i0) + 8 * j, vmulq_n_f32(v[2 * j], s));
                vst1q_f32(out + (i - i0) + 8 * j + 4, vmulq_n_f32(v[2 * j + 1], s));
            }
        }
        return;
    }
    const uint8_t *sb = row + d / 2;
    for (; i + 32 <= i0 + n; i += 32) {
        float s0, s1;
        if (fmt == DSATTN_ROW_FP4E4M3) {
            s0 = dsattn_e4m3_to_f32(sb[i / 16]);
            s1 = dsattn_e4m3_to_f32(sb[i / 16 + 1]);
        } else {
            s0 = s1 = dsattn_ue8m0_bits_f32(sb[i / 32]);
        }
        fp4x32(row + i / 2, v);
        for (int j = 0; j < 8; j++) vst1q_f32(out + (i - i0) + 4 * j, vmulq_n_f32(v[j], j < 4 ? s0 : s1));
    }
    if (i < i0 + n) {                       /* DSATTN_ROW_FP4E4M3: a last 16 */
        const float s = dsattn_e4m3_to_f32(sb[i / 16]);
        fp4x16(row + i / 2, v);
        for (int j = 0; j < 4; j++) vst1q_f32(out + (i - i0) + 4 * j, vmulq_n_f32(v[j], s));
    }
}

/* Fused kernels: decode up to RCH elements into an L1 buffer once, then
 * the fp32 dots / axpys over it for every head. */
AI void mdot_row(const int fmt, const float *q, size_t ldq, size_t nh, const uint8_t *row,
                 size_t d, float *out)
{
    float buf[RCH];
    if (d == 0) memset(out, 0, nh * sizeof(float));
    for (size_t i0 = 0; i0 < d; i0 += RCH) {
        const size_t n = d - i0 < RCH ? d - i0 : RCH;
        dequant_range(fmt, row, d, i0, n, buf);
        mdot_core(q + i0, ldq, nh, buf, n, out, i0 > 0);
    }
}

AI void maxpy_row(const int fmt, const float *p, size_t nh, const uint8_t *row, size_t d,
                  float *acc, size_t ldacc)
{
    float buf[RCH];
    for (size_t i0 = 0; i0 < d; i0 += RCH) {
        const size_t n = d - i0 < RCH ? d - i0 : RCH;
        dequant_range(fmt, row, d, i0, n, buf);
        maxpy_f32_neon(p, nh, buf, n, acc + i0, ldacc);
    }
}

#include "kernels_rows_tmpl.h"

/* ==== bf16 rows ========================================================= */

static void cvt_bf16_f32_neon(const uint16_t *src, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(out + i, dsattn_bf16lo_128n(h));
        vst1q_f32(out + i + 4, dsattn_bf16hi_128n(h));
    }
    for (; i < n; i++) out[i] = dsattn_bf16_to_f32(src[i]);
}

/* HB heads x RB bf16 rows (HB * RB <= 16 accumulators): each row vector
 * decoded once for the HB heads; the k tail (k % 4) in scalar fp32.  Head
 * h of row r goes to out[r * ldo + h * ldh]. */
AI void bf16_tile(const float *q, size_t ldq, const uint16_t *rows, size_t ldr, size_t k,
                  float *out, size_t ldo, size_t ldh, const int HB, const int RB)
{
    float32x4_t acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < HB * RB; j++) acc[j] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= k; i += 4) {
        float32x4_t w[8];
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++) w[r] = dsattn_bf16x4_128n(rows + r * ldr + i);
#pragma GCC unroll 4
        for (int h = 0; h < HB; h++) {
            const float32x4_t qv = vld1q_f32(q + h * ldq + i);
#pragma GCC unroll 8
            for (int r = 0; r < RB; r++) acc[h * RB + r] = vfmaq_f32(acc[h * RB + r], qv, w[r]);
        }
    }
    for (int h = 0; h < HB; h++)
        for (int r = 0; r < RB; r++) {
            float t = vaddvq_f32(acc[h * RB + r]);
            for (size_t j = i; j < k; j++) t += q[h * ldq + j] * dsattn_bf16_to_f32(rows[r * ldr + j]);
            out[r * ldo + (size_t)h * ldh] = t;
        }
}

AI void bf16_heads(const float *q, size_t ldq, const uint16_t *rows, size_t ldr, size_t nr,
                   size_t k, float *out, size_t ldo, size_t ldh, const int HB, const int RB)
{
    size_t r = 0;
    for (; r + (size_t)RB <= nr; r += (size_t)RB)
        bf16_tile(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, ldh, HB, RB);
    for (; r < nr; r++) bf16_tile(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, ldh, HB, 1);
}

/* nh heads (q rows) against nr bf16 rows: head h of row r to
 * out[r * ldo + h * ldh]; 4 heads x 4 rows a tile, then 2 x 8, 1 x 8 */
static void bf16_mdot(const float *q, size_t ldq, size_t nh, const uint16_t *rows, size_t ldr,
                      size_t nr, size_t k, float *out, size_t ldo, size_t ldh)
{
    size_t h = 0;
    for (; h + 4 <= nh; h += 4)
        bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h * ldh, ldo, ldh, 4, 4);
    if (h + 2 <= nh) {
        bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h * ldh, ldo, ldh, 2, 8);
        h += 2;
    }
    if (h < nh) bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h * ldh, ldo, ldh, 1, 8);
}

static void mdot_bf16_rows_neon(const float *q, size_t ldq, size_t nh, const uint16_t *rows,
                                size_t ldr, size_t nr, size_t k, float *out, size_t ldo)
{
    bf16_mdot(q, ldq, nh, rows, ldr, nr, k, out, ldo, 1);
}

/* a bf16 GEMV is one "head" (x) against the rows of W */
static void gemv_bf16_neon(const uint16_t *W, const float *x, float *y, size_t rows, size_t k)
{
    mdot_bf16_rows_neon(x, k, 1, W, k, rows, k, y, 1);
}

/* ... and m tokens are m heads, each row vector decoded once for 4 of
 * them (a batched decode step); token t's outputs at y + t * ldy */
static void gemv_bf16_m_neon(const uint16_t *W, const float *x, size_t ldx, size_t m, float *y,
                             size_t ldy, size_t rows, size_t k)
{
    bf16_mdot(x, ldx, m, W, k, rows, k, y, 1, ldy);
}

/* ==== FP8 E4M3 GEMV, one token or several =============================== */
/* Per weight row, per 8 codes of a scale block: decode once (exact), times
 * the block scale (one fp32 rounding), then FMA into 2 accumulators of
 * each of the T tokens (16 of the 32 registers at T = 8); a block's last
 * k % 8 codes in scalar fp32.  Several tokens walk k in slabs of M_KC so
 * that their x slabs (8 x 2 KB) stay in L1 while the rows stream past;
 * a row's slab sums are added to y.  Any k and block size. */
#define M_T 8
#define M_KC 512

AI void fp8_rows_m(const uint8_t *W, size_t k, const float *sc, size_t bs, const float *x,
                   size_t ldx, float *y, size_t ldy, size_t nr, size_t k0, size_t kn,
                   const int T, const int nan)
{
    for (size_t r = 0; r < nr; r++) {
        const uint8_t *w = W + r * k;
        float32x4_t a[2 * M_T];
        float tail[M_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            a[2 * t] = a[2 * t + 1] = vdupq_n_f32(0.0f);
            tail[t] = 0.0f;
        }
        for (size_t b0 = k0; b0 < k0 + kn;) {        /* a scale block's part in the slab */
            const size_t blk = b0 / bs, e = (blk + 1) * bs < k0 + kn ? (blk + 1) * bs : k0 + kn;
            const float s = sc[blk];
            size_t i = b0;
            for (; i + 8 <= e; i += 8) {
                float32x4_t f0, f1;
                dsattn_e4m3x8_128n(vld1_u8(w + i), &f0, &f1, nan);
                f0 = vmulq_n_f32(f0, s);
                f1 = vmulq_n_f32(f1, s);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const float *xt = x + (size_t)t * ldx + i;
                    a[2 * t] = vfmaq_f32(a[2 * t], f0, vld1q_f32(xt));
                    a[2 * t + 1] = vfmaq_f32(a[2 * t + 1], f1, vld1q_f32(xt + 4));
                }
            }
            for (; i < e; i++) {
                const float wv = dsattn_e4m3_to_f32(w[i]) * s;
                for (int t = 0; t < T; t++) tail[t] += wv * x[(size_t)t * ldx + i];
            }
            b0 = e;
        }
        for (int t = 0; t < T; t++) {
            const float v = vaddvq_f32(vaddq_f32(a[2 * t], a[2 * t + 1])) + tail[t];
            float *o = y + (size_t)t * ldy + r;
            *o = k0 > 0 ? *o + v : v;
        }
    }
}

static void fp8_gemv_m(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                       const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                       size_t rows, size_t k, int finite)
{
    if (bs == 0) return;
    const size_t kc = m > 1 ? M_KC : (k > 0 ? k : 1);     /* one token: no slabs */
    for (size_t g0 = 0; g0 < m;) {
        const size_t left = m - g0, T = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        const float *xg = x + g0 * ldx;
        float *yg = y + g0 * ldy;
        for (size_t k0 = 0; k0 == 0 || k0 < k; k0 += kc) {   /* k = 0: y = 0 */
            const size_t kn = k - k0 < kc ? k - k0 : kc;
            for (size_t rb0 = 0; rb0 < rows;) {
                const size_t sr = rb0 / bs;                       /* scale row */
                const size_t rb1 = (sr + 1) * bs < rows ? (sr + 1) * bs : rows;
                const uint8_t *w = W + rb0 * k;
                const float *sc = scale + sr * ldsc;
                const size_t nr = rb1 - rb0;
#define FP8_PASS(TT)                                                                  \
    (finite ? fp8_rows_m(w, k, sc, bs, xg, ldx, yg + rb0, ldy, nr, k0, kn, TT, 0)     \
            : fp8_rows_m(w, k, sc, bs, xg, ldx, yg + rb0, ldy, nr, k0, kn, TT, 1))
                switch (T) {   /* the token count as a constant: accumulators in registers */
                case 8: FP8_PASS(8); break;
                case 4: FP8_PASS(4); break;
                case 2: FP8_PASS(2); break;
                default: FP8_PASS(1); break;
                }
#undef FP8_PASS
                rb0 = rb1;
            }
        }
        g0 += T;
    }
}

static void gemv_fp8_neon(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                          const float *x, float *y, size_t rows, size_t k)
{
    fp8_gemv_m(W, scale, bs, ldsc, x, k, 1, y, rows, rows, k, 0);
}

static void gemv_fp8_finite_neon(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                                 const float *x, float *y, size_t rows, size_t k)
{
    fp8_gemv_m(W, scale, bs, ldsc, x, k, 1, y, rows, rows, k, 1);
}

/* ==== FP4 E2M1 GEMV ===================================================== */
/* Per row, per 32 codes (one UE8M0 block): decode (exact), two partial
 * sums against x, then one FMA of each with the block scale. */
static void gemv_fp4_neon(const uint8_t *W, const uint8_t *scale, const float *x, float *y,
                          size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * (k / 2), *sc = scale + r * (k / 32);
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        for (size_t g = 0; g < k / 32; g++) {
            float32x4_t v[8];
            const float *xg = x + g * 32;
            fp4x32(w + g * 16, v);
            float32x4_t p0 = vmulq_f32(v[0], vld1q_f32(xg));
            float32x4_t p1 = vmulq_f32(v[1], vld1q_f32(xg + 4));
            for (int j = 2; j < 8; j += 2) {
                p0 = vfmaq_f32(p0, v[j], vld1q_f32(xg + 4 * j));
                p1 = vfmaq_f32(p1, v[j + 1], vld1q_f32(xg + 4 * j + 4));
            }
            const float s = dsattn_ue8m0_bits_f32(sc[g]);
            a0 = vfmaq_n_f32(a0, p0, s);
            a1 = vfmaq_n_f32(a1, p1, s);
        }
        y[r] = vaddvq_f32(vaddq_f32(a0, a1));
    }
}

/* ==== Activation quantization =========================================== */
/* numfmt.c's dsattn_quant_fp8_ue8m0 deq, bit for bit: the block scale in
 * scalar code (the same expressions); per lane the same fp32 divide, the
 * clamp (FMIN / FMAX pass NaN through, as the C compares do), the E4M3
 * grid value: at |y| >= 2^-6 an integer round-to-nearest-even of the fp32
 * bits to 3 mantissa bits (a carry moves into the exponent, as m = 16 does
 * there; |y| <= 448 keeps it finite), below that FRINTN of y * 2^9 (exact
 * scalings; -0.0 stays -0.0 as code 0x80 does); then times the scale.
 * A NaN lane stays NaN through all of it. */
static void act_quant_fp8_pow2_neon(const float *x, size_t n, size_t block, float *deq)
{
    if (block == 0 || block % 4) {
        dsattn_act_quant_fp8_pow2_ref(x, n, block, deq);
        return;
    }
    const float inv448 = (float)(1.0 / 448.0);
    const uint32x4_t half = vdupq_n_u32(0x7ffff), one = vdupq_n_u32(1), keep = vdupq_n_u32(0xfff00000u);
    const float32x4_t lo = vdupq_n_f32(-448.0f), hi = vdupq_n_f32(448.0f), sub = vdupq_n_f32(0x1p-6f);
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        float32x4_t m = vdupq_n_f32(0.0f);
        for (size_t i = 0; i < block; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(xb + i)));   /* NaN sticks */
        const float s = dsattn_pow2_ceil(fmaxf(vmaxvq_f32(m), 1e-4f) * inv448);
        const float32x4_t sv = vdupq_n_f32(s);
        for (size_t i = 0; i < block; i += 4) {
            const float32x4_t y = vmaxq_f32(vminq_f32(vdivq_f32(vld1q_f32(xb + i), sv), hi), lo);
            const uint32x4_t u = vreinterpretq_u32_f32(y);
            const uint32x4_t rn = vandq_u32(vaddq_u32(u, vaddq_u32(half, vandq_u32(vshrq_n_u32(u, 20), one))), keep);
            const float32x4_t small = vmulq_n_f32(vrndnq_f32(vmulq_n_f32(y, 512.0f)), 0x1p-9f);
            const float32x4_t q = vbslq_f32(vcaltq_f32(y, sub), small, vreinterpretq_f32_u32(rn));
            vst1q_f32(deq + b * block + i, vmulq_f32(q, sv));
        }
    }
}

/* ==== The table ========================================================= */

static const dsattn_kernels kernels_neon = {
    .name                 = "neon",
    .gemv_f32             = gemv_f32_neon,
    .gemv_bf16            = gemv_bf16_neon,
    .gemv_bf16_m          = gemv_bf16_m_neon,
    .gemv_fp8             = gemv_fp8_neon,
    .gemv_fp8_finite      = gemv_fp8_finite_neon,
    .gemv_fp8_m           = fp8_gemv_m,
    .act_quant_fp8_pow2   = act_quant_fp8_pow2_neon,
    .gemv_fp4             = gemv_fp4_neon,
    .dot_f32              = dot_f32_neon,
    .mdot_f32             = mdot_f32_neon,
    .maxpy_f32            = maxpy_f32_neon,
    ROWS_TABLE_ENTRIES(mdot_fp4e4m3_rows_each, maxpy_fp4e4m3_rows_each),
    .cvt_bf16_f32         = cvt_bf16_f32_neon,
    .mdot_bf16_rows       = mdot_bf16_rows_neon,
};

const dsattn_kernels *const dsattn_kernels_neon_ptr = &kernels_neon;
