/* mla_forward.c - one sequence over an MLA (V3) or MLA + DSA (V3.2) stack:
 * the caches and the attention forward of both generations, both paths.
 *
 * The order of work inside a layer is the reference's MLA.forward
 * (docs/semantics.md §4-§5):
 *   q  = wq_b(q_norm(wq_a(x))) -> [H, dn | dr], interleaved RoPE on the last
 *        dr dims of each head
 *   kv = wkv_a(x) -> kv_norm(latent [KL]) | interleaved RoPE(k_pe [dr])
 *   cache write; (V3.2) the indexer's top-k; attention; wo.
 *
 * Arithmetic of each path, as each reference writes it (bf16 tensors, the
 * reference's default dtype; "bf16(...)" = one rounding of an fp32 value):
 *   V3 absorb  q' = bf16(q_nope . W_uk) [H, KL];  s = bf16(bf16(bf16(q'.kv)
 *              + bf16(q_pe.pe)) * scale); p = bf16(softmax_fp32(s + mask));
 *              x = bf16(p . kv); o = bf16(x . W_uv)
 *   V3 naive   K/V = wkv_b(kv) expanded and cached; s = bf16(bf16(q.k) *
 *              scale); p, o = bf16(p . v)
 *   V3.2 prefill (n > 1): the naive maths in fp32 over the chunk's own K/V,
 *              s = fp32(q.k) * scale, + index mask + causal mask
 *   V3.2 decode: q' = bf16(q_nope . W_uk); s = (fp32(q'.kv) + fp32(q_pe.pe))
 *              * scale, + index mask; x = bf16(p . kv); o = bf16(x . W_uv)
 * The index mask keeps only the selected positions; attending the selected
 * set directly is identical (masked entries add exact zeros to every sum).
 *
 * Reference mode follows docs/reference-mode.md (exact products, double sums,
 * one rounding; softmax e = exp(s - max), p = e / sum).  Fast mode keeps the
 * same cast points where they are free, but accumulates in fp32: the
 * absorbed attention streams the latent cache once for all heads in blocks
 * (online softmax, key ranges split over threads; the bf16 blocks where
 * they apply, else where the table has an mla slot (AVX-512, AVX2) the
 * heads-in-lanes kernels of mla_kernels.h on 12-key tiles decoded once for
 * both GEMMs, otherwise sgemm for Q.K^T and P.V), prefill rows run in
 * parallel.
 *
 * Here: the sequence (caches, lifetime, accessors, the synthetic fill), the
 * query and latent rows, the cache write, the indexer's selection and the
 * layer forward that calls the attention paths row by row.
 *
 * Not here: the attention of a query row over the cache on each path and
 * the W_uk / W_uv absorption products (mla_attend.c), the batched decode
 * step across sequences (mla_batch.c), the model and weights
 * (mla_model.c), the indexer's q/k and scores (mla_indexer.c).
 */
#include "mla.h"

#include "ktab.h"
#include "numfmt.h"
#include "seq_glue.h"

#include <math.h>
#include <stdlib.h>

/* ==== Sequence lifetime ================================================= */

static size_t fmt_row_bytes(const dsattn_mla_config *c, dsattn_mla_cache f, size_t *v_bytes)
{
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    *v_bytes = 0;
    switch (f) {
    case DSATTN_MLA_CACHE_NAIVE:
        *v_bytes = 2 * H * (size_t)c->v_dim;
        return 2 * H * (size_t)(c->nope + c->rope);
    case DSATTN_MLA_CACHE_LATENT_BF16: return 2 * (KL + dr);
    case DSATTN_MLA_CACHE_LATENT_FP8:  return dsattn_v32_kv_row_bytes(KL, dr);
    }
    return 0;
}

static size_t mla_ws_bytes(const dsattn_mla_config *c, dsattn_mla_cache fmt, size_t cap);

dsattn_status dsattn_mla_seq_create(dsattn_mla_seq **out, const dsattn_mla *m,
                                    size_t max_seq_len, dsattn_mla_cache fmt)
{
    if (!m) return DSATTN_ERR_INVALID_ARG;
    return dsattn_mla_seq_create_layers(out, m, max_seq_len, fmt, 0, (int)m->cfg.n_layers);
}

dsattn_status dsattn_mla_seq_create_layers(dsattn_mla_seq **out, const dsattn_mla *m,
                                           size_t max_seq_len, dsattn_mla_cache fmt,
                                           int first_layer, int n_layers)
{
    if (!out || !m || max_seq_len == 0) return DSATTN_ERR_INVALID_ARG;
    if (first_layer < 0 || n_layers <= 0 ||
        (int64_t)first_layer + n_layers > m->cfg.n_layers)
        return DSATTN_ERR_INVALID_ARG;
    if (fmt != DSATTN_MLA_CACHE_NAIVE && fmt != DSATTN_MLA_CACHE_LATENT_BF16 &&
        fmt != DSATTN_MLA_CACHE_LATENT_FP8)
        return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    const dsattn_mla_config *c = &m->cfg;
    if (fmt == DSATTN_MLA_CACHE_LATENT_FP8 && c->kv_lora_rank % 128)
        return DSATTN_ERR_UNSUPPORTED;       /* FP8 scale blocks of 128 */
    if (max_seq_len > (size_t)INT32_MAX) return DSATTN_ERR_INVALID_ARG;
    dsattn_mla_seq *s = calloc(1, sizeof *s);
    if (!s) return DSATTN_ERR_NOMEM;
    s->m = m;
    s->fmt = fmt;
    s->max_seq_len = max_seq_len;
    s->row_bytes = fmt_row_bytes(c, fmt, &s->v_bytes);
    s->idx_bytes = c->dsa ? dsattn_v32_index_row_bytes((size_t)c->index_head_dim) : 0;
    s->first = first_layer;
    s->count = n_layers;
    for (int64_t l = first_layer; l < (int64_t)first_layer + n_layers; l++) {
        dsattn_mla_layer_s *S = &s->layer[l];
        S->cache = dsattn_alloc_array(max_seq_len, s->row_bytes);
        if (!S->cache) goto nomem;
        if (s->v_bytes && !(S->v = dsattn_alloc_array(max_seq_len, s->v_bytes))) goto nomem;
        if (s->idx_bytes && !(S->kidx = dsattn_alloc_array(max_seq_len, s->idx_bytes)))
            goto nomem;
        s->kv_bytes += max_seq_len * (s->row_bytes + s->v_bytes + s->idx_bytes);
        if (c->dsa) {
            /* a decode step's selection row: min(index_topk, capacity) + 1 */
            S->sel_cap = DSATTN_MIN((size_t)c->index_topk, max_seq_len) + 1;
            if (!(S->sel = malloc(S->sel_cap * sizeof(int32_t)))) goto nomem;
            S->sel_own = S->sel;
            S->sel_own_cap = S->sel_cap;
            s->scratch_bytes += S->sel_cap * sizeof(int32_t);
        }
    }
    {
        const size_t wb = mla_ws_bytes(c, fmt, max_seq_len);
        dsattn_status st = dsattn_ws_init(&s->ws, wb);
        if (st) {
            dsattn_mla_seq_destroy(s);
            return st;
        }
        s->scratch_bytes += wb;
    }
    *out = s;
    return DSATTN_OK;
nomem:
    dsattn_mla_seq_destroy(s);
    return DSATTN_ERR_NOMEM;
}

void dsattn_mla_seq_destroy(dsattn_mla_seq *s)
{
    if (!s) return;
    for (int l = 0; l < DSATTN_MAX_LAYERS; l++) {
        dsattn_free(s->layer[l].cache);
        dsattn_free(s->layer[l].v);
        dsattn_free(s->layer[l].kidx);
        dsattn_chunk_rows_free(s->layer[l].sel, s->layer[l].sel_own);
    }
    dsattn_ws_free(&s->ws);
    free(s);
}

DSATTN_SEQ_POS_API(mla)

dsattn_mla_cache dsattn_mla_seq_cache_format(const dsattn_mla_seq *s)
{
    return s ? s->fmt : (dsattn_mla_cache)-1;
}

/* ==== Cache rows ======================================================== */

static void put_bf16(uint8_t *p, float v)
{
    uint16_t h = dsattn_f32_to_bf16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* latent row j <- kv[KL] | pe[dr] contiguous (bf16 values) */
static void latent_put(dsattn_mla_seq *s, int l, size_t j, const float *kvpe)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    uint8_t *row = s->layer[l].cache + j * s->row_bytes;
    if (s->fmt == DSATTN_MLA_CACHE_LATENT_BF16)
        for (size_t i = 0; i < KL + dr; i++) put_bf16(row + 2 * i, kvpe[i]);
    else
        dsattn_v32_kv_pack(kvpe, KL, dr, row, NULL);
}

/* ==== Small numeric helpers ============================================= */

/* RMSNorm of a bf16 activation with a weight (q_norm / kv_norm). */
static void mla_rmsnorm(const float *x, const float *w, size_t n, float eps, float *y)
{
    dsattn_rmsnorm(x, w, n, eps, y, DSATTN_OUT_BF16);
}

/* ==== The indexer's selection =========================================== */

/* Top-k of one query row: score over the visible keys [0, nvis); the
 * reference takes topk(min(index_topk, end)) of the masked row, whose
 * attended part is the top min(index_topk, nvis) of the visible scores
 * (masked picks, if any, attend nothing).  Writes the attended positions
 * ascending into row[0..width), -1 padded; returns how many. */
size_t dsattn_mla_select_row(const float *score, size_t nvis, size_t topk, size_t width,
                             int32_t *row)
{
    size_t k = DSATTN_MIN(topk, nvis);
    dsattn_topk(score, nvis, k, row, NULL);
    dsattn_sort_idx_valid_first(row, k);
    for (size_t i = k; i < width; i++) row[i] = -1;
    return k;
}

/* ==== The layer forward ================================================= */

/* The scratch one decode step (one token, any position below cap) takes
 * from the sequence's dsattn_ws, in either mode, on any kernel path, with
 * up to dsattn_ws_threads() threads: the buffers of dsattn_mla_attn_forward
 * below, in the order it takes them.  Steps that release what they took
 * (the indexer, then the attention) count as the larger of the two. */
static size_t mla_ws_bytes(const dsattn_mla_config *c, dsattn_mla_cache fmt, size_t cap)
{
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank, dqk = dn + dr, D = KL + dr;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const int T = dsattn_ws_threads(), naive = fmt == DSATTN_MLA_CACHE_NAIVE;
    const size_t maxk = DSATTN_MAX(DSATTN_MAX(dim, QL), DSATTN_MAX(KL, H * dv));
    size_t b = 0;
    dsattn_ws_need(&b, 2 * dim, sizeof(float));                    /* stack_forward */
    dsattn_ws_need(&b, DSATTN_MAX(QL, 1), sizeof(float));          /* qr   */
    dsattn_ws_need(&b, H * dqk, sizeof(float));                    /* q    */
    dsattn_ws_need(&b, KL + dr, sizeof(float));                    /* kv   */
    dsattn_ws_need(&b, H * dv, sizeof(float));                     /* o    */
    dsattn_ws_need(&b, maxk, sizeof(float));                       /* aqs  */
    if (naive) dsattn_ws_need(&b, H * (dn + dv), sizeof(float));   /* kvb  */
    size_t idx = 0;
    if (c->dsa) {
        dsattn_ws_need(&b, Hi * Di, sizeof(float));                /* qc   */
        dsattn_ws_need(&b, Hi, sizeof(float));                     /* wq   */
        dsattn_ws_need(&b, cap, sizeof(float));                    /* score */
        dsattn_ws_need(&b, 1, sizeof(size_t));                     /* nsel */
        dsattn_ws_need(&idx, Di + DSATTN_MAX(dim, QL) + 1, sizeof(float));     /* index_qk */
        idx = DSATTN_MAX(idx, dsattn_mla_index_scores_ws(Hi, Di, T));
    }
    size_t att = 0;
    if (naive) {
        dsattn_ws_need(&att, cap, (dqk + dv) * sizeof(float));    /* dsattn_mla_naive_row */
        dsattn_ws_need(&att, cap + dv, sizeof(float));             /* dsattn_mla_expanded_row */
        dsattn_ws_need(&att, dv, sizeof(double));
    } else {
        dsattn_ws_need(&att, H * KL, sizeof(float));               /* qa   */
        dsattn_ws_need(&att, H * KL, sizeof(float));               /* xo   */
        dsattn_ws_need(&att, H * dr, sizeof(float));               /* qpe  */
        size_t row = 0, r;
        /* the absorption products, dsattn_mla_absorb_q / _out */
        dsattn_ws_need(&row, (size_t)T, dsattn_mla_absorb_ws_per(KL, 1));
        r = 0;                                                     /* reference row */
        dsattn_ws_need(&r, cap + KL + dr, sizeof(float));
        dsattn_ws_need(&r, KL, sizeof(double));
        row = DSATTN_MAX(row, r);
        const int nt = dsattn_mla_row_threads(cap, T);
        r = 0;
        dsattn_ws_need(&r, dsattn_mla_tiled_ws_bytes(H, KL, dr, nt, NULL, NULL), 1);
        row = DSATTN_MAX(row, r);
        r = 0;
        dsattn_ws_need(&r, dsattn_mla_generic_ws_bytes(H, KL, dr, nt, NULL), 1);
        row = DSATTN_MAX(row, r);
        const size_t hp = (H + 31) / 32 * 32;
        if (dsattn_amx_fits(hp, D, KL) && KL % 128 == 0) {
            r = 0;
            const int fp8 = fmt == DSATTN_MLA_CACHE_LATENT_FP8;
            dsattn_ws_need(&r, dsattn_mla_amx_ws_bytes(H, KL, dr, fp8, nt, NULL, NULL), 1);
            row = DSATTN_MAX(row, r);
        }
        if (!dsattn_add_size(att, row, &att)) att = SIZE_MAX;
    }
    size_t rest = DSATTN_MAX(idx, att);
    if (b == SIZE_MAX || rest == SIZE_MAX || !dsattn_add_size(b, rest, &b)) return SIZE_MAX;
    return b;
}

/* The buffers of n rows both forwards take first, in this order from ws
 * (zeroed): qr, q, kv, o, aqs and, when expanded, kvb.  0 when one is
 * missing. */
int dsattn_mla_fwd_buf_rows(dsattn_mla_fwd_buf *b, dsattn_ws *ws, const dsattn_mla_config *c,
                            size_t n, int expanded)
{
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank;
    const size_t maxk = DSATTN_MAX(DSATTN_MAX(dim, QL), DSATTN_MAX(KL, H * dv));
    memset(b, 0, sizeof *b);
    b->qr = dsattn_ws_arrayz(ws, n, DSATTN_MAX(QL, 1) * sizeof(float));
    b->q = dsattn_ws_arrayz(ws, n, H * (dn + dr) * sizeof(float));
    b->kv = dsattn_ws_arrayz(ws, n, (KL + dr) * sizeof(float));
    b->o = dsattn_ws_arrayz(ws, n, H * dv * sizeof(float));
    b->aqs = dsattn_ws_arrayz(ws, n, maxk * sizeof(float));
    if (expanded) b->kvb = dsattn_ws_arrayz(ws, n, H * (dn + dv) * sizeof(float));
    return b->qr && b->q && b->kv && b->o && b->aqs && (!expanded || b->kvb);
}

/* Row t's position: start + t in one sequence's chunk (seqs NULL), or
 * sequence t's own in a batched step. */
static int64_t row_pos(int64_t start, dsattn_mla_seq *const *seqs, size_t t)
{
    return seqs ? seqs[t]->pos : start + (int64_t)t;
}

/* The query of n rows of x: q_norm(wq_a x) into b->qr, then wq_b (or wq
 * without a low-rank query) into b->q, RoPE on each head's rope tail at
 * the row's position. */
dsattn_status dsattn_mla_query_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                    size_t n, int64_t start, dsattn_mla_seq *const *seqs,
                                    const dsattn_mla_fwd_buf *b)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_mla_layer_w *L = &m->layer[l];
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dqk = dn + dr;
    const dsattn_actq *aq = m->use_actq ? &m->actq : NULL;
    float cs[64], sn[64];
    dsattn_status st;
    if (QL > 0) {
        if ((st = dsattn_linear(ctx, &L->wq_a, x, dim, n, b->qr, QL, DSATTN_OUT_BF16, aq, b->aqs)))
            return st;
        for (size_t t = 0; t < n; t++) mla_rmsnorm(b->qr + t * QL, L->q_norm, QL, c->eps, b->qr + t * QL);
        st = dsattn_linear(ctx, &L->wq_b, b->qr, QL, n, b->q, H * dqk, DSATTN_OUT_BF16, aq, b->aqs);
    } else {
        st = dsattn_linear(ctx, &L->wq, x, dim, n, b->q, H * dqk, DSATTN_OUT_BF16, aq, b->aqs);
    }
    if (st) return st;
    for (size_t t = 0; t < n; t++) {
        dsattn_rope_cs(&m->rope, row_pos(start, seqs, t), cs, sn);
        for (size_t h = 0; h < H; h++)
            dsattn_rope_apply(b->q + (t * H + h) * dqk + dn, dr, cs, sn, c->rope_il_mla, 0,
                              DSATTN_OUT_BF16);
    }
    return DSATTN_OK;
}

/* The latent rows of n rows of x into b->kv: kv_norm(wkv_a x [:KL]) |
 * RoPE(k_pe) at the row's position. */
dsattn_status dsattn_mla_latent_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                     size_t n, int64_t start, dsattn_mla_seq *const *seqs,
                                     const dsattn_mla_fwd_buf *b)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_mla_layer_w *L = &m->layer[l];
    const size_t dim = (size_t)c->dim, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const dsattn_actq *aq = m->use_actq ? &m->actq : NULL;
    float cs[64], sn[64];
    dsattn_status st = dsattn_linear(ctx, &L->wkv_a, x, dim, n, b->kv, KL + dr, DSATTN_OUT_BF16,
                                     aq, b->aqs);
    if (st) return st;
    for (size_t t = 0; t < n; t++) {
        float *k = b->kv + t * (KL + dr);
        mla_rmsnorm(k, L->kv_norm, KL, c->eps, k);
        dsattn_rope_cs(&m->rope, row_pos(start, seqs, t), cs, sn);
        dsattn_rope_apply(k + KL, dr, cs, sn, c->rope_il_mla, 0, DSATTN_OUT_BF16);
    }
    return DSATTN_OK;
}

/* Token j's cache row of layer l: the latent kv | k_pe (kv: KL + dr), or
 * for NAIVE the expanded K = [k_nope | k_pe] and V per head (e: wkv_b's
 * [H, dn + dv] of the token). */
void dsattn_mla_cache_write(dsattn_mla_seq *seq, int l, size_t j, const float *kv, const float *e)
{
    const dsattn_mla_config *c = &seq->m->cfg;
    if (seq->fmt != DSATTN_MLA_CACHE_NAIVE) {
        latent_put(seq, l, j, kv);
        return;
    }
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dr = (size_t)c->rope;
    const size_t dv = (size_t)c->v_dim, KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    dsattn_mla_layer_s *S = &seq->layer[l];
    uint8_t *krow = S->cache + j * seq->row_bytes, *vrow = S->v + j * seq->v_bytes;
    const float *kpe = kv + KL;
    for (size_t h = 0; h < H; h++) {
        for (size_t i = 0; i < dn; i++) put_bf16(krow + 2 * (h * dqk + i), e[h * (dn + dv) + i]);
        for (size_t i = 0; i < dr; i++) put_bf16(krow + 2 * (h * dqk + dn + i), kpe[i]);
        for (size_t i = 0; i < dv; i++) put_bf16(vrow + 2 * (h * dv + i), e[h * (dn + dv) + dn + i]);
    }
}

dsattn_status dsattn_mla_attn_forward(dsattn_ctx *ctx, dsattn_mla_seq *seq, int l,
                                      const float *x, size_t n_tok, float *out)
{
    if (!ctx || !seq || !x || !out || n_tok == 0) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mla *m = seq->m;
    const dsattn_mla_config *c = &m->cfg;
    if (!dsattn_mla_seq_holds(seq, l)) return DSATTN_ERR_INVALID_ARG;
    if ((size_t)seq->pos + n_tok > seq->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    if (!dsattn_mla_model_holds(m, l)) return DSATTN_ERR_UNSUPPORTED;   /* no weights */
    if (seq->pos > 0 && n_tok != 1) return DSATTN_ERR_UNSUPPORTED;     /* no chunked prefill */
    const dsattn_mla_layer_w *L = &m->layer[l];
    dsattn_mla_layer_s *S = &seq->layer[l];
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const int64_t start = seq->pos;
    const size_t end = (size_t)start + n_tok;
    const int v3 = !c->dsa;
    const int naive = seq->fmt == DSATTN_MLA_CACHE_NAIVE;
    /* V3.2 runs its MHA path whenever the chunk has more than one token
     * (the reference passes a mask exactly then); V3 and V3.2 decode read
     * the cache in its own format. */
    const int mha_fresh = c->dsa && n_tok > 1;
    const int need_expanded = naive || mha_fresh;
    const dsattn_actq *aq = m->use_actq ? &m->actq : NULL;
    dsattn_status st = DSATTN_OK;
    dsattn_phase_mark pm = { -1, 0.0, 0, 0 };        /* the open phase, if any */

    const int ref = ctx->mode == DSATTN_MODE_REFERENCE;
    /* every buffer of the call from the sequence's scratch (sized for a
     * decode step: a prefill chunk may spill to the heap); wa NULL for
     * helpers that run inside a parallel loop */
    dsattn_ws *ws = &seq->ws;
    const dsattn_ws_pos ws_mark = dsattn_ws_mark(ws);
    dsattn_mla_fwd_buf b;
    const int rows_ok = dsattn_mla_fwd_buf_rows(&b, ws, c, n_tok, need_expanded);
    if (c->dsa) {
        b.qc = dsattn_ws_arrayz(ws, n_tok, Hi * Di * sizeof(float));
        b.wq = dsattn_ws_arrayz(ws, n_tok, Hi * sizeof(float));
        b.score = dsattn_ws_array(ws, end, sizeof(float));   /* written before read */
    }
    if (!rows_ok || (c->dsa && (!b.qc || !b.wq || !b.score))) {
        st = DSATTN_ERR_NOMEM;
        goto done;
    }

    /* ---- query: q_norm(wq_a x) -> wq_b, RoPE on each head's rope tail */
    dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
    if ((st = dsattn_mla_query_rows(ctx, m, l, x, n_tok, start, NULL, &b))) goto done;
    dsattn_phase_end(ctx, &pm);

    /* ---- latent: kv_norm(wkv_a x [:KL]) | RoPE(k_pe) */
    dsattn_phase_begin(ctx, DSATTN_PHASE_KV, &pm);
    if ((st = dsattn_mla_latent_rows(ctx, m, l, x, n_tok, start, NULL, &b))) goto done;

    /* ---- expanded K/V of this chunk (naive cache, V3.2 prefill) */
    if (need_expanded) {
        if ((st = dsattn_linear(ctx, &L->wkv_b, b.kv, KL + dr, n_tok, b.kvb, H * (dn + dv),
                                DSATTN_OUT_BF16, aq, b.aqs)))
            goto done;
    }

    /* ---- cache write */
    for (size_t t = 0; t < n_tok; t++)
        dsattn_mla_cache_write(seq, l, (size_t)start + t, b.kv + t * (KL + dr),
                    naive ? b.kvb + t * H * (dn + dv) : NULL);

    dsattn_phase_end(ctx, &pm);

    /* ---- V3.2: the lightning indexer's selection per row */
    const size_t width = c->dsa ? DSATTN_MIN((size_t)c->index_topk, end) : 0;
    size_t *nsel = NULL;
    dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
    if (c->dsa) {
        if ((st = dsattn_mla_index_qk(ctx, m, l, x, b.qr, n_tok, start, b.qc, b.wq, S->kidx, ws)))
            goto done;
        if (!dsattn_chunk_rows((void **)&S->sel, &S->sel_cap, S->sel_own, S->sel_own_cap,
                               n_tok * width + 1, sizeof(int32_t))) {
            st = DSATTN_ERR_NOMEM;
            goto done;
        }
        nsel = dsattn_ws_arrayz(ws, n_tok, sizeof *nsel);
        if (!nsel) { st = DSATTN_ERR_NOMEM; goto done; }
        for (size_t t = 0; t < n_tok; t++) {
            const size_t nvis = (size_t)start + t + 1;
            dsattn_mla_index_scores(ctx, b.qc + t * Hi * Di, b.wq + t * Hi, Hi, Di, S->kidx,
                                    nvis, b.score, ws);
            nsel[t] = dsattn_mla_select_row(b.score, nvis, (size_t)c->index_topk, width,
                                 S->sel + t * width);
        }
        S->sel_rows = n_tok;
        S->sel_w = width;
    }
    dsattn_phase_end(ctx, &pm);

    /* ---- attention, row by row */
    const int sparse = c->dsa && !c->force_dense;
    const int absorbed = !naive && !mha_fresh;
    if (absorbed) {
        b.qa = dsattn_ws_arrayz(ws, n_tok, H * KL * sizeof(float));
        b.xo = dsattn_ws_arrayz(ws, n_tok, H * KL * sizeof(float));
        if (!b.qa || !b.xo) { st = DSATTN_ERR_NOMEM; goto done; }
        float *qpe = dsattn_ws_arrayz(ws, n_tok, H * dr * sizeof(float));
        if (!qpe) { st = DSATTN_ERR_NOMEM; goto done; }
        dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);           /* W_uk */
        for (size_t t = 0; t < n_tok && !st; t++) {
            st = dsattn_mla_absorb_q(ctx, m, l, b.q + t * H * dqk, 1, b.qa + t * H * KL, ws);
            for (size_t h = 0; h < H; h++)
                memcpy(qpe + (t * H + h) * dr, b.q + (t * H + h) * dqk + dn, dr * sizeof(float));
        }
        dsattn_phase_end(ctx, &pm);
        /* rows in parallel (prefill), or one row with its keys split */
        dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
        const int row_par = !ref && n_tok > 1;
        dsattn_status rst = DSATTN_OK;
#define ABSORBED_ROW(t, nthr, keep)                                                           \
        (ref ? dsattn_mla_absorbed_row_ref(seq, l, b.qa + (t) * H * KL, qpe + (t) * H * dr,   \
                                           sparse ? S->sel + (t) * width : NULL,              \
                                           sparse ? nsel[t] : (size_t)start + (t) + 1, v3,    \
                                           b.xo + (t) * H * KL, keep)                         \
             : dsattn_mla_absorbed_row_fast(ctx, seq, l, b.qa + (t) * H * KL,                 \
                                            qpe + (t) * H * dr,                               \
                                            sparse ? S->sel + (t) * width : NULL,             \
                                            sparse ? nsel[t] : (size_t)start + (t) + 1, v3,   \
                                            b.xo + (t) * H * KL, nthr, keep))
        if (st) {
            /* dsattn_mla_absorb_q failed: nothing to attend */
        } else if (row_par) {
            /* prefill: rows in parallel, each on one thread */
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->n_threads)
            for (size_t t = 0; t < n_tok; t++) {
                dsattn_status r = ABSORBED_ROW(t, 1, NULL);
                if (r) {
#pragma omp atomic write
                    rst = r;
                }
            }
        } else {
            /* decode (or reference mode): one row at a time with its keys split
             * over the threads - not inside an inactive outer region, whose
             * nested team would start threads of its own beside the idle pool
             * (with OMP_WAIT_POLICY=active: 69 ms instead of 42 per V3 step) */
            for (size_t t = 0; t < n_tok && !rst; t++) rst = ABSORBED_ROW(t, ctx->n_threads, ws);
        }
#undef ABSORBED_ROW
        if (!st) st = rst;
        uint64_t nk = 0;
        for (size_t t = 0; t < n_tok; t++) nk += sparse ? nsel[t] : (uint64_t)start + t + 1;
        dsattn_count(ctx, nk * H * (2ull * (KL + dr) + 2ull * KL), nk * seq->row_bytes);
        dsattn_phase_end(ctx, &pm);
        dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);          /* W_uv */
        for (size_t t = 0; t < n_tok && !st; t++)
            st = dsattn_mla_absorb_out(ctx, m, l, b.xo + t * H * KL, 1, b.o + t * H * dv, ws);
    } else {
        /* expanded keys: the chunk's own (V3.2 prefill: k_nope and v from
         * wkv_b, the shared k_pe) or the naive cache */
        const dsattn_mla_kv_view fresh = { b.kvb, b.kv + KL, b.kvb + dn, H * (dn + dv), dn + dv,
                                KL + dr, 0, H * (dn + dv), dn + dv };
        dsattn_status rst = DSATTN_OK;
        dsattn_ws *rws = !ref && n_tok > 1 ? NULL : ws;     /* rows in parallel: the heap */
        dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
#define EXPANDED_ROW(t)                                                                     \
        do {                                                                                \
            const int32_t *idx = sparse ? S->sel + (t) * width : NULL;                      \
            const size_t n = sparse ? nsel[t] : (size_t)start + (t) + 1;                     \
            dsattn_status r = naive                                                         \
                ? dsattn_mla_naive_row(ctx, seq, l, b.q + (t) * H * dqk, idx, n, v3,        \
                                       b.o + (t) * H * dv, rws)                             \
                : dsattn_mla_expanded_row(ctx, c, b.q + (t) * H * dqk, &fresh, idx, n, v3,  \
                                          b.o + (t) * H * dv, rws);                         \
            if (r) {                                                                        \
                _Pragma("omp atomic write")                                                 \
                rst = r;                                                                    \
            }                                                                               \
        } while (0)
        if (!ref && n_tok > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->n_threads)
            for (size_t t = 0; t < n_tok; t++) EXPANDED_ROW(t);
        } else {
            /* no region: a team of one would be allocated every step */
            for (size_t t = 0; t < n_tok; t++) EXPANDED_ROW(t);
        }
#undef EXPANDED_ROW
        st = rst;
        uint64_t nk = 0;
        for (size_t t = 0; t < n_tok; t++) nk += sparse ? nsel[t] : (uint64_t)start + t + 1;
        dsattn_count(ctx, nk * H * 2ull * (dqk + dv), nk * (seq->row_bytes + seq->v_bytes));
        dsattn_phase_end(ctx, &pm);
        dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);
    }
    if (!st) st = dsattn_linear(ctx, &L->wo, b.o, H * dv, n_tok, out, dim, DSATTN_OUT_BF16, aq, b.aqs);
done:
    dsattn_phase_end(ctx, &pm);                      /* whatever is open */
    dsattn_ws_reset(ws, ws_mark);                    /* every buffer above */
    return st;
}

size_t dsattn_mla_seq_scratch_at(const dsattn_mla *m, size_t cap, dsattn_mla_cache fmt)
{
    if (!m) return 0;
    const dsattn_mla_config *c = &m->cfg;
    size_t b = mla_ws_bytes(c, fmt, cap), sel = 0;
    if (b == SIZE_MAX) return SIZE_MAX;
    if (c->dsa) sel = (size_t)c->n_layers * (DSATTN_MIN((size_t)c->index_topk, cap) + 1) * sizeof(int32_t);
    return dsattn_add_size(b, sel, &b) ? b : SIZE_MAX;
}

/* ==== The golden-case stack and accessors =============================== */

DSATTN_STANDIN_STACK_API(mla, eps, dsattn_mla_seq_stackable)

dsattn_status dsattn_mla_seq_selection(const dsattn_mla_seq *s, int layer, const int32_t **rows,
                                       size_t *n_rows, size_t *width)
{
    if (!s || !rows || !n_rows || !width || !dsattn_mla_seq_holds(s, layer))
        return DSATTN_ERR_INVALID_ARG;
    if (!s->m->cfg.dsa) return DSATTN_ERR_NOT_FOUND;
    *rows = s->layer[layer].sel;
    *n_rows = s->layer[layer].sel_rows;
    *width = s->layer[layer].sel_w;
    return DSATTN_OK;
}

dsattn_status dsattn_mla_seq_latent(const dsattn_mla_seq *s, int layer, size_t pos, float *kv,
                                    float *pe)
{
    if (!s || !dsattn_mla_seq_holds(s, layer) || pos >= (size_t)s->pos)
        return DSATTN_ERR_INVALID_ARG;
    if (s->fmt == DSATTN_MLA_CACHE_NAIVE) return DSATTN_ERR_NOT_FOUND;
    dsattn_mla_latent_row(s, layer, pos, kv, pe);
    return DSATTN_OK;
}

dsattn_status dsattn_mla_seq_index_key(const dsattn_mla_seq *s, int layer, size_t pos,
                                       uint8_t *codes, float *scale)
{
    if (!s || !dsattn_mla_seq_holds(s, layer) || pos >= (size_t)s->pos)
        return DSATTN_ERR_INVALID_ARG;
    if (!s->m->cfg.dsa) return DSATTN_ERR_NOT_FOUND;
    const size_t Di = (size_t)s->m->cfg.index_head_dim;
    const uint8_t *row = s->layer[layer].kidx + pos * s->idx_bytes;
    if (codes) memcpy(codes, row, Di);
    if (scale) {
        uint32_t u = (uint32_t)row[Di] | (uint32_t)row[Di + 1] << 8 | (uint32_t)row[Di + 2] << 16 |
                     (uint32_t)row[Di + 3] << 24;
        *scale = dsattn_bits_f32(u);
    }
    return DSATTN_OK;
}

dsattn_status dsattn_mla_seq_kv_bill(const dsattn_mla_seq *s, dsattn_kv_bill *b)
{
    if (!s || !b) return DSATTN_ERR_INVALID_ARG;
    /* the byte counts seq_create recorded as it allocated, and the rows a
     * long chunk left (until the next step) */
    size_t sc = s->scratch_bytes;
    for (int64_t l = s->first; l < (int64_t)s->first + s->count; l++) {
        const dsattn_mla_layer_s *S = &s->layer[l];
        if (S->sel != S->sel_own) sc += S->sel_cap * sizeof(int32_t);
    }
    *b = (dsattn_kv_bill){ .global_bytes_allocated = s->kv_bytes, .scratch_bytes = sc };
    return dsattn_kv_bill_per_token(b, s->max_seq_len);
}

dsattn_status dsattn_mla_seq_fill_synthetic(dsattn_mla_seq *s, int64_t depth, uint64_t seed)
{
    if (!s || depth < 0 || (size_t)depth >= s->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t Di = (size_t)c->index_head_dim;
    const size_t nval = DSATTN_MAX(DSATTN_MAX(s->row_bytes / 2, s->v_bytes / 2), KL + dr);
    for (int64_t l = s->first; l < (int64_t)s->first + s->count; l++) {
        dsattn_mla_layer_s *S = &s->layer[l];
        int fail = 0;
#pragma omp parallel
        {
            float *v = dsattn_alloc_array(nval + Di, sizeof(float));
            if (!v) {
#pragma omp atomic write
                fail = 1;
            }
#pragma omp for schedule(static)
            for (int64_t j = 0; j < depth; j++) {
                if (!v) continue;
                uint64_t x = (seed ^ ((uint64_t)l << 40) ^ ((uint64_t)j * 0x9e3779b97f4a7c15ull)) | 1;
                /* values ~ uniform [-1.7, 1.7): unit RMS, as RMSNorm output */
                for (size_t k = 0; k < nval + Di; k++) {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    v[k] = dsattn_round_bf16((float)(((double)(x >> 11) * 0x1p-53 * 2.0 - 1.0) * 1.732));
                }
                if (s->fmt == DSATTN_MLA_CACHE_NAIVE) {
                    uint8_t *kr = S->cache + (size_t)j * s->row_bytes, *vr = S->v + (size_t)j * s->v_bytes;
                    for (size_t i = 0; i < s->row_bytes / 2; i++) put_bf16(kr + 2 * i, v[i]);
                    for (size_t i = 0; i < s->v_bytes / 2; i++) put_bf16(vr + 2 * i, v[nval - 1 - i]);
                } else {
                    latent_put(s, (int)l, (size_t)j, v);
                }
                if (S->kidx) dsattn_v32_index_pack(v + nval, Di, S->kidx + (size_t)j * s->idx_bytes, NULL);
            }
            dsattn_free(v);
        }
        if (fail) return DSATTN_ERR_NOMEM;
        S->sel_rows = S->sel_w = 0;
    }
    s->pos = depth;
    return DSATTN_OK;
}
