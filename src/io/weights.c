/* weights.c - the scalar reference side of dsattn_weight: release, row
 * decode and a double-accumulating GEMV.  This is the ground truth the
 * fast FP8/FP4/BF16 GEMV kernels are compared against; it stays slow and
 * obvious on purpose.  Deliberately not here: loading (checkpoint.c) and
 * any SIMD.
 */
#include "weights.h"

#include "internal.h"
#include "numfmt.h"

#include <math.h>
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

/* ==== Seeded random weights ============================================= */

int dsattn_weight_random(dsattn_weight *w, dsattn_wkind kind, size_t rows, size_t cols,
                         size_t block, float gain, uint64_t seed, dsattn_owned *own)
{
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->kind = kind;
    dsattn_status st;
    if (kind == DSATTN_W_FP8) {
        if (block == 0) return DSATTN_ERR_INVALID_ARG;
        size_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
        uint8_t *p = dsattn_alloc_array(rows, cols);
        float *scale = dsattn_alloc_array(sr * sc, sizeof(float));
        if ((st = dsattn_owned_add(own, p))) { dsattn_free(scale); return st; }
        if ((st = dsattn_owned_add(own, scale))) return st;
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < rows; r++) {
            uint64_t s = (seed ^ ((r + 1) * 0x9e3779b97f4a7c15ull)) | 1;
            for (size_t i = 0; i < cols; i += 8) {
                uint64_t v = dsattn_weight_rng_next(&s);
                for (size_t j = 0; j < 8 && i + j < cols; j++) {
                    uint8_t b = (uint8_t)(v >> (8 * j));
                    p[r * cols + i + j] = (uint8_t)((b & 0x80) | (((b >> 3) & 7) + 4) << 3 | (b & 7));
                }
            }
        }
        /* RMS of such codes is ~10 */
        float sv = dsattn_pow2_ceil(gain / (10.0f * sqrtf((float)cols)));
        for (size_t i = 0; i < sr * sc; i++) scale[i] = sv;
        w->block = block;
        w->data = p;
        w->scale = scale;
        w->finite = 1;                  /* exponent field 4..11: never NaN */
        return DSATTN_OK;
    }
    if (kind != DSATTN_W_BF16 && kind != DSATTN_W_F32) return DSATTN_ERR_UNSUPPORTED;
    const int f32 = kind == DSATTN_W_F32;
    void *p = dsattn_alloc_array(rows * cols, f32 ? 4 : 2);
    if ((st = dsattn_owned_add(own, p))) return st;
    const float sd = gain / sqrtf((float)cols);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        uint64_t s = (seed ^ ((r + 1) * 0x9e3779b97f4a7c15ull)) | 1;
        for (size_t i = 0; i < cols; i++) {
            float v = dsattn_weight_rng_normal(&s) * sd;
            if (f32) ((float *)p)[r * cols + i] = dsattn_round_bf16(v);
            else ((uint16_t *)p)[r * cols + i] = dsattn_f32_to_bf16(v);
        }
    }
    w->data = p;
    return DSATTN_OK;
}

int dsattn_vec_random(float **out, size_t n, float base, float jitter, int bf16,
                      uint64_t seed, dsattn_owned *own)
{
    float *v = dsattn_alloc_array(n, sizeof(float));
    dsattn_status st = dsattn_owned_add(own, v);
    if (st) return st;
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        float x = base + jitter * dsattn_weight_rng_normal(&s);
        v[i] = bf16 ? dsattn_round_bf16(x) : x;
    }
    *out = v;
    return DSATTN_OK;
}
