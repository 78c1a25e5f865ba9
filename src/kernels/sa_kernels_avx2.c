/* sa_kernels_avx2.c - the AVX2 table of sa_kernels.h (AVX2 + FMA + F16C):
 * the sparse-attention row decoder and the row-major QK / PV register
 * tiles on 8 lanes and 16 registers.
 *
 * rows: 8 values per register.  FP4 E2M1: the nibbles are split and
 * interleaved (element 2i is the low nibble) and widened to dword indices;
 * AVX2's vpermps has 8 entries, so the two halves of the 16-entry E2M1
 * table, each pre-multiplied by the block's E4M3 scale (exact, as
 * numfmt.c's code x scale), are looked up and blended by bit 3 of the
 * code.  FP8 E4M3: the code moved to fp16 is exactly 2^-8 times its value
 * (vcvtph2ps), times 2^8 (exact), times the UE8M0 scale as a float (b << 23,
 * 2^-127 for byte 0, NaN for 0xff): one rounding, numfmt.c's
 * code x 2^(e - 127); NaN codes (0x7f / 0xff) give NaN.  Both decode to
 * the unpackers' bits (tests/test_sparse_attn.c).
 *
 * qk / pv: the AVX-512 table's 12 x 32 tiles as sub-tiles of 6 keys
 * (columns) x 16 heads (12 accumulators): per step 2 head-vector loads and
 * 6 broadcasts for 12 FMAs (simd_avx2.h's 6 x 16 tile; the loops around
 * it in sa_tmpl.h, shared with the NEON table).
 *
 * finish: the division and bf16 rounding by 8 x 8 blocks, transposed in
 * registers (sa_tmpl.h, shared with the AVX-512 and NEON tables).  rows_bf16 is the
 * scalar table's (it serves only AMX contexts, which run the avx512 table).
 */
#include "sa_kernels.h"

#include "mla_kernels.h"
#include "numfmt.h"
#include "simd_avx2.h"

#include <string.h>

#define KT DSATTN_MLA_KT
#define AI static inline __attribute__((always_inline))

/* values c0..c0+7 of a V4.1 FP4 row (c0 % 8 == 0); tlo / thi: the E2M1
 * table's halves times the block's scale */
AI __m256 fp4x8(const uint8_t *row, size_t c0, __m256 tlo, __m256 thi)
{
    uint32_t w;
    memcpy(&w, row + c0 / 2, 4);
    const __m128i b = _mm_cvtsi32_si128((int)w);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    const __m256i ix = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    const __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(ix, 28));   /* bit 3 -> sign */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, ix),
                            _mm256_permutevar8x32_ps(thi, ix), sel);
}

/* values c0..c0+7 of a V4.1 FP8 window row (c0 % 8 == 0) */
AI __m256 fp8x8(const uint8_t *row, size_t d, size_t c0)
{
    const __m128i b8 = _mm_loadl_epi64((const __m128i *)(row + c0));
    const __m128i b = _mm_cvtepu8_epi16(b8);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f)),
                                   _mm256_set1_ps(dsattn_ue8m0_bits_f32(row[d + c0 / 32])));
    const __m256i nan = _mm256_cvtepi16_epi32(
        _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f)));
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(nan));
}

static void rows_avx2(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                      size_t d, float *out, size_t ld)
{
    const __m256 tlo = _mm256_loadu_ps(dsattn_e2m1_table);
    const __m256 thi = _mm256_loadu_ps(dsattn_e2m1_table + 8);
    for (size_t r = 0; r < KT; r++) {
        float *o = out + r * ld;
        if (r >= nr) {
            for (size_t c0 = 0; c0 < d; c0 += 8) _mm256_storeu_ps(o + c0, _mm256_setzero_ps());
        } else if (kinds[r] == DSATTN_SA_FP4) {
            const uint8_t *row = rows[r];
            for (size_t c0 = 0; c0 < d; c0 += 16) {
                const __m256 s = _mm256_set1_ps(dsattn_e4m3_lut[row[d / 2 + c0 / 16]]);
                const __m256 lo = _mm256_mul_ps(tlo, s), hi = _mm256_mul_ps(thi, s);
                _mm256_storeu_ps(o + c0, fp4x8(row, c0, lo, hi));
                _mm256_storeu_ps(o + c0 + 8, fp4x8(row, c0 + 8, lo, hi));
            }
        } else {
            for (size_t c0 = 0; c0 < d; c0 += 8) _mm256_storeu_ps(o + c0, fp8x8(rows[r], d, c0));
        }
    }
}

static int rows_bf16_avx2(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                          size_t d, uint16_t *out)
{
    return dsattn_sa_kern_ref.rows_bf16(rows, kinds, nr, d, out);
}

#include "sa_tmpl.h"

static void finish_avx2(const float *acct, size_t hp, size_t nh, size_t d, const float *den,
                        float *out)
{
    sa_finish_256(acct, hp, nh, d, den, out);
}

static const dsattn_sa_kern sa_avx2 = {
    "avx2", finish_avx2, rows_avx2, rows_bf16_avx2, sa_qk_rm, sa_pv_rm,
};
const dsattn_sa_kern *const dsattn_sa_kern_avx2_ptr = &sa_avx2;
