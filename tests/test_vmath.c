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

#include "numfmt.h"
#include "wdequant.h"

DSATTN_TEST(vmath, fp8_weight_row_dequant_exact)
{
    /* every non-NaN code, several block sizes and ragged tails: bit-exact */
    uint8_t w[300];
    float sc[16], a[300], b[300];
    for (int i = 0; i < 300; i++) {
        w[i] = (uint8_t)(i * 7 + 3);
        if ((w[i] & 0x7f) == 0x7f) w[i] = 0x01;
    }
    for (int i = 0; i < 16; i++) sc[i] = ldexpf(1.0f + (float)(i % 3) * 0.25f, i - 8);
    const size_t bss[3] = { 32, 128, 24 };
    for (int t = 0; t < 3; t++)
        for (size_t k = 1; k <= 300; k += 37) {
            dsattn_fp8_row_f32_ref(w, sc, bss[t], k, a);
            dsattn_fp8_row_best()(w, sc, bss[t], k, b);
            CHECK_BITS("fp8 row", b, a, k);
        }
}
