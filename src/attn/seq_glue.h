/* seq_glue.h - the public functions every generation's sequence has alike,
 * written once as macros that a generation's forward file expands: the
 * position accessor and advance (dsattn_<g>_seq_pos / _seq_advance) and the
 * golden cases' stand-in stack (dsattn_<g>_stack_forward: the shared loop
 * of src/ops, dsattn_standin_stack, over the generation's layer forward),
 * and the per-token field of the KV bill.
 *
 * Of the sequence type dsattn_<g>_seq they read only the fields pos,
 * max_seq_len, ws and m (whose cfg.n_layers, cfg.dim and layer[l].attn_norm
 * the stack reads; the norm epsilon is the cfg field the caller names).  The
 * stack refuses a sequence for which the caller's WHOLE(seq) is false (one
 * holding only some layers' caches); DSATTN_SEQ_WHOLE_ALWAYS where every
 * sequence holds them all.
 */
#ifndef DSATTN_SEQ_GLUE_H
#define DSATTN_SEQ_GLUE_H

#include "ops.h"

#define DSATTN_SEQ_POS_API(g)                                                           \
    int64_t dsattn_##g##_seq_pos(const dsattn_##g##_seq *s) { return s ? s->pos : -1; } \
                                                                                        \
    dsattn_status dsattn_##g##_seq_advance(dsattn_##g##_seq *s, size_t n)               \
    {                                                                                   \
        if (!s || n == 0 || n > s->max_seq_len - (size_t)s->pos)                        \
            return DSATTN_ERR_INVALID_ARG;                                              \
        s->pos += (int64_t)n;                                                           \
        return DSATTN_OK;                                                               \
    }

#define DSATTN_SEQ_WHOLE_ALWAYS(seq) 1

#define DSATTN_STANDIN_STACK_API(g, EPS, WHOLE)                                         \
    static dsattn_status g##_standin_layer(dsattn_ctx *ctx, void *seq, int l,           \
                                           const float *x, size_t n, float *out)        \
    {                                                                                   \
        return dsattn_##g##_attn_forward(ctx, (dsattn_##g##_seq *)seq, l, x, n, out);   \
    }                                                                                   \
    static const float *g##_standin_norm(const void *seq, int l)                        \
    {                                                                                   \
        return ((const dsattn_##g##_seq *)seq)->m->layer[l].attn_norm;                  \
    }                                                                                   \
    dsattn_status dsattn_##g##_stack_forward(dsattn_ctx *ctx, dsattn_##g##_seq *seq,    \
                                             float *h, size_t n, float *attn_in,        \
                                             float *attn_out)                           \
    {                                                                                   \
        if (!ctx || !seq || !h || n == 0 || n > seq->max_seq_len - (size_t)seq->pos ||  \
            !WHOLE(seq))                                                                \
            return DSATTN_ERR_INVALID_ARG;                                              \
        dsattn_status st = dsattn_standin_stack(                                        \
            ctx, seq, g##_standin_layer, g##_standin_norm, (size_t)seq->m->cfg.n_layers, \
            (size_t)seq->m->cfg.dim, seq->m->cfg.EPS, h, n, attn_in, attn_out, &seq->ws); \
        return st ? st : dsattn_##g##_seq_advance(seq, n);                              \
    }

/* The last field of a sequence's dsattn_kv_bill: global bytes per token of
 * its capacity.  Returns DSATTN_OK, for the bill function to return. */
static inline dsattn_status dsattn_kv_bill_per_token(dsattn_kv_bill *b, size_t max_seq_len)
{
    b->global_bytes_per_token = (double)b->global_bytes_allocated / (double)max_seq_len;
    return DSATTN_OK;
}

#endif /* DSATTN_SEQ_GLUE_H */
