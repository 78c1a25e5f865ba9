/* test_kernels.c - every fast kernel of every ISA table against the scalar
 * reference (kernels_ref.c), and the ISA choice of dsattn_ctx_create.
 *
 * Bounds.  The reference forms each product exactly and rounds the double
 * sum once; a fast kernel with L lanes sends each product through at most
 * ceil(k/L) sequential fp32 additions in its lane, plus a fixed number of
 * roundings for its block partial sums (<= 8), the folded block scale (1),
 * the lane tree (<= 4) and pass joins (<= 2).  So
 *     |fast - ref| <= (ceil(k/L) + 16) * 2^-24 * sum_i |w_i x_i s_i|
 *                     + (k + 16) * 2^-149          (subnormal floor)
 * with L = 16 (AVX-512), 8 (AVX2) or 4 (NEON).  For k = 5120 that is ~2e-5 of the
 * absolute sum, ten times smaller than dropping one typical term, and a
 * test below checks that such a one-term slip is indeed caught.  One form
 * keeps each output in a single chain over k, so its bound has L = 1: the
 * AVX2 table's tiled gemv_fp8_m (12+ tokens, finite codes, blocks a
 * multiple of 32; the tokens are its lanes).
 * The dequant kernels have no tolerance at all: bit-exact to numfmt.c,
 * -0.0 and NaN codes included, over every (code, scale) byte pair.
 * Outputs get canaries on both sides.  Each test skips when the CPU (or the
 * build) lacks the ISA.
 */
#include "harness.h"
#include "fp8sh.h"
#include "internal.h"
#include "ktab.h"
#include "numfmt.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define CANARY 12345.678f
#define NCAN 16

/* ==== Helpers =========================================================== */

typedef struct {
    const dsattn_kernels *k;
    double lanes;
} isa_t;

/* The base slot of the named table (ktab.h): "neon", and both AVX2 and
 * both AVX-512 tables by name ("avx2", "avx2-expshift", "avx512",
 * "avx512-expshift") whichever of them the context would choose on this
 * CPU. */
static int get_isa(const char *name, isa_t *out)
{
    dsattn_ktab t;
    const int w = !strncmp(name, "avx512", 6), neon = !strcmp(name, "neon");
    const dsattn_isa isa = w ? DSATTN_ISA_AVX512 : neon ? DSATTN_ISA_NEON : DSATTN_ISA_AVX2;
    if (dsattn_ktab_fill(&t, isa, 0) != DSATTN_OK) {
        dsattn_test_skip(w ? "no AVX-512 (CPU or build)" : neon ? "no NEON (not an aarch64 build)"
                           : "no AVX2+FMA (CPU or build)");
        return 0;
    }
    out->k = !strcmp(name, "avx2") ? dsattn_kernels_avx2_ptr
           : !strcmp(name, "avx2-expshift") ? dsattn_kernels_avx2_expshift_ptr
           : !strcmp(name, "avx512") ? dsattn_kernels_avx512_ptr
           : !strcmp(name, "avx512-expshift") ? dsattn_kernels_avx512_expshift_ptr : t.k;
    out->lanes = w ? 16 : neon ? 4 : 8;
    return 1;
}

/* Every kernel table this build and CPU can run (ref, both AVX2, both
 * AVX-512, NEON) into tabs; returns how many. */
static size_t runnable_tables(const dsattn_kernels *tabs[6])
{
    const dsattn_kernels *all[6] = { &dsattn_kernels_ref, dsattn_kernels_avx2_ptr,
                                     dsattn_kernels_avx512_ptr, dsattn_kernels_neon_ptr,
                                     dsattn_kernels_avx2_expshift_ptr,
                                     dsattn_kernels_avx512_expshift_ptr };
    const int have[6] = { 1, dsattn_cpu_has_avx2(), dsattn_cpu_has_avx512(), 1,
                          dsattn_cpu_has_avx2(), dsattn_cpu_has_avx512() };
    size_t n = 0;
    for (int t = 0; t < 6; t++)
        if (all[t] && have[t]) tabs[n++] = all[t];
    return n;
}

/* n floats with NCAN canaries on each side; returns the usable part. */
static float *canary_alloc(size_t n)
{
    if (n > ((size_t)1 << 30)) abort();     /* test sizes only */
    float *p = malloc((n + 2 * NCAN) * sizeof(float));
    if (!p) abort();
    for (size_t i = 0; i < n + 2 * NCAN; i++) p[i] = CANARY;
    return p + NCAN;
}

static int canary_ok(const float *p, size_t n)
{
    for (size_t i = 0; i < NCAN; i++)
        if (memcmp(&p[-1 - (ptrdiff_t)i], &(float){ CANARY }, 4) ||
            memcmp(&p[n + i], &(float){ CANARY }, 4))
            return 0;
    return 1;
}

static void canary_free(float *p) { free(p - NCAN); }

static double bound(const isa_t *isa, size_t k, double mag)
{
    double steps = (double)((k + (size_t)isa->lanes - 1) / (size_t)isa->lanes) + 16.0;
    return steps * 0x1p-24 * mag * 1.0001 + ((double)k + 16.0) * 0x1p-149;
}

/* |got - want| <= bound(k, mag[i]) for every i, NaN/inf positions equal.
 * Returns the number of violations (reports the first). */
static int check_bound(const char *what, const isa_t *isa, const float *got,
                       const float *want, const double *mag, size_t n, size_t k,
                       size_t tag1, size_t tag2)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        int ok;
        if (isnan(w) || isnan(g)) ok = isnan(w) && isnan(g);
        else if (isinf(w) || isinf(g)) ok = g == w;
        else ok = fabs(g - w) <= bound(isa, k, mag[i]);
        if (!ok) {
            if (!bad)
                dsattn_test_fail(__FILE__, __LINE__,
                                 "%s[%s] (%zu,%zu) [%zu]: got %.9g want %.9g (bound %.3g)",
                                 what, isa->k->name, tag1, tag2, i, g, w,
                                 bound(isa, k, mag[i]));
            bad++;
        }
    }
    return bad;
}

static void fill_uniform(dsattn_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = dsattn_rng_uniform(r);
}

static uint8_t rnd_byte(dsattn_rng *r) { return (uint8_t)(dsattn_rng_u64(r) >> 56); }

/* an E4M3 code that is not NaN */
static uint8_t rnd_e4m3(dsattn_rng *r)
{
    uint8_t c = rnd_byte(r);
    return (c & 0x7f) == 0x7f ? (uint8_t)(c ^ 1) : c;
}

/* 5120, 6144 and 6208: one x pass of the AVX2 FP8 GEMV (rows by pairs);
 * 12352: two equal passes of 6176, the second starting inside a 128-block */
static const size_t k_list[] = { 511, 512, 513, 5120, 6144, 6208, 12352 };
static const size_t row_list[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 33 };

/* ==== GEMV ============================================================== */

static void gemv_f32_case(const isa_t *isa, dsattn_rng *rng, size_t rows, size_t k)
{
    float *W = malloc(rows * k * sizeof(float)), *x = malloc(k * sizeof(float));
    float *y = canary_alloc(rows), *yr = malloc(rows * sizeof(float));
    double *mag = calloc(rows, sizeof(double));
    fill_uniform(rng, W, rows * k);
    fill_uniform(rng, x, k);
    isa->k->gemv_f32(W, x, y, rows, k);
    dsattn_kernels_ref.gemv_f32(W, x, yr, rows, k);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < k; i++) mag[r] += fabs((double)W[r * k + i] * x[i]);
    check_bound("gemv_f32", isa, y, yr, mag, rows, k, rows, k);
    CHECK_MSG(canary_ok(y, rows), "gemv_f32[%s] wrote outside y (%zu,%zu)", isa->k->name, rows, k);
    free(W); free(x); canary_free(y); free(yr); free(mag);
}

static void gemv_bf16_case(const isa_t *isa, dsattn_rng *rng, size_t rows, size_t k)
{
    uint16_t *W = malloc(rows * k * sizeof(uint16_t));
    float *x = malloc(k * sizeof(float));
    float *y = canary_alloc(rows), *yr = malloc(rows * sizeof(float));
    double *mag = calloc(rows, sizeof(double));
    for (size_t i = 0; i < rows * k; i++) W[i] = dsattn_f32_to_bf16(4.0f * dsattn_rng_uniform(rng));
    fill_uniform(rng, x, k);
    isa->k->gemv_bf16(W, x, y, rows, k);
    dsattn_kernels_ref.gemv_bf16(W, x, yr, rows, k);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < k; i++)
            mag[r] += fabs((double)dsattn_bf16_to_f32(W[r * k + i]) * x[i]);
    check_bound("gemv_bf16", isa, y, yr, mag, rows, k, rows, k);
    CHECK_MSG(canary_ok(y, rows), "gemv_bf16[%s] wrote outside y", isa->k->name);
    free(W); free(x); canary_free(y); free(yr); free(mag);
}

/* FP8: a [total_rows, k] matrix with bs x bs scale blocks; the kernel runs
 * on rows [r0, r0 + rows) the way the ops layer calls it. */
static void gemv_fp8_case(const isa_t *isa, dsattn_rng *rng, size_t total, size_t r0,
                          size_t rows, size_t k, size_t bs, int nan_codes)
{
    size_t ldsc = (k + bs - 1) / bs, nsr = (total + bs - 1) / bs;
    uint8_t *W = malloc(total * k);
    float *sc = malloc(nsr * ldsc * sizeof(float)), *x = malloc(k * sizeof(float));
    float *y = canary_alloc(rows), *yr = malloc(rows * sizeof(float));
    double *mag = calloc(rows, sizeof(double));
    for (size_t i = 0; i < total * k; i++) W[i] = rnd_e4m3(rng);
    if (nan_codes)   /* a NaN code in every third row */
        for (size_t r = 0; r < total; r += 3) W[r * k + (size_t)(dsattn_rng_u64(rng) % k)] = 0x7f | (uint8_t)(r & 1) << 7;
    for (size_t i = 0; i < nsr * ldsc; i++)
        sc[i] = ldexpf(1.0f + 0.5f * dsattn_rng_uniform(rng), -(int)(dsattn_rng_u64(rng) % 12));
    if (nan_codes & 2)   /* scales at the ends of the fp32 range, x's too */
        for (size_t i = 0; i < nsr * ldsc; i++)
            sc[i] = (i % 4 == 0) ? 0x1p80f : (i % 4 == 1) ? 0x1p-100f
                  : (i % 4 == 2) ? 0x1p-126f : 0x1p12f;   /* 2^12: |x * scale| past 2^8 */
    fill_uniform(rng, x, k);
    if (nan_codes & 2)
        for (size_t i = 0; i < k; i += 5) x[i] *= (i % 2) ? 0x1p20f : 0x1p-20f;
    nan_codes &= 1;
    const uint8_t *Wc = W + r0 * k;
    const float *scc = sc + (r0 / bs) * ldsc;
    isa->k->gemv_fp8(Wc, scc, bs, ldsc, x, y, rows, k);
    dsattn_kernels_ref.gemv_fp8(Wc, scc, bs, ldsc, x, yr, rows, k);
    for (size_t r = 0; r < rows; r++) {
        size_t gr = r0 + r;
        for (size_t i = 0; i < k; i++)
            mag[r] += fabs((double)dsattn_e4m3_to_f32(W[gr * k + i]) *
                           sc[(gr / bs) * ldsc + i / bs] * x[i]);
        if (nan_codes && isnan(mag[r])) mag[r] = 0;
    }
    check_bound("gemv_fp8", isa, y, yr, mag, rows, k, rows * 1000 + bs, k);
    CHECK_MSG(canary_ok(y, rows), "gemv_fp8[%s] wrote outside y", isa->k->name);
    if (nan_codes)
        for (size_t r = 0; r < rows; r++)
            CHECK_MSG(isnan(y[r]) == ((r0 + r) % 3 == 0), "gemv_fp8[%s] NaN row %zu",
                      isa->k->name, r0 + r);
    free(W); free(sc); free(x); canary_free(y); free(yr); free(mag);
}

static void gemv_fp4_case(const isa_t *isa, dsattn_rng *rng, size_t rows, size_t k,
                          int special_scales)
{
    uint8_t *W = malloc(rows * k / 2), *S = malloc(rows * (k / 32));
    float *x = malloc(k * sizeof(float));
    float *y = canary_alloc(rows), *yr = malloc(rows * sizeof(float));
    double *mag = calloc(rows, sizeof(double));
    for (size_t i = 0; i < rows * k / 2; i++) W[i] = rnd_byte(rng);
    for (size_t i = 0; i < rows * (k / 32); i++) S[i] = (uint8_t)(112 + dsattn_rng_u64(rng) % 24);
    if (special_scales)   /* 2^-127 (subnormal) in row 0, NaN in row 1 */
        for (size_t b = 0; b < k / 32; b++) {
            S[b] = 0;
            if (rows > 1 && b == k / 64) S[k / 32 + b] = 255;
        }
    fill_uniform(rng, x, k);
    isa->k->gemv_fp4(W, S, x, y, rows, k);
    dsattn_kernels_ref.gemv_fp4(W, S, x, yr, rows, k);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < k; i++) {
            uint8_t b = W[r * k / 2 + i / 2];
            uint8_t c = (i & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
            double t = (double)dsattn_e2m1_to_f32(c) * dsattn_ue8m0_to_f32(S[r * (k / 32) + i / 32]) * x[i];
            if (!isnan(t)) mag[r] += fabs(t);
        }
    check_bound("gemv_fp4", isa, y, yr, mag, rows, k, rows, k);
    CHECK_MSG(canary_ok(y, rows), "gemv_fp4[%s] wrote outside y", isa->k->name);
    if (special_scales && rows > 1) CHECK(isnan(y[1]));
    free(W); free(S); free(x); canary_free(y); free(yr); free(mag);
}

static void run_gemv(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 42 };
    for (size_t ri = 0; ri < DSATTN_ARRAY_LEN(row_list); ri++) {
        size_t rows = row_list[ri];
        for (size_t k = 1; k <= 70; k++) {
            gemv_f32_case(&isa, &rng, rows, k);
            gemv_bf16_case(&isa, &rng, rows, k);
            gemv_fp8_case(&isa, &rng, rows, 0, rows, k, 32, 0);
            gemv_fp8_case(&isa, &rng, rows, 0, rows, k, 128, 0);
        }
        for (size_t j = 0; j < DSATTN_ARRAY_LEN(k_list); j++) {
            size_t k = k_list[j];
            gemv_f32_case(&isa, &rng, rows, k);
            gemv_bf16_case(&isa, &rng, rows, k);
            gemv_fp8_case(&isa, &rng, rows, 0, rows, k, 32, 0);
            gemv_fp8_case(&isa, &rng, rows, 0, rows, k, 128, 0);
        }
        for (size_t k = 32; k <= 640; k += 32) gemv_fp4_case(&isa, &rng, rows, k, 0);
        gemv_fp4_case(&isa, &rng, rows, 5120, 0);
    }
    /* k past one x pass of the AVX-512 GEMVs (8192): pass joins */
    gemv_f32_case(&isa, &rng, 5, 8200);
    gemv_fp8_case(&isa, &rng, 5, 0, 5, 8200, 128, 0);
    gemv_fp8_case(&isa, &rng, 5, 0, 5, 16448, 32, 0);
    /* blocks that do not divide the pass: the second pass starts mid-block */
    gemv_fp8_case(&isa, &rng, 5, 0, 5, 8192 + 200, 96, 0);
    gemv_fp8_case(&isa, &rng, 7, 0, 7, 8192 + 64, 192, 0);
    /* the same past the exponent-shift GEMVs' pass (4096), one ending on a
     * half step of 64 */
    gemv_fp8_case(&isa, &rng, 5, 0, 5, 4096 + 32, 32, 0);
    gemv_fp8_case(&isa, &rng, 6, 0, 6, 4096 + 200, 96, 0);
    /* rows by pairs (the AVX2 GEMV's passes of 3072+ codes) with NaN codes
     * and an odd last row; one pass of 8192 by pairs at extreme scales */
    gemv_fp8_case(&isa, &rng, 7, 0, 7, 4096 + 32, 32, 1);
    gemv_fp8_case(&isa, &rng, 9, 0, 9, 8192, 128, 3);
    gemv_fp4_case(&isa, &rng, 5, 8192 + 96, 0);
    gemv_fp4_case(&isa, &rng, 6, 16384 + 32, 0);
}

/* FP8 row ranges that do not start at row 0: r0 a multiple of bs, and the
 * ops layer's 64-row chunks inside 128-row blocks; also odd block edges
 * (generic path) and NaN codes. */
static void run_gemv_fp8_ranges(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 7 };
    const size_t ks[] = { 32, 100, 512, 513, 1280 };
    for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++) {
        size_t k = ks[j];
        gemv_fp8_case(&isa, &rng, 96, 32, 64, k, 32, 0);       /* rows 32..95 */
        gemv_fp8_case(&isa, &rng, 96, 64, 9, k, 32, 0);
        gemv_fp8_case(&isa, &rng, 256, 128, 128, k, 128, 0);   /* block row 1 */
        gemv_fp8_case(&isa, &rng, 256, 64, 64, k, 128, 0);     /* ops chunk */
        gemv_fp8_case(&isa, &rng, 256, 192, 64, k, 128, 0);
        gemv_fp8_case(&isa, &rng, 200, 0, 200, k, 128, 0);     /* crosses blocks */
        gemv_fp8_case(&isa, &rng, 100, 0, 100, k, 32, 0);
        gemv_fp8_case(&isa, &rng, 50, 0, 50, k, 48, 0);        /* generic edge */
        gemv_fp8_case(&isa, &rng, 30, 0, 30, k, 7, 0);
        gemv_fp8_case(&isa, &rng, 40, 0, 40, k, 32, 1);        /* NaN codes */
        gemv_fp8_case(&isa, &rng, 256, 128, 33, k, 128, 1);
    }
}

/* Every block size a GEMV meets (and multiples of 32 it does not), with
 * scales at 2^100, 2^-100 and 2^-126 and x spread over 2^+-20: the fast
 * paths fold scales into x, so no product may leave the normal range. */
static void run_gemv_fp8_extremes(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 11 };
    const size_t bss[] = { 32, 64, 96, 128, 256 }, ks[] = { 31, 64, 100, 1280, 8192 + 33 };
    for (size_t b = 0; b < DSATTN_ARRAY_LEN(bss); b++)
        for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++) {
            gemv_fp8_case(&isa, &rng, 2 * bss[b] + 3, 0, 2 * bss[b] + 3, ks[j], bss[b], 2);
            gemv_fp8_case(&isa, &rng, 2 * bss[b] + 3, bss[b], bss[b] + 3, ks[j], bss[b], 3);
        }
}

/* The AVX2 FP8 GEMVs take the rows of a long pass two at a time (each
 * row's arithmetic that of one row alone): every row of a call over many
 * rows has the bits of a call over that row alone, NaN codes included, on
 * both entries.  Odd row counts and scale rows, one pass of 3072 codes to
 * three passes of 5504, 5504 and 5440. */
static void run_gemv_fp8_pairs(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 29 };
    const size_t ks[] = { 3072, 4096 + 32, 7168, 8192, 8192 + 200, 16448 };
    const size_t bss[] = { 32, 128 }, rows = 67;
    for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++)
        for (size_t b = 0; b < DSATTN_ARRAY_LEN(bss); b++)
            for (int nan = 0; nan < 2; nan++) {
                const size_t k = ks[j], bs = bss[b], ldsc = (k + bs - 1) / bs;
                const size_t nsr = (rows + bs - 1) / bs;
                uint8_t *W = malloc(rows * k);
                float *sc = malloc(nsr * ldsc * sizeof(float)), *x = malloc(k * sizeof(float));
                float *ya = malloc(rows * sizeof(float)), *y1 = malloc(rows * sizeof(float));
                for (size_t i = 0; i < rows * k; i++) W[i] = rnd_e4m3(&rng);
                if (nan)
                    for (size_t r = 1; r < rows; r += 5) W[r * k + (size_t)(dsattn_rng_u64(&rng) % k)] = 0xff;
                for (size_t i = 0; i < nsr * ldsc; i++)
                    sc[i] = ldexpf(1.0f + 0.5f * dsattn_rng_uniform(&rng), -(int)(dsattn_rng_u64(&rng) % 12));
                fill_uniform(&rng, x, k);
                void (*const g)(const uint8_t *, const float *, size_t, size_t, const float *,
                                float *, size_t, size_t) = nan ? isa.k->gemv_fp8 : isa.k->gemv_fp8_finite;
                g(W, sc, bs, ldsc, x, ya, rows, k);
                for (size_t r = 0; r < rows; r++)
                    g(W + r * k, sc + (r / bs) * ldsc, bs, ldsc, x, y1 + r, 1, k);
                size_t bad = 0;
                for (size_t r = 0; r < rows; r++)
                    if (memcmp(&ya[r], &y1[r], sizeof(float)) != 0) bad++;
                CHECK_MSG(bad == 0, "gemv_fp8%s[%s] k=%zu bs=%zu: %zu of %zu rows differ from one-row calls",
                          nan ? "" : "_finite", isa.k->name, k, bs, bad, rows);
                if (nan)
                    for (size_t r = 1; r < rows; r += 5) CHECK(isnan(ya[r]));
                free(W); free(sc); free(x); free(ya); free(y1);
            }
}

/* gemv_fp8_px (x prepared once by fp8_prep_x, the ops layer's chunks) has
 * the bits of gemv_fp8 / gemv_fp8_finite on the same table: one pass and
 * several (k past 8192, a last pass ending mid-group), k % 32 != 0, every
 * block size (48: the per-element path), row ranges inside the matrix
 * against the whole x's preparation, NaN codes, extreme scales, and x
 * holding an inf or a NaN in one pass only (that pass takes the fp16
 * decode, the others the exponent shift), x whose later passes need
 * another 2^K than the first (each pass's own maxima must be used). */
static void px_case(const dsattn_kernels *kt, dsattn_rng *rng, size_t total, size_t r0,
                    size_t rows, size_t k, size_t bs, int flags)
{
    const int nan = flags & 1;
    const size_t ldsc = (k + bs - 1) / bs, nsr = (total + bs - 1) / bs;
    uint8_t *W = malloc(total * k);
    float *sc = malloc(nsr * ldsc * sizeof(float)), *x = malloc(k * sizeof(float));
    float *px = aligned_alloc(32, (DSATTN_FP8_PX_FLOATS(k) + 7) / 8 * 32);
    float *y0 = canary_alloc(rows), *y1 = canary_alloc(rows);
    for (size_t i = 0; i < total * k; i++) W[i] = rnd_e4m3(rng);
    if (nan)
        for (size_t r = 0; r < total; r += 3) W[r * k + (size_t)(dsattn_rng_u64(rng) % k)] = 0xff;
    for (size_t i = 0; i < nsr * ldsc; i++)
        sc[i] = (flags & 2) ? ((i % 3 == 0) ? 0x1p100f : (i % 3 == 1) ? 0x1p-100f : 0x1p-126f)
                            : ldexpf(1.0f + 0.5f * dsattn_rng_uniform(rng),
                                     -(int)(dsattn_rng_u64(rng) % 12));
    fill_uniform(rng, x, k);
    if (flags & 2)
        for (size_t i = 0; i < k; i += 5) x[i] *= (i % 2) ? 0x1p20f : 0x1p-20f;
    if (flags & 16)     /* x's second half 2^80 times the first: K differs between passes */
        for (size_t i = k / 2; i < k; i++) x[i] *= 0x1p80f;
    if (flags & 4) x[k - 1 - k / 3] = __builtin_inff();
    if (flags & 8) x[k / 5] = __builtin_nanf("");
    const uint8_t *Wc = W + r0 * k;
    const float *scc = sc + (r0 / bs) * ldsc;
    (nan ? kt->gemv_fp8 : kt->gemv_fp8_finite)(Wc, scc, bs, ldsc, x, y0, rows, k);
    kt->fp8_prep_x(x, k, px);
    kt->gemv_fp8_px(Wc, scc, bs, ldsc, x, px, y1, rows, k, !nan);
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++)
        if (memcmp(&y0[r], &y1[r], sizeof(float))) bad++;
    CHECK_MSG(bad == 0, "gemv_fp8_px[%s] k=%zu bs=%zu rows %zu+%zu flags %d: %zu rows differ",
              kt->name, k, bs, r0, rows, flags, bad);
    CHECK_MSG(canary_ok(y1, rows), "gemv_fp8_px[%s] wrote outside y", kt->name);
    free(W); free(sc); free(x); free(px); canary_free(y0); canary_free(y1);
}

DSATTN_TEST(kernels, gemv_fp8_px_equals_gemv_fp8_seed31)
{
    const dsattn_kernels *tabs[6];
    const size_t nt = runnable_tables(tabs);
    /* the AVX2 exponent-shift table has the entries (so this cannot pass empty there) */
    if (dsattn_kernels_avx2_expshift_ptr)
        CHECK(dsattn_kernels_avx2_expshift_ptr->gemv_fp8_px &&
              dsattn_kernels_avx2_expshift_ptr->fp8_prep_x);
    dsattn_rng rng = { 31 };
    const size_t ks[] = { 1, 31, 64, 100, 1280, 4096, 4096 + 32, 8192, 8192 + 200, 16448 };
    const size_t bss[] = { 32, 64, 96, 128, 48 };
    int ran = 0;
    for (size_t t = 0; t < nt; t++) {
        if (!tabs[t]->gemv_fp8_px) continue;
        CHECK(tabs[t]->fp8_prep_x != NULL);
        ran = 1;
        for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++)
            for (size_t b = 0; b < DSATTN_ARRAY_LEN(bss); b++) {
                const size_t k = ks[j], bs = bss[b];
                px_case(tabs[t], &rng, 2 * bs + 3, 0, 2 * bs + 3, k, bs, 0);
                px_case(tabs[t], &rng, 2 * bs + 3, bs, bs + 3, k, bs, 1);
                if (k >= 64) {
                    px_case(tabs[t], &rng, bs + 5, 0, bs + 5, k, bs, 2);
                    px_case(tabs[t], &rng, bs + 5, 0, bs + 5, k, bs, 4);
                    px_case(tabs[t], &rng, bs + 5, 0, bs + 5, k, bs, 8 | 1);
                    px_case(tabs[t], &rng, bs + 5, 0, bs + 5, k, bs, 16);
                }
            }
    }
    if (!ran) dsattn_test_skip("no table on this CPU has gemv_fp8_px");
}

/* The AVX2 planner for blocks of 32 gives the scalar planner's answer:
 * the same refusal (an inf or NaN max, or a scale, or a product that
 * overflows), the same 2^K and 2^(120 - K) - group counts 1..40 (vector
 * tails), maxima and scales from 0 and subnormals to the top of the range,
 * signed zeros, negative scales. */
static float plan_value(dsattn_rng *r, int wide)
{
    const uint64_t u = dsattn_rng_u64(r);
    switch (u % 16) {
    case 0: return 0.0f;
    case 1: return wide ? -0.0f : 0.0f;
    case 2: return 0x1p-140f * (float)(1 + u % 7);
    case 3: return (u >> 8) % 64 == 0 ? __builtin_inff() : 0x1p126f;
    case 4: return (u >> 8) % 64 == 0 ? __builtin_nanf("") : 0x1p-126f;
    default: {
        const float v = ldexpf(1.0f + dsattn_rng_uniform(r), (int)((u >> 8) % 200) - 100);
        return wide && (u >> 20) % 2 ? -v : v;
    }
    }
}

DSATTN_TEST(kernels, fp8sh_plan32_equals_scalar_plan_seed37)
{
    if (!dsattn_kernels_avx2_expshift_ptr || !dsattn_cpu_has_avx2()) {
        dsattn_test_skip("no AVX2 table (CPU or build)");
        return;
    }
    dsattn_rng r = { 37 };
    size_t refused = 0, scaled = 0;
    for (int it = 0; it < 20000; it++) {
        const size_t ng = 1 + (size_t)(dsattn_rng_u64(&r) % 40);
        float bm[40], sc[40], sg[40], pk0 = 0, un0 = 0, pk1 = 0, un1 = 0;
        for (size_t g = 0; g < ng; g++) {
            bm[g] = fabsf(plan_value(&r, 0));
            sc[g] = plan_value(&r, 1);
        }
        const int a = dsattn_fp8sh_plan(bm, ng, sc, 32, 0, sg, &pk0, &un0);
        const int b = dsattn_avx2_fp8sh_plan32(bm, ng, sc, &pk1, &un1);
        CHECK_MSG(a == b, "plan32: returns %d, the scalar plan %d (ng %zu, it %d)", b, a, ng, it);
        if (a && b) {
            CHECK_MSG(!memcmp(&pk0, &pk1, 4) && !memcmp(&un0, &un1, 4),
                      "plan32: 2^K %g / %g, unscale %g / %g (it %d)", pk1, pk0, un1, un0, it);
            scaled += pk0 != 0x1p120f;
        }
        refused += !a;
    }
    /* both outcomes and K != 120 were exercised */
    CHECK_MSG(refused > 1000 && scaled > 1000, "refused %zu, K != 120 %zu", refused, scaled);
}

static void run_gemv_fp4_special(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 9 };
    gemv_fp4_case(&isa, &rng, 2, 64, 1);
    gemv_fp4_case(&isa, &rng, 5, 1280, 1);
}

/* gemv_fp8_m: m tokens (strided x, strided y) against rows [r0, r0+rows)
 * of a [total, k] FP8 matrix, each token's outputs within gemv_fp8's bound
 * of the ref gemv_fp8 of that token; the gaps between y's rows untouched.
 * flags: 1 NaN codes in every third row, 2 extreme scales and x, 4 the
 * finite form (no NaN codes then), 8 tokens of different magnitudes. */
static void gemv_fp8_m_case(const isa_t *isa, dsattn_rng *rng, size_t total, size_t r0,
                            size_t rows, size_t k, size_t bs, size_t m, int flags)
{
    if (!isa->k->gemv_fp8_m) return;
    const int nan_codes = (flags & 1) && !(flags & 4);
    const size_t ldsc = (k + bs - 1) / bs, nsr = (total + bs - 1) / bs;
    const size_t ldx = k + 3, ldy = rows + 5;
    uint8_t *W = malloc(total * k);
    float *sc = malloc(nsr * ldsc * sizeof(float)), *x = malloc(m * ldx * sizeof(float));
    float *y = canary_alloc(m * ldy), *yr = malloc(rows * sizeof(float));
    double *mag = calloc(rows, sizeof(double));
    for (size_t i = 0; i < total * k; i++) W[i] = rnd_e4m3(rng);
    if (nan_codes)
        for (size_t r = 0; r < total; r += 3) W[r * k + (size_t)(dsattn_rng_u64(rng) % k)] = 0x7f;
    for (size_t i = 0; i < nsr * ldsc; i++)
        sc[i] = (flags & 2) ? ((i % 4 == 0) ? 0x1p80f : (i % 4 == 1) ? 0x1p-100f
                               : (i % 4 == 2) ? 0x1p-126f : 0x1p12f)
                            : ldexpf(1.0f + 0.5f * dsattn_rng_uniform(rng),
                                     -(int)(dsattn_rng_u64(rng) % 12));
    fill_uniform(rng, x, m * ldx);
    if (flags & 2)
        for (size_t i = 0; i < m * ldx; i += 5) x[i] *= (i % 2) ? 0x1p20f : 0x1p-20f;
    if (flags & 8)      /* tokens of different magnitudes: 2^-8 .. 2^(4m - 12) */
        for (size_t t = 0; t < m; t++)
            for (size_t i = 0; i < k; i++) x[t * ldx + i] *= ldexpf(1.0f, 4 * (int)t - 8);
    const uint8_t *Wc = W + r0 * k;
    const float *scc = sc + (r0 / bs) * ldsc;
    isa->k->gemv_fp8_m(Wc, scc, bs, ldsc, x, ldx, m, y, ldy, rows, k, (flags & 4) != 0);
    /* the AVX2 tiled form: one chain over k per output (header) */
    isa_t chk = *isa;
    if (!strncmp(isa->k->name, "avx2", 4) && m >= 12 && (flags & 4) && k % 32 == 0 &&
        bs % 32 == 0)
        chk.lanes = 1;
    for (size_t t = 0; t < m; t++) {
        const float *xt = x + t * ldx;
        dsattn_kernels_ref.gemv_fp8(Wc, scc, bs, ldsc, xt, yr, rows, k);
        for (size_t r = 0; r < rows; r++) {
            size_t gr = r0 + r;
            mag[r] = 0;
            for (size_t i = 0; i < k; i++)
                mag[r] += fabs((double)dsattn_e4m3_to_f32(W[gr * k + i]) *
                               sc[(gr / bs) * ldsc + i / bs] * xt[i]);
            if (nan_codes && isnan(mag[r])) mag[r] = 0;
        }
        check_bound("gemv_fp8_m", &chk, y + t * ldy, yr, mag, rows, k, m * 100000 + rows * 100 + bs, k);
        for (size_t r = rows; r < ldy && t + 1 < m; r++)
            CHECK_MSG(!memcmp(&y[t * ldy + r], &(float){ CANARY }, 4),
                      "gemv_fp8_m[%s] wrote into y's gap (token %zu)", isa->k->name, t);
        if (nan_codes)
            for (size_t r = 0; r < rows; r++)
                CHECK_MSG(isnan(y[t * ldy + r]) == ((r0 + r) % 3 == 0),
                          "gemv_fp8_m[%s] NaN row %zu token %zu", isa->k->name, r0 + r, t);
    }
    CHECK_MSG(canary_ok(y, m * ldy), "gemv_fp8_m[%s] wrote outside y", isa->k->name);
    free(W); free(sc); free(x); canary_free(y); free(yr); free(mag);
}

/* Every token count of a batched step (1..17: whole and partial passes of
 * eight), the V4.1 shapes' k (one slab, several, a slab tail), blocks of 32
 * and 128, row ranges inside block rows, odd k and blocks (the per-token
 * path), NaN codes, the finite form, extreme scales. */
static void run_gemv_fp8_m(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    if (!isa.k->gemv_fp8_m) {
        dsattn_test_skip("this table has no gemv_fp8_m (its callers loop gemv_fp8)");
        return;
    }
    dsattn_rng rng = { 21 };
    for (size_t m = 1; m <= 17; m++) {
        gemv_fp8_m_case(&isa, &rng, 70, 0, 70, 1024, 32, m, 0);
        gemv_fp8_m_case(&isa, &rng, 33, 0, 33, 2560, 128, m, 4);
        gemv_fp8_m_case(&isa, &rng, 40, 0, 40, 512, 32, m, 8);
    }
    const size_t ks[] = { 31, 64, 96, 100, 512, 1536, 4096 + 64 };
    for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++) {
        gemv_fp8_m_case(&isa, &rng, 96, 32, 64, ks[j], 32, 8, 0);
        gemv_fp8_m_case(&isa, &rng, 256, 128, 65, ks[j], 128, 5, 0);
        gemv_fp8_m_case(&isa, &rng, 40, 0, 40, ks[j], 32, 8, 1);
        gemv_fp8_m_case(&isa, &rng, 40, 0, 13, ks[j], 32, 3, 1);
        gemv_fp8_m_case(&isa, &rng, 50, 0, 50, ks[j], 48, 4, 0);     /* odd block */
        gemv_fp8_m_case(&isa, &rng, 67, 0, 67, ks[j], 32, 9, 2);     /* extremes */
        gemv_fp8_m_case(&isa, &rng, 67, 64, 3, ks[j], 64, 16, 6);
    }
    /* blocks of rows over many scale rows (the AVX-512 table: ~256 KB each,
     * not scale-row aligned at k = 1536), 2 and 3 tokens in several slabs,
     * x prepared once per pass (2 x 8192) and per block and slab (3 x 8192) */
    for (size_t m = 2; m <= 3; m++) {
        gemv_fp8_m_case(&isa, &rng, 130, 0, 130, 8192, 32, m, 0);
        gemv_fp8_m_case(&isa, &rng, 512, 128, 384, 1536, 128, m, 4);
        gemv_fp8_m_case(&isa, &rng, 200, 0, 200, 5120, 32, m, 8);
    }
    /* many tokens over several blocks of rows, k slices with a tail, rows
     * not a whole number of panels (the AVX2 tiled form from 12 tokens) */
    for (size_t m = 12; m <= 16; m += 4) {
        gemv_fp8_m_case(&isa, &rng, 400, 0, 400, 1056, 32, m, 4);
        gemv_fp8_m_case(&isa, &rng, 384, 128, 250, 1536, 128, m, 12);
        gemv_fp8_m_case(&isa, &rng, 64, 32, 29, 8192, 32, m, 6);
    }
}

/* gemv_bf16_m: m tokens (strided x, strided y) against rows [r0, r0+rows)
 * of a [total, k] bf16 matrix (total - r0 - rows rows after them, which
 * the last slab's prefetch runs into), each token's outputs within
 * gemv_bf16's bound of the ref gemv_bf16 of that token; the gaps between
 * y's rows untouched.  big: x and W spread over 2^+-30 and NaN / inf in
 * some weights of row 1 (they propagate to every token of that row). */
static void gemv_bf16_m_case(const isa_t *isa, dsattn_rng *rng, size_t total, size_t r0,
                             size_t rows, size_t k, size_t m, int big)
{
    const size_t ldx = k + 3, ldy = rows + 5;
    uint16_t *W = malloc((total * k + 1) * sizeof(uint16_t));
    float *x = malloc((m * ldx + 1) * sizeof(float));
    float *y = canary_alloc(m * ldy), *yr = malloc((rows + 1) * sizeof(float));
    double *mag = calloc(rows + 1, sizeof(double));
    for (size_t i = 0; i < total * k; i++) {
        float v = dsattn_rng_uniform(rng) * 2.0f - 1.0f;
        if (big && i % 7 == 0) v *= (i % 2) ? 0x1p30f : 0x1p-30f;
        W[i] = dsattn_f32_to_bf16(v);
    }
    if (big && rows > 1 && k > 2) {
        W[(r0 + 1) * k + k / 2] = 0x7fc0;                     /* NaN */
        W[(r0 + 1) * k + k - 1] = 0x7f80;                     /* inf */
    }
    fill_uniform(rng, x, m * ldx);
    if (big)
        for (size_t i = 0; i < m * ldx; i += 5) x[i] *= (i % 2) ? 0x1p20f : 0x1p-20f;
    const uint16_t *Wc = W + r0 * k;
    isa->k->gemv_bf16_m(Wc, x, ldx, m, y, ldy, rows, k);
    for (size_t t = 0; t < m; t++) {
        const float *xt = x + t * ldx;
        dsattn_kernels_ref.gemv_bf16(Wc, xt, yr, rows, k);
        for (size_t r = 0; r < rows; r++) {
            mag[r] = 0;
            for (size_t i = 0; i < k; i++)
                mag[r] += fabs((double)dsattn_bf16_to_f32(Wc[r * k + i]) * xt[i]);
        }
        check_bound("gemv_bf16_m", isa, y + t * ldy, yr, mag, rows, k, m * 100000 + rows, k);
        for (size_t r = rows; r < ldy && t + 1 < m; r++)
            CHECK_MSG(!memcmp(&y[t * ldy + r], &(float){ CANARY }, 4),
                      "gemv_bf16_m[%s] wrote into y's gap (token %zu)", isa->k->name, t);
    }
    CHECK_MSG(canary_ok(y, m * ldy), "gemv_bf16_m[%s] wrote outside y", isa->k->name);
    free(W); free(x); canary_free(y); free(yr); free(mag);
}

/* Every token count of a batched step (1..17: whole and partial passes of
 * eight), k of one slab, several and a slab tail, k not a multiple of the
 * lanes, an odd row count (the AVX-512 table's single last row), k = 0. */
static void run_gemv_bf16_m(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    if (!isa.k->gemv_bf16_m) {
        dsattn_test_skip("this table has no gemv_bf16_m (its callers loop gemv_bf16)");
        return;
    }
    dsattn_rng rng = { 23 };
    for (size_t m = 1; m <= 17; m++) {
        gemv_bf16_m_case(&isa, &rng, 40, 0, 37, 1024 + 64, m, 0);
        gemv_bf16_m_case(&isa, &rng, 9, 2, 5, 4096 + 5, m, m % 3 == 0);
    }
    const size_t ks[] = { 0, 1, 7, 31, 64, 100, 1025, 2048, 8192 + 17 };
    for (size_t j = 0; j < DSATTN_ARRAY_LEN(ks); j++) {
        gemv_bf16_m_case(&isa, &rng, 12, 1, 11, ks[j], 8, 0);
        gemv_bf16_m_case(&isa, &rng, 6, 0, 3, ks[j], 3, 1);
        gemv_bf16_m_case(&isa, &rng, 6, 3, 1, ks[j], 16, 0);
    }
}

DSATTN_TEST(kernels, gemv_avx512)        { run_gemv("avx512"); }
DSATTN_TEST(kernels, gemv_avx2)          { run_gemv("avx2"); }
DSATTN_TEST(kernels, gemv_avx2_expshift) { run_gemv("avx2-expshift"); }
DSATTN_TEST(kernels, gemv_avx512_expshift) { run_gemv("avx512-expshift"); }
DSATTN_TEST(kernels, gemv_neon)          { run_gemv("neon"); }
DSATTN_TEST(kernels, gemv_fp8_rows_avx512) { run_gemv_fp8_ranges("avx512"); }
DSATTN_TEST(kernels, gemv_fp8_rows_avx2)   { run_gemv_fp8_ranges("avx2"); }
DSATTN_TEST(kernels, gemv_fp8_rows_avx2_expshift) { run_gemv_fp8_ranges("avx2-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_rows_avx512_expshift) { run_gemv_fp8_ranges("avx512-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_extremes_avx512) { run_gemv_fp8_extremes("avx512"); }
DSATTN_TEST(kernels, gemv_fp8_extremes_avx2)   { run_gemv_fp8_extremes("avx2"); }
DSATTN_TEST(kernels, gemv_fp8_extremes_avx2_expshift) { run_gemv_fp8_extremes("avx2-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_extremes_avx512_expshift) { run_gemv_fp8_extremes("avx512-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_extremes_neon)   { run_gemv_fp8_extremes("neon"); }
DSATTN_TEST(kernels, gemv_fp8_rows_neon)   { run_gemv_fp8_ranges("neon"); }
DSATTN_TEST(kernels, gemv_fp8_m_avx512) { run_gemv_fp8_m("avx512"); }
DSATTN_TEST(kernels, gemv_fp8_m_avx2)   { run_gemv_fp8_m("avx2"); }
DSATTN_TEST(kernels, gemv_fp8_m_avx2_expshift) { run_gemv_fp8_m("avx2-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_m_avx512_expshift) { run_gemv_fp8_m("avx512-expshift"); }
DSATTN_TEST(kernels, gemv_fp8_m_neon)   { run_gemv_fp8_m("neon"); }
DSATTN_TEST(kernels, gemv_bf16_m_avx512) { run_gemv_bf16_m("avx512"); }
DSATTN_TEST(kernels, gemv_bf16_m_avx2)   { run_gemv_bf16_m("avx2"); }
DSATTN_TEST(kernels, gemv_bf16_m_neon)   { run_gemv_bf16_m("neon"); }
DSATTN_TEST(kernels, gemv_fp8_pairs_avx2)   { run_gemv_fp8_pairs("avx2"); }
DSATTN_TEST(kernels, gemv_fp8_pairs_avx2_expshift) { run_gemv_fp8_pairs("avx2-expshift"); }
DSATTN_TEST(kernels, gemv_fp4_scales_avx512) { run_gemv_fp4_special("avx512"); }
DSATTN_TEST(kernels, gemv_fp4_scales_avx2)   { run_gemv_fp4_special("avx2"); }
DSATTN_TEST(kernels, gemv_fp4_scales_neon)   { run_gemv_fp4_special("neon"); }

/* Empty sums (k = 0, d = 0) write zeros like the reference. */
static void run_empty(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    const dsattn_kernels *k = isa.k;
    float y[20], q[4] = { 1, 2, 3, 4 }, x[1] = { 1 }, sc[1] = { 1 };
    uint8_t w[1] = { 0 }, row[1] = { 0 };
    const uint8_t *rows[2] = { row, row };
    float W[1] = { 1 };
    uint16_t Wb[1] = { 0 };
#define EMPTY(call, n)                                                        \
    do {                                                                      \
        for (int i = 0; i < 20; i++) y[i] = 9.0f;                             \
        call;                                                                 \
        for (int i = 0; i < (n); i++) CHECK_MSG(y[i] == 0.0f, "%s[%s] k=0 y[%d]=%g", #call, name, i, (double)y[i]); \
    } while (0)
    EMPTY(k->gemv_f32(W, x, y, 5, 0), 5);
    EMPTY(k->gemv_bf16(Wb, x, y, 5, 0), 5);
    EMPTY(k->gemv_fp8(w, sc, 32, 1, x, y, 5, 0), 5);
    EMPTY(k->gemv_fp4(w, w, x, y, 5, 0), 5);
    EMPTY(y[0] = k->dot_f32(q, q, 0), 1);
    EMPTY(k->mdot_f32(q, 0, 4, q, 0, y), 4);
    EMPTY(k->mdot_fp4e4m3(q, 0, 4, row, 0, y), 4);
    EMPTY(k->mdot_fp4e4m3(q, 0, 12, row, 0, y), 12);
    EMPTY(k->mdot_fp4ue8m0(q, 0, 12, row, 0, y), 12);
    EMPTY(k->mdot_fp8ue8m0(q, 0, 12, row, 0, y), 12);
    EMPTY(k->mdot_fp4e4m3_rows(q, 0, 9, rows, 2, 0, y, 9), 18);
#undef EMPTY
}

DSATTN_TEST(kernels, empty_avx512) { run_empty("avx512"); }
DSATTN_TEST(kernels, empty_avx2)   { run_empty("avx2"); }
DSATTN_TEST(kernels, empty_neon)   { run_empty("neon"); }

/* The bound is tight enough to see one slipped term: perturb the reference
 * by one typical |w_i x_i| and the check must fail. */
DSATTN_TEST(kernels, bound_is_sharp)
{
    isa_t isa = { &dsattn_kernels_ref, 16 };
    dsattn_rng rng = { 3 };
    size_t k = 5120;
    float *w = malloc(k * sizeof(float)), *x = malloc(k * sizeof(float));
    fill_uniform(&rng, w, k);
    fill_uniform(&rng, x, k);
    double mag = 0;
    for (size_t i = 0; i < k; i++) mag += fabs((double)w[i] * x[i]);
    float y = dsattn_kernels_ref.dot_f32(w, x, k);
    float slipped = (float)((double)y + mag / (double)k);    /* one average term */
    CHECK(fabs((double)slipped - y) > bound(&isa, k, mag));
    isa.lanes = 8;
    CHECK(fabs((double)slipped - y) > bound(&isa, k, mag));
    free(w); free(x);
}

/* ==== dot / mdot / maxpy ================================================ */

static void run_dots(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 11 };
    const size_t ns[] = { 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70,
                          127, 128, 129, 511, 512, 513, 5120 };
    const size_t nhs[] = { 1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 33, 64 };
    for (size_t a = 0; a < DSATTN_ARRAY_LEN(ns); a++) {
        size_t n = ns[a];
        float *u = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        fill_uniform(&rng, u, n);
        fill_uniform(&rng, v, n);
        double mag = 0;
        for (size_t i = 0; i < n; i++) mag += fabs((double)u[i] * v[i]);
        float got = isa.k->dot_f32(u, v, n), want = dsattn_kernels_ref.dot_f32(u, v, n);
        check_bound("dot_f32", &isa, &got, &want, &mag, 1, n, n, 0);
        for (size_t b = 0; b < DSATTN_ARRAY_LEN(nhs); b++) {
            size_t nh = nhs[b], ldq = n + 5;
            float *q = malloc(nh * ldq * sizeof(float));
            float *o = canary_alloc(nh), *orf = malloc(nh * sizeof(float));
            double *mg = calloc(nh, sizeof(double));
            fill_uniform(&rng, q, nh * ldq);
            isa.k->mdot_f32(q, ldq, nh, v, n, o);
            dsattn_kernels_ref.mdot_f32(q, ldq, nh, v, n, orf);
            for (size_t h = 0; h < nh; h++)
                for (size_t i = 0; i < n; i++) mg[h] += fabs((double)q[h * ldq + i] * v[i]);
            check_bound("mdot_f32", &isa, o, orf, mg, nh, n, nh, n);
            CHECK_MSG(canary_ok(o, nh), "mdot_f32[%s] canary", name);

            /* maxpy: acc rows of stride ldq; one rounding each side */
            float *acc = canary_alloc(nh * ldq), *accr = malloc(nh * ldq * sizeof(float));
            float *p = malloc(nh * sizeof(float));
            fill_uniform(&rng, acc, nh * ldq);
            fill_uniform(&rng, p, nh);
            memcpy(accr, acc, nh * ldq * sizeof(float));
            float *acc0 = malloc(nh * ldq * sizeof(float));
            memcpy(acc0, acc, nh * ldq * sizeof(float));
            isa.k->maxpy_f32(p, nh, v, n, acc, ldq);
            dsattn_kernels_ref.maxpy_f32(p, nh, v, n, accr, ldq);
            int bad = 0;
            for (size_t h = 0; h < nh && !bad; h++)
                for (size_t i = 0; i < ldq; i++) {
                    size_t j = h * ldq + i;
                    if (i >= n) {   /* padding of each acc row untouched */
                        if (memcmp(&acc[j], &acc0[j], 4)) bad = 1;
                        continue;
                    }
                    double lim = 0x1p-23 * (fabs(acc0[j]) + fabs((double)p[h] * v[i])) + 0x1p-149;
                    if (fabs((double)acc[j] - accr[j]) > lim) bad = 1;
                }
            CHECK_MSG(!bad, "maxpy_f32[%s] n=%zu nh=%zu", name, n, nh);
            CHECK_MSG(canary_ok(acc, nh * ldq), "maxpy_f32[%s] canary", name);
            free(q); canary_free(o); free(orf); free(mg);
            canary_free(acc); free(accr); free(p); free(acc0);
        }
        free(u); free(v);
    }
}

DSATTN_TEST(kernels, dots_avx512) { run_dots("avx512"); }
DSATTN_TEST(kernels, dots_avx2)   { run_dots("avx2"); }
DSATTN_TEST(kernels, dots_neon)   { run_dots("neon"); }

/* ==== Packed rows: bit-exact dequant ==================================== */

static int same_bits(const float *a, const float *b, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (memcmp(&a[i], &b[i], 4)) { *where = i; return 0; }
    }
    return 1;
}

typedef void (*deq_fn)(const uint8_t *, size_t, float *);

static void deq_check(const char *what, const char *isa, deq_fn fast, deq_fn exact,
                      const uint8_t *row, size_t d)
{
    float *a = canary_alloc(d), *b = malloc(d * sizeof(float));
    size_t at = 0;
    fast(row, d, a);
    exact(row, d, b);
    if (!same_bits(a, b, d, &at))
        dsattn_test_fail(__FILE__, __LINE__, "%s[%s] d=%zu [%zu]: got %a want %a", what,
                         isa, d, at, (double)a[at], (double)b[at]);
    CHECK_MSG(canary_ok(a, d), "%s[%s] canary d=%zu", what, isa, d);
    canary_free(a);
    free(b);
}

static void run_dequant(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    const dsattn_kernels *k = isa.k;
    uint8_t row[4096];
    /* Exhaustive: every payload byte under every scale byte. */
    for (int s = 0; s < 256; s++) {
        size_t d = 512;                                       /* 288 B */
        for (size_t i = 0; i < d / 2; i++) row[i] = (uint8_t)i;
        memset(row + d / 2, s, d / 16);
        deq_check("dequant_fp4e4m3_row", name, k->dequant_fp4e4m3_row, dsattn_v41_kv_unpack, row, d);
        for (size_t i = 0; i < d; i++) row[i] = (uint8_t)i;  /* 528 B */
        memset(row + d, s, d / 32);
        deq_check("dequant_fp8ue8m0_row", name, k->dequant_fp8ue8m0_row, dsattn_v41_swa_unpack, row, d);
        d = 128;                                              /* 68 B */
        for (int part = 0; part < 4; part++) {
            for (size_t i = 0; i < d / 2; i++) row[i] = (uint8_t)(64 * part + (int)i);
            memset(row + d / 2, s, d / 32);
            deq_check("dequant_fp4ue8m0_row", name, k->dequant_fp4ue8m0_row, dsattn_fp4_index_unpack, row, d);
        }
    }
    /* Random bytes, every legal size up to 1056, plus packed real rows. */
    dsattn_rng rng = { 5 };
    for (size_t d = 16; d <= 1056; d += 16) {
        for (size_t i = 0; i < sizeof row; i++) row[i] = rnd_byte(&rng);
        deq_check("dequant_fp4e4m3_row", name, k->dequant_fp4e4m3_row, dsattn_v41_kv_unpack, row, d);
        if (d % 32) continue;
        deq_check("dequant_fp8ue8m0_row", name, k->dequant_fp8ue8m0_row, dsattn_v41_swa_unpack, row, d);
        deq_check("dequant_fp4ue8m0_row", name, k->dequant_fp4ue8m0_row, dsattn_fp4_index_unpack, row, d);
    }
    for (int t = 0; t < 20; t++) {
        float x[512];
        for (size_t i = 0; i < 512; i++) x[i] = 3.0f * dsattn_rng_normal(&rng);
        dsattn_v41_kv_pack(x, 512, row, NULL);
        deq_check("dequant_fp4e4m3_row", name, k->dequant_fp4e4m3_row, dsattn_v41_kv_unpack, row, 512);
        dsattn_v41_swa_pack(x, 512, row, NULL);
        deq_check("dequant_fp8ue8m0_row", name, k->dequant_fp8ue8m0_row, dsattn_v41_swa_unpack, row, 512);
        dsattn_fp4_index_pack(x, 128, row, NULL);
        deq_check("dequant_fp4ue8m0_row", name, k->dequant_fp4ue8m0_row, dsattn_fp4_index_unpack, row, 128);
    }
}

DSATTN_TEST(kernels, dequant_rows_avx512) { run_dequant("avx512"); }
DSATTN_TEST(kernels, dequant_rows_avx2)   { run_dequant("avx2"); }
DSATTN_TEST(kernels, dequant_rows_neon)   { run_dequant("neon"); }

/* ==== Fused row kernels ================================================= */

/* A random valid row: finite codes, moderate scales. */
static void random_row(dsattn_rng *rng, int fmt, size_t d, uint8_t *row)
{
    if (fmt == 2) {
        for (size_t i = 0; i < d; i++) row[i] = rnd_e4m3(rng);
        for (size_t b = 0; b < d / 32; b++) row[d + b] = (uint8_t)(120 + dsattn_rng_u64(rng) % 12);
    } else {
        for (size_t i = 0; i < d / 2; i++) row[i] = rnd_byte(rng);
        if (fmt == 0)
            for (size_t b = 0; b < d / 16; b++) row[d / 2 + b] = (uint8_t)(rnd_e4m3(rng) & 0x7f);
        else
            for (size_t b = 0; b < d / 32; b++) row[d / 2 + b] = (uint8_t)(120 + dsattn_rng_u64(rng) % 12);
    }
}

static void run_fused(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    const dsattn_kernels *k = isa.k, *ref = &dsattn_kernels_ref;
    dsattn_rng rng = { 13 };
    const size_t ds[] = { 16, 32, 48, 64, 128, 496, 512, 528, 1024, 1056, 2080 };
    const size_t nhs[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 33, 64 };
    static uint8_t row[8192];
    static float deq[4096];
    for (int fmt = 0; fmt < 3; fmt++) {
        deq_fn dq = fmt == 0 ? ref->dequant_fp4e4m3_row
                  : fmt == 1 ? ref->dequant_fp4ue8m0_row : ref->dequant_fp8ue8m0_row;
        for (size_t a = 0; a < DSATTN_ARRAY_LEN(ds); a++) {
            size_t d = ds[a];
            if (fmt != 0 && d % 32) continue;
            for (size_t b = 0; b < DSATTN_ARRAY_LEN(nhs); b++) {
                size_t nh = nhs[b], ldq = d + 3;
                random_row(&rng, fmt, d, row);
                dq(row, d, deq);
                float *q = malloc(nh * ldq * sizeof(float));
                float *o = canary_alloc(nh), *orf = malloc(nh * sizeof(float));
                double *mg = calloc(nh, sizeof(double));
                fill_uniform(&rng, q, nh * ldq);
                for (size_t h = 0; h < nh; h++)
                    for (size_t i = 0; i < d; i++) mg[h] += fabs((double)q[h * ldq + i] * deq[i]);
                const char *what = fmt == 0 ? "mdot_fp4e4m3" : fmt == 1 ? "mdot_fp4ue8m0" : "mdot_fp8ue8m0";
                if (fmt == 0) { k->mdot_fp4e4m3(q, ldq, nh, row, d, o); ref->mdot_fp4e4m3(q, ldq, nh, row, d, orf); }
                if (fmt == 1) { k->mdot_fp4ue8m0(q, ldq, nh, row, d, o); ref->mdot_fp4ue8m0(q, ldq, nh, row, d, orf); }
                if (fmt == 2) { k->mdot_fp8ue8m0(q, ldq, nh, row, d, o); ref->mdot_fp8ue8m0(q, ldq, nh, row, d, orf); }
                check_bound(what, &isa, o, orf, mg, nh, d, nh, d);
                CHECK_MSG(canary_ok(o, nh), "%s[%s] canary", what, name);
                free(q); canary_free(o); free(orf); free(mg);
                if (fmt == 1) continue;

                /* maxpy over the same row */
                float *acc = canary_alloc(nh * ldq), *accr = malloc(nh * ldq * sizeof(float));
                float *acc0 = malloc(nh * ldq * sizeof(float)), *p = malloc(nh * sizeof(float));
                fill_uniform(&rng, acc, nh * ldq);
                fill_uniform(&rng, p, nh);
                memcpy(accr, acc, nh * ldq * sizeof(float));
                memcpy(acc0, acc, nh * ldq * sizeof(float));
                if (fmt == 0) { k->maxpy_fp4e4m3(p, nh, row, d, acc, ldq); ref->maxpy_fp4e4m3(p, nh, row, d, accr, ldq); }
                else          { k->maxpy_fp8ue8m0(p, nh, row, d, acc, ldq); ref->maxpy_fp8ue8m0(p, nh, row, d, accr, ldq); }
                int bad = 0;
                for (size_t h = 0; h < nh && !bad; h++)
                    for (size_t i = 0; i < ldq; i++) {
                        size_t j = h * ldq + i;
                        if (i >= d) { bad |= memcmp(&acc[j], &acc0[j], 4) != 0; continue; }
                        double lim = 0x1p-23 * (fabs(acc0[j]) + fabs((double)p[h] * deq[i])) + 0x1p-149;
                        bad |= !(fabs((double)acc[j] - accr[j]) <= lim);
                    }
                CHECK_MSG(!bad, "maxpy fmt %d [%s] d=%zu nh=%zu", fmt, name, d, nh);
                CHECK_MSG(canary_ok(acc, nh * ldq), "maxpy fmt %d [%s] canary", fmt, name);
                canary_free(acc); free(accr); free(acc0); free(p);
            }
        }
    }
}

/* Many rows per call: gathered (non-contiguous) rows, odd counts, out
 * stride > nh, against the per-row reference. */
static void run_fused_multi(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 21 };
    const size_t ds[] = { 16, 32, 48, 512, 528, 1056 };
    const size_t nhs[] = { 1, 2, 3, 4, 5, 8, 9, 16, 64 };
    const size_t nrs[] = { 1, 2, 3, 7, 8, 9, 16, 17 };
    static uint8_t pool[40 * 600];
    static float deq[1056];
    for (size_t a = 0; a < DSATTN_ARRAY_LEN(ds); a++) {
        size_t d = ds[a], rb = dsattn_v41_kv_row_bytes(d);
        for (size_t b = 0; b < DSATTN_ARRAY_LEN(nhs); b++)
            for (size_t c = 0; c < DSATTN_ARRAY_LEN(nrs); c++) {
                size_t nh = nhs[b], nr = nrs[c], ldq = d + 1, ldo = nh + 2;
                const uint8_t *rows[17];
                for (size_t r = 0; r < 40 && (r + 1) * rb <= sizeof pool; r++)
                    random_row(&rng, 0, d, pool + r * rb);
                size_t npool = sizeof pool / rb < 40 ? sizeof pool / rb : 40;
                for (size_t r = 0; r < nr; r++)
                    rows[r] = pool + (size_t)(dsattn_rng_u64(&rng) % npool) * rb;
                float *q = malloc(nh * ldq * sizeof(float));
                float *o = canary_alloc(nr * ldo), *orf = malloc(nr * ldo * sizeof(float));
                double *mg = calloc(nr * ldo, sizeof(double));
                fill_uniform(&rng, q, nh * ldq);
                for (size_t i = 0; i < nr * ldo; i++) orf[i] = o[i] = -7.0f;  /* gaps stay */
                isa.k->mdot_fp4e4m3_rows(q, ldq, nh, rows, nr, d, o, ldo);
                dsattn_kernels_ref.mdot_fp4e4m3_rows(q, ldq, nh, rows, nr, d, orf, ldo);
                for (size_t r = 0; r < nr; r++) {
                    dsattn_v41_kv_unpack(rows[r], d, deq);
                    for (size_t h = 0; h < nh; h++)
                        for (size_t i = 0; i < d; i++)
                            mg[r * ldo + h] += fabs((double)q[h * ldq + i] * deq[i]);
                }
                check_bound("mdot_fp4e4m3_rows", &isa, o, orf, mg, nr * ldo, d, nh, nr);
                CHECK_MSG(canary_ok(o, nr * ldo), "mdot_fp4e4m3_rows[%s] canary", name);

                /* P.V over the same rows: p [nh, ldp], acc [nh, ldq]; each
                 * element takes nr FMAs where ref rounds once */
                size_t ldp = nr + 3;
                float *p = malloc(nh * ldp * sizeof(float));
                float *acc = canary_alloc(nh * ldq), *accr = malloc(nh * ldq * sizeof(float));
                float *acc0 = malloc(nh * ldq * sizeof(float));
                fill_uniform(&rng, p, nh * ldp);
                fill_uniform(&rng, acc, nh * ldq);
                memcpy(accr, acc, nh * ldq * sizeof(float));
                memcpy(acc0, acc, nh * ldq * sizeof(float));
                isa.k->maxpy_fp4e4m3_rows(p, ldp, nh, rows, nr, d, acc, ldq);
                dsattn_kernels_ref.maxpy_fp4e4m3_rows(p, ldp, nh, rows, nr, d, accr, ldq);
                int bad = 0;
                float *dq = malloc(nr * d * sizeof(float));
                for (size_t r = 0; r < nr; r++) dsattn_v41_kv_unpack(rows[r], d, dq + r * d);
                for (size_t h = 0; h < nh && !bad; h++)
                    for (size_t i = 0; i < ldq; i++) {
                        size_t j = h * ldq + i;
                        if (i >= d) { bad |= memcmp(&acc[j], &acc0[j], 4) != 0; continue; }
                        double m = fabs(acc0[j]);
                        for (size_t r = 0; r < nr; r++)
                            m += fabs((double)p[h * ldp + r] * dq[r * d + i]);
                        double lim = ((double)nr + 2.0) * 0x1p-24 * m * 1.0001 + 0x1p-149;
                        if (!(fabs((double)acc[j] - accr[j]) <= lim)) {
                            bad = 1;
                            dsattn_test_fail(__FILE__, __LINE__,
                                             "maxpy_fp4e4m3_rows[%s] d=%zu nh=%zu nr=%zu [%zu,%zu]: %.9g vs %.9g",
                                             name, d, nh, nr, h, i, (double)acc[j], (double)accr[j]);
                            break;
                        }
                    }
                CHECK_MSG(canary_ok(acc, nh * ldq), "maxpy_fp4e4m3_rows[%s] canary", name);
                free(dq);
                free(p); canary_free(acc); free(accr); free(acc0);
                free(q); canary_free(o); free(orf); free(mg);
            }
    }
}

DSATTN_TEST(kernels, fused_multi_avx512) { run_fused_multi("avx512"); }
DSATTN_TEST(kernels, fused_multi_avx2)   { run_fused_multi("avx2"); }
DSATTN_TEST(kernels, fused_multi_neon)   { run_fused_multi("neon"); }

DSATTN_TEST(kernels, fused_rows_avx512) { run_fused("avx512"); }
DSATTN_TEST(kernels, fused_rows_avx2)   { run_fused("avx2"); }
DSATTN_TEST(kernels, fused_rows_neon)   { run_fused("neon"); }

/* ==== bf16 rows ========================================================= */

/* cvt_bf16_f32: bit-exact over all 65536 patterns (NaN payloads too), any
 * length and start; mdot_bf16_rows: every tile shape and tail of both ISAs
 * (heads 1..17, rows 1..33, k not a multiple of the lanes), row stride
 * != k, output stride != nh with the gaps and canaries untouched. */
static void run_bf16_rows(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 29 };
    {
        const size_t N = 65536;
        uint16_t *src = malloc(N * sizeof(uint16_t));
        float *o = canary_alloc(N), *orf = malloc(N * sizeof(float));
        for (size_t i = 0; i < N; i++) src[i] = (uint16_t)(i * 40503u);   /* a permutation */
        isa.k->cvt_bf16_f32(src, N, o);
        dsattn_kernels_ref.cvt_bf16_f32(src, N, orf);
        CHECK_MSG(!memcmp(o, orf, N * sizeof(float)), "cvt_bf16_f32[%s] not bit-exact", name);
        CHECK_MSG(canary_ok(o, N), "cvt_bf16_f32[%s] canary", name);
        canary_free(o);
        const size_t lens[] = { 0, 1, 7, 8, 15, 16, 17, 33, 576 };
        for (size_t a = 0; a < DSATTN_ARRAY_LEN(lens); a++) {
            size_t n = lens[a];
            float *t = canary_alloc(n);
            isa.k->cvt_bf16_f32(src + 3, n, t);
            CHECK_MSG(!memcmp(t, orf + 3, n * sizeof(float)) && canary_ok(t, n),
                      "cvt_bf16_f32[%s] n=%zu", name, n);
            canary_free(t);
        }
        free(src); free(orf);
    }
    const size_t nhs[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 17 };
    const size_t nrs[] = { 1, 2, 3, 5, 8, 16, 17, 33 };
    const size_t ks[] = { 1, 7, 8, 15, 16, 17, 64, 100, 128, 576 };
    for (size_t a = 0; a < DSATTN_ARRAY_LEN(ks); a++)
        for (size_t b = 0; b < DSATTN_ARRAY_LEN(nhs); b++)
            for (size_t c = 0; c < DSATTN_ARRAY_LEN(nrs); c++) {
                size_t k = ks[a], nh = nhs[b], nr = nrs[c];
                size_t ldq = k + 5, ldr = k + 3, ldo = nh + 2, no = nr * ldo;
                float *q = malloc(nh * ldq * sizeof(float));
                uint16_t *rows = malloc(nr * ldr * sizeof(uint16_t));
                fill_uniform(&rng, q, nh * ldq);
                for (size_t i = 0; i < nr * ldr; i++)
                    rows[i] = dsattn_f32_to_bf16(dsattn_rng_uniform(&rng) * 4.0f);
                float *o = canary_alloc(no), *orf = malloc(no * sizeof(float));
                for (size_t i = 0; i < no; i++) o[i] = orf[i] = -7.0f;    /* gaps */
                isa.k->mdot_bf16_rows(q, ldq, nh, rows, ldr, nr, k, o, ldo);
                dsattn_kernels_ref.mdot_bf16_rows(q, ldq, nh, rows, ldr, nr, k, orf, ldo);
                double *mg = calloc(no, sizeof(double));
                for (size_t r = 0; r < nr; r++)
                    for (size_t h = 0; h < nh; h++)
                        for (size_t i = 0; i < k; i++)
                            mg[r * ldo + h] += fabs((double)q[h * ldq + i] *
                                                    dsattn_bf16_to_f32(rows[r * ldr + i]));
                int gaps = 1;
                for (size_t r = 0; r < nr; r++)
                    for (size_t h = nh; h < ldo; h++) gaps &= o[r * ldo + h] == -7.0f;
                CHECK_MSG(gaps, "mdot_bf16_rows[%s] wrote outside nh (nh=%zu)", name, nh);
                check_bound("mdot_bf16_rows", &isa, o, orf, mg, no, k, nh * 1000 + nr, k);
                CHECK_MSG(canary_ok(o, no), "mdot_bf16_rows[%s] canary", name);
                free(q); free(rows); canary_free(o); free(orf); free(mg);
            }
}

DSATTN_TEST(kernels, bf16_rows_avx512) { run_bf16_rows("avx512"); }
DSATTN_TEST(kernels, bf16_rows_avx2)   { run_bf16_rows("avx2"); }
DSATTN_TEST(kernels, bf16_rows_neon)   { run_bf16_rows("neon"); }

/* ==== Table completeness and ISA choice ================================= */

static int table_complete(const dsattn_kernels *k)
{
    return k->name && k->gemv_f32 && k->gemv_bf16 && k->gemv_fp8 && k->gemv_fp4 &&
           k->dot_f32 && k->mdot_f32 && k->maxpy_f32 && k->dequant_fp4e4m3_row &&
           k->dequant_fp8ue8m0_row && k->dequant_fp4ue8m0_row && k->mdot_fp4e4m3 &&
           k->mdot_fp4e4m3_rows && k->maxpy_fp4e4m3_rows &&
           k->maxpy_fp4e4m3 && k->mdot_fp4ue8m0 && k->mdot_fp8ue8m0 && k->maxpy_fp8ue8m0 &&
           k->cvt_bf16_f32 && k->mdot_bf16_rows && k->gemv_fp8_finite;
}

/* ==== Activation quantization =========================================== */

/* Every path's act_quant_fp8_pow2 is the scalar quantizer's deq output bit
 * for bit: random blocks at several magnitudes, E4M3 grid midpoints (ties
 * to even), the subnormal/normal edge, values that clamp at 448, signed
 * zeros, and blocks holding NaN or +-inf. */
static void run_actq(const char *name)
{
    isa_t isa;
    if (!get_isa(name, &isa)) return;
    dsattn_rng rng = { 77 };
    const size_t blocks[] = { 16, 32, 128 };
    float x[1024], want[1024], got[1024];
    int bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        const size_t block = blocks[trial % 3], n = block * (1 + (size_t)trial % 5);
        const float mag = ldexpf(1.0f, (trial % 41) - 20);
        for (size_t i = 0; i < n; i++) {
            float u = (float)(dsattn_rng_u64(&rng) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
            x[i] = u * mag;
        }
        const size_t amax_at = (size_t)trial % n;
        x[amax_at] = mag * 448.0f / 512.0f;       /* sets the scale: s = mag / 512 */
        switch (trial % 8) {
        case 1: /* E4M3 midpoints at that scale, both tie directions */
            for (size_t i = 0; i < n && i < 24; i++)
                if (i != amax_at)
                    x[i] = (float)(17 + 2 * (int)i) / 16.0f * ldexpf(mag / 512.0f, (int)i % 9 - 3);
            break;
        case 2: /* around the subnormal edge 2^-6 (times the scale) */
            for (size_t i = 0; i < n && i < 16; i++)
                if (i != amax_at) x[i] = (0.0155f + 0.0002f * (float)i) * (mag / 512.0f);
            break;
        case 3: x[(amax_at + 1) % n] = -0.0f; x[(amax_at + 2) % n] = 0.0f; break;
        case 4: x[(amax_at + 3) % n] = __builtin_nanf(""); break;
        case 5: x[(amax_at + 1) % n] = INFINITY; break;
        case 6: x[(amax_at + 1) % n] = -INFINITY; x[(amax_at + 2) % n] = 1.0f; break;
        case 7: x[amax_at] = mag * 470.0f / 512.0f; break;   /* rounds past 448 * s */
        default: break;
        }
        dsattn_kernels_ref.act_quant_fp8_pow2(x, n, block, want);
        isa.k->act_quant_fp8_pow2(x, n, block, got);
        for (size_t i = 0; i < n; i++) {
            int same = isnan(want[i]) ? isnan(got[i])
                                      : memcmp(&want[i], &got[i], sizeof(float)) == 0;
            if (!same && bad++ < 5)
                CHECK_MSG(0, "act_quant[%s] trial %d block %zu i %zu: x %a want %a got %a",
                          isa.k->name, trial, block, i, (double)x[i], (double)want[i],
                          (double)got[i]);
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* a block that is not a multiple of 16 lanes takes the scalar form */
    for (size_t i = 0; i < 80; i++) x[i] = (float)i * 0.37f - 9.0f;
    dsattn_kernels_ref.act_quant_fp8_pow2(x, 80, 40, want);
    isa.k->act_quant_fp8_pow2(x, 80, 40, got);
    CHECK(memcmp(want, got, 80 * sizeof(float)) == 0);
}

DSATTN_TEST(kernels, act_quant_avx512) { run_actq("avx512"); }
DSATTN_TEST(kernels, act_quant_avx2)   { run_actq("avx2"); }
DSATTN_TEST(kernels, act_quant_neon)   { run_actq("neon"); }

DSATTN_TEST(kernels, tables_complete)
{
    CHECK(table_complete(&dsattn_kernels_ref));
    CHECK(!strcmp(dsattn_kernels_ref.name, "ref"));
    if (dsattn_kernels_avx2_ptr) {
        CHECK(table_complete(dsattn_kernels_avx2_ptr));
        CHECK(!strcmp(dsattn_kernels_avx2_ptr->name, "avx2"));
        CHECK(dsattn_kernels_avx2_expshift_ptr &&
              table_complete(dsattn_kernels_avx2_expshift_ptr));
    }
    if (dsattn_kernels_avx512_ptr) {
        CHECK(table_complete(dsattn_kernels_avx512_ptr));
        CHECK(!strcmp(dsattn_kernels_avx512_ptr->name, "avx512"));
        CHECK(dsattn_kernels_avx512_expshift_ptr &&
              table_complete(dsattn_kernels_avx512_expshift_ptr));
    }
    if (dsattn_kernels_neon_ptr) {
        CHECK(table_complete(dsattn_kernels_neon_ptr));
        CHECK(!strcmp(dsattn_kernels_neon_ptr->name, "neon"));
    }
#if defined(__aarch64__)
    CHECK(dsattn_kernels_neon_ptr && !dsattn_kernels_avx2_ptr && !dsattn_kernels_avx512_ptr);
#elif defined(__x86_64__)
    CHECK(!dsattn_kernels_neon_ptr);
#endif
}

/* Every slot of every sub-table filled (a NULL entry would crash the
 * algorithm code that trusts a non-NULL slot). */
static int mla_complete(const dsattn_mla_kern *m)
{
    return m->name && m->qk && m->softmax && m->pv && m->tile_rows && m->tile_bf16 &&
           m->v32_row && m->fp8w_axpy && m->fp8w_dot && m->fp8w_axpy4 && m->fp8w_dot4 &&
           m->bf16w_axpy && m->round_bf16 && m->relu_wsum;
}

static int ktab_complete(const dsattn_ktab *t)
{
    /* the table's name is its ISA's; the k table's starts with it
     * ("avx2-expshift" is an AVX2 table) */
    int ok = t->name && t->k && table_complete(t->k) &&
             !strncmp(t->k->name, t->name, strlen(t->name));
    ok &= t->wdq && t->wdq->name && t->wdq->fp8_row != NULL;         /* never NULL */
    ok &= t->vmath && t->vmath->name && t->vmath->exp_sub_sum != NULL;
    if (t->mla) ok &= mla_complete(t->mla);
    if (t->sa) ok &= t->sa->name && t->sa->finish && t->sa->rows && t->sa->rows_bf16 &&
                     t->sa->qk && t->sa->pv;
    if (t->pgemm) ok &= t->pgemm->name && t->pgemm->pack_b && t->pgemm->tile &&
                        t->pgemm->tile_fp8;
    if (t->mha) ok &= t->mha->name && t->mha->attend && t->mha->ws_bytes;
    for (int i = 0; i < 2; i++) {
        const dsattn_amx_kern *a = i ? t->bf16blk : t->amx;
        if (a) ok &= a->name && a->fits && a->pack_q && a->begin && a->end && a->block &&
                     a->gemm_nt && a->fp8_row_bf16 && a->rows_bf16 && a->finish;
    }
    /* the bf16 blocks are the AMX tiles wherever those are in the table */
    if (t->amx) ok &= t->bf16blk == t->amx;
    if (t->index) ok &= t->index->name && t->index->ok && t->index->prepare && t->index->scores;
    /* sa and the bf16 blocks use mla's kernels (pgemm has C forms of the two it may use) */
    if (t->sa || t->amx || t->bf16blk) ok &= t->mla != NULL;
    return ok;
}

DSATTN_TEST(kernels, every_table_of_tables_complete_with_scalar_twins)
{
    /* Enumerate every table this build and CPU can hand a context (ktab.h):
     * each complete, every filled fast slot with a scalar twin that is itself
     * complete - the twins are what tests/test_kernels.c (k), test_mla.c
     * (mla, amx), test_sparse_attn.c (sa, amx), test_pgemm.c (pgemm, amx),
     * test_vmath.c (wdq, vmath), test_mha.c (mha) and test_formats.c
     * (index) check the fast slots against. */
    dsattn_ktab sc;
    dsattn_ktab_scalar(&sc);
    CHECK(table_complete(sc.k) && !strcmp(sc.k->name, "ref"));
    CHECK(sc.mla && mla_complete(sc.mla) && !strcmp(sc.mla->name, "ref"));
    CHECK(sc.sa && !strcmp(sc.sa->name, "ref") && sc.pgemm && !strcmp(sc.pgemm->name, "ref"));
    CHECK(!strcmp(sc.wdq->name, "ref") && !strcmp(sc.vmath->name, "ref"));
    CHECK(!sc.mha && !sc.amx && !sc.index);
    const dsattn_isa isas[4] = { DSATTN_ISA_REF, DSATTN_ISA_AVX2, DSATTN_ISA_AVX512,
                                 DSATTN_ISA_NEON };
    const char *names[4] = { "ref", "avx2", "avx512", "neon" };
    int seen = 0;
    for (int i = 0; i < 4; i++)
        for (int amx = 0; amx <= 1; amx++) {
            dsattn_ktab t;
            dsattn_status st = dsattn_ktab_fill(&t, isas[i], amx);
            if (st == DSATTN_ERR_UNSUPPORTED) continue;
            CHECK_OK(st);
            if (st) continue;
            seen++;
            CHECK_MSG(ktab_complete(&t), "%s amx %d", names[i], amx);
            CHECK(!strcmp(t.name, names[i]));
            /* every filled slot is the ISA's own form, and its twin exists */
            for (size_t s = 1; s < DSATTN_KTAB_SLOTS; s++) {
                const char *impl = dsattn_ktab_impl_name(&t, s);
                if (!strcmp(impl, "-")) continue;
                /* (a form of the ISA may name itself after it: "neon-dot") */
                CHECK_MSG(i == 2 || !strncmp(impl, names[i], strlen(names[i])) ||
                              !strcmp(impl, "ref"), "%s slot %s: %s",
                          names[i], dsattn_ktab_slot_name(s), impl);
                CHECK_MSG(s >= 6 || strcmp(dsattn_ktab_impl_name(&sc, s), "-"),
                          "slot %s has no scalar twin", dsattn_ktab_slot_name(s));
            }
            if (i != 2) CHECK(!t.amx && !t.bf16blk);
            CHECK(i != 0 || !t.sa);
            CHECK(i != 1 || (t.sa && !strcmp(t.sa->name, "avx2")));
            CHECK(i != 3 || (t.sa && !strcmp(t.sa->name, "neon")));
            /* the integer indexer: avx512 (VNNI / AMX-INT8), avx2 and neon */
            CHECK(i != 0 || !t.index);
            CHECK(i != 1 || (t.index && !strcmp(t.index->name, "avx2")));
            CHECK(i != 3 || (t.index && !strcmp(t.index->name, dsattn_cpu_has_neon_dotprod()
                                                                   ? "neon-dot" : "neon")));
            /* x86-64 builds have the AVX2 tiles, attend kernel, row decoder, exp */
            CHECK(i != 1 || (t.pgemm && t.mla && t.mha && !strcmp(t.wdq->name, "avx2") &&
                             !strcmp(t.vmath->name, "avx2")));
            /* aarch64 builds: the NEON attend kernel, row decoder, exp, MLA
             * and prefill tiles */
            CHECK(i != 3 || (t.mha && !strcmp(t.mha->name, "neon") &&
                             t.mla && !strcmp(t.mla->name, "neon") &&
                             t.pgemm && !strcmp(t.pgemm->name, "neon") &&
                             !strcmp(t.wdq->name, "neon") && !strcmp(t.vmath->name, "neon")));
            CHECK(i != 0 || (!t.pgemm && !t.mla));
            CHECK(i != 0 || !t.mha);
            if (!amx) CHECK(t.amx == NULL);
        }
    CHECK(seen >= 2);                       /* ref, at least, with and without amx */
    dsattn_ktab t;
    CHECK_EQ_INT(dsattn_ktab_fill(&t, DSATTN_ISA_AUTO, 0), DSATTN_ERR_INVALID_ARG);
    CHECK(!strcmp(dsattn_ktab_slot_name(DSATTN_KTAB_SLOTS), "?"));
}

static const char *ctx_isa(dsattn_mode mode, dsattn_isa isa, dsattn_status *st,
                           const dsattn_kernels **table)
{
    static char name[16];
    dsattn_ctx_params p = dsattn_ctx_default_params();
    dsattn_ctx *c = NULL;
    p.mode = mode;
    p.isa = isa;
    *st = dsattn_ctx_create(&c, &p);
    if (*st != DSATTN_OK) return "error";
    snprintf(name, sizeof name, "%s", dsattn_ctx_isa_name(c));
    *table = c->k;
    /* the context's table of tables: its base slot, its name, and the
     * ISA's sub-tables exactly as dsattn_ktab_fill gives them */
    dsattn_ktab t;
    CHECK(c->kt->k == c->k && !strcmp(c->kt->name, name));
    CHECK_OK(dsattn_ktab_fill(&t, c->isa, dsattn_ctx_amx(c)));
    CHECK(t.k == c->kt->k && t.mla == c->kt->mla && t.sa == c->kt->sa &&
          t.pgemm == c->kt->pgemm && t.wdq == c->kt->wdq && t.vmath == c->kt->vmath &&
          t.mha == c->kt->mha && t.amx == c->kt->amx && t.index == c->kt->index &&
          t.bf16blk == c->kt->bf16blk);
    /* DSATTN_AMX-style switch: off empties the slot, on refills it where it runs */
    CHECK(dsattn_ctx_set_amx(c, 0) == 0 && c->kt->amx == NULL && !dsattn_ctx_amx(c));
    CHECK(dsattn_ctx_set_amx(c, 1) == (c->kt->amx != NULL));
    CHECK(c->kt->amx == NULL || c->isa == DSATTN_ISA_AVX512);
    /* the bf16 blocks follow AMX, else the bf16-dot GEMM's switch */
    const int dot = dsattn_ctx_set_bf16dot(c, 1), amx = dsattn_ctx_amx(c);
    CHECK(amx ? c->kt->bf16blk == c->kt->amx : dot == (c->kt->bf16blk != NULL));
    /* the MHA attend: its VDPBF16PS form with those blocks where VDPBF16PS
     * runs near the FMA rate, else the FMA form */
    if (c->isa == DSATTN_ISA_AVX512)
        CHECK(c->kt->mha == (c->kt->bf16blk && !amx && dsattn_avx512_bf16dot_full_rate()
                                 ? dsattn_mha_kern_avx512_bf16_ptr : dsattn_mha_kern_avx512_ptr));
    CHECK(dsattn_ctx_set_bf16dot(c, 0) == 0 && (amx || c->kt->bf16blk == NULL));
    CHECK(c->isa != DSATTN_ISA_AVX512 || c->kt->mha == dsattn_mha_kern_avx512_ptr);
    dsattn_ctx_destroy(c);
    return name;
}

DSATTN_TEST(kernels, ctx_isa_choice)
{
    const char *old = getenv("DSATTN_ISA");
    char saved[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    unsetenv("DSATTN_ISA");
    int has512 = dsattn_cpu_has_avx512() && dsattn_kernels_avx512_ptr;
    int has2 = dsattn_cpu_has_avx2() && dsattn_kernels_avx2_ptr;
    int hasneon = dsattn_kernels_neon_ptr != NULL;
    dsattn_status st;
    const dsattn_kernels *t = NULL;

    const char *best = has512 ? "avx512" : has2 ? "avx2" : hasneon ? "neon" : "ref";
    CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AUTO, &st, &t), best));
    /* reference mode forces the scalar table whatever is asked */
    CHECK(!strcmp(ctx_isa(DSATTN_MODE_REFERENCE, DSATTN_ISA_AVX512, &st, &t), "ref"));
    CHECK(t == &dsattn_kernels_ref);
    CHECK(!strcmp(ctx_isa(DSATTN_MODE_REFERENCE, DSATTN_ISA_AUTO, &st, &t), "ref"));
    CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_REF, &st, &t), "ref"));
    CHECK(t == &dsattn_kernels_ref);
    if (has2) {
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AVX2, &st, &t), "avx2"));
        /* the exponent-shift table exactly where the FMA probe says so */
        CHECK(t == (dsattn_avx2_fma_subnormal_full_rate() ? dsattn_kernels_avx2_expshift_ptr
                                                          : dsattn_kernels_avx2_ptr));
    } else {
        ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AVX2, &st, &t);
        CHECK_EQ_INT(st, DSATTN_ERR_UNSUPPORTED);
    }
    if (has512) {
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AVX512, &st, &t), "avx512"));
        CHECK(t == (dsattn_avx2_fma_subnormal_full_rate() ? dsattn_kernels_avx512_expshift_ptr
                                                          : dsattn_kernels_avx512_ptr));
    } else {
        ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AVX512, &st, &t);
        CHECK_EQ_INT(st, DSATTN_ERR_UNSUPPORTED);
    }

    if (hasneon) {
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_NEON, &st, &t), "neon"));
        CHECK(t == dsattn_kernels_neon_ptr);
        setenv("DSATTN_ISA", "neon", 1);
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AUTO, &st, &t), "neon"));
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_REFERENCE, DSATTN_ISA_AUTO, &st, &t), "ref"));
        unsetenv("DSATTN_ISA");
    } else {
        ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_NEON, &st, &t);
        CHECK_EQ_INT(st, DSATTN_ERR_UNSUPPORTED);
    }

    /* $DSATTN_ISA steers AUTO, never an explicit request or reference mode */
    setenv("DSATTN_ISA", "ref", 1);
    CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AUTO, &st, &t), "ref"));
    if (has2) {
        setenv("DSATTN_ISA", "avx2", 1);
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AUTO, &st, &t), "avx2"));
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_REFERENCE, DSATTN_ISA_AUTO, &st, &t), "ref"));
        if (has512)
            CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AVX512, &st, &t), "avx512"));
    }
    if (has512) {
        setenv("DSATTN_ISA", "avx512", 1);
        CHECK(!strcmp(ctx_isa(DSATTN_MODE_FAST, DSATTN_ISA_AUTO, &st, &t), "avx512"));
    }

    if (old) setenv("DSATTN_ISA", saved, 1);
    else unsetenv("DSATTN_ISA");
}

/* ==== BLAS boundary ===================================================== */

#include "blas.h"

DSATTN_TEST(kernels, sgemm_rowmajor)
{
    dsattn_rng rng = { 31 };
    const size_t shapes[][3] = { { 1, 1, 1 }, { 3, 5, 7 }, { 8, 33, 70 }, { 17, 64, 513 },
                                 { 64, 96, 1280 } };
    for (size_t s = 0; s < DSATTN_ARRAY_LEN(shapes); s++) {
        size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        size_t lda = K + 3, ldb = K + 1, ldc = N + 2;
        float *A = malloc(M * lda * sizeof(float)), *B = malloc(N * ldb * sizeof(float));
        float *C = canary_alloc(M * ldc), *Cr = malloc(M * ldc * sizeof(float));
        double *mag = calloc(M * ldc, sizeof(double));
        fill_uniform(&rng, A, M * lda);
        fill_uniform(&rng, B, N * ldb);
        for (size_t i = 0; i < M * ldc; i++) C[i] = Cr[i] = 5.0f;   /* gaps stay */
        CHECK_OK(dsattn_sgemm_rowmajor(M, N, K, A, lda, B, ldb, C, ldc));
        dsattn_sgemm_rowmajor_ref(M, N, K, A, lda, B, ldb, Cr, ldc);
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++)
                for (size_t k = 0; k < K; k++)
                    mag[m * ldc + n] += fabs((double)A[m * lda + k] * B[n * ldb + k]);
        /* OpenBLAS blocks k, so any order: the generic recursive bound */
        isa_t any = { &dsattn_kernels_ref, 1 };
        check_bound("sgemm", &any, C, Cr, mag, M * ldc, K, M * 1000 + N, K);
        CHECK(canary_ok(C, M * ldc));
        free(A); free(B); canary_free(C); free(Cr); free(mag);
    }
    float a = 1, b = 1, c = 0;
    CHECK_EQ_INT(dsattn_sgemm_rowmajor(1, 1, 1, NULL, 1, &b, 1, &c, 1), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsattn_sgemm_rowmajor(1, 1, 2, &a, 1, &b, 2, &c, 1), DSATTN_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsattn_sgemm_rowmajor(1, 2, 1, &a, 1, &b, 1, &c, 1), DSATTN_ERR_INVALID_ARG);
    c = 3;
    CHECK_OK(dsattn_sgemm_rowmajor(1, 1, 0, NULL, 0, NULL, 0, &c, 1));
    CHECK(c == 0.0f);
    CHECK(dsattn_blas_corename()[0] != 0);
}

/* The attention GEMM helper: both B layouts, beta 0 and 1, against a double
 * loop; and the calling thread's OpenMP thread count is what it was. */
DSATTN_TEST(kernels, sgemm_small)
{
    dsattn_rng rng = { 37 };
    const size_t shapes[][3] = { { 1, 1, 1 }, { 5, 64, 512 }, { 64, 512, 37 } };
    const int before = omp_get_max_threads();
    for (size_t s = 0; s < DSATTN_ARRAY_LEN(shapes); s++)
        for (int bt = 0; bt < 2; bt++)
            for (int beta = 0; beta < 2; beta++) {
                size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                size_t lda = K + 1, ldb = (bt ? K : N) + 2, ldc = N + 3;
                size_t brows = bt ? N : K;
                float *A = malloc(M * lda * sizeof(float)), *B = malloc(brows * ldb * sizeof(float));
                float *C = malloc(M * ldc * sizeof(float)), *C0 = malloc(M * ldc * sizeof(float));
                fill_uniform(&rng, A, M * lda);
                fill_uniform(&rng, B, brows * ldb);
                fill_uniform(&rng, C0, M * ldc);
                memcpy(C, C0, M * ldc * sizeof(float));
                dsattn_sgemm_small(1, bt, M, N, K, A, lda, B, ldb, (float)beta, C, ldc);
                double worst = 0.0;
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++) {
                        double acc = beta ? C0[m * ldc + n] : 0.0, mag = fabs(acc);
                        for (size_t k = 0; k < K; k++) {
                            double p = (double)A[m * lda + k] *
                                       (bt ? B[n * ldb + k] : B[k * ldb + n]);
                            acc += p;
                            mag += fabs(p);
                        }
                        double e = fabs(C[m * ldc + n] - acc) / (mag + 1e-30);
                        worst = e > worst ? e : worst;
                    }
                /* fp32 accumulation in any order: K+1 roundings at most */
                CHECK(worst <= (double)(K + 2) * 6e-8);
                for (size_t m = 0; m < M; m++)            /* ldc gaps untouched */
                    for (size_t n = N; n < ldc; n++) CHECK(C[m * ldc + n] == C0[m * ldc + n]);
                free(A); free(B); free(C); free(C0);
            }
    CHECK_EQ_INT(omp_get_max_threads(), before);
}

/* Runs the CLI: `dsattn bench blas` prints the environment it ended up with. */
static int cli_env(const char *env_prefix, char *out, size_t n)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE -u DSATTN_BLAS_REEXEC -u OMP_WAIT_POLICY %s "
                              "timeout 60 '%s' bench blas 2>&1", env_prefix, DSATTN_CLI_PATH);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    return pclose(p) == 0;
}

DSATTN_TEST(kernels, blas_coretype_reexec)
{
    /* The marker in the runner's own environment: the caller turned the
     * re-exec off for the whole run (scripts/test-arm64.sh: under qemu-user
     * a re-exec would leave the emulator). */
    if (getenv("DSATTN_BLAS_REEXEC")) { dsattn_test_skip("DSATTN_BLAS_REEXEC set for the run"); return; }
    static char out[4096];
    CHECK(cli_env("", out, sizeof out));
    /* re-exec'd exactly once, with the core (AVX-512 only) and the wait policy set */
    CHECK_MSG(strstr(out, "DSATTN_BLAS_REEXEC=1\n") && strstr(out, "OMP_WAIT_POLICY=active\n"),
              "no re-exec: %s", out);
    if (dsattn_cpu_has_avx512()) {
        CHECK_MSG(strstr(out, "OPENBLAS_CORETYPE=SkylakeX\n") != NULL, "core unset: %s", out);
        CHECK_MSG(strstr(out, "openblas_core: SkylakeX") != NULL, "core: %s", out);
    }
    /* what the user chose is left alone, and with both chosen nothing re-execs */
    CHECK(cli_env("OPENBLAS_CORETYPE=Haswell OMP_WAIT_POLICY=passive", out, sizeof out));
    CHECK_MSG(strstr(out, "OPENBLAS_CORETYPE=Haswell\n") && strstr(out, "DSATTN_BLAS_REEXEC=\n") &&
              strstr(out, "OMP_WAIT_POLICY=passive\n"), "user choice overridden: %s", out);
    /* only the wait policy missing: re-exec sets it, the user's core stays */
    CHECK(cli_env("OPENBLAS_CORETYPE=Haswell", out, sizeof out));
    CHECK_MSG(strstr(out, "OPENBLAS_CORETYPE=Haswell\n") && strstr(out, "OMP_WAIT_POLICY=active\n"),
              "partial: %s", out);
    /* the marker alone stops the re-exec (the loop guard) */
    CHECK(cli_env("DSATTN_BLAS_REEXEC=1", out, sizeof out));
    CHECK_MSG(strstr(out, "OPENBLAS_CORETYPE=\n") && strstr(out, "OMP_WAIT_POLICY=\n"),
              "marker ignored: %s", out);
}

DSATTN_TEST(kernels, gemv_fp8_finite_equals_gemv_fp8_on_nan_free_weights_seed17)
{
    /* Same bits as the NaN-tracking GEMV on every table, blocks 32 and 128,
     * ragged rows and k; and on the reference table it IS the reference. */
    const dsattn_kernels *tabs[6];
    const size_t nt = runnable_tables(tabs);
    dsattn_rng r = { 17 };
    const size_t shapes[3][3] = { { 37, 300, 32 }, { 130, 5120, 128 }, { 64, 1280, 32 } };
    for (int s = 0; s < 3; s++) {
        size_t R = shapes[s][0], K = shapes[s][1], bs = shapes[s][2];
        size_t ld = (K + bs - 1) / bs, sr = (R + bs - 1) / bs;
        uint8_t *W = malloc(R * K);
        float *sc = malloc(sr * ld * sizeof(float)), *x = malloc(K * sizeof(float));
        float *y0 = malloc(R * sizeof(float)), *y1 = malloc(R * sizeof(float));
        for (size_t i = 0; i < R * K; i++) {
            W[i] = (uint8_t)dsattn_rng_u64(&r);
            if ((W[i] & 0x7f) == 0x7f) W[i] ^= 1;
        }
        for (size_t i = 0; i < sr * ld; i++) sc[i] = ldexpf(1.0f, (int)(dsattn_rng_u64(&r) % 8) - 12);
        for (size_t i = 0; i < K; i++) x[i] = dsattn_rng_normal(&r);
        for (size_t t = 0; t < nt; t++) {
            tabs[t]->gemv_fp8(W, sc, bs, ld, x, y0, R, K);
            tabs[t]->gemv_fp8_finite(W, sc, bs, ld, x, y1, R, K);
            CHECK_BITS(tabs[t]->name, y1, y0, R);
        }
        free(W); free(sc); free(x); free(y0); free(y1);
    }
}

#if defined(__x86_64__)
#include <xmmintrin.h>
/* Under denormals-are-zero (a caller built with -ffast-math) the
 * exponent-shift GEMVs would read every E4M3 subnormal code as 0: they
 * take the fp16 decode instead, so their bits equal the avx2 table's under
 * the same MXCSR - and, with DAZ off again, the reference within bound. */
static void expshift_under_daz(const char *base, const char *sh)
{
    isa_t a, e;
    if (!get_isa(base, &a) || !get_isa(sh, &e)) return;
    dsattn_rng r = { 23 };
    const size_t R = 40, K = 1280, bs = 32, ld = K / bs, sr = (R + bs - 1) / bs, M = 3;
    uint8_t *W = malloc(R * K);
    float *sc = malloc(sr * ld * sizeof(float)), *x = malloc(M * K * sizeof(float));
    float *y0 = malloc(M * R * sizeof(float)), *y1 = malloc(M * R * sizeof(float));
    for (size_t i = 0; i < R * K; i++)      /* every fourth code subnormal */
        W[i] = (uint8_t)((i % 4 == 0) ? (dsattn_rng_u64(&r) & 0x87) : dsattn_rng_u64(&r) & 0xfe);
    for (size_t i = 0; i < sr * ld; i++) sc[i] = ldexpf(1.0f, (int)(dsattn_rng_u64(&r) % 8) - 6);
    for (size_t i = 0; i < M * K; i++) x[i] = dsattn_rng_normal(&r);
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x40);
    a.k->gemv_fp8(W, sc, bs, ld, x, y0, R, K);
    e.k->gemv_fp8(W, sc, bs, ld, x, y1, R, K);
    _mm_setcsr(csr);
    CHECK_BITS(sh, y1, y0, R);
    _mm_setcsr(csr | 0x40);                 /* and the several-token GEMV */
    a.k->gemv_fp8_m(W, sc, bs, ld, x, K, M, y0, R, R, K, 0);
    e.k->gemv_fp8_m(W, sc, bs, ld, x, K, M, y1, R, R, K, 0);
    _mm_setcsr(csr);
    CHECK_BITS(sh, y1, y0, M * R);
    free(W); free(sc); free(x); free(y0); free(y1);
}

DSATTN_TEST(kernels, gemv_fp8_expshift_under_daz_seed23)
{
    expshift_under_daz("avx2", "avx2-expshift");
    expshift_under_daz("avx512", "avx512-expshift");
}
#endif
