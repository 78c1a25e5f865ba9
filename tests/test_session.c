/* test_session.c - sessions: save -> load -> decode equals the uninterrupted
 * run bit for bit (outputs, every top-k, every state byte) for every
 * generation in reference and fast mode, with the position mid compressor
 * group and at a boundary, both V4.1 index_k modes, a larger capacity on
 * load; clone -> two continuations; every flipped byte and every truncation
 * refused; wrong generation / model / shapes / sizes / a huge length field
 * refused with the file and section named; a saver killed with SIGKILL at
 * random moments always leaves a file that loads as one of its states.
 *
 * "Every state byte" is checked by saving both final sequences and
 * comparing the files, and (independently of the session code) through the
 * public cache accessors of V4.1.
 */
#include "harness.h"

#include "internal.h"
#include "numfmt.h"
#include "ops.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* ==== A generation behind one table ==================================== */

typedef struct {
    const char *name;
    int dim, n_layers;
    void *(*model)(void);
    void (*model_free)(void *m);
    void *(*seq_new)(void *m, size_t cap, int variant);
    void (*seq_free)(void *s);
    dsattn_status (*step)(dsattn_ctx *ctx, void *s, float *h, size_t n);
    dsattn_status (*save)(void *s, const char *path, char *err, size_t errlen);
    dsattn_status (*load)(void **s, void *m, const char *path, size_t cap, char *err, size_t el);
    dsattn_status (*clone)(void **out, void *s);
    /* the last chunk's selection of layer l: rows (or NULL if none) */
    const int32_t *(*sel)(void *s, int l, size_t *n);
} gen;

static char *golden(const char *g, const char *file)
{
    static char p[4][1200];
    static int k;
    char *o = p[k++ & 3];
    snprintf(o, sizeof p[0], "%s/%s", dsattn_test_data(g), file);
    return o;
}

/* V4.1 */
static const char *v41_case = "golden/v41/tiny-seed0";
static void *v41_model(void)
{
    char err[512] = "";
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_load(&m, golden(v41_case, "config.json"),
                                       golden(v41_case, "weights.safetensors"), err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "v41 load: %s", err);
    return m;
}
static void v41_model_free(void *m) { dsattn_v41_destroy(m); }
static void *v41_seq_new(void *m, size_t cap, int v)
{
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, cap, (dsattn_v41_index_k)v));
    return s;
}
static void v41_seq_free(void *s) { dsattn_v41_seq_destroy(s); }
static dsattn_status v41_step(dsattn_ctx *c, void *s, float *h, size_t n)
{
    return dsattn_v41_stack_forward(c, s, h, n, NULL, NULL);
}
static dsattn_status v41_save(void *s, const char *p, char *e, size_t el)
{
    return dsattn_v41_seq_save(s, p, e, el);
}
static dsattn_status v41_load(void **s, void *m, const char *p, size_t cap, char *e, size_t el)
{
    return dsattn_v41_seq_load((dsattn_v41_seq **)s, m, p, cap, e, el);
}
static dsattn_status v41_clone(void **o, void *s) { return dsattn_v41_seq_clone((dsattn_v41_seq **)o, s); }
static const int32_t *v41_sel(void *s, int l, size_t *n)
{
    const int32_t *r;
    size_t nr, w;
    if (dsattn_v41_seq_selection(s, l, &r, &nr, &w)) return NULL;
    *n = nr * w;
    return r;
}
static const gen V41 = { "v41", 256, 12, v41_model, v41_model_free, v41_seq_new, v41_seq_free,
                         v41_step, v41_save, v41_load, v41_clone, v41_sel };

/* V4 */
static void *v4_model(void)
{
    char err[512] = "";
    dsattn_v4 *m = NULL;
    dsattn_status st = dsattn_v4_load(&m, golden("golden/v4/tiny-seed0", "config.json"),
                                      golden("golden/v4/tiny-seed0", "weights.safetensors"), err,
                                      sizeof err);
    CHECK_MSG(st == DSATTN_OK, "v4 load: %s", err);
    return m;
}
static void v4_model_free(void *m) { dsattn_v4_destroy(m); }
static void *v4_seq_new(void *m, size_t cap, int v)
{
    dsattn_v4_seq *s = NULL;
    CHECK_OK(dsattn_v4_seq_create(&s, m, cap, (dsattn_v4_empty)v));
    return s;
}
static void v4_seq_free(void *s) { dsattn_v4_seq_destroy(s); }
static dsattn_status v4_step(dsattn_ctx *c, void *s, float *h, size_t n)
{
    return dsattn_v4_stack_forward(c, s, h, n, NULL, NULL);
}
static dsattn_status v4_save(void *s, const char *p, char *e, size_t el)
{
    return dsattn_v4_seq_save(s, p, e, el);
}
static dsattn_status v4_load(void **s, void *m, const char *p, size_t cap, char *e, size_t el)
{
    return dsattn_v4_seq_load((dsattn_v4_seq **)s, m, p, cap, e, el);
}
static dsattn_status v4_clone(void **o, void *s) { return dsattn_v4_seq_clone((dsattn_v4_seq **)o, s); }
static const int32_t *v4_sel(void *s, int l, size_t *n)
{
    const int32_t *r;
    size_t nr, w;
    if (dsattn_v4_seq_selection(s, l, &r, &nr, &w)) return NULL;
    *n = nr * w;
    return r;
}
static const gen V4 = { "v4", 256, 7, v4_model, v4_model_free, v4_seq_new, v4_seq_free, v4_step,
                        v4_save, v4_load, v4_clone, v4_sel };

/* MLA: V3 and V3.2 golden models; variant = cache format */
static const char *mla_case = "golden/v3/tiny-seed0";
static void *mla_model(void)
{
    char err[512] = "";
    dsattn_mla *m = NULL;
    dsattn_status st = dsattn_mla_load(&m, golden(mla_case, "config.json"),
                                       golden(mla_case, "weights.safetensors"), err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "mla load: %s", err);
    return m;
}
static void mla_model_free(void *m) { dsattn_mla_destroy(m); }
static void *mla_seq_new(void *m, size_t cap, int v)
{
    dsattn_mla_seq *s = NULL;
    CHECK_OK(dsattn_mla_seq_create(&s, m, cap, (dsattn_mla_cache)v));
    return s;
}
static void mla_seq_free(void *s) { dsattn_mla_seq_destroy(s); }
static dsattn_status mla_step(dsattn_ctx *c, void *s, float *h, size_t n)
{
    return dsattn_mla_stack_forward(c, s, h, n, NULL, NULL);
}
static dsattn_status mla_save(void *s, const char *p, char *e, size_t el)
{
    return dsattn_mla_seq_save(s, p, e, el);
}
static dsattn_status mla_load(void **s, void *m, const char *p, size_t cap, char *e, size_t el)
{
    return dsattn_mla_seq_load((dsattn_mla_seq **)s, m, p, cap, e, el);
}
static dsattn_status mla_clone(void **o, void *s) { return dsattn_mla_seq_clone((dsattn_mla_seq **)o, s); }
static const int32_t *mla_sel(void *s, int l, size_t *n)
{
    const int32_t *r;
    size_t nr, w;
    if (dsattn_mla_seq_selection(s, l, &r, &nr, &w)) return NULL;
    *n = nr * w;
    return r;
}
static const gen MLA = { "mla", 256, 3, mla_model, mla_model_free, mla_seq_new, mla_seq_free,
                         mla_step, mla_save, mla_load, mla_clone, mla_sel };

/* MHA / GQA: a small Llama config, random weights from a fixed seed
 * (re-made for the "fresh model" side); the stand-in block is
 * h += attn_l(bf16(h)) for every layer. */
static int mha_kv = 2;
static void *mha_model(void)
{
    char path[DSATTN_TEST_PATH], err[512] = "";
    dsattn_test_tmp(path, sizeof path, "dsattn_test_sess_mha.json");
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 3,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": %d,"
               " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096,"
               " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null}", mha_kv);
    fclose(f);
    dsattn_mha *m = NULL;
    dsattn_status st = dsattn_mha_create_random(&m, path, 7, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "mha create: %s", err);
    unlink(path);
    return m;
}
static void mha_model_free(void *m) { dsattn_mha_destroy(m); }
static void *mha_seq_new(void *m, size_t cap, int v)
{
    (void)v;
    dsattn_mha_seq *s = NULL;
    CHECK_OK(dsattn_mha_seq_create(&s, m, cap));
    return s;
}
static void mha_seq_free(void *s) { dsattn_mha_seq_destroy(s); }
static dsattn_status mha_step(dsattn_ctx *c, void *s, float *h, size_t n)
{
    const size_t dim = 256;
    float *x = malloc(n * dim * sizeof(float)), *o = malloc(n * dim * sizeof(float));
    dsattn_status st = x && o ? DSATTN_OK : DSATTN_ERR_NOMEM;
    for (int l = 0; l < 3 && !st; l++) {
        for (size_t i = 0; i < n * dim; i++) x[i] = dsattn_round_bf16(h[i]);
        st = dsattn_mha_attn_forward(c, s, l, x, n, o);
        for (size_t i = 0; i < n * dim && !st; i++) h[i] += o[i];
    }
    if (!st) st = dsattn_mha_seq_advance(s, n);
    free(x);
    free(o);
    return st;
}
static dsattn_status mha_save(void *s, const char *p, char *e, size_t el)
{
    return dsattn_mha_seq_save(s, p, e, el);
}
static dsattn_status mha_load(void **s, void *m, const char *p, size_t cap, char *e, size_t el)
{
    return dsattn_mha_seq_load((dsattn_mha_seq **)s, m, p, cap, e, el);
}
static dsattn_status mha_clone(void **o, void *s) { return dsattn_mha_seq_clone((dsattn_mha_seq **)o, s); }
static const int32_t *mha_sel(void *s, int l, size_t *n) { (void)s; (void)l; (void)n; return NULL; }
static const gen MHA = { "mha", 256, 3, mha_model, mha_model_free, mha_seq_new, mha_seq_free,
                         mha_step, mha_save, mha_load, mha_clone, mha_sel };

/* ==== Helpers ========================================================== */

static const char *tmp(const char *tag)
{
    static char p[8][DSATTN_TEST_PATH];
    static int k;
    char *o = p[k++ & 7];
    dsattn_test_tmp(o, sizeof p[0], "dsattn_test_sess_%s", tag);
    return o;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static int spit(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static float *inputs(size_t T, size_t dim, uint64_t seed)
{
    dsattn_rng r = { seed };
    float *x = malloc(T * dim * sizeof(float));
    for (size_t i = 0; i < T * dim; i++) x[i] = dsattn_rng_normal(&r);
    return x;
}

/* Selections of every layer after each decode step, appended. */
typedef struct { int32_t *v; size_t n, cap; } ibuf;
static void record_sel(const gen *g, void *s, ibuf *b)
{
    for (int l = 0; l < g->n_layers; l++) {
        size_t n = 0;
        const int32_t *r = g->sel(s, l, &n);
        if (!r) continue;
        if (b->n + n + 1 > b->cap) {
            b->cap = 2 * (b->n + n + 1);
            b->v = realloc(b->v, b->cap * sizeof(int32_t));
        }
        b->v[b->n++] = (int32_t)n;             /* the shape too */
        memcpy(b->v + b->n, r, n * sizeof(int32_t));
        b->n += n;
    }
}

/* Decode tokens [t0, t1) of h one at a time, recording selections. */
static void decode(const gen *g, dsattn_ctx *ctx, void *s, float *h, size_t t0, size_t t1,
                   ibuf *sel)
{
    for (size_t t = t0; s && t < t1; t++) {
        CHECK_OK(g->step(ctx, s, h + t * (size_t)g->dim, 1));
        record_sel(g, s, sel);
    }
}

/* Prefill P, then M decode steps, uninterrupted (capacity capB) versus
 * interrupted by save (capacity capA) -> destroy model and sequence ->
 * fresh model -> load (capacity capB) -> M decode steps.  Outputs, every
 * selection after every decode step and the final state must be equal. */
static void exact(const gen *g, int variant, dsattn_mode mode, size_t P, size_t M, size_t capA,
                  size_t capB)
{
    char err[512] = "";
    dsattn_ctx *ctx = dsattn_test_ctx(mode, mode == DSATTN_MODE_FAST ? 2 : 0);
    void *m = g->model();
    if (!ctx || !m) { dsattn_ctx_destroy(ctx); if (m) g->model_free(m); return; }
    const size_t dim = (size_t)g->dim, T = P + M;
    float *x = inputs(T, dim, 100 + P);
    float *ha = malloc(T * dim * sizeof(float)), *hb = malloc(T * dim * sizeof(float));
    memcpy(ha, x, T * dim * sizeof(float));
    memcpy(hb, x, T * dim * sizeof(float));
    ibuf sa = { 0 }, sb = { 0 };
    const char *fa = tmp("a"), *fs = tmp("s"), *fb = tmp("b");

    void *a = g->seq_new(m, capB, variant);
    if (a) CHECK_OK(g->step(ctx, a, ha, P));
    decode(g, ctx, a, ha, P, T, &sa);
    if (a) CHECK_OK(g->save(a, fa, err, sizeof err));
    g->seq_free(a);

    void *b = g->seq_new(m, capA, variant);
    if (b) CHECK_OK(g->step(ctx, b, hb, P));
    dsattn_status st = b ? g->save(b, fs, err, sizeof err) : DSATTN_ERR_INVALID_ARG;
    CHECK_MSG(st == DSATTN_OK, "save: %s", err);
    g->seq_free(b);
    g->model_free(m);                         /* nothing survives but the file */
    m = g->model();
    b = NULL;
    st = m ? g->load(&b, m, fs, capB, err, sizeof err) : DSATTN_ERR_INVALID_ARG;
    CHECK_MSG(st == DSATTN_OK && b, "load: %s", err);
    decode(g, ctx, b, hb, P, T, &sb);
    if (b) CHECK_OK(g->save(b, fb, err, sizeof err));
    g->seq_free(b);

    CHECK_BITS("outputs, resumed vs uninterrupted", hb, ha, T * dim);
    CHECK_MSG(sa.n == sb.n && (!sa.n || !memcmp(sa.v, sb.v, sa.n * sizeof(int32_t))),
              "%s: selections differ (%zu vs %zu entries)", g->name, sb.n, sa.n);
    CHECK_MSG(same_file(fa, fb), "%s P=%zu: final state differs from the uninterrupted run",
              g->name, P);
    unlink(fa); unlink(fs); unlink(fb);
    free(sa.v); free(sb.v);
    free(x); free(ha); free(hb);
    g->model_free(m);
    dsattn_ctx_destroy(ctx);
}

/* Prefill P, clone, continue both with different inputs; each must equal
 * its own uninterrupted run. */
static void clone_two_ways(const gen *g, int variant, dsattn_mode mode, size_t P, size_t M)
{
    char err[512] = "";
    dsattn_ctx *ctx = dsattn_test_ctx(mode, mode == DSATTN_MODE_FAST ? 2 : 0);
    void *m = g->model();
    if (!ctx || !m) { dsattn_ctx_destroy(ctx); if (m) g->model_free(m); return; }
    const size_t dim = (size_t)g->dim, T = P + M, bytes = T * dim * sizeof(float);
    float *x1 = inputs(T, dim, 7), *x2 = inputs(T, dim, 8);
    memcpy(x2, x1, P * dim * sizeof(float));          /* one shared prefix */
    float *u1 = malloc(bytes), *u2 = malloc(bytes), *c1 = malloc(bytes), *c2 = malloc(bytes);
    memcpy(u1, x1, bytes); memcpy(c1, x1, bytes);
    memcpy(u2, x2, bytes); memcpy(c2, x2, bytes);
    ibuf su1 = { 0 }, su2 = { 0 }, sc1 = { 0 }, sc2 = { 0 };
    for (int k = 0; k < 2; k++) {
        void *s = g->seq_new(m, T, variant);
        if (s) CHECK_OK(g->step(ctx, s, k ? u2 : u1, P));
        decode(g, ctx, s, k ? u2 : u1, P, T, k ? &su2 : &su1);
        if (s) CHECK_OK(g->save(s, tmp(k ? "u2" : "u1"), err, sizeof err));
        g->seq_free(s);
    }
    void *s = g->seq_new(m, T, variant), *c = NULL;
    if (s) CHECK_OK(g->step(ctx, s, c1, P));
    memcpy(c2, c1, P * dim * sizeof(float));
    if (s) CHECK_OK(g->clone(&c, s));
    decode(g, ctx, s, c1, P, T, &sc1);                /* the original goes on with x1 */
    decode(g, ctx, c, c2, P, T, &sc2);                /* the clone with x2 */
    if (s) CHECK_OK(g->save(s, tmp("c1"), err, sizeof err));
    if (c) CHECK_OK(g->save(c, tmp("c2"), err, sizeof err));
    CHECK_BITS("continuation 1", c1, u1, T * dim);
    CHECK_BITS("continuation 2 (clone)", c2, u2, T * dim);
    CHECK(memcmp(u1 + P * dim, u2 + P * dim, M * dim * sizeof(float)) != 0);
    CHECK(sc1.n == su1.n && (!su1.n || !memcmp(sc1.v, su1.v, su1.n * 4)));
    CHECK(sc2.n == su2.n && (!su2.n || !memcmp(sc2.v, su2.v, su2.n * 4)));
    CHECK_MSG(same_file(tmp("c1"), tmp("u1")) && same_file(tmp("c2"), tmp("u2")),
              "%s: a continuation's final state differs", g->name);
    const char *names[] = { "u1", "u2", "c1", "c2" };
    for (int i = 0; i < 4; i++) unlink(tmp(names[i]));
    g->seq_free(s);
    g->seq_free(c);
    free(su1.v); free(su2.v); free(sc1.v); free(sc2.v);
    free(x1); free(x2); free(u1); free(u2); free(c1); free(c2);
    g->model_free(m);
    dsattn_ctx_destroy(ctx);
}

/* ==== Exactness ======================================================== */

/* V4.1: ratio-2 groups, so an odd P is mid group, an even P a boundary. */
DSATTN_TEST(session, v41_owner_mid_group_reference)  { exact(&V41, 0, DSATTN_MODE_REFERENCE, 13, 7, 20, 20); }
DSATTN_TEST(session, v41_owner_boundary_reference)   { exact(&V41, 0, DSATTN_MODE_REFERENCE, 12, 7, 19, 19); }
DSATTN_TEST(session, v41_refk_mid_group_reference)   { exact(&V41, 1, DSATTN_MODE_REFERENCE, 13, 7, 20, 20); }
DSATTN_TEST(session, v41_refk_boundary_reference)    { exact(&V41, 1, DSATTN_MODE_REFERENCE, 12, 7, 19, 19); }
DSATTN_TEST(session, v41_owner_mid_group_fast)       { exact(&V41, 0, DSATTN_MODE_FAST, 13, 7, 20, 20); }
DSATTN_TEST(session, v41_refk_boundary_fast)         { exact(&V41, 1, DSATTN_MODE_FAST, 12, 7, 19, 19); }
DSATTN_TEST(session, v41_refk_mid_group_fast)        { exact(&V41, 1, DSATTN_MODE_FAST, 15, 6, 21, 21); }
DSATTN_TEST(session, v41_fp8_owner_mid_group_fast)
{
    v41_case = "golden/v41/tiny-seed2-fp8";
    exact(&V41, 0, DSATTN_MODE_FAST, 11, 6, 17, 17);
    exact(&V41, 1, DSATTN_MODE_REFERENCE, 10, 6, 16, 16);
    v41_case = "golden/v41/tiny-seed0";
}
DSATTN_TEST(session, v41_larger_capacity_on_load)    { exact(&V41, 0, DSATTN_MODE_REFERENCE, 13, 7, 13, 64); }
/* the other plan (16 layers, window 16, 3 Full / 2 Reindex sources): P past
 * the window, mid ratio-2 group and at a boundary */
DSATTN_TEST(session, v41_alt_plan_reference_and_fast)
{
    v41_case = "golden/v41/alt-seed0";
    exact(&V41, 0, DSATTN_MODE_REFERENCE, 19, 7, 26, 26);
    exact(&V41, 1, DSATTN_MODE_REFERENCE, 18, 7, 25, 25);
    exact(&V41, 0, DSATTN_MODE_FAST, 21, 6, 27, 48);
    v41_case = "golden/v41/tiny-seed0";
}

/* V4: CSA ratio 4 and HCA ratio 16: 37 is mid group for both, 32 a
 * boundary for both (the overlap state of CSA carries the previous group). */
DSATTN_TEST(session, v4_mid_group_reference)         { exact(&V4, 0, DSATTN_MODE_REFERENCE, 37, 6, 43, 43); }
DSATTN_TEST(session, v4_boundary_reference)          { exact(&V4, 0, DSATTN_MODE_REFERENCE, 32, 6, 38, 38); }
DSATTN_TEST(session, v4_mid_group_fast)              { exact(&V4, 0, DSATTN_MODE_FAST, 37, 6, 43, 43); }
DSATTN_TEST(session, v4_boundary_fast_larger_cap)    { exact(&V4, 1, DSATTN_MODE_FAST, 32, 6, 38, 80); }

/* MLA: V3 (naive and latent caches) and V3.2 (latent + index keys). */
DSATTN_TEST(session, v3_naive_reference)    { mla_case = "golden/v3/tiny-seed0"; exact(&MLA, 0, DSATTN_MODE_REFERENCE, 9, 5, 14, 14); }
DSATTN_TEST(session, v3_latent_fast)        { mla_case = "golden/v3/tiny-seed0"; exact(&MLA, 1, DSATTN_MODE_FAST, 9, 5, 14, 30); }
DSATTN_TEST(session, v32_latent_reference)  { mla_case = "golden/v32/tiny-seed0"; exact(&MLA, 1, DSATTN_MODE_REFERENCE, 9, 5, 14, 14); }
DSATTN_TEST(session, v32_latent_fast)       { mla_case = "golden/v32/tiny-seed0"; exact(&MLA, 1, DSATTN_MODE_FAST, 10, 5, 15, 15); }

/* MHA / GQA: key tiles of 32 and value tiles of 64, so 37 is mid tile for
 * both, 64 a boundary for both; a larger capacity re-tiles the tail. */
DSATTN_TEST(session, gqa_mid_tile_reference)      { mha_kv = 2; exact(&MHA, 0, DSATTN_MODE_REFERENCE, 37, 4, 41, 41); }
DSATTN_TEST(session, gqa_boundary_fast)           { mha_kv = 2; exact(&MHA, 0, DSATTN_MODE_FAST, 64, 4, 68, 68); }
DSATTN_TEST(session, mha_mid_tile_fast_larger_cap) { mha_kv = 4; exact(&MHA, 0, DSATTN_MODE_FAST, 37, 4, 41, 200); }

DSATTN_TEST(session, clone_v41_reference)  { clone_two_ways(&V41, 1, DSATTN_MODE_REFERENCE, 13, 6); }
DSATTN_TEST(session, clone_v4_fast)        { clone_two_ways(&V4, 0, DSATTN_MODE_FAST, 37, 5); }
DSATTN_TEST(session, clone_v32_reference)  { mla_case = "golden/v32/tiny-seed0"; clone_two_ways(&MLA, 1, DSATTN_MODE_REFERENCE, 9, 5); }
DSATTN_TEST(session, clone_gqa_fast)       { mha_kv = 2; clone_two_ways(&MHA, 0, DSATTN_MODE_FAST, 37, 5); }

/* Independent of the session code: V4.1's packed caches through the public
 * accessor, loaded vs saved, byte for byte. */
DSATTN_TEST(session, v41_loaded_caches_match_accessor)
{
    char err[512] = "";
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 0);
    dsattn_v41 *m = v41_model();
    if (!ctx || !m) { dsattn_ctx_destroy(ctx); dsattn_v41_destroy(m); return; }
    float *h = inputs(15, 256, 5);
    dsattn_v41_seq *a = NULL, *b = NULL;
    CHECK_OK(dsattn_v41_seq_create(&a, m, 15, DSATTN_V41_INDEX_K_OWNER));
    if (a) CHECK_OK(dsattn_v41_stack_forward(ctx, a, h, 15, NULL, NULL));
    const char *f = tmp("acc");
    if (a) CHECK_OK(dsattn_v41_seq_save(a, f, err, sizeof err));
    dsattn_status st = dsattn_v41_seq_load(&b, m, f, 0, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "%s", err);
    size_t compared = 0;
    for (int l = 0; a && b && l < 12; l++)
        for (int which = 0; which < 3; which++) {
            const uint8_t *ra, *rb;
            size_t na, nb, ba, bb;
            dsattn_status s1 = dsattn_v41_seq_cache(a, l, which, &ra, &na, &ba);
            dsattn_status s2 = dsattn_v41_seq_cache(b, l, which, &rb, &nb, &bb);
            CHECK_EQ_INT(s1, s2);
            if (s1 || s2) continue;
            CHECK(na == nb && ba == bb && !memcmp(ra, rb, na * ba));
            compared += na * ba;
        }
    CHECK_MSG(compared > 5000, "only %zu bytes compared", compared);
    CHECK_EQ_INT(dsattn_v41_seq_pos(b), 15);
    dsattn_v41_seq_destroy(a);
    dsattn_v41_seq_destroy(b);
    unlink(f);
    free(h);
    dsattn_v41_destroy(m);
    dsattn_ctx_destroy(ctx);
}

/* ==== Refusals ========================================================= */

/* A V4.1 session of the golden model at position P (path returned). */
static const char *v41_session(dsattn_v41 *m, size_t P, const char *tag)
{
    char err[512] = "";
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    float *h = inputs(P, 256, 3);
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, P + 8, DSATTN_V41_INDEX_K_REFERENCE));
    if (s && ctx) CHECK_OK(dsattn_v41_stack_forward(ctx, s, h, P, NULL, NULL));
    const char *f = tmp(tag);
    if (s) CHECK_OK(dsattn_v41_seq_save(s, f, err, sizeof err));
    dsattn_v41_seq_destroy(s);
    free(h);
    dsattn_ctx_destroy(ctx);
    return f;
}

/* Load must fail with DSATTN_ERR_FORMAT-ish status, no sequence, and a
 * message holding every string of `want` (NULL-terminated). */
static void refused(dsattn_v41 *m, const uint8_t *b, size_t n, const char *what,
                    const char *const *want)
{
    char err[512] = "";
    dsattn_v41_seq *s = (dsattn_v41_seq *)(uintptr_t)1;
    dsattn_status st = dsattn_v41_seq_load_buffer(&s, m, b, n, 0, err, sizeof err);
    CHECK_MSG(st != DSATTN_OK && s == NULL, "%s: accepted (status %d)", what, (int)st);
    for (int i = 0; want && want[i]; i++)
        CHECK_MSG(strstr(err, want[i]) != NULL, "%s: message '%s' lacks '%s'", what, err, want[i]);
}

DSATTN_TEST(session, every_flipped_byte_and_truncation_refused)
{
    dsattn_v41 *m = v41_model();
    if (!m) return;
    const char *f = v41_session(m, 9, "flip");
    size_t n = 0;
    uint8_t *b = slurp(f, &n);
    CHECK(b && n > 1000);
    size_t bad = 0;
    for (size_t i = 0; b && i < n; i++) {
        for (int bit = 0; bit < 8; bit += 7) {       /* low and high bit of every byte */
            b[i] ^= (uint8_t)(1u << bit);
            char err[512] = "";
            dsattn_v41_seq *s = NULL;
            dsattn_status st = dsattn_v41_seq_load_buffer(&s, m, b, n, 0, err, sizeof err);
            if (st == DSATTN_OK || s || !err[0]) {
                if (bad++ < 5) CHECK_MSG(0, "byte %zu bit %d flipped: accepted (%s)", i, bit, err);
            }
            dsattn_v41_seq_destroy(s);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    for (size_t len = 0; b && len < n; len++) {
        char err[512] = "";
        dsattn_v41_seq *s = NULL;
        dsattn_status st = dsattn_v41_seq_load_buffer(&s, m, b, len, 0, err, sizeof err);
        if (st == DSATTN_OK || s || !err[0])
            if (bad++ < 10) CHECK_MSG(0, "truncated to %zu bytes: accepted", len);
        dsattn_v41_seq_destroy(s);
    }
    CHECK_EQ_INT(bad, 0);
    /* the file name and the section are named */
    if (b) {
        char err[512] = "";
        dsattn_v41_seq *s = NULL;
        b[n / 2] ^= 1;
        spit(tmp("flip2"), b, n);
        CHECK(dsattn_v41_seq_load(&s, m, tmp("flip2"), 0, err, sizeof err) == DSATTN_ERR_FORMAT);
        CHECK_MSG(strstr(err, tmp("flip2")) && strstr(err, "section 'layer.") &&
                      strstr(err, "checksum"), "message: %s", err);
        b[n / 2] ^= 1;
        spit(tmp("flip2"), b, n - 100);
        CHECK(dsattn_v41_seq_load(&s, m, tmp("flip2"), 0, err, sizeof err) == DSATTN_ERR_FORMAT);
        CHECK_MSG(strstr(err, "truncated"), "message: %s", err);
        /* a buffer of 0 bytes is a count of 0 (include/dsattn.h: INVALID_ARG,
         * with or without a pointer); an empty file a malformed session */
        for (int null_buf = 0; null_buf < 2; null_buf++) {
            err[0] = 0;
            s = (dsattn_v41_seq *)(uintptr_t)1;
            CHECK_EQ_INT(dsattn_v41_seq_load_buffer(&s, m, null_buf ? NULL : b, 0, 0, err,
                                                    sizeof err), DSATTN_ERR_INVALID_ARG);
            CHECK_MSG(s == NULL && strstr(err, "0 bytes"), "null_buf %d: %s", null_buf, err);
        }
        s = NULL;
        spit(tmp("flip2"), b, 0);
        CHECK_EQ_INT(dsattn_v41_seq_load(&s, m, tmp("flip2"), 0, err, sizeof err),
                     DSATTN_ERR_FORMAT);
        CHECK_MSG(s == NULL && strstr(err, tmp("flip2")), "message: %s", err);
        unlink(tmp("flip2"));
        /* intact, it loads */
        CHECK_OK(dsattn_v41_seq_load_buffer(&s, m, b, n, 0, err, sizeof err));
        dsattn_v41_seq_destroy(s);
    }
    free(b);
    unlink(f);
    dsattn_v41_destroy(m);
}

/* Re-seal a modified image: header checksum, section checksums (sections
 * walked by their stored lengths) and the file checksum, so only the
 * semantic check can refuse it. */
static void reseal(uint8_t *b, size_t n)
{
    uint64_t v = XXH3_64bits(b, 120);
    memcpy(b + 120, &v, 8);
    size_t at = 128;
    uint32_t ns;
    memcpy(&ns, b + 44, 4);
    for (uint32_t i = 0; i < ns && at + 56 <= n; i++) {
        uint64_t len;
        memcpy(&len, b + at + 40, 8);
        if (len > n - at - 56) return;
        v = XXH3_64bits(b + at, 48 + len);
        memcpy(b + at + 48 + len, &v, 8);
        at += 56 + len;
    }
    if (at + 16 == n) {
        v = XXH3_64bits(b, at + 8);
        memcpy(b + at + 8, &v, 8);
    }
}

DSATTN_TEST(session, wrong_model_generation_sizes_and_lengths_refused)
{
    dsattn_v41 *m = v41_model();
    if (!m) return;
    const char *f = v41_session(m, 9, "wrong");
    size_t n = 0;
    uint8_t *b = slurp(f, &n);
    if (!b) { dsattn_v41_destroy(m); return; }
    uint8_t *c = malloc(n);
    char err[512] = "";

    /* another generation */
    dsattn_v4 *m4 = v4_model();
    dsattn_v4_seq *s4 = NULL;
    CHECK(dsattn_v4_seq_load(&s4, m4, f, 0, err, sizeof err) == DSATTN_ERR_FORMAT && !s4);
    CHECK_MSG(strstr(err, "a v41 session, not v4") && strstr(err, f), "message: %s", err);
    dsattn_v4_destroy(m4);

    /* another config (the fp8 golden case has other candidate blocks and top-k) */
    dsattn_v41 *m2 = NULL;
    CHECK_OK(dsattn_v41_load(&m2, golden("golden/v41/tiny-seed2-fp8", "config.json"),
                             golden("golden/v41/tiny-seed2-fp8", "weights.safetensors"), err,
                             sizeof err));
    const char *cfgmsg[] = { "another model config", NULL };
    if (m2) refused(m2, b, n, "other config", cfgmsg);
    dsattn_v41_destroy(m2);

    /* same config, other weight shapes / dtypes: random FP8 weights, and
     * a config-only model (no weights at all) */
    m2 = NULL;
    CHECK_OK(dsattn_v41_load_config(&m2, golden(v41_case, "config.json"), err, sizeof err));
    const char *shpmsg[] = { "other weight shapes", NULL };
    if (m2) refused(m2, b, n, "config-only model", shpmsg);
    dsattn_v41_destroy(m2);

    /* magic, format version */
    memcpy(c, b, n); c[0] = 'X';
    const char *magic[] = { "bad magic", NULL };
    refused(m, c, n, "magic", magic);
    memcpy(c, b, n); c[8] = 2; reseal(c, n);
    const char *ver[] = { "format 2", NULL };
    refused(m, c, n, "format", ver);

    /* sizes disagreeing with the header: position moved by one group, all
     * checksums recomputed - the section list no longer fits the position */
    memcpy(c, b, n);
    int64_t pos;
    memcpy(&pos, c + 64, 8);
    pos += 2;
    memcpy(c + 64, &pos, 8);
    reseal(c, n);
    const char *sz[] = { "section 'layer.", "bytes", NULL };
    refused(m, c, n, "position vs sizes", sz);

    /* a huge length field in the first section */
    memcpy(c, b, n);
    uint64_t huge = UINT64_MAX - 5;
    memcpy(c + 128 + 40, &huge, 8);
    reseal(c, n);
    const char *hg[] = { "section 'runtime'", "exceeds", NULL };
    refused(m, c, n, "huge length", hg);
    /* and one that still fits the file but is off by 8 bytes */
    memcpy(c, b, n);
    uint64_t l8;
    memcpy(&l8, c + 128 + 40, 8);
    l8 += 8;
    memcpy(c + 128 + 40, &l8, 8);
    reseal(c, n);
    refused(m, c, n, "off-by-8 length", NULL);

    /* a runtime slot naming a layer that cannot hold it */
    memcpy(c, b, n);
    int64_t bogus = 1;                           /* layer 1 is SWA */
    memcpy(c + 128 + 48 + 8, &bogus, 8);
    reseal(c, n);
    const char *rt[] = { "section 'runtime'", "index_k", NULL };
    refused(m, c, n, "runtime slot", rt);

    /* capacity below the position */
    dsattn_v41_seq *s = NULL;
    CHECK(dsattn_v41_seq_load(&s, m, f, 5, err, sizeof err) == DSATTN_ERR_INVALID_ARG && !s);
    CHECK_MSG(strstr(err, "capacity"), "message: %s", err);
    /* a missing file */
    CHECK(dsattn_v41_seq_load(&s, m, "/nonexistent/x.session", 0, err, sizeof err) ==
          DSATTN_ERR_IO && !s);

    /* the header reader */
    dsattn_session_info info;
    CHECK_OK(dsattn_session_info_read(f, &info, err, sizeof err));
    CHECK(info.generation == DSATTN_SESSION_V41 && info.pos == 9 && info.capacity == 17 &&
          info.file_bytes == n && info.variant[0] == DSATTN_V41_INDEX_K_REFERENCE);
    CHECK(!strcmp(dsattn_session_gen_name(info.generation), "v41"));
    free(b);
    free(c);
    unlink(f);
    dsattn_v41_destroy(m);
}

/* ==== Atomic save under SIGKILL ======================================== */

DSATTN_TEST(session, killed_saver_leaves_a_loadable_saved_state)
{
    char err[512] = "";
    dsattn_ctx *ctx = dsattn_test_ctx(DSATTN_MODE_FAST, 2);
    dsattn_v41 *m = v41_model();
    if (!ctx || !m) { dsattn_ctx_destroy(ctx); dsattn_v41_destroy(m); return; }
    /* N states: prefill 9, then one more decode step each */
    enum { N = 5 };
    dsattn_v41_seq *st[N] = { 0 };
    float *h = inputs(9 + N, 256, 11);
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, 9 + N, DSATTN_V41_INDEX_K_OWNER));
    if (!s) goto out;
    CHECK_OK(dsattn_v41_stack_forward(ctx, s, h, 9, NULL, NULL));
    for (int k = 0; k < N; k++) {
        CHECK_OK(dsattn_v41_seq_clone(&st[k], s));
        if (k + 1 < N) CHECK_OK(dsattn_v41_stack_forward(ctx, s, h + (9 + k) * 256, 1, NULL, NULL));
        char ref[64];
        snprintf(ref, sizeof ref, "ref%d", k);
        if (st[k]) CHECK_OK(dsattn_v41_seq_save(st[k], tmp(ref), err, sizeof err));
    }
    char target[256];
    snprintf(target, sizeof target, "%s", tmp("target"));
    CHECK_OK(dsattn_v41_seq_save(st[0], target, err, sizeof err));
    srand(12345);
    int loaded[N] = { 0 };
    for (int round = 0; round < 24 && !dsattn_test_failed(); round++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            /* the saver: no OpenMP here, only the session writer */
            for (unsigned i = 1;; i++) {
                char e[256];
                if (dsattn_v41_seq_save(st[i % N], target, e, sizeof e)) _exit(3);
            }
        }
        CHECK(pid > 0);
        if (pid <= 0) break;
        struct timespec ts = { 0, (long)(rand() % 40000) * 1000 };  /* 0..40 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int ws = 0;
        waitpid(pid, &ws, 0);
        CHECK_MSG(WIFSIGNALED(ws), "the saver exited by itself (status %d)", ws);
        char stale[300];
        snprintf(stale, sizeof stale, "%s.tmp-%ld", target, (long)pid);
        unlink(stale);
        dsattn_v41_seq *l = NULL;
        dsattn_status r = dsattn_v41_seq_load(&l, m, target, 0, err, sizeof err);
        CHECK_MSG(r == DSATTN_OK, "round %d: the remaining file does not load: %s", round, err);
        if (!l) continue;
        int64_t k = dsattn_v41_seq_pos(l) - 9;
        CHECK(k >= 0 && k < N);
        if (k >= 0 && k < N) {
            char ref[64];
            snprintf(ref, sizeof ref, "ref%d", (int)k);
            CHECK_OK(dsattn_v41_seq_save(l, tmp("again"), err, sizeof err));
            CHECK_MSG(same_file(tmp("again"), tmp(ref)), "round %d: not saved state %d", round,
                      (int)k);
            loaded[k]++;
        }
        dsattn_v41_seq_destroy(l);
    }
    int distinct = 0;
    for (int k = 0; k < N; k++) distinct += loaded[k] > 0;
    CHECK_MSG(distinct >= 2, "the kills always found the same state (%d distinct)", distinct);
    for (int k = 0; k < N; k++) {
        char ref[64];
        snprintf(ref, sizeof ref, "ref%d", k);
        unlink(tmp(ref));
    }
    unlink(target);
    unlink(tmp("again"));
out:
    for (int k = 0; k < N; k++) dsattn_v41_seq_destroy(st[k]);
    dsattn_v41_seq_destroy(s);
    free(h);
    dsattn_v41_destroy(m);
    dsattn_ctx_destroy(ctx);
}

/* ==== The CLI ========================================================== */

static int run_cli(const char *args, char *out, size_t outlen)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", DSATTN_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

DSATTN_TEST(session, cli_info_prints_header_and_refuses_damage)
{
    dsattn_v41 *m = v41_model();
    if (!m) return;
    char f[256], args[512], out[4096];
    snprintf(f, sizeof f, "%s", v41_session(m, 9, "cli"));
    snprintf(args, sizeof args, "info '%s'", f);
    CHECK_EQ_INT(run_cli(args, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "generation:  v41 (index_k reference)") &&
                  strstr(out, "position:    9 tokens consumed, capacity 17") &&
                  strstr(out, "every checksum verified"), "output: %s", out);
    size_t n = 0;
    uint8_t *b = slurp(f, &n);
    if (b) {
        b[n - 20] ^= 0x40;
        spit(f, b, n);
        CHECK_EQ_INT(run_cli(args, out, sizeof out), 1);
        CHECK_MSG(strstr(out, f) && strstr(out, "checksum mismatch"), "output: %s", out);
    }
    free(b);
    unlink(f);
    dsattn_v41_destroy(m);
}

/* `dsattn run --prefill P --decode 0 --save S`, then `--resume S --decode M
 * --out B` equals `--prefill P --decode M --out A` byte for byte (the
 * decode outputs, out.{position}), for every generation. */
static void cli_resume(const char *config, const char *extra, int P, int M)
{
    char s[256], a[256], b[256], args[2048], out[8192];
    snprintf(s, sizeof s, "%s", tmp("cli.session"));
    snprintf(a, sizeof a, "%s", tmp("cli.a"));
    snprintf(b, sizeof b, "%s", tmp("cli.b"));
    snprintf(args, sizeof args, "run --config '%s' %s --prefill %d --decode 0 --save '%s'",
             config, extra, P, s);
    CHECK_MSG(run_cli(args, out, sizeof out) == 0, "%s: %s", args, out);
    CHECK_MSG(strstr(out, "Saved the session at position"), "%s", out);
    snprintf(args, sizeof args, "run --config '%s' %s --resume '%s' --decode %d --out '%s'",
             config, extra, s, M, b);
    CHECK_MSG(run_cli(args, out, sizeof out) == 0, "%s: %s", args, out);
    snprintf(args, sizeof args, "run --config '%s' %s --prefill %d --decode %d --out '%s'",
             config, extra, P, M, a);
    CHECK_MSG(run_cli(args, out, sizeof out) == 0, "%s: %s", args, out);
    CHECK_MSG(same_file(a, b), "%s: resumed outputs differ", config);
    /* --resume takes its position from the session: no --prefill */
    snprintf(args, sizeof args, "run --config '%s' %s --prefill 5 --resume '%s' --decode 1",
             config, extra, s);
    CHECK_EQ_INT(run_cli(args, out, sizeof out), 2);
    unlink(s); unlink(a); unlink(b);
}

DSATTN_TEST(session, cli_resume_v41_both_index_k_modes)
{
    cli_resume(golden("golden/v41/tiny-seed0", "config.json"), "", 300, 8);
    cli_resume(golden("golden/v41/tiny-seed2-fp8", "config.json"),
               "--index-k reference --mode reference", 301, 6);
}
DSATTN_TEST(session, cli_resume_v4)  { cli_resume(golden("golden/v4/tiny-seed0", "config.json"), "--bf16", 301, 6); }
DSATTN_TEST(session, cli_resume_v3_v32)
{
    cli_resume(golden("golden/v3/tiny-seed0", "config.json"), "--bf16 --mode reference", 300, 5);
    cli_resume(golden("golden/v32/tiny-seed0", "config.json"), "--bf16", 300, 5);
}
DSATTN_TEST(session, cli_resume_gqa_and_refusals)
{
    char cfg[256], args[1024], out[8192], s[256];
    snprintf(cfg, sizeof cfg, "%s", tmp("gqa.json"));
    FILE *f = fopen(cfg, "w");
    if (!f) return;
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 2,"
          " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_theta\": 10000.0,"
          " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null}", f);
    fclose(f);
    cli_resume(cfg, "", 300, 6);
    /* a session refused by another model: the run says why and fails */
    snprintf(s, sizeof s, "%s", tmp("cli2.session"));
    snprintf(args, sizeof args, "run --config '%s' --prefill 40 --decode 0 --save '%s'", cfg, s);
    CHECK_EQ_INT(run_cli(args, out, sizeof out), 0);
    snprintf(args, sizeof args, "run --config '%s' --bf16 --resume '%s' --decode 2",
             golden("golden/v3/tiny-seed0", "config.json"), s);
    CHECK_EQ_INT(run_cli(args, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "a mha session, not mla"), "output: %s", out);
    snprintf(args, sizeof args, "run --config '%s' --resume /nonexistent.session --decode 2", cfg);
    CHECK_EQ_INT(run_cli(args, out, sizeof out), 1);
    unlink(s);
    unlink(cfg);
}
