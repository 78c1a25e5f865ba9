/* test_args.c - every public entry point that takes a position, a count, a
 * layer or a pointer refuses a bad one with DSATTN_ERR_INVALID_ARG and no
 * side effect (the position does not move, the caches are not written);
 * accessors that return a number give -1 for a NULL object or a layer out
 * of range.  One test per function family: context, MHA/GQA, MLA (V3 and
 * V3.2), V4, V4.1.
 */
#include "harness.h"

#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BAD DSATTN_ERR_INVALID_ARG

enum { CAP = 12 };

static void case_paths(const char *dir, char cfg[512], char w[512])
{
    const char *d = dsattn_test_data(dir);
    if (strlen(d) > 400) d = "/nonexistent";
    snprintf(cfg, 512, "%.400s/config.json", d);
    snprintf(w, 512, "%.400s/weights.safetensors", d);
}

static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

DSATTN_TEST(args, ctx_family)
{
    CHECK_EQ_INT(dsattn_ctx_create(NULL, NULL), BAD);
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = (dsattn_mode)7;
    dsattn_ctx *c = (dsattn_ctx *)&p;
    CHECK_EQ_INT(dsattn_ctx_create(&c, &p), BAD);
    CHECK(c == NULL);
    p.mode = DSATTN_MODE_FAST;
    p.n_threads = DSATTN_MAX_THREADS + 1;        /* OpenMP would exit, not fail */
    CHECK_EQ_INT(dsattn_ctx_create(&c, &p), BAD);
    CHECK(c == NULL);
    CHECK_EQ_INT(dsattn_ctx_threads(NULL), 0);
    CHECK_EQ_INT(dsattn_ctx_mode(NULL), DSATTN_MODE_FAST);
    CHECK_EQ_INT(dsattn_ctx_amx(NULL), 0);
    dsattn_ctx_destroy(NULL);
    dsattn_ctx_counters_reset(NULL);
    dsattn_ctx_set_profiling(NULL, 1);
    CHECK(dsattn_ctx_counters(NULL).flops == 0);
}

/* The advance checks shared by every generation: n 0, past capacity (also
 * by wrapping), then exactly to capacity. */
#define CHECK_ADVANCE(G, s, pos0)                                                      \
    do {                                                                              \
        CHECK_EQ_INT(dsattn_##G##_seq_advance(NULL, 1), BAD);                          \
        CHECK_EQ_INT(dsattn_##G##_seq_advance(s, 0), BAD);                             \
        CHECK_EQ_INT(dsattn_##G##_seq_advance(s, CAP - (size_t)(pos0) + 1), BAD);      \
        CHECK_EQ_INT(dsattn_##G##_seq_advance(s, SIZE_MAX), BAD);                      \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(s), pos0);                                   \
        CHECK_OK(dsattn_##G##_seq_advance(s, CAP - (size_t)(pos0)));                   \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(s), CAP);                                    \
        CHECK_EQ_INT(dsattn_##G##_seq_advance(s, 1), BAD);                             \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(s), CAP);                                    \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(NULL), -1);                                  \
    } while (0)

/* Forward: NULL ctx / seq / x / out, layer -1 and n_layers, n 0, n past
 * capacity; the position stays. */
#define CHECK_FORWARD(G, ctx, s, nl, x, out)                                           \
    do {                                                                              \
        const int64_t p0 = dsattn_##G##_seq_pos(s);                                    \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(NULL, s, 0, x, 1, out), BAD);           \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, NULL, 0, x, 1, out), BAD);         \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, 0, NULL, 1, out), BAD);         \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, 0, x, 1, NULL), BAD);           \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, -1, x, 1, out), BAD);           \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, nl, x, 1, out), BAD);           \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, 0, x, 0, out), BAD);            \
        CHECK_EQ_INT(dsattn_##G##_attn_forward(ctx, s, 0, x, CAP + 1, out), BAD);      \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(s), p0);                                     \
    } while (0)

#define CHECK_STACK(G, ctx, s, h)                                                      \
    do {                                                                              \
        const int64_t p0 = dsattn_##G##_seq_pos(s);                                    \
        CHECK_EQ_INT(dsattn_##G##_stack_forward(NULL, s, h, 1, NULL, NULL), BAD);      \
        CHECK_EQ_INT(dsattn_##G##_stack_forward(ctx, NULL, h, 1, NULL, NULL), BAD);    \
        CHECK_EQ_INT(dsattn_##G##_stack_forward(ctx, s, NULL, 1, NULL, NULL), BAD);    \
        CHECK_EQ_INT(dsattn_##G##_stack_forward(ctx, s, h, 0, NULL, NULL), BAD);       \
        CHECK_EQ_INT(dsattn_##G##_stack_forward(ctx, s, h, CAP + 1, NULL, NULL), BAD); \
        CHECK_EQ_INT(dsattn_##G##_seq_pos(s), p0);                                     \
    } while (0)

DSATTN_TEST(args, mha_family)
{
    char err[256] = "", path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_test_args_mha.json");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 2,"
          " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_theta\": 10000.0,"
          " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06}", f);
    fclose(f);
    dsattn_mha *m = NULL, *m2 = NULL;
    CHECK_EQ_INT(dsattn_mha_create_random_layers(&m2, path, 3, 0, 0, err, sizeof err), BAD);
    CHECK_EQ_INT(dsattn_mha_create_random_layers(&m2, path, 3, INT_MAX, 1, err, sizeof err), BAD);
    CHECK(m2 == NULL);
    CHECK_OK(dsattn_mha_create_random(&m, path, 3, err, sizeof err));
    remove(path);
    if (!m) return;
    CHECK_EQ_INT(dsattn_mha_n_layers(NULL), -1);
    CHECK_EQ_INT(dsattn_mha_dim(NULL), -1);
    CHECK_EQ_INT(dsattn_mha_n_heads(NULL), -1);
    CHECK_EQ_INT(dsattn_mha_n_kv_heads(NULL), -1);
    CHECK_EQ_INT(dsattn_mha_head_dim(NULL), -1);
    CHECK_EQ_INT(dsattn_mha_has_weights(m, 2), 0);
    CHECK_EQ_INT(dsattn_mha_has_weights(m, -1), 0);
    dsattn_mha_seq *s = NULL;
    CHECK_EQ_INT(dsattn_mha_seq_create(NULL, m, CAP), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_create(&s, NULL, CAP), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_create(&s, m, 0), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_create_layers(&s, m, CAP, 1, 2), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_create_layers(&s, m, CAP, -1, 1), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_create_layers(&s, m, CAP, 0, 0), BAD);
    CHECK_OK(dsattn_mha_seq_create(&s, m, CAP));
    if (!s) { dsattn_mha_destroy(m); return; }
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1);
    float *x = zeros((CAP + 1) * 256), *out = zeros((CAP + 1) * 256), kv[256];
    CHECK_FORWARD(mha, ctx, s, 2, x, out);
    CHECK_EQ_INT(dsattn_mha_seq_kv(NULL, 0, 0, kv, kv), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_kv(s, 2, 0, kv, kv), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_kv(s, -1, 0, kv, kv), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_kv(s, 0, CAP, kv, kv), BAD);

    CHECK_EQ_INT(dsattn_mha_seq_kv_bill(NULL, NULL), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_kv_bill(s, NULL), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_fill_synthetic(NULL, 1, 1), BAD);
    CHECK_EQ_INT(dsattn_mha_weight_bytes(NULL), 0);
    CHECK_EQ_INT(dsattn_mha_seq_fill_synthetic(s, -1, 1), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_fill_synthetic(s, CAP, 1), BAD);
    CHECK_EQ_INT(dsattn_mha_seq_pos(s), 0);
    CHECK_ADVANCE(mha, s, 0);
    dsattn_ctx_destroy(ctx);
    dsattn_mha_seq_destroy(s);
    dsattn_mha_destroy(m);
    free(x);
    free(out);
}

static void mla_family(const char *dir)
{
    char err[256] = "", cfg[512], w[512];
    case_paths(dir, cfg, w);
    dsattn_mla *m = NULL;
    CHECK_EQ_INT(dsattn_mla_load(NULL, cfg, w, err, sizeof err), BAD);
    CHECK_OK(dsattn_mla_load(&m, cfg, w, err, sizeof err));
    if (!m) return;
    const int nl = dsattn_mla_n_layers(m), dim = dsattn_mla_dim(m);
    CHECK_EQ_INT(dsattn_mla_n_layers(NULL), -1);
    CHECK_EQ_INT(dsattn_mla_dim(NULL), -1);
    CHECK_EQ_INT(dsattn_mla_has_weights(NULL), 0);
    CHECK_EQ_INT(dsattn_mla_is_dsa(NULL), -1);
    int kvr = 0, rpd = 0;
    CHECK_EQ_INT(dsattn_mla_latent_dims(NULL, &kvr, &rpd), BAD);
    CHECK_OK(dsattn_mla_latent_dims(m, &kvr, NULL));
    CHECK_OK(dsattn_mla_latent_dims(m, NULL, &rpd));
    CHECK(kvr > 0 && rpd > 0);
    CHECK_EQ_INT(dsattn_mla_create_random(NULL, cfg, 1, 0, err, sizeof err), BAD);
    dsattn_mla_seq *s = NULL;
    CHECK_EQ_INT(dsattn_mla_seq_create(NULL, m, CAP, DSATTN_MLA_CACHE_LATENT_BF16), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_create(&s, NULL, CAP, DSATTN_MLA_CACHE_LATENT_BF16), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_create(&s, m, 0, DSATTN_MLA_CACHE_LATENT_BF16), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_create(&s, m, CAP, (dsattn_mla_cache)9), BAD);
    CHECK_OK(dsattn_mla_seq_create(&s, m, CAP, DSATTN_MLA_CACHE_LATENT_BF16));
    if (!s) { dsattn_mla_destroy(m); return; }
    CHECK(dsattn_mla_seq_cache_format(NULL) == (dsattn_mla_cache)-1);
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1);
    float *x = zeros((CAP + 1) * (size_t)dim), *out = zeros((CAP + 1) * (size_t)dim);
    float kv[1024], pe[256], sc;
    uint8_t codes[1024];
    const int32_t *rows;
    size_t nr, wd;
    CHECK_FORWARD(mla, ctx, s, nl, x, out);
    CHECK_STACK(mla, ctx, s, x);
    /* one real token, so position-taking readers have something to refuse */
    CHECK_OK(dsattn_mla_stack_forward(ctx, s, x, 1, NULL, NULL));
    CHECK_EQ_INT(dsattn_mla_seq_latent(NULL, 0, 0, kv, pe), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_latent(s, nl, 0, kv, pe), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_latent(s, -1, 0, kv, pe), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_latent(s, 0, 1, kv, pe), BAD);     /* not written yet */
    CHECK_OK(dsattn_mla_seq_latent(s, 0, 0, kv, pe));
    CHECK_EQ_INT(dsattn_mla_seq_index_key(s, nl, 0, codes, &sc), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_index_key(s, 0, 1, codes, &sc), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_selection(NULL, 0, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_selection(s, nl, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_selection(s, 0, NULL, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_selection(s, 0, &rows, NULL, &wd), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_selection(s, 0, &rows, &nr, NULL), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_kv_bill(NULL, NULL), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_kv_bill(s, NULL), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_fill_synthetic(NULL, 1, 1), BAD);
    CHECK_EQ_INT(dsattn_mla_weight_bytes(NULL), 0);
    CHECK_EQ_INT(dsattn_mla_seq_fill_synthetic(s, -1, 1), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_fill_synthetic(s, CAP, 1), BAD);
    CHECK_EQ_INT(dsattn_mla_seq_pos(s), 1);
    /* past the capacity at a later position: that, not "no chunked prefill" */
    CHECK_EQ_INT(dsattn_mla_attn_forward(ctx, s, 0, x, CAP, out), BAD);
    CHECK_ADVANCE(mla, s, 1);
    dsattn_ctx_destroy(ctx);
    dsattn_mla_seq_destroy(s);
    dsattn_mla_destroy(m);
    free(x);
    free(out);
}

DSATTN_TEST(args, mla_v3_family) { mla_family("golden/v3/tiny-seed0"); }
DSATTN_TEST(args, mla_v32_family) { mla_family("golden/v32/tiny-seed0"); }

DSATTN_TEST(args, v4_family)
{
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v4/tiny-seed0", cfg, w);
    dsattn_v4 *m = NULL;
    CHECK_EQ_INT(dsattn_v4_load(NULL, cfg, w, err, sizeof err), BAD);
    CHECK_OK(dsattn_v4_load(&m, cfg, w, err, sizeof err));
    if (!m) return;
    const int nl = dsattn_v4_n_layers(m), dim = dsattn_v4_dim(m);
    CHECK_EQ_INT(dsattn_v4_layer_ratio(m, -1), -1);
    CHECK_EQ_INT(dsattn_v4_layer_ratio(NULL, 0), -1);
    CHECK_EQ_INT(dsattn_v4_n_layers(NULL), -1);
    CHECK_EQ_INT(dsattn_v4_dim(NULL), -1);
    CHECK_EQ_INT(dsattn_v4_layer_kind(NULL, 0), -1);
    CHECK_EQ_INT(dsattn_v4_layer_kind(m, -1), -1);
    CHECK_EQ_INT(dsattn_v4_create_random(NULL, cfg, 1, 0, err, sizeof err), BAD);
    int ih = -1;
    CHECK_EQ_INT(dsattn_v4_index_shape(NULL, &ih, NULL, NULL), BAD);
    CHECK_EQ_INT(ih, -1);
    dsattn_v4_seq *s = NULL;
    CHECK_EQ_INT(dsattn_v4_seq_create(NULL, m, CAP, DSATTN_V4_EMPTY_REFERENCE), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_create(&s, NULL, CAP, DSATTN_V4_EMPTY_REFERENCE), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_create(&s, m, 0, DSATTN_V4_EMPTY_REFERENCE), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_create(&s, m, CAP, (dsattn_v4_empty)5), BAD);
    CHECK_OK(dsattn_v4_seq_create(&s, m, CAP, DSATTN_V4_EMPTY_REFERENCE));
    if (!s) { dsattn_v4_destroy(m); return; }
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1);
    float *x = zeros((CAP + 1) * (size_t)dim), *out = zeros((CAP + 1) * (size_t)dim);
    const int32_t *rows;
    const uint8_t *cr;
    size_t nr, wd;
    CHECK_FORWARD(v4, ctx, s, nl, x, out);
    CHECK_STACK(v4, ctx, s, x);
    CHECK_EQ_INT(dsattn_v4_seq_selection(NULL, 2, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_selection(s, nl, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_selection(s, 2, NULL, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_cache(NULL, 0, 0, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_cache(s, -1, 0, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_cache(s, 0, 0, NULL, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_cache(s, 0, 0, &cr, &nr, NULL), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_kv_bill(s, NULL), BAD);
    CHECK_EQ_INT(dsattn_v4_seq_fill_synthetic(s, -1, 1), BAD);
    CHECK_EQ_INT(dsattn_v4_weight_bytes(NULL), 0);
    CHECK_EQ_INT(dsattn_v4_seq_fill_synthetic(s, CAP, 1), BAD);
    CHECK_OK(dsattn_v4_seq_fill_synthetic(s, 1, 1));
    CHECK_EQ_INT(dsattn_v4_attn_forward(ctx, s, 0, x, CAP, out), BAD);   /* past capacity */
    CHECK_ADVANCE(v4, s, 1);
    dsattn_ctx_destroy(ctx);
    dsattn_v4_seq_destroy(s);
    dsattn_v4_destroy(m);
    free(x);
    free(out);
}

DSATTN_TEST(args, v41_family)
{
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v41/tiny-seed0", cfg, w);
    dsattn_v41 *m = NULL;
    CHECK_EQ_INT(dsattn_v41_load(NULL, cfg, w, err, sizeof err), BAD);
    CHECK_OK(dsattn_v41_load(&m, cfg, w, err, sizeof err));
    if (!m) return;
    const int nl = dsattn_v41_n_layers(m), dim = dsattn_v41_dim(m);
    CHECK_EQ_INT(dsattn_v41_n_layers(NULL), -1);
    CHECK_EQ_INT(dsattn_v41_dim(NULL), -1);
    CHECK_EQ_INT(dsattn_v41_layer_ratio(m, nl), -1);
    CHECK_EQ_INT(dsattn_v41_layer_ratio(m, -1), -1);
    CHECK(dsattn_v41_layer_mode(m, nl) == (dsattn_v41_mode)-1);
    CHECK(dsattn_v41_layer_mode(NULL, 0) == (dsattn_v41_mode)-1);
    dsattn_v41_seq *s = NULL;
    CHECK_EQ_INT(dsattn_v41_seq_create(NULL, m, CAP, DSATTN_V41_INDEX_K_OWNER), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_create(&s, NULL, CAP, DSATTN_V41_INDEX_K_OWNER), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_create(&s, m, 0, DSATTN_V41_INDEX_K_OWNER), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_create(&s, m, CAP, (dsattn_v41_index_k)3), BAD);
    CHECK_OK(dsattn_v41_seq_create(&s, m, CAP, DSATTN_V41_INDEX_K_OWNER));
    if (!s) { dsattn_v41_destroy(m); return; }
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1);
    float *x = zeros((CAP + 1) * (size_t)dim), *out = zeros((CAP + 1) * (size_t)dim);
    const int32_t *rows;
    const uint8_t *cr;
    size_t nr, wd;
    CHECK_FORWARD(v41, ctx, s, nl, x, out);
    CHECK_STACK(v41, ctx, s, x);
    CHECK_EQ_INT(dsattn_v41_seq_selection(NULL, 2, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_selection(s, nl, &rows, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_selection(s, 2, &rows, NULL, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_source_read(s, nl), -1);
    CHECK_EQ_INT(dsattn_v41_seq_index_read(s, -1), -1);
    CHECK_EQ_INT(dsattn_v41_seq_topk_read(NULL, 0), -1);
    CHECK_EQ_INT(dsattn_v41_seq_cache(NULL, 2, 1, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_cache(s, nl, 1, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_cache(s, 2, 3, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_cache(s, 2, -1, &cr, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_cache(s, 2, 1, NULL, &nr, &wd), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_kv_bill(s, NULL), BAD);
    CHECK_EQ_INT(dsattn_v41_seq_fill_synthetic(s, -1, 1), BAD);
    CHECK_EQ_INT(dsattn_v41_weight_bytes(NULL), 0);
    CHECK_EQ_INT(dsattn_v41_seq_fill_synthetic(s, CAP, 1), BAD);
    CHECK_ADVANCE(v41, s, 0);
    /* after a refused over-advance the cache reports only rows that exist */
    CHECK_OK(dsattn_v41_seq_cache(s, 2, 1, &cr, &nr, &wd));
    CHECK(nr <= (size_t)CAP / (size_t)dsattn_v41_layer_ratio(m, 2));
    dsattn_ctx_destroy(ctx);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    free(x);
    free(out);
}

/* A one-layer batched call on a config-only model: a layer out of range is
 * the caller's bad argument (INVALID_ARG) before the missing weights
 * (UNSUPPORTED), as in the one-sequence calls. */
#define CHECK_LAYER_FIRST(G, s)                                                        \
    do {                                                                              \
        CHECK_EQ_INT(dsattn_##G##_attn_forward_batch(ctx, &s, 1, -1, x, out, &failed), BAD); \
        CHECK_EQ_INT(dsattn_##G##_attn_forward_batch(ctx, &s, 1, 0, x, out, &failed),  \
                     DSATTN_ERR_UNSUPPORTED);                                         \
    } while (0)

DSATTN_TEST(args, batched_layer_checked_before_weights)
{
    char err[256] = "", cfg[512], w[512];
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1);
    size_t failed = 0;
    float *x = zeros(4096), *out = zeros(4096);
    if (!ctx || !x || !out) goto done;
    case_paths("golden/v41/tiny-seed0", cfg, w);
    {
        dsattn_v41 *m = NULL;
        dsattn_v41_seq *s = NULL;
        CHECK_OK(dsattn_v41_load_config(&m, cfg, err, sizeof err));
        if (m && !dsattn_v41_seq_create(&s, m, CAP, DSATTN_V41_INDEX_K_OWNER)) {
            CHECK_LAYER_FIRST(v41, s);
        }
        dsattn_v41_seq_destroy(s);
        dsattn_v41_destroy(m);
    }
    case_paths("golden/v4/tiny-seed0", cfg, w);
    {
        dsattn_v4 *m = NULL;
        dsattn_v4_seq *s = NULL;
        CHECK_OK(dsattn_v4_load_config(&m, cfg, err, sizeof err));
        if (m && !dsattn_v4_seq_create(&s, m, CAP, DSATTN_V4_EMPTY_REFERENCE)) {
            CHECK_LAYER_FIRST(v4, s);
        }
        dsattn_v4_seq_destroy(s);
        dsattn_v4_destroy(m);
    }
    case_paths("golden/v3/tiny-seed0", cfg, w);
    {
        dsattn_mla *m = NULL;
        dsattn_mla_seq *s = NULL;
        CHECK_OK(dsattn_mla_create_config_only(&m, cfg, err, sizeof err));
        if (m && !dsattn_mla_seq_create(&s, m, CAP, DSATTN_MLA_CACHE_LATENT_BF16)) {
            CHECK_LAYER_FIRST(mla, s);
        }
        dsattn_mla_seq_destroy(s);
        dsattn_mla_destroy(m);
    }
    {
        char path[DSATTN_TEST_PATH];
        dsattn_test_tmp(path, sizeof path, "batched_llama.json");
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (f) {
            fputs("{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 2,"
                  " \"num_attention_heads\": 4, \"num_key_value_heads\": 2}", f);
            fclose(f);
        }
        dsattn_mha *m = NULL;
        dsattn_mha_seq *s = NULL;
        CHECK_OK(dsattn_mha_load_config(&m, path, err, sizeof err));
        if (m && !dsattn_mha_seq_create(&s, m, CAP)) {
            CHECK_LAYER_FIRST(mha, s);
        }
        dsattn_mha_seq_destroy(s);
        dsattn_mha_destroy(m);
    }
done:
    dsattn_ctx_destroy(ctx);
    free(x);
    free(out);
}
