/* vmath_avx512.c - AVX-512 exp(x - m) with sum (vmath.h), on the shared
 * exp of simd_avx512.h (Cephes polynomial, vscalefps; exactly 0 below -104,
 * NaN propagates). */
#include "vmath.h"

#include <math.h>

#if defined(__x86_64__)
#include "simd_avx512.h"

float dsattn_exp_sub_sum_avx512(float *x, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = dsattn_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, v);
        acc = _mm512_add_ps(acc, v);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = dsattn_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, v);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, v));
    }
    return _mm512_reduce_add_ps(acc);
}

void dsattn_exp_ftz_avx512(const float *x, size_t n, float *out)
{
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, k, dsattn_exp512_ftz(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

static const dsattn_vmath_kern vmath_avx512 = { "avx512", dsattn_exp_sub_sum_avx512 };
const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr = &vmath_avx512;
#else
float dsattn_exp_sub_sum_avx512(float *x, size_t n, float m) { return dsattn_exp_sub_sum_ref(x, n, m); }
void dsattn_exp_ftz_avx512(const float *x, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = x[i] < -69.3f ? 0.0f : expf(x[i]);
}
const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr = NULL;
#endif
