/* harness.h - the one test runner's registry and checks.
 *
 * A test is `DSATTN_TEST(suite, name) { ... }` in tests/test_<suite>.c; it
 * registers itself at load time, so adding a file needs no central list.
 * Checks record file:line and keep going; a test fails if any check failed.
 * The runner ends with "N passed, N failed" and exits non-zero on failure.
 */
#ifndef DSATTN_HARNESS_H
#define DSATTN_HARNESS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsattn.h"

typedef void (*dsattn_test_fn)(void);

void dsattn_test_register(const char *suite, const char *name, dsattn_test_fn fn);
void dsattn_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Skip the rest of the current test (counted as passed, reported as skip). */
void dsattn_test_skip(const char *why);
int  dsattn_test_failed(void);

#define DSATTN_TEST(suite, name)                                            \
    static void test_##suite##_##name(void);                                \
    __attribute__((constructor)) static void reg_##suite##_##name(void)     \
    {                                                                       \
        dsattn_test_register(#suite, #name, test_##suite##_##name);         \
    }                                                                       \
    static void test_##suite##_##name(void)

#define CHECK(c)                                                            \
    do {                                                                    \
        if (!(c)) dsattn_test_fail(__FILE__, __LINE__, "CHECK(%s)", #c);    \
    } while (0)

#define CHECK_MSG(c, ...)                                                   \
    do {                                                                    \
        if (!(c)) dsattn_test_fail(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                  \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ != b_)                                                       \
            dsattn_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld",  \
                             #a, #b, a_, b_);                               \
    } while (0)

#define CHECK_OK(st)                                                        \
    do {                                                                    \
        int st_ = (int)(st);                                                \
        if (st_ != 0)                                                       \
            dsattn_test_fail(__FILE__, __LINE__, "%s returned %d", #st, st_); \
    } while (0)

/* Compare arrays: NaN/Inf positions must agree; then |a-b| <= abs_tol or
 * |a-b| <= rel_tol*|b|.  Prints the worst index.  Returns 1 if equal. */
int dsattn_check_close(const char *file, int line, const char *what,
                       const float *got, const float *want, size_t n,
                       double abs_tol, double rel_tol);
#define CHECK_CLOSE(what, got, want, n, at, rt) \
    dsattn_check_close(__FILE__, __LINE__, what, got, want, n, at, rt)
/* Bit-exact float comparison, except +0 == -0 and any NaN == any NaN. */
int dsattn_check_bits(const char *file, int line, const char *what,
                      const float *got, const float *want, size_t n);
#define CHECK_BITS(what, got, want, n) \
    dsattn_check_bits(__FILE__, __LINE__, what, got, want, n)

/* Summary statistics used by the statistical tier. */
double dsattn_rel_l2(const float *a, const float *b, size_t n);  /* |a-b|/|b| */
/* FNV-1a 64 over the bit patterns of n floats, chained from h (start with
 * DSATTN_FNV_START), every NaN hashed as the one quiet NaN 0x7fc00000 (NaN
 * sign and payload are not part of any contract) */
#define DSATTN_FNV_START 0xcbf29ce484222325ull
uint64_t dsattn_fnv_bits(uint64_t h, const float *y, size_t n);
double dsattn_cosine(const float *a, const float *b, size_t n);

/* A context in `mode` with `threads` threads (0: the default); a failed
 * creation is a failed check and NULL. */
dsattn_ctx *dsattn_test_ctx(dsattn_mode mode, int threads);
/* 1 where a fast context can run AMX-BF16 tiles; else marks the test
 * skipped ("no AMX-BF16 here") and returns 0. */
int dsattn_test_amx_or_skip(void);
/* The context's bf16 attention blocks (the ktab bf16blk slot: AMX tiles,
 * else their VDPBF16PS form) on or off - AMX and the bf16-dot GEMM both
 * follow `on` -; returns whether the context now runs them. */
int dsattn_test_set_bf16blk(dsattn_ctx *c, int on);
/* 1 where a fast context can run the bf16 attention blocks; else marks the
 * test skipped and returns 0. */
int dsattn_test_bf16blk_or_skip(void);
/* The AVX-512 table of tables (src/kernels/ktab.h, AMX slot empty) - the
 * fast slots the kernel tests check against their scalar twins - or NULL
 * after marking the test skipped when this CPU or build has none. */
const struct dsattn_ktab *dsattn_test_avx512_ktab(void);
/* The same for the AVX2 table (AVX2 + FMA CPUs of x86-64 builds). */
const struct dsattn_ktab *dsattn_test_avx2_ktab(void);
/* The same for the NEON table (aarch64 builds). */
const struct dsattn_ktab *dsattn_test_neon_ktab(void);

/* Seeded xorshift RNG, one per test. */
typedef struct { uint64_t s; } dsattn_rng;
static inline uint64_t dsattn_rng_u64(dsattn_rng *r)
{
    uint64_t x = r->s ? r->s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}
static inline float dsattn_rng_uniform(dsattn_rng *r) /* [-1, 1) */
{
    return (float)((double)(dsattn_rng_u64(r) >> 11) * 0x1p-52 - 1.0);
}
static inline float dsattn_rng_normal(dsattn_rng *r)
{
    double u1 = ((double)(dsattn_rng_u64(r) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(dsattn_rng_u64(r) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Path of a file under tests/data. */
const char *dsattn_test_data(const char *rel);

/* Room for a scratch path (the buffers given to dsattn_test_tmp). */
#define DSATTN_TEST_PATH 1024

/* Scratch files.  Every file or directory a test writes goes under
 * dsattn_test_tmpdir(): a directory of this process's own, made (mode 0700,
 * mkdtemp) on first use under $TMPDIR, else /tmp, and removed with all it
 * holds when the runner ends - by the process that made it only, so a
 * forked child never removes its parent's files.  NULL, after a failed
 * check, when it cannot be made. */
const char *dsattn_test_tmpdir(void);
/* "<tmpdir>/<name>", name formatted from fmt, into buf[n]; returns buf, or
 * NULL after a failed check (no directory, or the path does not fit). */
char *dsattn_test_tmp(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Remove the scratch directory now (the runner does it at its end); the
 * next dsattn_test_tmpdir() makes a new one.  Returns the number of
 * entries that could not be removed. */
int dsattn_test_tmp_cleanup(void);

#endif /* DSATTN_HARNESS_H */
