/* test_pgemm.c - the prefill GEMM: its SIMD tables (AVX-512, AVX2, NEON)
 * against the scalar `ref` table bit for bit (register tile, activation
 * packing, FP8 tile decode with and without NaN codes, the x256 fold and
 * its overflow fallback), and the prefill Linear of fast mode (the
 * context's own table and, where it runs, the AVX2 table) against
 * reference mode on shapes that cut every tile, slice and group edge,
 * thread counts included. */
#include "harness.h"
#include "internal.h"
#include "kernels.h"
#include "mla_kernels.h"
#include "numfmt.h"
#include "ops.h"
#include "ktab.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The SIMD pgemm tables this build and CPU run (AVX-512, AVX2, NEON),
 * into pk[]; none: the test is marked skipped.  Returns how many. */
static int simd_tables(const dsattn_pgemm_kern *pk[3])
{
    static const dsattn_isa isas[3] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX2, DSATTN_ISA_NEON };
    int n = 0;
    for (int i = 0; i < 3; i++) {
        dsattn_ktab t;
        if (dsattn_ktab_fill(&t, isas[i], 0) == DSATTN_OK && t.pgemm) pk[n++] = t.pgemm;
    }
    if (!n) dsattn_test_skip("no SIMD GEMM tiles (CPU or build)");
    return n;
}

DSATTN_TEST(pgemm, tile_and_pack_equal_ref_bit_for_bit)
{
    const dsattn_pgemm_kern *tabs[3], *rk = &dsattn_pgemm_ref;
    const int ntab = simd_tables(tabs);
    for (int ti = 0; ti < ntab; ti++) {
    const dsattn_pgemm_kern *pk = tabs[ti];
    enum { KMAX = 530, LDC = 40 };
    dsattn_rng r = { 7 };
    float *a = malloc(KMAX * 12 * 4), *b = malloc(KMAX * 32 * 4);
    float *c0 = malloc(12 * LDC * 4), *c1 = malloc(12 * LDC * 4), *c2 = malloc(12 * LDC * 4);
    for (size_t i = 0; i < KMAX * 12; i++) a[i] = dsattn_rng_normal(&r);
    for (size_t i = 0; i < KMAX * 32; i++) b[i] = dsattn_rng_normal(&r);
    for (size_t i = 0; i < 12 * LDC; i++) c0[i] = dsattn_rng_normal(&r);
    /* columns < nw as the ref tile; a form may write up to column 31
     * (pgemm.h), never beyond */
    const size_t kcs[4] = { 1, 7, 64, KMAX };
    for (int ki = 0; ki < 4; ki++)
        for (int nw = 8; nw <= 32; nw += 8)
            for (int first = 0; first < 2; first++) {
                memcpy(c1, c0, 12 * LDC * 4);
                memcpy(c2, c0, 12 * LDC * 4);
                pk->tile(a, b, kcs[ki], nw, c1, LDC, first);
                rk->tile(a, b, kcs[ki], nw, c2, LDC, first);
                int same = 1;
                for (size_t i = 0; i < 12; i++)
                    same &= memcmp(c1 + i * LDC, c2 + i * LDC, (size_t)nw * 4) == 0 &&
                            memcmp(c1 + i * LDC + 32, c0 + i * LDC + 32, (LDC - 32) * 4) == 0;
                CHECK_MSG(same, "%s tile kc %zu nw %d first %d", pk->name, kcs[ki], nw, first);
            }

    /* packing: tokens short of a group, K short of a 16-block */
    float *x = malloc(32 * 101 * 4), *p1 = malloc(101 * 32 * 4), *p2 = malloc(101 * 32 * 4);
    for (size_t i = 0; i < 32 * 101; i++) x[i] = dsattn_rng_normal(&r);
    const size_t nts[4] = { 1, 13, 17, 32 }, ks[4] = { 1, 15, 16, 100 };
    for (int ni = 0; ni < 4; ni++)
        for (int ki = 0; ki < 4; ki++) {
            memset(p1, 0xff, 101 * 32 * 4);
            memset(p2, 0xff, 101 * 32 * 4);
            pk->pack_b(x, 101, nts[ni], ks[ki], p1);
            rk->pack_b(x, 101, nts[ni], ks[ki], p2);
            CHECK_MSG(memcmp(p1, p2, ks[ki] * 32 * 4) == 0, "%s pack nt %zu K %zu", pk->name,
                      nts[ni], ks[ki]);
        }
    free(a); free(b); free(c0); free(c1); free(c2); free(x); free(p1); free(p2);
    }
}

DSATTN_TEST(pgemm, fp8_tile_decode_equals_ref_on_every_code)
{
    const dsattn_pgemm_kern *tabs[3], *rk = &dsattn_pgemm_ref;
    const int ntab = simd_tables(tabs);
    for (int ti = 0; ti < ntab; ti++) {
    const dsattn_pgemm_kern *pk = tabs[ti];
    /* K = 512: whole blocks; K = 48: a last partial block at bs 32, and
     * bs 128 past K */
    static const size_t Ks[2] = { 512, 48 };
    for (int kk = 0; kk < 2; kk++) {
    const size_t K = Ks[kk];
    uint8_t *w = malloc(12 * K);
    float *t1 = malloc(K * 12 * 4), *t2 = malloc(K * 12 * 4);
    float scales[4][512 / 16];
    dsattn_rng r = { 11 };
    /* every code (NaN codes 0x7f / 0xff too) in every row */
    for (size_t i = 0; i < 12 * K; i++) w[i] = (uint8_t)(i * 37 + i / K);
    for (size_t s = 0; s < 4; s++)
        for (size_t j = 0; j < K / 16; j++) scales[s][j] = ldexpf(1.0f, (int)(dsattn_rng_u64(&r) % 40) - 20);
    scales[2][3] = 0x1p121f;          /* 256 s overflows: the exact decode */
    scales[3][1] = INFINITY;
    scales[3][2] = NAN;
    const size_t bss[3] = { 16, 32, 128 }, nrs[3] = { 1, 5, 12 };
    for (int bi = 0; bi < 3; bi++)
        for (int ni = 0; ni < 3; ni++)
            for (int s = 0; s < 4; s++)
                for (int finite = 0; finite < 2; finite++) {
                    if (finite)      /* the caller's promise: no NaN code */
                        for (size_t i = 0; i < 12 * K; i++)
                            if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1;
                    const float *sc[12];
                    for (int i = 0; i < 12; i++) sc[i] = scales[(s + (i >= 6)) % 4];
                    pk->tile_fp8(w, K, sc, bss[bi], nrs[ni], finite, t1);
                    rk->tile_fp8(w, K, sc, bss[bi], nrs[ni], finite, t2);
                    CHECK_MSG(CHECK_BITS("fp8 tile", t1, t2, (size_t)K * 12),
                              "%s bs %zu nr %zu scales %d finite %d", pk->name, bss[bi],
                              nrs[ni], s, finite);
                }
    free(w); free(t1); free(t2);
    }
    }
}

/* |fast - ref| <= 2^-20 * sum |w x| per output (K <= 1100 terms of fp32
 * rounding, far inside), NaN where the reference has NaN. */
static void check_prefill(const char *what, const float *got, const float *want,
                          const float *mag, size_t n)
{
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        int ok = isnan(want[i]) ? isnan(got[i]) : fabsf(got[i] - want[i]) <= 0x1p-20f * mag[i];
        if (!ok && bad++ == 0) at = i;
    }
    CHECK_MSG(bad == 0, "%s: %zu outputs off, first at %zu: %g vs %g", what, bad, at,
              (double)got[at], (double)want[at]);
}

/* An FP8 weight over the test's codes and block scales */
static dsattn_weight fp8_weight(size_t R, size_t K, const uint8_t *w8, const float *sc, size_t bs,
                                int finite)
{
    dsattn_weight w = { .kind = DSATTN_W_FP8, .rows = R, .cols = K, .data = w8, .scale = sc,
                        .block = bs, .finite = finite };
    return w;
}

/* mag[t*R + o] = sum_k |w(o, k) x(t, k)|: the scale of check_prefill's bound */
static void magnitudes(const dsattn_weight *w, const float *x, size_t T, float *mag)
{
    const size_t R = w->rows, K = w->cols;
    for (size_t t = 0; t < T; t++)
        for (size_t o = 0; o < R; o++) {
            float m = 0.0f;
            for (size_t k = 0; k < K; k++) {
                float wv;
                if (w->kind == DSATTN_W_FP8)
                    wv = dsattn_e4m3_to_f32(((const uint8_t *)w->data)[o * K + k]) *
                         w->scale[(o / w->block) * ((K + w->block - 1) / w->block) + k / w->block];
                else if (w->kind == DSATTN_W_BF16)
                    wv = dsattn_bf16_to_f32(((const uint16_t *)w->data)[o * K + k]);
                else
                    wv = ((const float *)w->data)[o * K + k];
                m += fabsf(wv * x[t * K + k]);
            }
            mag[t * R + o] = m;
        }
}

/* The bench of a tile path's Linear tests (AMX, bf16-dot): FP8 codes
 * without NaN, power-of-two block scales 2^-9 .. 2^-3, activations that are
 * bf16 numbers, and four contexts - reference mode (cr), the path on 1 and
 * on 2 threads (a1, a2: the caller turns it on) and the same fast context
 * without it (f2). */
typedef struct {
    uint8_t *w8;
    float *sc, *x, *mag, *yr, *ya, *y2, *yf;
    dsattn_ctx *cr, *a1, *a2, *f2;
} path_bench;

static void path_bench_init(path_bench *b, uint64_t seed, size_t rmax, size_t kmax, size_t tmax)
{
    dsattn_rng r = { seed };
    b->w8 = malloc(rmax * kmax);
    b->sc = malloc(rmax * kmax * 4);
    b->x = malloc(tmax * kmax * 4);
    b->mag = malloc(tmax * rmax * 4);
    b->yr = malloc(tmax * rmax * 4);
    b->ya = malloc(tmax * rmax * 4);
    b->y2 = malloc(tmax * rmax * 4);
    b->yf = malloc(tmax * rmax * 4);
    for (size_t i = 0; i < rmax * kmax; i++) b->w8[i] = (uint8_t)(dsattn_rng_u64(&r) & 0xf7);
    for (size_t i = 0; i < rmax * kmax; i++) b->sc[i] = ldexpf(1.0f, (int)(i % 7) - 9);
    for (size_t i = 0; i < tmax * kmax; i++) b->x[i] = dsattn_round_bf16(dsattn_rng_normal(&r));
    b->cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 2);
    b->a1 = dsattn_test_ctx(DSATTN_MODE_FAST, 1);
    b->a2 = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    b->f2 = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
}

static void path_bench_free(path_bench *b)
{
    dsattn_ctx_destroy(b->cr);
    dsattn_ctx_destroy(b->a1);
    dsattn_ctx_destroy(b->a2);
    dsattn_ctx_destroy(b->f2);
    free(b->w8); free(b->sc); free(b->x); free(b->mag);
    free(b->yr); free(b->ya); free(b->y2); free(b->yf);
}

/* One case, T tokens of b->x through w in G groups: the path against
 * reference mode within check_prefill's bound and the same bits on 1 and
 * 2 threads.  Returns whether its bits differ from f2's (the path ran). */
static int path_bench_case(path_bench *b, const char *what, const dsattn_weight *w, size_t G,
                           size_t T)
{
    const size_t R = w->rows, K = w->cols;
    magnitudes(w, b->x, T, b->mag);       /* every group reads the same x (gx = 0) */
    CHECK_OK(dsattn_linear_grouped(b->cr, w, G, b->x, K, 0, T, b->yr, R, DSATTN_OUT_F32));
    CHECK_OK(dsattn_linear_grouped(b->a1, w, G, b->x, K, 0, T, b->ya, R, DSATTN_OUT_F32));
    CHECK_OK(dsattn_linear_grouped(b->a2, w, G, b->x, K, 0, T, b->y2, R, DSATTN_OUT_F32));
    CHECK_OK(dsattn_linear_grouped(b->f2, w, G, b->x, K, 0, T, b->yf, R, DSATTN_OUT_F32));
    check_prefill(what, b->ya, b->yr, b->mag, T * R);
    CHECK_MSG(memcmp(b->ya, b->y2, T * R * 4) == 0, "%s: 1 and 2 threads differ", what);
    return memcmp(b->ya, b->yf, T * R * 4) != 0;
}

/* Input the path must leave to the other paths: a2 gives exactly f2's bits */
static void path_bench_same(path_bench *b, const char *what, const dsattn_weight *w, size_t T)
{
    const size_t R = w->rows, K = w->cols;
    CHECK_OK(dsattn_linear(b->a2, w, b->x, K, T, b->ya, R, DSATTN_OUT_F32, NULL, NULL));
    CHECK_OK(dsattn_linear(b->f2, w, b->x, K, T, b->yf, R, DSATTN_OUT_F32, NULL, NULL));
    CHECK_MSG(memcmp(b->ya, b->yf, T * R * 4) == 0, "%s: not the other path's bits", what);
}

/* The fallbacks both tile paths share: a scale that is not a power of two,
 * an activation that is not a bf16 number (FP8 weight 64 x 256, 33 tokens) */
static void path_bench_common_fallbacks(path_bench *b)
{
    const size_t K = 256;
    dsattn_weight w = fp8_weight(64, K, b->w8, b->sc, 32, 1);
    const float keep = b->sc[1];
    b->sc[1] = 3.0e-3f;
    path_bench_same(b, "non-power-of-two scale", &w, 33);
    b->sc[1] = keep;
    const float xk = b->x[5 * K + 7];
    b->x[5 * K + 7] = 1.0f + 0x1p-12f;
    path_bench_same(b, "non-bf16 activation", &w, 33);
    b->x[5 * K + 7] = xk;
}

DSATTN_TEST(pgemm, prefill_linear_fast_matches_reference_and_ignores_threads)
{
    /* R cuts 12-row tiles and 96-row panels; K = 528 cuts 256 slices
     * (fused FP8 decode), K = 520 is not a multiple of 16 (row decode,
     * partial scale block); T cuts 32-token groups, T = 17 ends on a
     * 16-wide tile. */
    const size_t Rs[3] = { 1, 13, 200 }, Ks[2] = { 528, 520 }, Ts[3] = { 8, 17, 70 };
    enum { BS = 32, RMAX = 200, KMAX = 528, TMAX = 70 };
    dsattn_rng r = { 21 };
    uint8_t *w8 = malloc(RMAX * KMAX);
    uint16_t *w16 = malloc(RMAX * KMAX * 2);
    float *w32 = malloc(RMAX * KMAX * 4);
    float *sc = malloc(((RMAX + BS - 1) / BS) * ((KMAX + BS - 1) / BS) * 4);
    float *x = malloc(TMAX * KMAX * 4), *mag = malloc(TMAX * RMAX * 4);
    float *yr = malloc(TMAX * RMAX * 4), *yf = malloc(TMAX * RMAX * 4), *y1 = malloc(TMAX * RMAX * 4);
    for (size_t i = 0; i < RMAX * KMAX; i++) {
        w8[i] = (uint8_t)(dsattn_rng_u64(&r) & 0xf7);      /* no NaN code */
        w16[i] = (uint16_t)(0x3c00 + (dsattn_rng_u64(&r) & 0x83ff));
        w32[i] = dsattn_rng_normal(&r);
    }
    for (size_t i = 0; i < ((RMAX + BS - 1) / BS) * ((KMAX + BS - 1) / BS); i++)
        sc[i] = ldexpf(1.0f, (int)(i % 7) - 9);
    for (size_t i = 0; i < TMAX * KMAX; i++) x[i] = dsattn_rng_normal(&r);
    dsattn_ctx *cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 2);
    for (int ii = 0; ii < 2; ii++) {               /* the context's own table, then AVX2 */
    dsattn_ctx *cf[3] = { NULL, NULL, NULL };
    dsattn_ktab t;
    if (ii == 1 && dsattn_ktab_fill(&t, DSATTN_ISA_AVX2, 0) != DSATTN_OK) break;
    for (int c = 0; c < 3; c++) {
        dsattn_ctx_params p = dsattn_ctx_default_params();
        p.mode = DSATTN_MODE_FAST;
        p.n_threads = c + 1;
        p.isa = ii == 1 ? DSATTN_ISA_AVX2 : DSATTN_ISA_AUTO;
        CHECK_OK(dsattn_ctx_create(&cf[c], &p));
    }
    if (!cf[0] || !cf[1] || !cf[2]) break;
    for (int kind = 0; kind < 4; kind++)          /* FP8, FP8 with a NaN code, BF16, F32 */
        for (int ri = 0; ri < 3; ri++)
            for (int ki = 0; ki < 2; ki++)
                for (int ti = 0; ti < 3; ti++) {
                    const size_t R = Rs[ri], K = Ks[ki], T = Ts[ti];
                    dsattn_weight w = { .rows = R, .cols = K };
                    if (kind < 2) {
                        w = fp8_weight(R, K, w8, sc, BS, kind == 0);
                        w8[R / 2 * K + 3] = kind == 1 ? 0x7f : 0x11;
                    } else {
                        w.kind = kind == 2 ? DSATTN_W_BF16 : DSATTN_W_F32;
                        w.data = kind == 2 ? (const void *)w16 : (const void *)w32;
                    }
                    magnitudes(&w, x, T, mag);
                    CHECK_OK(dsattn_linear(cr, &w, x, K, T, yr, R, DSATTN_OUT_F32, NULL, NULL));
                    for (int c = 0; c < 3; c++) {
                        float *y = c == 0 ? y1 : yf;
                        memset(y, 0xff, TMAX * RMAX * 4);
                        CHECK_OK(dsattn_linear(cf[c], &w, x, K, T, y, R, DSATTN_OUT_F32, NULL,
                                               NULL));
                        char what[96];
                        snprintf(what, sizeof what, "%s kind %d R %zu K %zu T %zu threads %d",
                                 dsattn_ctx_isa_name(cf[c]), kind, R, K, T, c + 1);
                        check_prefill(what, y, yr, mag, T * R);
                        if (c > 0)
                            CHECK_MSG(memcmp(y, y1, T * R * 4) == 0, "%s: not the 1-thread bits",
                                      what);
                    }
                    if (kind == 1) w8[R / 2 * K + 3] = 0x11;    /* finite again */
                }
    for (int c = 0; c < 3; c++) dsattn_ctx_destroy(cf[c]);
    }
    dsattn_ctx_destroy(cr);
    free(w8); free(w16); free(w32); free(sc); free(x); free(mag); free(yr); free(yf); free(y1);
}

DSATTN_TEST(pgemm, prefill_linear_amx_matches_reference_fma_and_ignores_threads)
{
    /* Where the CPU has AMX-BF16: the prefill Linear on the tiles (FP8
     * weights with power-of-two scales in blocks of 32 - the direct bf16
     * decode - and of 48 - through fp32 rows -, bf16 weights, plain and
     * grouped in 2; 8, 33 and 130 tokens: a partial and a second token
     * chunk) against reference mode within check_prefill's bound, the same
     * bits on 1 and 2 threads, and not the FMA tile's bits (so the tiles
     * ran).  Then the fallbacks: a scale that is not a power of two, or
     * activations that are not bf16 numbers, give exactly the FMA tile's
     * bits. */
    enum { RMAX = 96, KMAX = 544, TMAX = 130 };
    if (!dsattn_test_amx_or_skip()) return;
    path_bench b;
    path_bench_init(&b, 31, RMAX, KMAX, TMAX);
    dsattn_rng r = { 32 };
    uint16_t *w16 = malloc(RMAX * KMAX * 2);
    for (size_t i = 0; i < RMAX * KMAX; i++)
        w16[i] = (uint16_t)(0x3c00 + (dsattn_rng_u64(&r) & 0x83ff));
    dsattn_ctx_set_amx(b.a1, 1);
    dsattn_ctx_set_amx(b.a2, 1);
    dsattn_ctx_set_amx(b.f2, 0);
    const size_t Rs[2] = { 32, 96 }, Ks[2] = { 256, 544 }, Ts[3] = { 8, 33, 130 };
    size_t differ = 0;
    for (int kind = 0; kind < 3; kind++)           /* FP8 bs 32, FP8 bs 48, BF16 */
        for (int ri = 0; ri < 2; ri++)
            for (int ki = 0; ki < 2; ki++)
                for (int ti = 0; ti < 3; ti++)
                    for (size_t G = 1; G <= 2; G++) {
                        const size_t R = Rs[ri] * G, K = Ks[ki], T = Ts[ti];
                        const size_t bs = kind == 1 ? 48 : 32;
                        if (R > RMAX || (kind < 2 && Rs[ri] % bs)) continue;   /* groups: whole blocks */
                        dsattn_weight w = { .rows = R, .cols = K };
                        if (kind < 2) {
                            w = fp8_weight(R, K, b.w8, b.sc, bs, 1);
                        } else {
                            w.kind = DSATTN_W_BF16;
                            w.data = w16;
                        }
                        char what[96];
                        snprintf(what, sizeof what, "AMX kind %d R %zu K %zu T %zu G %zu", kind, R,
                                 K, T, G);
                        differ += (size_t)path_bench_case(&b, what, &w, G, T);
                    }
    CHECK_MSG(differ > 0, "the AMX prefill gave the FMA tile's bits in every case");
    path_bench_common_fallbacks(&b);
    path_bench_free(&b);
    free(w16);
}

/* ==== The bf16-dot GEMM (pgemm.h: the avx512-bf16 table) ================ */

/* The avx512-bf16 table where the CPU runs it; NULL: the test is skipped. */
static const dsattn_pgemm_kern *bf16dot_table(void)
{
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, 1);
    const int on = dsattn_ctx_set_bf16dot(c, 1);
    dsattn_ctx_destroy(c);
    if (!on || !dsattn_pgemm_avx512_bf16_ptr) {
        dsattn_test_skip("no AVX512-BF16 (CPU or build)");
        return NULL;
    }
    return dsattn_pgemm_avx512_bf16_ptr;
}

DSATTN_TEST(pgemm, bf16dot_decodes_every_code_at_every_exponent_exactly)
{
    /* 32 rows of 256 codes: every code but NaN (0x7f, 0xff) once per row,
     * rotated from row to row; one-hot tokens (token t has x[t] = 1), so
     * each output is one product: y[t][r] = e4m3(w[r][t]) * 2^e exactly,
     * with e per block of 32 - the decode's extremes -117 and 119
     * included, and the subnormal codes (1..7, 0x81..0x87) among them. */
    const dsattn_pgemm_kern *pk = bf16dot_table();
    if (!pk) return;
    enum { R = 32, K = 256, N = 256, LDX = K + 32 };
    uint8_t *w = malloc(R * K);
    uint16_t *xb = calloc(N * LDX, 2);
    float *y = malloc(N * R * 4);
    void *work = malloc(DSATTN_PGEMM_DOT_WORK);
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < K; k++) {
            const uint8_t c = (uint8_t)(k + 7 * r);
            w[r * K + k] = (c & 0x7f) == 0x7f ? 0 : c;
        }
    for (size_t t = 0; t < N; t++) xb[t * LDX + t] = 0x3f80;           /* 1.0 */
    static const int es[3][K / 32] = { { -117, -117, -117, -117, -117, -117, -117, -117 },
                                       { 119, 119, 119, 119, 119, 119, 119, 119 },
                                       { 0, -1, 5, -60, 60, -9, 9, 100 } };
    size_t bad = 0;
    for (int s = 0; s < 3; s++) {
        int16_t eo[K / 32];
        for (int b = 0; b < K / 32; b++) eo[b] = (int16_t)(es[s][b] * 128);
        pk->fp8_bf16(w, K, R, eo, 32, xb, LDX, N, y, R, work);
        for (size_t t = 0; t < N; t++)
            for (size_t r = 0; r < R; r++) {
                const float want = ldexpf(dsattn_e4m3_to_f32(w[r * K + t]), es[s][t / 32]);
                if (y[t * R + r] != want && bad++ == 0)
                    fprintf(stderr, "    exponents %d: code 0x%02x at k %zu: %g, want %g\n", s,
                            w[r * K + t], t, (double)y[t * R + r], (double)want);
            }
    }
    CHECK_MSG(bad == 0, "%zu decoded products wrong", bad);
    free(w); free(xb); free(y); free(work);
}

DSATTN_TEST(pgemm, bf16dot_pack_takes_only_normal_bf16_numbers)
{
    const dsattn_pgemm_kern *pk = bf16dot_table();
    if (!pk) return;
    enum { K = 64, LDX = K + 32 };
    float x[2 * K];
    uint16_t xb[2 * LDX];
    for (int i = 0; i < 2 * K; i++) x[i] = dsattn_round_bf16(ldexpf(1.5f, i % 21 - 10));
    x[3] = 0.0f;
    x[K + 4] = -0.0f;
    int lo, hi;
    CHECK(pk->pack_bf16(x, K, 2, K, xb, LDX, &lo, &hi));
    CHECK_MSG(lo == 127 - 10 && hi == 127 + 10, "exponent fields %d..%d", lo, hi);
    int same = 1;
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < K; k++) {
            uint32_t u;
            memcpy(&u, &x[t * K + k], 4);
            same &= xb[t * LDX + k] == (uint16_t)(u >> 16);
        }
    CHECK_MSG(same, "packed bits are not the upper halves");
    const float bad[4] = { 1.0f + 0x1p-12f, INFINITY, NAN, 0x1p-130f };   /* subnormal */
    for (int i = 0; i < 4; i++) {
        const float keep = x[K + 9];
        x[K + 9] = bad[i];
        CHECK_MSG(!pk->pack_bf16(x, K, 2, K, xb, LDX, &lo, &hi), "took %g", (double)bad[i]);
        x[K + 9] = keep;
    }
    for (int i = 0; i < 2 * K; i++) x[i] = 0.0f;
    CHECK(pk->pack_bf16(x, K, 2, K, xb, LDX, &lo, &hi) && lo == 255 && hi == 0);
}

DSATTN_TEST(pgemm, bf16dot_linear_matches_reference_and_falls_back_exactly)
{
    /* The bf16-dot Linear (power-of-two scales in blocks of 32 and 128,
     * plain and grouped in 2; 4, 9, 17 and 130 tokens: whole and partial
     * groups of 8; two k slabs: K = 8224 at 4 and 17 tokens, 2080 at 130)
     * against reference mode within check_prefill's bound, the same bits on
     * 1 and 2 threads, and not the bits of the same context without it (so
     * it ran).  Then the cases it must leave to the other paths, which must
     * give exactly their bits: a scale that is not a power of two, a scale
     * past the decode's range, activations that are not bf16 numbers, a
     * weight with a NaN code, and 3 tokens. */
    if (!bf16dot_table()) return;
    enum { RMAX = 256, KMAX = 8224, TMAX = 130 };
    path_bench b;
    path_bench_init(&b, 41, RMAX, KMAX, TMAX);
    CHECK(dsattn_ctx_set_bf16dot(b.a1, 1) && dsattn_ctx_set_bf16dot(b.a2, 1));
    CHECK(!dsattn_ctx_set_bf16dot(b.f2, 0));
    const size_t Ks[4] = { 256, 544, 2080, 8224 }, Ts[4] = { 4, 9, 17, 130 };
    size_t differ = 0, ran = 0;
    for (int bi = 0; bi < 2; bi++)
        for (int ki = 0; ki < 4; ki++)
            for (int ti = 0; ti < 4; ti++)
                for (size_t G = 1; G <= 2; G++) {
                    const size_t bs = bi ? 128 : 32, R = (bi ? 128 : 64) * G, K = Ks[ki];
                    const size_t T = Ts[ti];
                    if ((K == 8224 && (T == 130 || T == 9 || G == 2)) ||
                        (K == 2080 && T == 130 && G == 2))
                        continue;                                          /* time */
                    dsattn_weight w = fp8_weight(R, K, b.w8, b.sc, bs, 1);
                    char what[96];
                    snprintf(what, sizeof what, "bf16dot bs %zu R %zu K %zu T %zu G %zu", bs, R,
                             K, T, G);
                    differ += (size_t)path_bench_case(&b, what, &w, G, T);
                    ran++;
                }
    CHECK_MSG(differ == ran, "the bf16-dot Linear gave the other path's bits in %zu of %zu cases",
              ran - differ, ran);
    /* with the activation quantization of V4.1 (act_quant, block 32,
     * power-of-two scales) in dsattn_linear */
    {
        const size_t R = 96, K = 544, T = 8;
        const dsattn_actq aq = { 32, DSATTN_ACTQ_POW2 };
        float *q = malloc(T * K * 4), *xq = b.x + TMAX * KMAX / 2;
        dsattn_weight w = fp8_weight(R, K, b.w8, b.sc, 32, 1);
        CHECK_OK(dsattn_linear(b.cr, &w, b.x, K, T, b.yr, R, DSATTN_OUT_F32, &aq, q));
        for (size_t i = 0; i < T * K; i++) xq[i] = q[i];   /* the quantized x */
        magnitudes(&w, xq, T, b.mag);
        CHECK_OK(dsattn_linear(b.a2, &w, b.x, K, T, b.ya, R, DSATTN_OUT_F32, &aq, q));
        CHECK_OK(dsattn_linear(b.f2, &w, b.x, K, T, b.yf, R, DSATTN_OUT_F32, &aq, q));
        check_prefill("bf16dot act_quant", b.ya, b.yr, b.mag, T * R);
        CHECK_MSG(memcmp(b.ya, b.yf, T * R * 4) != 0, "act_quant: the bf16-dot path did not run");
        free(q);
    }
    /* fallbacks: exactly the other path's bits */
    path_bench_common_fallbacks(&b);
    {
        const size_t R = 64, K = 256;
        dsattn_weight w = fp8_weight(R, K, b.w8, b.sc, 32, 1);
        const float keep = b.sc[1];
        b.sc[1] = 0x1p120f;                               /* past the decode's 2^119 */
        path_bench_same(&b, "scale 2^120", &w, 33);
        b.sc[1] = keep;
        dsattn_weight wn = fp8_weight(R, K, b.w8, b.sc, 32, 0);   /* may hold NaN codes */
        path_bench_same(&b, "NaN-code weight", &wn, 33);
        path_bench_same(&b, "3 tokens", &w, 3);
    }
    path_bench_free(&b);
}
