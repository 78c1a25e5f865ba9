/* wdequant.h - FP8 weight rows to fp32, for the prefill path that
 * dequantizes row panels and hands them to sgemm (src/ops/linear.c).
 * Exact: E4M3 -> fp16 by moving bits (then x 256) is lossless, and the
 * block scale is a power of two or an exact fp32 factor. */
#ifndef DSATTN_WDEQUANT_H
#define DSATTN_WDEQUANT_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = e4m3(w[i]) * scale[i / bs], i < k (scale: this row's block scales) */
typedef void (*dsattn_fp8_row_fn)(const uint8_t *w, const float *scale, size_t bs,
                                  size_t k, float *out);

void dsattn_fp8_row_f32_ref(const uint8_t *w, const float *scale, size_t bs, size_t k,
                            float *out);
void dsattn_fp8_row_f32_avx512(const uint8_t *w, const float *scale, size_t bs, size_t k,
                               float *out);
void dsattn_fp8_row_f32_avx2(const uint8_t *w, const float *scale, size_t bs, size_t k,
                             float *out);
/* aarch64 builds only */
void dsattn_fp8_row_f32_neon(const uint8_t *w, const float *scale, size_t bs, size_t k,
                             float *out);
/* The ktab slot (ktab.h): one named row decoder. */
typedef struct dsattn_wdequant_kern {
    const char        *name;                     /* "ref", "avx512", "avx2", "neon" */
    dsattn_fp8_row_fn  fp8_row;
} dsattn_wdequant_kern;

extern const dsattn_wdequant_kern dsattn_wdequant_ref;
/* NULL when the build has no x86-64 path */
extern const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr;
/* wdequant_avx2.c; NULL outside x86-64 builds */
extern const dsattn_wdequant_kern *const dsattn_wdequant_avx2_ptr;
/* wdequant_neon.c; NULL outside aarch64 builds */
extern const dsattn_wdequant_kern *const dsattn_wdequant_neon_ptr;

#endif
