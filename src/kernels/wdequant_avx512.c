/* wdequant_avx512.c - E4M3 bytes to fp32 sixteen at a time (wdequant.h).
 *
 * An E4M3 code s.eeee.mmm moved into fp16 as s.0eeee.mmm0000000 is the
 * value 2^-8 times the E4M3 value, normals and subnormals alike (fp16's
 * extra exponent bit absorbs the bias difference of 8), so vcvtph2ps and
 * one exact multiply by 256 decode it (dsattn_e4m3x16 of simd_avx512.h);
 * the NaN codes (0x7f/0xff) give NaN, as numfmt.c's table. */
#include "wdequant.h"

#include "numfmt.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx512.h"

void dsattn_fp8_row_f32_avx512(const uint8_t *w, const float *scale, size_t bs, size_t k,
                               float *out)
{
    size_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m512 f = dsattn_e4m3x16(w + i);
        __m512 s;
        if (bs % 16 == 0) s = _mm512_set1_ps(scale[i / bs]);
        else {
            float tmp[16];
            for (int j = 0; j < 16; j++) tmp[j] = scale[(i + (size_t)j) / bs];
            s = _mm512_loadu_ps(tmp);
        }
        _mm512_storeu_ps(out + i, _mm512_mul_ps(f, s));
    }
    for (; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

static const dsattn_wdequant_kern wdequant_avx512 = { "avx512", dsattn_fp8_row_f32_avx512 };
const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr = &wdequant_avx512;
#else
void dsattn_fp8_row_f32_avx512(const uint8_t *w, const float *scale, size_t bs, size_t k,
                               float *out)
{
    dsattn_fp8_row_f32_ref(w, scale, bs, k, out);
}
const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr = NULL;
#endif
