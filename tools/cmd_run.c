/* cmd_run.c - `dsattn run`: the full DeepSeek-V4.1-Flash attention stack
 * (40 backbone layers, real dimensions, the shared attention runtime) on
 * random FP8 weights from a seed or on a real checkpoint: prefill N tokens,
 * decode M, and show what happened.
 *
 * Per layer: its mode (SWA / Full / Reindex / Reuse) and ratio, whose
 * compressed KV it read (dsattn_v41_seq_source_read), whose index keys it
 * scored (dsattn_v41_seq_index_read) and whose top-k rows it attended
 * (dsattn_v41_seq_topk_read), as recorded by the shared runtime.  Per step: wall time, the kernels' FLOP and byte
 * counters, the KV bytes in use.  At the end: peak RSS.
 *
 * The stack forward is dsattn_v41_stack_forward: for each layer
 * x = bf16(RMSNorm(h)), attention, h += out.  Deliberately not here: the
 * embedding, MoE/FFN blocks, mHC and the LM head - this is an attention
 * library - so inputs are seeded random rows of unit RMS standing in for
 * the token embeddings, and nothing is sampled.
 */
#include "cli.h"
#include "cli_num.h"
#include "dsattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* --prefill / --decode bound: 16M tokens (the caches decide what fits). */
#define RUN_MAX_TOKENS (1ll << 24)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void run_usage(FILE *f)
{
    fprintf(f,
        "usage: dsattn run [options]\n\n"
        "Runs the DeepSeek-V4.1-Flash attention stack (all backbone layers, real dims):\n"
        "prefill N tokens, then decode M one at a time, with random FP8 weights from a\n"
        "seed, or a checkpoint with --weights.  Inputs are seeded random rows standing in\n"
        "for token embeddings (no embedding, FFN or LM head: an attention library).\n\n"
        "options:\n"
        "  --config FILE        config (default: the checkpoint's own config.json with\n"
        "                       --weights, else configs/deepseek-v4.1-flash.json)\n"
        "  --weights PATH       checkpoint: a .safetensors file, a shard index or a folder\n"
        "                       (official inference or HF names); default random weights\n"
        "  --seed N             random weights and inputs (default 1)\n"
        "  --bf16               random bf16 weights instead of the released FP8\n"
        "  --prefill N          prompt tokens (default 64)\n"
        "  --decode M           decode steps (default 8)\n"
        "  --mode fast|reference  arithmetic (default fast)\n"
        "  --index-k owner|reference  V4.1 index_k quirk (default owner)\n"
        "  --threads N          threads (default: OpenMP's)\n");
}

static const char *find_config(void)
{
    static char path[1100];
    const char *e = getenv("DSATTN_CONFIGS");
    if (e && *e) {
        snprintf(path, sizeof path, "%s/deepseek-v4.1-flash.json", e);
        return path;
    }
    if (access("configs/deepseek-v4.1-flash.json", R_OK) == 0)
        return "configs/deepseek-v4.1-flash.json";
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) {
            *s = 0;
            snprintf(path, sizeof path, "%s/../configs/deepseek-v4.1-flash.json", exe);
            if (access(path, R_OK) == 0) return path;
        }
    }
    return "configs/deepseek-v4.1-flash.json";
}

static const char *mode_name(dsattn_v41_mode m)
{
    switch (m) {
    case DSATTN_V41_SWA:     return "SWA";
    case DSATTN_V41_FULL:    return "Full";
    case DSATTN_V41_REINDEX: return "Reindex";
    case DSATTN_V41_REUSE:   return "Reuse";
    default:                 return "MTP";
    }
}

/* Unit-RMS rows (bf16 values need not hold: the residual stream is fp32). */
static void rand_rows(float *h, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = *s;
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        *s = x;
        h[i] = (float)((double)(x >> 11) * 0x1p-52 - 1.0) * 1.7320508f;
    }
}

/* Bytes of the global caches (compressed KV + index keys) and of the
 * window rings holding tokens so far, from the packed caches themselves. */
static void kv_in_use(const dsattn_v41 *m, const dsattn_v41_seq *s, double *global,
                      double *window)
{
    *global = *window = 0;
    int64_t pos = dsattn_v41_seq_pos(s);
    for (int l = 0; l < dsattn_v41_n_layers(m); l++) {
        const uint8_t *rows;
        size_t n, rb;
        if (dsattn_v41_seq_cache(s, l, 0, &rows, &n, &rb) == DSATTN_OK)
            *window += (double)((size_t)pos < n ? (size_t)pos : n) * (double)rb;
        for (int which = 1; which <= 2; which++)
            if (dsattn_v41_seq_cache(s, l, which, &rows, &n, &rb) == DSATTN_OK)
                *global += (double)n * (double)rb;
    }
}

static const char *mib(double b, char *buf, size_t n)
{
    if (b >= 1048576.0) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else snprintf(buf, n, "%.1f KiB", b / 1024.0);
    return buf;
}

DSATTN_CMD(run, 30, "run the V4.1-Flash attention stack: prefill N, decode M, per-layer modes and sources")
{
    const char *config = NULL, *weights = NULL;
    uint64_t seed = 1;
    int fp8 = 1, threads = 0;
    long long n_prefill = 64, n_decode = 8;
    int rc;
    dsattn_mode mode = DSATTN_MODE_FAST;
    dsattn_v41_index_k ik = DSATTN_V41_INDEX_K_OWNER;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        if (!strcmp(a, "--bf16")) { fp8 = 0; continue; }
        if (!v) { fprintf(stderr, "dsattn run: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--seed")) { if ((rc = dsattn_cli_u64("run", a, v, &seed))) return rc; }
        else if (!strcmp(a, "--prefill")) {
            if ((rc = dsattn_cli_int("run", a, v, 1, RUN_MAX_TOKENS, DSATTN_CLI_SUFFIX, &n_prefill)))
                return rc;
        } else if (!strcmp(a, "--decode")) {
            if ((rc = dsattn_cli_int("run", a, v, 0, RUN_MAX_TOKENS, DSATTN_CLI_SUFFIX, &n_decode)))
                return rc;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = dsattn_cli_i32("run", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &threads))) return rc;
        }
        else if (!strcmp(a, "--mode") && !strcmp(v, "fast")) mode = DSATTN_MODE_FAST;
        else if (!strcmp(a, "--mode") && !strcmp(v, "reference")) mode = DSATTN_MODE_REFERENCE;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "owner")) ik = DSATTN_V41_INDEX_K_OWNER;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "reference")) ik = DSATTN_V41_INDEX_K_REFERENCE;
        else { fprintf(stderr, "dsattn run: bad option %s %s\n", a, v); run_usage(stderr); return 2; }
    }
    /* a checkpoint brings its own config.json unless --config says otherwise */
    if (!config && !weights) config = find_config();

    char err[1024] = "", b1[48], b2[48];
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    p.n_threads = threads;
    dsattn_ctx *ctx = NULL;
    dsattn_v41 *m = NULL;
    dsattn_v41_seq *s = NULL;
    float *h = NULL;
    rc = 1;
    dsattn_status st = dsattn_ctx_create(&ctx, &p);
    if (st) { fprintf(stderr, "dsattn run: context: %s\n", dsattn_status_str(st)); return 1; }

    double t0 = now_s();
    /* The weights hook: a real checkpoint goes through the checkpoint
     * loader (dsattn_v41_load: file, shard index or folder); otherwise
     * random weights at the config's dims. */
    if (weights) st = dsattn_v41_load(&m, config, weights, err, sizeof err);
    else st = dsattn_v41_create_random(&m, config, seed, fp8, err, sizeof err);
    if (st) {
        fprintf(stderr, "dsattn run: %s (%s)\n", err[0] ? err : "cannot make the model",
                dsattn_status_str(st));
        goto out;
    }
    const int L = dsattn_v41_n_layers(m), dim = dsattn_v41_dim(m);
    printf("dsattn run: V4.1 attention stack from %s\n",
           config ? config : "the config.json beside the weights");
    printf("  %d layers, dim %d, weights %s (%.2f GiB, %s), made in %.1f s\n", L, dim,
           weights ? weights : "random", (double)dsattn_v41_weight_bytes(m) / 1073741824.0,
           weights ? "as stored" : fp8 ? "FP8 E4M3, seed" : "bf16, seed", now_s() - t0);
    printf("  isa %s, %d threads, %s mode, index_k %s\n", dsattn_ctx_isa_name(ctx),
           dsattn_ctx_threads(ctx), mode == DSATTN_MODE_FAST ? "fast" : "reference",
           ik == DSATTN_V41_INDEX_K_OWNER ? "owner" : "reference");
    printf("  inputs: seeded random unit-RMS rows standing in for token embeddings\n\n");

    if ((st = dsattn_v41_seq_create(&s, m, (size_t)(n_prefill + n_decode), ik))) {
        fprintf(stderr, "dsattn run: sequence: %s\n", dsattn_status_str(st));
        goto out;
    }
    h = malloc((size_t)n_prefill * (size_t)dim * sizeof(float));
    if (!h) goto out;
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + 12345;
    dsattn_kv_bill bill;
    dsattn_v41_seq_kv_bill(s, &bill);

    printf("| step | tokens | position | ms | GFLOP | GB read | global KV in use | window in use | out RMS |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (long long step = 0; step <= n_decode; step++) {
        size_t n = step == 0 ? (size_t)n_prefill : 1;
        int64_t pos0 = dsattn_v41_seq_pos(s);
        rand_rows(h, n * (size_t)dim, &rs);
        dsattn_ctx_counters_reset(ctx);
        double ts = now_s();
        st = dsattn_v41_stack_forward(ctx, s, h, n, NULL, NULL);
        double ms = (now_s() - ts) * 1e3;
        if (st) {
            fprintf(stderr, "dsattn run: step %lld: %s\n", step, dsattn_status_str(st));
            goto out;
        }
        dsattn_counters c = dsattn_ctx_counters(ctx);
        double ss = 0, g, w;
        for (size_t i = 0; i < n * (size_t)dim; i++) ss += (double)h[i] * h[i];
        double rms = sqrt(ss / (double)(n * (size_t)dim));
        if (!isfinite(rms)) {
            fprintf(stderr, "dsattn run: step %lld produced a non-finite residual\n", step);
            goto out;
        }
        kv_in_use(m, s, &g, &w);
        char nm[32];
        if (step == 0) snprintf(nm, sizeof nm, "prefill");
        else snprintf(nm, sizeof nm, "decode %lld", step);
        printf("| %s | %zu | %lld | %.1f | %.2f | %.3f | %s | %s | %.4f |\n", nm, n,
               (long long)pos0, ms, (double)c.flops / 1e9, (double)c.bytes_read / 1e9,
               mib(g, b1, sizeof b1), mib(w, b2, sizeof b2), rms);
    }

    /* The plan and the sources each layer actually read in the last step. */
    printf("\n| layer | mode | ratio | read compressed KV of | took top-k rows of | scored index keys of |\n");
    printf("|---:|---|---:|---:|---:|---:|\n");
    for (int l = 0; l < L; l++) {
        dsattn_v41_mode md = dsattn_v41_layer_mode(m, l);
        int src = dsattn_v41_seq_source_read(s, l), ir = dsattn_v41_seq_index_read(s, l);
        int tk = dsattn_v41_seq_topk_read(s, l);
        char a[16] = "-", b[32] = "-", c[16] = "-";
        if (src >= 0) snprintf(a, sizeof a, "%d", src);
        if (tk >= 0) snprintf(b, sizeof b, "%d", tk);
        if (ir >= 0) snprintf(c, sizeof c, "%d", ir);
        printf("| %d | %s | %d | %s | %s | %s |\n", l, mode_name(md), dsattn_v41_layer_ratio(m, l),
               a, b, c);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char b3[48];
    printf("\nKV allocated for %lld tokens: %s global (%.2f B/token), %s windows, %s compressor "
           "state.\n", (long long)(n_prefill + n_decode),
           mib((double)bill.global_bytes_allocated, b1, sizeof b1), bill.global_bytes_per_token,
           mib((double)bill.window_bytes, b2, sizeof b2),
           mib((double)bill.state_bytes, b3, sizeof b3));
    printf("The three source columns are what each layer read in the last step, recorded by\n"
           "the shared runtime (dsattn_v41_seq_source_read / _topk_read / _index_read).\n");
    printf("Peak RSS: %.2f GiB\n", (double)ru.ru_maxrss / 1048576.0);
    rc = 0;
out:
    free(h);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    dsattn_ctx_destroy(ctx);
    return rc;
}
