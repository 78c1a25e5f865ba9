/* trace_tensors.c - the tensor writers every part of `dsattn trace` uses:
 * one F32 tensor, a generation's packed caches with their decoded twins
 * (cache.{l}.{name} as stored, cache.{l}.{name}_deq as fp32), and the FP4
 * index-key row decoder V4 and V4.1 share.  trace.c (the protocol) and the
 * per-generation cache lists (trace_v3.c, trace_v4.c, trace_v41.c) call
 * them; they call nothing of those. */
#include "trace.h"

#include "internal.h"
#include "numfmt.h"

#include <stdio.h>

dsattn_status dsattn_trace_add_f32(dsattn_st_writer *w, const char *name, const float *v,
                                   size_t r, size_t c)
{
    int64_t shape[2] = { (int64_t)r, (int64_t)c };
    return dsattn_st_writer_add(w, name, DSATTN_DT_F32, 2, shape, v);
}

dsattn_status dsattn_trace_add_caches(dsattn_st_writer *w, int l, const dsattn_trace_cache *caches,
                                      int n, dsattn_status (*get)(const void *seq, int l, int which,
                                                                  const uint8_t **rows, size_t *n_rows,
                                                                  size_t *row_bytes),
                                      const void *seq)
{
    dsattn_status st = DSATTN_OK;
    for (int which = 0; which < n && !st; which++) {
        const dsattn_trace_cache *c = &caches[which];
        const uint8_t *rows;
        size_t nr, rb;
        if ((st = get(seq, l, which, &rows, &nr, &rb))) {
            if (st == DSATTN_ERR_NOT_FOUND) st = DSATTN_OK;
            continue;
        }
        char nm[128];
        int64_t shape[2] = { (int64_t)nr, (int64_t)rb };
        snprintf(nm, sizeof nm, "cache.%d.%s", l, c->name);
        if ((st = dsattn_st_writer_add(w, nm, DSATTN_DT_U8, 2, shape, rows))) break;
        float *deq = dsattn_alloc_array(nr * c->d + 1, sizeof(float));
        if (!deq) return DSATTN_ERR_NOMEM;
        for (size_t i = 0; i < nr; i++) c->unpack(rows + i * rb, c->d, deq + i * c->d, seq);
        snprintf(nm, sizeof nm, "cache.%d.%s_deq", l, c->name);
        st = dsattn_trace_add_f32(w, nm, deq, nr, c->d);
        dsattn_free(deq);
    }
    return st;
}

void dsattn_trace_unpack_fp4_index(const uint8_t *row, size_t d, float *out, const void *seq)
{
    dsattn_fp4_index_unpack(row, d, out);
}
