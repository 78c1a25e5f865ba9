/* exp_avx512.h - the one AVX-512 exp, inlined into every kernel that needs
 * it (vmath_avx512.c's exp-sub-sum, the MLA tile softmax, the MHA/GQA
 * attend kernel), so its tile loops keep it in registers.
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split in a
 * high and a low part so r is exact to ~2^-30), exp(r) by the Cephes
 * minimax polynomial on [-ln2/2, ln2/2] (within 2 ulp of expf), 2^n applied
 * with vscalefps (which also produces subnormals).  Inputs below -104 give
 * exactly 0 (exp(-inf) = 0, as the softmax masks need); NaN propagates.
 * Include only from files compiled for AVX-512 (names ending _avx512.c). */
#ifndef DSATTN_EXP_AVX512_H
#define DSATTN_EXP_AVX512_H

#include <immintrin.h>

static inline __attribute__((always_inline)) __m512 dsattn_exp512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(88.72283935546875f);
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
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

#endif /* DSATTN_EXP_AVX512_H */
