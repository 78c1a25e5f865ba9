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
 * Cephes exp of vmath_avx512.c.  FP8 codes decode through fp16 (an E4M3
 * code s.eeee.mmm moved to fp16 s.0eeee.mmm0000000 is 2^-8 times its
 * value; x256 is exact), NaN codes (0x7f/0xff) forced to NaN, so the
 * decoded values equal numfmt.c's table bit for bit.
 *
 * Not here: the driver (mla_forward.c), the scalar cross-check
 * (mla_tile.c).
 */
#include "mla_kernels.h"

#include "numfmt.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx512.h"

#define KT DSATTN_MLA_KT
#define AI static inline __attribute__((always_inline))

/* ---- small vector helpers ---------------------------------------------- */



static float le_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* ---- QK ------------------------------------------------------------------ */

/* one tile of 12 keys against NV (1 or 2) head vectors of one packed group */
AI void qk_tile(const float *q, size_t D, const float *k, float *st, size_t ldst, int NV)
{
    dsattn_tile12(k, q, (size_t)NV * 16, D, st, ldst, 1, NV);
}

static void qk_avx512(const float *qp, size_t hp, size_t D, const float *kt, size_t nk,
                      float *st, size_t ldst)
{
    const size_t nt = (nk + KT - 1) / KT;
    for (size_t t = 0; t < nt; t++) {
        const float *k = kt + t * KT * D;
        float *s = st + t * KT * ldst;
        size_t h0 = 0;
        for (; h0 + 32 <= hp; h0 += 32) qk_tile(qp + h0 * D, D, k, s + h0, ldst, 2);
        if (h0 < hp) qk_tile(qp + h0 * D, D, k, s + h0, ldst, 1);
    }
}

/* ---- softmax ------------------------------------------------------------- */

static void softmax_avx512(float *st, size_t ldst, size_t hp, size_t nk, float scale, int bf16,
                           float *m, float *l, float *alpha)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (size_t h = 0; h < hp; h += 16) {
        const __m512 mo = _mm512_loadu_ps(m + h);
        __m512 mx = mo;
        for (size_t j = 0; j < nk; j++) {
            float *p = st + j * ldst + h;
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(p), sc);
            if (bf16) s = dsattn_rbf16(s);
            _mm512_storeu_ps(p, s);
            mx = _mm512_max_ps(mx, s);
        }
        __m512 a = dsattn_exp512_ftz(_mm512_sub_ps(mo, mx));
        a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(mo, mx, _CMP_EQ_OQ), _mm512_set1_ps(1.0f));
        __m512 sum = _mm512_setzero_ps();
        for (size_t j = 0; j < nk; j++) {
            float *p = st + j * ldst + h;
            const __m512 e = dsattn_exp512_ftz(_mm512_sub_ps(_mm512_loadu_ps(p), mx));
            _mm512_storeu_ps(p, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_storeu_ps(l + h, _mm512_fmadd_ps(_mm512_loadu_ps(l + h), a, sum));
        _mm512_storeu_ps(m + h, mx);
        _mm512_storeu_ps(alpha + h, a);
    }
}

/* ---- PV ------------------------------------------------------------------ */

/* RC latent columns c.. x NV head vectors, over all nk keys of the block */
AI void pv_tile(const float *p, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
                size_t c, const float *alpha, float *acct, int RC, int NV)
{
    __m512 a[KT][2];
    const __m512 al0 = _mm512_loadu_ps(alpha), al1 = NV > 1 ? _mm512_loadu_ps(alpha + 16) : al0;
#pragma GCC unroll 12
    for (int r = 0; r < RC; r++) {
        a[r][0] = _mm512_mul_ps(_mm512_loadu_ps(acct + (size_t)r * hp), al0);
        a[r][1] = NV > 1 ? _mm512_mul_ps(_mm512_loadu_ps(acct + (size_t)r * hp + 16), al1) : al1;
    }
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
#pragma GCC unroll 12
    for (int r = 0; r < RC; r++) {
        _mm512_storeu_ps(acct + (size_t)r * hp, a[r][0]);
        if (NV > 1) _mm512_storeu_ps(acct + (size_t)r * hp + 16, a[r][1]);
    }
}

static void pv_avx512(const float *p, size_t ldp, size_t hp, const float *kt, size_t D,
                      size_t nk, size_t C, const float *alpha, float *acct,
                      const uint8_t *const *pf, size_t npf, size_t pf_bytes)
{
    /* column tiles of 12, then 4, then 1; the prefetch lines are spread
     * evenly over the tile calls of every head group */
    const size_t lpr = (pf_bytes + 63) / 64, nl = npf * lpr;
    const size_t per_group = C / 12 + C % 12 / 4 + C % 4;
    const size_t steps = (hp + 31) / 32 * per_group;
    size_t done = 0, step = 0, prow = 0, pline = 0;       /* done = prow * lpr + pline */
#define PF_NEXT()                                                                   \
    do {                                                                            \
        _mm_prefetch((const char *)pf[prow] + pline * 64, _MM_HINT_T1);             \
        if (++pline == lpr) { pline = 0; prow++; }                                  \
    } while (0)
    for (size_t h0 = 0; h0 < hp; h0 += 32) {
        const int nv = h0 + 32 <= hp ? 2 : 1;
        const float *ph = p + h0, *ah = alpha + h0;
        for (size_t c = 0; c < C; step++) {
            const size_t want = nl * (step + 1) / steps;
            for (; done < want; done++) PF_NEXT();
            float *o = acct + c * hp + h0;
            const size_t left = C - c;
            if (left >= 12) {
                if (nv == 2) pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 12, 2);
                else pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 12, 1);
                c += 12;
            } else if (left >= 4) {
                if (nv == 2) pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 4, 2);
                else pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 4, 1);
                c += 4;
            } else {
                if (nv == 2) pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 1, 2);
                else pv_tile(ph, ldp, hp, kt, D, nk, c, ah, o, 1, 1);
                c += 1;
            }
        }
    }
    for (; done < nl; done++) PF_NEXT();
#undef PF_NEXT
}

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

AI __m512 bf16x16(const uint8_t *p)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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

static void v32_row_avx512(const uint8_t *row, size_t kl, size_t dr, float *out)
{
    for (size_t b = 0; b * 128 < kl; b++) {
        const __m512 s = _mm512_set1_ps(le_f32(row + kl + 4 * b));
        for (size_t i = b * 128; i < b * 128 + 128; i += 16)
            _mm512_storeu_ps(out + i, _mm512_mul_ps(dsattn_e4m3x16(row + i), s));
    }
    const uint8_t *rp = row + kl + 4 * (kl / 128);
    size_t i = 0;
    for (; i + 16 <= dr; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(rp + 2 * i));
        _mm512_storeu_ps(out + kl + i,
                         _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    for (; i < dr; i++)
        out[kl + i] = dsattn_bf16_to_f32((uint16_t)(rp[2 * i] | rp[2 * i + 1] << 8));
}

/* ---- absorption weight rows ---------------------------------------------- */

static float w8(const uint8_t *w, const float *scale, size_t bs, size_t i)
{
    return dsattn_round_bf16(dsattn_e4m3_to_f32(w[i]) * scale[i / bs]);
}

/* The weight path.  fp16 bits of 16 codes: (b << 8) >> 1 (arithmetic)
 * puts the 7 magnitude bits at 7..13 and the sign at 15 and 14; clearing
 * bit 14 leaves s.0eeee.mmm0000000.  The x256 of the decode is folded into
 * the block scale: (e/256) * (256 s) is the same real product as e * s, so
 * it rounds to the same fp32 (256 s is exact while |s| < 2^100; larger
 * scales keep the separate multiply).  NaN codes decode to finite values
 * here and are put back as NaN after the rounding (one compare on the
 * bytes), so the rounding needs no NaN lanes of its own. */
AI __m512 e4m3x16_div256(const uint8_t *w, __mmask16 *nan)
{
    const __m128i b8 = _mm_loadu_si128((const __m128i *)w);
    const __m256i b = _mm256_cvtepu8_epi16(b8);
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1),
                                       _mm256_set1_epi16((short)0xbfff));
    *nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b8, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
    return _mm512_cvtph_ps(h);
}

/* rbf16 for non-NaN lanes */
AI __m512 rbf16_finite(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* How one block scale s is applied.  mode 0: e/256 * (256 s) then the
 * bf16 rounding (256 s exact while |s| < 2^100).  mode 1: s a power of two
 * in [2^-100, 2^100]: e * s has e's 4 significant bits, a normal bf16
 * value, so the rounding is the identity and is skipped (bit-identical;
 * the V3.2 release's UE8M0 scales and the generated weights).  mode 2:
 * huge scales, the x256 and s separately, then rounding. */
AI int wscale(float s, __m512 *f1, __m512 *f2)
{
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    const uint32_t e = (u >> 23) & 0xff;
    *f2 = _mm512_set1_ps(s);
    if ((u & 0x7fffff) == 0 && e >= 127 - 100 && e <= 127 + 100) {
        *f1 = _mm512_set1_ps(s * 256.0f);
        return 1;
    }
    if (s < 0x1p100f && s > -0x1p100f) {
        *f1 = _mm512_set1_ps(s * 256.0f);
        return 0;
    }
    *f1 = _mm512_set1_ps(256.0f);
    return 2;
}

/* bf16(e4m3(w) * s) of 16 codes (NaN codes: NaN), for wscale's mode */
AI __m512 wrow16(const uint8_t *w, __m512 f1, __m512 f2, int mode)
{
    __mmask16 nan;
    __m512 v = _mm512_mul_ps(e4m3x16_div256(w, &nan), f1);
    if (mode == 2) v = _mm512_mul_ps(v, f2);
    if (mode != 1) v = rbf16_finite(v);
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}

/* wrow16 of 32 finite codes (elements 0..15 in *v0, 16..31 in *v1) */
AI void wrow32_finite(const uint8_t *w, __m512 f1, __m512 f2, int mode, __m512 *v0, __m512 *v1)
{
    __m512 a, b;
    dsattn_e4m3x32_div256(w, &a, &b);   /* no NaN compare: finite rows */
    a = _mm512_mul_ps(a, f1);
    b = _mm512_mul_ps(b, f1);
    if (mode == 2) {
        a = _mm512_mul_ps(a, f2);
        b = _mm512_mul_ps(b, f2);
    }
    if (mode != 1) {
        a = rbf16_finite(a);
        b = rbf16_finite(b);
    }
    *v0 = a;
    *v1 = b;
}

AI void axpy_block(const uint8_t *w, size_t n, __m512 va, __m512 f1, __m512 f2, float *acc,
                   int mode)
{
    for (size_t i = 0; i < n; i += 16) {
        const __m512 v = wrow16(w + i, f1, f2, mode);
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(va, v, _mm512_loadu_ps(acc + i)));
    }
}

AI __m512 dot_block(const uint8_t *w, size_t n, __m512 f1, __m512 f2, const float *x,
                    __m512 s0, int mode)
{
    __m512 s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(wrow16(w + i, f1, f2, mode), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(wrow16(w + i + 16, f1, f2, mode), _mm512_loadu_ps(x + i + 16), s1);
    }
    if (i < n) s0 = _mm512_fmadd_ps(wrow16(w + i, f1, f2, mode), _mm512_loadu_ps(x + i), s0);
    return _mm512_add_ps(s0, s1);
}

/* Both walk the row one scale block at a time (no division per vector). */
static void fp8w_axpy_avx512(const uint8_t *w, const float *scale, size_t bs, size_t n, float a,
                             float *acc)
{
    const __m512 va = _mm512_set1_ps(a);
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        __m512 f1, f2;
        const int mode = wscale(scale[b0 / bs], &f1, &f2);
        if (mode == 1) axpy_block(w + b0, bs, va, f1, f2, acc + b0, 1);
        else if (mode == 0) axpy_block(w + b0, bs, va, f1, f2, acc + b0, 0);
        else axpy_block(w + b0, bs, va, f1, f2, acc + b0, 2);
    }
    for (size_t i = b0; i < n; i++) acc[i] += a * w8(w, scale, bs, i);
}

/* Four rows per pass over acc (the W_uk absorption adds 128 rows into one
 * 512-float accumulator per head: one row per pass reloaded it 128 times). */
/* One scale block of four finite rows, one mode for all four (a
 * constant after inlining), 32 elements a step: each element still sees
 * acc + r0, + r1, + r2, + r3 in that order. */
AI void axpy4_block_finite(const uint8_t *const *w, size_t b0, size_t bs, const __m512 *va,
                           const __m512 *f1, const __m512 *f2, int mode, float *acc)
{
    size_t i = b0;
    for (; i + 32 <= b0 + bs; i += 32) {
        __m512 s0 = _mm512_loadu_ps(acc + i), s1 = _mm512_loadu_ps(acc + i + 16);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512 v0, v1;
            wrow32_finite(w[k] + i, f1[k], f2[k], mode, &v0, &v1);
            s0 = _mm512_fmadd_ps(va[k], v0, s0);
            s1 = _mm512_fmadd_ps(va[k], v1, s1);
        }
        _mm512_storeu_ps(acc + i, s0);
        _mm512_storeu_ps(acc + i + 16, s1);
    }
    if (i < b0 + bs) {                          /* bs % 32 == 16 */
        __m512 s = _mm512_loadu_ps(acc + i);
        for (int k = 0; k < 4; k++)
            s = _mm512_fmadd_ps(va[k], wrow16(w[k] + i, f1[k], f2[k], mode), s);
        _mm512_storeu_ps(acc + i, s);
    }
}

static void fp8w_axpy4_avx512(const uint8_t *const *w, const float *const *scale, size_t bs,
                              size_t n, const float *a, float *acc, int finite)
{
    const __m512 va0 = _mm512_set1_ps(a[0]), va1 = _mm512_set1_ps(a[1]);
    const __m512 va2 = _mm512_set1_ps(a[2]), va3 = _mm512_set1_ps(a[3]);
    const __m512 va[4] = { va0, va1, va2, va3 };
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        __m512 f1[4], f2[4];
        int mode[4];
        for (int k = 0; k < 4; k++) mode[k] = wscale(scale[k][b0 / bs], &f1[k], &f2[k]);
        if (finite && mode[0] == mode[1] && mode[0] == mode[2] && mode[0] == mode[3]) {
            if (mode[0] == 1) axpy4_block_finite(w, b0, bs, va, f1, f2, 1, acc);
            else if (mode[0] == 0) axpy4_block_finite(w, b0, bs, va, f1, f2, 0, acc);
            else axpy4_block_finite(w, b0, bs, va, f1, f2, 2, acc);
            continue;
        }
        for (size_t i = b0; i < b0 + bs; i += 16) {
            __m512 s = _mm512_loadu_ps(acc + i);
            s = _mm512_fmadd_ps(va0, wrow16(w[0] + i, f1[0], f2[0], mode[0]), s);
            s = _mm512_fmadd_ps(va1, wrow16(w[1] + i, f1[1], f2[1], mode[1]), s);
            s = _mm512_fmadd_ps(va2, wrow16(w[2] + i, f1[2], f2[2], mode[2]), s);
            s = _mm512_fmadd_ps(va3, wrow16(w[3] + i, f1[3], f2[3], mode[3]), s);
            _mm512_storeu_ps(acc + i, s);
        }
    }
    for (size_t i = b0; i < n; i++)
        for (int k = 0; k < 4; k++) acc[i] += a[k] * w8(w[k], scale[k], bs, i);
}

static float fp8w_dot_avx512(const uint8_t *w, const float *scale, size_t bs, size_t n,
                             const float *x)
{
    __m512 s = _mm512_setzero_ps();
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        __m512 f1, f2;
        const int mode = wscale(scale[b0 / bs], &f1, &f2);
        if (mode == 1) s = dot_block(w + b0, bs, f1, f2, x + b0, s, 1);
        else if (mode == 0) s = dot_block(w + b0, bs, f1, f2, x + b0, s, 0);
        else s = dot_block(w + b0, bs, f1, f2, x + b0, s, 2);
    }
    float r = _mm512_reduce_add_ps(s);
    for (size_t i = b0; i < n; i++) r += w8(w, scale, bs, i) * x[i];
    return r;
}

/* fp8w_dot of four rows: each row keeps fp8w_dot's two chains (s0 on the
 * even 16-element steps, s1 on the odd ones), so the bits are the same;
 * the x vectors are loaded once for the four rows. */
/* The 32-element steps of one scale block of four finite rows, one mode
 * for all four: the same chains as dot4's general loop. */
AI size_t dot4_block_finite(const uint8_t *const *w, size_t b0, size_t bs, const float *x,
                            const __m512 *f1, const __m512 *f2, int mode, __m512 *s0,
                            __m512 *s1)
{
    size_t i = b0;
    for (; i + 32 <= b0 + bs; i += 32) {
        const __m512 xa = _mm512_loadu_ps(x + i), xb = _mm512_loadu_ps(x + i + 16);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512 v0, v1;
            wrow32_finite(w[k] + i, f1[k], f2[k], mode, &v0, &v1);
            s0[k] = _mm512_fmadd_ps(v0, xa, s0[k]);
            s1[k] = _mm512_fmadd_ps(v1, xb, s1[k]);
        }
    }
    return i;
}

static void fp8w_dot4_avx512(const uint8_t *const *w, const float *const *scale, size_t bs,
                             size_t n, const float *x, float *out, int finite)
{
    __m512 s0[4], s1[4];
    for (int k = 0; k < 4; k++) s0[k] = s1[k] = _mm512_setzero_ps();
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        __m512 f1[4], f2[4];
        int mode[4];
        for (int k = 0; k < 4; k++) mode[k] = wscale(scale[k][b0 / bs], &f1[k], &f2[k]);
        size_t i = b0;
        if (finite && mode[0] == mode[1] && mode[0] == mode[2] && mode[0] == mode[3]) {
            if (mode[0] == 1) i = dot4_block_finite(w, b0, bs, x, f1, f2, 1, s0, s1);
            else if (mode[0] == 0) i = dot4_block_finite(w, b0, bs, x, f1, f2, 0, s0, s1);
            else i = dot4_block_finite(w, b0, bs, x, f1, f2, 2, s0, s1);
        }
        for (; i + 32 <= b0 + bs; i += 32) {
            const __m512 xa = _mm512_loadu_ps(x + i), xb = _mm512_loadu_ps(x + i + 16);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                s0[k] = _mm512_fmadd_ps(wrow16(w[k] + i, f1[k], f2[k], mode[k]), xa, s0[k]);
                s1[k] = _mm512_fmadd_ps(wrow16(w[k] + i + 16, f1[k], f2[k], mode[k]), xb, s1[k]);
            }
        }
        if (i < b0 + bs) {
            const __m512 xa = _mm512_loadu_ps(x + i);
            for (int k = 0; k < 4; k++)
                s0[k] = _mm512_fmadd_ps(wrow16(w[k] + i, f1[k], f2[k], mode[k]), xa, s0[k]);
        }
        /* fp8w_dot folds s1 into s0 after every block (dot_block's return) */
        for (int k = 0; k < 4; k++) {
            s0[k] = _mm512_add_ps(s0[k], s1[k]);
            s1[k] = _mm512_setzero_ps();
        }
    }
    for (int k = 0; k < 4; k++) {
        float r = _mm512_reduce_add_ps(s0[k]);
        for (size_t i = b0; i < n; i++) r += w8(w[k], scale[k], bs, i) * x[i];
        out[k] = r;
    }
}

static void bf16w_axpy_avx512(const uint16_t *w, size_t n, float a, float *acc)
{
    const __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(w + i));
        const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(va, v, _mm512_loadu_ps(acc + i)));
    }
    for (; i < n; i++) acc[i] += a * dsattn_bf16_to_f32(w[i]);
}

static void round_bf16_avx512(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, dsattn_rbf16(_mm512_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = dsattn_round_bf16(x[i]);
}

static void relu_wsum_avx512(const float *c, size_t ldc, size_t nk, const float *w, size_t nh,
                             float *out)
{
    const size_t n16 = nh / 16 * 16;
    for (size_t j = 0; j < nk; j++) {
        const float *cj = c + j * ldc;
        __m512 acc = _mm512_setzero_ps();
        for (size_t h = 0; h < n16; h += 16)
            acc = _mm512_fmadd_ps(_mm512_max_ps(_mm512_loadu_ps(cj + h), _mm512_setzero_ps()),
                                  _mm512_loadu_ps(w + h), acc);
        float sum = _mm512_reduce_add_ps(acc);
        for (size_t h = n16; h < nh; h++) sum += (cj[h] > 0.0f ? cj[h] : 0.0f) * w[h];
        out[j] = sum;
    }
}

static const dsattn_mla_kern mla_avx512 = {
    "avx512", qk_avx512, softmax_avx512, pv_avx512, tile_rows_avx512, tile_bf16_avx512,
    v32_row_avx512,
    fp8w_axpy_avx512, fp8w_dot_avx512, fp8w_axpy4_avx512, fp8w_dot4_avx512, bf16w_axpy_avx512,
    round_bf16_avx512, relu_wsum_avx512,
};
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = &mla_avx512;

#else
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = NULL;
#endif
