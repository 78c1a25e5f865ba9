/* cmd_run.c - `dsattn run`: any generation's attention stack at the dims of
 * its config.json (model_type picks: llama -> MHA/GQA, deepseek_v3 -> MLA,
 * deepseek_v32 -> MLA + DSA, deepseek_v4 -> CSA/HCA, deepseek_v41 or V4.1
 * keys -> CSA2) on random weights from a seed or on a real checkpoint:
 * prefill N tokens, decode M, and show what happened.
 *
 * Per step: wall time, the kernels' FLOP and byte counters, the KV bytes in
 * use.  V4.1 also shows, per layer, its mode (SWA / Full / Reindex / Reuse)
 * and whose compressed KV, index keys and top-k rows it read, as recorded by
 * the shared runtime; V4 its layer kinds.  At the end: peak RSS.
 *
 * The stack forward is the golden cases' stand-in block (every
 * generation's *_stack_forward; for MHA/GQA the same loop,
 * dsattn_standin_stack, around dsattn_mha_attn_forward): for each layer
 * x = bf16(RMSNorm(h)), attention, h += out.  Deliberately not here: the
 * embedding, MoE/FFN blocks, mHC and the LM head - this is an attention
 * library - so the input at position p is a unit-RMS row that is a pure
 * function of (seed, p), standing in for the token embedding, and nothing
 * is sampled.  --out writes the residual after each decode step
 * (out.{position}, F32 [dim]) as safetensors, so two runs that reach a
 * position by different routes can be compared bit for bit.
 *
 * Sessions (docs/sessions.md): --save FILE writes the sequence after the
 * prefill and the decode steps; --resume FILE loads one (with the same
 * --config, --seed / --weights, which its model hashes check) and decodes
 * --decode M more steps from the saved position, feeding the same inputs
 * an uninterrupted run feeds there.
 *
 * --batch B (every generation) runs B sequences of the same stack side by side,
 * sequence k fed the inputs of seed + k: each is prefilled on its own,
 * then every decode step is ONE batched call (dsattn_*_stack_forward_batch;
 * MHA / GQA: the stand-in loop over dsattn_mha_attn_forward_batch)
 * that decodes a token for each sequence with the weights read once; the
 * table shows the step's time and the tokens per second across the batch.
 *
 * Full-size configs: a stack's random weights are made (a checkpoint's
 * loaded) for every layer unless --layers N asks for the first N; when all
 * of them would not fit in the memory available (measured per layer from a
 * small probe: random weights' bytes, or the memory a checkpoint's load
 * takes - V3's FP8 projections become bf16), the run takes the first layers
 * that fit and says so.  V4.1 always runs all its
 * layers (its layer plan shares caches across layers).
 */
#include "cli.h"
#include "cli_num.h"
#include "bench_util.h"
#include "cli_util.h"
#include "config.h"
#include "dsattn.h"
#include "internal.h"
#include "jsoncfg.h"
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* --prefill / --decode bound: 16M tokens (the caches decide what fits). */
#define RUN_MAX_TOKENS (1ll << 24)

static void run_usage(FILE *f)
{
    fprintf(f,
        "usage: dsattn run [options]\n\n"
        "Runs the attention stack of any generation at its config's dims: prefill N\n"
        "tokens, then decode M one at a time, with random weights from a seed, or a\n"
        "checkpoint with --weights.  config.json's model_type picks the generation\n"
        "(llama: MHA/GQA, deepseek_v3: MLA, deepseek_v32: MLA + DSA, deepseek_v4:\n"
        "CSA/HCA, deepseek_v41: CSA2).  The input at position p is a seeded unit-RMS\n"
        "row, a pure function of (seed, p), standing in for the token embedding (no\n"
        "embedding, FFN or LM head: an attention library).\n\n"
        "options:\n"
        "  --config FILE        config (default: the checkpoint's own config.json with\n"
        "                       --weights, else configs/deepseek-v4.1-flash.json)\n"
        "  --weights PATH       checkpoint: a .safetensors file, a shard index or a folder\n"
        "                       (MHA/GQA, V3/V3.2, V4, V4.1); default random weights\n"
        "  --seed N             random weights and inputs (default 1)\n"
        "  --bf16               random bf16 weights instead of the released FP8\n"
        "                       (MHA/GQA is bf16 as released)\n"
        "  --prefill N          prompt tokens (default 64; K, M suffixes)\n"
        "  --decode M           decode steps (default 8)\n"
        "  --layers N           run the first N layers (default all that fit in memory;\n"
        "                       not V4.1, whose layers share caches)\n"
        "  --save FILE          save the sequence (a session) after the prefill and decode\n"
        "  --resume FILE        continue a saved session: no prefill, --decode M steps from\n"
        "                       its position (same --config and --seed / --weights)\n"
        "  --out FILE           write the residual after each decode step as safetensors:\n"
        "                       out.{position}, F32 [dim]\n"
        "  --mode fast|reference  arithmetic (default fast)\n"
        "  --index-k owner|reference  V4.1 index_k quirk (default owner)\n"
        "  --ced off|exact|bounded  V4.1 prefill: every layer over every token (off,\n"
        "                       default), the decoder over only the rows decode depends\n"
        "                       on (exact: the same bits), or over the last window tokens\n"
        "                       (bounded: approximate); docs/v41.md \"CED prefill\"\n"
        "  --threads N          threads (default: OpenMP's)\n"
        "  --batch B            B sequences (inputs from seeds seed .. seed+B-1),\n"
        "                       each prefilled, then decoded together, one batched call per\n"
        "                       step (default 1)\n");
}

/* The V4.1-Flash config of the configs folder. */
static const char *find_config(void)
{
    static char path[1200];
    snprintf(path, sizeof path, "%s/deepseek-v4.1-flash.json", dsattn_cli_configs_dir());
    return path;
}

/* The config.json a checkpoint brings: beside the file, or in the folder. */
static void config_beside(const char *weights, char *out, size_t n)
{
    struct stat sb;
    if (stat(weights, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(out, n, "%s/config.json", weights);
        return;
    }
    const char *s = strrchr(weights, '/');
    if (s) snprintf(out, n, "%.*s/config.json", (int)(s - weights), weights);
    else snprintf(out, n, "config.json");
}

/* ==== One interface over the four structures ============================ */

typedef enum { GEN_MHA, GEN_MLA, GEN_V4, GEN_V41 } gen_t;

typedef struct {
    gen_t       g;
    int         dsa;                /* MLA: V3.2                           */
    const char *label;
    void       *m, *s;
    int         n_layers;           /* layers run                          */
    int         cfg_layers;         /* layers in the config                */
    int         dim;
    dsattn_v41_ced ced;             /* V4.1: the prefill's CED mode        */
} runner;

static dsattn_status r_stack(runner *r, dsattn_ctx *ctx, float *h, size_t n)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_cli_mha_stack(ctx, r->s, (size_t)r->n_layers, h, n);
    case GEN_MLA: return dsattn_mla_stack_forward(ctx, r->s, h, n, NULL, NULL);
    case GEN_V4:  return dsattn_v4_stack_forward(ctx, r->s, h, n, NULL, NULL);
    default:
        if (r->ced != DSATTN_V41_CED_OFF && dsattn_v41_seq_pos(r->s) == 0)
            return dsattn_v41_stack_prefill(ctx, r->s, h, n, r->ced, NULL);
        return dsattn_v41_stack_forward(ctx, r->s, h, n, NULL, NULL);
    }
}

static int64_t r_pos(const runner *r)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_mha_seq_pos(r->s);
    case GEN_MLA: return dsattn_mla_seq_pos(r->s);
    case GEN_V4:  return dsattn_v4_seq_pos(r->s);
    default:      return dsattn_v41_seq_pos(r->s);
    }
}

static dsattn_status r_bill(const runner *r, dsattn_kv_bill *b)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_mha_seq_kv_bill(r->s, b);
    case GEN_MLA: return dsattn_mla_seq_kv_bill(r->s, b);
    case GEN_V4:  return dsattn_v4_seq_kv_bill(r->s, b);
    default:      return dsattn_v41_seq_kv_bill(r->s, b);
    }
}

static size_t r_weight_bytes(const runner *r)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_mha_weight_bytes(r->m);
    case GEN_MLA: return dsattn_mla_weight_bytes(r->m);
    case GEN_V4:  return dsattn_v4_weight_bytes(r->m);
    default:      return dsattn_v41_weight_bytes(r->m);
    }
}

static void r_destroy(runner *r)
{
    switch (r->g) {
    case GEN_MHA: dsattn_mha_seq_destroy(r->s); dsattn_mha_destroy(r->m); break;
    case GEN_MLA: dsattn_mla_seq_destroy(r->s); dsattn_mla_destroy(r->m); break;
    case GEN_V4:  dsattn_v4_seq_destroy(r->s); dsattn_v4_destroy(r->m); break;
    default:      dsattn_v41_seq_destroy(r->s); dsattn_v41_destroy(r->m); break;
    }
    r->m = r->s = NULL;
}

static dsattn_status r_save(const runner *r, const char *path, char *err, size_t errlen)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_mha_seq_save(r->s, path, err, errlen);
    case GEN_MLA: return dsattn_mla_seq_save(r->s, path, err, errlen);
    case GEN_V4:  return dsattn_v4_seq_save(r->s, path, err, errlen);
    default:      return dsattn_v41_seq_save(r->s, path, err, errlen);
    }
}

/* The sequence from a session file, with room for cap tokens. */
static dsattn_status r_load(runner *r, const char *path, size_t cap, char *err, size_t errlen)
{
    switch (r->g) {
    case GEN_MHA: return dsattn_mha_seq_load((dsattn_mha_seq **)&r->s, r->m, path, cap, err, errlen);
    case GEN_MLA: return dsattn_mla_seq_load((dsattn_mla_seq **)&r->s, r->m, path, cap, err, errlen);
    case GEN_V4:  return dsattn_v4_seq_load((dsattn_v4_seq **)&r->s, r->m, path, cap, err, errlen);
    default:      return dsattn_v41_seq_load((dsattn_v41_seq **)&r->s, r->m, path, cap, err, errlen);
    }
}

/* The generation of a config (as `dsattn trace` dispatches) and its layer
 * count; *root keeps the parsed JSON for the --layers rewrite. */
static dsattn_status detect(const char *path, runner *r, cJSON **root, char *err,
                            size_t errlen)
{
    dsattn_status st = dsattn_jcfg_load(root, path, err, errlen);
    if (st) return st;
    const char *mt = NULL;
    if ((st = dsattn_jcfg_string_opt(*root, "model_type", "", &mt, err, errlen))) return st;
    int64_t L = 0;
    const char *lk = dsattn_jcfg_has(*root, "n_layers") ? "n_layers" : "num_hidden_layers";
    if ((st = dsattn_jcfg_int_opt(*root, lk, 0, &L, err, errlen))) return st;
    r->cfg_layers = r->n_layers = L > 0 && L < (1 << 20) ? (int)L : 0;
    if (!strcmp(mt, "llama")) { r->g = GEN_MHA; r->label = "MHA/GQA"; }
    else if (!strcmp(mt, "deepseek_v3")) { r->g = GEN_MLA; r->label = "V3 MLA"; }
    else if (!strcmp(mt, "deepseek_v32")) { r->g = GEN_MLA; r->dsa = 1; r->label = "V3.2 MLA + DSA"; }
    else if (!strcmp(mt, "deepseek_v4")) { r->g = GEN_V4; r->label = "V4 CSA + HCA"; }
    else if (!strcmp(mt, "deepseek_v41") || (!*mt && dsattn_jcfg_has(*root, "kv_source_layers"))) {
        r->g = GEN_V41;
        r->label = "V4.1 CSA2";
    } else {
        snprintf(err, errlen, "%.300s: unknown model_type '%.64s' (known: llama, deepseek_v3, "
                 "deepseek_v32, deepseek_v4, deepseek_v41)", path, mt);
        return DSATTN_ERR_UNSUPPORTED;
    }
    return DSATTN_OK;
}

/* A copy of the config with only the first n layers, written to tmp (MLA:
 * n_layers; V4: n_layers, no MTP layers, the first n compress ratios). */
static int write_layers_config(const cJSON *root, gen_t g, int n, const char *tmp)
{
    cJSON *j = cJSON_Duplicate(root, 1);
    if (!j) return -1;
    const char *lk = cJSON_HasObjectItem(j, "n_layers") ? "n_layers" : "num_hidden_layers";
    cJSON_ReplaceItemInObjectCaseSensitive(j, lk, cJSON_CreateNumber(n));
    if (g == GEN_V4) {
        cJSON_DeleteItemFromObjectCaseSensitive(j, "n_mtp_layers");
        cJSON_AddNumberToObject(j, "n_mtp_layers", 0);
        cJSON *cr = cJSON_GetObjectItemCaseSensitive(j, "compress_ratios");
        while (cJSON_IsArray(cr) && cJSON_GetArraySize(cr) > n)
            cJSON_DeleteItemFromArray(cr, cJSON_GetArraySize(cr) - 1);
    }
    int rc = dsattn_cli_json_write(j, tmp);
    cJSON_Delete(j);
    return rc;
}

/* The model of r->g with r->n_layers layers from config (or the original
 * config when all layers run). */
static dsattn_status make_model(runner *r, const cJSON *root, const char *config,
                                const char *weights, uint64_t seed, int fp8, char *err,
                                size_t errlen)
{
    char tmp[256] = "";
    const char *cfg = config;
    dsattn_status st;
    if (r->g != GEN_MHA && r->g != GEN_V41 && r->n_layers < r->cfg_layers) {
        if (dsattn_cli_tmp_file(tmp, sizeof tmp, "run-layers", ".json")) {
            snprintf(err, errlen, "cannot create a file in %s", dsattn_cli_tmp_root());
            return DSATTN_ERR_IO;
        }
        if (write_layers_config(root, r->g, r->n_layers, tmp)) {
            snprintf(err, errlen, "cannot write %s", tmp);
            unlink(tmp);
            return DSATTN_ERR_IO;
        }
        cfg = tmp;
    }
    switch (r->g) {
    case GEN_MHA:
        if (weights) {
            st = dsattn_mha_load((dsattn_mha **)&r->m, cfg, weights, err, errlen);
        } else {
            st = dsattn_mha_create_random_layers((dsattn_mha **)&r->m, cfg, seed, 0, r->n_layers,
                                                 err, errlen);
        }
        if (!st) r->dim = dsattn_mha_dim(r->m);
        break;
    case GEN_MLA:
        st = weights ? dsattn_mla_load((dsattn_mla **)&r->m, cfg, weights, err, errlen)
                     : dsattn_mla_create_random((dsattn_mla **)&r->m, cfg, seed, fp8, err, errlen);
        if (!st) r->dim = dsattn_mla_dim(r->m), r->n_layers = dsattn_mla_n_layers(r->m);
        break;
    case GEN_V4:
        st = weights ? dsattn_v4_load((dsattn_v4 **)&r->m, cfg, weights, err, errlen)
                     : dsattn_v4_create_random((dsattn_v4 **)&r->m, cfg, seed, fp8, err, errlen);
        if (!st) r->dim = dsattn_v4_dim(r->m), r->n_layers = dsattn_v4_n_layers(r->m);
        break;
    default:
        st = weights ? dsattn_v41_load((dsattn_v41 **)&r->m, cfg, weights, err, errlen)
                     : dsattn_v41_create_random((dsattn_v41 **)&r->m, cfg, seed, fp8, err, errlen);
        if (!st) r->dim = dsattn_v41_dim(r->m), r->n_layers = dsattn_v41_n_layers(r->m);
        break;
    }
    if (tmp[0]) {
        unlink(tmp);
        /* an error names the file it read: the user's config, not the copy */
        const char *at = st ? strstr(err, tmp) : NULL;
        if (at) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%.*s%s (its first %d layer%s)%s", (int)(at - err), err,
                     config, r->n_layers, r->n_layers == 1 ? "" : "s", at + strlen(tmp));
            snprintf(err, errlen, "%s", msg);
        }
    }
    return st;
}

static dsattn_status make_seq(runner *r, size_t cap, dsattn_v41_index_k ik)
{
    switch (r->g) {
    case GEN_MHA:
        return dsattn_mha_seq_create_layers((dsattn_mha_seq **)&r->s, r->m, cap, 0, r->n_layers);
    case GEN_MLA:
        return dsattn_mla_seq_create((dsattn_mla_seq **)&r->s, r->m, cap,
                                     DSATTN_MLA_CACHE_LATENT_BF16);
    case GEN_V4:
        return dsattn_v4_seq_create((dsattn_v4_seq **)&r->s, r->m, cap, DSATTN_V4_EMPTY_REFERENCE);
    default:
        return dsattn_v41_seq_create((dsattn_v41_seq **)&r->s, r->m, cap, ik);
    }
}

static void seq_destroy(gen_t g, void *s)
{
    switch (g) {
    case GEN_MHA: dsattn_mha_seq_destroy(s); break;
    case GEN_MLA: dsattn_mla_seq_destroy(s); break;
    case GEN_V4:  dsattn_v4_seq_destroy(s); break;
    default:      dsattn_v41_seq_destroy(s); break;
    }
}

/* One batched decode step of the stand-in stack over B sequences. */
static dsattn_status r_stack_batch(runner *r, dsattn_ctx *ctx, void **seqs, void *typed,
                                   size_t B, float *h, size_t *failed)
{
    if (r->g == GEN_MHA) {
        dsattn_mha_seq **t = typed;
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        const size_t dim = (size_t)r->dim;
        float *xio = malloc(2 * B * dim * sizeof(float));   /* the tool's loop: heap */
        if (!xio) return DSATTN_ERR_NOMEM;
        dsattn_status st = dsattn_cli_mha_stack_batch(ctx, t, B, (size_t)r->n_layers, h, xio, failed);
        free(xio);
        return st;
    }
    if (r->g == GEN_MLA) {
        dsattn_mla_seq **t = typed;
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_mla_stack_forward_batch(ctx, t, B, h, NULL, NULL, failed);
    }
    if (r->g == GEN_V4) {
        dsattn_v4_seq **t = typed;
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_v4_stack_forward_batch(ctx, t, B, h, NULL, NULL, failed);
    }
    dsattn_v41_seq **t = typed;
    for (size_t k = 0; k < B; k++) t[k] = seqs[k];
    return dsattn_v41_stack_forward_batch(ctx, t, B, h, NULL, NULL, failed);
}

/* --batch: B sequences, each prefilled with its own inputs (seed + k),
 * then n_decode batched steps.  r->s is the sequence at hand. */
static int run_batch(runner *r, dsattn_ctx *ctx, size_t B, long long n_prefill,
                     long long n_decode, uint64_t seed, dsattn_v41_index_k ik)
{
    const size_t dim = (size_t)r->dim;
    void **seqs = calloc(B, sizeof *seqs), **typed = calloc(B, sizeof *typed);
    size_t hn;
    float *h = NULL;
    int rc = 1;
    dsattn_status st = DSATTN_OK;
    if (!seqs || !typed || !dsattn_mul_size(DSATTN_MAX((size_t)n_prefill, B), dim, &hn) ||
        !(h = malloc(hn * sizeof(float)))) {
        fprintf(stderr, "dsattn run: out of memory for the batch\n");
        goto out;
    }
    printf("| step | sequences | tokens | positions | ms | tok/s | GFLOP | GB read | out RMS |\n");
    printf("|---|---:|---:|---|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < B; k++) {
        r->s = NULL;
        if ((st = make_seq(r, (size_t)(n_prefill + n_decode), ik))) {
            fprintf(stderr, "dsattn run: sequence %zu: %s\n", k, dsattn_status_str(st));
            goto out;
        }
        seqs[k] = r->s;
        for (long long t = 0; t < n_prefill; t++)
            dsattn_cli_input_row(h + (size_t)t * dim, dim, seed + k, t);
        dsattn_ctx_counters_reset(ctx);
        const double ts = dsattn_bench_now();
        if ((st = r_stack(r, ctx, h, (size_t)n_prefill))) {
            fprintf(stderr, "dsattn run: prefill of sequence %zu: %s\n", k, dsattn_status_str(st));
            goto out;
        }
        const double ms = (dsattn_bench_now() - ts) * 1e3;
        const dsattn_counters c = dsattn_ctx_counters(ctx);
        double ss = 0;
        for (size_t i = 0; i < (size_t)n_prefill * dim; i++) ss += (double)h[i] * h[i];
        printf("| prefill seq %zu | 1 | %lld | 0 | %.1f | %.1f | %.2f | %.3f | %.4f |\n", k,
               n_prefill, ms, ms > 0 ? (double)n_prefill * 1e3 / ms : 0, (double)c.flops / 1e9,
               (double)c.bytes_read / 1e9, sqrt(ss / (double)((size_t)n_prefill * dim)));
    }
    r->s = NULL;
    for (long long step = 1; step <= n_decode; step++) {
        for (size_t k = 0; k < B; k++)
            dsattn_cli_input_row(h + k * dim, dim, seed + k, n_prefill + step - 1);
        dsattn_ctx_counters_reset(ctx);
        size_t failed = SIZE_MAX;
        const double ts = dsattn_bench_now();
        st = r_stack_batch(r, ctx, seqs, typed, B, h, &failed);
        const double ms = (dsattn_bench_now() - ts) * 1e3;
        if (st) {
            fprintf(stderr, "dsattn run: batched step %lld: %s (sequence %zu)\n", step,
                    dsattn_status_str(st), failed);
            goto out;
        }
        const dsattn_counters c = dsattn_ctx_counters(ctx);
        double ss = 0;
        for (size_t i = 0; i < B * dim; i++) ss += (double)h[i] * h[i];
        const double rms = sqrt(ss / (double)(B * dim));
        if (!isfinite(rms)) {
            fprintf(stderr, "dsattn run: batched step %lld produced a non-finite residual\n", step);
            goto out;
        }
        printf("| decode %lld | %zu | %zu | %lld | %.1f | %.1f | %.2f | %.3f | %.4f |\n", step, B,
               B, n_prefill + step - 1, ms, ms > 0 ? (double)B * 1e3 / ms : 0,
               (double)c.flops / 1e9, (double)c.bytes_read / 1e9, rms);
    }
    printf("\nEach decode row is one batched call: a token for each of the %zu sequences, the "
           "weights read once (tok/s = sequences / step time).\n", B);
    rc = 0;
out:
    for (size_t k = 0; seqs && k < B; k++) seq_destroy(r->g, seqs[k]);
    r->s = NULL;
    free(seqs);
    free(typed);
    free(h);
    return rc;
}

/* The kB figure of `key` in a /proc file, as bytes, or -1. */
static double proc_kb(const char *path, const char *key)
{
    const double kb = dsattn_file_number(path, key);
    return kb < 0 ? -1 : kb * 1024.0;
}

/* Bytes of memory available (the library's figure, dsattn_mem_available),
 * or 0.  The environment's DSATTN_RUN_MEM_AVAILABLE (bytes) stands in for
 * it here only - the CLI tests' way to see the fit below act without the
 * library refusing allocations. */
static double mem_available(void)
{
    const char *e = getenv("DSATTN_RUN_MEM_AVAILABLE");
    if (e && *e) return strtod(e, NULL);
    const double b = dsattn_mem_available();
    return b > 0 ? b : 0;
}

/* Every layer when its weights fit in 80 % of the available memory, else
 * the first layers that do, measured on a probe of the first min(4, L)
 * layers (V4's first layers hold each layer kind) with a 25 % margin for
 * layers the probe did not see.  Random weights: their bytes.  A
 * checkpoint: the anonymous memory its load took (RssAnon) - the tensors
 * the loader converts (V3's FP8 projections become bf16: ~374 MB a layer);
 * bytes it borrows from the file mapping take none.  Not an MHA
 * checkpoint: its loader binds every layer whatever runs (it borrows its
 * bf16 bytes). */
static dsattn_status fit_layers(runner *r, const cJSON *root, const char *config,
                                const char *weights, uint64_t seed, int fp8, char *err,
                                size_t errlen)
{
    double avail = mem_available();
    if (avail <= 0 || r->g == GEN_V41 || r->cfg_layers <= 4 || (weights && r->g == GEN_MHA))
        return DSATTN_OK;
    runner p = *r;
    p.n_layers = r->g == GEN_V4 ? 4 : 1;
    const double a0 = weights ? proc_kb("/proc/self/status", "RssAnon:") : 0;
    dsattn_status st = make_model(&p, root, config, weights, seed, fp8, err, errlen);
    if (st) return st;
    double bytes = (double)r_weight_bytes(&p);
    if (weights) {
        const double a1 = proc_kb("/proc/self/status", "RssAnon:");
        bytes = a0 >= 0 && a1 > a0 ? a1 - a0 : 0;
    }
    double per_layer = 1.25 * bytes / p.n_layers;
    r_destroy(&p);
    if (per_layer <= 0) return DSATTN_OK;
    double need = per_layer * r->cfg_layers;
    if (need <= 0.8 * avail) return DSATTN_OK;
    int n = (int)(0.8 * avail / per_layer);
    r->n_layers = n < 1 ? 1 : n;
    printf("note: the weights of all %d layers would take ~%.1f GiB, %.1f GiB are available:\n"
           "      running the first %d layers (--layers N to choose)\n", r->cfg_layers,
           need / 1073741824.0, avail / 1073741824.0, r->n_layers);
    return DSATTN_OK;
}

/* ==== Reporting ========================================================== */

static const char *v4_kind_name(dsattn_v4_kind k)
{
    switch (k) {
    case DSATTN_V4_SWA: return "SWA";
    case DSATTN_V4_CSA: return "CSA";
    case DSATTN_V4_HCA: return "HCA";
    default:            return "MTP";
    }
}

/* KV bytes in use: V4.1 from its packed caches (global = compressed KV +
 * index keys; window = ring rows holding tokens so far); the others from
 * the bill (global bytes per token x position; V4's window rings and
 * compressor state are allocated whole, shown as allocated). */
static void kv_in_use(const runner *r, const dsattn_kv_bill *b, double *global, double *window)
{
    *global = *window = 0;
    int64_t pos = r_pos(r);
    if (r->g != GEN_V41) {
        *global = b->global_bytes_per_token * (double)pos;
        *window = (double)b->window_bytes;
        return;
    }
    for (int l = 0; l < r->n_layers; l++) {
        const uint8_t *rows;
        size_t n, rb;
        if (dsattn_v41_seq_cache(r->s, l, 0, &rows, &n, &rb) == DSATTN_OK)
            *window += (double)((size_t)pos < n ? (size_t)pos : n) * (double)rb;
        for (int which = 1; which <= 2; which++)
            if (dsattn_v41_seq_cache(r->s, l, which, &rows, &n, &rb) == DSATTN_OK)
                *global += (double)n * (double)rb;
    }
}

static void layer_table(const runner *r)
{
    if (r->g == GEN_V41) {
        printf("\n| layer | mode | ratio | read compressed KV of | took top-k rows of | "
               "scored index keys of |\n|---:|---|---:|---:|---:|---:|\n");
        for (int l = 0; l < r->n_layers; l++) {
            int src = dsattn_v41_seq_source_read(r->s, l), ir = dsattn_v41_seq_index_read(r->s, l);
            int tk = dsattn_v41_seq_topk_read(r->s, l);
            char a[16] = "-", b[32] = "-", c[16] = "-";
            if (src >= 0) snprintf(a, sizeof a, "%d", src);
            if (tk >= 0) snprintf(b, sizeof b, "%d", tk);
            if (ir >= 0) snprintf(c, sizeof c, "%d", ir);
            printf("| %d | %s | %d | %s | %s | %s |\n", l,
                   dsattn_v41_mode_name(dsattn_v41_layer_mode(r->m, l)), dsattn_v41_layer_ratio(r->m, l),
                   a, b, c);
        }
        printf("The three source columns are what each layer read in the last step, recorded\n"
               "by the shared runtime (dsattn_v41_seq_source_read / _topk_read / _index_read).\n");
    } else if (r->g == GEN_V4) {
        int count[4] = { 0 };
        for (int l = 0; l < r->n_layers; l++) {
            dsattn_v4_kind k = dsattn_v4_layer_kind(r->m, l);
            if (k >= 0 && k < 4) count[k]++;
        }
        printf("\nLayers: %d SWA, %d CSA (ratio 4, indexer top-k), %d HCA (dense compressed).\n",
               count[DSATTN_V4_SWA], count[DSATTN_V4_CSA], count[DSATTN_V4_HCA]);
        for (int l = 0; l < r->n_layers; l++)
            printf("%s%s/%d", l ? " " : "  ", v4_kind_name(dsattn_v4_layer_kind(r->m, l)),
                   dsattn_v4_layer_ratio(r->m, l));
        printf("\n");
    }
}

/* ==== The command ======================================================== */

DSATTN_CMD(run, 30, "run any generation's attention stack: prefill N, decode M, per-step bill")
static int cmd_run(int argc, char **argv)
{
    const char *config = NULL, *weights = NULL, *out_path = NULL;
    const char *save_path = NULL, *resume_path = NULL;
    int prefill_given = 0;
    uint64_t seed = 1;
    int fp8 = 1, threads = 0, rc, layers = 0, n_batch = 1;
    long long n_prefill = 64, n_decode = 8;
    dsattn_mode mode = DSATTN_MODE_FAST;
    dsattn_v41_index_k ik = DSATTN_V41_INDEX_K_OWNER;
    dsattn_v41_ced ced = DSATTN_V41_CED_OFF;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        if (!strcmp(a, "--bf16")) { fp8 = 0; continue; }
        if (!v) { fprintf(stderr, "dsattn run: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--save")) save_path = v;
        else if (!strcmp(a, "--resume")) resume_path = v;
        else if (!strcmp(a, "--seed")) { if ((rc = dsattn_cli_u64("run", a, v, &seed))) return rc; }
        else if (!strcmp(a, "--prefill")) {
            if ((rc = dsattn_cli_int("run", a, v, 1, RUN_MAX_TOKENS, DSATTN_CLI_SUFFIX, &n_prefill)))
                return rc;
            prefill_given = 1;
        } else if (!strcmp(a, "--decode")) {
            if ((rc = dsattn_cli_int("run", a, v, 0, RUN_MAX_TOKENS, DSATTN_CLI_SUFFIX, &n_decode)))
                return rc;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = dsattn_cli_i32("run", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &threads))) return rc;
        } else if (!strcmp(a, "--layers")) {
            if ((rc = dsattn_cli_i32("run", a, v, 1, 1 << 20, 0, &layers))) return rc;
        } else if (!strcmp(a, "--batch")) {
            if ((rc = dsattn_cli_i32("run", a, v, 1, 4096, 0, &n_batch))) return rc;
        }
        else if (!strcmp(a, "--mode") && !strcmp(v, "fast")) mode = DSATTN_MODE_FAST;
        else if (!strcmp(a, "--mode") && !strcmp(v, "reference")) mode = DSATTN_MODE_REFERENCE;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "owner")) ik = DSATTN_V41_INDEX_K_OWNER;
        else if (!strcmp(a, "--index-k") && !strcmp(v, "reference")) ik = DSATTN_V41_INDEX_K_REFERENCE;
        else if (!strcmp(a, "--ced") && !strcmp(v, "off")) ced = DSATTN_V41_CED_OFF;
        else if (!strcmp(a, "--ced") && !strcmp(v, "exact")) ced = DSATTN_V41_CED_EXACT;
        else if (!strcmp(a, "--ced") && !strcmp(v, "bounded")) ced = DSATTN_V41_CED_BOUNDED;
        else { fprintf(stderr, "dsattn run: bad option %s %s\n", a, v); run_usage(stderr); return 2; }
    }
    if (n_batch > 1 && (resume_path || save_path || out_path)) {
        fprintf(stderr, "dsattn run: --batch runs fresh sequences; --resume, --save and --out "
                        "take one\n");
        return 2;
    }
    /* a resumed run starts at the session's position: no prefill */
    dsattn_session_info sess;
    memset(&sess, 0, sizeof sess);
    if (resume_path) {
        char e[1024] = "";
        if (prefill_given) {
            fprintf(stderr, "dsattn run: --resume continues a saved prefill; drop --prefill\n");
            return 2;
        }
        dsattn_status rs = dsattn_session_info_read(resume_path, &sess, e, sizeof e);
        if (rs) {
            fprintf(stderr, "dsattn run: --resume: %s (%s)\n", e, dsattn_status_str(rs));
            return 1;
        }
        if (sess.pos < 1 || sess.pos > RUN_MAX_TOKENS) {
            fprintf(stderr, "dsattn run: --resume %s: position %lld out of range\n", resume_path,
                    (long long)sess.pos);
            return 1;
        }
        n_prefill = sess.pos;
    }
    /* a checkpoint brings its own config.json unless --config says otherwise */
    char beside[4200];
    const char *cfg_show = config;
    if (!config && !weights) config = cfg_show = find_config();
    if (!config) {
        config_beside(weights, beside, sizeof beside);
        cfg_show = beside;
    }

    char err[1024] = "", b1[48], b2[48], b3[48];
    runner r;
    memset(&r, 0, sizeof r);
    cJSON *root = NULL;
    dsattn_st_writer *w = NULL;
    dsattn_ctx *ctx = NULL;
    float *h = NULL, *outs = NULL;
    rc = 1;
    dsattn_status st = detect(cfg_show, &r, &root, err, sizeof err);
    if (st) {
        fprintf(stderr, "dsattn run: %s (%s)\n", err[0] ? err : "cannot read the config",
                dsattn_status_str(st));
        cJSON_Delete(root);
        return 1;
    }
    if (layers) {
        if (r.g == GEN_V41 && layers != r.cfg_layers) {
            fprintf(stderr, "dsattn run: --layers: V4.1 runs all %d layers (its layer plan "
                            "shares caches across layers)\n", r.cfg_layers);
            cJSON_Delete(root);
            return 2;
        }
        if (layers > r.cfg_layers) {
            fprintf(stderr, "dsattn run: --layers %d: the config has %d layers\n", layers,
                    r.cfg_layers);
            cJSON_Delete(root);
            return 2;
        }
        r.n_layers = layers;
    }

    if (ced != DSATTN_V41_CED_OFF && (r.g != GEN_V41 || resume_path)) {
        fprintf(stderr, "dsattn run: --ced is a V4.1 prefill option (%s)\n",
                resume_path ? "a resumed run has no prefill" : "this config is not V4.1");
        cJSON_Delete(root);
        return 2;
    }
    r.ced = ced;
    if (n_batch > 1 && ced != DSATTN_V41_CED_OFF) {
        fprintf(stderr, "dsattn run: --batch decodes fresh sequences prefilled in full; --ced "
                        "takes one sequence\n");
        cJSON_Delete(root);
        return 2;
    }
    if (resume_path && r.g == GEN_V41 && sess.generation == DSATTN_SESSION_V41)
        ik = sess.variant[0] ? DSATTN_V41_INDEX_K_REFERENCE : DSATTN_V41_INDEX_K_OWNER;
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    p.n_threads = threads;
    if ((st = dsattn_ctx_create(&ctx, &p))) {
        fprintf(stderr, "dsattn run: context: %s\n", dsattn_status_str(st));
        goto out;
    }

    double t0 = dsattn_bench_now();
    if (!layers) st = fit_layers(&r, root, config, weights, seed, fp8, err, sizeof err);
    /* The weights hook: a real checkpoint goes through the checkpoint
     * loader (file, shard index or folder); otherwise random weights at
     * the config's dims. */
    if (!st) st = make_model(&r, root, config, weights, seed, fp8, err, sizeof err);
    if (st) {
        fprintf(stderr, "dsattn run: %s (%s)\n", err[0] ? err : "cannot make the model",
                dsattn_status_str(st));
        goto out;
    }
    const size_t dim = (size_t)r.dim;
    const char *wfmt = weights ? "as stored" : (r.g == GEN_MHA || !fp8) ? "bf16, seed"
                     : "FP8 E4M3, seed";
    printf("dsattn run: %s attention stack from %s\n", r.label, cfg_show);
    printf("  %d of %d layers, dim %zu, weights %s (%.2f GiB, %s), made in %.1f s\n",
           r.n_layers, r.cfg_layers, dim, weights ? weights : "random",
           (double)r_weight_bytes(&r) / 1073741824.0, wfmt, dsattn_bench_now() - t0);
    printf("  isa %s, %d threads, %s mode%s%s\n", dsattn_ctx_isa_name(ctx),
           dsattn_ctx_threads(ctx), mode == DSATTN_MODE_FAST ? "fast" : "reference",
           r.g == GEN_V41 ? ", index_k " : "",
           r.g != GEN_V41 ? "" : ik == DSATTN_V41_INDEX_K_OWNER ? "owner" : "reference");
    printf("  inputs: seeded unit-RMS rows, a function of (seed, position), standing in for "
           "token embeddings\n");
    if (n_batch > 1) {
        printf("  batch: %d sequences, inputs from seeds %llu .. %llu\n\n", n_batch,
               (unsigned long long)seed, (unsigned long long)(seed + (uint64_t)n_batch - 1));
        rc = run_batch(&r, ctx, (size_t)n_batch, n_prefill, n_decode, seed, ik);
        if (!rc) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            printf("Peak RSS: %.2f GiB\n", (double)ru.ru_maxrss / 1048576.0);
        }
        goto out;
    }
    if (r.g == GEN_V41 && !resume_path) {
        static const char *const ced_name[] = { "off", "exact", "bounded" };
        uint64_t in_rows = 0, full_rows = 0;
        if (!dsattn_v41_ced_work(r.m, (size_t)n_prefill, ced, &in_rows, NULL) &&
            !dsattn_v41_ced_work(r.m, (size_t)n_prefill, DSATTN_V41_CED_OFF, &full_rows, NULL))
            printf("  prefill: ced %s, %llu of %llu layer-rows\n", ced_name[ced],
                   (unsigned long long)in_rows, (unsigned long long)full_rows);
    }
    if (resume_path) {
        t0 = dsattn_bench_now();
        if ((st = r_load(&r, resume_path, (size_t)(n_prefill + n_decode), err, sizeof err))) {
            fprintf(stderr, "dsattn run: --resume: %s (%s)\n", err, dsattn_status_str(st));
            goto out;
        }
        printf("  resumed %s at position %lld (%.1f MB, loaded in %.3f s)\n", resume_path,
               (long long)r_pos(&r), (double)sess.file_bytes / 1e6, dsattn_bench_now() - t0);
    } else if ((st = make_seq(&r, (size_t)(n_prefill + n_decode), ik))) {
        fprintf(stderr, "dsattn run: sequence: %s\n", dsattn_status_str(st));
        goto out;
    }
    printf("\n");
    size_t hn, on = 0;
    if (!dsattn_mul_size(resume_path ? 1 : (size_t)n_prefill, dim, &hn) ||
        (out_path && !dsattn_mul_size((size_t)n_decode, dim, &on)) ||
        !(h = malloc(hn * sizeof(float))) || (on && !(outs = malloc(on * sizeof(float))))) {
        fprintf(stderr, "dsattn run: out of memory for the inputs\n");
        goto out;
    }
    dsattn_kv_bill bill;
    memset(&bill, 0, sizeof bill);
    r_bill(&r, &bill);

    printf("| step | tokens | position | ms | GFLOP | GB read | global KV in use | window in use | out RMS |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (long long step = resume_path ? 1 : 0; step <= n_decode; step++) {
        size_t n = step == 0 ? (size_t)n_prefill : 1;
        int64_t pos0 = r_pos(&r);
        for (size_t t = 0; t < n; t++)
            dsattn_cli_input_row(h + t * dim, dim, seed, pos0 + (int64_t)t);
        dsattn_ctx_counters_reset(ctx);
        double ts = dsattn_bench_now();
        st = r_stack(&r, ctx, h, n);
        double ms = (dsattn_bench_now() - ts) * 1e3;
        if (st) {
            fprintf(stderr, "dsattn run: step %lld: %s%s\n", step, dsattn_status_str(st),
                    step == 0 && st == DSATTN_ERR_NOMEM
                        ? " (a prefill's scratch grows with the prompt - about "
                          "0.1 MB a token at V4.1-Flash widths - and is taken in one call: "
                          "use a shorter --prefill)"
                        : "");
            goto out;
        }
        dsattn_counters c = dsattn_ctx_counters(ctx);
        double ss = 0, g, wu;
        /* a CED prefill leaves only the last row as the stack's output */
        const size_t r0 = step == 0 && r.ced != DSATTN_V41_CED_OFF ? n - 1 : 0;
        for (size_t i = r0 * dim; i < n * dim; i++) ss += (double)h[i] * h[i];
        double rms = sqrt(ss / (double)((n - r0) * dim));
        if (!isfinite(rms)) {
            fprintf(stderr, "dsattn run: step %lld produced a non-finite residual\n", step);
            goto out;
        }
        if (outs && step > 0) memcpy(outs + (size_t)(step - 1) * dim, h, dim * sizeof(float));
        kv_in_use(&r, &bill, &g, &wu);
        char nm[32];
        if (step == 0) snprintf(nm, sizeof nm, "prefill");
        else snprintf(nm, sizeof nm, "decode %lld", step);
        printf("| %s | %zu | %lld | %.1f | %.2f | %.3f | %s | %s | %.4f |\n", nm, n,
               (long long)pos0, ms, (double)c.flops / 1e9, (double)c.bytes_read / 1e9,
               dsattn_cli_mib(g, b1, sizeof b1), r.g == GEN_MHA || r.g == GEN_MLA ? "-" : dsattn_cli_mib(wu, b2, sizeof b2),
               rms);
    }
    layer_table(&r);

    if (save_path) {
        t0 = dsattn_bench_now();
        if ((st = r_save(&r, save_path, err, sizeof err))) {
            fprintf(stderr, "dsattn run: --save: %s (%s)\n", err, dsattn_status_str(st));
            goto out;
        }
        struct stat sb;
        printf("\nSaved the session at position %lld to %s (%.1f MB, %.3f s).\n",
               (long long)r_pos(&r), save_path,
               stat(save_path, &sb) == 0 ? (double)sb.st_size / 1e6 : 0.0, dsattn_bench_now() - t0);
    }

    if (out_path) {
        w = dsattn_st_writer_create();
        if (!w) { st = DSATTN_ERR_NOMEM; goto werr; }
        char sb[32];
        snprintf(sb, sizeof sb, "%llu", (unsigned long long)seed);
        dsattn_st_writer_meta(w, "producer", "dsattn run");
        dsattn_st_writer_meta(w, "generation", r.label);
        dsattn_st_writer_meta(w, "seed", sb);
        dsattn_st_writer_meta(w, "mode", mode == DSATTN_MODE_FAST ? "fast" : "reference");
        int64_t shape[1] = { (int64_t)dim };
        for (long long k = 0; k < n_decode && !st; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "out.%lld", n_prefill + k);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_F32, 1, shape, outs + (size_t)k * dim);
        }
        if (!st) st = dsattn_st_writer_save(w, out_path, err, sizeof err);
werr:
        if (st) {
            fprintf(stderr, "dsattn run: --out %s: %s (%s)\n", out_path, err[0] ? err : "cannot write",
                    dsattn_status_str(st));
            goto out;
        }
        printf("\nWrote the residual after each of the %lld decode steps to %s (out.{position}).\n",
               n_decode, out_path);
    }

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\nKV allocated for %lld tokens: %s global (%.2f B/token), %s windows, %s compressor "
           "state.\n", n_prefill + n_decode,
           dsattn_cli_mib((double)bill.global_bytes_allocated, b1, sizeof b1), bill.global_bytes_per_token,
           dsattn_cli_mib((double)bill.window_bytes, b2, sizeof b2),
           dsattn_cli_mib((double)bill.state_bytes, b3, sizeof b3));
    if (r.g != GEN_V41)
        printf("Global KV in use = the bill's bytes per token x tokens so far.\n");
    printf("Peak RSS: %.2f GiB\n", (double)ru.ru_maxrss / 1048576.0);
    rc = 0;
out:
    dsattn_st_writer_destroy(w);
    free(outs);
    free(h);
    r_destroy(&r);
    dsattn_ctx_destroy(ctx);
    cJSON_Delete(root);
    return rc;
}
