/* vmath_avx2.c - AVX2 + FMA exp(x - m) with its sum (vmath.h), the avx2
 * table's vmath slot: dsattn_exp256 of simd_avx2.h (the AVX-512 exp's
 * polynomial and bits on 8 lanes; exactly 0 below -104, NaN propagates),
 * the tail through masked loads and stores. */
#include "vmath.h"

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "simd_avx2.h"

float dsattn_exp_sub_sum_avx2(float *x, size_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = dsattn_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    if (i < n) {
        const __m256i k = dsattn_mask256(n - i);
        /* masked-off lanes load 0 and are zeroed before the sum */
        const __m256 v = dsattn_exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), vm));
        _mm256_maskstore_ps(x + i, k, v);
        acc = _mm256_add_ps(acc, _mm256_and_ps(v, _mm256_castsi256_ps(k)));
    }
    return dsattn_hsum256(acc);
}

void dsattn_exp_ftz_avx2(const float *x, size_t n, float *out)
{
    for (size_t i = 0; i < n; i += 8) {
        const __m256i k = dsattn_mask256(n - i);
        _mm256_maskstore_ps(out + i, k, dsattn_exp256_ftz(_mm256_maskload_ps(x + i, k)));
    }
}

static const dsattn_vmath_kern vmath_avx2 = { "avx2", dsattn_exp_sub_sum_avx2 };
const dsattn_vmath_kern *const dsattn_vmath_avx2_ptr = &vmath_avx2;

#else  /* no AVX2 compiler support: no such path */
float dsattn_exp_sub_sum_avx2(float *x, size_t n, float m) { return dsattn_exp_sub_sum_ref(x, n, m); }
void dsattn_exp_ftz_avx2(const float *x, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = x[i] < -69.3f ? 0.0f : expf(x[i]);
}
const dsattn_vmath_kern *const dsattn_vmath_avx2_ptr = 0;
#endif
