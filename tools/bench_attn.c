/* bench_attn.c - `dsattn bench mha`: decode speed of one MHA / GQA layer
 * (DeepSeek-LLM 7B / 67B, real dims, bf16) at deep contexts, as a fraction
 * of the machine's DRAM read bandwidth measured in the same run.
 *
 * A decode step of dense attention streams the whole bf16 K/V cache once;
 * the fast path reads each KV head's rows once for all query heads of its
 * group, so the step's bytes (cache + one layer's weights, counted by the
 * kernels) over its time should approach the read bandwidth.  Deep
 * contexts come from dsattn_mha_seq_fill_synthetic (random bf16 rows), as
 * the output says.  Before anything is timed, the fast step is checked
 * against the reference step on the same cache at a short depth.
 * Deliberately not here: targets enforced as failures (they are reported).
 */
#include "bench_util.h"
#include "dsattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
        if (*end && *end != ',') return -1;
        v[n++] = x;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* is `name` one of the comma-separated items of `list`? */
static int in_list(const char *list, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == k && !strncmp(p, name, k)) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

static float *rand_x(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof(float));
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 3;
    for (size_t i = 0; i < n && x; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        float u = (float)((double)(s >> 11) * 0x1p-52 - 1.0) * 1.7320508f;
        uint32_t b;
        memcpy(&b, &u, 4);
        b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;      /* bf16 value */
        memcpy(&x[i], &b, 4);
    }
    return x;
}

/* fast vs reference on one synthetic cache: rel L2 <= 4e-3 (test_mha's
 * bound).  Returns 0 if they agree. */
static int verify(const dsattn_mha *m, uint64_t seed)
{
    const size_t depth = 2048, dim = (size_t)dsattn_mha_dim(m);
    dsattn_ctx_params p = dsattn_ctx_default_params();
    dsattn_ctx *cf = NULL, *cr = NULL;
    dsattn_mha_seq *sf = NULL, *sr = NULL;
    float *x = rand_x(dim, seed), *of = calloc(dim, 4), *orf = calloc(dim, 4);
    int bad = 1;
    dsattn_ctx_create(&cf, &p);
    p.mode = DSATTN_MODE_REFERENCE;
    dsattn_ctx_create(&cr, &p);
    if (cf && cr && x && of && orf && !dsattn_mha_seq_create_layers(&sf, m, depth + 1, 0, 1) &&
        !dsattn_mha_seq_create_layers(&sr, m, depth + 1, 0, 1) &&
        !dsattn_mha_seq_fill_synthetic(sf, depth, seed) &&
        !dsattn_mha_seq_fill_synthetic(sr, depth, seed) &&
        !dsattn_mha_attn_forward(cf, sf, 0, x, 1, of) &&
        !dsattn_mha_attn_forward(cr, sr, 0, x, 1, orf)) {
        double num = 0, den = 0;
        for (size_t i = 0; i < dim; i++) {
            num += (double)(of[i] - orf[i]) * (of[i] - orf[i]);
            den += (double)orf[i] * orf[i];
        }
        bad = !(sqrt(num / fmax(den, 1e-300)) <= 4e-3);
    }
    dsattn_mha_seq_destroy(sf);
    dsattn_mha_seq_destroy(sr);
    dsattn_ctx_destroy(cf);
    dsattn_ctx_destroy(cr);
    free(x); free(of); free(orf);
    return bad;
}

int dsattn_bench_mha(int argc, char **argv)
{
    const char *configs = getenv("DSATTN_CONFIGS") ? getenv("DSATTN_CONFIGS") : "configs";
    const char *fmt = "md", *models = "7b,67b";
    long long depths[8] = { 16384, 65536, 131072 }, thr[8] = { 1, 2 };
    int nd = 3, nt = 2, reps = 3;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dsattn bench mha [--model 7b,67b] [--depth 16K,64K,128K] [--threads 1,2]\n"
                   "                        [--reps 3] [--configs DIR] [--seed S] [--format md|csv|json]\n"
                   "One MHA (DeepSeek-LLM-7B) / GQA (67B) layer at real dims decoding one token\n"
                   "over a synthetically filled bf16 cache; GB/s vs the DRAM read bandwidth.\n");
            return 0;
        }
        if (!v) { fprintf(stderr, "bench mha: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--depth")) nd = parse_list(v, depths, 8);
        else if (!strcmp(a, "--threads")) nt = parse_list(v, thr, 8);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--model")) models = v;
        else if (!strcmp(a, "--configs")) configs = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--format")) fmt = v;
        else { fprintf(stderr, "bench mha: unknown option %s\n", a); return 2; }
    }
    if (nd <= 0 || nt <= 0 || reps <= 0) { fprintf(stderr, "bench mha: bad list\n"); return 2; }
    const int csv = !strcmp(fmt, "csv"), json = !strcmp(fmt, "json");
    if (csv) printf("model,depth,threads,ms_mean,ms_sd,gb_read,gb_s,dram_gb_s,frac_dram,gflop\n");
    else if (json) printf("[\n");
    else {
        printf("One attention layer decoding one token at real dims (bf16 weights and cache; "
               "synthetic cache fill to each depth); bytes = cache + the layer's weights, "
               "counted by the kernels\n\n");
        printf("| model | depth | thr | ms/token | GB read | GB/s | DRAM read GB/s | of DRAM | GFLOP |\n");
        printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    int nrow = 0, rc = 0;
    const char *names[2] = { "7b", "67b" };
    for (int mi = 0; mi < 2; mi++) {
        if (!in_list(models, names[mi])) continue;
        char cfg[1024], err[512] = "";
        snprintf(cfg, sizeof cfg, "%s/deepseek-llm-%s.json", configs, names[mi]);
        dsattn_mha *m = NULL;
        if (dsattn_mha_create_random_layers(&m, cfg, seed, 0, 1, err, sizeof err)) {
            fprintf(stderr, "bench mha: %s\n", err);
            rc = 1;
            continue;
        }
        if (verify(m, seed)) {
            fprintf(stderr, "bench mha: %s fast path disagrees with reference; not timing\n", cfg);
            dsattn_mha_destroy(m);
            rc = 1;
            continue;
        }
        const size_t dim = (size_t)dsattn_mha_dim(m);
        float *x = rand_x(dim, seed + 1), *y = calloc(dim, sizeof(float));
        for (int di = 0; di < nd; di++) {
            dsattn_mha_seq *s = NULL;
            if (dsattn_mha_seq_create_layers(&s, m, (size_t)depths[di] + 1, 0, 1) ||
                dsattn_mha_seq_fill_synthetic(s, depths[di], seed + (uint64_t)di)) {
                fprintf(stderr, "bench mha: cannot hold depth %lld\n", depths[di]);
                dsattn_mha_seq_destroy(s);
                continue;
            }
            for (int ti = 0; ti < nt; ti++) {
                dsattn_ctx *ctx = NULL;
                dsattn_ctx_params p = dsattn_ctx_default_params();
                p.n_threads = (int)thr[ti];
                if (dsattn_ctx_create(&ctx, &p)) continue;
                double bw = dsattn_bench_read_bw((int)thr[ti]);
                dsattn_mha_attn_forward(ctx, s, 0, x, 1, y);             /* warm-up */
                double sum = 0, sum2 = 0, gb = 0, gf = 0;
                for (int r = 0; r < reps; r++) {
                    dsattn_ctx_counters_reset(ctx);
                    double a = now_s();
                    dsattn_status st = dsattn_mha_attn_forward(ctx, s, 0, x, 1, y);
                    double dt = (now_s() - a) * 1e3;
                    if (st) { fprintf(stderr, "bench mha: %s\n", dsattn_status_str(st)); break; }
                    dsattn_counters c = dsattn_ctx_counters(ctx);
                    gb = (double)c.bytes_read / 1e9;
                    gf = (double)c.flops / 1e9;
                    sum += dt;
                    sum2 += dt * dt;
                }
                double mean = sum / reps, sd = sqrt(fmax(0.0, sum2 / reps - mean * mean));
                double gbs = gb / (mean / 1e3);
                if (csv)
                    printf("%s,%lld,%lld,%.3f,%.3f,%.4f,%.3f,%.3f,%.3f,%.3f\n", names[mi], depths[di],
                           thr[ti], mean, sd, gb, gbs, bw, gbs / bw, gf);
                else if (json)
                    printf("%s  {\"model\": \"deepseek-llm-%s\", \"depth\": %lld, \"threads\": %lld, "
                           "\"ms_mean\": %.3f, \"ms_sd\": %.3f, \"gb_read\": %.4f, \"gb_s\": %.3f, "
                           "\"dram_gb_s\": %.3f, \"gflop\": %.3f}", nrow ? ",\n" : "", names[mi],
                           depths[di], thr[ti], mean, sd, gb, gbs, bw, gf);
                else
                    printf("| DeepSeek-LLM-%s (%s) | %lld | %lld | %.1f ± %.1f | %.3f | %.2f | %.2f | "
                           "%.0f%% | %.2f |\n", mi ? "67B" : "7B", mi ? "GQA" : "MHA", depths[di],
                           thr[ti], mean, sd, gb, gbs, bw, 100.0 * gbs / bw, gf);
                fflush(stdout);
                nrow++;
                dsattn_ctx_destroy(ctx);
            }
            dsattn_mha_seq_destroy(s);
        }
        free(x);
        free(y);
        dsattn_mha_destroy(m);
    }
    if (json) printf("\n]\n");
    return rc;
}
