/* pgemm_avx2.c - the AVX2 + FMA + F16C table of pgemm.h.
 *
 * Sixteen 8-wide registers cannot hold the 12 x 32 tile of the AVX-512
 * form (48 accumulators), so the tile call runs it as sub-tiles over the
 * same packed operands: 6 rows x 16 tokens (12 accumulators, per k two
 * token loads and six row broadcasts: 12 FMAs per 8 loads) for each full
 * 16 tokens, and 12 rows x 8 tokens (12 accumulators, 12 FMAs per 13
 * loads) for a last 8.  Only the loop order over outputs changes: each
 * output is still one FMA chain over k in increasing order, the `ref`
 * tile's, so the two are equal bit for bit (tests/test_pgemm.c).
 * pack_b and tile_fp8 transpose 8 x 8 blocks in registers; tile_fp8
 * decodes E4M3 by the fp16 bit move of kernels_avx2.c (value / 256, the
 * x256 folded into the block scale) for finite weights, times 256 with
 * the NaN codes blended in otherwise (no gather: QEMU 7.2's AVX2 gather,
 * which scripts/test-avx2-emu.sh runs, dropped lanes here).
 */
#include "pgemm.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "numfmt.h"

#define MR DSATTN_PGEMM_MR
#define NR DSATTN_PGEMM_NR
#define AI static inline __attribute__((always_inline))

/* r[i] lane j  ->  r[j] lane i */
AI void tr8(__m256 r[8])
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

static void pack_b_avx2(const float *x, size_t ldx, size_t nt, size_t K, float *bp)
{
    static const int32_t ones[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    for (size_t t0 = 0; t0 < NR; t0 += 8)
        for (size_t k0 = 0; k0 < K; k0 += 8) {
            const size_t kn = K - k0 >= 8 ? 8 : K - k0;
            const __m256i m = _mm256_loadu_si256((const __m256i *)(ones + 8 - kn));
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = t0 + (size_t)i < nt
                           ? _mm256_maskload_ps(x + (t0 + (size_t)i) * ldx + k0, m)
                           : _mm256_setzero_ps();
            tr8(r);
            for (size_t c = 0; c < kn; c++) _mm256_storeu_ps(bp + (k0 + c) * NR + t0, r[c]);
        }
}

/* rows 0..5 of a (a already offset to the first row) x tokens 0..15 of b */
AI void sub6x16(const float *a, const float *b, size_t kc, float *c, size_t ldc, int first)
{
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        acc[i][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)i * ldc);
        acc[i][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)i * ldc + 8);
    }
    for (size_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + k * MR + (size_t)i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        _mm256_storeu_ps(c + (size_t)i * ldc, acc[i][0]);
        _mm256_storeu_ps(c + (size_t)i * ldc + 8, acc[i][1]);
    }
}

/* rows 0..11 x tokens 0..7 of b */
AI void sub12x8(const float *a, const float *b, size_t kc, float *c, size_t ldc, int first)
{
    __m256 acc[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
        acc[i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)i * ldc);
    for (size_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + k * MR + (size_t)i), b0, acc[i]);
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(c + (size_t)i * ldc, acc[i]);
}

static void tile_avx2(const float *a, const float *b, size_t kc, int nw, float *c, size_t ldc,
                      int first)
{
    int j = 0;
    for (; j + 16 <= nw; j += 16) {
        sub6x16(a, b + j, kc, c + j, ldc, first);
        sub6x16(a + 6, b + j, kc, c + 6 * ldc + j, ldc, first);
    }
    if (j < nw) sub12x8(a, b + j, kc, c + j, ldc, first);   /* nw % 16 == 8 */
}

/* 8 codes of a finite row: E4M3 s.eeee.mmm moved to fp16 s.0eeee.mmm0000000
 * is 2^-8 times its value (pgemm_avx512.c); the caller's scale carries the
 * x256. */
AI __m256 e4m3x8_div256(const uint8_t *w)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)w));
    const __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(b, 8), 1),
                                    _mm_set1_epi16((short)0xBF80));
    return _mm256_cvtph_ps(h);
}

/* 8 codes, any: the fp16 move times 256 (exact), and the scalar decode's
 * NaN (its sign from the code) where the code is s.1111.111 */
AI __m256 e4m3x8_exact(const uint8_t *w)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)w));
    const __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(b, 8), 1),
                                    _mm_set1_epi16((short)0xBF80));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m128i n16 = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)),
                                        _mm_set1_epi16(0x7f));
    const __m256 nan = _mm256_or_ps(_mm256_set1_ps(dsattn_e4m3_lut[0x7f]),
                                    _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
    return _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(n16)));
}

/* 8 columns of the 12 rows at a time: decode, scale, transpose (rows 0..7
 * as one 8 x 8 block, rows 8..11 as two 4 x 4 halves).  cheap: see
 * pgemm_avx512.c - (e / 256) * (256 s) is e * s rounded once. */
AI void tile_fp8_impl(const uint8_t *w, size_t K, const float *const *sc, size_t bs, size_t nr,
                      float *a, const int cheap)
{
    size_t blk = 0, left = bs;              /* scale block of column d, columns left in it */
    for (size_t d = 0; d < K; d += 8) {
        __m256 r[MR];
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            const uint8_t *wi = w + (size_t)i * K + d;
            if ((size_t)i >= nr) r[i] = _mm256_setzero_ps();
            else if (cheap) r[i] = _mm256_mul_ps(e4m3x8_div256(wi), _mm256_set1_ps(256.0f * sc[i][blk]));
            else r[i] = _mm256_mul_ps(e4m3x8_exact(wi), _mm256_set1_ps(sc[i][blk]));
        }
        if ((left -= 8) == 0) { blk++; left = bs; }
        tr8(r);
        const __m256 t0 = _mm256_unpacklo_ps(r[8], r[9]), t1 = _mm256_unpackhi_ps(r[8], r[9]);
        const __m256 t2 = _mm256_unpacklo_ps(r[10], r[11]), t3 = _mm256_unpackhi_ps(r[10], r[11]);
        const __m256 s[4] = { _mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                              _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE) };
        float *o = a + d * MR;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm256_storeu_ps(o + (size_t)c * MR, r[c]);
            _mm_storeu_ps(o + (size_t)c * MR + 8, _mm256_castps256_ps128(s[c]));
            _mm256_storeu_ps(o + (size_t)(c + 4) * MR, r[c + 4]);
            _mm_storeu_ps(o + (size_t)(c + 4) * MR + 8, _mm256_extractf128_ps(s[c], 1));
        }
    }
}

static void tile_fp8_avx2(const uint8_t *w, size_t K, const float *const *sc, size_t bs,
                          size_t nr, int finite, float *a)
{
    int cheap = finite;
    for (size_t r = 0; r < nr && cheap; r++) {
        if (r > 0 && sc[r] == sc[r - 1]) continue;      /* rows of one scale block */
        for (size_t b = 0; b < (K + bs - 1) / bs && cheap; b++)
            cheap = !__builtin_isinf(256.0f * sc[r][b]) || __builtin_isinf(sc[r][b]);
    }
    if (cheap) tile_fp8_impl(w, K, sc, bs, nr, a, 1);
    else tile_fp8_impl(w, K, sc, bs, nr, a, 0);
}

static const dsattn_pgemm_kern pgemm_avx2 = {"avx2", pack_b_avx2, tile_avx2, tile_fp8_avx2};
const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr = &pgemm_avx2;

#else
const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr = 0;
#endif
