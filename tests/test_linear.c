/* test_linear.c - the decode-sized Linear's split into chunks taken by any
 * thread (the same bits on every team size, nested teams included), and the
 * grouped Linear (V4 / V4.1 wo_a) against one plain Linear per row block:
 * the same bits in both modes, on every thread count and weight format it
 * takes, decode- and prefill-sized; bad shapes are refused; the bill
 * every path adds to the context's counters (block scales included); and a
 * prefill chunk's act_quant over the threads, the row quantizer's bits. */
#include "harness.h"

#include "numfmt.h"
#include "ops.h"
#include "weights.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Rows [r0, r0+n) as a weight of their own: what the grouped call must
 * equal, built here independently of linear.c. */
static dsattn_weight rows_of(const dsattn_weight *w, size_t r0, size_t n)
{
    dsattn_weight v = *w;
    if (w->kind == DSATTN_W_FP8) {
        size_t ldsc = (w->cols + w->block - 1) / w->block;
        v.data = (const uint8_t *)w->data + r0 * w->cols;
        v.scale = w->scale + (r0 / w->block) * ldsc;
    } else {
        v.data = (const uint16_t *)w->data + r0 * w->cols;
    }
    v.rows = n;
    return v;
}

DSATTN_TEST(linear, grouped_equals_one_linear_per_group)
{
    /* 4 groups of 160 rows (5 FP8 blocks of 32: thread ranges of 128 rows
     * cross group edges) over 96 inputs each; 1, 3 and 9 tokens (9: the
     * prefill-sized path in fast mode). */
    enum { G = 4, RG = 160, K = 96, BS = 32, TMAX = 9 };
    dsattn_rng r = { 99 };
    uint8_t *w8 = malloc((size_t)G * RG * K);
    uint16_t *w16 = malloc((size_t)G * RG * K * 2);
    float *sc = malloc((size_t)(G * RG / BS) * (K / BS) * 4);
    float *x = malloc((size_t)TMAX * G * K * 4);
    float *ya = malloc((size_t)TMAX * G * RG * 4), *yb = malloc((size_t)TMAX * G * RG * 4);
    for (size_t i = 0; i < (size_t)G * RG * K; i++) {
        w8[i] = (uint8_t)(dsattn_rng_u64(&r) & 0xf7);       /* no NaN code */
        w16[i] = (uint16_t)(0x3c00 + (dsattn_rng_u64(&r) & 0x83ff));
    }
    for (size_t i = 0; i < (size_t)(G * RG / BS) * (K / BS); i++)
        sc[i] = (float)(1 + i % 5) / 64.0f;
    for (size_t i = 0; i < (size_t)TMAX * G * K; i++) x[i] = dsattn_rng_uniform(&r) * 2.0f;
    dsattn_weight w[2] = {
        { .kind = DSATTN_W_FP8, .rows = G * RG, .cols = K, .data = w8, .scale = sc,
          .block = BS, .finite = 1 },
        { .kind = DSATTN_W_BF16, .rows = G * RG, .cols = K, .data = w16 },
    };
    const dsattn_mode modes[2] = { DSATTN_MODE_REFERENCE, DSATTN_MODE_FAST };
    const int threads[3] = { 1, 2, 3 };
    const size_t toks[3] = { 1, 3, TMAX };
    for (int mi = 0; mi < 2; mi++)
        for (int ti = 0; ti < 3; ti++) {
            dsattn_ctx *c = dsattn_test_ctx(modes[mi], threads[ti]);
            if (!c) continue;
            for (int wi = 0; wi < 2; wi++)
                for (int ni = 0; ni < 3; ni++) {
                    const size_t T = toks[ni];
                    memset(ya, 0xff, (size_t)TMAX * G * RG * 4);
                    memset(yb, 0, (size_t)TMAX * G * RG * 4);
                    CHECK_OK(dsattn_linear_grouped(c, &w[wi], G, x, G * K, K, T, ya, G * RG,
                                                   DSATTN_OUT_BF16));
                    for (size_t g = 0; g < G; g++) {
                        dsattn_weight wg = rows_of(&w[wi], g * RG, RG);
                        CHECK_OK(dsattn_linear(c, &wg, x + g * K, G * K, T, yb + g * RG, G * RG,
                                               DSATTN_OUT_BF16, NULL, NULL));
                    }
                    CHECK_MSG(memcmp(ya, yb, T * G * RG * 4) == 0,
                              "mode %d threads %d kind %d tokens %zu", mi, threads[ti], wi, T);
                }
            /* refused: rows not a multiple of G; FP8 groups cutting a block */
            CHECK(dsattn_linear_grouped(c, &w[0], 7, x, G * K, K, 1, ya, G * RG,
                                        DSATTN_OUT_BF16) == DSATTN_ERR_INVALID_ARG);
            CHECK(dsattn_linear_grouped(c, &w[0], 40, x, G * K, K, 1, ya, G * RG,
                                        DSATTN_OUT_BF16) == DSATTN_ERR_UNSUPPORTED);
            CHECK(dsattn_linear_grouped(c, &w[0], 0, x, G * K, K, 1, ya, G * RG,
                                        DSATTN_OUT_BF16) == DSATTN_ERR_INVALID_ARG);
            dsattn_ctx_destroy(c);
        }
    free(w8); free(w16); free(sc); free(x); free(ya); free(yb);
}

/* One decode-sized call: y (n_tok rows of R) starts as NaN, so a chunk that
 * no thread took stays visible. */
static void decode_call(dsattn_ctx *c, const dsattn_weight *w, const float *x, size_t n_tok,
                        float *y)
{
    for (size_t i = 0; i < n_tok * w->rows; i++) y[i] = NAN;
    CHECK_OK(dsattn_linear(c, w, x, w->cols, n_tok, y, w->rows, DSATTN_OUT_BF16, NULL, NULL));
}

DSATTN_TEST(linear, decode_chunks_same_bits_on_any_team)
{
    /* Big enough for many ~256 KB chunks: FP8 2016 x 2048 in 32x32 blocks
     * (63 blocks of rows: the last chunk is short) and bf16 1001 x 1024 (a
     * last row outside any 4-row pass).  One thread is one whole-matrix
     * kernel call; 2, 3 and 7 threads, and a call from inside a parallel
     * region (a team of one that must take every other run from the back),
     * must give exactly its bits, on 1, 3 and 16 tokens (16: chunks sized by
     * the thread count, linear.c's chunk_rows; the AVX2 tiled form). */
    enum { R8 = 2016, K8 = 2048, BS = 32, R16 = 1001, K16 = 1024, T = 16 };
    const size_t toks[3] = { 1, 3, T };
    dsattn_rng r = { 7 };
    uint8_t *w8 = malloc((size_t)R8 * K8);
    uint16_t *w16 = malloc((size_t)R16 * K16 * 2);
    float *sc = malloc((size_t)(R8 / BS) * (K8 / BS) * 4);
    float *x = malloc((size_t)T * K8 * 4);
    float *y1 = malloc((size_t)T * R8 * 4), *yn = malloc((size_t)T * R8 * 4);
    for (size_t i = 0; i < (size_t)R8 * K8; i++) w8[i] = (uint8_t)(dsattn_rng_u64(&r) & 0xf7);
    for (size_t i = 0; i < (size_t)R16 * K16; i++)
        w16[i] = (uint16_t)(0x3c00 + (dsattn_rng_u64(&r) & 0x83ff));
    for (size_t i = 0; i < (size_t)(R8 / BS) * (K8 / BS); i++) sc[i] = (float)(1 + i % 7) / 128.0f;
    for (size_t i = 0; i < (size_t)T * K8; i++) x[i] = dsattn_rng_uniform(&r) * 2.0f - 1.0f;
    const dsattn_weight w[2] = {
        { .kind = DSATTN_W_FP8, .rows = R8, .cols = K8, .data = w8, .scale = sc, .block = BS,
          .finite = 1 },
        { .kind = DSATTN_W_BF16, .rows = R16, .cols = K16, .data = w16 },
    };
    const dsattn_mode modes[2] = { DSATTN_MODE_REFERENCE, DSATTN_MODE_FAST };
    const int threads[4] = { 2, 3, 7, 3 };             /* the last: nested */
    for (int mi = 0; mi < 2; mi++)
        for (int wi = 0; wi < 2; wi++)
            for (int ni = 0; ni < 3; ni++) {
                const size_t n_tok = toks[ni], n = n_tok * w[wi].rows;
                dsattn_ctx *c1 = dsattn_test_ctx(modes[mi], 1);
                if (!c1) continue;
                decode_call(c1, &w[wi], x, n_tok, y1);
                dsattn_ctx_destroy(c1);
                size_t finite = 0;
                for (size_t i = 0; i < n; i++) finite += isfinite(y1[i]) != 0;
                CHECK_MSG(finite == n, "mode %d kind %d: %zu of %zu outputs finite", mi, wi,
                          finite, n);
                for (int ti = 0; ti < 4; ti++) {
                    dsattn_ctx *c = dsattn_test_ctx(modes[mi], threads[ti]);
                    if (!c) continue;
                    if (ti == 3) {
#pragma omp parallel num_threads(2)
                        {
                            if (omp_get_thread_num() == 0) decode_call(c, &w[wi], x, n_tok, yn);
                        }
                    } else {
                        decode_call(c, &w[wi], x, n_tok, yn);
                    }
                    CHECK_MSG(memcmp(y1, yn, n * 4) == 0, "mode %d kind %d tokens %zu: %d threads%s",
                              mi, wi, n_tok, threads[ti], ti == 3 ? " (nested)" : "");
                    dsattn_ctx_destroy(c);
                }
            }
    free(w8); free(w16); free(sc); free(x); free(y1); free(yn);
}

/* The bill: a Linear adds 2 n_tok R K FLOPs and the bytes it reads - the
 * weight's codes and its block scales (fp32, one per block x block), and
 * the n_tok x K fp32 inputs - on every path (decode- and prefill-sized,
 * grouped or not, both modes).  Expected sizes are written out here, not
 * taken from weights.c. */
DSATTN_TEST(linear, bills_codes_scales_and_inputs_on_every_path)
{
    enum { R = 256, K = 512, G = 2, TMAX = 9 };
    static const struct { dsattn_wkind kind; size_t bs, wbytes; } ws[] = {
        { DSATTN_W_FP8, 32, (size_t)R * K + 4 * (R / 32) * (K / 32) },
        { DSATTN_W_FP8, 128, (size_t)R * K + 4 * (R / 128) * (K / 128) },
        { DSATTN_W_BF16, 0, (size_t)R * K * 2 },
    };
    float *x = malloc((size_t)TMAX * G * K * 4), *y = malloc((size_t)TMAX * R * G * 4);
    float *scr = malloc((size_t)TMAX * G * K * 4);
    dsattn_rng r = { 5 };
    for (size_t i = 0; i < (size_t)TMAX * G * K; i++) x[i] = dsattn_rng_uniform(&r) - 0.5f;
    const dsattn_actq aq = { 32, DSATTN_ACTQ_POW2 };
    const dsattn_mode modes[2] = { DSATTN_MODE_REFERENCE, DSATTN_MODE_FAST };
    for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++) {
        dsattn_owned own = { 0 };
        dsattn_weight w;
        CHECK(dsattn_weight_random(&w, ws[wi].kind, R, K, ws[wi].bs, 1.0f, 11 + wi, &own) == 0);
        dsattn_weight wg = w;            /* the same bytes as G groups of K / G inputs */
        wg.cols = K / G;
        wg.rows = R * G;
        for (int mi = 0; mi < 2; mi++) {
            dsattn_ctx *c = dsattn_test_ctx(modes[mi], 2);
            if (!c) continue;
            for (size_t T = 1; T <= TMAX; T += 4) {
                const dsattn_actq *q = ws[wi].kind == DSATTN_W_FP8 ? &aq : NULL;
                dsattn_ctx_counters_reset(c);
                CHECK_OK(dsattn_linear(c, &w, x, K, T, y, R, DSATTN_OUT_BF16, q, scr));
                dsattn_counters n = dsattn_ctx_counters(c);
                CHECK_MSG(n.bytes_read == ws[wi].wbytes + T * K * 4 &&
                              n.flops == 2ull * T * R * K,
                          "kind %d block %zu mode %d tokens %zu: %llu bytes, %llu flops",
                          ws[wi].kind, ws[wi].bs, mi, T, (unsigned long long)n.bytes_read,
                          (unsigned long long)n.flops);
                if (ws[wi].kind == DSATTN_W_FP8 && ws[wi].bs == 128)
                    continue;                                 /* K / G cuts a block */
                dsattn_ctx_counters_reset(c);
                CHECK_OK(dsattn_linear_grouped(c, &wg, G, x, K, K / G, T, y, R * G,
                                               DSATTN_OUT_BF16));
                n = dsattn_ctx_counters(c);
                const size_t gb = ws[wi].kind == DSATTN_W_FP8
                                      ? (size_t)R * K + 4 * (R * G / 32) * (K / G / 32)
                                      : ws[wi].wbytes;
                CHECK_MSG(n.bytes_read == gb + T * K * 4 && n.flops == 2ull * T * R * K,
                          "grouped kind %d mode %d tokens %zu: %llu bytes", ws[wi].kind, mi, T,
                          (unsigned long long)n.bytes_read);
            }
            dsattn_ctx_destroy(c);
        }
        dsattn_owned_free(&own);
    }
    free(x); free(y); free(scr);
}

/* A prefill-sized FP8 Linear quantizes its activations (act_quant, block
 * 32, power-of-two scales) with the rows split over the threads: the
 * quantized rows it leaves in the scratch are dsattn_quant_fp8_ue8m0's,
 * bit for bit, and the outputs the same bits on 1, 2 and 3 threads - 70
 * tokens (past the 32 from which the split runs, a partial last group),
 * inputs spread over 2^-30 .. 2^30 so the blocks take different scales,
 * one block all zero, one with a NaN. */
DSATTN_TEST(linear, prefill_act_quant_over_threads_is_the_row_quantizer)
{
    enum { R = 40, K = 512, T = 70 };
    float *x = malloc((size_t)T * K * 4), *want = malloc((size_t)T * K * 4);
    float *scr = malloc((size_t)T * K * 4), *y1 = malloc((size_t)T * R * 4);
    float *y = malloc((size_t)T * R * 4);
    dsattn_rng r = { 77 };
    for (size_t i = 0; i < (size_t)T * K; i++)
        x[i] = ldexpf(dsattn_rng_uniform(&r), (int)(i / 32 % 61) - 30);
    for (size_t i = 0; i < 32; i++) x[5 * K + 64 + i] = 0.0f;
    x[9 * K + 200] = NAN;
    for (size_t t = 0; t < T; t++)
        dsattn_quant_fp8_ue8m0(x + t * K, K, 32, NULL, NULL, want + t * K);
    dsattn_owned own = { 0 };
    dsattn_weight w;
    CHECK(dsattn_weight_random(&w, DSATTN_W_FP8, R, K, 32, 1.0f, 3, &own) == 0);
    const dsattn_actq aq = { 32, DSATTN_ACTQ_POW2 };
    for (int th = 1; th <= 3; th++) {
        dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, th);
        if (!c) continue;
        memset(scr, 0xff, (size_t)T * K * 4);
        CHECK_OK(dsattn_linear(c, &w, x, K, T, th == 1 ? y1 : y, R, DSATTN_OUT_BF16, &aq, scr));
        size_t bad = 0, at = 0;
        for (size_t i = 0; i < (size_t)T * K; i++)
            if (memcmp(scr + i, want + i, 4) && bad++ == 0) at = i;
        CHECK_MSG(bad == 0, "%d threads: %zu quantized inputs differ, first at %zu: %g vs %g",
                  th, bad, at, (double)scr[at], (double)want[at]);
        if (th > 1)
            CHECK_MSG(memcmp(y, y1, (size_t)T * R * 4) == 0, "%d threads: not the 1-thread bits",
                      th);
        dsattn_ctx_destroy(c);
    }
    dsattn_owned_free(&own);
    free(x); free(want); free(scr); free(y1); free(y);
}

/* RNE to bf16 stated by comparison, apart from numfmt.h's add-and-carry:
 * the truncation t or the next bf16 up, by the low half against the tie,
 * ties to the even one; a NaN quiet with its sign and top payload bits. */
static uint32_t bf16_by_compare(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u & 0xffff0000u) | 0x00400000u;
    const uint32_t t = u & 0xffff0000u, lo = u & 0xffffu;
    const int up = lo > 0x8000u || (lo == 0x8000u && (t >> 16 & 1u));
    return up ? t + 0x10000u : t;
}

/* dsattn_round_bf16 and dsattn_round_bf16_n (its vectorised loop) round as
 * bf16_by_compare does, bit for bit: every high half (every sign, exponent
 * - inf and NaN included - and top mantissa bits) with low halves at and
 * around the ties, and lengths that leave a vector tail. */
DSATTN_TEST(linear, round_bf16_n_is_the_scalar_rounding)
{
    const uint32_t lows[] = { 0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xffff };
    const size_t nl = sizeof lows / sizeof lows[0], n = 65536 * nl;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (uint32_t h = 0; h < 65536; h++)
        for (size_t l = 0; l < nl; l++) {
            const uint32_t u = h << 16 | lows[l];
            memcpy(&x[h * nl + l], &u, 4);
        }
    size_t bad = 0, bad1 = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u, r;
        memcpy(&u, &x[i], 4);
        const float s = dsattn_round_bf16(x[i]);
        memcpy(&r, &s, 4);
        bad1 += r != bf16_by_compare(u);
    }
    for (size_t len = n; len + 3 >= n; len--) {    /* n, n-1, n-2, n-3 */
        memcpy(y, x, n * sizeof(float));
        dsattn_round_bf16_n(y, len);
        for (size_t i = 0; i < n; i++) {
            uint32_t u, r;
            memcpy(&u, &x[i], 4);
            memcpy(&r, &y[i], 4);
            bad += r != (i < len ? bf16_by_compare(u) : u);
        }
    }
    CHECK_MSG(bad1 == 0, "dsattn_round_bf16: %zu elements differ", bad1);
    CHECK_MSG(bad == 0, "dsattn_round_bf16_n: %zu elements differ", bad);
    free(x); free(y);
}
