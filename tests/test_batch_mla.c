/* test_batch_mla.c - the batched MLA decode (dsattn_mla_attn_forward_batch,
 * dsattn_mla_stack_forward_batch) against one-sequence forwards.
 *
 * Every case keeps two pools of sequences fed the same tokens: pool A
 * decodes through the batched API, pool B one sequence at a time.  Random
 * batches of 1-9 sequences at mixed depths (depth 0 included) and mixed
 * cache formats (latent bf16 and NAIVE), in a different subset and order
 * every step (so sequences leave and rejoin), through the layer API with
 * its own input per layer and through the stand-in stack.  Reference mode:
 * every output bit, every cache byte (latent / expanded K and V, V3.2
 * index keys) and every V3.2 selection equal.  Fast mode: outputs within
 * the golden cases' fast-mode gates (rel <= 1e-2, cosine >= 0.9999).
 * Models: the V3 and V3.2 golden configs with their bf16 weights, and
 * random FP8 weights at those dims with the ranks at 128 (the FP8
 * absorption kernels and the FP8 latent cache).
 * Errors: a sequence out of capacity, twice in a batch or of another
 * model is reported with its index and nothing is written anywhere.
 */
#include "harness.h"

#include "internal.h"
#include "mla.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NPOOL = 9, CAP = 40, STEPS = 6 };

static void case_paths(const char *gen, char cfg[512], char w[512])
{
    char rel[64];
    snprintf(rel, sizeof rel, "golden/%s/tiny-seed0", gen);
    const char *d = dsattn_test_data(rel);
    if (strlen(d) > 400) d = "/nonexistent";
    snprintf(cfg, 512, "%.400s/config.json", d);
    snprintf(w, 512, "%.400s/weights.safetensors", d);
}

/* fp8: random FP8 weights at the golden dims with the ranks at 128 (the
 * act_quant blocks; kv_lora_rank 128 also allows the FP8 latent cache) and
 * nope + v = 128 (one FP8 block per head of wkv_b: the grouped W_uv form
 * of fast batches of 8 and more). */
static dsattn_mla *load_model(const char *gen, int fp8)
{
    char cfg[512], w[512], err[256] = "";
    dsattn_mla *m = NULL;
    case_paths(gen, cfg, w);
    dsattn_status st;
    if (fp8) {
        char path[DSATTN_TEST_PATH];
        dsattn_test_tmp(path, sizeof path, "dsattn_test_batch_mla_%s.json", gen);
        FILE *f = fopen(path, "w");
        if (!f) { CHECK_MSG(0, "cannot write %s", path); return NULL; }
        fprintf(f, "{\"model_type\": \"deepseek_%s\", \"dim\": 256, \"n_layers\": 2, "
                   "\"n_heads\": 4, \"q_lora_rank\": 128, \"kv_lora_rank\": 128, "
                   "\"qk_nope_head_dim\": 96, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, "
                   "\"max_seq_len\": 64, \"index_n_heads\": 4, \"index_head_dim\": 128, "
                   "\"index_topk\": 6, \"scale_fmt\": \"ue8m0\"}\n",
                strcmp(gen, "v32") ? "v3" : "v32");
        fclose(f);
        st = dsattn_mla_create_random(&m, path, 11, 1, err, sizeof err);
        remove(path);
    } else {
        st = dsattn_mla_load(&m, cfg, w, err, sizeof err);
    }
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", gen, err);
    return st ? NULL : m;
}

/* n bf16 values ~ N(0, 0.5) */
static void rand_bf16(dsattn_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = 0.5f * dsattn_rng_normal(r);
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xffff0000u;
        memcpy(&v, &u, 4);
        x[i] = v;
    }
}

/* Everything a decode step writes into a sequence: the position, every
 * layer's cache rows below it, index keys, and the last selection. */
static int seq_same(const dsattn_mla_seq *a, const dsattn_mla_seq *b)
{
    if (a->pos != b->pos) return 0;
    const size_t n = (size_t)a->pos;
    for (int64_t l = 0; l < a->m->cfg.n_layers; l++) {
        const dsattn_mla_layer_s *x = &a->layer[l], *y = &b->layer[l];
        if (memcmp(x->cache, y->cache, n * a->row_bytes)) return 0;
        if (a->v_bytes && memcmp(x->v, y->v, n * a->v_bytes)) return 0;
        if (a->idx_bytes && memcmp(x->kidx, y->kidx, n * a->idx_bytes)) return 0;
        if (x->sel_rows != y->sel_rows || x->sel_w != y->sel_w) return 0;
        if (x->sel_rows && memcmp(x->sel, y->sel, x->sel_rows * x->sel_w * sizeof(int32_t)))
            return 0;
    }
    return 1;
}

/* outputs: bits (reference) or the fast gates */
static void compare_out(dsattn_mode mode, const char *what, const float *got, const float *want,
                        size_t n, double *worst)
{
    if (mode == DSATTN_MODE_REFERENCE) {
        CHECK_MSG(memcmp(got, want, n * sizeof(float)) == 0, "%s: batched != one-by-one", what);
        return;
    }
    const double rel = dsattn_rel_l2(got, want, n), cos = dsattn_cosine(got, want, n);
    if (rel > *worst) *worst = rel;
    CHECK_MSG(rel <= 1e-2 && cos >= 0.9999, "%s: rel %.3g cosine %.6f", what, rel, cos);
}

static void run_case(const char *gen, int fp8, dsattn_mode mode)
{
    dsattn_mla *m = load_model(gen, fp8);
    dsattn_ctx *ctx = dsattn_test_ctx(mode, 2);
    if (!m || !ctx) {
        dsattn_mla_destroy(m);
        dsattn_ctx_destroy(ctx);
        return;
    }
    const size_t D = (size_t)dsattn_mla_dim(m), L = (size_t)dsattn_mla_n_layers(m);
    dsattn_rng r = { 0x5eed0000u + (uint64_t)fp8 * 7 + (uint64_t)mode * 13 +
                     (uint64_t)dsattn_mla_is_dsa(m) * 101 };
    dsattn_mla_seq *A[NPOOL], *B[NPOOL];
    float *x = malloc(L * (CAP + NPOOL) * D * sizeof(float));
    float *oa = malloc(L * NPOOL * D * sizeof(float)), *ob = malloc(L * NPOOL * D * sizeof(float));
    float *ha = malloc(NPOOL * D * sizeof(float)), *hb = malloc(NPOOL * D * sizeof(float));
    float *ia = malloc(L * NPOOL * D * sizeof(float)), *ib = malloc(L * D * sizeof(float));
    float *ua = malloc(L * NPOOL * D * sizeof(float)), *ub = malloc(L * D * sizeof(float));
    double worst = 0.0;
    char what[160];
    /* the pool: depths 0..13 (sequence 0 at depth 0), every third NAIVE,
     * with kv_lora_rank % 128 == 0 every third the FP8 latent cache */
    for (int i = 0; i < NPOOL; i++) {
        dsattn_mla_cache f = i % 3 == 2 ? DSATTN_MLA_CACHE_NAIVE : DSATTN_MLA_CACHE_LATENT_BF16;
        if (i % 3 == 1 && m->cfg.kv_lora_rank % 128 == 0) f = DSATTN_MLA_CACHE_LATENT_FP8;
        CHECK_OK(dsattn_mla_seq_create(&A[i], m, CAP, f));
        CHECK_OK(dsattn_mla_seq_create(&B[i], m, CAP, f));
        const size_t d = i == 0 ? 0 : (size_t)(dsattn_rng_u64(&r) % 14);
        if (d == 0) continue;
        rand_bf16(&r, x, L * d * D);
        for (size_t l = 0; l < L; l++) {
            CHECK_OK(dsattn_mla_attn_forward(ctx, A[i], (int)l, x + l * d * D, d, oa));
            CHECK_OK(dsattn_mla_attn_forward(ctx, B[i], (int)l, x + l * d * D, d, ob));
        }
        CHECK_OK(dsattn_mla_seq_advance(A[i], d));
        CHECK_OK(dsattn_mla_seq_advance(B[i], d));
    }
    for (int step = 0; step < STEPS && !dsattn_test_failed(); step++) {
        /* a random subset in a random order; the first step takes all */
        int perm[NPOOL];
        for (int i = 0; i < NPOOL; i++) perm[i] = i;
        for (int i = NPOOL - 1; i > 0; i--) {
            const int j = (int)(dsattn_rng_u64(&r) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        const size_t k = step == 0 ? NPOOL : 1 + (size_t)(dsattn_rng_u64(&r) % NPOOL);
        dsattn_mla_seq *sa[NPOOL];
        for (size_t i = 0; i < k; i++) sa[i] = A[perm[i]];
        size_t failed = 99;
        if (step % 2 == 0) {
            /* the layer API: each layer its own input rows */
            rand_bf16(&r, x, L * k * D);
            for (size_t l = 0; l < L; l++)
                CHECK_OK(dsattn_mla_attn_forward_batch(ctx, sa, k, (int)l, x + l * k * D,
                                                       oa + l * k * D, &failed));
            for (size_t i = 0; i < k; i++) {
                for (size_t l = 0; l < L; l++)
                    CHECK_OK(dsattn_mla_attn_forward(ctx, B[perm[i]], (int)l,
                                                     x + (l * k + i) * D, 1, ob + (l * k + i) * D));
                CHECK_OK(dsattn_mla_seq_advance(B[perm[i]], 1));
                CHECK_OK(dsattn_mla_seq_advance(sa[i], 1));
            }
            snprintf(what, sizeof what, "%s%s %s step %d (layers, B=%zu)", gen, fp8 ? " fp8" : "",
                     mode == DSATTN_MODE_REFERENCE ? "reference" : "fast", step, k);
            compare_out(mode, what, oa, ob, L * k * D, &worst);
        } else {
            /* the stand-in stack, which advances */
            for (size_t i = 0; i < k * D; i++) ha[i] = hb[i] = 0.7f * dsattn_rng_normal(&r);
            CHECK_OK(dsattn_mla_stack_forward_batch(ctx, sa, k, ha, ia, ua, &failed));
            for (size_t i = 0; i < k; i++) {
                CHECK_OK(dsattn_mla_stack_forward(ctx, B[perm[i]], hb + i * D, 1, ib, ub));
                for (size_t l = 0; l < L; l++) {
                    memcpy(oa + (l * k + i) * D, ua + (l * k + i) * D, D * sizeof(float));
                    memcpy(ob + (l * k + i) * D, ub + l * D, D * sizeof(float));
                    if (mode == DSATTN_MODE_REFERENCE)
                        CHECK_MSG(!memcmp(ia + (l * k + i) * D, ib + l * D, D * sizeof(float)),
                                  "stack attn_in of layer %zu row %zu", l, i);
                }
            }
            snprintf(what, sizeof what, "%s%s %s step %d (stack, B=%zu)", gen, fp8 ? " fp8" : "",
                     mode == DSATTN_MODE_REFERENCE ? "reference" : "fast", step, k);
            compare_out(mode, what, oa, ob, L * k * D, &worst);
            compare_out(mode, what, ha, hb, k * D, &worst);
        }
        CHECK_MSG(failed == 99, "%s: *failed written on success (%zu)", what, failed);
        if (mode == DSATTN_MODE_REFERENCE)
            for (int i = 0; i < NPOOL; i++)
                CHECK_MSG(seq_same(A[i], B[i]), "%s: sequence %d's caches differ", what, i);
        else
            for (int i = 0; i < NPOOL; i++)
                CHECK_MSG(A[i]->pos == B[i]->pos, "%s: sequence %d's position", what, i);
    }
    if (mode == DSATTN_MODE_FAST)
        printf("    %s%s fast: worst rel %.3g (batched vs one by one)\n", gen, fp8 ? " fp8" : "",
               worst);
    for (int i = 0; i < NPOOL; i++) {
        dsattn_mla_seq_destroy(A[i]);
        dsattn_mla_seq_destroy(B[i]);
    }
    free(x); free(oa); free(ob); free(ha); free(hb); free(ia); free(ib); free(ua); free(ub);
    dsattn_ctx_destroy(ctx);
    dsattn_mla_destroy(m);
}

DSATTN_TEST(batch_mla, v3_reference_bit_exact) { run_case("v3", 0, DSATTN_MODE_REFERENCE); }
DSATTN_TEST(batch_mla, v32_reference_bit_exact) { run_case("v32", 0, DSATTN_MODE_REFERENCE); }
DSATTN_TEST(batch_mla, v3_fp8_reference_bit_exact) { run_case("v3", 1, DSATTN_MODE_REFERENCE); }
DSATTN_TEST(batch_mla, v32_fp8_reference_bit_exact) { run_case("v32", 1, DSATTN_MODE_REFERENCE); }
DSATTN_TEST(batch_mla, v3_fast_within_bounds) { run_case("v3", 0, DSATTN_MODE_FAST); }
DSATTN_TEST(batch_mla, v32_fast_within_bounds) { run_case("v32", 0, DSATTN_MODE_FAST); }
DSATTN_TEST(batch_mla, v3_fp8_fast_within_bounds) { run_case("v3", 1, DSATTN_MODE_FAST); }
DSATTN_TEST(batch_mla, v32_fp8_fast_within_bounds) { run_case("v32", 1, DSATTN_MODE_FAST); }

/* ---- errors: checked before anything is written */

/* every cache byte of a sequence, for "nothing written" */
static uint8_t *snap(const dsattn_mla_seq *s, size_t *n)
{
    const size_t L = (size_t)s->m->cfg.n_layers, per = s->max_seq_len * (s->row_bytes + s->v_bytes + s->idx_bytes);
    uint8_t *p = malloc(L * per + 1), *q = p;
    for (size_t l = 0; l < L; l++) {
        const dsattn_mla_layer_s *S = &s->layer[l];
        memcpy(q, S->cache, s->max_seq_len * s->row_bytes);
        q += s->max_seq_len * s->row_bytes;
        if (s->v_bytes) memcpy(q, S->v, s->max_seq_len * s->v_bytes);
        q += s->max_seq_len * s->v_bytes;
        if (s->idx_bytes) memcpy(q, S->kidx, s->max_seq_len * s->idx_bytes);
        q += s->max_seq_len * s->idx_bytes;
    }
    *n = L * per;
    return p;
}

static void errors_case(const char *gen)
{
    dsattn_mla *m = load_model(gen, 0), *m2 = load_model(gen, 0);
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 2);
    if (!m || !m2 || !ctx) goto out;
    const size_t D = (size_t)dsattn_mla_dim(m), L = (size_t)dsattn_mla_n_layers(m);
    dsattn_rng r = { 77 };
    dsattn_mla_seq *s[4] = { NULL, NULL, NULL, NULL }, *other = NULL;
    float *x = malloc(4 * D * 4 * sizeof(float)), *o = malloc(4 * D * sizeof(float));
    float *h = malloc(4 * D * sizeof(float));
    CHECK_OK(dsattn_mla_seq_create(&s[0], m, 8, DSATTN_MLA_CACHE_LATENT_BF16));
    CHECK_OK(dsattn_mla_seq_create(&s[1], m, 3, DSATTN_MLA_CACHE_LATENT_BF16));   /* filled */
    CHECK_OK(dsattn_mla_seq_create(&s[2], m, 8, DSATTN_MLA_CACHE_NAIVE));
    CHECK_OK(dsattn_mla_seq_create(&other, m2, 8, DSATTN_MLA_CACHE_LATENT_BF16));
    rand_bf16(&r, x, 3 * D);
    for (size_t l = 0; l < L; l++) CHECK_OK(dsattn_mla_attn_forward(ctx, s[1], (int)l, x, 3, o));
    CHECK_OK(dsattn_mla_seq_advance(s[1], 3));
    size_t n0, n2;
    uint8_t *b0 = snap(s[0], &n0), *b2 = snap(s[2], &n2);
    for (size_t i = 0; i < 3 * D; i++) o[i] = 12345.0f;
    memcpy(h, o, 3 * D * sizeof(float));
    size_t failed = 99;
    /* out of capacity in the middle */
    CHECK(dsattn_mla_attn_forward_batch(ctx, s, 3, 0, x, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT((int)failed, 1);
    failed = 99;
    CHECK(dsattn_mla_stack_forward_batch(ctx, s, 3, h, NULL, NULL, &failed) ==
          DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT((int)failed, 1);
    /* twice in a batch: the second occurrence */
    dsattn_mla_seq *dup[3] = { s[0], s[2], s[0] };
    CHECK(dsattn_mla_attn_forward_batch(ctx, dup, 3, 0, x, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT((int)failed, 2);
    /* another model's sequence */
    dsattn_mla_seq *mix[3] = { s[0], s[2], other };
    CHECK(dsattn_mla_attn_forward_batch(ctx, mix, 3, 0, x, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT((int)failed, 2);
    /* a NULL entry (its index); NULL arguments, a bad layer: SIZE_MAX */
    dsattn_mla_seq *nul[3] = { s[0], NULL, s[2] };
    CHECK(dsattn_mla_attn_forward_batch(ctx, nul, 3, 0, x, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT((int)failed, 1);
    CHECK(dsattn_mla_attn_forward_batch(ctx, mix, 2, (int)L, x, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK(failed == SIZE_MAX);
    failed = 0;
    CHECK(dsattn_mla_attn_forward_batch(ctx, mix, 2, 0, NULL, o, &failed) == DSATTN_ERR_INVALID_ARG);
    CHECK(failed == SIZE_MAX);
    CHECK(dsattn_mla_attn_forward_batch(ctx, mix, 0, 0, x, o, NULL) == DSATTN_ERR_INVALID_ARG);
    CHECK(dsattn_mla_attn_forward_batch(NULL, mix, 2, 0, x, o, NULL) == DSATTN_ERR_INVALID_ARG);
    /* nothing written: outputs, residuals, caches, positions */
    for (size_t i = 0; i < 3 * D; i++)
        if (o[i] != 12345.0f || h[i] != 12345.0f) {
            CHECK_MSG(0, "output written by a failed batch (element %zu)", i);
            break;
        }
    size_t n0b, n2b;
    uint8_t *a0 = snap(s[0], &n0b), *a2 = snap(s[2], &n2b);
    CHECK_MSG(n0 == n0b && !memcmp(a0, b0, n0), "sequence 0's cache written by a failed batch");
    CHECK_MSG(n2 == n2b && !memcmp(a2, b2, n2), "sequence 2's cache written by a failed batch");
    CHECK(dsattn_mla_seq_pos(s[0]) == 0 && dsattn_mla_seq_pos(s[1]) == 3 &&
          dsattn_mla_seq_pos(s[2]) == 0);
    /* without the full one the same batch runs */
    dsattn_mla_seq *ok[2] = { s[0], s[2] };
    CHECK_OK(dsattn_mla_stack_forward_batch(ctx, ok, 2, h, NULL, NULL, &failed));
    CHECK(dsattn_mla_seq_pos(s[0]) == 1 && dsattn_mla_seq_pos(s[2]) == 1);
    free(a0); free(a2); free(b0); free(b2); free(x); free(o); free(h);
    for (int i = 0; i < 4; i++) dsattn_mla_seq_destroy(s[i]);
    dsattn_mla_seq_destroy(other);
out:
    dsattn_ctx_destroy(ctx);
    dsattn_mla_destroy(m);
    dsattn_mla_destroy(m2);
}

DSATTN_TEST(batch_mla, v3_errors_write_nothing) { errors_case("v3"); }
DSATTN_TEST(batch_mla, v32_errors_write_nothing) { errors_case("v32"); }
