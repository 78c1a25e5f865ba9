/* v41_ced.c - CED prefill of a V4.1 (CSA2) stack: which rows each layer needs
 * for a prompt (the exact tail rule and bounded replay), and the stand-in
 * stack's prefill that runs each layer over only those rows.
 *
 * The rule is derived from the plan, not from layer numbers: the last KV
 * source S (its compressor and index keys take every prompt token) and every
 * layer before it need all rows; a layer after S carries only its window
 * ring into decode, so it needs its input for the rows its window reaches
 * from the rows the next layer needs (docs/v41.md, "CED prefill", has the
 * argument).  The per-layer forward over a suffix of the chunk is
 * dsattn_v41_attn_forward_rows (v41_forward.c).
 */
#include "v41.h"

#include <string.h>

static int last_kv_source(const dsattn_v41 *m)
{
    int S = -1;
    for (int l = 0; l < (int)m->cfg.n_layers; l++)
        if (m->layer[l].is_kv_source) S = l;
    return S;
}

dsattn_status dsattn_v41_ced_plan(const dsattn_v41 *m, size_t n, dsattn_v41_ced mode,
                                  dsattn_v41_ced_rows *rows)
{
    if (!m || !rows || n == 0) return DSATTN_ERR_INVALID_ARG;
    if (mode != DSATTN_V41_CED_OFF && mode != DSATTN_V41_CED_EXACT &&
        mode != DSATTN_V41_CED_BOUNDED)
        return DSATTN_ERR_INVALID_ARG;
    const int L = (int)m->cfg.n_layers, S = last_kv_source(m);
    const size_t w = (size_t)m->cfg.window_size;
    for (int l = 0; l < L; l++) rows[l].in_first = rows[l].out_first = 0;
    if (mode == DSATTN_V41_CED_OFF) return DSATTN_OK;
    /* the decoder, last layer first: the next layer's first input row is
     * this layer's first output row; only the prompt's last token leaves the
     * stack */
    size_t next_in = n - 1;
    for (int l = L - 1; l > S; l--) {
        rows[l].out_first = next_in;
        if (mode == DSATTN_V41_CED_EXACT)
            rows[l].in_first = next_in > w - 1 ? next_in - (w - 1) : 0;
        else
            rows[l].in_first = n > w ? n - w : 0;
        if (mode == DSATTN_V41_CED_BOUNDED && l < L - 1) rows[l].out_first = rows[l].in_first;
        next_in = rows[l].in_first;
    }
    if (S >= 0) rows[S].out_first = next_in;          /* every input row, these outputs */
    return DSATTN_OK;
}

dsattn_status dsattn_v41_ced_work(const dsattn_v41 *m, size_t n, dsattn_v41_ced mode,
                                  uint64_t *in_rows, uint64_t *out_rows)
{
    dsattn_v41_ced_rows r[DSATTN_MAX_LAYERS];
    dsattn_status st = dsattn_v41_ced_plan(m, n, mode, r);
    if (st) return st;
    uint64_t a = 0, b = 0;
    for (int l = 0; l < (int)m->cfg.n_layers; l++) {
        a += n - r[l].in_first;
        b += n - r[l].out_first;
    }
    if (in_rows) *in_rows = a;
    if (out_rows) *out_rows = b;
    return DSATTN_OK;
}

dsattn_status dsattn_v41_stack_prefill(dsattn_ctx *ctx, dsattn_v41_seq *seq, float *h, size_t n,
                                       dsattn_v41_ced mode, float *attn_out)
{
    if (!ctx || !seq || !h || n == 0 || n > seq->max_seq_len - (size_t)seq->pos)
        return DSATTN_ERR_INVALID_ARG;
    if (mode == DSATTN_V41_CED_OFF) return dsattn_v41_stack_forward(ctx, seq, h, n, NULL, attn_out);
    if (seq->pos != 0) return DSATTN_ERR_UNSUPPORTED;       /* a prompt at position 0 */
    const dsattn_v41 *m = seq->m;
    const size_t L = (size_t)m->cfg.n_layers, dim = (size_t)m->cfg.dim;
    dsattn_v41_ced_rows r[DSATTN_MAX_LAYERS];
    dsattn_status st = dsattn_v41_ced_plan(m, n, mode, r);
    if (st) return st;
    if (attn_out) {
        size_t total;
        if (!dsattn_mul3_size(L, n, dim, &total)) return DSATTN_ERR_OVERFLOW;
        memset(attn_out, 0, total * sizeof(float));
    }
    const dsattn_ws_pos mark = dsattn_ws_mark(&seq->ws);
    float *xin = dsattn_ws_array(&seq->ws, 2 * n * dim, sizeof(float));
    if (!xin) return DSATTN_ERR_NOMEM;
    float *xout = xin + n * dim;
    for (size_t l = 0; l < L && !st; l++) {
        const size_t a = r[l].in_first, b = r[l].out_first;
        for (size_t t = a; t < n; t++)
            dsattn_rmsnorm(h + t * dim, m->layer[l].attn_norm, dim, m->cfg.norm_eps,
                           xin + (t - a) * dim, DSATTN_OUT_BF16);
        if ((st = dsattn_v41_attn_forward_rows(ctx, seq, (int)l, xin, n - a, a, b - a, xout)))
            break;
        for (size_t i = 0; i < (n - b) * dim; i++) h[b * dim + i] = h[b * dim + i] + xout[i];
        if (attn_out) memcpy(attn_out + (l * n + b) * dim, xout, (n - b) * dim * sizeof(float));
    }
    dsattn_ws_put(&seq->ws, xin);
    dsattn_ws_reset(&seq->ws, mark);
    if (!st) seq->pos += (int64_t)n;
    return st;
}
