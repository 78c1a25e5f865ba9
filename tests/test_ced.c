/* test_ced.c - CED prefill of V4.1 (CSA2): the row rule derived from the
 * plan, exact tail replay bit for bit against a full prefill in reference
 * mode (the last prompt token's output, every decode step after it, the
 * caches the decode reads, the top-k rows) on the golden cases and on random
 * plans whose prompts span many windows x decoder layers, fast mode within
 * bounds, and bounded replay (exact when the prompt fits a window; measured
 * and different from exact past it). */
#include "csa.h"
#include "harness.h"

#include "internal.h"
#include "safetensors.h"
#include "trace.h"
#include "v41.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* 17 layers, window 8: two SWA layers, an encoder of ratio-2 sources (2, 4)
 * with Reuse layers, the decoder source 6 (ratio 1, candidate source), Reuse
 * and Reindex layers and one SWA layer (11) in the decoder. */
static const char *write_cfg(const char *tag, int ratio_dec_src)
{
    static char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_ced_%s.json", tag);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f,
            "{\"dim\": 128, \"n_layers\": 17, \"n_heads\": 4, \"head_dim\": 64,"
            " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 32,"
            " \"window_size\": 8, \"compress_ratios\": [0,0,2,2,2,2,%d,%d,%d,%d,%d,0,%d,%d,%d,%d,%d],"
            " \"kv_source_layers\": [2,4,6], \"index_source_layers\": [2,4,6,9,13,15],"
            " \"candidate_source_layer\": 6, \"candidate_topk_blocks\": 3,"
            " \"candidate_block_size\": 4, \"index_n_heads\": 4, \"index_head_dim\": 32,"
            " \"index_topk\": 6, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
            " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
            " \"beta_slow\": 1, \"norm_eps\": 1e-20, \"dtype\": \"bf16\"}\n",
            ratio_dec_src, ratio_dec_src, ratio_dec_src, ratio_dec_src, ratio_dec_src,
            ratio_dec_src, ratio_dec_src, ratio_dec_src, ratio_dec_src, ratio_dec_src);
    fclose(f);
    return path;
}

static float *rand_input(size_t T, size_t dim, uint64_t seed)
{
    dsattn_rng r = { seed };
    float *x = malloc(T * dim * sizeof(float));
    for (size_t i = 0; i < T * dim; i++) x[i] = dsattn_rng_normal(&r);
    return x;
}

/* What one run leaves: the stack's h after the prefill's last token and each
 * decode step, each index source's selection of those rows, the caches. */
typedef struct {
    float *h;                    /* [1 + n_dec, dim]: row P-1, then decode */
    int32_t *sel;                /* [1 + n_dec, L, sel_w] (-2: no selection) */
    size_t sel_w;
    dsattn_v41_seq *s, *prefilled;   /* at the end; a copy after the prefill */
} run_out;

static void keep_sel(const dsattn_v41_seq *s, int L, size_t sel_w, int32_t *dst)
{
    for (int l = 0; l < L; l++) {
        const int32_t *rows;
        size_t nr, w;
        int32_t *d = dst + (size_t)l * sel_w;
        for (size_t i = 0; i < sel_w; i++) d[i] = -2;
        if (dsattn_v41_seq_selection(s, l, &rows, &nr, &w) || nr == 0) continue;
        for (size_t i = 0; i < w && i < sel_w; i++) d[i] = rows[(nr - 1) * w + i];
    }
}

static run_out run(dsattn_ctx *ctx, const dsattn_v41 *m, const float *x, size_t T, size_t P,
                   dsattn_v41_ced mode, dsattn_v41_index_k ik, float *attn_out)
{
    run_out r = { NULL, NULL, 0, NULL, NULL };
    const size_t dim = (size_t)dsattn_v41_dim(m), L = (size_t)dsattn_v41_n_layers(m);
    const size_t nd = T - P;
    r.sel_w = (size_t)m->cfg.index_topk + 1;
    float *h = malloc(T * dim * sizeof(float));
    r.h = malloc((1 + nd) * dim * sizeof(float));
    r.sel = malloc((1 + nd) * L * r.sel_w * sizeof(int32_t));
    memcpy(h, x, T * dim * sizeof(float));
    CHECK_OK(dsattn_v41_seq_create(&r.s, m, T, ik));
    if (r.s) {
        CHECK_OK(dsattn_v41_stack_prefill(ctx, r.s, h, P, mode, attn_out));
        CHECK_OK(dsattn_v41_seq_clone(&r.prefilled, r.s));
        memcpy(r.h, h + (P - 1) * dim, dim * sizeof(float));
        keep_sel(r.s, (int)L, r.sel_w, r.sel);
        for (size_t t = P; t < T; t++) {
            CHECK_OK(dsattn_v41_stack_forward(ctx, r.s, h + t * dim, 1, NULL, NULL));
            memcpy(r.h + (1 + t - P) * dim, h + t * dim, dim * sizeof(float));
            keep_sel(r.s, (int)L, r.sel_w, r.sel + (1 + t - P) * L * r.sel_w);
        }
    }
    free(h);
    return r;
}

static void run_free(run_out *r)
{
    free(r->h);
    free(r->sel);
    dsattn_v41_seq_destroy(r->s);
    dsattn_v41_seq_destroy(r->prefilled);
}

/* The caches a decode reads, after the same tokens: each window ring
 * (every slot a position was written to), compressed KV, index keys and
 * compressor state. */
static void same_caches(const char *what, const dsattn_v41_seq *a, const dsattn_v41_seq *b,
                        size_t T)
{
    const dsattn_v41 *m = a->m;
    const size_t w = (size_t)m->cfg.window_size;
    for (int l = 0; l < (int)m->cfg.n_layers; l++) {
        for (int which = 0; which < 3; which++) {
            const uint8_t *ra, *rb;
            size_t na, nb, rba, rbb;
            dsattn_status sa = dsattn_v41_seq_cache(a, l, which, &ra, &na, &rba);
            dsattn_status sb = dsattn_v41_seq_cache(b, l, which, &rb, &nb, &rbb);
            CHECK(sa == sb);
            if (sa || sb) continue;
            CHECK(na == nb && rba == rbb);
            if (which == 0) na = DSATTN_MIN(na, T < w ? T : w);   /* slots written */
            CHECK_MSG(na == 0 || !memcmp(ra, rb, na * rba), "%s: layer %d cache %d differs",
                      what, l, which);
        }
        const dsattn_v41_layer_s *A = &a->layer[l], *B = &b->layer[l];
        if (A->kv_state) {
            const size_t nst = (size_t)m->layer[l].ratio * (size_t)m->cfg.head_dim;
            CHECK_MSG(!memcmp(A->kv_state, B->kv_state, nst * sizeof(float)) &&
                          !memcmp(A->score_state, B->score_state, nst * sizeof(float)),
                      "%s: layer %d compressor state differs", what, l);
        }
    }
}

/* mode against OFF: the last prompt token, each decode step, the selections
 * of those rows and the caches after the prefill and at the end, bit for
 * bit. */
static void same_as_full(dsattn_ctx *ctx, const dsattn_v41 *m, const float *x, size_t T,
                         size_t P, dsattn_v41_ced mode, dsattn_v41_index_k ik)
{
    const size_t dim = (size_t)dsattn_v41_dim(m), L = (size_t)dsattn_v41_n_layers(m);
    char what[96];
    snprintf(what, sizeof what, "P=%zu T=%zu mode %d index_k %d", P, T, (int)mode, (int)ik);
    run_out a = run(ctx, m, x, T, P, DSATTN_V41_CED_OFF, ik, NULL);
    run_out b = run(ctx, m, x, T, P, mode, ik, NULL);
    if (a.prefilled && b.prefilled) same_caches(what, a.prefilled, b.prefilled, P);
    if (a.s && b.s) {
        CHECK_BITS(what, b.h, a.h, (1 + T - P) * dim);
        CHECK_MSG(!memcmp(a.sel, b.sel, (1 + T - P) * L * a.sel_w * sizeof(int32_t)),
                  "%s: top-k rows differ", what);
        same_caches(what, a.s, b.s, T);
    }
    run_free(&a);
    run_free(&b);
}

/* ==== The rule ========================================================== */

DSATTN_TEST(ced, rule_from_the_plan_of_v41_flash)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_load_config(&m, dsattn_test_data("../../configs/deepseek-v4.1-flash.json"),
                                    err, sizeof err));
    if (!m) { CHECK_MSG(0, "%s", err); return; }
    dsattn_v41_ced_rows r[64];
    const size_t n = 8192, w = 128;
    CHECK_OK(dsattn_v41_ced_plan(m, n, DSATTN_V41_CED_EXACT, r));
    for (int l = 0; l < 20; l++) CHECK(r[l].in_first == 0 && r[l].out_first == 0);
    CHECK(r[20].in_first == 0);                             /* the decoder's KV source */
    for (int l = 21; l < 40; l++) {
        /* w + (L - 1 - l)(w - 1) input rows, outputs for the next layer's inputs */
        CHECK_MSG(n - r[l].in_first == w + (size_t)(39 - l) * (w - 1), "layer %d: %zu rows", l,
                  n - r[l].in_first);
        CHECK(r[l - 1].out_first == r[l].in_first);
    }
    CHECK(r[39].out_first == n - 1);
    CHECK_OK(dsattn_v41_ced_plan(m, n, DSATTN_V41_CED_BOUNDED, r));
    for (int l = 21; l < 40; l++) CHECK(r[l].in_first == n - w);
    CHECK(r[20].out_first == n - w && r[38].out_first == n - w && r[39].out_first == n - 1);
    /* a prompt shorter than the tail: clamped to the prompt */
    CHECK_OK(dsattn_v41_ced_plan(m, 300, DSATTN_V41_CED_EXACT, r));
    CHECK(r[21].in_first == 0 && r[37].in_first == 0 && r[38].in_first == 45 &&
          r[39].in_first == 172 && r[20].out_first == 0);
    uint64_t fi, fo, ei, eo, bi, bo;
    CHECK_OK(dsattn_v41_ced_work(m, n, DSATTN_V41_CED_OFF, &fi, &fo));
    CHECK_OK(dsattn_v41_ced_work(m, n, DSATTN_V41_CED_EXACT, &ei, &eo));
    CHECK_OK(dsattn_v41_ced_work(m, n, DSATTN_V41_CED_BOUNDED, &bi, &bo));
    CHECK(fi == 40 * n && fo == 40 * n);
    CHECK(ei == 21 * n + 19 * 128 + 127 * (19 * 18 / 2));
    CHECK(bi == 21 * n + 19 * 128);
    CHECK(dsattn_v41_ced_plan(m, 0, DSATTN_V41_CED_EXACT, r) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_v41_ced_plan(m, 5, (dsattn_v41_ced)7, r) == DSATTN_ERR_INVALID_ARG);
    dsattn_v41_destroy(m);
}

/* ==== Exact tail replay, bit for bit ==================================== */

static void golden_case(const char *rel)
{
    char dir[1024], cfg[1200], wts[1200], err[512] = "";
    snprintf(dir, sizeof dir, "%s", dsattn_test_data(rel));
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(wts, sizeof wts, "%s/weights.safetensors", dir);
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_load(&m, cfg, wts, err, sizeof err));
    float *x = NULL;
    size_t T = 0, dim = 0, P = 0;
    CHECK_OK(dsattn_trace_load_input(dir, &x, &T, &dim, &P, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (m && x && ctx) {
        /* the case's own split, and every other prompt length of its input */
        const size_t ps[] = { P, 1, 8, 9, 17, T - 6, T - 1 };
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            for (int ik = 0; ik < 2; ik++)
                if (ps[i] < T && (i == 0 || ik == 0))
                    same_as_full(ctx, m, x, T, ps[i], DSATTN_V41_CED_EXACT,
                                 (dsattn_v41_index_k)ik);
    }
    free(x);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(ced, exact_bit_for_bit_golden_seed0)     { golden_case("golden/v41/tiny-seed0"); }
DSATTN_TEST(ced, exact_bit_for_bit_golden_seed2_fp8) { golden_case("golden/v41/tiny-seed2-fp8"); }
DSATTN_TEST(ced, exact_bit_for_bit_golden_alt_seed0) { golden_case("golden/v41/alt-seed0"); }

/* The replayed rows' heads run a block at a time, as a prompt's
 * (dsattn_csa_prompt_block): with blocks of 2 and 3 rows the replay still
 * equals the full prefill (itself bit-exact in blocks: v41 suite). */
DSATTN_TEST(ced, exact_bit_for_bit_in_blocks_of_rows)
{
    const size_t keep = dsattn_csa_prompt_block;
    for (size_t b = 2; b <= 3; b++) {
        dsattn_csa_prompt_block = b;
        golden_case("golden/v41/tiny-seed2-fp8");
    }
    dsattn_csa_prompt_block = keep;
}

DSATTN_TEST(ced, exact_bit_for_bit_random_plans_seed31)
{
    /* 11 decoder layers of window 8: the tail of the first decoder layer is
     * 8 + 9 x 7 = 71 rows; prompts below, at and far past it */
    char err[512] = "";
    for (int rr = 1; rr <= 2; rr++) {
        dsattn_v41 *m = NULL;
        CHECK_OK(dsattn_v41_create_random(&m, write_cfg(rr == 1 ? "r1" : "r2", rr), 31 + rr,
                                          rr == 2, err, sizeof err));
        dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
        if (!m || !ctx) { CHECK_MSG(0, "%s", err); dsattn_ctx_destroy(ctx); return; }
        const size_t dim = 128;
        const size_t Ps[] = { 3, 9, 50, 70, 71, 72, 150, rr == 1 ? 1000 : 333 };
        for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++) {
            const size_t P = Ps[i], T = P + 5;
            float *x = rand_input(T, dim, 100 + P);
            same_as_full(ctx, m, x, T, P, DSATTN_V41_CED_EXACT, DSATTN_V41_INDEX_K_OWNER);
            if (P == 72 || P == 9)
                same_as_full(ctx, m, x, T, P, DSATTN_V41_CED_EXACT, DSATTN_V41_INDEX_K_REFERENCE);
            free(x);
        }
        dsattn_ctx_destroy(ctx);
        dsattn_v41_destroy(m);
    }
}

/* ==== Fast mode, bounded replay ========================================= */

static double rel_l2(const float *a, const float *b, size_t n)
{
    return dsattn_rel_l2(a, b, n);
}

DSATTN_TEST(ced, exact_fast_mode_within_bounds_seed41)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("f", 1), 41, 1, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    if (!m || !ctx) { dsattn_ctx_destroy(ctx); dsattn_v41_destroy(m); return; }
    const size_t dim = 128, P = 200, T = P + 6;
    float *x = rand_input(T, dim, 41);
    run_out a = run(ctx, m, x, T, P, DSATTN_V41_CED_OFF, DSATTN_V41_INDEX_K_OWNER, NULL);
    run_out b = run(ctx, m, x, T, P, DSATTN_V41_CED_EXACT, DSATTN_V41_INDEX_K_OWNER, NULL);
    if (a.s && b.s) {
        const double rel = rel_l2(b.h, a.h, (1 + T - P) * dim);
        const double cs = dsattn_cosine(b.h, a.h, (1 + T - P) * dim);
        fprintf(stderr, "    fast exact vs fast full: rel %.3g cosine %.7f\n", rel, cs);
        CHECK_MSG(rel <= 1e-2 && cs >= 0.9999, "fast exact vs full: rel %.4g cosine %.6f", rel, cs);
    }
    run_free(&a);
    run_free(&b);
    free(x);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(ced, bounded_exact_within_a_window_approximate_past_it_seed51)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("b", 1), 51, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ctx) { dsattn_ctx_destroy(ctx); dsattn_v41_destroy(m); return; }
    const size_t dim = 128;
    /* a prompt that fits one window: every layer sees all of it */
    {
        const size_t P = 8, T = 14;
        float *x = rand_input(T, dim, 51);
        same_as_full(ctx, m, x, T, P, DSATTN_V41_CED_BOUNDED, DSATTN_V41_INDEX_K_OWNER);
        free(x);
    }
    /* past it: finite, close, not the same */
    {
        const size_t P = 120, T = 126;
        float *x = rand_input(T, dim, 52);
        run_out a = run(ctx, m, x, T, P, DSATTN_V41_CED_EXACT, DSATTN_V41_INDEX_K_OWNER, NULL);
        run_out b = run(ctx, m, x, T, P, DSATTN_V41_CED_BOUNDED, DSATTN_V41_INDEX_K_OWNER, NULL);
        if (a.s && b.s) {
            const size_t nv = (1 + T - P) * dim;
            int finite = 1;
            for (size_t i = 0; i < nv; i++) finite &= isfinite(b.h[i]) != 0;
            CHECK(finite);
            CHECK_MSG(memcmp(a.h, b.h, nv * sizeof(float)) != 0, "bounded equals exact at P=%zu", P);
            const double rel = rel_l2(b.h, a.h, nv);
            fprintf(stderr, "    bounded vs exact at P=%zu: h rel %.3g\n", P, rel);
            CHECK(rel < 1.0);
        }
        run_free(&a);
        run_free(&b);
        free(x);
    }
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(ced, bad_arguments)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("a", 1), 61, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    dsattn_v41_seq *s = NULL;
    if (m) CHECK_OK(dsattn_v41_seq_create(&s, m, 64, DSATTN_V41_INDEX_K_OWNER));
    if (!m || !ctx || !s) { dsattn_ctx_destroy(ctx); dsattn_v41_destroy(m); return; }
    float *x = rand_input(64, 128, 61), o[128 * 64];
    /* a KV source must take every row; outputs must be inside the rows */
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 2, x, 10, 5, 0, o) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 0, x, 10, 0, 10, o) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 0, x, 60, 10, 0, o) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 17, x, 10, 0, 0, o) == DSATTN_ERR_INVALID_ARG);
    /* a Reuse layer whose rows the last index source did not publish */
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 3, x, 10, 0, 0, o) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_v41_stack_prefill(ctx, s, x, 10, (dsattn_v41_ced)9, NULL) == DSATTN_ERR_INVALID_ARG);
    CHECK_OK(dsattn_v41_stack_prefill(ctx, s, x, 10, DSATTN_V41_CED_EXACT, NULL));
    /* CED is a prompt at position 0 */
    CHECK(dsattn_v41_stack_prefill(ctx, s, x, 4, DSATTN_V41_CED_EXACT, NULL) == DSATTN_ERR_UNSUPPORTED);
    CHECK(dsattn_v41_attn_forward_rows(ctx, s, 0, x, 1, 10, 0, o) == DSATTN_ERR_UNSUPPORTED);
    free(x);
    dsattn_v41_seq_destroy(s);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

/* ==== The CLI ============================================================ */

static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int ws = system(cmd);
    return ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

DSATTN_TEST(ced, cli_run_ced_writes_the_same_decode_outputs)
{
    /* --out of an exact prefill is the full prefill's file byte for byte;
     * bounded past the tail is not; --ced is refused where it means nothing */
    const char *cli = DSATTN_CLI_PATH;
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s", dsattn_test_data("golden/v41/tiny-seed0/config.json"));
    char o[3][DSATTN_TEST_PATH];
    const char *mode[3] = { "off", "exact", "bounded" };
    for (int k = 0; k < 3; k++) {
        dsattn_test_tmp(o[k], sizeof o[k], "dsattn_test_ced_%s.st", mode[k]);
        CHECK_EQ_INT(sh("'%s' run --config '%s' --bf16 --prefill 60 --decode 3 --threads 1 "
                        "--mode reference --ced %s --out '%s' >/dev/null 2>&1",
                        cli, cfg, mode[k], o[k]), 0);
    }
    CHECK_EQ_INT(sh("cmp -s '%s' '%s'", o[0], o[1]), 0);
    CHECK(sh("cmp -s '%s' '%s'", o[0], o[2]) != 0);
    for (int k = 0; k < 3; k++) unlink(o[k]);
    CHECK_EQ_INT(sh("'%s' run --config '%s' --ced fast >/dev/null 2>&1", cli, cfg), 2);
    CHECK_EQ_INT(sh("'%s' run --config '%s' --ced exact --prefill 4 >/dev/null 2>&1", cli,
                    dsattn_test_data("golden/v4/tiny-seed0/config.json")), 2);
    CHECK_EQ_INT(sh("'%s' bench v41 --ced off,fast >/dev/null 2>&1", cli), 2);
    CHECK_EQ_INT(sh("'%s' bench v41 --ced exact,exact >/dev/null 2>&1", cli), 2);
}
