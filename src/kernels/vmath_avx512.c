/* vmath_avx512.c - AVX-512 exp(x - m) with sum (vmath.h).
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split in a
 * high and a low part so r is exact to ~2^-30), exp(r) by the Cephes
 * minimax polynomial on [-ln2/2, ln2/2], 2^n applied with vscalefps (which
 * also produces subnormals).  Inputs below -104 give exactly 0 (exp(-inf)
 * = 0, as the softmax masks need); NaN propagates. */
#include "vmath.h"

#include <math.h>

#if defined(__x86_64__)
#include <immintrin.h>

static inline __m512 exp512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(88.72283935546875f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    __m512 y = _mm512_scalef_ps(p, n);
    y = _mm512_mask_mov_ps(y, tiny, _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, nan, x);
}

float dsattn_exp_sub_sum_avx512(float *x, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, v);
        acc = _mm512_add_ps(acc, v);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, v);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, v));
    }
    return _mm512_reduce_add_ps(acc);
}

#else
float dsattn_exp_sub_sum_avx512(float *x, size_t n, float m) { return dsattn_exp_sub_sum_ref(x, n, m); }
#endif
