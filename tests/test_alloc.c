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
 * The batched decode of every generation is checked the same way over
 * batches of up to 9 sequences.  One table of entry points a generation
 * (`gen`) drives every case.
 */
#include "harness.h"

#include "internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    const char *name;                 /* in messages                            */
    int n_variants, n_batch_variants; /* one-sequence / batched variants        */
    /* sequence k of a pool (0 for one sequence) of the given variant */
    dsattn_status (*create)(void **seq, const void *m, size_t cap, int variant, int k);
    int (*n_layers)(const void *m);
    int (*dim)(const void *m);
    dsattn_status (*fwd)(dsattn_ctx *, void *, int, const float *, size_t, float *);
    dsattn_status (*adv)(void *, size_t);
    dsattn_status (*stack)(dsattn_ctx *, void *, float *, size_t);          /* NULL: none */
    dsattn_status (*bfwd)(dsattn_ctx *, void *const *, size_t, int, const float *, float *);
    dsattn_status (*bstack)(dsattn_ctx *, void *const *, size_t, float *);
    void (*destroy)(void *seq);
    dsattn_status (*load)(void **m, const char *cfg, const char *w, char *err, size_t errlen);
    void (*free_model)(void *m);
} gen;

enum { BPOOL = 9 };

#define ADAPT(G, SEQ, MODEL)                                                                \
    static int G##_n_layers(const void *m) { return dsattn_##G##_n_layers((const MODEL *)m); } \
    static int G##_dim(const void *m) { return dsattn_##G##_dim((const MODEL *)m); }       \
    static dsattn_status G##_fwd(dsattn_ctx *c, void *s, int l, const float *x, size_t n, \
                                 float *o)                                                 \
    {                                                                                      \
        return dsattn_##G##_attn_forward(c, (SEQ *)s, l, x, n, o);                         \
    }                                                                                      \
    static dsattn_status G##_adv(void *s, size_t n) { return dsattn_##G##_seq_advance((SEQ *)s, n); } \
    static void G##_destroy(void *s) { dsattn_##G##_seq_destroy((SEQ *)s); }              \
    static void G##_free_model(void *m) { dsattn_##G##_destroy((MODEL *)m); }

/* the stand-in stack, the batched steps and loading a golden case */
#define ADAPT_STACK(G, SEQ, MODEL)                                                          \
    static dsattn_status G##_stack(dsattn_ctx *c, void *s, float *h, size_t n)            \
    {                                                                                      \
        return dsattn_##G##_stack_forward(c, (SEQ *)s, h, n, NULL, NULL);                  \
    }                                                                                      \
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
    static dsattn_status G##_load(void **m, const char *cfg, const char *w, char *err,    \
                                  size_t errlen)                                           \
    {                                                                                      \
        MODEL *t = NULL;                                                                   \
        dsattn_status st = dsattn_##G##_load(&t, cfg, w, err, errlen);                     \
        *m = t;                                                                            \
        return st;                                                                         \
    }

ADAPT(mha, dsattn_mha_seq, dsattn_mha)
ADAPT(mla, dsattn_mla_seq, dsattn_mla)
ADAPT(v4, dsattn_v4_seq, dsattn_v4)
ADAPT(v41, dsattn_v41_seq, dsattn_v41)
ADAPT_STACK(mla, dsattn_mla_seq, dsattn_mla)
ADAPT_STACK(v4, dsattn_v4_seq, dsattn_v4)
ADAPT_STACK(v41, dsattn_v41_seq, dsattn_v41)

/* Each generation's sequence options: MHA none; MLA the cache format
 * (a pool mixes naive into latent bf16); V4 the all-invalid-row rule (a
 * pool mixes both); V4.1 the index_k mode (one per batch). */
static dsattn_status mha_create(void **s, const void *m, size_t cap, int v, int k)
{
    dsattn_mha_seq *t = NULL;
    dsattn_status st = dsattn_mha_seq_create(&t, m, cap);
    *s = t;
    return st;
}

static dsattn_status mla_create(void **s, const void *m, size_t cap, int v, int k)
{
    dsattn_mla_seq *t = NULL;
    dsattn_status st = dsattn_mla_seq_create(&t, m, cap, v || k % 3 == 2
                                                             ? DSATTN_MLA_CACHE_NAIVE
                                                             : DSATTN_MLA_CACHE_LATENT_BF16);
    *s = t;
    return st;
}

static dsattn_status v4_create(void **s, const void *m, size_t cap, int v, int k)
{
    dsattn_v4_seq *t = NULL;
    dsattn_status st = dsattn_v4_seq_create(&t, m, cap, (v + k) & 1 ? DSATTN_V4_EMPTY_ZERO
                                                                    : DSATTN_V4_EMPTY_REFERENCE);
    *s = t;
    return st;
}

static dsattn_status v41_create(void **s, const void *m, size_t cap, int v, int k)
{
    dsattn_v41_seq *t = NULL;
    dsattn_status st = dsattn_v41_seq_create(&t, m, cap, v ? DSATTN_V41_INDEX_K_REFERENCE
                                                           : DSATTN_V41_INDEX_K_OWNER);
    *s = t;
    return st;
}

static dsattn_status mha_bfwd(dsattn_ctx *c, void *const *s, size_t n, int l, const float *x,
                              float *o)
{
    dsattn_mha_seq *t[BPOOL];
    for (size_t i = 0; i < n; i++) t[i] = (dsattn_mha_seq *)s[i];
    return dsattn_mha_attn_forward_batch(c, t, n, l, x, o, NULL);
}

static const gen MHA = { "MHA/GQA", 1, 1, mha_create, mha_n_layers, mha_dim, mha_fwd, mha_adv,
                         NULL, mha_bfwd, NULL, mha_destroy, NULL, mha_free_model };
static const gen MLA = { "MLA", 2, 1, mla_create, mla_n_layers, mla_dim, mla_fwd, mla_adv,
                         mla_stack, mla_bfwd, mla_bstack, mla_destroy, mla_load,
                         mla_free_model };
static const gen V4 = { "V4 CSA/HCA", 1, 1, v4_create, v4_n_layers, v4_dim, v4_fwd, v4_adv,
                        v4_stack, v4_bfwd, v4_bstack, v4_destroy, v4_load, v4_free_model };
static const gen V41 = { "V4.1 CSA2", 2, 2, v41_create, v41_n_layers, v41_dim, v41_fwd,
                         v41_adv, v41_stack, v41_bfwd, v41_bstack, v41_destroy, v41_load,
                         v41_free_model };

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

enum { PREFILL = 8, CAP = PREFILL + 24 + 1 };

static const dsattn_mode modes[2] = { DSATTN_MODE_FAST, DSATTN_MODE_REFERENCE };

/* config.json and weights.safetensors of a golden case folder */
static void case_paths(const char *dir, char cfg[512], char w[512])
{
    const char *d = dsattn_test_data(dir);
    if (strlen(d) > 400) d = "/nonexistent";
    snprintf(cfg, 512, "%.400s/config.json", d);
    snprintf(w, 512, "%.400s/weights.safetensors", d);
}

static void *load_case(const gen *g, const char *dir)
{
    char err[256] = "", cfg[512], w[512];
    case_paths(dir, cfg, w);
    void *m = NULL;
    dsattn_status st = g->load(&m, cfg, w, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "load %s: %s", dir, err);
    return st ? NULL : m;
}

/* ==== One sequence ====================================================== */

/* Prefill PREFILL tokens, then `steps` decode steps (attn_forward of every
 * layer + advance, or stack_forward when use_stack).  Returns the largest
 * per-step count of libc and dsattn_alloc allocations over steps 2..steps;
 * *first gets step 1's libc count. */
static void run_steps(dsattn_ctx *ctx, const gen *g, const void *m, void *seq, int steps,
                      int use_stack, unsigned long long *worst_libc,
                      unsigned long long *worst_ds, unsigned long long *first,
                      unsigned long long *total_after_first)
{
    const size_t D = (size_t)g->dim(m);
    const int nl = g->n_layers(m);
    float *x = rand_x((PREFILL + (size_t)steps) * D, 99);
    float *out = malloc(PREFILL * D * sizeof *out);
    *worst_libc = *worst_ds = *first = *total_after_first = 0;
    for (int t = -1; t < steps; t++) {             /* -1: the prefill */
        const size_t n = t < 0 ? PREFILL : 1;
        float *xt = t < 0 ? x : x + (PREFILL + (size_t)t) * D;
        const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
        if (use_stack) {
            CHECK_OK(g->stack(ctx, seq, xt, n));
        } else {
            for (int l = 0; l < nl; l++) CHECK_OK(g->fwd(ctx, seq, l, xt, n, out));
            CHECK_OK(g->adv(seq, n));
        }
        const unsigned long long dc = libc_count() - c0, dd = dsattn_alloc_count() - d0;
        if (t < 0) continue;
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

/* Every variant, 8 and 24 steps, layer API and stack, both modes, 2
 * threads and 1: a fresh sequence of capacity CAP each time. */
static void check_gen(const char *what, const gen *g, const void *m)
{
    static const int step_counts[2] = { 8, 24 };
    static const int thread_counts[2] = { 2, 1 };
    for (int ti = 0; ti < 2; ti++)
    for (int mi = 0; mi < 2; mi++) {
        const int nthr = thread_counts[ti];
        dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], nthr);
        if (!ctx) return;
        for (int v = 0; v < g->n_variants; v++)
            for (int si = 0; si < 2; si++)
                for (int use_stack = 0; use_stack < 1 + (g->stack != NULL); use_stack++) {
                    void *seq = NULL;
                    CHECK_OK(g->create(&seq, m, CAP, v, 0));
                    if (!seq) { CHECK_MSG(0, "%s: no sequence", what); continue; }
                    unsigned long long wl, wd, first, tot;
                    run_steps(ctx, g, m, seq, step_counts[si], use_stack, &wl, &wd, &first,
                              &tot);
                    if (!use_stack)
                        printf("    %-22s variant %d %-9s %d thr %2d steps: step 1 %llu libc"
                               " allocations, steps 2..%d %llu (%.2f per step; dsattn_alloc"
                               " max %llu)\n", what, v, mi ? "reference" : "fast", nthr,
                               step_counts[si], first, step_counts[si], tot,
                               (double)tot / (step_counts[si] - 1), wd);
                    CHECK_MSG(wl == 0 && wd == 0,
                              "%s (%s variant %d, %s mode, %d thread(s), %s, %d steps): up to"
                              " %llu libc / %llu dsattn_alloc allocations in a decode step"
                              " after the first", what, g->name, v, mi ? "reference" : "fast",
                              nthr, use_stack ? "stack_forward" : "attn_forward",
                              step_counts[si], wl, wd);
                    g->destroy(seq);
                }
        dsattn_ctx_destroy(ctx);
    }
}

static void decode_case(const gen *g, const char *dir)
{
    if (!counting_or_skip()) return;
    void *m = load_case(g, dir);
    if (!m) return;
    check_gen(dir, g, m);
    g->free_model(m);
}

/* ---- MHA / GQA: a small Llama config written to /tmp, MHA (v 0) or
 * GQA with 2 KV heads (v 1) */
static dsattn_mha *mha_model(int v)
{
    char err[256] = "", path[DSATTN_TEST_PATH], j[512];
    dsattn_test_tmp(path, sizeof path, "dsattn_test_alloc_mha%d.json", v);
    snprintf(j, sizeof j,
             "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": %d,"
             " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096,"
             " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null}", v ? 2 : 4);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return NULL;
    fputs(j, f);
    fclose(f);
    dsattn_mha *m = NULL;
    CHECK_OK(dsattn_mha_create_random(&m, path, 5 + (uint64_t)v, err, sizeof err));
    remove(path);
    return m;
}

DSATTN_TEST(alloc, mha_gqa_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    for (int v = 0; v < 2; v++) {
        dsattn_mha *m = mha_model(v);
        if (!m) return;
        check_gen(v ? "GQA (kv 2)" : "MHA", &MHA, m);
        dsattn_mha_destroy(m);
    }
}

/* ---- MLA (V3) and MLA + DSA (V3.2), both cache formats; V4; V4.1 with
 * bf16 and FP8 weights, both index_k modes: the golden cases' weights */
DSATTN_TEST(alloc, v3_mla_decode_allocates_nothing) { decode_case(&MLA, "golden/v3/tiny-seed0"); }
DSATTN_TEST(alloc, v32_dsa_decode_allocates_nothing) { decode_case(&MLA, "golden/v32/tiny-seed0"); }
DSATTN_TEST(alloc, v4_csa_hca_decode_allocates_nothing)
{
    decode_case(&V4, "golden/v4/tiny-seed0");
}
DSATTN_TEST(alloc, v41_csa2_decode_allocates_nothing)
{
    decode_case(&V41, "golden/v41/tiny-seed0");
    decode_case(&V41, "golden/v41/tiny-seed2-fp8");
}

/* ==== Batched decode steps ============================================= */
/* A pool of sequences at mixed depths (prefills of 0..8 tokens) decodes
 * batches of changing size and membership, through the layer API and the
 * stack; after the first batched step (which sizes the context's batch
 * scratch for the largest batch, 9 here) no step allocates. */

/* 12 batched steps after the first; returns the worst per-step counts. */
static void run_batched(dsattn_ctx *ctx, const gen *g, const void *m, void *const *pool,
                        unsigned long long *worst_libc, unsigned long long *worst_ds)
{
    static const size_t sizes[13] = { 9, 4, 9, 1, 7, 8, 2, 9, 5, 9, 3, 6, 9 };
    const size_t D = (size_t)g->dim(m);
    const int nl = g->n_layers(m);
    float *x = rand_x(BPOOL * D * (size_t)nl + PREFILL * D, 7);
    float *out = malloc(BPOOL * D * sizeof *out);
    *worst_libc = *worst_ds = 0;
    for (size_t k = 0; k < BPOOL; k++) {
        const size_t n = k % PREFILL;          /* the prefill: the stack, else every layer */
        if (n && g->stack) {
            CHECK_OK(g->stack(ctx, pool[k], x, n));
        } else if (n) {
            for (int l = 0; l < nl; l++) CHECK_OK(g->fwd(ctx, pool[k], l, x, n, out));
            CHECK_OK(g->adv(pool[k], n));
        }
    }
    for (size_t t = 0; t < 13; t++) {
        const size_t n = sizes[t];
        void *sub[BPOOL];
        for (size_t i = 0; i < n; i++) sub[i] = pool[(t * 5 + i * 7) % BPOOL];   /* distinct */
        const unsigned long long c0 = libc_count(), d0 = dsattn_alloc_count();
        if ((t & 1) && g->bstack) {
            CHECK_OK(g->bstack(ctx, sub, n, x));
        } else {
            for (int l = 0; l < nl; l++)
                CHECK_OK(g->bfwd(ctx, sub, n, l, x + (size_t)l * BPOOL * D, out));
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

static void batched_model(const gen *g, const void *m, const char *dir)
{
    /* both modes on 2 threads and on 1 (where every parallel region of the
     * step must be a plain loop: libgomp allocates a team for a region it
     * runs on one thread) */
    for (int threads = 2; threads >= 1; threads--)
        for (int mi = 0; mi < 2; mi++) {
            dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], threads);
            if (!ctx) break;
            for (int v = 0; v < g->n_batch_variants; v++) {
                void *pool[BPOOL] = { NULL };
                int made = 1;
                for (int k = 0; k < BPOOL; k++) {
                    CHECK_OK(g->create(&pool[k], m, CAP, v, k));
                    made = made && pool[k];
                }
                unsigned long long wl = 0, wd = 0;
                if (made) run_batched(ctx, g, m, pool, &wl, &wd);
                printf("    %-22s variant %d %-9s %d thread(s), batched steps 2..13: up to %llu"
                       " libc / %llu dsattn_alloc allocations per step\n",
                       dir, v, mi ? "reference" : "fast", threads, wl, wd);
                CHECK_MSG(wl == 0 && wd == 0,
                          "%s (%s variant %d, %s mode, %d thread(s)): up to %llu libc / %llu"
                          " dsattn_alloc allocations in a batched step after the first",
                          dir, g->name, v, mi ? "reference" : "fast", threads, wl, wd);
                for (int k = 0; k < BPOOL; k++)
                    if (pool[k]) g->destroy(pool[k]);
            }
            dsattn_ctx_destroy(ctx);
        }
}

static void batched_case(const gen *g, const char *dir)
{
    if (!counting_or_skip()) return;
    void *m = load_case(g, dir);
    if (!m) return;
    batched_model(g, m, dir);
    g->free_model(m);
}

/* MLA: its pool mixes the cache formats; V4: the all-invalid-row rules;
 * V4.1: one index_k mode a batch, each in turn. */
/* A V4.1 stack with no compressed layer (every layer window-only): the
 * sequence has no index scratch, and its steps allocate nothing either. */
DSATTN_TEST(alloc, v41_window_only_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    char err[256] = "", path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_test_alloc_swa.json");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"dim\": 128, \"n_layers\": 2, \"n_heads\": 4, \"head_dim\": 64,"
          " \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 32,"
          " \"window_size\": 4, \"compress_ratios\": [0, 0], \"kv_source_layers\": [],"
          " \"index_source_layers\": [], \"candidate_source_layer\": -1,"
          " \"index_n_heads\": 8, \"index_head_dim\": 32, \"index_topk\": 5,"
          " \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0, \"rope_factor\": 16,"
          " \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
          " \"norm_eps\": 1e-20, \"dtype\": \"bf16\"}", f);
    fclose(f);
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_create_random(&m, path, 9, 0, err, sizeof err));
    remove(path);
    if (!m) return;
    check_gen("V4.1 window-only", &V41, m);
    batched_model(&V41, m, "V4.1 window-only");
    dsattn_v41_destroy(m);
}

DSATTN_TEST(alloc, mha_gqa_batched_decode_allocates_nothing)
{
    if (!counting_or_skip()) return;
    for (int v = 0; v < 2; v++) {
        dsattn_mha *m = mha_model(v);
        if (!m) return;
        batched_model(&MHA, m, v ? "GQA (kv 2)" : "MHA");
        dsattn_mha_destroy(m);
    }
}
DSATTN_TEST(alloc, v3_mla_batched_decode_allocates_nothing)
{
    batched_case(&MLA, "golden/v3/tiny-seed0");
}
DSATTN_TEST(alloc, v32_dsa_batched_decode_allocates_nothing)
{
    batched_case(&MLA, "golden/v32/tiny-seed0");
}
DSATTN_TEST(alloc, v4_batched_decode_allocates_nothing)
{
    batched_case(&V4, "golden/v4/tiny-seed0");
}
DSATTN_TEST(alloc, v41_batched_decode_allocates_nothing)
{
    batched_case(&V41, "golden/v41/tiny-seed2-fp8");
}

/* The counters count: creating a sequence allocates its caches through
 * dsattn_alloc (aligned_alloc underneath), and both counters see it. */
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

/* ==== What a prefill leaves in the sequence ============================= */
/* A prefill chunk longer than a decode step borrows its scratch from the
 * context (or the heap, for the call), and the rows it leaves for later
 * layers and for *_seq_selection live until the sequence's next step: once
 * a decode step has run, the sequence's bill (scratch_bytes) is what it was
 * at creation.  The context lends the same bytes to the next sequence's
 * chunk instead of growing again. */
typedef struct {
    const gen *g;
    dsattn_status (*bill)(const void *s, dsattn_kv_bill *b);
} billed;

static dsattn_status mha_bill(const void *s, dsattn_kv_bill *b)
{
    return dsattn_mha_seq_kv_bill((const dsattn_mha_seq *)s, b);
}
static dsattn_status mla_bill(const void *s, dsattn_kv_bill *b)
{
    return dsattn_mla_seq_kv_bill((const dsattn_mla_seq *)s, b);
}
static dsattn_status v4_bill(const void *s, dsattn_kv_bill *b)
{
    return dsattn_v4_seq_kv_bill((const dsattn_v4_seq *)s, b);
}
static dsattn_status v41_bill(const void *s, dsattn_kv_bill *b)
{
    return dsattn_v41_seq_kv_bill((const dsattn_v41_seq *)s, b);
}

enum { LONG_CAP = 96, LONG_CHUNK = 80 };

/* every layer of seq over n rows of x, then advance */
static void layers_step(dsattn_ctx *ctx, const gen *g, const void *m, void *seq,
                        const float *x, size_t n, float *out)
{
    for (int l = 0; l < g->n_layers(m); l++) CHECK_OK(g->fwd(ctx, seq, l, x, n, out));
    CHECK_OK(g->adv(seq, n));
}

static void prefill_case(const char *what, const billed *b, const void *m)
{
    const gen *g = b->g;
    const size_t D = (size_t)g->dim(m);
    float *x = rand_x((LONG_CHUNK + 1) * D, 7), *out = malloc(LONG_CHUNK * D * sizeof *out);
    for (int mi = 0; mi < 2; mi++) {
        const char *mode = mi ? "reference" : "fast";
        dsattn_ctx *ctx = dsattn_test_ctx(modes[mi], 2);
        if (!ctx || !out) break;
        size_t lent = 0;
        for (int k = 0; k < 2; k++) {                  /* two sequences, one context */
            void *seq = NULL;
            CHECK_OK(g->create(&seq, m, LONG_CAP, 0, 0));
            if (!seq) break;
            dsattn_kv_bill b0, b1, b2;
            CHECK_OK(b->bill(seq, &b0));
            layers_step(ctx, g, m, seq, x, LONG_CHUNK, out);
            CHECK_OK(b->bill(seq, &b1));
            const size_t c = dsattn_ctx_scratch_bytes(ctx);
            if (k == 0) lent = c;
            else CHECK_MSG(c == lent, "%s (%s mode): the second sequence's prefill grew the"
                           " context's scratch from %zu to %zu B", what, mode, lent, c);
            layers_step(ctx, g, m, seq, x + LONG_CHUNK * D, 1, out);
            CHECK_OK(b->bill(seq, &b2));
            CHECK_MSG(b2.scratch_bytes == b0.scratch_bytes,
                      "%s (%s mode, sequence %d): after a %d-token prefill (scratch %zu B) and"
                      " a decode step the sequence holds %zu B of scratch, not its %zu B",
                      what, mode, k, LONG_CHUNK, b1.scratch_bytes, b2.scratch_bytes,
                      b0.scratch_bytes);
            g->destroy(seq);
        }
        dsattn_ctx_destroy(ctx);
    }
    free(x);
    free(out);
}

DSATTN_TEST(alloc, prefill_leaves_nothing_past_the_next_step)
{
    const billed bm = { &MHA, mha_bill }, bl = { &MLA, mla_bill };
    const billed b4 = { &V4, v4_bill }, b41 = { &V41, v41_bill };
    for (int v = 0; v < 2; v++) {
        dsattn_mha *m = mha_model(v);
        if (!m) return;
        prefill_case(v ? "GQA (kv 2)" : "MHA", &bm, m);
        dsattn_mha_destroy(m);
    }
    const struct { const billed *b; const char *dir; } cases[] = {
        { &bl, "golden/v3/tiny-seed0" }, { &bl, "golden/v32/tiny-seed0" },
        { &b4, "golden/v4/tiny-seed0" }, { &b41, "golden/v41/tiny-seed0" },
        { &b41, "golden/v41/tiny-seed2-fp8" } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *m = load_case(cases[i].b->g, cases[i].dir);
        if (!m) return;
        prefill_case(cases[i].dir, cases[i].b, m);
        cases[i].b->g->free_model(m);
    }
}

/* ==== Requests past the memory available ================================ */
/* dsattn_alloc zeroes what it hands out, so a request the system cannot
 * back would get the process killed by the OOM killer while it is written;
 * one of 64 MiB or more past the memory available fails instead (NULL, and
 * DSATTN_ERR_NOMEM through the API).  $DSATTN_MEM_AVAILABLE stands in for
 * the kernel's figure. */
DSATTN_TEST(alloc, requests_past_the_available_memory_are_refused)
{
    setenv("DSATTN_MEM_AVAILABLE", "100000000", 1);                  /* 100 MB */
    void *big = dsattn_alloc((size_t)200 << 20), *fits = dsattn_alloc((size_t)80 << 20);
    CHECK_MSG(big == NULL, "a 200 MiB request with 100 MB available was granted");
    CHECK_MSG(fits != NULL, "an 80 MiB request with 100 MB available was refused");
    dsattn_free(big);
    dsattn_free(fits);
    /* through the API: a sequence whose caches need more than that */
    char err[256] = "", cfg[512], w[512];
    case_paths("golden/v41/tiny-seed0", cfg, w);
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_load_config(&m, cfg, err, sizeof err));
    dsattn_v41_seq *s = NULL;
    if (m) {
        const size_t cap = (size_t)1 << 22;                          /* 4M tokens */
        CHECK_EQ_INT(dsattn_v41_seq_create(&s, m, cap, DSATTN_V41_INDEX_K_OWNER),
                     DSATTN_ERR_NOMEM);
        CHECK(s == NULL);
    }
    unsetenv("DSATTN_MEM_AVAILABLE");
    /* without the stand-in, the machine's own figure: an ordinary sequence is made */
    if (m) {
        const dsattn_status st = dsattn_v41_seq_create(&s, m, 1000, DSATTN_V41_INDEX_K_OWNER);
        CHECK_OK(st);
        dsattn_v41_seq_destroy(s);
    }
    dsattn_v41_destroy(m);
}

/* ==== The cgroup memory limits the guard reads ========================== */

/* root/rel holds text (its directories made first) */
static void put(const char *root, const char *rel, const char *text)
{
    char p[DSATTN_TEST_PATH + 256];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        if (mkdir(p, 0700) && errno != EEXIST) CHECK_MSG(0, "mkdir %s: %s", p, strerror(errno));
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    CHECK_MSG(f != NULL, "cannot write %s", p);
    if (f) { fputs(text, f); fclose(f); }
}

#define ROOM_IS(want)                                                                       \
    do {                                                                                    \
        const double got_ = dsattn_cgroup_room(cg, root);                                   \
        CHECK_MSG(got_ == (double)(want), "cgroup room %.0f, want %.0f", got_, (double)(want)); \
    } while (0)

DSATTN_TEST(alloc, cgroup_v1_and_v2_limits_are_read)
{
    char root[DSATTN_TEST_PATH], cg[DSATTN_TEST_PATH + 16];
    if (!dsattn_test_tmp(root, sizeof root, "cgroups") || mkdir(root, 0700)) {
        CHECK_MSG(0, "cannot make %s", root);
        return;
    }
    /* v1, the process's own directory: 1 GB limit, 600 MB charged of which
     * 100 MB inactive page cache (the hierarchical total, not the local one) */
    put(root, "memory/a/b/memory.limit_in_bytes", "1000000000\n");
    put(root, "memory/a/b/memory.usage_in_bytes", "600000000\n");
    put(root, "memory/a/b/memory.stat", "cache 1\ninactive_file 7\ntotal_inactive_file 100000000\n");
    put(root, "self", "12:pids:/x\n4:cpu,memory:/a/b\n0::/\n");
    snprintf(cg, sizeof cg, "%s/self", root);
    ROOM_IS(500e6);
    /* v1 unlimited (the kernel writes ~2^63): no limit */
    put(root, "memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
    ROOM_IS(-1);
    /* inside a container: the path names a directory not mounted here; the
     * hierarchy's top is the container's own cgroup */
    put(root, "self", "4:memory:/docker/abc\n");
    put(root, "memory/memory.limit_in_bytes", "2000000000\n");
    put(root, "memory/memory.usage_in_bytes", "300000000\n");
    put(root, "memory/memory.stat", "total_inactive_file 0\n");
    ROOM_IS(1700e6);
    /* v2: memory.max less (memory.current less inactive_file); the least of
     * v1 and v2 where both are set */
    put(root, "self", "4:memory:/docker/abc\n0::/svc\n");
    put(root, "svc/memory.max", "1200000000\n");
    put(root, "svc/memory.current", "500000000\n");
    put(root, "svc/memory.stat", "active_file 5\ninactive_file 100000000\n");
    ROOM_IS(800e6);
    put(root, "svc/memory.max", "max\n");
    ROOM_IS(1700e6);
    /* a charge past the limit: no room; no file: unknown */
    put(root, "memory/memory.usage_in_bytes", "2500000000\n");
    ROOM_IS(0);
    put(root, "self", "1:cpu:/\n0::/\n");
    ROOM_IS(-1);
    snprintf(cg, sizeof cg, "%s/none", root);
    ROOM_IS(-1);
}
