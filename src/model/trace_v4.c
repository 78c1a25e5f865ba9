/* trace_v4.c - the CSA + HCA (V4) backend of `dsattn trace`.
 *
 * Runs the golden protocol over a dsattn_v4 stack (prefill of x[:P], then
 * one-token decode steps) and writes: out [T, dim] (final residual),
 * layer.{i}.attn_in / attn_out [T, dim], for CSA layers layer.{i}.topk
 * [T, min(index_topk, T)] (compressed-entry indices j, ascending, -1
 * padded: compare as sets) and trace.{i}.topk_order (the same picks in
 * the reference's score order), and the packed caches cache.{i}.kv (the
 * layer's one KV buffer: window ring rows, then the T // ratio compressed
 * entries, MODEL1 rows) and, for CSA, cache.{i}.index_kv, each with a
 * _deq F32 twin.
 */
#include "trace.h"

#include "internal.h"
#include "numfmt.h"
#include "safetensors.h"
#include "v4.h"

#include <stdio.h>
#include <stdlib.h>

static dsattn_status add_f32(dsattn_st_writer *w, const char *name, const float *v, size_t r,
                             size_t c)
{
    int64_t shape[2] = { (int64_t)r, (int64_t)c };
    return dsattn_st_writer_add(w, name, DSATTN_DT_F32, 2, shape, v);
}

static dsattn_status add_cache(dsattn_st_writer *w, const dsattn_v4_seq *s, int l, int which,
                               const char *name)
{
    const dsattn_v4_config *c = &s->m->cfg;
    const uint8_t *rows;
    size_t n, rb;
    dsattn_status st = dsattn_v4_seq_cache(s, l, which, &rows, &n, &rb);
    if (st == DSATTN_ERR_NOT_FOUND) return DSATTN_OK;
    if (st) return st;
    const size_t D = (size_t)c->head_dim, rd = (size_t)c->rope_head_dim;
    const size_t d = which == 0 ? D : (size_t)c->index_head_dim;
    char nm[128];
    int64_t shape[2] = { (int64_t)n, (int64_t)rb };
    snprintf(nm, sizeof nm, "cache.%d.%s", l, name);
    if ((st = dsattn_st_writer_add(w, nm, DSATTN_DT_U8, 2, shape, rows))) return st;
    float *deq = dsattn_alloc_array(n * d + 1, sizeof(float));
    if (!deq) return DSATTN_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (which == 0) dsattn_v4_kv_unpack(rows + i * rb, D - rd, rd, deq + i * d);
        else dsattn_fp4_index_unpack(rows + i * rb, d, deq + i * d);
    }
    snprintf(nm, sizeof nm, "cache.%d.%s_deq", l, name);
    st = add_f32(w, nm, deq, n, d);
    dsattn_free(deq);
    return st;
}

static int cmp_valid_first(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (x < 0 && y >= 0) return 1;
    if (y < 0 && x >= 0) return -1;
    return (x > y) - (x < y);
}

dsattn_status dsattn_trace_v4(const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char cfg[4096], wts[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", case_dir);
    snprintf(wts, sizeof wts, "%s/weights.safetensors", case_dir);
    dsattn_v4 *m = NULL;
    dsattn_v4_seq *seq = NULL;
    dsattn_ctx *ctx = NULL;
    dsattn_st_writer *w = NULL;
    float *x = NULL, *ain = NULL, *aout = NULL, *lin = NULL, *lout = NULL;
    int32_t *order = NULL, *sorted = NULL;
    size_t T = 0, dim = 0, P = 0;
    dsattn_status st = dsattn_v4_load(&m, cfg, wts, err, errlen);
    if (st) return st;
    const dsattn_v4_config *c = &m->cfg;
    const size_t nl = (size_t)c->n_layers;
    if ((st = dsattn_trace_load_input(case_dir, &x, &T, &dim, &P, err, errlen))) goto out;
    if (dim != (size_t)c->dim) {
        st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "input dim %zu != config dim %lld",
                         dim, (long long)c->dim);
        goto out;
    }
    dsattn_ctx_params cp = dsattn_ctx_default_params();
    cp.mode = o->mode;
    cp.n_threads = o->n_threads;
    if ((st = dsattn_ctx_create(&ctx, &cp))) goto out;
    if ((st = dsattn_v4_seq_create(&seq, m, T, o->v4_defined_empty ? DSATTN_V4_EMPTY_ZERO
                                                                   : DSATTN_V4_EMPTY_REFERENCE)))
        goto out;
    const size_t kw = DSATTN_MIN((size_t)c->index_topk, T);
    ain = dsattn_alloc_array(nl * T * dim, sizeof(float));
    aout = dsattn_alloc_array(nl * T * dim, sizeof(float));
    lin = dsattn_alloc_array(nl * P * dim, sizeof(float));
    lout = dsattn_alloc_array(nl * P * dim, sizeof(float));
    order = dsattn_alloc_array(nl * T * kw + 1, sizeof(int32_t));
    sorted = dsattn_alloc_array(nl * T * kw + 1, sizeof(int32_t));
    if (!ain || !aout || !lin || !lout || !order || !sorted) { st = DSATTN_ERR_NOMEM; goto out; }
    for (size_t i = 0; i < nl * T * kw; i++) order[i] = -1;

    for (size_t t0 = 0; t0 < T;) {
        size_t n = t0 == 0 ? P : 1;
        if ((st = dsattn_v4_stack_forward(ctx, seq, x + t0 * dim, n, lin, lout))) {
            dsattn_errf(err, errlen, st, "stack forward at token %zu: %s", t0,
                        dsattn_status_str(st));
            goto out;
        }
        for (size_t l = 0; l < nl; l++) {
            for (size_t t = 0; t < n; t++) {
                memcpy(ain + (l * T + t0 + t) * dim, lin + (l * n + t) * dim, dim * sizeof(float));
                memcpy(aout + (l * T + t0 + t) * dim, lout + (l * n + t) * dim,
                       dim * sizeof(float));
            }
            const int32_t *rows;
            size_t nr, wd;
            if (dsattn_v4_seq_selection(seq, (int)l, &rows, &nr, &wd) == DSATTN_OK)
                for (size_t t = 0; t < nr; t++)
                    for (size_t i = 0; i < wd && i < kw; i++)
                        order[(l * T + t0 + t) * kw + i] = rows[t * wd + i];
        }
        t0 += n;
    }
    memcpy(sorted, order, nl * T * kw * sizeof(int32_t));
    for (size_t r = 0; r < nl * T; r++) qsort(sorted + r * kw, kw, sizeof(int32_t), cmp_valid_first);

    w = dsattn_st_writer_create();
    if (!w) { st = DSATTN_ERR_NOMEM; goto out; }
    dsattn_st_writer_meta(w, "producer", "dsattn trace (v4)");
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, "v4_empty", o->v4_defined_empty ? "zero" : "nan");
    if ((st = add_f32(w, "out", x, T, dim))) goto out;
    for (size_t l = 0; l < nl && !st; l++) {
        char nm[128];
        snprintf(nm, sizeof nm, "layer.%zu.attn_out", l);
        st = add_f32(w, nm, aout + l * T * dim, T, dim);
        snprintf(nm, sizeof nm, "layer.%zu.attn_in", l);
        if (!st) st = add_f32(w, nm, ain + l * T * dim, T, dim);
        if (!st && m->layer[l].kind == DSATTN_V4_CSA) {
            int64_t shape[2] = { (int64_t)T, (int64_t)kw };
            snprintf(nm, sizeof nm, "layer.%zu.topk", l);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, sorted + l * T * kw);
            snprintf(nm, sizeof nm, "trace.%zu.topk_order", l);
            if (!st) st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, order + l * T * kw);
        }
        if (!st) st = add_cache(w, seq, (int)l, 0, "kv");
        if (!st) st = add_cache(w, seq, (int)l, 1, "index_kv");
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
out:
    dsattn_st_writer_destroy(w);
    dsattn_free(x);
    dsattn_free(ain);
    dsattn_free(aout);
    dsattn_free(lin);
    dsattn_free(lout);
    dsattn_free(order);
    dsattn_free(sorted);
    dsattn_v4_seq_destroy(seq);
    dsattn_ctx_destroy(ctx);
    dsattn_v4_destroy(m);
    return st;
}
