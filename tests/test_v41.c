/* test_v41.c - CSA2 (V4.1): the golden cases bit for bit, and the
 * invariants that hold whatever the weights: prefill/decode consistency,
 * forced-dense selection, Reuse layers reading their sources, Reindex picks
 * inside the candidate pool, all-invalid rows, the 890-byte bill, bad
 * configs. */
#include "csa.h"
#include "harness.h"

#include "internal.h"
#include "ops.h"
#include "safetensors.h"
#include "trace.h"
#include "v41.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== Golden cases ====================================================== */

typedef struct { const dsattn_st_file *got, *want; } pair;

static const dsattn_st_tensor *need(const dsattn_st_file *f, const char *name)
{
    const dsattn_st_tensor *t = dsattn_st_find(f, name);
    CHECK_MSG(t != NULL, "missing tensor %s", name);
    return t;
}

static float *as_f32(const dsattn_st_tensor *t)
{
    float *v = malloc(t->numel * sizeof(float) + 4);
    dsattn_st_to_f32(t, v, t->numel);
    return v;
}

static double meta_noise(const dsattn_st_file *f, const char *key)
{
    /* noise_floor is a JSON object in the metadata; pull one number out */
    const char *nf = dsattn_st_meta(f, "noise_floor");
    const char *p = nf ? strstr(nf, key) : NULL;
    if (!p) return NAN;
    p = strchr(p, ':');
    return p ? atof(p + 1) : NAN;
}

static char *tmp_path(const char *tag)
{
    static char buf[DSATTN_TEST_PATH];
    dsattn_test_tmp(buf, sizeof buf, "dsattn_test_%s.safetensors", tag);
    return buf;
}

/* Reference mode: every tensor of the expected file that we also write must
 * be identical (floats bit for bit, top-k rows identical, cache bytes). */
static void golden_exact(const char *case_dir, const char *expected, int index_k_ref)
{
    char dir[1024], exp_path[1200], err[512] = "";
    snprintf(dir, sizeof dir, "%s", dsattn_test_data(case_dir));
    snprintf(exp_path, sizeof exp_path, "%s/%s", dir, expected);
    const char *out = tmp_path("v41g");
    dsattn_trace_opts o = { DSATTN_MODE_REFERENCE, 0, index_k_ref, 0, 0 };
    dsattn_status st = dsattn_trace_case(dir, out, &o, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "trace %s: %s", case_dir, err);
    if (st) return;
    dsattn_st_file *g = NULL, *w = NULL;
    CHECK_OK(dsattn_st_open(&g, out, err, sizeof err));
    CHECK_OK(dsattn_st_open(&w, exp_path, err, sizeof err));
    if (!g || !w) { dsattn_st_close(g); dsattn_st_close(w); return; }
    size_t compared = 0;
    for (size_t i = 0; i < dsattn_st_count(w); i++) {
        const dsattn_st_tensor *tw = dsattn_st_at(w, i);
        if (strstr(tw->name, "unstable")) continue;
        const dsattn_st_tensor *tg = need(g, tw->name);
        if (!tg) continue;
        CHECK_MSG(tg->numel == tw->numel, "%s: %zu values, want %zu", tw->name, tg->numel, tw->numel);
        if (tg->numel != tw->numel) continue;
        if (tw->dtype == DSATTN_DT_F32) {
            float *a = as_f32(tg), *b = as_f32(tw);
            CHECK_BITS(tw->name, a, b, tw->numel);
            free(a); free(b);
        } else {
            CHECK_MSG(tg->nbytes == tw->nbytes && !memcmp(tg->data, tw->data, tw->nbytes),
                      "%s differs", tw->name);
        }
        compared++;
    }
    CHECK_MSG(compared >= 20, "only %zu tensors compared", compared);
    dsattn_st_close(g);
    dsattn_st_close(w);
    unlink(out);
}

DSATTN_TEST(v41, golden_seed0_owner_exact)     { golden_exact("golden/v41/tiny-seed0", "expected_intended.safetensors", 0); }
DSATTN_TEST(v41, golden_seed0_reference_exact) { golden_exact("golden/v41/tiny-seed0", "expected_bugcompat.safetensors", 1); }
DSATTN_TEST(v41, golden_seed2_fp8_owner_exact) { golden_exact("golden/v41/tiny-seed2-fp8", "expected_intended.safetensors", 0); }
DSATTN_TEST(v41, golden_seed2_fp8_reference_exact) { golden_exact("golden/v41/tiny-seed2-fp8", "expected_bugcompat.safetensors", 1); }
DSATTN_TEST(v41, golden_alt_seed0_owner_exact)     { golden_exact("golden/v41/alt-seed0", "expected_intended.safetensors", 0); }
DSATTN_TEST(v41, golden_alt_seed0_reference_exact) { golden_exact("golden/v41/alt-seed0", "expected_bugcompat.safetensors", 1); }

/* Fast mode on the tiny cases: these are numerically discontinuous (FP4
 * codes, bf16 top-k), so the gate is the oracle's own noise floor between
 * two correct fp32 runs (metadata noise_floor), not 1e-2. */
static void golden_fast(const char *case_dir)
{
    char dir[1024], exp_path[1200], err[512] = "";
    snprintf(dir, sizeof dir, "%s", dsattn_test_data(case_dir));
    snprintf(exp_path, sizeof exp_path, "%s/expected_intended.safetensors", dir);
    const char *out = tmp_path("v41f");
    dsattn_trace_opts o = { DSATTN_MODE_FAST, 2, 0, 0, 0 };
    CHECK_OK(dsattn_trace_case(dir, out, &o, err, sizeof err));
    dsattn_st_file *g = NULL, *w = NULL;
    CHECK_OK(dsattn_st_open(&g, out, err, sizeof err));
    CHECK_OK(dsattn_st_open(&w, exp_path, err, sizeof err));
    if (g && w) {
        const dsattn_st_tensor *tg = need(g, "out"), *tw = need(w, "out");
        if (tg && tw && tg->numel == tw->numel) {
            float *a = as_f32(tg), *b = as_f32(tw);
            double rel = dsattn_rel_l2(a, b, tw->numel), cs = dsattn_cosine(a, b, tw->numel);
            double rel_max = meta_noise(w, "out_rel_max"), cos_min = meta_noise(w, "out_cos_min");
            CHECK_MSG(rel <= rel_max, "fast out rel %.4g > noise floor %.4g", rel, rel_max);
            CHECK_MSG(cs >= cos_min, "fast out cosine %.6f < noise floor %.6f", cs, cos_min);
            free(a); free(b);
        }
    }
    dsattn_st_close(g);
    dsattn_st_close(w);
    unlink(out);
}

DSATTN_TEST(v41, golden_seed0_fast_within_noise_floor)     { golden_fast("golden/v41/tiny-seed0"); }
DSATTN_TEST(v41, golden_seed2_fp8_fast_within_noise_floor) { golden_fast("golden/v41/tiny-seed2-fp8"); }
DSATTN_TEST(v41, golden_alt_seed0_fast_within_noise_floor) { golden_fast("golden/v41/alt-seed0"); }

/* ==== Invariants on generated stacks ==================================== */

/* A tiny V4.1 plan like the golden one; knobs for the invariant tests. */
static const char *write_cfg(const char *tag, int dim, int topk, int cand_blocks,
                             int cand_bs, const char *dtype)
{
    static char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_cfg_%s.json", tag);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f,
            "{\"dim\": %d, \"n_layers\": 12, \"n_heads\": 4, \"head_dim\": 64,"
            " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 64,"
            " \"window_size\": 8, \"compress_ratios\": [0,0,2,2,2,2,1,1,1,1,1,1],"
            " \"kv_source_layers\": [2,4,6], \"index_source_layers\": [2,4,6,8,10],"
            " \"candidate_source_layer\": 6, \"candidate_topk_blocks\": %d,"
            " \"candidate_block_size\": %d, \"index_n_heads\": 8, \"index_head_dim\": 32,"
            " \"index_topk\": %d, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
            " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
            " \"beta_slow\": 1, \"norm_eps\": 1e-20, \"dtype\": \"%s\"}\n",
            dim, cand_blocks, cand_bs, topk, dtype);
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

/* Run the stand-in stack: prefill P then decode; returns final h. */
static float *run_stack(dsattn_ctx *ctx, const dsattn_v41 *m, const float *x, size_t T,
                        size_t P, dsattn_v41_index_k mode)
{
    size_t dim = (size_t)dsattn_v41_dim(m);
    float *h = malloc(T * dim * sizeof(float));
    memcpy(h, x, T * dim * sizeof(float));
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, T, mode));
    for (size_t t = 0; s && t < T;) {
        size_t n = t == 0 ? P : 1;
        CHECK_OK(dsattn_v41_stack_forward(ctx, s, h + t * dim, n, NULL, NULL));
        t += n;
    }
    dsattn_v41_seq_destroy(s);
    return h;
}

/* A prompt's query heads, attention and output run a block of rows at a
 * time (dsattn_csa_prompt_block); with blocks of 2 and 3 rows the golden
 * cases' 7-token prompts cross block edges and the traces are still the
 * expected bits.  And a 64-token prompt of a larger random stack in blocks
 * of 5 against one block: the same bits in reference mode; in fast mode
 * within the stack's noise (a 5-row projection may sum in another order
 * than a 64-row one). */
DSATTN_TEST(v41, prompt_blocks_keep_the_bits)
{
    const size_t keep = dsattn_csa_prompt_block;
    static const size_t blocks[2] = { 2, 3 };
    for (int b = 0; b < 2; b++) {
        dsattn_csa_prompt_block = blocks[b];
        golden_exact("golden/v41/tiny-seed0", "expected_intended.safetensors", 0);
        golden_exact("golden/v41/tiny-seed2-fp8", "expected_bugcompat.safetensors", 1);
    }
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("blocks", 256, 16, 4, 4, "fp8"), 31, 1, err,
                                      sizeof err));
    if (!m) { dsattn_csa_prompt_block = keep; return; }
    const size_t T = 70, P = 64, dim = (size_t)dsattn_v41_dim(m);
    float *x = rand_input(T, dim, 31);
    for (int mi = 0; mi < 2; mi++) {
        dsattn_ctx *ctx = dsattn_test_ctx(mi ? DSATTN_MODE_REFERENCE : DSATTN_MODE_FAST, 2);
        if (!ctx) break;
        dsattn_csa_prompt_block = keep;
        float *whole = run_stack(ctx, m, x, T, P, DSATTN_V41_INDEX_K_OWNER);
        dsattn_csa_prompt_block = 5;
        float *split = run_stack(ctx, m, x, T, P, DSATTN_V41_INDEX_K_OWNER);
        if (mi) {
            CHECK_BITS("reference, blocks of 5", split, whole, T * dim);
        } else {
            /* fast mode: a projection of 5 rows may sum in another order
             * than one of 64 (docs/kernels.md; the ref table's BLAS path),
             * and the stack amplifies any difference through FP4 codes
             * (docs/semantics.md §9): the same bits on the avx512 / avx2
             * tables here, rel 0.13 on the ref table - so a loose bound */
            const double rel = dsattn_rel_l2(split, whole, T * dim);
            fprintf(stderr, "    fast, blocks of 5 against one block: rel %.3g\n", rel);
            CHECK_MSG(rel <= 0.3, "fast, blocks of 5: rel %.3g > 0.3", rel);
        }
        free(whole);
        free(split);
        dsattn_ctx_destroy(ctx);
    }
    dsattn_csa_prompt_block = keep;
    free(x);
    dsattn_v41_destroy(m);
}

/* A synthetic fill leaves the sequence ready for a decode step in either
 * index_k mode: layer 2 owns index keys at ratio 2, so at an even depth a
 * REFERENCE-mode step reads the slot an earlier token published. */
DSATTN_TEST(v41, decode_after_synthetic_fill_in_both_index_k_modes)
{
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("fill", 256, 5, 3, 4, "bf16"), 5, 0, err,
                                      sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ctx) { dsattn_v41_destroy(m); dsattn_ctx_destroy(ctx); return; }
    const size_t dim = (size_t)dsattn_v41_dim(m);
    float *h = rand_input(2, dim, 9);
    for (int mode = 0; mode < 2; mode++)
        for (int64_t depth = 6; depth <= 9; depth++) {
            dsattn_v41_seq *s = NULL;
            CHECK_OK(dsattn_v41_seq_create(&s, m, 16, mode ? DSATTN_V41_INDEX_K_REFERENCE
                                                           : DSATTN_V41_INDEX_K_OWNER));
            if (!s) continue;
            CHECK_OK(dsattn_v41_seq_fill_synthetic(s, depth, 3));
            float y[2][4096];
            memcpy(y[0], h, dim * sizeof(float));
            memcpy(y[1], h + dim, dim * sizeof(float));
            dsattn_status st = dsattn_v41_stack_forward(ctx, s, y[0], 1, NULL, NULL);
            CHECK_MSG(st == DSATTN_OK, "mode %d depth %lld: step 1 gave %d", mode,
                      (long long)depth, (int)st);
            st = dsattn_v41_stack_forward(ctx, s, y[1], 1, NULL, NULL);
            CHECK_MSG(st == DSATTN_OK, "mode %d depth %lld: step 2 gave %d", mode,
                      (long long)depth, (int)st);
            int fin = 1;
            for (size_t i = 0; i < dim; i++) fin &= isfinite(y[0][i]) && isfinite(y[1][i]);
            CHECK_MSG(fin, "mode %d depth %lld: non-finite output", mode, (long long)depth);
            CHECK_EQ_INT(dsattn_v41_seq_pos(s), depth + 2);
            dsattn_v41_seq_destroy(s);
        }
    free(h);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, prefill_then_decode_equals_all_decode_owner_seed3)
{
    /* Reference mode rounds every row the same way whatever the chunk, and
     * window rows are attended in position order either way, so in owner
     * mode the split point must not change a single bit. */
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("pd", 256, 5, 3, 4, "bf16"), 3, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ctx) return;
    const size_t T = 29, dim = 256;
    float *x = rand_input(T, dim, 3);
    float *a = run_stack(ctx, m, x, T, T, DSATTN_V41_INDEX_K_OWNER);
    float *b = run_stack(ctx, m, x, T, 1, DSATTN_V41_INDEX_K_OWNER);
    float *c = run_stack(ctx, m, x, T, 10, DSATTN_V41_INDEX_K_OWNER);
    CHECK_BITS("prefill all vs decode all", b, a, T * dim);
    CHECK_BITS("prefill 10 vs decode all", c, a, T * dim);
    /* the reference quirk breaks this on odd splits: make sure the switch
     * really changes something (else the test above proves nothing about it) */
    float *d = run_stack(ctx, m, x, T, 1, DSATTN_V41_INDEX_K_REFERENCE);
    CHECK_MSG(memcmp(d, a, T * dim * sizeof(float)) != 0, "index_k modes gave identical decode");
    free(x); free(a); free(b); free(c); free(d);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

/* A stack without compressed layers (every layer window-only) is a plan
 * the reference runs (Attention.forward skips the compressor and indexer
 * at ratio 0); its sequence needs no index scratch, and creating it must
 * not take that for a failed allocation.  Prefill length does not change a
 * bit in reference mode; a saved and reloaded sequence decodes on as the
 * original; fast mode stays close. */
DSATTN_TEST(v41, window_only_stack_runs_seed8)
{
    char err[256];
    char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_cfg_swa.json");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"dim\": 128, \"n_layers\": 2, \"n_heads\": 4, \"head_dim\": 64,"
               " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2,"
               " \"o_lora_rank\": 32, \"window_size\": 4, \"compress_ratios\": [0, 0],"
               " \"kv_source_layers\": [], \"index_source_layers\": [],"
               " \"candidate_source_layer\": -1, \"index_n_heads\": 8,"
               " \"index_head_dim\": 32, \"index_topk\": 5, \"rope_theta\": 10000.0,"
               " \"compress_rope_theta\": 160000.0, \"rope_factor\": 16,"
               " \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
               " \"norm_eps\": 1e-20, \"dtype\": \"bf16\"}\n");
    fclose(f);
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, path, 8, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    dsattn_ctx *fast = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    if (!m || !ctx || !fast) return;
    const size_t T = 13, dim = 128;
    float *x = rand_input(T, dim, 8);
    float *a = run_stack(ctx, m, x, T, T, DSATTN_V41_INDEX_K_OWNER);
    float *b = run_stack(ctx, m, x, T, 1, DSATTN_V41_INDEX_K_OWNER);
    float *c = run_stack(ctx, m, x, T, 6, DSATTN_V41_INDEX_K_REFERENCE);
    CHECK_BITS("prefill all vs decode all", b, a, T * dim);
    CHECK_BITS("prefill 6 vs decode all", c, a, T * dim);
    /* the window (4) wraps: the last token must differ from its input */
    CHECK(memcmp(a + (T - 1) * dim, x + (T - 1) * dim, dim * sizeof(float)) != 0);
    float *d = run_stack(fast, m, x, T, 5, DSATTN_V41_INDEX_K_OWNER);
    /* compared on what the layers added (the residual input dominates h) */
    float *ad = malloc(T * dim * sizeof(float)), *dd = malloc(T * dim * sizeof(float));
    for (size_t i = 0; i < T * dim; i++) ad[i] = a[i] - x[i], dd[i] = d[i] - x[i];
    const double rel = dsattn_rel_l2(dd, ad, T * dim);
    CHECK_MSG(rel <= 1e-2, "fast vs reference: rel %.3g", rel);
    free(ad);
    free(dd);
    /* session: save after 7 tokens, reload, decode the rest */
    float *h = malloc(T * dim * sizeof(float));
    memcpy(h, x, T * dim * sizeof(float));
    dsattn_v41_seq *s = NULL, *r = NULL;
    char sess[DSATTN_TEST_PATH];
    dsattn_test_tmp(sess, sizeof sess, "dsattn_swa.session");
    CHECK_OK(dsattn_v41_seq_create(&s, m, T, DSATTN_V41_INDEX_K_OWNER));
    if (s) CHECK_OK(dsattn_v41_stack_forward(ctx, s, h, 7, NULL, NULL));
    if (s) CHECK_OK(dsattn_v41_seq_save(s, sess, err, sizeof err));
    CHECK_OK(dsattn_v41_seq_load(&r, m, sess, 0, err, sizeof err));
    for (size_t t = 7; r && t < T; t++)
        CHECK_OK(dsattn_v41_stack_forward(ctx, r, h + t * dim, 1, NULL, NULL));
    if (r) CHECK_BITS("saved, reloaded, decoded", h, a, T * dim);
    unlink(sess);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_seq_destroy(r);
    free(x); free(a); free(b); free(c); free(d); free(h);
    dsattn_ctx_destroy(fast);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
    unlink(path);
}

/* The phase profile: off records nothing and changes no bit; on, every
 * phase a decode step passes through is timed, projections are a part of
 * their phase, the phases fit in the step, and a counter reset clears it. */
DSATTN_TEST(v41, phase_profile_seed13)
{
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("prof", 256, 5, 3, 4, "fp8"), 13, 1, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    if (!m || !ctx) return;
    const size_t T = 21, dim = 256;
    float *x = rand_input(T, dim, 13);
    float *a = run_stack(ctx, m, x, T, 1, DSATTN_V41_INDEX_K_OWNER);
    dsattn_profile p = dsattn_ctx_profile(ctx);
    for (int ph = 0; ph < DSATTN_PHASE_COUNT; ph++) CHECK(p.seconds[ph] == 0 && p.proj_seconds[ph] == 0);
    dsattn_ctx_set_profiling(ctx, 1);
    dsattn_ctx_counters_reset(ctx);
    const double t0 = dsattn_clock();
    float *b = run_stack(ctx, m, x, T, 1, DSATTN_V41_INDEX_K_OWNER);
    const double wall = dsattn_clock() - t0;
    CHECK_BITS("profiling changes nothing", b, a, T * dim);
    p = dsattn_ctx_profile(ctx);
    double sum = 0;
    for (int ph = 0; ph < DSATTN_PHASE_COUNT; ph++) {
        CHECK_MSG(p.proj_seconds[ph] <= p.seconds[ph] + 1e-6, "%s: projections %g > phase %g",
                  dsattn_phase_name((dsattn_phase)ph), p.proj_seconds[ph], p.seconds[ph]);
        CHECK_MSG(p.proj_flops[ph] <= p.flops[ph], "%s: projection FLOPs %llu > phase %llu",
                  dsattn_phase_name((dsattn_phase)ph), (unsigned long long)p.proj_flops[ph],
                  (unsigned long long)p.flops[ph]);
        sum += p.seconds[ph];
    }
    const dsattn_phase seen[] = { DSATTN_PHASE_QUERY, DSATTN_PHASE_KV, DSATTN_PHASE_COMPRESS,
                                  DSATTN_PHASE_INDEX, DSATTN_PHASE_ATTN, DSATTN_PHASE_OUTPUT };
    for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++)
        CHECK_MSG(p.seconds[seen[i]] > 0 && p.bytes_read[seen[i]] > 0, "phase %s not timed",
                  dsattn_phase_name(seen[i]));
    CHECK(p.proj_seconds[DSATTN_PHASE_QUERY] > 0 && p.proj_seconds[DSATTN_PHASE_ATTN] == 0);
    CHECK(p.proj_flops[DSATTN_PHASE_QUERY] > 0 && p.proj_flops[DSATTN_PHASE_ATTN] == 0);
    CHECK(sum <= wall);
    dsattn_ctx_counters_reset(ctx);
    p = dsattn_ctx_profile(ctx);
    CHECK(p.seconds[DSATTN_PHASE_QUERY] == 0);
    CHECK(strcmp(dsattn_phase_name(DSATTN_PHASE_ATTN), "attention") == 0 &&
          strcmp(dsattn_phase_name(DSATTN_PHASE_COUNT), "?") == 0);
    free(x); free(a); free(b);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, causal_future_token_changes_nothing_before_seed4)
{
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("causal", 256, 5, 3, 4, "fp8"), 4, 1, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ctx) return;
    const size_t T = 24, dim = 256;
    float *x = rand_input(T, dim, 4);
    float *a = run_stack(ctx, m, x, T, T, DSATTN_V41_INDEX_K_OWNER);
    x[20 * dim + 7] += 3.0f;
    float *b = run_stack(ctx, m, x, T, T, DSATTN_V41_INDEX_K_OWNER);
    CHECK_BITS("rows before the change", b, a, 20 * dim);
    CHECK_MSG(memcmp(b + 20 * dim, a + 20 * dim, dim * sizeof(float)) != 0, "row 20 unchanged");
    free(x); free(a); free(b);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, forced_dense_selects_every_visible_entry_seed5)
{
    /* index_topk >= T and a pool covering everything: every row selects
     * exactly the visible entries 0..cl-1, in every index source. */
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("dense", 256, 64, 64, 4, "bf16"), 5, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    if (!m || !ctx) return;
    const size_t T = 27, P = 11, dim = 256;
    float *h = rand_input(T, dim, 5);
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, T, DSATTN_V41_INDEX_K_OWNER));
    for (size_t t = 0; s && t < T;) {
        size_t n = t == 0 ? P : 1;
        CHECK_OK(dsattn_v41_stack_forward(ctx, s, h + t * dim, n, NULL, NULL));
        for (int l = 0; l < 12; l++) {
            const int32_t *rows;
            size_t nr, w;
            if (dsattn_v41_seq_selection(s, l, &rows, &nr, &w)) continue;
            size_t ratio = (size_t)dsattn_v41_layer_ratio(m, l);
            for (size_t r = 0; r < nr; r++) {
                size_t cl = (t + r + 1) / ratio;
                for (size_t i = 0; i < w; i++) {
                    int32_t want = i < cl ? (int32_t)i : -1;
                    if (rows[r * w + i] != want) {
                        CHECK_MSG(0, "layer %d token %zu slot %zu: %d want %d", l, t + r, i,
                                  rows[r * w + i], want);
                        break;
                    }
                }
            }
        }
        t += n;
    }
    dsattn_v41_seq_destroy(s);
    free(h);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, reuse_layers_read_their_sources_seed6)
{
    /* Plan: 2 Full(m2) -> 3 Reuse; 4 Full(m2) -> 5 Reuse; 6 Full(m1, cand)
     * -> 7 Reuse; 8 Reindex -> 9 Reuse; 10 Reindex -> 11 Reuse. */
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("reuse", 256, 5, 3, 4, "bf16"), 6, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    if (!m || !ctx) return;
    static const int want_mode[12] = { 0, 0, 1, 3, 1, 3, 1, 3, 2, 3, 2, 3 };
    static const int want_src[12] = { -1, -1, 2, 2, 4, 4, 6, 6, 6, 6, 6, 6 };
    static const int want_idx[12] = { -1, -1, 2, 2, 4, 4, 6, 6, 6, 6, 6, 6 };
    for (int l = 0; l < 12; l++) CHECK_EQ_INT(dsattn_v41_layer_mode(m, l), want_mode[l]);
    const size_t T = 20, dim = 256;
    float *x = rand_input(T, dim, 6);
    float *h = run_stack(ctx, m, x, T, 12, DSATTN_V41_INDEX_K_OWNER);
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, T, DSATTN_V41_INDEX_K_OWNER));
    float *hh = malloc(T * dim * sizeof(float));
    memcpy(hh, x, T * dim * sizeof(float));
    CHECK_OK(dsattn_v41_stack_forward(ctx, s, hh, 12, NULL, NULL));
    for (int l = 0; l < 12; l++) {
        CHECK_MSG(dsattn_v41_seq_source_read(s, l) == want_src[l], "layer %d read KV of %d", l,
                  dsattn_v41_seq_source_read(s, l));
        int ir = dsattn_v41_seq_index_read(s, l);
        static const int want_topk[12] = { -1, -1, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10 };
        CHECK_MSG(dsattn_v41_seq_topk_read(s, l) == want_topk[l], "layer %d took top-k of %d", l,
                  dsattn_v41_seq_topk_read(s, l));
        if (l == 2 || l == 4 || l == 6 || l == 8 || l == 10)
            CHECK_MSG(ir == want_idx[l], "layer %d scored index keys of %d", l, ir);
    }
    /* Behaviour, not bookkeeping: with the same input rows, corrupting
     * layer 2's compressed cache changes Reuse layer 3 and leaves layer 5
     * (which reads layer 4) bit-identical. */
    float *xin = rand_input(1, dim, 66), *o3 = malloc(dim * 4), *o5 = malloc(dim * 4);
    float *o3b = malloc(dim * 4), *o5b = malloc(dim * 4);
    for (int l = 0; l < 12; l++) CHECK_OK(dsattn_v41_attn_forward(ctx, s, l, xin, 1, l == 3 ? o3 : (l == 5 ? o5 : hh)));
    /* redo the step at the same position with layer 2's entries flipped */
    dsattn_v41_seq *s2 = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s2, m, T, DSATTN_V41_INDEX_K_OWNER));
    memcpy(hh, x, T * dim * sizeof(float));
    CHECK_OK(dsattn_v41_stack_forward(ctx, s2, hh, 12, NULL, NULL));
    for (size_t i = 0; i < 6 * dsattn_v41_ckv_bytes(&m->cfg); i++) s2->layer[2].ckv[i] ^= 0x11;
    for (int l = 0; l < 12; l++) {
        float *dst = l == 3 ? o3b : (l == 5 ? o5b : hh);
        if (l == 2) {
            /* layer 2 itself rewrites nothing at this odd position (group of 2
             * not complete at pos 12? pos 12 completes no group), so its
             * corrupted entries stay in place for layer 3 */
        }
        CHECK_OK(dsattn_v41_attn_forward(ctx, s2, l, xin, 1, dst));
    }
    CHECK_MSG(memcmp(o3, o3b, dim * 4) != 0, "Reuse layer 3 ignored its source's cache");
    CHECK_BITS("layer 5 (reads layer 4)", o5b, o5, dim);
    free(x); free(h); free(hh); free(xin); free(o3); free(o5); free(o3b); free(o5b);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_seq_destroy(s2);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, reindex_picks_lie_inside_the_pool_seed7)
{
    /* a small pool (2 blocks of 2) and top-3: Reindex picks must come from
     * the candidate source's pool of the same row */
    char err[256];
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, write_cfg("pool", 256, 3, 2, 2, "bf16"), 7, 0, err, sizeof err));
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    if (!m || !ctx) return;
    const size_t T = 30, dim = 256;
    float *h = rand_input(T, dim, 7);
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, T, DSATTN_V41_INDEX_K_OWNER));
    size_t checked = 0;
    for (size_t t = 0; s && t < T;) {
        size_t n = t == 0 ? 9 : 1;
        CHECK_OK(dsattn_v41_stack_forward(ctx, s, h + t * dim, n, NULL, NULL));
        for (int l = 8; l <= 10; l += 2) {
            const int32_t *rows;
            size_t nr, w;
            CHECK_OK(dsattn_v41_seq_selection(s, l, &rows, &nr, &w));
            for (size_t r = 0; r < nr; r++) {
                const int32_t *pool = s->rt.cand + r * s->rt.cand_stride;
                size_t np = s->rt.cand_n[r], cl = t + r + 1;
                size_t in_pool_visible = 0;
                for (size_t i = 0; i < np; i++) in_pool_visible += (size_t)pool[i] < cl;
                for (size_t i = 0; i < w; i++) {
                    int32_t j = rows[r * w + i];
                    if (j < 0) continue;
                    int found = 0;
                    for (size_t k = 0; k < np; k++) found |= pool[k] == j;
                    /* the reference keeps -inf picks outside the pool only
                     * when the pool holds fewer visible entries than top-k */
                    if (in_pool_visible >= w)
                        CHECK_MSG(found, "layer %d token %zu picked %d outside the pool", l, t + r, j);
                    checked++;
                }
            }
        }
        t += n;
    }
    CHECK(checked > 50);
    dsattn_v41_seq_destroy(s);
    free(h);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, all_invalid_row_gives_exact_zero)
{
    for (int mode = 0; mode < 2; mode++) {
        dsattn_ctx *ctx = dsattn_test_ctx(mode ? DSATTN_MODE_REFERENCE : DSATTN_MODE_FAST, 0);
        float kv[4 * 64], q[2 * 64], out[2 * 64], sink[2] = { 0.5f, 80.0f };
        for (int i = 0; i < 4 * 64; i++) kv[i] = (float)(i % 7) - 3.0f;
        for (int i = 0; i < 2 * 64; i++) q[i] = 1.0f;
        int32_t idx[70];
        for (int i = 0; i < 70; i++) idx[i] = -1;
        dsattn_kv_src src = { DSATTN_KV_F32, kv, 64 * 4, 4, 64, 0 };
        float *ws = malloc(dsattn_sparse_attn_scratch(2, 64) * sizeof(float));
        memset(out, 0x7f, sizeof out);
        dsattn_sparse_attn(ctx, q, 2, 64, &src, NULL, idx, 70, sink, 0.125f, -1e30f, out, ws);
        for (int i = 0; i < 128; i++)
            if (out[i] != 0.0f) { CHECK_MSG(0, "mode %d out[%d] = %g", mode, i, (double)out[i]); break; }
        /* and a sink does not leak into a row that has entries: the sink only
         * grows the denominator, the output stays a convex mix scaled < 1 */
        idx[0] = 1;
        dsattn_sparse_attn(ctx, q, 2, 64, &src, NULL, idx, 70, sink, 0.125f, -1e30f, out, ws);
        CHECK(fabsf(out[0]) <= fabsf(kv[64]) + 1e-6f);
        free(ws);
        dsattn_ctx_destroy(ctx);
    }
}

DSATTN_TEST(v41, kv_bill_is_890_bytes_at_real_size)
{
    char err[512];
    dsattn_v41 *m = NULL;
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/../../configs/deepseek-v4.1-flash.json", dsattn_test_data(""));
    CHECK_OK(dsattn_v41_load_config(&m, cfg, err, sizeof err));
    if (!m) { CHECK_MSG(0, "%s", err); return; }
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, 8192, DSATTN_V41_INDEX_K_OWNER));
    dsattn_kv_bill b;
    CHECK_OK(dsattn_v41_seq_kv_bill(s, &b));
    CHECK_MSG(b.global_bytes_per_token == 890.0, "global %.3f B/token", b.global_bytes_per_token);
    CHECK_EQ_INT(b.window_bytes, 40 * 128 * 528);
    CHECK_EQ_INT(b.state_bytes, 3 * 2 * 2 * 512 * 4);
    /* plan of the released model */
    int full = 0, reindex = 0, reuse = 0, swa = 0;
    for (int l = 0; l < 40; l++) {
        dsattn_v41_mode md = dsattn_v41_layer_mode(m, l);
        full += md == DSATTN_V41_FULL; reindex += md == DSATTN_V41_REINDEX;
        reuse += md == DSATTN_V41_REUSE; swa += md == DSATTN_V41_SWA;
    }
    CHECK_EQ_INT(full, 4); CHECK_EQ_INT(reindex, 4); CHECK_EQ_INT(reuse, 30); CHECK_EQ_INT(swa, 2);
    CHECK_EQ_INT(dsattn_v41_layer_mode(m, 20), DSATTN_V41_FULL);
    CHECK_EQ_INT(dsattn_v41_layer_ratio(m, 20), 1);
    CHECK_EQ_INT(dsattn_v41_layer_mode(m, 24), DSATTN_V41_REINDEX);
    /* a config-only model refuses to run */
    float x[5120] = { 0 }, y[5120];
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 0);
    CHECK_EQ_INT(dsattn_v41_attn_forward(ctx, s, 0, x, 1, y), DSATTN_ERR_UNSUPPORTED);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
}

static void bad_cfg(const char *json, dsattn_status want, const char *needle)
{
    char path[DSATTN_TEST_PATH], err[512] = "";
    dsattn_test_tmp(path, sizeof path, "dsattn_badcfg.json");
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_load_config(&m, path, err, sizeof err);
    CHECK_MSG(st == want, "status %d want %d (%s)", st, want, err);
    CHECK_MSG(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    CHECK(m == NULL);
    dsattn_v41_destroy(m);
    unlink(path);
}

#define TINY_KEYS "\"dim\": 256, \"n_layers\": 4, \"n_heads\": 4, \"head_dim\": 64," \
    " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 64," \
    " \"window_size\": 8, \"index_n_heads\": 8, \"index_head_dim\": 32, \"index_topk\": 5," \
    " \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0, \"rope_factor\": 16," \
    " \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1, \"norm_eps\": 1e-20," \
    " \"candidate_source_layer\": -1, \"candidate_topk_blocks\": 1, \"candidate_block_size\": 1"

/* The index_k quirk's reach.  In REFERENCE mode an index source whose keys
 * are not published this step scores the last published ones over its own
 * count of entries.  In this plan layer 1 (ratio 2) reads, on some steps,
 * layer 8's (ratio 4) keys, which are fewer: the official code reads the
 * rest of layer 8's buffer, rows no token wrote (zeros in a fresh process),
 * and dsattn scores them 0 without reading them (docs/semantics.md §7.7).
 * Found by `dsattn soak --shapes random`, where the scorer read past the
 * keys: a clone then parted from its original.  Here every byte of layer
 * 8's key buffer past the keys it holds is overwritten before each step:
 * the outputs keep their bits, in both arithmetic modes. */
DSATTN_TEST(v41, stale_index_keys_of_a_coarser_owner_read_no_unwritten_row_seed31)
{
    char path[DSATTN_TEST_PATH], err[512] = "";
    dsattn_test_tmp(path, sizeof path, "dsattn_stale_plan.json");
    FILE *f = fopen(path, "w");
    if (!f) { CHECK(0); return; }
    fputs("{\"dim\": 64, \"n_layers\": 10, \"n_heads\": 2, \"head_dim\": 32,"
          " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 1, \"o_lora_rank\": 64,"
          " \"window_size\": 5, \"index_n_heads\": 5, \"index_head_dim\": 32,"
          " \"index_topk\": 4, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
          " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
          " \"beta_slow\": 1, \"norm_eps\": 1e-6, \"candidate_source_layer\": 8,"
          " \"candidate_topk_blocks\": 2, \"candidate_block_size\": 2, \"dtype\": \"fp8\","
          " \"compress_ratios\": [0, 2, 1, 1, 1, 0, 1, 2, 4, 0],"
          " \"kv_source_layers\": [1, 2, 3, 7, 8], \"index_source_layers\": [1, 2, 3, 7, 8]}\n", f);
    fclose(f);
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, path, 31, 1, err, sizeof err));
    unlink(path);
    if (!m) return;
    const size_t dim = (size_t)dsattn_v41_dim(m), T = 48, P = 9;
    const size_t kb = dsattn_v41_kidx_bytes(&m->cfg);
    float *x = rand_input(T, dim, 31), *h[2];
    for (int mode = 0; mode < 2; mode++) {
        dsattn_ctx *ctx = dsattn_test_ctx(mode ? DSATTN_MODE_FAST : DSATTN_MODE_REFERENCE, 0);
        int stale = 0;
        for (int dirty = 0; dirty < 2; dirty++) {
            h[dirty] = malloc(T * dim * sizeof(float));
            memcpy(h[dirty], x, T * dim * sizeof(float));
            dsattn_v41_seq *s = NULL;
            CHECK_OK(dsattn_v41_seq_create(&s, m, T, DSATTN_V41_INDEX_K_REFERENCE));
            for (size_t t = 0; s && t < T;) {
                const size_t n = t == 0 ? P : 1, held = t / 4;
                if (dirty) memset(s->layer[8].kidx + held * kb, 0x5a, (s->layer[8].cap - held) * kb);
                CHECK_OK(dsattn_v41_stack_forward(ctx, s, h[dirty] + t * dim, n, NULL, NULL));
                /* layer 1 scored layer 8's keys over more entries than it holds */
                stale += t > 0 && dsattn_v41_seq_index_read(s, 1) == 8 && (t + 1) / 2 > held;
                t += n;
            }
            dsattn_v41_seq_destroy(s);
        }
        CHECK_MSG(stale >= 4, "mode %d: layer 1 read layer 8's keys short on %d steps", mode,
                  stale);
        CHECK_MSG(!memcmp(h[0], h[1], T * dim * sizeof(float)),
                  "mode %d: the bytes past layer 8's keys changed the outputs", mode);
        free(h[0]);
        free(h[1]);
        dsattn_ctx_destroy(ctx);
    }
    free(x);
    dsattn_v41_destroy(m);
}

DSATTN_TEST(v41, bad_configs_are_errors_not_defaults)
{
    bad_cfg("{" TINY_KEYS ", \"compress_ratios\": [0,2,2,2], \"kv_source_layers\": [0],"
            " \"index_source_layers\": [0]}", DSATTN_ERR_FORMAT, "ratio 0");
    bad_cfg("{" TINY_KEYS ", \"compress_ratios\": [0,2,2], \"kv_source_layers\": [1],"
            " \"index_source_layers\": [1]}", DSATTN_ERR_FORMAT, "compress_ratios");
    bad_cfg("{" TINY_KEYS ", \"compress_ratios\": [0,2,2,2], \"kv_source_layers\": [2],"
            " \"index_source_layers\": [2]}", DSATTN_ERR_FORMAT, "no kv source layer");
    bad_cfg("{" TINY_KEYS ", \"compress_ratios\": [0,2,2,2], \"kv_source_layers\": [1],"
            " \"index_source_layers\": [1], \"n_mtp_layers\": 3}", DSATTN_ERR_FORMAT, "MTP");
    /* a ratio-2 owner after a ratio-1 candidate source: the pool mask does
     * not fit its scores (the reference fails on the shapes) */
    bad_cfg("{\"candidate_source_layer\": 1, \"candidate_topk_blocks\": 2,"
            " \"candidate_block_size\": 4, " TINY_KEYS ", \"compress_ratios\": [0,1,1,2],"
            " \"kv_source_layers\": [1,3], \"index_source_layers\": [1,3]}",
            DSATTN_ERR_FORMAT, "candidate pool of layer 1");
    bad_cfg("{\"model_type\": \"deepseek_v41\", \"dim\": 256}", DSATTN_ERR_NOT_FOUND, "missing");
    bad_cfg("{\"dim\": 256}", DSATTN_ERR_UNSUPPORTED, "generation");
    bad_cfg("{" TINY_KEYS ", \"compress_ratios\": [0,2,2,2], \"kv_source_layers\": [9],"
            " \"index_source_layers\": [1]}", DSATTN_ERR_FORMAT, "outside layers");
    bad_cfg("not json", DSATTN_ERR_FORMAT, "");
    /* the limits V4.1 shares with V4 (csa_config.c); the first of a
     * repeated key is the one read */
    bad_cfg("{\"n_heads\": 1024, " TINY_KEYS ", \"compress_ratios\": [0,2,2,2],"
            " \"kv_source_layers\": [1], \"index_source_layers\": [1]}", DSATTN_ERR_FORMAT,
            "n_heads 1024 must be positive and at most 512");
    bad_cfg("{\"index_n_heads\": 512, " TINY_KEYS ", \"compress_ratios\": [0,2,2,2],"
            " \"kv_source_layers\": [1], \"index_source_layers\": [1]}", DSATTN_ERR_FORMAT,
            "index_n_heads 512 must be positive and at most 256");
}

/* ==== Checkpoints written by make-weights =============================== */

#include "checkpoint.h"
#include "config.h"

static float *run_ckpt(const char *dir, const float *x, size_t T, size_t P)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_load(&m, NULL, dir, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", dir, err);
    if (st) return NULL;
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    float *h = run_stack(ctx, m, x, T, P, DSATTN_V41_INDEX_K_OWNER);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
    return h;
}

DSATTN_TEST(v41, make_weights_single_vs_sharded_vs_hf_names_seed12)
{
    /* The same seeded weights written as one file, as 3 shards with an
     * index, and with HF names, for bf16 and FP8 32x32: every load runs to
     * the same bits. */
    const char *cfg = write_cfg("mw", 256, 5, 3, 4, "fp8");
    dsattn_model_config mc;
    char err[512] = "";
    CHECK_OK(dsattn_config_load(&mc, cfg, err, sizeof err));
    const size_t T = 14, dim = 256;
    float *x = rand_input(T, dim, 12);
    for (int fmt = 0; fmt < 2; fmt++) {
        float *first = NULL;
        for (int v = 0; v < 3; v++) {
            char dir[DSATTN_TEST_PATH];
            dsattn_test_tmp(dir, sizeof dir, "dsattn_mw_%d_%d", fmt, v);
            dsattn_mw_params p = { 12, fmt ? DSATTN_MW_FP8 : DSATTN_MW_BF16,
                                   v == 2 ? DSATTN_MW_NAMES_HF : DSATTN_MW_NAMES_INFERENCE,
                                   v == 1 ? 3 : 1, cfg };
            dsattn_status st = dsattn_make_weights(&mc, &p, dir, err, sizeof err);
            CHECK_MSG(st == DSATTN_OK, "make_weights: %s", err);
            if (st) continue;
            float *h = run_ckpt(dir, x, T, 6);
            if (!h) continue;
            if (!first) first = h;
            else { CHECK_BITS(v == 1 ? "sharded" : "hf names", h, first, T * dim); free(h); }
            char cmd[DSATTN_TEST_PATH + 32];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
            CHECK(system(cmd) == 0);
        }
        free(first);
    }
    free(x);
}

/* ==== Fast vs reference on a larger, better-conditioned case ============ */

static const char *write_big_cfg(void)
{
    static char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_cfg_big.json");
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f,
            "{\"dim\": 1024, \"n_layers\": 6, \"n_heads\": 16, \"head_dim\": 128,"
            " \"rope_head_dim\": 32, \"q_lora_rank\": 256, \"o_groups\": 4, \"o_lora_rank\": 128,"
            " \"window_size\": 32, \"compress_ratios\": [0,2,2,1,1,1],"
            " \"kv_source_layers\": [1,3], \"index_source_layers\": [1,3,4],"
            " \"candidate_source_layer\": 3, \"candidate_topk_blocks\": 16,"
            " \"candidate_block_size\": 4, \"index_n_heads\": 16, \"index_head_dim\": 64,"
            " \"index_topk\": 32, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
            " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
            " \"beta_slow\": 1, \"norm_eps\": 1e-20, \"dtype\": \"fp8\"}\n");
    fclose(f);
    return path;
}

/* Fast against reference under teacher forcing (the gates are described at
 * the test below): T tokens, a prefill of P, then decode.  With nb > 1 the
 * fast side is nb twin sequences decoded together by the batched forward
 * (each gets the reference's input of the layer and step), so the gates
 * hold for the batched projections (gemv_fp8_m) and the batched
 * attention too; every twin's output is gated, the first twin's
 * selection. */
static void fast_vs_reference_nb(const char *cfg, uint64_t seed, int fp8, size_t T, size_t P,
                                 size_t min_union, size_t nb)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, cfg, seed, fp8, err, sizeof err));
    if (!m) { CHECK_MSG(0, "%s", err); return; }
    enum { NB_MAX = 8 };
    if (nb < 1 || nb > NB_MAX) { CHECK(0); dsattn_v41_destroy(m); return; }
    const size_t dim = (size_t)dsattn_v41_dim(m), L = (size_t)dsattn_v41_n_layers(m);
    float *h = rand_input(T, dim, seed);
    float *ain = malloc(L * P * dim * sizeof(float)), *aout = malloc(L * P * dim * sizeof(float));
    float *o = malloc(P * nb * dim * sizeof(float)), *xb = malloc(nb * dim * sizeof(float));
    double inter = 0, uni = 0, worst_rel = 0, worst_cos = 1, dd = 0, ww = 0;
    dsattn_v41_seq *s0 = NULL, *f[NB_MAX] = { NULL };
    dsattn_ctx *ctx[2] = { dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0), dsattn_test_ctx(DSATTN_MODE_FAST, 0) };
    CHECK_OK(dsattn_v41_seq_create(&s0, m, T, DSATTN_V41_INDEX_K_OWNER));
    for (size_t b = 0; b < nb; b++) CHECK_OK(dsattn_v41_seq_create(&f[b], m, T, DSATTN_V41_INDEX_K_OWNER));
    for (size_t t = 0; t < T && s0 && f[nb - 1];) {
        size_t n = t == 0 ? P : 1;
        CHECK_OK(dsattn_v41_stack_forward(ctx[0], s0, h + t * dim, n, ain, aout));
        for (size_t l = 0; l < L; l++) {
            const float *want = aout + l * n * dim;
            if (nb > 1 && n == 1) {
                size_t failed = 0;
                for (size_t b = 0; b < nb; b++) memcpy(xb + b * dim, ain + l * dim, dim * sizeof(float));
                CHECK_OK(dsattn_v41_attn_forward_batch(ctx[1], f, nb, (int)l, xb, o, &failed));
            } else {
                for (size_t b = 0; b < nb; b++)
                    CHECK_OK(dsattn_v41_attn_forward(ctx[1], f[b], (int)l, ain + l * n * dim, n,
                                                     o + b * n * dim));
            }
            for (size_t b = 0; b < nb; b++) {
                const float *got = o + b * n * dim;
                for (size_t i = 0; i < n * dim; i++) {
                    double e = (double)got[i] - want[i];
                    dd += e * e;
                    ww += (double)want[i] * want[i];
                }
                worst_rel = fmax(worst_rel, dsattn_rel_l2(got, want, n * dim));
                worst_cos = fmin(worst_cos, dsattn_cosine(got, want, n * dim));
            }
            const int32_t *ra, *rb;
            size_t na, nbs, wa, wb;
            if (dsattn_v41_seq_selection(s0, (int)l, &ra, &na, &wa)) continue;
            CHECK_OK(dsattn_v41_seq_selection(f[0], (int)l, &rb, &nbs, &wb));
            for (size_t r = 0; r < na && r < nbs; r++) {
                size_t sa = 0, sb = 0, both = 0;
                for (size_t j = 0; j < wb; j++) sb += rb[r * wb + j] >= 0;
                for (size_t i = 0; i < wa; i++) {
                    if (ra[r * wa + i] < 0) continue;
                    sa++;
                    for (size_t j = 0; j < wb; j++) both += rb[r * wb + j] == ra[r * wa + i];
                }
                inter += (double)both;
                uni += (double)(sa + sb - both);
            }
        }
        for (size_t b = 0; b < nb; b++) CHECK_OK(dsattn_v41_seq_advance(f[b], n));
        t += n;
    }
    double jac = uni > 0 ? inter / uni : 1.0;
    /* relative error over every layer and step (one layer-step alone can
     * reach ~1.1e-2 where a bf16 rounding flips a whole FP4 code) */
    const double rel_all = sqrt(dd / ww);
    CHECK_MSG(rel_all <= 1e-2, "fast vs reference: attn_out rel %.4g > 1e-2", rel_all);
    CHECK_MSG(worst_rel <= 3e-2, "fast vs reference: one layer-step at rel %.4g > 3e-2", worst_rel);
    CHECK_MSG(worst_cos >= 0.9999, "fast vs reference: cosine %.6f < 0.9999", worst_cos);
    CHECK_MSG(jac >= 0.98, "fast vs reference: top-k Jaccard %.4f < 0.98", jac);
    CHECK(uni > (double)min_union);
    fprintf(stderr, "    fast%s vs reference, per layer: rel %.3g (worst layer-step %.3g), worst "
            "cosine %.7f, Jaccard %.4f\n", nb > 1 ? " batched" : "", rel_all, worst_rel, worst_cos,
            jac);
    dsattn_v41_seq_destroy(s0);
    for (size_t b = 0; b < nb; b++) dsattn_v41_seq_destroy(f[b]);
    for (int k = 0; k < 2; k++) dsattn_ctx_destroy(ctx[k]);
    free(h); free(ain); free(aout); free(o); free(xb);
    dsattn_v41_destroy(m);
}

static void fast_vs_reference(const char *cfg, uint64_t seed, int fp8, size_t T, size_t P,
                              size_t min_union)
{
    fast_vs_reference_nb(cfg, seed, fp8, T, P, min_union, 1);
}

DSATTN_TEST(v41, fast_vs_reference_statistical_gates_seed21)
{
    /* The statistical tier of tests/data/golden/README.md on a case larger
     * than the tiny ones.  The stack is numerically chaotic (a 4e-4 input
     * difference becomes 1e-2 after one compressed layer through FP4 codes
     * and bf16 top-k), so the gate is
     * taken per layer under teacher forcing: every fast layer gets the
     * reference's input for that layer and step, with its own caches.
     * Gates: attn_out relative error <= 1e-2 over all layers and steps,
     * cosine >= 0.9999 for every layer-step, top-k Jaccard >= 0.98 over
     * every index source and row. */
    fast_vs_reference(write_big_cfg(), 21, 1, 96, 64, 1000);
}

/* The same gates with the decode steps batched over four twins: the
 * batched step stays within the fast path's bounds against the
 * reference.  These gates are tight for the projections: FP8 act_quant and
 * the FP4 KV codes turn a 3e-4 relative error of each projection (what
 * fp16 products give) into 2.5e-2 over the stack. */
DSATTN_TEST(v41, fast_batched_vs_reference_statistical_gates_seed21)
{
    fast_vs_reference_nb(write_big_cfg(), 21, 1, 96, 64, 1000, 4);
}

/* ==== Shapes the reference accepts ====================================== */

/* o_groups 3, o_lora_rank 48 (G*R = 144), q_lora_rank 80, 5 index heads,
 * 6 heads: shapes no fast kernel tiles evenly; only head_dim and
 * index_head_dim, which the reference quantizes, are multiples of 32.  bf16
 * Linears are F.linear in the reference, so this
 * runs there; dsattn runs it in both modes (fast paths fall back where a
 * shape is not theirs). */
static const char *write_odd_cfg(const char *dtype)
{
    static char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_cfg_odd_%s.json", dtype);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f,
            "{\"dim\": 160, \"n_layers\": 6, \"n_heads\": 6, \"head_dim\": 64,"
            " \"rope_head_dim\": 16, \"q_lora_rank\": 80, \"o_groups\": 3, \"o_lora_rank\": 48,"
            " \"window_size\": 16, \"compress_ratios\": [0,2,2,1,1,1],"
            " \"kv_source_layers\": [1,3], \"index_source_layers\": [1,3,4],"
            " \"candidate_source_layer\": 3, \"candidate_topk_blocks\": 8,"
            " \"candidate_block_size\": 4, \"index_n_heads\": 5, \"index_head_dim\": 32,"
            " \"index_topk\": 16, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
            " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
            " \"beta_slow\": 1, \"norm_eps\": 1e-20, \"dtype\": \"%s\"}\n", dtype);
    fclose(f);
    return path;
}

DSATTN_TEST(v41, odd_shapes_bf16_run_fast_within_reference_seed22)
{
    /* the same gates as fast_vs_reference_statistical_gates_seed21 */
    fast_vs_reference(write_odd_cfg("bf16"), 22, 0, 72, 40, 300);
}

DSATTN_TEST(v41, odd_shapes_fp8_name_the_block_they_miss)
{
    /* FP8 weights quantize their input in blocks of 32: the same shapes are
     * refused, and the message says which dim and which block */
    char err[512] = "";
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_create_random(&m, write_odd_cfg("bf16"), 1, 1, err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_FORMAT && strstr(err, "q_lora_rank 80 is not a multiple of "
                                                     "the FP8 activation block 32"), "%d: %s", st, err);
    CHECK(m == NULL);
    st = dsattn_v41_load_config(&m, write_odd_cfg("fp8"), err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_FORMAT && strstr(err, "FP8 activation block 32"), "%d: %s", st, err);
    CHECK(m == NULL);
    /* head_dim stays a multiple of the window KV's FP8 block in any dtype */
    bad_cfg("{\"dim\": 256, \"n_layers\": 4, \"n_heads\": 4, \"head_dim\": 48,"
            " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 64,"
            " \"window_size\": 8, \"index_n_heads\": 8, \"index_head_dim\": 32, \"index_topk\": 5,"
            " \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0, \"rope_factor\": 16,"
            " \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
            " \"norm_eps\": 1e-20, \"candidate_source_layer\": -1, \"compress_ratios\": [0,2,2,2],"
            " \"kv_source_layers\": [1], \"index_source_layers\": [1]}", DSATTN_ERR_FORMAT,
            "head_dim 48 is not a positive multiple of 32");
}
