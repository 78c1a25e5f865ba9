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
