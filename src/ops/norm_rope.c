/* norm_rope.c - RMSNorm, LayerNorm and RoPE (with the YaRN table), exactly
 * as the reference evaluates them; the window index rows and the golden
 * cases' stand-in block (norm, attention, residual) built on them.
 *
 * These ops are O(d) per token, so one scalar implementation serves both
 * modes; what matters here is the order of fp32 operations, which follows
 * the reference line by line (docs/reference-mode.md, item 4): RMSNorm
 * var = fp32(sum fp32(x*x))/n - the squares rounded to fp32 first, as the
 * reference's x.square() materialises them -, r = fp32(1/sqrt(var+eps)),
 * y = w*(x*r); RoPE
 * re = a*c - b*s, im = a*s + b*c with the angle fp32(pos)*fp32(freq) and
 * cos/sin correctly rounded from it.  The file is built with
 * -ffp-contract=off, so no step is fused into an FMA.
 */
#include "ops.h"

#include "numfmt.h"

#include <math.h>

static float maybe_bf16(float v, dsattn_out_round round)
{
    return round == DSATTN_OUT_BF16 ? dsattn_round_bf16(v) : v;
}

void dsattn_rmsnorm(const float *x, const float *w, size_t n, float eps,
                    float *y, dsattn_out_round round)
{
    /* x.square() is an fp32 tensor: each square is rounded to fp32 before
     * the reduction sums it (in double, one rounding) - not the exact
     * products a dot product would sum. */
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float sq = x[i] * x[i];
        ss += (double)sq;
    }
    float var = (float)ss / (float)n;
    float r = (float)(1.0 / sqrt((double)(var + eps)));
    for (size_t i = 0; i < n; i++) {
        float v = x[i] * r;
        if (w) v = w[i] * v;
        y[i] = maybe_bf16(v, round);
    }
}

void dsattn_layernorm(const float *x, const float *w, const float *b, size_t n,
                      float eps, float *y, dsattn_out_round round)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += x[i];
    float mean = (float)s / (float)n;
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        float dlt = x[i] - mean;
        ss += (double)dlt * (double)dlt;
    }
    float var = (float)ss / (float)n;
    float r = (float)(1.0 / sqrt((double)(var + eps)));
    for (size_t i = 0; i < n; i++) {
        float v = (x[i] - mean) * r;
        if (w) v = v * w[i];
        if (b) v = v + b[i];
        y[i] = maybe_bf16(v, round);
    }
}

void dsattn_rope_init(dsattn_rope *r, size_t dim, double base, int yarn,
                      double original_seq_len, double factor, double beta_fast,
                      double beta_slow)
{
    size_t half = dim / 2;
    r->dim = dim;
    for (size_t i = 0; i < half && i < 64; i++) {
        float e = (float)(2 * i) / (float)dim;
        float p = (float)pow((double)(float)base, (double)e);
        r->freqs[i] = 1.0f / p;
    }
    if (!yarn || original_seq_len <= 0) return;
    /* corrected_dim and the ramp bounds are Python doubles in the reference */
    double lb = 2.0 * log(base);
    double cd_fast = (double)dim * log(original_seq_len / (beta_fast * 2.0 * M_PI)) / lb;
    double cd_slow = (double)dim * log(original_seq_len / (beta_slow * 2.0 * M_PI)) / lb;
    double low = floor(cd_fast);
    if (low < 0) low = 0;
    double high = ceil(cd_slow);
    if (high > (double)dim - 1) high = (double)dim - 1;   /* dim-1, as upstream */
    double den = high - low;
    if (den < 1e-3) den = 1e-3;
    float fden = (float)den, flow = (float)low, ffac = (float)factor;
    for (size_t i = 0; i < half && i < 64; i++) {
        float ramp = ((float)i - flow) / fden;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        float smooth = 1.0f - ramp;
        float f = r->freqs[i];
        float a = f / ffac;
        float one_minus = 1.0f - smooth;
        r->freqs[i] = a * one_minus + f * smooth;
    }
}

void dsattn_rope_cs(const dsattn_rope *r, int64_t pos, float *c, float *s)
{
    float fp = (float)pos;
    for (size_t i = 0; i < r->dim / 2; i++) {
        float ang = fp * r->freqs[i];
        c[i] = (float)cos((double)ang);
        s[i] = (float)sin((double)ang);
    }
}

void dsattn_rope_apply(float *x, size_t dim, const float *c, const float *s,
                       int interleaved, int inverse, dsattn_out_round round)
{
    size_t half = dim / 2;
    for (size_t i = 0; i < half; i++) {
        float *pa = interleaved ? &x[2 * i] : &x[i];
        float *pb = interleaved ? &x[2 * i + 1] : &x[i + half];
        float a = *pa, b = *pb, cc = c[i], ss = inverse ? -s[i] : s[i];
        float t1 = a * cc, t2 = b * ss;
        float re = t1 - t2;
        float t3 = a * ss, t4 = b * cc;
        float im = t3 + t4;
        *pa = maybe_bf16(re, round);
        *pb = maybe_bf16(im, round);
    }
}

void dsattn_window_idx_prefill(size_t w, size_t s, size_t t, int32_t *row)
{
    size_t width = DSATTN_MIN(s, w);
    size_t start = t + 1 > w ? t + 1 - w : 0;
    for (size_t i = 0; i < width; i++) {
        size_t p = start + i;
        row[i] = p > t ? -1 : (int32_t)p;
    }
}

void dsattn_window_idx_decode(size_t w, int64_t start_pos, int32_t *row)
{
    size_t oldest = (size_t)(start_pos % (int64_t)w) + 1;
    size_t k = 0;
    for (size_t i = oldest; i < w; i++) row[k++] = (int64_t)i > start_pos ? -1 : (int32_t)i;
    for (size_t i = 0; i < oldest; i++) row[k++] = (int64_t)i > start_pos ? -1 : (int32_t)i;
}

void dsattn_window_idx_decode_valid_first(size_t w, int64_t start_pos, int32_t *row)
{
    dsattn_window_idx_decode(w, start_pos, row);
    size_t k = 0;
    for (size_t i = 0; i < w; i++)
        if (row[i] >= 0) row[k++] = row[i];
    for (; k < w; k++) row[k] = -1;
}

dsattn_status dsattn_standin_rows(dsattn_ctx *ctx, void *seq, dsattn_layer_fn layer,
                                  dsattn_norm_fn norm, size_t n_layers, size_t dim, float eps,
                                  float *h, size_t n, float *xin, float *xout, float *attn_in,
                                  float *attn_out)
{
    dsattn_status st = DSATTN_OK;
    for (size_t l = 0; l < n_layers && !st; l++) {
        for (size_t t = 0; t < n; t++)
            dsattn_rmsnorm(h + t * dim, norm(seq, (int)l), dim, eps, xin + t * dim,
                           DSATTN_OUT_BF16);
        if ((st = layer(ctx, seq, (int)l, xin, n, xout))) break;
        for (size_t i = 0; i < n * dim; i++) h[i] = h[i] + xout[i];
        if (attn_in) memcpy(attn_in + l * n * dim, xin, n * dim * sizeof(float));
        if (attn_out) memcpy(attn_out + l * n * dim, xout, n * dim * sizeof(float));
    }
    return st;
}

dsattn_status dsattn_standin_stack(dsattn_ctx *ctx, void *seq, dsattn_layer_fn layer,
                                   dsattn_norm_fn norm, size_t n_layers, size_t dim,
                                   float eps, float *h, size_t n, float *attn_in,
                                   float *attn_out, dsattn_ws *ws)
{
    const dsattn_ws_pos mark = dsattn_ws_mark(ws);
    float *xin = dsattn_ws_arrayz(ws, 2 * n * dim, sizeof(float));
    if (!xin) return DSATTN_ERR_NOMEM;
    dsattn_status st = dsattn_standin_rows(ctx, seq, layer, norm, n_layers, dim, eps, h, n, xin,
                                           xin + n * dim, attn_in, attn_out);
    dsattn_ws_put(ws, xin);
    dsattn_ws_reset(ws, mark);
    return st;
}
