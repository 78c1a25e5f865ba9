/* v4_forward.c - one sequence over a V4 (CSA + HCA) stack: the per-layer KV
 * buffer, the compressors' state, the lightning indexer and the attention
 * forward of every layer kind.
 *
 * The order of work inside a layer is the reference's Attention.forward
 * (docs/semantics.md §6): query path with V4's per-head RMS rescale;
 * window KV (kv_norm, RoPE, FP8 on the nope dims, rope dims bf16: one
 * MODEL1 row, ring slot pos % w); for CSA the indexer (its own compressor
 * over x with RoPE -> Hadamard -> FP4 keys, queries RoPE -> Hadamard ->
 * FP4, bf16 scores, top-k in score order), for HCA every visible entry;
 * the main compressor (pooled -> bf16 -> RMSNorm -> RoPE at j*m -> FP8
 * nope, one MODEL1 row after the ring); one sparse_attn over [window rows ;
 * compressed rows] with V4's -inf running-max start; inverse RoPE; grouped
 * wo_a; wo_b.  The shared pieces are src/ops (attn_common.c, compressor.c,
 * sparse_attn.c, ...): this file only wires V4's caches and index rows.
 *
 * The KV buffer holds packed bytes only; attention and the indexer
 * dequantize rows as they read them, which gives exactly the reference's
 * quant-dequant bf16 values.  The indexer scores only the causally visible
 * entries of a row (the reference scores all and masks the rest to -inf);
 * the picks it then adds are exactly the ones the reference maps to -1.
 */
#include "v4.h"

#include "numfmt.h"
#include "seq_glue.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

/* ==== Sequence lifetime ================================================= */

static size_t coff_of(const dsattn_v4_compressor_w *C) { return C->overlap ? 2 : 1; }

static dsattn_status comp_state_alloc(const dsattn_v4_compressor_w *C, dsattn_v4_comp_s *S)
{
    size_t n;
    const size_t coff = coff_of(C);
    if (!dsattn_mul3_size(coff * C->ratio, coff, C->d, &n)) return DSATTN_ERR_OVERFLOW;
    S->kv = dsattn_alloc_array(n, sizeof(float));
    S->z = dsattn_alloc_array(n, sizeof(float));
    if (!S->kv || !S->z) return DSATTN_ERR_NOMEM;
    dsattn_compressor_state_init(S->kv, S->z, C->ratio, C->d, C->overlap);
    return DSATTN_OK;
}

static size_t comp_state_bytes(const dsattn_v4_compressor_w *C)
{
    const size_t coff = coff_of(C);
    return 2 * coff * C->ratio * coff * C->d * sizeof(float);
}

static void v4_decode_scratch(const dsattn_v4 *m, size_t cap, size_t *fwd, size_t *ws);

dsattn_status dsattn_v4_seq_create(dsattn_v4_seq **out, const dsattn_v4 *m,
                                   size_t max_seq_len, dsattn_v4_empty empty)
{
    if (!m) return DSATTN_ERR_INVALID_ARG;
    return dsattn_v4_seq_create_layers(out, m, max_seq_len, empty, 0, (int)m->cfg.n_layers);
}

dsattn_status dsattn_v4_seq_create_layers(dsattn_v4_seq **out, const dsattn_v4 *m,
                                          size_t max_seq_len, dsattn_v4_empty empty,
                                          int first_layer, int n_layers)
{
    if (!out || !m || max_seq_len == 0 || max_seq_len > ((size_t)1 << 40))
        return DSATTN_ERR_INVALID_ARG;
    if (first_layer < 0 || n_layers <= 0 ||
        (int64_t)first_layer + n_layers > m->cfg.n_layers)
        return DSATTN_ERR_INVALID_ARG;
    if (empty != DSATTN_V4_EMPTY_REFERENCE && empty != DSATTN_V4_EMPTY_ZERO)
        return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    const dsattn_v4_config *c = &m->cfg;
    dsattn_v4_seq *s = calloc(1, sizeof *s);
    if (!s) return DSATTN_ERR_NOMEM;
    s->m = m;
    s->empty = empty;
    s->max_seq_len = max_seq_len;
    s->first = first_layer;
    s->count = n_layers;
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    const size_t ib = dsattn_v4_idx_bytes(c);
    dsattn_status st = DSATTN_OK;
    for (int64_t l = first_layer; l < (int64_t)first_layer + n_layers && !st; l++) {
        const dsattn_v4_layer_w *L = &m->layer[l];
        dsattn_v4_layer_s *S = &s->layer[l];
        S->cap = L->ratio > 0 ? max_seq_len / (size_t)L->ratio : 0;
        /* Attention.kv_cache: [window + max_seq_len // ratio, head_dim] */
        S->kv = dsattn_alloc_array(w + S->cap, kvb);
        if (!S->kv) { st = DSATTN_ERR_NOMEM; break; }
        s->window_bytes += w * kvb;
        s->kv_bytes += S->cap * kvb;
        if (L->ratio > 0) st = comp_state_alloc(&L->comp, &S->comp);
        if (!st && L->ratio > 0) s->state_bytes += comp_state_bytes(&L->comp);
        if (!st && L->kind == DSATTN_V4_CSA) {
            S->ikv = dsattn_alloc_array(DSATTN_MAX(S->cap, 1), ib);
            if (!S->ikv) st = DSATTN_ERR_NOMEM;
            if (!st) s->kv_bytes += DSATTN_MAX(S->cap, 1) * ib;
            if (!st) st = comp_state_alloc(&L->icomp, &S->icomp);
            if (!st) s->state_bytes += comp_state_bytes(&L->icomp);
            /* a decode step's own selection row */
            S->sel_cap = DSATTN_MIN((size_t)c->index_topk, S->cap) + 1;
            if (!st && !(S->sel = malloc(S->sel_cap * sizeof(int32_t)))) st = DSATTN_ERR_NOMEM;
            S->sel_own = S->sel;
            S->sel_own_cap = S->sel_cap;
        }
    }
    if (!st) {
        size_t fwd, wsb;
        v4_decode_scratch(m, max_seq_len, &fwd, &wsb);
        if (!(s->scratch = dsattn_alloc(fwd))) st = DSATTN_ERR_NOMEM;
        else s->scratch_size = fwd;
        if (!st) st = dsattn_ws_init(&s->ws, wsb);
    }
    if (st) { dsattn_v4_seq_destroy(s); return st; }
    *out = s;
    return DSATTN_OK;
}

void dsattn_v4_seq_destroy(dsattn_v4_seq *s)
{
    if (!s) return;
    for (int l = 0; l < DSATTN_MAX_LAYERS; l++) {
        dsattn_v4_layer_s *S = &s->layer[l];
        dsattn_free(S->kv);
        dsattn_free(S->ikv);
        dsattn_free(S->comp.kv);
        dsattn_free(S->comp.z);
        dsattn_free(S->icomp.kv);
        dsattn_free(S->icomp.z);
        dsattn_chunk_rows_free(S->sel, S->sel_own);
    }
    dsattn_free(s->scratch);
    dsattn_ws_free(&s->ws);
    free(s);
}

DSATTN_SEQ_POS_API(v4)

/* The forward's scratch: the sequence's, sized at creation for a decode
 * step (v4_decode_scratch), or the context's for a prefill chunk that
 * needs more (nothing kept in the sequence). */
static void *scratch_get(dsattn_ctx *ctx, dsattn_v4_seq *s, size_t bytes)
{
    return dsattn_call_scratch(ctx, DSATTN_CTX_SCR_CHUNK, s->scratch, s->scratch_size, bytes);
}

/* ==== Compressor ======================================================== */

typedef dsattn_v4_chunk chunk;

/* run_compressor's scratch for s rows: projections kv and z [s, coff*d],
 * the pooled entries, the pooling state machine's own. */
static size_t compressor_bytes(const dsattn_v4_compressor_w *C, size_t s, int prefill)
{
    const size_t d = C->d, m = C->ratio, coff = coff_of(C);
    const size_t npool = prefill ? s / m + 1 : 1;
    return (2 * s * coff * d + npool * d + dsattn_compressor_scratch(m, d)) * sizeof(float);
}

/* Compressor.forward of one compressor (main: rotate = 0, the indexer's:
 * rotate = 1): fp32 projections, the shared pooling state machine, then per
 * new entry j: bf16 cast -> RMSNorm -> RoPE at j*m -> (main) FP8 on the
 * nope dims, rope bf16, one MODEL1 row at rows + j*rb / (indexer)
 * Hadamard -> FP4 QDQ, one index-key row.  Returns the number of entries.
 * pkv / pz (a batched step): the projections already made, [s, coff*d]. */
static dsattn_status run_compressor(dsattn_ctx *ctx, const dsattn_v4_config *c,
                                    const dsattn_v4_layer_w *L,
                                    const dsattn_v4_compressor_w *C, dsattn_v4_comp_s *S,
                                    const float *x, const chunk *ck, uint8_t *rows,
                                    size_t rb, size_t *n_new, dsattn_ws *wa,
                                    const float *pkv, const float *pz)
{
    const size_t s = ck->s, d = C->d, m = C->ratio, coff = coff_of(C);
    const size_t dim = (size_t)c->dim, rd = (size_t)c->rope_head_dim;
    const dsattn_ws_pos mark = dsattn_ws_mark(wa);
    float *kv = dsattn_ws_getz(wa, compressor_bytes(C, s, ck->prefill));
    if (!kv) return DSATTN_ERR_NOMEM;
    const size_t npool = ck->prefill ? s / m + 1 : 1;
    float *z = kv + s * coff * d, *pooled = z + s * coff * d, *ws = pooled + npool * d;
    float cs[64], sn[64];
    dsattn_status st;
    *n_new = 0;
    /* x.float(); wkv / wgate are fp32 Linears (bf16 values in the checkpoint) */
    if (!pkv) {
        st = dsattn_linear(ctx, &C->wkv, x, dim, s, kv, coff * d, DSATTN_OUT_F32, NULL, NULL);
        if (!st)
            st = dsattn_linear(ctx, &C->wgate, x, dim, s, z, coff * d, DSATTN_OUT_F32, NULL, NULL);
        if (st) { dsattn_ws_reset(wa, mark); return st; }
    }
    const size_t n = dsattn_compressor_pool(pkv ? pkv : kv, pkv ? pz : z, s, d, m, C->overlap,
                                            C->ape, S->kv, S->z, ck->start_pos, ck->prefill,
                                            pooled, ws);
    const size_t first = ck->prefill ? 0 : (size_t)ck->start_pos / m;
    const float hscale = (float)pow((double)d, -0.5);
    for (size_t i = 0; i < n; i++) {
        float *v = pooled + i * d;
        const size_t j = first + i;
        dsattn_round_bf16_n(v, d);                                  /* kv.to(bf16) */
        dsattn_rmsnorm(v, C->norm, d, c->norm_eps, v, DSATTN_OUT_BF16);
        dsattn_rope_cs(&L->rope, (int64_t)(j * m), cs, sn);
        dsattn_rope_apply(v + d - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
        if (C->rotate) {
            dsattn_hadamard(v, d, hscale, v, DSATTN_OUT_BF16);
            dsattn_fp4_index_pack(v, d, rows + j * rb, NULL);
        } else {
            dsattn_v4_kv_pack(v, d - rd, rd, rows + j * rb, NULL);
        }
    }
    dsattn_ws_put(wa, kv);
    dsattn_ws_reset(wa, mark);
    *n_new = n;
    return DSATTN_OK;
}

/* ==== Indexer (CSA) ===================================================== */

/* Indexer.forward: queries, the indexer's compressor, head weights, bf16
 * scores over the visible entries, top-k in descending score order (lower
 * index first on ties).  rows [s, kw]: j + offset or -1 (prefill picks the
 * row cannot see); sel [s, kw]: the same without the offset. */
/* The new window rows of a chunk, n from position p0: MODEL1 rows in
 * wrow, the last w of them also in the ring (slot pos % w). */
typedef struct {
    uint8_t *ring, *wrow;
    size_t   n, p0, w, D, rd, kvb;
} window_rows;

static void pack_window(const void *arg, const float *kvw)
{
    const window_rows *r = arg;
    for (size_t t = 0; t < r->n; t++)
        dsattn_v4_kv_pack(kvw + t * r->D, r->D - r->rd, r->rd, r->wrow + t * r->kvb, NULL);
    for (size_t t = r->n > r->w ? r->n - r->w : 0; t < r->n; t++)
        memcpy(r->ring + ((r->p0 + t) % r->w) * r->kvb, r->wrow + t * r->kvb, r->kvb);
}

static dsattn_status run_indexer(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l, const float *x,
                                 const float *qr, const chunk *ck, size_t offset,
                                 int32_t *rows, size_t kw, float *aqs,
                                 const dsattn_v4_index_pre *pre)
{
    const dsattn_v4_config *c = &seq->m->cfg;
    const dsattn_v4_layer_w *L = &seq->m->layer[l];
    dsattn_v4_layer_s *S = &seq->layer[l];
    const size_t s = ck->s, m = (size_t)L->ratio;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t ib = dsattn_v4_idx_bytes(c);
    const size_t T = ((size_t)ck->start_pos + s) / m;
    dsattn_status st;
    size_t n_new;

    if (!dsattn_chunk_rows((void **)&S->sel, &S->sel_cap, S->sel_own, S->sel_own_cap,
                           s * kw + 1, sizeof(int32_t)))
        return DSATTN_ERR_NOMEM;
    const int nthr = s > 1 ? DSATTN_MAX(ctx->n_threads, 1) : 1;
    dsattn_ws *wa = &seq->ws;
    const dsattn_ws_pos mark = dsattn_ws_mark(wa);
    float *qi = dsattn_ws_arrayz(wa, s * Hi * Di + s * Hi + (size_t)nthr * (T + 1), sizeof(float));
    int32_t *pick = dsattn_ws_arrayz(wa, (size_t)nthr * (kw + 1), sizeof(int32_t));
    if (!qi || !pick) { st = DSATTN_ERR_NOMEM; goto done; }
    float *wts = qi + s * Hi * Di, *scores = wts + s * Hi;
    if (pre) {
        /* a batched step projected this row's queries, weights and the
         * indexer compressor's inputs */
        qi = pre->qi;
        wts = pre->wts;
        if ((st = run_compressor(ctx, c, L, &L->icomp, &S->icomp, x, ck, S->ikv, ib, &n_new, wa,
                                 pre->ikv, pre->iz)))
            goto done;
    } else {
        const dsattn_attn_rows qrows = { s, NULL, ck->start_pos, aqs };
        if ((st = dsattn_index_query(ctx, &L->attn, &qrows, qr, qi)))
            goto done;
        if ((st = run_compressor(ctx, c, L, &L->icomp, &S->icomp, x, ck, S->ikv, ib, &n_new, wa,
                                 NULL, NULL)))
            goto done;
        if ((st = dsattn_index_weights(ctx, &L->i_wproj, x, s, Hi, Di, wts))) goto done;
    }
    const dsattn_kv_src ksrc = { DSATTN_KV_FP4_IDX, S->ikv, ib, T, Di, 0 };
    /* rows are independent: one thread per row (prefill), so the result does
     * not depend on the thread count.  A single decode row runs outside any
     * region, so the scorer's own parallel loop is a top-level team (nested
     * in an inactive region, libgomp starts extra threads beside the pool). */
#define INDEX_ROW(t, th)                                                                   \
    do {                                                                                  \
        float *score = scores + (size_t)(th) * (T + 1);                                   \
        int32_t *pk = pick + (size_t)(th) * (kw + 1);                                     \
        /* entry j is visible to query t iff j < (t+1) // m */                            \
        const size_t cl = ck->prefill ? ((t) + 1) / m : T;                                \
        const size_t k = DSATTN_MIN(kw, cl);                                              \
        dsattn_index_scores_bf16(ctx, qi + (t) * Hi * Di, Hi, Di, wts + (t) * Hi, &ksrc, 0, cl, \
                                 score);                                                  \
        dsattn_topk(score, cl, k, pk, NULL);                                              \
        for (size_t i = 0; i < kw; i++) {                                                 \
            const int32_t j = i < k ? pk[i] : -1;                                         \
            S->sel[(t) * kw + i] = j;                                                     \
            rows[(t) * kw + i] = j >= 0 ? j + (int32_t)offset : -1;                       \
        }                                                                                 \
    } while (0)
    if (nthr > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
        for (size_t t = 0; t < s; t++) INDEX_ROW(t, omp_get_thread_num());
    } else {
        for (size_t t = 0; t < s; t++) INDEX_ROW(t, 0);
    }
#undef INDEX_ROW
    S->sel_rows = s;
    S->sel_w = kw;
done:
    dsattn_ws_reset(wa, mark);
    return st;
}

/* ==== The layer forward ================================================= */

/* The layer forward's scratch for s rows of which qb at a time have heads
 * (dsattn_csa_prompt_block), nthr threads, ww window and cw compressed
 * index columns: qr [s], q [qb], kv [s], o [qb], oa [qb], act-quant (s rows
 * of the inputs, qb of the grouped output), per-task attention workspace
 * and index row | window rows [s] | compressed index rows [s]. */
typedef struct {
    size_t hg, hper, att_ws, per_thr, bytes;
} fwd_plan;

/* the act-quant scratch's rows: the whole chunk's inputs x and qr (the
 * query, the window KV, the indexer) and a block's grouped output */
static size_t fwd_aq(const dsattn_v4_config *c, size_t s, size_t qb)
{
    const size_t in = DSATTN_MAX((size_t)c->dim, (size_t)c->q_lora_rank);
    return DSATTN_MAX(dsattn_attn_aq_scratch(s, in),
                      dsattn_attn_aq_scratch(qb, (size_t)c->o_groups * (size_t)c->o_lora_rank));
}

static fwd_plan plan_fwd(const dsattn_v4_config *c, size_t s, size_t qb, int nthr, size_t ww,
                         size_t cw)
{
    const size_t H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank, kvb = dsattn_v4_kv_bytes(c);
    fwd_plan p;
    /* decode: one head group per thread - every task gathers and decodes
     * all of the row's attended entries, so more groups cost more decoding */
    p.hg = s == 1 ? DSATTN_MIN(H, (size_t)nthr) : 1;
    p.hper = (H + p.hg - 1) / p.hg;
    p.att_ws = dsattn_sparse_attn_scratch(p.hper, D);
    p.per_thr = p.att_ws + ww + cw + 16;
    const size_t nfl = s * QL + qb * H * D + s * D + qb * H * D + qb * G * R +
                       fwd_aq(c, s, qb) + (size_t)nthr * p.per_thr;
    p.bytes = nfl * sizeof(float) + s * kvb + 64 + (s * cw + 1) * sizeof(int32_t);
    return p;
}

/* What one decode step at any position below cap needs, with up to
 * dsattn_ws_threads() threads: the forward's scratch (*fwd) and the
 * compressors' / indexer's (*ws, the stand-in stack's rows included). */
static void v4_decode_scratch(const dsattn_v4 *m, size_t cap, size_t *fwd, size_t *ws)
{
    const dsattn_v4_config *c = &m->cfg;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const int T = dsattn_ws_threads();
    *fwd = *ws = 0;
    size_t need = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const dsattn_v4_layer_w *L = &m->layer[l];
        const size_t ratio = (size_t)L->ratio, Tc = ratio ? cap / ratio : 0;
        const size_t cw = L->kind == DSATTN_V4_CSA ? DSATTN_MIN((size_t)c->index_topk, Tc)
                          : L->kind == DSATTN_V4_HCA ? Tc : 0;
        for (int n = 1; n <= T; n++)
            *fwd = DSATTN_MAX(*fwd, plan_fwd(c, 1, 1, n, (size_t)c->window_size, cw).bytes);
        size_t b = 0;
        if (ratio > 0) dsattn_ws_need(&b, compressor_bytes(&L->comp, 1, 0), 1);
        if (L->kind == DSATTN_V4_CSA) {
            size_t ib = 0;
            dsattn_ws_need(&ib, Hi * Di + Hi + Tc + 1, sizeof(float));
            dsattn_ws_need(&ib, cw + 1, sizeof(int32_t));
            dsattn_ws_need(&ib, compressor_bytes(&L->icomp, 1, 0), 1);
            b = DSATTN_MAX(b, ib);
        }
        need = DSATTN_MAX(need, b);
    }
    dsattn_ws_need(ws, 2 * (size_t)c->dim, sizeof(float));            /* stack_forward */
    if (*ws == SIZE_MAX || !dsattn_add_size(*ws, need, ws)) *ws = SIZE_MAX;
}

dsattn_status dsattn_v4_attn_forward(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l,
                                     const float *x, size_t n_tok, float *out)
{
    if (!ctx || !seq || !x || !out || n_tok == 0) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v4 *m = seq->m;
    const dsattn_v4_config *c = &m->cfg;
    if (!dsattn_v4_seq_holds(seq, l)) return DSATTN_ERR_INVALID_ARG;
    if ((size_t)seq->pos + n_tok > seq->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    if (!m->has_weights) return DSATTN_ERR_UNSUPPORTED;        /* config-only model */
    if (seq->pos > 0 && n_tok != 1) return DSATTN_ERR_UNSUPPORTED; /* no chunked prefill */
    const dsattn_v4_layer_w *L = &m->layer[l];
    dsattn_v4_layer_s *S = &seq->layer[l];
    const chunk ck = { n_tok, seq->pos, seq->pos == 0 };
    const size_t H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t rd = (size_t)c->rope_head_dim, QL = (size_t)c->q_lora_rank;
    const size_t G = (size_t)c->o_groups, R = (size_t)c->o_lora_rank;
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    const size_t ratio = (size_t)L->ratio;
    const size_t T = ratio ? ((size_t)ck.start_pos + n_tok) / ratio : 0;
    const size_t wrows = ck.prefill ? n_tok : w;               /* window rows attended */
    const size_t ww = ck.prefill ? DSATTN_MIN(n_tok, w) : w;   /* window index width   */
    /* compressed index width: CSA top-k, HCA every entry (prefill: s // m
     * columns, -1 where not yet visible; decode: (pos+1) // m) */
    const size_t cw = L->kind == DSATTN_V4_CSA ? DSATTN_MIN((size_t)c->index_topk, T)
                      : L->kind == DSATTN_V4_HCA ? T : 0;
    const size_t offset = wrows;
    dsattn_status st;

    const int nthr = DSATTN_MAX(ctx->n_threads, 1);
    /* rows with heads at once: the whole chunk, or a prompt's block */
    const size_t qb = DSATTN_MIN(n_tok, DSATTN_MAX(dsattn_csa_prompt_block, (size_t)1));
    const fwd_plan fp = plan_fwd(c, n_tok, qb, nthr, ww, cw);
    const size_t hg = fp.hg, hper = fp.hper, att_ws = fp.att_ws, per_thr = fp.per_thr;
    float *qr = scratch_get(ctx, seq, fp.bytes);
    if (!qr) return DSATTN_ERR_NOMEM;
    float *q = qr + n_tok * QL, *kvw = q + qb * H * D, *o = kvw + n_tok * D;
    float *oa = o + qb * H * D;
    float *aqs = oa + qb * G * R, *thr_ws = aqs + fwd_aq(c, n_tok, qb);
    uint8_t *wrow = (uint8_t *)(thr_ws + (size_t)nthr * per_thr);
    int32_t *crow = (int32_t *)(((uintptr_t)(wrow + n_tok * kvb) + 63) & ~(uintptr_t)63);

    /* ---- query: q_norm(wq_a x) for every row (the indexer reads it; the
     * heads wq_b -> per-head RMS rescale -> RoPE a block at a time, below);
     * window KV: kv_norm(wkv x) -> RoPE -> MODEL1 row; ring slot p % w */
    dsattn_phase_mark pm;
    const dsattn_attn_rows rows = { n_tok, NULL, ck.start_pos, aqs };
    const window_rows wr = { S->kv, wrow, n_tok, (size_t)ck.start_pos, w, D, rd, kvb };
    const dsattn_csa_qkv qkv = { x, qr, NULL, NULL, NULL, kvw, pack_window, &wr };
    if ((st = dsattn_csa_query_kv(ctx, &L->attn, &rows, &qkv))) return st;
    const dsattn_kv_src wsrc = { DSATTN_KV_V4, ck.prefill ? wrow : S->kv, kvb, wrows, D, rd };

    /* ---- compressed branch: index rows, then the main compressor */
    dsattn_kv_src csrc = { DSATTN_KV_V4, S->kv + w * kvb, kvb, T, D, rd };
    if (L->kind == DSATTN_V4_CSA && cw > 0) {
        dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
        st = run_indexer(ctx, seq, l, x, qr, &ck, offset, crow, cw, aqs, NULL);
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
    } else if (L->kind == DSATTN_V4_CSA) {
        S->sel_rows = n_tok;
        S->sel_w = 0;
        /* the indexer's compressor still runs (its state fills up) */
        size_t n_new;
        dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
        st = run_compressor(ctx, c, L, &L->icomp, &S->icomp, x, &ck, S->ikv,
                            dsattn_v4_idx_bytes(c), &n_new, &seq->ws, NULL, NULL);
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
    } else if (L->kind == DSATTN_V4_HCA) {
        for (size_t t = 0; t < n_tok; t++) {
            const size_t cl = ck.prefill ? (t + 1) / ratio : T;
            for (size_t j = 0; j < cw; j++)
                crow[t * cw + j] = j < cl ? (int32_t)(j + offset) : -1;
        }
    }
    if (ratio > 0) {
        size_t n_new;
        dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
        st = run_compressor(ctx, c, L, &L->comp, &S->comp, x, &ck, S->kv + w * kvb, kvb, &n_new,
                            &seq->ws, NULL, NULL);
        dsattn_phase_end(ctx, &pm);
        if (st) return st;
    }

    /* ---- per block of rows: the query heads, one sparse attention over
     * [window rows ; compressed rows] (a row with no valid entry: the
     * sequence's dsattn_v4_empty rule), then inverse RoPE at the query
     * position, grouped wo_a, wo_b */
    const int zero = seq->empty == DSATTN_V4_EMPTY_ZERO;
    const dsattn_csa_chunk_rows cr = { &ck, w, 1, crow,
                                       { wsrc, csrc, ww, cw, zero ? -1e30f : -INFINITY, zero } };
    const dsattn_csa_attend job = { NULL, o, oa, out, L->sink, hg, hper, att_ws, per_thr, thr_ws,
                                    dsattn_csa_chunk_row, &cr };
    return dsattn_csa_prompt_attend(ctx, &L->attn, &rows, qr, q, qb, &job);
}

dsattn_status dsattn_v4_compress_rows(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l, int index,
                                      const dsattn_v4_chunk *ck, const float *kv,
                                      const float *z)
{
    const dsattn_v4_config *c = &seq->m->cfg;
    const dsattn_v4_layer_w *L = &seq->m->layer[l];
    dsattn_v4_layer_s *S = &seq->layer[l];
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    size_t n_new;
    if (index)
        return run_compressor(ctx, c, L, &L->icomp, &S->icomp, NULL, ck, S->ikv,
                              dsattn_v4_idx_bytes(c), &n_new, &seq->ws, kv, z);
    return run_compressor(ctx, c, L, &L->comp, &S->comp, NULL, ck, S->kv + w * kvb, kvb, &n_new,
                          &seq->ws, kv, z);
}

dsattn_status dsattn_v4_index_rows(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l,
                                   const dsattn_v4_chunk *ck, size_t offset, int32_t *rows,
                                   size_t kw, const dsattn_v4_index_pre *pre)
{
    return run_indexer(ctx, seq, l, NULL, NULL, ck, offset, rows, kw, NULL, pre);
}

size_t dsattn_v4_seq_scratch_at(const dsattn_v4 *m, size_t cap)
{
    if (!m) return 0;
    const dsattn_v4_config *c = &m->cfg;
    size_t fwd, wsb, sel = 0, b;
    v4_decode_scratch(m, cap, &fwd, &wsb);
    for (int l = 0; l < c->n_layers; l++)
        if (m->layer[l].kind == DSATTN_V4_CSA)
            sel += (DSATTN_MIN((size_t)c->index_topk, cap / (size_t)m->layer[l].ratio) + 1) *
                   sizeof(int32_t);
    if (fwd == SIZE_MAX || wsb == SIZE_MAX || !dsattn_add_size(fwd, wsb, &b) ||
        !dsattn_add_size(b, sel, &b))
        return SIZE_MAX;
    return b;
}

/* ==== The golden-case stack and accessors =============================== */

DSATTN_STANDIN_STACK_API(v4, norm_eps, dsattn_v4_seq_whole)

dsattn_status dsattn_v4_seq_selection(const dsattn_v4_seq *s, int layer,
                                      const int32_t **rows, size_t *n_rows, size_t *width)
{
    if (!s || !rows || !n_rows || !width || !dsattn_v4_seq_holds(s, layer))
        return DSATTN_ERR_INVALID_ARG;
    if (s->m->layer[layer].kind != DSATTN_V4_CSA) return DSATTN_ERR_NOT_FOUND;
    *rows = s->layer[layer].sel;
    *n_rows = s->layer[layer].sel_rows;
    *width = s->layer[layer].sel_w;
    return DSATTN_OK;
}

dsattn_status dsattn_v4_seq_cache(const dsattn_v4_seq *s, int layer, int which,
                                  const uint8_t **rows, size_t *n_rows, size_t *row_bytes)
{
    if (!s || !rows || !n_rows || !row_bytes || !dsattn_v4_seq_holds(s, layer))
        return DSATTN_ERR_INVALID_ARG;
    const dsattn_v4_config *c = &s->m->cfg;
    const dsattn_v4_layer_w *L = &s->m->layer[layer];
    const dsattn_v4_layer_s *S = &s->layer[layer];
    const size_t written = L->ratio > 0 ? (size_t)s->pos / (size_t)L->ratio : 0;
    switch (which) {
    case 0:
        *rows = S->kv;
        *n_rows = (size_t)c->window_size + written;
        *row_bytes = dsattn_v4_kv_bytes(c);
        return DSATTN_OK;
    case 1:
        if (!S->ikv) return DSATTN_ERR_NOT_FOUND;
        *rows = S->ikv;
        *n_rows = written;
        *row_bytes = dsattn_v4_idx_bytes(c);
        return DSATTN_OK;
    }
    return DSATTN_ERR_INVALID_ARG;
}

dsattn_status dsattn_v4_seq_kv_bill(const dsattn_v4_seq *s, dsattn_kv_bill *b)
{
    if (!s || !b) return DSATTN_ERR_INVALID_ARG;
    /* the byte counts seq_create recorded as it allocated (one KV buffer per
     * layer: its ring rows are bounded state, the rest is global), and the
     * scratch as it is now */
    size_t sc = s->scratch_size + s->ws.cap;
    for (int64_t l = 0; l < s->m->cfg.n_layers; l++) {
        const dsattn_v4_layer_s *S = &s->layer[l];
        sc += dsattn_chunk_rows_bytes(S->sel, S->sel_cap, S->sel_own, S->sel_own_cap,
                                      sizeof(int32_t));
    }
    *b = (dsattn_kv_bill){ .global_bytes_allocated = s->kv_bytes, .window_bytes = s->window_bytes,
                           .state_bytes = s->state_bytes, .scratch_bytes = sc };
    return dsattn_kv_bill_per_token(b, s->max_seq_len);
}

static void rand_row(uint64_t *x, float *v, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
        v[k] = dsattn_round_bf16((float)((double)(*x >> 11) * 0x1p-53 * 2.0 - 1.0));
    }
}

dsattn_status dsattn_v4_seq_fill_synthetic(dsattn_v4_seq *s, int64_t depth, uint64_t seed)
{
    if (!s || depth < 0 || (size_t)depth >= s->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v4_config *c = &s->m->cfg;
    const size_t D = (size_t)c->head_dim, rd = (size_t)c->rope_head_dim;
    const size_t Di = (size_t)c->index_head_dim, w = (size_t)c->window_size;
    const size_t kvb = dsattn_v4_kv_bytes(c), ib = dsattn_v4_idx_bytes(c);
    for (int64_t l = s->first; l < (int64_t)s->first + s->count; l++) {
        const dsattn_v4_layer_w *L = &s->m->layer[l];
        dsattn_v4_layer_s *S = &s->layer[l];
        const size_t n = L->ratio > 0 ? (size_t)depth / (size_t)L->ratio : 0;
#pragma omp parallel
        {
            float v[512];
#pragma omp for schedule(static)
            for (size_t i = 0; i < w + n; i++) {
                uint64_t x = ((seed ^ ((uint64_t)l << 40)) | 1) ^ ((i + 1) * 0x9e3779b97f4a7c15ull);
                rand_row(&x, v, D);
                dsattn_v4_kv_pack(v, D - rd, rd, S->kv + i * kvb, NULL);
                if (S->ikv && i < n) {
                    rand_row(&x, v, Di);
                    dsattn_fp4_index_pack(v, Di, S->ikv + i * ib, NULL);
                }
            }
        }
        /* A finite state (kv small, scores 0) from which any decode step
         * pools a well-defined entry. */
        dsattn_v4_comp_s *cs[2] = { &S->comp, &S->icomp };
        const dsattn_v4_compressor_w *cw[2] = { &L->comp, &L->icomp };
        for (int k = 0; k < 2; k++) {
            if (!cs[k]->kv) continue;
            const size_t coff = coff_of(cw[k]), nn = coff * cw[k]->ratio * coff * cw[k]->d;
            uint64_t x = (seed ^ ((uint64_t)l << 32) ^ (uint64_t)k) | 1;
            rand_row(&x, cs[k]->kv, nn);
            for (size_t i = 0; i < nn; i++) cs[k]->z[i] = 0.0f;
        }
    }
    s->pos = depth;
    return DSATTN_OK;
}
