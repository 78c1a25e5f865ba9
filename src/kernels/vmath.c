/* vmath.c - scalar reference of vmath.h and its table (the ktab slot). */
#include "vmath.h"

#include <math.h>

float dsattn_exp_sub_sum_ref(float *x, size_t n, float m)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

const dsattn_vmath_kern dsattn_vmath_ref = { "ref", dsattn_exp_sub_sum_ref };

#if defined(__x86_64__)
static const dsattn_vmath_kern vmath_avx512 = { "avx512", dsattn_exp_sub_sum_avx512 };
const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr = &vmath_avx512;
#else
const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr = NULL;
#endif
