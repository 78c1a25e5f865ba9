/* sa_kernels_avx512.c - the AVX-512 table of sa_kernels.h (F/BW/VL/DQ).
 *
 * rows: 16 values per register straight from the packed bytes.  FP4 E2M1:
 * the byte's two nibbles are split and interleaved (element 2i is the low
 * nibble), widened to dword indices and looked up (vpermps) in the 16-entry
 * E2M1 table pre-multiplied by the block's E4M3 scale (16 values = one
 * scale block; e2m1 x e4m3 is exact, as numfmt.c's code x scale is).  FP8
 * E4M3: the code moved to fp16 s.0eeee.mmm0000000 is exactly 2^-8 times its
 * value; vscalefps by 2^(e - 127 + 8) applies the UE8M0 scale with one
 * rounding, the same as numfmt.c's code x 2^(e - 127); NaN codes (0x7f /
 * 0xff) and the NaN scale byte 0xff give NaN.
 *
 * qk / pv: register tiles of 12 keys (columns) x 32 heads (24 accumulators),
 * per step 2 head-vector loads + 12 broadcasts for 24 FMAs - the kernels of
 * mla_tile_avx512.c with the keys row-major (see sa_kernels.h).  pv
 * prefetches the row 8 keys ahead (the rows are 2 KB apart, past the
 * hardware stride prefetcher's reach).
 *
 * finish: acc^T [d][hp] / den[h] -> bf16 -> out [nh][d], by 16 x 16 blocks
 * (vdivps on head vectors, RNE to bf16, transpose, store: sa_tmpl.h,
 * shared with the AVX2 table).
 *
 * Not here: the softmax (mla_tile_avx512.c), the scalar cross-check
 * (sa_kernels.c).
 */
#include "sa_kernels.h"

#include "mla_kernels.h"
#include "numfmt.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx512.h"

#define KT DSATTN_MLA_KT
#define AI static inline __attribute__((always_inline))


/* values c0..c0+15 of a V4.1 FP4 row (c0 % 16 == 0) */
AI __m512 fp4x16(const uint8_t *row, size_t d, size_t c0, __m512 tab)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)(row + c0 / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    const __m512i ix = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    const __m512 t = _mm512_mul_ps(tab, _mm512_set1_ps(dsattn_e4m3_lut[row[d / 2 + c0 / 16]]));
    return _mm512_permutexvar_ps(ix, t);
}

/* values c0..c0+15 of a V4.1 FP8 window row (c0 % 16 == 0) */
AI __m512 fp8x16(const uint8_t *row, size_t d, size_t c0)
{
    const __m128i b8 = _mm_loadu_si128((const __m128i *)(row + c0));
    const __m256i b = _mm256_cvtepu8_epi16(b8);
    const __m256i h = _mm256_or_si256(
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    const uint8_t e = row[d + c0 / 32];
    __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b8, _mm_set1_epi8(0x7f)),
                                        _mm_set1_epi8(0x7f));
    if (e == 0xff) nan = 0xffff;
    const __m512 v = _mm512_scalef_ps(_mm512_cvtph_ps(h), _mm512_set1_ps((float)((int)e - 119)));
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}

/* ---- row-major path ----------------------------------------------------- */

/* nr <= 12 rows -> rows out + r * ld (d floats each), rows nr..11 zero */
static void rows_avx512(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                        size_t d, float *out, size_t ld)
{
    const __m512 tab = _mm512_loadu_ps(dsattn_e2m1_table);
    for (size_t r = 0; r < KT; r++) {
        float *o = out + r * ld;
        if (r >= nr) {
            for (size_t c0 = 0; c0 < d; c0 += 16) _mm512_storeu_ps(o + c0, _mm512_setzero_ps());
        } else if (kinds[r] == DSATTN_SA_FP4) {
            for (size_t c0 = 0; c0 < d; c0 += 16) _mm512_storeu_ps(o + c0, fp4x16(rows[r], d, c0, tab));
        } else {
            for (size_t c0 = 0; c0 < d; c0 += 16) _mm512_storeu_ps(o + c0, fp8x16(rows[r], d, c0));
        }
    }
}

/* Lanes that are subnormal (not zero, exponent field 0) */
AI __mmask16 subnormal16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
           _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffffff));
}

/* Straight to bf16: E2M1 x E4M3 has at most 5 significant bits and lies
 * in [2^-10, 2688] (or is NaN), E4M3 x 2^(e-127) has 4 and is normal for
 * every code once e >= 10, so only FP8 blocks with e < 10 are checked. */
static int rows_bf16_avx512(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                            size_t d, uint16_t *out)
{
    const __m512 tab = _mm512_loadu_ps(dsattn_e2m1_table);
    for (size_t r = 0; r < nr; r++) {
        uint16_t *o = out + r * d;
        const uint8_t *row = rows[r];
        if (kinds[r] == DSATTN_SA_FP4) {
            for (size_t c0 = 0; c0 < d; c0 += 32)
                _mm512_storeu_si512(o + c0, dsattn_bf16_hi32(fp4x16(row, d, c0, tab),
                                                             fp4x16(row, d, c0 + 16, tab)));
            continue;
        }
        for (size_t c0 = 0; c0 < d; c0 += 32) {
            const __m512 a = fp8x16(row, d, c0), b = fp8x16(row, d, c0 + 16);
            if (row[d + c0 / 32] < 10 && (subnormal16(a) | subnormal16(b))) return 0;
            _mm512_storeu_si512(o + c0, dsattn_bf16_hi32(a, b));
        }
    }
    return 1;
}

/* 12 keys (rows k + r*ld) x NV head vectors of one packed query group */
AI void qk_rm_tile(const float *q, size_t D, const float *k, size_t ld, float *st, size_t ldst,
                   int NV)
{
    __m512 a[KT][2];
#pragma GCC unroll 12
    for (int r = 0; r < KT; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    const size_t w = (size_t)NV * 16;
    for (size_t d = 0; d < D; d++) {
        const __m512 q0 = _mm512_loadu_ps(q + d * w);
        const __m512 q1 = NV > 1 ? _mm512_loadu_ps(q + d * w + 16) : q0;
#pragma GCC unroll 12
        for (int r = 0; r < KT; r++) {
            const __m512 b = _mm512_set1_ps(k[(size_t)r * ld + d]);
            a[r][0] = _mm512_fmadd_ps(b, q0, a[r][0]);
            if (NV > 1) a[r][1] = _mm512_fmadd_ps(b, q1, a[r][1]);
        }
    }
    dsattn_rows_store512(a, st, ldst, KT, NV);
}

static void qk_rm_avx512(const float *qp, size_t hp, size_t D, const float *rows, size_t ld,
                         size_t nk, float *st, size_t ldst)
{
    for (size_t j0 = 0; j0 < nk; j0 += KT) {
        const float *k = rows + j0 * ld;
        float *o = st + j0 * ldst;
        size_t h0 = 0;
        for (; h0 + 32 <= hp; h0 += 32) qk_rm_tile(qp + h0 * D, D, k, ld, o + h0, ldst, 2);
        if (h0 < hp) qk_rm_tile(qp + h0 * D, D, k, ld, o + h0, ldst, 1);
    }
}

/* RC columns c.. x NV head vectors over all nk keys; rescale on load */
AI void pv_rm_tile(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld,
                   size_t nk, size_t c, const float *alpha, float *acct, int RC, int NV)
{
    __m512 a[KT][2];
    dsattn_pv_load512(a, acct, hp, alpha, RC, NV);
    const float *kb = rows + c;
    for (size_t j = 0; j < nk; j++, kb += ld, p += ldp) {
        _mm_prefetch((const char *)(kb + 8 * ld + 16), _MM_HINT_T0);
        const __m512 p0 = _mm512_loadu_ps(p);
        const __m512 p1 = NV > 1 ? _mm512_loadu_ps(p + 16) : p0;
#pragma GCC unroll 12
        for (int r = 0; r < RC; r++) {
            const __m512 b = _mm512_set1_ps(kb[r]);
            a[r][0] = _mm512_fmadd_ps(b, p0, a[r][0]);
            if (NV > 1) a[r][1] = _mm512_fmadd_ps(b, p1, a[r][1]);
        }
    }
    dsattn_rows_store512(a, acct, hp, RC, NV);
}

static void pv_rm_avx512(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld,
                         size_t nk, size_t C, const float *alpha, float *acct)
{
    for (size_t h0 = 0; h0 < hp; h0 += 32) {
        const int nv = h0 + 32 <= hp ? 2 : 1;
        const float *ph = p + h0, *ah = alpha + h0;
        for (size_t c = 0; c < C;) {
            float *o = acct + c * hp + h0;
            size_t n;
#define PV_TILE(RC, NV) pv_rm_tile(ph, ldp, hp, rows, ld, nk, c, ah, o, RC, NV)
            DSATTN_PV_COLS_12_4_1(n, C - c, nv, PV_TILE);
#undef PV_TILE
            c += n;
        }
    }
}


#include "sa_tmpl.h"

static void finish_avx512(const float *acct, size_t hp, size_t nh, size_t d, const float *den,
                          float *out)
{
    sa_finish_512(acct, hp, nh, d, den, out);
}

static const dsattn_sa_kern sa_avx512 = {
    "avx512", finish_avx512, rows_avx512, rows_bf16_avx512, qk_rm_avx512, pv_rm_avx512,
};
const dsattn_sa_kern *const dsattn_sa_kern_avx512_ptr = &sa_avx512;

#else
const dsattn_sa_kern *const dsattn_sa_kern_avx512_ptr = NULL;
#endif
