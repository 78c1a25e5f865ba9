/* trace_v3.c - the MLA (V3, model_type deepseek_v3) and MLA + DSA (V3.2,
 * deepseek_v32) backend of `dsattn trace`.
 *
 * Runs the golden protocol over a dsattn_mla stack (prefill of x[:P] at
 * position 0, then one-token decode steps) and writes: out [T, dim],
 * layer.{i}.attn_in / attn_out [T, dim]; V3.2 also layer.{i}.topk
 * [T, min(index_topk, T)] (token positions attended, ascending, -1 padded),
 * cache.{i}.index_k (F8_E4M3 codes [T, Di]) and cache.{i}.index_k_scale
 * (F32 [T, 1]); with a latent cache cache.{i}.kv_cache [T, kv_lora_rank]
 * and cache.{i}.pe_cache [T, qk_rope_head_dim] (F32 values of the bf16
 * caches).  --mla naive runs the expanded path and cache (no latent cache
 * to write).
 */
#include "trace.h"

#include "internal.h"
#include "mla.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>


static dsattn_status add_caches(dsattn_st_writer *w, const dsattn_mla_seq *seq, int l)
{
    const dsattn_mla_config *c = &seq->m->cfg;
    const size_t T = (size_t)dsattn_mla_seq_pos(seq);
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t Di = (size_t)c->index_head_dim;
    dsattn_status st = DSATTN_OK;
    char nm[128];
    if (dsattn_mla_seq_cache_format(seq) != DSATTN_MLA_CACHE_NAIVE) {
        float *kv = dsattn_alloc_array(T * (KL + dr) + 1, sizeof(float));
        if (!kv) return DSATTN_ERR_NOMEM;
        float *pe = kv + T * KL;
        for (size_t t = 0; t < T && !st; t++)
            st = dsattn_mla_seq_latent(seq, l, t, kv + t * KL, pe + t * dr);
        snprintf(nm, sizeof nm, "cache.%d.kv_cache", l);
        if (!st) st = dsattn_trace_add_f32(w, nm, kv, T, KL);
        snprintf(nm, sizeof nm, "cache.%d.pe_cache", l);
        if (!st) st = dsattn_trace_add_f32(w, nm, pe, T, dr);
        dsattn_free(kv);
        if (st) return st;
    }
    if (c->dsa) {
        uint8_t *codes = dsattn_alloc_array(T * Di + 1, 1);
        float *sc = dsattn_alloc_array(T + 1, sizeof(float));
        if (!codes || !sc) st = DSATTN_ERR_NOMEM;
        for (size_t t = 0; t < T && !st; t++)
            st = dsattn_mla_seq_index_key(seq, l, t, codes + t * Di, sc + t);
        int64_t shape[2] = { (int64_t)T, (int64_t)Di };
        snprintf(nm, sizeof nm, "cache.%d.index_k", l);
        if (!st) st = dsattn_st_writer_add(w, nm, DSATTN_DT_F8_E4M3, 2, shape, codes);
        snprintf(nm, sizeof nm, "cache.%d.index_k_scale", l);
        if (!st) st = dsattn_trace_add_f32(w, nm, sc, T, 1);
        dsattn_free(codes);
        dsattn_free(sc);
    }
    return st;
}

static dsattn_status mla_stack(dsattn_ctx *ctx, void *seq, float *h, size_t n, float *ain,
                               float *aout)
{
    return dsattn_mla_stack_forward(ctx, (dsattn_mla_seq *)seq, h, n, ain, aout);
}

static dsattn_status mla_selection(const void *seq, int l, const int32_t **rows, size_t *nr,
                                   size_t *w)
{
    return dsattn_mla_seq_selection((const dsattn_mla_seq *)seq, l, rows, nr, w);
}

dsattn_status dsattn_trace_v3(const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char cfg[4096], wts[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", case_dir);
    snprintf(wts, sizeof wts, "%s/weights.safetensors", case_dir);
    dsattn_mla *m = NULL;
    dsattn_mla_seq *seq = NULL;
    dsattn_ctx *ctx = NULL;
    dsattn_st_writer *w = NULL;
    dsattn_trace_result r;
    memset(&r, 0, sizeof r);
    dsattn_status st = dsattn_mla_load(&m, cfg, wts, err, errlen);
    if (st) return st;
    const dsattn_mla_config *c = &m->cfg;
    const size_t nl = (size_t)c->n_layers;
    if ((st = dsattn_trace_result_init(&r, case_dir, (size_t)c->dim, nl,
                                       c->dsa ? (size_t)c->index_topk : 0, err, errlen)))
        goto out;
    if ((st = dsattn_trace_ctx(&ctx, o))) goto out;
    if ((st = dsattn_mla_seq_create(&seq, m, r.T, o->mla_naive ? DSATTN_MLA_CACHE_NAIVE
                                                               : DSATTN_MLA_CACHE_LATENT_BF16)))
        goto out;
    dsattn_trace_stack ts = { seq, nl, r.dim, mla_stack, c->dsa ? mla_selection : NULL };
    if ((st = dsattn_trace_run(ctx, &ts, &r, err, errlen))) goto out;

    w = dsattn_st_writer_create();
    if (!w) { st = DSATTN_ERR_NOMEM; goto out; }
    dsattn_st_writer_meta(w, "producer", c->dsa ? "dsattn trace (v32)" : "dsattn trace (v3)");
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, "attn_impl", o->mla_naive ? "naive" : (c->dsa ?
                          "official (prefill MHA, decode absorbed)" : "absorb"));
    st = dsattn_trace_add_common(w, &r, nl);
    for (size_t l = 0; l < nl && !st; l++) {
        char nm[128];
        if (c->dsa) {
            int64_t shape[2] = { (int64_t)r.T, (int64_t)r.kw };
            snprintf(nm, sizeof nm, "layer.%zu.topk", l);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, r.topk + l * r.T * r.kw);
        }
        if (!st) st = add_caches(w, seq, (int)l);
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
out:
    dsattn_st_writer_destroy(w);
    dsattn_trace_result_free(&r);
    dsattn_mla_seq_destroy(seq);
    dsattn_ctx_destroy(ctx);
    dsattn_mla_destroy(m);
    return st;
}
