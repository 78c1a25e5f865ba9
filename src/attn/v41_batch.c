/* v41_batch.c - the batched decode step of a V4.1 (CSA2) stack: one token
 * for each of B sequences of the same model, each at its own position, in
 * one call per layer (dsattn_v41_attn_forward_batch) or for the whole
 * stand-in stack (dsattn_v41_stack_forward_batch).
 *
 * Every weight projection of the layer - query wq_a / wq_b, window wkv,
 * the compressor's wkv / wgate, the indexer's wk / wq_b / weights_proj,
 * the grouped wo_a and wo_b - runs ONCE over the B rows, so the weights
 * stream once per step whatever B is.  What belongs to a sequence stays
 * with it: its window ring, compressor state, index keys, candidate pool,
 * top-k and runtime slots, updated by the same functions and in the same
 * order as the one-sequence forward (v41_forward.c).  Attention runs as
 * (sequence x head group) tasks in one parallel region.
 *
 * Batching changes the order of work, never a row's arithmetic: each
 * projection output row depends on its own input row only (a reference
 * mode Linear is one GEMV per row), so in reference mode the batched step
 * equals B one-sequence steps bit for bit.  In fast mode an FP8 or bf16
 * projection of up to 16 rows (AMX contexts: up to 7) runs the kernel
 * table's multi-token GEMV (each weight block decoded once for every row),
 * from 4 rows the bf16-dot GEMM where the table has it, more rows the tiled
 * path; their fp32 sums differ from the one-row GEMV's in the last bits.
 *
 * Every sequence is checked before a layer writes anything: on an error
 * (an allocation failure inside the step excepted) no sequence and no
 * output row has changed.  The stack over the batch checks its first layer
 * so; a later layer's checks hold by what the earlier layers of the step
 * leave, as in the one-sequence stack.  The B-row buffers live in the
 * context's batch scratch (grow-only), the per-sequence buffers in each
 * sequence's own decode scratch, so a steady batched step allocates
 * nothing.
 */
#include "v41.h"

#include "batch_common.h"
#include "numfmt.h"

#include <math.h>
#include <string.h>

/* ==== Validation ======================================================== */

static void set_failed(size_t *failed, size_t i)
{
    *failed = i;
}

/* The sequence-level checks (batch_common.c) see one model and one
 * index_k mode. */
static int seq_info(const void *seqs, size_t i, dsattn_batch_seq_info *info)
{
    const dsattn_v41_seq *s = ((dsattn_v41_seq *const *)seqs)[i];
    if (!s) return 0;
    *info = (dsattn_batch_seq_info){ s, s->m, (int)s->index_k_mode, s->pos, s->max_seq_len,
                                     (size_t)s->m->cfg.dim, s->m->layer[0].wq_a.data != NULL,
                                     s->m->cfg.n_layers };
    return 1;
}

/* New compressed entries this token completes in a KV source of ratio m. */
static size_t entries_new(int64_t pos, size_t m)
{
    return (size_t)(pos + 1) / m - (size_t)pos / m;
}

/* What the one-sequence forward of layer l would refuse midway (runtime
 * slots out of step with the calling protocol), checked up front. */
static dsattn_status check_layer(dsattn_v41_seq *const *seqs, size_t B, int l, size_t *failed)
{
    const dsattn_v41 *m = seqs[0]->m;
    const dsattn_v41_layer_w *L = &m->layer[l];
    if (L->ratio <= 0) return DSATTN_OK;
    const size_t ratio = (size_t)L->ratio;
    for (size_t i = 0; i < B; i++) {
        const dsattn_v41_seq *s = seqs[i];
        set_failed(failed, i);
        if (L->is_kv_source && ratio > 1 &&
            s->iscratch_size < dsattn_v41_compress_pool_scratch(m, l))
            return DSATTN_ERR_NOMEM;
        if (!L->is_kv_source && s->rt.compress_kv < 0) return DSATTN_ERR_INVALID_ARG;
        if (!L->is_index_source) {
            if (!s->rt.topk_valid || s->rt.topk_rows != 1) return DSATTN_ERR_INVALID_ARG;
        } else if ((size_t)(s->pos + 1) / ratio > 0) {
            const size_t nn = L->is_kv_source ? entries_new(s->pos, ratio) : 0;
            const int kl = L->owns_k && (nn > 0 || s->index_k_mode == DSATTN_V41_INDEX_K_OWNER)
                               ? l
                               : s->rt.index_k;
            if (kl < 0 || !s->layer[kl].kidx) return DSATTN_ERR_INVALID_ARG;
            if (L->uses_candidates && (!s->rt.cand_valid || s->rt.cand_rows != 1))
                return DSATTN_ERR_INVALID_ARG;
        }
    }
    set_failed(failed, SIZE_MAX);
    return DSATTN_OK;
}

/* ==== Scratch =========================================================== */

/* The batch scratch of one layer step over B rows with nthr threads, in
 * floats: offsets of each buffer, 16-float aligned. */
typedef struct {
    size_t pos, qr, q, kvw, o, oa, lat, aqs, ckz, kk, qi, wts, nnew, thr, wrow, xin, end;
    size_t hg, hper, att_ws, per_thr;
} bplan;

/* 0 on size overflow.  The stand-in stack's rows are always included, so
 * that after a step of B sequences neither call grows the scratch for B
 * or fewer. */
static int plan_batch(const dsattn_v41_config *c, size_t B, int nthr, bplan *p)
{
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank, maxk = dsattn_v41_actq_cols(c);
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t T = (size_t)DSATTN_MAX(nthr, 1);
    /* head groups per sequence: enough tasks for the threads */
    p->hg = DSATTN_MIN(H, DSATTN_MAX((size_t)1, (T + B - 1) / B));
    p->hper = (H + p->hg - 1) / p->hg;
    p->att_ws = dsattn_sparse_attn_scratch(p->hper, D);
    p->per_thr = p->att_ws + (size_t)c->window_size + (size_t)c->index_topk + 16;
    const size_t swab_f = (dsattn_v41_swa_bytes(c) + 3) / 4;
    const dsattn_batch_buf bufs[] = {
        { &p->pos, B, 2 },   { &p->qr, B, QL },     { &p->q, B, H * D },   { &p->kvw, B, D },
        { &p->o, B, H * D }, { &p->oa, B, G * R },  { &p->lat, B, D },     { &p->aqs, B, maxk },
        { &p->ckz, B, 2 * D }, { &p->kk, B, Di },   { &p->qi, B, Hi * Di }, { &p->wts, B, Hi },
        { &p->nnew, B, 4 },  { &p->thr, T, p->per_thr }, { &p->wrow, B, swab_f },
        { &p->xin, B, 2 * dim },
    };
    return dsattn_batch_layout(bufs, DSATTN_ARRAY_LEN(bufs), &p->end);
}

static float *batch_scratch(dsattn_ctx *ctx, const bplan *p)
{
    return dsattn_ctx_scratch(ctx, DSATTN_CTX_SCR_BATCH, p->end * sizeof(float) + 64);
}

/* ==== The batched layer ================================================= */

/* Row i of a batched step: sequence i's one token at pos[i]. */
typedef struct {
    dsattn_v41_seq *const *seqs;
    const int64_t         *pos;
    size_t                 B;
    int                    l;
    uint8_t               *wrow;      /* [B, swa_bytes] this step's window rows */
} batch_rows;

static void pack_window(const void *arg, const float *kvw)
{
    const batch_rows *r = arg;
    const dsattn_v41_config *c = &r->seqs[0]->m->cfg;
    const size_t D = (size_t)c->head_dim, w = (size_t)c->window_size;
    const size_t swab = dsattn_v41_swa_bytes(c);
    for (size_t i = 0; i < r->B; i++) {
        uint8_t *row = r->wrow + i * swab;
        dsattn_v41_swa_pack(kvw + i * D, D, row, NULL);
        memcpy(r->seqs[i]->layer[r->l].ring + ((size_t)r->pos[i] % w) * swab, row, swab);
    }
}

static void batch_row(const void *arg, size_t i, int32_t *idx, dsattn_csa_row_src *src)
{
    const batch_rows *r = arg;
    const dsattn_v41_seq *s = r->seqs[i];
    const dsattn_v41_config *c = &s->m->cfg;
    const dsattn_v41_layer_w *L = &s->m->layer[r->l];
    const size_t D = (size_t)c->head_dim, w = (size_t)c->window_size;
    const size_t swab = dsattn_v41_swa_bytes(c);
    const int prefill = r->pos[i] == 0;
    const dsattn_kv_src wsrc = { DSATTN_KV_V41_SWA,
                                 prefill ? r->wrow + i * swab : s->layer[r->l].ring, swab,
                                 prefill ? 1 : w, D, 0 };
    const dsattn_kv_src none = { DSATTN_KV_V41_FP4, NULL, dsattn_v41_ckv_bytes(c), 0, D, 0 };
    *src = (dsattn_csa_row_src){ wsrc, none, prefill ? 1 : w, 0, -1e30f, 0 };
    if (prefill) dsattn_window_idx_prefill(w, 1, 0, idx);
    else dsattn_window_idx_decode(w, r->pos[i], idx);
    if (L->ratio > 0) {
        src->csrc.base = s->layer[s->rt.compress_kv].ckv;
        src->csrc.n_rows = (size_t)(r->pos[i] + 1) / (size_t)L->ratio;
        src->cw = s->rt.topk_w;
        if (src->cw) memcpy(idx + src->ww, s->rt.topk, src->cw * sizeof(int32_t));
    }
}

/* A dsattn_layer_fn over the B rows of the step `step`. */
static dsattn_status batch_layer(dsattn_ctx *ctx, void *step, int l, const float *x, size_t B,
                                 float *out)
{
    const dsattn_batch_step *sp = step;
    dsattn_v41_seq *const *seqs = sp->seqs;
    float *base = sp->scratch;
    const bplan *bp = sp->plan;
    const dsattn_v41 *m = seqs[0]->m;
    const dsattn_v41_config *c = &m->cfg;
    const dsattn_v41_layer_w *L = &m->layer[l];
    const size_t dim = (size_t)c->dim, D = (size_t)c->head_dim;
    const size_t rd = (size_t)c->rope_head_dim, w = (size_t)c->window_size;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t ckvb = dsattn_v41_ckv_bytes(c);
    int64_t *pos = (int64_t *)(base + bp->pos);
    float *qr = base + bp->qr, *q = base + bp->q, *kvw = base + bp->kvw, *o = base + bp->o;
    float *oa = base + bp->oa, *lat = base + bp->lat, *aqs = base + bp->aqs;
    float *ckz = base + bp->ckz, *kk = base + bp->kk, *qi = base + bp->qi, *wts = base + bp->wts;
    size_t *nnew = (size_t *)(base + bp->nnew), *latrow = nnew + B;
    uint8_t *wrow = (uint8_t *)(base + bp->wrow);
    float cs[64], sn[64];
    dsattn_status st;
    dsattn_phase_mark pm;

    for (size_t i = 0; i < B; i++) pos[i] = seqs[i]->pos;
    const dsattn_attn_rows rows = { B, pos, 0, aqs };

    /* ---- query path over the B rows, each at its own position; window KV
     * rows, each into its sequence's ring */
    const batch_rows br = { seqs, pos, B, l, wrow };
    const dsattn_csa_qkv qkv = { x, qr, q, NULL, NULL, kvw, pack_window, &br };
    if ((st = dsattn_csa_query_kv(ctx, &L->attn, &rows, &qkv))) return st;

    /* ---- compressed branch */
    if (L->ratio > 0) {
        const size_t ratio = (size_t)L->ratio;
        size_t nl = 0;                         /* latents produced this step */
        for (size_t i = 0; i < B; i++) nnew[i] = latrow[i] = 0;
        if (L->is_kv_source) {
            dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
            if (ratio == 1) {
                st = dsattn_linear(ctx, &L->c_wkv, x, dim, B, lat, D, DSATTN_OUT_BF16, NULL, NULL);
                for (size_t i = 0; i < B && !st; i++) {
                    dsattn_rmsnorm(lat + i * D, L->c_norm, D, c->norm_eps, lat + i * D,
                                   DSATTN_OUT_BF16);
                    nnew[i] = 1;
                    latrow[i] = nl++;
                }
            } else {
                float *kv = ckz, *z = ckz + B * D;
                st = dsattn_linear(ctx, &L->c_wkv, x, dim, B, kv, D, DSATTN_OUT_F32, NULL, NULL);
                if (!st)
                    st = dsattn_linear(ctx, &L->c_wgate, x, dim, B, z, D, DSATTN_OUT_F32, NULL,
                                       NULL);
                for (size_t i = 0; i < B && !st; i++) {
                    const dsattn_v41_chunk ck = { 1, pos[i], pos[i] == 0 };
                    latrow[i] = nl;
                    nnew[i] = dsattn_v41_compress_pool(seqs[i], l, kv + i * D, z + i * D, &ck,
                                                       lat + nl * D, seqs[i]->iscratch);
                    nl += nnew[i];
                }
            }
            dsattn_phase_end(ctx, &pm);
            if (st) return st;
            for (size_t i = 0; i < B; i++) seqs[i]->rt.compress_kv = l;
        }
        if (L->is_index_source) {
            dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
            if (L->owns_k && nl > 0)
                st = dsattn_linear(ctx, &L->i_wk, lat, D, nl, kk, Di, DSATTN_OUT_BF16, NULL, NULL);
            if (!st)
                st = dsattn_index_query(ctx, &L->attn, &rows, qr, qi);
            if (!st) st = dsattn_index_weights(ctx, &L->i_wproj, x, B, Hi, Di, wts);
            for (size_t i = 0; i < B && !st; i++) {
                dsattn_v41_seq *s = seqs[i];
                dsattn_v41_layer_s *S = &s->layer[l];
                const dsattn_v41_chunk ck = { 1, pos[i], pos[i] == 0 };
                if ((size_t)(pos[i] + 1) / ratio == 0) {
                    s->rt.topk_rows = 1;
                    s->rt.topk_w = 0;
                    s->rt.topk_valid = 1;
                    s->rt.topk_layer = l;
                    S->sel_rows = 1;
                    S->sel_w = 0;
                    continue;
                }
                const dsattn_v41_index_pre pre = { kk + latrow[i] * Di, qi + i * Hi * Di,
                                                   wts + i * Hi };
                st = dsattn_v41_index_rows(ctx, s, l, &ck, nnew[i], pos[i] == 0 ? 1 : w, &pre);
            }
            dsattn_phase_end(ctx, &pm);
            if (st) return st;
        }
        dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
        for (size_t i = 0; i < B; i++) {
            dsattn_v41_seq *s = seqs[i];
            if (nnew[i]) {
                /* nnew is 0 or 1 for one token */
                const size_t first = (size_t)pos[i] / ratio;
                float *v = lat + latrow[i] * D;
                dsattn_rope_cs(&L->rope, (int64_t)(first * ratio), cs, sn);
                dsattn_rope_apply(v + D - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
                dsattn_v41_kv_pack(v, D, s->layer[l].ckv + first * ckvb, NULL);
            }
            s->layer[l].source_read = s->rt.compress_kv;
            s->layer[l].topk_read = s->rt.topk_layer;
        }
        dsattn_phase_end(ctx, &pm);
    }

    /* ---- attention: (sequence, head group) tasks, each output computed
     * by one thread in one order, as in the one-sequence forward; then
     * inverse RoPE at each row's position, grouped wo_a, wo_b */
    const dsattn_csa_attend job = { q, o, oa, out, L->sink, bp->hg, bp->hper, bp->att_ws,
                                    bp->per_thr, base + bp->thr, batch_row, &br };
    return dsattn_csa_attend_output(ctx, &L->attn, &rows, &job);
}

/* ==== Public entry points =============================================== */

static dsattn_status attn_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs, size_t n_seqs,
                                int layer, const float *x, float *out, size_t *failed)
{
    dsattn_status st =
        dsattn_batch_check_seqs(ctx, seqs, n_seqs, seq_info, x, out, &layer, failed);
    if (st) return st;
    const dsattn_v41 *m = seqs[0]->m;
    if (layer < 0 || layer >= m->cfg.n_layers) return DSATTN_ERR_INVALID_ARG;
    if ((st = check_layer(seqs, n_seqs, layer, failed))) return st;
    bplan bp;
    if (!plan_batch(&m->cfg, n_seqs, ctx->n_threads, &bp)) return DSATTN_ERR_OVERFLOW;
    float *base = batch_scratch(ctx, &bp);
    if (!base) return DSATTN_ERR_NOMEM;
    dsattn_batch_step sp = { seqs, base, &bp, NULL };
    return batch_layer(ctx, &sp, layer, x, n_seqs, out);
}

/* A layer of the stand-in stack: its checks, then the layer. */
static dsattn_status stack_layer(dsattn_ctx *ctx, void *step, int l, const float *x, size_t B,
                                 float *out)
{
    const dsattn_batch_step *sp = step;
    dsattn_status st = check_layer(sp->seqs, B, l, sp->failed);
    return st ? st : batch_layer(ctx, step, l, x, B, out);
}

/* The stand-in stack's norm of layer l (a dsattn_norm_fn of the step). */
static const float *batch_norm(const void *step, int l)
{
    const dsattn_batch_step *sp = step;
    return ((dsattn_v41_seq *const *)sp->seqs)[0]->m->layer[l].attn_norm;
}

static dsattn_status stack_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs, size_t n_seqs,
                                 float *h, float *attn_in, float *attn_out, size_t *failed)
{
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, n_seqs, seq_info, h, h, NULL, failed);
    if (st) return st;
    const dsattn_v41 *m = seqs[0]->m;
    const dsattn_v41_config *c = &m->cfg;
    const size_t B = n_seqs, dim = (size_t)c->dim;
    bplan bp;
    if (!plan_batch(c, B, ctx->n_threads, &bp)) return DSATTN_ERR_OVERFLOW;
    /* the first layer's checks; later layers' slots are what earlier
     * layers of this step leave, which the one-sequence stack relies on too */
    if ((st = check_layer(seqs, B, 0, failed))) return st;
    float *base = batch_scratch(ctx, &bp);
    if (!base) return DSATTN_ERR_NOMEM;
    dsattn_batch_step sp = { seqs, base, &bp, failed };
    float *xin = base + bp.xin;
    if ((st = dsattn_standin_rows(ctx, &sp, stack_layer, batch_norm, (size_t)c->n_layers, dim,
                                  c->norm_eps, h, B, xin, xin + B * dim, attn_in, attn_out)))
        return st;
    for (size_t i = 0; i < B; i++) seqs[i]->pos += 1;
    return DSATTN_OK;
}

/* *failed is written only when the call fails */
dsattn_status dsattn_v41_attn_forward_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x,
                                            float *out, size_t *failed)
{
    size_t bad = SIZE_MAX;
    return dsattn_batch_result(attn_batch(ctx, seqs, n_seqs, layer, x, out, &bad), &bad, failed);
}

dsattn_status dsattn_v41_stack_forward_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs,
                                             size_t n_seqs, float *h, float *attn_in,
                                             float *attn_out, size_t *failed)
{
    size_t bad = SIZE_MAX;
    return dsattn_batch_result(stack_batch(ctx, seqs, n_seqs, h, attn_in, attn_out, &bad), &bad,
                               failed);
}
