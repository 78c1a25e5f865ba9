/* vmath.c - scalar reference of vmath.h and the runtime choice. */
#include "vmath.h"

#include "kernels.h"

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

dsattn_exp_sub_sum_fn dsattn_exp_sub_sum_best(void)
{
#if defined(__x86_64__)
    if (dsattn_cpu_has_avx512()) return dsattn_exp_sub_sum_avx512;
#endif
    return dsattn_exp_sub_sum_ref;
}
