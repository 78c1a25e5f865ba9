/* bench_model.c - `dsattn bench mla`, `dsattn bench v4` and the short
 * labelled bench that `dsattn` with no arguments prints after the bill.
 *
 * Each mode decodes ONE attention layer at a generation's real dimensions
 * (a one-layer copy of the published config in a temporary file, random
 * weights in the format the model ships) over a cache filled synthetically
 * to each depth (*_seq_fill_synthetic: random valid entries, as the output
 * says), llama-bench style: --model, --depth, --threads and --reps are
 * lists and every combination is a row; each row is one warm-up step then
 * reps timed steps (mean +- sample sd), with the bytes and FLOPs the
 * kernels counted during the step (dsattn_ctx_counters), their rates, and
 * the fractions of the DRAM read bandwidth and fp32 FMA peak measured in
 * the same process (bench_util.c).  A row's KV bytes per token is the
 * sequence's own live-allocation bill (*_seq_kv_bill) for that one layer.
 *
 *   mla  DeepSeek-V3 (MLA, absorbed decode) with the bf16 latent cache
 *        (1152 B/token) and with the FP8 FlashMLA rows (656 B), and V3.2
 *        (MLA + DSA: the lightning indexer scores every cached token, the
 *        attention reads the top-2048; 656 + 132 B).
 *   v4   DeepSeek-V4-Flash: one CSA layer (ratio 4, indexer, top-512) and
 *        one HCA layer (ratio 128, every entry) at 4K..1M.  The indexer
 *        column times the layer's own index scan alone (the same scoring
 *        and top-k calls the layer makes, over the same index-key cache,
 *        same thread count) and gives it as a share of the CSA step.
 *
 * Before anything is timed, each model's fast step is checked against
 * reference mode on the same synthetic cache at depth 512 (where every
 * entry is selected, so no top-k boundary can differ): the layer output
 * must be within rel L2 <= 3e-2 and cosine >= 0.9995 (VERIFY_REL / _COS
 * below say why); on a mismatch the model is not timed and the mode fails.
 *
 * Deliberately not here: model code (the public API does the work) and
 * speed assertions - this machine is shared; numbers are reported.
 */
#include "bench_util.h"
#include "cli_num.h"
#include "cli_util.h"
#include "dsattn.h"
#include "numfmt.h"
#include "ops.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Fast vs reference gate before timing.  Both modes round the same bf16
 * intermediates (absorbed queries, scores, probabilities, latent rows) but
 * at different points of an fp32 vs double accumulation, so near-tie
 * roundings flip; at real dims (128 heads, 512-wide latents, 16K-wide
 * output projections) that noise measured rel 1.3-1.4e-2, cosine 0.99990
 * on these synthetic caches (test_mla's bound for two differently rounded
 * paths of the same maths is 2e-2 / 0.9995).  A wrong index, head or scale
 * gives rel O(1). */
#define VERIFY_REL 3e-2
#define VERIFY_COS 0.9995

/* ==== Shared ============================================================= */

static double t_start;

/* --profile rows of the running bench (markdown only) */
static dsattn_bench_prof_row g_prof[64];
static int g_nprof;

static void prof_keep(const dsattn_bench_opts *o, dsattn_ctx *ctx, const char *key,
                      long long depth, int thr, double step_s)
{
    if (!o->profile || g_nprof >= 64) return;
    dsattn_bench_prof_row *r = &g_prof[g_nprof++];
    snprintf(r->what, sizeof r->what, "%s @%lld", key, depth);
    r->threads = thr;
    r->step_s = step_s;
    r->p = dsattn_ctx_profile(ctx);
}

static void progress(const char *mode, int i, int n, const char *what, long long depth, int thr)
{
    fprintf(stderr, "bench %s: [%d/%d] %s depth %lld, %d thread%s (%.0f s so far)\n", mode, i, n,
            what, depth, thr, thr == 1 ? "" : "s", dsattn_bench_now() - t_start);
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = 0;
    else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    cJSON *j = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    return j;
}

/* A published config to edit into a sampler; *fp8: its dtype is "fp8"
 * (fp8 may be NULL).  NULL, with err, when it cannot be read. */
static cJSON *read_cfg(const char *src, int *fp8, char *err, size_t errlen)
{
    cJSON *j = read_json(src);
    if (!j) { snprintf(err, errlen, "cannot read %.300s", src); return NULL; }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (fp8) *fp8 = cJSON_IsString(dt) && !strcmp(dt->valuestring, "fp8");
    return j;
}

/* Write j (then freed) to a new temporary dsattn_bench-<tag>_XXXXXX.json
 * (cli_util.h), its path in out[n]; non-zero, with err and no file left,
 * when it cannot be written.  The caller removes it. */
static int write_cfg(cJSON *j, const char *tag, char *out, size_t n, char *err, size_t errlen)
{
    char t[64];
    snprintf(t, sizeof t, "bench-%s", tag);
    int wr = dsattn_cli_tmp_file(out, n, t, ".json");
    if (wr) {
        snprintf(err, errlen, "cannot create a file in %s", dsattn_cli_tmp_root());
    } else if ((wr = dsattn_cli_json_write(j, out))) {
        snprintf(err, errlen, "cannot write %s", out);
        remove(out);
    }
    cJSON_Delete(j);
    return wr;
}

/* Fast vs reference of a one-layer model's step at depth 512, reported on
 * stderr as `bench gen: key ...`; 0 = agree. */
static int verify_report(const char *gen, const char *key, dsattn_bench_layer_step step,
                         const void *arg, size_t dim, uint64_t seed)
{
    const int64_t depth = 512;
    double rel = -1, cs = -1;
    int bad = dsattn_bench_verify(step, arg, dim, depth, seed, seed + 7, &rel, &cs) ||
              !(rel <= VERIFY_REL && cs >= VERIFY_COS);
    fprintf(stderr, "bench %s: %s fast vs reference at depth %lld: rel %.3g, cosine %.7f "
                    "(need <= %g, >= %g) %s\n", gen, key, (long long)depth, rel, cs,
            VERIFY_REL, VERIFY_COS, bad ? "MISMATCH" : "ok");
    return bad;
}

/* ==== MLA (V3, V3.2) ==================================================== */

typedef struct {
    const char      *key, *model, *variant, *config;
    dsattn_mla_cache cache;
} mla_case;

static const mla_case MLA_CASES[] = {
    { "v3", "DeepSeek-V3", "MLA absorbed, bf16 latent", "deepseek-v3.json",
      DSATTN_MLA_CACHE_LATENT_BF16 },
    { "v3-fp8", "DeepSeek-V3", "MLA absorbed, FP8 latent rows", "deepseek-v3.json",
      DSATTN_MLA_CACHE_LATENT_FP8 },
    { "v3.2", "DeepSeek-V3.2", "MLA + DSA top-2048, FP8 rows", "deepseek-v3.2.json",
      DSATTN_MLA_CACHE_LATENT_FP8 },
};

typedef struct {
    dsattn_mla_seq *s;
    const float    *x;
    float          *y;
    double          last_s;       /* wall time of the last step            */
} mla_step_arg;

static dsattn_status mla_step(dsattn_ctx *ctx, void *p)
{
    mla_step_arg *a = p;
    const double t0 = dsattn_bench_now();
    dsattn_status st = dsattn_mla_attn_forward(ctx, a->s, 0, a->x, 1, a->y);
    a->last_s = dsattn_bench_now() - t0;
    return st ? st : dsattn_mla_seq_advance(a->s, 1);
}

/* B sequences, one token each, through the batched call */
typedef struct {
    dsattn_mla_seq **s;
    size_t           n;
    const float     *x;
    float           *y;
    double           last_s;
} mla_batch_arg;

static dsattn_status mla_batch_step(dsattn_ctx *ctx, void *p)
{
    mla_batch_arg *a = p;
    const double t0 = dsattn_bench_now();
    dsattn_status st = dsattn_mla_attn_forward_batch(ctx, a->s, a->n, 0, a->x, a->y, NULL);
    a->last_s = dsattn_bench_now() - t0;
    for (size_t i = 0; i < a->n && !st; i++) st = dsattn_mla_seq_advance(a->s[i], 1);
    return st;
}

/* One-layer model of a published MLA config (weights as it ships). */
static dsattn_mla *mla_model(const char *configs, const mla_case *c, uint64_t seed, char *path,
                             size_t pathn, char *err, size_t errlen)
{
    char src[1024];
    snprintf(src, sizeof src, "%s/%s", configs, c->config);
    int fp8 = 0;
    cJSON *j = read_cfg(src, &fp8, err, errlen);
    if (!j) return NULL;
    dsattn_cli_json_set_num(j, "n_layers", 1);
    if (write_cfg(j, c->key, path, pathn, err, errlen)) return NULL;
    dsattn_mla *m = NULL;
    if (dsattn_mla_create_random(&m, path, seed, fp8, err, errlen)) m = NULL;
    return m;
}

/* Fast vs reference on one synthetic cache at depth 512; 0 = agree. */
typedef struct { const dsattn_mla *m; dsattn_mla_cache cache; } mla_verify_arg;

static dsattn_status mla_verify_step(dsattn_ctx *ctx, const void *arg, int64_t depth,
                                     uint64_t seed, const float *x, float *out)
{
    const mla_verify_arg *a = arg;
    dsattn_mla_seq *s = NULL;
    dsattn_status st = dsattn_mla_seq_create_layers(&s, a->m, (size_t)depth + 1, a->cache, 0, 1);
    if (!st) st = dsattn_mla_seq_fill_synthetic(s, depth, seed);
    if (!st) st = dsattn_mla_attn_forward(ctx, s, 0, x, 1, out);
    dsattn_mla_seq_destroy(s);
    return st;
}

static int mla_verify(const dsattn_mla *m, const mla_case *c, uint64_t seed)
{
    const mla_verify_arg a = { m, c->cache };
    return verify_report("mla", c->key, mla_verify_step, &a, (size_t)dsattn_mla_dim(m), seed);
}

/* One row per (depth, threads, reps, batch) of one MLA case; returns 0 or 1.
 * Batch 1 is the one-sequence forward; B > 1 the batched call over B
 * sequences, each filled to the depth (with its own seed). */
static int mla_rows(const dsattn_bench_opts *o, const mla_case *c, const char *model,
                    dsattn_mla *m, dsattn_bench_table *t, int *done, int total)
{
    const size_t dim = (size_t)dsattn_mla_dim(m);
    static const long long one[1] = { 1 };
    const long long *bl = o->nb > 0 ? o->batch : one;
    const int nb = o->nb > 0 ? o->nb : 1;
    size_t maxb = 1;
    for (int i = 0; i < nb; i++) maxb = (size_t)bl[i] > maxb ? (size_t)bl[i] : maxb;
    float *x = dsattn_cli_rand_bf16(maxb * dim, o->seed + 1, 3);
    float *y = calloc(maxb * dim, sizeof(float));
    dsattn_mla_seq **s = calloc(maxb, sizeof *s);
    int rc = 0;
    long long maxr = 0;
    for (int i = 0; i < o->nr; i++) maxr = o->reps[i] > maxr ? o->reps[i] : maxr;
    for (int di = 0; di < o->nd && x && y && s; di++) {
        size_t made = 0;
        for (; made < maxb; made++)
            if (dsattn_mla_seq_create_layers(&s[made], m, (size_t)(o->depth[di] + maxr + 2),
                                             c->cache, 0, 1))
                break;
        if (made < maxb) {
            fprintf(stderr, "bench mla: cannot hold %zu sequences at depth %lld\n", maxb,
                    o->depth[di]);
            for (size_t i = 0; i < made; i++) dsattn_mla_seq_destroy(s[i]);
            rc = 1;
            continue;
        }
        dsattn_kv_bill kb = { 0 };
        dsattn_mla_seq_kv_bill(s[0], &kb);
        for (int ti = 0; ti < o->nt; ti++)
            for (int ri = 0; ri < o->nr; ri++)
                for (int bi = 0; bi < nb; bi++) {
                    const size_t B = (size_t)bl[bi];
                    progress("mla", ++*done, total, c->key, o->depth[di], (int)o->thr[ti]);
                    dsattn_ctx *ctx = dsattn_bench_ctx(DSATTN_MODE_FAST, (int)o->thr[ti]);
                    if (ctx) dsattn_ctx_set_profiling(ctx, 1);
                    dsattn_bench_result r;
                    memset(&r, 0, sizeof r);
                    snprintf(r.model, sizeof r.model, "%s", model);
                    snprintf(r.variant, sizeof r.variant, "%s", c->variant);
                    r.depth = o->depth[di];
                    r.kv_bytes = kb.global_bytes_per_token;
                    mla_step_arg a = { s[0], x, y, 0.0 };
                    mla_batch_arg ba = { s, B, x, y, 0.0 };
                    dsattn_status st = !ctx ? DSATTN_ERR_NOMEM : DSATTN_OK;
                    for (size_t i = 0; i < B && !st; i++)
                        st = dsattn_mla_seq_fill_synthetic(s[i], o->depth[di],
                                                           o->seed + (uint64_t)di + 7919 * (uint64_t)i);
                    if (!st)
                        st = B == 1 ? dsattn_bench_time(ctx, mla_step, &a, (int)o->reps[ri], &r)
                                    : dsattn_bench_time(ctx, mla_batch_step, &ba, (int)o->reps[ri], &r);
                    if (st) {
                        fprintf(stderr, "bench mla: %s: %s\n", c->key, dsattn_status_str(st));
                        rc = 1;
                    } else {
                        /* entries the last step's query attended, keys it scored
                         * (the batch's first sequence) */
                        const int32_t *rows;
                        size_t nr, w;
                        long long vis = (long long)dsattn_mla_seq_pos(s[0]);
                        int dsa = dsattn_mla_is_dsa(m);
                        if (dsa && !dsattn_mla_seq_selection(s[0], 0, &rows, &nr, &w))
                            snprintf(r.extra[0], sizeof r.extra[0], "%zu", w);
                        else
                            snprintf(r.extra[0], sizeof r.extra[0], "%lld", vis);
                        snprintf(r.extra[1], sizeof r.extra[1], "%lld", dsa ? vis : 0LL);
                        /* the attention phase of the last step alone (the rest of
                         * the step streams the layer's FP8 projection weights) */
                        dsattn_profile pr = dsattn_ctx_profile(ctx);
                        const double at = pr.seconds[DSATTN_PHASE_ATTN];
                        const double af = (double)pr.flops[DSATTN_PHASE_ATTN] / 1e9;
                        snprintf(r.extra[2], sizeof r.extra[2], "%.2f", at * 1e3);
                        snprintf(r.extra[3], sizeof r.extra[3], "%.0f%%",
                                 at > 0 && r.lim_gflops > 0 ? 100.0 * af / at / r.lim_gflops : 0.0);
                        /* the attention runs on the bf16 blocks where the context
                         * has them (amx_attn.h: AMX tiles or VDPBF16PS): their
                         * own roofline */
                        const double bp = dsattn_bench_bf16blk_peak(ctx, (int)o->thr[ti]);
                        if (bp > 0 && at > 0)
                            snprintf(r.extra[4], sizeof r.extra[4], "%.0f%%", 100.0 * af / at / bp);
                        else
                            snprintf(r.extra[4], sizeof r.extra[4], "-");
                        if (t->n_extra > 5) {
                            /* the batch, its aggregate tokens/s, and the step's
                             * bound: max(bytes / read BW, FLOPs / the peak of
                             * the Linears' multiply) */
                            const double gp = fmax(r.lim_gflops,
                                                   dsattn_bench_gemm_peak(ctx, (int)o->thr[ti]));
                            const double bound_ms =
                                1e3 * fmax(r.lim_gbs > 0 ? r.gb / r.lim_gbs : 0.0,
                                           gp > 0 ? r.gflop / gp : 0.0);
                            snprintf(r.extra[5], sizeof r.extra[5], "%zu", B);
                            snprintf(r.extra[6], sizeof r.extra[6], "%.1f",
                                     r.ms_mean > 0 ? 1e3 * (double)B / r.ms_mean : 0.0);
                            snprintf(r.extra[7], sizeof r.extra[7], "%.2f", bound_ms);
                            snprintf(r.extra[8], sizeof r.extra[8], "%.2f",
                                     bound_ms > 0 ? r.ms_mean / bound_ms : 0.0);
                        }
                        /* the short bench's table has one extra column: layers */
                        if (t->n_extra == 1) snprintf(r.extra[0], sizeof r.extra[0], "1");
                        dsattn_bench_row(t, &r);
                        char key[48];
                        snprintf(key, sizeof key, B > 1 ? "%s B=%zu" : "%s", c->key, B);
                        prof_keep(o, ctx, key, o->depth[di], (int)o->thr[ti],
                                  B > 1 ? ba.last_s : a.last_s);
                    }
                    dsattn_ctx_destroy(ctx);
                }
        for (size_t i = 0; i < maxb; i++) dsattn_mla_seq_destroy(s[i]);
    }
    free(s);
    free(x);
    free(y);
    return rc;
}

int dsattn_bench_mla(int argc, char **argv)
{
    static const char usage[] =
        "usage: dsattn bench mla [--model v3,v3-fp8,v3.2] [--depth 4K,32K,128K] [--threads 1,2]\n"
        "                        [--batch 1,8] [--reps 3] [--configs DIR] [--seed S]\n"
        "                        [--format md|csv|json]\n"
        "                        [--profile (markdown: per-phase time of each row's last step)]\n"
        "One MLA layer of DeepSeek-V3 (absorbed decode; bf16 latent cache 1152 B/token, or\n"
        "FP8 rows 656 B) and of V3.2 (MLA + DSA: indexer over every token, attention over\n"
        "the top-2048; 656 + 132 B) at real dims, FP8 weights, decoding one token over a\n"
        "synthetically filled cache.  --batch B decodes one token for each of B sequences\n"
        "(each filled to the depth) in one batched call: tok/s is the aggregate.  Every\n"
        "list is cross-multiplied; one warm-up step, then reps timed steps per row.\n"
        "Checked against reference mode first.\n"
        "  --weights PATH  layer 0 of a V3 / V3.2 checkpoint (a .safetensors file, shard\n"
        "                  index or folder; its config.json unless --config PATH) instead\n"
        "                  of --model's random layers: V3 with both cache formats, V3.2\n"
        "                  with FP8 rows.  Only layer 0's weights are loaded and only its\n"
        "                  caches allocated.\n";
    dsattn_bench_opts o = { getenv("DSATTN_CONFIGS") ? getenv("DSATTN_CONFIGS") : "configs",
               DSATTN_BENCH_MD, "v3,v3-fp8,v3.2", { 4096, 32768, 131072 }, { 1, 2 }, { 3 },
               3, 2, 1, 1, 0, { 1 }, 1, NULL, NULL };
    const char *const all_models = o.models;
    int pr = dsattn_bench_parse_opts("mla", argc, argv, &o, usage);
    if (pr) return pr == 1 ? 0 : pr;
    if (o.weights && o.models != all_models) {
        fprintf(stderr, "bench mla: --model and --weights: one or the other (the checkpoint is "
                        "the model)\n");
        return 2;
    }
    t_start = dsattn_bench_now();
    /* a checkpoint is opened (and refused) before anything is printed; its
     * cases are its generation's */
    dsattn_mla *cm = NULL;
    char cmodel[64] = "";
    if (o.weights) {
        char err[512] = "";
        if (dsattn_mla_load_layers(&cm, o.config, o.weights, 0, 1, err, sizeof err)) {
            fprintf(stderr, "bench mla: %s\n", err);
            return 1;
        }
        fprintf(stderr, "bench mla: %s, %d layers; layer 0's %.3f GB of weights loaded from %s "
                        "in %.1f s; timing layer 0\n", dsattn_mla_is_dsa(cm) ? "V3.2" : "V3",
                dsattn_mla_n_layers(cm), (double)dsattn_mla_weight_bytes(cm) / 1e9, o.weights,
                dsattn_bench_now() - t_start);
        o.models = dsattn_mla_is_dsa(cm) ? "v3.2" : "v3,v3-fp8";
        snprintf(cmodel, sizeof cmodel, "checkpoint %s (dim %d)",
                 dsattn_mla_is_dsa(cm) ? "V3.2" : "V3", dsattn_mla_dim(cm));
    }
    int nm = 0;
    for (size_t i = 0; i < sizeof MLA_CASES / sizeof MLA_CASES[0]; i++)
        nm += dsattn_bench_in_list(o.models, MLA_CASES[i].key);
    if (!nm) { fprintf(stderr, "bench mla: --model takes v3, v3-fp8, v3.2\n"); return 2; }
    char title[1024];
    if (o.weights)
        snprintf(title, sizeof title,
                 "Layer 0 of the checkpoint %.400s (its weights as loaded; caches filled "
                 "synthetically to each depth) decoding one token per sequence. ms/token = one "
                 "layer's step (for batch B: the step that decodes B tokens, one per sequence); "
                 "GB/s and GFLOP/s = the kernels' counted bytes and FLOPs over that time; KV "
                 "B/token = the layer's bill; tok/s = B / step time; bound = max(counted bytes / "
                 "read BW, counted FLOPs / the peak of the Linears' multiply) with the limits "
                 "measured in this run.", o.weights);
    else
        snprintf(title, sizeof title, "%s",
        "One MLA layer decoding one token per sequence at real dims (random FP8 weights; "
        "caches filled synthetically to each depth). ms/token = one layer's step (for batch "
        "B: the step that decodes B tokens, one per sequence); GB/s and GFLOP/s = the "
        "kernels' counted bytes and FLOPs over that time; KV B/token = the layer's bill; "
        "tok/s = B / step time; bound = max(counted bytes / read BW, counted FLOPs / the peak "
        "of the Linears' multiply: fp32 FMA, or AMX-BF16 tiles / VDPBF16PS where the context "
        "runs them) with the limits measured in this run.");
    dsattn_bench_table t = { "mla", title, o.fmt, 9, { "attended", "idx keys", "attention ms", "attention % FMA peak",
                    "attention % bf16 peak", "batch", "tok/s", "bound ms", "step/bound" },
        { "entries_attended", "index_keys_scored", "attention_ms", "attention_frac_fma_peak",
          "attention_frac_bf16_peak", "batch", "tok_per_s", "bound_ms", "step_over_bound" },
        0, "", NULL };
    dsattn_bench_begin(&t, dsattn_bench_isa_label());
    int rc = 0, done = 0, total = nm * o.nd * o.nt * o.nr * o.nb, timed = 0;
    for (size_t i = 0; i < sizeof MLA_CASES / sizeof MLA_CASES[0]; i++) {
        const mla_case *c = &MLA_CASES[i];
        if (!dsattn_bench_in_list(o.models, c->key)) continue;
        char path[256] = "", err[512] = "";
        dsattn_mla *m = cm ? cm : mla_model(o.configs, c, o.seed, path, sizeof path, err, sizeof err);
        if (!m) { fprintf(stderr, "bench mla: %s: %s\n", c->key, err); rc = 1; remove(path); continue; }
        dsattn_mla_seq *probe = NULL;
        if (cm && dsattn_mla_seq_create_layers(&probe, m, 1, c->cache, 0, 1) ==
                      DSATTN_ERR_UNSUPPORTED) {
            /* FP8 rows hold the latent in blocks of 128 */
            fprintf(stderr, "bench mla: %s: this checkpoint's cache cannot take %s; skipped\n",
                    c->key, c->variant);
            continue;
        }
        dsattn_mla_seq_destroy(probe);
        timed++;
        if (mla_verify(m, c, o.seed)) {
            fprintf(stderr, "bench mla: %s: fast path disagrees with reference; not timing\n", c->key);
            rc = 1;
        } else {
            rc |= mla_rows(&o, c, cm ? cmodel : c->model, m, &t, &done, total);
        }
        if (!cm) {
            dsattn_mla_destroy(m);
            remove(path);
        }
    }
    dsattn_mla_destroy(cm);
    if (!timed) {
        fprintf(stderr, "bench mla: no case to time\n");
        rc = 1;
    }
    char note[1024];
    dsattn_bench_limits_note(note, sizeof note, o.thr, o.nt, 1);
    dsattn_bench_end(&t, note);
    if (o.fmt == DSATTN_BENCH_MD)
        printf("attended = cache entries the step's query attended; idx keys = index keys the "
               "DSA indexer scored (every cached token). Fast path checked against reference "
               "mode at depth 512 before timing (rel <= 3e-2, cosine >= 0.9995). Where the "
               "CPU has AMX-BF16 (isa \"avx512+amx\") or AVX512-BF16 (\"+bf16dot\"), the "
               "attention runs on bf16 blocks - the tiles, or VDPBF16PS: %% FMA peak (fp32 "
               "FMA) can then exceed 100 and the bf16 column is the fraction of their "
               "measured peak.\n");
    if (g_nprof && o.fmt == DSATTN_BENCH_MD) dsattn_bench_print_profile(g_prof, g_nprof, "the layer");
    return rc;
}

/* ==== V4 (CSA, HCA) ===================================================== */

typedef struct {
    const char *key, *variant;
    int         ratio;
} v4_case;

static const v4_case V4_CASES[] = {
    { "csa", "CSA m=4, top-512", 4 },
    { "hca", "HCA m=128, all entries", 128 },
};

typedef struct {
    dsattn_v4_seq *s;
    int            layer;
    const float   *x;
    float         *y;
    double         last_s;        /* wall time of the last step            */
} v4_step_arg;

static dsattn_status v4_step(dsattn_ctx *ctx, void *p)
{
    v4_step_arg *a = p;
    const double t0 = dsattn_bench_now();
    dsattn_status st = dsattn_v4_attn_forward(ctx, a->s, a->layer, a->x, 1, a->y);
    a->last_s = dsattn_bench_now() - t0;
    return st ? st : dsattn_v4_seq_advance(a->s, 1);
}

/* The CSA layer's index scan alone: the scoring and top-k calls the
 * layer's indexer makes on decode, over its own index-key cache. */
typedef struct {
    dsattn_kv_src src;
    const float  *q, *w;
    float        *score;
    int32_t      *pick;
    size_t        nh, dh, k;
} scan_arg;

static dsattn_status scan_step(dsattn_ctx *ctx, void *p)
{
    scan_arg *a = p;
    dsattn_index_scores_bf16(ctx, a->q, a->nh, a->dh, a->w, &a->src, 0, a->src.n_rows, a->score);
    dsattn_topk(a->score, a->src.n_rows, a->k, a->pick, NULL);
    return DSATTN_OK;
}

static dsattn_v4 *v4_model(const char *src, const v4_case *c, uint64_t seed, char *path,
                           size_t pathn, int *nh, int *dh, int *topk, char *err, size_t errlen)
{
    int fp8 = 0;
    cJSON *j = read_cfg(src, &fp8, err, errlen);
    if (!j) return NULL;
    *nh = (int)dsattn_cli_json_num(j, "index_n_heads", 64);
    *dh = (int)dsattn_cli_json_num(j, "index_head_dim", 128);
    *topk = (int)dsattn_cli_json_num(j, "index_topk", 512);
    dsattn_cli_json_set_num(j, "n_layers", 1);
    dsattn_cli_json_set_num(j, "n_mtp_layers", 0);
    dsattn_cli_json_set_ints(j, "compress_ratios", &c->ratio, 1);
    if (write_cfg(j, c->key, path, pathn, err, errlen)) return NULL;
    dsattn_v4 *m = NULL;
    if (dsattn_v4_create_random(&m, path, seed, fp8, err, errlen)) m = NULL;
    return m;
}

typedef struct { const dsattn_v4 *m; int layer; } v4_verify_arg;

static dsattn_status v4_verify_step(dsattn_ctx *ctx, const void *arg, int64_t depth,
                                    uint64_t seed, const float *x, float *out)
{
    const v4_verify_arg *a = arg;
    dsattn_v4_seq *s = NULL;
    dsattn_status st = dsattn_v4_seq_create_layers(&s, a->m, (size_t)depth + 1,
                                                   DSATTN_V4_EMPTY_REFERENCE, a->layer, 1);
    if (!st) st = dsattn_v4_seq_fill_synthetic(s, depth, seed);
    if (!st) st = dsattn_v4_attn_forward(ctx, s, a->layer, x, 1, out);
    dsattn_v4_seq_destroy(s);
    return st;
}

static int v4_verify(const dsattn_v4 *m, int layer, const v4_case *c, uint64_t seed)
{
    const v4_verify_arg a = { m, layer };
    return verify_report("v4", c->key, v4_verify_step, &a, (size_t)dsattn_v4_dim(m), seed);
}

/* Time the index scan of CSA layer `layer` of s with ctx: ms mean, keys. */
static double v4_scan_ms(dsattn_ctx *ctx, const dsattn_v4_seq *s, int layer, int nh, int dh,
                         int topk, int reps, size_t *keys, uint64_t seed)
{
    const uint8_t *rows;
    size_t n, rb;
    *keys = 0;
    if (dsattn_v4_seq_cache(s, layer, 1, &rows, &n, &rb) || n == 0) return 0;
    float *q = dsattn_cli_rand_bf16((size_t)nh * dh, seed, 3);
    float *w = dsattn_cli_rand_bf16((size_t)nh, seed + 1, 3);
    float *score = malloc((n + 1) * sizeof(float));
    int32_t *pick = malloc(((size_t)topk + 1) * sizeof(int32_t));
    double ms = -1;
    if (q && w && score && pick) {
        for (int i = 0; i < nh; i++) w[i] *= 0.0625f;   /* scaled like weights_proj * dh^-0.5 */
        /* the layer's queries are FP4 QDQ values (what the VNNI scan takes) */
        uint8_t row[512];
        float *dq = malloc((size_t)dh * sizeof(float));
        for (int h = 0; dq && h < nh && (size_t)dh / 2 + (size_t)dh / 32 <= sizeof row; h++) {
            dsattn_fp4_index_pack(q + (size_t)h * dh, (size_t)dh, row, dq);
            memcpy(q + (size_t)h * dh, dq, (size_t)dh * sizeof(float));
        }
        free(dq);
        scan_arg a = { { DSATTN_KV_FP4_IDX, rows, rb, n, (size_t)dh, 0 }, q, w, score, pick,
                       (size_t)nh, (size_t)dh, (size_t)topk < n ? (size_t)topk : n };
        dsattn_bench_result r;
        memset(&r, 0, sizeof r);
        if (!dsattn_bench_time(ctx, scan_step, &a, reps, &r)) ms = r.ms_mean;
        *keys = n;
    }
    free(q); free(w); free(score); free(pick);
    return ms;
}

int dsattn_bench_v4(int argc, char **argv)
{
    static const char usage[] =
        "usage: dsattn bench v4 [--model csa,hca] [--depth 4K,64K,256K,1M] [--threads 1,2]\n"
        "                       [--reps 3] [--configs DIR] [--config PATH (V4 config;\n"
        "                       default DIR/deepseek-v4-flash.json)] [--seed S]\n"
        "                       [--format md|csv|json] [--profile]\n"
        "One CSA layer (ratio 4: overlapping compressor, lightning indexer over every\n"
        "compressed entry, top-k attention) and one HCA layer (ratio 128: every entry) of\n"
        "DeepSeek-V4-Flash at real dims, FP8 weights, decoding one token over a\n"
        "synthetically filled cache.  The indexer column times the CSA layer's index scan\n"
        "alone.  Every list is cross-multiplied; checked against reference mode first.\n"
        "  --weights PATH  a V4 checkpoint's own first CSA layer and first HCA layer (a\n"
        "                  .safetensors file, shard index or folder; its config.json\n"
        "                  unless --config PATH) instead of random ones; only those\n"
        "                  layers' caches are allocated.\n";
    const char *cfg = NULL;
    /* --config is this mode's own option: strip it before the shared parser */
    char **av = malloc(((size_t)argc + 1) * sizeof *av);
    int ac = 0;
    if (!av) return 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) { cfg = argv[++i]; continue; }
        av[ac++] = argv[i];
    }
    dsattn_bench_opts o = { getenv("DSATTN_CONFIGS") ? getenv("DSATTN_CONFIGS") : "configs",
               DSATTN_BENCH_MD, "csa,hca", { 4096, 65536, 262144, 1048576 }, { 1, 2 }, { 3 },
               4, 2, 1, 1, 0, { 1 }, 1, NULL, NULL };
    const char *const all_models = o.models;
    int pr = dsattn_bench_parse_opts("v4", ac, av, &o, usage);
    free(av);
    if (pr) return pr == 1 ? 0 : pr;
    if (o.weights && o.models != all_models) {
        fprintf(stderr, "bench v4: --model and --weights: one or the other (the checkpoint's "
                        "first CSA and HCA layers are timed)\n");
        return 2;
    }
    t_start = dsattn_bench_now();
    char src[1024];
    if (cfg) snprintf(src, sizeof src, "%s", cfg);
    else snprintf(src, sizeof src, "%s/deepseek-v4-flash.json", o.configs);
    /* a checkpoint is opened (and refused) before anything is printed */
    dsattn_v4 *cm = NULL;
    if (o.weights) {
        char err[512] = "";
        if (dsattn_v4_load(&cm, cfg, o.weights, err, sizeof err)) {
            fprintf(stderr, "bench v4: %s\n", err);
            return 1;
        }
        fprintf(stderr, "bench v4: %d layers, %.3f GB of weights from %s in %.1f s\n",
                dsattn_v4_n_layers(cm), (double)dsattn_v4_weight_bytes(cm) / 1e9, o.weights,
                dsattn_bench_now() - t_start);
    }
    int nm = 0;
    for (size_t i = 0; i < sizeof V4_CASES / sizeof V4_CASES[0]; i++)
        nm += dsattn_bench_in_list(o.models, V4_CASES[i].key);
    if (!nm) { fprintf(stderr, "bench v4: --model takes csa, hca\n"); return 2; }
    char title[1024];
    if (cm)
        snprintf(title, sizeof title,
                 "One V4 attention layer of the checkpoint %.400s (its weights as stored; caches "
                 "filled synthetically to each depth) decoding one token. ms/token = one layer's "
                 "step; KV B/token = the layer's global bill (compressed entries + index keys).",
                 o.weights);
    else
        snprintf(title, sizeof title,
                 "One V4 attention layer decoding one token at real dims of %.300s (random FP8 "
                 "weights; caches filled synthetically to each depth). ms/token = one layer's "
                 "step; KV B/token = the layer's global bill (compressed entries + index keys).",
                 src);
    dsattn_bench_table t = { "v4", title, o.fmt, 3,
        { "idx keys", "idx scan ms", "idx scan % of step" },
        { "index_keys_scored", "index_scan_ms", "index_scan_pct" }, 0, "", NULL };
    dsattn_bench_begin(&t, dsattn_bench_isa_label());
    int rc = 0, done = 0, total = nm * o.nd * o.nt * o.nr, timed = 0;
    char dominated[512] = "";
    long long maxr = 0;
    for (int i = 0; i < o.nr; i++) maxr = o.reps[i] > maxr ? o.reps[i] : maxr;
    for (size_t ci = 0; ci < sizeof V4_CASES / sizeof V4_CASES[0]; ci++) {
        const v4_case *c = &V4_CASES[ci];
        if (!dsattn_bench_in_list(o.models, c->key)) continue;
        char path[256] = "", err[512] = "", mname[48], variant[64];
        int nh, dh, topk, layer = 0;
        dsattn_v4 *m = cm;
        if (cm) {
            /* the checkpoint's first layer of the case's kind */
            const dsattn_v4_kind kind = c->ratio == 4 ? DSATTN_V4_CSA : DSATTN_V4_HCA;
            while (layer < dsattn_v4_n_layers(cm) && dsattn_v4_layer_kind(cm, layer) != kind)
                layer++;
            if (layer == dsattn_v4_n_layers(cm)) {
                fprintf(stderr, "bench v4: %s: the checkpoint has no %s layer; skipped\n", c->key,
                        c->key);
                continue;
            }
            dsattn_v4_index_shape(cm, &nh, &dh, &topk);
            snprintf(mname, sizeof mname, "checkpoint V4 (dim %d)", dsattn_v4_dim(cm));
            if (c->ratio == 4)
                snprintf(variant, sizeof variant, "CSA m=%d, top-%d, layer %d",
                         dsattn_v4_layer_ratio(cm, layer), topk, layer);
            else
                snprintf(variant, sizeof variant, "HCA m=%d, all entries, layer %d",
                         dsattn_v4_layer_ratio(cm, layer), layer);
        } else {
            m = v4_model(src, c, o.seed, path, sizeof path, &nh, &dh, &topk, err, sizeof err);
            snprintf(mname, sizeof mname, "%s",
                     strstr(src, "pro") ? "DeepSeek-V4-Pro" : "DeepSeek-V4-Flash");
            snprintf(variant, sizeof variant, "%s", c->variant);
        }
        timed++;
        if (!m) { fprintf(stderr, "bench v4: %s: %s\n", c->key, err); rc = 1; remove(path); continue; }
        if (v4_verify(m, layer, c, o.seed)) {
            fprintf(stderr, "bench v4: %s: fast path disagrees with reference; not timing\n", c->key);
            rc = 1;
            if (!cm) dsattn_v4_destroy(m);
            remove(path);
            continue;
        }
        const size_t dim = (size_t)dsattn_v4_dim(m);
        float *x = dsattn_cli_rand_bf16(dim, o.seed + 1, 3), *y = calloc(dim, sizeof(float));
        for (int di = 0; di < o.nd && x && y; di++) {
            dsattn_v4_seq *s = NULL;
            if (dsattn_v4_seq_create_layers(&s, m, (size_t)(o.depth[di] + maxr + 2),
                                            DSATTN_V4_EMPTY_REFERENCE, layer, 1)) {
                fprintf(stderr, "bench v4: cannot hold depth %lld\n", o.depth[di]);
                rc = 1;
                continue;
            }
            dsattn_kv_bill kb = { 0 };
            dsattn_v4_seq_kv_bill(s, &kb);
            for (int ti = 0; ti < o.nt; ti++)
                for (int ri = 0; ri < o.nr; ri++) {
                    progress("v4", ++done, total, c->key, o.depth[di], (int)o.thr[ti]);
                    dsattn_ctx *ctx = dsattn_bench_ctx(DSATTN_MODE_FAST, (int)o.thr[ti]);
                    dsattn_bench_result r;
                    memset(&r, 0, sizeof r);
                    snprintf(r.model, sizeof r.model, "%s", mname);
                    snprintf(r.variant, sizeof r.variant, "%s", variant);
                    r.depth = o.depth[di];
                    r.kv_bytes = kb.global_bytes_per_token;
                    v4_step_arg a = { s, layer, x, y, 0.0 };
                    if (ctx && o.profile) dsattn_ctx_set_profiling(ctx, 1);
                    dsattn_status st = !ctx ? DSATTN_ERR_NOMEM
                                       : dsattn_v4_seq_fill_synthetic(s, o.depth[di],
                                                                      o.seed + (uint64_t)di);
                    if (!st) st = dsattn_bench_time(ctx, v4_step, &a, (int)o.reps[ri], &r);
                    if (st) {
                        fprintf(stderr, "bench v4: %s: %s\n", c->key, dsattn_status_str(st));
                        rc = 1;
                        dsattn_ctx_destroy(ctx);
                        continue;
                    }
                    prof_keep(&o, ctx, c->key, o.depth[di], (int)o.thr[ti], a.last_s);
                    if (c->ratio == 4) {
                        dsattn_bench_result keep = r;
                        size_t keys = 0;
                        double ms = v4_scan_ms(ctx, s, layer, nh, dh, topk, (int)o.reps[ri],
                                               &keys, o.seed + 5);
                        r = keep;
                        double pct = ms > 0 && r.ms_mean > 0 ? 100.0 * ms / r.ms_mean : 0;
                        snprintf(r.extra[0], sizeof r.extra[0], "%zu", keys);
                        snprintf(r.extra[1], sizeof r.extra[1], "%.2f", ms);
                        snprintf(r.extra[2], sizeof r.extra[2], "%.0f", pct);
                        if (pct >= 50) {
                            size_t k = strlen(dominated);
                            snprintf(dominated + k, sizeof dominated - k, "%s%lld/%lldT",
                                     k ? ", " : "", o.depth[di], o.thr[ti]);
                        }
                    } else {
                        snprintf(r.extra[0], sizeof r.extra[0], "0");
                        snprintf(r.extra[1], sizeof r.extra[1], "-");
                        snprintf(r.extra[2], sizeof r.extra[2], "-");
                    }
                    dsattn_bench_row(&t, &r);
                    dsattn_ctx_destroy(ctx);
                }
            dsattn_v4_seq_destroy(s);
        }
        free(x);
        free(y);
        if (!cm) dsattn_v4_destroy(m);
        remove(path);
    }
    dsattn_v4_destroy(cm);
    if (!timed) {
        fprintf(stderr, "bench v4: no case to time\n");
        rc = 1;
    }
    char note[1024];
    dsattn_bench_limits_note(note, sizeof note, o.thr, o.nt, 1);
    dsattn_bench_end(&t, note);
    if (o.fmt == DSATTN_BENCH_MD) {
        printf("idx keys = compressed index keys the CSA indexer scored in the step (depth/4); "
               "idx scan ms = the same scoring + top-k calls timed alone over the layer's own "
               "index cache at the same thread count; %% of step = its share of the CSA layer's "
               "ms/token.\n");
        if (dominated[0])
            printf("The indexer scan is >= 50%% of the CSA step (dominates) at depth/threads: "
                   "%s.\n", dominated);
        else
            printf("The indexer scan is < 50%% of the CSA step in every row above.\n");
        printf("Fast path checked against reference mode at depth 512 before timing "
               "(rel <= 3e-2, cosine >= 0.9995).\n");
        if (g_nprof) dsattn_bench_print_profile(g_prof, g_nprof, "the layer");
    }
    return rc;
}

/* ==== The short bench of `dsattn` (no arguments) ======================== */

typedef struct {
    dsattn_v41_seq *s;
    float          *h;
    size_t          dim;
} v41_step_arg;

static dsattn_status v41_step(dsattn_ctx *ctx, void *p)
{
    v41_step_arg *a = p;
    for (size_t i = 0; i < a->dim; i++) a->h[i] = (float)((int)((i * 37) % 11) - 5);
    return dsattn_v41_stack_forward(ctx, a->s, a->h, 1, NULL, NULL);
}

/* A V4.1-Flash sampler: one layer of every kind the published stack has
 * (SWA; Full m=2; Reuse m=2; Full m=1 + candidate source; Reindex m=1;
 * Reuse m=1), sources renumbered - the same kinds dsattn bill samples. */
static dsattn_v41 *v41_sampler(const char *configs, uint64_t seed, char *path, size_t pathn,
                               char *err, size_t errlen)
{
    char src[1024];
    snprintf(src, sizeof src, "%s/deepseek-v4.1-flash.json", configs);
    cJSON *j = read_cfg(src, NULL, err, errlen);
    if (!j) return NULL;
    static const int ratios[] = { 0, 2, 2, 1, 1, 1 }, kv[] = { 1, 3 }, ix[] = { 1, 3, 4 };
    dsattn_cli_json_set_num(j, "n_layers", 6);
    dsattn_cli_json_set_num(j, "n_mtp_layers", 0);
    dsattn_cli_json_set_ints(j, "compress_ratios", ratios, 6);
    dsattn_cli_json_set_ints(j, "kv_source_layers", kv, 2);
    dsattn_cli_json_set_ints(j, "index_source_layers", ix, 3);
    dsattn_cli_json_set_num(j, "candidate_source_layer", 3);
    if (write_cfg(j, "v41", path, pathn, err, errlen)) return NULL;
    dsattn_v41 *m = NULL;
    if (dsattn_v41_create_random(&m, path, seed, 1, err, errlen)) m = NULL;
    return m;
}

/* Fast vs reference per layer (attention outputs under the same inputs at
 * depth 256, where every compressed entry is selected). */
static int v41_verify(const dsattn_v41 *m, uint64_t seed)
{
    const int64_t depth = 256;
    const int L = dsattn_v41_n_layers(m);
    const size_t dim = (size_t)dsattn_v41_dim(m);
    dsattn_ctx *cf = dsattn_bench_ctx(DSATTN_MODE_FAST, 0);
    dsattn_ctx *cr = dsattn_bench_ctx(DSATTN_MODE_REFERENCE, 1);
    dsattn_v41_seq *sf = NULL, *sr = NULL;
    float *x = dsattn_cli_rand_bf16(dim, seed + 7, 3), *of = calloc(dim, 4), *orf = calloc(dim, 4);
    int bad = !(cf && cr && x && of && orf) ||
              dsattn_v41_seq_create(&sf, m, depth + 1, DSATTN_V41_INDEX_K_OWNER) ||
              dsattn_v41_seq_create(&sr, m, depth + 1, DSATTN_V41_INDEX_K_OWNER) ||
              dsattn_v41_seq_fill_synthetic(sf, depth, seed) ||
              dsattn_v41_seq_fill_synthetic(sr, depth, seed);
    double worst_rel = 0, worst_cos = 1;
    for (int l = 0; l < L && !bad; l++) {
        double rel, cs;
        if (dsattn_v41_attn_forward(cf, sf, l, x, 1, of) ||
            dsattn_v41_attn_forward(cr, sr, l, x, 1, orf)) { bad = 1; break; }
        dsattn_bench_rel_cos(of, orf, dim, &rel, &cs);
        worst_rel = fmax(worst_rel, rel);
        worst_cos = fmin(worst_cos, cs);
    }
    bad = bad || !(worst_rel <= VERIFY_REL && worst_cos >= VERIFY_COS);
    fprintf(stderr, "bench: V4.1 sampler fast vs reference at depth %lld, worst layer: rel %.3g, "
                    "cosine %.7f (need <= %g, >= %g) %s\n", (long long)depth, worst_rel,
            worst_cos, VERIFY_REL, VERIFY_COS, bad ? "MISMATCH" : "ok");
    dsattn_v41_seq_destroy(sf);
    dsattn_v41_seq_destroy(sr);
    dsattn_ctx_destroy(cf);
    dsattn_ctx_destroy(cr);
    free(x); free(of); free(orf);
    return bad;
}

int dsattn_bench_short(const char *configs, int threads)
{
    const int64_t d41 = 65536, dmla = 32768;
    const int reps = 2;
    const uint64_t seed = 1;
    t_start = dsattn_bench_now();
    dsattn_ctx *ctx = dsattn_bench_ctx(DSATTN_MODE_FAST, threads);
    if (!ctx) return 1;
    const int T = dsattn_ctx_threads(ctx);
    fprintf(stderr, "dsattn: short bench (V4.1 sampler at 64K, one V3 MLA layer at 32K) ...\n");
    dsattn_bench_table t = { "(short: dsattn with no arguments)",
        "Short bench, one decode step each (random FP8 weights, caches filled synthetically; "
        "one warm-up step, then 2 timed). V4.1: a 6-layer sampler with one layer of every "
        "kind of the 40-layer stack (SWA, Full m=2, Reuse m=2, Full m=1 + candidates, "
        "Reindex m=1, Reuse m=1). V3: one MLA layer, bf16 latent cache. Full tables: "
        "dsattn bench v41 | mla | v4 | mha.",
        DSATTN_BENCH_MD, 1, { "layers" }, { "layers" }, 0, "", NULL };
    int rc = 0;
    char path[256] = "", err[512] = "";
    dsattn_bench_begin(&t, dsattn_bench_isa_label());

    /* V4.1 sampler at 64K */
    dsattn_v41 *m41 = v41_sampler(configs, seed, path, sizeof path, err, sizeof err);
    remove(path);
    if (!m41) { fprintf(stderr, "bench: V4.1 sampler: %s\n", err); rc = 1; }
    else if (v41_verify(m41, seed)) { fprintf(stderr, "bench: V4.1 sampler not timed\n"); rc = 1; }
    else {
        dsattn_v41_seq *s = NULL;
        const size_t dim = (size_t)dsattn_v41_dim(m41);
        float *h = calloc(dim, sizeof(float));
        dsattn_bench_result r;
        memset(&r, 0, sizeof r);
        dsattn_status st = !h ? DSATTN_ERR_NOMEM
                           : dsattn_v41_seq_create(&s, m41, (size_t)d41 + reps + 2,
                                                   DSATTN_V41_INDEX_K_OWNER);
        if (!st) st = dsattn_v41_seq_fill_synthetic(s, d41, seed);
        v41_step_arg a = { s, h, dim };
        fprintf(stderr, "dsattn: V4.1 sampler, depth %lld (%.0f s so far)\n", (long long)d41,
                dsattn_bench_now() - t_start);
        if (!st) st = dsattn_bench_time(ctx, v41_step, &a, reps, &r);
        if (!st) {
            dsattn_kv_bill kb = { 0 };
            dsattn_v41_seq_kv_bill(s, &kb);
            snprintf(r.model, sizeof r.model, "DeepSeek-V4.1-Flash");
            snprintf(r.variant, sizeof r.variant, "CSA2 sampler, stack step");
            r.depth = d41;
            r.kv_bytes = kb.global_bytes_per_token;
            snprintf(r.extra[0], sizeof r.extra[0], "%d", dsattn_v41_n_layers(m41));
            dsattn_bench_row(&t, &r);
        } else {
            fprintf(stderr, "bench: V4.1 sampler: %s\n", dsattn_status_str(st));
            rc = 1;
        }
        dsattn_v41_seq_destroy(s);
        free(h);
    }
    dsattn_v41_destroy(m41);

    /* one V3 MLA layer at 32K */
    const mla_case *c = &MLA_CASES[0];
    dsattn_mla *m = mla_model(configs, c, seed, path, sizeof path, err, sizeof err);
    remove(path);
    if (!m) { fprintf(stderr, "bench: V3: %s\n", err); rc = 1; }
    else if (mla_verify(m, c, seed)) { fprintf(stderr, "bench: V3 not timed\n"); rc = 1; }
    else {
        dsattn_bench_opts o = { configs, DSATTN_BENCH_MD, c->key, { dmla }, { T }, { reps }, 1, 1,
                                1, seed, 0, { 1 }, 1, NULL, NULL };
        int done = 0;
        rc |= mla_rows(&o, c, c->model, m, &t, &done, 1);
    }
    dsattn_mla_destroy(m);
    char note[512];
    const double amx = dsattn_bench_amx_bf16_peak(T);
    char amxs[64] = "";
    if (amx > 0) snprintf(amxs, sizeof amxs, ", AMX-BF16 tiles %.0f GFLOP/s", amx);
    snprintf(note, sizeof note, "Limits measured here (%d threads): DRAM read %.2f GB/s, fp32 FMA "
             "%.1f GFLOP/s%s. The machine may be shared: treat times as indicative. (%.0f s)\n", T,
             dsattn_bench_read_bw(T), dsattn_bench_fma_peak(T), amxs, dsattn_bench_now() - t_start);
    dsattn_bench_end(&t, note);
    dsattn_ctx_destroy(ctx);
    return rc;
}
