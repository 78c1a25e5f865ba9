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
    st = dsattn_trace_add_f32(w, nm, deq, n, d);
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

static dsattn_status v4_stack(dsattn_ctx *ctx, void *seq, float *h, size_t n, float *ain,
                              float *aout)
{
    return dsattn_v4_stack_forward(ctx, (dsattn_v4_seq *)seq, h, n, ain, aout);
}

static dsattn_status v4_selection(const void *seq, int l, const int32_t **rows, size_t *nr,
                                  size_t *w)
{
    return dsattn_v4_seq_selection((const dsattn_v4_seq *)seq, l, rows, nr, w);
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
    int32_t *sorted = NULL;
    dsattn_trace_result r;
    memset(&r, 0, sizeof r);
    dsattn_status st = dsattn_v4_load(&m, cfg, wts, err, errlen);
    if (st) return st;
    const dsattn_v4_config *c = &m->cfg;
    const size_t nl = (size_t)c->n_layers;
    if ((st = dsattn_trace_result_init(&r, case_dir, (size_t)c->dim, nl, (size_t)c->index_topk,
                                       err, errlen)))
        goto out;
    if ((st = dsattn_trace_ctx(&ctx, o))) goto out;
    if ((st = dsattn_v4_seq_create(&seq, m, r.T, o->v4_defined_empty ? DSATTN_V4_EMPTY_ZERO
                                                                     : DSATTN_V4_EMPTY_REFERENCE)))
        goto out;
    dsattn_trace_stack ts = { seq, nl, r.dim, v4_stack, v4_selection };
    if ((st = dsattn_trace_run(ctx, &ts, &r, err, errlen))) goto out;
    /* r.topk holds the picks in the reference's score order; the golden
     * layer.{i}.topk is the same set ascending, valid first */
    const size_t kw = r.kw, T = r.T;
    sorted = dsattn_alloc_array(nl * T * kw + 1, sizeof(int32_t));
    if (!sorted) { st = DSATTN_ERR_NOMEM; goto out; }
    memcpy(sorted, r.topk, nl * T * kw * sizeof(int32_t));
    for (size_t i = 0; i < nl * T; i++) qsort(sorted + i * kw, kw, sizeof(int32_t), cmp_valid_first);

    w = dsattn_st_writer_create();
    if (!w) { st = DSATTN_ERR_NOMEM; goto out; }
    dsattn_st_writer_meta(w, "producer", "dsattn trace (v4)");
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, "v4_empty", o->v4_defined_empty ? "zero" : "nan");
    st = dsattn_trace_add_common(w, &r, nl);
    for (size_t l = 0; l < nl && !st; l++) {
        char nm[128];
        if (m->layer[l].kind == DSATTN_V4_CSA) {
            int64_t shape[2] = { (int64_t)T, (int64_t)kw };
            snprintf(nm, sizeof nm, "layer.%zu.topk", l);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, sorted + l * T * kw);
            snprintf(nm, sizeof nm, "trace.%zu.topk_order", l);
            if (!st) st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, r.topk + l * T * kw);
        }
        if (!st) st = add_cache(w, seq, (int)l, 0, "kv");
        if (!st) st = add_cache(w, seq, (int)l, 1, "index_kv");
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
out:
    dsattn_st_writer_destroy(w);
    dsattn_free(sorted);
    dsattn_trace_result_free(&r);
    dsattn_v4_seq_destroy(seq);
    dsattn_ctx_destroy(ctx);
    dsattn_v4_destroy(m);
    return st;
}
