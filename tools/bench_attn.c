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
 * --weights PATH times layer 0 of a checkpoint (dsattn_mha_load: HF Llama
 * names, its config.json unless --config) instead of the random 7B / 67B
 * layers.  Deliberately not here: targets enforced as failures (they are
 * reported).
 */
#include "bench_util.h"
#include "cli_num.h"
#include "cli_util.h"
#include "dsattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dsattn_status verify_step(dsattn_ctx *ctx, const void *m, int64_t depth, uint64_t seed,
                                 const float *x, float *out)
{
    dsattn_mha_seq *s = NULL;
    dsattn_status st = dsattn_mha_seq_create_layers(&s, m, (size_t)depth + 1, 0, 1);
    if (!st) st = dsattn_mha_seq_fill_synthetic(s, depth, seed);
    if (!st) st = dsattn_mha_attn_forward(ctx, s, 0, x, 1, out);
    dsattn_mha_seq_destroy(s);
    return st;
}

/* fast vs reference on one synthetic cache: rel L2 <= 4e-3 (test_mha's
 * bound).  Returns 0 if they agree. */
static int verify(const dsattn_mha *m, uint64_t seed)
{
    double rel = -1, cs = -1;
    return dsattn_bench_verify(verify_step, m, (size_t)dsattn_mha_dim(m), 2048, seed, seed, &rel,
                               &cs) || !(rel <= 4e-3);
}

typedef struct {
    dsattn_mha_seq *const *s;   /* B sequences                                 */
    size_t          n;
    const float    *x;          /* [B, dim]                                    */
    float          *y;
} mha_step_arg;

/* One decode step at a fixed position (the new token's K/V row is
 * rewritten each time; the cache depth stays as filled): the one-sequence
 * forward for B = 1, else the batched call over the B sequences. */
static dsattn_status mha_step(dsattn_ctx *ctx, void *p)
{
    mha_step_arg *a = p;
    return a->n == 1 ? dsattn_mha_attn_forward(ctx, a->s[0], 0, a->x, 1, a->y)
                     : dsattn_mha_attn_forward_batch(ctx, a->s, a->n, 0, a->x, a->y, NULL);
}

/* Verify, then time one model's layer 0 at every depth, thread count and
 * rep count of o; rows labelled model / variant.  Returns nonzero if any
 * case failed. */
static int time_layer(dsattn_bench_table *t, const dsattn_mha *m, const char *model,
                       const char *variant, const char *what, const dsattn_bench_opts *o,
                       int *done, int total, double t_start)
{
    if (verify(m, o->seed)) {
        fprintf(stderr, "bench mha: %s: fast path disagrees with reference; not timing\n", what);
        return 1;
    }
    int rc = 0;
    const uint64_t seed = o->seed;
    const size_t dim = (size_t)dsattn_mha_dim(m);
    static const long long one[1] = { 1 };
    const long long *bl = o->nb > 0 ? o->batch : one;
    const int nb = o->nb > 0 ? o->nb : 1;
    size_t maxb = 1;
    for (int i = 0; i < nb; i++) maxb = (size_t)bl[i] > maxb ? (size_t)bl[i] : maxb;
    float *x = dsattn_cli_rand_bf16(maxb * dim, seed + 1, 3), *y = calloc(maxb * dim, sizeof(float));
    dsattn_mha_seq **s = calloc(maxb, sizeof *s);
    if (!x || !y || !s) rc = 1;
    for (int di = 0; di < o->nd && x && y && s; di++) {
        const long long depth = o->depth[di];
        /* each sequence filled to the depth with its own rows */
        size_t made = 0;
        for (; made < maxb; made++)
            if (dsattn_mha_seq_create_layers(&s[made], m, (size_t)depth + 1, 0, 1) ||
                dsattn_mha_seq_fill_synthetic(s[made], depth,
                                              seed + (uint64_t)di + 7919 * (uint64_t)made)) {
                dsattn_mha_seq_destroy(s[made]);
                break;
            }
        if (made < maxb) {
            fprintf(stderr, "bench mha: cannot hold %zu sequence(s) at depth %lld\n", maxb, depth);
            for (size_t i = 0; i < made; i++) dsattn_mha_seq_destroy(s[i]);
            rc = 1;
            continue;
        }
        dsattn_kv_bill kb = { 0 };
        dsattn_mha_seq_kv_bill(s[0], &kb);
        for (int ti = 0; ti < o->nt; ti++)
            for (int ri = 0; ri < o->nr; ri++)
                for (int bi = 0; bi < nb; bi++) {
                    const size_t B = (size_t)bl[bi];
                    fprintf(stderr, "bench mha: [%d/%d] %s depth %lld, %lld threads%s (%.0f s so "
                                    "far)\n", ++*done, total, what, depth, o->thr[ti],
                            B > 1 ? ", a batch" : "", dsattn_bench_now() - t_start);
                    dsattn_ctx *ctx = NULL;
                    dsattn_ctx_params p = dsattn_ctx_default_params();
                    p.n_threads = (int)o->thr[ti];
                    if (dsattn_ctx_create(&ctx, &p)) { rc = 1; continue; }
                    dsattn_bench_result r;
                    memset(&r, 0, sizeof r);
                    snprintf(r.model, sizeof r.model, "%s", model);
                    snprintf(r.variant, sizeof r.variant, "%s", variant);
                    r.depth = depth;
                    r.kv_bytes = kb.global_bytes_per_token;
                    mha_step_arg a = { s, B, x, y };
                    dsattn_status st = dsattn_bench_time(ctx, mha_step, &a, (int)o->reps[ri], &r);
                    if (st) {
                        fprintf(stderr, "bench mha: %s\n", dsattn_status_str(st));
                        rc = 1;
                    } else {
                        if (t->n_extra == 2) {   /* --batch: B, the aggregate tokens/s */
                            snprintf(r.extra[0], sizeof r.extra[0], "%zu", B);
                            snprintf(r.extra[1], sizeof r.extra[1], "%.1f",
                                     r.ms_mean > 0 ? 1e3 * (double)B / r.ms_mean : 0.0);
                        }
                        dsattn_bench_row(t, &r);
                    }
                    dsattn_ctx_destroy(ctx);
                }
        for (size_t i = 0; i < maxb; i++) dsattn_mha_seq_destroy(s[i]);
    }
    free(s);
    free(x);
    free(y);
    return rc;
}

int dsattn_bench_mha(int argc, char **argv)
{
    static const char usage[] =
        "usage: dsattn bench mha [--model 7b,67b] [--depth 16K,64K,128K] [--threads 1,2]\n"
        "                        [--reps 3] [--configs DIR] [--seed S] [--format md|csv|json]\n"
        "                        [--weights PATH (a checkpoint's layer 0 instead of --model's\n"
        "                         random layers; its config.json unless --config PATH)]\n"
        "                        [--batch 1,8]\n"
        "One MHA (DeepSeek-LLM-7B) / GQA (67B) layer at real dims decoding one token\n"
        "over a synthetically filled bf16 cache; GB/s vs the DRAM read bandwidth.\n"
        "--batch B decodes one token for each of B sequences (each filled to the depth)\n"
        "in one batched call: ms/token is the step, tok/s the aggregate.\n"
        "Every list is cross-multiplied; one warm-up step, then reps timed steps.\n";
    static const char all_models[] = "7b,67b";
    dsattn_bench_opts o = { getenv("DSATTN_CONFIGS") ? getenv("DSATTN_CONFIGS") : "configs",
                            DSATTN_BENCH_MD, all_models, { 16384, 65536, 131072 }, { 1, 2 },
                            { 3 }, 3, 2, 1, 1, 0, { 1 }, 0, NULL, NULL };
    int pr = dsattn_bench_parse_opts("mha", argc, argv, &o, usage);
    if (pr) return pr == 1 ? 0 : pr;
    if (o.weights && o.models != all_models) {
        fprintf(stderr, "bench mha: --model and --weights: one or the other (the checkpoint is "
                        "the model)\n");
        return 2;
    }
    const char *names[2] = { "7b", "67b" };
    int nm = o.weights ? 1
                       : dsattn_bench_in_list(o.models, names[0]) +
                             dsattn_bench_in_list(o.models, names[1]);
    if (!nm) { fprintf(stderr, "bench mha: --model takes 7b, 67b\n"); return 2; }
    /* a checkpoint is opened (and refused) before anything is printed */
    dsattn_mha *cm = NULL;
    if (o.weights) {
        char err[512] = "";
        const double t0 = dsattn_bench_now();
        if (dsattn_mha_load(&cm, o.config, o.weights, err, sizeof err)) {
            fprintf(stderr, "bench mha: %s\n", err);
            return 1;
        }
        fprintf(stderr, "bench mha: %d layers, %.3f GB of weights mapped from %s in %.1f s; "
                        "timing layer 0\n",
                dsattn_mha_n_layers(cm), (double)dsattn_mha_weight_bytes(cm) / 1e9, o.weights,
                dsattn_bench_now() - t0);
    }
    const char *isa = dsattn_bench_isa_label();
    char title[1024];
    if (o.weights)
        snprintf(title, sizeof title,
                 "Layer 0 of the checkpoint %.400s (weights as stored, bf16 cache; synthetic cache "
                 "fill to each depth) decoding one token; bytes = cache + the layer's weights, "
                 "counted by the kernels. KV B/token = the layer's bill (bf16 K and V of its KV "
                 "heads).", o.weights);
    else
        snprintf(title, sizeof title, "%s",
                 "One attention layer decoding one token at real dims (bf16 weights and cache; "
                 "synthetic cache fill to each depth); bytes = cache + the layer's weights, "
                 "counted by the kernels. KV B/token = the layer's bill (bf16 K and V of its KV "
                 "heads).");
    dsattn_bench_table t = { "mha", title, o.fmt, 0, { NULL }, { NULL }, 0, "", NULL };
    if (o.nb > 0) {             /* --batch: two more columns */
        t.n_extra = 2;
        t.extra[0] = "batch";
        t.extra[1] = "tok/s";
        t.extra_key[0] = "batch";
        t.extra_key[1] = "tok_per_s";
    }
    int nbatch = o.nb > 0 ? o.nb : 1;
    dsattn_bench_begin(&t, isa);
    int rc = 0, done = 0, total = nm * o.nd * o.nt * o.nr * nbatch;
    double t_start = dsattn_bench_now();
    if (cm) {
        char model[48], variant[64];
        snprintf(model, sizeof model, "checkpoint (dim %d)", dsattn_mha_dim(cm));
        snprintf(variant, sizeof variant, "%s %dx%d, bf16 cache",
                 dsattn_mha_n_kv_heads(cm) < dsattn_mha_n_heads(cm) ? "GQA" : "MHA",
                 dsattn_mha_n_heads(cm), dsattn_mha_head_dim(cm));
        rc |= time_layer(&t, cm, model, variant, "checkpoint", &o, &done, total, t_start);
        dsattn_mha_destroy(cm);
    }
    for (int mi = 0; mi < 2 && !o.weights; mi++) {
        if (!dsattn_bench_in_list(o.models, names[mi])) continue;
        char cfg[1024], err[512] = "";
        snprintf(cfg, sizeof cfg, "%s/deepseek-llm-%s.json", o.configs, names[mi]);
        dsattn_mha *m = NULL;
        if (dsattn_mha_create_random_layers(&m, cfg, o.seed, 0, 1, err, sizeof err)) {
            fprintf(stderr, "bench mha: %s\n", err);
            rc = 1;
            continue;
        }
        rc |= time_layer(&t, m, mi ? "DeepSeek-LLM-67B" : "DeepSeek-LLM-7B",
                          mi ? "GQA, bf16 cache" : "MHA, bf16 cache", names[mi], &o, &done, total,
                          t_start);
        dsattn_mha_destroy(m);
    }
    char note[1024];
    dsattn_bench_limits_note(note, sizeof note, o.thr, o.nt, 0);
    dsattn_bench_end(&t, note);
    return rc;
}
