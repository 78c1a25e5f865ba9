/* indexer.c - the lightning indexer's operators of V4 and V4.1, written
 * once: the index queries (i_wq_b, RoPE, V4's Hadamard rotation, FP4 QDQ),
 * the per-head weights, and the index scores (the bf16 ReLU-weighted head
 * sum of q . k over a range of key rows or at listed rows).  The Hadamard
 * rotation is V3.2's too (src/attn/mla_indexer.c); V4.1 has none.
 *
 * Reference mode scores each key with exact products summed in double;
 * fast mode uses the kernel table's dot products, or exact integer dots
 * (kt->index, VNNI) when the keys are FP4 index rows - bit-identical to
 * the reference, so both modes select the same entries.
 *
 * Not here: which keys a layer scores and the top-k over the scores (the
 * generation's run_indexer, src/attn), the FP4 index-key rows (src/quant),
 * the V3.2 indexer's queries and scores (src/attn/mla_indexer.c).
 */
#include "ops.h"

#include "ktab.h"
#include "numfmt.h"

#include <math.h>

void dsattn_hadamard(const float *x, size_t n, float scale, float *y,
                     dsattn_out_round round)
{
    double buf[DSATTN_HADAMARD_MAX];
    if (n > DSATTN_HADAMARD_MAX) n = DSATTN_HADAMARD_MAX;      /* callers check */
    size_t p = 1;                          /* the next power of two: x zero-padded to it */
    while (p < n) p *= 2;
    for (size_t i = 0; i < p; i++) buf[i] = i < n ? x[i] : 0.0;
    for (size_t h = 1; h < p; h *= 2)               /* butterflies, exact */
        for (size_t i = 0; i < p; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                double a = buf[j], b = buf[j + h];
                buf[j] = a + b;
                buf[j + h] = a - b;
            }
    for (size_t i = 0; i < n; i++) {                /* the first n outputs */
        float v = (float)(buf[i] * (double)scale);
        y[i] = round == DSATTN_OUT_BF16 ? dsattn_round_bf16(v) : v;
    }
}

dsattn_status dsattn_index_query(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                 const dsattn_attn_rows *r, const float *qr, float *q)
{
    const size_t Hi = a->Hi, Di = a->Di, rd = a->rd, QL = a->i_wq_b->cols;
    float cs[64], sn[64];
    dsattn_status st = dsattn_linear(ctx, a->i_wq_b, qr, QL, r->n, q, Hi * Di, DSATTN_OUT_BF16,
                                     &a->aq, r->aqs);
    if (st) return st;
    const float hscale = (float)pow((double)Di, -0.5);
    for (size_t t = 0; t < r->n; t++) {
        dsattn_rope_cs(a->rope, dsattn_attn_row_pos(r, t), cs, sn);
        for (size_t h = 0; h < Hi; h++) {
            float *qh = q + (t * Hi + h) * Di;
            dsattn_rope_apply(qh + Di - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
            if (a->hadamard) dsattn_hadamard(qh, Di, hscale, qh, DSATTN_OUT_BF16);
            dsattn_quant_fp4_ue8m0(qh, Di, NULL, NULL, qh);
        }
    }
    return DSATTN_OK;
}

dsattn_status dsattn_index_weights(dsattn_ctx *ctx, const dsattn_weight *wproj,
                                   const float *x, size_t s, size_t Hi, size_t Di,
                                   float *w)
{
    dsattn_status st = dsattn_linear(ctx, wproj, x, wproj->cols, s, w, Hi, DSATTN_OUT_BF16,
                                     NULL, NULL);
    if (st) return st;
    /* softmax_scale * n_heads ** -0.5 is a Python float product, then the
     * bf16 tensor times it rounds to bf16 */
    const float wscale = (float)(pow((double)Di, -0.5) * pow((double)Hi, -0.5));
    for (size_t i = 0; i < s * Hi; i++) w[i] = dsattn_round_bf16(w[i] * wscale);
    return DSATTN_OK;
}

/* ==== Indexer score ===================================================== */

static float index_head_sum(const float *dots, size_t nh, const float *w)
{
    double s = 0.0;
    for (size_t h = 0; h < nh; h++) {
        float dd = dsattn_round_bf16(dots[h]);
        float r = dd > 0.0f ? dd : 0.0f;
        s += (double)dsattn_round_bf16(r * w[h]);
    }
    return dsattn_round_bf16((float)s);
}

static void index_score_one(dsattn_ctx *ctx, const float *q, size_t nh, size_t dh,
                            const float *key, float *dots)
{
    if (ctx->mode == DSATTN_MODE_REFERENCE) {
        for (size_t h = 0; h < nh; h++) {
            double a = 0.0;
            for (size_t i = 0; i < dh; i++) a += (double)q[h * dh + i] * (double)key[i];
            dots[h] = (float)a;
        }
    } else {
        ctx->k->mdot_f32(q, dh, nh, key, dh, dots);
    }
}

/* Fast path: exact integer dots (the table's index slot: AVX-512 VNNI /
 * AMX-INT8, AVX2 or NEON) when the keys are FP4 index rows; bit-identical
 * to the reference, so fast and reference modes select the same entries. */
static int index_scores_vnni(dsattn_ctx *ctx, const float *q, size_t nh, size_t dh,
                             const float *w, const dsattn_kv_src *ksrc,
                             const int32_t *rows, size_t j0, size_t n, float *score)
{
    const dsattn_index_kern *ik = ctx->kt->index;
    if (ctx->mode != DSATTN_MODE_FAST || !ik || ksrc->kind != DSATTN_KV_FP4_IDX ||
        ksrc->d != dh || !ik->ok(nh, dh))
        return 0;
    /* one per thread, reused: no allocation per scored row set */
    static __thread dsattn_index_vnni_q tls_q;
    dsattn_index_vnni_q *p = &tls_q;
    if (!ik->prepare(p, q, nh, dh, w)) return 0;
    /* chunks of 2048 keys, or 2 per thread when there are fewer keys (a
     * V4.1 index layer at 4K scores ~2048: one chunk left the other thread
     * idle for ~100 us per layer); keys score independently, so the cut
     * never changes a bit */
    const size_t nthr = (size_t)DSATTN_MAX(1, ctx->n_threads);
    const size_t chunk = DSATTN_MIN((size_t)2048,
                                    DSATTN_MAX((size_t)256, (n + 2 * nthr - 1) / (2 * nthr)));
    const size_t nc = (n + chunk - 1) / chunk;
#define VNNI_CHUNK(c)                                                                     \
    ik->scores(p, ksrc->base, ksrc->stride, rows ? rows + (c) * chunk : NULL,             \
               j0 + (c) * chunk, DSATTN_MIN(chunk, n - (c) * chunk), score + (c) * chunk)
    if (nc > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->n_threads)
        for (size_t c = 0; c < nc; c++) VNNI_CHUNK(c);
    } else {
        /* no region: libgomp would allocate a team of one every call */
        for (size_t c = 0; c < nc; c++) VNNI_CHUNK(c);
    }
#undef VNNI_CHUNK
    return 1;
}

void dsattn_index_scores_bf16(dsattn_ctx *ctx, const float *q, size_t nh,
                              size_t dh, const float *w,
                              const dsattn_kv_src *ksrc, size_t j0, size_t n,
                              float *score)
{
    dsattn_count(ctx, 2ull * n * nh * dh, n * (uint64_t)ksrc->stride);
    if (index_scores_vnni(ctx, q, nh, dh, w, ksrc, NULL, j0, n, score)) return;
    /* a region only when it has more than one thread: no team of one */
    DSATTN_PARALLEL(n >= 4096 ? ctx->n_threads : 1, {
        size_t jlo_, jhi_;
        dsattn_range(n, dsattn_tid, dsattn_nth, &jlo_, &jhi_);
        for (size_t j = jlo_; j < jhi_; j++) {
            float key[512], dots[256];
            dsattn_kv_row(ksrc, j0 + j, key);
            index_score_one(ctx, q, nh, dh, key, dots);
            score[j] = index_head_sum(dots, nh, w);
        }
    });
}

void dsattn_index_scores_bf16_at(dsattn_ctx *ctx, const float *q, size_t nh,
                                 size_t dh, const float *w,
                                 const dsattn_kv_src *ksrc,
                                 const int32_t *rows, size_t n, float *score)
{
    dsattn_count(ctx, 2ull * n * nh * dh, n * (uint64_t)ksrc->stride);
    if (index_scores_vnni(ctx, q, nh, dh, w, ksrc, rows, 0, n, score)) return;
    DSATTN_PARALLEL(n >= 4096 ? ctx->n_threads : 1, {
        size_t jlo_, jhi_;
        dsattn_range(n, dsattn_tid, dsattn_nth, &jlo_, &jhi_);
        for (size_t j = jlo_; j < jhi_; j++) {
            float key[512], dots[256];
            dsattn_kv_row(ksrc, (size_t)rows[j], key);
            index_score_one(ctx, q, nh, dh, key, dots);
            score[j] = index_head_sum(dots, nh, w);
        }
    });
}
