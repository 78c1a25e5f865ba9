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

static dsattn_status add_f32(dsattn_st_writer *w, const char *name, const float *v, size_t r,
                             size_t c)
{
    int64_t shape[2] = { (int64_t)r, (int64_t)c };
    return dsattn_st_writer_add(w, name, DSATTN_DT_F32, 2, shape, v);
}

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
        if (!st) st = add_f32(w, nm, kv, T, KL);
        snprintf(nm, sizeof nm, "cache.%d.pe_cache", l);
        if (!st) st = add_f32(w, nm, pe, T, dr);
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
        if (!st) st = add_f32(w, nm, sc, T, 1);
        dsattn_free(codes);
        dsattn_free(sc);
    }
    return st;
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
    float *x = NULL, *ain = NULL, *aout = NULL, *lin = NULL, *lout = NULL;
    int32_t *topk = NULL;
    size_t T = 0, dim = 0, P = 0;
    dsattn_status st = dsattn_mla_load(&m, cfg, wts, err, errlen);
    if (st) return st;
    const dsattn_mla_config *c = &m->cfg;
    const size_t nl = (size_t)c->n_layers;
    if ((st = dsattn_trace_load_input(case_dir, &x, &T, &dim, &P, err, errlen))) goto out;
    if (dim != (size_t)c->dim) {
        st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "input dim %zu != config dim %lld", dim,
                         (long long)c->dim);
        goto out;
    }
    dsattn_ctx_params cp = dsattn_ctx_default_params();
    cp.mode = o->mode;
    cp.n_threads = o->n_threads;
    if ((st = dsattn_ctx_create(&ctx, &cp))) goto out;
    if ((st = dsattn_mla_seq_create(&seq, m, T, o->mla_naive ? DSATTN_MLA_CACHE_NAIVE
                                                             : DSATTN_MLA_CACHE_LATENT_BF16)))
        goto out;
    const size_t kw = c->dsa ? DSATTN_MIN((size_t)c->index_topk, T) : 0;
    ain = dsattn_alloc_array(nl * T * dim, sizeof(float));
    aout = dsattn_alloc_array(nl * T * dim, sizeof(float));
    lin = dsattn_alloc_array(nl * P * dim, sizeof(float));
    lout = dsattn_alloc_array(nl * P * dim, sizeof(float));
    topk = dsattn_alloc_array(nl * T * kw + 1, sizeof(int32_t));
    if (!ain || !aout || !lin || !lout || !topk) { st = DSATTN_ERR_NOMEM; goto out; }
    for (size_t i = 0; i < nl * T * kw; i++) topk[i] = -1;

    for (size_t t0 = 0; t0 < T;) {
        size_t n = t0 == 0 ? P : 1;
        if ((st = dsattn_mla_stack_forward(ctx, seq, x + t0 * dim, n, lin, lout))) {
            dsattn_errf(err, errlen, st, "stack forward at token %zu: %s", t0,
                        dsattn_status_str(st));
            goto out;
        }
        for (size_t l = 0; l < nl; l++) {
            for (size_t t = 0; t < n; t++) {
                memcpy(ain + (l * T + t0 + t) * dim, lin + (l * n + t) * dim, dim * sizeof(float));
                memcpy(aout + (l * T + t0 + t) * dim, lout + (l * n + t) * dim, dim * sizeof(float));
            }
            const int32_t *rows;
            size_t nr, wd;
            if (c->dsa && dsattn_mla_seq_selection(seq, (int)l, &rows, &nr, &wd) == DSATTN_OK)
                for (size_t t = 0; t < nr; t++)
                    for (size_t i = 0; i < wd && i < kw; i++)
                        topk[(l * T + t0 + t) * kw + i] = rows[t * wd + i];
        }
        t0 += n;
    }

    w = dsattn_st_writer_create();
    if (!w) { st = DSATTN_ERR_NOMEM; goto out; }
    dsattn_st_writer_meta(w, "producer", c->dsa ? "dsattn trace (v32)" : "dsattn trace (v3)");
    dsattn_st_writer_meta(w, "mode", o->mode == DSATTN_MODE_REFERENCE ? "reference" : "fast");
    dsattn_st_writer_meta(w, "attn_impl", o->mla_naive ? "naive" : (c->dsa ?
                          "official (prefill MHA, decode absorbed)" : "absorb"));
    if ((st = add_f32(w, "out", x, T, dim))) goto out;
    for (size_t l = 0; l < nl && !st; l++) {
        char nm[128];
        snprintf(nm, sizeof nm, "layer.%zu.attn_out", l);
        st = add_f32(w, nm, aout + l * T * dim, T, dim);
        snprintf(nm, sizeof nm, "layer.%zu.attn_in", l);
        if (!st) st = add_f32(w, nm, ain + l * T * dim, T, dim);
        if (!st && c->dsa) {
            int64_t shape[2] = { (int64_t)T, (int64_t)kw };
            snprintf(nm, sizeof nm, "layer.%zu.topk", l);
            st = dsattn_st_writer_add(w, nm, DSATTN_DT_I32, 2, shape, topk + l * T * kw);
        }
        if (!st) st = add_caches(w, seq, (int)l);
    }
    if (!st) st = dsattn_st_writer_save(w, out_path, err, errlen);
out:
    dsattn_st_writer_destroy(w);
    dsattn_free(x);
    dsattn_free(ain);
    dsattn_free(aout);
    dsattn_free(lin);
    dsattn_free(lout);
    dsattn_free(topk);
    dsattn_mla_seq_destroy(seq);
    dsattn_ctx_destroy(ctx);
    dsattn_mla_destroy(m);
    return st;
}
