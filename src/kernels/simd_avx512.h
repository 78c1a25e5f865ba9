/* simd_avx512.h - small AVX-512 helpers that several kernel files inline
 * into their tile loops (so the values stay in registers): the exp of the
 * softmaxes, the bf16 rounding of 16 lanes, a 16 x 16 transpose, eight
 * accumulators summed into one __m256, the
 * exact decode of 16 E4M3 codes, and the 12-row register tile that the MLA
 * scores and the prefill GEMM share; and the 16-lane vector words (DSV_F,
 * dsv_fmadd, ...) of the templates written once for both widths
 * (simd_tmpl.h, mla_tile_tmpl.h).
 * Include only from files compiled for AVX-512 (names ending _avx512.c).
 *
 * dsattn_exp512: exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split in a
 * high and a low part so r is exact to ~2^-30), exp(r) by the Cephes
 * minimax polynomial on [-ln2/2, ln2/2] (within 2 ulp of expf), 2^n applied
 * with vscalefps (which also produces subnormals).  Inputs below -104 give
 * exactly 0 (exp(-inf) = 0, as the softmax masks need); NaN propagates.
 * dsattn_exp512_ftz, for the attention softmaxes: 0 below 2^-100, no
 * subnormal ever computed. */
#ifndef DSATTN_SIMD_AVX512_H
#define DSATTN_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The vector words of simd_tmpl.h (and of the *_tmpl.h kernel templates)
 * on 16 lanes; simd_avx2.h defines the same words on 8. */
#define DSV_F __m512
#define DSV_I __m512i
#define DSV_N 16
#define DSV(name) name##512
#define DSV_AI static inline __attribute__((always_inline))
#define dsv_load(p) _mm512_loadu_ps(p)
#define dsv_store(p, v) _mm512_storeu_ps((p), (v))
#define dsv_set1(f) _mm512_set1_ps(f)
#define dsv_zero() _mm512_setzero_ps()
#define dsv_add(a, b) _mm512_add_ps((a), (b))
#define dsv_sub(a, b) _mm512_sub_ps((a), (b))
#define dsv_mul(a, b) _mm512_mul_ps((a), (b))
#define dsv_max(a, b) _mm512_max_ps((a), (b))
#define dsv_fmadd(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define dsv_fnmadd(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
#define dsv_round(a) _mm512_roundscale_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* lanes where a == b (ordered) take y, the others x */
#define dsv_sel_eq(a, b, x, y) _mm512_mask_mov_ps((x), _mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ), (y))
#define dsv_casti(a) _mm512_castps_si512(a)
#define dsv_castf(a) _mm512_castsi512_ps(a)
#define dsv_i_set1(i) _mm512_set1_epi32(i)
#define dsv_i_add(a, b) _mm512_add_epi32((a), (b))
#define dsv_i_and(a, b) _mm512_and_si512((a), (b))
#define dsv_i_srli(a, n) _mm512_srli_epi32((a), (n))
#define dsv_div(a, b) _mm512_div_ps((a), (b))
#define dsv_tr(r) dsattn_tr16(r)             /* defined below */
#define dsv_rbf16x(a) dsattn_rbf16(a)        /* defined below */

#include "simd_tmpl.h"

/* Eight accumulators -> their eight sums in one __m256 (transpose-reduce:
 * about three shuffles/adds per head instead of eight). */
static inline __attribute__((always_inline)) __m256 dsattn_hsum8(const __m512 *a)
{
    __m512 t[4];
    for (int p = 0; p < 4; p++) {
        __m512 lo = _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44);
        __m512 hi = _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE);
        t[p] = _mm512_add_ps(lo, hi);           /* [a(2p) 8 | a(2p+1) 8] */
    }
    __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88),
                              _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
    __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88),
                              _mm512_shuffle_f32x4(t[2], t[3], 0xDD));
    /* u0: 128-bit lane L holds 4 partials of head L; u1 of head 4+L */
    __m512 v = _mm512_add_ps(_mm512_unpacklo_ps(u0, u1), _mm512_unpackhi_ps(u0, u1));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    /* lane L: [head L, head 4+L, ...] */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
                                          0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, v));
}

/* exp of lanes already clamped to [lo, 88.72]: the polynomial and 2^n */
static inline __attribute__((always_inline)) __m512 dsattn_exp512_core(__m512 xc)
{
    __m512 n;
    const __m512 p = dsattn_exp_poly512(xc, &n);
    return _mm512_scalef_ps(p, n);
}

/* exp with every lane below `lo` exactly 0 (clamped there first, so the
 * polynomial and 2^n never see it); NaN propagates */
static inline __attribute__((always_inline)) __m512 dsattn_exp512_cut(__m512 x, float lo)
{
    const __m512 vlo = _mm512_set1_ps(lo), hi = _mm512_set1_ps(88.72283935546875f);
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, vlo, _CMP_LT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 y = dsattn_exp512_core(_mm512_min_ps(_mm512_max_ps(x, vlo), hi));
    y = _mm512_mask_mov_ps(y, tiny, _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, nan, x);
}

static inline __attribute__((always_inline)) __m512 dsattn_exp512(__m512 x)
{
    return dsattn_exp512_cut(x, -104.0f);
}

/* dsattn_exp512 for softmax weights: results below 2^-100 (x < -69.3)
 * are exactly 0, and no lane ever computes a subnormal.  Such a weight is
 * 2^-100 or less of the row's largest (which is 1), far below what a bf16
 * output resolves; but dsattn_exp512 makes a subnormal (or, below -104,
 * an underflowing 2^n it then discards) for every lane under -87.3, and
 * each is a microcode assist.  A decode over a synthetic or peaked cache
 * has thousands per call: bench v41 @4K, 2 threads, attention phase 20-24
 * ms before, about 14 ms after - what the CPU's flush-to-zero mode gives. */
static inline __attribute__((always_inline)) __m512 dsattn_exp512_ftz(__m512 x)
{
    return dsattn_exp512_cut(x, -69.3f);
}

/* dsattn_round_bf16 on 16 lanes: RNE, NaN -> quiet NaN with the top bits */
static inline __attribute__((always_inline)) __m512 dsattn_rbf16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_and_si512(r, hi);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i qn = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, qn));
}

/* d[i] = the even 128-bit lanes of s[i] then of s[j], d[j] the odd ones */
static inline __attribute__((always_inline)) void dsattn_tr16_lanes(__m512 *d, const __m512 *s,
                                                                    int i, int j)
{
    d[i] = _mm512_shuffle_f32x4(s[i], s[j], 0x88);
    d[j] = _mm512_shuffle_f32x4(s[i], s[j], 0xdd);
}

/* r[i] = row i (16 columns) -> r[c] = column c (16 rows) */
static inline __attribute__((always_inline)) void dsattn_tr16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* the 128-bit lanes: rows k, 4+k and 8+k, 12+k, then k, 8+k and 4+k, 12+k */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        dsattn_tr16_lanes(t, r, k, 4 + k);
        dsattn_tr16_lanes(t, r, 8 + k, 12 + k);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        dsattn_tr16_lanes(r, t, k, 8 + k);
        dsattn_tr16_lanes(r, t, 4 + k, 12 + k);
    }
}

/* 16 E4M3 codes -> their exact fp32 values (NaN codes -> NaN) */
static inline __attribute__((always_inline)) __m512 dsattn_e4m3x16(const uint8_t *w)
{
    const __m128i b8 = _mm_loadu_si128((const __m128i *)w);
    const __m256i b = _mm256_cvtepu8_epi16(b8);
    const __m256i h = _mm256_or_si256(
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b8, _mm_set1_epi8(0x7f)),
                                              _mm_set1_epi8(0x7f));
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(__builtin_nanf("")));
}

/* 32 E4M3 codes without NaN codes -> their values / 256, elements 0..15
 * in *v0 and 16..31 in *v1: sign and the 7 magnitude bits moved into an
 * fp16 (s.0eeee.mmm0000000 is the E4M3 value times 2^-8, subnormals
 * included), one 32-byte load and one widening for 32 codes.  The callers
 * fold the x256 into their scale (MLA absorption rows, AMX row decode). */
static inline __attribute__((always_inline)) void dsattn_e4m3x32_div256(const uint8_t *w,
                                                                      __m512 *v0, __m512 *v1)
{
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)w));
    const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(b, 8), 1),
                                       _mm512_set1_epi16((short)0xbfff));
    *v0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *v1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* Two fp32 vectors whose values are bf16 numbers -> their 32 bf16 bits in
 * order (the high 16-bit word of each lane: no rounding happens). */
static inline __attribute__((always_inline)) __m512i dsattn_bf16_hi32(__m512 a, __m512 b)
{
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                         35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9,
                                         7, 5, 3, 1);
    return _mm512_permutex2var_epi16(_mm512_castps_si512(a), odd, _mm512_castps_si512(b));
}

/* The rows of a 12-row register form (rows r < R of NV head vectors of 16,
 * a[r][1] unused when NV == 1) stored to c + r*ldc; with the P.V forms'
 * load (mla_tile_avx512.c, sa_kernels_avx512.c): the accumulator rows
 * read from acct (hp floats apart) times the softmax rescale alpha. */
static inline __attribute__((always_inline)) void dsattn_rows_store512(__m512 a[][2], float *c,
                                                                       size_t ldc, int R,
                                                                       const int NV)
{
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(c + (size_t)r * ldc, a[r][0]);
        if (NV > 1) _mm512_storeu_ps(c + (size_t)r * ldc + 16, a[r][1]);
    }
}

static inline __attribute__((always_inline)) void dsattn_pv_load512(__m512 a[][2],
                                                                    const float *acct, size_t hp,
                                                                    const float *alpha, int RC,
                                                                    const int NV)
{
    const __m512 al0 = _mm512_loadu_ps(alpha), al1 = NV > 1 ? _mm512_loadu_ps(alpha + 16) : al0;
#pragma GCC unroll 12
    for (int r = 0; r < RC; r++) {
        a[r][0] = _mm512_mul_ps(_mm512_loadu_ps(acct + (size_t)r * hp), al0);
        a[r][1] = NV > 1 ? _mm512_mul_ps(_mm512_loadu_ps(acct + (size_t)r * hp + 16), al1) : al1;
    }
}

/* The column tiles of those P.V forms: 12 columns while 12 are left, then
 * 4, then 1, each with nv (2 or 1) head vectors; TILE(RC, NV) runs one
 * (constants after inlining), n is set to the columns it covers. */
#define DSATTN_PV_COLS_12_4_1(n, left, nv, TILE)                                         \
    do {                                                                                 \
        const int pv_rc_ = (left) >= 12 ? 12 : (left) >= 4 ? 4 : 1;                       \
        (n) = (size_t)pv_rc_;                                                            \
        if (pv_rc_ == 12) { if ((nv) == 2) TILE(12, 2); else TILE(12, 1); }              \
        else if (pv_rc_ == 4) { if ((nv) == 2) TILE(4, 2); else TILE(4, 1); }            \
        else { if ((nv) == 2) TILE(1, 2); else TILE(1, 1); }                             \
    } while (0)

/* The 12-row register tile (MLA scores, prefill GEMM):
 *   c[r*ldc + 16v + j] = (first ? 0 : c[r*ldc + 16v + j])
 *                        + sum_{k<kc} a[k*12 + r] * b[k*ldb + 16v + j]
 * for r < 12, v < NV (1 or 2), j < 16: 12 x NV accumulators, per k NV
 * vector loads of b and 12 broadcasts of a (one pointer, constant
 * displacements), each lane one FMA chain over k in order. */
static inline __attribute__((always_inline)) void dsattn_tile12(const float *a, const float *b,
                                                                size_t ldb, size_t kc, float *c,
                                                                size_t ldc, int first, const int NV)
{
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (size_t)r * ldc);
        acc[r][1] = first || NV < 2 ? _mm512_setzero_ps()
                                    : _mm512_loadu_ps(c + (size_t)r * ldc + 16);
    }
    for (size_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * ldb);
        const __m512 b1 = NV > 1 ? _mm512_loadu_ps(b + k * ldb + 16) : b0;
        const float *ak = a + k * 12;
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) {
            const __m512 av = _mm512_set1_ps(ak[r]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            if (NV > 1) acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    dsattn_rows_store512(acc, c, ldc, 12, NV);
}

#endif /* DSATTN_SIMD_AVX512_H */
