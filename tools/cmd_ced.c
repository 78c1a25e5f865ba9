/* cmd_ced.c - `dsattn ced`: how far bounded replay lands from the exact CED
 * prefill of a V4.1 stack (docs/v41.md "CED prefill").  Runs the same prompt
 * and decode steps twice (exact, bounded) and prints, per layer, the
 * attention output at the prompt's last token (relative L2 error and
 * cosine, bounded against exact), then per decode step the stack's output
 * and the top-k overlap of every index source.  Exact equals a full prefill
 * bit for bit in reference mode (tests/test_ced.c), so this is the error
 * against the reference's prefill.
 */
#include "bench_util.h"
#include "cli.h"
#include "cli_num.h"
#include "dsattn.h"
#include "trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ced_usage(FILE *f)
{
    fprintf(f,
            "usage: dsattn ced [--case DIR | --config FILE [--seed S] [--bf16]]\n"
            "                  [--prefill N] [--decode M (4)] [--threads T] [--mode fast|reference]\n"
            "  --case DIR: a golden case folder (config.json, weights.safetensors,\n"
            "  input.safetensors; prefill defaults to the case's).  Otherwise random\n"
            "  weights at the config's dims (FP8 unless --bf16) and seeded unit-normal\n"
            "  input rows; --prefill defaults to 4 windows.  Prints bounded replay\n"
            "  against exact: per layer at the last prompt token, then per decode step.\n");
}

typedef struct {
    dsattn_v41_seq *s;
    float *aout;             /* [L, P, dim] prefill attention outputs */
    float *h;                /* [T, dim] */
    int32_t *sel;            /* [M, L, kw] decode selections (last row), -2 none */
} ced_run;

static dsattn_status run_one(dsattn_ctx *ctx, const dsattn_v41 *m, const float *x, size_t P,
                             size_t T, size_t kw, dsattn_v41_ced mode, ced_run *r)
{
    const size_t dim = (size_t)dsattn_v41_dim(m), L = (size_t)dsattn_v41_n_layers(m);
    memset(r, 0, sizeof *r);
    r->aout = malloc(L * P * dim * sizeof(float));
    r->h = malloc(T * dim * sizeof(float));
    r->sel = malloc((T - P + 1) * L * kw * sizeof(int32_t));
    if (!r->aout || !r->h || !r->sel) return DSATTN_ERR_NOMEM;
    memcpy(r->h, x, T * dim * sizeof(float));
    dsattn_status st = dsattn_v41_seq_create(&r->s, m, T, DSATTN_V41_INDEX_K_OWNER);
    if (!st) st = dsattn_v41_stack_prefill(ctx, r->s, r->h, P, mode, r->aout);
    for (size_t t = P; t < T && !st; t++) {
        st = dsattn_v41_stack_forward(ctx, r->s, r->h + t * dim, 1, NULL, NULL);
        for (size_t l = 0; l < L && !st; l++) {
            int32_t *d = r->sel + ((t - P) * L + l) * kw;
            const int32_t *rows;
            size_t nr, w;
            for (size_t i = 0; i < kw; i++) d[i] = -2;
            if (dsattn_v41_seq_selection(r->s, (int)l, &rows, &nr, &w) == DSATTN_OK && nr)
                for (size_t i = 0; i < w && i < kw; i++) d[i] = rows[(nr - 1) * w + i];
        }
    }
    return st;
}

static void run_free(ced_run *r)
{
    dsattn_v41_seq_destroy(r->s);
    free(r->aout);
    free(r->h);
    free(r->sel);
}

/* |A ∩ B| / |A| over the valid entries of two selection rows */
static void overlap(const int32_t *a, const int32_t *b, size_t kw, double *both, double *na)
{
    for (size_t i = 0; i < kw; i++) {
        if (a[i] < 0) continue;
        *na += 1;
        for (size_t j = 0; j < kw; j++)
            if (b[j] == a[i]) { *both += 1; break; }
    }
}

DSATTN_CMD(ced, 35, "V4.1 CED prefill: bounded replay's error against exact, per layer and decode step")
static int cmd_ced(int argc, char **argv)
{
    const char *case_dir = NULL, *config = NULL;
    uint64_t seed = 1;
    int fp8 = 1, threads = 0, rc;
    long long prefill = 0, decode = 4;
    dsattn_mode mode = DSATTN_MODE_FAST;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { ced_usage(stdout); return 0; }
        if (!strcmp(a, "--bf16")) { fp8 = 0; continue; }
        if (!v) { fprintf(stderr, "dsattn ced: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--case")) case_dir = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--seed")) { if ((rc = dsattn_cli_u64("ced", a, v, &seed))) return rc; }
        else if (!strcmp(a, "--prefill")) {
            if ((rc = dsattn_cli_int("ced", a, v, 1, 1 << 20, DSATTN_CLI_SUFFIX, &prefill))) return rc;
        } else if (!strcmp(a, "--decode")) {
            if ((rc = dsattn_cli_int("ced", a, v, 1, 4096, 0, &decode))) return rc;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = dsattn_cli_i32("ced", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &threads))) return rc;
        } else if (!strcmp(a, "--mode") && !strcmp(v, "fast")) mode = DSATTN_MODE_FAST;
        else if (!strcmp(a, "--mode") && !strcmp(v, "reference")) mode = DSATTN_MODE_REFERENCE;
        else { fprintf(stderr, "dsattn ced: bad option %s %s\n", a, v); ced_usage(stderr); return 2; }
    }
    if (!case_dir == !config) {
        fprintf(stderr, "dsattn ced: give --case DIR or --config FILE\n");
        return 2;
    }
    char err[1024] = "", cfgp[1100], wts[1100];
    dsattn_v41 *m = NULL;
    float *x = NULL;
    size_t T = 0, dim = 0, P = 0;
    dsattn_status st;
    if (case_dir) {
        snprintf(cfgp, sizeof cfgp, "%s/config.json", case_dir);
        snprintf(wts, sizeof wts, "%s/weights.safetensors", case_dir);
        st = dsattn_v41_load(&m, cfgp, wts, err, sizeof err);
        if (!st) st = dsattn_trace_load_input(case_dir, &x, &T, &dim, &P, err, sizeof err);
        if (!st && prefill) {
            if ((size_t)prefill + (size_t)decode > T) {
                fprintf(stderr, "dsattn ced: --prefill + --decode > the case's %zu tokens\n", T);
                free(x);
                dsattn_v41_destroy(m);
                return 2;
            }
            P = (size_t)prefill;
        }
        if (!st && P + (size_t)decode < T) T = P + (size_t)decode;
    } else {
        st = dsattn_v41_create_random(&m, config, seed, fp8, err, sizeof err);
        if (!st) {
            dim = (size_t)dsattn_v41_dim(m);
            P = prefill ? (size_t)prefill : 512;
            T = P + (size_t)decode;
            x = malloc(T * dim * sizeof(float));
            if (!x) st = DSATTN_ERR_NOMEM;
            uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
            for (size_t i = 0; x && i < T * dim; i++) {       /* Box-Muller, xorshift */
                double u[2];
                for (int k = 0; k < 2; k++) {
                    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                    u[k] = ((double)(s >> 11) + 0.5) * 0x1p-53;
                }
                x[i] = (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
            }
        }
    }
    if (st) {
        fprintf(stderr, "dsattn ced: %s (%s)\n", err[0] ? err : "cannot load", dsattn_status_str(st));
        free(x);
        dsattn_v41_destroy(m);
        return 1;
    }
    const size_t L = (size_t)dsattn_v41_n_layers(m), kw = 4097;
    dsattn_ctx *ctx = NULL;
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    p.n_threads = threads;
    ced_run e, b;
    memset(&e, 0, sizeof e);
    memset(&b, 0, sizeof b);
    rc = 1;
    if ((st = dsattn_ctx_create(&ctx, &p))) goto out;
    double t0 = dsattn_bench_now();
    if ((st = run_one(ctx, m, x, P, T, kw, DSATTN_V41_CED_EXACT, &e))) goto out;
    double te = dsattn_bench_now() - t0;
    t0 = dsattn_bench_now();
    if ((st = run_one(ctx, m, x, P, T, kw, DSATTN_V41_CED_BOUNDED, &b))) goto out;
    double tb = dsattn_bench_now() - t0;
    dsattn_v41_ced_rows rows[256];
    dsattn_v41_ced_plan(m, P, DSATTN_V41_CED_BOUNDED, rows);
    char cpu[128];
    dsattn_bench_cpu_model(cpu, sizeof cpu);
    printf("dsattn ced: %s, %zu layers, dim %zu, prompt %zu, %lld decode steps, %s mode, isa %s, "
           "%d threads, CPU %s\n", case_dir ? case_dir : config, L, dim, P, decode,
           mode == DSATTN_MODE_FAST ? "fast" : "reference", dsattn_ctx_isa_name(ctx),
           dsattn_ctx_threads(ctx), cpu);
    printf("exact run %.1f s, bounded run %.1f s (prefill + decode)\n\n", te, tb);
    printf("Attention output at the last prompt token, bounded against exact:\n\n");
    printf("| layer | mode | rows bounded | rel L2 | cosine |\n|---:|---|---:|---:|---:|\n");
    static const char *mname[] = { "SWA", "Full", "Reindex", "Reuse", "MTP" };
    for (size_t l = 0; l < L; l++) {
        const float *ea = e.aout + (l * P + P - 1) * dim, *ba = b.aout + (l * P + P - 1) * dim;
        double rel, cs;
        dsattn_bench_rel_cos(ba, ea, dim, &rel, &cs);
        dsattn_v41_mode md = dsattn_v41_layer_mode(m, (int)l);
        printf("| %zu | %s | %zu | %.3g | %.6f |\n", l, (unsigned)md < 5 ? mname[md] : "?",
               P - rows[l].in_first, rel, cs);
    }
    printf("\nDecode steps after the prompt (the stack's output; top-k: entries of exact's "
           "selection bounded also picks, over every index source):\n\n");
    printf("| position | rel L2 | cosine | top-k overlap |\n|---:|---:|---:|---:|\n");
    for (size_t t = P; t < T; t++) {
        double rel, cs, both = 0, na = 0;
        dsattn_bench_rel_cos(b.h + t * dim, e.h + t * dim, dim, &rel, &cs);
        for (size_t l = 0; l < L; l++)
            overlap(e.sel + ((t - P) * L + l) * kw, b.sel + ((t - P) * L + l) * kw, kw, &both, &na);
        printf("| %zu | %.3g | %.6f | %.4f |\n", t, rel, cs, na > 0 ? both / na : 1.0);
    }
    rc = 0;
out:
    if (st) fprintf(stderr, "dsattn ced: %s\n", dsattn_status_str(st));
    run_free(&e);
    run_free(&b);
    dsattn_ctx_destroy(ctx);
    free(x);
    dsattn_v41_destroy(m);
    return rc;
}
