/* test_alloc.c - a decode step allocates nothing, for every generation.
 *
 * Two counters watch each step: dsattn_alloc's own (src/core/core.c), and
 * every C library allocation the process makes.  The second comes from the
 * interposer below: this file defines malloc, calloc, realloc, reallocarray,
 * aligned_alloc, posix_memalign and memalign in the test executable, so the
 * dynamic linker binds every caller to them - the dsattn library, libgomp,
 * OpenBLAS and libc's own users alike - and each forwards to glibc's
 * __libc_* entry point after counting.  A sanitizer build brings its own
 * allocator, so there the interposer is left out and the tests skip.
 *
 * Each generation runs a prefill of 8 tokens and then 8 or 24 one-token
 * decode steps (the public protocol: every layer's attn_forward, then
 * seq_advance; and the stand-in stack_forward), in fast and in reference
 * mode, on contexts of 2 threads and of 1 (libgomp allocates a team for a
 * parallel region run on one thread, so every region of a decode step is
 * skipped on one thread); every step after the first must allocate nothing.
 * The batched MLA decode is checked the same way over batches of up to 9
 * sequences (2 threads).
 */
#include "harness.h"

#include "internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define ALLOC_COUNTING 0
#endif
#endif
#if !defined(ALLOC_COUNTING) && defined(__GLIBC__)
#define ALLOC_COUNTING 1
#endif
#ifndef ALLOC_COUNTING
#define ALLOC_COUNTING 0
#endif

static atomic_ullong libc_allocs;

#if ALLOC_COUNTING
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t a, size_t b);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void  __libc_free(void *p);

static inline void counted(void) { atomic_fetch_add_explicit(&libc_allocs, 1, memory_order_relaxed); }

void *malloc(size_t n) { counted(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { counted(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { counted(); return __libc_realloc(p, n); }
void  free(void *p) { __libc_free(p); }
void *reallocarray(void *p, size_t a, size_t b)
{
    size_t n;
    if (!dsattn_mul_size(a, b, &n)) { errno = ENOMEM; return NULL; }
    counted();
    return __libc_realloc(p, n);
}
void *memalign(size_t align, size_t n) { counted(); return __libc_memalign(align, n); }
void *aligned_alloc(size_t align, size_t n) { counted(); return __libc_memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    counted();
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif

static unsigned long long libc_count(void)
{
    return atomic_load_explicit(&libc_allocs, memory_order_relaxed);
}

static int counting_or_skip(void)
{
    if (!ALLOC_COUNTING) {
        dsattn_test_skip("allocator interposer off (sanitizer build or not glibc)");
        return 0;
    }
    return 1;
}

/* ==== One generation behind a common face =============================== */

typedef struct {
    const char *name;
    void *seq;
    int n_layers;
    size_t dim;
    dsattn_status (*fwd)(dsattn_ctx *, void *, int, const float *, size_t, float *);
    dsattn_status (*adv)(void *, size_t);
    dsattn_status (*stack)(dsattn_ctx *, void *, float *, size_t, float *, float *);
    void (*destroy)(void *);
} gen;

#define ADAPT(G, SEQ)                                                                       \
    static dsattn_status G##_fwd(dsattn_ctx *c, void *s, int l, const float *x, size_t n, \
                                 float *o)                                                 \
    {                                                                                      \
        return dsattn_##G##_attn_forward(c, (SEQ *)s, l, x, n, o);                         \
    }                                                                                      \
    static dsattn_status G##_adv(void *s, size_t n) { return dsattn_##G##_seq_advance((SEQ *)s, n); } \
    static void G##_destroy(void *s) { dsattn_##G##_seq_destroy((SEQ *)s); }

ADAPT(mha, dsattn_mha_seq)
ADAPT(mla, dsattn_mla_seq)
ADAPT(v4, dsattn_v4_seq)
ADAPT(v41, dsattn_v41_seq)

#define ADAPT_STACK(G, SEQ)                                                                 \
    static dsattn_status G##_stack(dsattn_ctx *c, void *s, float *h, size_t n, float *a,   \
                                   float *b)                                               \
    {                                                                                      \
        return dsattn_##G##_stack_forward(c, (SEQ *)s, h, n, a, b);                        \
    }
ADAPT_STACK(mla, dsattn_mla_seq)
ADAPT_STACK(v4, dsattn_v4_seq)
ADAPT_STACK(v41, dsattn_v41_seq)

static float *rand_x(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    dsattn_rng r = { seed };
    for (size_t i = 0; i < n; i++) {
        float v = 0.5f * dsattn_rng_uniform(&r);
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xffff0000u;                            /* a bf16 value */
        memcpy(&v, &u, 4);
        x[i] = v;
    }
    return x;
}

enum { PREFILL = 8 };

/* config.json and weights.safetensors of a golden case folder */
static void case_paths(const char *dir, char cfg[512], char w[512])
{
    const char *d = dsattn_test_data(dir);
    if (strlen(d) > 400) d = "/nonexistent";
    snprintf(cfg, 512, "%.400s/config.json", d);
    snprintf(w, 512, "%.400s/weights.safetensors", d);
}

/* Prefill PREFILL tokens, then `steps` decode steps (attn_forward of every
 * layer + advance, or stack_forward when use_stack).  Returns the largest
 * per-step count of libc and dsattn_alloc allocations over steps 2..steps;
 * *first gets step 1's libc count. */
static void run_steps(dsattn_ctx *ctx, const gen *g, int steps, int use_stack,
                      unsigned long long *worst_libc, unsigned long long *worst_ds,
                      unsigned long long *first, unsigned long long *total_after_first)
{
    const size_t D = g->dim;
    float *x = rand_x((PREFILL + (size_t)steps) * D, 99);
    float *out = malloc(PREFILL * D * sizeof *out);
    *worst_libc = *worst_ds = *first = *total_after_first = 0;
    if (use_stack) {
        CHECK_OK(g->stack(ctx, g->seq, x, PREFILL, NULL, NULL));
    } else {
        for (int l = 0; l < g->n_layers; l++) CHECK_OK(g->fwd(ctx, g->seq, l, x, PREFILL, out));
        CHECK_OK(g->adv(g->seq, PREFILL));
    }
    for (int t = 0; t < steps; t++) {
        float *xt = x + (PREFILL + (size_t)t) * D;
        const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
        if (use_stack) {
            CHECK_OK(g->stack(ctx, g->seq, xt, 1, NULL, NULL));
        } else {
            for (int l = 0; l < g->n_layers; l++) CHECK_OK(g->fwd(ctx, g->seq, l, xt, 1, out));
            CHECK_OK(g->adv(g->seq, 1));
        }
        const unsigned long long dc = libc_count() - c0, dd = dsattn_alloc_count() - d0;
        if (t == 0) {
            *first = dc;
            continue;
        }
        *total_after_first += dc;
        if (dc > *worst_libc) *worst_libc = dc;
        if (dd > *worst_ds) *worst_ds = dd;
    }
    free(x);
    free(out);
}

/* make(): a fresh sequence of capacity PREFILL + 24 + 1 in *g. */
static void check_gen(const char *what, void (*make)(gen *g, int variant), int n_variants)
{
    static const dsattn_mode modes[2] = { DSATTN_MODE_FAST, DSATTN_MODE_REFERENCE };
    static const int step_counts[2] = { 8, 24 };
    static const int thread_counts[2] = { 2, 1 };
    for (int ti = 0; ti < 2; ti++)
    for (int mi = 0; mi < 2; mi++) {
        const int nthr = thread_counts[ti];
        dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], nthr);
        if (!ctx) return;
        for (int v = 0; v < n_variants; v++)
            for (int si = 0; si < 2; si++)
                for (int use_stack = 0; use_stack < 2; use_stack++) {
                    gen g;
                    memset(&g, 0, sizeof g);
                    make(&g, v);
                    if (!g.seq) { CHECK_MSG(0, "%s: no sequence", what); continue; }
                    if (use_stack && !g.stack) { g.destroy(g.seq); continue; }
                    unsigned long long wl, wd, first, tot;
                    run_steps(ctx, &g, step_counts[si], use_stack, &wl, &wd, &first, &tot);
                    if (!use_stack)
                        printf("    %-22s %-9s %d thr %2d steps: step 1 %llu libc allocations,"
                           " steps 2..%d %llu (%.2f per step; dsattn_alloc max %llu)\n",
                               g.name, mi ? "reference" : "fast", nthr,
                               step_counts[si], first, step_counts[si], tot,
                               (double)tot / (step_counts[si] - 1), wd);
                    CHECK_MSG(wl == 0 && wd == 0,
                              "%s (%s, %s mode, %d thread(s), %s, %d steps): up to %llu libc /"
                              " %llu dsattn_alloc allocations in a decode step after the first",
                              what, g.name, mi ? "reference" : "fast", nthr,
                              use_stack ? "stack_forward" : "attn_forward", step_counts[si],
                              wl, wd);
                    g.destroy(g.seq);
                }
        dsattn_ctx_destroy(ctx);
    }
}

enum { CAP = PREFILL + 24 + 1 };

/* ---- MHA / GQA: a small Llama config written to /tmp */
static dsattn_mha *mha_model[2];

static void make_mha(gen *g, int v)
{
    dsattn_mha_seq *s = NULL;
    CHECK_OK(dsattn_mha_seq_create(&s, mha_model[v], CAP));
    g->name = v ? "GQA (kv 2)" : "MHA";
    g->seq = s;
    g->n_layers = dsattn_mha_n_layers(mha_model[v]);
    g->dim = (size_t)dsattn_mha_dim(mha_model[v]);
    g->fwd = mha_fwd;
    g->adv = mha_adv;
    g->destroy = mha_destroy;
}

DSATTN_TEST(alloc, mha_gqa_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    char err[256] = "";
    for (int v = 0; v < 2; v++) {
        char path[128], j[512];
        snprintf(path, sizeof path, "/tmp/dsattn_test_alloc_%d_mha%d.json", (int)getpid(), v);
        snprintf(j, sizeof j,
                 "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4, \"num_key_value_heads\": %d,"
                 " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096,"
                 " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null}", v ? 2 : 4);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) return;
        fputs(j, f);
        fclose(f);
        CHECK_OK(dsattn_mha_create_random(&mha_model[v], path, 5 + (uint64_t)v, err, sizeof err));
        remove(path);
        if (!mha_model[v]) return;
    }
    check_gen("MHA/GQA", make_mha, 2);
    for (int v = 0; v < 2; v++) dsattn_mha_destroy(mha_model[v]);
}

/* ---- MLA (V3) and MLA + DSA (V3.2): the golden cases' weights */
static dsattn_mla *mla_model;

static void make_mla(gen *g, int v)
{
    static const dsattn_mla_cache fmts[2] = { DSATTN_MLA_CACHE_LATENT_BF16, DSATTN_MLA_CACHE_NAIVE };
    static const char *const names[2][2] = { { "V3 latent bf16", "V3 naive" },
                                              { "V3.2 latent bf16", "V3.2 naive" } };
    dsattn_mla_seq *s = NULL;
    CHECK_OK(dsattn_mla_seq_create(&s, mla_model, CAP, fmts[v]));
    g->name = names[dsattn_mla_is_dsa(mla_model)][v];
    g->seq = s;
    g->n_layers = dsattn_mla_n_layers(mla_model);
    g->dim = (size_t)dsattn_mla_dim(mla_model);
    g->fwd = mla_fwd;
    g->adv = mla_adv;
    g->stack = mla_stack;
    g->destroy = mla_destroy;
}

static void mla_case(const char *dir)
{
    char err[256] = "", cfg[512], w[512];
    case_paths(dir, cfg, w);
    dsattn_status st = dsattn_mla_load(&mla_model, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", dir, err);
    if (st) return;
    check_gen(dir, make_mla, 2);
    dsattn_mla_destroy(mla_model);
}

DSATTN_TEST(alloc, v3_mla_decode_allocates_nothing) { if (counting_or_skip()) mla_case("golden/v3/tiny-seed0"); }
DSATTN_TEST(alloc, v32_dsa_decode_allocates_nothing) { if (counting_or_skip()) mla_case("golden/v32/tiny-seed0"); }

/* ---- MLA batched decode (dsattn_mla_attn_forward_batch / stack_forward_batch):
 * 9 sequences of mixed depths and cache formats, a first step of all 9,
 * then steps over random subsets in random orders (B <= 9, layers or the
 * stack): every step after the first allocates nothing, on a context of 2
 * threads in both modes. */
static void mla_batch_case(const char *dir)
{
    enum { NB = 9, BSTEPS = 12 };
    char err[256] = "", cfg[512], w[512];
    case_paths(dir, cfg, w);
    dsattn_mla *m = NULL;
    dsattn_status st = dsattn_mla_load(&m, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", dir, err);
    if (st) return;
    const size_t D = (size_t)dsattn_mla_dim(m), L = (size_t)dsattn_mla_n_layers(m);
    static const dsattn_mode modes[2] = { DSATTN_MODE_FAST, DSATTN_MODE_REFERENCE };
    for (int mi = 0; mi < 2; mi++) {
        dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], 2);
        if (!ctx) break;
        dsattn_mla_seq *pool[NB];
        float *x = rand_x((PREFILL + L * NB) * D, 7 + (uint64_t)mi);
        float *out = malloc(L * NB * D * sizeof *out);
        dsattn_rng r = { 1234 };
        for (int i = 0; i < NB; i++) {
            CHECK_OK(dsattn_mla_seq_create(&pool[i], m, CAP + BSTEPS,
                                           i % 3 == 2 ? DSATTN_MLA_CACHE_NAIVE
                                                      : DSATTN_MLA_CACHE_LATENT_BF16));
            const size_t d = (size_t)i % PREFILL;           /* depths 0..7 */
            if (d == 0) continue;
            for (size_t l = 0; l < L; l++) CHECK_OK(dsattn_mla_attn_forward(ctx, pool[i], (int)l, x, d, out));
            CHECK_OK(dsattn_mla_seq_advance(pool[i], d));
        }
        unsigned long long worst_libc = 0, worst_ds = 0;
        for (int step = 0; step < BSTEPS && !dsattn_test_failed(); step++) {
            int perm[NB];
            for (int i = 0; i < NB; i++) perm[i] = i;
            for (int i = NB - 1; i > 0; i--) {
                const int j = (int)(dsattn_rng_u64(&r) % (uint64_t)(i + 1)), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            const size_t k = step == 0 ? NB : 1 + (size_t)(dsattn_rng_u64(&r) % NB);
            dsattn_mla_seq *b[NB];
            for (size_t i = 0; i < k; i++) b[i] = pool[perm[i]];
            const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
            if (step % 2) {
                CHECK_OK(dsattn_mla_stack_forward_batch(ctx, b, k, x, NULL, NULL, NULL));
            } else {
                for (size_t l = 0; l < L; l++)
                    CHECK_OK(dsattn_mla_attn_forward_batch(ctx, b, k, (int)l, x + l * k * D,
                                                           out + l * k * D, NULL));
                for (size_t i = 0; i < k; i++) CHECK_OK(dsattn_mla_seq_advance(b[i], 1));
            }
            const unsigned long long dc = libc_count() - c0, dd = dsattn_alloc_count() - d0;
            if (step == 0) continue;
            if (dc > worst_libc) worst_libc = dc;
            if (dd > worst_ds) worst_ds = dd;
        }
        printf("    %-22s %-9s batched steps 2..%d: up to %llu libc / %llu dsattn_alloc"
               " allocations per step\n", dir, mi ? "reference" : "fast", BSTEPS, worst_libc,
               worst_ds);
        CHECK_MSG(worst_libc == 0 && worst_ds == 0,
                  "%s (%s mode): up to %llu libc / %llu dsattn_alloc allocations in a batched"
                  " decode step after the first", dir, mi ? "reference" : "fast", worst_libc,
                  worst_ds);
        for (int i = 0; i < NB; i++) dsattn_mla_seq_destroy(pool[i]);
        free(x);
        free(out);
        dsattn_ctx_destroy(ctx);
    }
    dsattn_mla_destroy(m);
}

DSATTN_TEST(alloc, v3_mla_batched_decode_allocates_nothing)
{
    if (counting_or_skip()) mla_batch_case("golden/v3/tiny-seed0");
}
DSATTN_TEST(alloc, v32_dsa_batched_decode_allocates_nothing)
{
    if (counting_or_skip()) mla_batch_case("golden/v32/tiny-seed0");
}

/* ---- CSA + HCA (V4) */
static dsattn_v4 *v4_model;

static void make_v4(gen *g, int v)
{
    dsattn_v4_seq *s = NULL;
    CHECK_OK(dsattn_v4_seq_create(&s, v4_model, CAP,
                                  v ? DSATTN_V4_EMPTY_ZERO : DSATTN_V4_EMPTY_REFERENCE));
    g->name = "V4 CSA/HCA";
    g->seq = s;
    g->n_layers = dsattn_v4_n_layers(v4_model);
    g->dim = (size_t)dsattn_v4_dim(v4_model);
    g->fwd = v4_fwd;
    g->adv = v4_adv;
    g->stack = v4_stack;
    g->destroy = v4_destroy;
}

DSATTN_TEST(alloc, v4_csa_hca_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v4/tiny-seed0", cfg, w);
    dsattn_status st = dsattn_v4_load(&v4_model, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load: %s", err);
    if (st) return;
    check_gen("V4", make_v4, 1);
    dsattn_v4_destroy(v4_model);
}

/* ---- CSA2 (V4.1), bf16 and FP8 weights, both index_k modes */
static dsattn_v41 *v41_model;

static void make_v41(gen *g, int v)
{
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, v41_model, CAP,
                                   v ? DSATTN_V41_INDEX_K_REFERENCE : DSATTN_V41_INDEX_K_OWNER));
    g->name = v ? "V4.1 index_k ref" : "V4.1 index_k owner";
    g->seq = s;
    g->n_layers = dsattn_v41_n_layers(v41_model);
    g->dim = (size_t)dsattn_v41_dim(v41_model);
    g->fwd = v41_fwd;
    g->adv = v41_adv;
    g->stack = v41_stack;
    g->destroy = v41_destroy;
}

static void v41_case(const char *dir)
{
    char err[256] = "", cfg[512], w[512];
    case_paths(dir, cfg, w);
    dsattn_status st = dsattn_v41_load(&v41_model, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", dir, err);
    if (st) return;
    check_gen(dir, make_v41, 2);
    dsattn_v41_destroy(v41_model);
}

DSATTN_TEST(alloc, v41_csa2_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    v41_case("golden/v41/tiny-seed0");
    v41_case("golden/v41/tiny-seed2-fp8");
}

/* The counters count: creating a sequence allocates its caches through
 * dsattn_alloc (aligned_alloc underneath), and both counters see it. */
/* ==== Batched decode steps ============================================= */
/* A pool of sequences at mixed depths (prefills of 0..8 tokens) decodes
 * batches of changing size and membership, through the layer API and the
 * stack; after the first batched step (which sizes the context's batch
 * scratch for the largest batch, 9 here) no step allocates. */

enum { BPOOL = 9 };

typedef struct {
    const char *name;
    void *seq[BPOOL];
    int n_layers;
    size_t dim;
    dsattn_status (*fwd)(dsattn_ctx *, void *const *, size_t, int, const float *, float *);
    dsattn_status (*stack)(dsattn_ctx *, void *const *, size_t, float *);
    dsattn_status (*one)(dsattn_ctx *, void *, float *, size_t);   /* a prefill */
    dsattn_status (*adv)(void *, size_t);
    void (*destroy)(void *);
} bgen;

#define ADAPT_BATCH(G, SEQ)                                                                 \
    static dsattn_status G##_bfwd(dsattn_ctx *c, void *const *s, size_t n, int l,         \
                                  const float *x, float *o)                                \
    {                                                                                      \
        SEQ *t[BPOOL];                                                                     \
        for (size_t i = 0; i < n; i++) t[i] = (SEQ *)s[i];                                 \
        return dsattn_##G##_attn_forward_batch(c, t, n, l, x, o, NULL);                    \
    }                                                                                      \
    static dsattn_status G##_bstack(dsattn_ctx *c, void *const *s, size_t n, float *h)     \
    {                                                                                      \
        SEQ *t[BPOOL];                                                                     \
        for (size_t i = 0; i < n; i++) t[i] = (SEQ *)s[i];                                 \
        return dsattn_##G##_stack_forward_batch(c, t, n, h, NULL, NULL, NULL);             \
    }                                                                                      \
    static dsattn_status G##_one(dsattn_ctx *c, void *s, float *h, size_t n)               \
    {                                                                                      \
        return dsattn_##G##_stack_forward(c, (SEQ *)s, h, n, NULL, NULL);                  \
    }
ADAPT_BATCH(v41, dsattn_v41_seq)
ADAPT_BATCH(v4, dsattn_v4_seq)

/* 12 batched steps after the first; returns the worst per-step counts. */
static void run_batched(dsattn_ctx *ctx, const bgen *g, unsigned long long *worst_libc,
                        unsigned long long *worst_ds)
{
    static const size_t sizes[13] = { 9, 4, 9, 1, 7, 8, 2, 9, 5, 9, 3, 6, 9 };
    const size_t D = g->dim;
    float *x = rand_x(BPOOL * D * (size_t)g->n_layers + PREFILL * D, 7);
    float *out = malloc(BPOOL * D * sizeof *out);
    *worst_libc = *worst_ds = 0;
    for (size_t k = 0; k < BPOOL; k++)
        if (k % PREFILL) CHECK_OK(g->one(ctx, g->seq[k], x, k % PREFILL));
    for (size_t t = 0; t < 13; t++) {
        const size_t n = sizes[t];
        void *sub[BPOOL];
        for (size_t i = 0; i < n; i++) sub[i] = g->seq[(t * 5 + i * 7) % BPOOL];   /* distinct */
        const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
        if (t & 1) {
            CHECK_OK(g->stack(ctx, sub, n, x));
        } else {
            for (int l = 0; l < g->n_layers; l++)
                CHECK_OK(g->fwd(ctx, sub, n, l, x + (size_t)l * BPOOL * D, out));
            for (size_t i = 0; i < n; i++) CHECK_OK(g->adv(sub[i], 1));
        }
        const unsigned long long dc = libc_count() - c0, dd = dsattn_alloc_count() - d0;
        if (t == 0) continue;
        if (dc > *worst_libc) *worst_libc = dc;
        if (dd > *worst_ds) *worst_ds = dd;
    }
    free(x);
    free(out);
}

static void check_batched(void (*make)(bgen *g, int variant), int n_variants)
{
    static const dsattn_mode modes[2] = { DSATTN_MODE_FAST, DSATTN_MODE_REFERENCE };
    /* fast mode on 1 thread is left out: batches of 8 and more take the
     * Linear's tiled prefill path, whose parallel regions libgomp still
     * runs with a team it allocates */
    for (int threads = 2; threads >= 1; threads--)
        for (int mi = threads == 1; mi < 2; mi++) {
            dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], threads);
            if (!ctx) return;
            for (int v = 0; v < n_variants; v++) {
                bgen g;
                memset(&g, 0, sizeof g);
                make(&g, v);
                unsigned long long wl = 0, wd = 0;
                if (g.seq[BPOOL - 1]) run_batched(ctx, &g, &wl, &wd);
                printf("    %-22s %-9s %d thread(s), batched steps 2..13: up to %llu libc /"
                       " %llu dsattn_alloc allocations per step\n",
                       g.name, mi ? "reference" : "fast", threads, wl, wd);
                CHECK_MSG(wl == 0 && wd == 0,
                          "%s (%s mode, %d thread(s)): up to %llu libc / %llu dsattn_alloc"
                          " allocations in a batched step after the first",
                          g.name, mi ? "reference" : "fast", threads, wl, wd);
                for (int k = 0; k < BPOOL; k++) g.destroy(g.seq[k]);
            }
            dsattn_ctx_destroy(ctx);
        }
}

static void make_v41_batch(bgen *g, int v)
{
    g->name = v ? "V4.1 batch (ref index_k)" : "V4.1 batch";
    for (int k = 0; k < BPOOL; k++)
        CHECK_OK(dsattn_v41_seq_create((dsattn_v41_seq **)&g->seq[k], v41_model, CAP,
                                       v ? DSATTN_V41_INDEX_K_REFERENCE : DSATTN_V41_INDEX_K_OWNER));
    g->n_layers = dsattn_v41_n_layers(v41_model);
    g->dim = (size_t)dsattn_v41_dim(v41_model);
    g->fwd = v41_bfwd;
    g->stack = v41_bstack;
    g->one = v41_one;
    g->adv = v41_adv;
    g->destroy = v41_destroy;
}

static void make_v4_batch(bgen *g, int v)
{
    (void)v;
    g->name = "V4 batch (mixed empty)";
    for (int k = 0; k < BPOOL; k++)
        CHECK_OK(dsattn_v4_seq_create((dsattn_v4_seq **)&g->seq[k], v4_model, CAP,
                                      k & 1 ? DSATTN_V4_EMPTY_ZERO : DSATTN_V4_EMPTY_REFERENCE));
    g->n_layers = dsattn_v4_n_layers(v4_model);
    g->dim = (size_t)dsattn_v4_dim(v4_model);
    g->fwd = v4_bfwd;
    g->stack = v4_bstack;
    g->one = v4_one;
    g->adv = v4_adv;
    g->destroy = v4_destroy;
}

DSATTN_TEST(alloc, v4_batched_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v4/tiny-seed0", cfg, w);
    dsattn_status st = dsattn_v4_load(&v4_model, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load: %s", err);
    if (st) return;
    check_batched(make_v4_batch, 1);
    dsattn_v4_destroy(v4_model);
    v4_model = NULL;
}

DSATTN_TEST(alloc, v41_batched_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v41/tiny-seed2-fp8", cfg, w);
    dsattn_status st = dsattn_v41_load(&v41_model, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load: %s", err);
    if (st) return;
    check_batched(make_v41_batch, 2);
    dsattn_v41_destroy(v41_model);
    v41_model = NULL;
}

DSATTN_TEST(alloc, counters_see_library_allocations)
{
    if (!counting_or_skip()) return;
    char err[256] = "";
    dsattn_v41 *m = NULL;
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", dsattn_test_data("golden/v41/tiny-seed0/config.json"));
    CHECK_OK(dsattn_v41_load_config(&m, cfg, err, sizeof err));
    if (!m) return;
    const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
    dsattn_v41_seq *s = NULL;
    CHECK_OK(dsattn_v41_seq_create(&s, m, 64, DSATTN_V41_INDEX_K_OWNER));
    CHECK(dsattn_alloc_count() > d0);
    CHECK(libc_count() - c0 >= dsattn_alloc_count() - d0);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
}

/* The bill's per-sequence scratch at a context no sequence is made for
 * (*_seq_scratch_at) is what seq_create allocates: equal to the live
 * sequence's kv_bill at several capacities, growing with the capacity. */
DSATTN_TEST(alloc, scratch_at_is_what_seq_create_allocates)
{
    char err[256] = "", cfg[512], w[512];
    static const size_t caps[3] = { 40, 1000, 5000 };
    dsattn_kv_bill b;
    case_paths("golden/v41/tiny-seed0", cfg, w);
    dsattn_v41 *m41 = NULL;
    CHECK_OK(dsattn_v41_load_config(&m41, cfg, err, sizeof err));
    case_paths("golden/v4/tiny-seed0", cfg, w);
    dsattn_v4 *m4 = NULL;
    CHECK_OK(dsattn_v4_load_config(&m4, cfg, err, sizeof err));
    case_paths("golden/v32/tiny-seed0", cfg, w);
    dsattn_mla *m32 = NULL;
    CHECK_OK(dsattn_mla_create_config_only(&m32, cfg, err, sizeof err));
    if (!m41 || !m4 || !m32) return;
    size_t prev[3] = { 0, 0, 0 };
    for (int i = 0; i < 3; i++) {
        dsattn_v41_seq *s41 = NULL;
        dsattn_v4_seq *s4 = NULL;
        dsattn_mla_seq *s32 = NULL;
        CHECK_OK(dsattn_v41_seq_create(&s41, m41, caps[i], DSATTN_V41_INDEX_K_OWNER));
        CHECK_OK(dsattn_v4_seq_create(&s4, m4, caps[i], DSATTN_V4_EMPTY_REFERENCE));
        CHECK_OK(dsattn_mla_seq_create(&s32, m32, caps[i], DSATTN_MLA_CACHE_LATENT_BF16));
        if (!s41 || !s4 || !s32) return;
        CHECK_OK(dsattn_v41_seq_kv_bill(s41, &b));
        CHECK_EQ_INT(b.scratch_bytes, dsattn_v41_seq_scratch_at(m41, caps[i]));
        CHECK(b.scratch_bytes > prev[0]);
        prev[0] = b.scratch_bytes;
        CHECK_OK(dsattn_v4_seq_kv_bill(s4, &b));
        CHECK_EQ_INT(b.scratch_bytes, dsattn_v4_seq_scratch_at(m4, caps[i]));
        CHECK(b.scratch_bytes > prev[1]);
        prev[1] = b.scratch_bytes;
        CHECK_OK(dsattn_mla_seq_kv_bill(s32, &b));
        CHECK_EQ_INT(b.scratch_bytes,
                     dsattn_mla_seq_scratch_at(m32, caps[i], DSATTN_MLA_CACHE_LATENT_BF16));
        CHECK(b.scratch_bytes > prev[2]);
        prev[2] = b.scratch_bytes;
        dsattn_v41_seq_destroy(s41);
        dsattn_v4_seq_destroy(s4);
        dsattn_mla_seq_destroy(s32);
    }
    dsattn_v41_destroy(m41);
    dsattn_v4_destroy(m4);
    dsattn_mla_destroy(m32);
}
