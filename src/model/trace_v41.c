/* trace_v41.c - the CSA2 (V4.1) part of `dsattn trace`: the caches.
 *
 * trace.c runs the golden protocol over a dsattn_v41 stack and writes out
 * [T, dim] (final residual), layer.{i}.attn_in / attn_out [T, dim] and
 * layer.{i}.topk [T, min(index_topk, T)] for every index source
 * (compressed-entry indices j, ascending, -1 padded).  This file adds the
 * packed caches: cache.{i}.window_kv (every layer), cache.{i}.compress_kv
 * and cache.{i}.index_k (KV sources), each with a _deq F32 twin.
 */
#include "trace.h"

#include "internal.h"
#include "numfmt.h"
#include "safetensors.h"
#include "v41.h"

#include <stdio.h>
#include <stdlib.h>

/* The window and compressed rows' decoders; d is the row's width. */
static void unpack_window(const uint8_t *row, size_t d, float *out, const void *seq)
{
    dsattn_v41_swa_unpack(row, d, out);
}

static void unpack_compressed(const uint8_t *row, size_t d, float *out, const void *seq)
{
    dsattn_v41_kv_unpack(row, d, out);
}

static dsattn_status get_cache(const void *seq, int l, int which, const uint8_t **rows,
                               size_t *n, size_t *row_bytes)
{
    return dsattn_v41_seq_cache(seq, l, which, rows, n, row_bytes);
}

dsattn_status dsattn_trace_v41_caches(dsattn_st_writer *w, const dsattn_v41_seq *s, int l)
{
    const size_t D = (size_t)s->m->cfg.head_dim, Di = (size_t)s->m->cfg.index_head_dim;
    const dsattn_trace_cache caches[] = {
        { "window_kv", D, unpack_window },
        { "compress_kv", D, unpack_compressed },
        { "index_k", Di, dsattn_trace_unpack_fp4_index },
    };
    return dsattn_trace_add_caches(w, l, caches, 3, get_cache, s);
}
