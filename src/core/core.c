/* core.c - status strings, version, aligned allocation, error text and the
 * one internal-invariant failure path; the memory-available limit that
 * large allocations are checked against (dsattn_mem_available: MemAvailable,
 * a cgroup v1 / v2 limit, DSATTN_MEM_AVAILABLE); a call's workspace
 * (dsattn_ws_*), owned allocations (dsattn_owned_*) and the rows a chunk
 * leaves for later layers (dsattn_chunk_rows*).  The one global is the
 * process-wide count of dsattn_alloc calls (an atomic, read by the tests
 * that check a decode step allocates nothing). */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif

const char *dsattn_status_str(dsattn_status s)
{
    switch (s) {
    case DSATTN_OK:              return "ok";
    case DSATTN_ERR_INVALID_ARG: return "invalid argument";
    case DSATTN_ERR_NOMEM:       return "out of memory";
    case DSATTN_ERR_UNSUPPORTED: return "unsupported";
    case DSATTN_ERR_FORMAT:      return "malformed input";
    case DSATTN_ERR_OVERFLOW:    return "size overflow";
    case DSATTN_ERR_IO:          return "i/o error";
    case DSATTN_ERR_NOT_FOUND:   return "not found";
    }
    return "unknown status";
}

const char *dsattn_version(void)
{
#define DSATTN_STR2(x) #x
#define DSATTN_STR(x) DSATTN_STR2(x)
    return DSATTN_STR(DSATTN_VERSION_MAJOR) "." DSATTN_STR(DSATTN_VERSION_MINOR)
           "." DSATTN_STR(DSATTN_VERSION_PATCH);
}

/* Buffers of 2 MiB and more - weights, deep caches, probes - are what a
 * decode step streams.  They are 2 MiB aligned and asked for as
 * transparent huge pages before the first touch: where the kernel gives
 * huge pages only on request (THP "madvise"), 4 KiB pages cost a TLB walk
 * every 64 cache lines and stop the hardware prefetcher at each page edge
 * (about 11 % of a GQA decode step at 256K, docs/mha.md; a V4.1 wq_a of
 * 6.5 MB streamed at 13 GB/s on 4 KiB pages and 19 GB/s on huge pages, in
 * the stack).  The padding to whole huge pages costs at most 2 MiB per
 * buffer.  The advice is a hint; where THP is off it changes nothing. */
#define DSATTN_HUGE_PAGE ((size_t)2 << 20)
#define DSATTN_HUGE_MIN  ((size_t)2 << 20)

static atomic_ullong alloc_calls;

/* dsattn_alloc zeroes what it returns, so under Linux's overcommit a
 * request past the memory the system has would succeed and the process be
 * killed by the OOM killer while the pages are written - a crash where the
 * caller should get DSATTN_ERR_NOMEM.  So a request of DSATTN_ALLOC_CHECK
 * bytes or more is first compared with what is available: the kernel's
 * MemAvailable, and the process's cgroup memory limit's headroom where
 * one is set, v2 or v1 (its charge less inactive page cache).
 * $DSATTN_MEM_AVAILABLE (bytes) stands in for both (tests).  Unknown
 * (no /proc): not checked.  Smaller requests are not worth the read. */
#define DSATTN_ALLOC_CHECK ((size_t)64 << 20)

double dsattn_file_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    double v = -1;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) {
            char *end;
            const double x = strtod(line + n, &end);
            if (end != line + n) v = x;
            break;
        }
    fclose(f);
    return v;
}

double dsattn_mem_available(void)
{
    const char *e = getenv("DSATTN_MEM_AVAILABLE");
    if (e && *e) {
        char *end;
        const double v = strtod(e, &end);
        if (end != e && v >= 0) return v;
    }
    double avail = dsattn_file_number("/proc/meminfo", "MemAvailable:");
    if (avail >= 0) avail *= 1024.0;                       /* kB */
    const double room = dsattn_cgroup_room("/proc/self/cgroup", "/sys/fs/cgroup");
    if (room >= 0) avail = avail < 0 ? room : (room < avail ? room : avail);
    return avail;
}

/* A limit's headroom from the files of one cgroup directory: the limit
 * less the charge, the charge less the page cache the kernel would reclaim
 * first (inactive files).  -1: no limit or no files. */
static double room_in(const char *dir, const char *limit, const char *charge, const char *cache)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, limit);
    const double max = dsattn_file_number(path, "");    /* v2 "max": -1 */
    if (max < 0 || max >= 0x1p62) return -1;             /* v1 unlimited: ~2^63 */
    snprintf(path, sizeof path, "%s/%s", dir, charge);
    double cur = dsattn_file_number(path, "");
    if (cur < 0) return -1;
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    const double c = dsattn_file_number(path, cache);
    if (c > 0) cur = cur > c ? cur - c : 0;
    return max > cur ? max - cur : 0;
}

double dsattn_cgroup_room(const char *cgroup_file, const char *root)
{
    FILE *f = fopen(cgroup_file, "r");
    if (!f) return -1;
    char line[1024], dir[1200];
    double room = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        /* "id:controllers:path"; v2 is "0::path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *ctl = c1 + 1, *cg = c2 + 1;
        double r = -1;
        if (!strcmp(line, "0") && !*ctl) {
            snprintf(dir, sizeof dir, "%s%s", root, cg);
            r = room_in(dir, "memory.max", "memory.current", "inactive_file ");
        } else {
            int mem = 0;                                 /* "memory" in the list */
            for (const char *p = ctl; *p;) {
                const size_t n = strcspn(p, ",");
                if (n == 6 && !strncmp(p, "memory", 6)) mem = 1;
                p += n + (p[n] == ',');
            }
            if (!mem) continue;
            /* the process's own cgroup directory; inside a container the
             * hierarchy is often mounted at its own cgroup instead */
            snprintf(dir, sizeof dir, "%s/memory%s", root, cg);
            r = room_in(dir, "memory.limit_in_bytes", "memory.usage_in_bytes",
                        "total_inactive_file ");
            if (r < 0) {
                snprintf(dir, sizeof dir, "%s/memory", root);
                r = room_in(dir, "memory.limit_in_bytes", "memory.usage_in_bytes",
                            "total_inactive_file ");
            }
        }
        if (r >= 0) room = room < 0 ? r : (r < room ? r : room);
    }
    fclose(f);
    return room;
}

uint64_t dsattn_alloc_count(void)
{
    return atomic_load_explicit(&alloc_calls, memory_order_relaxed);
}

void *dsattn_alloc(size_t n)
{
    atomic_fetch_add_explicit(&alloc_calls, 1, memory_order_relaxed);
    if (n == 0) n = 1;
    const size_t align = n >= DSATTN_HUGE_MIN ? DSATTN_HUGE_PAGE : 64;
    size_t padded;
    if (!dsattn_add_size(n, align - 1, &padded)) return NULL;
    padded &= ~(align - 1);
    if (padded >= DSATTN_ALLOC_CHECK) {
        const double avail = dsattn_mem_available();
        if (avail >= 0 && (double)padded > avail) return NULL;
    }
    void *p = aligned_alloc(align, padded);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == DSATTN_HUGE_PAGE) (void)madvise(p, padded, MADV_HUGEPAGE);
#endif
    memset(p, 0, padded);
    return p;
}

void dsattn_free(void *p) { free(p); }

void *dsattn_alloc_array(size_t a, size_t b)
{
    size_t n;
    if (!dsattn_mul_size(a, b, &n)) return NULL;
    return dsattn_alloc(n);
}

/* ==== Step scratch (internal.h dsattn_ws) ============================= */

dsattn_status dsattn_ws_init(dsattn_ws *w, size_t bytes)
{
    memset(w, 0, sizeof *w);
    if (bytes == SIZE_MAX) return DSATTN_ERR_OVERFLOW;
    if (bytes == 0) return DSATTN_OK;
    if (!(w->base = dsattn_alloc(bytes))) return DSATTN_ERR_NOMEM;
    w->cap = bytes;
    return DSATTN_OK;
}

void dsattn_ws_free(dsattn_ws *w)
{
    if (!w) return;
    dsattn_owned_free(&w->spill);
    dsattn_free(w->base);
    memset(w, 0, sizeof *w);
}

void *dsattn_ws_get(dsattn_ws *w, size_t bytes)
{
    if (!w) return dsattn_alloc(bytes);
    size_t n;
    if (!dsattn_add_size(bytes, 63, &n)) return NULL;
    n &= ~(size_t)63;
    if (n <= w->cap - w->used) {
        void *p = w->base + w->used;
        w->used += n;
        if (w->used > w->high) w->high = w->used;
        return p;
    }
    void *p = dsattn_alloc(bytes);
    if (p && dsattn_owned_add(&w->spill, p)) return NULL;   /* add freed p */
    return p;
}

void *dsattn_ws_getz(dsattn_ws *w, size_t bytes)
{
    void *p = dsattn_ws_get(w, bytes);
    if (p && w) memset(p, 0, bytes);     /* dsattn_alloc zeroes already */
    return p;
}

void *dsattn_ws_array(dsattn_ws *w, size_t a, size_t b)
{
    size_t n;
    return dsattn_mul_size(a, b, &n) ? dsattn_ws_get(w, n) : NULL;
}

void *dsattn_ws_arrayz(dsattn_ws *w, size_t a, size_t b)
{
    size_t n;
    return dsattn_mul_size(a, b, &n) ? dsattn_ws_getz(w, n) : NULL;
}

void dsattn_ws_put(dsattn_ws *w, void *p)
{
    if (!w) dsattn_free(p);
}

dsattn_ws_pos dsattn_ws_mark(const dsattn_ws *w)
{
    dsattn_ws_pos m = { 0, 0 };
    if (w) {
        m.used = w->used;
        m.spills = w->spill.n;
    }
    return m;
}

void dsattn_ws_reset(dsattn_ws *w, dsattn_ws_pos mark)
{
    if (!w) return;
    if (mark.used < w->used) w->used = mark.used;
    while (w->spill.n > mark.spills) dsattn_free(w->spill.p[--w->spill.n]);
}

int dsattn_ws_threads(void)
{
#ifdef _OPENMP
    const int a = omp_get_max_threads(), b = omp_get_num_procs();
    return a > b ? a : b;
#else
    return 1;
#endif
}

dsattn_status dsattn_owned_add(dsattn_owned *o, void *p)
{
    if (!p) return DSATTN_ERR_NOMEM;
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 64;
        void **np = realloc(o->p, nc * sizeof *np);
        if (!np) { dsattn_free(p); return DSATTN_ERR_NOMEM; }
        o->p = np;
        o->cap = nc;
    }
    o->p[o->n++] = p;
    return DSATTN_OK;
}

void dsattn_owned_free(dsattn_owned *o)
{
    for (size_t i = 0; i < o->n; i++) dsattn_free(o->p[i]);
    free(o->p);
    o->p = NULL;
    o->n = o->cap = 0;
}

/* ==== Rows a chunk leaves behind (internal.h) ========================== */

void *dsattn_chunk_rows(void **p, size_t *cap, void *own, size_t own_cap, size_t need,
                        size_t elem)
{
    if (need <= own_cap) {
        if (*p != own) free(*p);
        *p = own;
        *cap = own_cap;
        return own;
    }
    if (*p != own && need <= *cap) return *p;
    size_t bytes;
    if (!dsattn_mul_size(need, elem, &bytes)) return NULL;
    void *np = realloc(*p == own ? NULL : *p, bytes);
    if (!np) return NULL;
    *p = np;
    *cap = need;
    return np;
}

void dsattn_chunk_rows_free(void *p, void *own)
{
    if (p != own) free(p);
    free(own);
}

size_t dsattn_chunk_rows_bytes(const void *p, size_t cap, const void *own, size_t own_cap,
                               size_t elem)
{
    return (own_cap + (p != own ? cap : 0)) * elem;
}

dsattn_status dsattn_errf(char *err, size_t errlen, dsattn_status st,
                          const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

void dsattn_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "dsattn: internal invariant failed: %s (%s:%d)\n", expr,
            file, line);
    abort();
}
