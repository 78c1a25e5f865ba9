/* pgemm_avx512.c - the AVX-512 table of pgemm.h (F/BW/VL/DQ only).
 *
 * The tile is simd_avx512.h's dsattn_tile12, the MLA score tile: 12 rows
 * x 32 tokens in 24 accumulators; per k it loads the two token vectors of
 * the packed activations and broadcasts the 12 row values of the weight
 * tile, 24 FMAs per 14 loads.  Each lane is one FMA chain over k, the `ref`
 * tile's order.  pack_b and tile_fp8 (pgemm_tmpl.h, shared with the AVX2
 * table) transpose 16 x 16 blocks in registers.
 */
#include "pgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx512.h"

#define MR DSATTN_PGEMM_MR
#define NR DSATTN_PGEMM_NR
#define AI static inline __attribute__((always_inline))

static void pack_b_avx512(const float *x, size_t ldx, size_t nt, size_t K, float *bp)
{
    for (size_t t0 = 0; t0 < NR; t0 += 16) {
        size_t k0 = 0;
        for (; k0 < K; k0 += 16) {
            const __mmask16 m = K - k0 >= 16 ? 0xffff : (__mmask16)((1u << (K - k0)) - 1u);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = t0 + (size_t)i < nt ? _mm512_maskz_loadu_ps(m, x + (t0 + (size_t)i) * ldx + k0)
                                           : _mm512_setzero_ps();
            dsattn_tr16(r);
            for (size_t c = 0; c < 16 && k0 + c < K; c++)
                _mm512_storeu_ps(bp + (k0 + c) * NR + t0, r[c]);
        }
    }
}

static void tile_avx512(const float *a, const float *b, size_t kc, int nw, float *c,
                        size_t ldc, int first)
{
    if (nw > 16) dsattn_tile12(a, b, NR, kc, c, ldc, first, 2);
    else dsattn_tile12(a, b, NR, kc, c, ldc, first, 1);
}

/* 16 codes of a finite row: E4M3 s.eeee.mmm moved to fp16 s.0eeee.mmm0000000
 * ((b << 8) >> 1 arithmetic, then bit 14 cleared) is 2^-8 times its value;
 * the caller's scale carries the x256.  NaN codes would decode as finite
 * numbers, hence only for weights without them. */
AI __m512 e4m3x16_div256(const uint8_t *w)
{
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w));
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(h);
}

/* The 16 columns of the 12 rows: one 16 x 16 transpose (rows 12..15
 * zero), 12 floats a column stored */
AI void store_cols16(__m512 r[16], float *a)
{
#pragma GCC unroll 4
    for (int i = MR; i < 16; i++) r[i] = _mm512_setzero_ps();
    dsattn_tr16(r);
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(a + (size_t)c * MR, 0x0fff, r[c]);
}

#define PG_RN 16
#define pg_e4m3_div256 e4m3x16_div256
#define pg_e4m3_exact dsattn_e4m3x16
#define pg_store_cols store_cols16
#include "pgemm_tmpl.h"

static const dsattn_pgemm_kern pgemm_avx512 = {"avx512", pack_b_avx512, tile_avx512,
                                               tile_fp8};
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = &pgemm_avx512;

#else
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = 0;
#endif
