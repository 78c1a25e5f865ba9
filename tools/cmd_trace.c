/* cmd_trace.c - `dsattn trace`: run a golden case folder and write every
 * observable tensor (src/model/trace.h says what and why); with --compare,
 * hold what it wrote against the case's expected file and say whether they
 * match: bit for bit in reference mode (top-k rows as sets, the protocol's
 * rule), within the expected file's own noise floor in fast mode. */
#include "bench_util.h"
#include "cli.h"
#include "cli_num.h"
#include "trace.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void trace_usage(FILE *f)
{
    fprintf(f,
        "usage: dsattn trace --case DIR --out FILE [options]\n\n"
        "Runs the case in DIR (config.json, weights.safetensors, input.safetensors):\n"
        "prefill of x[:prefill_len] at position 0, then one-token decode steps, and\n"
        "writes out, layer.{i}.attn_in/attn_out, layer.{i}.topk and cache.{i}.* to FILE\n"
        "(safetensors).  config.json's model_type picks the generation (deepseek_v3,\n"
        "deepseek_v32, deepseek_v4, deepseek_v41 / V4.1 keys).\n\n"
        "options:\n"
        "  --mode reference|fast     reference: bit-reproducible arithmetic contract\n"
        "                            (default); fast: SIMD + threads, fp32 accumulation\n"
        "  --index-k owner|reference V4.1 index_k quirk: owner (default) uses each\n"
        "                            owner's own keys; reference replays the official\n"
        "                            code's stale slot on incomplete ratio-2 groups\n"
        "  --mla absorb|naive        V3/V3.2 MLA path (default absorb, as official)\n"
        "  --v4-empty nan|zero       V4 all-invalid attention rows: nan as the\n"
        "                            reference (default) or a defined 0\n"
        "  --threads N               threads for fast mode\n"
        "  --compare auto|FILE       then compare FILE of the run with an expected\n"
        "                            file (auto: the case's expected.safetensors, or\n"
        "                            for V4.1 expected_intended / expected_bugcompat\n"
        "                            as --index-k says): every tensor it holds but the\n"
        "                            *_unstable ones; exit 0 when they match - bit for\n"
        "                            bit in reference mode (top-k rows as sets), `out`\n"
        "                            within the file's noise floor in fast mode\n");
}

/* The expected file's noise floor (metadata noise_floor, a JSON object):
 * out_rel_max and out_cos_min, or the protocol's tier-B gates without one. */
static void noise_floor(const dsattn_st_file *w, double *rel_max, double *cos_min, int *given)
{
    *rel_max = 1e-2;
    *cos_min = 0.9999;
    *given = 0;
    const char *nf = dsattn_st_meta(w, "noise_floor");
    cJSON *j = nf ? cJSON_Parse(nf) : NULL;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "out_rel_max");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "out_cos_min");
    if (cJSON_IsNumber(r) && cJSON_IsNumber(c)) {
        *rel_max = r->valuedouble;
        *cos_min = c->valuedouble;
        *given = 1;
    }
    cJSON_Delete(j);
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The valid (>= 0) entries of row r of a [rows, k] I32 tensor, sorted */
static size_t valid_sorted(const dsattn_st_tensor *t, size_t r, size_t k, int32_t *v)
{
    size_t n = 0;
    for (size_t i = 0; i < k; i++) {
        int32_t x;
        memcpy(&x, (const int32_t *)t->data + r * k + i, 4);
        if (x >= 0) v[n++] = x;
    }
    qsort(v, n, sizeof *v, cmp_i32);
    return n;
}

/* Rows of an I32 top-k tensor [rows, k] as sets of their valid (>= 0)
 * entries: *same counts the equal rows, *jac sums the Jaccard indices
 * (a row listing an entry twice counts it twice).  0 if out of memory. */
static int topk_rows(const dsattn_st_tensor *g, const dsattn_st_tensor *w, size_t *rows,
                     size_t *same, double *jac)
{
    const size_t k = w->ndim >= 2 ? (size_t)w->shape[w->ndim - 1] : w->numel;
    const size_t n = k ? w->numel / k : 0;
    int32_t *a = malloc((k + 1) * sizeof *a), *b = malloc((k + 1) * sizeof *b);
    if (!a || !b) { free(a); free(b); return 0; }
    for (size_t r = 0; r < n; r++) {
        const size_t na = valid_sorted(g, r, k, a), nb = valid_sorted(w, r, k, b);
        size_t both = 0;
        for (size_t i = 0, j = 0; i < na && j < nb;) {
            if (a[i] < b[j]) i++;
            else if (a[i] > b[j]) j++;
            else { both++; i++; j++; }
        }
        const size_t un = na + nb - both;
        *same += both == na && both == nb;
        *jac += un ? (double)both / (double)un : 1.0;
    }
    *rows += n;
    free(a);
    free(b);
    return 1;
}

/* FILE got against FILE want; prints the comparison to stdout.  0: they
 * match, 1: they differ, 2: a file could not be read. */
static int trace_compare(const char *got, const char *want, int fast)
{
    char err[512] = "";
    dsattn_st_file *g = NULL, *w = NULL;
    if (dsattn_st_open(&g, got, err, sizeof err) || dsattn_st_open(&w, want, err, sizeof err)) {
        fprintf(stderr, "dsattn trace: compare: %s\n", err);
        dsattn_st_close(g);
        return 2;
    }
    size_t nf = 0, fsame = 0, nb = 0, bsame = 0, nt = 0, rows = 0, rsame = 0, skipped = 0;
    double jac = 0, out_rel = NAN, out_cos = NAN;
    int out_exact = 0, have_out = 0;
    const char *first_bad = NULL, *missing = NULL;
    for (size_t i = 0; i < dsattn_st_count(w); i++) {
        const dsattn_st_tensor *tw = dsattn_st_at(w, i);
        if (strstr(tw->name, "unstable")) { skipped++; continue; }
        const dsattn_st_tensor *tg = dsattn_st_find(g, tw->name);
        if (!tg) { if (!missing) missing = tw->name; continue; }
        int shape_ok = tg->dtype == tw->dtype && tg->ndim == tw->ndim &&
                       tg->numel == tw->numel && tg->nbytes == tw->nbytes;
        for (int d = 0; shape_ok && d < tw->ndim; d++) shape_ok = tg->shape[d] == tw->shape[d];
        const size_t len = strlen(tw->name);
        if (tw->dtype == DSATTN_DT_I32 && len > 5 && !strcmp(tw->name + len - 5, ".topk")) {
            nt++;
            const size_t before = rsame, r0 = rows;
            const int ok = shape_ok && topk_rows(tg, tw, &rows, &rsame, &jac);
            if ((!ok || rsame - before != rows - r0) && !first_bad) first_bad = tw->name;
        } else if (tw->dtype == DSATTN_DT_F32) {
            nf++;
            const int same = shape_ok && !memcmp(tg->data, tw->data, tw->nbytes);
            fsame += same;
            if (!same && !first_bad) first_bad = tw->name;
            if (!strcmp(tw->name, "out") && shape_ok) {
                float *a = malloc(tw->numel * sizeof(float) + 4);
                float *b = malloc(tw->numel * sizeof(float) + 4);
                if (a && b && !dsattn_st_to_f32(tg, a, tg->numel) &&
                    !dsattn_st_to_f32(tw, b, tw->numel)) {
                    dsattn_bench_rel_cos(a, b, tw->numel, &out_rel, &out_cos);
                    have_out = 1;
                    out_exact = same;
                }
                free(a);
                free(b);
            }
        } else {
            nb++;
            const int same = shape_ok && !memcmp(tg->data, tw->data, tw->nbytes);
            bsame += same;
            if (!same && !first_bad) first_bad = tw->name;
        }
    }
    double rel_max, cos_min;
    int given;
    noise_floor(w, &rel_max, &cos_min, &given);
    printf("compare: %s with %s (%zu tensors; %zu *_unstable left out)\n", got, want,
           dsattn_st_count(w) - skipped, skipped);
    if (have_out)
        printf("  out: %s, relative L2 %.3g, cosine %.7f (%s: relative <= %.3g, cosine >= %.7f)\n",
               out_exact ? "bit for bit" : "differs", out_rel, out_cos,
               given ? "the file's noise floor" : "the protocol's gate", rel_max, cos_min);
    printf("  float tensors: %zu of %zu bit for bit\n", fsame, nf);
    if (nt)
        printf("  top-k: %zu tensors, %zu of %zu rows the same sets (mean Jaccard %.4f)\n", nt,
               rsame, rows, rows ? jac / (double)rows : 1.0);
    if (nb) printf("  other tensors (caches, indices): %zu of %zu byte for byte\n", bsame, nb);
    int rc;
    if (missing) {
        printf("verdict: DIFFERS: the run wrote no %s\n", missing);
        rc = 1;
    } else if (!have_out) {
        printf("verdict: DIFFERS: no comparable `out`\n");
        rc = 1;
    } else if (!fast) {
        rc = first_bad != NULL;
        if (rc) printf("verdict: DIFFERS: first at %s\n", first_bad);
        else    printf("verdict: MATCH, bit for bit\n");
    } else {
        rc = !(out_rel <= rel_max && out_cos >= cos_min);
        printf("verdict: %s\n", rc ? "DIFFERS: `out` outside the noise floor"
                                   : "MATCH, `out` within the noise floor (fast mode)");
    }
    dsattn_st_close(g);
    dsattn_st_close(w);
    return rc;
}

/* --compare auto: the case's expected file for these options */
static int expected_auto(const char *dir, int index_k_ref, char *path, size_t n)
{
    const char *names[] = { "expected.safetensors",
                            index_k_ref ? "expected_bugcompat.safetensors"
                                        : "expected_intended.safetensors" };
    for (size_t i = 0; i < 2; i++) {
        if ((size_t)snprintf(path, n, "%s/%s", dir, names[i]) >= n) return -1;
        if (access(path, R_OK) == 0) return 0;
    }
    return -1;
}

DSATTN_CMD(trace, 40, "run a golden case folder, write every tensor (compare with any reference)")
static int cmd_trace(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *cmp = NULL;
    dsattn_trace_opts o = { DSATTN_MODE_REFERENCE, 0, 0, 0, 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { trace_usage(stdout); return 0; }
        if (!v) { fprintf(stderr, "dsattn trace: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--case")) dir = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--compare")) cmp = v;
        else if (!strcmp(a, "--threads")) {
            int rc = dsattn_cli_i32("trace", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &o.n_threads);
            if (rc) return rc;
        }
        else if (!strcmp(a, "--mode") && !strcmp(v, "reference")) o.mode = DSATTN_MODE_REFERENCE;
        else if (!strcmp(a, "--mode") && !strcmp(v, "fast")) o.mode = DSATTN_MODE_FAST;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "owner")) o.index_k_ref = 0;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "reference")) o.index_k_ref = 1;
        else if (!strcmp(a, "--mla") && !strcmp(v, "absorb")) o.mla_naive = 0;
        else if (!strcmp(a, "--mla") && !strcmp(v, "naive")) o.mla_naive = 1;
        else if (!strcmp(a, "--v4-empty") && !strcmp(v, "nan")) o.v4_defined_empty = 0;
        else if (!strcmp(a, "--v4-empty") && !strcmp(v, "zero")) o.v4_defined_empty = 1;
        else { fprintf(stderr, "dsattn trace: bad option %s %s\n", a, v); trace_usage(stderr); return 2; }
    }
    if (!dir || !out) { trace_usage(stderr); return 2; }
    char want[4096];
    if (cmp && !strcmp(cmp, "auto")) {
        if (expected_auto(dir, o.index_k_ref, want, sizeof want)) {
            fprintf(stderr, "dsattn trace: --compare auto: %s holds no expected.safetensors%s\n",
                    dir, o.index_k_ref ? " or expected_bugcompat.safetensors"
                                       : " or expected_intended.safetensors");
            return 2;
        }
    } else if (cmp && (size_t)snprintf(want, sizeof want, "%s", cmp) >= sizeof want) {
        fprintf(stderr, "dsattn trace: --compare: path too long\n");
        return 2;
    }
    struct stat so, sw;
    if (cmp && stat(out, &so) == 0 && stat(want, &sw) == 0 && so.st_dev == sw.st_dev &&
        so.st_ino == sw.st_ino) {          /* the run would overwrite what it is held against */
        fprintf(stderr, "dsattn trace: --out %s is the file --compare reads\n", out);
        return 2;
    }
    char err[1024] = "";
    dsattn_status st = dsattn_trace_case(dir, out, &o, err, sizeof err);
    if (st) {
        fprintf(stderr, "dsattn trace: %s (%s)\n", err[0] ? err : "failed", dsattn_status_str(st));
        return 1;
    }
    fprintf(stderr, "dsattn trace: wrote %s\n", out);
    return cmp ? trace_compare(out, want, o.mode == DSATTN_MODE_FAST) : 0;
}
