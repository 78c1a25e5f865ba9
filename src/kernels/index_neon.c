/* index_neon.c - the NEON forms of the `index` slot (aarch64 builds): the
 * lightning-indexer score over FP4 index keys with exact integer byte dot
 * products, the same bits as the scalar reference and the x86 forms
 * (index_vnni_avx512.c says why the integer sums are exact).  Two forms,
 * which differ only in how a key's 32-dim block sums are formed:
 *  - "neon" (ARMv8.0 Advanced SIMD): from a copy of the query layout with
 *    each head's int8 half-units in dim order (16 KB at most), per block
 *    and head the 32 byte products by SMULL / SMLAL(2) into 8 int16 lanes
 *    (each at most 4 x 12 x 12 = 576 in magnitude), four heads' lanes
 *    folded by pairwise adds (at most 2304) and widened to their four int32
 *    block sums;
 *  - "neon-dot" (the ARMv8.2 dot product, SDOT: Neoverse N1 / V1 / V2,
 *    Apple M1 on, Cortex-A76 on; chosen where the kernel reports
 *    HWCAP_ASIMDDP): straight from the shared layout ([dh/4][64 heads][4]
 *    bytes, the VNNI form's), four heads' block sums by 8 SDOTs a block,
 *    each adding the 4-byte dot of a head's group with the key's group
 *    selected by lane (at most 32 x 144 = 4608: exact), half the
 *    instructions of the SMULL form and no copy of the query.
 * Both: the key's codes to signed half-units (-12..12) by one TBL per 16
 * codes (no bias: both multiply signed by signed, unlike vpdpbusd), then,
 * four heads a step in float64x2 / float32x4 lanes, the double scaling of
 * the other forms (index_avx2.c, score_rows4), which gives the reference's
 * bits for every key: per head dot = fp32 of the block sums times
 * u_bh * s_kb fused-added in double in block order (s_kb = 2^(e - 128)
 * from the key's UE8M0 byte e, the other forms' key_scaled); then the head
 * weighting bf16(dot) -> relu -> bf16(* w) summed in double in 8 lanes
 * (head h in lane h % 8), the lanes reduced as the x86 forms reduce them,
 * rounded to fp32, then to bf16.  No fp32 shortcut for the keys that would
 * allow it: the double form is exact for all.  Equal block sums make equal
 * scores, so the two forms give the same bits (test_formats checks both
 * against the reference; scripts/test-arm64.sh runs that suite once more
 * as a CPU without SDOT, which must then take "neon").
 *
 * Limits: the shared prepare's (nh a multiple of 16 up to 64, dh a multiple
 * of 32 up to 256).  Compiled for aarch64 only (CMakeLists.txt); absent.c
 * holds the NULL pointers of other builds.  Speed: not measured (no ARM
 * machine here); the forms are checked for bits under qemu-aarch64.
 */
#include "index_vnni.h"

#include "numfmt.h"
#include "simd_neon.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

int dsattn_index_neon_ok(size_t nh, size_t dh)
{
    return nh % 16 == 0 && nh >= 16 && nh <= 64 && dh % 32 == 0 && dh >= 32 && dh <= 256;
}

/* E2M1 code -> 2 * value: the keys' signed half-units */
static const int8_t k_half[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* 2^(e - 128) as a double (the x86 forms' key_scaled: no NaN for e = 255) */
static double key_scaled(uint8_t e)
{
    const uint64_t b = ((uint64_t)e + 1023 - 128) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

#define AI static inline __attribute__((always_inline))

/* Four heads' block sums over one 32-dim block: k0/k1 the key's 32
 * half-units, q the first head's 32 bytes, the next heads dh bytes apart. */
AI int32x4_t block4(int8x16_t k0, int8x16_t k1, const int8_t *q, size_t dh)
{
    int16x8_t s[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const int8x16_t a0 = vld1q_s8(q + (size_t)i * dh), a1 = vld1q_s8(q + (size_t)i * dh + 16);
        int16x8_t t = vmull_s8(vget_low_s8(k0), vget_low_s8(a0));
        t = vmlal_high_s8(t, k0, a0);
        t = vmlal_s8(t, vget_low_s8(k1), vget_low_s8(a1));
        s[i] = vmlal_high_s8(t, k1, a1);
    }
    /* [s0 s1] pairs, [s2 s3] pairs, then two lanes a head, widened */
    const int16x8_t u = vpaddq_s16(vpaddq_s16(s[0], s[1]), vpaddq_s16(s[2], s[3]));
    return vpaddlq_s16(u);
}

/* The same four block sums by SDOT: q the shared layout at the block's
 * first group and the first head (group g, dims 4g..4g+3 of the block, of
 * heads h..h+3 is the 16 bytes at q + 256 g); lane g % 4 of k0 / k1 is the
 * key's group g.  Two chains, added at the end (integers: exact). */
__attribute__((target("arch=armv8.2-a+dotprod"))) AI int32x4_t block4_dot(int8x16_t k0, int8x16_t k1,
                                                            const int8_t *q)
{
    int32x4_t a = vdupq_n_s32(0), c = vdupq_n_s32(0);
    a = vdotq_laneq_s32(a, vld1q_s8(q), k0, 0);
    c = vdotq_laneq_s32(c, vld1q_s8(q + 256), k0, 1);
    a = vdotq_laneq_s32(a, vld1q_s8(q + 512), k0, 2);
    c = vdotq_laneq_s32(c, vld1q_s8(q + 768), k0, 3);
    a = vdotq_laneq_s32(a, vld1q_s8(q + 1024), k1, 0);
    c = vdotq_laneq_s32(c, vld1q_s8(q + 1280), k1, 1);
    a = vdotq_laneq_s32(a, vld1q_s8(q + 1536), k1, 2);
    c = vdotq_laneq_s32(c, vld1q_s8(q + 1792), k1, 3);
    return vaddq_s32(a, c);
}

/* Key j of a call (row sel[j], or j0 + j): its row, and its dh codes (the
 * even element in the low nibble) as signed half-units kb[dh] */
AI const uint8_t *key_half_units(const uint8_t *base, size_t row_bytes, const int32_t *sel,
                                 size_t j0, size_t j, size_t dh, int8x16_t lut, int8_t *kb)
{
    const uint8_t *row = base + (sel ? (size_t)sel[j] : j0 + j) * row_bytes;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    for (size_t c = 0; c < dh / 2; c += 16) {
        const uint8x16_t x = vld1q_u8(row + c);
        const uint8x16_t lo = vandq_u8(x, m4), hi = vshrq_n_u8(x, 4);
        vst1q_s8(kb + 2 * c, vqtbl1q_s8(lut, vzip1q_u8(lo, hi)));
        vst1q_s8(kb + 2 * c + 16, vqtbl1q_s8(lut, vzip2q_u8(lo, hi)));
    }
    return row;
}

/* One key's score from its block sums bsum[b * 64 + h] (row: its codes,
 * then its nb UE8M0 scale bytes) */
AI float key_score(const dsattn_index_vnni_q *p, const uint8_t *row, const int32_t *bsum)
{
    const size_t nh = p->nh, dh = p->dh, nb = dh / 32;
    float64x2_t td[32];                              /* heads 2i, 2i + 1 */
    for (size_t b = 0; b < nb; b++) {
        const double ks = key_scaled(row[dh / 2 + b]);
        for (size_t h = 0; h < nh; h += 4) {
            const int32x4_t s = vld1q_s32(bsum + b * 64 + h);
            const float64x2_t s0 = vcvtq_f64_s64(vmovl_s32(vget_low_s32(s)));
            const float64x2_t s1 = vcvtq_f64_s64(vmovl_high_s32(s));
            /* corr * u_q * s_k exact in double, one fused add each */
            const float64x2_t u0 = vmulq_n_f64(vld1q_f64(p->unitd + b * 64 + h), ks);
            const float64x2_t u1 = vmulq_n_f64(vld1q_f64(p->unitd + b * 64 + h + 2), ks);
            const float64x2_t z = vdupq_n_f64(0.0);
            td[h / 2] = vfmaq_f64(b ? td[h / 2] : z, s0, u0);
            td[h / 2 + 1] = vfmaq_f64(b ? td[h / 2 + 1] : z, s1, u1);
        }
    }
    /* the head weighting in the x86 forms' lanes and reduction tree:
     * lane[l] (l = h % 8) in L[l / 2] */
    float64x2_t L[4] = { vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0),
                         vdupq_n_f64(0.0) };
    for (size_t h = 0; h < nh; h += 4) {
        const float32x4_t dot = vcvt_high_f32_f64(vcvt_f32_f64(td[h / 2]), td[h / 2 + 1]);
        const float32x4_t dd = dsattn_rbf16_128n(dot);
        const float32x4_t r = vbslq_f32(vcgtq_f32(dd, vdupq_n_f32(0.0f)), dd,
                                        vdupq_n_f32(0.0f));  /* NaN -> 0 as dd > 0 ? dd : 0 */
        const float32x4_t pr = dsattn_rbf16_128n(vmulq_f32(r, vld1q_f32(p->w + h)));
        const size_t l = h % 8 / 2;
        L[l] = vaddq_f64(L[l], vcvt_f64_f32(vget_low_f32(pr)));
        L[l + 1] = vaddq_f64(L[l + 1], vcvt_high_f64_f32(pr));
    }
    /* t3 = lanes 4-7 + lanes 0-3, t6 = its upper half + its lower */
    const float64x2_t t6 = vaddq_f64(vaddq_f64(L[3], L[1]), vaddq_f64(L[2], L[0]));
    return dsattn_round_bf16((float)(vgetq_lane_f64(t6, 0) + vgetq_lane_f64(t6, 1)));
}

void dsattn_index_neon_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score)
{
    const size_t nh = p->nh, dh = p->dh, nb = dh / 32;
    int8_t qh[64 * 256] __attribute__((aligned(16)));          /* [h][dh] */
    for (size_t d = 0; d < dh; d++)
        for (size_t h = 0; h < nh; h++) qh[h * dh + d] = p->qb[((d / 4) * 64 + h) * 4 + d % 4];
    const int8x16_t lut = vld1q_s8(k_half);
    for (size_t j = 0; j < n; j++) {
        int8_t kb[256] __attribute__((aligned(16)));
        int32_t bsum[8 * 64] __attribute__((aligned(16)));
        const uint8_t *row = key_half_units(base, row_bytes, sel, j0, j, dh, lut, kb);
        for (size_t b = 0; b < nb; b++)
            for (size_t h = 0; h < nh; h += 4)
                vst1q_s32(bsum + b * 64 + h, block4(vld1q_s8(kb + 32 * b),
                                                    vld1q_s8(kb + 32 * b + 16),
                                                    qh + h * dh + 32 * b, dh));
        score[j] = key_score(p, row, bsum);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod")))
void dsattn_index_neon_dot_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                                  size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                                  float *score)
{
    const size_t nh = p->nh, dh = p->dh, nb = dh / 32;
    const int8x16_t lut = vld1q_s8(k_half);
    for (size_t j = 0; j < n; j++) {
        int8_t kb[256] __attribute__((aligned(16)));
        int32_t bsum[8 * 64] __attribute__((aligned(16)));
        const uint8_t *row = key_half_units(base, row_bytes, sel, j0, j, dh, lut, kb);
        for (size_t b = 0; b < nb; b++) {
            const int8x16_t k0 = vld1q_s8(kb + 32 * b), k1 = vld1q_s8(kb + 32 * b + 16);
            for (size_t h = 0; h < nh; h += 4)
                vst1q_s32(bsum + b * 64 + h, block4_dot(k0, k1, p->qb + (b * 8 * 64 + h) * 4));
        }
        score[j] = key_score(p, row, bsum);
    }
}

static const dsattn_index_kern index_neon = {
    "neon", dsattn_index_neon_ok, dsattn_index_q_prepare, dsattn_index_neon_scores,
};
const dsattn_index_kern *const dsattn_index_neon_ptr = &index_neon;

static const dsattn_index_kern index_neon_dot = {
    "neon-dot", dsattn_index_neon_ok, dsattn_index_q_prepare, dsattn_index_neon_dot_scores,
};
const dsattn_index_kern *const dsattn_index_neon_dot_ptr = &index_neon_dot;
