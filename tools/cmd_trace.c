/* cmd_trace.c - `dsattn trace`: run a golden case folder and write every
 * observable tensor (src/model/trace.h says what and why). */
#include "cli.h"
#include "cli_num.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        "  --threads N               threads for fast mode\n");
}

DSATTN_CMD(trace, 40, "run a golden case folder, write every tensor (compare with any reference)")
static int cmd_trace(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    dsattn_trace_opts o = { DSATTN_MODE_REFERENCE, 0, 0, 0, 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { trace_usage(stdout); return 0; }
        if (!v) { fprintf(stderr, "dsattn trace: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--case")) dir = v;
        else if (!strcmp(a, "--out")) out = v;
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
    char err[1024] = "";
    dsattn_status st = dsattn_trace_case(dir, out, &o, err, sizeof err);
    if (st) {
        fprintf(stderr, "dsattn trace: %s (%s)\n", err[0] ? err : "failed", dsattn_status_str(st));
        return 1;
    }
    fprintf(stderr, "dsattn trace: wrote %s\n", out);
    return 0;
}
