/* mla_batch.c - the batched decode step of an MLA (V3) or MLA + DSA (V3.2)
 * stack: one token for each of B sequences of the same model, each at its
 * own position, in one call per layer (dsattn_mla_attn_forward_batch) or for
 * the whole stand-in stack (dsattn_mla_stack_forward_batch).  The weight
 * products run once over the B rows; each sequence's indexer scores, top-k
 * and attention run on its own cache with the row paths of mla_attend.c and
 * the query / latent rows of mla_forward.c, so a row's arithmetic is the
 * one-sequence forward's (bit for bit in reference mode).
 */
#include "mla.h"

#include "batch_common.h"
#include "ktab.h"
#include "numfmt.h"

#include <string.h>

/* ==== Batched decode across sequences =================================== */

/* One decode token for each of B sequences of one model, each at its own
 * position.  Every weight product runs once over the B rows: wq_a / wq_b
 * (or wq), wkv_a, the indexer's wq_b / wk / weights_proj, the absorption
 * products with wkv_b (dsattn_mla_absorb_q / dsattn_mla_absorb_out decode each weight row once
 * for all rows) and wo, with the B-row buffers in the context's batch
 * scratch.  What reads a sequence's own cache - the indexer scores, its
 * top-k, the attention - runs per sequence with that sequence's scratch:
 * sequences whose key set is long enough to split over the threads one
 * after another with their keys split (as the one-sequence forward), the
 * others in parallel, one sequence per thread.  A row's arithmetic is the
 * one-sequence forward's: only dsattn_linear's path for B > 1 (fast mode:
 * the multi-token GEMV, or the tiles) and the split of short rows' keys
 * over threads differ. */

/* The batch scratch of one layer step for B rows (what mla_batch_layer
 * takes from it, in order; counted generously where a piece is released). */
static size_t batch_layer_bytes(const dsattn_mla_config *c, size_t B, int nth)
{
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t maxk = DSATTN_MAX(DSATTN_MAX(dim, QL), DSATTN_MAX(KL, H * dv));
    size_t b = 0;
    dsattn_ws_need(&b, B, DSATTN_MAX(QL, 1) * sizeof(float));      /* qr   */
    dsattn_ws_need(&b, B, H * dqk * sizeof(float));                /* q    */
    dsattn_ws_need(&b, B, (KL + dr) * sizeof(float));              /* kv   */
    dsattn_ws_need(&b, B, H * dv * sizeof(float));                 /* o    */
    dsattn_ws_need(&b, B, maxk * sizeof(float));                   /* aqs  */
    dsattn_ws_need(&b, B, H * (dn + dv) * sizeof(float));          /* kvb  */
    dsattn_ws_need(&b, B, H * KL * sizeof(float));                 /* qa   */
    dsattn_ws_need(&b, B, H * KL * sizeof(float));                 /* xo   */
    dsattn_ws_need(&b, B, H * dr * sizeof(float));                 /* qpe  */
    dsattn_ws_need(&b, B, sizeof(size_t));                         /* nsel */
    if (c->dsa) {
        dsattn_ws_need(&b, B, Hi * Di * sizeof(float));            /* qc   */
        dsattn_ws_need(&b, B, Hi * sizeof(float));                 /* wq   */
        dsattn_ws_need(&b, B, sizeof(int64_t));                    /* pos  */
        dsattn_ws_need(&b, B, sizeof(uint8_t *));                  /* krow */
    }
    size_t r = 0, t = 0;
    dsattn_ws_need(&t, B, H * dv * sizeof(float));                 /* ob (mixed) */
    dsattn_ws_need(&t, B, H * (dn + dv) * sizeof(float));          /* absorb_out_rows */
    if (c->dsa) dsattn_ws_need(&r, B * (Di + DSATTN_MAX(dim, QL)) + 1, sizeof(float));
    dsattn_ws_need(&t, (size_t)DSATTN_MAX(nth, 1), dsattn_mla_absorb_ws_per(KL, B));
    r = DSATTN_MAX(r, t);
    if (b == SIZE_MAX || r == SIZE_MAX || !dsattn_add_size(b, r, &b)) return SIZE_MAX;
    return b;
}

/* What both batched calls ask of the context: the stack's [2, B, dim]
 * rows and a layer step (the same size for both, so that a stack step
 * after a layer step of as many sequences does not grow it). */
static size_t batch_bytes(const dsattn_mla_config *c, size_t B, int nth)
{
    size_t b = batch_layer_bytes(c, B, nth);
    dsattn_ws_need(&b, 2 * B, (size_t)c->dim * sizeof(float));
    return b;
}

/* A dsattn_ws over the context's batch scratch (bytes of it); done with
 * batch_ws_end.  A request past it spills to the heap (correct, only not
 * allocation-free). */
static dsattn_status batch_ws_begin(dsattn_ctx *ctx, size_t bytes, dsattn_ws *w)
{
    memset(w, 0, sizeof *w);
    if (bytes == SIZE_MAX) return DSATTN_ERR_OVERFLOW;
    void *p = dsattn_ctx_scratch(ctx, DSATTN_CTX_SCR_BATCH, bytes);
    if (!p) return DSATTN_ERR_NOMEM;
    w->base = p;
    w->cap = bytes;
    return DSATTN_OK;
}

static void batch_ws_end(dsattn_ws *w)
{
    const dsattn_ws_pos zero = { 0, 0 };
    dsattn_ws_reset(w, zero);
    dsattn_owned_free(&w->spill);
}

static int batch_seq_info(const void *seqs, size_t i, dsattn_batch_seq_info *info)
{
    const dsattn_mla_seq *s = ((dsattn_mla_seq *const *)seqs)[i];
    if (!s) return 0;
    *info = (dsattn_batch_seq_info){ s, s->m, 0, s->pos, s->max_seq_len, (size_t)s->m->cfg.dim,
                                     s->m->has_weights, s->m->cfg.n_layers };
    return 1;
}

/* Every check before anything is written: the sequences' (batch_common.c),
 * then the layer.  A status and in *failed (when given) the first bad
 * sequence, SIZE_MAX when the fault is not a sequence's. */
static dsattn_status batch_check(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs, size_t B,
                                 int l, const void *x, const void *out, size_t *failed)
{
    size_t bad;
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, B, batch_seq_info, x, out, &l, &bad);
    if (!st && (l < 0 || l >= seqs[0]->m->cfg.n_layers)) {
        st = DSATTN_ERR_INVALID_ARG;
        bad = SIZE_MAX;
    }
    if (!st && !dsattn_mla_model_holds(seqs[0]->m, l)) {     /* the layer's weights */
        st = DSATTN_ERR_UNSUPPORTED;
        bad = SIZE_MAX;
    }
    for (size_t i = 0; i < B && !st; i++)
        if (!dsattn_mla_seq_holds(seqs[i], l)) {   /* a sequence of other layers */
            st = DSATTN_ERR_INVALID_ARG;
            bad = i;
        }
    if (st && failed) *failed = bad;
    return st;
}

/* W_uv over B rows.  Fast mode with B >= 8: o = x . W_uv^T is a Linear
 * per head, so all of wkv_b runs as one block-diagonal Linear of H groups
 * (dsattn_linear_grouped: the multi-token GEMV or the prefill tile GEMM,
 * each weight block decoded once for the B rows; the W_uk rows of each group compute a by-product
 * that is dropped), far less decode work than dsattn_mla_absorb_out's per-row dots.
 * Otherwise (reference mode, small B, shapes the grouped form refuses)
 * dsattn_mla_absorb_out. */
static dsattn_status absorb_out_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                     const float *x, size_t nr, float *o, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_weight *W = &m->layer[l].wkv_b;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank;
    if (ctx->mode == DSATTN_MODE_FAST && nr >= 8 && W->rows == H * (dn + dv) && W->cols == KL &&
        (W->kind != DSATTN_W_FP8 || (dn + dv) % W->block == 0) && W->kind != DSATTN_W_FP4) {
        const dsattn_ws_pos mark = dsattn_ws_mark(wa);
        float *y = dsattn_ws_array(wa, nr, H * (dn + dv) * sizeof(float));
        if (!y) return DSATTN_ERR_NOMEM;
        dsattn_status st = dsattn_linear_grouped(ctx, W, H, x, H * KL, KL, nr, y, H * (dn + dv),
                                                 DSATTN_OUT_BF16);
        if (!st)
            for (size_t r = 0; r < nr; r++)
                for (size_t h = 0; h < H; h++)
                    memcpy(o + (r * H + h) * dv, y + (r * H + h) * (dn + dv) + dn,
                           dv * sizeof(float));
        dsattn_ws_put(wa, y);
        dsattn_ws_reset(wa, mark);
        if (st != DSATTN_ERR_UNSUPPORTED) return st;
    }
    return dsattn_mla_absorb_out(ctx, m, l, x, nr, o, wa);
}

/* One layer for B checked sequences; x, out: [B, dim]; bw: the batch ws. */
static dsattn_status mla_batch_layer(dsattn_ctx *ctx, void *step, int l, const float *x,
                                     size_t B, float *out)
{
    const dsattn_batch_step *sp = step;
    dsattn_mla_seq *const *seqs = sp->seqs;
    dsattn_ws *bw = sp->scratch;
    const dsattn_mla *m = seqs[0]->m;
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_mla_layer_w *L = &m->layer[l];
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const int v3 = !c->dsa, sparse = c->dsa && !c->force_dense;
    const int ref = ctx->mode == DSATTN_MODE_REFERENCE;
    const int nth = DSATTN_MAX(ctx->n_threads, 1);
    const dsattn_actq *aq = m->use_actq ? &m->actq : NULL;
    dsattn_status st = DSATTN_OK;
    dsattn_phase_mark pm = { -1, 0.0, 0, 0 };
    size_t n_naive = 0;
    for (size_t t = 0; t < B; t++) n_naive += seqs[t]->fmt == DSATTN_MLA_CACHE_NAIVE;
    const size_t n_latent = B - n_naive;

    const dsattn_ws_pos mark = dsattn_ws_mark(bw);
    dsattn_mla_fwd_buf b;
    const int rows_ok = dsattn_mla_fwd_buf_rows(&b, bw, c, B, n_naive > 0);
    b.qa = dsattn_ws_arrayz(bw, B, H * KL * sizeof(float));
    b.xo = dsattn_ws_arrayz(bw, B, H * KL * sizeof(float));
    float *qpe = dsattn_ws_arrayz(bw, B, H * dr * sizeof(float));
    size_t *nsel = dsattn_ws_arrayz(bw, B, sizeof(size_t));
    int64_t *pos = NULL;
    uint8_t **krow = NULL;
    if (c->dsa) {
        b.qc = dsattn_ws_arrayz(bw, B, Hi * Di * sizeof(float));
        b.wq = dsattn_ws_arrayz(bw, B, Hi * sizeof(float));
        pos = dsattn_ws_arrayz(bw, B, sizeof(int64_t));
        krow = dsattn_ws_arrayz(bw, B, sizeof(uint8_t *));
    }
    if (!rows_ok || !b.qa || !b.xo || !qpe || !nsel ||
        (c->dsa && (!b.qc || !b.wq || !pos || !krow))) {
        st = DSATTN_ERR_NOMEM;
        goto done;
    }

    /* ---- query over the B rows, RoPE at each row's own position */
    dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
    if ((st = dsattn_mla_query_rows(ctx, m, l, x, B, 0, seqs, &b))) goto done;
    for (size_t t = 0; t < B * H; t++) memcpy(qpe + t * dr, b.q + t * dqk + dn, dr * sizeof(float));
    dsattn_phase_end(ctx, &pm);

    /* ---- latent rows, expanded K/V for NAIVE rows, cache writes */
    dsattn_phase_begin(ctx, DSATTN_PHASE_KV, &pm);
    if ((st = dsattn_mla_latent_rows(ctx, m, l, x, B, 0, seqs, &b))) goto done;
    if (n_naive && (st = dsattn_linear(ctx, &L->wkv_b, b.kv, KL + dr, B, b.kvb, H * (dn + dv),
                                       DSATTN_OUT_BF16, aq, b.aqs)))
        goto done;
    for (size_t t = 0; t < B; t++)
        dsattn_mla_cache_write(seqs[t], l, (size_t)seqs[t]->pos, b.kv + t * (KL + dr),
                    b.kvb ? b.kvb + t * H * (dn + dv) : NULL);
    dsattn_phase_end(ctx, &pm);

    /* ---- V3.2: index q/k over the B rows, scores and top-k per sequence */
    dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
    if (c->dsa) {
        for (size_t t = 0; t < B; t++) {
            pos[t] = seqs[t]->pos;
            krow[t] = seqs[t]->layer[l].kidx + (size_t)pos[t] * seqs[t]->idx_bytes;
        }
        if ((st = dsattn_mla_index_qk_rows(ctx, m, l, x, b.qr, B, 0, pos, NULL, krow, b.qc, b.wq,
                                           bw)))
            goto done;
        for (size_t t = 0; t < B && !st; t++) {
            dsattn_mla_seq *seq = seqs[t];
            dsattn_mla_layer_s *S = &seq->layer[l];
            const size_t nvis = (size_t)seq->pos + 1;
            const size_t width = DSATTN_MIN((size_t)c->index_topk, nvis);
            dsattn_ws *ws = &seq->ws;
            const dsattn_ws_pos sm = dsattn_ws_mark(ws);
            float *score = dsattn_ws_array(ws, nvis, sizeof(float));
            if (!score ||
                !dsattn_chunk_rows((void **)&S->sel, &S->sel_cap, S->sel_own, S->sel_own_cap,
                                   width + 1, sizeof(int32_t))) {
                st = DSATTN_ERR_NOMEM;
            } else {
                dsattn_mla_index_scores(ctx, b.qc + t * Hi * Di, b.wq + t * Hi, Hi, Di, S->kidx,
                                        nvis, score, ws);
                nsel[t] = dsattn_mla_select_row(score, nvis, (size_t)c->index_topk, width, S->sel);
                S->sel_rows = 1;
                S->sel_w = width;
            }
            dsattn_ws_reset(ws, sm);
        }
        if (st) goto done;
    }
    dsattn_phase_end(ctx, &pm);

    /* ---- W_uk over the latent rows (all B rows: NAIVE ones are unused) */
    if (n_latent) {
        dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
        if ((st = dsattn_mla_absorb_q(ctx, m, l, b.q, B, b.qa, bw))) goto done;
        dsattn_phase_end(ctx, &pm);
    }

    /* ---- attention per sequence over its own cache */
    dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
    dsattn_status rst = DSATTN_OK;
    uint64_t nk_lat = 0, nk_naive = 0, by_lat = 0, by_naive = 0;
    for (size_t t = 0; t < B; t++) {
        const dsattn_mla_seq *seq = seqs[t];
        const uint64_t n = sparse ? nsel[t] : (uint64_t)seq->pos + 1;
        if (seq->fmt == DSATTN_MLA_CACHE_NAIVE) {
            nk_naive += n;
            by_naive += n * (seq->row_bytes + seq->v_bytes);
        } else {
            nk_lat += n;
            by_lat += n * seq->row_bytes;
        }
    }
#define BATCH_ROW(t, nthr)                                                                  \
    do {                                                                                    \
        dsattn_mla_seq *sq_ = seqs[t];                                                      \
        const int32_t *idx_ = sparse ? sq_->layer[l].sel : NULL;                           \
        const size_t n_ = sparse ? nsel[t] : (size_t)sq_->pos + 1;                         \
        dsattn_status r_;                                                                   \
        if (sq_->fmt == DSATTN_MLA_CACHE_NAIVE)                                             \
            r_ = dsattn_mla_naive_row(ctx, sq_, l, b.q + (t) * H * dqk, idx_, n_, v3,      \
                                      b.o + (t) * H * dv, &sq_->ws);                        \
        else if (ref)                                                                       \
            r_ = dsattn_mla_absorbed_row_ref(sq_, l, b.qa + (t) * H * KL, qpe + (t) * H * dr,  \
                                             idx_, n_, v3, b.xo + (t) * H * KL, &sq_->ws);  \
        else                                                                                \
            r_ = dsattn_mla_absorbed_row_fast(ctx, sq_, l, b.qa + (t) * H * KL,            \
                                              qpe + (t) * H * dr, idx_, n_, v3,             \
                                              b.xo + (t) * H * KL, nthr, &sq_->ws);         \
        if (r_) {                                                                           \
            _Pragma("omp atomic write")                                                     \
            rst = r_;                                                                       \
        }                                                                                   \
    } while (0)
    /* long latent rows (fast mode: keys split over every thread) one after
     * another; the rest one sequence per thread */
    size_t n_short = 0;
    for (size_t t = 0; t < B; t++) {
        const dsattn_mla_seq *sq = seqs[t];
        const size_t n = sparse ? nsel[t] : (size_t)sq->pos + 1;
        if (!ref && sq->fmt != DSATTN_MLA_CACHE_NAIVE && dsattn_mla_row_threads(n, nth) > 1)
            BATCH_ROW(t, nth);
        else
            n_short++;
    }
    if (n_short) {
        const int par = nth > 1 && n_short > 1;
#define BATCH_SHORT(t)                                                                      \
        do {                                                                                \
            const dsattn_mla_seq *sq = seqs[t];                                             \
            const size_t n = sparse ? nsel[t] : (size_t)sq->pos + 1;                        \
            if (ref || sq->fmt == DSATTN_MLA_CACHE_NAIVE ||                                 \
                dsattn_mla_row_threads(n, nth) <= 1)                                        \
                BATCH_ROW(t, 1);                                                            \
        } while (0)
        if (par) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
            for (size_t t = 0; t < B; t++) BATCH_SHORT(t);
        } else {
            for (size_t t = 0; t < B; t++) BATCH_SHORT(t);
        }
#undef BATCH_SHORT
    }
#undef BATCH_ROW
    if ((st = rst)) goto done;
    dsattn_count(ctx, nk_lat * H * (2ull * (KL + dr) + 2ull * KL) + nk_naive * H * 2ull * (dqk + dv),
                 by_lat + by_naive);
    dsattn_phase_end(ctx, &pm);

    /* ---- W_uv over the latent rows (then NAIVE rows keep their own o) */
    dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);
    if (n_latent) {
        if (!n_naive) {
            st = absorb_out_rows(ctx, m, l, b.xo, B, b.o, bw);
        } else {
            /* mixed batch: W_uv of every row into ob, kept for the latent rows */
            float *ob = dsattn_ws_array(bw, B, H * dv * sizeof(float));
            if (!ob) st = DSATTN_ERR_NOMEM;
            else if (!(st = absorb_out_rows(ctx, m, l, b.xo, B, ob, bw)))
                for (size_t t = 0; t < B; t++)
                    if (seqs[t]->fmt != DSATTN_MLA_CACHE_NAIVE)
                        memcpy(b.o + t * H * dv, ob + t * H * dv, H * dv * sizeof(float));
        }
        if (st) goto done;
    }
    st = dsattn_linear(ctx, &L->wo, b.o, H * dv, B, out, dim, DSATTN_OUT_BF16, aq, b.aqs);
done:
    dsattn_phase_end(ctx, &pm);
    dsattn_ws_reset(bw, mark);
    return st;
}

dsattn_status dsattn_mla_attn_forward_batch(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x, float *out,
                                            size_t *failed)
{
    dsattn_status st = batch_check(ctx, seqs, n_seqs, layer, x, out, failed);
    if (st) return st;
    dsattn_ws bw;
    if ((st = batch_ws_begin(ctx, batch_bytes(&seqs[0]->m->cfg, n_seqs, ctx->n_threads), &bw)))
        return st;
    dsattn_batch_step sp = { seqs, &bw, NULL, NULL };
    st = mla_batch_layer(ctx, &sp, layer, x, n_seqs, out);
    batch_ws_end(&bw);
    return st;
}

/* The stand-in stack's norm of layer l (a dsattn_norm_fn of the step). */
static const float *mla_batch_norm(const void *step, int l)
{
    const dsattn_batch_step *sp = step;
    return ((dsattn_mla_seq *const *)sp->seqs)[0]->m->layer[l].attn_norm;
}

dsattn_status dsattn_mla_stack_forward_batch(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs,
                                             size_t n_seqs, float *h, float *attn_in,
                                             float *attn_out, size_t *failed)
{
    dsattn_status st = batch_check(ctx, seqs, n_seqs, 0, h, h, failed);
    /* the stack runs every layer: a sequence of some layers, or of a model
     * of some layers' weights (batch_check: no weights for layer 0), is
     * refused as the one-sequence stack refuses it */
    const int some = !st || st == DSATTN_ERR_UNSUPPORTED;
    for (size_t i = 0; i < n_seqs && some; i++)
        if (!dsattn_mla_seq_stackable(seqs[i])) {
            st = DSATTN_ERR_INVALID_ARG;
            if (failed) *failed = i;
            break;
        }
    if (st) return st;
    const dsattn_mla *m = seqs[0]->m;
    const size_t B = n_seqs, dim = (size_t)m->cfg.dim, nl = (size_t)m->cfg.n_layers;
    dsattn_ws bw;
    if ((st = batch_ws_begin(ctx, batch_bytes(&m->cfg, B, ctx->n_threads), &bw))) return st;
    float *xin = dsattn_ws_array(&bw, 2 * B, dim * sizeof(float));
    if (!xin) {
        batch_ws_end(&bw);
        return DSATTN_ERR_NOMEM;
    }
    dsattn_batch_step sp = { seqs, &bw, NULL, NULL };
    st = dsattn_standin_rows(ctx, &sp, mla_batch_layer, mla_batch_norm, nl, dim, m->cfg.eps, h, B,
                             xin, xin + B * dim, attn_in, attn_out);
    batch_ws_end(&bw);
    for (size_t t = 0; t < B && !st; t++) st = dsattn_mla_seq_advance(seqs[t], 1);
    return st;
}
