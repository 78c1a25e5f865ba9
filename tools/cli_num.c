/* cli_num.c - strict command-line number parsing for every subcommand of
 * the dsattn tool (what is accepted: tools/cli_num.h).  Digits are read by
 * hand with overflow checks rather than through strtol, whose leading
 * blanks, signs on unsigned conversions and partial parses are exactly
 * what a strict parser must refuse. */
#include "cli_num.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void range_str(char *buf, size_t n, long long lo, long long hi, unsigned flags)
{
    snprintf(buf, n, "an integer in [%lld, %lld]%s", lo, hi,
             (flags & DSATTN_CLI_SUFFIX) ? " (K, M, G suffixes: 2^10, 2^20, 2^30)" : "");
}

static int refuse(const char *cmd, const char *opt, const char *v, const char *why,
                  const char *want)
{
    fprintf(stderr, "dsattn %s: %s '%s': %s; accepted: %s\n", cmd, opt, v, why, want);
    return 2;
}

/* Parse [-]digits[suffix] of s[0..len) into *out; 0 ok, -1 syntax, -2 range
 * (magnitude past 2^63 - 1 before the caller's range check). */
static int parse_ll(const char *s, size_t len, unsigned flags, long long *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < len && s[i] == '-') { neg = 1; i++; }
    if (i == len || s[i] < '0' || s[i] > '9') return -1;
    unsigned long long x = 0;
    int big = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (0x7fffffffffffffffull - d) / 10) big = 1;
        else x = x * 10 + d;
    }
    unsigned shift = 0;
    if (i < len && (flags & DSATTN_CLI_SUFFIX)) {
        char c = s[i];
        if (c == 'K' || c == 'k') shift = 10;
        else if (c == 'M' || c == 'm') shift = 20;
        else if (c == 'G' || c == 'g') shift = 30;
        if (shift) i++;
    }
    if (i != len) return -1;
    if (big || (shift && x > (0x7fffffffffffffffull >> shift))) return -2;
    x <<= shift;
    *out = neg ? -(long long)x : (long long)x;
    return 0;
}

static int check_one(const char *cmd, const char *opt, const char *v, const char *s,
                     size_t len, long long lo, long long hi, unsigned flags, long long *out)
{
    char want[160];
    range_str(want, sizeof want, lo, hi, flags);
    long long x = 0;
    int r = parse_ll(s, len, flags, &x);
    if (r == -1) return refuse(cmd, opt, v, len ? "not an integer" : "empty", want);
    if (r == -2 || x < lo || x > hi) return refuse(cmd, opt, v, "out of range", want);
    *out = x;
    return 0;
}

int dsattn_cli_int(const char *cmd, const char *opt, const char *v, long long lo,
                   long long hi, unsigned flags, long long *out)
{
    if (!v) v = "";
    return check_one(cmd, opt, v, v, strlen(v), lo, hi, flags, out);
}

int dsattn_cli_i32(const char *cmd, const char *opt, const char *v, int lo, int hi,
                   unsigned flags, int *out)
{
    long long x;
    int rc = dsattn_cli_int(cmd, opt, v, lo, hi, flags, &x);
    if (!rc) *out = (int)x;
    return rc;
}

int dsattn_cli_u64(const char *cmd, const char *opt, const char *v, uint64_t *out)
{
    const char *want = "an integer in [0, 18446744073709551615]";
    if (!v) v = "";
    if (!*v) return refuse(cmd, opt, v, "empty", want);
    uint64_t x = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9') return refuse(cmd, opt, v, "not an integer", want);
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) return refuse(cmd, opt, v, "out of range", want);
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

int dsattn_cli_double(const char *cmd, const char *opt, const char *v, double lo,
                      double hi, double *out)
{
    char want[128];
    snprintf(want, sizeof want, "a number in [%g, %g]", lo, hi);
    if (!v) v = "";
    if (!*v) return refuse(cmd, opt, v, "empty", want);
    /* plain decimal only: no blanks, inf, nan or hex floats */
    for (const char *p = v; *p; p++)
        if (!strchr("0123456789.eE+-", *p)) return refuse(cmd, opt, v, "not a number", want);
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end) return refuse(cmd, opt, v, "not a number", want);
    if (errno == ERANGE || !isfinite(x) || x < lo || x > hi)
        return refuse(cmd, opt, v, "out of range", want);
    *out = x;
    return 0;
}

int dsattn_cli_list(const char *cmd, const char *opt, const char *v, long long lo,
                    long long hi, unsigned flags, long long *out, int max, int *n)
{
    char want[200], r[160];
    range_str(r, sizeof r, lo, hi, flags);
    snprintf(want, sizeof want, "a comma list of 1 to %d items, each %s", max, r);
    if (!v) v = "";
    if (!*v) return refuse(cmd, opt, v, "empty", want);
    int k = 0;
    for (const char *p = v;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (k == max) return refuse(cmd, opt, v, "too many items", want);
        long long x = 0;
        int rc = parse_ll(p, len, flags, &x);
        if (rc == -1) return refuse(cmd, opt, v, len ? "not an integer" : "empty item", want);
        if (rc == -2 || x < lo || x > hi) return refuse(cmd, opt, v, "out of range", want);
        out[k++] = x;
        if (!c) break;
        p = c + 1;
    }
    *n = k;
    return 0;
}
