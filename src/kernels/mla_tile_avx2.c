/* mla_tile_avx2.c - the AVX2 + FMA + F16C table of mla_kernels.h.
 *
 * The AVX-512 table's arithmetic with 8-wide vectors and 16 registers.
 * Its 12 x 32 register tiles (24 accumulators of 16 lanes) do not fit, so
 * QK and PV run as 6 x 16 sub-tiles over the same operands, as
 * pgemm_avx2.c does for the prefill tile: QK 6 keys x 16 heads (12
 * accumulators; per latent element two head vectors of the packed query
 * and six key broadcasts from the d-major key tile: 12 FMAs per 8 loads),
 * PV 6 latent columns x 16 heads (per key two probability vectors and six
 * broadcasts), the accumulator tile loaded once per key block and scaled
 * by the softmax rescale on load, a last 1..5 columns as one narrower
 * tile.  Only the loop order over outputs changes: every score and every
 * P.V output is one FMA chain in the AVX-512 table's order (QK over d, PV
 * from acc * alpha over the keys), so the two tables agree bit for bit on
 * both; against `ref` they differ by contraction (tests/test_mla.c).
 *
 * Softmax: elementwise over 8-head vectors with the AVX-512 table's
 * Cephes exp (simd_avx512.h), 2^n built in the exponent field instead of
 * vscalefps.  Its arguments are s - max and m_old - m_new, never above 0,
 * so the upper clamp is 0 and 2^n (n in [-100, 0]) is a normal number:
 * p * 2^n is then exact as vscalefps's is, the same bits.
 *
 * FP8 codes decode through fp16 (E4M3 s.eeee.mmm moved to fp16
 * s.0eeee.mmm0000000 is 2^-8 times its value; x256 is exact, or folded
 * into the block scale for the weight rows), NaN codes (0x7f/0xff) put
 * back as NaN, so the decoded values equal numfmt.c's table.  No gathers
 * (QEMU 7.2's AVX2 gather, which the Haswell emulation runs, lost lanes).
 *
 * Here: the 8-lane decoders.  Not here: the entries written once around
 * them (mla_tile_tmpl.h: the 6 x 16 sub-tile calls and key tiles, which
 * the NEON table shares, the QK / PV loops, softmax, row decode,
 * absorption rows), the register tile itself (simd_avx2.h), the driver
 * (mla_attend.c), the scalar cross-check (mla_tile.c), the AVX-512 form
 * (mla_tile_avx512.c).
 */
#include "mla_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "numfmt.h"
#include "simd_avx2.h"

#define AI static inline __attribute__((always_inline))

/* ---- small vector helpers (the hooks of mla_tile_tmpl.h) ------------------ */

/* exp(x) for x <= 0: 0 below -69.3 (below 2^-100, no subnormal ever
 * computed), NaN kept - simd_avx512.h's dsattn_exp512_ftz lane for lane */
AI __m256 exp8_ftz(__m256 x)
{
    return _mm256_blendv_ps(dsattn_exp256_ftz_neg(x), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* dsattn_round_bf16 on 8 lanes: RNE, NaN -> quiet NaN with the top bits */
AI __m256 rbf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x), hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    r = _mm256_and_si256(r, hi);
    const __m256i qn = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qn),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}


/* 8 codes widened to 16 bits -> fp16 bits s.0eeee.mmm0000000 */
AI __m128i e4m3_h8(__m128i b)
{
    return _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(b, 8), 1), _mm_set1_epi16((short)0xbfff));
}

/* lanes whose code (widened to 16 bits) is a NaN code, as an fp32 mask */
AI __m256 e4m3_nan8(__m128i b)
{
    const __m128i n16 = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)),
                                        _mm_set1_epi16(0x7f));
    return _mm256_castsi256_ps(_mm256_cvtepi16_epi32(n16));
}

/* 8 E4M3 codes -> their exact fp32 values (NaN codes -> NaN) */
AI __m256 e4m3x8(const uint8_t *w)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)w));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(e4m3_h8(b)), _mm256_set1_ps(256.0f));
    return _mm256_blendv_ps(f, _mm256_set1_ps(__builtin_nanf("")), e4m3_nan8(b));
}

/* bf16(e4m3(w) * s) of 8 codes (NaN codes: NaN), for wscale's mode */
AI __m256 wrow8(const uint8_t *w, __m256 f1, __m256 f2, int mode)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)w));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(e4m3_h8(b)), f1);
    if (mode == 2) v = _mm256_mul_ps(v, f2);
    if (mode != 1) v = dsattn_rbf16_256(v);
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), e4m3_nan8(b));
}

#define rbf16q rbf16
#define exp_ftz exp8_ftz
#define wrow wrow8
#define e4m3x2_div256 dsattn_e4m3x16_div256_256
#define bf16v dsattn_bf16x8_256
#define e4m3v e4m3x8
#define hsumv dsattn_hsum256

#include "mla_tile_tmpl.h"

static const dsattn_mla_kern mla_avx2 = {
    "avx2", mla_qk, mla_softmax, mla_pv, mla_tile_rows, mla_tile_bf16, mla_v32_row,
    mla_fp8w_axpy, mla_fp8w_dot, mla_fp8w_axpy4, mla_fp8w_dot4, mla_bf16w_axpy,
    mla_round_bf16, mla_relu_wsum,
};
const dsattn_mla_kern *const dsattn_mla_kern_avx2_ptr = &mla_avx2;

#else
const dsattn_mla_kern *const dsattn_mla_kern_avx2_ptr = NULL;
#endif
