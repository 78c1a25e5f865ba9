/* kernels_ref.c - the scalar reference of every kernel in the table.
 *
 * Contract (docs/reference-mode.md): each product is formed exactly (fp32*fp32
 * fits a double exactly; FP8/FP4 codes times power-of-two scales do too),
 * the sum runs in double, and the result is rounded once to fp32.  This
 * file is compiled with -ffp-contract=off and never gets -m ISA flags.
 * Never delete a function here: the fast paths are tested against it.
 */
#include "kernels.h"

#include "numfmt.h"

static void gemv_f32_ref(const float *W, const float *x, float *y, size_t rows,
                         size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const float *w = W + r * k;
        double acc = 0.0;
        for (size_t i = 0; i < k; i++) acc += (double)w[i] * (double)x[i];
        y[r] = (float)acc;
    }
}

static void gemv_bf16_ref(const uint16_t *W, const float *x, float *y,
                          size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint16_t *w = W + r * k;
        double acc = 0.0;
        for (size_t i = 0; i < k; i++)
            acc += (double)dsattn_bf16_to_f32(w[i]) * (double)x[i];
        y[r] = (float)acc;
    }
}

static void gemv_fp8_ref(const uint8_t *W, const float *scale, size_t bs,
                         size_t ldsc, const float *x, float *y, size_t rows,
                         size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * k;
        const float *sc = scale + (r / bs) * ldsc;
        double acc = 0.0;
        for (size_t i = 0; i < k; i++)
            acc += (double)dsattn_e4m3_to_f32(w[i]) * (double)sc[i / bs] *
                   (double)x[i];
        y[r] = (float)acc;
    }
}

static void gemv_fp4_ref(const uint8_t *W, const uint8_t *scale,
                         const float *x, float *y, size_t rows, size_t k)
{
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * (k / 2);
        const uint8_t *sc = scale + r * (k / 32);
        double acc = 0.0;
        for (size_t i = 0; i < k; i++) {
            uint8_t c = (i & 1) ? (uint8_t)(w[i / 2] >> 4) : (uint8_t)(w[i / 2] & 15);
            acc += (double)dsattn_e2m1_to_f32(c) *
                   (double)dsattn_ue8m0_to_f32(sc[i / 32]) * (double)x[i];
        }
        y[r] = (float)acc;
    }
}

static float dot_f32_ref(const float *a, const float *b, size_t n)
{
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)a[i] * (double)b[i];
    return (float)acc;
}

static void mdot_f32_ref(const float *q, size_t ldq, size_t nh, const float *v,
                         size_t n, float *out)
{
    for (size_t h = 0; h < nh; h++) out[h] = dot_f32_ref(q + h * ldq, v, n);
}

static void maxpy_f32_ref(const float *p, size_t nh, const float *v, size_t n,
                          float *acc, size_t ldacc)
{
    for (size_t h = 0; h < nh; h++) {
        float *a = acc + h * ldacc;
        for (size_t i = 0; i < n; i++)
            a[i] = (float)((double)a[i] + (double)p[h] * (double)v[i]);
    }
}

/* ==== Packed cache rows ================================================ */
/* One element of each row format, exactly as numfmt.c's unpack computes it
 * (an fp32 product of two exact values).  The fused references decode
 * element by element instead of into a buffer: the reference never needs
 * scratch memory, and nh * d decodes are cheap next to the double sums. */

static float fp4e4m3_at(const uint8_t *row, size_t d, size_t i)
{
    uint8_t b = row[i / 2];
    uint8_t c = (i & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
    return dsattn_e2m1_to_f32(c) * dsattn_e4m3_to_f32(row[d / 2 + i / 16]);
}

static float fp4ue8m0_at(const uint8_t *row, size_t d, size_t i)
{
    uint8_t b = row[i / 2];
    uint8_t c = (i & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
    return dsattn_e2m1_to_f32(c) * dsattn_ue8m0_to_f32(row[d / 2 + i / 32]);
}

static float fp8ue8m0_at(const uint8_t *row, size_t d, size_t i)
{
    return dsattn_e4m3_to_f32(row[i]) * dsattn_ue8m0_to_f32(row[d + i / 32]);
}

/* The row loops of kernels_rows_tmpl.h: whole rows decode through
 * numfmt.c's unpackers; dots and axpys take every element exactly from
 * the format's decoder, summed in double and rounded once. */
static inline __attribute__((always_inline)) void
dequant_range(const int fmt, const uint8_t *row, size_t d, size_t i0, size_t n, float *out)
{
    (void)i0;                                   /* whole rows only: i0 = 0, n = d */
    (void)n;
    if (fmt == DSATTN_ROW_FP4E4M3) dsattn_v41_kv_unpack(row, d, out);
    else if (fmt == DSATTN_ROW_FP8UE8M0) dsattn_v41_swa_unpack(row, d, out);
    else dsattn_fp4_index_unpack(row, d, out);
}

static inline __attribute__((always_inline)) float packed_at(const int fmt, const uint8_t *row,
                                                             size_t d, size_t i)
{
    return fmt == DSATTN_ROW_FP4E4M3    ? fp4e4m3_at(row, d, i)
           : fmt == DSATTN_ROW_FP4UE8M0 ? fp4ue8m0_at(row, d, i)
                                        : fp8ue8m0_at(row, d, i);
}

static inline __attribute__((always_inline)) void
mdot_row(const int fmt, const float *q, size_t ldq, size_t nh, const uint8_t *row, size_t d,
         float *out)
{
    for (size_t h = 0; h < nh; h++) {
        double acc = 0.0;
        for (size_t i = 0; i < d; i++)
            acc += (double)q[h * ldq + i] * (double)packed_at(fmt, row, d, i);
        out[h] = (float)acc;
    }
}

static inline __attribute__((always_inline)) void
maxpy_row(const int fmt, const float *p, size_t nh, const uint8_t *row, size_t d, float *acc,
          size_t ldacc)
{
    for (size_t h = 0; h < nh; h++) {
        float *a = acc + h * ldacc;
        for (size_t i = 0; i < d; i++)
            a[i] = (float)((double)a[i] + (double)p[h] * (double)packed_at(fmt, row, d, i));
    }
}

#include "kernels_rows_tmpl.h"

static void maxpy_fp4e4m3_rows_ref(const float *p, size_t ldp, size_t nh,
                                   const uint8_t *const *rows, size_t nr, size_t d,
                                   float *acc, size_t ldacc)
{
    for (size_t h = 0; h < nh; h++) {
        float *a = acc + h * ldacc;
        for (size_t i = 0; i < d; i++) {
            double s = (double)a[i];
            for (size_t r = 0; r < nr; r++)
                s += (double)p[h * ldp + r] * (double)fp4e4m3_at(rows[r], d, i);
            a[i] = (float)s;
        }
    }
}

/* ==== bf16 rows ======================================================== */

static void cvt_bf16_f32_ref(const uint16_t *src, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = dsattn_bf16_to_f32(src[i]);
}

static void mdot_bf16_rows_ref(const float *q, size_t ldq, size_t nh, const uint16_t *rows,
                               size_t ldr, size_t nr, size_t k, float *out, size_t ldo)
{
    for (size_t r = 0; r < nr; r++)
        for (size_t h = 0; h < nh; h++) {
            const float *qh = q + h * ldq;
            const uint16_t *w = rows + r * ldr;
            double acc = 0.0;
            for (size_t i = 0; i < k; i++) acc += (double)qh[i] * (double)dsattn_bf16_to_f32(w[i]);
            out[r * ldo + h] = (float)acc;
        }
}

void dsattn_act_quant_fp8_pow2_ref(const float *x, size_t n, size_t block, float *deq)
{
    dsattn_quant_fp8_ue8m0(x, n, block, NULL, NULL, deq);
}

const dsattn_kernels dsattn_kernels_ref = {
    .name      = "ref",
    .gemv_f32  = gemv_f32_ref,
    .gemv_bf16 = gemv_bf16_ref,
    .gemv_fp8  = gemv_fp8_ref,
    .gemv_fp8_finite = gemv_fp8_ref,   /* same function: no NaN code, same result */
    .act_quant_fp8_pow2 = dsattn_act_quant_fp8_pow2_ref,
    .gemv_fp4  = gemv_fp4_ref,
    .dot_f32   = dot_f32_ref,
    .mdot_f32  = mdot_f32_ref,
    .maxpy_f32            = maxpy_f32_ref,
    ROWS_TABLE_ENTRIES(mdot_fp4e4m3_rows_each, maxpy_fp4e4m3_rows_ref),
    .cvt_bf16_f32         = cvt_bf16_f32_ref,
    .mdot_bf16_rows       = mdot_bf16_rows_ref,
};
