/* trace_v41.c - the CSA2 (V4.1) backend of `dsattn trace`.
 *
 * Runs the golden protocol over a dsattn_v41 stack and writes: out [T, dim]
 * (final residual), layer.{i}.attn_in / attn_out [T, dim], layer.{i}.topk
 * [T, min(index_topk, T)] for every index source (compressed-entry indices
 * j, ascending, -1 padded), and the packed caches cache.{i}.window_kv
 * (every layer), cache.{i}.compress_kv and cache.{i}.index_k (KV sources),
 * each with a _deq F32 twin.
 */
#include "trace.h"

#include "internal.h"
#include "numfmt.h"
#include "safetensors.h"
#include "v41.h"

#include <stdio.h>
#include <stdlib.h>

static dsattn_status add_cache(dsattn_st_writer *w, const dsattn_v41_seq *s, int l,
                               int which, const char *name, size_t d)
{
    const uint8_t *rows;
    size_t n, rb;
    dsattn_status st = dsattn_v41_seq_cache(s, l, which, &rows, &n, &rb);
    if (st == DSATTN_ERR_NOT_FOUND) return DSATTN_OK;
    if (st) return st;
    char nm[128];
    int64_t shape[2] = { (int64_t)n, (int64_t)rb };
    snprintf(nm, sizeof nm, "cache.%d.%s", l, name);
    if ((st = dsattn_st_writer_add(w, nm, DSATTN_DT_U8, 2, shape, rows))) return st;
    float *deq = dsattn_alloc_array(n * d + 1, sizeof(float));
    if (!deq) return DSATTN_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (which == 0) dsattn_v41_swa_unpack(rows + i * rb, d, deq + i * d);
        else if (which == 1) dsattn_v41_kv_unpack(rows + i * rb, d, deq + i * d);
        else dsattn_fp4_index_unpack(rows + i * rb, d, deq + i * d);
    }
    snprintf(nm, sizeof nm, "cache.%d.%s_deq", l, name);
    st = dsattn_trace_add_f32(w, nm, deq, n, d);
    dsattn_free(deq);
    return st;
}

static dsattn_status v41_stack(dsattn_ctx *ctx, void *seq, float *h, size_t n, float *ain,
                               float *aout)
{
    return dsattn_v41_stack_forward(ctx, (dsattn_v41_seq *)seq, h, n, ain, aout);
}

static dsattn_status v41_selection(const void *seq, int l, const int32_t **rows, size_t *nr,
                                   size_t *w)
{
    return dsattn_v41_seq_selection((const dsattn_v41_seq *)seq, l, rows, nr, w);
}

dsattn_status dsattn_trace_v41(const char *case_dir, const char *out_path,
                               const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char cfg[4096], wts[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", case_dir);
    snprintf(wts, sizeof wts, "%s/weights.safetensors", case_dir);
    dsattn_v41 *m = NULL;
    dsattn_v41_seq *seq = NULL;
    dsattn_ctx *ctx = NULL;
    dsattn_st_writer *w = NULL;
    dsattn_trace_result r;
    memset(&r, 0, sizeof r);
    dsattn_status st = dsattn_v41_load(&m, cfg, wts, err, errlen);
    if (st) return st;
    const dsattn_v41_config *c = &m->cfg;
    const size_t nl = (size_t)c->n_layers;
    if ((st = dsattn_trace_result_init(&r, case_dir, (size_t)c->dim, nl, (size_t)c->index_topk,
                                       err, errlen)))
        goto out;
    if ((st = dsattn_trace_ctx(&ctx, o))) goto out;
    if ((st = dsattn_v41_seq_create(&seq, m, r.T, o->index_k_ref ? DSATTN_V41_INDEX_K_REFERENCE
                                                                 : DSATTN_V41_INDEX_K_OWNER)))
        goto out;
    dsattn_trace_stack ts = { seq, nl, r.dim, v41_stack, v41_selection };
    if ((st = dsattn_trace_run(ctx, &ts, &r, err, errlen))) goto out;

    w = dsattn_st_writer_create();
    if (!w) { st = DSATTN_ERR_NOMEM; goto out; }
    dsattn_st_writer_meta(w, "producer", "dsattn trace (v41)");
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, "index_k", o->index_k_ref ? "reference" : "owner");
    st = dsattn_trace_add_common(w, &r, nl);
    for (size_t l = 0; l < nl && !st; l++) {
        char nm[128];
        if (m->layer[l].is_index_source) {
            int64_t shape[2] = { (int64_t)r.T, (int64_t)r.kw };
            snprintf(nm, sizeof nm, "layer.%zu.topk", l);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, r.topk + l * r.T * r.kw);
        }
        if (!st) st = add_cache(w, seq, (int)l, 0, "window_kv", (size_t)c->head_dim);
        if (!st) st = add_cache(w, seq, (int)l, 1, "compress_kv", (size_t)c->head_dim);
        if (!st) st = add_cache(w, seq, (int)l, 2, "index_k", (size_t)c->index_head_dim);
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
out:
    dsattn_st_writer_destroy(w);
    dsattn_trace_result_free(&r);
    dsattn_v41_seq_destroy(seq);
    dsattn_ctx_destroy(ctx);
    dsattn_v41_destroy(m);
    return st;
}
