/* bench_v41.c - `dsattn bench v41`: decode ms/token of the full V4.1-Flash
 * attention stack (40 backbone layers, real dims, FP8 weights, random and
 * seeded) at chosen context depths and thread counts, beside its byte bound.
 *
 * Deep contexts are reached by synthetic cache fill (random valid packed
 * entries, dsattn_v41_seq_fill_synthetic), which the output says.  The byte
 * bound is (bytes the kernels read during the step: weights + KV + index
 * keys) / (DRAM read bandwidth measured in the same run); the ratio
 * t / bound says how close decode is to the machine's memory limit.  Before
 * anything is timed, the golden tiny case runs in fast mode and is checked
 * against reference mode (the same code paths on a small slice).
 */
#include "bench_util.h"
#include "dsattn.h"
#include "internal.h"
#include "trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_list(const char *s, long long *v, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s) return -1;
        if (*end == 'K' || *end == 'k') { x <<= 10; end++; }
        else if (*end == 'M' || *end == 'm') { x <<= 20; end++; }
        v[n++] = x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static double peak_rss_gb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0 / 1e9;
}

/* fast vs reference on the bundled tiny golden case: out within 1e-1 rel
 * and cosine >= 0.99 (the tiny case's own noise floor is ~0.2 / 0.97). */
static int verify_slice(const char *data_dir)
{
    char dir[2048], a[256], b[256], err[512] = "";
    snprintf(dir, sizeof dir, "%s/golden/v41/tiny-seed2-fp8", data_dir);
    snprintf(a, sizeof a, "/tmp/dsattn_bench_ref_%d.safetensors", (int)getpid());
    snprintf(b, sizeof b, "/tmp/dsattn_bench_fast_%d.safetensors", (int)getpid());
    dsattn_trace_opts o = { DSATTN_MODE_REFERENCE, 0, 0, 0, 0 };
    if (dsattn_trace_case(dir, a, &o, err, sizeof err)) return -1;
    o.mode = DSATTN_MODE_FAST;
    if (dsattn_trace_case(dir, b, &o, err, sizeof err)) return -1;
    double rel = 0, cs = 0;
    int st = dsattn_bench_compare_out(a, b, &rel, &cs);
    remove(a);
    remove(b);
    if (st) return -1;
    fprintf(stderr, "bench v41: fast vs reference on %s: out rel %.3g, cosine %.6f\n", dir, rel, cs);
    return rel <= 0.1 && cs >= 0.99 ? 0 : 1;
}

int dsattn_bench_v41(int argc, char **argv)
{
    const char *cfg = "configs/deepseek-v4.1-flash.json", *fmt = "md";
    const char *data = "tests/data";
    long long depths[8] = { 4096, 65536, 1048576 }, thr[8] = { 1, 2 };
    int nd = 3, nt = 2, reps = 3, fp8 = 1;
    long long prefill = 128;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dsattn bench v41 [--depth 4096,65536,1M] [--threads 1,2] [--reps 3]\n"
                   "                        [--prefill N (128; 0 = skip)]\n"
                   "                        [--config PATH] [--bf16] [--seed S] [--format md|csv|json]\n"
                   "                        [--data DIR (tests/data, for the pre-timing check)]\n");
            return 0;
        }
        if (!strcmp(a, "--bf16")) { fp8 = 0; continue; }
        if (!v) { fprintf(stderr, "bench v41: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--depth")) nd = parse_list(v, depths, 8);
        else if (!strcmp(a, "--threads")) nt = parse_list(v, thr, 8);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--prefill")) prefill = atoll(v);
        else if (!strcmp(a, "--config")) cfg = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--format")) fmt = v;
        else if (!strcmp(a, "--data")) data = v;
        else { fprintf(stderr, "bench v41: unknown option %s\n", a); return 2; }
    }
    if (nd <= 0 || nt <= 0 || reps <= 0) { fprintf(stderr, "bench v41: bad list\n"); return 2; }

    int vs = verify_slice(data);
    if (vs > 0) { fprintf(stderr, "bench v41: fast path disagrees with reference; not timing\n"); return 1; }
    if (vs < 0) fprintf(stderr, "bench v41: golden slice not found under %s; timing unverified\n", data);

    long long maxd = 0;
    for (int i = 0; i < nd; i++) maxd = depths[i] > maxd ? depths[i] : maxd;
    char err[512] = "";
    double t0 = now_s();
    dsattn_v41 *m = NULL;
    if (dsattn_v41_create_random(&m, cfg, seed, fp8, err, sizeof err)) {
        fprintf(stderr, "bench v41: %s\n", err);
        return 1;
    }
    fprintf(stderr, "bench v41: %d layers, %.2f GB of %s weights made in %.1f s\n",
            dsattn_v41_n_layers(m), (double)dsattn_v41_weight_bytes(m) / 1e9,
            fp8 ? "FP8" : "bf16", now_s() - t0);
    dsattn_v41_seq *s = NULL;
    if (dsattn_v41_seq_create(&s, m, (size_t)maxd + (size_t)reps + 8, DSATTN_V41_INDEX_K_OWNER)) {
        fprintf(stderr, "bench v41: cannot allocate caches for depth %lld\n", maxd);
        dsattn_v41_destroy(m);
        return 1;
    }
    const int dim = dsattn_v41_dim(m);
    float *h = calloc((size_t)dim, sizeof(float));
    const int csv = !strcmp(fmt, "csv"), json = !strcmp(fmt, "json");
    if (csv) printf("depth,threads,ms_mean,ms_sd,gb_read,bw_gbs,bound_ms,ratio,gflop,vs_first\n");
    else if (json) printf("[\n");
    else {
        printf("V4.1-Flash attention stack, decode (40 layers, real dims, %s weights, synthetic "
               "cache fill to each depth)\n\n", fp8 ? "FP8 32x32" : "bf16");
        printf("| depth | thr | ms/token | GB read | read BW GB/s | byte bound ms | t/bound | GFLOP | t/t(first depth) |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    double first[8] = { 0 };
    int nrow = 0;
    for (int di = 0; di < nd; di++) {
        for (int ti = 0; ti < nt; ti++) {
            dsattn_ctx *ctx = NULL;
            dsattn_ctx_params p = dsattn_ctx_default_params();
            p.n_threads = (int)thr[ti];
            if (dsattn_ctx_create(&ctx, &p)) continue;
            double bw = dsattn_bench_read_bw((int)thr[ti]);
            dsattn_v41_seq_fill_synthetic(s, depths[di], seed + (uint64_t)di);
            for (int i = 0; i < dim; i++) h[i] = (float)((i * 37) % 11) - 5.0f;
            dsattn_v41_stack_forward(ctx, s, h, 1, NULL, NULL);           /* warm-up */
            double sum = 0, sum2 = 0, gb = 0, gf = 0;
            for (int r = 0; r < reps; r++) {
                for (int i = 0; i < dim; i++) h[i] = (float)((i * 37 + r) % 11) - 5.0f;
                dsattn_ctx_counters_reset(ctx);
                double a = now_s();
                dsattn_status st = dsattn_v41_stack_forward(ctx, s, h, 1, NULL, NULL);
                double dt = (now_s() - a) * 1e3;
                if (st) { fprintf(stderr, "bench v41: step failed: %s\n", dsattn_status_str(st)); break; }
                dsattn_counters c = dsattn_ctx_counters(ctx);
                gb = (double)c.bytes_read / 1e9;
                gf = (double)c.flops / 1e9;
                sum += dt;
                sum2 += dt * dt;
            }
            double mean = sum / reps, sd = sqrt(fmax(0.0, sum2 / reps - mean * mean));
            double bound = gb / bw * 1e3;
            if (di == 0) first[ti] = mean;
            double vsf = first[ti] > 0 ? mean / first[ti] : 1.0;
            if (csv)
                printf("%lld,%lld,%.2f,%.2f,%.3f,%.2f,%.2f,%.3f,%.2f,%.3f\n", depths[di], thr[ti],
                       mean, sd, gb, bw, bound, mean / bound, gf, vsf);
            else if (json)
                printf("%s  {\"depth\": %lld, \"threads\": %lld, \"ms_mean\": %.3f, \"ms_sd\": %.3f, "
                       "\"gb_read\": %.4f, \"bw_gbs\": %.3f, \"bound_ms\": %.3f, \"gflop\": %.3f}",
                       nrow ? ",\n" : "", depths[di], thr[ti], mean, sd, gb, bw, bound, gf);
            else
                printf("| %lld | %lld | %.1f ± %.1f | %.3f | %.1f | %.1f | %.2f | %.2f | %.2f |\n",
                       depths[di], thr[ti], mean, sd, gb, bw, bound, mean / bound, gf, vsf);
            fflush(stdout);
            nrow++;
            dsattn_ctx_destroy(ctx);
        }
    }
    if (json) printf("\n]\n");
    /* Prefill at a shallow depth: one chunk of `prefill` tokens at position 0
     * on a fresh sequence (the reference supports no chunked prefill). */
    if (prefill > 0 && !csv && !json) {
        printf("\n| prefill tokens | thr | s | tokens/s | GFLOP | GFLOP/s |\n|---:|---:|---:|---:|---:|---:|\n");
        float *hp = calloc((size_t)prefill * (size_t)dim, sizeof(float));
        for (int ti = 0; hp && ti < nt; ti++) {
            dsattn_ctx *ctx = NULL;
            dsattn_ctx_params p = dsattn_ctx_default_params();
            p.n_threads = (int)thr[ti];
            dsattn_v41_seq *ps = NULL;
            if (dsattn_ctx_create(&ctx, &p) ||
                dsattn_v41_seq_create(&ps, m, (size_t)prefill + 1, DSATTN_V41_INDEX_K_OWNER)) {
                dsattn_ctx_destroy(ctx);
                continue;
            }
            for (long long i = 0; i < prefill * dim; i++) hp[i] = (float)((i * 37) % 11) - 5.0f;
            dsattn_ctx_counters_reset(ctx);
            double a = now_s();
            dsattn_status st = dsattn_v41_stack_forward(ctx, ps, hp, (size_t)prefill, NULL, NULL);
            double dt = now_s() - a;
            dsattn_counters c = dsattn_ctx_counters(ctx);
            if (!st)
                printf("| %lld | %lld | %.2f | %.1f | %.1f | %.1f |\n", prefill, thr[ti], dt,
                       (double)prefill / dt, (double)c.flops / 1e9, (double)c.flops / 1e9 / dt);
            fflush(stdout);
            dsattn_v41_seq_destroy(ps);
            dsattn_ctx_destroy(ctx);
        }
        free(hp);
    }
    if (!csv && !json)
        printf("\npeak RSS %.2f GB (weights + caches for depth %lld); ISA %s\n", peak_rss_gb(),
               maxd, getenv("DSATTN_ISA") ? getenv("DSATTN_ISA") : "auto");
    free(h);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    return 0;
}
