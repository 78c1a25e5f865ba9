/* v4_batch.c - the batched decode step of a V4 (CSA + HCA) stack: one token
 * for each of B sequences of the same model, each at its own position, in
 * one call per layer (dsattn_v4_attn_forward_batch) or for the whole
 * stand-in stack (dsattn_v4_stack_forward_batch).
 *
 * Every weight projection of the layer - query wq_a / wq_b, window wkv,
 * both compressors' wkv / wgate, the indexer's wq_b / weights_proj, the
 * grouped wo_a and wo_b - runs ONCE over the B rows.  Each sequence's
 * window ring, compressor state, index keys and selection are updated by
 * the one-sequence forward's own functions (v4_forward.c) in its order;
 * attention runs as (sequence x head group) tasks in one parallel region,
 * each sequence with its own all-invalid-row rule (dsattn_v4_empty).
 *
 * As for V4.1 (v41_batch.c): a row's arithmetic does not depend on the
 * batch, so reference mode equals B one-sequence steps bit for bit; every
 * sequence is checked before anything is written; the B-row buffers are
 * the context's batch scratch, sized from the sequences' capacities so a
 * steady step allocates nothing.
 */
#include "v4.h"

#include "batch_common.h"
#include "numfmt.h"

#include <math.h>
#include <string.h>

static int seq_info(const void *seqs, size_t i, dsattn_batch_seq_info *info)
{
    const dsattn_v4_seq *s = ((dsattn_v4_seq *const *)seqs)[i];
    if (!s) return 0;
    *info = (dsattn_batch_seq_info){ s, s->m, 0, s->pos, s->max_seq_len, (size_t)s->m->cfg.dim,
                                     s->m->has_weights, s->m->cfg.n_layers };
    return 1;
}

/* ==== Scratch =========================================================== */

typedef struct {
    size_t pos, qr, q, kvw, o, oa, aqs, ckv, cz, ikv, iz, qi, wts, crow, thr, wrow, xin, end;
    size_t cwmax, hg, hper, att_ws, per_thr;
} bplan;

/* cwmax: the widest compressed index row any of the sequences can reach
 * (HCA: every entry up to capacity), so that the plan depends on the
 * sequences' capacities, not on their positions. */
static int plan_batch(const dsattn_v4 *m, size_t B, size_t cap, int nthr, bplan *p)
{
    const dsattn_v4_config *c = &m->cfg;
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank, maxk = DSATTN_MAX(DSATTN_MAX(dim, QL), G * R);
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t T = (size_t)DSATTN_MAX(nthr, 1);
    size_t cmain = 0, cidx = 0;
    p->cwmax = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const dsattn_v4_layer_w *L = &m->layer[l];
        if (L->ratio <= 0) continue;
        const size_t Tc = cap / (size_t)L->ratio;
        if (L->kind == DSATTN_V4_CSA) {
            p->cwmax = DSATTN_MAX(p->cwmax, DSATTN_MIN((size_t)c->index_topk, Tc));
            cidx = DSATTN_MAX(cidx, (L->icomp.overlap ? 2 : 1) * L->icomp.d);
        } else {
            p->cwmax = DSATTN_MAX(p->cwmax, Tc);
        }
        cmain = DSATTN_MAX(cmain, (L->comp.overlap ? 2 : 1) * L->comp.d);
    }
    p->hg = DSATTN_MIN(H, DSATTN_MAX((size_t)1, (T + B - 1) / B));
    p->hper = (H + p->hg - 1) / p->hg;
    p->att_ws = dsattn_sparse_attn_scratch(p->hper, D);
    p->per_thr = p->att_ws + (size_t)c->window_size + p->cwmax + 16;
    const size_t kvb_f = (dsattn_v4_kv_bytes(c) + 3) / 4;
    const dsattn_batch_buf bufs[] = {
        { &p->pos, B, 2 },     { &p->qr, B, QL },     { &p->q, B, H * D },  { &p->kvw, B, D },
        { &p->o, B, H * D },   { &p->oa, B, G * R },  { &p->aqs, B, maxk }, { &p->ckv, B, cmain },
        { &p->cz, B, cmain },  { &p->ikv, B, cidx },  { &p->iz, B, cidx },  { &p->qi, B, Hi * Di },
        { &p->wts, B, Hi },    { &p->crow, B, p->cwmax + 1 }, { &p->thr, T, p->per_thr },
        { &p->wrow, B, kvb_f }, { &p->xin, B, 2 * dim },
    };
    return dsattn_batch_layout(bufs, DSATTN_ARRAY_LEN(bufs), &p->end);
}

static size_t max_cap(dsattn_v4_seq *const *seqs, size_t B)
{
    size_t cap = 0;
    for (size_t i = 0; i < B; i++) cap = DSATTN_MAX(cap, seqs[i]->max_seq_len);
    return cap;
}

/* ==== The batched layer ================================================= */

/* Row i of a batched step: sequence i's one token at pos[i], with its own
 * all-invalid-row rule. */
typedef struct {
    dsattn_v4_seq *const *seqs;
    const int64_t        *pos;
    size_t                B;
    int                   l;
    uint8_t              *wrow;       /* [B, kv_bytes] this step's window rows  */
    const int32_t        *crow;       /* [B, cst] compressed index rows         */
    size_t                cst;
} batch_rows;

static void pack_window(const void *arg, const float *kvw)
{
    const batch_rows *r = arg;
    const dsattn_v4_config *c = &r->seqs[0]->m->cfg;
    const size_t D = (size_t)c->head_dim, rd = (size_t)c->rope_head_dim;
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    for (size_t i = 0; i < r->B; i++) {
        uint8_t *row = r->wrow + i * kvb;
        dsattn_v4_kv_pack(kvw + i * D, D - rd, rd, row, NULL);
        memcpy(r->seqs[i]->layer[r->l].kv + ((size_t)r->pos[i] % w) * kvb, row, kvb);
    }
}

static void batch_row(const void *arg, size_t i, int32_t *idx, dsattn_csa_row_src *src)
{
    const batch_rows *r = arg;
    const dsattn_v4_seq *s = r->seqs[i];
    const dsattn_v4_config *c = &s->m->cfg;
    const dsattn_v4_layer_w *L = &s->m->layer[r->l];
    const dsattn_v4_layer_s *S = &s->layer[r->l];
    const size_t D = (size_t)c->head_dim, rd = (size_t)c->rope_head_dim;
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    const size_t ratio = (size_t)L->ratio;
    const int prefill = r->pos[i] == 0, zero = s->empty == DSATTN_V4_EMPTY_ZERO;
    const size_t T = ratio ? (size_t)(r->pos[i] + 1) / ratio : 0;
    const size_t cw = L->kind == DSATTN_V4_CSA ? DSATTN_MIN((size_t)c->index_topk, T)
                      : L->kind == DSATTN_V4_HCA ? T : 0;
    const dsattn_kv_src wsrc = { DSATTN_KV_V4, prefill ? r->wrow + i * kvb : S->kv, kvb,
                                 prefill ? 1 : w, D, rd };
    const dsattn_kv_src csrc = { DSATTN_KV_V4, S->kv + w * kvb, kvb, T, D, rd };
    *src = (dsattn_csa_row_src){ wsrc, csrc, prefill ? 1 : w, cw, zero ? -1e30f : -INFINITY,
                                 zero };
    if (prefill) dsattn_window_idx_prefill(w, 1, 0, idx);
    else dsattn_window_idx_decode_valid_first(w, r->pos[i], idx);
    if (cw) memcpy(idx + src->ww, r->crow + i * r->cst, cw * sizeof(int32_t));
}

/* A dsattn_layer_fn over the B rows of the step `step`. */
static dsattn_status batch_layer(dsattn_ctx *ctx, void *step, int l, const float *x, size_t B,
                                 float *out)
{
    const dsattn_batch_step *sp = step;
    dsattn_v4_seq *const *seqs = sp->seqs;
    float *base = sp->scratch;
    const bplan *bp = sp->plan;
    const dsattn_v4 *m = seqs[0]->m;
    const dsattn_v4_config *c = &m->cfg;
    const dsattn_v4_layer_w *L = &m->layer[l];
    const size_t dim = (size_t)c->dim, w = (size_t)c->window_size;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t ratio = (size_t)L->ratio;
    int64_t *pos = (int64_t *)(base + bp->pos);
    float *qr = base + bp->qr, *q = base + bp->q, *kvw = base + bp->kvw, *o = base + bp->o;
    float *oa = base + bp->oa, *aqs = base + bp->aqs;
    int32_t *crow = (int32_t *)(base + bp->crow);
    const size_t cst = bp->cwmax + 1;                   /* crow stride */
    uint8_t *wrow = (uint8_t *)(base + bp->wrow);
    dsattn_status st;
    dsattn_phase_mark pm;

    for (size_t i = 0; i < B; i++) pos[i] = seqs[i]->pos;
    const dsattn_attn_rows rows = { B, pos, 0, aqs };

    /* ---- query path (V4's per-head RMS rescale) over the B rows; window
     * KV rows, each into its sequence's ring */
    const batch_rows br = { seqs, pos, B, l, wrow, crow, cst };
    const dsattn_csa_qkv qkv = { x, qr, q, NULL, NULL, kvw, pack_window, &br };
    if ((st = dsattn_csa_query_kv(ctx, &L->attn, &rows, &qkv))) return st;

    /* ---- compressed branch: index rows (CSA) or every entry (HCA), then
     * the main compressor */
    if (L->kind == DSATTN_V4_CSA) {
        const dsattn_v4_compressor_w *C = &L->icomp;
        const size_t cd = (C->overlap ? 2 : 1) * C->d;
        float *ikv = base + bp->ikv, *iz = base + bp->iz;
        float *qi = base + bp->qi, *wts = base + bp->wts;
        dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
        st = dsattn_index_query(ctx, &L->attn, &rows, qr, qi);
        if (!st) st = dsattn_linear(ctx, &C->wkv, x, dim, B, ikv, cd, DSATTN_OUT_F32, NULL, NULL);
        if (!st) st = dsattn_linear(ctx, &C->wgate, x, dim, B, iz, cd, DSATTN_OUT_F32, NULL, NULL);
        if (!st) st = dsattn_index_weights(ctx, &L->i_wproj, x, B, Hi, Di, wts);
        for (size_t i = 0; i < B && !st; i++) {
            dsattn_v4_seq *s = seqs[i];
            const dsattn_v4_chunk ck = { 1, pos[i], pos[i] == 0 };
            const size_t T = (size_t)(pos[i] + 1) / ratio;
            const size_t cw = DSATTN_MIN((size_t)c->index_topk, T);
            if (cw > 0) {
                const dsattn_v4_index_pre pre = { qi + i * Hi * Di, wts + i * Hi, ikv + i * cd,
                                                  iz + i * cd };
                st = dsattn_v4_index_rows(ctx, s, l, &ck, pos[i] == 0 ? 1 : w, crow + i * cst,
                                          cw, &pre);
            } else {
                s->layer[l].sel_rows = 1;
                s->layer[l].sel_w = 0;
                /* the indexer's compressor still runs (its state fills up) */
                st = dsattn_v4_compress_rows(ctx, s, l, 1, &ck, ikv + i * cd, iz + i * cd);
            }
        }
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
    } else if (L->kind == DSATTN_V4_HCA) {
        for (size_t i = 0; i < B; i++) {
            const size_t T = (size_t)(pos[i] + 1) / ratio, off = pos[i] == 0 ? 1 : w;
            for (size_t j = 0; j < T; j++) crow[i * cst + j] = (int32_t)(j + off);
        }
    }
    if (ratio > 0) {
        const dsattn_v4_compressor_w *C = &L->comp;
        const size_t cd = (C->overlap ? 2 : 1) * C->d;
        float *ckv = base + bp->ckv, *cz = base + bp->cz;
        dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
        st = dsattn_linear(ctx, &C->wkv, x, dim, B, ckv, cd, DSATTN_OUT_F32, NULL, NULL);
        if (!st) st = dsattn_linear(ctx, &C->wgate, x, dim, B, cz, cd, DSATTN_OUT_F32, NULL, NULL);
        for (size_t i = 0; i < B && !st; i++) {
            const dsattn_v4_chunk ck = { 1, pos[i], pos[i] == 0 };
            st = dsattn_v4_compress_rows(ctx, seqs[i], l, 0, &ck, ckv + i * cd, cz + i * cd);
        }
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
    }

    /* ---- attention: (sequence, head group) tasks, each output computed
     * by one thread in one order, as in the one-sequence forward; then
     * inverse RoPE at each row's position, grouped wo_a, wo_b */
    const dsattn_csa_attend job = { q, o, oa, out, L->sink, bp->hg, bp->hper, bp->att_ws,
                                    bp->per_thr, base + bp->thr, batch_row, &br };
    return dsattn_csa_attend_output(ctx, &L->attn, &rows, &job);
}

/* ==== Public entry points =============================================== */

static dsattn_status attn_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs, size_t B, int layer,
                                const float *x, float *out, size_t *failed)
{
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, B, seq_info, x, out, &layer, failed);
    if (st) return st;
    const dsattn_v4 *m = seqs[0]->m;
    if (layer < 0 || layer >= m->cfg.n_layers) return DSATTN_ERR_INVALID_ARG;
    for (size_t i = 0; i < B; i++)
        if (!dsattn_v4_seq_holds(seqs[i], layer)) {    /* a sequence of other layers */
            *failed = i;
            return DSATTN_ERR_INVALID_ARG;
        }
    bplan bp;
    if (!plan_batch(m, B, max_cap(seqs, B), ctx->n_threads, &bp)) return DSATTN_ERR_OVERFLOW;
    float *base = dsattn_ctx_scratch(ctx, DSATTN_CTX_SCR_BATCH, bp.end * sizeof(float) + 64);
    if (!base) return DSATTN_ERR_NOMEM;
    dsattn_batch_step sp = { seqs, base, &bp, NULL };
    return batch_layer(ctx, &sp, layer, x, B, out);
}

/* The stand-in stack's norm of layer l (a dsattn_norm_fn of the step). */
static const float *batch_norm(const void *step, int l)
{
    const dsattn_batch_step *sp = step;
    return ((dsattn_v4_seq *const *)sp->seqs)[0]->m->layer[l].attn_norm;
}

static dsattn_status stack_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs, size_t B, float *h,
                                 float *attn_in, float *attn_out, size_t *failed)
{
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, B, seq_info, h, h, NULL, failed);
    if (st) return st;
    for (size_t i = 0; i < B; i++)
        if (!dsattn_v4_seq_whole(seqs[i])) {           /* the stack runs every layer */
            *failed = i;
            return DSATTN_ERR_INVALID_ARG;
        }
    const dsattn_v4 *m = seqs[0]->m;
    const dsattn_v4_config *c = &m->cfg;
    const size_t dim = (size_t)c->dim;
    bplan bp;
    if (!plan_batch(m, B, max_cap(seqs, B), ctx->n_threads, &bp)) return DSATTN_ERR_OVERFLOW;
    float *base = dsattn_ctx_scratch(ctx, DSATTN_CTX_SCR_BATCH, bp.end * sizeof(float) + 64);
    if (!base) return DSATTN_ERR_NOMEM;
    dsattn_batch_step sp = { seqs, base, &bp, NULL };
    float *xin = base + bp.xin;
    if ((st = dsattn_standin_rows(ctx, &sp, batch_layer, batch_norm, (size_t)c->n_layers, dim,
                                  c->norm_eps, h, B, xin, xin + B * dim, attn_in, attn_out)))
        return st;
    for (size_t i = 0; i < B; i++) seqs[i]->pos += 1;
    return DSATTN_OK;
}

/* *failed is written only when the call fails */
dsattn_status dsattn_v4_attn_forward_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs,
                                           size_t n_seqs, int layer, const float *x, float *out,
                                           size_t *failed)
{
    size_t bad = SIZE_MAX;
    return dsattn_batch_result(attn_batch(ctx, seqs, n_seqs, layer, x, out, &bad), &bad, failed);
}

dsattn_status dsattn_v4_stack_forward_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs,
                                            size_t n_seqs, float *h, float *attn_in,
                                            float *attn_out, size_t *failed)
{
    size_t bad = SIZE_MAX;
    return dsattn_batch_result(stack_batch(ctx, seqs, n_seqs, h, attn_in, attn_out, &bad), &bad,
                               failed);
}
