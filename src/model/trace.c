/* trace.c - `dsattn trace`: the protocol every generation shares, and the
 * one place that tells the generations apart.
 *
 * The protocol: load the case's model, read its input, prefill x[:P] at
 * position 0, then step one token at a time, and write `out`,
 * layer.{i}.attn_in / attn_out, layer.{i}.topk for every layer that selects
 * (V4 adds trace.{i}.topk_order, its picks in the reference's score order)
 * and each layer's caches.  config.json's model_type picks the generation
 * (the table in dsattn_trace_case); the few calls that differ by generation
 * (load, sequence, description, stack, selection, caches) are the if-chains
 * over a trace_seq below, and the cache layouts live beside this file, one
 * file per generation.  The tensor writers both use: trace_tensors.c.
 */
#include "trace.h"

#include "config.h"
#include "internal.h"
#include "jsoncfg.h"
#include "mla.h"
#include "numfmt.h"
#include "safetensors.h"
#include "v4.h"
#include "v41.h"

#include <stdio.h>
#include <stdlib.h>

typedef enum { GEN_MLA, GEN_V4, GEN_V41 } trace_gen;

/* One generation's model and sequence: the pair of that generation is set. */
typedef struct {
    dsattn_mla *mla_m;   dsattn_mla_seq *mla;     /* V3, V3.2 */
    dsattn_v4  *v4_m;    dsattn_v4_seq  *v4;      /* V4       */
    dsattn_v41 *v41_m;   dsattn_v41_seq *v41;     /* V4.1     */
} trace_seq;

/* What the output says about the model run. */
typedef struct {
    size_t      n_layers, dim;
    size_t      index_topk;   /* 0: nothing selects                           */
    int         score_order;  /* V4: topk is the set sorted, plus topk_order  */
    const char *producer;     /* metadata "producer"                          */
    const char *key, *value;  /* one more metadata pair: the variant run      */
} trace_desc;

/* Everything a run produces. */
typedef struct {
    float   *x;            /* [T, dim]: the input, then the final residual */
    size_t   T, P, dim, kw;
    float   *ain, *aout;   /* [n_layers, T, dim]                            */
    int32_t *topk;         /* [n_layers, T, kw], -1 padded                  */
} trace_result;

static dsattn_status protocol(trace_gen g, const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen);

dsattn_status dsattn_trace_case(const char *case_dir, const char *out_path,
                                const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", case_dir);
    /* the generation by the config reader's own rules (model_type at the
     * top or in text_config, else the keys only one generation has) */
    dsattn_model_config mc;
    dsattn_status st = dsattn_config_load(&mc, path, err, errlen);
    if (st) return st;
    switch (mc.arch) {
    case DSATTN_ARCH_V41: return protocol(GEN_V41, case_dir, out_path, o, err, errlen);
    case DSATTN_ARCH_V3:
    case DSATTN_ARCH_V32: return protocol(GEN_MLA, case_dir, out_path, o, err, errlen);
    case DSATTN_ARCH_V4: return protocol(GEN_V4, case_dir, out_path, o, err, errlen);
    default:
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: the golden-case protocol covers deepseek_v3, deepseek_v32, "
                           "deepseek_v4 and deepseek_v41, not this model", path);
    }
}

dsattn_status dsattn_trace_load_input(const char *case_dir, float **x, size_t *T,
                                      size_t *dim, size_t *prefill, char *err,
                                      size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/input.safetensors", case_dir);
    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open(&f, path, err, errlen);
    if (st) return st;
    const dsattn_st_tensor *tx = dsattn_st_find(f, "x");
    const dsattn_st_tensor *tp = dsattn_st_find(f, "prefill_len");
    if (!tx || !tp || tx->ndim != 2 || tp->numel != 1) {
        dsattn_st_close(f);
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: needs x [T, dim] and prefill_len [1]", path);
    }
    *T = (size_t)tx->shape[0];
    *dim = (size_t)tx->shape[1];
    float p;
    *x = dsattn_alloc_array(tx->numel, sizeof(float));
    if (!*x) { dsattn_st_close(f); return DSATTN_ERR_NOMEM; }
    st = dsattn_st_to_f32(tx, *x, tx->numel);
    if (!st) st = dsattn_st_to_f32(tp, &p, 1);
    dsattn_st_close(f);
    if (st) { dsattn_free(*x); *x = NULL; return st; }
    if (!(p >= 1.0f) || (size_t)p > *T) {
        dsattn_free(*x);
        *x = NULL;
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: prefill_len %g out of [1, %zu]",
                           path, (double)p, *T);
    }
    *prefill = (size_t)p;
    return DSATTN_OK;
}

/* ==== What differs by generation ====================================== */

static dsattn_status model_load(trace_seq *s, trace_gen g, const char *cfg, const char *wts,
                                char *err, size_t errlen)
{
    if (g == GEN_MLA) return dsattn_mla_load(&s->mla_m, cfg, wts, err, errlen);
    if (g == GEN_V4) return dsattn_v4_load(&s->v4_m, cfg, wts, err, errlen);
    return dsattn_v41_load(&s->v41_m, cfg, wts, err, errlen);
}

/* A sequence of T tokens on the loaded model, of the variant the options
 * pick. */
static dsattn_status seq_create(trace_seq *s, size_t T, const dsattn_trace_opts *o)
{
    if (s->mla_m)
        return dsattn_mla_seq_create(&s->mla, s->mla_m, T, o->mla_naive
                                                           ? DSATTN_MLA_CACHE_NAIVE
                                                           : DSATTN_MLA_CACHE_LATENT_BF16);
    if (s->v4_m)
        return dsattn_v4_seq_create(&s->v4, s->v4_m, T, o->v4_defined_empty
                                                        ? DSATTN_V4_EMPTY_ZERO
                                                        : DSATTN_V4_EMPTY_REFERENCE);
    return dsattn_v41_seq_create(&s->v41, s->v41_m, T, o->index_k_ref
                                                       ? DSATTN_V41_INDEX_K_REFERENCE
                                                       : DSATTN_V41_INDEX_K_OWNER);
}

static void seq_close(trace_seq *s)
{
    dsattn_mla_seq_destroy(s->mla);  dsattn_mla_destroy(s->mla_m);
    dsattn_v4_seq_destroy(s->v4);    dsattn_v4_destroy(s->v4_m);
    dsattn_v41_seq_destroy(s->v41);  dsattn_v41_destroy(s->v41_m);
}

static trace_desc describe(const trace_seq *s, const dsattn_trace_opts *o)
{
    if (s->mla_m) {
        const dsattn_mla_config *c = &s->mla_m->cfg;
        return (trace_desc){ (size_t)c->n_layers, (size_t)c->dim,
                             c->dsa ? (size_t)c->index_topk : 0, 0,
                             c->dsa ? "dsattn trace (v32)" : "dsattn trace (v3)", "attn_impl",
                             o->mla_naive ? "naive"
                             : c->dsa     ? "official (prefill MHA, decode absorbed)"
                                          : "absorb" };
    }
    if (s->v4_m)
        return (trace_desc){ (size_t)s->v4_m->cfg.n_layers, (size_t)s->v4_m->cfg.dim,
                             (size_t)s->v4_m->cfg.index_topk, 1, "dsattn trace (v4)",
                             "v4_empty", o->v4_defined_empty ? "zero" : "nan" };
    const dsattn_v41_config *c = &s->v41_m->cfg;
    return (trace_desc){ (size_t)c->n_layers, (size_t)c->dim, (size_t)c->index_topk, 0,
                         "dsattn trace (v41)", "index_k",
                         o->index_k_ref ? "reference" : "owner" };
}

/* The golden stand-in stack over all layers on h [n, dim] (in place),
 * capturing attn_in / attn_out [n_layers, n, dim]; advances the seq. */
static dsattn_status seq_stack(dsattn_ctx *ctx, trace_seq *s, float *h, size_t n, float *ain,
                               float *aout)
{
    if (s->mla) return dsattn_mla_stack_forward(ctx, s->mla, h, n, ain, aout);
    if (s->v4) return dsattn_v4_stack_forward(ctx, s->v4, h, n, ain, aout);
    return dsattn_v41_stack_forward(ctx, s->v41, h, n, ain, aout);
}

/* The last chunk's own selection of layer l (rows x width); NOT_FOUND for
 * a layer that does not select. */
static dsattn_status seq_selection(const trace_seq *s, size_t l, const int32_t **rows,
                                   size_t *nr, size_t *w)
{
    if (s->mla) return dsattn_mla_seq_selection(s->mla, (int)l, rows, nr, w);
    if (s->v4) return dsattn_v4_seq_selection(s->v4, (int)l, rows, nr, w);
    return dsattn_v41_seq_selection(s->v41, (int)l, rows, nr, w);
}

static dsattn_status seq_caches(dsattn_st_writer *w, const trace_seq *s, size_t l)
{
    if (s->mla) return dsattn_trace_mla_caches(w, s->mla, (int)l);
    if (s->v4) return dsattn_trace_v4_caches(w, s->v4, (int)l);
    return dsattn_trace_v41_caches(w, s->v41, (int)l);
}

/* ==== The protocol ===================================================== */

/* The result arrays for n_layers and a top-k width min(kw, T), once r
 * holds the input (x, T, P, dim) and the model's dim is checked. */
static dsattn_status result_alloc(trace_result *r, size_t dim, size_t n_layers, size_t kw,
                                  char *err, size_t errlen)
{
    if (r->dim != dim)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "input dim %zu != config dim %zu",
                           r->dim, dim);
    r->kw = DSATTN_MIN(kw, r->T);            /* golden width: min(index_topk, T) */
    kw = r->kw;
    r->ain = dsattn_alloc_array(n_layers * r->T * dim, sizeof(float));
    r->aout = dsattn_alloc_array(n_layers * r->T * dim, sizeof(float));
    r->topk = dsattn_alloc_array(n_layers * r->T * kw + 1, sizeof(int32_t));
    if (!r->ain || !r->aout || !r->topk) return DSATTN_ERR_NOMEM;
    for (size_t i = 0; i < n_layers * r->T * kw; i++) r->topk[i] = -1;
    return DSATTN_OK;
}

static void result_free(trace_result *r)
{
    dsattn_free(r->x);
    dsattn_free(r->ain);
    dsattn_free(r->aout);
    dsattn_free(r->topk);
    memset(r, 0, sizeof *r);
}

/* Prefill x[:P] at position 0, then one-token decode steps, collecting
 * attn_in/attn_out and the selections (first kw picks of each row). */
static dsattn_status run(dsattn_ctx *ctx, trace_seq *s, size_t nl, trace_result *r, char *err,
                         size_t errlen)
{
    const size_t dim = r->dim, T = r->T, P = r->P, kw = r->kw;
    float *lin = dsattn_alloc_array(nl * P * dim, sizeof(float));
    float *lout = dsattn_alloc_array(nl * P * dim, sizeof(float));
    dsattn_status st = lin && lout ? DSATTN_OK : DSATTN_ERR_NOMEM;
    for (size_t t0 = 0; t0 < T && !st;) {
        size_t n = t0 == 0 ? P : 1;
        if ((st = seq_stack(ctx, s, r->x + t0 * dim, n, lin, lout))) {
            dsattn_errf(err, errlen, st, "stack forward at token %zu: %s", t0,
                        dsattn_status_str(st));
            break;
        }
        for (size_t l = 0; l < nl; l++) {
            for (size_t t = 0; t < n; t++) {
                memcpy(r->ain + (l * T + t0 + t) * dim, lin + (l * n + t) * dim,
                       dim * sizeof(float));
                memcpy(r->aout + (l * T + t0 + t) * dim, lout + (l * n + t) * dim,
                       dim * sizeof(float));
            }
            const int32_t *rows;
            size_t nr, wd;
            if (kw && seq_selection(s, l, &rows, &nr, &wd) == DSATTN_OK)
                for (size_t t = 0; t < nr && t < n; t++)
                    for (size_t i = 0; i < wd && i < kw; i++)
                        r->topk[(l * T + t0 + t) * kw + i] = rows[t * wd + i];
        }
        t0 += n;
    }
    dsattn_free(lin);
    dsattn_free(lout);
    return st;
}

static dsattn_status add_i32(dsattn_st_writer *w, const char *name, const int32_t *v,
                             size_t r, size_t c)
{
    int64_t shape[2] = { (int64_t)r, (int64_t)c };
    return dsattn_st_writer_add(w, name, DSATTN_DT_I32, 2, shape, v);
}

static int cmp_valid_first(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (x < 0 && y >= 0) return 1;
    if (y < 0 && x >= 0) return -1;
    return (x > y) - (x < y);
}

/* Layer l's picks: layer.{l}.topk, the picks as run; with score_order
 * (V4, which picks in score order) layer.{l}.topk is the same set
 * ascending, valid first, and trace.{l}.topk_order the picks as run. */
static dsattn_status add_topk(dsattn_st_writer *w, const trace_result *r, size_t l,
                              int score_order)
{
    const size_t T = r->T, kw = r->kw;
    const int32_t *picks = r->topk + l * T * kw;
    char nm[128];
    snprintf(nm, sizeof nm, "layer.%zu.topk", l);
    if (!score_order) return add_i32(w, nm, picks, T, kw);
    int32_t *sorted = dsattn_alloc_array(T * kw + 1, sizeof(int32_t));
    if (!sorted) return DSATTN_ERR_NOMEM;
    memcpy(sorted, picks, T * kw * sizeof(int32_t));
    for (size_t t = 0; t < T; t++) qsort(sorted + t * kw, kw, sizeof(int32_t), cmp_valid_first);
    dsattn_status st = add_i32(w, nm, sorted, T, kw);
    dsattn_free(sorted);
    snprintf(nm, sizeof nm, "trace.%zu.topk_order", l);
    return st ? st : add_i32(w, nm, picks, T, kw);
}

static dsattn_status write_file(const trace_seq *s, const trace_desc *d, const trace_result *r,
                                const char *out_path, const dsattn_trace_opts *o, char *err,
                                size_t errlen)
{
    dsattn_st_writer *w = dsattn_st_writer_create();
    if (!w) return DSATTN_ERR_NOMEM;
    dsattn_st_writer_meta(w, "producer", d->producer);
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, d->key, d->value);
    const size_t T = r->T, dim = r->dim;
    dsattn_status st = dsattn_trace_add_f32(w, "out", r->x, T, dim);
    for (size_t l = 0; l < d->n_layers && !st; l++) {
        char nm[128];
        snprintf(nm, sizeof nm, "layer.%zu.attn_out", l);
        st = dsattn_trace_add_f32(w, nm, r->aout + l * T * dim, T, dim);
        snprintf(nm, sizeof nm, "layer.%zu.attn_in", l);
        if (!st) st = dsattn_trace_add_f32(w, nm, r->ain + l * T * dim, T, dim);
    }
    for (size_t l = 0; l < d->n_layers && !st; l++) {
        const int32_t *rows;
        size_t nr, wd;
        if (r->kw && seq_selection(s, l, &rows, &nr, &wd) == DSATTN_OK)
            st = add_topk(w, r, l, d->score_order);
        if (!st) st = seq_caches(w, s, l);
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
    dsattn_st_writer_destroy(w);
    return st;
}

static dsattn_status protocol(trace_gen g, const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char cfg[4096], wts[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", case_dir);
    snprintf(wts, sizeof wts, "%s/weights.safetensors", case_dir);
    trace_seq s;
    memset(&s, 0, sizeof s);
    trace_result r;
    memset(&r, 0, sizeof r);
    dsattn_ctx *ctx = NULL;
    dsattn_ctx_params cp = dsattn_ctx_default_params();
    cp.mode = o->mode;
    cp.n_threads = o->n_threads;
    dsattn_status st = model_load(&s, g, cfg, wts, err, errlen);
    if (!st) {
        const trace_desc d = describe(&s, o);
        if (!(st = dsattn_trace_load_input(case_dir, &r.x, &r.T, &r.dim, &r.P, err, errlen)) &&
            !(st = result_alloc(&r, d.dim, d.n_layers, d.index_topk, err, errlen)) &&
            !(st = dsattn_ctx_create(&ctx, &cp)) && !(st = seq_create(&s, r.T, o)) &&
            !(st = run(ctx, &s, d.n_layers, &r, err, errlen)))
            st = write_file(&s, &d, &r, out_path, o, err, errlen);
    }
    result_free(&r);
    dsattn_ctx_destroy(ctx);
    seq_close(&s);
    return st;
}

/* ==== The public entry point (include/dsattn.h, "Trace") ================ */

dsattn_trace_params dsattn_trace_default_params(void)
{
    dsattn_trace_params p;
    memset(&p, 0, sizeof p);
    p.mode = DSATTN_MODE_REFERENCE;
    p.index_k = DSATTN_V41_INDEX_K_OWNER;
    p.v4_empty = DSATTN_V4_EMPTY_REFERENCE;
    return p;
}

dsattn_status dsattn_trace_write(const char *case_dir, const char *out_path,
                                 const dsattn_trace_params *p, char *err, size_t errlen)
{
    dsattn_trace_params d = dsattn_trace_default_params();
    if (!p) p = &d;
    if (!case_dir || !out_path)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "trace: case_dir and out_path are required");
    if ((p->mode != DSATTN_MODE_FAST && p->mode != DSATTN_MODE_REFERENCE) ||
        (p->index_k != DSATTN_V41_INDEX_K_OWNER && p->index_k != DSATTN_V41_INDEX_K_REFERENCE) ||
        (p->mla_naive != 0 && p->mla_naive != 1) ||
        (p->v4_empty != DSATTN_V4_EMPTY_REFERENCE && p->v4_empty != DSATTN_V4_EMPTY_ZERO))
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "trace: a parameter is out of its domain");
    dsattn_trace_opts o = { p->mode, p->n_threads, p->index_k == DSATTN_V41_INDEX_K_REFERENCE,
                            p->mla_naive, p->v4_empty == DSATTN_V4_EMPTY_ZERO };
    return dsattn_trace_case(case_dir, out_path, &o, err, errlen);
}
