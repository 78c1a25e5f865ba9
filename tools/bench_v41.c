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
 * against reference mode (the same code paths on a small slice).  Rows go
 * through the shared llama-bench table (bench_util.h), with the byte bound,
 * t / bound and t / t(first depth) as this mode's extra columns, and one
 * prefill row per thread count (depth 0, ms per prefilled token).
 *
 * --batch B1,B2,... decodes B sequences per step (each filled to the
 * depth) through dsattn_v41_stack_forward_batch, B = 1 through the
 * one-sequence stack: the weights stream once per step for all B tokens.
 * Each row adds the batch, the aggregate decoded tokens per second, the
 * step's FLOP bound (the kernels' FLOPs / the peak of the fastest multiply
 * the context's Linears run, measured in this run: the fp32 FMA, AMX-BF16
 * tiles or VDPBF16PS - dsattn_bench_gemm_peak), the
 * step bound max(byte bound, FLOP bound), t / step bound, and tok/s over
 * the B = 1 row of the same depth and threads.
 */
#include "bench_util.h"
#include "cli_num.h"
#include "cli_util.h"
#include "dsattn.h"
#include "internal.h"
#include "trace.h"
#include "v41.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The buffers a decode step streams - every layer's weights and their
 * scales, in forward order - for the replay probe (bench_util.h). */
typedef struct {
    const void **buf;
    size_t      *bytes;
    size_t       n;
    double       total;
} weight_list;

static void add_weight(weight_list *wl, const dsattn_weight *w)
{
    if (!w->data) return;
    size_t b = 0, sb = 0;
    switch (w->kind) {
    case DSATTN_W_F32:  b = w->rows * w->cols * 4; break;
    case DSATTN_W_BF16: b = w->rows * w->cols * 2; break;
    case DSATTN_W_FP8:
        b = w->rows * w->cols;
        sb = ((w->rows + w->block - 1) / w->block) * ((w->cols + w->block - 1) / w->block) * 4;
        break;
    case DSATTN_W_FP4:  b = w->rows * w->cols / 2; sb = w->rows * (w->cols / 32); break;
    }
    wl->buf[wl->n] = w->data;
    wl->bytes[wl->n++] = b;
    wl->total += (double)b;
    const void *sp = w->kind == DSATTN_W_FP8 ? (const void *)w->scale
                   : w->kind == DSATTN_W_FP4 ? (const void *)w->scale_e8m0 : NULL;
    if (sp && sb) {
        wl->buf[wl->n] = sp;
        wl->bytes[wl->n++] = sb;
        wl->total += (double)sb;
    }
}

static int weight_list_make(const dsattn_v41 *m, weight_list *wl)
{
    const int nl = dsattn_v41_n_layers(m);
    const size_t cap = (size_t)nl * 20;
    wl->buf = calloc(cap, sizeof *wl->buf);
    wl->bytes = calloc(cap, sizeof *wl->bytes);
    wl->n = 0;
    wl->total = 0;
    if (!wl->buf || !wl->bytes) return -1;
    for (int l = 0; l < nl; l++) {
        const dsattn_v41_layer_w *L = &m->layer[l];
        const dsattn_weight *ws[] = { &L->wq_a, &L->wq_b, &L->wkv, &L->c_wkv, &L->c_wgate,
                                      &L->i_wq_b, &L->i_wproj, &L->i_wk, &L->wo_a, &L->wo_b };
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) add_weight(wl, ws[i]);
    }
    return 0;
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
    char dir[2048], a[1024] = "", b[1024] = "", err[512] = "";
    snprintf(dir, sizeof dir, "%s/golden/v41/tiny-seed2-fp8", data_dir);
    int st = dsattn_cli_tmp_file(a, sizeof a, "bench-ref", ".safetensors") ||
             dsattn_cli_tmp_file(b, sizeof b, "bench-fast", ".safetensors");
    dsattn_trace_opts o = { DSATTN_MODE_REFERENCE, 0, 0, 0, 0 };
    if (!st) st = dsattn_trace_case(dir, a, &o, err, sizeof err);
    o.mode = DSATTN_MODE_FAST;
    if (!st) st = dsattn_trace_case(dir, b, &o, err, sizeof err);
    double rel = 0, cs = 0;
    if (!st) st = dsattn_bench_compare_out(a, b, &rel, &cs);
    if (a[0]) remove(a);
    if (b[0]) remove(b);
    if (st) return -1;
    fprintf(stderr, "bench v41: fast vs reference on %s: out rel %.3g, cosine %.6f\n", dir, rel, cs);
    return rel <= 0.1 && cs >= 0.99 ? 0 : 1;
}

/* One timed step: a decode token (n == 1) on the shared deep sequence, or
 * a prefill of n tokens on a fresh sequence (the reference has no chunked
 * prefill, so each prefill starts at position 0). */
typedef struct {
    const dsattn_v41 *m;
    dsattn_v41_seq   *seq;        /* decode: the filled sequence             */
    dsattn_v41_seq  **seqs;       /* batched decode: nb filled sequences     */
    size_t            nb;
    size_t            n, dim;
    float            *h;
    int               calls;
    double            last_s;     /* wall time of the last call            */
    dsattn_v41_ced    ced;        /* prefill: CED mode                     */
} v41_step;

/* The "proj % peak" column: the FLOPs of the context's projections
 * (dsattn_linear) over their wall time, against peak (GFLOP/s, measured
 * in this run); "-" when nothing was projected. */
static void proj_peak_col(const dsattn_ctx *ctx, double peak, char *out, size_t n)
{
    const dsattn_profile p = dsattn_ctx_profile(ctx);
    double s = 0, f = 0;
    for (int ph = 0; ph < DSATTN_PHASE_COUNT; ph++) {
        s += p.proj_seconds[ph];
        f += (double)p.proj_flops[ph];
    }
    if (s > 0 && peak > 0) snprintf(out, n, "%.0f%%", 100.0 * f / 1e9 / s / peak);
    else snprintf(out, n, "-");
}

static dsattn_status v41_step_run(dsattn_ctx *ctx, void *arg)
{
    v41_step *a = arg;
    for (size_t i = 0; i < DSATTN_MAX(a->n, a->nb) * a->dim; i++)
        a->h[i] = (float)((i * 37 + (size_t)a->calls) % 11) - 5.0f;
    a->calls++;
    const double t0 = dsattn_bench_now();
    if (a->n == 1 && a->nb > 1) {
        dsattn_status st = dsattn_v41_stack_forward_batch(ctx, a->seqs, a->nb, a->h, NULL, NULL,
                                                          NULL);
        a->last_s = dsattn_bench_now() - t0;
        return st;
    }
    if (a->n == 1) {
        dsattn_status st = dsattn_v41_stack_forward(ctx, a->seq, a->h, 1, NULL, NULL);
        a->last_s = dsattn_bench_now() - t0;
        return st;
    }
    dsattn_v41_seq *ps = NULL;
    dsattn_status st = dsattn_v41_seq_create(&ps, a->m, a->n + 1, DSATTN_V41_INDEX_K_OWNER);
    if (!st) st = dsattn_v41_stack_prefill(ctx, ps, a->h, a->n, a->ced, NULL);
    a->last_s = dsattn_bench_now() - t0;
    dsattn_v41_seq_destroy(ps);
    return st;
}

int dsattn_bench_v41(int argc, char **argv)
{
    const char *cfg = NULL, *weights = NULL;
    const char *data = "tests/data";
    long long depths[8] = { 4096, 65536, 1048576 }, thr[8] = { 1, 2 }, batch[8] = { 1 };
    int nd = 3, nt = 2, nbt = 1, reps = 3, fp8 = 1, profile = 0;
    long long prefill = 128;
    static const char *const ced_name[] = { "off", "exact", "bounded" };
    dsattn_v41_ced ceds[3] = { DSATTN_V41_CED_OFF };
    int n_ced = 1;
    uint64_t seed = 1;
    dsattn_bench_fmt fmt = DSATTN_BENCH_MD;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: dsattn bench v41 [--depth 4096,65536,1M] [--threads 1,2] [--reps 3]\n"
                   "                        [--batch 1,8,16 (sequences decoded per step)]\n"
                   "                        [--prefill N (128; 0 = skip)] [--ced off,exact,bounded]\n"
                   "                        [--config PATH] [--bf16] [--seed S] [--format md|csv|json]\n"
                   "                        [--weights PATH (a checkpoint instead of random weights;\n"
                   "                         its config.json unless --config)]\n"
                   "                        [--data DIR (tests/data, for the pre-timing check)]\n"
                   "                        [--profile (markdown: per-phase time of the last step)]\n"
                   "Decode ms/token of the 40-layer V4.1-Flash attention stack at real dims\n"
                   "(FP8 weights, random, seeded; synthetic cache fill to each depth) beside\n"
                   "its byte bound, then one prefill of N tokens per thread count.  Every\n"
                   "list is cross-multiplied; one warm-up step, then reps timed steps\n"
                   "(a prefill of 1,024+ tokens: one cold timed run, no warm-up).\n"
                   "--batch B decodes B sequences per step (all filled to the depth) through\n"
                   "the batched stack; rows add tok/s across the batch and the step bound\n"
                   "max(bytes / read BW, FLOPs / the peak of the Linears' multiply).\n");
            return 0;
        }
        if (!strcmp(a, "--bf16")) { fp8 = 0; continue; }
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!v) { fprintf(stderr, "bench v41: %s needs a value\n", a); return 2; }
        i++;
        int rc = 0;
        if (!strcmp(a, "--depth"))
            rc = dsattn_cli_list("bench v41", a, v, 1, DSATTN_BENCH_MAX_DEPTH, DSATTN_CLI_SUFFIX,
                                 depths, 8, &nd);
        else if (!strcmp(a, "--threads"))
            rc = dsattn_cli_list("bench v41", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, thr, 8, &nt);
        else if (!strcmp(a, "--batch"))
            rc = dsattn_cli_list("bench v41", a, v, 1, 256, 0, batch, 8, &nbt);
        else if (!strcmp(a, "--reps"))
            rc = dsattn_cli_i32("bench v41", a, v, 1, DSATTN_BENCH_MAX_REPS, 0, &reps);
        else if (!strcmp(a, "--prefill"))
            rc = dsattn_cli_int("bench v41", a, v, 0, 1 << 20, DSATTN_CLI_SUFFIX, &prefill);
        else if (!strcmp(a, "--config")) cfg = v;
        else if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--seed")) rc = dsattn_cli_u64("bench v41", a, v, &seed);
        else if (!strcmp(a, "--format")) {
            if (dsattn_bench_parse_fmt(v, &fmt)) { fprintf(stderr, "bench v41: bad --format %s\n", v); return 2; }
        }
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--ced")) {
            /* a comma list of distinct mode names, in the order given */
            n_ced = 0;
            for (const char *p = v; n_ced >= 0;) {
                const char *e = strchr(p, ',');
                const size_t len = e ? (size_t)(e - p) : strlen(p);
                int k = 0;
                while (k < 3 && (strlen(ced_name[k]) != len || strncmp(p, ced_name[k], len))) k++;
                for (int j = 0; j < n_ced && k < 3; j++) k = ceds[j] == (dsattn_v41_ced)k ? 3 : k;
                if (k == 3 || n_ced == 3) n_ced = -1;
                else ceds[n_ced++] = (dsattn_v41_ced)k;
                if (!e || n_ced < 0) break;
                p = e + 1;
            }
            if (n_ced <= 0) {
                fprintf(stderr, "bench v41: bad --ced %s (a list of off, exact, bounded)\n", v);
                return 2;
            }
        }
        else { fprintf(stderr, "bench v41: unknown option %s\n", a); return 2; }
        if (rc) return rc;
    }
    if (nd <= 0 || nt <= 0 || nbt <= 0 || reps <= 0 || prefill < 0 || prefill > (1 << 20)) {
        fprintf(stderr, "bench v41: bad list or count\n");
        return 2;
    }

    int vs = verify_slice(data);
    if (vs > 0) { fprintf(stderr, "bench v41: fast path disagrees with reference; not timing\n"); return 1; }
    if (vs < 0) fprintf(stderr, "bench v41: golden slice not found under %s; timing unverified\n", data);

    long long maxd = 0;
    for (int i = 0; i < nd; i++) maxd = depths[i] > maxd ? depths[i] : maxd;
    char err[512] = "";
    double t0 = dsattn_bench_now();
    dsattn_v41 *m = NULL;
    if (weights ? dsattn_v41_load(&m, cfg, weights, err, sizeof err)
                : dsattn_v41_create_random(&m, cfg ? cfg : "configs/deepseek-v4.1-flash.json",
                                           seed, fp8, err, sizeof err)) {
        fprintf(stderr, "bench v41: %s\n", err);
        return 1;
    }
    if (weights)
        fprintf(stderr, "bench v41: %d layers, %.2f GB of weights mapped from %s in %.1f s\n",
                dsattn_v41_n_layers(m), (double)dsattn_v41_weight_bytes(m) / 1e9, weights,
                dsattn_bench_now() - t0);
    else
        fprintf(stderr, "bench v41: %d layers, %.2f GB of %s weights made in %.1f s\n",
                dsattn_v41_n_layers(m), (double)dsattn_v41_weight_bytes(m) / 1e9,
                fp8 ? "FP8" : "bf16", dsattn_bench_now() - t0);
    long long maxb = 1;
    for (int i = 0; i < nbt; i++) maxb = batch[i] > maxb ? batch[i] : maxb;
    dsattn_v41_seq **seqs = calloc((size_t)maxb, sizeof *seqs);
    for (long long k = 0; seqs && k < maxb; k++)
        if (dsattn_v41_seq_create(&seqs[k], m, (size_t)maxd + (size_t)reps + 8,
                                  DSATTN_V41_INDEX_K_OWNER)) {
            fprintf(stderr, "bench v41: cannot allocate caches of %lld sequences for depth %lld\n",
                    maxb, maxd);
            for (long long j = 0; j < k; j++) dsattn_v41_seq_destroy(seqs[j]);
            free(seqs);
            dsattn_v41_destroy(m);
            return 1;
        }
    if (!seqs) {
        dsattn_v41_destroy(m);
        return 1;
    }
    dsattn_v41_seq *s = seqs[0];
    dsattn_kv_bill bill = { 0 };
    dsattn_v41_seq_kv_bill(s, &bill);
    const size_t dim = (size_t)dsattn_v41_dim(m);
    const size_t hn = (size_t)DSATTN_MAX(prefill > 1 ? prefill : 1, maxb) * dim;
    float *h = calloc(hn, sizeof(float));
    if (!h) {
        for (long long k = 0; k < maxb; k++) dsattn_v41_seq_destroy(seqs[k]);
        free(seqs);
        dsattn_v41_destroy(m);
        return 1;
    }

    char title[640];
    if (weights)
        snprintf(title, sizeof title,
                 "V4.1-Flash attention stack (%d layers, weights as stored in %.300s, "
                 "memory-mapped); decode rows over a synthetic cache fill to each depth.",
                 dsattn_v41_n_layers(m), weights);
    else
        snprintf(title, sizeof title,
                 "V4.1-Flash attention stack (40 layers, real dims, %s weights, random, seeded); "
                 "decode rows over a synthetic cache fill to each depth.",
                 fp8 ? "FP8 32x32 UE8M0" : "bf16");
    /* The replay probe: the same weight buffers read with no compute, per
     * thread count, best of 3 passes. */
    weight_list wl = { 0 };
    double replay_s[8] = { 0 };
    if (weight_list_make(m, &wl) == 0)
        for (int ti = 0; ti < nt; ti++)
            replay_s[ti] = dsattn_bench_replay_read(wl.buf, wl.bytes, wl.n, (int)thr[ti], 3);
    dsattn_bench_table t = { .mode = "v41", .title = title, .fmt = fmt, .n_extra = 16,
                             .extra = { "byte bound ms", "t / bound", "replay bound ms",
                                        "t / replay bound", "t / t(first depth)", "batch",
                                        "tok/s", "FLOP bound ms", "step bound ms",
                                        "t / step bound", "tok/s / B=1", "ced",
                                        "prefill tok/s", "work bound", "t(off) / t",
                                        "proj % peak" },
                             .extra_key = { "byte_bound_ms", "t_over_bound", "replay_bound_ms",
                                            "t_over_replay_bound", "t_over_first", "batch",
                                            "tok_per_s", "flop_bound_ms", "step_bound_ms",
                                            "t_over_step_bound", "tok_per_s_over_b1", "ced",
                                            "prefill_tok_per_s", "work_bound",
                                            "speedup_vs_off", "proj_frac_fma_peak" } };
    dsattn_bench_begin(&t, dsattn_bench_isa_label());
    double first[8][8] = { { 0 } };
    int rc = 0, n_prof = 0;
    dsattn_bench_prof_row prof[64];
    for (int di = 0; di < nd && !rc; di++) {
        for (int ti = 0; ti < nt && !rc; ti++) {
          double tok_b1 = 0;
          for (int bi = 0; bi < nbt && !rc; bi++) {
            const size_t nb = (size_t)batch[bi];
            dsattn_ctx *ctx = NULL;
            dsattn_ctx_params p = dsattn_ctx_default_params();
            p.n_threads = (int)thr[ti];
            if (dsattn_ctx_create(&ctx, &p)) { rc = 1; break; }
            dsattn_ctx_set_profiling(ctx, 1);        /* proj % peak */
            for (size_t k = 0; k < nb; k++)
                dsattn_v41_seq_fill_synthetic(seqs[k], depths[di],
                                              seed + (uint64_t)di + 1000 * (uint64_t)k);
            v41_step a = { m, s, seqs, nb, 1, dim, h, 0, 0.0, DSATTN_V41_CED_OFF };
            dsattn_bench_result r = { .depth = depths[di], .kv_bytes = bill.global_bytes_per_token };
            snprintf(r.model, sizeof r.model, "DeepSeek-V4.1-Flash");
            if (nb > 1) snprintf(r.variant, sizeof r.variant, "CSA2 stack, decode, batch %zu", nb);
            else snprintf(r.variant, sizeof r.variant, "CSA2 stack, decode");
            dsattn_status st = dsattn_bench_time(ctx, v41_step_run, &a, reps, &r);
            if (st) {
                fprintf(stderr, "bench v41: step failed: %s\n", dsattn_status_str(st));
                rc = 1;
            } else {
                double bound = r.lim_gbs > 0 ? r.gb / r.lim_gbs * 1e3 : 0;
                if (di == 0) first[ti][bi] = r.ms_mean;
                snprintf(r.extra[0], sizeof r.extra[0], "%.1f", bound);
                snprintf(r.extra[1], sizeof r.extra[1], "%.2f", bound > 0 ? r.ms_mean / bound : 0);
                /* replay bound: the weights at the rate they can merely be
                 * read, the rest (KV, index keys) at the 1 GiB probe's */
                double rest_gb = r.gb - wl.total / 1e9;
                double rbound = replay_s[ti] > 0
                    ? (replay_s[ti] + (rest_gb > 0 && r.lim_gbs > 0 ? rest_gb / r.lim_gbs : 0)) * 1e3
                    : 0;
                snprintf(r.extra[2], sizeof r.extra[2], "%.1f", rbound);
                snprintf(r.extra[3], sizeof r.extra[3], "%.2f", rbound > 0 ? r.ms_mean / rbound : 0);
                snprintf(r.extra[4], sizeof r.extra[4], "%.2f",
                         first[ti][bi] > 0 ? r.ms_mean / first[ti][bi] : 1.0);
                /* the batch's columns: tokens per second over the batch,
                 * the FLOP bound at the FMA (or tile) peak of this run */
                const double tok = r.ms_mean > 0 ? (double)nb * 1e3 / r.ms_mean : 0;
                if (nb == 1) tok_b1 = tok;
                const double peak = DSATTN_MAX(r.lim_gflops, dsattn_bench_gemm_peak(ctx, (int)thr[ti]));
                const double fbound = peak > 0 ? r.gflop / peak * 1e3 : 0;
                const double sbound = DSATTN_MAX(bound, fbound);
                snprintf(r.extra[5], sizeof r.extra[5], "%zu", nb);
                snprintf(r.extra[6], sizeof r.extra[6], "%.2f", tok);
                snprintf(r.extra[7], sizeof r.extra[7], "%.1f", fbound);
                snprintf(r.extra[8], sizeof r.extra[8], "%.1f", sbound);
                snprintf(r.extra[9], sizeof r.extra[9], "%.2f", sbound > 0 ? r.ms_mean / sbound : 0);
                if (tok_b1 > 0) snprintf(r.extra[10], sizeof r.extra[10], "%.2f", tok / tok_b1);
                else snprintf(r.extra[10], sizeof r.extra[10], "-");
                for (int k = 11; k < 15; k++) snprintf(r.extra[k], sizeof r.extra[k], "-");
                proj_peak_col(ctx, peak, r.extra[15], sizeof r.extra[15]);
                dsattn_bench_row(&t, &r);
                if (profile && n_prof < 64) {
                    dsattn_bench_prof_row *pr = &prof[n_prof++];
                    snprintf(pr->what, sizeof pr->what, "decode @%lld x%zu", depths[di], nb);
                    pr->threads = (int)thr[ti];
                    pr->step_s = a.last_s;
                    pr->p = dsattn_ctx_profile(ctx);
                }
            }
            dsattn_ctx_destroy(ctx);
          }
        }
    }
    /* Prefill: `prefill` tokens at position 0 on a fresh sequence per rep;
     * ms/token is the chunk's time over its tokens.  One row per CED mode;
     * work bound = full prefill's layer-rows over the mode's (the speedup if
     * time followed the rows), t(off) / t the measured one. */
    double off_ms = 0;
    for (int pi = 0; prefill > 1 && pi < nt * n_ced && !rc; pi++) {
        const int ti = pi / n_ced;
        const dsattn_v41_ced ced = ceds[pi % n_ced];
        uint64_t rows_full = 0, rows_mode = 0;
        dsattn_v41_ced_work(m, (size_t)prefill, DSATTN_V41_CED_OFF, &rows_full, NULL);
        dsattn_v41_ced_work(m, (size_t)prefill, ced, &rows_mode, NULL);
        dsattn_ctx *ctx = NULL;
        dsattn_ctx_params p = dsattn_ctx_default_params();
        p.n_threads = (int)thr[ti];
        if (dsattn_ctx_create(&ctx, &p)) { rc = 1; break; }
        dsattn_ctx_set_profiling(ctx, 1);
        v41_step a = { m, NULL, NULL, 1, (size_t)prefill, dim, h, 0, 0.0, ced };
        dsattn_bench_result r = { .depth = 0, .kv_bytes = bill.global_bytes_per_token };
        snprintf(r.model, sizeof r.model, "DeepSeek-V4.1-Flash");
        snprintf(r.variant, sizeof r.variant, "CSA2 stack, prefill %lld tokens, ced %s", prefill,
                 ced_name[ced]);
        /* a prompt of 1,024+ tokens is timed cold: a warm-up would double it */
        dsattn_status st = dsattn_bench_time_w(ctx, v41_step_run, &a, 1, prefill < 1024, &r);
        if (st) {
            fprintf(stderr, "bench v41: prefill failed: %s\n", dsattn_status_str(st));
            rc = 1;
        } else {
            r.ms_mean /= (double)prefill;
            r.ms_sd /= (double)prefill;
            r.gb /= (double)prefill;
            r.gflop /= (double)prefill;
            snprintf(r.extra[0], sizeof r.extra[0], "-");
            snprintf(r.extra[1], sizeof r.extra[1], "-");
            snprintf(r.extra[2], sizeof r.extra[2], "-");
            snprintf(r.extra[3], sizeof r.extra[3], "-");
            if (ced == DSATTN_V41_CED_OFF) off_ms = r.ms_mean;
            if (pi % n_ced == 0 && ced != DSATTN_V41_CED_OFF) off_ms = 0;
            for (int e = 4; e < 11; e++) snprintf(r.extra[e], sizeof r.extra[e], "-");
            snprintf(r.extra[11], sizeof r.extra[11], "%s", ced_name[ced]);
            snprintf(r.extra[12], sizeof r.extra[12], "%.1f", r.ms_mean > 0 ? 1e3 / r.ms_mean : 0);
            snprintf(r.extra[13], sizeof r.extra[13], "%.2f",
                     rows_mode ? (double)rows_full / (double)rows_mode : 0);
            if (off_ms > 0 && r.ms_mean > 0)
                snprintf(r.extra[14], sizeof r.extra[14], "%.2f", off_ms / r.ms_mean);
            else
                snprintf(r.extra[14], sizeof r.extra[14], "-");
            proj_peak_col(ctx, DSATTN_MAX(r.lim_gflops, dsattn_bench_gemm_peak(ctx, (int)thr[ti])),
                          r.extra[15], sizeof r.extra[15]);
            dsattn_bench_row(&t, &r);
            if (profile && n_prof < 64) {
                dsattn_bench_prof_row *pr = &prof[n_prof++];
                snprintf(pr->what, sizeof pr->what, "prefill %lld %s", prefill, ced_name[ced]);
                pr->threads = (int)thr[ti];
                pr->step_s = a.last_s;
                pr->p = dsattn_ctx_profile(ctx);
            }
        }
        dsattn_ctx_destroy(ctx);
    }
    char footer[2800];
    snprintf(footer, sizeof footer,
             "Byte bound = bytes the kernels read in the step (weights + KV + index keys) / the "
             "read bandwidth measured in this run (a 1 GiB read).  Replay bound = the time to merely "
             "read this model's %.2f GB of weight buffers in the step's pattern (one parallel "
             "region per buffer, no compute; %.1f GB/s on %d thread(s)), plus the other bytes at "
             "the 1 GiB rate: the weights are hundreds of buffers over GBs, which this machine "
             "reads slower than one 1 GiB array.  KV B/token is the global cache measured from "
             "the live allocation; the bounded window rings hold %.1f MB more.  Prefill rows: "
             "per-token time and counters of one %lld-token chunk, per CED mode (docs/v41.md): "
             "work bound = the full prefill's layer-rows over the mode's, t(off) / t the measured "
             "speedup in this run.  Batch rows (batch B > 1): "
             "ms/token is the time of one step that decodes one token for each of B sequences "
             "(the batched stack, weights read once), tok/s = B / that time; FLOP bound = the "
             "step's FLOPs / the peak of the fastest multiply the context's Linears run, measured "
             "in this run (fp32 FMA; AMX-BF16 tiles or VDPBF16PS where the context runs them: "
             "the isa label's +amx / +bf16dot); step bound = max(byte bound, FLOP bound).  "
             "proj %% peak = the FLOPs of the step's weight projections over their own wall time, "
             "against the same peak.  Peak RSS %.2f GB.\n",
             wl.total / 1e9, replay_s[nt - 1] > 0 ? wl.total / replay_s[nt - 1] / 1e9 : 0,
             (int)thr[nt - 1], (double)bill.window_bytes / 1e6, prefill, peak_rss_gb());
    free(wl.buf);
    free(wl.bytes);
    dsattn_bench_end(&t, footer);
    if (n_prof && fmt == DSATTN_BENCH_MD) dsattn_bench_print_profile(prof, n_prof, "the 40 layers");
    free(h);
    for (long long k = 0; k < maxb; k++) dsattn_v41_seq_destroy(seqs[k]);
    free(seqs);
    dsattn_v41_destroy(m);
    return rc;
}
