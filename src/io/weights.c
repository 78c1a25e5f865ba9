/* weights.c - the scalar reference side of dsattn_weight: release, row
 * decode and a double-accumulating GEMV.  This is the ground truth the
 * fast FP8/FP4/BF16 GEMV kernels are compared against; it stays slow and
 * obvious on purpose.  Deliberately not here: loading (checkpoint.c) and
 * any SIMD.
 */
#include "weights.h"

#include "internal.h"
#include "numfmt.h"

#include <stdlib.h>

void dsattn_weight_release(dsattn_weight *w)
{
    if (!w) return;
    dsattn_free(w->owned);
    memset(w, 0, sizeof *w);
}

int dsattn_weight_row_f32(const dsattn_weight *w, size_t r, float *out)
{
    if (!w || r >= w->rows) return -1;
    const size_t C = w->cols;
    switch (w->kind) {
    case DSATTN_W_F32:
        memcpy(out, (const float *)w->data + r * C, C * sizeof(float));
        break;
    case DSATTN_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * C;
        for (size_t c = 0; c < C; c++) out[c] = dsattn_bf16_to_f32(p[c]);
        break;
    }
    case DSATTN_W_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + r * C;
        const size_t bs = w->block, sc = (C + bs - 1) / bs;
        const float *srow = w->scale + (r / bs) * sc;
        for (size_t c = 0; c < C; c++) out[c] = dsattn_e4m3_to_f32(p[c]) * srow[c / bs];
        break;
    }
    case DSATTN_W_FP4: {
        const uint8_t *p = (const uint8_t *)w->data + r * (C / 2);
        const uint8_t *s = w->scale_e8m0 + r * (C / 32);
        for (size_t c = 0; c < C; c++) {
            uint8_t b = p[c / 2];
            uint8_t code = (c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
            out[c] = dsattn_e2m1_to_f32(code) * dsattn_ue8m0_to_f32(s[c / 32]);
        }
        break;
    }
    default:
        return -1;
    }
    return 0;
}

int dsattn_weight_gemv_ref(const dsattn_weight *w, const float *x, float *y)
{
    float *row = malloc(w->cols * sizeof *row + 1);
    if (!row) return -1;
    for (size_t r = 0; r < w->rows; r++) {
        if (dsattn_weight_row_f32(w, r, row) != 0) {
            free(row);
            return -1;
        }
        double acc = 0;
        for (size_t c = 0; c < w->cols; c++) acc += (double)row[c] * (double)x[c];
        y[r] = (float)acc;
    }
    free(row);
    return 0;
}

size_t dsattn_weight_bytes(const dsattn_weight *w)
{
    size_t n = w->rows * w->cols;
    switch (w->kind) {
    case DSATTN_W_F32:  return 4 * n;
    case DSATTN_W_BF16: return 2 * n;
    case DSATTN_W_FP8: {
        size_t bs = w->block ? w->block : 1;
        return n + 4 * ((w->rows + bs - 1) / bs) * ((w->cols + bs - 1) / bs);
    }
    case DSATTN_W_FP4:  return n / 2 + n / 32;
    }
    return 0;
}
