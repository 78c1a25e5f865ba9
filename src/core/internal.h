/* internal.h - what every dsattn source file shares: checked size arithmetic,
 * aligned allocation and the memory-available limit, error-text helpers, the
 * context layout, a call's workspace (dsattn_ws), owned allocations and the
 * rows a chunk leaves for later layers (dsattn_chunk_rows).
 *
 * Nothing here is public.  Size arithmetic on anything that came from a file,
 * a config or a caller goes through dsattn_mul_size / dsattn_add_size, which
 * report overflow instead of wrapping.  Allocation failures are statuses,
 * never exits.
 */
#ifndef DSATTN_INTERNAL_H
#define DSATTN_INTERNAL_H

#include "dsattn.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The most layers (backbone + MTP) any generation's model holds: fixed
 * per-layer arrays in configs, plans, models and sequences.  Every
 * published model has at most 126. */
#define DSATTN_MAX_LAYERS 256

struct dsattn_kernels;
struct dsattn_ktab;

/* The context's grow-only scratch slots (dsattn_ctx_scratch). */
typedef enum {
    DSATTN_CTX_SCR_BATCH,        /* the [n_seqs x ...] rows of a batched step     */
    DSATTN_CTX_SCR_CHUNK,        /* a prefill chunk's forward rows                */
    DSATTN_CTX_SCR_CHUNK_INDEX,  /* V4.1: a prefill chunk's indexer / compressor  */
    DSATTN_CTX_SCR_SLOTS
} dsattn_ctx_scr;

struct dsattn_ctx {
    dsattn_mode                  mode;
    dsattn_isa                   isa;     /* resolved, never AUTO          */
    int                          n_threads;
    /* every kernel this context runs, chosen once (src/kernels/ktab.h,
     * dispatch.c); the AMX slot kt->amx is non-NULL when the AMX-BF16
     * forms are allowed (avx512 table, CPU and OS have them, $DSATTN_AMX
     * is not "0", dsattn_ctx_set_amx) */
    const struct dsattn_ktab    *kt;
    const struct dsattn_kernels *k;       /* = kt->k, the base table       */
    dsattn_counters              cnt;     /* flops / bytes, see dsattn.h   */
    int                          prof_on; /* dsattn_ctx_set_profiling      */
    int                          phase;   /* open phase, -1: none          */
    dsattn_profile               prof;
    /* grow-only scratch of the prefill Linear (linear.c), kept between
     * calls so each chunk does not re-fault and re-zero megabytes; used
     * only outside parallel regions (a context runs one call at a time) */
    void                        *lin_ws;
    size_t                       lin_ws_bytes;
    /* grow-only scratch of a call (dsattn_ctx_scratch), one buffer a slot */
    void                        *scr[DSATTN_CTX_SCR_SLOTS];
    size_t                       scr_bytes[DSATTN_CTX_SCR_SLOTS];
};

/* The context's scratch in `slot` of at least `bytes` (64-byte aligned,
 * contents undefined, never NULL for 0 bytes), kept between calls: a call
 * allocates only when it needs more than any call before it on this
 * context took from the slot.  NULL on OOM.  One call at a time per
 * context (the API's rule); the previous pointer of the slot is invalid
 * after a request that grows it.  What a sequence keeps is sized for a
 * decode step; a prefill chunk that needs more takes it from here, so a
 * sequence holds no more after a long prompt than before, and the
 * sequences of one context share one chunk's scratch. */
void *dsattn_ctx_scratch(dsattn_ctx *ctx, dsattn_ctx_scr slot, size_t bytes);
/* own (own_bytes) when it holds `bytes`, else the context's slot: the
 * scratch of a forward whose sequence was sized for a decode step. */
static inline void *dsattn_call_scratch(dsattn_ctx *ctx, dsattn_ctx_scr slot, void *own,
                                        size_t own_bytes, size_t bytes)
{
    return own && bytes <= own_bytes ? own : dsattn_ctx_scratch(ctx, slot, bytes);
}

/* ==== Checked size arithmetic ========================================== */

static inline bool dsattn_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

static inline bool dsattn_add_size(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}

/* a*b*c, false on overflow */
static inline bool dsattn_mul3_size(size_t a, size_t b, size_t c, size_t *out)
{
    size_t t;
    return dsattn_mul_size(a, b, &t) && dsattn_mul_size(t, c, out);
}

/* ==== Allocation ======================================================== */

/* 64-byte aligned, zeroed; NULL on failure or n == 0 overflow.  Free with
 * dsattn_free.  Sizes are checked by the caller with dsattn_mul_size. */
void *dsattn_alloc(size_t n);
void  dsattn_free(void *p);
/* dsattn_alloc(a*b) with the product checked; NULL on overflow or OOM. */
void *dsattn_alloc_array(size_t a, size_t b);
/* How many times dsattn_alloc has been called in this process (all
 * threads; relaxed atomic).  A decode step must not move it. */
uint64_t dsattn_alloc_count(void);

/* A set of allocations freed together: what a model converted or made. */
typedef struct dsattn_owned {
    void  **p;
    size_t  n, cap;
} dsattn_owned;

/* Adopt p (NULL -> DSATTN_ERR_NOMEM).  On failure p is freed, so callers
 * can write `if ((st = dsattn_owned_add(&o, dsattn_alloc(n)))) return st;`. */
dsattn_status dsattn_owned_add(dsattn_owned *o, void *p);
/* Free every adopted allocation and the list itself; the set is empty after. */
void dsattn_owned_free(dsattn_owned *o);

/* ==== The machine's memory (core.c) ==================================== */

/* The first number after `key` at the start of a line of the file (the
 * first line's for key ""), or -1 when there is none or no file. */
double dsattn_file_number(const char *path, const char *key);
/* Bytes this process may still allocate and touch: $DSATTN_MEM_AVAILABLE,
 * else MemAvailable within its cgroup memory limit's headroom; -1 when
 * unknown.  dsattn_alloc refuses requests of 64 MiB or more past it. */
double dsattn_mem_available(void);
/* The headroom of the memory limits of the cgroups cgroup_file lists (as
 * /proc/self/cgroup does) under the hierarchy root (/sys/fs/cgroup): v2
 * memory.max - memory.current, v1 memory.limit_in_bytes -
 * memory.usage_in_bytes (in the cgroup's directory, else the memory
 * hierarchy's top, where a container mounts its own), each charge less its
 * inactive page cache; the least of those set, -1 when none is. */
double dsattn_cgroup_room(const char *cgroup_file, const char *root);

/* ==== Rows a chunk leaves behind ======================================= */

/* Rows a call leaves for later layers or for the caller to read (a chunk's
 * top-k selections, V4.1's runtime slots).  A sequence allocates `own` at
 * creation, sized for a decode step; a longer chunk gets a buffer of its
 * own, which the next call that fits `own` frees (a free, not an
 * allocation), so a long prompt's rows live only until the sequence's next
 * step.  *p / *cap: the buffer in use and its elements (own / own_cap, or
 * the chunk's).  Returns *p for `need` elements, NULL on OOM (nothing in
 * use changed). */
void  *dsattn_chunk_rows(void **p, size_t *cap, void *own, size_t own_cap, size_t need,
                         size_t elem);
/* free both (p may be own) */
void   dsattn_chunk_rows_free(void *p, void *own);
/* bytes held: own, and the chunk's buffer if one is in use */
size_t dsattn_chunk_rows_bytes(const void *p, size_t cap, const void *own, size_t own_cap,
                               size_t elem);

/* ==== Step scratch ===================================================== */

/* A sequence's decode scratch: one buffer sized at sequence creation from
 * the model and the sequence's capacity (so a decode step allocates
 * nothing), handed out front to back and taken back with mark / reset.
 * A request that does not fit (a prefill chunk, a context with more
 * threads than the sequence was sized for) is a heap allocation kept in
 * `spill` until the reset past it: correct, only not allocation-free.
 * Not thread-safe: take per-thread pieces before a parallel region.
 * Every function accepts w == NULL and then allocates (get) and frees
 * (put) on the heap, for callers that run in parallel (prefill rows). */
typedef struct dsattn_ws {
    uint8_t     *base;
    size_t       cap, used;
    size_t       high;           /* most bytes in use at once              */
    dsattn_owned spill;
} dsattn_ws;

/* One allocation of `bytes` (0: none).  NOMEM on failure. */
dsattn_status dsattn_ws_init(dsattn_ws *w, size_t bytes);
void  dsattn_ws_free(dsattn_ws *w);
/* 64-byte aligned, contents undefined (getz: zeroed); NULL on OOM. */
void *dsattn_ws_get(dsattn_ws *w, size_t bytes);
void *dsattn_ws_getz(dsattn_ws *w, size_t bytes);
/* a*b bytes, the product checked */
void *dsattn_ws_array(dsattn_ws *w, size_t a, size_t b);
void *dsattn_ws_arrayz(dsattn_ws *w, size_t a, size_t b);
/* w == NULL: dsattn_free(p); else nothing (reset takes it back). */
void  dsattn_ws_put(dsattn_ws *w, void *p);
/* A point to come back to: bytes in use and spills held. */
typedef struct {
    size_t used, spills;
} dsattn_ws_pos;
dsattn_ws_pos dsattn_ws_mark(const dsattn_ws *w);
/* Everything got since `mark` is free again, spills included. */
void  dsattn_ws_reset(dsattn_ws *w, dsattn_ws_pos mark);

/* Sizing: *acc += a*b rounded up to 64 bytes (what one get of a*b takes);
 * saturates at SIZE_MAX on overflow, which ws_init then refuses. */
static inline void dsattn_ws_need(size_t *acc, size_t a, size_t b)
{
    size_t n;
    if (!dsattn_mul_size(a, b, &n) || !dsattn_add_size(n, 63, &n) ||
        !dsattn_add_size(*acc, n & ~(size_t)63, acc))
        *acc = SIZE_MAX;
}
/* Threads a sequence sizes its per-thread scratch for: the most a context
 * created now would run (omp_get_max_threads, and at least the processor
 * count). */
int dsattn_ws_threads(void);

/* ==== Parallel regions without a team of one =========================== */

/* Run the block on nt threads: a parallel region when nt > 1, the plain
 * block otherwise.  libgomp allocates (and frees) a team for every region
 * that runs on one thread - num_threads(1), or an if() clause that is
 * false - so a decode step that opened such regions allocated each time.
 * Inside the block, dsattn_tid / dsattn_nth are this thread's number and
 * the block's thread count (0 / 1 when run plainly, also inside an outer
 * region); split work with dsattn_range, never with an orphaned `omp for`
 * (run plainly inside an outer region it would bind to the outer team). */
#define DSATTN_PARALLEL(nt, ...)                                           \
    do {                                                                   \
        const int dsattn_par_nt_ = (int)(nt);                              \
        if (dsattn_par_nt_ > 1) {                                          \
            _Pragma("omp parallel num_threads(dsattn_par_nt_)")            \
            {                                                              \
                const int dsattn_tid = dsattn_thread_num();                \
                const int dsattn_nth = dsattn_num_threads();               \
                (void)dsattn_tid;                                          \
                (void)dsattn_nth;                                          \
                __VA_ARGS__                                                \
            }                                                              \
        } else {                                                           \
            const int dsattn_tid = 0, dsattn_nth = 1;                      \
            (void)dsattn_tid;                                              \
            (void)dsattn_nth;                                              \
            __VA_ARGS__                                                    \
        }                                                                  \
    } while (0)

/* for (size_t var = 0; var < n; var++) { body } as schedule(dynamic, 1)
 * on nt threads when nt > 1 and n > 1, else the plain loop in this
 * thread: libgomp allocates (and frees) a team for every region run on
 * one thread, which a decode step must not do.  In the body,
 * dsattn_thread_num() is this thread's number (0 in the plain loop). */
#define DSATTN_PARALLEL_FOR_DYN(nt, var, n, ...)                           \
    do {                                                                   \
        const int dsattn_pf_nt_ = (int)(nt);                               \
        const size_t dsattn_pf_n_ = (size_t)(n);                           \
        if (dsattn_pf_nt_ > 1 && dsattn_pf_n_ > 1) {                       \
            _Pragma("omp parallel for schedule(dynamic, 1) num_threads(dsattn_pf_nt_)") \
            for (size_t var = 0; var < dsattn_pf_n_; var++) { __VA_ARGS__ }             \
        } else {                                                           \
            for (size_t var = 0; var < dsattn_pf_n_; var++) { __VA_ARGS__ }             \
        }                                                                  \
    } while (0)

/* Thread tid's share [*lo, *hi) of n items split in nth contiguous parts
 * (the partition of schedule(static)). */
static inline void dsattn_range(size_t n, int tid, int nth, size_t *lo, size_t *hi)
{
    const size_t chunk = (n + (size_t)nth - 1) / (size_t)nth;
    const size_t first = (size_t)tid * chunk;
    *lo = first < n ? first : n;
    *hi = n - *lo < chunk ? n : *lo + chunk;
}

#ifdef _OPENMP
int  omp_get_thread_num(void);
int  omp_get_num_threads(void);
void omp_set_num_threads(int n);
#endif
static inline int dsattn_thread_num(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static inline int dsattn_num_threads(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}
static inline void dsattn_set_num_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* ==== Error text ======================================================== */

/* printf into err[errlen] if err != NULL; returns st so callers can write
 * `return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "...", ...);`. */
dsattn_status dsattn_errf(char *err, size_t errlen, dsattn_status st,
                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ==== Misc ============================================================== */

#define DSATTN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DSATTN_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define DSATTN_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Internal invariant (never for validating input): always on. */
void dsattn_assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));
#define DSATTN_ASSERT(e) \
    ((e) ? (void)0 : dsattn_assert_fail(#e, __FILE__, __LINE__))

static inline void dsattn_count(dsattn_ctx *ctx, uint64_t flops, uint64_t bytes)
{
    if (ctx) {
#pragma omp atomic
        ctx->cnt.flops += flops;
#pragma omp atomic
        ctx->cnt.bytes_read += bytes;
    }
}

/* ==== Phase profile (dsattn.h dsattn_profile) ========================= */

static inline double dsattn_clock(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    int      ph;                  /* -1: this mark records nothing        */
    double   t0;
    uint64_t b0, f0;
} dsattn_phase_mark;

/* Phases do not nest: a begin inside an open phase records nothing, so a
 * helper may mark its own phase and still be called from a bigger one. */
static inline void dsattn_phase_begin(dsattn_ctx *ctx, dsattn_phase ph, dsattn_phase_mark *m)
{
    m->ph = -1;
    m->t0 = 0.0;
    m->b0 = m->f0 = 0;
    if (!ctx->prof_on || ctx->phase >= 0) return;
    m->ph = (int)ph;
    ctx->phase = (int)ph;
    m->b0 = ctx->cnt.bytes_read;
    m->f0 = ctx->cnt.flops;
    m->t0 = dsattn_clock();
}

/* Closes the mark's phase; a second end of the same mark does nothing, so
 * an error path may end whatever is open. */
static inline void dsattn_phase_end(dsattn_ctx *ctx, dsattn_phase_mark *m)
{
    if (m->ph < 0) return;
    ctx->prof.seconds[m->ph] += dsattn_clock() - m->t0;
    ctx->prof.bytes_read[m->ph] += ctx->cnt.bytes_read - m->b0;
    ctx->prof.flops[m->ph] += ctx->cnt.flops - m->f0;
    ctx->phase = -1;
    m->ph = -1;
}

#endif /* DSATTN_INTERNAL_H */
