/* test_vmath.c - the vectorised exp against expf: every float input class
 * (normal, near overflow, subnormal results, -inf, NaN) and every tail. */
#include "harness.h"

#include "kernels.h"
#include "ktab.h"

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
    /* the AVX-512 table's vmath slot against its scalar twin */
    const dsattn_ktab *KT = dsattn_test_avx512_ktab();
    if (!KT) return;
    const dsattn_exp_sub_sum_fn fast = KT->vmath->exp_sub_sum;
    CHECK(fast != dsattn_vmath_ref.exp_sub_sum);
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
        float s = fast(c, n, 0.0f);
        for (size_t i = 0; i < n; i++) CHECK_MSG(ulp_diff(c[i], b[i]) <= 2, "n %zu [%zu]", n, i);
        CHECK_MSG(fabs((double)s - s_ref) <= 1e-5 * fabs((double)s_ref) + 1e-30, "n %zu sum %.9g ref %.9g", n, (double)s, (double)s_ref);
    }
    memcpy(b, a, sizeof a);
    float m = 10.0f;
    dsattn_exp_sub_sum_ref(b, N, m);
    static float c[N];
    memcpy(c, a, sizeof a);
    fast(c, N, m);
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

DSATTN_TEST(vmath, softmax_exp_flushes_below_2_pow_minus_100_and_nothing_else)
{
    /* the attention softmaxes' exp: dsattn_exp512's bits where x >= -69.3
     * (checked through exp_sub_sum with m = 0), exactly 0 below, never a
     * subnormal, NaN kept, exp(-inf) = 0 */
#if defined(__x86_64__)
    if (!dsattn_cpu_has_avx512()) { dsattn_test_skip("no AVX-512"); return; }
    enum { N = 4000 };
    static float x[N], y[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = -120.0f + 0.05f * (float)i;      /* -120 .. 80 */
    x[0] = -INFINITY; x[1] = NAN; x[2] = -69.3f; x[3] = nextafterf(-69.3f, -INFINITY);
    x[4] = -87.5f; x[5] = -104.5f; x[6] = 0.0f;
    memcpy(ref, x, sizeof x);
    dsattn_exp_sub_sum_avx512(ref, N, 0.0f);
    dsattn_exp_ftz_avx512(x, N, y);
    size_t sub = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        sub += y[i] != 0.0f && fabsf(y[i]) < 0x1p-126f;
        if (isnan(x[i])) bad += !isnan(y[i]);
        else if (x[i] < -69.3f) bad += y[i] != 0.0f;
        else bad += memcmp(&y[i], &ref[i], sizeof(float)) != 0;
    }
    CHECK_MSG(sub == 0, "%zu subnormal results", sub);
    CHECK_MSG(bad == 0, "%zu results off the rule", bad);
    CHECK(y[2] > 0.0f && y[2] >= 0x1p-100f * 0.99f && y[3] == 0.0f && y[0] == 0.0f);
#else
    dsattn_test_skip("AVX-512 forms exist only in x86-64 builds");
#endif
}

DSATTN_TEST(vmath, fp8_weight_row_decoder_follows_the_table)
{
    /* the ISA override reaches the prefill's row decoder and the softmax
     * exp: only the "avx512" table gets the AVX-512 forms */
    dsattn_ktab t;
    CHECK_OK(dsattn_ktab_fill(&t, DSATTN_ISA_REF, 1));
    CHECK(t.wdq == &dsattn_wdequant_ref && t.vmath == &dsattn_vmath_ref);
    if (dsattn_ktab_fill(&t, DSATTN_ISA_AVX2, 1) == DSATTN_OK)
        CHECK(t.wdq == &dsattn_wdequant_ref && t.vmath == &dsattn_vmath_ref);
    if (dsattn_ktab_fill(&t, DSATTN_ISA_AVX512, 1) == DSATTN_OK && dsattn_wdequant_avx512_ptr) {
        CHECK(t.wdq == dsattn_wdequant_avx512_ptr && t.vmath == dsattn_vmath_avx512_ptr);
#if defined(__x86_64__)
        CHECK(t.wdq->fp8_row == dsattn_fp8_row_f32_avx512);
#endif
    }
}

DSATTN_TEST(vmath, fp8_weight_row_dequant_exact)
{
    /* every code (the NaN codes 0x7f / 0xff give NaN), several block sizes
     * and ragged tails: bit-exact */
    uint8_t w[300];
    float sc[16], a[300], b[300];
    for (int i = 0; i < 300; i++) w[i] = (uint8_t)(i * 7 + 3);
    w[17] = 0x7f;
    w[40] = 0xff;
    for (int i = 0; i < 16; i++) sc[i] = ldexpf(1.0f + (float)(i % 3) * 0.25f, i - 8);
    const size_t bss[3] = { 32, 128, 24 };
    /* the table's slot (AVX-512 where this CPU has it) against the scalar twin */
    dsattn_ktab kt;
    if (dsattn_ktab_fill(&kt, DSATTN_ISA_AVX512, 0) != DSATTN_OK)
        dsattn_ktab_fill(&kt, DSATTN_ISA_REF, 0);
    const dsattn_fp8_row_fn fast = kt.wdq->fp8_row;
    for (int t = 0; t < 3; t++)
        for (size_t k = 1; k <= 300; k += 37) {
            dsattn_fp8_row_f32_ref(w, sc, bss[t], k, a);
            fast(w, sc, bss[t], k, b);
            CHECK_BITS("fp8 row", b, a, k);
        }
}
