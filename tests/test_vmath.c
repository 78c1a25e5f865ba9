/* test_vmath.c - the vectorised exp against expf: every float input class
 * (normal, near overflow, subnormal results, -inf, NaN) and every tail. */
#include "harness.h"

#include "kernels.h"
#include "vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double ulp_diff(float a, float b)
{
    if (a == b) return 0;
    if (isnan(a) || isnan(b)) return INFINITY;
    return fabs((double)a - b) / (double)fmaxf(nextafterf(fabsf(b), INFINITY) - fabsf(b), 1e-45f);
}

DSATTN_TEST(vmath, exp_sub_sum_avx512_within_2ulp)
{
    if (!dsattn_cpu_has_avx512()) { dsattn_test_skip("no AVX-512"); return; }
    dsattn_rng r = { 5 };
    enum { N = 4099 };
    static float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = dsattn_rng_uniform(&r) * 100.0f - 40.0f;
    a[0] = -INFINITY; a[1] = 88.7f; a[2] = -87.5f; a[3] = -100.0f; a[4] = 0.0f; a[5] = -0.0f;
    a[6] = NAN; a[7] = -104.5f; a[8] = 1e-8f;
    for (size_t n = 0; n <= 40; n++) {                    /* every tail */
        memcpy(b, a + 9, n * sizeof(float));
        float s_ref = dsattn_exp_sub_sum_ref(b, n, 0.0f);
        float c[64];
        memcpy(c, a + 9, n * sizeof(float));
        float s = dsattn_exp_sub_sum_avx512(c, n, 0.0f);
        for (size_t i = 0; i < n; i++) CHECK_MSG(ulp_diff(c[i], b[i]) <= 2, "n %zu [%zu]", n, i);
        CHECK_MSG(fabs((double)s - s_ref) <= 1e-5 * fabs((double)s_ref) + 1e-30, "n %zu sum %.9g ref %.9g", n, (double)s, (double)s_ref);
    }
    memcpy(b, a, sizeof a);
    float m = 10.0f;
    dsattn_exp_sub_sum_ref(b, N, m);
    static float c[N];
    memcpy(c, a, sizeof a);
    dsattn_exp_sub_sum_avx512(c, N, m);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        if (i == 6) { CHECK(isnan(c[i])); continue; }
        double u = ulp_diff(c[i], b[i]);
        if (u > worst) worst = u;
    }
    CHECK_MSG(worst <= 2, "worst %.1f ulp", worst);
    CHECK(c[0] == 0.0f && c[7] == 0.0f);                 /* exp(-inf), far below */
}
