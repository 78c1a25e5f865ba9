/* batch_common.c - the checks, scratch offsets and public-call result rule
 * batched decode step shares (batch_common.h); the generations' own
 * checks (a layer's runtime slots, V4.1) stay in their batch files.
 */
#include "batch_common.h"

#include "ops.h"

#include <string.h>

dsattn_status dsattn_batch_check_seqs(const dsattn_ctx *ctx, const void *seqs, size_t B,
                                      dsattn_batch_info_fn info, const void *x,
                                      const void *out, const int *layer, size_t *failed)
{
    *failed = SIZE_MAX;
    if (!ctx || !seqs || !x || !out || B == 0) return DSATTN_ERR_INVALID_ARG;
    dsattn_batch_seq_info first = { 0 }, s, o;
    for (size_t i = 0; i < B; i++) {
        *failed = i;
        if (!info(seqs, i, &s)) return DSATTN_ERR_INVALID_ARG;
        if (i == 0) first = s;
        if (s.model != first.model || s.variant != first.variant) return DSATTN_ERR_INVALID_ARG;
        if (s.pos < 0 || (size_t)s.pos >= s.max_seq_len) return DSATTN_ERR_INVALID_ARG;
        for (size_t j = 0; j < i; j++)
            if (info(seqs, j, &o) && o.seq == s.seq) return DSATTN_ERR_INVALID_ARG;
    }
    *failed = SIZE_MAX;
    size_t n;
    if (!dsattn_mul_size(B, first.dim, &n) || n > SIZE_MAX / sizeof(float))
        return DSATTN_ERR_OVERFLOW;
    if (layer && (*layer < 0 || *layer >= first.n_layers)) return DSATTN_ERR_INVALID_ARG;
    if (!first.has_weights) return DSATTN_ERR_UNSUPPORTED;   /* config only */
    return DSATTN_OK;
}

int dsattn_batch_layout(const dsattn_batch_buf *bufs, size_t n, size_t *end)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (!dsattn_mul_size(bufs[i].a, bufs[i].b, &k) || !dsattn_add_size(k, 15, &k))
            return 0;
        *bufs[i].off = at;
        if (!dsattn_add_size(at, k / 16 * 16, &at)) return 0;
    }
    *end = at;
    return at <= SIZE_MAX / sizeof(float) - 64;
}

dsattn_status dsattn_batch_result(dsattn_status st, const size_t *bad, size_t *failed)
{
    if (st && failed) *failed = *bad;
    return st;
}
