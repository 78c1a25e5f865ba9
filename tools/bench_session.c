/* bench_session.c - `dsattn bench session`: session save and load speed
 * against a plain `cp` of a file of the same size on the same disk.
 *
 * For each depth: a V4.1 sequence (config only, no weights: the session
 * holds caches, not weights) filled synthetically to the depth
 * (dsattn_v41_seq_fill_synthetic), saved to --dir (default $TMPDIR, else
 * /tmp; the save is temporary file, fsync, rename, fsync of the folder),
 * loaded back (whole-file validation, a fresh
 * sequence, copy), and re-saved to check the round trip is byte-identical.
 * Then `cp` of the session file, and `cp` followed by `sync FILE` (the
 * fsync a save does), both timed from here.  The file is read from the
 * page cache in every case (it was just written), so load and cp compare
 * like with like; a cold-cache load is bounded by the disk instead.
 *
 * Each figure is the best of --reps runs (default 3): the first write of
 * a size into the page cache was measured up to 10x slower than the next
 * ones on this VM (the kernel clearing fresh pages), for cp as for a save.
 * The whole mode runs on one thread: session I/O is single-threaded, and
 * idle OpenMP workers spinning (OMP_WAIT_POLICY=active, which the CLI
 * sets) would take the second core from it.
 *
 * Deliberately not here: assertions - the machine is shared; the numbers
 * are reported.
 */
#include "bench_util.h"
#include "cli_num.h"
#include "cli_util.h"
#include "dsattn.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DSATTN_BENCH_MIN(a, b) ((a) < (b) ? (a) : (b))

/* Wall time of a shell command; +inf if it failed (never the best). */
static double timed_system(const char *cmd)
{
    double t0 = dsattn_bench_now();
    int r = system(cmd);
    double t = dsattn_bench_now() - t0;
    return r == 0 ? t : 1e30;
}

static int same_bytes(const char *a, const char *b)
{
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    int same = x && y;
    static char p[1 << 16], q[1 << 16];
    while (same) {
        size_t n = fread(p, 1, sizeof p, x), m = fread(q, 1, sizeof q, y);
        if (n != m || memcmp(p, q, n)) same = 0;
        if (n == 0) break;
    }
    if (x) fclose(x);
    if (y) fclose(y);
    return same;
}

int dsattn_bench_session(int argc, char **argv)
{
    const char *cfg = NULL, *dir = NULL, *depths = "65536,1M";
    int reps = 3, prc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) cfg = v, i++;
        else if (!strcmp(a, "--dir") && v) dir = v, i++;
        else if (!strcmp(a, "--depth") && v) depths = v, i++;
        else if (!strcmp(a, "--reps") && v) {
            if ((prc = dsattn_cli_i32("bench session", a, v, 1, 100, 0, &reps))) return prc;
            i++;
        } else {
            const int help = !strcmp(a, "--help") || !strcmp(a, "-h");
            if (!help) fprintf(stderr, "bench session: unknown option or missing value: %s\n", a);
            fprintf(help ? stdout : stderr,
                    "usage: dsattn bench session [--config FILE] [--dir DIR] "
                    "[--depth N,N..] [--reps N]\n"
                    "  (defaults: the V4.1-Flash config of the configs folder, $TMPDIR or /tmp,\n"
                    "  65536,1M, 3)\n");
            return help ? 0 : 2;
        }
    }
    if (!dir) dir = dsattn_cli_tmp_root();
    char cfg_path[1200];
    if (!cfg) {
        snprintf(cfg_path, sizeof cfg_path, "%s/deepseek-v4.1-flash.json", dsattn_cli_configs_dir());
        cfg = cfg_path;
    }
    long long dv[16];
    int nd = 0;
    if ((prc = dsattn_cli_list("bench session", "--depth", depths, 1, DSATTN_BENCH_MAX_DEPTH,
                               DSATTN_CLI_SUFFIX, dv, 16, &nd)))
        return prc;
    omp_set_num_threads(1);
    char err[512] = "";
    dsattn_v41 *m = NULL;
    if (dsattn_v41_load_config(&m, cfg, err, sizeof err)) {
        fprintf(stderr, "bench session: %s\n", err);
        return 1;
    }
    char f1[1024], f2[1024], f3[1024], cmd[4096];
    snprintf(f1, sizeof f1, "%s/dsattn-bench-%d.session", dir, (int)getpid());
    snprintf(f2, sizeof f2, "%s/dsattn-bench-%d.again", dir, (int)getpid());
    snprintf(f3, sizeof f3, "%s/dsattn-bench-%d.cp", dir, (int)getpid());
    printf("## Session save / load, V4.1 (%s), files in %s\n\n", cfg, dir);
    printf("Best of %d; page-cache reads; save includes fsync of the file and its folder; "
           "the machine is shared.\n\n", reps);
    printf("| depth | session MB | save s | save MB/s | load s | load MB/s | cp s | cp MB/s | "
           "cp+sync s | cp+sync MB/s | round trip |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
           "---:|---:|---|\n");
    int rc = 0;
    for (int d = 0; d < nd && !rc; d++) {
        dsattn_v41_seq *s = NULL, *l = NULL;
        dsattn_status st = dsattn_v41_seq_create(&s, m, (size_t)dv[d] + 1,
                                                 DSATTN_V41_INDEX_K_OWNER);
        if (!st) st = dsattn_v41_seq_fill_synthetic(s, dv[d], 1);
        if (st) {
            fprintf(stderr, "bench session: depth %lld: %s\n", dv[d], dsattn_status_str(st));
            dsattn_v41_seq_destroy(s);
            rc = 1;
            break;
        }
        double ts = 1e30, tl = 1e30, tc = 1e30, tcs = 1e30;
        int same = 1;
        for (int r = 0; r < reps && !st; r++) {
            double t0 = dsattn_bench_now();
            st = dsattn_v41_seq_save(s, f1, err, sizeof err);
            ts = DSATTN_BENCH_MIN(ts, dsattn_bench_now() - t0);
            t0 = dsattn_bench_now();
            if (!st) st = dsattn_v41_seq_load(&l, m, f1, 0, err, sizeof err);
            tl = DSATTN_BENCH_MIN(tl, dsattn_bench_now() - t0);
            if (!st) st = dsattn_v41_seq_save(l, f2, err, sizeof err);
            dsattn_v41_seq_destroy(l);
            l = NULL;
            if (!st) same &= same_bytes(f1, f2);
            unlink(f2);
            snprintf(cmd, sizeof cmd, "cp '%s' '%s'", f1, f3);
            tc = DSATTN_BENCH_MIN(tc, timed_system(cmd));
            unlink(f3);
            snprintf(cmd, sizeof cmd, "cp '%s' '%s' && sync '%s'", f1, f3, f3);
            tcs = DSATTN_BENCH_MIN(tcs, timed_system(cmd));
            unlink(f3);
        }
        dsattn_v41_seq_destroy(s);
        if (st) {
            fprintf(stderr, "bench session: %s\n", err);
            unlink(f1);
            rc = 1;
            break;
        }
        struct stat sb;
        double mb = stat(f1, &sb) == 0 ? (double)sb.st_size / 1e6 : 0;
        unlink(f1);
        printf("| %lld | %.1f | %.3f | %.0f | %.3f | %.0f | %.3f | %.0f | %.3f | %.0f | %s |\n",
               dv[d], mb, ts, mb / ts, tl, mb / tl, tc, mb / tc, tcs, mb / tcs,
               same ? "identical" : "DIFFERS");
        fflush(stdout);
        if (!same) rc = 1;
    }
    dsattn_v41_destroy(m);
    return rc;
}
