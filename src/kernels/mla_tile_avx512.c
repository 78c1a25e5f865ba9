/* mla_tile_avx512.c - the AVX-512 table of mla_kernels.h (F/BW/VL/DQ only).
 *
 * QK: a register tile of 12 keys x 32 heads (24 accumulators); per latent
 * element two head vectors of the packed query are loaded and each of the
 * 12 keys is broadcast from the d-major key tile (one pointer, constant
 * displacements), 24 FMAs per 14 loads.  PV: 12 latent columns x 32 heads
 * per tile, the accumulator tile loaded once per key block and scaled by
 * the softmax rescale on load; per key two probability vectors and 12
 * broadcasts.  Both keep every operand stream sequential: the packed query
 * (L2) and the key tile (L1) for QK, the probabilities (L1) and the key
 * block (L2) for PV.  Softmax: elementwise over head vectors with the
 * Cephes exp of simd_avx512.h (dsattn_exp512_ftz).  FP8 codes decode through fp16 (an E4M3
 * code s.eeee.mmm moved to fp16 s.0eeee.mmm0000000 is 2^-8 times its
 * value; x256 is exact), NaN codes (0x7f/0xff) forced to NaN, so the
 * decoded values equal numfmt.c's table bit for bit.
 *
 * Here: the 16-lane decoders and register tiles.  Not here: the entries
 * written once for both widths around them (mla_tile_tmpl.h: the QK / PV
 * loops, softmax, row decode, absorption rows), the driver
 * (mla_attend.c), the scalar cross-check (mla_tile.c).
 */
#include "mla_kernels.h"

#include "numfmt.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx512.h"

#define KT DSATTN_MLA_KT
#define AI static inline __attribute__((always_inline))

/* ---- small vector helpers (the hooks of mla_tile_tmpl.h) ------------------ */

AI __m512 bf16x16(const uint8_t *p)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The weight path.  fp16 bits of 16 codes: (b << 8) >> 1 (arithmetic)
 * puts the 7 magnitude bits at 7..13 and the sign at 15 and 14; clearing
 * bit 14 leaves s.0eeee.mmm0000000, the value / 256 (the x256 is folded
 * into the block scale, mla_tile_tmpl.h's wscale).  NaN codes decode to
 * finite values here and are put back as NaN after the rounding (one
 * compare on the bytes), so the rounding needs no NaN lanes of its own. */
AI __m512 e4m3x16_div256(const uint8_t *w, __mmask16 *nan)
{
    const __m128i b8 = _mm_loadu_si128((const __m128i *)w);
    const __m256i b = _mm256_cvtepu8_epi16(b8);
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xbfff));
    *nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b8, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
    return _mm512_cvtph_ps(h);
}

/* bf16(e4m3(w) * s) of 16 codes (NaN codes: NaN), for wscale's mode */
AI __m512 wrow16(const uint8_t *w, __m512 f1, __m512 f2, int mode)
{
    __mmask16 nan;
    __m512 v = _mm512_mul_ps(e4m3x16_div256(w, &nan), f1);
    if (mode == 2) v = _mm512_mul_ps(v, f2);
    if (mode != 1) v = dsattn_rbf16_512(v);
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}

#define rbf16q dsattn_rbf16
#define exp_ftz dsattn_exp512_ftz
#define wrow wrow16
#define e4m3x2_div256 dsattn_e4m3x32_div256
#define bf16v bf16x16
#define e4m3v dsattn_e4m3x16
#define hsumv _mm512_reduce_add_ps

/* ---- QK ------------------------------------------------------------------ */

/* one tile of 12 keys against NV (1 or 2) head vectors of one packed group */
AI void qk_tile(const float *q, size_t D, const float *k, float *st, size_t ldst, int NV)
{
    dsattn_tile12(k, q, (size_t)NV * 16, D, st, ldst, 1, NV);
}

/* one key tile against every head: 32 heads a tile, a last 16 */
AI void qk_keytile(const float *qp, size_t hp, size_t D, const float *k, float *s, size_t ldst)
{
    size_t h0 = 0;
    for (; h0 + 32 <= hp; h0 += 32) qk_tile(qp + h0 * D, D, k, s + h0, ldst, 2);
    if (h0 < hp) qk_tile(qp + h0 * D, D, k, s + h0, ldst, 1);
}

/* ---- PV ------------------------------------------------------------------ */

/* RC latent columns c.. x NV head vectors, over all nk keys of the block */
AI void pv_tile_rc(const float *p, size_t ldp, size_t hp, const float *kt, size_t D,
                   size_t nk, size_t c, const float *alpha, float *acct, int RC, int NV)
{
    __m512 a[KT][2];
    dsattn_pv_load512(a, acct, hp, alpha, RC, NV);
    for (size_t j0 = 0; j0 < nk; j0 += KT) {
        const float *kb = kt + j0 * D + c * KT;
        const size_t nj = nk - j0 < KT ? nk - j0 : KT;
        const float *pj = p + j0 * ldp;
        if (nj == KT) {                     /* full tile: no loop exit to predict */
#pragma GCC unroll 12
            for (int jj = 0; jj < KT; jj++) {
                const __m512 p0 = _mm512_loadu_ps(pj + (size_t)jj * ldp);
                const __m512 p1 = NV > 1 ? _mm512_loadu_ps(pj + (size_t)jj * ldp + 16) : p0;
#pragma GCC unroll 12
                for (int r = 0; r < RC; r++) {
                    const __m512 b = _mm512_set1_ps(kb[r * KT + jj]);
                    a[r][0] = _mm512_fmadd_ps(b, p0, a[r][0]);
                    if (NV > 1) a[r][1] = _mm512_fmadd_ps(b, p1, a[r][1]);
                }
            }
            continue;
        }
        for (size_t jj = 0; jj < nj; jj++, pj += ldp) {
            const __m512 p0 = _mm512_loadu_ps(pj);
            const __m512 p1 = NV > 1 ? _mm512_loadu_ps(pj + 16) : p0;
#pragma GCC unroll 12
            for (int r = 0; r < RC; r++) {
                const __m512 b = _mm512_set1_ps(kb[r * KT + (int)jj]);
                a[r][0] = _mm512_fmadd_ps(b, p0, a[r][0]);
                if (NV > 1) a[r][1] = _mm512_fmadd_ps(b, p1, a[r][1]);
            }
        }
    }
    dsattn_rows_store512(a, acct, hp, RC, NV);
}

/* PV in 32-head groups (a last 16): column tiles of 12, then 4, then 1 */
#define PV_HG 32
#define PV_COL_OUTER 0     /* measured so on the Xeon's 2 MB L2; Zen 4: not compared */
#define pv_tiles(C) ((C) / 12 + (C) % 12 / 4 + (C) % 4)

AI size_t pv_tile(const float *ph, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
                  size_t c, size_t C, const float *ah, float *o, int nv)
{
    size_t n;
#define PV_TILE(RC, NV) pv_tile_rc(ph, ldp, hp, kt, D, nk, c, ah, o, RC, NV)
    DSATTN_PV_COLS_12_4_1(n, C - c, nv, PV_TILE);
#undef PV_TILE
    return n;
}

#include "mla_tile_tmpl.h"

/* ---- key tiles ------------------------------------------------------------ */


static void tile_rows_avx512(const float *rows, size_t ldr, size_t nr, size_t D, float *kt)
{
    size_t d = 0;
    for (; d + 16 <= D; d += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = (size_t)i < nr ? _mm512_loadu_ps(rows + (size_t)i * ldr + d) : _mm512_setzero_ps();
        dsattn_tr16(r);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(kt + (d + (size_t)c) * KT, 0x0fff, r[c]);
    }
    for (; d < D; d++)
        for (size_t i = 0; i < KT; i++) kt[d * KT + i] = i < nr ? rows[i * ldr + d] : 0.0f;
}

static void tile_bf16_avx512(const uint8_t *const *rows, size_t nr, size_t D, float *kt)
{
    if (nr < KT) {                          /* a last partial tile: rare */
        const uint8_t *rr[KT];
        for (size_t i = 0; i < KT; i++) rr[i] = rows[i < nr ? i : 0];
        tile_bf16_avx512(rr, KT, D, kt);
        for (size_t d = 0; d < D; d++)
            for (size_t i = nr; i < KT; i++) kt[d * KT + i] = 0.0f;
        return;
    }
    size_t d = 0;
    for (; d + 16 <= D; d += 16) {
        __m512 r[16];
#pragma GCC unroll 12
        for (int i = 0; i < KT; i++) r[i] = bf16x16(rows[i] + 2 * d);
#pragma GCC unroll 4
        for (int i = KT; i < 16; i++) r[i] = _mm512_setzero_ps();
        dsattn_tr16(r);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(kt + (d + (size_t)c) * KT, 0x0fff, r[c]);
    }
    for (; d < D; d++)
        for (size_t i = 0; i < KT; i++) kt[d * KT + i] =
                dsattn_bf16_to_f32((uint16_t)(rows[i][2 * d] | rows[i][2 * d + 1] << 8));
}

static const dsattn_mla_kern mla_avx512 = {
    "avx512", mla_qk, mla_softmax, mla_pv, tile_rows_avx512, tile_bf16_avx512,
    mla_v32_row, mla_fp8w_axpy, mla_fp8w_dot, mla_fp8w_axpy4, mla_fp8w_dot4, mla_bf16w_axpy,
    mla_round_bf16, mla_relu_wsum,
};
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = &mla_avx512;

#else
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = NULL;
#endif
