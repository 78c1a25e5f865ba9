/* simd_avx2.h - small AVX2 + FMA + F16C helpers that the AVX2 kernel files
 * inline into their loops (so the values stay in registers): the exp of the softmaxes, 8 bf16 values
 * widened to fp32, the bf16 rounding of 8 lanes, the
 * exact decode of E4M3 codes, horizontal max / sum, first-n lane masks,
 * an 8 x 8 transpose and the 12-row tile store, and the 6 x 16 register
 * tile that the MLA scores and PV, the prefill GEMM and the sparse-attention
 * QK / PV share;
 * and the 8-lane vector words (DSV_F, dsv_fmadd, ...) of the templates
 * written once for both widths (simd_tmpl.h, mla_tile_tmpl.h).
 * Include only from files compiled for AVX2 (names ending _avx2.c, built
 * with -mavx2 -mfma -mf16c and nothing more: they must run on a Haswell).
 *
 * dsattn_exp256 is dsattn_exp512 of simd_avx512.h on 8 lanes, bit for bit:
 * the same range reduction and Cephes polynomial; 2^n (n in [-150, 128]
 * after the clamp) is applied as two exact power-of-two factors 2^(n>>1)
 * and 2^(n - (n>>1)), each a normal number, so the product rounds once -
 * the value vscalefps gives, subnormal results included.  Inputs below
 * -104 give exactly 0 (exp(-inf) = 0), NaN propagates.  dsattn_exp256_ftz,
 * for the attention softmaxes: 0 below 2^-100 (x < -69.3), as
 * dsattn_exp512_ftz. */
#ifndef DSATTN_SIMD_AVX2_H
#define DSATTN_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#define DSATTN_AVX2_AI static inline __attribute__((always_inline))

/* The vector words of simd_tmpl.h (and of the *_tmpl.h kernel templates)
 * on 8 lanes; simd_avx512.h defines the same words on 16. */
#define DSV_F __m256
#define DSV_I __m256i
#define DSV_N 8
#define DSV(name) name##256
#define DSV_AI DSATTN_AVX2_AI
#define dsv_load(p) _mm256_loadu_ps(p)
#define dsv_store(p, v) _mm256_storeu_ps((p), (v))
#define dsv_set1(f) _mm256_set1_ps(f)
#define dsv_zero() _mm256_setzero_ps()
#define dsv_add(a, b) _mm256_add_ps((a), (b))
#define dsv_sub(a, b) _mm256_sub_ps((a), (b))
#define dsv_mul(a, b) _mm256_mul_ps((a), (b))
#define dsv_max(a, b) _mm256_max_ps((a), (b))
#define dsv_fmadd(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define dsv_fnmadd(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define dsv_round(a) _mm256_round_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* lanes where a == b (ordered) take y, the others x */
#define dsv_sel_eq(a, b, x, y) _mm256_blendv_ps((x), (y), _mm256_cmp_ps((a), (b), _CMP_EQ_OQ))
#define dsv_casti(a) _mm256_castps_si256(a)
#define dsv_castf(a) _mm256_castsi256_ps(a)
#define dsv_i_set1(i) _mm256_set1_epi32(i)
#define dsv_i_add(a, b) _mm256_add_epi32((a), (b))
#define dsv_i_and(a, b) _mm256_and_si256((a), (b))
#define dsv_i_srli(a, n) _mm256_srli_epi32((a), (n))
#define dsv_div(a, b) _mm256_div_ps((a), (b))
#define dsv_tr(r) dsattn_tr8_256(r)          /* defined below */
#define dsv_rbf16x(a) dsattn_rbf16x_256(a)   /* defined below */

#include "simd_tmpl.h"

/* exp of lanes already clamped to [lo, 88.72]: the polynomial and 2^n */
DSATTN_AVX2_AI __m256 dsattn_exp256_core(__m256 xc)
{
    __m256 n;
    const __m256 p = dsattn_exp_poly256(xc, &n);
    /* 2^n = 2^n1 * 2^n2, n1 = n >> 1 (floor), both in [-75, 64] */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i b = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, b), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, b), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* exp with every lane below `lo` exactly 0 (clamped there first, so the
 * polynomial and 2^n never see it); NaN propagates */
DSATTN_AVX2_AI __m256 dsattn_exp256_cut(__m256 x, float lo)
{
    const __m256 vlo = _mm256_set1_ps(lo), hi = _mm256_set1_ps(88.72283935546875f);
    const __m256 tiny = _mm256_cmp_ps(x, vlo, _CMP_LT_OQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    /* maxps returns its second operand for a NaN lane: vlo, a finite input */
    __m256 y = dsattn_exp256_core(_mm256_min_ps(_mm256_max_ps(x, vlo), hi));
    y = _mm256_andnot_ps(tiny, y);
    return _mm256_blendv_ps(y, x, nan);
}

DSATTN_AVX2_AI __m256 dsattn_exp256(__m256 x) { return dsattn_exp256_cut(x, -104.0f); }

/* dsattn_exp256 for softmax weights: results below 2^-100 are exactly 0
 * and no lane computes a subnormal (each would be a microcode assist) */
DSATTN_AVX2_AI __m256 dsattn_exp256_ftz(__m256 x) { return dsattn_exp256_cut(x, -69.3f); }

/* dsattn_exp256_ftz for x <= 0 or NaN (x - max in a softmax) with fewer
 * operations, the same bits: no upper clamp, n in [-100, 0] so 2^n is one
 * normal factor; NaN flows through (maxps returns its second operand). */
DSATTN_AVX2_AI __m256 dsattn_exp256_ftz_neg(__m256 x)
{
    const __m256 vlo = _mm256_set1_ps(-69.3f);
    const __m256 tiny = _mm256_cmp_ps(x, vlo, _CMP_LT_OQ);
    __m256 n;
    const __m256 p = dsattn_exp_poly256(_mm256_max_ps(vlo, x), &n);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* 8 bf16 values (16 bytes at p, any alignment) -> fp32, exactly */
DSATTN_AVX2_AI __m256 dsattn_bf16x8_256(const void *p)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

DSATTN_AVX2_AI float dsattn_hmax256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

DSATTN_AVX2_AI float dsattn_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* all-ones in the first n lanes (n <= 8) of 32 bits: maskload / maskstore */
DSATTN_AVX2_AI __m256i dsattn_mask256(size_t n)
{
    static const int32_t src[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    return _mm256_loadu_si256((const __m256i *)(src + 8 - (n > 8 ? 8 : n)));
}

/* 16 E4M3 codes -> their exact fp32 values (NaN codes 0x7f / 0xff -> NaN),
 * elements 0..7 in *v0, 8..15 in *v1: s.eeee.mmm moved into an fp16 as
 * s.0eeee.mmm0000000 is the E4M3 value times 2^-8 (normals and subnormals
 * alike), so vcvtph2ps and an exact * 256 decode it. */
DSATTN_AVX2_AI void dsattn_e4m3x16_256(const uint8_t *w, __m256 *v0, __m256 *v1)
{
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w));
    const __m256i h = _mm256_or_si256(
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)),
                                           _mm256_set1_epi16(0x7f));
    const __m256 k = _mm256_set1_ps(256.0f), qn = _mm256_set1_ps(__builtin_nanf(""));
    const __m256 f0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k);
    const __m256 f1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k);
    const __m256 m0 = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan)));
    const __m256 m1 = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan, 1)));
    *v0 = _mm256_blendv_ps(f0, qn, m0);
    *v1 = _mm256_blendv_ps(f1, qn, m1);
}

/* 16 E4M3 codes without NaN codes -> their values / 256, elements 0..7 in
 * *v0 and 8..15 in *v1: sign and the 7 magnitude bits moved into an fp16
 * ((b << 8) >> 1 arithmetic puts them at 15, 14 and 7..13; clearing bit
 * 14 leaves s.0eeee.mmm0000000), one 16-byte load and one widening.  The
 * callers fold the x256 into their scale (MLA absorption rows), as
 * simd_avx512.h's dsattn_e4m3x32_div256. */
DSATTN_AVX2_AI void dsattn_e4m3x16_div256_256(const uint8_t *w, __m256 *v0, __m256 *v1)
{
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w));
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xbfff));
    *v0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *v1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* dsattn_round_bf16 on 8 lanes, NaN lanes included: RNE, a NaN -> the
 * quiet NaN with its top bits (dsattn_rbf16_256 leaves NaN lanes to the
 * caller) */
DSATTN_AVX2_AI __m256 dsattn_rbf16x_256(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i qn = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)),
                                        _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_blendv_ps(dsattn_rbf16_256(x), _mm256_castsi256_ps(qn),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* r[i] lane j  ->  r[j] lane i */
DSATTN_AVX2_AI void dsattn_tr8_256(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* 12 rows of 8 columns (r[i] = row i) -> 8 columns of a 12-row tile,
 * 12 floats a column (o[c*12 + i] = row i, column c): rows 0..7 as one
 * 8 x 8 transpose, rows 8..11 as two 4 x 4 halves.  r is overwritten. */
DSATTN_AVX2_AI void dsattn_store12x8_256(__m256 r[12], float *o)
{
    dsattn_tr8_256(r);
    const __m256 t0 = _mm256_unpacklo_ps(r[8], r[9]), t1 = _mm256_unpackhi_ps(r[8], r[9]);
    const __m256 t2 = _mm256_unpacklo_ps(r[10], r[11]), t3 = _mm256_unpackhi_ps(r[10], r[11]);
    const __m256 s[4] = { _mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                          _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE) };
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(o + (size_t)c * 12, r[c]);
        _mm_storeu_ps(o + (size_t)c * 12 + 8, _mm256_castps256_ps128(s[c]));
        _mm256_storeu_ps(o + (size_t)(c + 4) * 12, r[c + 4]);
        _mm_storeu_ps(o + (size_t)(c + 4) * 12 + 8, _mm256_extractf128_ps(s[c], 1));
    }
}

/* The 6 x 16 register tile of 8-lane vectors: up to 6 rows of 16 lanes
 * (12 accumulators), a row's 16 lanes read from b, one broadcast of a per
 * row and step.  Its three steps, for rows i < nr (nr <= 6, a constant):
 *   load:  acc[i] = c[i*ldc + 0..15] * alpha[0..15] (an online softmax's
 *          rescale);
 *   fma:   acc[i] += sum_{k<kc} a[k*ak + i*ai] * b[k*ldb + 0..15], each
 *          lane one FMA chain over k in order; pf > 0 prefetches the a of
 *          step k + pf;
 *   store: c[i*ldc + 0..15] = acc[i].
 * The MLA scores and PV (mla_tile_avx2.c), the prefill GEMM (pgemm_avx2.c),
 * the sparse-attention QK / PV (sa_kernels_avx2.c) and the multi-token FP8
 * GEMV from 12 tokens (kernels_avx2.c, gemv_fp8_mt) run on it, each with
 * its operands' strides; a tile that starts from 0 or from c unscaled
 * sets acc itself. */
DSATTN_AVX2_AI void dsattn_acc6x16_load_256(__m256 acc[6][2], const int nr, const float *c,
                                            size_t ldc, const float *alpha)
{
    const __m256 al0 = _mm256_loadu_ps(alpha), al1 = _mm256_loadu_ps(alpha + 8);
#pragma GCC unroll 6
    for (int i = 0; i < nr; i++) {
        acc[i][0] = _mm256_mul_ps(_mm256_loadu_ps(c + (size_t)i * ldc), al0);
        acc[i][1] = _mm256_mul_ps(_mm256_loadu_ps(c + (size_t)i * ldc + 8), al1);
    }
}

DSATTN_AVX2_AI void dsattn_acc6x16_zero_256(__m256 acc[6][2])
{
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
}

DSATTN_AVX2_AI void dsattn_acc6x16_fma_256(__m256 acc[6][2], const int nr, const float *a,
                                           size_t ak, size_t ai, const float *b, size_t ldb,
                                           size_t kc, const size_t pf)
{
    for (size_t k = 0; k < kc; k++) {
        if (pf) _mm_prefetch((const char *)(a + (k + pf) * ak), _MM_HINT_T0);
        const __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
#pragma GCC unroll 6
        for (int i = 0; i < nr; i++) {
            const __m256 av = _mm256_broadcast_ss(a + k * ak + (size_t)i * ai);
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
    }
}

DSATTN_AVX2_AI void dsattn_acc6x16_store_256(__m256 acc[6][2], const int nr, float *c,
                                             size_t ldc)
{
#pragma GCC unroll 6
    for (int i = 0; i < nr; i++) {
        _mm256_storeu_ps(c + (size_t)i * ldc, acc[i][0]);
        _mm256_storeu_ps(c + (size_t)i * ldc + 8, acc[i][1]);
    }
}

/* The whole tile over a packed [kc][12] operand (rows 0..5 of a 12-row
 * tile; the 8-lane half of simd_avx512.h's dsattn_tile12):
 *   c[r*ldc + j] = (first ? 0 : c[r*ldc + j]) + sum_{k<kc} a[k*12 + r] * b[k*ldb + j] */
DSATTN_AVX2_AI void dsattn_tile6x16_256(const float *a, const float *b, size_t ldb, size_t kc,
                                        float *c, size_t ldc, int first)
{
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        acc[i][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)i * ldc);
        acc[i][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)i * ldc + 8);
    }
    dsattn_acc6x16_fma_256(acc, 6, a, 12, 1, b, ldb, kc, 0);
    dsattn_acc6x16_store_256(acc, 6, c, ldc);
}

/* The 6 x 16 tile in the templates' words: the loops around it are
 * written once for AVX2 and NEON (mla_tile_tmpl.h, sa_tmpl.h,
 * pgemm_tmpl.h, under DSV_TILE6X16) */
#define DSV_TILE6X16 1
#define DSV_ACC6X16(a) __m256 a[6][2]
#define dsv_acc6x16_zero dsattn_acc6x16_zero_256
#define dsv_acc6x16_load dsattn_acc6x16_load_256
#define dsv_acc6x16_fma dsattn_acc6x16_fma_256
#define dsv_acc6x16_store dsattn_acc6x16_store_256
#define dsv_tile6x16 dsattn_tile6x16_256
#define dsv_store12cols dsattn_store12x8_256

#endif /* DSATTN_SIMD_AVX2_H */
