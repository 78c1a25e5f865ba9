/* trace_v3.c - the MLA (V3, model_type deepseek_v3) and MLA + DSA (V3.2,
 * deepseek_v32) part of `dsattn trace`: the caches.
 *
 * trace.c runs the golden protocol over a dsattn_mla stack (prefill of x[:P]
 * at position 0, then one-token decode steps) and writes out [T, dim],
 * layer.{i}.attn_in / attn_out [T, dim] and, for V3.2, layer.{i}.topk
 * [T, min(index_topk, T)] (token positions attended, -1 padded).  This file
 * adds, for V3.2, cache.{i}.index_k (F8_E4M3 codes [T, Di]) and
 * cache.{i}.index_k_scale (F32 [T, 1]), and with a latent cache
 * cache.{i}.kv_cache [T, kv_lora_rank] and cache.{i}.pe_cache
 * [T, qk_rope_head_dim] (F32 values of the bf16 caches).  --mla naive runs
 * the expanded path and cache (no latent cache to write).
 */
#include "trace.h"

#include "internal.h"
#include "mla.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>

dsattn_status dsattn_trace_mla_caches(dsattn_st_writer *w, const dsattn_mla_seq *seq, int l)
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

