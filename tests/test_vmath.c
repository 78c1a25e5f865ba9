/* test_vmath.c - the vmath and wdq slots of every table against their
 * scalar twins: the vectorised exp against expf (every float input class:
 * normal, near overflow, subnormal results, -inf, NaN; every tail), the
 * softmaxes' flushing exp, and the FP8 weight-row decoder bit for bit. */
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

/* a table's vmath slot against its scalar twin */
static void run_exp_sub_sum(const dsattn_ktab *KT)
{
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
    /* sums of moderate terms at every tail (a lane past n counted would
     * move them by far more than the bound) */
    for (size_t n = 0; n <= 40; n++) {
        float c[64], d[64];
        for (size_t i = 0; i < n; i++) c[i] = d[i] = -2.0f * dsattn_rng_uniform(&r) - 2.0f;
        float s_ref = dsattn_exp_sub_sum_ref(d, n, -1.0f), s = fast(c, n, -1.0f);
        CHECK_MSG(fabs((double)s - s_ref) <= 1e-5 * fabs((double)s_ref) + 1e-30,
                  "moderate n %zu sum %.9g ref %.9g", n, (double)s, (double)s_ref);
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

DSATTN_TEST(vmath, exp_sub_sum_avx512_within_2ulp) { run_exp_sub_sum(dsattn_test_avx512_ktab()); }
DSATTN_TEST(vmath, exp_sub_sum_avx2_within_2ulp)   { run_exp_sub_sum(dsattn_test_avx2_ktab()); }
DSATTN_TEST(vmath, exp_sub_sum_neon_within_2ulp)   { run_exp_sub_sum(dsattn_test_neon_ktab()); }

/* FNV-1a over the bit patterns of exp on a fixed grid: 120,001 inputs in
 * [-150, 90] (every result class: 0 below the cut, subnormal, normal, near
 * overflow) and the edges -inf, +inf, -0, subnormal inputs, +-200, +-1e30,
 * -FLT_MAX.  The values below are what the AVX-512 and the AVX2 forms give
 * on x86-64, for exp_sub_sum (the vmath slot, exp cut at -104) and for the
 * attention softmaxes' exp (cut at -69.3); every vectorised form a build
 * and CPU have (the NEON one on aarch64, under qemu in CI) must give them
 * too: one exp on every ISA, bit for bit.  NaN is checked apart (its sign
 * and payload are not part of the contract). */
#define EXP_GRID_FNV 0x2300a2fc184367fcull /* the AVX-512 and AVX2 forms, 2026-12-07 */
#define EXP_FTZ_GRID_FNV 0xc1c6dab49f415a7cull /* the same, for the softmaxes' exp */
enum { EXP_GRID_N = 120013 };
static void exp_grid(float *x)
{
    const int n = EXP_GRID_N - 12;
    for (int i = 0; i < n; i++) x[i] = -150.0f + (float)((double)i * (240.0 / (n - 1)));
    const float edge[12] = { -INFINITY, INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 200.0f, -200.0f,
                             1e30f, -1e30f, -3.4028235e38f, 88.72283935546875f };
    memcpy(x + n, edge, sizeof edge);
}


/* the softmaxes' exp of the ISA (tests only), NULL where the build has none */
typedef void (*exp_ftz_fn)(const float *x, size_t n, float *out);
static exp_ftz_fn exp_ftz_of(dsattn_isa isa)
{
#if defined(__x86_64__)
    if (isa == DSATTN_ISA_AVX512) return dsattn_exp_ftz_avx512;
    if (isa == DSATTN_ISA_AVX2) return dsattn_exp_ftz_avx2;
#elif defined(__aarch64__)
    if (isa == DSATTN_ISA_NEON) return dsattn_exp_ftz_neon;
#endif
    (void)isa;
    return NULL;
}

DSATTN_TEST(vmath, exp_is_one_function_on_every_isa)
{
    const dsattn_isa isas[3] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX2, DSATTN_ISA_NEON };
    static float x[EXP_GRID_N], y[EXP_GRID_N];
    int seen = 0;
    for (int k = 0; k < 3; k++) {
        dsattn_ktab t;
        if (dsattn_ktab_fill(&t, isas[k], 0) != DSATTN_OK) continue;
        exp_grid(x);
        t.vmath->exp_sub_sum(x, EXP_GRID_N, 0.0f);
        uint64_t h = dsattn_fnv_bits(DSATTN_FNV_START, x, EXP_GRID_N);
        CHECK_MSG(h == EXP_GRID_FNV, "%s: exp grid hash 0x%016llx, expected 0x%016llx", t.name,
                  (unsigned long long)h, (unsigned long long)EXP_GRID_FNV);
        const exp_ftz_fn ftz = exp_ftz_of(isas[k]);
        CHECK_MSG(ftz != NULL, "%s: no softmax exp", t.name);
        if (ftz) {
            exp_grid(x);
            ftz(x, EXP_GRID_N, y);
            h = dsattn_fnv_bits(DSATTN_FNV_START, y, EXP_GRID_N);
            CHECK_MSG(h == EXP_FTZ_GRID_FNV, "%s: softmax exp grid hash 0x%016llx, expected "
                      "0x%016llx", t.name, (unsigned long long)h,
                      (unsigned long long)EXP_FTZ_GRID_FNV);
        }
        float n[5] = { 1.0f, NAN, 2.0f, -NAN, 3.0f };
        t.vmath->exp_sub_sum(n, 5, 0.0f);
        CHECK_MSG(isnan(n[1]) && isnan(n[3]) && !isnan(n[0]) && !isnan(n[2]) && !isnan(n[4]),
                  "%s: NaN in, NaN out (and only there)", t.name);
        seen++;
    }
    if (!seen) dsattn_test_skip("no vectorised exp in this build and CPU");
}

#include "numfmt.h"
#include "wdequant.h"

/* The attention softmaxes' exp (isa 1: AVX-512, 2: AVX2, 3: NEON): the table's
 * exp bits where x >= -69.3 (checked through its exp_sub_sum with m = 0),
 * exactly 0 below, never a subnormal, NaN kept, exp(-inf) = 0. */
static void run_exp_ftz(int isa)
{
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__aarch64__)
    if (isa != 3) {
        dsattn_test_skip("AVX-512 / AVX2 forms exist only in x86-64 builds");
        return;
    }
#else
    if (isa == 3) {
        dsattn_test_skip("the NEON form exists only in aarch64 builds");
        return;
    }
#endif
    if (isa == 1 ? !dsattn_cpu_has_avx512() : isa == 2 ? !dsattn_cpu_has_avx2() : 0) {
        dsattn_test_skip(isa == 1 ? "no AVX-512" : "no AVX2");
        return;
    }
    enum { N = 4000 };
    static float x[N], y[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = -120.0f + 0.05f * (float)i;      /* -120 .. 80 */
    x[0] = -INFINITY; x[1] = NAN; x[2] = -69.3f; x[3] = nextafterf(-69.3f, -INFINITY);
    x[4] = -87.5f; x[5] = -104.5f; x[6] = 0.0f;
    memcpy(ref, x, sizeof x);
#if defined(__aarch64__)
    dsattn_exp_sub_sum_neon(ref, N, 0.0f);
    dsattn_exp_ftz_neon(x, N, y);
#else
    if (isa == 1) {
        dsattn_exp_sub_sum_avx512(ref, N, 0.0f);
        dsattn_exp_ftz_avx512(x, N, y);
    } else {
        dsattn_exp_sub_sum_avx2(ref, N, 0.0f);
        dsattn_exp_ftz_avx2(x, N, y);
    }
#endif
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
    (void)isa;
    dsattn_test_skip("the vectorised forms exist only in x86-64 and aarch64 builds");
#endif
}

DSATTN_TEST(vmath, softmax_exp_flushes_below_2_pow_minus_100_and_nothing_else)
{
    run_exp_ftz(1);
}

DSATTN_TEST(vmath, softmax_exp_avx2_flushes_below_2_pow_minus_100_and_nothing_else)
{
    run_exp_ftz(2);
}

DSATTN_TEST(vmath, softmax_exp_neon_flushes_below_2_pow_minus_100_and_nothing_else)
{
    run_exp_ftz(3);
}

DSATTN_TEST(vmath, exp_avx2_is_the_avx512_exp_bit_for_bit)
{
    /* one polynomial, one rounding of 2^n: the two tables' exp_sub_sum give
     * the same element bits on every input class (subnormal results too) */
#if defined(__x86_64__)
    if (!dsattn_cpu_has_avx512()) { dsattn_test_skip("no AVX-512"); return; }
    enum { N = 6001 };
    static float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = -150.0f + 0.04f * (float)i;      /* -150 .. 90 */
    a[0] = -INFINITY; a[1] = NAN; a[2] = 88.72283935546875f; a[3] = -103.99f; a[4] = -87.4f;
    memcpy(b, a, sizeof a);
    dsattn_exp_sub_sum_avx512(a, N, 0.0f);
    dsattn_exp_sub_sum_avx2(b, N, 0.0f);
    CHECK_BITS("exp avx2 vs avx512", b, a, N);
#else
    dsattn_test_skip("AVX-512 / AVX2 forms exist only in x86-64 builds");
#endif
}

DSATTN_TEST(vmath, fp8_weight_row_decoder_follows_the_table)
{
    /* the ISA override reaches the prefill's row decoder and the softmax
     * exp: the "avx512" table gets the AVX-512 forms, "avx2" the AVX2 ones,
     * "neon" the NEON ones */
    dsattn_ktab t;
    CHECK_OK(dsattn_ktab_fill(&t, DSATTN_ISA_REF, 1));
    CHECK(t.wdq == &dsattn_wdequant_ref && t.vmath == &dsattn_vmath_ref);
    if (dsattn_ktab_fill(&t, DSATTN_ISA_AVX2, 1) == DSATTN_OK) {
        CHECK(t.wdq == dsattn_wdequant_avx2_ptr && t.vmath == dsattn_vmath_avx2_ptr);
        CHECK(t.wdq && !strcmp(t.wdq->name, "avx2") && t.vmath && !strcmp(t.vmath->name, "avx2"));
    }
    if (dsattn_ktab_fill(&t, DSATTN_ISA_AVX512, 1) == DSATTN_OK && dsattn_wdequant_avx512_ptr) {
        CHECK(t.wdq == dsattn_wdequant_avx512_ptr && t.vmath == dsattn_vmath_avx512_ptr);
#if defined(__x86_64__)
        CHECK(t.wdq->fp8_row == dsattn_fp8_row_f32_avx512);
#endif
    }
    if (dsattn_ktab_fill(&t, DSATTN_ISA_NEON, 1) == DSATTN_OK) {
        CHECK(t.wdq == dsattn_wdequant_neon_ptr && t.vmath == dsattn_vmath_neon_ptr);
        CHECK(t.wdq && !strcmp(t.wdq->name, "neon") && t.vmath && !strcmp(t.vmath->name, "neon"));
    }
}

/* a table's wdq slot against its scalar twin: every code (the NaN codes
 * 0x7f / 0xff give NaN), several block sizes and ragged tails, bit-exact */
static void run_fp8_row(const dsattn_ktab *KT)
{
    if (!KT) return;
    uint8_t w[300];
    float sc[64], a[300], b[300];             /* 300 codes in blocks of 6: 50 scales */
    for (int i = 0; i < 300; i++) w[i] = (uint8_t)(i * 7 + 3);
    w[17] = 0x7f;
    w[40] = 0xff;
    for (int i = 0; i < 64; i++) sc[i] = ldexpf(1.0f + (float)(i % 3) * 0.25f, i % 16 - 8);
    /* 6 and 10: blocks that split a 4- and an 8-lane vector (the forms'
     * per-element scale path) */
    const size_t bss[7] = { 32, 128, 24, 12, 8, 6, 10 };
    const dsattn_fp8_row_fn fast = KT->wdq->fp8_row;
    CHECK(fast != dsattn_wdequant_ref.fp8_row);
    for (int t = 0; t < 7; t++)
        for (size_t k = 1; k <= 300; k += 37) {
            dsattn_fp8_row_f32_ref(w, sc, bss[t], k, a);
            fast(w, sc, bss[t], k, b);
            CHECK_BITS("fp8 row", b, a, k);
        }
    /* all 256 codes, one scale */
    uint8_t all[256];
    float one = 1.0f, ra[256], rb[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    dsattn_fp8_row_f32_ref(all, &one, 256, 256, ra);
    fast(all, &one, 256, 256, rb);
    CHECK_BITS("fp8 row, every code", rb, ra, 256);
}

DSATTN_TEST(vmath, fp8_weight_row_dequant_exact)       { run_fp8_row(dsattn_test_avx512_ktab()); }
DSATTN_TEST(vmath, fp8_weight_row_dequant_exact_avx2)  { run_fp8_row(dsattn_test_avx2_ktab()); }
DSATTN_TEST(vmath, fp8_weight_row_dequant_exact_neon)  { run_fp8_row(dsattn_test_neon_ktab()); }
