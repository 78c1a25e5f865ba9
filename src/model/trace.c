/* trace.c - dispatch of `dsattn trace` by model_type, and the input reader
 * every backend shares.  Backends live beside this file, one per
 * generation; add a row to the table below for a new one. */
#include "trace.h"

#include "internal.h"
#include "jsoncfg.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct { const char *model_type; dsattn_trace_fn fn; } backend;


dsattn_status dsattn_trace_case(const char *case_dir, const char *out_path,
                                const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", case_dir);
    cJSON *root = NULL;
    dsattn_status st = dsattn_jcfg_load(&root, path, err, errlen);
    if (st) return st;
    const char *mt = NULL;
    st = dsattn_jcfg_string_opt(root, "model_type", "", &mt, err, errlen);
    char type[64];
    snprintf(type, sizeof type, "%s", st ? "" : mt);
    int v41_keys = dsattn_jcfg_has(root, "kv_source_layers");
    cJSON_Delete(root);
    if (st) return st;
    const backend table[] = {
        { "deepseek_v41", dsattn_trace_v41 },
        { "deepseek_v3", dsattn_trace_v3 },
        { "deepseek_v32", dsattn_trace_v3 },
        { "deepseek_v4", dsattn_trace_v4 },
    };
    if (!type[0] && v41_keys) snprintf(type, sizeof type, "deepseek_v41");
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(table); i++) {
        if (strcmp(type, table[i].model_type)) continue;
        if (!table[i].fn)
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: model_type '%s' has no trace backend in this build",
                               path, type);
        return table[i].fn(case_dir, out_path, o, err, errlen);
    }
    return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                       "%s: unknown model_type '%s' (known: deepseek_v3, deepseek_v32, "
                       "deepseek_v4, deepseek_v41)", path, type);
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

/* ==== The protocol runner =============================================== */

dsattn_status dsattn_trace_result_init(dsattn_trace_result *r, const char *case_dir,
                                       size_t dim, size_t n_layers, size_t kw, char *err,
                                       size_t errlen)
{
    memset(r, 0, sizeof *r);
    dsattn_status st = dsattn_trace_load_input(case_dir, &r->x, &r->T, &r->dim, &r->P, err,
                                               errlen);
    if (st) return st;
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

void dsattn_trace_result_free(dsattn_trace_result *r)
{
    dsattn_free(r->x);
    dsattn_free(r->ain);
    dsattn_free(r->aout);
    dsattn_free(r->topk);
    memset(r, 0, sizeof *r);
}

dsattn_status dsattn_trace_run(dsattn_ctx *ctx, const dsattn_trace_stack *s,
                               dsattn_trace_result *r, char *err, size_t errlen)
{
    const size_t nl = s->n_layers, dim = r->dim, T = r->T, P = r->P, kw = r->kw;
    float *lin = dsattn_alloc_array(nl * P * dim, sizeof(float));
    float *lout = dsattn_alloc_array(nl * P * dim, sizeof(float));
    dsattn_status st = lin && lout ? DSATTN_OK : DSATTN_ERR_NOMEM;
    for (size_t t0 = 0; t0 < T && !st;) {
        size_t n = t0 == 0 ? P : 1;
        if ((st = s->stack(ctx, s->seq, r->x + t0 * dim, n, lin, lout))) {
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
            if (kw && s->selection && s->selection(s->seq, (int)l, &rows, &nr, &wd) == DSATTN_OK)
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

dsattn_status dsattn_trace_ctx(dsattn_ctx **ctx, const dsattn_trace_opts *o)
{
    dsattn_ctx_params cp = dsattn_ctx_default_params();
    cp.mode = o->mode;
    cp.n_threads = o->n_threads;
    return dsattn_ctx_create(ctx, &cp);
}

dsattn_status dsattn_trace_add_f32(dsattn_st_writer *w, const char *name, const float *v,
                                   size_t r, size_t c)
{
    int64_t shape[2] = { (int64_t)r, (int64_t)c };
    return dsattn_st_writer_add(w, name, DSATTN_DT_F32, 2, shape, v);
}

dsattn_status dsattn_trace_add_common(dsattn_st_writer *w, const dsattn_trace_result *r,
                                      size_t n_layers)
{
    const size_t T = r->T, dim = r->dim;
    dsattn_status st = dsattn_trace_add_f32(w, "out", r->x, T, dim);
    for (size_t l = 0; l < n_layers && !st; l++) {
        char nm[128];
        snprintf(nm, sizeof nm, "layer.%zu.attn_out", l);
        st = dsattn_trace_add_f32(w, nm, r->aout + l * T * dim, T, dim);
        snprintf(nm, sizeof nm, "layer.%zu.attn_in", l);
        if (!st) st = dsattn_trace_add_f32(w, nm, r->ain + l * T * dim, T, dim);
    }
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
