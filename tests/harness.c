/* harness.c - registry, checks and main() of dsattn_test.
 *
 *   dsattn_test                 every suite
 *   dsattn_test --suite NAME    one suite (ctest runs one per entry)
 *   dsattn_test -p SUBSTR       tests whose "suite.name" contains SUBSTR
 *   dsattn_test --list          list tests
 *
 * Scratch files live in one directory per process (dsattn_test_tmpdir),
 * removed when the runner ends.  With DSATTN_TEST_TMP_CHECK=1 (ctest sets
 * it, with a $TMPDIR of the suite's own) the runner also fails when the
 * tests, or the CLI they start, left anything else in $TMPDIR.
 */
#include "harness.h"
#include "internal.h"
#include "ktab.h"

#include "blas.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { const char *suite, *name; dsattn_test_fn fn; } test_entry;

static test_entry *tests;
static size_t n_tests, cap_tests;
static int cur_failed, cur_skipped;

void dsattn_test_register(const char *suite, const char *name, dsattn_test_fn fn)
{
    if (n_tests == cap_tests) {
        cap_tests = cap_tests ? 2 * cap_tests : 64;
        tests = realloc(tests, cap_tests * sizeof *tests);
        if (!tests) { fprintf(stderr, "out of memory\n"); exit(2); }
    }
    tests[n_tests++] = (test_entry){ suite, name, fn };
}

void dsattn_test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    cur_failed++;
    if (cur_failed > 20) return;          /* keep the log readable */
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void dsattn_test_skip(const char *why)
{
    cur_skipped = 1;
    fprintf(stderr, "    skipped: %s\n", why);
}

int dsattn_test_failed(void) { return cur_failed; }

int dsattn_check_close(const char *file, int line, const char *what,
                       const float *got, const float *want, size_t n,
                       double abs_tol, double rel_tol)
{
    size_t bad = 0, worst = 0;
    double worst_ex = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        int ok;
        if (isnan(w) || isnan(g)) ok = isnan(w) && isnan(g);
        else if (isinf(w) || isinf(g)) ok = g == w;
        else {
            double d = fabs(g - w);
            double lim = fmax(abs_tol, rel_tol * fabs(w));
            ok = d <= lim;
            double ex = lim > 0 ? d / lim : (d > 0 ? INFINITY : 0);
            if (ex > worst_ex) { worst_ex = ex; worst = i; }
        }
        if (!ok) { if (!bad) worst = i; bad++; }
    }
    if (bad) {
        dsattn_test_fail(file, line, "%s: %zu/%zu differ; worst [%zu] got %.9g want %.9g",
                         what, bad, n, worst, (double)got[worst], (double)want[worst]);
        return 0;
    }
    return 1;
}

int dsattn_check_bits(const char *file, int line, const char *what,
                      const float *got, const float *want, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        int same = memcmp(&got[i], &want[i], 4) == 0 ||
                   (got[i] == 0.0f && want[i] == 0.0f) ||
                   (isnan(got[i]) && isnan(want[i]));
        if (!same) { if (!bad) first = i; bad++; }
    }
    if (bad) {
        dsattn_test_fail(file, line, "%s: %zu/%zu not bit-equal; first [%zu] got %.9g want %.9g",
                         what, bad, n, first, (double)got[first], (double)want[first]);
        return 0;
    }
    return 1;
}

double dsattn_rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

uint64_t dsattn_fnv_bits(uint64_t h, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &y[i], 4);
        if (isnan(y[i])) u = 0x7fc00000u;
        for (int b = 0; b < 4; b++) h = (h ^ ((u >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
}

double dsattn_cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return (aa > 0 && bb > 0) ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

const char *dsattn_test_data(const char *rel)
{
    static __thread char buf[4096];
    const char *root = getenv("DSATTN_TEST_DATA");
    if (!root) root = DSATTN_TEST_DATA;
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

/* ==== Scratch files ===================================================== */

static char tmp_dir[512];
static pid_t tmp_owner;
static int tmp_left;

static const char *tmp_root(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] ? t : "/tmp";
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st; (void)flag; (void)f;
    if (remove(path) != 0) tmp_left++;
    return 0;
}

int dsattn_test_tmp_cleanup(void)
{
    if (!tmp_dir[0] || tmp_owner != getpid()) return 0;
    tmp_left = 0;
    if (nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) tmp_left++;
    tmp_dir[0] = '\0';
    return tmp_left;
}

static void tmp_atexit(void) { (void)dsattn_test_tmp_cleanup(); }

const char *dsattn_test_tmpdir(void)
{
    static int registered;
    if (tmp_dir[0]) return tmp_dir;      /* a forked child shares its parent's */
    int w = snprintf(tmp_dir, sizeof tmp_dir, "%s/dsattn_test_XXXXXX", tmp_root());
    if (w < 0 || (size_t)w >= sizeof tmp_dir || !mkdtemp(tmp_dir)) {
        dsattn_test_fail(__FILE__, __LINE__, "cannot make a scratch directory under %s: %s",
                         tmp_root(), strerror(errno));
        tmp_dir[0] = '\0';
        return NULL;
    }
    tmp_owner = getpid();
    if (!registered) registered = !atexit(tmp_atexit);
    return tmp_dir;
}

char *dsattn_test_tmp(char *buf, size_t n, const char *fmt, ...)
{
    if (n) buf[0] = '\0';                 /* a failed call leaves "" (fopen fails) */
    const char *d = dsattn_test_tmpdir();
    if (!d) return NULL;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int w2 = w < 0 || (size_t)w >= sizeof name ? -1 : snprintf(buf, n, "%s/%s", d, name);
    if (w2 < 0 || (size_t)w2 >= n) {
        if (n) buf[0] = '\0';
        dsattn_test_fail(__FILE__, __LINE__, "scratch path for \"%s\" does not fit %zu bytes",
                         fmt, n);
        return NULL;
    }
    return buf;
}

/* The names in directory d (sorted, NULL-terminated; NULL when d cannot
 * be read), for the $TMPDIR check. */
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char **dir_names(const char *d)
{
    DIR *dir = opendir(d);
    if (!dir) return NULL;
    size_t n = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    for (struct dirent *e; v && (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n + 1 == cap) {
            char **nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        if (!(v[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(dir);
    if (v) { v[n] = NULL; qsort(v, n, sizeof *v, cmp_str); }
    return v;
}

static void free_names(char **v)
{
    for (size_t i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}

/* $TMPDIR itself, made if missing (with its parents). */
static void make_root(void)
{
    char p[512];
    int w = snprintf(p, sizeof p, "%s", tmp_root());
    if (w < 0 || (size_t)w >= sizeof p) return;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') { *s = '\0'; (void)mkdir(p, 0700); *s = '/'; }
    (void)mkdir(p, 0700);
}

/* Entries of $TMPDIR now that were not there at the start: each one a
 * failure line; returns their number. */
static size_t tmp_leftovers(char **before)
{
    char **after = dir_names(tmp_root());
    size_t n = 0, nb = 0;
    while (before[nb]) nb++;
    for (size_t i = 0; after && after[i]; i++) {
        if (bsearch(&after[i], before, nb, sizeof *before, cmp_str)) continue;
        fprintf(stderr, "[ FAIL ] scratch: %s/%s was left behind\n", tmp_root(), after[i]);
        n++;
    }
    free_names(after);
    return n;
}

int main(int argc, char **argv)
{
    /* OpenBLAS's core type, decided where the CLI decides it
     * (src/core/blas.c): may re-exec this runner once. */
    dsattn_blas_reexec(argv, DSATTN_REEXEC_CORETYPE);
    const char *suite = NULL, *pat = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--suite") && i + 1 < argc) suite = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) pat = argv[++i];
        else if (!strcmp(argv[i], "--list")) list = 1;
        else {
            fprintf(stderr, "usage: %s [--suite NAME] [-p SUBSTR] [--list]\n", argv[0]);
            return 2;
        }
    }
    const char *chk = getenv("DSATTN_TEST_TMP_CHECK");
    const int tmp_check = !list && chk && !strcmp(chk, "1");
    char **tmp_before = NULL;
    if (tmp_check) {
        make_root();
        tmp_before = dir_names(tmp_root());
        if (!tmp_before) {
            fprintf(stderr, "cannot read TMPDIR %s\n", tmp_root());
            return 2;
        }
    }
    size_t passed = 0, failed = 0, skipped = 0, ran = 0;
    for (size_t i = 0; i < n_tests; i++) {
        const test_entry *t = &tests[i];
        char full[256];
        snprintf(full, sizeof full, "%s.%s", t->suite, t->name);
        if (suite && strcmp(suite, t->suite)) continue;
        if (pat && !strstr(full, pat)) continue;
        if (list) { printf("%s\n", full); continue; }
        cur_failed = 0;
        cur_skipped = 0;
        fprintf(stderr, "[ RUN  ] %s\n", full);
        t->fn();
        ran++;
        if (cur_failed) { failed++; fprintf(stderr, "[ FAIL ] %s (%d check(s))\n", full, cur_failed); }
        else if (cur_skipped) { skipped++; fprintf(stderr, "[ SKIP ] %s\n", full); }
        else { passed++; fprintf(stderr, "[  OK  ] %s\n", full); }
    }
    if (list) return 0;
    if (ran == 0) {
        fprintf(stderr, "no test matched\n");
        return 2;
    }
    {   /* the table a fast-mode context gets here ($DSATTN_ISA honoured) */
        dsattn_ctx *c = NULL;
        if (dsattn_ctx_create(&c, NULL) == DSATTN_OK)
            printf("kernel table: %s\n", dsattn_ctx_isa_name(c));
        dsattn_ctx_destroy(c);
    }
    if (dsattn_test_tmp_cleanup()) {
        fprintf(stderr, "[ FAIL ] scratch: the scratch directory could not be removed\n");
        failed++;
    }
    if (tmp_check) {
        failed += tmp_leftovers(tmp_before);
        free_names(tmp_before);
    }
    printf("%zu passed, %zu failed, %zu skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

dsattn_ctx *dsattn_test_ctx(dsattn_mode mode, int threads)
{
    dsattn_ctx *c = NULL;
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    if (threads > 0) p.n_threads = threads;
    CHECK_OK(dsattn_ctx_create(&c, &p));
    return c;
}

/* The table of `isa` in t, or NULL after marking the test skipped */
static const struct dsattn_ktab *isa_ktab(dsattn_ktab *t, dsattn_isa isa, const char *why)
{
    if (dsattn_ktab_fill(t, isa, 0) != DSATTN_OK) {
        dsattn_test_skip(why);
        return NULL;
    }
    return t;
}

const struct dsattn_ktab *dsattn_test_avx512_ktab(void)
{
    static dsattn_ktab t;
    return isa_ktab(&t, DSATTN_ISA_AVX512, "no AVX-512 (CPU or build)");
}

const struct dsattn_ktab *dsattn_test_avx2_ktab(void)
{
    static dsattn_ktab t;
    return isa_ktab(&t, DSATTN_ISA_AVX2, "no AVX2 (CPU or build)");
}

const struct dsattn_ktab *dsattn_test_neon_ktab(void)
{
    static dsattn_ktab t;
    return isa_ktab(&t, DSATTN_ISA_NEON, "no NEON (not an aarch64 build)");
}

int dsattn_test_set_bf16blk(dsattn_ctx *c, int on)
{
    if (!c) return 0;
    dsattn_ctx_set_amx(c, on);
    dsattn_ctx_set_bf16dot(c, on);
    return c->kt->bf16blk != NULL;
}

int dsattn_test_bf16blk_or_skip(void)
{
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, 1);
    const int have = dsattn_test_set_bf16blk(c, 1);
    dsattn_ctx_destroy(c);
    if (!have) dsattn_test_skip("no AMX-BF16 or AVX512-BF16 here");
    return have;
}

int dsattn_test_amx_or_skip(void)
{
    dsattn_ctx *c = dsattn_test_ctx(DSATTN_MODE_FAST, 1);
    const int have = c && dsattn_ctx_set_amx(c, 1);
    dsattn_ctx_destroy(c);
    if (!have) dsattn_test_skip("no AMX-BF16 here");
    return have;
}
