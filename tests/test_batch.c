/* test_batch.c - batched decode across sequences: a batched step equals
 * the same sequences' one-sequence steps.
 *
 * Each sequence of a pool has a twin with identical state.  A step runs a
 * random subset of the pool, in a random order, through the batched call
 * and each twin through the one-sequence call with the same input row;
 * then every output, every cache byte, the compressor state, the top-k
 * selections and the positions must agree - bit for bit in reference
 * mode, within the fast path's bounds in fast mode.  The pool holds
 * sequences at mixed depths (0, inside and at the end of a compressor
 * group) on the golden V4.1 configs, in both index_k modes, and on the
 * golden V4 config with both all-invalid-row rules in one batch.  Bad batches
 * (a sequence out of capacity, a repeated sequence, another model, a
 * NULL) fail with the right index and change nothing.
 */
#include "harness.h"

#include "internal.h"
#include "numfmt.h"
#include "v4.h"
#include "v41.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

static void rand_rows(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = dsattn_round_bf16((float)((double)(rng(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0));
}

/* ==== V4.1 ============================================================== */

static dsattn_v41 *load_v41(const char *case_dir)
{
    char cfg[1200], w[1200], err[512] = "";
    snprintf(cfg, sizeof cfg, "%s/config.json", dsattn_test_data(case_dir));
    snprintf(w, sizeof w, "%s/weights.safetensors", dsattn_test_data(case_dir));
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_load(&m, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", case_dir, err);
    return m;
}

/* Everything a step can write in a sequence, compared between twins. */
static int v41_same(const dsattn_v41_seq *a, const dsattn_v41_seq *b, int with_sel)
{
    int ok = dsattn_v41_seq_pos(a) == dsattn_v41_seq_pos(b);
    const dsattn_v41 *m = a->m;
    const size_t D = (size_t)m->cfg.head_dim;
    for (int l = 0; l < dsattn_v41_n_layers(m); l++) {
        for (int which = 0; which < 3; which++) {
            const uint8_t *ra, *rb;
            size_t na, nb, ba, bb;
            dsattn_status sa = dsattn_v41_seq_cache(a, l, which, &ra, &na, &ba);
            dsattn_status sb = dsattn_v41_seq_cache(b, l, which, &rb, &nb, &bb);
            ok &= sa == sb;
            if (sa || sb) continue;
            ok &= na == nb && ba == bb && (na == 0 || !memcmp(ra, rb, na * ba));
        }
        const dsattn_v41_layer_s *Sa = &a->layer[l], *Sb = &b->layer[l];
        if (Sa->kv_state) {
            const size_t n = (size_t)m->layer[l].ratio * D * sizeof(float);
            ok &= !memcmp(Sa->kv_state, Sb->kv_state, n) &&
                  !memcmp(Sa->score_state, Sb->score_state, n);
        }
        /* the last chunk's observations (not state: a clone starts without) */
        if (with_sel)
            ok &= Sa->source_read == Sb->source_read && Sa->index_read == Sb->index_read &&
                  Sa->topk_read == Sb->topk_read;
        if (with_sel && m->layer[l].is_index_source) {
            const int32_t *ra, *rb;
            size_t na, nb, wa, wb;
            CHECK_OK(dsattn_v41_seq_selection(a, l, &ra, &na, &wa));
            CHECK_OK(dsattn_v41_seq_selection(b, l, &rb, &nb, &wb));
            ok &= na == nb && wa == wb && (na * wa == 0 || !memcmp(ra, rb, na * wa * 4));
        }
    }
    ok &= a->rt.compress_kv == b->rt.compress_kv && a->rt.index_k == b->rt.index_k &&
          a->rt.topk_w == b->rt.topk_w &&
          (a->rt.topk_w == 0 || !memcmp(a->rt.topk, b->rt.topk, a->rt.topk_w * 4));
    return ok;
}

#define POOL 9

typedef struct {
    dsattn_v41      *m;
    dsattn_v41_seq  *a[POOL], *b[POOL];   /* batched, one-sequence twin */
    size_t           dim, L;
} v41_pool;

/* Twins at depths 0, 1, 2, 3, 5, 8, 13, 20, 31 (prefills), capacity cap. */
static void v41_pool_make(v41_pool *p, dsattn_ctx *ctx, const char *case_dir,
                          dsattn_v41_index_k mode, size_t cap, uint64_t *seed)
{
    static const size_t depth[POOL] = { 0, 1, 2, 3, 5, 8, 13, 20, 31 };
    memset(p, 0, sizeof *p);
    p->m = load_v41(case_dir);
    if (!p->m) return;
    p->dim = (size_t)dsattn_v41_dim(p->m);
    p->L = (size_t)dsattn_v41_n_layers(p->m);
    float *h = malloc(32 * p->dim * sizeof(float));
    for (int k = 0; k < POOL; k++) {
        CHECK_OK(dsattn_v41_seq_create(&p->a[k], p->m, cap, mode));
        if (depth[k]) {
            rand_rows(h, depth[k] * p->dim, seed);
            CHECK_OK(dsattn_v41_stack_forward(ctx, p->a[k], h, depth[k], NULL, NULL));
        }
        CHECK_OK(dsattn_v41_seq_clone(&p->b[k], p->a[k]));
    }
    free(h);
}

static void v41_pool_free(v41_pool *p)
{
    for (int k = 0; k < POOL; k++) {
        dsattn_v41_seq_destroy(p->a[k]);
        dsattn_v41_seq_destroy(p->b[k]);
    }
    dsattn_v41_destroy(p->m);
}

/* A random subset of the pool (1..POOL members), in a random order. */
static size_t pick_subset(int *ids, uint64_t *seed)
{
    int all[POOL];
    for (int k = 0; k < POOL; k++) all[k] = k;
    for (int k = POOL - 1; k > 0; k--) {
        int j = (int)(rng(seed) % (uint64_t)(k + 1)), t = all[k];
        all[k] = all[j];
        all[j] = t;
    }
    size_t n = 1 + (size_t)(rng(seed) % POOL);
    for (size_t i = 0; i < n; i++) ids[i] = all[i];
    return n;
}

/* One step of a random subset: stack API (per_layer 0) or the layer API
 * with every layer's input given (per_layer 1).  exact: compare bits;
 * else accumulate the squared error and norm of the outputs. */
static void v41_step(v41_pool *p, dsattn_ctx *ctx, int per_layer, int exact, uint64_t *seed,
                     double *err2, double *ref2)
{
    int ids[POOL];
    const size_t B = pick_subset(ids, seed), dim = p->dim, L = p->L;
    dsattn_v41_seq *seqs[POOL];
    for (size_t i = 0; i < B; i++) seqs[i] = p->a[ids[i]];
    float *x = malloc(L * B * dim * sizeof(float)), *ob = malloc(L * B * dim * sizeof(float));
    float *os = malloc(L * B * dim * sizeof(float));
    float *h1 = malloc(B * dim * sizeof(float));
    rand_rows(x, (per_layer ? L : 1) * B * dim, seed);
    size_t failed = 7;
    if (per_layer) {
        for (size_t l = 0; l < L; l++)
            CHECK_OK(dsattn_v41_attn_forward_batch(ctx, seqs, B, (int)l, x + l * B * dim,
                                                   ob + l * B * dim, &failed));
        for (size_t i = 0; i < B; i++) CHECK_OK(dsattn_v41_seq_advance(seqs[i], 1));
        for (size_t i = 0; i < B; i++) {
            dsattn_v41_seq *t = p->b[ids[i]];
            for (size_t l = 0; l < L; l++)
                CHECK_OK(dsattn_v41_attn_forward(ctx, t, (int)l, x + (l * B + i) * dim, 1,
                                                 os + (l * B + i) * dim));
            CHECK_OK(dsattn_v41_seq_advance(t, 1));
        }
    } else {
        float *ain = malloc(L * B * dim * sizeof(float));
        memcpy(h1, x, B * dim * sizeof(float));
        CHECK_OK(dsattn_v41_stack_forward_batch(ctx, seqs, B, x, ain, ob, &failed));
        for (size_t i = 0; i < B; i++) {
            float *ai = malloc(L * dim * sizeof(float)), *ao = malloc(L * dim * sizeof(float));
            CHECK_OK(dsattn_v41_stack_forward(ctx, p->b[ids[i]], h1 + i * dim, 1, ai, ao));
            for (size_t l = 0; l < L; l++) {
                memcpy(os + (l * B + i) * dim, ao + l * dim, dim * sizeof(float));
                if (exact)
                    CHECK_BITS("batched attn_in", ain + (l * B + i) * dim, ai + l * dim, dim);
            }
            free(ai);
            free(ao);
        }
        if (exact) CHECK_BITS("batched residual", x, h1, B * dim);
        free(ain);
    }
    CHECK_EQ_INT(failed, 7);                   /* untouched on success */
    if (exact) {
        CHECK_BITS("batched attn_out", ob, os, L * B * dim);
        for (size_t i = 0; i < B; i++)
            CHECK_MSG(v41_same(p->a[ids[i]], p->b[ids[i]], 1),
                      "sequence %d (batch slot %zu of %zu) differs from its twin", ids[i], i, B);
    } else {
        for (size_t j = 0; j < L * B * dim; j++) {
            double e = (double)ob[j] - os[j];
            *err2 += e * e;
            *ref2 += (double)os[j] * os[j];
        }
    }
    free(x); free(ob); free(os); free(h1);
}

static void v41_exact(const char *case_dir, dsattn_v41_index_k mode, uint64_t seed)
{
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 2);
    v41_pool p;
    v41_pool_make(&p, ctx, case_dir, mode, 64, &seed);
    if (!p.m || !ctx) { v41_pool_free(&p); dsattn_ctx_destroy(ctx); return; }
    for (int step = 0; step < 12 && !dsattn_test_failed(); step++)
        v41_step(&p, ctx, step & 1, 1, &seed, NULL, NULL);
    v41_pool_free(&p);
    dsattn_ctx_destroy(ctx);
}

DSATTN_TEST(batch, v41_seed0_owner_bit_exact)     { v41_exact("golden/v41/tiny-seed0", DSATTN_V41_INDEX_K_OWNER, 11); }
DSATTN_TEST(batch, v41_seed0_reference_bit_exact) { v41_exact("golden/v41/tiny-seed0", DSATTN_V41_INDEX_K_REFERENCE, 12); }
DSATTN_TEST(batch, v41_seed2_fp8_owner_bit_exact) { v41_exact("golden/v41/tiny-seed2-fp8", DSATTN_V41_INDEX_K_OWNER, 13); }
DSATTN_TEST(batch, v41_seed2_fp8_reference_bit_exact) { v41_exact("golden/v41/tiny-seed2-fp8", DSATTN_V41_INDEX_K_REFERENCE, 14); }
DSATTN_TEST(batch, v41_alt_seed0_owner_bit_exact) { v41_exact("golden/v41/alt-seed0", DSATTN_V41_INDEX_K_OWNER, 15); }
DSATTN_TEST(batch, v41_alt_seed0_reference_bit_exact) { v41_exact("golden/v41/alt-seed0", DSATTN_V41_INDEX_K_REFERENCE, 16); }

/* Fast mode: the batched rows against the one-sequence rows under the
 * fast_vs_reference gate of test_v41.c (relative error over every layer
 * and step <= 1e-2): batches of 8 and more run the tiled Linear. */
DSATTN_TEST(batch, v41_fast_within_bounds)
{
    uint64_t seed = 21;
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    v41_pool p;
    v41_pool_make(&p, ctx, "golden/v41/tiny-seed2-fp8", DSATTN_V41_INDEX_K_OWNER, 64, &seed);
    double e2 = 0, r2 = 0;
    for (int step = 0; step < 10 && p.m && ctx; step++) v41_step(&p, ctx, 1, 0, &seed, &e2, &r2);
    const double rel = sqrt(e2 / fmax(r2, 1e-300));
    CHECK_MSG(r2 > 0 && rel <= 1e-2, "fast batched vs one-sequence: rel %.4g > 1e-2", rel);
    fprintf(stderr, "    fast batched vs one-sequence: rel %.3g\n", rel);
    v41_pool_free(&p);
    dsattn_ctx_destroy(ctx);
}

/* ==== Bad batches ======================================================= */

/* All of a sequence's bytes a step could write (caches, state, slots). */
static void v41_snapshot_check(dsattn_v41_seq *const *s, dsattn_v41_seq *const *twin, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(v41_same(s[i], twin[i], 1), "sequence %zu changed by a failed batch", i);
}

DSATTN_TEST(batch, v41_bad_batches_change_nothing)
{
    uint64_t seed = 5;
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 2);
    dsattn_v41 *m = load_v41("golden/v41/tiny-seed0"), *m2 = load_v41("golden/v41/tiny-seed0");
    if (!ctx || !m || !m2) { dsattn_v41_destroy(m); dsattn_v41_destroy(m2); dsattn_ctx_destroy(ctx); return; }
    const size_t dim = (size_t)dsattn_v41_dim(m), L = (size_t)dsattn_v41_n_layers(m);
    dsattn_v41_seq *s[4], *twin[4], *other = NULL, *refmode = NULL;
    float h[16 * 256];
    /* s[1] full: capacity 3, three tokens consumed */
    const size_t cap[4] = { 32, 3, 32, 32 }, depth[4] = { 5, 3, 0, 2 };
    for (int k = 0; k < 4; k++) {
        /* twins by the same prefill (a clone drops the last chunk's
         * observations, which a failed batch must not touch either) */
        CHECK_OK(dsattn_v41_seq_create(&s[k], m, cap[k], DSATTN_V41_INDEX_K_OWNER));
        CHECK_OK(dsattn_v41_seq_create(&twin[k], m, cap[k], DSATTN_V41_INDEX_K_OWNER));
        if (depth[k]) {
            rand_rows(h, depth[k] * dim, &seed);
            memcpy(h + 8 * dim, h, depth[k] * dim * sizeof(float));
            CHECK_OK(dsattn_v41_stack_forward(ctx, s[k], h, depth[k], NULL, NULL));
            CHECK_OK(dsattn_v41_stack_forward(ctx, twin[k], h + 8 * dim, depth[k], NULL, NULL));
        }
    }
    CHECK_OK(dsattn_v41_seq_create(&other, m2, 32, DSATTN_V41_INDEX_K_OWNER));
    CHECK_OK(dsattn_v41_seq_create(&refmode, m, 32, DSATTN_V41_INDEX_K_REFERENCE));
    float x[4 * 256], out[4 * 256], out0[4 * 256];
    rand_rows(x, 4 * dim, &seed);
    for (size_t i = 0; i < 4 * dim; i++) out[i] = out0[i] = (float)i;
    size_t failed = 0;

    /* out of capacity at index 1 */
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, s, 4, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 1);
    memcpy(h, x, sizeof x);
    CHECK_EQ_INT(dsattn_v41_stack_forward_batch(ctx, s, 4, h, NULL, NULL, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 1);
    CHECK(!memcmp(h, x, 4 * dim * sizeof(float)));
    /* a repeated sequence: the second occurrence */
    dsattn_v41_seq *rep[3] = { s[0], s[2], s[0] };
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, rep, 3, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 2);
    /* another model, another index_k mode, a NULL */
    dsattn_v41_seq *mix[3] = { s[0], s[2], other };
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, mix, 3, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 2);
    mix[2] = refmode;
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, mix, 3, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 2);
    mix[1] = NULL;
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, mix, 3, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 1);
    /* not one sequence's: layer out of range, n 0, NULL x */
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, s, 1, (int)L, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK(failed == SIZE_MAX);
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, s, 0, 0, x, out, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK(failed == SIZE_MAX);
    CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, s, 1, 0, NULL, out, NULL), DSATTN_ERR_INVALID_ARG);
    /* a layer out of protocol: s[2] (position 0) at a Reuse layer before
     * any index source ran this step (the first bad one) */
    for (int l = 0; l < (int)L; l++) {
        if (dsattn_v41_layer_mode(m, l) != DSATTN_V41_REUSE) continue;
        dsattn_v41_seq *pr[2] = { s[2], s[0] };
        CHECK_EQ_INT(dsattn_v41_attn_forward_batch(ctx, pr, 2, l, x, out, &failed), DSATTN_ERR_INVALID_ARG);
        CHECK_EQ_INT(failed, 0);
        break;
    }
    CHECK(!memcmp(out, out0, sizeof out));
    v41_snapshot_check(s, twin, 4);

    /* the batch without the full sequence runs */
    dsattn_v41_seq *ok3[3] = { s[0], s[2], s[3] };
    memcpy(h, x, 3 * dim * sizeof(float));
    CHECK_OK(dsattn_v41_stack_forward_batch(ctx, ok3, 3, h, NULL, NULL, &failed));
    for (int k = 0; k < 4; k++) {
        dsattn_v41_seq_destroy(s[k]);
        dsattn_v41_seq_destroy(twin[k]);
    }
    dsattn_v41_seq_destroy(other);
    dsattn_v41_seq_destroy(refmode);
    dsattn_v41_destroy(m);
    dsattn_v41_destroy(m2);
    dsattn_ctx_destroy(ctx);
}

/* ==== V4 ================================================================ */

static int v4_same(const dsattn_v4_seq *a, const dsattn_v4_seq *b)
{
    int ok = dsattn_v4_seq_pos(a) == dsattn_v4_seq_pos(b);
    const dsattn_v4 *m = a->m;
    for (int l = 0; l < dsattn_v4_n_layers(m); l++) {
        for (int which = 0; which < 2; which++) {
            const uint8_t *ra, *rb;
            size_t na, nb, ba, bb;
            dsattn_status sa = dsattn_v4_seq_cache(a, l, which, &ra, &na, &ba);
            dsattn_status sb = dsattn_v4_seq_cache(b, l, which, &rb, &nb, &bb);
            ok &= sa == sb;
            if (sa || sb) continue;
            ok &= na == nb && ba == bb && (na == 0 || !memcmp(ra, rb, na * ba));
        }
        const dsattn_v4_layer_w *L = &m->layer[l];
        const dsattn_v4_compressor_w *C[2] = { &L->comp, &L->icomp };
        const dsattn_v4_comp_s *Sa[2] = { &a->layer[l].comp, &a->layer[l].icomp };
        const dsattn_v4_comp_s *Sb[2] = { &b->layer[l].comp, &b->layer[l].icomp };
        for (int k = 0; k < 2; k++) {
            if (!Sa[k]->kv) continue;
            const size_t co = C[k]->overlap ? 2 : 1;
            const size_t n = co * C[k]->ratio * co * C[k]->d * sizeof(float);
            ok &= !memcmp(Sa[k]->kv, Sb[k]->kv, n) && !memcmp(Sa[k]->z, Sb[k]->z, n);
        }
        const int32_t *ra, *rb;
        size_t na, nb, wa, wb;
        if (dsattn_v4_seq_selection(a, l, &ra, &na, &wa) == DSATTN_OK) {
            CHECK_OK(dsattn_v4_seq_selection(b, l, &rb, &nb, &wb));
            ok &= na == nb && wa == wb && (na * wa == 0 || !memcmp(ra, rb, na * wa * 4));
        }
    }
    return ok;
}

/* Twins at depths 0..31 as for V4.1; odd members run the ZERO rule. */
static void v4_exact_run(dsattn_mode mode, uint64_t seed)
{
    static const size_t depth[POOL] = { 0, 1, 3, 4, 7, 16, 17, 30, 31 };
    char cfg[1200], wp[1200], err[512] = "";
    snprintf(cfg, sizeof cfg, "%s/config.json", dsattn_test_data("golden/v4/tiny-seed0"));
    snprintf(wp, sizeof wp, "%s/weights.safetensors", dsattn_test_data("golden/v4/tiny-seed0"));
    dsattn_v4 *m = NULL;
    dsattn_status st = dsattn_v4_load(&m, cfg, wp, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load: %s", err);
    dsattn_ctx *ctx = dsattn_test_ctx(mode, 2);
    if (!m || !ctx) { dsattn_v4_destroy(m); dsattn_ctx_destroy(ctx); return; }
    const size_t dim = (size_t)dsattn_v4_dim(m), L = (size_t)dsattn_v4_n_layers(m);
    dsattn_v4_seq *a[POOL], *b[POOL];
    float *h = malloc(64 * dim * sizeof(float));
    for (int k = 0; k < POOL; k++) {
        const dsattn_v4_empty e = k & 1 ? DSATTN_V4_EMPTY_ZERO : DSATTN_V4_EMPTY_REFERENCE;
        CHECK_OK(dsattn_v4_seq_create(&a[k], m, 64, e));
        CHECK_OK(dsattn_v4_seq_create(&b[k], m, 64, e));
        if (depth[k]) {
            rand_rows(h, depth[k] * dim, &seed);
            memcpy(h + 32 * dim, h, depth[k] * dim * sizeof(float));
            CHECK_OK(dsattn_v4_stack_forward(ctx, a[k], h, depth[k], NULL, NULL));
            CHECK_OK(dsattn_v4_stack_forward(ctx, b[k], h + 32 * dim, depth[k], NULL, NULL));
        }
    }
    float *x = malloc(L * POOL * dim * sizeof(float)), *ob = malloc(L * POOL * dim * sizeof(float));
    float *os = malloc(L * POOL * dim * sizeof(float)), *h1 = malloc(POOL * dim * sizeof(float));
    double e2 = 0, r2 = 0;
    for (int step = 0; step < 12 && !dsattn_test_failed(); step++) {
        int ids[POOL];
        const size_t B = pick_subset(ids, &seed);
        dsattn_v4_seq *seqs[POOL];
        for (size_t i = 0; i < B; i++) seqs[i] = a[ids[i]];
        size_t failed = 7;
        if (step & 1) {
            rand_rows(x, L * B * dim, &seed);
            for (size_t l = 0; l < L; l++)
                CHECK_OK(dsattn_v4_attn_forward_batch(ctx, seqs, B, (int)l, x + l * B * dim,
                                                      ob + l * B * dim, &failed));
            for (size_t i = 0; i < B; i++) {
                CHECK_OK(dsattn_v4_seq_advance(seqs[i], 1));
                for (size_t l = 0; l < L; l++)
                    CHECK_OK(dsattn_v4_attn_forward(ctx, b[ids[i]], (int)l,
                                                    x + (l * B + i) * dim, 1,
                                                    os + (l * B + i) * dim));
                CHECK_OK(dsattn_v4_seq_advance(b[ids[i]], 1));
            }
        } else {
            rand_rows(x, B * dim, &seed);
            memcpy(h1, x, B * dim * sizeof(float));
            CHECK_OK(dsattn_v4_stack_forward_batch(ctx, seqs, B, x, NULL, ob, &failed));
            for (size_t i = 0; i < B; i++) {
                float *ao = malloc(L * dim * sizeof(float));
                CHECK_OK(dsattn_v4_stack_forward(ctx, b[ids[i]], h1 + i * dim, 1, NULL, ao));
                for (size_t l = 0; l < L; l++)
                    memcpy(os + (l * B + i) * dim, ao + l * dim, dim * sizeof(float));
                free(ao);
            }
            if (mode == DSATTN_MODE_REFERENCE) CHECK_BITS("V4 batched residual", x, h1, B * dim);
        }
        CHECK_EQ_INT(failed, 7);
        if (mode == DSATTN_MODE_REFERENCE) {
            CHECK_BITS("V4 batched attn_out", ob, os, L * B * dim);
            for (size_t i = 0; i < B; i++)
                CHECK_MSG(v4_same(a[ids[i]], b[ids[i]]),
                          "V4 sequence %d (batch slot %zu of %zu) differs from its twin", ids[i],
                          i, B);
        } else {
            for (size_t j = 0; j < L * B * dim; j++) {
                const double e = (double)ob[j] - os[j];
                if (isfinite(e)) { e2 += e * e; r2 += (double)os[j] * os[j]; }
            }
        }
    }
    if (mode == DSATTN_MODE_FAST) {
        const double rel = sqrt(e2 / fmax(r2, 1e-300));
        CHECK_MSG(r2 > 0 && rel <= 1e-2, "V4 fast batched vs one-sequence: rel %.4g > 1e-2", rel);
        fprintf(stderr, "    V4 fast batched vs one-sequence: rel %.3g\n", rel);
    }
    /* a bad batch changes nothing: a repeated sequence, then one full */
    dsattn_v4_seq *rep[3] = { a[0], a[1], a[0] };
    size_t failed = 0;
    CHECK_EQ_INT(dsattn_v4_attn_forward_batch(ctx, rep, 3, 0, x, ob, &failed), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 2);
    dsattn_v4_seq *full = NULL, *twin = NULL;
    CHECK_OK(dsattn_v4_seq_create(&full, m, 2, DSATTN_V4_EMPTY_REFERENCE));
    CHECK_OK(dsattn_v4_seq_create(&twin, m, 2, DSATTN_V4_EMPTY_REFERENCE));
    rand_rows(h, 2 * dim, &seed);
    memcpy(h + 32 * dim, h, 2 * dim * sizeof(float));
    CHECK_OK(dsattn_v4_stack_forward(ctx, full, h, 2, NULL, NULL));
    CHECK_OK(dsattn_v4_stack_forward(ctx, twin, h + 32 * dim, 2, NULL, NULL));
    dsattn_v4_seq *bad[3] = { a[2], full, a[3] };
    memcpy(h, x, 3 * dim * sizeof(float));
    CHECK_EQ_INT(dsattn_v4_stack_forward_batch(ctx, bad, 3, h, NULL, NULL, &failed),
                 DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(failed, 1);
    CHECK(!memcmp(h, x, 3 * dim * sizeof(float)));
    CHECK(v4_same(full, twin));
    if (mode == DSATTN_MODE_REFERENCE)   /* fast-mode twins differ in the last bits */
        CHECK(v4_same(a[2], b[2]) && v4_same(a[3], b[3]));
    dsattn_v4_seq_destroy(full);
    dsattn_v4_seq_destroy(twin);
    for (int k = 0; k < POOL; k++) {
        dsattn_v4_seq_destroy(a[k]);
        dsattn_v4_seq_destroy(b[k]);
    }
    free(h); free(x); free(ob); free(os); free(h1);
    dsattn_ctx_destroy(ctx);
    dsattn_v4_destroy(m);
}

DSATTN_TEST(batch, v4_bit_exact_and_bad_batches) { v4_exact_run(DSATTN_MODE_REFERENCE, 31); }
DSATTN_TEST(batch, v4_fast_within_bounds)        { v4_exact_run(DSATTN_MODE_FAST, 32); }
