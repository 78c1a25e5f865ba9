/* csa_attend.c - the phases of a V4 / V4.1 layer step written once for the
 * one-sequence forwards (v4_forward.c, v41_forward.c, the CED row forward)
 * and the batched ones (v4_batch.c, v41_batch.c): the query and window-KV
 * projections (the generation packs the new window rows), and the
 * attention - one sparse attention per (row, head group) task over the
 * row's window and compressed entries - followed by the inverse RoPE and
 * grouped output projection (dsattn_attn_output); a prompt's heads, that
 * attention and the output a block of rows at a time
 * (dsattn_csa_prompt_attend).
 *
 * Each output is computed by one thread in one order, so the result does
 * not depend on the thread count.  What differs between the callers - which
 * entries a row's index row names, and from which caches - is the caller's
 * `row` function (csa.h, dsattn_csa_attend); the index row of a chunk of
 * one sequence is dsattn_csa_chunk_row here.
 */
#include "csa.h"

#include <math.h>
#include <string.h>

dsattn_status dsattn_csa_query_kv(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                  const dsattn_attn_rows *rows, const dsattn_csa_qkv *j)
{
    dsattn_phase_mark pm;
    dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
    dsattn_status st = dsattn_attn_query(ctx, a, rows, j->x, j->qr, j->q);
    dsattn_phase_end(ctx, &pm);
    if (st) return st;
    dsattn_phase_begin(ctx, DSATTN_PHASE_KV, &pm);
    st = dsattn_attn_window_kv(ctx, a, j->krows ? j->krows : rows, j->kx ? j->kx : j->x, j->kvw);
    if (!st) j->pack(j->arg, j->kvw);
    dsattn_phase_end(ctx, &pm);
    return st;
}

dsattn_status dsattn_csa_attend_output(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                       const dsattn_attn_rows *rows, const dsattn_csa_attend *j)
{
    const size_t H = a->H, D = a->D, hg = j->hg, hper = j->hper;
    const int nthr = DSATTN_MAX(ctx->n_threads, 1);
    const float scale = (float)pow((double)D, -0.5);
    const size_t n_tasks = rows->n * hg;
    dsattn_phase_mark pm;
    dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
    DSATTN_PARALLEL_FOR_DYN(nthr, task, n_tasks, {
        const size_t t = task / hg, h0 = (task % hg) * hper;
        const size_t nhh = DSATTN_MIN(hper, H - DSATTN_MIN(H, h0));
        if (nhh == 0) continue;
        float *ws = j->thr_ws + (size_t)dsattn_thread_num() * j->per_thr;
        int32_t *idx = (int32_t *)(ws + j->att_ws);
        dsattn_csa_row_src src;
        j->row(j->arg, t, idx, &src);
        const size_t n_idx = src.ww + src.cw;
        float *ot = j->o + (t * H + h0) * D;
        if (src.zero_empty) {
            size_t nv = 0;
            for (size_t i = 0; i < n_idx; i++) nv += idx[i] >= 0;
            if (nv == 0) { memset(ot, 0, nhh * D * sizeof(float)); continue; }
        }
        dsattn_sparse_attn(ctx, j->q + (t * H + h0) * D, nhh, D, &src.wsrc,
                           src.cw ? &src.csrc : NULL, idx, n_idx, j->sink ? j->sink + h0 : NULL,
                           scale, src.max_init, ot, ws);
    });
    dsattn_phase_end(ctx, &pm);

    dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);
    dsattn_status st = dsattn_attn_output(ctx, a, rows, j->o, j->oa, j->out);
    dsattn_phase_end(ctx, &pm);
    return st;
}

size_t dsattn_csa_prompt_block = 256;

/* Row t0 + t of a caller's rows: the attention of one block of them. */
typedef struct {
    void       (*row)(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src);
    const void  *arg;
    size_t       t0;
} block_rows;

static void block_row(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src)
{
    const block_rows *b = arg;
    b->row(b->arg, b->t0 + t, idx, src);
}

dsattn_status dsattn_csa_prompt_attend(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                       const dsattn_attn_rows *rows, const float *qr, float *q,
                                       size_t qb, const dsattn_csa_attend *j)
{
    if (rows->pos || !j->row || qb == 0) return DSATTN_ERR_INVALID_ARG;
    const size_t QL = a->wq_a->rows, dim = a->wo_b->rows;
    dsattn_phase_mark pm;
    for (size_t t0 = 0; t0 < rows->n; t0 += qb) {
        const size_t nb = DSATTN_MIN(qb, rows->n - t0);
        const dsattn_attn_rows brows = { nb, NULL, rows->start_pos + (int64_t)t0, rows->aqs };
        dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
        dsattn_status st = dsattn_attn_query_heads(ctx, a, &brows, qr + t0 * QL, q);
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
        const block_rows br = { j->row, j->arg, t0 };
        dsattn_csa_attend bj = *j;
        bj.q = q;
        bj.out = j->out + t0 * dim;
        bj.row = block_row;
        bj.arg = &br;
        if ((st = dsattn_csa_attend_output(ctx, a, &brows, &bj))) return st;
    }
    return DSATTN_OK;
}

void dsattn_csa_chunk_row(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src)
{
    const dsattn_csa_chunk_rows *r = arg;
    const dsattn_csa_chunk *ck = r->ck;
    if (ck->prefill) dsattn_window_idx_prefill(r->w, ck->s, t, idx);
    else if (r->valid_first) dsattn_window_idx_decode_valid_first(r->w, ck->start_pos, idx);
    else dsattn_window_idx_decode(r->w, ck->start_pos, idx);
    *src = r->src;
    if (src->cw) memcpy(idx + src->ww, r->cidx + t * src->cw, src->cw * sizeof(int32_t));
}
