/* attn_common.c - the parts of Attention.forward that V4 (CSA/HCA) and
 * V4.1 (CSA2) compute the same way, written once: the low-rank query, the
 * sliding-window KV projection and the grouped output projection.
 *
 * Generation differences are flags of the caller's dsattn_attn_layer, not
 * copies: V4 rescales each query head by its RMS (V4.1 dropped it); the FP8
 * activation block of the Linears is 128 in V4, 32 in V4.1.
 *
 * Not here: the lightning indexer's queries and head weights (indexer.c),
 * and anything that touches a cache or a sequence (window packing,
 * compressors, top-k), which stays with each generation.
 */
#include "ops.h"

#include "numfmt.h"

#include <math.h>

size_t dsattn_attn_aq_scratch(size_t s, size_t max_cols)
{
    return s * max_cols;
}

/* q_h *= rsqrt(mean(q_h^2) + eps) with bf16 tensors, as
 * `q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)` evaluates:
 * q.square() is a bf16 tensor (each square rounded), the mean is a
 * reduction (double accumulation, one rounding to fp32, then the division)
 * held as bf16, + eps and rsqrt each give a bf16 tensor, and the product is
 * rounded to bf16. */
static void head_rms_bf16(float *q, size_t D, float eps)
{
    double ss = 0.0;
    for (size_t i = 0; i < D; i++) ss += (double)dsattn_round_bf16(q[i] * q[i]);
    float mean = dsattn_round_bf16((float)ss / (float)D);
    float t = dsattn_round_bf16(mean + eps);
    float r = dsattn_round_bf16((float)(1.0 / sqrt((double)t)));
    for (size_t i = 0; i < D; i++) q[i] = dsattn_round_bf16(q[i] * r);
}

dsattn_status dsattn_attn_query(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                const dsattn_attn_rows *r, const float *x, float *qr,
                                float *q)
{
    const size_t dim = a->wq_a->cols, QL = a->wq_a->rows, s = r->n;
    dsattn_status st;
    if ((st = dsattn_linear(ctx, a->wq_a, x, dim, s, qr, QL, DSATTN_OUT_BF16, &a->aq, r->aqs)))
        return st;
    for (size_t t = 0; t < s; t++)
        dsattn_rmsnorm(qr + t * QL, a->q_norm, QL, a->eps, qr + t * QL, DSATTN_OUT_BF16);
    return q ? dsattn_attn_query_heads(ctx, a, r, qr, q) : DSATTN_OK;
}

dsattn_status dsattn_attn_query_heads(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                      const dsattn_attn_rows *r, const float *qr, float *q)
{
    const size_t QL = a->wq_a->rows, s = r->n;
    const size_t H = a->H, D = a->D, rd = a->rd;
    float cs[64], sn[64];
    dsattn_status st;
    if ((st = dsattn_linear(ctx, a->wq_b, qr, QL, s, q, H * D, DSATTN_OUT_BF16, &a->aq, r->aqs)))
        return st;
    for (size_t t = 0; t < s; t++) {
        dsattn_rope_cs(a->rope, dsattn_attn_row_pos(r, t), cs, sn);
        for (size_t h = 0; h < H; h++) {
            float *qh = q + (t * H + h) * D;
            if (a->head_rms) head_rms_bf16(qh, D, a->eps);
            dsattn_rope_apply(qh + D - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
        }
    }
    return DSATTN_OK;
}

dsattn_status dsattn_attn_window_kv(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                    const dsattn_attn_rows *r, const float *x, float *kv)
{
    const size_t D = a->D, rd = a->rd;
    float cs[64], sn[64];
    dsattn_status st = dsattn_linear(ctx, a->wkv, x, a->wkv->cols, r->n, kv, D,
                                     DSATTN_OUT_BF16, &a->aq, r->aqs);
    if (st) return st;
    for (size_t t = 0; t < r->n; t++) {
        float *k = kv + t * D;
        dsattn_rmsnorm(k, a->kv_norm, D, a->eps, k, DSATTN_OUT_BF16);
        dsattn_rope_cs(a->rope, dsattn_attn_row_pos(r, t), cs, sn);
        dsattn_rope_apply(k + D - rd, rd, cs, sn, 1, 0, DSATTN_OUT_BF16);
    }
    return DSATTN_OK;
}

dsattn_status dsattn_attn_output(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                 const dsattn_attn_rows *r, float *o, float *oa, float *out)
{
    const size_t s = r->n, H = a->H, D = a->D, rd = a->rd, G = a->G, R = a->R;
    const dsattn_weight *wo_a = a->wo_a;
    float cs[64], sn[64];
    dsattn_status st;
    /* wo_a is a bf16 einsum in the reference (convert.py dequantizes the
     * checkpoint's FP8 wo_a to bf16).  An E4M3 code times a power-of-two
     * block scale is exact in bf16, so running the einsum directly on the
     * FP8 bytes - with NO activation quantization, as an einsum has none -
     * computes the same products while reading half the bytes. */
    if (wo_a->kind != DSATTN_W_BF16 && wo_a->kind != DSATTN_W_F32 &&
        !(wo_a->kind == DSATTN_W_FP8 && R % wo_a->block == 0))
        return DSATTN_ERR_UNSUPPORTED;
    for (size_t t = 0; t < s; t++) {
        dsattn_rope_cs(a->rope, dsattn_attn_row_pos(r, t), cs, sn);
        for (size_t h = 0; h < H; h++)
            dsattn_rope_apply(o + (t * H + h) * D + D - rd, rd, cs, sn, 1, 1, DSATTN_OUT_BF16);
    }
    if (wo_a->rows != G * R) return DSATTN_ERR_INVALID_ARG;
    if ((st = dsattn_linear_grouped(ctx, wo_a, G, o, H * D, H * D / G, s, oa, G * R,
                                    DSATTN_OUT_BF16)))
        return st;
    return dsattn_linear(ctx, a->wo_b, oa, G * R, s, out, a->wo_b->rows, DSATTN_OUT_BF16,
                         &a->aq, r->aqs);
}
