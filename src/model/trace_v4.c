/* trace_v4.c - the CSA + HCA (V4) part of `dsattn trace`: the caches.
 *
 * trace.c runs the golden protocol over a dsattn_v4 stack and writes out
 * [T, dim] (final residual), layer.{i}.attn_in / attn_out [T, dim] and, for
 * CSA layers, layer.{i}.topk [T, min(index_topk, T)] (compressed-entry
 * indices j, ascending, -1 padded: compare as sets) and trace.{i}.topk_order
 * (the same picks in the reference's score order).  This file adds the
 * packed caches: cache.{i}.kv (the layer's one KV buffer: window ring rows,
 * then the T // ratio compressed entries, MODEL1 rows) and, for CSA,
 * cache.{i}.index_kv, each with a _deq F32 twin.
 */
#include "trace.h"

#include "internal.h"
#include "numfmt.h"
#include "safetensors.h"
#include "v4.h"

#include <stdio.h>
#include <stdlib.h>

/* The KV rows' decoder (MODEL1: the non-rope FP8 part, then the rope
 * tail); d is the row's width. */
static void unpack_kv(const uint8_t *row, size_t d, float *out, const void *seq)
{
    const size_t rd = (size_t)((const dsattn_v4_seq *)seq)->m->cfg.rope_head_dim;
    dsattn_v4_kv_unpack(row, d - rd, rd, out);
}

static dsattn_status get_cache(const void *seq, int l, int which, const uint8_t **rows,
                               size_t *n, size_t *row_bytes)
{
    return dsattn_v4_seq_cache(seq, l, which, rows, n, row_bytes);
}

dsattn_status dsattn_trace_v4_caches(dsattn_st_writer *w, const dsattn_v4_seq *s, int l)
{
    const dsattn_v4_config *c = &s->m->cfg;
    const dsattn_trace_cache caches[] = {
        { "kv", (size_t)c->head_dim, unpack_kv },
        { "index_kv", (size_t)c->index_head_dim, dsattn_trace_unpack_fp4_index },
    };
    return dsattn_trace_add_caches(w, l, caches, 2, get_cache, s);
}
