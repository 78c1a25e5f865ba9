/* cli_num.h - the one strict parser for the numbers the dsattn tool takes
 * on its command line.  A value is accepted only when the whole string is
 * a number of the right kind inside the option's range: "abc", "", "-1"
 * for a count, "1e30", "12x" and values past the range are refused with a
 * message on stderr naming the command, the option and the accepted range.
 * Every function returns 0 on success and 2 (the tool's usage-error exit
 * status) on a refusal, so a caller writes
 *     if ((rc = dsattn_cli_int("run", "--decode", v, 0, MAX, 0, &n))) return rc;
 */
#ifndef DSATTN_CLI_NUM_H
#define DSATTN_CLI_NUM_H

#include <stdint.h>

/* The largest --threads any subcommand takes. */
#define DSATTN_CLI_MAX_THREADS 1024

/* flags */
#define DSATTN_CLI_SUFFIX 1   /* accept a K (2^10), M (2^20) or G (2^30) suffix */

/* A decimal integer in [lo, hi] (digits only, an optional leading '-' when
 * lo < 0; with DSATTN_CLI_SUFFIX one of K, M, G, either case). */
int dsattn_cli_int(const char *cmd, const char *opt, const char *v, long long lo,
                   long long hi, unsigned flags, long long *out);

/* dsattn_cli_int into an int. */
int dsattn_cli_i32(const char *cmd, const char *opt, const char *v, int lo, int hi,
                   unsigned flags, int *out);

/* A seed: a decimal integer in [0, 2^64 - 1] (digits only). */
int dsattn_cli_u64(const char *cmd, const char *opt, const char *v, uint64_t *out);

/* A finite decimal number (strtod syntax without inf/nan/hex) in [lo, hi]. */
int dsattn_cli_double(const char *cmd, const char *opt, const char *v, double lo,
                      double hi, double *out);

/* A comma list of 1..max integers, each as dsattn_cli_int; *n receives the
 * count.  Empty items ("1,,2", "1,") are refused. */
int dsattn_cli_list(const char *cmd, const char *opt, const char *v, long long lo,
                    long long hi, unsigned flags, long long *out, int max, int *n);

#endif
