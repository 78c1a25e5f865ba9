/* mla_attend.c - the attention of MLA (V3) and MLA + DSA (V3.2) query rows
 * over a sequence's cache, every path, and the absorption products around
 * it.
 *
 *   dsattn_mla_absorb_q / _absorb_out  q' = bf16(q_nope . W_uk) and
 *        o = bf16(x . W_uv) for nr rows, each wkv_b row decoded once for all
 *        rows (a prefill chunk, or a batched step's B sequences)
 *   dsattn_mla_absorbed_row_ref        one absorbed row in reference mode
 *        (exact products, double sums, one rounding: docs/reference-mode.md)
 *   dsattn_mla_absorbed_row_fast       the same in fast mode: the latent
 *        cache streamed once for all heads in blocks, online softmax, keys
 *        split over threads; on the heads-in-lanes FMA tiles (mla_kernels.h),
 *        the bf16 attention blocks (AMX-BF16 tiles or VDPBF16PS, amx_attn.h)
 *        where the rows are bf16 numbers, else sgemm for Q.K^T and P.V
 *   dsattn_mla_naive_row / _expanded_row  the naive (expanded K / V) cache
 * The arithmetic each path keeps (where the reference rounds to bf16) is
 * in mla_forward.c's header; the layer forward there (and the batched step
 * in mla_batch.c) calls these row by row.
 */
#include "mla.h"

#include "ktab.h"
#include "numfmt.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ==== Cache rows ======================================================== */

/* latent row j -> kv[KL] and pe[dr] (either may be NULL) */
void dsattn_mla_latent_row(const dsattn_mla_seq *s, int l, size_t j, float *kv, float *pe)
{
    const dsattn_mla_config *c = &s->m->cfg;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const uint8_t *row = s->layer[l].cache + j * s->row_bytes;
    if (s->fmt == DSATTN_MLA_CACHE_LATENT_BF16) {
        if (kv) for (size_t i = 0; i < KL; i++) kv[i] = dsattn_mla_get_bf16(row + 2 * i);
        if (pe) for (size_t i = 0; i < dr; i++) pe[i] = dsattn_mla_get_bf16(row + 2 * (KL + i));
    } else {
        float buf[4096 + 128];
        dsattn_v32_kv_unpack(row, KL, dr, buf);
        if (kv) memcpy(kv, buf, KL * sizeof(float));
        if (pe) memcpy(pe, buf + KL, dr * sizeof(float));
    }
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

/* Row set of a query: idx (positions) or, if NULL, 0..n-1. */
static inline size_t key_at(const int32_t *idx, size_t i) { return idx ? (size_t)idx[i] : i; }

/* ==== W_uk absorption and the W_uv output =============================== */

/* Fast mode's dsattn_mla_weight_row_bf16: FP8 rows through the SIMD row
 * dequant (wdequant.h: the same exact fp32 products code * block scale),
 * then the same bf16 rounding; other kinds fall back to the shared one.
 * Per decode step dsattn_mla_absorb_q and dsattn_mla_absorb_out dequantize all of wkv_b (16.8 M
 * values for V3), which the scalar path spent ~70 ms on. */
/* FP8 weight row r: its codes, and in *scale its row of block scales */
static inline const uint8_t *weight_fp8_row(const dsattn_weight *W, size_t r,
                                            const float **scale)
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
    const uint8_t *codes = weight_fp8_row(w, r, &sc);
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

/* One thread's scratch of dsattn_mla_absorb_q / dsattn_mla_absorb_out over nr rows: nr * KL
 * doubles (the rows' accumulators) + KL floats (a dequantized weight row). */
size_t dsattn_mla_absorb_ws_per(size_t KL, size_t nr)
{
    return (KL * (nr * sizeof(double) + sizeof(float)) + 63) / 64 * 64;
}

/* What dsattn_mla_absorb_q and dsattn_mla_absorb_out both set up: the path (reference, or the
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
dsattn_status dsattn_mla_absorb_q(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *q,
                                  size_t nr, float *qa, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_weight *W = &m->layer[l].wkv_b;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope, dr = (size_t)c->rope;
    const size_t dv = (size_t)c->v_dim, KL = (size_t)c->kv_lora_rank, dqk = dn + dr;
    /* per thread: acc [nr, KL] doubles, wr [KL] floats */
    absorb_run ab;
    if (absorb_begin(ctx, W, dsattn_mla_absorb_ws_per(KL, nr), wa, &ab)) return DSATTN_ERR_NOMEM;
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
                            w4[k] = weight_fp8_row(W, h * (dn + dv) + d0 + (size_t)k, &s4[k]);
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
                        const uint8_t *codes = weight_fp8_row(W, row, &sc);
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
dsattn_status dsattn_mla_absorb_out(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                    size_t nr, float *o, dsattn_ws *wa)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_weight *W = &m->layer[l].wkv_b;
    const size_t H = (size_t)c->n_heads, dn = (size_t)c->nope;
    const size_t dv = (size_t)c->v_dim, KL = (size_t)c->kv_lora_rank;
    absorb_run ab;
    if (absorb_begin(ctx, W, dsattn_mla_absorb_ws_per(KL, 1), wa, &ab)) return DSATTN_ERR_NOMEM;
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
                        w4[k] = weight_fp8_row(W, h * (dn + dv) + dn + d0 + (size_t)k, &s4[k]);
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
                    codes = weight_fp8_row(W, row, &sc);
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

/* The scratch of a one-query-row reference (dsattn_mla_absorbed_row_ref,
 * dsattn_mla_expanded_row): nf floats and nd doubles from wa (or the heap), given back
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
dsattn_status dsattn_mla_absorbed_row_ref(const dsattn_mla_seq *s, int l, const float *qa,
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
            dsattn_mla_latent_row(s, l, key_at(idx, i), k, k + KL);
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
            dsattn_mla_latent_row(s, l, key_at(idx, i), k, k + KL);
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
                for (size_t t = 0; t < dr; t++) o[KL + t] = dsattn_mla_get_bf16(rp + 2 * t);
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
int dsattn_mla_row_threads(size_t n, int n_threads)
{
    int nt = DSATTN_MAX(n_threads, 1);
    if ((size_t)nt > n / 512) nt = (int)DSATTN_MAX(n / 512, 1);
    return nt;
}

/* Scratch of absorbed_row_tiled with nt threads: per thread m, l, alpha
 * [hp], acc^T [KL, hp], the block [MT_BLOCK, D], scores [MT_BLOCK, hp],
 * KT decoded rows; the packed and plain queries; 2 MT_BLOCK row pointers
 * per thread, from a whole 64 bytes on (an odd latent or rope width makes
 * the float count odd; the pointers need their own alignment). */
size_t dsattn_mla_tiled_ws_bytes(size_t H, size_t KL, size_t dr, int nt, size_t *per_out,
                                 size_t *wsf_out)
{
    const size_t D = KL + dr, hp = (H + 15) / 16 * 16;
    const size_t per = 3 * hp + KL * hp + MT_BLOCK * D + MT_BLOCK * hp + DSATTN_MLA_KT * D;
    const size_t wsf = ((size_t)nt * per + hp * D + H * D + 15) / 16 * 16;  /* then pointers */
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
    const int nt = dsattn_mla_row_threads(n, n_threads);
    size_t per, wsf;
    const size_t bytes = dsattn_mla_tiled_ws_bytes(H, KL, dr, nt, &per, &wsf);
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
size_t dsattn_mla_amx_ws_bytes(size_t H, size_t KL, size_t dr, int fp8, int nt, size_t *part_out,
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
    const int nt = dsattn_mla_row_threads(n, n_threads);
    size_t part, per;
    const size_t bytes = dsattn_mla_amx_ws_bytes(H, KL, dr, fp8, nt, &part, &per);
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
size_t dsattn_mla_generic_ws_bytes(size_t H, size_t KL, size_t dr, int nt, size_t *per_out)
{
    const size_t D = KL + dr, per = 2 * H + H * KL + AB_BLOCK * D + H * AB_BLOCK;
    if (per_out) *per_out = per;
    return ((size_t)nt * per + H * D) * sizeof(float);
}

dsattn_status dsattn_mla_absorbed_row_fast(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l,
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
    const int nt = dsattn_mla_row_threads(n, n_threads);
    size_t per;
    const dsattn_ws_pos wmark = dsattn_ws_mark(wa);
    float *ws = dsattn_ws_get(wa, dsattn_mla_generic_ws_bytes(H, KL, dr, nt, &per));
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

/* One query row over expanded keys: q [H, dqk]; keys idx or 0..n-1.
 * v3: bf16 score arithmetic (V3 naive); else fp32 (V3.2).  o [H, dv]. */
dsattn_status dsattn_mla_expanded_row(dsattn_ctx *ctx, const dsattn_mla_config *c, const float *q,
                                      const dsattn_mla_kv_view *kv, const int32_t *idx, size_t n,
                                      int v3, float *o, dsattn_ws *wa)
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
dsattn_status dsattn_mla_naive_row(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l, const float *q,
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
    const dsattn_mla_kv_view kv = { kh, kh + dn, vh, dqk, 0, dqk, 0, dv, 0 };
    dsattn_status st = DSATTN_OK;
    for (size_t h = 0; h < H && !st; h++) {
        for (size_t i = 0; i < n; i++) {
            const size_t j = key_at(idx, i);
            const uint8_t *kr = s->layer[l].cache + j * s->row_bytes + 2 * h * dqk;
            const uint8_t *vr = s->layer[l].v + j * s->v_bytes + 2 * h * dv;
            for (size_t t = 0; t < dqk; t++) kh[i * dqk + t] = dsattn_mla_get_bf16(kr + 2 * t);
            for (size_t t = 0; t < dv; t++) vh[i * dv + t] = dsattn_mla_get_bf16(vr + 2 * t);
        }
        st = dsattn_mla_expanded_row(ctx, &c1, q + h * dqk, &kv, NULL, n, v3, o + h * dv, wa);
    }
    dsattn_ws_put(wa, kh);
    dsattn_ws_reset(wa, wmark);
    return st;
}
