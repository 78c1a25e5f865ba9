/* test_mla.c - properties of the MLA (V3) and MLA + DSA (V3.2) stacks on
 * random weights at small dims (the golden cases are test_golden_mla.c).
 *
 * Each test can fail: prefill-then-decode vs one prefill (V3 bit-exact;
 * V3.2 switches from the MHA path to the absorbed path, stated bound),
 * causality, absorbed vs naive, DSA with top-k >= visible == dense MLA (and
 * != with a small top-k), the selection == a brute-force top-k of the same
 * scores, fast == reference at depth (absorbed decode over bf16 and FP8
 * latent caches, index scores; the heads-in-lanes AVX-512 kernels against
 * their scalar table on odd sizes, and the tiled decode at key counts and
 * head counts off its tiles), FP8 latent cache and FP8 weights within
 * stated bounds, the YaRN / mscale gate, cache bytes per token from the
 * allocation at the released dims, and argument errors.
 */
#include "harness.h"

#include "ktab.h"
#include "internal.h"
#include "kernels.h"
#include "mla.h"
#include "mla_kernels.h"
#include "numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== Helpers =========================================================== */

typedef struct {
    int dsa, topk, max_seq_len, n_layers, kv_lora, n_heads, q_lora, rope;
} cfg_opts;

static cfg_opts small(int dsa)
{
    cfg_opts o = { dsa, 2048, 64, 2, 128, 4, 128, 16 };
    return o;
}

/* Write a config.json for the options; returns the path (static buffer). */
static const char *write_cfg(const cfg_opts *o)
{
    static char path[2][DSATTN_TEST_PATH];
    static int k;
    k ^= 1;
    if (!dsattn_test_tmp(path[k], sizeof path[k], "dsattn_mla_cfg_XXXXXX")) return NULL;
    int fd = mkstemp(path[k]);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) { close(fd); return NULL; }
    fprintf(f,
            "{\"model_type\": \"%s\", \"dim\": 256, \"n_layers\": %d, \"n_heads\": %d,\n"
            " \"q_lora_rank\": %d, \"kv_lora_rank\": %d, \"qk_nope_head_dim\": 32,\n"
            " \"qk_rope_head_dim\": %d, \"v_head_dim\": 32, \"original_seq_len\": 4096,\n"
            " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,\n"
            " \"mscale\": 1.0, \"max_seq_len\": %d, \"dtype\": \"bf16\"",
            o->dsa ? "deepseek_v32" : "deepseek_v3", o->n_layers, o->n_heads, o->q_lora,
            o->kv_lora, o->rope, o->max_seq_len);
    if (o->dsa)
        fprintf(f, ", \"index_n_heads\": 4, \"index_head_dim\": 128, \"index_topk\": %d,"
                   " \"scale_fmt\": \"ue8m0\"", o->topk);
    fprintf(f, "}\n");
    fclose(f);
    return path[k];
}

static dsattn_mla *make_model(const cfg_opts *o, uint64_t seed, int fp8)
{
    const char *p = write_cfg(o);
    dsattn_mla *m = NULL;
    char err[512] = "";
    dsattn_status st = p ? dsattn_mla_create_random(&m, p, seed, fp8, err, sizeof err)
                         : DSATTN_ERR_IO;
    CHECK_MSG(st == DSATTN_OK, "create_random: %s", err);
    if (p) unlink(p);
    return m;
}

static float *rand_input(size_t T, size_t dim, uint64_t seed)
{
    dsattn_rng r = { seed * 77 + 1 };
    float *x = malloc(T * dim * sizeof *x);
    for (size_t i = 0; i < T * dim; i++) x[i] = dsattn_round_bf16(dsattn_rng_normal(&r));
    return x;
}

/* Run the stack over x [T, dim] (copied into h): prefill of P tokens, then
 * one-token decode.  h [T, dim] gets the final residual; optional ain/aout
 * [n_layers, T, dim] and sel0 (layer 0 selection [T, kw]). */
static dsattn_status run(dsattn_ctx *ctx, const dsattn_mla *m, dsattn_mla_cache fmt,
                         const float *x, size_t T, size_t P, float *h, float *aout,
                         int32_t *sel0, size_t kw)
{
    const size_t dim = (size_t)dsattn_mla_dim(m), nl = (size_t)dsattn_mla_n_layers(m);
    memcpy(h, x, T * dim * sizeof *h);
    dsattn_mla_seq *s = NULL;
    dsattn_status st = dsattn_mla_seq_create(&s, m, T, fmt);
    float *lo = malloc(nl * T * dim * sizeof *lo);
    for (size_t t0 = 0; t0 < T && !st;) {
        size_t n = t0 == 0 ? P : 1;
        st = dsattn_mla_stack_forward(ctx, s, h + t0 * dim, n, NULL, lo);
        for (size_t l = 0; !st && aout && l < nl; l++)
            for (size_t t = 0; t < n; t++)
                memcpy(aout + (l * T + t0 + t) * dim, lo + (l * n + t) * dim, dim * sizeof(float));
        const int32_t *rows;
        size_t nr, wd;
        if (!st && sel0 && dsattn_mla_seq_selection(s, 0, &rows, &nr, &wd) == DSATTN_OK)
            for (size_t t = 0; t < nr; t++)
                for (size_t i = 0; i < kw; i++) sel0[(t0 + t) * kw + i] = i < wd ? rows[t * wd + i] : -1;
        t0 += n;
    }
    free(lo);
    dsattn_mla_seq_destroy(s);
    return st;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void check_stat(const char *what, const float *got, const float *want, size_t n,
                       double rel_max, double cos_min)
{
    double rel = dsattn_rel_l2(got, want, n), cs = dsattn_cosine(got, want, n);
    CHECK_MSG(rel <= rel_max && cs >= cos_min, "%s: rel %.3e (max %.1e) cosine %.7f (min %.5f)",
              what, rel, rel_max, cs, cos_min);
}

/* ==== Prefill vs decode ================================================= */

DSATTN_TEST(mla, v3_prefill_then_decode_equals_one_prefill)
{
    /* V3 runs the absorbed maths for every row either way: in reference
     * mode each row's arithmetic is the same, so the results are identical. */
    cfg_opts o = small(0);
    dsattn_mla *m = make_model(&o, 1, 0);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    const size_t T = 24, dim = 256;
    float *x = rand_input(T, dim, 3), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
    if (m && ref && fast) {
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, T, a, NULL, NULL, 0));
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 9, b, NULL, NULL, 0));
        CHECK_MSG(same_bits(a, b, T * dim), "V3 reference: prefill+decode != one prefill");
        /* fast: prefill GEMMs go through sgemm, decode through GEMV */
        CHECK_OK(run(fast, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 9, b, NULL, NULL, 0));
        check_stat("V3 fast prefill+decode vs reference prefill", b, a, T * dim, 1e-2, 0.9999);
        /* naive cache: same statement */
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_NAIVE, x, T, T, a, NULL, NULL, 0));
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_NAIVE, x, T, 9, b, NULL, NULL, 0));
        CHECK_MSG(same_bits(a, b, T * dim), "V3 naive: prefill+decode != one prefill");
    }
    free(x); free(a); free(b);
    dsattn_ctx_destroy(ref); dsattn_ctx_destroy(fast);
    dsattn_mla_destroy(m);
}

DSATTN_TEST(mla, v32_prefill_then_decode_close_to_one_prefill)
{
    /* V3.2 prefill rows use the MHA path (fp32 scores over the expanded
     * K/V), decode rows the absorbed path: same maths, other rounding.
     * Stated bound on the layer-0 output: rel <= 1e-2, cosine >= 0.9999;
     * the index path is identical, so layer 0 selects the same tokens. */
    cfg_opts o = small(1);
    o.topk = 5;                                /* sparse: T > topk */
    o.n_layers = 1;
    dsattn_mla *m = make_model(&o, 2, 0);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    const size_t T = 24, dim = 256, kw = 5;
    float *x = rand_input(T, dim, 4), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
    float *aa = malloc(T * dim * 4), *ab = malloc(T * dim * 4);
    int32_t *sa = malloc(T * kw * 4), *sb = malloc(T * kw * 4);
    if (m && ref) {
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, T, a, aa, sa, kw));
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 9, b, ab, sb, kw));
        CHECK_MSG(memcmp(sa, sb, T * kw * 4) == 0, "selections differ between prefill and decode");
        check_stat("V3.2 layer 0 prefill+decode vs one prefill", ab, aa, T * dim, 1e-2, 0.9999);
        CHECK_MSG(same_bits(aa, ab, 9 * dim), "the prefill rows themselves must be identical");
        CHECK_MSG(!same_bits(aa, ab, T * dim), "decode rows bit-identical: absorbed path not run?");
    }
    free(x); free(a); free(b); free(aa); free(ab); free(sa); free(sb);
    dsattn_ctx_destroy(ref);
    dsattn_mla_destroy(m);
}

/* ==== Causality ========================================================= */

DSATTN_TEST(mla, causal_future_token_changes_nothing_before_it)
{
    const size_t T = 20, dim = 256;
    for (int dsa = 0; dsa < 2; dsa++)
        for (int mode = 0; mode < 2; mode++) {
            cfg_opts o = small(dsa);
            o.topk = 6;
            dsattn_mla *m = make_model(&o, 5 + (uint64_t)dsa, 0);
            dsattn_ctx *ctx = dsattn_test_ctx(mode ? DSATTN_MODE_REFERENCE : DSATTN_MODE_FAST, 0);
            float *x = rand_input(T, dim, 6), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
            if (m && ctx) {
                CHECK_OK(run(ctx, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, T, a, NULL, NULL, 0));
                for (size_t i = 0; i < dim; i++) x[(T - 1) * dim + i] *= -1.5f;
                CHECK_OK(run(ctx, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, T, b, NULL, NULL, 0));
                CHECK_MSG(same_bits(a, b, (T - 1) * dim), "dsa %d mode %d: a future token changed "
                          "an earlier output", dsa, mode);
                CHECK_MSG(!same_bits(a + (T - 1) * dim, b + (T - 1) * dim, dim),
                          "the changed token's own output did not change");
            }
            free(x); free(a); free(b);
            dsattn_ctx_destroy(ctx);
            dsattn_mla_destroy(m);
        }
}

/* ==== Absorbed vs naive ================================================= */

DSATTN_TEST(mla, absorbed_equals_naive)
{
    /* The same maths with bf16 roundings at other points (golden README:
     * ~5e-3 relative).  Stated bound: rel <= 2e-2, cosine >= 0.9995. */
    const size_t T = 24, dim = 256;
    for (int dsa = 0; dsa < 2; dsa++) {
        cfg_opts o = small(dsa);
        dsattn_mla *m = make_model(&o, 7 + (uint64_t)dsa, 0);
        dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
        float *x = rand_input(T, dim, 8), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
        if (m && ref) {
            CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 6, a, NULL, NULL, 0));
            CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_NAIVE, x, T, 6, b, NULL, NULL, 0));
            check_stat(dsa ? "V3.2 naive vs absorbed" : "V3 naive vs absorbed", b, a, T * dim,
                       2e-2, 0.9995);
            /* V3.2 prefill is the MHA path in both: identical rows */
            if (dsa) CHECK(same_bits(a, b, 6 * dim));
            CHECK_MSG(!same_bits(a + 6 * dim, b + 6 * dim, (T - 6) * dim),
                      "naive and absorbed decode are bit-identical: one path not run?");
        }
        free(x); free(a); free(b);
        dsattn_ctx_destroy(ref);
        dsattn_mla_destroy(m);
    }
}

/* ==== DSA vs dense ====================================================== */

DSATTN_TEST(mla, dsa_with_topk_ge_visible_equals_dense)
{
    const size_t T = 20, dim = 256;
    cfg_opts o = small(1);
    o.topk = 32;                           /* >= every row's visible count */
    dsattn_mla *m = make_model(&o, 9, 0);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    float *x = rand_input(T, dim, 10), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
    if (m && ref && fast) {
        for (int mode = 0; mode < 2; mode++) {
            dsattn_ctx *ctx = mode ? fast : ref;
            m->cfg.force_dense = 0;
            CHECK_OK(run(ctx, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 7, a, NULL, NULL, 0));
            m->cfg.force_dense = 1;
            CHECK_OK(run(ctx, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 7, b, NULL, NULL, 0));
            CHECK_MSG(same_bits(a, b, T * dim), "mode %d: DSA with top-k >= visible != dense", mode);
        }
        /* and a top-k below the visible count does change the result */
        m->cfg.force_dense = 0;
        m->cfg.index_topk = 4;
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 7, a, NULL, NULL, 0));
        CHECK_MSG(!same_bits(a + 6 * dim, b + 6 * dim, (T - 6) * dim),
                  "top-4 of up to 20 visible tokens equals dense: the mask is not applied");
        CHECK_MSG(same_bits(a, b, 4 * dim), "rows with <= 4 visible tokens must stay dense");
    }
    free(x); free(a); free(b);
    dsattn_ctx_destroy(ref); dsattn_ctx_destroy(fast);
    dsattn_mla_destroy(m);
}

/* ==== Selection vs brute force ========================================== */

typedef struct { float s; int32_t i; } scored;

static int cmp_scored(const void *pa, const void *pb)
{
    const scored *a = pa, *b = pb;
    if (a->s != b->s) return a->s > b->s ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

DSATTN_TEST(mla, dsa_selection_equals_brute_force_topk)
{
    /* The index scores recomputed here from the cached codes and the
     * queries (fp8_index written out: relu(q_code . k_code) * w_h summed,
     * times k_s), sorted in full (ties: lower position), top min(k, t+1):
     * the layer's selection must be that set on every prefill and decode
     * row. */
    const size_t T = 26, P = 11, dim = 256, K = 5;
    cfg_opts o = small(1);
    o.topk = (int)K;
    o.n_layers = 1;
    dsattn_mla *m = make_model(&o, 11, 0);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ref) goto out;
    const dsattn_mla_config *c = &m->cfg;
    const size_t QL = (size_t)c->q_lora_rank, Hi = (size_t)c->index_n_heads;
    const size_t Di = (size_t)c->index_head_dim, kb = Di + 4;
    float *x = rand_input(T, dim, 12), *out = malloc(T * dim * 4);
    float *qr = malloc(T * QL * 4), *qc = malloc(T * Hi * Di * 4), *wq = malloc(T * Hi * 4);
    uint8_t *kc = calloc(T, kb);
    scored *sc = malloc(T * sizeof *sc);
    dsattn_mla_seq *s = NULL;
    CHECK_OK(dsattn_mla_seq_create(&s, m, T, DSATTN_MLA_CACHE_LATENT_BF16));
    /* queries and keys of all tokens, outside the stack */
    CHECK_OK(dsattn_linear(ref, &m->layer[0].wq_a, x, dim, T, qr, QL, DSATTN_OUT_BF16, NULL, NULL));
    for (size_t t = 0; t < T; t++)
        dsattn_rmsnorm(qr + t * QL, m->layer[0].q_norm, QL, c->eps, qr + t * QL, DSATTN_OUT_BF16);
    CHECK_OK(dsattn_mla_index_qk(ref, m, 0, x, qr, T, 0, qc, wq, kc, NULL));
    size_t rows_checked = 0, rows_sparse = 0;
    for (size_t t0 = 0; s && t0 < T;) {
        size_t n = t0 == 0 ? P : 1;
        CHECK_OK(dsattn_mla_attn_forward(ref, s, 0, x + t0 * dim, n, out + t0 * dim));
        const int32_t *rows;
        size_t nr, wd;
        CHECK_OK(dsattn_mla_seq_selection(s, 0, &rows, &nr, &wd));
        CHECK_EQ_INT(nr, n);
        for (size_t r = 0; r < nr; r++) {
            size_t t = t0 + r, nvis = t + 1;
            for (size_t j = 0; j < nvis; j++) {
                double sum = 0.0;
                for (size_t h = 0; h < Hi; h++) {
                    double d = 0.0;
                    for (size_t i = 0; i < Di; i++)
                        d += (double)qc[(t * Hi + h) * Di + i] * dsattn_e4m3_to_f32(kc[j * kb + i]);
                    float df = (float)d;
                    sum += (double)((df > 0 ? df : 0.0f) * wq[t * Hi + h]);
                }
                float ks;
                memcpy(&ks, kc + j * kb + Di, 4);
                sc[j].s = (float)sum * ks;
                sc[j].i = (int32_t)j;
            }
            qsort(sc, nvis, sizeof *sc, cmp_scored);
            size_t k = nvis < K ? nvis : K;
            int32_t want[64];
            for (size_t i = 0; i < k; i++) want[i] = sc[i].i;
            dsattn_sort_idx_valid_first(want, k);
            int ok = 1;
            for (size_t i = 0; i < wd; i++) ok &= i < k ? rows[r * wd + i] == want[i] : rows[r * wd + i] == -1;
            CHECK_MSG(ok, "row %zu: selection differs from the brute-force top-%zu", t, k);
            rows_checked++;
            rows_sparse += nvis > K;
        }
        CHECK_OK(dsattn_mla_seq_advance(s, n));
        t0 += n;
    }
    CHECK_EQ_INT(rows_checked, T);
    CHECK(rows_sparse >= T - K);
    dsattn_mla_seq_destroy(s);
    free(x); free(out); free(qr); free(qc); free(wq); free(kc); free(sc);
out:
    dsattn_ctx_destroy(ref);
    dsattn_mla_destroy(m);
}

/* ==== Fast paths at depth =============================================== */

/* One decode step at `depth` over synthetic caches, in both modes, on two
 * sequences filled with the same seed; out [dim] each. */
static void decode_at_depth(const dsattn_mla *m, dsattn_mla_cache fmt, int64_t depth, float *o_ref,
                            float *o_fast, int32_t *sel_ref, int32_t *sel_fast, size_t kw)
{
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    const size_t dim = (size_t)dsattn_mla_dim(m);
    float *x = rand_input(1, dim, 99);
    for (int mode = 0; mode < 2 && ref && fast; mode++) {
        dsattn_mla_seq *s = NULL;
        CHECK_OK(dsattn_mla_seq_create(&s, m, (size_t)depth + 1, fmt));
        CHECK_OK(dsattn_mla_seq_fill_synthetic(s, depth, 1234));
        CHECK_EQ_INT(dsattn_mla_seq_pos(s), depth);
        dsattn_ctx *ctx = mode ? fast : ref;
        dsattn_ctx_counters_reset(ctx);
        CHECK_OK(dsattn_mla_attn_forward(ctx, s, 0, x, 1, mode ? o_fast : o_ref));
        dsattn_counters cn = dsattn_ctx_counters(ctx);
        CHECK_MSG(cn.flops > 0 && cn.bytes_read > 0, "counters not updated");
        const int32_t *rows;
        size_t nr, wd;
        int32_t *sel = mode ? sel_fast : sel_ref;
        if (sel && dsattn_mla_seq_selection(s, 0, &rows, &nr, &wd) == DSATTN_OK)
            for (size_t i = 0; i < kw; i++) sel[i] = i < wd ? rows[i] : -1;
        dsattn_mla_seq_destroy(s);
    }
    free(x);
    dsattn_ctx_destroy(ref);
    dsattn_ctx_destroy(fast);
}

DSATTN_TEST(mla, fast_absorbed_decode_matches_reference_at_depth)
{
    /* depth 3000: the fast path splits the keys over threads and merges the
     * partial softmax states; bf16 and FP8 latent caches; V3 and V3.2
     * (top-k above the depth, so the same keys are attended). */
    const size_t dim = 256;
    float a[256], b[256];
    for (int dsa = 0; dsa < 2; dsa++) {
        cfg_opts o = small(dsa);
        o.n_layers = 1;
        o.topk = 4096;
        dsattn_mla *m = make_model(&o, 13 + (uint64_t)dsa, 0);
        for (int f = 1; m && f <= 2; f++) {
            decode_at_depth(m, (dsattn_mla_cache)f, 3000, a, b, NULL, NULL, 0);
            char what[64];
            snprintf(what, sizeof what, "dsa %d cache %d: fast vs reference", dsa, f);
            check_stat(what, b, a, dim, 1e-2, 0.9999);
        }
        dsattn_mla_destroy(m);
    }
}

/* The phase profile over an MLA decode step: every phase the step passes
 * through is timed, the attention phase carries the attention FLOPs and no
 * projection, and profiling changes no bit of the output. */
DSATTN_TEST(mla, phase_profile)
{
    cfg_opts o = small(1);
    o.n_layers = 1;
    dsattn_mla *m = make_model(&o, 19, 1);
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    if (!m || !ctx) return;
    const size_t dim = (size_t)dsattn_mla_dim(m);
    float *x = rand_input(1, dim, 19), *y0 = calloc(dim, sizeof(float)), *y1 = calloc(dim, sizeof(float));
    dsattn_mla_seq *s0 = NULL, *s1 = NULL;
    CHECK_OK(dsattn_mla_seq_create(&s0, m, 200, DSATTN_MLA_CACHE_LATENT_BF16));
    CHECK_OK(dsattn_mla_seq_create(&s1, m, 200, DSATTN_MLA_CACHE_LATENT_BF16));
    if (s0 && s1) {
        CHECK_OK(dsattn_mla_seq_fill_synthetic(s0, 150, 3));
        CHECK_OK(dsattn_mla_seq_fill_synthetic(s1, 150, 3));
        CHECK_OK(dsattn_mla_attn_forward(ctx, s0, 0, x, 1, y0));
        dsattn_ctx_set_profiling(ctx, 1);
        dsattn_ctx_counters_reset(ctx);
        CHECK_OK(dsattn_mla_attn_forward(ctx, s1, 0, x, 1, y1));
        CHECK(memcmp(y0, y1, dim * sizeof(float)) == 0);
        dsattn_profile p = dsattn_ctx_profile(ctx);
        const dsattn_phase seen[] = { DSATTN_PHASE_QUERY, DSATTN_PHASE_KV, DSATTN_PHASE_INDEX,
                                      DSATTN_PHASE_ATTN, DSATTN_PHASE_OUTPUT };
        for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++)
            CHECK_MSG(p.seconds[seen[i]] > 0, "phase %s not timed", dsattn_phase_name(seen[i]));
        CHECK(p.flops[DSATTN_PHASE_ATTN] > 0 && p.proj_seconds[DSATTN_PHASE_ATTN] == 0);
        CHECK(p.proj_seconds[DSATTN_PHASE_QUERY] > 0 && p.proj_seconds[DSATTN_PHASE_OUTPUT] > 0);
        CHECK(p.seconds[DSATTN_PHASE_COMPRESS] == 0 && p.seconds[DSATTN_PHASE_OTHER] == 0);
    }
    dsattn_mla_seq_destroy(s0);
    dsattn_mla_seq_destroy(s1);
    free(x); free(y0); free(y1);
    dsattn_ctx_destroy(ctx);
    dsattn_mla_destroy(m);
}

DSATTN_TEST(mla, fast_index_scores_match_reference)
{
    /* fp8_index in fast mode vs the double-accumulating reference over 3000
     * random keys, 8 and 64 heads: the FMA form (sgemm over decoded key
     * blocks, the kernel table's head sum) and, where the CPU has AMX or
     * AVX512-BF16, the bf16-block form (not the FMA form's bits, so it
     * ran); then a NaN key code, which the block form hands back to the
     * FMA form (the same bits). */
    const size_t Di = 128, n = 3000, kb = Di + 4;
    for (size_t Hi = 8; Hi <= 64; Hi *= 8) {
        dsattn_rng r = { 17 + Hi };
        float *q = malloc(Hi * Di * 4), *w = malloc(Hi * 4), *sa = malloc(n * 4);
        float *sb = malloc(n * 4), *sc = malloc(n * 4);
        uint8_t *kc = malloc(n * kb);
        float v[128];
        for (size_t i = 0; i < Hi * Di; i++)
            q[i] = dsattn_e4m3_to_f32(dsattn_f32_to_e4m3(dsattn_rng_normal(&r) * 100));
        for (size_t h = 0; h < Hi; h++) w[h] = dsattn_rng_normal(&r) * 0x1p-9f;
        for (size_t j = 0; j < n; j++) {
            for (size_t i = 0; i < Di; i++) v[i] = dsattn_rng_normal(&r);
            dsattn_v32_index_pack(v, Di, kc + j * kb, NULL);
        }
        dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
        dsattn_ctx *fma = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
        dsattn_ctx *blk = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
        if (ref && fma && blk) {
            dsattn_test_set_bf16blk(fma, 0);
            const int have_blk = dsattn_test_set_bf16blk(blk, 1);
            dsattn_mla_index_scores(ref, q, w, Hi, Di, kc, n, sa, NULL);
            dsattn_mla_index_scores(fma, q, w, Hi, Di, kc, n, sb, NULL);
            dsattn_mla_index_scores(blk, q, w, Hi, Di, kc, n, sc, NULL);
            /* fp32 head sums: the bound grows with the heads summed */
            const double tol = 1e-6 * (double)Hi / 8;
            CHECK_CLOSE("index scores FMA vs ref", sb, sa, n, tol, 1e-5);
            CHECK_CLOSE("index scores bf16 blocks (or FMA) vs ref", sc, sa, n, tol, 1e-5);
            if (have_blk)
                CHECK_MSG(memcmp(sb, sc, n * 4) != 0, "H %zu: the bf16 blocks gave the FMA bits", Hi);
            /* the top-64 sets agree */
            int32_t ia[64], ib[64];
            dsattn_topk(sa, n, 64, ia, NULL);
            dsattn_topk(sc, n, 64, ib, NULL);
            dsattn_sort_idx_valid_first(ia, 64);
            dsattn_sort_idx_valid_first(ib, 64);
            size_t same = 0;
            for (size_t i = 0; i < 64; i++) same += ia[i] == ib[i];
            CHECK_MSG(same >= 62, "top-64 of 3000 differs in %zu places", 64 - same);
            kc[1234 * kb + 5] = 0x7f;                   /* a NaN code */
            dsattn_mla_index_scores(fma, q, w, Hi, Di, kc, n, sb, NULL);
            dsattn_mla_index_scores(blk, q, w, Hi, Di, kc, n, sc, NULL);
            CHECK_MSG(memcmp(sb, sc, n * 4) == 0, "H %zu: NaN code not handed to the FMA form", Hi);
        }
        free(q); free(w); free(sa); free(sb); free(sc); free(kc);
        dsattn_ctx_destroy(ref); dsattn_ctx_destroy(fma); dsattn_ctx_destroy(blk);
    }
}

DSATTN_TEST(mla, dsa_sparse_decode_at_depth_fast_vs_reference)
{
    /* top-64 of 2000 synthetic keys: the selections (fast index scores) and
     * the sparse absorbed attention over them. */
    cfg_opts o = small(1);
    o.n_layers = 1;
    o.topk = 64;
    dsattn_mla *m = make_model(&o, 15, 0);
    float a[256], b[256];
    int32_t sa[64], sb[64];
    if (m) {
        decode_at_depth(m, DSATTN_MLA_CACHE_LATENT_BF16, 2000, a, b, sa, sb, 64);
        size_t same = 0;
        for (size_t i = 0, j = 0; i < 64 && j < 64;) {
            if (sa[i] == sb[j]) { same++; i++; j++; }
            else if (sa[i] < sb[j]) i++;
            else j++;
        }
        CHECK_MSG(same >= 62, "selection overlap %zu of 64", same);
        CHECK(sa[63] >= 0 && sa[63] < 2001);
        if (same == 64) check_stat("sparse decode fast vs reference", b, a, 256, 1e-2, 0.9999);
    }
    dsattn_mla_destroy(m);
}

/* ==== The heads-in-lanes kernels (mla_kernels.h) ======================== */

static void fill_rand(float *x, size_t n, uint64_t seed, float amp)
{
    dsattn_rng r = { seed };
    for (size_t i = 0; i < n; i++) x[i] = amp * dsattn_rng_normal(&r);
}

/* One SIMD table's tiles against the scalar one on one shape (H heads, hp
 * padded, D latent elements, C columns; check_mla_table below runs five).
 * The first is off every tile: 37 heads (hp 48 = a 32-head group and a
 * 16-head half group), D = 45 (a 16- and an
 * 8-wide transpose tail), 23 latent columns (AVX-512 12 + 4 + 4 + 3, AVX2
 * 6 + 6 + 6 + 5), key counts 1, 13 and 30 (partial 12-key tiles).  Tile
 * packing, FP8 row decode and the weight rows are bit-exact (same values,
 * NaN codes included); QK, PV and the softmax differ only by FMA
 * contraction and the exp polynomial: elementwise rel <= 2e-5 (scores,
 * P.V) and 1e-5 (probabilities, sums).  With a second table B (the AVX2
 * table beside the AVX-512 one), QK, the softmax and PV must equal B's bit
 * for bit: the same FMA chains in other register tiles (mla_kernels.h). */
static void check_mla_tiles(const dsattn_mla_kern *A, const dsattn_mla_kern *B, size_t H,
                            size_t hp, size_t D, size_t C)
{
    const dsattn_mla_kern *R = &dsattn_mla_kern_ref;
    const size_t NKMAX = 36, ld = hp + 3;
    float *q = malloc(H * D * 4), *qp = malloc(hp * D * 4), *rows = malloc(NKMAX * D * 4);
    float *ka = malloc(NKMAX * D * 4), *kr = malloc(NKMAX * D * 4);
    float *sa = malloc(NKMAX * ld * 4), *sr = malloc(NKMAX * ld * 4), *sb = malloc(NKMAX * ld * 4);
    float *aa = malloc(C * hp * 4), *ar = malloc(C * hp * 4), *ab = malloc(C * hp * 4);
    uint16_t *b16 = malloc(NKMAX * D * 2);
    fill_rand(q, H * D, 5, 1.0f);
    fill_rand(rows, NKMAX * D, 6, 1.0f);
    for (size_t i = 0; i < NKMAX * D; i++) b16[i] = dsattn_f32_to_bf16(rows[i]);
    dsattn_mla_pack_q(q, D, H, hp, D, qp);
    const size_t nks[] = { 1, 13, 30 };
    for (size_t t = 0; t < 3; t++) {
        const size_t nk = nks[t], ntile = (nk + 11) / 12;
        /* tiles from fp32 rows and from bf16 rows: bit-exact */
        for (size_t i = 0; i < ntile; i++) {
            const size_t nr = nk - i * 12 < 12 ? nk - i * 12 : 12;
            A->tile_rows(rows + i * 12 * D, D, nr, D, ka + i * 12 * D);
            R->tile_rows(rows + i * 12 * D, D, nr, D, kr + i * 12 * D);
        }
        CHECK_BITS("tile_rows", ka, kr, ntile * 12 * D);
        for (size_t i = 0; i < ntile; i++) {
            const size_t nr = nk - i * 12 < 12 ? nk - i * 12 : 12;
            const uint8_t *rp[12];
            for (size_t r = 0; r < nr; r++) rp[r] = (const uint8_t *)(b16 + (i * 12 + r) * D);
            A->tile_bf16(rp, nr, D, ka + i * 12 * D);
            R->tile_bf16(rp, nr, D, kr + i * 12 * D);
        }
        CHECK_BITS("tile_bf16", ka, kr, ntile * 12 * D);
        /* scores, every tile row (padded keys score 0) */
        A->qk(qp, hp, D, kr, nk, sa, ld);
        R->qk(qp, hp, D, kr, nk, sr, ld);
        for (size_t j = 0; j < ntile * 12; j++)
            CHECK_CLOSE("qk", sa + j * ld, sr + j * ld, hp, 1e-5, 2e-5);
        if (B) {
            B->qk(qp, hp, D, kr, nk, sb, ld);
            for (size_t j = 0; j < ntile * 12; j++)
                CHECK_BITS("qk, two SIMD tables", sa + j * ld, sb + j * ld, hp);
        }
        /* online softmax from a state with a max to move, bf16 and fp32 */
        for (int bf = 0; bf < 2; bf++) {
            float ma[96], la[96], fa[96], mr[96], lr[96], fr[96];
            for (size_t h = 0; h < hp; h++) {
                ma[h] = mr[h] = h % 3 ? 0.25f * (float)(h % 7) : -INFINITY;
                la[h] = lr[h] = h % 3 ? 2.0f : 0.0f;
            }
            memcpy(sa, sr, nk * ld * 4);
            memcpy(sb, sr, nk * ld * 4);
            float mb[96], lb[96], fb[96];
            memcpy(mb, ma, sizeof mb);
            memcpy(lb, la, sizeof lb);
            A->softmax(sa, ld, hp, nk, 0.37f, bf, ma, la, fa);
            R->softmax(sr, ld, hp, nk, 0.37f, bf, mr, lr, fr);
            CHECK_BITS("softmax max", ma, mr, hp);
            CHECK_CLOSE("softmax sum", la, lr, hp, 0, 1e-5);
            CHECK_CLOSE("softmax alpha", fa, fr, hp, 0, 1e-5);
            for (size_t j = 0; j < nk; j++)
                CHECK_CLOSE("softmax p", sa + j * ld, sr + j * ld, hp, 0, 1e-5);
            if (B) {
                B->softmax(sb, ld, hp, nk, 0.37f, bf, mb, lb, fb);
                CHECK_BITS("softmax sum, two SIMD tables", la, lb, hp);
                CHECK_BITS("softmax alpha, two SIMD tables", fa, fb, hp);
                for (size_t j = 0; j < nk; j++)
                    CHECK_BITS("softmax p, two SIMD tables", sa + j * ld, sb + j * ld, hp);
            }
        }
        /* P.V with a rescale, over the scalar's probabilities */
        fill_rand(aa, C * hp, 7, 1.0f);
        memcpy(ar, aa, C * hp * 4);
        float al[96];
        for (size_t h = 0; h < hp; h++) al[h] = h % 3 ? 1.0f : 0.25f * (float)(1 + h % 4);
        const uint8_t *pf[1] = { (const uint8_t *)b16 };
        memcpy(ab, aa, C * hp * 4);
        A->pv(sr, ld, hp, kr, D, nk, C, al, aa, pf, 1, 200);
        R->pv(sr, ld, hp, kr, D, nk, C, al, ar, pf, 1, 200);
        CHECK_CLOSE("pv", aa, ar, C * hp, 1e-5, 2e-5);
        if (B) {
            B->pv(sr, ld, hp, kr, D, nk, C, al, ab, pf, 1, 200);
            CHECK_BITS("pv, two SIMD tables", aa, ab, C * hp);
        }
    }
    free(q); free(qp); free(rows); free(ka); free(kr); free(sa); free(sr); free(aa); free(ar);
    free(sb); free(ab); free(b16);
}

/* The table's row entries against the scalar table: the V3.2 FP8 latent
 * row, the absorption weight rows, the indexer's head sum, the bf16 rows
 * and rounding. */
static void check_mla_rows(const dsattn_mla_kern *A)
{
    const dsattn_mla_kern *R = &dsattn_mla_kern_ref;
    /* FP8 latent rows (656-byte layout at kl 512; and a rope of 66, a
     * tail past the last whole vector) with NaN codes */
    for (size_t dr = 64; dr <= 66; dr += 2) {
        const size_t kl = 512, rb = dsattn_v32_kv_row_bytes(kl, dr);
        float *x = malloc((kl + dr) * 4), *oa = malloc((kl + dr) * 4), *orf = malloc((kl + dr) * 4);
        uint8_t *row = malloc(rb);
        fill_rand(x, kl + dr, 8, 3.0f);
        dsattn_v32_kv_pack(x, kl, dr, row, NULL);
        row[3] = 0x7f;
        row[200] = 0xff;
        A->v32_row(row, kl, dr, oa);
        R->v32_row(row, kl, dr, orf);
        CHECK(isnan(oa[3]) && isnan(oa[200]));
        CHECK_BITS("v32_row", oa, orf, kl + dr);
        free(x); free(oa); free(orf); free(row);
    }
    /* absorption weight rows: every code, two block scales, a tail */
    {
        const size_t n = 272, bs = 128;           /* 2 blocks + 16 */
        uint8_t w[272];
        const float scale[3] = { 0x1p-9f, 3.0e-3f, 0x1p110f };
        float ya[272], yr[272], x[272];
        for (size_t i = 0; i < n; i++) w[i] = (uint8_t)(i * 7 + 3);
        memset(ya, 0, sizeof ya);
        memset(yr, 0, sizeof yr);
        A->fp8w_axpy(w, scale, bs, n, 1.0f, ya);
        R->fp8w_axpy(w, scale, bs, n, 1.0f, yr);
        CHECK_BITS("fp8w_axpy values", ya, yr, n);  /* 0 + 1*w: the weights themselves */
        size_t nn = 0;
        for (size_t i = 0; i < n; i++) nn += isnan(ya[i]) ? 1 : 0;
        CHECK(nn >= 2);
        for (size_t i = 0; i < n; i++) w[i] = (w[i] & 0x7f) == 0x7f ? 0x3c : w[i];
        fill_rand(x, n, 9, 1.0f);
        const float da = A->fp8w_dot(w, scale, bs, n - 16, x);
        const float dr_ = R->fp8w_dot(w, scale, bs, n - 16, x);
        CHECK_MSG(fabsf(da - dr_) <= 1e-5f * (fabsf(dr_) + 1.0f), "fp8w_dot %g vs %g", da, dr_);
        /* the four-row forms equal four one-row calls bit for bit, on both
         * tables, with and without the finite promise: rows with different
         * scale modes in one block (the general loop), then blocks where
         * all four rows share mode 1 (power of two), 0 (any scale) or 2
         * (huge) - the finite forms' 32-code steps - with bs = 128 and
         * bs = 48 (a 16-element step left in every block), and a tail past
         * the blocks. */
        {
            enum { NMAX = 400 };
            static uint8_t w4b[4][NMAX];
            static const float sc_mixed[4][4] = {
                { 0x1p-9f, 3.0e-3f, 0x1p-7f, 0.5f }, { 0x1p-3f, 0x1p-3f, 0x1p-3f, 0.5f },
                { 5.0e-4f, 0x1p-12f, 7.0e-2f, 0.5f }, { 0x1p-20f, 1.0f, 0x1p-8f, 0.5f } };
            static const float sc_same[4][9] = {
                { 0x1p-9f, 3.0e-3f, 0x1p110f, 0x1p-2f, 0.7f, 0x1p105f, 0x1p-9f, 1.0f, 0.3f },
                { 0x1p-3f, 1.7e-2f, 0x1p112f, 0x1p-12f, 1.3f, 0x1p101f, 0x1p-3f, 1.0f, 0.3f },
                { 0x1p-12f, 5.0e-4f, 0x1p104f, 0x1p3f, 0.1f, 0x1p120f, 0x1p-12f, 1.0f, 0.3f },
                { 0x1p-20f, 9.0e-1f, 0x1p101f, 0x1p-7f, 2.3f, 0x1p103f, 0x1p-20f, 1.0f, 0.3f } };
            const struct { size_t bs, n; int same; } cfg[3] = {
                { 128, 272, 0 }, { 128, 400, 1 }, { 48, 400, 1 } };
            const float a4[4] = { 0.75f, -1.5f, 3.0e-2f, 11.0f };
            float xw[NMAX];
            fill_rand(xw, NMAX, 12, 1.0f);
            for (int c = 0; c < 3; c++) {
                const size_t wbs = cfg[c].bs, wn = cfg[c].n;
                const uint8_t *w4[4];
                const float *s4[4];
                for (int k = 0; k < 4; k++) {
                    for (size_t i = 0; i < wn; i++) {
                        uint8_t b = (uint8_t)(i * (5 + 2 * k) + 11 * k);
                        w4b[k][i] = (b & 0x7f) == 0x7f ? 0x41 : b;
                    }
                    w4[k] = w4b[k];
                    s4[k] = cfg[c].same ? sc_same[k] : sc_mixed[k];
                }
                const dsattn_mla_kern *T[2] = { A, R };
                for (int t = 0; t < 2; t++)
                    for (int fin = 0; fin < 2; fin++) {
                        float acc1[NMAX], acc4[NMAX], d1[4], d4[4];
                        fill_rand(acc1, wn, 11, 2.0f);
                        memcpy(acc4, acc1, wn * sizeof(float));
                        for (int k = 0; k < 4; k++)
                            T[t]->fp8w_axpy(w4[k], s4[k], wbs, wn, a4[k], acc1);
                        T[t]->fp8w_axpy4(w4, s4, wbs, wn, a4, acc4, fin);
                        CHECK_MSG(memcmp(acc4, acc1, wn * sizeof(float)) == 0,
                                  "fp8w_axpy4 (%s, bs %zu, finite %d) differs", T[t]->name, wbs,
                                  fin);
                        for (int k = 0; k < 4; k++)
                            d1[k] = T[t]->fp8w_dot(w4[k], s4[k], wbs, wn, xw);
                        T[t]->fp8w_dot4(w4, s4, wbs, wn, xw, d4, fin);
                        CHECK_MSG(memcmp(d4, d1, sizeof d4) == 0,
                                  "fp8w_dot4 (%s, bs %zu, finite %d) differs", T[t]->name, wbs, fin);
                    }
                /* the SIMD four-row forms against the scalar table (within
                 * rounding: the sums run in other orders) */
                float ra[NMAX], rb[NMAX], dsa[4], dsb[4];
                memset(ra, 0, wn * sizeof(float));
                memset(rb, 0, wn * sizeof(float));
                A->fp8w_axpy4(w4, s4, wbs, wn, a4, ra, 1);
                R->fp8w_axpy4(w4, s4, wbs, wn, a4, rb, 0);
                for (size_t i = 0; i < wn; i++)
                    CHECK_MSG(ra[i] == rb[i] || (isnan(ra[i]) && isnan(rb[i])) ||
                                  fabsf(ra[i] - rb[i]) <= 1e-5f * (fabsf(rb[i]) + 1.0f),
                              "fp8w_axpy4 SIMD vs scalar at %zu: %g vs %g", i, ra[i], rb[i]);
                A->fp8w_dot4(w4, s4, wbs, wn, xw, dsa, 1);
                R->fp8w_dot4(w4, s4, wbs, wn, xw, dsb, 0);
                for (int k = 0; k < 4; k++)
                    CHECK_MSG(dsa[k] == dsb[k] || (isnan(dsa[k]) && isnan(dsb[k])) ||
                                  fabsf(dsa[k] - dsb[k]) <= 1e-5f * (fabsf(dsb[k]) + 1.0f),
                              "fp8w_dot4 SIMD vs scalar row %d: %g vs %g", k, dsa[k], dsb[k]);
            }
        }
        /* the indexer's head sum (64 heads and a 20-head tail case) */
        {
            float cw[3 * 72], hw[72], oa3[3], or3[3];
            fill_rand(cw, 3 * 72, 13, 1.0f);
            fill_rand(hw, 72, 14, 1.0f);
            for (size_t nh = 20; nh <= 64; nh += 44) {
                A->relu_wsum(cw, 72, 3, hw, nh, oa3);
                R->relu_wsum(cw, 72, 3, hw, nh, or3);
                for (int j = 0; j < 3; j++) {
                    double want = 0.0;
                    for (size_t h = 0; h < nh; h++)
                        want += (cw[j * 72 + h] > 0 ? cw[j * 72 + h] : 0.0) * hw[h];
                    CHECK_MSG(fabs(oa3[j] - want) <= 1e-5 * (fabs(want) + 1.0) &&
                                  fabs(or3[j] - want) <= 1e-5 * (fabs(want) + 1.0),
                              "relu_wsum nh %zu key %d: %g / %g vs %g", nh, j, oa3[j], or3[j], want);
                }
            }
        }
        uint16_t wb[45];              /* 45: a tail past the last whole vector */
        for (size_t i = 0; i < 45; i++) wb[i] = dsattn_f32_to_bf16(x[i]);
        memset(ya, 0, sizeof ya);
        memset(yr, 0, sizeof yr);
        A->bf16w_axpy(wb, 45, 1.0f, ya);
        R->bf16w_axpy(wb, 45, 1.0f, yr);
        CHECK_BITS("bf16w_axpy", ya, yr, 45);
        float ra[37], rr[37];
        fill_rand(ra, 37, 10, 1.0f);
        ra[5] = NAN;
        memcpy(rr, ra, sizeof ra);
        A->round_bf16(ra, 37);
        R->round_bf16(rr, 37);
        CHECK_BITS("round_bf16", ra, rr, 37);
    }
}

/* One SIMD table against the scalar one (and B, see above): the tiles on
 * five shapes - the one above; a lone 16-head half group with D = 3 (no
 * whole vector) and 3 columns; two 32-head groups at D = 64 with a last
 * 4-column P.V tile; 20 heads at D = 20 with a last single column; 8
 * latent elements and columns (a last 2-column tile) - then the rows. */
static void check_mla_table(const dsattn_mla_kern *A, const dsattn_mla_kern *B)
{
    static const size_t shape[5][4] = {
        { 37, 48, 45, 23 }, { 13, 16, 3, 3 }, { 60, 64, 64, 64 }, { 20, 32, 20, 19 },
        { 5, 16, 8, 8 } };
    for (int i = 0; i < 5; i++)
        check_mla_tiles(A, B, shape[i][0], shape[i][1], shape[i][2], shape[i][3]);
    check_mla_rows(A);
}

DSATTN_TEST(mla, tile_kernels_simd_match_scalar_on_odd_sizes)
{
    /* every SIMD mla table this build and CPU run (AVX-512, AVX2, NEON),
     * each against the scalar table, and the AVX2 one against the AVX-512
     * one (NEON against x86: mla.tile_bits_are_one_function_on_every_isa) */
    static const dsattn_isa isas[3] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX2, DSATTN_ISA_NEON };
    const dsattn_mla_kern *tab[3] = { NULL, NULL, NULL };
    int n = 0;
    for (int i = 0; i < 3; i++) {
        dsattn_ktab t;
        if (dsattn_ktab_fill(&t, isas[i], 0) == DSATTN_OK && t.mla) tab[i] = t.mla;
    }
    for (int i = 0; i < 3; i++) {
        if (!tab[i]) continue;
        const int before = dsattn_test_failed();
        check_mla_table(tab[i], i == 1 ? tab[0] : NULL);
        CHECK_MSG(dsattn_test_failed() == before, "the checks above failed for mla table %s",
                  tab[i]->name);
        n++;
    }
    if (!n) dsattn_test_skip("no SIMD MLA tiles (CPU or build)");
}

/* FNV-1a (tests/harness.c, NaN as one NaN) over everything the MLA tiles
 * compute on one fixed case: 12-key tiles from 30 fp32 rows of D = 68 (a
 * 4-wide tail after 16- and 8-wide steps), their scores against 37 heads
 * (hp 48: a 32-head group and a half group), the online softmax in bf16
 * and fp32 from a state whose max moves (one key holds a NaN element, so
 * one score per head is NaN: what the running max does with it is x86
 * maxps's), and P.V over 23 columns with a rescale.  The value is what the
 * AVX-512 and the AVX2 tables give on x86-64; every SIMD table a build and
 * CPU have (NEON on aarch64, under qemu in CI) must give it: one set of
 * FMA chains and one exp on every ISA. */
#define MLA_TILE_FNV 0xed2988b92e805de8ull /* the AVX-512 and AVX2 tables, 2026-12-07 */

static uint64_t mla_tile_hash(const dsattn_mla_kern *A)
{
    enum { H = 37, HP = 48, D = 68, C = 23, NK = 30, NT = 3, LD = HP + 5 };
    static float q[H * D], qp[HP * D], rows[NK * D], kt[NT * 12 * D], st[NT * 12 * LD];
    static float p[NT * 12 * LD], acct[C * HP];
    float m[HP], l[HP], al[HP];
    fill_rand(q, H * D, 41, 1.0f);
    fill_rand(rows, NK * D, 42, 1.0f);
    rows[5 * D + 3] = NAN;
    dsattn_mla_pack_q(q, D, H, HP, D, qp);
    for (size_t i = 0; i < NT; i++) {
        const size_t nr = NK - i * 12 < 12 ? NK - i * 12 : 12;
        A->tile_rows(rows + i * 12 * D, D, nr, D, kt + i * 12 * D);
    }
    uint64_t h = dsattn_fnv_bits(DSATTN_FNV_START, kt, NT * 12 * D);
    memset(st, 0, sizeof st);
    A->qk(qp, HP, D, kt, NK, st, LD);
    h = dsattn_fnv_bits(h, st, NT * 12 * LD);
    for (int bf = 1; bf >= 0; bf--) {
        for (size_t i = 0; i < HP; i++) {
            m[i] = i % 3 ? 0.5f * (float)(i % 5) : -INFINITY;
            l[i] = i % 3 ? 1.5f : 0.0f;
        }
        memcpy(p, st, sizeof p);
        A->softmax(p, LD, HP, NK, 0.23f, bf, m, l, al);
        h = dsattn_fnv_bits(h, p, NK * LD);
        h = dsattn_fnv_bits(h, m, HP);
        h = dsattn_fnv_bits(h, l, HP);
        h = dsattn_fnv_bits(h, al, HP);
    }
    /* P.V over the keys without the NaN one (key 5's column is NaN on
     * every table; the rest would be too) */
    for (size_t i = 0; i < HP; i++) p[5 * LD + i] = 0.0f;
    fill_rand(acct, C * HP, 43, 1.0f);
    for (size_t i = 0; i < HP; i++) al[i] = i % 3 ? 1.0f : 0.125f * (float)(1 + i % 6);
    kt[5 + 3 * 12] = 0.0f;
    A->pv(p, LD, HP, kt, D, NK, C, al, acct, NULL, 0, 0);
    return dsattn_fnv_bits(h, acct, C * HP);
}

/* The same over the elementwise row entries (every output one rounding
 * chain whatever the width; the scalar tail past the last whole scale
 * block is the same code on every ISA): key tiles from bf16 rows, the
 * V3.2 FP8 latent row with NaN codes and a rope tail, the absorption rows
 * fp8w_axpy (power-of-two, plain and huge block scales: the three scale
 * modes; NaN codes) and fp8w_axpy4 (finite and not), bf16w_axpy (45
 * elements: a tail past every width's last whole vector) and the bf16
 * rounding.  Not the dots and the head sum (their lanes are added in each
 * width's order). */
#define MLA_ROWS_FNV 0x666e7ff985fbe351ull /* the AVX-512 and AVX2 tables, 2026-12-07 */

static uint64_t mla_rows_hash(const dsattn_mla_kern *A)
{
    enum { D = 68, NT = 2, KL = 512, DR = 66, N = 272, BS = 128 };
    static uint16_t b16[24 * D];
    static float x[24 * D], kt[NT * 12 * D], row[KL + DR];
    static uint8_t v32[KL + 4 * (KL / 128) + 2 * DR], w[4][N];
    fill_rand(x, 24 * D, 51, 2.0f);
    for (size_t i = 0; i < 24 * D; i++) b16[i] = dsattn_f32_to_bf16(x[i]);
    for (size_t t = 0; t < NT; t++) {
        const uint8_t *rp[12];
        for (size_t r = 0; r < 12; r++) rp[r] = (const uint8_t *)(b16 + (t * 12 + r) * D);
        A->tile_bf16(rp, t ? 7 : 12, D, kt + t * 12 * D);
    }
    uint64_t h = dsattn_fnv_bits(DSATTN_FNV_START, kt, NT * 12 * D);
    fill_rand(row, KL + DR, 52, 3.0f);
    dsattn_v32_kv_pack(row, KL, DR, v32, NULL);
    v32[7] = 0x7f;
    v32[300] = 0xff;
    A->v32_row(v32, KL, DR, row);
    h = dsattn_fnv_bits(h, row, KL + DR);
    static const float sc[4][3] = { { 0x1p-7f, 3.0e-3f, 0x1p110f }, { 0x1p-3f, 0x1p-3f, 0x1p-3f },
                                    { 7.0e-2f, 5.0e-4f, 1.5f }, { 0x1p105f, 0x1p-20f, 0.3f } };
    const uint8_t *w4[4];
    const float *s4[4];
    const float a4[4] = { 0.75f, -1.5f, 3.0e-2f, 11.0f };
    float acc[N];
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < N; i++) w[k][i] = (uint8_t)(i * (7 + 2 * k) + 3 * k);
        w4[k] = w[k];
        s4[k] = sc[k];
        fill_rand(acc, N, 53 + (uint64_t)k, 1.0f);
        A->fp8w_axpy(w[k], sc[k], BS, N, a4[k], acc);
        h = dsattn_fnv_bits(h, acc, N);
    }
    fill_rand(acc, N, 57, 1.0f);
    A->fp8w_axpy4(w4, s4, BS, N, a4, acc, 0);
    h = dsattn_fnv_bits(h, acc, N);
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < N; i++) w[k][i] = (w[k][i] & 0x7f) == 0x7f ? 0x3c : w[k][i];
    s4[0] = s4[1] = s4[2] = s4[3] = sc[1];        /* one mode: the finite two-vector steps */
    fill_rand(acc, N, 58, 1.0f);
    A->fp8w_axpy4(w4, s4, BS, N, a4, acc, 1);
    h = dsattn_fnv_bits(h, acc, N);
    fill_rand(acc, N, 60, 1.0f);
    A->bf16w_axpy(b16 + 5, 45, -0.3f, acc);     /* a product that rounds */
    h = dsattn_fnv_bits(h, acc, 45);
    fill_rand(acc, N, 59, 1.0f);
    acc[5] = NAN;
    acc[6] = INFINITY;
    A->round_bf16(acc, N);
    return dsattn_fnv_bits(h, acc, N);
}

DSATTN_TEST(mla, tile_bits_are_one_function_on_every_isa)
{
    static const dsattn_isa isas[3] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX2, DSATTN_ISA_NEON };
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        dsattn_ktab t;
        if (dsattn_ktab_fill(&t, isas[i], 0) != DSATTN_OK || !t.mla) continue;
        const uint64_t h = mla_tile_hash(t.mla);
        CHECK_MSG(h == MLA_TILE_FNV, "%s: MLA tile hash 0x%016llx, expected 0x%016llx",
                  t.mla->name, (unsigned long long)h, (unsigned long long)MLA_TILE_FNV);
        const uint64_t hr = mla_rows_hash(t.mla);
        CHECK_MSG(hr == MLA_ROWS_FNV, "%s: MLA rows hash 0x%016llx, expected 0x%016llx",
                  t.mla->name, (unsigned long long)hr, (unsigned long long)MLA_ROWS_FNV);
        seen++;
    }
    if (!seen) dsattn_test_skip("no SIMD MLA tiles (CPU or build)");
}

DSATTN_TEST(mla, tiled_decode_off_tile_sizes_matches_reference)
{
    /* The fast decode over key counts off its tiles and blocks: 1 key, 13
     * (a partial 12-key tile), 389 (two 192-key blocks and a tail; one
     * thread), 1200 (split over threads, uneven blocks), with 5 or 12
     * heads (hp 16: a half group, 11 or 4 padded heads), bf16 and FP8
     * latent rows, V3 and V3.2, and V3 with FP8 weights (the SIMD W_uk /
     * W_uv rows).  Stated bound as the depth test: rel <= 1e-2, cosine
     * >= 0.9999 vs reference. */
    const size_t dim = 256;
    float a[256], b[256];
    const int64_t depths[] = { 0, 12, 388, 1199 };
    for (int v = 0; v < 4; v++) {
        /* FP8 weights on V3 only: V3.2 quantizes every GEMM input to E4M3,
         * which amplifies any difference (the same 1.2e-2 on every ISA at
         * depth 12, the old sgemm path included), see
         * fp8_weights_fast_vs_reference */
        const int dsa = v & 1, fp8 = v == 2;
        cfg_opts o = small(dsa);
        o.n_layers = 1;
        o.n_heads = v >= 2 ? 12 : 5;        /* FP8 weights need H*32 % 128 == 0 */
        o.topk = 4096;
        o.max_seq_len = 2048;
        dsattn_mla *m = make_model(&o, 31 + (uint64_t)v, fp8);
        for (size_t di = 0; m && di < 4; di++)
            for (int f = 1; f <= 2; f++) {
                decode_at_depth(m, (dsattn_mla_cache)f, depths[di], a, b, NULL, NULL, 0);
                char what[96];
                snprintf(what, sizeof what, "dsa %d fp8w %d H %d cache %d depth %lld: fast vs "
                         "reference", dsa, fp8, o.n_heads, f, (long long)depths[di]);
                check_stat(what, b, a, dim, 1e-2, 0.9999);
            }
        dsattn_mla_destroy(m);
    }
}

/* ==== AMX form ============================================================ */

DSATTN_TEST(mla, amx_pack_q_takes_only_bf16_numbers)
{
    /* the B-tile layout (row k, column 2n + e = q[16g + n][32s + 2k + e]),
     * zero padded heads, and the refusal of a value with fp32-only bits or
     * a subnormal one (signed zero passes) */
    enum { H = 20, HP = 32, D = 64 };
    static float q[H * D];
    static uint16_t qb[HP * D] __attribute__((aligned(64)));
    for (size_t i = 0; i < H * D; i++) q[i] = dsattn_round_bf16((float)i * 0.37f - 11.0f);
    /* through the table: an aarch64 build has no AMX entry points */
    const dsattn_amx_kern *ak = dsattn_amx_avx512_ptr;
    if (!dsattn_cpu_has_avx512() || !ak) {
        dsattn_test_skip("no AVX-512 build path");
        return;
    }
    CHECK(ak->pack_q(q, D, H, HP, D, qb));
    for (size_t h = 0; h < HP; h++)
        for (size_t d = 0; d < D; d++) {
            const size_t g = h / 16, n = h % 16, st = d / 32, k = (d % 32) / 2, e = d % 2;
            const uint16_t got = qb[(g * (D / 32) + st) * 512 + k * 32 + 2 * n + e];
            const uint16_t want = h < H ? dsattn_f32_to_bf16(q[h * D + d]) : 0;
            CHECK_MSG(got == want, "qb head %zu dim %zu: %04x, want %04x", h, d, got, want);
        }
    q[7 * D + 33] = 1.0f + 0x1p-12f;                 /* not a bf16 number */
    CHECK(!ak->pack_q(q, D, H, HP, D, qb));
    q[7 * D + 33] = 0x1p-130f;                       /* subnormal: the tiles read 0 */
    CHECK(!ak->pack_q(q, D, H, HP, D, qb));
    q[7 * D + 33] = -0.0f;
    CHECK(ak->pack_q(q, D, H, HP, D, qb));
}

DSATTN_TEST(mla, bf16_blocks_decode_matches_reference_and_the_fma_tiles)
{
    /* Where the CPU and OS offer AMX-BF16, or the CPU AVX512-BF16: the V3
     * absorbed decode over the bf16 latent cache through the bf16 blocks
     * (AMX tiles, or their VDPBF16PS form), against reference mode and
     * against the same context with them off (the FMA tiles): 20 heads (12
     * padded) and 64; 1, 32, 301 keys (a staged partial block, a full
     * block, two blocks and a tail on one thread) and 1200 (split over
     * threads); V3.2 with top-64 (gathered, staged rows); the bf16 latent
     * rows and the FP8 ones (decoded to bf16 numbers per block).  Bound as the
     * tiled test: rel <= 1e-2, cosine >= 0.9999; and past one key the
     * blocks' output is not bit-identical to the FMA tiles' (so they
     * really ran). */
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    dsattn_ctx *blk = dsattn_test_ctx(DSATTN_MODE_FAST, 0), *fma = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    if (!ref || !blk || !fma || !dsattn_test_set_bf16blk(blk, 1)) {
        dsattn_test_skip("no AMX-BF16 or AVX512-BF16 here");
        goto out;
    }
    CHECK(dsattn_test_set_bf16blk(fma, 0) == 0);
    const int64_t depths[] = { 0, 31, 300, 1199 };
    for (int v = 0; v < 3; v++) {
        cfg_opts o = small(v == 2);
        o.n_layers = 1;
        o.n_heads = v == 1 ? 64 : 20;
        o.rope = 32;                               /* D = 160: whole 32-dim tile steps */
        o.topk = v == 2 ? 64 : 4096;
        o.max_seq_len = 2048;
        dsattn_mla *m = make_model(&o, 41 + (uint64_t)v, 0);
        const size_t dim = m ? (size_t)dsattn_mla_dim(m) : 0;
        float *x = rand_input(1, dim, 98), out[3][256];
        for (size_t di = 0; m && x && di < 8; di++) {
            dsattn_ctx *cs[3] = { ref, blk, fma };
            const dsattn_mla_cache fmt = di < 4 ? DSATTN_MLA_CACHE_LATENT_BF16
                                                : DSATTN_MLA_CACHE_LATENT_FP8;
            for (int k = 0; k < 3; k++) {
                dsattn_mla_seq *s = NULL;
                CHECK_OK(dsattn_mla_seq_create(&s, m, (size_t)depths[di % 4] + 1, fmt));
                CHECK_OK(dsattn_mla_seq_fill_synthetic(s, depths[di % 4], 1234));
                CHECK_OK(dsattn_mla_attn_forward(cs[k], s, 0, x, 1, out[k]));
                dsattn_mla_seq_destroy(s);
            }
            char what[112];
            snprintf(what, sizeof what, "H %d dsa %d %s depth %lld: bf16 blocks vs reference", o.n_heads,
                     o.dsa, di < 4 ? "bf16" : "fp8", (long long)depths[di % 4]);
            check_stat(what, out[1], out[0], dim, 1e-2, 0.9999);
            snprintf(what, sizeof what, "H %d dsa %d %s depth %lld: bf16 blocks vs FMA tiles", o.n_heads,
                     o.dsa, di < 4 ? "bf16" : "fp8", (long long)depths[di % 4]);
            check_stat(what, out[1], out[2], dim, 1e-2, 0.9999);
            if (depths[di % 4] > 0)                  /* one key: p = 1 in both */
                CHECK_MSG(!same_bits(out[1], out[2], dim), "%s: identical bits", what);
        }
        free(x);
        dsattn_mla_destroy(m);
    }
out:
    dsattn_ctx_destroy(ref);
    dsattn_ctx_destroy(blk);
    dsattn_ctx_destroy(fma);
}

/* ==== FP8 ================================================================ */

DSATTN_TEST(mla, fp8_latent_cache_close_to_bf16)
{
    /* 656-byte rows (E4M3 latent per 128 with a power-of-two fp32 scale,
     * bf16 rope): a few % of relative error on the attention output.
     * Stated bound: rel <= 8e-2, cosine >= 0.995, and not identical. */
    const size_t T = 24, dim = 256;
    cfg_opts o = small(1);
    o.n_layers = 1;
    dsattn_mla *m = make_model(&o, 19, 0);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    float *x = rand_input(T, dim, 20), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
    float *aa = malloc(T * dim * 4), *ab = malloc(T * dim * 4);
    if (m && ref) {
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 4, a, aa, NULL, 0));
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_FP8, x, T, 4, b, ab, NULL, 0));
        check_stat("FP8 latent vs bf16 latent", ab + 4 * dim, aa + 4 * dim, (T - 4) * dim, 8e-2,
                   0.995);
        CHECK(same_bits(aa, ab, 4 * dim));   /* V3.2 prefill reads no cache */
        CHECK(!same_bits(aa + 4 * dim, ab + 4 * dim, (T - 4) * dim));
    }
    free(x); free(a); free(b); free(aa); free(ab);
    dsattn_ctx_destroy(ref);
    dsattn_mla_destroy(m);
}

/* Shapes the reference runs with bf16 weights but no fast kernel tiles
 * evenly (dim 160, 5 heads, q_lora_rank 80, kv_lora_rank 96, nope 24,
 * rope 16, v 40; V3.2 with 3 index heads): fast within the stack gates. */
DSATTN_TEST(mla, odd_shapes_bf16_fast_matches_reference)
{
    /* kv_lora_rank 96, then 97: an odd latent + rope width D = 113 makes
     * the float count of the tiled decode's scratch odd, and its row
     * pointers behind it must still be aligned (UBSan: a misaligned store
     * before the fix) */
    for (int v = 0; v < 4; v++) {
        const int dsa = v & 1, kl = v < 2 ? 96 : 97;
        char path[DSATTN_TEST_PATH];
        if (!dsattn_test_tmp(path, sizeof path, "dsattn_mla_odd_XXXXXX")) continue;
        int fd = mkstemp(path);
        if (fd < 0) continue;
        FILE *f = fdopen(fd, "w");
        if (!f) { close(fd); continue; }
        fprintf(f,
                "{\"model_type\": \"%s\", \"dim\": 160, \"n_layers\": 2, \"n_heads\": 5,"
                " \"q_lora_rank\": 80, \"kv_lora_rank\": %d, \"qk_nope_head_dim\": 24,"
                " \"qk_rope_head_dim\": 16, \"v_head_dim\": 40, \"original_seq_len\": 4096,"
                " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32,"
                " \"beta_slow\": 1, \"mscale\": 1.0, \"max_seq_len\": 64, \"dtype\": \"bf16\"%s}\n",
                dsa ? "deepseek_v32" : "deepseek_v3", kl,
                dsa ? ", \"index_n_heads\": 3, \"index_head_dim\": 128, \"index_topk\": 2048,"
                      " \"scale_fmt\": \"ue8m0\"" : "");
        fclose(f);
        dsattn_mla *m = NULL;
        char err[512] = "";
        dsattn_status st = dsattn_mla_create_random(&m, path, 9 + (uint64_t)v, 0, err, sizeof err);
        CHECK_MSG(st == DSATTN_OK, "create_random: %s", err);
        unlink(path);
        if (!m) continue;
        const size_t T = 37, P = 21, dim = 160;
        float *x = rand_input(T, dim, 9), *hr = malloc(T * dim * 4), *hf = malloc(T * dim * 4);
        dsattn_ctx *cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
        dsattn_ctx *cf = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
        CHECK_OK(run(cr, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, P, hr, NULL, NULL, 0));
        CHECK_OK(run(cf, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, P, hf, NULL, NULL, 0));
        for (size_t i = 0; i < T * dim; i++) { hr[i] -= x[i]; hf[i] -= x[i]; }
        char what[64];
        snprintf(what, sizeof what, "%s odd shapes, kv_lora_rank %d", dsa ? "v3.2" : "v3", kl);
        check_stat(what, hf, hr, T * dim, 1e-2, 0.9999);
        dsattn_ctx_destroy(cr);
        dsattn_ctx_destroy(cf);
        free(x); free(hr); free(hf);
        dsattn_mla_destroy(m);
    }
}

DSATTN_TEST(mla, fp8_weights_fast_vs_reference)
{
    /* Random FP8 weights (128x128 power-of-two blocks): V3 dequantizes to
     * bf16 (exact), V3.2 quantizes activations per 128 first.  Stated
     * bound per layer: rel <= 1e-2, cosine >= 0.9999. */
    const size_t T = 12, dim = 256;
    for (int dsa = 0; dsa < 2; dsa++) {
        cfg_opts o = small(dsa);
        /* one layer: V3.2 quantizes every GEMM input to E4M3, where a
         * 1e-3 difference can flip a code by a 2^-3 step, so fast/reference
         * differences compound from layer to layer (2 layers: ~1.4e-2) */
        o.n_layers = 1;
        o.topk = 4;
        dsattn_mla *m = make_model(&o, 21 + (uint64_t)dsa, 1);
        dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
        float *x = rand_input(T, dim, 22), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
        if (m && ref && fast) {
            CHECK_EQ_INT(m->layer[0].wkv_b.kind, DSATTN_W_FP8);
            CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 5, a, NULL, NULL, 0));
            CHECK_OK(run(fast, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 5, b, NULL, NULL, 0));
            check_stat(dsa ? "V3.2 fp8 fast vs ref" : "V3 fp8 fast vs ref", b, a, T * dim, 1e-2,
                       0.9999);
            for (size_t i = 0; i < T * dim; i++) CHECK_MSG(isfinite(a[i]), "non-finite output");
        }
        free(x); free(a); free(b);
        dsattn_ctx_destroy(ref); dsattn_ctx_destroy(fast);
        dsattn_mla_destroy(m);
    }
}

DSATTN_TEST(mla, v3_fp8_weights_at_any_widths)
{
    /* V3 uses its FP8 weights dequantized: any widths, the blocks at the
     * edges partial (q_lora 72, kv_lora 100, 3 heads: H * v_head_dim 96);
     * fast vs reference within the stated bound.  V3.2 quantizes each FP8
     * Linear's input in blocks of 128: the same widths are refused. */
    const size_t T = 12, dim = 256;
    cfg_opts o = small(0);
    o.q_lora = 72;
    o.kv_lora = 100;
    o.n_heads = 3;
    dsattn_mla *m = make_model(&o, 23, 1);
    dsattn_ctx *ref = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    float *x = rand_input(T, dim, 24), *a = malloc(T * dim * 4), *b = malloc(T * dim * 4);
    if (m && ref && fast) {
        CHECK_EQ_INT(m->layer[0].wkv_a.kind, DSATTN_W_FP8);
        CHECK_OK(run(ref, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 5, a, NULL, NULL, 0));
        CHECK_OK(run(fast, m, DSATTN_MLA_CACHE_LATENT_BF16, x, T, 5, b, NULL, NULL, 0));
        for (size_t i = 0; i < T * dim; i++) { a[i] -= x[i]; b[i] -= x[i]; }
        check_stat("V3 fp8 at odd widths, fast vs ref", b, a, T * dim, 1e-2, 0.9999);
    }
    free(x); free(a); free(b);
    dsattn_ctx_destroy(ref); dsattn_ctx_destroy(fast);
    dsattn_mla_destroy(m);
    o.dsa = 1;
    const char *p = write_cfg(&o);
    dsattn_mla *m2 = NULL;
    char err[512] = "";
    CHECK_EQ_INT(p ? dsattn_mla_create_random(&m2, p, 23, 1, err, sizeof err) : -1,
                 DSATTN_ERR_UNSUPPORTED);
    CHECK_MSG(m2 == NULL && strstr(err, "multiples of 128"), "%s", err);
    if (p) unlink(p);
}

/* ==== YaRN gate, bills, errors ========================================== */

DSATTN_TEST(mla, yarn_and_mscale_follow_max_seq_len)
{
    cfg_opts o = small(0);
    o.max_seq_len = 4096;                  /* == original_seq_len: off */
    dsattn_mla *off = make_model(&o, 1, 0);
    o.max_seq_len = 4097;                  /* > original: on */
    dsattn_mla *on = make_model(&o, 1, 0);
    if (off && on) {
        double base = pow(48.0, -0.5), ms = 0.1 * log(40.0) + 1.0;
        CHECK(dsattn_mla_softmax_scale(off) == (float)base);
        CHECK(dsattn_mla_softmax_scale(on) == (float)(base * (ms * ms)));
        /* YaRN: the slowest pair is interpolated by 1/40, the fastest kept */
        CHECK(on->rope.freqs[0] == off->rope.freqs[0]);
        CHECK_MSG(fabsf(on->rope.freqs[7] * 40.0f / off->rope.freqs[7] - 1.0f) < 1e-6f,
                  "slow pair %g vs %g", (double)on->rope.freqs[7], (double)off->rope.freqs[7]);
    }
    dsattn_mla_destroy(off);
    dsattn_mla_destroy(on);
}

static const char *config_path(const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/../../configs/%s", dsattn_test_data(""), name);
    return p;
}

DSATTN_TEST(mla, cache_bytes_per_token_at_released_dims)
{
    /* From the live allocation of a 4-token sequence at the released dims
     * (61 layers, 128 heads, kv_lora 512, rope 64, index 128). */
    const struct { const char *cfg; dsattn_mla_cache f; double per_layer; } cases[] = {
        { "deepseek-v3.json",   DSATTN_MLA_CACHE_NAIVE,       81920 },
        { "deepseek-v3.json",   DSATTN_MLA_CACHE_LATENT_BF16, 1152 },
        { "deepseek-v3.json",   DSATTN_MLA_CACHE_LATENT_FP8,  656 },
        { "deepseek-v3.2.json", DSATTN_MLA_CACHE_NAIVE,       81920 + 132 },
        { "deepseek-v3.2.json", DSATTN_MLA_CACHE_LATENT_BF16, 1152 + 132 },
        { "deepseek-v3.2.json", DSATTN_MLA_CACHE_LATENT_FP8,  656 + 132 },
    };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(cases); i++) {
        dsattn_mla *m = NULL;
        char err[512] = "";
        dsattn_status st = dsattn_mla_create_config_only(&m, config_path(cases[i].cfg), err,
                                                         sizeof err);
        CHECK_MSG(st == DSATTN_OK, "%s: %s", cases[i].cfg, err);
        if (st) continue;
        CHECK_EQ_INT(dsattn_mla_n_layers(m), 61);
        CHECK_EQ_INT(dsattn_mla_has_weights(m), 0);
        dsattn_mla_seq *s = NULL;
        CHECK_OK(dsattn_mla_seq_create(&s, m, 4, cases[i].f));
        dsattn_kv_bill b;
        CHECK_OK(dsattn_mla_seq_kv_bill(s, &b));
        CHECK_MSG(b.global_bytes_per_token == 61 * cases[i].per_layer,
                  "%s fmt %d: %.1f B/token, want 61 x %.0f", cases[i].cfg, (int)cases[i].f,
                  b.global_bytes_per_token, cases[i].per_layer);
        CHECK_EQ_INT(b.global_bytes_allocated, (size_t)(4 * 61 * cases[i].per_layer));
        CHECK_EQ_INT(b.window_bytes + b.state_bytes, 0);
        /* no weights: forward refuses */
        float x[1] = { 0 };
        CHECK_EQ_INT(dsattn_mla_attn_forward(NULL, s, 0, x, 1, x), DSATTN_ERR_INVALID_ARG);
        dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
        float *xx = calloc(7168, sizeof *xx);
        CHECK_EQ_INT(dsattn_mla_attn_forward(c, s, 0, xx, 1, xx), DSATTN_ERR_UNSUPPORTED);
        free(xx);
        dsattn_ctx_destroy(c);
        dsattn_mla_seq_destroy(s);
        /* the paper's totals: V3 bf16 70,272 B, V3.2 FP8 48,068 B */
        if (cases[i].f == DSATTN_MLA_CACHE_LATENT_BF16 && !dsattn_mla_is_dsa(m))
            CHECK(b.global_bytes_per_token == 70272);
        if (cases[i].f == DSATTN_MLA_CACHE_LATENT_FP8 && dsattn_mla_is_dsa(m))
            CHECK(b.global_bytes_per_token == 48068);
        dsattn_mla_destroy(m);
    }
}

DSATTN_TEST(mla, argument_errors)
{
    cfg_opts o = small(1);
    o.n_layers = 1;
    dsattn_mla *m = make_model(&o, 23, 0);
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !c) goto out;
    dsattn_mla_seq *s = NULL;
    CHECK_EQ_INT(dsattn_mla_seq_create(&s, m, 0, DSATTN_MLA_CACHE_LATENT_BF16), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsattn_mla_seq_create(&s, m, 8, (dsattn_mla_cache)7), DSATTN_ERR_INVALID_ARG);
    CHECK_OK(dsattn_mla_seq_create(&s, m, 8, DSATTN_MLA_CACHE_LATENT_BF16));
    float *x = rand_input(8, 256, 24), *y = malloc(8 * 256 * 4);
    CHECK_EQ_INT(dsattn_mla_attn_forward(c, s, 1, x, 1, y), DSATTN_ERR_INVALID_ARG);   /* layer */
    CHECK_EQ_INT(dsattn_mla_attn_forward(c, s, 0, x, 9, y), DSATTN_ERR_INVALID_ARG);   /* capacity */
    CHECK_OK(dsattn_mla_attn_forward(c, s, 0, x, 3, y));
    CHECK_OK(dsattn_mla_seq_advance(s, 3));
    CHECK_EQ_INT(dsattn_mla_attn_forward(c, s, 0, x, 2, y), DSATTN_ERR_UNSUPPORTED);   /* chunked */
    CHECK_EQ_INT(dsattn_mla_seq_advance(s, 6), DSATTN_ERR_INVALID_ARG);
    float kv[128];
    CHECK_EQ_INT(dsattn_mla_seq_latent(s, 0, 3, kv, NULL), DSATTN_ERR_INVALID_ARG);    /* not yet */
    CHECK_OK(dsattn_mla_seq_latent(s, 0, 2, kv, NULL));
    CHECK_EQ_INT(dsattn_mla_seq_fill_synthetic(s, 8, 1), DSATTN_ERR_INVALID_ARG);
    dsattn_mla_seq_destroy(s);
    CHECK_OK(dsattn_mla_seq_create(&s, m, 8, DSATTN_MLA_CACHE_NAIVE));
    CHECK_OK(dsattn_mla_attn_forward(c, s, 0, x, 2, y));
    CHECK_OK(dsattn_mla_seq_advance(s, 2));
    CHECK_EQ_INT(dsattn_mla_seq_latent(s, 0, 0, kv, NULL), DSATTN_ERR_NOT_FOUND);
    dsattn_mla_seq_destroy(s);
    free(x); free(y);
    /* a V3.2 config the reference cannot run, a kv_lora the FP8 rows cannot hold */
    o.kv_lora = 96;
    dsattn_mla *m2 = make_model(&o, 1, 0);
    if (m2) {
        CHECK_EQ_INT(dsattn_mla_seq_create(&s, m2, 4, DSATTN_MLA_CACHE_LATENT_FP8), DSATTN_ERR_UNSUPPORTED);
        const int32_t *rows;
        size_t nr, wd;
        CHECK_EQ_INT(dsattn_mla_seq_selection(NULL, 0, &rows, &nr, &wd), DSATTN_ERR_INVALID_ARG);
    }
    dsattn_mla_destroy(m2);
    {
        char p[DSATTN_TEST_PATH];
        dsattn_test_tmp(p, sizeof p, "dsattn_mla_badcfg.json");
        FILE *f = fopen(p, "w");
        if (f) {
            fprintf(f, "{\"model_type\": \"deepseek_v32\", \"dim\": 256, \"n_layers\": 1, \"n_heads\": 4,"
                       " \"q_lora_rank\": 64, \"kv_lora_rank\": 64, \"qk_nope_head_dim\": 32,"
                       " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"index_n_heads\": 4,"
                       " \"index_head_dim\": 64, \"index_topk\": 8}\n");
            fclose(f);
            dsattn_mla *bad = NULL;
            char err[512] = "";
            CHECK_EQ_INT(dsattn_mla_create_config_only(&bad, p, err, sizeof err), DSATTN_ERR_FORMAT);
            CHECK_MSG(strstr(err, "index_head_dim") != NULL, "error text: %s", err);
            unlink(p);
        }
    }
out:
    dsattn_ctx_destroy(c);
    dsattn_mla_destroy(m);
}

/* A sequence of some layers (dsattn_mla_seq_create_layers) runs a layer it
 * holds exactly as a sequence of every layer does - same outputs, same cache
 * rows, same selection, bit for bit in both modes - refuses the layers it
 * does not hold and the stacks, and keeps its layer range through a session
 * file. */
DSATTN_TEST(mla, layer_subset_sequence_equals_whole_on_its_layers)
{
    for (int dsa = 0; dsa <= 1; dsa++) {
        cfg_opts o = small(dsa);
        o.n_layers = 3;
        o.topk = 8;                      /* the DSA selection is a real top-k */
        dsattn_mla *m = make_model(&o, 31 + (uint64_t)dsa, 1);
        if (!m) return;
        const size_t dim = 256, T = 24, P = 12;
        const dsattn_mla_cache fmt = DSATTN_MLA_CACHE_LATENT_FP8;
        float *x = rand_input(T, dim, 5), *yw = calloc(T * dim, 4), *yp = calloc(T * dim, 4);
        for (int mode = 0; mode < 2; mode++) {
            dsattn_ctx *c = dsattn_test_ctx(mode ? DSATTN_MODE_FAST : DSATTN_MODE_REFERENCE, 0);
            dsattn_mla_seq *w = NULL, *p = NULL;
            CHECK_OK(dsattn_mla_seq_create(&w, m, T + 1, fmt));
            CHECK_OK(dsattn_mla_seq_create_layers(&p, m, T + 1, fmt, 1, 1));
            if (!w || !p) break;
            /* prefill then one-token decode, on layer 1 only, in both */
            CHECK_OK(dsattn_mla_attn_forward(c, w, 1, x, P, yw));
            CHECK_OK(dsattn_mla_attn_forward(c, p, 1, x, P, yp));
            CHECK_OK(dsattn_mla_seq_advance(w, P));
            CHECK_OK(dsattn_mla_seq_advance(p, P));
            for (size_t t = P; t < T; t++) {
                CHECK_OK(dsattn_mla_attn_forward(c, w, 1, x + t * dim, 1, yw + t * dim));
                CHECK_OK(dsattn_mla_attn_forward(c, p, 1, x + t * dim, 1, yp + t * dim));
                CHECK_OK(dsattn_mla_seq_advance(w, 1));
                CHECK_OK(dsattn_mla_seq_advance(p, 1));
            }
            CHECK_MSG(same_bits(yw, yp, T * dim), "dsa %d mode %d: outputs differ", dsa, mode);
            float kw[128 + 16], kp[128 + 16];
            for (size_t j = 0; j < T; j++) {
                CHECK_OK(dsattn_mla_seq_latent(w, 1, j, kw, kw + 128));
                CHECK_OK(dsattn_mla_seq_latent(p, 1, j, kp, kp + 128));
                CHECK_MSG(same_bits(kw, kp, 128 + 16), "cache row %zu differs", j);
            }
            if (dsa) {
                const int32_t *rw, *rp;
                size_t nw, np, ww, wp;
                CHECK_OK(dsattn_mla_seq_selection(w, 1, &rw, &nw, &ww));
                CHECK_OK(dsattn_mla_seq_selection(p, 1, &rp, &np, &wp));
                CHECK(nw == np && ww == wp && ww > 0 && !memcmp(rw, rp, nw * ww * sizeof *rw));
            }
            /* layers it does not hold, the stacks, a batch of mixed holdings */
            float *h = calloc(dim, 4);
            CHECK_EQ_INT(dsattn_mla_attn_forward(c, p, 0, x, 1, yp), DSATTN_ERR_INVALID_ARG);
            CHECK_EQ_INT(dsattn_mla_attn_forward(c, p, 2, x, 1, yp), DSATTN_ERR_INVALID_ARG);
            CHECK_EQ_INT(dsattn_mla_seq_latent(p, 0, 0, kp, NULL), DSATTN_ERR_INVALID_ARG);
            CHECK_EQ_INT(dsattn_mla_stack_forward(c, p, h, 1, NULL, NULL), DSATTN_ERR_INVALID_ARG);
            dsattn_mla_seq *both[2] = { w, p };
            size_t failed = 99;
            CHECK_EQ_INT(dsattn_mla_attn_forward_batch(c, both, 2, 0, x, yp, &failed),
                         DSATTN_ERR_INVALID_ARG);
            CHECK_EQ_INT((int)failed, 1);
            CHECK_EQ_INT(dsattn_mla_stack_forward_batch(c, both, 2, yp, NULL, NULL, &failed),
                         DSATTN_ERR_INVALID_ARG);
            CHECK_EQ_INT((int)failed, 1);
            CHECK_EQ_INT(dsattn_mla_seq_pos(p), (int)T);     /* nothing advanced */
            free(h);
            /* the session keeps the range and the bytes */
            if (mode == 1) {
                char err[512] = "";
                char path[DSATTN_TEST_PATH];
                dsattn_test_tmp(path, sizeof path, "dsattn_test_mla_subset.dsess");
                CHECK_OK(dsattn_mla_seq_save(p, path, err, sizeof err));
                dsattn_mla_seq *q = NULL;
                CHECK_MSG(dsattn_mla_seq_load(&q, m, path, 0, err, sizeof err) == DSATTN_OK,
                          "load: %s", err);
                if (q) {
                    CHECK_EQ_INT(dsattn_mla_seq_pos(q), (int)T);
                    for (size_t j = 0; j < T; j++) {
                        CHECK_OK(dsattn_mla_seq_latent(q, 1, j, kw, kw + 128));
                        CHECK_OK(dsattn_mla_seq_latent(p, 1, j, kp, kp + 128));
                        CHECK(same_bits(kw, kp, 128 + 16));
                    }
                    CHECK_EQ_INT(dsattn_mla_seq_latent(q, 0, 0, kw, NULL), DSATTN_ERR_INVALID_ARG);
                    dsattn_kv_bill bp, bq;
                    CHECK_OK(dsattn_mla_seq_kv_bill(p, &bp));
                    CHECK_OK(dsattn_mla_seq_kv_bill(q, &bq));
                    CHECK(bp.global_bytes_allocated == bq.global_bytes_allocated);
                }
                dsattn_mla_seq_destroy(q);
                unlink(path);
            }
            /* one layer's bill is a third of the three-layer one */
            dsattn_kv_bill bw, bp;
            CHECK_OK(dsattn_mla_seq_kv_bill(w, &bw));
            CHECK_OK(dsattn_mla_seq_kv_bill(p, &bp));
            CHECK(bw.global_bytes_allocated == 3 * bp.global_bytes_allocated);
            dsattn_mla_seq_destroy(w);
            dsattn_mla_seq_destroy(p);
            dsattn_ctx_destroy(c);
        }
        dsattn_mla_seq *s = NULL;
        CHECK_EQ_INT(dsattn_mla_seq_create_layers(&s, m, 8, fmt, 2, 2), DSATTN_ERR_INVALID_ARG);
        CHECK_EQ_INT(dsattn_mla_seq_create_layers(&s, m, 8, fmt, -1, 1), DSATTN_ERR_INVALID_ARG);
        CHECK_EQ_INT(dsattn_mla_seq_create_layers(&s, m, 8, fmt, 0, 0), DSATTN_ERR_INVALID_ARG);
        CHECK(s == NULL);
        free(x); free(yw); free(yp);
        dsattn_mla_destroy(m);
    }
}

/* dsattn_mla_load_layers binds only its layers: the golden V3 checkpoint's
 * layer 1 loaded alone runs exactly as in the whole model (bit for bit in
 * both modes), other layers are DSATTN_ERR_UNSUPPORTED, the stacks refuse
 * it, its weight bytes are that layer's, and a bad range is refused. */
DSATTN_TEST(mla, load_layers_binds_only_its_layers)
{
    char cfg[600], w[600], err[512] = "";
    snprintf(cfg, sizeof cfg, "%s", dsattn_test_data("golden/v3/tiny-seed0/config.json"));
    snprintf(w, sizeof w, "%s", dsattn_test_data("golden/v3/tiny-seed0/weights.safetensors"));
    dsattn_mla *all = NULL, *one = NULL, *bad = NULL;
    CHECK_MSG(dsattn_mla_load(&all, cfg, w, err, sizeof err) == DSATTN_OK, "%s", err);
    CHECK_MSG(dsattn_mla_load_layers(&one, cfg, w, 1, 1, err, sizeof err) == DSATTN_OK, "%s", err);
    if (!all || !one) goto out;
    CHECK_EQ_INT(dsattn_mla_n_layers(one), 3);
    CHECK(3 * dsattn_mla_weight_bytes(one) == dsattn_mla_weight_bytes(all));
    const size_t dim = 256, T = 6;
    float *x = rand_input(T, dim, 9), *ya = calloc(T * dim, 4), *yo = calloc(T * dim, 4);
    for (int mode = 0; mode < 2; mode++) {
        dsattn_ctx *c = dsattn_test_ctx(mode ? DSATTN_MODE_FAST : DSATTN_MODE_REFERENCE, 0);
        dsattn_mla_seq *sa = NULL, *so = NULL, *sw = NULL;
        CHECK_OK(dsattn_mla_seq_create_layers(&sa, all, T, DSATTN_MLA_CACHE_LATENT_BF16, 1, 1));
        CHECK_OK(dsattn_mla_seq_create_layers(&so, one, T, DSATTN_MLA_CACHE_LATENT_BF16, 1, 1));
        CHECK_OK(dsattn_mla_seq_create(&sw, one, T, DSATTN_MLA_CACHE_LATENT_BF16));
        if (!sa || !so || !sw) break;
        CHECK_OK(dsattn_mla_attn_forward(c, sa, 1, x, T - 1, ya));
        CHECK_OK(dsattn_mla_attn_forward(c, so, 1, x, T - 1, yo));
        CHECK_OK(dsattn_mla_seq_advance(sa, T - 1));
        CHECK_OK(dsattn_mla_seq_advance(so, T - 1));
        CHECK_OK(dsattn_mla_attn_forward(c, sa, 1, x + (T - 1) * dim, 1, ya + (T - 1) * dim));
        CHECK_OK(dsattn_mla_attn_forward(c, so, 1, x + (T - 1) * dim, 1, yo + (T - 1) * dim));
        CHECK_MSG(same_bits(ya, yo, T * dim), "mode %d: layer 1 differs", mode);
        /* a sequence of every layer on the one-layer model */
        CHECK_EQ_INT(dsattn_mla_attn_forward(c, sw, 0, x, 1, yo), DSATTN_ERR_UNSUPPORTED);
        CHECK_EQ_INT(dsattn_mla_attn_forward(c, sw, 2, x, 1, yo), DSATTN_ERR_UNSUPPORTED);
        CHECK_EQ_INT(dsattn_mla_stack_forward(c, sw, yo, 1, NULL, NULL), DSATTN_ERR_INVALID_ARG);
        size_t failed = 99;
        CHECK_EQ_INT(dsattn_mla_attn_forward_batch(c, &sw, 1, 0, x, yo, &failed),
                     DSATTN_ERR_UNSUPPORTED);
        CHECK(failed == SIZE_MAX);
        CHECK_EQ_INT(dsattn_mla_stack_forward_batch(c, &sw, 1, yo, NULL, NULL, &failed),
                     DSATTN_ERR_INVALID_ARG);
        CHECK_EQ_INT(dsattn_mla_seq_pos(sw), 0);
        CHECK_OK(dsattn_mla_attn_forward(c, sw, 1, x, 1, yo));
        dsattn_mla_seq_destroy(sa);
        dsattn_mla_seq_destroy(so);
        dsattn_mla_seq_destroy(sw);
        dsattn_ctx_destroy(c);
    }
    free(x); free(ya); free(yo);
    CHECK_EQ_INT(dsattn_mla_load_layers(&bad, cfg, w, 2, 2, err, sizeof err), DSATTN_ERR_INVALID_ARG);
    CHECK_MSG(strstr(err, "outside the model's 3") != NULL, "%s", err);
    CHECK_EQ_INT(dsattn_mla_load_layers(&bad, cfg, w, -1, 1, err, sizeof err), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsattn_mla_load_layers(&bad, cfg, w, 0, 0, err, sizeof err), DSATTN_ERR_INVALID_ARG);
    CHECK(bad == NULL);
out:
    dsattn_mla_destroy(all);
    dsattn_mla_destroy(one);
}
