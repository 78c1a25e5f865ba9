/* wdequant_avx2.c - E4M3 bytes to fp32 sixteen at a time on AVX2 + F16C
 * (wdequant.h), the avx2 table's wdq slot.
 *
 * The decode of wdequant_avx512.c on 8 lanes (dsattn_e4m3x16_256 of
 * simd_avx2.h): the code's sign and 7 magnitude bits moved into an fp16
 * are the E4M3 value times 2^-8, vcvtph2ps and an exact * 256 give it, the
 * NaN codes (0x7f / 0xff) NaN; times the block scale, one rounding, as the
 * scalar twin (wdequant.c): bit-exact. */
#include "wdequant.h"

#include "numfmt.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "simd_avx2.h"

void dsattn_fp8_row_f32_avx2(const uint8_t *w, const float *scale, size_t bs, size_t k,
                             float *out)
{
    size_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m256 f0, f1, s0, s1;
        dsattn_e4m3x16_256(w + i, &f0, &f1);
        if (bs % 8 == 0) {
            s0 = _mm256_set1_ps(scale[i / bs]);
            s1 = _mm256_set1_ps(scale[(i + 8) / bs]);
        } else {
            float tmp[16];
            for (size_t j = 0; j < 16; j++) tmp[j] = scale[(i + j) / bs];
            s0 = _mm256_loadu_ps(tmp);
            s1 = _mm256_loadu_ps(tmp + 8);
        }
        _mm256_storeu_ps(out + i, _mm256_mul_ps(f0, s0));
        _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(f1, s1));
    }
    for (; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

static const dsattn_wdequant_kern wdequant_avx2 = { "avx2", dsattn_fp8_row_f32_avx2 };
const dsattn_wdequant_kern *const dsattn_wdequant_avx2_ptr = &wdequant_avx2;

#else  /* no AVX2 compiler support: no such path */
void dsattn_fp8_row_f32_avx2(const uint8_t *w, const float *scale, size_t bs, size_t k,
                             float *out)
{
    dsattn_fp8_row_f32_ref(w, scale, bs, k, out);
}
const dsattn_wdequant_kern *const dsattn_wdequant_avx2_ptr = 0;
#endif
