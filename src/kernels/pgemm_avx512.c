/* pgemm_avx512.c - the AVX-512 tables of pgemm.h (F/BW/VL/DQ, and the
 * bf16-dot GEMM on AVX512-BF16).
 *
 * The tile is simd_avx512.h's dsattn_tile12, the MLA score tile: 12 rows
 * x 32 tokens in 24 accumulators; per k it loads the two token vectors of
 * the packed activations and broadcasts the 12 row values of the weight
 * tile, 24 FMAs per 14 loads.  Each lane is one FMA chain over k, the `ref`
 * tile's order.  pack_b (here) and tile_fp8 (pgemm_tmpl.h, shared with the
 * AVX2 table) transpose 16 x 16 blocks in registers.
 */
#include "pgemm.h"

#include "cpu.h"

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

/* ==== The bf16-dot GEMM (pgemm.h; the avx512-bf16 table) ================
 * GEMV-shaped: every (row, token) output is a vector of 16 fp32 lanes
 * along k, each VDPBF16PS adding the products of 32 weights with 32 token
 * values, reduced at the end of each k slab (dsattn_hsum8).  Per slab of
 * db_slab codes (DB_KC_MANY past 16 tokens; else, on 32 KB L1Ds, DB_KC,
 * the whole row up to 8192, so that each row pair is read as two unbroken
 * runs; on 48 KB L1Ds as many as keep a group's token slab in L1, below) of
 * DB_ROWS rows, each group
 * of up to 8 tokens passes over the rows two at a time: 16 accumulators,
 * per 32 codes 2 weight vectors + 8 token loads for 16 VDPBF16PS (in L1:
 * 95 % of the instruction's peak on AMD Zen 4).  The first group decodes
 * the rows inside that loop, where the decode's shifts and shuffles run
 * beside the products, and stores them (bf16, up to 512 KB, L2: the
 * caller's work) for the others; it prefetches the codes DB_PF_ROWS rows
 * ahead into L2 (against slabs of 2048 codes and an L1 prefetch 16 rows
 * ahead: 1-16 % less time, median 8 %, over the V4.1 shapes at 8 and 16
 * tokens; Zen 4).  Compiled for AVX512-BF16 function by function (target
 * attribute): the rest of the file runs on any AVX-512 CPU. */
#define DB_FN __attribute__((target("avx512bf16")))
#define DB_AI static inline __attribute__((always_inline, target("avx512bf16")))
#define DB_KC 8192
#define DB_KC_MANY 2048
#define DB_ROWS 32
_Static_assert(DB_ROWS * DB_KC * 2 + 64 <= DSATTN_PGEMM_DOT_WORK, "pgemm.h's work size");
#define DB_PF_ROWS 8               /* rows ahead the codes are prefetched */
#define DB_X_L1 32768              /* bytes of a group's token slab kept in L1 */

/* Codes per slab for n tokens.  Every row pair of a slab reads the token
 * group's slab (T x kc bf16) again: from L1 where it fits, else from L2.
 * Where VDPBF16PS issues twice per cycle (AMD Zen 5) that L2 stream, not the
 * products, bounds the group - so there, with an L1D of 48 KB, the slab is
 * cut to keep 32 KB of tokens in L1 (2,048 codes for 8 tokens): 8 to 16
 * tokens at K = 4096 and 8192 ran 1.01-1.49x as fast, 4 tokens the same
 * (docs/benchmarks.md, 2026-12-07 04:10-04:16).  On a 32 KB L1D (AMD Zen
 * 4: one VDPBF16PS a cycle, the L2 stream keeps up) whole rows measured
 * faster.  Only the order of the fp32 sums depends on it. */
static size_t db_slab(size_t n)
{
    if (n > 2 * 8) return DB_KC_MANY;
    if (dsattn_cpu_l1d_bytes() < 48 * 1024) return DB_KC;
    const size_t g = n < 8 ? n : 8, fit = DB_X_L1 / (2 * g) / 32 * 32;
    return fit < DB_KC ? fit : DB_KC;
}

/* E4M3 code -> bf16, the block's exponent e folded in (base = (120 + e) << 7
 * for the normals, tab = the subnormals m * 2^-9, entry m at index m,
 * times 2^e, entry 0 zero): mag = code & 0x7f; mag >= 8 gives
 * (mag << 4) + base (exponent field (mag >> 3) + 120 + e, mantissa (mag & 7) << 4),
 * mag < 8 the table; the sign bit goes to bit 15. */
DB_AI __m512i db_decode32(const uint8_t *p, __m512i base, __m512i tab)
{
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
    __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), base);
    v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), mag,
                                      tab);
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(w, 8), _mm512_set1_epi16((short)0x8000),
                                     0xF8);                     /* v | (w << 8 & 0x8000) */
}

/* The decode's per-block constants of the 32 codes at k */
DB_AI void db_block(const int16_t *eo, size_t bs, size_t k, __m512i *base, __m512i *tab)
{
    static const int16_t sub[32] __attribute__((aligned(64))) = {
        0, 118 << 7, 119 << 7, (119 << 7) | 0x40, 120 << 7, (120 << 7) | 0x20, (120 << 7) | 0x40,
        (120 << 7) | 0x60};
    const __m512i tab0 = _mm512_load_si512(sub);
    const __m512i ev = _mm512_set1_epi16(eo[k / bs]);
    *base = _mm512_add_epi16(_mm512_set1_epi16(120 << 7), ev);
    *tab = _mm512_mask_add_epi16(tab0, 0xFE, tab0, ev);
}

/* R rows x T (1..8) tokens over one slab [k0, k0 + kn); the sums go to
 * y[t*ldy + r] (added where accumulate).  DEC (R 1, 2): the rows are
 * decoded from their codes (row r at w + r*K) here, in the loop of the
 * products (the decode's shifts and shuffles run beside the VDPBF16PS), and
 * stored to wb for the call's other token groups when STORE; else (R 1..3)
 * read from wb. */
DB_AI void db_dots(const uint8_t *w, size_t K, const int16_t *eo, size_t bs, uint16_t *wb,
                   const int DEC, const int STORE, const uint16_t *xb, size_t ldxb, size_t k0,
                   size_t kn, const int R, const int T, float *y, size_t ldy, int accumulate)
{
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) acc[r][t] = _mm512_setzero_ps();
    for (size_t c = 0; c < kn; c += 32) {
        __m512i wv[3];
        if (DEC) {
            __m512i base, tab;
            db_block(eo, bs, k0 + c, &base, &tab);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                if (!(c & 63))                  /* the codes DB_PF_ROWS rows on */
                    _mm_prefetch((const char *)(w + (DB_PF_ROWS + r) * K + k0 + c), _MM_HINT_T1);
                wv[r] = db_decode32(w + (size_t)r * K + k0 + c, base, tab);
                if (STORE) _mm512_store_si512(wb + (size_t)r * DB_KC + c, wv[r]);
            }
        } else {
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) wv[r] = _mm512_load_si512(wb + (size_t)r * DB_KC + c);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512i xv = _mm512_loadu_si512(xb + (size_t)t * ldxb + k0 + c);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
        __m512 a8[8];              /* a copy: acc stays in registers in the loop */
        float s[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) a8[t] = t < T ? acc[r][t] : _mm512_setzero_ps();
        _mm256_storeu_ps(s, dsattn_hsum8(a8));
        for (int t = 0; t < T; t++) {
            float *o = y + (size_t)t * ldy + r;
            *o = accumulate ? *o + s[t] : s[t];
        }
    }
}

/* one token group over the slab's nr rows (row r of wb at wb + r*DB_KC),
 * the token count and the decode mode constants: rows two at a time where
 * they are decoded, three at a time from wb (24 accumulators: per 32 codes
 * 3 + 8 loads for 24 VDPBF16PS, the rows and the tokens' slab in L2) */
DB_AI void db_group(const uint8_t *w, size_t K, const int16_t *eo, size_t bs, uint16_t *wb,
                    const int DEC, const int STORE, const uint16_t *xb, size_t ldxb, size_t k0,
                    size_t kn, size_t nr, const int T, float *y, size_t ldy, int accumulate)
{
    size_t r = 0;
    if (!DEC)
        for (; r + 3 <= nr; r += 3)
            db_dots(w + r * K, K, eo, bs, wb + r * DB_KC, 0, 0, xb, ldxb, k0, kn, 3, T, y + r,
                    ldy, accumulate);
    for (; r + 2 <= nr; r += 2)
        db_dots(w + r * K, K, eo, bs, wb + r * DB_KC, DEC, STORE, xb, ldxb, k0, kn, 2, T, y + r,
                ldy, accumulate);
    if (r < nr)
        db_dots(w + r * K, K, eo, bs, wb + r * DB_KC, DEC, STORE, xb, ldxb, k0, kn, 1, T, y + r,
                ldy, accumulate);
}

/* mode 0: decode only (one group: the call's tokens); 1: decode and store;
 * 2: from the stored rows */
DB_FN static void db_group_t(const uint8_t *w, size_t K, const int16_t *eo, size_t bs,
                             uint16_t *wb, int mode, const uint16_t *xb, size_t ldxb, size_t k0,
                             size_t kn, size_t nr, size_t T, float *y, size_t ldy, int accumulate)
{
    switch (T * 3 + (size_t)mode) {
#define DB_CASE(t)                                                                             \
    case 3 * t:     db_group(w, K, eo, bs, wb, 1, 0, xb, ldxb, k0, kn, nr, t, y, ldy, accumulate); \
                    break;                                                                     \
    case 3 * t + 1: db_group(w, K, eo, bs, wb, 1, 1, xb, ldxb, k0, kn, nr, t, y, ldy, accumulate); \
                    break;                                                                     \
    case 3 * t + 2: db_group(w, K, eo, bs, wb, 0, 0, xb, ldxb, k0, kn, nr, t, y, ldy, accumulate); \
                    break;
    DB_CASE(1) DB_CASE(2) DB_CASE(3) DB_CASE(4) DB_CASE(5) DB_CASE(6) DB_CASE(7) DB_CASE(8)
#undef DB_CASE
    default: break;
    }
}

DB_FN static void fp8_bf16_avx512(const uint8_t *w, size_t K, size_t nr, const int16_t *eo,
                                  size_t bs, const uint16_t *xb, size_t ldxb, size_t n, float *y,
                                  size_t ldy, void *work)
{
    uint16_t *wb = (uint16_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    for (size_t r0 = 0; r0 < nr; r0 += DB_ROWS) {
        const size_t rn = nr - r0 < DB_ROWS ? nr - r0 : DB_ROWS;
        /* equal slabs of at most db_slab codes (1280 = 640 + 640, not 1024
         * + 256); past two token groups (a prefill chunk) DB_KC_MANY, whose
         * 8 tokens' slab stays in L1 for the groups that reread the stored
         * rows */
        const size_t cap = db_slab(n);
        const size_t ns = (K + cap - 1) / cap, kc = (K / 32 + ns - 1) / ns * 32;
        for (size_t k0 = 0; k0 < K; k0 += kc) {
            const size_t kn = K - k0 < kc ? K - k0 : kc;
            for (size_t t0 = 0; t0 < n; t0 += 8)
                db_group_t(w + r0 * K, K, eo, bs, wb, t0 > 0 ? 2 : n > 8, xb + t0 * ldxb, ldxb,
                           k0, kn, rn, n - t0 < 8 ? n - t0 : 8, y + t0 * ldy + r0, ldy, k0 > 0);
        }
    }
}

/* x -> bf16 rows; 0 if an element is not a finite normal bf16 number or zero */
static int pack_bf16_avx512(const float *x, size_t ldx, size_t n, size_t K, uint16_t *xb,
                            size_t ldxb, int *efmin, int *efmax)
{
    __m512i lo = _mm512_set1_epi32(255), hi = _mm512_setzero_si512();
    __mmask16 bad = 0;
    for (size_t t = 0; t < n; t++)
        for (size_t k = 0; k < K; k += 16) {
            const __m512i v = _mm512_loadu_si512(x + t * ldx + k);
            const __m512i e = _mm512_and_si512(_mm512_srli_epi32(v, 23), _mm512_set1_epi32(0xff));
            const __mmask16 nz = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x7fffffff));
            bad |= _mm512_test_epi32_mask(v, _mm512_set1_epi32(0xffff)) |
                   _mm512_mask_cmpeq_epi32_mask(nz, e, _mm512_setzero_si512()) |
                   _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0xff));
            lo = _mm512_mask_min_epu32(lo, nz, lo, e);
            hi = _mm512_mask_max_epu32(hi, nz, hi, e);
            _mm256_storeu_si256((__m256i *)(xb + t * ldxb + k),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
        }
    *efmin = (int)_mm512_reduce_min_epu32(lo);
    *efmax = (int)_mm512_reduce_max_epu32(hi);
    return bad == 0;
}

static const dsattn_pgemm_kern pgemm_avx512 = {
    .name = "avx512", .pack_b = pack_b_avx512, .tile = tile_avx512, .tile_fp8 = tile_fp8};
static const dsattn_pgemm_kern pgemm_avx512_bf16 = {
    .name = "avx512-bf16", .pack_b = pack_b_avx512, .tile = tile_avx512, .tile_fp8 = tile_fp8,
    .pack_bf16 = pack_bf16_avx512, .fp8_bf16 = fp8_bf16_avx512};
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = &pgemm_avx512;
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_bf16_ptr = &pgemm_avx512_bf16;

#else
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = 0;
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_bf16_ptr = 0;
#endif
