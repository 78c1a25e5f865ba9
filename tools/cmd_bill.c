/* cmd_bill.c - `dsattn bill`: what each DeepSeek attention generation costs,
 * measured on its published configuration.
 *
 * One row per model (DeepSeek-LLM 7B / 67B, V3, V3.2, V4-Flash, V4-Pro,
 * V4.1-Flash).  Every number comes from running the library, not from a
 * formula:
 *   - global KV bytes per token: a sequence is created over the published
 *     config with no weights (the *_load_config / config-only models), and
 *     its live allocation is divided by its capacity (*_seq_kv_bill); the
 *     bounded per-sequence state (sliding windows, compressor state) is
 *     reported separately;
 *   - attention FLOPs and bytes read per decoded token at --ctx tokens: the
 *     context counters of one real decode step, taken per layer, of ONE
 *     layer of each distinct layer kind at real dimensions (random weights,
 *     FP8 where the model ships FP8) over a synthetically filled cache
 *     (*_seq_fill_synthetic), multiplied by the number of layers of that
 *     kind.  Where a whole-context cache of even one layer does not fit the
 *     memory budget (dense MHA/GQA/MLA at 1M), the step is measured at two
 *     depths and extrapolated affinely - dense attention's work is exactly
 *     affine in the context - and the row says so.
 * tests/test_bill.c recomputes every bytes-per-token value from the
 * configs' dimensions and compares it with this tool's measured output.
 *
 * Deliberately not here: any model code (the generations' APIs do the
 * work), and constants for bytes or FLOPs (a hidden constant would defeat
 * the point of a measured bill).
 */
#include "dsattn_commit.h"
#include "bench_util.h"
#include "cli.h"
#include "cli_num.h"
#include "cli_util.h"
#include "config.h"
#include "dsattn.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ==== Rows ============================================================== */

#define MAX_KINDS 8
#define BILL_MAX_SAMPLER 32   /* layers of a V4.1 sampler model */

typedef enum { FAM_MHA, FAM_MLA, FAM_V4, FAM_V41 } family;

typedef struct {
    const char *key;         /* --only key                                    */
    const char *model;
    const char *structure;
    const char *first;       /* where the structure first shipped             */
    const char *cuts;        /* the quantity it cuts                          */
    const char *config;      /* file under configs/                           */
    family      fam;
    int         available;   /* 0: the generation's API is not built: pending */
} bill_gen;

static const bill_gen GENS[] = {
    { "v1-7b", "DeepSeek-LLM-7B", "MHA", "V1-7B (2024.01)", "- (baseline)",
      "deepseek-llm-7b.json", FAM_MHA, 1 },
    { "v1-67b", "DeepSeek-LLM-67B", "GQA", "V1-67B (2024.01)", "KV heads 64 -> 8",
      "deepseek-llm-67b.json", FAM_MHA, 1 },
    { "v3", "DeepSeek-V3", "MLA", "V2 / V3 (2024.05 / 2024.12)", "entry width -> 576 latent",
      "deepseek-v3.json", FAM_MLA, 1 },
    { "v3.2", "DeepSeek-V3.2", "MLA + DSA", "V3.2 (2025.09)", "entries read -> top-2048",
      "deepseek-v3.2.json", FAM_MLA, 1 },
    { "v4-flash", "DeepSeek-V4-Flash", "CSA + HCA", "V4 (2026.06)",
      "entries stored /4 (CSA), /128 (HCA)", "deepseek-v4-flash.json", FAM_V4, 1 },
    { "v4-pro", "DeepSeek-V4-Pro", "CSA + HCA", "V4 (2026.06)",
      "entries stored /4 (CSA), /128 (HCA)", "deepseek-v4-pro.json", FAM_V4, 1 },
    { "v4.1-flash", "DeepSeek-V4.1-Flash", "CSA2", "V4.1-Flash (2026.09)",
      "layers x precision (shared KV, FP4)", "deepseek-v4.1-flash.json", FAM_V41, 1 },
};
#define N_GENS (sizeof GENS / sizeof GENS[0])
#define BASELINE_KEY "v1-67b"   /* the ratio column divides this row's bytes */
#define DSATTN_BILL_MIN(a, b) ((a) < (b) ? (a) : (b))

/* Layer kinds of one stack, and what one decode step of each cost. */
typedef struct {
    int    n;
    char   name[MAX_KINDS][24];
    int    count[MAX_KINDS];       /* layers of the kind in the published stack */
    int    sampler[MAX_KINDS];     /* its layer in the sampler model            */
    double flops[MAX_KINDS], bytes[MAX_KINDS];   /* one layer, one token      */
    double attended[MAX_KINDS];    /* entries one query attends, per layer     */
    double scored[MAX_KINDS];      /* index keys one query scores, per layer   */
    long   width[MAX_KINDS];       /* measured top-k width (-1: none)          */
} kinds_t;

typedef struct {
    const bill_gen *g;
    const char *status;            /* "measured", "kv-only", "pending", "error" */
    char   err[256];
    int    n_layers;
    const char *weights;           /* "bf16" / "fp8" (the sampler's)           */
    dsattn_kv_bill kv;
    kinds_t k;
    double flops, bytes;           /* per decoded token, all layers            */
    double attended_total, scored_total;
    int    extrapolated;
    long   depth_lo, depth_hi;     /* contexts the decode step ran at          */
    double seconds;
} bill_row;

typedef struct {
    long        ctx;
    int         kv_only;
    uint64_t    seed;
    double      budget_mib;        /* per-layer cache for a direct measurement */
    const char *configs;
    const char *tmpdir;
    int         quiet;
    dsattn_ctx *dctx;
    double      baseline;          /* V1-67B's measured B/token (ratio column) */
} bill_opts;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ==== Config files ====================================================== */

static cJSON *load_json(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%.200s: cannot open", path); return NULL; }
    long n = -1;
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        fclose(f);
        snprintf(err, errlen, "%.200s: cannot seek (not a regular file?)", path);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)n) { free(buf); snprintf(err, errlen, "%.200s: read failed", path); return NULL; }
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    if (!j) snprintf(err, errlen, "%.200s: not JSON", path);
    return j;
}

static int kind_add(kinds_t *k, const char *name, int sampler_layer)
{
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->name[i], name)) return i;
    if (k->n == MAX_KINDS) return -1;
    snprintf(k->name[k->n], sizeof k->name[0], "%s", name);
    k->sampler[k->n] = sampler_layer;
    k->width[k->n] = -1;
    return k->n++;
}

/* Run the decode step's layers in order with per-layer counters.  fwd is
 * the generation's attn_forward; the caller advances. */
typedef dsattn_status (*fwd_fn)(dsattn_ctx *, void *, int, const float *, size_t, float *);

static dsattn_status step_layers(const bill_opts *o, void *seq, fwd_fn fwd, int n_layers,
                                 size_t dim, double *fl, double *by)
{
    float *x = dsattn_cli_rand_bf16(dim, o->seed + 7, 1), *y = malloc(dim * sizeof(float));
    dsattn_status st = x && y ? DSATTN_OK : DSATTN_ERR_NOMEM;
    for (int l = 0; l < n_layers && !st; l++) {
        dsattn_ctx_counters_reset(o->dctx);
        st = fwd(o->dctx, seq, l, x, 1, y);
        dsattn_counters c = dsattn_ctx_counters(o->dctx);
        fl[l] = (double)c.flops;
        by[l] = (double)c.bytes_read;
    }
    free(x);
    free(y);
    return st;
}

static dsattn_status fwd_mha(dsattn_ctx *c, void *s, int l, const float *x, size_t n, float *y)
{ return dsattn_mha_attn_forward(c, s, l, x, n, y); }
static dsattn_status fwd_mla(dsattn_ctx *c, void *s, int l, const float *x, size_t n, float *y)
{ return dsattn_mla_attn_forward(c, s, l, x, n, y); }
static dsattn_status fwd_v4(dsattn_ctx *c, void *s, int l, const float *x, size_t n, float *y)
{ return dsattn_v4_attn_forward(c, s, l, x, n, y); }
static dsattn_status fwd_v41(dsattn_ctx *c, void *s, int l, const float *x, size_t n, float *y)
{ return dsattn_v41_attn_forward(c, s, l, x, n, y); }

#define TRY(call)                                                            \
    do {                                                                     \
        dsattn_status st_ = (call);                                          \
        if (st_) {                                                           \
            if (!r->err[0]) snprintf(r->err, sizeof r->err, "%s: %s", #call, \
                                     dsattn_status_str(st_));                \
            goto out;                                                        \
        }                                                                    \
    } while (0)

/* ==== MHA / GQA (DeepSeek-LLM) ========================================== */

static void plan_mha(const cJSON *cfg, bill_row *r)
{
    int L = (int)dsattn_cli_json_num(cfg, "num_hidden_layers", 0);
    int H = (int)dsattn_cli_json_num(cfg, "num_attention_heads", 0);
    int Hkv = (int)dsattn_cli_json_num(cfg, "num_key_value_heads", H);
    kind_add(&r->k, Hkv == H ? "MHA" : "GQA", 0);
    r->k.count[0] = L;
    r->n_layers = L;
    r->weights = "bf16";
}

static void entries_mha(bill_row *r, long ctx)
{
    r->k.attended[0] = (double)ctx;
    r->k.scored[0] = 0;
}

/* The KV rows: a live config-only sequence of a small capacity gives the
 * global bytes per token (allocated / capacity), the windows and the
 * state; its decode scratch, part of which grows with the capacity, is
 * what seq_create would allocate at ctx tokens (*_seq_scratch_at, the
 * function seq_create sizes it with). */
static dsattn_status kv_mha(const char *cfg, size_t ctx, dsattn_kv_bill *b, char *err,
                            size_t errlen)
{
    dsattn_mha *m = NULL;
    dsattn_mha_seq *s = NULL;
    dsattn_status st = dsattn_mha_load_config(&m, cfg, err, errlen);
    if (!st) st = dsattn_mha_seq_create(&s, m, 256);
    if (!st) st = dsattn_mha_seq_kv_bill(s, b);
    if (!st) b->scratch_bytes = dsattn_mha_seq_scratch_at(m, ctx);
    dsattn_mha_seq_destroy(s);
    dsattn_mha_destroy(m);
    return st;
}

/* One layer's weights and one layer's cache: the whole model's cache at a
 * deep context would not fit (491,520 B/token for 7B). */
static int decode_mha(const bill_opts *o, const char *cfg, long ctx, bill_row *r)
{
    dsattn_mha *m = NULL;
    dsattn_mha_seq *s = NULL;
    double fl[1], by[1];
    int ok = 0;
    TRY(dsattn_mha_create_random_layers(&m, cfg, o->seed, 0, 1, r->err, sizeof r->err));
    TRY(dsattn_mha_seq_create_layers(&s, m, (size_t)ctx, 0, 1));
    TRY(dsattn_mha_seq_fill_synthetic(s, ctx - 1, o->seed + 1));
    TRY(step_layers(o, s, fwd_mha, 1, (size_t)dsattn_mha_dim(m), fl, by));
    r->k.flops[0] = fl[0];
    r->k.bytes[0] = by[0];
    ok = 1;
out:
    dsattn_mha_seq_destroy(s);
    dsattn_mha_destroy(m);
    return ok;
}

/* ==== MLA (V3) and MLA + DSA (V3.2) ===================================== */

static int is_dsa(const cJSON *cfg)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    return cJSON_IsString(v) && !strcmp(v->valuestring, "deepseek_v32");
}

/* The cache each generation's official inference code keeps: V3 the bf16
 * latent (kv_cache + pe_cache, attn_impl "absorb"), V3.2 the FlashMLA FP8
 * rows (656 B) with the 132 B FP8 index keys. */
static dsattn_mla_cache mla_cache_of(const cJSON *cfg)
{
    return is_dsa(cfg) ? DSATTN_MLA_CACHE_LATENT_FP8 : DSATTN_MLA_CACHE_LATENT_BF16;
}

static void plan_mla(const cJSON *cfg, bill_row *r, cJSON *sampler)
{
    r->n_layers = (int)dsattn_cli_json_num(cfg, "n_layers", 0);
    kind_add(&r->k, is_dsa(cfg) ? "MLA+DSA" : "MLA", 0);
    r->k.count[0] = r->n_layers;
    r->weights = dsattn_cli_json_is_fp8(cfg) ? "fp8" : "bf16";
    dsattn_cli_json_set_num(sampler, "n_layers", 1);     /* every layer has the same attention */
}

static void entries_mla(const cJSON *cfg, bill_row *r, long ctx)
{
    if (is_dsa(cfg)) {
        double topk = dsattn_cli_json_num(cfg, "index_topk", 2048);
        r->k.attended[0] = fmin(topk, (double)ctx);
        r->k.scored[0] = (double)ctx;
    } else {
        r->k.attended[0] = (double)ctx;
        r->k.scored[0] = 0;
    }
}

static dsattn_status kv_mla(const char *cfgpath, const cJSON *cfg, size_t ctx,
                            dsattn_kv_bill *b, char *err, size_t errlen)
{
    dsattn_mla *m = NULL;
    dsattn_mla_seq *s = NULL;
    dsattn_status st = dsattn_mla_create_config_only(&m, cfgpath, err, errlen);
    if (!st) st = dsattn_mla_seq_create(&s, m, 256, mla_cache_of(cfg));
    if (!st) st = dsattn_mla_seq_kv_bill(s, b);
    if (!st) b->scratch_bytes = dsattn_mla_seq_scratch_at(m, ctx, mla_cache_of(cfg));
    dsattn_mla_seq_destroy(s);
    dsattn_mla_destroy(m);
    return st;
}

static int decode_mla(const bill_opts *o, const char *sampler, const cJSON *cfg, long ctx,
                      bill_row *r)
{
    dsattn_mla *m = NULL;
    dsattn_mla_seq *s = NULL;
    double fl[1], by[1];
    int ok = 0;
    TRY(dsattn_mla_create_random(&m, sampler, o->seed, dsattn_cli_json_is_fp8(cfg), r->err, sizeof r->err));
    TRY(dsattn_mla_seq_create(&s, m, (size_t)ctx, mla_cache_of(cfg)));
    TRY(dsattn_mla_seq_fill_synthetic(s, ctx - 1, o->seed + 1));
    TRY(step_layers(o, s, fwd_mla, 1, (size_t)dsattn_mla_dim(m), fl, by));
    r->k.flops[0] = fl[0];
    r->k.bytes[0] = by[0];
    if (is_dsa(cfg)) {
        const int32_t *rows;
        size_t nr, w;
        if (dsattn_mla_seq_selection(s, 0, &rows, &nr, &w) == DSATTN_OK) r->k.width[0] = (long)w;
    }
    ok = 1;
out:
    dsattn_mla_seq_destroy(s);
    dsattn_mla_destroy(m);
    return ok;
}

/* ==== CSA + HCA (V4) ==================================================== */

static const char *v4_kind_name(dsattn_v4_kind k)
{
    return k == DSATTN_V4_SWA ? "SWA" : k == DSATTN_V4_CSA ? "CSA" : "HCA";
}

/* Kinds from the config-only model's plan; the sampler keeps the first
 * layer of each distinct compress ratio, in order. */
static dsattn_status plan_v4(const char *cfgpath, bill_row *r, cJSON *sampler, char *err,
                             size_t errlen)
{
    dsattn_v4 *m = NULL;
    dsattn_status st = dsattn_v4_load_config(&m, cfgpath, err, errlen);
    if (st) return st;
    int L = dsattn_v4_n_layers(m), ratios[MAX_KINDS], ns = 0;
    r->n_layers = L;
    for (int l = 0; l < L; l++) {
        int ratio = dsattn_v4_layer_ratio(m, l), seen = -1;
        for (int i = 0; i < ns; i++)
            if (ratios[i] == ratio) seen = i;
        char name[24];
        snprintf(name, sizeof name, "%s m=%d", v4_kind_name(dsattn_v4_layer_kind(m, l)), ratio);
        if (seen < 0) {
            if (ns == MAX_KINDS) { st = DSATTN_ERR_UNSUPPORTED; break; }
            ratios[ns++] = ratio;
        }
        int k = kind_add(&r->k, name, seen < 0 ? ns - 1 : seen);
        r->k.count[k]++;
    }
    dsattn_v4_destroy(m);
    dsattn_cli_json_set_num(sampler, "n_layers", ns);
    dsattn_cli_json_set_num(sampler, "n_mtp_layers", 0);
    dsattn_cli_json_set_ints(sampler, "compress_ratios", ratios, ns);
    return st;
}

static void entries_v4(const cJSON *cfg, bill_row *r, long ctx)
{
    double w = fmin(dsattn_cli_json_num(cfg, "window_size", 128), (double)ctx);
    double topk = dsattn_cli_json_num(cfg, "index_topk", 512);
    for (int i = 0; i < r->k.n; i++) {
        int ratio = atoi(strstr(r->k.name[i], "m=") + 2);
        if (ratio == 0) { r->k.attended[i] = w; r->k.scored[i] = 0; }
        else if (!strncmp(r->k.name[i], "CSA", 3)) {
            r->k.attended[i] = w + fmin(topk, floor((double)ctx / ratio));
            r->k.scored[i] = floor((double)ctx / ratio);
        } else {
            r->k.attended[i] = w + floor((double)ctx / ratio);
            r->k.scored[i] = 0;
        }
    }
}

static dsattn_status kv_v4(const char *cfg, size_t ctx, dsattn_kv_bill *b, char *err,
                           size_t errlen)
{
    dsattn_v4 *m = NULL;
    dsattn_v4_seq *s = NULL;
    dsattn_status st = dsattn_v4_load_config(&m, cfg, err, errlen);
    if (!st) st = dsattn_v4_seq_create(&s, m, 1024, DSATTN_V4_EMPTY_REFERENCE);
    if (!st) st = dsattn_v4_seq_kv_bill(s, b);
    if (!st) b->scratch_bytes = dsattn_v4_seq_scratch_at(m, ctx);
    dsattn_v4_seq_destroy(s);
    dsattn_v4_destroy(m);
    return st;
}

static int decode_v4(const bill_opts *o, const char *sampler, const cJSON *cfg, long ctx,
                     bill_row *r)
{
    dsattn_v4 *m = NULL;
    dsattn_v4_seq *s = NULL;
    double fl[MAX_KINDS], by[MAX_KINDS];
    int ok = 0;
    TRY(dsattn_v4_create_random(&m, sampler, o->seed, dsattn_cli_json_is_fp8(cfg), r->err, sizeof r->err));
    TRY(dsattn_v4_seq_create(&s, m, (size_t)ctx, DSATTN_V4_EMPTY_REFERENCE));
    TRY(dsattn_v4_seq_fill_synthetic(s, ctx - 1, o->seed + 1));
    TRY(step_layers(o, s, fwd_v4, dsattn_v4_n_layers(m), (size_t)dsattn_v4_dim(m), fl, by));
    for (int i = 0; i < r->k.n; i++) {
        int l = r->k.sampler[i];
        const int32_t *rows;
        size_t nr, w;
        r->k.flops[i] = fl[l];
        r->k.bytes[i] = by[l];
        if (dsattn_v4_layer_kind(m, l) == DSATTN_V4_CSA &&
            dsattn_v4_seq_selection(s, l, &rows, &nr, &w) == DSATTN_OK)
            r->k.width[i] = (long)w;
    }
    ok = 1;
out:
    dsattn_v4_seq_destroy(s);
    dsattn_v4_destroy(m);
    return ok;
}

/* ==== CSA2 (V4.1) ======================================================= */

/* The sampler keeps the first layer of each kind (mode, ratio, candidate
 * source or not) plus what that layer reads: the latest KV source at or
 * before it, the latest index source, and for Reindex the candidate
 * source.  Source lists and the candidate layer are renumbered. */
static dsattn_status plan_v41(const char *cfgpath, const cJSON *cfg, bill_row *r,
                              cJSON *sampler, char *err, size_t errlen)
{
    dsattn_v41 *m = NULL;
    dsattn_status st = dsattn_v41_load_config(&m, cfgpath, err, errlen);
    if (st) return st;
    const int L = dsattn_v41_n_layers(m), cand = (int)dsattn_cli_json_num(cfg, "candidate_source_layer", -1);
    r->n_layers = L;
    char (*kname)[24] = calloc((size_t)L, sizeof *kname);
    int *keep = calloc((size_t)L, sizeof(int)), *newi = calloc((size_t)L, sizeof(int));
    if (!kname || !keep || !newi) { st = DSATTN_ERR_NOMEM; goto done; }
    int last_kv = -1, last_idx = -1;
    kinds_t seen = { 0 };
    for (int l = 0; l < L; l++) {
        dsattn_v41_mode md = dsattn_v41_layer_mode(m, l);
        int ratio = dsattn_v41_layer_ratio(m, l);
        if (md == DSATTN_V41_FULL) last_kv = l;
        if (md == DSATTN_V41_FULL || md == DSATTN_V41_REINDEX) last_idx = l;
        if (md == DSATTN_V41_SWA) snprintf(kname[l], 24, "SWA");
        else snprintf(kname[l], 24, "%s m=%d%s", dsattn_v41_mode_name(md), ratio,
                      l == cand ? "+cand" : "");
        int before = seen.n;
        kind_add(&seen, kname[l], l);
        if (seen.n == before) continue;               /* kind already sampled */
        keep[l] = 1;
        if (md != DSATTN_V41_SWA) {
            if (last_kv >= 0) keep[last_kv] = 1;
            if (last_idx >= 0) keep[last_idx] = 1;
            if (md == DSATTN_V41_REINDEX && cand >= 0) keep[cand] = 1;
        }
    }
    int ns = 0, ratios[BILL_MAX_SAMPLER], kv[BILL_MAX_SAMPLER], ix[BILL_MAX_SAMPLER];
    int nkv = 0, nix = 0;
    for (int l = 0; l < L; l++) {
        if (!keep[l]) continue;
        if (ns == BILL_MAX_SAMPLER) { st = DSATTN_ERR_UNSUPPORTED; goto done; }
        dsattn_v41_mode md = dsattn_v41_layer_mode(m, l);
        newi[l] = ns;
        ratios[ns] = dsattn_v41_layer_ratio(m, l);
        if (md == DSATTN_V41_FULL) kv[nkv++] = ns;
        if (md == DSATTN_V41_FULL || md == DSATTN_V41_REINDEX) ix[nix++] = ns;
        ns++;
    }
    /* kinds: names in first-seen order, sampler layer = first kept layer of
     * the kind, counts over the published stack */
    for (int l = 0; l < L; l++) {
        int k = kind_add(&r->k, kname[l], keep[l] ? newi[l] : -1);
        if (k < 0) { st = DSATTN_ERR_UNSUPPORTED; goto done; }
        r->k.count[k]++;
    }
    dsattn_cli_json_set_num(sampler, "n_layers", ns);
    dsattn_cli_json_set_num(sampler, "n_mtp_layers", 0);
    dsattn_cli_json_set_ints(sampler, "compress_ratios", ratios, ns);
    dsattn_cli_json_set_ints(sampler, "kv_source_layers", kv, nkv);
    dsattn_cli_json_set_ints(sampler, "index_source_layers", ix, nix);
    dsattn_cli_json_set_num(sampler, "candidate_source_layer", cand >= 0 && keep[cand] ? newi[cand] : -1);
done:
    free(kname);
    free(keep);
    free(newi);
    dsattn_v41_destroy(m);
    return st;
}

static void entries_v41(const cJSON *cfg, bill_row *r, long ctx)
{
    double w = fmin(dsattn_cli_json_num(cfg, "window_size", 128), (double)ctx);
    double topk = dsattn_cli_json_num(cfg, "index_topk", 512);
    double pool = dsattn_cli_json_num(cfg, "candidate_topk_blocks", 0) * dsattn_cli_json_num(cfg, "candidate_block_size", 0);
    for (int i = 0; i < r->k.n; i++) {
        const char *nm = r->k.name[i], *mp = strstr(nm, "m=");
        int ratio = mp ? atoi(mp + 2) : 0;
        double T = ratio ? floor((double)ctx / ratio) : 0;
        r->k.attended[i] = w + (ratio ? fmin(topk, T) : 0);
        if (!strncmp(nm, "Full", 4)) r->k.scored[i] = T;
        else if (!strncmp(nm, "Reindex", 7)) r->k.scored[i] = pool > 0 ? fmin(pool, T) : T;
        else r->k.scored[i] = 0;
    }
}

static dsattn_status kv_v41(const char *cfg, size_t ctx, dsattn_kv_bill *b, char *err,
                            size_t errlen)
{
    dsattn_v41 *m = NULL;
    dsattn_v41_seq *s = NULL;
    dsattn_status st = dsattn_v41_load_config(&m, cfg, err, errlen);
    if (!st) st = dsattn_v41_seq_create(&s, m, 1024, DSATTN_V41_INDEX_K_OWNER);
    if (!st) st = dsattn_v41_seq_kv_bill(s, b);
    if (!st) b->scratch_bytes = dsattn_v41_seq_scratch_at(m, ctx);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    return st;
}

static int decode_v41(const bill_opts *o, const char *sampler, const cJSON *cfg, long ctx,
                      bill_row *r)
{
    dsattn_v41 *m = NULL;
    dsattn_v41_seq *s = NULL;
    double fl[BILL_MAX_SAMPLER], by[BILL_MAX_SAMPLER];
    int ok = 0;
    TRY(dsattn_v41_create_random(&m, sampler, o->seed, dsattn_cli_json_is_fp8(cfg), r->err, sizeof r->err));
    TRY(dsattn_v41_seq_create(&s, m, (size_t)ctx, DSATTN_V41_INDEX_K_OWNER));
    TRY(dsattn_v41_seq_fill_synthetic(s, ctx - 1, o->seed + 1));
    TRY(step_layers(o, s, fwd_v41, dsattn_v41_n_layers(m), (size_t)dsattn_v41_dim(m), fl, by));
    for (int i = 0; i < r->k.n; i++) {
        int l = r->k.sampler[i];
        const int32_t *rows;
        size_t nr, w;
        if (l < 0) continue;
        r->k.flops[i] = fl[l];
        r->k.bytes[i] = by[l];
        if (dsattn_v41_layer_mode(m, l) != DSATTN_V41_SWA && dsattn_v41_layer_mode(m, l) != DSATTN_V41_REUSE &&
            dsattn_v41_seq_selection(s, l, &rows, &nr, &w) == DSATTN_OK)
            r->k.width[i] = (long)w;
    }
    ok = 1;
out:
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    return ok;
}

/* ==== One row =========================================================== */

/* Largest context whose one-layer cache fits the budget, for dense rows;
 * 0 = no limit (compressed caches are small at any context we run). */
static long direct_limit(const bill_opts *o, const bill_row *r)
{
    if (r->g->fam == FAM_V4 || r->g->fam == FAM_V41) return 0;
    double per_layer = r->kv.global_bytes_per_token / r->n_layers;
    long lim = (long)(o->budget_mib * 1048576.0 / per_layer);
    return lim < 8192 ? 8192 : lim;
}

static int decode_at(const bill_opts *o, const bill_row *r0, const char *cfgpath,
                     const char *sampler, const cJSON *cfg, long ctx, bill_row *r)
{
    (void)r0;
    switch (r->g->fam) {
    case FAM_MHA: return decode_mha(o, cfgpath, ctx, r);
    case FAM_MLA: return decode_mla(o, sampler, cfg, ctx, r);
    case FAM_V4:  return decode_v4(o, sampler, cfg, ctx, r);
    case FAM_V41: return decode_v41(o, sampler, cfg, ctx, r);
    }
    return 0;
}

static void measure_row(const bill_opts *o, const bill_gen *g, bill_row *r)
{
    char cfgpath[1024], sampler[1200];
    double t0 = now_s();
    memset(r, 0, sizeof *r);
    r->g = g;
    r->status = "error";
    if (!g->available) { r->status = "pending"; return; }
    snprintf(cfgpath, sizeof cfgpath, "%s/%s", o->configs, g->config);
    snprintf(sampler, sizeof sampler, "%s/sampler-%s.json", o->tmpdir, g->key);
    cJSON *cfg = load_json(cfgpath, r->err, sizeof r->err);
    if (!cfg) return;
    cJSON *smp = cJSON_Duplicate(cfg, 1);
    dsattn_status st = DSATTN_OK;
    switch (g->fam) {
    case FAM_MHA: plan_mha(cfg, r); break;
    case FAM_MLA: plan_mla(cfg, r, smp); break;
    case FAM_V4:  st = plan_v4(cfgpath, r, smp, r->err, sizeof r->err);
                  r->weights = dsattn_cli_json_is_fp8(cfg) ? "fp8" : "bf16"; break;
    case FAM_V41: st = plan_v41(cfgpath, cfg, r, smp, r->err, sizeof r->err);
                  r->weights = dsattn_cli_json_is_fp8(cfg) ? "fp8" : "bf16"; break;
    }
    if (!st && g->fam != FAM_MHA && dsattn_cli_json_write(smp, sampler))
        st = DSATTN_ERR_IO, snprintf(r->err, sizeof r->err, "cannot write %.200s", sampler);
    /* the KV bill: a sequence over the published config, no weights */
    if (!st) {
        switch (g->fam) {
        case FAM_MHA: st = kv_mha(cfgpath, (size_t)o->ctx, &r->kv, r->err, sizeof r->err); break;
        case FAM_MLA: st = kv_mla(cfgpath, cfg, (size_t)o->ctx, &r->kv, r->err, sizeof r->err); break;
        case FAM_V4:  st = kv_v4(cfgpath, (size_t)o->ctx, &r->kv, r->err, sizeof r->err); break;
        case FAM_V41: st = kv_v41(cfgpath, (size_t)o->ctx, &r->kv, r->err, sizeof r->err); break;
        }
    }
    if (st) goto done;
    switch (g->fam) {
    case FAM_MHA: entries_mha(r, o->ctx); break;
    case FAM_MLA: entries_mla(cfg, r, o->ctx); break;
    case FAM_V4:  entries_v4(cfg, r, o->ctx); break;
    case FAM_V41: entries_v41(cfg, r, o->ctx); break;
    }
    for (int i = 0; i < r->k.n; i++) {
        r->attended_total += r->k.attended[i] * r->k.count[i];
        r->scored_total += r->k.scored[i] * r->k.count[i];
    }
    if (o->kv_only) { r->status = "kv-only"; goto done; }

    long lim = direct_limit(o, r);
    if (lim == 0 || o->ctx <= lim) {
        r->depth_lo = r->depth_hi = o->ctx;
        if (!decode_at(o, r, cfgpath, sampler, cfg, o->ctx, r)) goto done;
        /* the measured top-k widths must be what the structure says */
        for (int i = 0; i < r->k.n; i++) {
            double want = r->k.attended[i] - fmin(dsattn_cli_json_num(cfg, "window_size", 0), (double)o->ctx);
            if (r->k.width[i] >= 0 && fabs((double)r->k.width[i] - want) > 0.5) {
                char kn[24];
                memcpy(kn, r->k.name[i], sizeof kn);
                snprintf(r->err, sizeof r->err, "%s: measured top-k width %ld, structure says %.0f",
                         kn, r->k.width[i], want);
                goto done;
            }
        }
    } else {
        /* dense: two depths, affine fit, evaluated at ctx */
        bill_row lo = *r;
        r->depth_lo = lim / 2;
        r->depth_hi = lim;
        r->extrapolated = 1;
        if (!decode_at(o, r, cfgpath, sampler, cfg, r->depth_lo, &lo)) {
            memcpy(r->err, lo.err, sizeof r->err);
            goto done;
        }
        if (!decode_at(o, r, cfgpath, sampler, cfg, r->depth_hi, r)) goto done;
        double span = (double)(r->depth_hi - r->depth_lo);
        for (int i = 0; i < r->k.n; i++) {
            double df = (r->k.flops[i] - lo.k.flops[i]) / span;
            double db = (r->k.bytes[i] - lo.k.bytes[i]) / span;
            r->k.flops[i] += df * (double)(o->ctx - r->depth_hi);
            r->k.bytes[i] += db * (double)(o->ctx - r->depth_hi);
        }
    }
    for (int i = 0; i < r->k.n; i++) {
        r->flops += r->k.flops[i] * r->k.count[i];
        r->bytes += r->k.bytes[i] * r->k.count[i];
    }
    r->status = "measured";
done:
    cJSON_Delete(cfg);
    cJSON_Delete(smp);
    unlink(sampler);
    r->seconds = now_s() - t0;
}

/* ==== Formatting ======================================================== */

/* 1234567 -> "1,234,567" (integers) */
static const char *grp(double v, char *buf, size_t n)
{
    char t[64];
    snprintf(t, sizeof t, "%.0f", v);
    size_t len = strlen(t), o = 0, lead = len % 3 ? len % 3 : 3;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && i >= lead && (i - lead) % 3 == 0 && t[i - 1] != '-') buf[o++] = ',';
        buf[o++] = t[i];
    }
    buf[o] = 0;
    return buf;
}

/* bytes per token: exact integers keep all digits, fractions two */
static const char *bpt(double v, char *buf, size_t n)
{
    if (v == floor(v)) return grp(v, buf, n);
    char ip[48];
    grp(floor(v), ip, sizeof ip);
    snprintf(buf, n, "%s.%02.0f", ip, (v - floor(v)) * 100.0);
    return buf;
}

static const char *human_bytes(double b, char *buf, size_t n)
{
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    int i = 0;
    while (b >= 1024.0 && i < 5) { b /= 1024.0; i++; }
    snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

static const char *ctx_name(long ctx, char *buf, size_t n)
{
    if (ctx % 1048576 == 0) snprintf(buf, n, "%ldM", ctx / 1048576);
    else if (ctx % 1024 == 0) snprintf(buf, n, "%ldK", ctx / 1024);
    else snprintf(buf, n, "%ld", ctx);
    return buf;
}

/* "128 x2, 640 x38": the entries one query attends in each layer kind */
static const char *attended_str(const bill_row *r, char *buf, size_t n)
{
    double v[MAX_KINDS];
    int c[MAX_KINDS], m = 0;
    for (int i = 0; i < r->k.n; i++) {
        int j = 0;
        while (j < m && v[j] != r->k.attended[i]) j++;
        if (j == m) { v[m] = r->k.attended[i]; c[m++] = 0; }
        c[j] += r->k.count[i];
    }
    size_t o = 0;
    buf[0] = 0;
    for (int j = 0; j < m && o < n; j++) {
        char g[48];
        o += (size_t)snprintf(buf + o, n - o, "%s%s x%d", j ? ", " : "", grp(v[j], g, sizeof g), c[j]);
    }
    return buf;
}

static int has_kv(const bill_row *r)
{
    return !strcmp(r->status, "measured") || !strcmp(r->status, "kv-only");
}

/* 3292.86 -> "3,292.9"; 35.49 -> "35.49" */
static const char *gnum(double v, char *buf, size_t n)
{
    if (v >= 100.0) {
        char ip[48];
        double r = floor(v * 10.0 + 0.5) / 10.0;
        grp(floor(r), ip, sizeof ip);
        snprintf(buf, n, "%s.%.0f", ip, (r - floor(r)) * 10.0);
    } else {
        snprintf(buf, n, "%.2f", v);
    }
    return buf;
}

static void print_md(FILE *f, const bill_opts *o, const bill_row *rows, size_t n)
{
    char cn[32], a[64], b[64], c[64], d[256];
    double base = o->baseline;
    ctx_name(o->ctx, cn, sizeof cn);
    fprintf(f, "dsattn %s (%s) bill at %s = %s tokens; isa %s, %d threads, seed %llu\n\n",
            dsattn_version(), DSATTN_GIT_COMMIT, cn, grp((double)o->ctx, a, sizeof a),
            dsattn_ctx_isa_name(o->dctx), dsattn_ctx_threads(o->dctx),
            (unsigned long long)o->seed);
    fprintf(f, "| Structure | First model | Cuts | Model | Global KV B/token (measured) | "
               "Window + state + scratch / seq | V1-67B / this | Entries attended / query / layer @%s | "
               "Index keys scored / token @%s | Attn GFLOP / token @%s | Attn GB read / token @%s | "
               "Global KV @%s |\n", cn, cn, cn, cn, cn);
    fprintf(f, "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const bill_row *r = &rows[i];
        fprintf(f, "| %s | %s | %s | %s | ", r->g->structure, r->g->first, r->g->cuts, r->g->model);
        if (!has_kv(r)) {
            fprintf(f, "%s%s%s | | | | | | | |\n", r->status, r->err[0] ? ": " : "", r->err);
            continue;
        }
        fprintf(f, "%s | %s | ", bpt(r->kv.global_bytes_per_token, a, sizeof a),
                human_bytes((double)(r->kv.window_bytes + r->kv.state_bytes + r->kv.scratch_bytes),
                            b, sizeof b));
        double ratio = base / r->kv.global_bytes_per_token;
        if (base > 0) fprintf(f, ratio >= 10 ? "%.0fx | " : "%.2fx | ", ratio);
        else fprintf(f, "- | ");
        fprintf(f, "%s | %s | ", attended_str(r, d, sizeof d),
                r->scored_total > 0 ? grp(r->scored_total, c, sizeof c) : "0");
        if (!strcmp(r->status, "measured"))
            fprintf(f, "%s%s | %s%s | ", gnum(r->flops / 1e9, a, sizeof a),
                    r->extrapolated ? " (fit)" : "", gnum(r->bytes / 1e9, b, sizeof b),
                    r->extrapolated ? " (fit)" : "");
        else
            fprintf(f, "(kv-only) | (kv-only) | ");
        fprintf(f, "%s |\n", human_bytes(r->kv.global_bytes_per_token * (double)o->ctx, a, sizeof a));
    }
    fprintf(f, "\n");
    fprintf(f, "- Global KV B/token: bytes a sequence over the published config allocates for its\n"
               "  context-proportional caches, divided by its capacity (*_seq_kv_bill on a config-only\n"
               "  model, no weights). Sliding-window rings and compressor state are bounded per\n"
               "  sequence and shown separately. MHA/GQA: bf16 K and V; V3: the bf16 latent + RoPE key\n"
               "  (attn_impl absorb); V3.2: FlashMLA FP8 rows + FP8 index keys; V4: MODEL1 FP8 rows +\n"
               "  FP4 index keys; V4.1: FP4 rows + FP4 index keys of its 4 KV-source layers.\n");
    fprintf(f, "- FLOPs and bytes per decoded token: the kernels' own counters (dsattn_ctx_counters)\n"
               "  during one real decode step at context %s, of ONE layer of each distinct layer kind\n"
               "  at real dimensions (random weights, fp8 where the model ships fp8), times the number\n"
               "  of layers of that kind. Includes the projections and the weight bytes they read.\n"
               "  Caches were filled synthetically (*_seq_fill_synthetic) before the step.\n",
            grp((double)o->ctx, a, sizeof a));
    int any_x = 0;
    for (size_t i = 0; i < n; i++) any_x |= rows[i].extrapolated;
    if (any_x) {
        fprintf(f, "- (fit): a dense row whose one-layer cache at this context exceeds the\n"
                   "  --budget-mib %.0f MiB was measured at two depths and extrapolated affinely\n"
                   "  (dense attention's work is exactly affine in the context):\n",
                o->budget_mib);
        for (size_t i = 0; i < n; i++)
            if (rows[i].extrapolated)
                fprintf(f, "  %s at %s and %s tokens.\n", rows[i].g->model,
                        grp((double)rows[i].depth_lo, a, sizeof a),
                        grp((double)rows[i].depth_hi, b, sizeof b));
        fprintf(f, "  DeepSeek-LLM's max_position_embeddings is 4,096 and V3's published context is\n"
                   "  128K: at longer contexts those rows are what the structure would cost, not a\n"
                   "  supported mode.\n");
    }
    fprintf(f, "- V1-67B / this: DeepSeek-LLM-67B's measured bytes per token over this row's.\n");
}

static void print_csv(FILE *f, const bill_opts *o, const bill_row *rows, size_t n)
{
    double base = o->baseline;
    char d[256];
    fprintf(f, "key,model,structure,first_model,cuts,status,ctx,global_kv_bytes_per_token,"
               "window_bytes,state_bytes,scratch_bytes,ratio_to_v1_67b,attended_per_layer,index_keys_scored,"
               "attn_flops_per_token,attn_bytes_per_token,extrapolated,global_kv_bytes_at_ctx\n");
    for (size_t i = 0; i < n; i++) {
        const bill_row *r = &rows[i];
        fprintf(f, "%s,%s,%s,\"%s\",\"%s\",%s,%ld,", r->g->key, r->g->model, r->g->structure,
                r->g->first, r->g->cuts, r->status, o->ctx);
        if (!has_kv(r)) { fprintf(f, ",,,,,,,,,,\n"); continue; }
        fprintf(f, "%.4f,%zu,%zu,%zu,%.4f,\"%s\",%.0f,", r->kv.global_bytes_per_token,
                r->kv.window_bytes, r->kv.state_bytes, r->kv.scratch_bytes,
                base / r->kv.global_bytes_per_token,
                attended_str(r, d, sizeof d), r->scored_total);
        if (!strcmp(r->status, "measured"))
            fprintf(f, "%.0f,%.0f,%d,", r->flops, r->bytes, r->extrapolated);
        else
            fprintf(f, ",,,");
        fprintf(f, "%.0f\n", r->kv.global_bytes_per_token * (double)o->ctx);
    }
}

static void print_json(FILE *f, const bill_opts *o, const bill_row *rows, size_t n)
{
    double base = o->baseline;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddNumberToObject(root, "ctx", (double)o->ctx);
    cJSON_AddStringToObject(root, "isa", dsattn_ctx_isa_name(o->dctx));
    cJSON_AddStringToObject(root, "version", dsattn_version());
    cJSON_AddItemToObject(root, "rows", arr);
    for (size_t i = 0; i < n; i++) {
        const bill_row *r = &rows[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "key", r->g->key);
        cJSON_AddStringToObject(j, "model", r->g->model);
        cJSON_AddStringToObject(j, "structure", r->g->structure);
        cJSON_AddStringToObject(j, "first_model", r->g->first);
        cJSON_AddStringToObject(j, "cuts", r->g->cuts);
        cJSON_AddStringToObject(j, "config", r->g->config);
        cJSON_AddStringToObject(j, "status", r->status);
        if (r->err[0]) cJSON_AddStringToObject(j, "error", r->err);
        if (has_kv(r)) {
            cJSON_AddNumberToObject(j, "layers", r->n_layers);
            cJSON_AddNumberToObject(j, "global_kv_bytes_per_token", r->kv.global_bytes_per_token);
            cJSON_AddNumberToObject(j, "global_kv_bytes_allocated", (double)r->kv.global_bytes_allocated);
            cJSON_AddNumberToObject(j, "window_bytes", (double)r->kv.window_bytes);
            cJSON_AddNumberToObject(j, "state_bytes", (double)r->kv.state_bytes);
            cJSON_AddNumberToObject(j, "scratch_bytes", (double)r->kv.scratch_bytes);
            cJSON_AddNumberToObject(j, "ratio_to_v1_67b", base / r->kv.global_bytes_per_token);
            cJSON_AddNumberToObject(j, "global_kv_bytes_at_ctx", r->kv.global_bytes_per_token * (double)o->ctx);
            cJSON_AddNumberToObject(j, "index_keys_scored", r->scored_total);
            cJSON *ks = cJSON_CreateArray();
            for (int k = 0; k < r->k.n; k++) {
                cJSON *kk = cJSON_CreateObject();
                cJSON_AddStringToObject(kk, "kind", r->k.name[k]);
                cJSON_AddNumberToObject(kk, "layers", r->k.count[k]);
                cJSON_AddNumberToObject(kk, "attended", r->k.attended[k]);
                cJSON_AddNumberToObject(kk, "index_keys_scored", r->k.scored[k]);
                if (!strcmp(r->status, "measured")) {
                    cJSON_AddNumberToObject(kk, "flops", r->k.flops[k]);
                    cJSON_AddNumberToObject(kk, "bytes_read", r->k.bytes[k]);
                    if (r->k.width[k] >= 0) cJSON_AddNumberToObject(kk, "topk_width", (double)r->k.width[k]);
                }
                cJSON_AddItemToArray(ks, kk);
            }
            cJSON_AddItemToObject(j, "kinds", ks);
            if (!strcmp(r->status, "measured")) {
                cJSON_AddNumberToObject(j, "attn_flops_per_token", r->flops);
                cJSON_AddNumberToObject(j, "attn_bytes_per_token", r->bytes);
                cJSON_AddBoolToObject(j, "extrapolated", r->extrapolated);
                cJSON_AddNumberToObject(j, "depth_lo", (double)r->depth_lo);
                cJSON_AddNumberToObject(j, "depth_hi", (double)r->depth_hi);
                cJSON_AddStringToObject(j, "weights", r->weights ? r->weights : "");
            }
            cJSON_AddNumberToObject(j, "seconds", r->seconds);
        }
        cJSON_AddItemToArray(arr, j);
    }
    char *t = cJSON_Print(root);
    if (t) fprintf(f, "%s\n", t);
    free(t);
    cJSON_Delete(root);
}

/* A log-scale horizontal bar chart of global KV bytes per token, written by
 * hand: one bar per row with a KV bill, the axis spanning the decades the
 * values need, each bar labelled with its bytes and its ratio to V1-67B. */
static int write_svg(const char *path, double base, const bill_row *rows, size_t n)
{
    int nb = 0;
    double vmin = INFINITY, vmax = 0;
    for (size_t i = 0; i < n; i++)
        if (has_kv(&rows[i])) {
            nb++;
            vmin = fmin(vmin, rows[i].kv.global_bytes_per_token);
            vmax = fmax(vmax, rows[i].kv.global_bytes_per_token);
        }
    if (nb == 0) return -1;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const double x0 = 300, x1 = 800;
    double lo = floor(log10(vmin)) - (vmin > 0 && log10(vmin) == floor(log10(vmin))),
           hi = ceil(log10(vmax));
    if (hi <= lo) hi = lo + 1;
    const int top = 64, bar = 26, gap = 12, W = 960;
    const int yb = top + nb * (bar + gap), H = yb + 56;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"20\" y=\"28\" font-size=\"18\" font-weight=\"bold\">Global KV "
               "cache bytes per token, measured (log scale)</text>\n");
    fprintf(f, "<text x=\"20\" y=\"48\" font-size=\"12\" fill=\"#555\">dsattn bill: live "
               "allocations of each published config, all layers; sliding windows and "
               "compressor state excluded</text>\n");
    const char *unit[] = { "B", "kB", "MB", "GB" };
    for (int e = (int)lo; e <= (int)hi; e++) {
        double x = x0 + (x1 - x0) * ((double)e - lo) / (hi - lo);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ccc\"/>\n", x,
                top - 6, x, yb);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\" "
                   "fill=\"#333\">%d %s</text>\n", x, yb + 16,
                e < 0 ? 1 : (int)pow(10, e % 3), unit[e < 0 ? 0 : DSATTN_BILL_MIN(e / 3, 3)]);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">bytes per "
               "token (log10)</text>\n", (x0 + x1) / 2, yb + 36);
    const char *col[] = { "#8c564b", "#d62728", "#ff7f0e", "#bcbd22", "#2ca02c", "#17becf",
                          "#1f77b4" };
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const bill_row *r = &rows[i];
        if (!has_kv(r)) continue;
        double v = r->kv.global_bytes_per_token;
        double w = (x1 - x0) * (log10(v) - lo) / (hi - lo);
        int y = top + k * (bar + gap);
        char val[48], ratio[48] = "";
        if (base > 0 && base / v >= 1.5) snprintf(ratio, sizeof ratio, "  (1/%.0f of V1-67B)", base / v);
        fprintf(f, "<text x=\"%.0f\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">%s "
                   "(%s)</text>\n", x0 - 10, y + bar / 2 + 5, r->g->model, r->g->structure);
        fprintf(f, "<rect x=\"%.0f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", x0,
                y, w, bar, col[k % 7]);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" fill=\"#000\">%s B%s</text>\n",
                x0 + w + 6, y + bar / 2 + 5, bpt(v, val, sizeof val), ratio);
        k++;
    }
    fprintf(f, "</svg>\n");
    return fclose(f) ? -1 : 0;
}

/* ==== The command ======================================================= */

static void bill_usage(FILE *f)
{
    fprintf(f,
        "usage: dsattn bill [options]\n\n"
        "One row per DeepSeek attention generation at its published configuration:\n"
        "global KV bytes per token measured from live allocations, the bounded\n"
        "per-sequence state, the ratio to DeepSeek-LLM-67B, entries each query reads,\n"
        "and attention FLOPs / bytes per decoded token counted by the kernels during a\n"
        "real decode step at --ctx tokens (synthetic caches).  docs/bill.md explains\n"
        "every column.\n\n"
        "options:\n"
        "  --ctx N              context length (K/M suffixes = 2^10/2^20; default 1M)\n"
        "  --format md|csv|json output format (default md)\n"
        "  --svg FILE           also write a log-scale bar chart of bytes per token\n"
        "  --kv-only            only the KV bill (no decode step; seconds, not minutes)\n"
        "  --only KEYS          comma-separated rows: v1-7b,v1-67b,v3,v3.2,v4-flash,\n"
        "                       v4-pro,v4.1-flash\n"
        "  --budget-mib N       one-layer cache allowed for a direct dense measurement\n"
        "                       (default 1024); beyond it two depths + affine fit\n"
        "  --configs DIR        config folder (default: $DSATTN_CONFIGS, else ./configs,\n"
        "                       else next to the build)\n"
        "  --seed N             random weights / synthetic caches (default 1)\n"
        "  --threads N          threads (default: OpenMP's)\n"
        "  --quiet              no progress on stderr\n"
        "  --bench              then a short labelled bench (V4.1 sampler at 64K, one V3\n"
        "                       MLA layer at 32K; markdown only) - what `dsattn` alone runs\n");
}

/* --ctx bound: 2^32 tokens (the bill extrapolates past what it measures). */
#define BILL_MAX_CTX (1ll << 32)

static int wanted(const char *only, const char *key)
{
    if (!only) return 1;
    size_t k = strlen(key);
    for (const char *p = only; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == k && !strncmp(p, key, k)) return 1;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

DSATTN_CMD(bill, 10, "the bill of every generation: KV bytes/token, FLOPs and bytes per token at 1M")
static int cmd_bill(int argc, char **argv)
{
    bill_opts o = { 1048576, 0, 1, 1024.0, NULL, NULL, 0, NULL, 0.0 };
    const char *fmt = "md", *svg = NULL, *only = NULL;
    int threads = 0, bench = 0, rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { bill_usage(stdout); return 0; }
        if (!strcmp(a, "--kv-only")) { o.kv_only = 1; continue; }
        if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
        if (!strcmp(a, "--bench")) { bench = 1; continue; }
        if (!v) { fprintf(stderr, "dsattn bill: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--ctx")) {
            long long x;
            if ((rc = dsattn_cli_int("bill", a, v, 2, BILL_MAX_CTX, DSATTN_CLI_SUFFIX, &x)))
                return rc;
            o.ctx = (long)x;
        } else if (!strcmp(a, "--format")) fmt = v;
        else if (!strcmp(a, "--svg")) svg = v;
        else if (!strcmp(a, "--only")) only = v;
        else if (!strcmp(a, "--budget-mib")) {
            if ((rc = dsattn_cli_double("bill", a, v, 1, 16777216, &o.budget_mib))) return rc;
        } else if (!strcmp(a, "--configs")) o.configs = v;
        else if (!strcmp(a, "--seed")) {
            if ((rc = dsattn_cli_u64("bill", a, v, &o.seed))) return rc;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = dsattn_cli_i32("bill", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &threads)))
                return rc;
        }
        else { fprintf(stderr, "dsattn bill: unknown option %s\n", a); bill_usage(stderr); return 2; }
    }
    if (o.ctx < 2 || o.budget_mib <= 0 ||
        (strcmp(fmt, "md") && strcmp(fmt, "csv") && strcmp(fmt, "json"))) {
        bill_usage(stderr);
        return 2;
    }
    if (!o.configs) o.configs = dsattn_cli_configs_dir();
    char tmpl[1024];
    int tw = snprintf(tmpl, sizeof tmpl, "%s/dsattn_bill_XXXXXX", dsattn_cli_tmp_root());
    o.tmpdir = tw > 0 && (size_t)tw < sizeof tmpl ? mkdtemp(tmpl) : NULL;
    if (!o.tmpdir) { fprintf(stderr, "dsattn bill: cannot create a temporary folder\n"); return 1; }
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.n_threads = threads;
    if (dsattn_ctx_create(&o.dctx, &p)) {
        fprintf(stderr, "dsattn bill: cannot create a context\n");
        rmdir(o.tmpdir);
        return 1;
    }
    /* the ratio column's denominator, measured like every row */
    for (size_t i = 0; i < N_GENS; i++)
        if (!strcmp(GENS[i].key, BASELINE_KEY)) {
            char path[1100], e[256];
            dsattn_kv_bill b;
            snprintf(path, sizeof path, "%s/%s", o.configs, GENS[i].config);
            if (kv_mha(path, 1, &b, e, sizeof e) == DSATTN_OK) o.baseline = b.global_bytes_per_token;
        }
    bill_row rows[N_GENS];
    size_t n = 0;
    int failed = 0;
    double t0 = now_s();
    for (size_t i = 0; i < N_GENS; i++) {
        if (!wanted(only, GENS[i].key)) continue;
        if (!o.quiet) {
            fprintf(stderr, "dsattn bill: %-20s ...", GENS[i].model);
            fflush(stderr);
        }
        measure_row(&o, &GENS[i], &rows[n]);
        if (!o.quiet)
            fprintf(stderr, " %s (%.1f s)%s%s\n", rows[n].status, rows[n].seconds,
                    rows[n].err[0] ? " " : "", rows[n].err);
        failed |= !strcmp(rows[n].status, "error");
        n++;
    }
    if (!o.quiet)
        fprintf(stderr, "dsattn bill: %zu rows in %.1f s (isa %s, %d threads)\n", n,
                now_s() - t0, dsattn_ctx_isa_name(o.dctx), dsattn_ctx_threads(o.dctx));
    if (!strcmp(fmt, "csv")) print_csv(stdout, &o, rows, n);
    else if (!strcmp(fmt, "json")) print_json(stdout, &o, rows, n);
    else print_md(stdout, &o, rows, n);
    if (svg && write_svg(svg, o.baseline, rows, n)) {
        fprintf(stderr, "dsattn bill: cannot write %s\n", svg);
        failed = 1;
    }
    dsattn_ctx_destroy(o.dctx);
    rmdir(o.tmpdir);
    /* --bench (what `dsattn` alone passes): a short, labelled speed check
     * after the bill, markdown only; the bill's own format is unchanged. */
    if (bench && !strcmp(fmt, "md")) {
        fflush(stdout);
        printf("\n");
        failed |= dsattn_bench_short(o.configs, threads) != 0;
    }
    return failed ? 1 : 0;
}
