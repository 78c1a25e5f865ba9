/* v41_forward.c - one sequence over a V4.1 (CSA2) stack: packed caches, the
 * shared attention runtime, and the attention forward of every layer mode.
 *
 * The order of work inside a layer is the reference's Attention.forward
 * (docs/semantics.md §7): query path; window KV (FP8 rows, ring slot
 * pos % w); then, for compressed layers, the compressor (KV sources), the
 * indexer (index sources: index keys from the pre-RoPE latent, scores in
 * bf16, candidate pool, top-k) which publishes top-k rows for Reuse layers,
 * then RoPE + FP4 of the new compressed entries; one sparse_attn over
 * [window rows ; compressed rows]; inverse RoPE; grouped wo_a; wo_b.
 *
 * Caches hold packed bytes only (288 B compressed KV, 68 B index keys, 528 B
 * window rows at real size); attention and the indexer dequantize rows as
 * they read them, which gives exactly the reference's quant-dequant values.
 *
 * Two places where dsattn computes less than the reference with the same
 * result: Reindex layers score only the positions of the candidate pool
 * (the reference scores all and masks the rest to -inf), and every index
 * source scores only the causally visible entries of a row.  Top-k is then
 * completed with the -inf picks the reference would make (the lowest
 * remaining indices), so the selection is identical.
 */
#include "v41.h"

#include "numfmt.h"
#include "seq_glue.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

/* ==== Sequence lifetime ================================================= */

/* A sequence's buffer of at least `bytes` (seq_create: the scratch of a
 * decode step, v41_decode_scratch).  Never NULL on success, even for 0
 * bytes (a stack without compressed layers needs no index scratch). */
static void *grow_buf(void **buf, size_t *size, size_t bytes)
{
    if (bytes > *size || !*buf) {
        size_t want = DSATTN_MAX(bytes, *size + *size / 2);
        dsattn_free(*buf);
        *buf = dsattn_alloc(want);
        *size = *buf ? want : 0;
    }
    return *buf;
}

/* The forward's scratch and the indexer's / compressor's: the sequence's,
 * or the context's for a prefill chunk that needs more (nothing kept in
 * the sequence). */
static void *scratch_get(dsattn_ctx *ctx, dsattn_v41_seq *s, size_t bytes)
{
    return dsattn_call_scratch(ctx, DSATTN_CTX_SCR_CHUNK, s->scratch, s->scratch_size, bytes);
}

static void *iscratch_get(dsattn_ctx *ctx, dsattn_v41_seq *s, size_t bytes)
{
    return dsattn_call_scratch(ctx, DSATTN_CTX_SCR_CHUNK_INDEX, s->iscratch, s->iscratch_size,
                               bytes);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 1;
    void *np = realloc(*p, need * elem);
    if (!np) return 0;
    *p = np;
    *cap = need;
    return 1;
}

static void v41_decode_scratch(const dsattn_v41 *m, size_t cap, size_t *fwd, size_t *idx,
                               size_t *stride);


dsattn_status dsattn_v41_seq_create(dsattn_v41_seq **out, const dsattn_v41 *m,
                                    size_t max_seq_len, dsattn_v41_index_k mode)
{
    if (!out || !m || max_seq_len == 0) return DSATTN_ERR_INVALID_ARG;
    if (mode != DSATTN_V41_INDEX_K_OWNER && mode != DSATTN_V41_INDEX_K_REFERENCE)
        return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    const dsattn_v41_config *c = &m->cfg;
    dsattn_v41_seq *s = calloc(1, sizeof *s);
    if (!s) return DSATTN_ERR_NOMEM;
    s->m = m;
    s->index_k_mode = mode;
    s->max_seq_len = max_seq_len;
    s->rt.compress_kv = s->rt.index_k = -1;
    size_t D = (size_t)c->head_dim, w = (size_t)c->window_size;
    const size_t kw = DSATTN_MIN((size_t)c->index_topk, max_seq_len) + 1;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const dsattn_v41_layer_w *L = &m->layer[l];
        dsattn_v41_layer_s *S = &s->layer[l];
        S->source_read = S->index_read = S->topk_read = -1;
        S->ring = dsattn_alloc_array(w, dsattn_v41_swa_bytes(c));
        if (!S->ring) goto nomem;
        s->window_bytes += w * dsattn_v41_swa_bytes(c);
        if (L->is_kv_source) {
            S->cap = max_seq_len / (size_t)L->ratio;
            S->ckv = dsattn_alloc_array(DSATTN_MAX(S->cap, 1), dsattn_v41_ckv_bytes(c));
            if (!S->ckv) goto nomem;
            s->kv_bytes += DSATTN_MAX(S->cap, 1) * dsattn_v41_ckv_bytes(c);
            if (L->owns_k) {
                S->kidx = dsattn_alloc_array(DSATTN_MAX(S->cap, 1), dsattn_v41_kidx_bytes(c));
                if (!S->kidx) goto nomem;
                s->kv_bytes += DSATTN_MAX(S->cap, 1) * dsattn_v41_kidx_bytes(c);
            }
            if (L->ratio > 1) {
                S->kv_state = dsattn_alloc_array((size_t)L->ratio * D, sizeof(float));
                S->score_state = dsattn_alloc_array((size_t)L->ratio * D, sizeof(float));
                if (!S->kv_state || !S->score_state) goto nomem;
                s->state_bytes += 2 * (size_t)L->ratio * D * sizeof(float);
                dsattn_compressor_state_init(S->kv_state, S->score_state, (size_t)L->ratio, D, 0);
            }
        }
        if (L->is_index_source) {
            /* a decode step's own selection row */
            if (!grow((void **)&S->sel, &S->sel_cap, kw, sizeof(int32_t))) goto nomem;
            S->sel_own = S->sel;
            S->sel_own_cap = S->sel_cap;
        }
    }
    /* the runtime slots and the scratch of one decode step at capacity */
    {
        size_t fwd = 0, idx = 0, stride = 0;
        v41_decode_scratch(m, max_seq_len, &fwd, &idx, &stride);
        if (fwd == SIZE_MAX || idx == SIZE_MAX) {
            dsattn_v41_seq_destroy(s);
            return DSATTN_ERR_OVERFLOW;
        }
        if (!grow((void **)&s->rt.topk, &s->rt.topk_cap, kw, sizeof(int32_t)) ||
            !grow((void **)&s->rt.cand, &s->rt.cand_cap, stride + 1, sizeof(int32_t)) ||
            !grow((void **)&s->rt.cand_n, &s->rt.cand_n_cap, 2, sizeof(size_t)) ||
            !grow_buf(&s->scratch, &s->scratch_size, fwd) ||
            !grow_buf(&s->iscratch, &s->iscratch_size, idx) ||
            dsattn_ws_init(&s->ws, 2 * (size_t)c->dim * sizeof(float) + 64))
            goto nomem;
        s->rt.topk_own = s->rt.topk;
        s->rt.topk_own_cap = s->rt.topk_cap;
        s->rt.cand_own = s->rt.cand;
        s->rt.cand_own_cap = s->rt.cand_cap;
        s->rt.cand_n_own = s->rt.cand_n;
        s->rt.cand_n_own_cap = s->rt.cand_n_cap;
    }
    *out = s;
    return DSATTN_OK;
nomem:
    dsattn_v41_seq_destroy(s);
    return DSATTN_ERR_NOMEM;
}

void dsattn_v41_seq_destroy(dsattn_v41_seq *s)
{
    if (!s) return;
    for (int l = 0; l < DSATTN_MAX_LAYERS; l++) {
        dsattn_v41_layer_s *S = &s->layer[l];
        dsattn_free(S->ring);
        dsattn_free(S->ckv);
        dsattn_free(S->kidx);
        dsattn_free(S->kv_state);
        dsattn_free(S->score_state);
        dsattn_chunk_rows_free(S->sel, S->sel_own);
    }
    dsattn_chunk_rows_free(s->rt.topk, s->rt.topk_own);
    dsattn_chunk_rows_free(s->rt.cand, s->rt.cand_own);
    dsattn_chunk_rows_free(s->rt.cand_n, s->rt.cand_n_own);
    dsattn_free(s->scratch);
    dsattn_free(s->iscratch);
    dsattn_ws_free(&s->ws);
    free(s);
}

DSATTN_SEQ_POS_API(v41)

/* ==== Helpers =========================================================== */

/* ==== Candidate pool (select_candidate_blocks) ========================== */

/* scores[0..T) already masked (-inf beyond the row's visible count cl).
 * Writes the pool positions (ascending) and returns their count. */
size_t dsattn_v41_candidate_pool(const float *scores, size_t T, size_t cl, size_t bs,
                             size_t topk_blocks, float *bscore, int32_t *bidx,
                             int32_t *pool)
{
    size_t nb = (T + bs - 1) / bs;
    for (size_t b = 0; b < nb; b++) {
        float mx = -INFINITY;
        for (size_t j = b * bs; j < DSATTN_MIN(T, (b + 1) * bs); j++)
            mx = scores[j] > mx ? scores[j] : mx;
        bscore[b] = mx;
    }
    if (cl > 0) {
        size_t last = (cl - 1) / bs;                  /* newest visible block */
        if (last < nb) bscore[last] = INFINITY;
    }
    size_t kb = DSATTN_MIN(topk_blocks, nb);
    dsattn_topk(bscore, nb, kb, bidx, NULL);
    /* keep blocks whose score beats -inf, in ascending block order */
    size_t nk = 0;
    for (size_t i = 0; i < kb; i++)
        if (bscore[bidx[i]] > -INFINITY) bidx[nk++] = bidx[i];
    dsattn_sort_idx_valid_first(bidx, nk);
    size_t n = 0;
    for (size_t i = 0; i < nk; i++)
        for (size_t j = (size_t)bidx[i] * bs; j < DSATTN_MIN(T, ((size_t)bidx[i] + 1) * bs); j++)
            pool[n++] = (int32_t)j;
    return n;
}

/* Complete a top-k the way torch.topk over the full masked row would:
 * `fin` holds the finite-score candidates (positions fpos, NULL: 0..nf-1,
 * ascending; scores fscore); if fewer than k, the rest are the lowest
 * positions in [0, T) not among them (all tied at -inf, lower index
 * first).  Result: k positions; returns 1 when they are already ascending.
 * scr: scratch for the selection, nf int32 at least (>= both
 * dsattn_topk_set_scratch and dsattn_topk_par_scratch). */
static int complete_topk(const dsattn_ctx *ctx, const int32_t *fpos, const float *fscore,
                         size_t nf, size_t T, size_t k, int32_t *out, int32_t *tmp, void *scr)
{
    if (nf >= k) {
        /* a large share (a few thousand entries): quickselect, in index
         * order; a small share of many: the parallel heap */
        const int set = 16 * k > nf;
        if (set) dsattn_topk_set(fscore, nf, k, tmp, scr);
        else dsattn_topk_par(fscore, nf, k, dsattn_ctx_threads(ctx), tmp, scr);
        for (size_t i = 0; i < k; i++) out[i] = fpos ? fpos[tmp[i]] : tmp[i];
        return set;
    }
    for (size_t i = 0; i < nf; i++) out[i] = fpos ? fpos[i] : (int32_t)i;
    /* fpos is ascending: walk [0,T) skipping members */
    size_t n = nf, fi = 0;
    for (size_t j = 0; j < T && n < k; j++) {
        while (fi < nf && (size_t)(fpos ? fpos[fi] : (int32_t)fi) < j) fi++;
        if (fi < nf && (size_t)(fpos ? fpos[fi] : (int32_t)fi) == j) continue;
        out[n++] = (int32_t)j;
    }
    return 0;
}

/* ==== The layer forward ================================================= */

typedef dsattn_v41_chunk chunk;

/* The indexer's scratch for s rows over T compressed entries: queries,
 * weights and act-quant scales (nq), scores and positions (4 per entry: the
 * ~16 B per entry a sequence holds for its deepest index source), block
 * scores and picks.  *nb_max: the candidate pool's block count + 1. */
static size_t indexer_scratch_bytes(const dsattn_v41_config *c, const dsattn_v41_layer_w *L,
                                    size_t s, size_t T, size_t *nb_max)
{
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t QL = (size_t)c->q_lora_rank, kw = DSATTN_MIN((size_t)c->index_topk, T);
    const size_t bs = (size_t)c->candidate_block_size;
    *nb_max = L->is_candidate_source ? (T + bs - 1) / bs + 1 : 1;
    const size_t nq = s * (Hi * Di + Hi + QL) + 16;
    return (nq + 4 * (T + 16) + 2 * (*nb_max + 16) + kw + 16) * sizeof(float);
}

/* Index-source work for one layer: publish index keys (owners), score the
 * visible or pooled entries of each row, build the candidate pool (the
 * candidate source), pick top-k.  Writes the final rows (offset applied)
 * into the runtime's topk slot and the layer's own selection into S->sel.
 * The keys come from the whole chunk ck; the queries from its rows
 * [q_first, ck->s) only (x and qr hold just those rows), so a suffix of the
 * chunk can be scored (docs/v41.md, "CED prefill"). */
static dsattn_status run_indexer(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l,
                                 const float *x, const float *qr, const chunk *ck,
                                 size_t q_first, const float *latent, size_t n_new,
                                 size_t offset, const dsattn_v41_index_pre *pre)
{
    const dsattn_v41 *m = seq->m;
    const dsattn_v41_config *c = &m->cfg;
    const dsattn_v41_layer_w *L = &m->layer[l];
    dsattn_v41_layer_s *S = &seq->layer[l];
    const size_t s = ck->s - q_first, ratio = (size_t)L->ratio;
    const size_t q_pos0 = (size_t)ck->start_pos + q_first;   /* first query row */
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t rd = (size_t)c->rope_head_dim, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank;
    const size_t T = ((size_t)ck->start_pos + ck->s) / ratio;
    const size_t first = (size_t)ck->start_pos / ratio;
    const size_t kbytes = dsattn_v41_kidx_bytes(c);
    const size_t kw = DSATTN_MIN((size_t)c->index_topk, T);
    dsattn_status st = DSATTN_OK;
    float cs[64], sn[64];

    /* 1. owners: index keys from the PRE-RoPE latent -> RoPE -> FP4 */
    if (L->owns_k && n_new > 0) {
        /* the sequence's indexer scratch; done with before it grows below */
        float *kk = pre ? pre->kk
                        : iscratch_get(ctx, seq, n_new * Di * sizeof(float));
        if (!kk) return DSATTN_ERR_NOMEM;
        if (!pre)
            st = dsattn_linear(ctx, &L->i_wk, latent, D, n_new, kk, Di, DSATTN_OUT_BF16, NULL,
                               NULL);
        for (size_t i = 0; i < n_new && !st; i++) {
            float *k = kk + i * Di;
            dsattn_rmsnorm(k, L->i_knorm, Di, c->norm_eps, k, DSATTN_OUT_BF16);
            dsattn_rope_cs(&L->rope, (int64_t)((first + i) * ratio), cs, sn);
            dsattn_rope_apply(k + Di - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
            dsattn_fp4_index_pack(k, Di, S->kidx + (first + i) * kbytes, NULL);
        }
        if (st) return st;
        seq->rt.index_k = l;
    }
    /* OWNER mode: an owner always scores (and publishes) its own keys.
     * REFERENCE mode: publish only when a group completed (above) and read
     * whatever the slot holds - layer 20's keys on half the decode steps. */
    if (L->owns_k && seq->index_k_mode == DSATTN_V41_INDEX_K_OWNER) seq->rt.index_k = l;
    const int kl = seq->rt.index_k;
    if (kl < 0 || !seq->layer[kl].kidx) return DSATTN_ERR_INVALID_ARG;
    S->index_read = kl;
    /* The keys kl holds: one per group of its ratio of the tokens it has
     * taken - this chunk's too when it ran before this layer.  Its own keys,
     * or a finer or equal owner's, number at least T.  A stale slot of a
     * coarser owner (REFERENCE mode, plans with ratios 2 and 4, say) holds
     * fewer: the official code reads the rest of that owner's buffer, rows
     * no token wrote, which are zeros in a fresh process, and each scores 0
     * (docs/semantics.md §7.7).  Entries from `have` on score 0 here, read
     * from nowhere. */
    const size_t have = DSATTN_MIN(T, (kl <= l ? (size_t)ck->start_pos + ck->s
                                               : (size_t)ck->start_pos) /
                                          (size_t)m->layer[kl].ratio);
    const dsattn_kv_src ksrc = { DSATTN_KV_FP4_IDX, seq->layer[kl].kidx, kbytes, have, Di, 0 };

    /* 2. queries (RoPE, FP4; no Hadamard in V4.1) and head weights */
    size_t nb_max;
    float *qi = iscratch_get(ctx, seq, indexer_scratch_bytes(c, L, s, T, &nb_max));
    if (!qi) return DSATTN_ERR_NOMEM;
    const size_t nq = s * (Hi * Di + Hi + QL) + 16;
    float *fsc = qi + nq, *score = fsc + T + 16, *bscore = score + T + 16;
    int32_t *fpos = (int32_t *)(bscore + nb_max + 16);
    int32_t *tmp = fpos + T + 16, *pick = tmp + T + nb_max + 16;
    float *wts = qi + s * Hi * Di, *aqs = wts + s * Hi;
    if (pre) {
        /* a batched step projected the queries and weights of every row */
        qi = pre->qi;
        wts = pre->wts;
    } else {
        const dsattn_attn_rows rows = { s, NULL, (int64_t)q_pos0, aqs };
        if ((st = dsattn_index_query(ctx, &L->attn, &rows, qr, qi)))
            goto done;
        if ((st = dsattn_index_weights(ctx, &L->i_wproj, x, s, Hi, Di, wts))) goto done;
    }

    /* 3. slots for this chunk's rows */
    if (!dsattn_chunk_rows((void **)&seq->rt.topk, &seq->rt.topk_cap, seq->rt.topk_own,
                           seq->rt.topk_own_cap, s * kw + 1, sizeof(int32_t)) ||
        !dsattn_chunk_rows((void **)&S->sel, &S->sel_cap, S->sel_own, S->sel_own_cap,
                           s * kw + 1, sizeof(int32_t))) {
        st = DSATTN_ERR_NOMEM;
        goto done;
    }
    if (L->is_candidate_source) {
        size_t stride = DSATTN_MIN((size_t)c->candidate_topk_blocks, nb_max) *
                        (size_t)c->candidate_block_size;
        if (!dsattn_chunk_rows((void **)&seq->rt.cand, &seq->rt.cand_cap, seq->rt.cand_own,
                               seq->rt.cand_own_cap, s * stride + 1, sizeof(int32_t))) {
            st = DSATTN_ERR_NOMEM;
            goto done;
        }
        if (!dsattn_chunk_rows((void **)&seq->rt.cand_n, &seq->rt.cand_n_cap, seq->rt.cand_n_own,
                               seq->rt.cand_n_own_cap, s + 1, sizeof(size_t))) {
            st = DSATTN_ERR_NOMEM;
            goto done;
        }
        seq->rt.cand_rows = s;
        seq->rt.cand_p0 = (int64_t)q_pos0;
        seq->rt.cand_stride = stride;
        seq->rt.cand_valid = 1;
    }
    /* the pool rows of this chunk's query positions (cand_p0: the source's first) */
    const size_t cand_at = (size_t)((int64_t)q_pos0 - seq->rt.cand_p0);
    if (L->uses_candidates && (!seq->rt.cand_valid || (int64_t)q_pos0 < seq->rt.cand_p0 ||
                               cand_at + s > seq->rt.cand_rows)) {
        st = DSATTN_ERR_INVALID_ARG;
        goto done;
    }

    /* 4. rows */
    for (size_t t = 0; t < s; t++) {
        const size_t cl = ck->prefill ? (q_pos0 + t + 1) / ratio : T;  /* visible entries */
        const float *q = qi + t * Hi * Di, *w = wts + t * Hi;
        size_t nf = 0;
        const int32_t *pos = fpos;                     /* NULL: 0..nf-1 */
        if (L->uses_candidates) {
            /* Reindex: only the pool, O(pool) whatever the context length */
            const int32_t *pool = seq->rt.cand + (cand_at + t) * seq->rt.cand_stride;
            size_t nk = 0;                             /* the pool is ascending */
            for (size_t i = 0; i < seq->rt.cand_n[cand_at + t]; i++)
                if ((size_t)pool[i] < cl) {
                    fpos[nf++] = pool[i];
                    nk += (size_t)pool[i] < have;
                }
            dsattn_index_scores_bf16_at(ctx, q, Hi, Di, w, &ksrc, fpos, nk, fsc);
            for (size_t j = nk; j < nf; j++) fsc[j] = 0.0f;
        } else {
            pos = NULL;
            nf = cl;
            const size_t nk = DSATTN_MIN(nf, have);
            dsattn_index_scores_bf16(ctx, q, Hi, Di, w, &ksrc, 0, nk, fsc);
            for (size_t j = nk; j < nf; j++) fsc[j] = 0.0f;
        }
        if (L->is_candidate_source) {
            for (size_t j = 0; j < T; j++) score[j] = j < cl ? fsc[j] : -INFINITY;
            seq->rt.cand_n[t] = dsattn_v41_candidate_pool(score, T, cl, (size_t)c->candidate_block_size,
                                               (size_t)c->candidate_topk_blocks, bscore, tmp,
                                               seq->rt.cand + t * seq->rt.cand_stride);
        }
        /* score is free again (the pool is built): the top-k's scratch */
        if (!complete_topk(ctx, pos, fsc, nf, T, kw, pick, tmp, score))
            dsattn_sort_idx_valid_first(pick, kw);
        int32_t *row = seq->rt.topk + t * kw, *own_row = S->sel + t * kw;
        for (size_t i = 0; i < kw; i++) {
            int valid = pick[i] >= 0 && (size_t)pick[i] < cl;
            own_row[i] = valid ? pick[i] : -1;
            row[i] = valid ? pick[i] + (int32_t)offset : -1;
        }
    }
    seq->rt.topk_rows = s;
    seq->rt.topk_w = kw;
    seq->rt.topk_p0 = (int64_t)q_pos0;
    seq->rt.topk_off = offset;
    seq->rt.topk_valid = 1;
    seq->rt.topk_layer = l;
    S->sel_rows = s;
    S->sel_w = kw;
done:
    return st;
}

static size_t compressor_scratch_bytes(size_t s, size_t ratio, size_t D)
{
    return (2 * s * D + dsattn_compressor_scratch(ratio, D)) * sizeof(float);
}

/* The compressor of a KV source: returns the new latents (pre-RoPE, bf16
 * values) in lat [n_new, D].  Ratio 1: compressor.norm(compressor.wkv(x)).
 * Ratio m >= 2: fp32 projections, per-channel softmax over each complete
 * group of m tokens, bf16 cast, then RMSNorm; partial groups wait in the
 * fp32 state (prefill remainder, decode slot start_pos % m). */
static dsattn_status run_compressor(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l,
                                    const float *x, const chunk *ck, float *lat,
                                    size_t *n_new)
{
    const dsattn_v41_config *c = &seq->m->cfg;
    const dsattn_v41_layer_w *L = &seq->m->layer[l];
    const size_t s = ck->s, m = (size_t)L->ratio, D = (size_t)c->head_dim;
    const size_t dim = (size_t)c->dim;
    dsattn_status st;
    *n_new = 0;
    if (m == 1) {
        if ((st = dsattn_linear(ctx, &L->c_wkv, x, dim, s, lat, D, DSATTN_OUT_BF16, NULL, NULL)))
            return st;
        for (size_t t = 0; t < s; t++)
            dsattn_rmsnorm(lat + t * D, L->c_norm, D, c->norm_eps, lat + t * D, DSATTN_OUT_BF16);
        *n_new = s;
        return DSATTN_OK;
    }
    /* projections in the sequence's indexer scratch (free until the indexer
     * of this layer runs): no allocation per decode step */
    float *kv = iscratch_get(ctx, seq, compressor_scratch_bytes(s, m, D));
    if (!kv) return DSATTN_ERR_NOMEM;
    float *z = kv + s * D, *ws = z + s * D;
    st = dsattn_linear(ctx, &L->c_wkv, x, dim, s, kv, D, DSATTN_OUT_F32, NULL, NULL);
    if (!st) st = dsattn_linear(ctx, &L->c_wgate, x, dim, s, z, D, DSATTN_OUT_F32, NULL, NULL);
    if (st) return st;
    *n_new = dsattn_v41_compress_pool(seq, l, kv, z, ck, lat, ws);
    return DSATTN_OK;
}

size_t dsattn_v41_compress_pool(dsattn_v41_seq *seq, int l, const float *kv, const float *z,
                                const dsattn_v41_chunk *ck, float *lat, float *ws)
{
    const dsattn_v41_config *c = &seq->m->cfg;
    const dsattn_v41_layer_w *L = &seq->m->layer[l];
    dsattn_v41_layer_s *S = &seq->layer[l];
    const size_t m = (size_t)L->ratio, D = (size_t)c->head_dim;
    /* V4.1: no APE, no overlap - the same state machine as V4's compressor */
    size_t n = dsattn_compressor_pool(kv, z, ck->s, D, m, 0, NULL, S->kv_state, S->score_state,
                                      ck->start_pos, ck->prefill, lat, ws);
    for (size_t i = 0; i < n; i++) {
        dsattn_round_bf16_n(lat + i * D, D);                   /* kv.to(bf16) */
        dsattn_rmsnorm(lat + i * D, L->c_norm, D, c->norm_eps, lat + i * D, DSATTN_OUT_BF16);
    }
    return n;
}

size_t dsattn_v41_compress_pool_scratch(const dsattn_v41 *m, int l)
{
    const size_t D = (size_t)m->cfg.head_dim;
    return dsattn_compressor_scratch((size_t)m->layer[l].ratio, D) * sizeof(float);
}

dsattn_status dsattn_v41_index_rows(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l,
                                    const dsattn_v41_chunk *ck, size_t n_new, size_t offset,
                                    const dsattn_v41_index_pre *pre)
{
    return run_indexer(ctx, seq, l, NULL, NULL, ck, 0, NULL, n_new, offset, pre);
}

/* The layer forward's scratch for s rows, nthr threads, ww window index
 * columns: qr, q, kv, o, oa, latent, act-quant, per thread its attention
 * workspace and index row, then the window rows. */
typedef struct {
    size_t hg, hper, att_ws, per_thr, bytes;
} fwd_plan;

/* The widest input an activation-quantized Linear of the layer forward
 * takes (wq_a / wkv: dim, wq_b: q_lora, wo_b: o_groups x o_lora; wo_a is
 * an einsum without one): the act-quant scratch's row. */
size_t dsattn_v41_actq_cols(const dsattn_v41_config *c)
{
    const size_t gr = (size_t)c->o_groups * (size_t)c->o_lora_rank;
    return DSATTN_MAX(DSATTN_MAX((size_t)c->dim, (size_t)c->q_lora_rank), gr);
}

/* The act-quant scratch of a forward of s rows of which qb at a time have
 * heads: the chunk's inputs (query, window KV) and a block's widest
 * quantized input (dsattn_v41_actq_cols). */
static size_t fwd_aq(const dsattn_v41_config *c, size_t s, size_t qb)
{
    return DSATTN_MAX(dsattn_attn_aq_scratch(s, (size_t)c->dim),
                      dsattn_attn_aq_scratch(qb, dsattn_v41_actq_cols(c)));
}

/* The forward's scratch for s rows of which qb at a time have heads. */
static fwd_plan plan_fwd(const dsattn_v41_config *c, size_t s, size_t qb, int nthr, size_t ww)
{
    const size_t H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank, aq = fwd_aq(c, s, qb);
    fwd_plan p;
    /* decode: one head group per thread - every task gathers and decodes
     * all of the row's attended entries, so more groups cost more decoding */
    p.hg = s == 1 ? DSATTN_MIN(H, (size_t)nthr) : 1;
    p.hper = (H + p.hg - 1) / p.hg;
    p.att_ws = dsattn_sparse_attn_scratch(p.hper, D);
    p.per_thr = p.att_ws + ww + (size_t)c->index_topk + 16;
    const size_t nfl = s * QL + qb * H * D + s * D + qb * H * D + qb * G * R + s * D + aq +
                       (size_t)nthr * p.per_thr;
    p.bytes = nfl * sizeof(float) + s * dsattn_v41_swa_bytes(c) + 256;
    return p;
}

/* What one decode step at any position below cap needs, with up to
 * dsattn_ws_threads() threads: the forward's scratch (*fwd), the
 * compressor / indexer scratch (*idx) and the candidate pool's row
 * stride (*stride).  SIZE_MAX on a capacity too large to size. */
static void v41_decode_scratch(const dsattn_v41 *m, size_t cap, size_t *fwd, size_t *idx,
                               size_t *stride)
{
    const dsattn_v41_config *c = &m->cfg;
    *fwd = *idx = *stride = 0;
    if (cap > SIZE_MAX / 64) {
        *fwd = *idx = SIZE_MAX;
        return;
    }
    const int T = dsattn_ws_threads();
    for (int n = 1; n <= T; n++)
        *fwd = DSATTN_MAX(*fwd, plan_fwd(c, 1, 1, n, (size_t)c->window_size).bytes);
    const size_t D = (size_t)c->head_dim, Di = (size_t)c->index_head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        const dsattn_v41_layer_w *L = &m->layer[l];
        if (L->ratio <= 0) continue;
        const size_t ratio = (size_t)L->ratio, Tc = cap / ratio;
        if (L->is_kv_source && ratio > 1)
            *idx = DSATTN_MAX(*idx, compressor_scratch_bytes(1, ratio, D));
        if (L->owns_k) *idx = DSATTN_MAX(*idx, Di * sizeof(float));
        if (L->is_index_source) {
            size_t nb_max;
            *idx = DSATTN_MAX(*idx, indexer_scratch_bytes(c, L, 1, Tc, &nb_max));
            if (L->is_candidate_source)
                *stride = DSATTN_MAX(*stride, DSATTN_MIN((size_t)c->candidate_topk_blocks, nb_max) *
                                                  (size_t)c->candidate_block_size);
        }
    }
}

/* ==== Steps the layer forward and the CED row forward share ============= */

/* The new window rows of a chunk of one sequence, n from position p0:
 * FP8 rows in wrow, the last w of them also in the ring (slot pos % w). */
typedef struct {
    uint8_t *ring, *wrow;
    size_t   n, p0, w, D, swab;
} window_rows;

static void pack_window(const void *arg, const float *kvw)
{
    const window_rows *r = arg;
    for (size_t t = 0; t < r->n; t++)
        dsattn_v41_swa_pack(kvw + t * r->D, r->D, r->wrow + t * r->swab, NULL);
    for (size_t t = r->n > r->w ? r->n - r->w : 0; t < r->n; t++)
        memcpy(r->ring + ((r->p0 + t) % r->w) * r->swab, r->wrow + t * r->swab, r->swab);
}

/* A KV source's compressor over the chunk (phase COMPRESS): its completed
 * groups' latents in lat, and the compress_kv slot names the layer. */
static dsattn_status compress_source(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l, const float *x,
                                     const chunk *ck, float *lat, size_t *n_new)
{
    dsattn_phase_mark pm;
    dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
    dsattn_status st = run_compressor(ctx, seq, l, x, ck, lat, n_new);
    dsattn_phase_end(ctx, &pm);
    if (!st) seq->rt.compress_kv = l;
    return st;
}

/* An index source with no compressed entry visible yet: the shared top-k
 * slot holds `rows` empty rows from position p0, and so does its own
 * selection. */
static void topk_empty(dsattn_v41_seq *seq, int l, size_t rows, int64_t p0)
{
    seq->rt.topk_rows = rows;
    seq->rt.topk_p0 = p0;
    seq->rt.topk_w = 0;
    seq->rt.topk_valid = 1;
    seq->rt.topk_layer = l;
    seq->layer[l].sel_rows = rows;
    seq->layer[l].sel_w = 0;
}

/* A KV source's n_new new latents (entries first.. of its cache): RoPE at
 * the entry's position (entry * ratio), then packed FP4 into the cache. */
static void publish_latents(dsattn_v41_seq *seq, int l, float *lat, size_t n_new, size_t first)
{
    const dsattn_v41_config *c = &seq->m->cfg;
    const dsattn_v41_layer_w *L = &seq->m->layer[l];
    const size_t D = (size_t)c->head_dim, rd = (size_t)c->rope_head_dim;
    const size_t ratio = (size_t)L->ratio, ckvb = dsattn_v41_ckv_bytes(c);
    float cs[64], sn[64];
    for (size_t i = 0; i < n_new; i++) {
        float *v = lat + i * D;
        dsattn_rope_cs(&L->rope, (int64_t)((first + i) * ratio), cs, sn);
        dsattn_rope_apply(v + D - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
        dsattn_v41_kv_pack(v, D, seq->layer[l].ckv + (first + i) * ckvb, NULL);
    }
}

/* A compressed layer reads the current compress_kv slot (its n_rows
 * entries) and the top-k rows of the last index source; recorded for the
 * accessors. */
static dsattn_status read_sources(dsattn_v41_seq *seq, int l, size_t n_rows, dsattn_kv_src *csrc)
{
    const int src = seq->rt.compress_kv;
    if (src < 0) return DSATTN_ERR_INVALID_ARG;
    seq->layer[l].source_read = src;
    seq->layer[l].topk_read = seq->rt.topk_layer;
    csrc->base = seq->layer[src].ckv;
    csrc->n_rows = n_rows;
    return DSATTN_OK;
}

dsattn_status dsattn_v41_attn_forward(dsattn_ctx *ctx, dsattn_v41_seq *seq,
                                      int l, const float *x, size_t n_tok, float *out)
{
    if (!ctx || !seq || !x || !out || n_tok == 0) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41 *m = seq->m;
    const dsattn_v41_config *c = &m->cfg;
    if (l < 0 || l >= c->n_layers) return DSATTN_ERR_INVALID_ARG;
    if (seq->pos > 0 && n_tok != 1) return DSATTN_ERR_UNSUPPORTED;   /* no chunked prefill */
    if ((size_t)seq->pos + n_tok > seq->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41_layer_w *L = &m->layer[l];
    dsattn_v41_layer_s *S = &seq->layer[l];
    if (!L->wq_a.data) return DSATTN_ERR_UNSUPPORTED;      /* config-only model */
    const chunk ck = { n_tok, seq->pos, seq->pos == 0 };
    const size_t H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank;
    const size_t G = (size_t)c->o_groups, R = (size_t)c->o_lora_rank, w = (size_t)c->window_size;
    const size_t swab = dsattn_v41_swa_bytes(c), ckvb = dsattn_v41_ckv_bytes(c);
    const size_t wrows = ck.prefill ? n_tok : w;               /* window rows attended */
    const size_t ww = ck.prefill ? DSATTN_MIN(n_tok, w) : w;   /* window idx width     */
    dsattn_status st;

    const int nthr = DSATTN_MAX(ctx->n_threads, 1);
    /* rows with heads at once: the whole chunk, or a prompt's block */
    const size_t qb = DSATTN_MIN(n_tok, DSATTN_MAX(dsattn_csa_prompt_block, (size_t)1));
    const fwd_plan fp = plan_fwd(c, n_tok, qb, nthr, ww);
    const size_t hg = fp.hg, hper = fp.hper, att_ws = fp.att_ws, per_thr = fp.per_thr;
    float *qr = scratch_get(ctx, seq, fp.bytes);
    if (!qr) return DSATTN_ERR_NOMEM;
    float *q = qr + n_tok * QL, *kvw = q + qb * H * D, *o = kvw + n_tok * D;
    float *oa = o + qb * H * D;
    float *lat = oa + qb * G * R, *aqs = lat + n_tok * D;
    float *thr_ws = aqs + fwd_aq(c, n_tok, qb);
    uint8_t *wrow = (uint8_t *)(thr_ws + (size_t)nthr * per_thr);

    /* ---- query: q_norm(wq_a x) for every row (the indexer reads it; the
     * heads wq_b -> RoPE a block at a time, below); window KV: kv_norm(wkv
     * x) -> RoPE -> FP8 rows; ring slot pos % w */
    dsattn_phase_mark pm;
    const dsattn_attn_rows rows = { n_tok, NULL, ck.start_pos, aqs };
    const window_rows wr = { S->ring, wrow, n_tok, (size_t)ck.start_pos, w, D, swab };
    const dsattn_csa_qkv qkv = { x, qr, NULL, NULL, NULL, kvw, pack_window, &wr };
    if ((st = dsattn_csa_query_kv(ctx, &L->attn, &rows, &qkv))) return st;
    dsattn_kv_src wsrc = { DSATTN_KV_V41_SWA, ck.prefill ? wrow : S->ring, swab, wrows, D, 0 };

    /* ---- compressed branch */
    dsattn_kv_src csrc = { DSATTN_KV_V41_FP4, NULL, ckvb, 0, D, 0 };
    const int32_t *cidx = NULL;
    size_t cw = 0;
    if (L->ratio > 0) {
        const size_t ratio = (size_t)L->ratio;
        const size_t compress_len = ((size_t)ck.start_pos + n_tok) / ratio;
        size_t n_new = 0;
        if (L->is_kv_source && (st = compress_source(ctx, seq, l, x, &ck, lat, &n_new)))
            return st;
        if (!L->is_index_source) {
            if (!seq->rt.topk_valid || seq->rt.topk_rows != n_tok) return DSATTN_ERR_INVALID_ARG;
        } else if (compress_len == 0) {
            topk_empty(seq, l, n_tok, ck.start_pos);
        } else {
            dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
            st = run_indexer(ctx, seq, l, x, qr, &ck, 0, lat, n_new, wrows, NULL);
            dsattn_phase_end(ctx, &pm);
            if (st) return st;
        }
        if (n_new) {
            dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
            publish_latents(seq, l, lat, n_new, (size_t)ck.start_pos / ratio);
            dsattn_phase_end(ctx, &pm);
        }
        if ((st = read_sources(seq, l, compress_len, &csrc))) return st;
        cidx = seq->rt.topk;
        cw = seq->rt.topk_w;
    }

    /* ---- per block of rows: the query heads (wq_b, RoPE), one sparse
     * attention over [window rows ; compressed rows], then inverse RoPE at
     * the query position, grouped wo_a, wo_b */
    const dsattn_csa_chunk_rows cr = { &ck, w, 0, cidx, { wsrc, csrc, ww, cw, -1e30f, 0 } };
    const dsattn_csa_attend job = { NULL, o, oa, out, L->sink, hg, hper, att_ws, per_thr, thr_ws,
                                    dsattn_csa_chunk_row, &cr };
    return dsattn_csa_prompt_attend(ctx, &L->attn, &rows, qr, q, qb, &job);
}

size_t dsattn_v41_seq_scratch_at(const dsattn_v41 *m, size_t cap)
{
    if (!m) return 0;
    const dsattn_v41_config *c = &m->cfg;
    size_t fwd, idx, stride, b;
    v41_decode_scratch(m, cap, &fwd, &idx, &stride);
    if (fwd == SIZE_MAX || idx == SIZE_MAX) return SIZE_MAX;
    const size_t kw = DSATTN_MIN((size_t)c->index_topk, cap) + 1;
    size_t nsel = 0;
    for (int l = 0; l < c->n_layers; l++) nsel += m->layer[l].is_index_source != 0;
    b = fwd + idx + 2 * (size_t)c->dim * sizeof(float) + 64;           /* + the stack's rows */
    b += (kw * (1 + nsel) + stride + 1) * sizeof(int32_t) + 2 * sizeof(size_t);
    return b;
}

/* ==== The golden-case stack and accessors =============================== */

DSATTN_STANDIN_STACK_API(v41, norm_eps, DSATTN_SEQ_WHOLE_ALWAYS)

dsattn_status dsattn_v41_seq_selection(const dsattn_v41_seq *s, int layer,
                                       const int32_t **rows, size_t *n_rows,
                                       size_t *width)
{
    if (!s || !rows || !n_rows || !width || layer < 0 || layer >= s->m->cfg.n_layers)
        return DSATTN_ERR_INVALID_ARG;
    if (!s->m->layer[layer].is_index_source) return DSATTN_ERR_NOT_FOUND;
    *rows = s->layer[layer].sel;
    *n_rows = s->layer[layer].sel_rows;
    *width = s->layer[layer].sel_w;
    return DSATTN_OK;
}

static int layer_ok(const dsattn_v41_seq *s, int layer)
{
    return s && layer >= 0 && layer < s->m->cfg.n_layers;
}

int dsattn_v41_seq_source_read(const dsattn_v41_seq *s, int layer)
{
    return layer_ok(s, layer) ? s->layer[layer].source_read : -1;
}

int dsattn_v41_seq_index_read(const dsattn_v41_seq *s, int layer)
{
    return layer_ok(s, layer) ? s->layer[layer].index_read : -1;
}

int dsattn_v41_seq_topk_read(const dsattn_v41_seq *s, int layer)
{
    return layer_ok(s, layer) ? s->layer[layer].topk_read : -1;
}

dsattn_status dsattn_v41_seq_cache(const dsattn_v41_seq *s, int layer, int which,
                                   const uint8_t **rows, size_t *n_rows,
                                   size_t *row_bytes)
{
    if (!s || !rows || !n_rows || !row_bytes || layer < 0 || layer >= s->m->cfg.n_layers ||
        which < 0 || which > 2)
        return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41_config *c = &s->m->cfg;
    const dsattn_v41_layer_w *L = &s->m->layer[layer];
    const dsattn_v41_layer_s *S = &s->layer[layer];
    size_t written = L->ratio > 0 ? (size_t)s->pos / (size_t)L->ratio : 0;
    switch (which) {
    case 0:
        *rows = S->ring; *n_rows = (size_t)c->window_size; *row_bytes = dsattn_v41_swa_bytes(c);
        return DSATTN_OK;
    case 1:
        if (!S->ckv) return DSATTN_ERR_NOT_FOUND;
        *rows = S->ckv; *n_rows = written; *row_bytes = dsattn_v41_ckv_bytes(c);
        return DSATTN_OK;
    case 2:
        if (!S->kidx) return DSATTN_ERR_NOT_FOUND;
        *rows = S->kidx; *n_rows = written; *row_bytes = dsattn_v41_kidx_bytes(c);
        return DSATTN_OK;
    }
    return DSATTN_ERR_INVALID_ARG;
}

dsattn_status dsattn_v41_seq_kv_bill(const dsattn_v41_seq *s, dsattn_kv_bill *b)
{
    if (!s || !b) return DSATTN_ERR_INVALID_ARG;
    /* the byte counts seq_create recorded as it allocated, and the scratch
     * and runtime buffers as they are now */
    size_t sc = s->scratch_size + s->iscratch_size + s->ws.cap;
    sc += dsattn_chunk_rows_bytes(s->rt.topk, s->rt.topk_cap, s->rt.topk_own,
                                  s->rt.topk_own_cap, sizeof(int32_t));
    sc += dsattn_chunk_rows_bytes(s->rt.cand, s->rt.cand_cap, s->rt.cand_own,
                                  s->rt.cand_own_cap, sizeof(int32_t));
    sc += dsattn_chunk_rows_bytes(s->rt.cand_n, s->rt.cand_n_cap, s->rt.cand_n_own,
                                  s->rt.cand_n_own_cap, sizeof(size_t));
    for (int64_t l = 0; l < s->m->cfg.n_layers; l++) {
        const dsattn_v41_layer_s *S = &s->layer[l];
        sc += dsattn_chunk_rows_bytes(S->sel, S->sel_cap, S->sel_own, S->sel_own_cap,
                                      sizeof(int32_t));
    }
    *b = (dsattn_kv_bill){ .global_bytes_allocated = s->kv_bytes, .window_bytes = s->window_bytes,
                           .state_bytes = s->state_bytes, .scratch_bytes = sc };
    return dsattn_kv_bill_per_token(b, s->max_seq_len);
}

/* Random but valid packed bytes: payload codes uniform, scales in a sane
 * range (E4M3 scale codes 0x28..0x37, i.e. 0.25..0.9375; UE8M0 2^-4..2^3),
 * no NaN code anywhere.  Writing bytes directly keeps a 1M-token fill to a
 * fraction of a second. */
static void synth_rows(uint8_t *rows, size_t n, size_t row_bytes, size_t payload,
                       int kind, uint64_t seed)
{
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < n; r++) {
        uint64_t x = (seed ^ ((r + 1) * 0x9e3779b97f4a7c15ull)) | 1;
        uint8_t *p = rows + r * row_bytes;
        for (size_t i = 0; i < row_bytes; i += 8) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            uint64_t v = x;
            for (size_t k = 0; k < 8 && i + k < row_bytes; k++, v >>= 8) {
                uint8_t b = (uint8_t)v;
                size_t at = i + k;
                if (at < payload) {
                    if (kind == 0 && (b & 0x7f) == 0x7f) b ^= 1;   /* E4M3 payload: no NaN */
                    p[at] = b;
                } else if (kind == 1) {
                    p[at] = (uint8_t)(0x28 + (b & 15));            /* E4M3 scale  */
                } else {
                    p[at] = (uint8_t)(123 + (b & 7));              /* UE8M0 scale */
                }
            }
        }
    }
}

dsattn_status dsattn_v41_seq_fill_synthetic(dsattn_v41_seq *s, int64_t depth,
                                            uint64_t seed)
{
    if (!s || depth < 0 || (size_t)depth >= s->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41_config *c = &s->m->cfg;
    const size_t D = (size_t)c->head_dim, Di = (size_t)c->index_head_dim;
    const size_t w = (size_t)c->window_size;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const dsattn_v41_layer_w *L = &s->m->layer[l];
        dsattn_v41_layer_s *S = &s->layer[l];
        uint64_t sd = seed * 131 + (uint64_t)l;
        /* kind 0: FP8 payload + UE8M0; 1: FP4 + E4M3 scales; 2: FP4 + UE8M0 */
        synth_rows(S->ring, w, dsattn_v41_swa_bytes(c), D, 0, sd);
        if (S->ckv) {
            size_t n = (size_t)depth / (size_t)L->ratio;
            synth_rows(S->ckv, n, dsattn_v41_ckv_bytes(c), D / 2, 1, sd + 7);
            if (S->kidx) synth_rows(S->kidx, n, dsattn_v41_kidx_bytes(c), Di / 2, 2, sd + 13);
        }
        if (S->kv_state)   /* a pending ratio-2 group slot holds finite values */
            for (size_t i = 0; i < (size_t)L->ratio * D; i++) {
                S->kv_state[i] = 0.0f;
                S->score_state[i] = 0.0f;
            }
    }
    /* the index-key slot as a prefill of depth tokens in one chunk leaves
     * it: the last KV source (layer order) that completed a group, which in
     * OWNER mode every source does - a REFERENCE-mode owner whose group is
     * not complete reads it at the next step */
    s->rt.index_k = -1;
    for (int64_t l = 0; l < c->n_layers; l++)
        if (s->m->layer[l].owns_k && s->layer[l].kidx &&
            (s->index_k_mode == DSATTN_V41_INDEX_K_OWNER ||
             (size_t)depth >= (size_t)s->m->layer[l].ratio))
            s->rt.index_k = (int)l;
    s->pos = depth;
    return DSATTN_OK;
}

/* ==== A suffix of a prefill chunk (CED prefill) ========================= */

/* The index rows of dsattn_v41_attn_forward_rows (below). */
typedef struct {
    dsattn_csa_row_src src;
    size_t             w, P, qpos, kpos;   /* window, chunk end, first query / KV row */
    const int32_t     *cidx;               /* [nout, cw] top-k rows                  */
    size_t             coff, nkv;          /* their writer's offset, this call's     */
} ced_rows;

static void ced_row(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src)
{
    const ced_rows *r = arg;
    const size_t ww = r->src.ww, cw = r->src.cw;
    dsattn_window_idx_prefill(r->w, r->P, r->qpos + t, idx);
    for (size_t i = 0; i < ww; i++)
        idx[i] = idx[i] >= 0 && (size_t)idx[i] >= r->kpos ? (int32_t)((size_t)idx[i] - r->kpos)
                                                           : -1;
    for (size_t i = 0; i < cw; i++) {
        const int32_t v = r->cidx[t * cw + i];
        idx[ww + i] = v >= 0 ? (int32_t)((size_t)v - r->coff + r->nkv) : -1;
    }
    *src = r->src;
}

/* The layer forward over rows [first, first + n) of a prompt chunk that
 * starts at position 0 and ends at first + n, with attention outputs for
 * rows [first + out_first, first + n) only.  The layer's window has not seen
 * the rows before `first`: a window entry there reads as -1 (never the case
 * for the rows the exact rule asks, docs/v41.md "CED prefill").  Window KV is
 * made for the rows the asked outputs read (and the ring's last w), the
 * compressor (KV sources, which must take every row: first == 0) for all n
 * rows, the indexer's keys for all, its queries for the output rows.  Each
 * output row attends the same entries in the same order as in a prefill of
 * the whole chunk, so in reference mode its bits are the same. */
dsattn_status dsattn_v41_attn_forward_rows(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l,
                                           const float *x, size_t n, size_t first,
                                           size_t out_first, float *out)
{
    if (!ctx || !seq || !x || !out || n == 0 || out_first >= n) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41 *m = seq->m;
    const dsattn_v41_config *c = &m->cfg;
    if (l < 0 || l >= c->n_layers) return DSATTN_ERR_INVALID_ARG;
    if (seq->pos != 0) return DSATTN_ERR_UNSUPPORTED;      /* a prompt chunk at 0 only */
    if (first > seq->max_seq_len || n > seq->max_seq_len - first) return DSATTN_ERR_INVALID_ARG;
    const dsattn_v41_layer_w *L = &m->layer[l];
    dsattn_v41_layer_s *S = &seq->layer[l];
    if (!L->wq_a.data) return DSATTN_ERR_UNSUPPORTED;      /* config-only model */
    if (L->is_kv_source && first != 0) return DSATTN_ERR_INVALID_ARG;
    const chunk ck = { n, (int64_t)first, 1 };
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank;
    const size_t G = (size_t)c->o_groups, R = (size_t)c->o_lora_rank, w = (size_t)c->window_size;
    const size_t swab = dsattn_v41_swa_bytes(c), ckvb = dsattn_v41_ckv_bytes(c);
    const size_t P = first + n;                              /* the chunk's end      */
    const size_t kv0 = out_first > w - 1 ? out_first - (w - 1) : 0;
    const size_t nkv = n - kv0, nout = n - out_first;
    const size_t kpos = first + kv0, qpos = first + out_first;  /* first KV / query row */
    const size_t ww = DSATTN_MIN(P, w);                     /* window idx width      */
    dsattn_status st;

    const int nthr = DSATTN_MAX(ctx->n_threads, 1);
    /* output rows with heads at once: all, or a block (as a prompt's) */
    const size_t qb = DSATTN_MIN(nout, DSATTN_MAX(dsattn_csa_prompt_block, (size_t)1));
    const fwd_plan fp = plan_fwd(c, n, qb, nthr, ww);
    const size_t hg = nout == 1 ? DSATTN_MIN(H, (size_t)nthr) : 1;
    const size_t hper = (H + hg - 1) / hg, att_ws = dsattn_sparse_attn_scratch(hper, D);
    const size_t per_thr = att_ws + ww + (size_t)c->index_topk + 16;
    if (per_thr > fp.per_thr) return DSATTN_ERR_OVERFLOW;   /* hg >= plan_fwd's: never */
    float *qr = scratch_get(ctx, seq, fp.bytes);
    if (!qr) return DSATTN_ERR_NOMEM;
    float *q = qr + n * QL, *kvw = q + qb * H * D, *o = kvw + n * D, *oa = o + qb * H * D;
    float *lat = oa + qb * G * R, *aqs = lat + n * D;
    float *thr_ws = aqs + fwd_aq(c, n, qb);
    uint8_t *wrow = (uint8_t *)(thr_ws + (size_t)nthr * fp.per_thr);
    dsattn_phase_mark pm;

    const dsattn_attn_rows qrows = { nout, NULL, (int64_t)qpos, aqs };
    const dsattn_attn_rows krows = { nkv, NULL, (int64_t)kpos, aqs };
    const window_rows wr = { S->ring, wrow, nkv, kpos, w, D, swab };
    const dsattn_csa_qkv qkv = { x + out_first * dim, qr, NULL, &krows, x + kv0 * dim, kvw,
                                 pack_window, &wr };
    if ((st = dsattn_csa_query_kv(ctx, &L->attn, &qrows, &qkv))) return st;
    dsattn_kv_src wsrc = { DSATTN_KV_V41_SWA, wrow, swab, nkv, D, 0 };

    dsattn_kv_src csrc = { DSATTN_KV_V41_FP4, NULL, ckvb, 0, D, 0 };
    const int32_t *cidx = NULL;
    size_t cw = 0, coff = 0;
    if (L->ratio > 0) {
        const size_t ratio = (size_t)L->ratio, compress_len = P / ratio;
        size_t n_new = 0;
        if (L->is_kv_source && (st = compress_source(ctx, seq, l, x, &ck, lat, &n_new)))
            return st;
        if (!L->is_index_source) {
            if (!seq->rt.topk_valid || seq->rt.topk_p0 > (int64_t)qpos ||
                (int64_t)(qpos + nout) > seq->rt.topk_p0 + (int64_t)seq->rt.topk_rows)
                return DSATTN_ERR_INVALID_ARG;
        } else if (compress_len == 0) {
            topk_empty(seq, l, nout, (int64_t)qpos);
        } else {
            dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
            st = run_indexer(ctx, seq, l, x + out_first * dim, qr, &ck, out_first, lat, n_new,
                             nkv, NULL);
            dsattn_phase_end(ctx, &pm);
            if (st) return st;
        }
        if (n_new) {
            dsattn_phase_begin(ctx, DSATTN_PHASE_COMPRESS, &pm);
            publish_latents(seq, l, lat, n_new, 0);
            dsattn_phase_end(ctx, &pm);
        }
        if ((st = read_sources(seq, l, compress_len, &csrc))) return st;
        cw = seq->rt.topk_w;
        cidx = seq->rt.topk + (size_t)((int64_t)qpos - seq->rt.topk_p0) * cw;
        coff = seq->rt.topk_off;
    }

    /* one sparse attention per (row, head group): the window entries of the
     * row's position in a whole-chunk prefill, moved to this call's window
     * rows; the top-k rows moved from their writer's offset to nkv */
    const ced_rows cr = { { wsrc, csrc, ww, cw, -1e30f, 0 }, w, P, qpos, kpos, cidx, coff, nkv };
    const dsattn_csa_attend job = { NULL, o, oa, out, L->sink, hg, hper, att_ws, fp.per_thr,
                                    thr_ws, ced_row, &cr };
    return dsattn_csa_prompt_attend(ctx, &L->attn, &qrows, qr, q, qb, &job);
}
