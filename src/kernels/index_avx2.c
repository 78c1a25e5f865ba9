/* index_avx2.c - the AVX2 form of the `index` slot: the lightning-indexer
 * score over FP4 index keys with AVX2 integer dot products, the same bits
 * as the AVX-512 VNNI form (index_vnni_avx512.c) and the scalar reference.
 *
 * The query layout is the shared one (index_prep.c): int8 half-units, for
 * each group of 4 dims 8 heads x 4 bytes per ymm, keys decoded to biased
 * half-units k + 12 (0..24), and the block sum started at -12 * sum(q).
 * AVX2 has no vpdpbusd; its two steps are vpmaddubsw (unsigned key bytes x
 * signed query bytes, adjacent pairs summed into int16 with saturation)
 * and vpmaddwd against ones (int16 pairs into int32).  Nothing saturates:
 * a key byte is at most 24 and a query byte at most 12 in magnitude, so a
 * pair sum is at most 2 * 24 * 12 = 576 in magnitude, and the int16 lanes
 * add the pair sums of a whole 32-dim block (8 groups) before widening:
 * at most 8 * 576 = 4608 < 32767.  The int32 block sum is then exactly
 * the vpdpbusd one, and the scaling (fp32 where dsattn_index_key_fits_f32
 * allows it, double otherwise) and the head weighting repeat the VNNI
 * form's operations in its order, 8 lanes at a time - the double head sum
 * in the same lanes and the same reduction tree - so the scores are the
 * same bits.
 *
 * The key loop around score_rows is the VNNI form's, index_scores_tmpl.h.
 *
 * Limits: the VNNI form's (nh a multiple of 16 up to 64, dh a multiple of
 * 32 up to 256); callers check dsattn_index_avx2_ok() and fall back to the
 * reference.  Built with -mavx2 -mfma -mf16c only.
 */
#include "index_vnni.h"

#include "numfmt.h"
#include "simd_avx2.h"

#include <string.h>

int dsattn_index_avx2_ok(size_t nh, size_t dh)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return have && nh % 16 == 0 && nh >= 16 && nh <= 64 && dh % 32 == 0 && dh >= 32 &&
           dh <= 256;
}

#define AI static inline __attribute__((always_inline))

/* One row's FP4 codes to biased half-units, element order kept (the even
 * element is the low nibble): 16 code bytes per step, dh / 2 bytes read. */
AI void decode_row(const uint8_t *row, size_t dh, __m128i lut, uint8_t *kb)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (size_t c = 0; c < dh / 2; c += 16) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(row + c));
        const __m128i lo = _mm_and_si128(x, m4);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
        _mm_store_si128((__m128i *)(kb + 2 * c), _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)));
        _mm_store_si128((__m128i *)(kb + 2 * c + 16),
                        _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)));
    }
}

/* 2^(e - 128) as a float (fp32-scaled keys: normal range) and as a double */
AI __m256 key_scale32(uint8_t e)
{
    return _mm256_castsi256_ps(_mm256_set1_epi32((int)(((uint32_t)e + 127u - 128u) << 23)));
}
AI __m256d key_scaled(uint8_t e)
{
    return _mm256_castsi256_pd(_mm256_set1_epi64x((long long)(((uint64_t)e + 1023 - 128) << 52)));
}

/* Head weighting of 8 heads' fp32 dots into the double head sum, lanes
 * 0-3 in lo and 4-7 in hi (the VNNI form's 8 double lanes):
 * bf16(dot) -> relu -> bf16(* w) -> added in double. */
AI void head_oct(__m256d *lo, __m256d *hi, __m256 dot, const float *w)
{
    const __m256 d = _mm256_max_ps(dsattn_rbf16_256(dot), _mm256_setzero_ps());
    const __m256 pr = dsattn_rbf16_256(_mm256_mul_ps(d, _mm256_loadu_ps(w)));
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
}

/* The VNNI form's _mm512_reduce_add_pd: (hi + lo), then its halves, then
 * the two lanes; rounded to fp32, then to bf16. */
AI float head_reduce(__m256d lo, __m256d hi)
{
    const __m256d t3 = _mm256_add_pd(hi, lo);
    const __m128d t6 = _mm_add_pd(_mm256_extractf128_pd(t3, 1), _mm256_castpd256_pd128(t3));
    return dsattn_round_bf16((float)(_mm_cvtsd_f64(t6) + _mm_cvtsd_f64(_mm_unpackhi_pd(t6, t6))));
}

#define IDX_ROWS 4

/* NR rows x NHC chunks of 16 heads, compile-time shapes.  Per block and
 * chunk the 2 x NR int16 accumulators stay in registers over the block's 8
 * groups; each pair of query loads feeds NR rows.  The block totals live in
 * small arrays (L1). */
AI void score_rows(const dsattn_index_vnni_q *p, const uint8_t *const *row, size_t dh,
                   __m128i lut, const size_t NR, const size_t NHC, float *out)
{
    uint8_t kb[IDX_ROWS][256] __attribute__((aligned(32)));
    float t32[IDX_ROWS][64] __attribute__((aligned(32)));
    double td[IDX_ROWS][64] __attribute__((aligned(32)));
    int f32[IDX_ROWS];
    const size_t nb = dh / 32;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) {
        decode_row(row[r], dh, lut, kb[r]);
        f32[r] = dsattn_index_key_fits_f32(p, row[r] + dh / 2, nb);
    }
    for (size_t b = 0; b < nb; b++) {
        /* rolled loops on purpose: unrolled, GCC kept all 32 key broadcasts
         * of a block live across the head chunks and reassociated the adds
         * into trees of products, and spilled most of them */
#pragma GCC unroll 1
        for (size_t hc = 0; hc < NHC; hc++) {
            __m256i acc[IDX_ROWS][2];
#pragma GCC unroll 4
            for (size_t r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (size_t g = 0; g < 8; g++) {
                const int8_t *qg = p->qb + ((b * 8 + g) * 64 + hc * 16) * 4;
                const __m256i q0 = _mm256_load_si256((const __m256i *)qg);
                const __m256i q1 = _mm256_load_si256((const __m256i *)(qg + 32));
#pragma GCC unroll 4
                for (size_t r = 0; r < NR; r++) {
                    int32_t kk;
                    memcpy(&kk, kb[r] + b * 32 + g * 4, 4);
                    const __m256i kv = _mm256_set1_epi32(kk);
                    acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_maddubs_epi16(kv, q0));
                    acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_maddubs_epi16(kv, q1));
                }
            }
            const size_t h0 = b * 64 + hc * 16;
            const int first = b == 0;      /* the totals start at 0 (no memset) */
#pragma GCC unroll 4
            for (size_t r = 0; r < NR; r++) {
                const uint8_t e8 = row[r][dh / 2 + b];
#pragma GCC unroll 2
                for (size_t s = 0; s < 2; s++) {
                    const size_t h = hc * 16 + s * 8;
                    const __m256i corr = _mm256_add_epi32(
                        _mm256_madd_epi16(acc[r][s], ones),
                        _mm256_loadu_si256((const __m256i *)(p->nbias + h0 + s * 8)));
                    if (f32[r]) {
                        /* corr * (u * s_k), all exact (dsattn_index_key_fits_f32) */
                        const __m256 u = _mm256_mul_ps(_mm256_loadu_ps(p->unit + h0 + s * 8),
                                                       key_scale32(e8));
                        _mm256_store_ps(t32[r] + h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), u,
                                                                    first ? _mm256_setzero_ps()
                                                                          : _mm256_load_ps(t32[r] + h)));
                    } else {
                        /* corr * u_q * s_k exact in double, one fused add each */
                        const __m256d ks = key_scaled(e8);
                        const __m256d u0 = _mm256_mul_pd(_mm256_loadu_pd(p->unitd + h0 + s * 8), ks);
                        const __m256d u1 = _mm256_mul_pd(_mm256_loadu_pd(p->unitd + h0 + s * 8 + 4), ks);
                        const __m256d f0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(corr));
                        const __m256d f1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(corr, 1));
                        const __m256d z = _mm256_setzero_pd();
                        _mm256_store_pd(td[r] + h, _mm256_fmadd_pd(f0, u0, first ? z : _mm256_load_pd(td[r] + h)));
                        _mm256_store_pd(td[r] + h + 4,
                                        _mm256_fmadd_pd(f1, u1, first ? z : _mm256_load_pd(td[r] + h + 4)));
                    }
                }
            }
        }
    }
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) {
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (size_t h = 0; h < NHC * 16; h += 8) {
            /* double totals are rounded to fp32 first, as in the VNNI form */
            const __m256 dot = f32[r] ? _mm256_load_ps(t32[r] + h)
                                      : _mm256_set_m128(_mm256_cvtpd_ps(_mm256_load_pd(td[r] + h + 4)),
                                                        _mm256_cvtpd_ps(_mm256_load_pd(td[r] + h)));
            head_oct(&lo, &hi, dot, p->w + h);
        }
        out[r] = head_reduce(lo, hi);
    }
}

#define IDX_LUT __m128i
#define IDX_TARGET
#include "index_scores_tmpl.h"

void dsattn_index_avx2_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score)
{
    const __m128i lut = _mm_loadu_si128((const __m128i *)dsattn_index_k_lut);
    score_heads(p, base, row_bytes, sel, j0, n, lut, score);
}

static const dsattn_index_kern index_avx2 = {
    "avx2", dsattn_index_avx2_ok, dsattn_index_q_prepare, dsattn_index_avx2_scores,
};
const dsattn_index_kern *const dsattn_index_avx2_ptr = &index_avx2;
