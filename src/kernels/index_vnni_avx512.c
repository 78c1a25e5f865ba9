/* index_vnni_avx512.c - the lightning-indexer score over FP4 index keys with
 * AVX-512 VNNI integer dot products, bit-exact with the scalar reference.
 *
 * Why integers: an FP4 (E2M1) value times a power-of-two scale is a small
 * integer times a power of two.  With the index queries FP4-quantized too
 * (V4 / V4.1), every product q_i * k_i within a 32-value block is an
 * integer (|q|,|k| <= 12 in half-units) times one power of two, so the
 * block's dot product is EXACT in int32.  The four block sums are scaled
 * (exactly) and added in double, then rounded once to fp32: precisely the
 * reference's "exact products, double accumulation, one rounding".  The
 * head weighting (bf16 dot, relu, bf16 product, double head sum, bf16
 * score) follows dsattn_index_scores_bf16 in src/ops/indexer.c.
 *
 * Layout per call (one query token): q as int8 half-units arranged for
 * vpdpbusd - for each group of 4 dims, 16 heads x 4 bytes per zmm - and a
 * bias correction, because vpdpbusd multiplies unsigned by signed bytes:
 * keys are stored as k + 12 (0..24) and 12 * sum(q) is subtracted.  The
 * layout is index_prep.c's, shared with the AVX2 form (index_avx2.c), which
 * forms the same int32 block sums and scales and weights them in the same
 * order: both forms give the same bits.
 *
 * Where the CPU and OS offer AMX-INT8 (checked at run time; the machines
 * dsattn targets may not have it), the integer block dots of 16 keys x 16
 * heads come from one tile multiply (TDPBUSD: the same unsigned x signed
 * byte products, summed exactly in int32) instead of 32 vpdpbusd; the
 * scaling and head weighting that follow are the same code, so both forms
 * give the same bits.
 *
 * The block sums are scaled and added in double (the reference's exact
 * products and double sum).  When a key's block scales and the query's
 * block units lie close together - within 8 binades, and far from the ends
 * of fp32's range, which dsattn_index_key_fits_f32 (index_vnni.h) checks
 * from the exponents alone - the
 * four terms of every head (integers below 2^14 times powers of two) and
 * all their partial sums fit in 24 bits, so the same sums formed in fp32 are
 * exact too, and equal the rounded double; those keys take the cheaper fp32
 * form.  The others keep the double form.
 *
 * Limits: nh a multiple of 16 up to 64, dh a multiple of 32 up to 256;
 * callers check dsattn_index_vnni_ok() and fall back to the reference.
 */
#include "index_vnni.h"

#include "kernels.h"
#include "numfmt.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

int dsattn_index_vnni_ok(size_t nh, size_t dh)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
    }
    return have && nh % 16 == 0 && nh >= 16 && nh <= 64 && dh % 32 == 0 && dh >= 32 &&
           dh <= 256;
}

int dsattn_index_amx_ok(void) { return dsattn_cpu_has_amx_int8(); }

int dsattn_index_vnni_prepare(dsattn_index_vnni_q *p, const float *q, size_t nh,
                              size_t dh, const float *w)
{
    if (!dsattn_index_q_prepare(p, q, nh, dh, w)) return 0;
    p->use_amx = dsattn_index_amx_ok();
    return 1;
}

VNNI_TARGET static inline __m512 round_bf16_ps(__m512 x)
{
    /* RNE to bf16 on finite values: add 0x7fff + lsb, clear the low half */
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    u = _mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u));
    return _mm512_castsi512_ps(u);
}

/* Decode one row's FP4 codes to biased half-units, element order kept. */
VNNI_TARGET static inline void decode_row(const uint8_t *row, size_t dh, __m512i lut,
                                          uint8_t *kb)
{
    const __m512i m4 = _mm512_set1_epi16(0x0f);
    for (size_t c = 0; c < dh / 2; c += 32) {
        size_t left = dh / 2 - c;
        __mmask32 lm = left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1);
        __m512i x = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lm, row + c));
        __m512i lo = _mm512_and_si512(x, m4);
        __m512i hi = _mm512_slli_epi16(_mm512_srli_epi16(x, 4), 8);
        __m512i codes = _mm512_or_si512(lo, hi);           /* bytes: lo, hi, lo, hi ... */
        _mm512_store_si512((__m512i *)(kb + 2 * c), _mm512_shuffle_epi8(lut, codes));
    }
}

/* Exact block dot (int32; the accumulator started at -bias, so the bias is
 * already removed) scaled into the double totals: corr * u_q * s_k, an
 * integer times powers of two, exact in double; one fused add each. */
VNNI_TARGET static inline void block_to_tot(__m512i corr, const double *unitd, __m512d ksd,
                                            __m512d *t0, __m512d *t1)
{
    __m512d f0 = _mm512_cvtepi32_pd(_mm512_castsi512_si256(corr));  /* |corr| <= 9216 */
    __m512d f1 = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(corr, 1));
    __m512d u0 = _mm512_mul_pd(_mm512_loadu_pd(unitd), ksd);
    __m512d u1 = _mm512_mul_pd(_mm512_loadu_pd(unitd + 8), ksd);
    *t0 = _mm512_fmadd_pd(f0, u0, *t0);
    *t1 = _mm512_fmadd_pd(f1, u1, *t1);
}

/* The fp32 form of block_to_tot: corr * (u * s_k), all exact (dsattn_index_key_fits_f32). */
VNNI_TARGET static inline void block_to_tot32(__m512i corr, const float *unit, __m512 ks,
                                              __m512 *t)
{
    *t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(_mm512_loadu_ps(unit), ks), *t);
}

/* 2^(e - 128) as a float, for dsattn_index_key_fits_f32 keys (normal range) */
VNNI_TARGET static inline __m512 key_scale32(uint8_t e)
{
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)(((uint32_t)e + 127u - 128u) << 23)));
}

/* One chunk of 16 heads' fp32 dots into the double head sum:
 * bf16(dot) -> relu -> bf16(* w) -> added in double. */
VNNI_TARGET static inline __m512d head_chunk(__m512d hs, __m512 dot, const float *w)
{
    __m512 d = _mm512_max_ps(round_bf16_ps(dot), _mm512_setzero_ps());
    __m512 pr = round_bf16_ps(_mm512_mul_ps(d, _mm512_loadu_ps(w)));
    hs = _mm512_add_pd(hs, _mm512_cvtps_pd(_mm512_castps512_ps256(pr)));
    return _mm512_add_pd(hs, _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pr), 1))));
}

/* Head weighting from fp32 block totals (equal to the rounded double ones). */
VNNI_TARGET static inline float head_sum32(const __m512 *tot, size_t nhc, const float *w)
{
    __m512d hs = _mm512_setzero_pd();
    for (size_t hc = 0; hc < nhc; hc++) hs = head_chunk(hs, tot[hc], w + hc * 16);
    return dsattn_round_bf16((float)_mm512_reduce_add_pd(hs));
}

/* Head weighting from double totals: each rounded to fp32 first, then as
 * head_sum32. */
VNNI_TARGET static inline float head_sum(const __m512d *tot, size_t nhc, const float *w)
{
    __m512d hs = _mm512_setzero_pd();
    for (size_t hc = 0; hc < nhc; hc++) {
        __m256 d0 = _mm512_cvtpd_ps(tot[2 * hc]), d1 = _mm512_cvtpd_ps(tot[2 * hc + 1]);
        hs = head_chunk(hs, _mm512_insertf32x8(_mm512_castps256_ps512(d0), d1, 1), w + hc * 16);
    }
    return dsattn_round_bf16((float)_mm512_reduce_add_pd(hs));
}

#define VNNI_ROWS 4

/* NR rows x NHC head-chunks with compile-time shapes, so the int32
 * accumulators and double totals stay in registers (with runtime bounds
 * the compiler spilled them around every vpdpbusd).  Each query load feeds
 * NR independent dpbusd chains, hiding the instruction's latency. */
#define ALWAYS_INLINE __attribute__((always_inline)) inline
VNNI_TARGET static ALWAYS_INLINE void score_rows_form(const dsattn_index_vnni_q *p,
                                                      const uint8_t *const *row, size_t dh,
                                                      __m512i lut, const size_t NR,
                                                      const size_t NHC, const int ALL32,
                                                      float *out)
{
    uint8_t kb[VNNI_ROWS][256 + 64] __attribute__((aligned(64)));
    const size_t nb = dh / 32;
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) decode_row(row[r], dh, lut, kb[r]);
    __m512d tot[VNNI_ROWS][8];
    __m512 tot32[VNNI_ROWS][4];
    int f32[VNNI_ROWS];
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) {
        f32[r] = ALL32;
#pragma GCC unroll 8
        for (size_t v = 0; v < 2 * NHC; v++) tot[r][v] = _mm512_setzero_pd();
#pragma GCC unroll 4
        for (size_t v = 0; v < NHC; v++) tot32[r][v] = _mm512_setzero_ps();
    }
    for (size_t b = 0; b < nb; b++) {
        __m512i acc[VNNI_ROWS][4];
#pragma GCC unroll 4
        for (size_t r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (size_t hc = 0; hc < NHC; hc++)
                acc[r][hc] = _mm512_loadu_si512((const void *)(p->nbias + b * 64 + hc * 16));
#pragma GCC unroll 8
        for (size_t g = 0; g < 8; g++) {
            const int8_t *qg = p->qb + ((b * 8 + g) * 64) * 4;
            __m512i kv[VNNI_ROWS];
#pragma GCC unroll 4
            for (size_t r = 0; r < NR; r++) {
                int32_t kk;
                memcpy(&kk, kb[r] + b * 32 + g * 4, 4);
                kv[r] = _mm512_set1_epi32(kk);
            }
#pragma GCC unroll 4
            for (size_t hc = 0; hc < NHC; hc++) {
                __m512i q = _mm512_load_si512((const void *)(qg + hc * 64));
#pragma GCC unroll 4
                for (size_t r = 0; r < NR; r++)
                    acc[r][hc] = _mm512_dpbusd_epi32(acc[r][hc], kv[r], q);
            }
        }
#pragma GCC unroll 4
        for (size_t r = 0; r < NR; r++) {
            const uint8_t e8 = row[r][dh / 2 + b];
            if (f32[r]) {
                const __m512 ks = key_scale32(e8);
#pragma GCC unroll 4
                for (size_t hc = 0; hc < NHC; hc++)
                    block_to_tot32(acc[r][hc], p->unit + b * 64 + hc * 16, ks, &tot32[r][hc]);
                continue;
            }
            /* UE8M0 byte e -> 2^(e-127) / 2 as a double, from the bits */
            const uint64_t e = e8;
            const __m512d ksd = _mm512_castsi512_pd(_mm512_set1_epi64((long long)((e + 1023 - 128) << 52)));
#pragma GCC unroll 4
            for (size_t hc = 0; hc < NHC; hc++)
                block_to_tot(acc[r][hc], p->unitd + b * 64 + hc * 16, ksd, &tot[r][2 * hc],
                             &tot[r][2 * hc + 1]);
        }
    }
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++)
        out[r] = f32[r] ? head_sum32(tot32[r], NHC, p->w) : head_sum(tot[r], NHC, p->w);
}

/* score_rows_form in one scaling for all the rows, a constant: the fp32 one
 * when every row takes it (the common case), else the double one, which
 * gives the fp32-fit keys the same bits (the rounded double sum is their
 * exact fp32 sum).  With a branch per row in the block loop, both sets of
 * totals stayed live and GCC spilled them. */
VNNI_TARGET static ALWAYS_INLINE void score_rows_fit(const dsattn_index_vnni_q *p,
                                                     const uint8_t *const *row, size_t dh,
                                                     __m512i lut, const size_t NR,
                                                     const size_t NHC, float *out)
{
    int all = 1;
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) all &= dsattn_index_key_fits_f32(p, row[r] + dh / 2, dh / 32);
    if (all) score_rows_form(p, row, dh, lut, NR, NHC, 1, out);
    else     score_rows_form(p, row, dh, lut, NR, NHC, 0, out);
}

/* 4 chunks: 2 rows at a time, or the totals spill */
VNNI_TARGET static ALWAYS_INLINE void score_rows(const dsattn_index_vnni_q *p,
                                                 const uint8_t *const *row, size_t dh,
                                                 __m512i lut, const size_t NR,
                                                 const size_t NHC, float *out)
{
    if (NHC > 3 && NR > 2) {
        score_rows_fit(p, row, dh, lut, 2, NHC, out);
        score_rows_fit(p, row + 2, dh, lut, NR - 2, NHC, out + 2);
    } else {
        score_rows_fit(p, row, dh, lut, NR, NHC, out);
    }
}

/* ---- AMX form: 16 keys per pass ------------------------------------- */

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))
#define KB_STRIDE (256 + 64)

typedef struct {
    uint8_t  palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} amx_cfg;

/* tmm0: 16 keys x 32 biased bytes (one 32-dim block), tmm1: the block's
 * queries for 16 heads (8 rows of 4 dims x 16 heads, the qb layout), tmm2..5:
 * 16 keys x 16 heads int32 per head chunk, loaded with the bias correction
 * in every row (a stride-0 tile load) so the products add onto it. */
AMX_TARGET static void score_amx(const dsattn_index_vnni_q *p, const uint8_t *base, size_t rb,
                                 const int32_t *sel, size_t j0, size_t n, __m512i lut,
                                 float *score)
{
    const size_t dh = p->dh, nb = dh / 32, nhc = p->nh / 16;
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[0] = 16; cfg.colsb[0] = 32;
    cfg.rows[1] = 8;  cfg.colsb[1] = 64;
    for (int t = 2; t < 6; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    /* GCC's ldtilecfg builtin does not tell the optimiser that it reads
     * the 64 bytes: without this the rows / colsb stores were dropped as
     * dead (SIGILL on the first tile load) */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
    uint8_t kb[16][KB_STRIDE] __attribute__((aligned(64)));
    int32_t cb[8][4][16][16] __attribute__((aligned(64)));    /* [block][chunk][key][head] */
    memset(kb, 0, sizeof kb);
    for (size_t j = 0; j < n; j += 16) {
        const size_t nr = n - j < 16 ? n - j : 16;
        /* the rows two passes ahead (selected rows are scattered, and even
         * in order a pass is too short for the hardware prefetcher) */
        for (size_t r = j + 32; r < j + 48 && r < n; r++) {
            const char *a = (const char *)(base + (sel ? (size_t)sel[r] : j0 + r) * rb);
            _mm_prefetch(a, _MM_HINT_T0);
            _mm_prefetch(a + rb - 1, _MM_HINT_T0);
        }
        for (size_t r = 0; r < nr; r++)
            decode_row(base + (sel ? (size_t)sel[j + r] : j0 + j + r) * rb, dh, lut, kb[r]);
        for (size_t b = 0; b < nb; b++) {
            _tile_loadd(0, kb[0] + b * 32, KB_STRIDE);
            /* one chunk at a time through tmm1; the tile numbers must be
             * constants, hence the unrolled switch */
#define AMX_CHUNK(HC, T)                                                              \
            if (HC < nhc) {                                                           \
                _tile_loadd(1, p->qb + ((b * 8) * 64 + HC * 16) * 4, 256);            \
                _tile_loadd(T, p->nbias + b * 64 + HC * 16, 0);                       \
                _tile_dpbusd(T, 0, 1);                                                \
                _tile_stored(T, cb[b][HC], 64);                                       \
            }
            AMX_CHUNK(0, 2)
            AMX_CHUNK(1, 3)
            AMX_CHUNK(2, 4)
            AMX_CHUNK(3, 5)
#undef AMX_CHUNK
        }
        for (size_t r = 0; r < nr; r++) {
            const uint8_t *row = base + (sel ? (size_t)sel[j + r] : j0 + j + r) * rb;
            if (dsattn_index_key_fits_f32(p, row + dh / 2, nb)) {
                __m512 t32[4];
                for (size_t v = 0; v < nhc; v++) t32[v] = _mm512_setzero_ps();
                for (size_t b = 0; b < nb; b++) {
                    const __m512 ks = key_scale32(row[dh / 2 + b]);
                    for (size_t hc = 0; hc < nhc; hc++) {
                        const __m512i corr = _mm512_load_si512((const void *)cb[b][hc][r]);
                        block_to_tot32(corr, p->unit + b * 64 + hc * 16, ks, &t32[hc]);
                    }
                }
                score[j + r] = head_sum32(t32, nhc, p->w);
                continue;
            }
            __m512d tot[8];
            for (size_t v = 0; v < 2 * nhc; v++) tot[v] = _mm512_setzero_pd();
            for (size_t b = 0; b < nb; b++) {
                const uint64_t e = row[dh / 2 + b];
                const __m512d ksd = _mm512_castsi512_pd(_mm512_set1_epi64((long long)((e + 1023 - 128) << 52)));
                for (size_t hc = 0; hc < nhc; hc++) {
                    const __m512i corr = _mm512_load_si512((const void *)cb[b][hc][r]);
                    block_to_tot(corr, p->unitd + b * 64 + hc * 16, ksd, &tot[2 * hc],
                                 &tot[2 * hc + 1]);
                }
            }
            score[j + r] = head_sum(tot, nhc, p->w);
        }
    }
    _tile_release();
}

#define IDX_ROWS VNNI_ROWS
#define IDX_LUT __m512i
#define IDX_TARGET VNNI_TARGET
#include "index_scores_tmpl.h"

VNNI_TARGET void dsattn_index_vnni_scores(const dsattn_index_vnni_q *p,
                                          const uint8_t *base, size_t row_bytes,
                                          const int32_t *sel, size_t j0, size_t n,
                                          float *score)
{
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dsattn_index_k_lut));
    if (p->use_amx && dsattn_index_amx_ok()) {
        score_amx(p, base, row_bytes, sel, j0, n, lut, score);
        return;
    }
    score_heads(p, base, row_bytes, sel, j0, n, lut, score);
}

static const dsattn_index_kern index_vnni = {
    "vnni", dsattn_index_vnni_ok, dsattn_index_vnni_prepare, dsattn_index_vnni_scores,
};
const dsattn_index_kern *const dsattn_index_vnni_ptr = &index_vnni;

#else

int dsattn_index_vnni_ok(size_t nh, size_t dh) { (void)nh; (void)dh; return 0; }
int dsattn_index_amx_ok(void) { return 0; }
int dsattn_index_vnni_prepare(dsattn_index_vnni_q *p, const float *q, size_t nh,
                              size_t dh, const float *w)
{ (void)p; (void)q; (void)nh; (void)dh; (void)w; return 0; }
void dsattn_index_vnni_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score)
{ (void)p; (void)base; (void)row_bytes; (void)sel; (void)j0; (void)n; (void)score; }

const dsattn_index_kern *const dsattn_index_vnni_ptr = NULL;

#endif
