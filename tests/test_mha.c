/* test_mha.c - MHA / GQA (DeepSeek-LLM 7B / 67B, HF Llama form).
 *
 * There are no golden outputs for these models (no official code beyond
 * transformers' LlamaAttention), so the tests pin the invariants and an
 * independent float64 restatement of LlamaAttention: prefill-then-decode
 * equals one prefill (bit for bit in reference mode), causality, GQA with
 * its KV rows repeated equals MHA, fast equals reference within a stated
 * bound, half-split RoPE, and the cache bytes the released configs
 * allocate (16,384 / 4,096 B per token per layer). */
#include "harness.h"
#include "ktab.h"

#include "kernels.h"
#include "mha.h"
#include "mha_kernels.h"
#include "numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *write_cfg(const char *tag, const char *json)
{
    static char path[4][DSATTN_TEST_PATH];
    static int k;
    char *p = path[k++ & 3];
    dsattn_test_tmp(p, sizeof path[0], "dsattn_test_mha_%s.json", tag);
    FILE *f = fopen(p, "w");
    if (!f) return NULL;
    fputs(json, f);
    fclose(f);
    return p;
}

/* A small Llama config: hidden 256, 4 query heads of 64, kv KV heads. */
static const char *tiny_cfg(const char *tag, int kv, int layers)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": %d,"
             " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096,"
             " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null}", layers, kv);
    return write_cfg(tag, j);
}

/* bf16-valued random inputs [n, dim] */
static float *rand_x(size_t n, size_t dim, uint64_t seed)
{
    dsattn_rng r = { seed };
    float *x = malloc(n * dim * sizeof(float));
    for (size_t i = 0; i < n * dim; i++) x[i] = dsattn_round_bf16(dsattn_rng_normal(&r));
    return x;
}

/* Run tokens [t0, t0+n) of every layer's input through a sequence. */
static void run_chunk(dsattn_ctx *c, dsattn_mha_seq *s, int layers, float *const *x,
                      size_t dim, size_t t0, size_t n, float *const *out)
{
    for (int l = 0; l < layers; l++)
        CHECK_OK(dsattn_mha_attn_forward(c, s, l, x[l] + t0 * dim, n, out[l] + t0 * dim));
    CHECK_OK(dsattn_mha_seq_advance(s, n));
}

/* ==== Released configs: dims and cache bytes from the allocation ======= */

static void real_bill(const char *cfg, int layers, int heads, int kv, int hidden,
                      double per_layer)
{
    char err[256] = "";
    dsattn_mha *m = NULL;
    dsattn_status st = dsattn_mha_load_config(&m, cfg, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "%s: %s", cfg, err);
    if (st) return;
    CHECK_EQ_INT(dsattn_mha_n_layers(m), layers);
    CHECK_EQ_INT(dsattn_mha_n_heads(m), heads);
    CHECK_EQ_INT(dsattn_mha_n_kv_heads(m), kv);
    CHECK_EQ_INT(dsattn_mha_dim(m), hidden);
    CHECK_EQ_INT(dsattn_mha_head_dim(m), 128);
    CHECK_EQ_INT(dsattn_mha_weight_bytes(m), 0);
    dsattn_mha_seq *s = NULL;
    dsattn_kv_bill b;
    /* one layer at an odd capacity, then the whole model */
    CHECK_OK(dsattn_mha_seq_create_layers(&s, m, 777, layers - 1, 1));
    CHECK_OK(dsattn_mha_seq_kv_bill(s, &b));
    CHECK_MSG(b.global_bytes_per_token == per_layer, "%s: %.3f B/token/layer, want %.0f",
              cfg, b.global_bytes_per_token, per_layer);
    CHECK_EQ_INT(b.global_bytes_allocated, (size_t)per_layer * 777);
    CHECK_EQ_INT(b.window_bytes, 0);
    CHECK_EQ_INT(b.state_bytes, 0);
    dsattn_mha_seq_destroy(s);
    CHECK_OK(dsattn_mha_seq_create(&s, m, 64));
    CHECK_OK(dsattn_mha_seq_kv_bill(s, &b));
    CHECK_MSG(b.global_bytes_per_token == per_layer * layers, "%s: %.3f B/token, want %.0f",
              cfg, b.global_bytes_per_token, per_layer * layers);
    /* a config-only model has no forward */
    float x[1] = { 0 };
    CHECK_EQ_INT(dsattn_mha_attn_forward(NULL, s, 0, x, 1, x), DSATTN_ERR_INVALID_ARG);
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    float *xx = calloc((size_t)hidden, sizeof(float));
    CHECK_EQ_INT(dsattn_mha_attn_forward(c, s, 0, xx, 1, xx), DSATTN_ERR_UNSUPPORTED);
    free(xx);
    dsattn_ctx_destroy(c);
    dsattn_mha_seq_destroy(s);
    dsattn_mha_destroy(m);
}

DSATTN_TEST(mha, deepseek_llm_7b_cache_is_16384_bytes_per_token_layer)
{
    real_bill(DSATTN_TEST_DATA "/../../configs/deepseek-llm-7b.json", 30, 32, 32, 4096, 16384);
}

DSATTN_TEST(mha, deepseek_llm_67b_gqa_cache_is_4096_bytes_per_token_layer)
{
    real_bill(DSATTN_TEST_DATA "/../../configs/deepseek-llm-67b.json", 95, 64, 8, 8192, 4096);
}

/* ==== Prefill then decode == one prefill ================================ */

static void split_invariance(dsattn_mode mode, double rel_tol, uint64_t seed)
{
    enum { N = 24, P = 9, LAYERS = 2, DIM = 256 };
    char err[256] = "";
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("split", 2, LAYERS), seed, err, sizeof err));
    if (!m) return;
    dsattn_ctx *c = dsattn_test_ctx(mode, 0);
    float *x[LAYERS], *a[LAYERS], *b[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        x[l] = rand_x(N, DIM, seed * 10 + (uint64_t)l);
        a[l] = calloc(N * DIM, sizeof(float));
        b[l] = calloc(N * DIM, sizeof(float));
    }
    dsattn_mha_seq *sa = NULL, *sb = NULL;
    CHECK_OK(dsattn_mha_seq_create(&sa, m, N));
    CHECK_OK(dsattn_mha_seq_create(&sb, m, N));
    run_chunk(c, sa, LAYERS, x, DIM, 0, N, a);                 /* one prefill  */
    run_chunk(c, sb, LAYERS, x, DIM, 0, P, b);                 /* prefill P    */
    for (size_t t = P; t < N; t++) run_chunk(c, sb, LAYERS, x, DIM, t, 1, b);  /* decode */
    CHECK_EQ_INT(dsattn_mha_seq_pos(sb), N);
    for (int l = 0; l < LAYERS; l++) {
        if (rel_tol == 0.0) {
            CHECK_BITS("prefill+decode vs prefill", b[l], a[l], N * DIM);
        } else {
            double r = dsattn_rel_l2(b[l], a[l], N * DIM);
            CHECK_MSG(r <= rel_tol, "layer %d: rel L2 %.3g > %.3g", l, r, rel_tol);
        }
        free(x[l]); free(a[l]); free(b[l]);
    }
    dsattn_mha_seq_destroy(sa);
    dsattn_mha_seq_destroy(sb);
    dsattn_ctx_destroy(c);
    dsattn_mha_destroy(m);
}

/* Reference mode: every sum is exact-then-rounded-once, so the split cannot
 * change a single bit. */
DSATTN_TEST(mha, prefill_then_decode_equals_prefill_reference_bit_exact_seed1)
{
    split_invariance(DSATTN_MODE_REFERENCE, 0.0, 1);
}

/* Fast mode: a prefill of >= 8 tokens runs its Linears through sgemm and a
 * decode through the GEMV kernels (different fp32 orders), so bf16 values
 * may flip by one ulp: relative L2 <= 4e-3 (bf16 eps is 7.8e-3). */
DSATTN_TEST(mha, prefill_then_decode_equals_prefill_fast_within_4e3_seed2)
{
    split_invariance(DSATTN_MODE_FAST, 4e-3, 2);
}

/* ==== Batched decode == one-sequence steps ============================== */

/* Nine sequences of one GQA model at depths around the cache tiles (K 32,
 * V 64 keys) and of different capacities, each with a twin (a clone).
 * Three steps run batches of 9, 5 and 3 of them, in shuffled order,
 * through dsattn_mha_attn_forward_batch on every layer, the twins through
 * the one-sequence forward with the same rows; then the outputs, every
 * cache row and the positions must agree: bit for bit in reference mode,
 * relative L2 <= tol in fast mode (9 rows take the tiled Linear, one the
 * GEMV).  In between, bad batches fail with the right index and change
 * nothing: the final comparison covers them. */
static void batched_case(dsattn_mode mode, double tol, uint64_t seed)
{
    enum { NS = 9, LAYERS = 2, DIM = 256, KVD = 2 * 64 };
    static const size_t depth[NS] = { 0, 1, 7, 31, 32, 33, 63, 64, 65 };
    static const size_t steps[3] = { 9, 5, 3 };
    char err[256] = "";
    dsattn_mha *m = NULL, *m2 = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("batch", 2, LAYERS), seed, err, sizeof err));
    CHECK_OK(dsattn_mha_create_random(&m2, tiny_cfg("batch2", 2, LAYERS), seed, err, sizeof err));
    if (!m || !m2) return;
    dsattn_ctx *c = dsattn_test_ctx(mode, 0);
    dsattn_mha_seq *a[NS] = { NULL }, *b[NS] = { NULL };
    float *pre = rand_x(72, DIM, seed * 7), *po[LAYERS];
    for (int l = 0; l < LAYERS; l++) po[l] = calloc(72 * DIM, sizeof(float));
    for (size_t i = 0; i < NS; i++) {
        float *px[LAYERS] = { pre, pre };
        CHECK_OK(dsattn_mha_seq_create(&a[i], m, depth[i] + 4 + i));
        if (!a[i]) return;
        if (depth[i]) run_chunk(c, a[i], LAYERS, px, DIM, 0, depth[i], po);
        CHECK_OK(dsattn_mha_seq_clone(&b[i], a[i]));
    }
    float *ya = calloc(NS * DIM, sizeof(float)), *yb = calloc(NS * DIM, sizeof(float));
    for (int t = 0; t < 3; t++) {
        const size_t B = steps[t];
        dsattn_mha_seq *sa[NS];
        size_t idx[NS];
        for (size_t k = 0; k < B; k++) {
            idx[k] = ((size_t)t * 4 + k * 2) % NS;               /* distinct, shuffled */
            sa[k] = a[idx[k]];
        }
        for (int l = 0; l < LAYERS; l++) {
            float *x = rand_x(B, DIM, seed * 100 + (uint64_t)(t * 10 + l));
            size_t failed = 77;
            CHECK_OK(dsattn_mha_attn_forward_batch(c, sa, B, l, x, ya, &failed));
            CHECK_EQ_INT(failed, 77);                    /* written only on failure */
            for (size_t k = 0; k < B; k++)
                CHECK_OK(dsattn_mha_attn_forward(c, b[idx[k]], l, x + k * DIM, 1, yb + k * DIM));
            if (tol == 0.0) {
                CHECK_BITS("batched vs one sequence", ya, yb, B * DIM);
            } else {
                const double r = dsattn_rel_l2(ya, yb, B * DIM);
                CHECK_MSG(r <= tol, "step %d layer %d, %zu rows: rel L2 %.3g > %.3g", t, l, B,
                          r, tol);
            }
            free(x);
        }
        for (size_t k = 0; k < B; k++) {
            CHECK_OK(dsattn_mha_seq_advance(a[idx[k]], 1));
            CHECK_OK(dsattn_mha_seq_advance(b[idx[k]], 1));
        }
    }
    if (mode == DSATTN_MODE_REFERENCE) {
        /* bad batches: the call fails, names the sequence, writes nothing */
        dsattn_mha_seq *full = NULL, *part = NULL, *other = NULL;
        CHECK_OK(dsattn_mha_seq_create(&full, m, 1));
        CHECK_OK(dsattn_mha_seq_create_layers(&part, m, 8, 1, 1));
        CHECK_OK(dsattn_mha_seq_create(&other, m2, 8));
        {
            float *px[LAYERS] = { pre, pre };
            run_chunk(c, full, LAYERS, px, DIM, 0, 1, po);          /* at capacity */
        }
        const struct { dsattn_mha_seq *s[3]; size_t n; int layer; dsattn_status st; size_t bad; }
            cases[] = {
                { { a[1], a[2], a[1] }, 3, 0, DSATTN_ERR_INVALID_ARG, 2 },    /* repeated */
                { { a[1], full }, 2, 0, DSATTN_ERR_INVALID_ARG, 1 },          /* no room */
                { { a[3], NULL }, 2, 0, DSATTN_ERR_INVALID_ARG, 1 },
                { { a[3], other }, 2, 0, DSATTN_ERR_INVALID_ARG, 1 },         /* other model */
                { { a[3], part }, 2, 0, DSATTN_ERR_INVALID_ARG, 1 },          /* layer 1 only */
                { { a[3], a[4] }, 2, LAYERS, DSATTN_ERR_INVALID_ARG, SIZE_MAX },
                { { a[3] }, 0, 0, DSATTN_ERR_INVALID_ARG, SIZE_MAX },
            };
        float *x = rand_x(3, DIM, 5);
        for (size_t e = 0; e < DSATTN_ARRAY_LEN(cases); e++) {
            for (size_t i = 0; i < 3 * DIM; i++) ya[i] = 7.0f;
            size_t failed = 77;
            CHECK_EQ_INT(dsattn_mha_attn_forward_batch(c, cases[e].s, cases[e].n, cases[e].layer,
                                                       x, ya, &failed),
                         cases[e].st);
            CHECK_MSG(failed == cases[e].bad, "bad batch %zu: failed %zu, want %zu", e, failed,
                      cases[e].bad);
            for (size_t i = 0; i < 3 * DIM; i++)
                if (ya[i] != 7.0f) {
                    CHECK_MSG(0, "bad batch %zu wrote out[%zu]", e, i);
                    break;
                }
        }
        /* the sequence of layer 1 alone takes a batch of layer 1 */
        dsattn_mha_seq *p1[1] = { part };
        CHECK_OK(dsattn_mha_attn_forward_batch(c, p1, 1, 1, x, ya, NULL));
        free(x);
        dsattn_mha_seq_destroy(full);
        dsattn_mha_seq_destroy(part);
        dsattn_mha_seq_destroy(other);
    }
    /* the caches and positions of the twins */
    float ka[KVD], va[KVD], kb[KVD], vb[KVD];
    for (size_t i = 0; i < NS; i++) {
        CHECK_EQ_INT(dsattn_mha_seq_pos(a[i]), dsattn_mha_seq_pos(b[i]));
        for (int l = 0; l < LAYERS; l++)
            for (size_t p = 0; p < (size_t)dsattn_mha_seq_pos(a[i]); p++) {
                CHECK_OK(dsattn_mha_seq_kv(a[i], l, p, ka, va));
                CHECK_OK(dsattn_mha_seq_kv(b[i], l, p, kb, vb));
                if (tol == 0.0) {
                    CHECK_BITS("cache K", ka, kb, KVD);
                    CHECK_BITS("cache V", va, vb, KVD);
                } else {
                    CHECK(dsattn_rel_l2(ka, kb, KVD) <= tol && dsattn_rel_l2(va, vb, KVD) <= tol);
                }
            }
        dsattn_mha_seq_destroy(a[i]);
        dsattn_mha_seq_destroy(b[i]);
    }
    for (int l = 0; l < LAYERS; l++) free(po[l]);
    free(pre); free(ya); free(yb);
    dsattn_ctx_destroy(c);
    dsattn_mha_destroy(m);
    dsattn_mha_destroy(m2);
}

DSATTN_TEST(mha, batched_decode_equals_one_sequence_steps_reference_bit_exact_seed12)
{
    batched_case(DSATTN_MODE_REFERENCE, 0.0, 12);
}

/* fast mode: the bound of the prefill-vs-decode test above (the same two
 * Linear paths) */
DSATTN_TEST(mha, batched_decode_equals_one_sequence_steps_fast_within_4e3_seed13)
{
    batched_case(DSATTN_MODE_FAST, 4e-3, 13);
}

/* ==== Causality ========================================================= */

DSATTN_TEST(mha, causal_future_tokens_change_nothing_before_seed3)
{
    enum { N = 16, K = 6, DIM = 256 };
    char err[256] = "";
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("causal", 2, 1), 3, err, sizeof err));
    if (!m) return;
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    float *x1 = rand_x(N, DIM, 31), *x2 = rand_x(N, DIM, 31);
    for (size_t i = (K + 1) * DIM; i < N * DIM; i++) x2[i] = -x2[i] + 0.5f;  /* new future */
    float *o1 = calloc(N * DIM, 4), *o2 = calloc(N * DIM, 4);
    dsattn_mha_seq *s1 = NULL, *s2 = NULL;
    CHECK_OK(dsattn_mha_seq_create(&s1, m, N));
    CHECK_OK(dsattn_mha_seq_create(&s2, m, N));
    CHECK_OK(dsattn_mha_attn_forward(c, s1, 0, x1, N, o1));
    CHECK_OK(dsattn_mha_attn_forward(c, s2, 0, x2, N, o2));
    CHECK_BITS("rows <= K", o2, o1, (K + 1) * DIM);
    /* and the future rows did change (the test can tell a leak from none) */
    CHECK(dsattn_rel_l2(o2 + (K + 1) * DIM, o1 + (K + 1) * DIM, (N - K - 1) * DIM) > 0.05);
    /* the first token attends only to itself: its output is o_proj(v) */
    dsattn_mha_seq_destroy(s1);
    dsattn_mha_seq_destroy(s2);
    free(x1); free(x2); free(o1); free(o2);
    dsattn_ctx_destroy(c);
    dsattn_mha_destroy(m);
}

/* ==== GQA with its KV heads repeated == MHA ============================= */

DSATTN_TEST(mha, gqa_equals_mha_with_repeated_kv_heads_seed4)
{
    enum { N = 10, DIM = 256, H = 4, HKV = 2, DH = 64 };
    char err[256] = "";
    dsattn_mha *g = NULL, *mh = NULL;
    CHECK_OK(dsattn_mha_create_random(&g, tiny_cfg("gqa", HKV, 1), 4, err, sizeof err));
    CHECK_OK(dsattn_mha_create_random(&mh, tiny_cfg("mha", H, 1), 99, err, sizeof err));
    if (!g || !mh) { dsattn_mha_destroy(g); dsattn_mha_destroy(mh); return; }
    /* MHA weights: wq, wo copied; head h's K/V rows = group h/2's rows */
    dsattn_mha_layer_w *Lg = &g->layer[0], *Lm = &mh->layer[0];
    memcpy((void *)Lm->wq.data, Lg->wq.data, (size_t)H * DH * DIM * 2);
    memcpy((void *)Lm->wo.data, Lg->wo.data, (size_t)DIM * H * DH * 2);
    for (int h = 0; h < H; h++) {
        int grp = h / (H / HKV);
        memcpy((uint16_t *)Lm->wk.data + (size_t)h * DH * DIM,
               (const uint16_t *)Lg->wk.data + (size_t)grp * DH * DIM, (size_t)DH * DIM * 2);
        memcpy((uint16_t *)Lm->wv.data + (size_t)h * DH * DIM,
               (const uint16_t *)Lg->wv.data + (size_t)grp * DH * DIM, (size_t)DH * DIM * 2);
    }
    float *x = rand_x(N, DIM, 41), *og = calloc(N * DIM, 4), *om = calloc(N * DIM, 4);
    for (int mode = 0; mode < 2; mode++) {
        dsattn_ctx *c = dsattn_test_ctx(mode ? DSATTN_MODE_FAST : DSATTN_MODE_REFERENCE, 0);
        dsattn_mha_seq *sg = NULL, *sm = NULL;
        CHECK_OK(dsattn_mha_seq_create(&sg, g, N));
        CHECK_OK(dsattn_mha_seq_create(&sm, mh, N));
        /* prefill 7, decode 3: both paths of both models */
        CHECK_OK(dsattn_mha_attn_forward(c, sg, 0, x, 7, og));
        CHECK_OK(dsattn_mha_attn_forward(c, sm, 0, x, 7, om));
        CHECK_OK(dsattn_mha_seq_advance(sg, 7));
        CHECK_OK(dsattn_mha_seq_advance(sm, 7));
        for (int t = 7; t < N; t++) {
            CHECK_OK(dsattn_mha_attn_forward(c, sg, 0, x + t * DIM, 1, og + t * DIM));
            CHECK_OK(dsattn_mha_attn_forward(c, sm, 0, x + t * DIM, 1, om + t * DIM));
            CHECK_OK(dsattn_mha_seq_advance(sg, 1));
            CHECK_OK(dsattn_mha_seq_advance(sm, 1));
        }
        CHECK_BITS(mode ? "fast GQA vs MHA" : "reference GQA vs MHA", og, om, N * DIM);
        /* the GQA cache holds HKV heads, not H: half the bytes */
        dsattn_kv_bill bg, bm;
        CHECK_OK(dsattn_mha_seq_kv_bill(sg, &bg));
        CHECK_OK(dsattn_mha_seq_kv_bill(sm, &bm));
        CHECK(bg.global_bytes_per_token * 2 == bm.global_bytes_per_token);
        CHECK(bg.global_bytes_per_token == 2.0 * HKV * DH * 2);
        dsattn_mha_seq_destroy(sg);
        dsattn_mha_seq_destroy(sm);
        dsattn_ctx_destroy(c);
    }
    free(x); free(og); free(om);
    dsattn_mha_destroy(g);
    dsattn_mha_destroy(mh);
}

/* ==== Fast == reference ================================================= */

/* Prefill and a decode at a synthetic depth of 3000: the fast path (fp32
 * accumulation, SIMD kernels, sgemm for the prefill Linears) against the
 * reference.  Bound: relative L2 <= 4e-3 and no element further than 4
 * bf16 ulps of the row's largest magnitude.  Every intermediate is rounded
 * to bf16 where HF rounds, so fp32-vs-double accumulation only shows when a
 * value sits within ~1e-7 of a bf16 rounding boundary: these seeds come
 * out bit-identical, and a flipped rounding moves an output by ~1 ulp. */
static void close_enough(const char *what, const float *f, const float *r, size_t n,
                         size_t row)
{
    double rl = dsattn_rel_l2(f, r, n);
    CHECK_MSG(rl <= 4e-3, "%s: rel L2 %.3g > 4e-3", what, rl);
    for (size_t i0 = 0; i0 < n; i0 += row) {
        float mx = 0.0f;
        for (size_t i = i0; i < i0 + row; i++) mx = fmaxf(mx, fabsf(r[i]));
        for (size_t i = i0; i < i0 + row; i++)
            if (fabsf(f[i] - r[i]) > 4.0f * mx * 0x1p-8f) {
                CHECK_MSG(0, "%s: [%zu] fast %g ref %g (row max %g)", what, i, f[i], r[i], mx);
                return;
            }
    }
}

DSATTN_TEST(mha, fast_matches_reference_prefill_and_deep_decode_seed5)
{
    enum { N = 20, DIM = 256, DEPTH = 3000 };
    char err[256] = "";
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("fast", 1, 1), 5, err, sizeof err));
    if (!m) return;
    dsattn_ctx *cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *cf = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    float *x = rand_x(N, DIM, 51), *of = calloc(N * DIM, 4), *orf = calloc(N * DIM, 4);
    dsattn_mha_seq *sf = NULL, *sr = NULL;
    CHECK_OK(dsattn_mha_seq_create(&sf, m, N));
    CHECK_OK(dsattn_mha_seq_create(&sr, m, N));
    CHECK_OK(dsattn_mha_attn_forward(cf, sf, 0, x, N, of));
    CHECK_OK(dsattn_mha_attn_forward(cr, sr, 0, x, N, orf));
    close_enough("prefill", of, orf, N * DIM, DIM);
    dsattn_mha_seq_destroy(sf);
    dsattn_mha_seq_destroy(sr);
    /* decode one token after 3000 synthetic ones (MQA: 4 heads, 1 KV head) */
    CHECK_OK(dsattn_mha_seq_create(&sf, m, DEPTH + 1));
    CHECK_OK(dsattn_mha_seq_create(&sr, m, DEPTH + 1));
    CHECK_OK(dsattn_mha_seq_fill_synthetic(sf, DEPTH, 7));
    CHECK_OK(dsattn_mha_seq_fill_synthetic(sr, DEPTH, 7));
    CHECK_EQ_INT(dsattn_mha_seq_pos(sf), DEPTH);
    dsattn_ctx_counters_reset(cf);
    CHECK_OK(dsattn_mha_attn_forward(cf, sf, 0, x, 1, of));
    dsattn_counters k = dsattn_ctx_counters(cf);
    CHECK_OK(dsattn_mha_attn_forward(cr, sr, 0, x, 1, orf));
    close_enough("decode at 3000", of, orf, DIM, DIM);
    /* the core was counted: 4 H d (T) FLOPs and both caches' bytes once */
    CHECK(k.flops >= 4ull * 4 * 64 * (DEPTH + 1));
    CHECK(k.bytes_read >= 2ull * 1 * 64 * 2 * (DEPTH + 1));
    dsattn_mha_seq_destroy(sf);
    dsattn_mha_seq_destroy(sr);
    free(x); free(of); free(orf);
    dsattn_ctx_destroy(cr);
    dsattn_ctx_destroy(cf);
    dsattn_mha_destroy(m);
}

/* ==== An independent float64 LlamaAttention ============================= */

/* q/k/v from the bf16 weights, half-split RoPE (rotate_half) at theta 1e4,
 * softmax(q.k / sqrt(d)) over positions <= t, P.V, o_proj - all in double,
 * no bf16 rounding anywhere.  The library output (bf16 everywhere HF rounds)
 * must agree to bf16 noise: rel L2 <= 1e-2 (4e-3 seen).  A wrong RoPE pairing
 * (interleaved), scale, head-to-KV mapping or causal window is far off. */
DSATTN_TEST(mha, reference_agrees_with_float64_llama_attention_seed6)
{
    enum { N = 12, DIM = 256, H = 4, HKV = 2, DH = 64, G = H / HKV };
    char err[256] = "";
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("f64", HKV, 1), 6, err, sizeof err));
    if (!m) return;
    const dsattn_mha_layer_w *L = &m->layer[0];
    float *x = rand_x(N, DIM, 61), *o = calloc(N * DIM, 4), *want = calloc(N * DIM, 4);
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    dsattn_mha_seq *s = NULL;
    CHECK_OK(dsattn_mha_seq_create(&s, m, N));
    CHECK_OK(dsattn_mha_attn_forward(c, s, 0, x, N, o));

    double *q = calloc(N * H * DH, 8), *k = calloc(N * HKV * DH, 8), *v = calloc(N * HKV * DH, 8);
    double *att = calloc(N * H * DH, 8);
#define W(w, r, i) ((double)dsattn_bf16_to_f32(((const uint16_t *)(w).data)[(size_t)(r) * (w).cols + (i)]))
    for (int t = 0; t < N; t++) {
        for (int r = 0; r < H * DH; r++) {
            double a = 0; for (int i = 0; i < DIM; i++) a += W(L->wq, r, i) * x[t * DIM + i];
            q[t * H * DH + r] = a;
        }
        for (int r = 0; r < HKV * DH; r++) {
            double a = 0, b = 0;
            for (int i = 0; i < DIM; i++) { a += W(L->wk, r, i) * x[t * DIM + i]; b += W(L->wv, r, i) * x[t * DIM + i]; }
            k[t * HKV * DH + r] = a;
            v[t * HKV * DH + r] = b;
        }
        /* rotate_half: pairs (i, i + d/2), inv_freq_i = 1e4^(-2i/d) */
        for (int hh = 0; hh < H + HKV; hh++) {
            double *p = hh < H ? q + (t * H + hh) * DH : k + (t * HKV + hh - H) * DH;
            for (int i = 0; i < DH / 2; i++) {
                double f = pow(10000.0, -2.0 * i / DH), cs = cos(t * f), sn = sin(t * f);
                double a = p[i], b = p[i + DH / 2];
                p[i] = a * cs - b * sn;
                p[i + DH / 2] = b * cs + a * sn;
            }
        }
    }
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            int g = h / G;
            double sc[N], mx = -1e300, sum = 0;
            for (int j = 0; j <= t; j++) {
                double a = 0;
                for (int i = 0; i < DH; i++) a += q[(t * H + h) * DH + i] * k[(j * HKV + g) * DH + i];
                sc[j] = a / sqrt((double)DH);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= t; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
            for (int i = 0; i < DH; i++) {
                double a = 0;
                for (int j = 0; j <= t; j++) a += sc[j] / sum * v[(j * HKV + g) * DH + i];
                att[(t * H + h) * DH + i] = a;
            }
        }
    for (int t = 0; t < N; t++)
        for (int r = 0; r < DIM; r++) {
            double a = 0;
            for (int i = 0; i < H * DH; i++) a += W(L->wo, r, i) * att[t * H * DH + i];
            want[t * DIM + r] = (float)a;
        }
#undef W
    double rl = dsattn_rel_l2(o, want, N * DIM);
    CHECK_MSG(rl <= 1e-2, "rel L2 vs float64 LlamaAttention %.3g > 1e-2", rl);
    /* the cache holds RoPE'd keys: token 5, KV head 1 */
    float kc[HKV * DH];
    CHECK_OK(dsattn_mha_seq_kv(s, 0, 5, kc, NULL));
    double num = 0, den = 0;
    for (int i = 0; i < HKV * DH; i++) {
        double dlt = kc[i] - k[5 * HKV * DH + i];
        num += dlt * dlt;
        den += k[5 * HKV * DH + i] * k[5 * HKV * DH + i];
    }
    /* one bf16 rounding of each value: ~2^-9 relative (2.5e-3 seen) */
    CHECK_MSG(sqrt(num / den) <= 5e-3, "cached K vs float64 RoPE'd k: %.3g", sqrt(num / den));
    free(q); free(k); free(v); free(att); free(x); free(o); free(want);
    dsattn_mha_seq_destroy(s);
    dsattn_ctx_destroy(c);
    dsattn_mha_destroy(m);
}

/* ==== The fast decode kernel against the contract ====================== */

/* One query token, G heads against one KV head's cache in the mha.h layout
 * (key-tiled K and V), restated here in double with the contract's
 * roundings (bf16 scores, fp32 exp of the difference, bf16 p, bf16 o):
 * written from docs/bill.md, independent of both kernels. */
static void contract_attend_mag(const float *q, size_t G, size_t d, const uint16_t *K,
                                const uint16_t *V, size_t cap, size_t T, float *o, float *mag)
{
    const float inv = 1.0f / sqrtf((float)d);
    float *s = malloc(T * sizeof(float));
    for (size_t h = 0; h < G; h++) {
        float mx = -INFINITY;
        for (size_t j = 0; j < T; j++) {
            double a = 0.0;
            for (size_t i = 0; i < d; i++)
                a += (double)q[h * d + i] *
                     (double)dsattn_bf16_to_f32(K[dsattn_mha_k_index(cap, d, 0, j, i)]);
            s[j] = dsattn_round_bf16(dsattn_round_bf16((float)a) * inv);
            mx = fmaxf(mx, s[j]);
        }
        double sum = 0.0;
        for (size_t j = 0; j < T; j++) {
            s[j] = (float)exp((double)(s[j] - mx));
            sum += s[j];
        }
        for (size_t j = 0; j < T; j++) s[j] = dsattn_round_bf16(s[j] / (float)sum);
        for (size_t i = 0; i < d; i++) {
            double a = 0.0;
            double m = 0.0;
            for (size_t j = 0; j < T; j++) {
                const double t = (double)s[j] * (double)dsattn_bf16_to_f32(V[dsattn_mha_v_index(cap, d, 0, j, i)]);
                a += t;
                m = fmax(m, fabs(t));
            }
            o[h * d + i] = dsattn_round_bf16((float)a);
            if (mag) mag[h * d + i] = (float)m;
        }
    }
    free(s);
}

static void contract_attend(const float *q, size_t G, size_t d, const uint16_t *K,
                            const uint16_t *V, size_t cap, size_t T, float *o)
{
    contract_attend_mag(q, G, d, K, V, cap, T, o, NULL);
}

/* |f - r| <= 2 bf16 ulps of r (fp32 sums in another order flip a bf16
 * rounding now and then, by one ulp).  A key dropped, doubled or read from
 * the wrong tile moves outputs by ~200/sqrt(T) ulps at these depths. */
static int within_2ulp(const char *what, const float *f, const float *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int e;
        frexpf(r[i], &e);
        float tol = r[i] == 0.0f ? 1e-30f : ldexpf(2.0f, e - 8);
        if (!(fabsf(f[i] - r[i]) <= tol)) {
            CHECK_MSG(0, "%s: [%zu] fast %.9g contract %.9g", what, i, f[i], r[i]);
            return 0;
        }
    }
    return 1;
}

/* within_2ulp, plus 2^-6 of mag (the largest |p_j v_j| of the element):
 * where the terms cancel, one score on a bf16 rounding boundary (its sum
 * in another fp32 order) moves that p_j by a bf16 ulp of s, more than 2
 * ulps of the small result.  A stale or misplaced exp moves p_j by far
 * more. */
static int within_2ulp_mag(const char *what, const float *f, const float *r, const float *mag,
                           size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int e;
        frexpf(r[i], &e);
        float tol = (r[i] == 0.0f ? 1e-30f : ldexpf(2.0f, e - 8)) + ldexpf(mag[i], -6);
        if (!(fabsf(f[i] - r[i]) <= tol)) {
            CHECK_MSG(0, "%s: [%zu] fast %.9g contract %.9g (max |p v| %.3g)", what, i, f[i], r[i],
                      mag[i]);
            return 0;
        }
    }
    return 1;
}

/* Cases: one key, a cache of one key, keys ending inside a partial tile
 * (cap not a multiple of 32) or a full one, depths off the 32-key tile and
 * the 64-key P.V chunk, G batched as 8/4/2/1 (3, 5, 12, 64), d with a
 * partial 32-dim block (80, 96, 34, 100, 126), and a deep case with
 * prefetch active. */
static void run_decode_kernel(const dsattn_mha_kern *mk)
{
    if (!mk) return;
    static const struct { size_t G, d, cap, T; float qs; } cs[] = {
        { 1, 128, 1, 1, 1 },      { 8, 128, 40, 1, 1 },     { 8, 128, 40, 33, 1 },
        { 8, 128, 40, 40, 4 },    { 2, 64, 100, 97, 1 },    { 3, 80, 70, 64, 2 },
        { 12, 128, 300, 257, 1 }, { 1, 128, 1000, 999, 1 }, { 5, 96, 129, 129, 4 },
        { 64, 128, 65, 65, 1 },   { 16, 128, 64, 64, 1 },   { 4, 128, 4096, 3001, 3 },
        { 8, 2, 33, 33, 8 },
        /* a last 32-dim block of 2, 4 and 30 dims: a part of 8 dims narrower
         * than 8 after whole blocks */
        { 6, 34, 97, 90, 2 },     { 2, 100, 65, 65, 1 },    { 9, 126, 200, 131, 1 },
    };
    dsattn_rng r = { 7 };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const size_t G = cs[c].G, d = cs[c].d, cap = cs[c].cap, T = cs[c].T;
        uint16_t *K = malloc(cap * d * 2), *V = malloc(cap * d * 2);
        float *q = malloc(G * d * 4), *of = malloc(G * d * 4), *oc = malloc(G * d * 4),
              *o1 = malloc(G * d * 4);
        /* odd cases hand the kernel a ws 8 bytes off a 64-byte boundary */
        char *wsb = dsattn_alloc(mk->ws_bytes(G, T) + 8);
        void *ws = wsb + (c & 1) * 8;
        for (size_t i = 0; i < cap * d; i++) {
            K[i] = dsattn_f32_to_bf16(dsattn_rng_uniform(&r));
            V[i] = dsattn_f32_to_bf16(dsattn_rng_uniform(&r));
        }
        for (size_t i = 0; i < G * d; i++) q[i] = dsattn_round_bf16(cs[c].qs * dsattn_rng_normal(&r));
        const float inv = 1.0f / sqrtf((float)d);
        mk->attend(q, G, d, K, V, cap, T, inv, ws, of);
        contract_attend(q, G, d, K, V, cap, T, oc);
        char what[96];
        snprintf(what, sizeof what, "G %zu d %zu cap %zu T %zu", G, d, cap, T);
        if (!within_2ulp(what, of, oc, G * d)) CHECK_MSG(0, "case %zu", c);
        /* heads one at a time give the same bits as the batch (GQA == MHA) */
        for (size_t h = 0; h < G; h++)
            mk->attend(q + h * d, 1, d, K, V, cap, T, inv, ws, o1 + h * d);
        CHECK_BITS(what, o1, of, G * d);
        free(K); free(V); free(q); free(of); free(oc); free(o1);
        dsattn_free(wsb);
    }
}

/* GQA shapes where the running max of the scores grows late or never
 * after the first key, so the V pass of a kernel that keeps the K pass's
 * exp(s - max) rows takes them for some chunks and computes them again for
 * others (the AVX2 kernel: chunks before the tile that last raised the
 * max).  K's values carry a ramp over the keys (q > 0): rising, so the max
 * moves on to the last tile; falling, so it is fixed by key 0; rising then
 * falling, so it stops in the middle.  G from 2 to 16 (batches of 6, 4, 2
 * and 1 heads), depths 1, off the 32-key tile and the 64-key chunk. */
static void run_decode_kernel_ramps(const dsattn_mha_kern *mk)
{
    if (!mk) return;
    static const size_t Gs[] = { 2, 4, 6, 7, 8, 9, 16 };
    static const size_t Ts[] = { 1, 31, 33, 65, 97, 200, 1000 };
    const size_t d = 128;
    dsattn_rng r = { 11 };
    for (int shape = 0; shape < 3; shape++)
        for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const size_t G = Gs[gi], T = Ts[ti], cap = T + (ti & 1) * 7;
                uint16_t *K = malloc(cap * d * 2), *V = malloc(cap * d * 2);
                float *q = malloc(G * d * 4), *of = malloc(G * d * 4), *oc = malloc(G * d * 4),
                      *o1 = malloc(G * d * 4), *mag = malloc(G * d * 4);
                char *wsb = dsattn_alloc(mk->ws_bytes(G, T) + 8);
                void *ws = wsb + (ti & 1) * 8;
                for (size_t j = 0; j < cap; j++) {
                    const double f = (double)j / (double)(T > 1 ? T - 1 : 1);
                    const double ramp = shape == 0 ? f : shape == 1 ? 1.0 - f : 1.0 - fabs(2.0 * f - 1.0);
                    for (size_t i = 0; i < d; i++) {
                        const float k = (float)(0.05 * dsattn_rng_uniform(&r) + 0.5 * ramp);
                        K[dsattn_mha_k_index(cap, d, 0, j, i)] = dsattn_f32_to_bf16(k);
                        V[dsattn_mha_v_index(cap, d, 0, j, i)] = dsattn_f32_to_bf16(dsattn_rng_uniform(&r));
                    }
                }
                for (size_t i = 0; i < G * d; i++)
                    q[i] = dsattn_round_bf16(0.05f + 0.2f * fabsf(dsattn_rng_normal(&r)));
                const float inv = 1.0f / sqrtf((float)d);
                mk->attend(q, G, d, K, V, cap, T, inv, ws, of);
                contract_attend_mag(q, G, d, K, V, cap, T, oc, mag);
                char what[96];
                snprintf(what, sizeof what, "ramp %d G %zu cap %zu T %zu", shape, G, cap, T);
                within_2ulp_mag(what, of, oc, mag, G * d);
                for (size_t h = 0; h < G; h++)
                    mk->attend(q + h * d, 1, d, K, V, cap, T, inv, ws, o1 + h * d);
                CHECK_BITS(what, o1, of, G * d);
                free(K); free(V); free(q); free(of); free(oc); free(o1); free(mag);
                dsattn_free(wsb);
            }
}

/* Each attend kernel this CPU runs, whichever a table would pick: the
 * AVX-512 FMA form, its VDPBF16PS form (AVX512-BF16 CPUs), AVX2. */
static const dsattn_mha_kern *kern_avx512(void)
{
    const dsattn_ktab *kt = dsattn_test_avx512_ktab();
    if (!kt) return NULL;
    if (!dsattn_mha_kern_avx512_ptr) dsattn_test_skip("no AVX-512 MHA kernel (compiler)");
    return dsattn_mha_kern_avx512_ptr;
}

static const dsattn_mha_kern *kern_avx512_bf16(void)
{
    if (!kern_avx512()) return NULL;
    if (!dsattn_cpu_has_avx512_bf16()) {
        dsattn_test_skip("no AVX512-BF16");
        return NULL;
    }
    return dsattn_mha_kern_avx512_bf16_ptr;
}

static const dsattn_mha_kern *kern_avx2(void)
{
    const dsattn_ktab *kt = dsattn_test_avx2_ktab();
    if (kt && !kt->mha) dsattn_test_skip("no AVX2 MHA kernel (compiler)");
    return kt ? kt->mha : NULL;
}

static const dsattn_mha_kern *kern_neon(void)
{
    const dsattn_ktab *kt = dsattn_test_neon_ktab();
    CHECK(!kt || kt->mha == dsattn_mha_kern_neon_ptr);
    return kt ? kt->mha : NULL;
}

DSATTN_TEST(mha, neon_decode_kernel_matches_contract_on_tails_seed7)
{
    run_decode_kernel(kern_neon());
}

DSATTN_TEST(mha, neon_decode_kernel_matches_contract_on_score_ramps_seed11)
{
    run_decode_kernel_ramps(kern_neon());
}

DSATTN_TEST(mha, avx512_decode_kernel_matches_contract_on_tails_seed7)
{
    run_decode_kernel(kern_avx512());
}

DSATTN_TEST(mha, avx512_bf16_decode_kernel_matches_contract_on_tails_seed7)
{
    run_decode_kernel(kern_avx512_bf16());
}

DSATTN_TEST(mha, avx2_decode_kernel_matches_contract_on_tails_seed7)
{
    run_decode_kernel(kern_avx2());
}

DSATTN_TEST(mha, avx512_decode_kernel_matches_contract_on_score_ramps_seed11)
{
    run_decode_kernel_ramps(kern_avx512());
}

DSATTN_TEST(mha, avx512_bf16_decode_kernel_matches_contract_on_score_ramps_seed11)
{
    run_decode_kernel_ramps(kern_avx512_bf16());
}

DSATTN_TEST(mha, avx2_decode_kernel_matches_contract_on_score_ramps_seed11)
{
    run_decode_kernel_ramps(kern_avx2());
}

/* Decode through the layer at depths around the tile and chunk edges, on
 * every fast table this CPU has (the AVX-512 kernel its table picks, the
 * AVX-512 FMA form where that is the VDPBF16PS one, the AVX2 kernel, the
 * NEON kernel, plain C on ref): each against the reference layer, and each SIMD kernel against
 * the plain C path.  A GQA config (4 heads on 2 KV heads, d = 64). */
DSATTN_TEST(mha, fast_decode_every_isa_matches_reference_at_tile_edges_seed8)
{
    enum { DIM = 256, NI = 5 };
    static const size_t depth[] = { 0, 1, 31, 32, 63, 64, 65, 97, 200 };
    char err[256] = "";
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, tiny_cfg("edges", 2, 1), 8, err, sizeof err));
    if (!m) return;
    dsattn_ctx *cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), *cf[NI] = { NULL };
    /* the plain C path (ref) last: the SIMD kernels are compared with it */
    const dsattn_isa isa[NI] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX512, DSATTN_ISA_AVX2,
                                 DSATTN_ISA_NEON, DSATTN_ISA_REF };
    const char *name[NI] = { "avx512", "avx512 FMA form", "avx2", "neon", "plain C" };
    for (int k = 0; k < NI; k++) {
        dsattn_ctx_params p = dsattn_ctx_default_params();
        p.mode = DSATTN_MODE_FAST;
        p.isa = isa[k];
        if (k <= 1 && !dsattn_cpu_has_avx512()) continue;
        if (k == 2 && !dsattn_cpu_has_avx2()) continue;
        if (k == 3 && !dsattn_mha_kern_neon_ptr) continue;
        CHECK_OK(dsattn_ctx_create(&cf[k], &p));
        if (k == 1 && cf[k]) {   /* only where the table's own pick is the VDPBF16PS form */
            dsattn_ctx_set_bf16dot(cf[k], 0);
            if (cf[0] && cf[0]->kt->mha == cf[1]->kt->mha) {
                dsattn_ctx_destroy(cf[1]);
                cf[1] = NULL;
            }
        }
    }
    float *x = rand_x(1, DIM, 81), *orf = calloc(DIM, 4), *of[NI];
    for (int k = 0; k < NI; k++) of[k] = calloc(DIM, 4);
    for (size_t di = 0; di < sizeof depth / sizeof depth[0]; di++) {
        /* caps: one more than the depth (a 1-wide last tile at 31, 63) and
         * a full 32-key last tile */
        for (int cv = 0; cv < 2; cv++) {
            size_t cap = cv ? (depth[di] + 1 + 31) / 32 * 32 : depth[di] + 1;
            dsattn_mha_seq *s = NULL;
            CHECK_OK(dsattn_mha_seq_create(&s, m, cap));
            CHECK_OK(dsattn_mha_seq_fill_synthetic(s, (int64_t)depth[di], 9 + di));
            CHECK_OK(dsattn_mha_attn_forward(cr, s, 0, x, 1, orf));
            char what[64];
            for (int k = 0; k < NI; k++) {
                if (!cf[k]) continue;
                CHECK_OK(dsattn_mha_attn_forward(cf[k], s, 0, x, 1, of[k]));
                snprintf(what, sizeof what, "%s depth %zu cap %zu", name[k], depth[di], cap);
                close_enough(what, of[k], orf, DIM, DIM);
            }
            for (int k = 0; k + 1 < NI; k++) {
                if (!cf[k] || !cf[NI - 1]) continue;
                snprintf(what, sizeof what, "%s vs plain C depth %zu", name[k], depth[di]);
                close_enough(what, of[k], of[NI - 1], DIM, DIM);
            }
            dsattn_mha_seq_destroy(s);
        }
    }
    free(x); free(orf);
    for (int k = 0; k < NI; k++) {
        free(of[k]);
        dsattn_ctx_destroy(cf[k]);
    }
    dsattn_ctx_destroy(cr);
    dsattn_mha_destroy(m);
}

/* ==== Errors ============================================================ */

DSATTN_TEST(mha, bad_configs_and_calls_are_errors)
{
    char err[256] = "";
    dsattn_mha *m = NULL;
    const char *p = write_cfg("bad1", "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 256,"
                              " \"num_hidden_layers\": 1, \"num_attention_heads\": 4}");
    CHECK_EQ_INT(dsattn_mha_load_config(&m, p, err, sizeof err), DSATTN_ERR_UNSUPPORTED);
    CHECK(m == NULL);
    p = write_cfg("bad2", "{\"model_type\": \"llama\", \"hidden_size\": 256,"
                  " \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
                  " \"num_key_value_heads\": 3}");
    CHECK_EQ_INT(dsattn_mha_load_config(&m, p, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "num_key_value_heads") != NULL);
    p = write_cfg("bad3", "{\"model_type\": \"llama\", \"hidden_size\": 256,"
                  " \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
                  " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}");
    CHECK_EQ_INT(dsattn_mha_load_config(&m, p, err, sizeof err), DSATTN_ERR_UNSUPPORTED);
    p = write_cfg("bad4", "{\"model_type\": \"llama\", \"num_hidden_layers\": 1,"
                  " \"num_attention_heads\": 4}");
    CHECK_EQ_INT(dsattn_mha_load_config(&m, p, err, sizeof err), DSATTN_ERR_NOT_FOUND);
    CHECK(strstr(err, "hidden_size") != NULL);
    p = write_cfg("bad5", "{\"model_type\": \"llama\", \"hidden_size\": 768,"
                  " \"num_hidden_layers\": 1, \"num_attention_heads\": 2}");
    CHECK_EQ_INT(dsattn_mha_load_config(&m, p, err, sizeof err), DSATTN_ERR_FORMAT);

    CHECK_OK(dsattn_mha_create_random_layers(&m, tiny_cfg("range", 2, 3), 1, 1, 1, err,
                                             sizeof err));
    if (!m) return;
    CHECK(!dsattn_mha_has_weights(m, 0) && dsattn_mha_has_weights(m, 1) &&
          !dsattn_mha_has_weights(m, 2));
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    dsattn_mha_seq *s = NULL;
    CHECK_EQ_INT(dsattn_mha_seq_create_layers(&s, m, 8, 2, 2), DSATTN_ERR_INVALID_ARG);
    CHECK_OK(dsattn_mha_seq_create_layers(&s, m, 4, 1, 1));
    float *x = rand_x(5, 256, 1), *o = calloc(5 * 256, 4);
    CHECK_EQ_INT(dsattn_mha_attn_forward(c, s, 0, x, 1, o), DSATTN_ERR_INVALID_ARG); /* not held */
    CHECK_EQ_INT(dsattn_mha_attn_forward(c, s, 1, x, 5, o), DSATTN_ERR_INVALID_ARG); /* > cap */
    CHECK_OK(dsattn_mha_attn_forward(c, s, 1, x, 4, o));
    CHECK_OK(dsattn_mha_seq_advance(s, 4));
    CHECK_EQ_INT(dsattn_mha_attn_forward(c, s, 1, x, 1, o), DSATTN_ERR_INVALID_ARG); /* full */
    CHECK_EQ_INT(dsattn_mha_seq_advance(s, 1), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsattn_mha_seq_fill_synthetic(s, 4, 1), DSATTN_ERR_INVALID_ARG);
    free(x); free(o);
    dsattn_mha_seq_destroy(s);
    dsattn_ctx_destroy(c);
    dsattn_mha_destroy(m);
    dsattn_mha_destroy(NULL);
    dsattn_mha_seq_destroy(NULL);
}
