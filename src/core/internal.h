/* internal.h - what every dsattn source file shares: checked size arithmetic,
 * aligned allocation, error-text helpers and the context layout.
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

struct dsattn_kernels;
struct dsattn_ktab;

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
};

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
