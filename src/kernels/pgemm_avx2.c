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
 * pack_b (here) and tile_fp8 (pgemm_tmpl.h, shared with the AVX-512 table)
 * transpose 8 x 8 blocks in registers; tile_fp8 decodes E4M3 by the fp16
 * bit move of kernels_avx2.c (value / 256, the x256 folded into the block
 * scale) for finite weights, times 256 with the NaN codes blended in
 * otherwise (no gather: QEMU 7.2's AVX2 gather, which
 * scripts/test-avx2-emu.sh runs, dropped lanes here).
 */
#include "pgemm.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "numfmt.h"
#include "simd_avx2.h"

#define MR DSATTN_PGEMM_MR
#define NR DSATTN_PGEMM_NR
#define AI static inline __attribute__((always_inline))

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
            dsattn_tr8_256(r);
            for (size_t c = 0; c < kn; c++) _mm256_storeu_ps(bp + (k0 + c) * NR + t0, r[c]);
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

/* The 8 columns of the 12 rows: rows 0..7 as one 8 x 8 transpose, rows
 * 8..11 as two 4 x 4 halves */
#define PG_RN MR
#define pg_e4m3_div256 e4m3x8_div256
#define pg_e4m3_exact e4m3x8_exact
#define pg_sub12x8 sub12x8
#define pg_store_cols dsattn_store12x8_256
#include "pgemm_tmpl.h"

static const dsattn_pgemm_kern pgemm_avx2 = {
    .name = "avx2", .pack_b = pack_b_avx2, .tile = pg_tile, .tile_fp8 = tile_fp8};
const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr = &pgemm_avx2;

#else
const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr = 0;
#endif
