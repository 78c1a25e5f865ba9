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
 * (online softmax, key ranges split over threads; with the AVX-512 table
 * the heads-in-lanes kernels of mla_kernels.h on 12-key tiles decoded once
 * for both GEMMs, otherwise sgemm for Q.K^T and P.V), prefill rows run in
 * parallel.
 *
 * The batched decode step (dsattn_mla_attn_forward_batch, at the end) runs
 * one token of each of B sequences: the weight products once over the B
 * rows, each sequence's attention on its own cache.
 *
 * Not here: the model and weights (mla_model.c), the indexer's q/k and
 * scores (mla_indexer.c).
 */
#include "mla.h"

#include "batch_common.h"
#include "ktab.h"
#include "numfmt.h"
#include "seq_glue.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
        free(s->layer[l].sel);
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

static float get_bf16(const uint8_t *p)
{
    return dsattn_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* latent row j -> kv[KL] and pe[dr] (either may be NULL) */
static void latent_row(const dsattn_mla_seq *s, int l, size_t j, float *kv, float *pe)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const uint8_t *row = s->layer[l].cache + j * s->row_bytes;
    if (s->fmt == DSATTN_MLA_CACHE_LATENT_BF16) {
        if (kv) for (size_t i = 0; i < KL; i++) kv[i] = get_bf16(row + 2 * i);
        if (pe) for (size_t i = 0; i < dr; i++) pe[i] = get_bf16(row + 2 * (KL + i));
    } else {
        float buf[4096 + 128];
        dsattn_v32_kv_unpack(row, KL, dr, buf);
        if (kv) memcpy(kv, buf, KL * sizeof(float));
        if (pe) memcpy(pe, buf + KL, dr * sizeof(float));
    }
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

/* Softmax of n fp32 scores in place, the contract's way: max, e = fp32(exp
 * (s - max)) evaluated in double, sum in double rounded once, p = e / sum.
 * Returns nothing special for an empty row (n >= 1 always here). */
static void softmax_ref(float *sc, size_t n)
{
    float mx = -INFINITY;
    for (size_t j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
    double sum = 0.0;
    for (size_t j = 0; j < n; j++) {
        sc[j] = (float)exp((double)(sc[j] - mx));
        sum += sc[j];
    }
    float fs = (float)sum;
    for (size_t j = 0; j < n; j++) sc[j] = sc[j] / fs;
}

/* RMSNorm of a bf16 activation with a weight (q_norm / kv_norm). */
static void mla_rmsnorm(const float *x, const float *w, size_t n, float eps, float *y)
{
    dsattn_rmsnorm(x, w, n, eps, y, DSATTN_OUT_BF16);
}

/* Row set of a query: idx (positions) or, if NULL, 0..n-1. */
static inline size_t key_at(const int32_t *idx, size_t i) { return idx ? (size_t)idx[i] : i; }

/* ==== W_uk absorption and the W_uv output =============================== */

/* Fast mode's dsattn_mla_weight_row_bf16: FP8 rows through the SIMD row
 * dequant (wdequant.h: the same exact fp32 products code * block scale),
 * then the same bf16 rounding; other kinds fall back to the shared one.
 * Per decode step absorb_q and absorb_out dequantize all of wkv_b (16.8 M
 * values for V3), which the scalar path spent ~70 ms on. */
/* FP8 weight row r: its codes, and in *scale its row of block scales */
static inline const uint8_t *fp8_row(const dsattn_weight *W, size_t r, const float **scale)
{
    *scale = W->scale + (r / W->block) * ((W->cols + W->block - 1) / W->block);
    return (const uint8_t *)W->data + r * W->cols;
}

static void weight_row_bf16_fast(const dsattn_ctx *ctx, const dsattn_weight *w, size_t r,
                                 float *out)
{
    if (w->kind != DSATTN_W_FP8) {
        dsattn_mla_weight_row_bf16(w, r, out);
        return;
    }
    const float *sc;
    const uint8_t *codes = fp8_row(w, r, &sc);
    ctx->kt->wdq->fp8_row(codes, sc, w->block, w->cols, out);
    for (size_t i = 0; i < w->cols; i++) out[i] = dsattn_round_bf16(out[i]);
}

/* FP8 weight row r (n bytes) on its way into the cache: the absorption
 * loops read one 512-byte row per call, too short for the hardware
 * prefetcher to run ahead (measured ~5 GB/s without this). */
static inline void prefetch_row(const dsattn_weight *W, size_t r, size_t n)
{
    if (r >= W->rows) return;
    const uint8_t *p = (const uint8_t *)W->data + r * n;
    for (size_t i = 0; i < n; i += 64) __builtin_prefetch(p + i, 0, 2);
}

/* Row `ahead` rows past row d of head h's n-row block (block of head g at
 * g*stride + off): in the same block, or - past its end - in the next
 * head's, which is where the loop goes next; the W_uk and W_uv blocks
 * alternate in wkv_b, so "16 rows further in memory" would prefetch the
 * other block's rows instead. */
static inline size_t row_ahead(size_t h, size_t d, size_t ahead, size_t n, size_t stride,
                               size_t off)
{
    d += ahead;
    return d < n ? h * stride + off + d : (h + 1) * stride + off + (d - n);
}

/* One thread's scratch of absorb_q / absorb_out over nr rows: nr * KL
 * doubles (the rows' accumulators) + KL floats (a dequantized weight row). */
static size_t absorb_ws_per(size_t KL, size_t nr)
{
    return (KL * (nr * sizeof(double) + sizeof(float)) + 63) / 64 * 64;
}

/* What absorb_q and absorb_out both set up: the path (reference, or the
 * MLA kernels and whether they take the FP8 rows), and every thread's
 * scratch of per bytes from wa, given back by absorb_end. */
typedef struct {
    int                    ref, fp8k, nth;
    const dsattn_mla_kern *mk;
    dsattn_ws_pos          mark;
    size_t                 per;
    uint8_t               *all;
} absorb_run;

static dsattn_status absorb_begin(dsattn_ctx *ctx, const dsattn_weight *W, size_t per,
                                  dsattn_ws *wa, absorb_run *a)
{
    a->ref = ctx->mode == DSATTN_MODE_REFERENCE;
    a->mk = a->ref ? NULL : ctx->kt->mla;
    a->fp8k = a->mk && W->kind == DSATTN_W_FP8 && W->block % 16 == 0;
    a->nth = DSATTN_MAX(ctx->n_threads, 1);
    a->mark = dsattn_ws_mark(wa);
    a->per = per;
    a->all = dsattn_ws_array(wa, (size_t)a->nth, per);
    return a->all ? DSATTN_OK : DSATTN_ERR_NOMEM;
}

/* Thread tid's scratch. */
static inline void *absorb_scratch(const absorb_run *a, int tid)
{
    return a->all + (size_t)tid * a->per;
}

/* Gives the scratch back and counts nw weight rows of KL over nr rows. */
static void absorb_end(dsattn_ctx *ctx, dsattn_ws *wa, const absorb_run *a, size_t nr,
                       size_t nw, size_t KL)
{
    dsattn_ws_put(wa, a->all);
    dsattn_ws_reset(wa, a->mark);
    dsattn_count(ctx, 2ull * nr * nw * KL, (uint64_t)nw * KL * 2);
}

/* q'[r][h] = bf16(q_nope[r][h] . W_uk[h]) for all heads of nr query rows
 * (q: [nr, H, dn+dr], qa: [nr, H, KL]); W_uk[h] = rows h*(dn+dv) .. +dn of
 * wkv_b (bf16 values of weight_dequant), [dn, KL].  Each weight row is
 * read (and decoded) once for all nr rows; every row's sum runs in the same
 * order as with nr = 1, so a row's bits do not depend on nr. */
/* fast mode: row r's fp32 accumulator, the first KL floats of its slot */
#define ACCF(r) ((float *)(void *)(acc + (r) * KL))
static dsattn_status absorb_q(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *q,
                              size_t nr, float *qa, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_weight *W = &m->layer[l].wkv_b;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dr = (size_t)c->rope;
    const size_t dv = (size_t)c->v_dim, KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    /* per thread: acc [nr, KL] doubles, wr [KL] floats */
    absorb_run ab;
    if (absorb_begin(ctx, W, absorb_ws_per(KL, nr), wa, &ab)) return DSATTN_ERR_NOMEM;
    const int ref = ab.ref, fp8k = ab.fp8k;
    const dsattn_mla_kern *mk = ab.mk;
    DSATTN_PARALLEL(!ref && H >= 4 ? ab.nth : 1, {
        double *acc = absorb_scratch(&ab, dsattn_tid);
        float *wr = (float *)(void *)(acc + nr * KL);
        size_t hlo_, hhi_;
        dsattn_range(H, dsattn_tid, dsattn_nth, &hlo_, &hhi_);
        for (size_t h = hlo_; h < hhi_; h++) {
            if (ref) {
                for (size_t i = 0; i < nr * KL; i++) acc[i] = 0.0;
                for (size_t d = 0; d < dn; d++) {
                    dsattn_mla_weight_row_bf16(W, h * (dn + dv) + d, wr);
                    for (size_t r = 0; r < nr; r++) {
                        const double a = (double)q[(r * H + h) * dqk + d];
                        double *ar = acc + r * KL;
                        for (size_t i = 0; i < KL; i++) ar[i] += a * (double)wr[i];
                    }
                }
                for (size_t r = 0; r < nr; r++)
                    for (size_t i = 0; i < KL; i++)
                        qa[(r * H + h) * KL + i] = dsattn_round_bf16((float)acc[r * KL + i]);
            } else {
                for (size_t r = 0; r < nr; r++)
                    for (size_t i = 0; i < KL; i++) ACCF(r)[i] = 0.0f;
                size_t d0 = 0;
                if (fp8k) {
                    /* four rows per pass over the accumulator, same chain */
                    for (; d0 + 4 <= dn; d0 += 4) {
                        const uint8_t *w4[4];
                        const float *s4[4];
                        for (int k = 0; k < 4; k++) {
                            w4[k] = fp8_row(W, h * (dn + dv) + d0 + (size_t)k, &s4[k]);
                            prefetch_row(W, row_ahead(h, d0 + (size_t)k, 16, dn, dn + dv, 0), KL);
                        }
                        for (size_t r = 0; r < nr; r++)
                            mk->fp8w_axpy4(w4, s4, W->block, KL, q + (r * H + h) * dqk + d0,
                                           ACCF(r), W->finite);
                    }
                }
                for (size_t d = d0; d < dn; d++) {
                    const size_t row = h * (dn + dv) + d;
                    if (fp8k) {
                        const float *sc;
                        const uint8_t *codes = fp8_row(W, row, &sc);
                        prefetch_row(W, row_ahead(h, d, 16, dn, dn + dv, 0), KL);
                        for (size_t r = 0; r < nr; r++)
                            mk->fp8w_axpy(codes, sc, W->block, KL, q[(r * H + h) * dqk + d],
                                          ACCF(r));
                    } else if (mk && W->kind == DSATTN_W_BF16) {
                        for (size_t r = 0; r < nr; r++)
                            mk->bf16w_axpy((const uint16_t *)W->data + row * KL, KL,
                                           q[(r * H + h) * dqk + d], ACCF(r));
                    } else if (W->kind == DSATTN_W_BF16) {
                        const uint16_t *p = (const uint16_t *)W->data + row * KL;
                        for (size_t r = 0; r < nr; r++) {
                            const float a = q[(r * H + h) * dqk + d];
                            float *af = ACCF(r);
                            for (size_t i = 0; i < KL; i++) af[i] += a * dsattn_bf16_to_f32(p[i]);
                        }
                    } else {
                        weight_row_bf16_fast(ctx, W, row, wr);
                        for (size_t r = 0; r < nr; r++) {
                            const float a = q[(r * H + h) * dqk + d];
                            float *af = ACCF(r);
                            for (size_t i = 0; i < KL; i++) af[i] += a * wr[i];
                        }
                    }
                }
                for (size_t r = 0; r < nr; r++)
                    for (size_t i = 0; i < KL; i++)
                        qa[(r * H + h) * KL + i] = dsattn_round_bf16(ACCF(r)[i]);
            }
        }
    });
    absorb_end(ctx, wa, &ab, nr, H * dn, KL);
    return DSATTN_OK;
}
#undef ACCF

/* o[r][h*dv + d] = bf16(x[r][h] . W_uv[h][d]), W_uv[h] = rows h*(dn+dv)+dn
 * .. +dv, for nr rows (x: [nr, H, KL], o: [nr, H*dv]); each weight row read
 * once for all rows, each row's bits those of nr = 1. */
static dsattn_status absorb_out(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                size_t nr, float *o, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_weight *W = &m->layer[l].wkv_b;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope;
    const size_t dv = (size_t)c->v_dim, KL = (size_t)c->kv_lora_rank;
    absorb_run ab;
    if (absorb_begin(ctx, W, absorb_ws_per(KL, 1), wa, &ab)) return DSATTN_ERR_NOMEM;
    const int ref = ab.ref, fp8k = ab.fp8k;
    const dsattn_mla_kern *mk = ab.mk;
    DSATTN_PARALLEL(!ref && H >= 4 ? ab.nth : 1, {
        float *wr = absorb_scratch(&ab, dsattn_tid);
        size_t hlo_, hhi_;
        dsattn_range(H, dsattn_tid, dsattn_nth, &hlo_, &hhi_);
        for (size_t h = hlo_; h < hhi_; h++) {
            size_t d0 = 0;
            if (fp8k) {
                /* four rows per pass, the x loads shared; same bits */
                for (; d0 + 4 <= dv; d0 += 4) {
                    const uint8_t *w4[4];
                    const float *s4[4];
                    float y4[4];
                    for (int k = 0; k < 4; k++) {
                        w4[k] = fp8_row(W, h * (dn + dv) + dn + d0 + (size_t)k, &s4[k]);
                        prefetch_row(W, row_ahead(h, d0 + (size_t)k, 16, dv, dn + dv, dn), KL);
                    }
                    for (size_t r = 0; r < nr; r++) {
                        mk->fp8w_dot4(w4, s4, W->block, KL, x + (r * H + h) * KL, y4, W->finite);
                        for (int k = 0; k < 4; k++)
                            o[r * H * dv + h * dv + d0 + (size_t)k] = dsattn_round_bf16(y4[k]);
                    }
                }
            }
            for (size_t d = d0; d < dv; d++) {
                const size_t row = h * (dn + dv) + dn + d;
                const float *sc = NULL;
                const uint8_t *codes = NULL;
                if (!ref && W->kind == DSATTN_W_BF16) {
                    /* read in place below */
                } else if (fp8k) {
                    codes = fp8_row(W, row, &sc);
                    prefetch_row(W, row_ahead(h, d, 16, dv, dn + dv, dn), KL);
                } else if (ref) {
                    dsattn_mla_weight_row_bf16(W, row, wr);
                } else {
                    weight_row_bf16_fast(ctx, W, row, wr);
                }
                for (size_t r = 0; r < nr; r++) {
                    const float *xh = x + (r * H + h) * KL;
                    float y;
                    if (!ref && W->kind == DSATTN_W_BF16) {
                        ctx->k->gemv_bf16((const uint16_t *)W->data + row * KL, xh, &y, 1, KL);
                    } else if (fp8k) {
                        y = mk->fp8w_dot(codes, sc, W->block, KL, xh);
                    } else if (ref) {
                        double a = 0.0;
                        for (size_t i = 0; i < KL; i++) a += (double)xh[i] * (double)wr[i];
                        y = (float)a;
                    } else {
                        y = ctx->k->dot_f32(xh, wr, KL);
                    }
                    o[r * H * dv + h * dv + d] = dsattn_round_bf16(y);
                }
            }
        }
    });
    absorb_end(ctx, wa, &ab, nr, H * dv, KL);
    return DSATTN_OK;
}

/* ==== Absorbed attention over the latent cache ========================== */

/* The scratch of a one-query-row reference (absorbed_row_ref,
 * expanded_row): nf floats and nd doubles from wa (or the heap), given back
 * with the workspace reset to mark by row_scratch_put; neither when one
 * does not fit (DSATTN_ERR_NOMEM). */
static void row_scratch_put(dsattn_ws *wa, dsattn_ws_pos mark, float *f, double *d)
{
    dsattn_ws_put(wa, f);
    dsattn_ws_put(wa, d);
    dsattn_ws_reset(wa, mark);
}

static dsattn_status row_scratch(dsattn_ws *wa, dsattn_ws_pos mark, size_t nf, size_t nd,
                                 float **f, double **d)
{
    *f = dsattn_ws_array(wa, nf, sizeof(float));
    *d = dsattn_ws_array(wa, nd, sizeof(double));
    if (*f && *d) return DSATTN_OK;
    row_scratch_put(wa, mark, *f, *d);
    return DSATTN_ERR_NOMEM;
}

/* Reference: one query row, all heads.  qa [H, KL] (q'), qpe [H, dr];
 * keys = idx[0..n) or 0..n-1; xo [H, KL] = bf16(p . kv). */
static dsattn_status absorbed_row_ref(const dsattn_mla_seq *s, int l, const float *qa,
                                      const float *qpe, const int32_t *idx, size_t n, int v3,
                                      float *xo, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const float scale = c->softmax_scale;
    /* one head's scores [n] and one decoded row [KL + dr]: each head
     * decodes its keys again (the same values), so the scratch grows by
     * 4 bytes per key, not by a decoded copy of the cache */
    const dsattn_ws_pos mark = dsattn_ws_mark(wa);
    float *sh;
    double *acc;
    if (row_scratch(wa, mark, n + KL + dr, KL, &sh, &acc)) return DSATTN_ERR_NOMEM;
    float *k = sh + n;
    for (size_t h = 0; h < H; h++) {
        const float *q1 = qa + h * KL, *q2 = qpe + h * dr;
        for (size_t i = 0; i < n; i++) {
            latent_row(s, l, key_at(idx, i), k, k + KL);
            double a = 0.0, b = 0.0;
            for (size_t t = 0; t < KL; t++) a += (double)q1[t] * (double)k[t];
            for (size_t t = 0; t < dr; t++) b += (double)q2[t] * (double)k[KL + t];
            if (v3) {
                float sn = dsattn_round_bf16((float)a), sp = dsattn_round_bf16((float)b);
                sh[i] = dsattn_round_bf16(dsattn_round_bf16(sn + sp) * scale);
            } else {
                sh[i] = ((float)a + (float)b) * scale;
            }
        }
        softmax_ref(sh, n);
        for (size_t t = 0; t < KL; t++) acc[t] = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double p = dsattn_round_bf16(sh[i]);
            latent_row(s, l, key_at(idx, i), k, k + KL);
            for (size_t t = 0; t < KL; t++) acc[t] += p * (double)k[t];
        }
        for (size_t t = 0; t < KL; t++) xo[h * KL + t] = dsattn_round_bf16((float)acc[t]);
    }
    row_scratch_put(wa, mark, sh, acc);
    return DSATTN_OK;
}

#define AB_BLOCK 256

/* Fast partial: keys [i0, i1) of the set; online softmax state m[H], l[H],
 * acc[H, KL] (fp32).  Q = [q' | q_pe] rows [H, KL+dr]. */
static void absorbed_part_fast(const dsattn_ktab *kt, const dsattn_mla_seq *s, int l,
                               const float *Q, const int32_t *idx, size_t i0, size_t i1,
                               int v3, float *m, float *lsum, float *acc, float *kb, float *sc,
                               const float *lut)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t D = KL + dr;
    const float scale = c->softmax_scale;
    const dsattn_exp_sub_sum_fn vexp = kt->vmath->exp_sub_sum;
    for (size_t b0 = i0; b0 < i1; b0 += AB_BLOCK) {
        const size_t nb = DSATTN_MIN((size_t)AB_BLOCK, i1 - b0);
        for (size_t i = 0; i < nb; i++) {
            const size_t j = key_at(idx, b0 + i);
            if (s->fmt == DSATTN_MLA_CACHE_LATENT_BF16) {
                const uint16_t *row = (const uint16_t *)(s->layer[l].cache + j * s->row_bytes);
                kt->k->cvt_bf16_f32(row, D, kb + i * D);      /* SIMD shift, exact */
            } else {
                /* dsattn_v32_kv_unpack with a code table: the same fp32
                 * products code * scale, bf16 rope */
                const uint8_t *row = s->layer[l].cache + j * s->row_bytes;
                float *o = kb + i * D;
                for (size_t b = 0; b < KL / 128; b++) {
                    const uint8_t *q = row + KL + 4 * b;
                    const float bsc = dsattn_bits_f32((uint32_t)q[0] | (uint32_t)q[1] << 8 |
                                                     (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24);
                    for (size_t t = 0; t < 128; t++) o[b * 128 + t] = lut[row[b * 128 + t]] * bsc;
                }
                const uint8_t *rp = row + KL + 4 * (KL / 128);
                for (size_t t = 0; t < dr; t++) o[KL + t] = get_bf16(rp + 2 * t);
            }
        }
        /* sc[h, i] = Q_h . K_i */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)H, (int)nb, (int)D, 1.0f, Q,
                    (int)D, kb, (int)D, 0.0f, sc, (int)nb);
        for (size_t h = 0; h < H; h++) {
            float *sh = sc + h * nb, mx = m[h];
            for (size_t i = 0; i < nb; i++) {
                float v = sh[i] * scale;
                if (v3) v = dsattn_round_bf16(v);
                sh[i] = v;
                mx = v > mx ? v : mx;
            }
            const float alpha = expf(m[h] - mx);
            const float ps = vexp(sh, nb, mx);           /* vectorised exp + sum */
            lsum[h] = lsum[h] * alpha + ps;
            m[h] = mx;
            if (alpha != 1.0f) {
                float *a = acc + h * KL;
                for (size_t t = 0; t < KL; t++) a[t] *= alpha;
            }
        }
        /* acc[H, KL] += P[H, nb] . K[nb, :KL] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)H, (int)KL, (int)nb, 1.0f,
                    sc, (int)nb, kb, (int)D, 1.0f, acc, (int)KL);
    }
}

/* The AVX-512 path (mla_kernels.h): heads in lanes, keys in blocks of
 * MT_BLOCK decoded once into 12-key tiles that serve both GEMMs.  Per
 * thread: m, l, alpha [hp], acc^T [KL, hp], the tiled block [MT_BLOCK, D],
 * scores/probabilities [MT_BLOCK, hp] and 12 decoded rows; shared: the
 * packed queries [hp, D].  The block stays in L2 (~0.45 MB at real dims)
 * while the QK and PV kernels run over it. */
#define MT_BLOCK 192

/* Inside a parallel region: this thread's number and its share [i0, i1)
 * of n keys split evenly over the region's threads. */
static int thread_keys(size_t n, int tid, int nth, size_t *i0, size_t *i1)
{
    const size_t chunk = (n + (size_t)nth - 1) / (size_t)nth;
    *i0 = DSATTN_MIN(n, (size_t)tid * chunk);
    *i1 = DSATTN_MIN(n, *i0 + chunk);
    return tid;
}

/* Threads a decode row of n keys splits its keys over (at most n_threads,
 * at least 512 keys each). */
static int row_threads(size_t n, int n_threads)
{
    int nt = DSATTN_MAX(n_threads, 1);
    if ((size_t)nt > n / 512) nt = (int)DSATTN_MAX(n / 512, 1);
    return nt;
}

/* Scratch of absorbed_row_tiled with nt threads: per thread m, l, alpha
 * [hp], acc^T [KL, hp], the block [MT_BLOCK, D], scores [MT_BLOCK, hp],
 * KT decoded rows; the packed and plain queries; 2 MT_BLOCK row pointers
 * per thread. */
static size_t tiled_ws_bytes(size_t H, size_t KL, size_t dr, int nt, size_t *per_out,
                             size_t *wsf_out)
{
    const size_t D = KL + dr, hp = (H + 15) / 16 * 16;
    const size_t per = 3 * hp + KL * hp + MT_BLOCK * D + MT_BLOCK * hp + DSATTN_MLA_KT * D;
    const size_t wsf = (size_t)nt * per + hp * D + H * D;      /* floats, then row pointers */
    if (per_out) *per_out = per;
    if (wsf_out) *wsf_out = wsf;
    return wsf * sizeof(float) + (size_t)nt * 2 * MT_BLOCK * sizeof(uint8_t *);
}

/* wa: the sequence's scratch for a decode row (one call at a time), or
 * NULL when rows run in parallel (prefill: each call allocates). */
static dsattn_status absorbed_row_tiled(dsattn_ctx *ctx, const dsattn_mla_kern *mk,
                                        const dsattn_mla_seq *s, int l, const float *qa,
                                        const float *qpe, const int32_t *idx, size_t n, int v3,
                                        float *xo, int n_threads, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t D = KL + dr, hp = (H + 15) / 16 * 16;
    const float scale = c->softmax_scale;
    const int nt = row_threads(n, n_threads);
    size_t per, wsf;
    const size_t bytes = tiled_ws_bytes(H, KL, dr, nt, &per, &wsf);
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    float *ws = dsattn_ws_get(wa, bytes);
    if (!ws) return DSATTN_ERR_NOMEM;
    const uint8_t **rp = (const uint8_t **)(void *)(ws + wsf);
    float *qp = ws + (size_t)nt * per, *Q = qp + hp * D;
    for (size_t h = 0; h < H; h++) {
        memcpy(Q + h * D, qa + h * KL, KL * sizeof(float));
        memcpy(Q + h * D + KL, qpe + h * dr, dr * sizeof(float));
    }
    dsattn_mla_pack_q(Q, D, H, hp, D, qp);
    const uint8_t *cache = s->layer[l].cache;
    const size_t rb = s->row_bytes;
    const int bf16 = s->fmt == DSATTN_MLA_CACHE_LATENT_BF16;
    DSATTN_PARALLEL(nt, {
        size_t i0, i1;
        const int tid = thread_keys(n, dsattn_tid, dsattn_nth, &i0, &i1);
        float *mm = ws + (size_t)tid * per, *ll = mm + hp, *al = ll + hp, *acc = al + hp;
        float *kt = acc + KL * hp, *st = kt + MT_BLOCK * D, *rows = st + MT_BLOCK * hp;
        const uint8_t **cur = rp + (size_t)tid * 2 * MT_BLOCK, **nxt = cur + MT_BLOCK;
        for (size_t h = 0; h < hp; h++) { mm[h] = -INFINITY; ll[h] = 0.0f; }
        memset(acc, 0, KL * hp * sizeof(float));
        size_t nb = DSATTN_MIN((size_t)MT_BLOCK, i1 - i0);
        for (size_t i = 0; i < nb; i++) cur[i] = cache + key_at(idx, i0 + i) * rb;
        for (size_t b0 = i0; b0 < i1; b0 += MT_BLOCK) {
            /* the next block's rows, prefetched while this one computes */
            const size_t b1 = b0 + nb, nn = b1 < i1 ? DSATTN_MIN((size_t)MT_BLOCK, i1 - b1) : 0;
            for (size_t i = 0; i < nn; i++) nxt[i] = cache + key_at(idx, b1 + i) * rb;
            for (size_t t0 = 0; t0 < nb; t0 += DSATTN_MLA_KT) {
                const size_t nr = DSATTN_MIN((size_t)DSATTN_MLA_KT, nb - t0);
                if (bf16) {
                    mk->tile_bf16(cur + t0, nr, D, kt + t0 * D);
                } else {
                    for (size_t r = 0; r < nr; r++) mk->v32_row(cur[t0 + r], KL, dr, rows + r * D);
                    mk->tile_rows(rows, D, nr, D, kt + t0 * D);
                }
            }
            mk->qk(qp, hp, D, kt, nb, st, hp);
            mk->softmax(st, hp, hp, nb, scale, v3, mm, ll, al);
            mk->pv(st, hp, hp, kt, D, nb, KL, al, acc, nxt, nn, rb);
            const uint8_t **sw = cur;
            cur = nxt;
            nxt = sw;
            nb = nn;
        }
    });
    /* merge the partial softmax states into thread 0's */
    float *m0 = ws, *l0 = m0 + hp, *f0 = l0 + hp, *a0 = f0 + hp;
    for (int t = 1; t < nt; t++) {
        float *mt = ws + (size_t)t * per, *lt = mt + hp, *ft = lt + hp, *at = ft + hp;
        for (size_t h = 0; h < hp; h++) {
            const float mx = mt[h] > m0[h] ? mt[h] : m0[h];
            f0[h] = m0[h] == mx ? 1.0f : expf(m0[h] - mx);
            ft[h] = lt[h] == 0.0f ? 0.0f : mt[h] == mx ? 1.0f : expf(mt[h] - mx);
            l0[h] = l0[h] * f0[h] + lt[h] * ft[h];
            m0[h] = mx;
        }
        for (size_t i = 0; i < KL; i++)
            for (size_t h = 0; h < hp; h++)
                a0[i * hp + h] = a0[i * hp + h] * f0[h] + at[i * hp + h] * ft[h];
    }
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < KL; i++) xo[h * KL + i] = dsattn_round_bf16(a0[i * hp + h] / l0[h]);
    dsattn_ws_put(wa, ws);
    dsattn_ws_reset(wa, wmark);
    return DSATTN_OK;
}

/* Extra per-thread scratch of amx_part for FP8 latent rows: a block of
 * bf16 rows [DSATTN_AMX_MB + 32][D] and 16 decoded fp32 rows [16][D]. */
static size_t amx_fp8_scratch(size_t D)
{
    return ((size_t)(DSATTN_AMX_MB + 32) * D * 2 + 16 * D * 4 + 127) / 64 * 64;
}

/* Scratch of absorbed_row_amx with nt threads: per thread m, l [hp], O
 * [hp, KL], the part's scratch (and FP8 rows' decode); shared: Q, qb. */
static size_t amx_ws_bytes(size_t H, size_t KL, size_t dr, int fp8, int nt, size_t *part_out,
                           size_t *per_out)
{
    const size_t D = KL + dr, hp = (H + 31) / 32 * 32;
    const size_t part = (dsattn_amx_ws_bytes(hp, D, KL) + 63) / 64 * 64;
    const size_t fpart = fp8 ? amx_fp8_scratch(D) : 0;
    const size_t per = (2 * hp + hp * KL) * sizeof(float) + part + fpart;
    if (part_out) *part_out = part;
    if (per_out) *per_out = per;
    return (size_t)nt * per + H * D * sizeof(float) + hp * D * 2 + 64;
}

/* One thread's keys i0..i1 (cache rows idx[i], or i) through the AMX
 * blocks of amx_attn.h; r carries the next block's first rows for the
 * prefetch.  bf16 rows go to the tiles as they are; FP8 rows (E4M3 per
 * 128 times a power-of-two scale, bf16 rope: bf16 numbers) are decoded
 * with mk->v32_row and converted with ak->rows_bf16, which checks
 * that every value is one.  Returns 0 if a row was not (the caller falls
 * back to the FMA tiles for the whole row). */
static int amx_part(const dsattn_amx_kern *ak, const dsattn_mla_kern *mk, const uint16_t *qb,
                    size_t hp, size_t D, size_t KL, size_t dr, const uint8_t *cache, size_t rb, int fp8,
                    const int32_t *idx, size_t i0, size_t i1, float scale, int v3, float *m,
                    float *l, float *o, void *ws, void *fws)
{
    const size_t MB = DSATTN_AMX_MB;
    const uint8_t *r[DSATTN_AMX_MB + 32];
    uint16_t *rows = fws;
    float *dec = fws ? (float *)(rows + (MB + 32) * D) : NULL;
    int ok = 1;
    ak->begin();
    for (size_t b0 = i0; b0 < i1 && ok; b0 += MB) {
        const size_t nk = DSATTN_MIN(MB, i1 - b0), nq = (nk + 31) / 32;
        for (size_t i = 0; i < 32 * nq + 32; i++) {
            const int real = i < nk || (i >= 32 * nq && nk == MB && b0 + i < i1);
            r[i] = real ? cache + key_at(idx, b0 + i) * rb : NULL;
        }
        if (fp8) {
            /* decode into contiguous bf16 rows, zero up to the 32-key step */
            for (size_t t0 = 0; t0 < nk && ok; t0 += 16) {
                const size_t nr = DSATTN_MIN((size_t)16, nk - t0);
                for (size_t i = 0; i < nr; i++) mk->v32_row(r[t0 + i], KL, dr, dec + i * D);
                ok &= ak->rows_bf16(dec, D, nr, D, rows + t0 * D);
            }
            memset(rows + nk * D, 0, (32 * nq - nk) * D * sizeof(uint16_t));
            for (size_t i = 0; i < 32 * nq; i++) r[i] = (const uint8_t *)(rows + i * D);
            for (size_t i = 32 * nq; i < 32 * nq + 32; i++) r[i] = NULL;
            if (ok)
                ak->block(mk, qb, hp, D, KL, r, nk, D * 2, 1, 1, scale, v3, m, l, o, ws);
        } else {
            ak->block(mk, qb, hp, D, KL, r, nk, rb, !idx && nk == 32 * nq, 0, scale, v3, m, l, o,
                      ws);
        }
    }
    ak->end();
    return ok;
}

/* The AMX-BF16 form (amx_attn.h) for the latent caches: the keys split
 * over threads as in absorbed_row_tiled, each part's (m, l, O) merged into
 * thread 0's.  Returns 0 without touching xo when it
 * does not apply (no AMX in the context, other shapes, a query value that is
 * not a bf16 number); *st carries an allocation failure. */
static int absorbed_row_amx(dsattn_ctx *ctx, const dsattn_mla_kern *mk, const dsattn_mla_seq *s,
                            int l, const float *qa, const float *qpe, const int32_t *idx,
                            size_t n, int v3, float *xo, int n_threads, dsattn_ws *wa,
                            dsattn_status *st)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t D = KL + dr, hp = (H + 31) / 32 * 32;
    const int fp8 = s->fmt == DSATTN_MLA_CACHE_LATENT_FP8;
    const dsattn_amx_kern *ak = ctx->kt->bf16blk;
    if (!ak || !ak->fits(hp, D, KL) || KL % 128 ||
        !(fp8 || (s->fmt == DSATTN_MLA_CACHE_LATENT_BF16 && s->row_bytes >= D * 2)))
        return 0;
    const int nt = row_threads(n, n_threads);
    size_t part, per;
    const size_t bytes = amx_ws_bytes(H, KL, dr, fp8, nt, &part, &per);
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    void *ws = dsattn_ws_get(wa, bytes);
    if (!ws) {
        *st = DSATTN_ERR_NOMEM;
        return 1;
    }
    uint8_t *w8 = ws;
    float *Q = (float *)(w8 + (size_t)nt * per);
    uint16_t *qb = (uint16_t *)(w8 + (size_t)nt * per + H * D * sizeof(float));
    for (size_t h = 0; h < H; h++) {
        memcpy(Q + h * D, qa + h * KL, KL * sizeof(float));
        memcpy(Q + h * D + KL, qpe + h * dr, dr * sizeof(float));
    }
    if (!ak->pack_q(Q, D, H, hp, D, qb)) {
        dsattn_ws_put(wa, ws);
        dsattn_ws_reset(wa, wmark);
        return 0;
    }
    const uint8_t *cache = s->layer[l].cache;
    const float scale = c->softmax_scale;
    int failed = 0;
    DSATTN_PARALLEL(nt, {
        size_t i0, i1;
        const int tid = thread_keys(n, dsattn_tid, dsattn_nth, &i0, &i1);
        float *mm = (float *)(w8 + (size_t)tid * per), *ll = mm + hp, *o = ll + hp;
        uint8_t *pw = (uint8_t *)(o + hp * KL);
        for (size_t h = 0; h < hp; h++) { mm[h] = -INFINITY; ll[h] = 0.0f; }
        memset(o, 0, hp * KL * sizeof(float));
        if (i0 < i1 && !amx_part(ak, mk, qb, hp, D, KL, dr, cache, s->row_bytes, fp8, idx, i0,
                                 i1, scale, v3, mm, ll, o, pw, fp8 ? pw + part : NULL)) {
        _Pragma("omp atomic write")
            failed = 1;
        }
    });
    if (failed) {                   /* a row value that is not a bf16 number */
        dsattn_ws_put(wa, ws);
        dsattn_ws_reset(wa, wmark);
        return 0;
    }
    /* merge the parts into thread 0's (a part with l = 0 adds nothing) */
    const size_t ncg = KL / 16;
    float *m0 = (float *)w8, *l0 = m0 + hp, *o0 = l0 + hp;
    for (int t = 1; t < nt; t++) {
        float *mt = (float *)(w8 + (size_t)t * per), *lt = mt + hp, *ot = lt + hp;
        for (size_t h = 0; h < H; h++) {
            if (lt[h] == 0.0f) continue;
            const float mx = mt[h] > m0[h] ? mt[h] : m0[h];
            const float f0 = l0[h] == 0.0f ? 0.0f : expf(m0[h] - mx), ft = expf(mt[h] - mx);
            l0[h] = l0[h] * f0 + lt[h] * ft;
            m0[h] = mx;
            for (size_t cg = 0; cg < ncg; cg++) {
                const size_t at = ((h / 16) * ncg + cg) * 256 + (h % 16) * 16;
                for (size_t i = 0; i < 16; i++) o0[at + i] = o0[at + i] * f0 + ot[at + i] * ft;
            }
        }
    }
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < KL; i++)
            xo[h * KL + i] = dsattn_round_bf16(
                o0[((h / 16) * ncg + i / 16) * 256 + (h % 16) * 16 + i % 16] / l0[h]);
    dsattn_ws_put(wa, ws);
    dsattn_ws_reset(wa, wmark);
    return 1;
}

/* Scratch of the sgemm form below with nt threads: per thread m, l [H],
 * acc [H, KL], kb [AB, D], sc [H, AB] (floats); plus Q [H, D]. */
static size_t generic_ws_bytes(size_t H, size_t KL, size_t dr, int nt, size_t *per_out)
{
    const size_t D = KL + dr, per = 2 * H + H * KL + AB_BLOCK * D + H * AB_BLOCK;
    if (per_out) *per_out = per;
    return ((size_t)nt * per + H * D) * sizeof(float);
}

static dsattn_status absorbed_row_fast(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l,
                                       const float *qa, const float *qpe, const int32_t *idx,
                                       size_t n, int v3, float *xo, int n_threads,
                                       dsattn_ws *wa)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t D = KL + dr;
    const dsattn_mla_kern *mk = ctx->kt->mla;
    dsattn_status ast = DSATTN_OK;
    if (mk && absorbed_row_amx(ctx, mk, s, l, qa, qpe, idx, n, v3, xo, n_threads, wa, &ast))
        return ast;
    if (mk) return absorbed_row_tiled(ctx, mk, s, l, qa, qpe, idx, n, v3, xo, n_threads, wa);
    const int nt = row_threads(n, n_threads);
    size_t per;
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    float *ws = dsattn_ws_get(wa, generic_ws_bytes(H, KL, dr, nt, &per));
    if (!ws) return DSATTN_ERR_NOMEM;
    float *Q = ws + (size_t)nt * per;
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = dsattn_e4m3_to_f32((uint8_t)i);
    for (size_t h = 0; h < H; h++) {
        memcpy(Q + h * D, qa + h * KL, KL * sizeof(float));
        memcpy(Q + h * D + KL, qpe + h * dr, dr * sizeof(float));
    }
    /* Always a parallel region, even of one thread, and one OpenBLAS
     * thread inside it: OpenBLAS's OpenMP build sizes its team from
     * omp_get_max_threads() unless it runs inside an *active* region, so
     * with nt = 1 every sgemm of 256 rows forked the whole default team
     * (measured: 788 ms -> 250 ms per V3 decode step at 32K on 1 thread).
     * omp_set_num_threads inside the region changes only the region's
     * own ICV; with nt = 1 the block runs without a region (no team of
     * one to allocate) and the caller's value is put back after. */
#ifdef _OPENMP
    const int saved_max = omp_get_max_threads();
#endif
    DSATTN_PARALLEL(nt, {
        const int tid = dsattn_tid, nth = dsattn_nth;
        dsattn_set_num_threads(1);
        float *mm = ws + (size_t)tid * per, *ll = mm + H, *acc = ll + H;
        float *kb = acc + H * KL, *sc = kb + AB_BLOCK * D;
        for (size_t h = 0; h < H; h++) { mm[h] = -INFINITY; ll[h] = 0.0f; }
        memset(acc, 0, H * KL * sizeof(float));
        size_t chunk = (n + (size_t)nth - 1) / (size_t)nth;
        size_t i0 = DSATTN_MIN(n, (size_t)tid * chunk), i1 = DSATTN_MIN(n, i0 + chunk);
        if (i0 < i1) absorbed_part_fast(ctx->kt, s, l, Q, idx, i0, i1, v3, mm, ll, acc, kb, sc, lut);
    });
#ifdef _OPENMP
    omp_set_num_threads(saved_max);    /* run plainly (nt = 1) it set the caller's */
#endif
    /* merge the partial softmax states into thread 0's */
    float *m0 = ws, *l0 = m0 + H, *a0 = l0 + H;
    for (int t = 1; t < nt; t++) {
        float *mt = ws + (size_t)t * per, *lt = mt + H, *at = lt + H;
        for (size_t h = 0; h < H; h++) {
            if (lt[h] == 0.0f) continue;
            float mx = mt[h] > m0[h] ? mt[h] : m0[h];
            float a = expf(m0[h] - mx), b = expf(mt[h] - mx);
            l0[h] = l0[h] * a + lt[h] * b;
            for (size_t i = 0; i < KL; i++) a0[h * KL + i] = a0[h * KL + i] * a + at[h * KL + i] * b;
            m0[h] = mx;
        }
    }
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < KL; i++) xo[h * KL + i] = dsattn_round_bf16(a0[h * KL + i] / l0[h]);
    dsattn_ws_put(wa, ws);
    dsattn_ws_reset(wa, wmark);
    return DSATTN_OK;
}

/* ==== Expanded (MHA) attention ========================================== */

/* Where the expanded keys and values of a query's key set live.  Key j of
 * head h: nope part at kn + j*ldk + h*hsk (dn floats), rope part at
 * kr + j*ldr + h*hsr (dr floats); value at v + j*ldv + h*hsv (dv floats). */
typedef struct {
    const float *kn, *kr, *v;
    size_t ldk, hsk, ldr, hsr, ldv, hsv;
} kv_view;

/* One query row over expanded keys: q [H, dqk]; keys idx or 0..n-1.
 * v3: bf16 score arithmetic (V3 naive); else fp32 (V3.2).  o [H, dv]. */
static dsattn_status expanded_row(dsattn_ctx *ctx, const dsattn_mla_config *c, const float *q,
                                  const kv_view *kv, const int32_t *idx, size_t n, int v3,
                                  float *o, dsattn_ws *wa)
{
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dr = (size_t)c->rope;
    const size_t dqk = dn + dr, dv = (size_t)c->v_dim;
    const float scale = c->softmax_scale;
    const int ref = ctx->mode == DSATTN_MODE_REFERENCE;
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    float *sc;
    double *acc;
    if (row_scratch(wa, wmark, n + dv, dv, &sc, &acc)) return DSATTN_ERR_NOMEM;
    float *accf = sc + n;
    for (size_t h = 0; h < H; h++) {
        const float *qh = q + h * dqk;
        for (size_t i = 0; i < n; i++) {
            const size_t j = key_at(idx, i);
            const float *kn = kv->kn + j * kv->ldk + h * kv->hsk;
            const float *kr = kv->kr + j * kv->ldr + h * kv->hsr;
            float d;
            if (ref) {
                double a = 0.0;            /* one double sum over [nope | rope] */
                for (size_t t = 0; t < dn; t++) a += (double)qh[t] * (double)kn[t];
                for (size_t t = 0; t < dr; t++) a += (double)qh[dn + t] * (double)kr[t];
                d = (float)a;
            } else {
                d = ctx->k->dot_f32(qh, kn, dn) + ctx->k->dot_f32(qh + dn, kr, dr);
            }
            sc[i] = v3 ? dsattn_round_bf16(dsattn_round_bf16(d) * scale) : d * scale;
        }
        softmax_ref(sc, n);
        if (ref) {
            for (size_t t = 0; t < dv; t++) acc[t] = 0.0;
            for (size_t i = 0; i < n; i++) {
                const double p = dsattn_round_bf16(sc[i]);
                const float *v = kv->v + key_at(idx, i) * kv->ldv + h * kv->hsv;
                for (size_t t = 0; t < dv; t++) acc[t] += p * (double)v[t];
            }
            for (size_t t = 0; t < dv; t++) o[h * dv + t] = dsattn_round_bf16((float)acc[t]);
        } else {
            for (size_t t = 0; t < dv; t++) accf[t] = 0.0f;
            for (size_t i = 0; i < n; i++) {
                const float p = dsattn_round_bf16(sc[i]);
                const float *v = kv->v + key_at(idx, i) * kv->ldv + h * kv->hsv;
                for (size_t t = 0; t < dv; t++) accf[t] += p * v[t];
            }
            for (size_t t = 0; t < dv; t++) o[h * dv + t] = dsattn_round_bf16(accf[t]);
        }
    }
    row_scratch_put(wa, wmark, sc, acc);
    return DSATTN_OK;
}

/* The naive cache for one query row: per head, gather that head's K and V
 * of the key set from the bf16 rows into kh [n, dqk] / vh [n, dv] (so no
 * row is expanded for all heads at once), then attend. */
static dsattn_status naive_row(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l, const float *q,
                               const int32_t *idx, size_t n, int v3, float *o, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dr = (size_t)c->rope;
    const size_t dqk = dn + dr, dv = (size_t)c->v_dim;
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    float *kh = dsattn_ws_array(wa, n, (dqk + dv) * sizeof(float));
    if (!kh) return DSATTN_ERR_NOMEM;
    float *vh = kh + n * dqk;
    dsattn_mla_config c1 = *c;
    c1.n_heads = 1;
    const kv_view kv = { kh, kh + dn, vh, dqk, 0, dqk, 0, dv, 0 };
    dsattn_status st = DSATTN_OK;
    for (size_t h = 0; h < H && !st; h++) {
        for (size_t i = 0; i < n; i++) {
            const size_t j = key_at(idx, i);
            const uint8_t *kr = s->layer[l].cache + j * s->row_bytes + 2 * h * dqk;
            const uint8_t *vr = s->layer[l].v + j * s->v_bytes + 2 * h * dv;
            for (size_t t = 0; t < dqk; t++) kh[i * dqk + t] = get_bf16(kr + 2 * t);
            for (size_t t = 0; t < dv; t++) vh[i * dv + t] = get_bf16(vr + 2 * t);
        }
        st = expanded_row(ctx, &c1, q + h * dqk, &kv, NULL, n, v3, o + h * dv, wa);
    }
    dsattn_ws_put(wa, kh);
    dsattn_ws_reset(wa, wmark);
    return st;
}

/* ==== The indexer's selection =========================================== */

/* Top-k of one query row: score over the visible keys [0, nvis); the
 * reference takes topk(min(index_topk, end)) of the masked row, whose
 * attended part is the top min(index_topk, nvis) of the visible scores
 * (masked picks, if any, attend nothing).  Writes the attended positions
 * ascending into row[0..width), -1 padded; returns how many. */
static size_t select_row(const float *score, size_t nvis, size_t topk, size_t width,
                         int32_t *row)
{
    size_t k = DSATTN_MIN(topk, nvis);
    dsattn_topk(score, nvis, k, row, NULL);
    dsattn_sort_idx_valid_first(row, k);
    for (size_t i = k; i < width; i++) row[i] = -1;
    return k;
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
        dsattn_ws_need(&att, cap, (dqk + dv) * sizeof(float));    /* naive_row */
        dsattn_ws_need(&att, cap + dv, sizeof(float));             /* expanded_row */
        dsattn_ws_need(&att, dv, sizeof(double));
    } else {
        dsattn_ws_need(&att, H * KL, sizeof(float));               /* qa   */
        dsattn_ws_need(&att, H * KL, sizeof(float));               /* xo   */
        dsattn_ws_need(&att, H * dr, sizeof(float));               /* qpe  */
        size_t row = 0, r;
        dsattn_ws_need(&row, (size_t)T, absorb_ws_per(KL, 1));        /* absorb_q / _out */
        r = 0;                                                     /* reference row */
        dsattn_ws_need(&r, cap + KL + dr, sizeof(float));
        dsattn_ws_need(&r, KL, sizeof(double));
        row = DSATTN_MAX(row, r);
        const int nt = row_threads(cap, T);
        r = 0;
        dsattn_ws_need(&r, tiled_ws_bytes(H, KL, dr, nt, NULL, NULL), 1);
        row = DSATTN_MAX(row, r);
        r = 0;
        dsattn_ws_need(&r, generic_ws_bytes(H, KL, dr, nt, NULL), 1);
        row = DSATTN_MAX(row, r);
        const size_t hp = (H + 31) / 32 * 32;
        if (dsattn_amx_fits(hp, D, KL) && KL % 128 == 0) {
            r = 0;
            dsattn_ws_need(&r, amx_ws_bytes(H, KL, dr, fmt == DSATTN_MLA_CACHE_LATENT_FP8, nt,
                                            NULL, NULL), 1);
            row = DSATTN_MAX(row, r);
        }
        if (!dsattn_add_size(att, row, &att)) att = SIZE_MAX;
    }
    size_t rest = DSATTN_MAX(idx, att);
    if (b == SIZE_MAX || rest == SIZE_MAX || !dsattn_add_size(b, rest, &b)) return SIZE_MAX;
    return b;
}

typedef struct {
    float *q, *qa, *kv, *kvb, *o, *xo, *aqs, *qr, *qc, *wq, *score;
} fwd_buf;

/* The buffers of n rows both forwards take first, in this order from ws
 * (zeroed): qr, q, kv, o, aqs and, when expanded, kvb.  0 when one is
 * missing. */
static int fwd_buf_rows(fwd_buf *b, dsattn_ws *ws, const dsattn_mla_config *c, size_t n,
                        int expanded)
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
static dsattn_status mla_query_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                    size_t n, int64_t start, dsattn_mla_seq *const *seqs,
                                    const fwd_buf *b)
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
static dsattn_status mla_latent_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                     size_t n, int64_t start, dsattn_mla_seq *const *seqs,
                                     const fwd_buf *b)
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
static void cache_write(dsattn_mla_seq *seq, int l, size_t j, const float *kv, const float *e)
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
                                      const float *x, size_t s, float *out)
{
    if (!ctx || !seq || !x || !out || s == 0) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mla *m = seq->m;
    const dsattn_mla_config *c = &m->cfg;
    if (!dsattn_mla_seq_holds(seq, l)) return DSATTN_ERR_INVALID_ARG;
    if (!dsattn_mla_model_holds(m, l)) return DSATTN_ERR_UNSUPPORTED;   /* no weights */
    if (seq->pos > 0 && s != 1) return DSATTN_ERR_UNSUPPORTED;     /* no chunked prefill */
    if ((size_t)seq->pos + s > seq->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mla_layer_w *L = &m->layer[l];
    dsattn_mla_layer_s *S = &seq->layer[l];
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads;
    const size_t dn = (size_t)c->nope, dr = (size_t)c->rope, dv = (size_t)c->v_dim;
    const size_t KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const int64_t start = seq->pos;
    const size_t end = (size_t)start + s;
    const int v3 = !c->dsa;
    const int naive = seq->fmt == DSATTN_MLA_CACHE_NAIVE;
    /* V3.2 runs its MHA path whenever the chunk has more than one token
     * (the reference passes a mask exactly then); V3 and V3.2 decode read
     * the cache in its own format. */
    const int mha_fresh = c->dsa && s > 1;
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
    fwd_buf b;
    const int rows_ok = fwd_buf_rows(&b, ws, c, s, need_expanded);
    if (c->dsa) {
        b.qc = dsattn_ws_arrayz(ws, s, Hi * Di * sizeof(float));
        b.wq = dsattn_ws_arrayz(ws, s, Hi * sizeof(float));
        b.score = dsattn_ws_array(ws, end, sizeof(float));   /* written before read */
    }
    if (!rows_ok || (c->dsa && (!b.qc || !b.wq || !b.score))) {
        st = DSATTN_ERR_NOMEM;
        goto done;
    }

    /* ---- query: q_norm(wq_a x) -> wq_b, RoPE on each head's rope tail */
    dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);
    if ((st = mla_query_rows(ctx, m, l, x, s, start, NULL, &b))) goto done;
    dsattn_phase_end(ctx, &pm);

    /* ---- latent: kv_norm(wkv_a x [:KL]) | RoPE(k_pe) */
    dsattn_phase_begin(ctx, DSATTN_PHASE_KV, &pm);
    if ((st = mla_latent_rows(ctx, m, l, x, s, start, NULL, &b))) goto done;

    /* ---- expanded K/V of this chunk (naive cache, V3.2 prefill) */
    if (need_expanded) {
        if ((st = dsattn_linear(ctx, &L->wkv_b, b.kv, KL + dr, s, b.kvb, H * (dn + dv),
                                DSATTN_OUT_BF16, aq, b.aqs)))
            goto done;
    }

    /* ---- cache write */
    for (size_t t = 0; t < s; t++)
        cache_write(seq, l, (size_t)start + t, b.kv + t * (KL + dr),
                    naive ? b.kvb + t * H * (dn + dv) : NULL);

    dsattn_phase_end(ctx, &pm);

    /* ---- V3.2: the lightning indexer's selection per row */
    const size_t width = c->dsa ? DSATTN_MIN((size_t)c->index_topk, end) : 0;
    size_t *nsel = NULL;
    dsattn_phase_begin(ctx, DSATTN_PHASE_INDEX, &pm);
    if (c->dsa) {
        if ((st = dsattn_mla_index_qk(ctx, m, l, x, b.qr, s, start, b.qc, b.wq, S->kidx, ws)))
            goto done;
        if (!grow((void **)&S->sel, &S->sel_cap, s * width + 1, sizeof(int32_t))) {
            st = DSATTN_ERR_NOMEM;
            goto done;
        }
        nsel = dsattn_ws_arrayz(ws, s, sizeof *nsel);
        if (!nsel) { st = DSATTN_ERR_NOMEM; goto done; }
        for (size_t t = 0; t < s; t++) {
            const size_t nvis = (size_t)start + t + 1;
            dsattn_mla_index_scores(ctx, b.qc + t * Hi * Di, b.wq + t * Hi, Hi, Di, S->kidx,
                                    nvis, b.score, ws);
            nsel[t] = select_row(b.score, nvis, (size_t)c->index_topk, width,
                                 S->sel + t * width);
        }
        S->sel_rows = s;
        S->sel_w = width;
    }
    dsattn_phase_end(ctx, &pm);

    /* ---- attention, row by row */
    const int sparse = c->dsa && !c->force_dense;
    const int absorbed = !naive && !mha_fresh;
    if (absorbed) {
        b.qa = dsattn_ws_arrayz(ws, s, H * KL * sizeof(float));
        b.xo = dsattn_ws_arrayz(ws, s, H * KL * sizeof(float));
        if (!b.qa || !b.xo) { st = DSATTN_ERR_NOMEM; goto done; }
        float *qpe = dsattn_ws_arrayz(ws, s, H * dr * sizeof(float));
        if (!qpe) { st = DSATTN_ERR_NOMEM; goto done; }
        dsattn_phase_begin(ctx, DSATTN_PHASE_QUERY, &pm);           /* W_uk */
        for (size_t t = 0; t < s && !st; t++) {
            st = absorb_q(ctx, m, l, b.q + t * H * dqk, 1, b.qa + t * H * KL, ws);
            for (size_t h = 0; h < H; h++)
                memcpy(qpe + (t * H + h) * dr, b.q + (t * H + h) * dqk + dn, dr * sizeof(float));
        }
        dsattn_phase_end(ctx, &pm);
        /* rows in parallel (prefill), or one row with its keys split */
        dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
        const int row_par = !ref && s > 1;
        dsattn_status rst = DSATTN_OK;
#define ABSORBED_ROW(t, nthr, keep)                                                        \
        (ref ? absorbed_row_ref(seq, l, b.qa + (t) * H * KL, qpe + (t) * H * dr,            \
                                sparse ? S->sel + (t) * width : NULL,                      \
                                sparse ? nsel[t] : (size_t)start + (t) + 1, v3,            \
                                b.xo + (t) * H * KL, keep)                                 \
             : absorbed_row_fast(ctx, seq, l, b.qa + (t) * H * KL, qpe + (t) * H * dr,      \
                                 sparse ? S->sel + (t) * width : NULL,                     \
                                 sparse ? nsel[t] : (size_t)start + (t) + 1, v3,           \
                                 b.xo + (t) * H * KL, nthr, keep))
        if (st) {
            /* absorb_q failed: nothing to attend */
        } else if (row_par) {
            /* prefill: rows in parallel, each on one thread */
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->n_threads)
            for (size_t t = 0; t < s; t++) {
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
            for (size_t t = 0; t < s && !rst; t++) rst = ABSORBED_ROW(t, ctx->n_threads, ws);
        }
#undef ABSORBED_ROW
        if (!st) st = rst;
        uint64_t nk = 0;
        for (size_t t = 0; t < s; t++) nk += sparse ? nsel[t] : (uint64_t)start + t + 1;
        dsattn_count(ctx, nk * H * (2ull * (KL + dr) + 2ull * KL), nk * seq->row_bytes);
        dsattn_phase_end(ctx, &pm);
        dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);          /* W_uv */
        for (size_t t = 0; t < s && !st; t++)
            st = absorb_out(ctx, m, l, b.xo + t * H * KL, 1, b.o + t * H * dv, ws);
    } else {
        /* expanded keys: the chunk's own (V3.2 prefill: k_nope and v from
         * wkv_b, the shared k_pe) or the naive cache */
        const kv_view fresh = { b.kvb, b.kv + KL, b.kvb + dn, H * (dn + dv), dn + dv,
                                KL + dr, 0, H * (dn + dv), dn + dv };
        dsattn_status rst = DSATTN_OK;
        dsattn_ws *rws = !ref && s > 1 ? NULL : ws;     /* rows in parallel: the heap */
        dsattn_phase_begin(ctx, DSATTN_PHASE_ATTN, &pm);
#define EXPANDED_ROW(t)                                                                     \
        do {                                                                                \
            const int32_t *idx = sparse ? S->sel + (t) * width : NULL;                      \
            const size_t n = sparse ? nsel[t] : (size_t)start + (t) + 1;                     \
            dsattn_status r = naive                                                         \
                ? naive_row(ctx, seq, l, b.q + (t) * H * dqk, idx, n, v3, b.o + (t) * H * dv, rws) \
                : expanded_row(ctx, c, b.q + (t) * H * dqk, &fresh, idx, n, v3,             \
                               b.o + (t) * H * dv, rws);                                    \
            if (r) {                                                                        \
                _Pragma("omp atomic write")                                                 \
                rst = r;                                                                    \
            }                                                                               \
        } while (0)
        if (!ref && s > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->n_threads)
            for (size_t t = 0; t < s; t++) EXPANDED_ROW(t);
        } else {
            /* no region: a team of one would be allocated every step */
            for (size_t t = 0; t < s; t++) EXPANDED_ROW(t);
        }
#undef EXPANDED_ROW
        st = rst;
        uint64_t nk = 0;
        for (size_t t = 0; t < s; t++) nk += sparse ? nsel[t] : (uint64_t)start + t + 1;
        dsattn_count(ctx, nk * H * 2ull * (dqk + dv), nk * (seq->row_bytes + seq->v_bytes));
        dsattn_phase_end(ctx, &pm);
        dsattn_phase_begin(ctx, DSATTN_PHASE_OUTPUT, &pm);
    }
    if (!st) st = dsattn_linear(ctx, &L->wo, b.o, H * dv, s, out, dim, DSATTN_OUT_BF16, aq, b.aqs);
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
    latent_row(s, layer, pos, kv, pe);
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
    /* the byte counts seq_create recorded as it allocated */
    *b = (dsattn_kv_bill){ .global_bytes_allocated = s->kv_bytes,
                           .scratch_bytes = s->scratch_bytes };
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

/* ==== Batched decode across sequences =================================== */

/* One decode token for each of B sequences of one model, each at its own
 * position.  Every weight product runs once over the B rows: wq_a / wq_b
 * (or wq), wkv_a, the indexer's wq_b / wk / weights_proj, the absorption
 * products with wkv_b (absorb_q / absorb_out decode each weight row once
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
    dsattn_ws_need(&t, (size_t)DSATTN_MAX(nth, 1), absorb_ws_per(KL, B));
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
    void *p = dsattn_ctx_batch_scratch(ctx, bytes);
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
                                     s->m->has_weights };
    return 1;
}

/* Every check before anything is written: the sequences' (batch_common.c),
 * then the layer.  A status and in *failed (when given) the first bad
 * sequence, SIZE_MAX when the fault is not a sequence's. */
static dsattn_status batch_check(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs, size_t B,
                                 int l, const void *x, const void *out, size_t *failed)
{
    size_t bad;
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, B, batch_seq_info, x, out, &bad);
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
 * that is dropped), far less decode work than absorb_out's per-row dots.
 * Otherwise (reference mode, small B, shapes the grouped form refuses)
 * absorb_out. */
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
    return absorb_out(ctx, m, l, x, nr, o, wa);
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
    fwd_buf b;
    const int rows_ok = fwd_buf_rows(&b, bw, c, B, n_naive > 0);
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
    if ((st = mla_query_rows(ctx, m, l, x, B, 0, seqs, &b))) goto done;
    for (size_t t = 0; t < B * H; t++) memcpy(qpe + t * dr, b.q + t * dqk + dn, dr * sizeof(float));
    dsattn_phase_end(ctx, &pm);

    /* ---- latent rows, expanded K/V for NAIVE rows, cache writes */
    dsattn_phase_begin(ctx, DSATTN_PHASE_KV, &pm);
    if ((st = mla_latent_rows(ctx, m, l, x, B, 0, seqs, &b))) goto done;
    if (n_naive && (st = dsattn_linear(ctx, &L->wkv_b, b.kv, KL + dr, B, b.kvb, H * (dn + dv),
                                       DSATTN_OUT_BF16, aq, b.aqs)))
        goto done;
    for (size_t t = 0; t < B; t++)
        cache_write(seqs[t], l, (size_t)seqs[t]->pos, b.kv + t * (KL + dr),
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
            if (!score || !grow((void **)&S->sel, &S->sel_cap, width + 1, sizeof(int32_t))) {
                st = DSATTN_ERR_NOMEM;
            } else {
                dsattn_mla_index_scores(ctx, b.qc + t * Hi * Di, b.wq + t * Hi, Hi, Di, S->kidx,
                                        nvis, score, ws);
                nsel[t] = select_row(score, nvis, (size_t)c->index_topk, width, S->sel);
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
        if ((st = absorb_q(ctx, m, l, b.q, B, b.qa, bw))) goto done;
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
            r_ = naive_row(ctx, sq_, l, b.q + (t) * H * dqk, idx_, n_, v3,                  \
                           b.o + (t) * H * dv, &sq_->ws);                                   \
        else if (ref)                                                                       \
            r_ = absorbed_row_ref(sq_, l, b.qa + (t) * H * KL, qpe + (t) * H * dr, idx_, n_, \
                                  v3, b.xo + (t) * H * KL, &sq_->ws);                       \
        else                                                                                \
            r_ = absorbed_row_fast(ctx, sq_, l, b.qa + (t) * H * KL, qpe + (t) * H * dr,    \
                                   idx_, n_, v3, b.xo + (t) * H * KL, nthr, &sq_->ws);      \
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
        if (!ref && sq->fmt != DSATTN_MLA_CACHE_NAIVE && row_threads(n, nth) > 1)
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
            if (ref || sq->fmt == DSATTN_MLA_CACHE_NAIVE || row_threads(n, nth) <= 1)       \
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
