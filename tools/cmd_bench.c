/* cmd_bench.c - `dsattn bench <mode>`: measured speed against measured limits.
 *
 * Modes live in one table (bench_modes below); a mode is a function taking
 * the remaining argv.  Every mode prints markdown by default (--format csv
 * or json for machines) and verifies each case against the scalar reference
 * before timing it (llm.c dev/ style: a fast wrong kernel is not a result).
 *
 *   kernels   the kernel table of one ISA: DRAM read bandwidth and FMA peak
 *             of this machine, measured in the same run, then GEMV f32 /
 *             bf16 / fp8 / fp4 at real V4.1 shapes and the fused packed-row
 *             attention kernels, at 1 and 2 threads, as a fraction of those
 *             limits; and the FP8 Linear of a batched step and of a prefill
 *             chunk (dsattn_linear: the path the context's table takes)
 *             against the peak of its multiply.
 *   blas      OpenBLAS core name, the coretype environment, sgemm GFLOP/s.
 *
 * Deliberately not here: attention- and model-level modes (other files'
 * owners add rows to bench_modes), and assertions - targets are reported,
 * never enforced.  The machine probes (read bandwidth, FMA peak) are in
 * bench_util.c, shared with the model-level modes.
 */
#include "dsattn_commit.h"
#include "bench_util.h"
#include "blas.h"
#include "cli.h"
#include "cli_num.h"
#include "dsattn.h"
#include "internal.h"
#include "ktab.h"
#include "numfmt.h"
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ==== Output ============================================================ */

typedef enum { FMT_MD, FMT_CSV, FMT_JSON } out_fmt;

typedef struct {
    char   kernel[48];
    char   shape[48];
    int    threads;
    double sec;                 /* per call (one matrix / one row sweep) */
    double bytes, flops;        /* per call */
    double lim_bw, lim_flops;   /* the machine limits at this thread count */
    const char *check;          /* "ok" or "FAIL" */
} bench_row;

static double now_s(void)
{
#ifdef _OPENMP
    return omp_get_wtime();
#else
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
#endif
}

static void print_rows(FILE *f, out_fmt fmt, const bench_row *r, size_t n)
{
    if (fmt == FMT_CSV) {
        fprintf(f, "kernel,shape,threads,us_per_call,gb_s,frac_bw,gflop_s,frac_peak,check\n");
        for (size_t i = 0; i < n; i++) {
            double gbs = r[i].bytes / r[i].sec / 1e9, gfs = r[i].flops / r[i].sec / 1e9;
            fprintf(f, "%s,%s,%d,%.2f,%.2f,%.3f,%.2f,%.3f,%s\n", r[i].kernel, r[i].shape,
                    r[i].threads, r[i].sec * 1e6, gbs, gbs / r[i].lim_bw, gfs,
                    gfs / r[i].lim_flops, r[i].check);
        }
        return;
    }
    if (fmt == FMT_JSON) {
        fprintf(f, "  \"results\": [\n");
        for (size_t i = 0; i < n; i++) {
            double gbs = r[i].bytes / r[i].sec / 1e9, gfs = r[i].flops / r[i].sec / 1e9;
            fprintf(f, "    {\"kernel\": \"%s\", \"shape\": \"%s\", \"threads\": %d, "
                       "\"us_per_call\": %.3f, \"gb_s\": %.3f, \"frac_bw\": %.4f, "
                       "\"gflop_s\": %.3f, \"frac_peak\": %.4f, \"check\": \"%s\"}%s\n",
                    r[i].kernel, r[i].shape, r[i].threads, r[i].sec * 1e6, gbs,
                    gbs / r[i].lim_bw, gfs, gfs / r[i].lim_flops, r[i].check,
                    i + 1 < n ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        return;
    }
    fprintf(f, "| kernel | shape | thr | us/call | GB/s | %% read BW | GFLOP/s | %% FMA peak | check |\n");
    fprintf(f, "|---|---|--:|--:|--:|--:|--:|--:|---|\n");
    for (size_t i = 0; i < n; i++) {
        double gbs = r[i].bytes / r[i].sec / 1e9, gfs = r[i].flops / r[i].sec / 1e9;
        fprintf(f, "| %s | %s | %d | %.1f | %.2f | %.0f%% | %.1f | %.0f%% | %s |\n",
                r[i].kernel, r[i].shape, r[i].threads, r[i].sec * 1e6, gbs,
                100.0 * gbs / r[i].lim_bw, gfs, 100.0 * gfs / r[i].lim_flops, r[i].check);
    }
}

/* ==== Machine probes ==================================================== */
/* Both probes live in bench_util.c (every mode reports against them):
 * read bandwidth = an xor pass over a >= 1 GiB array, contiguous slice per
 * thread, best of several passes; FMA peak = many independent FMA chains
 * over register values that stay normal, in the vectors of the table
 * measured (8 lanes for --isa avx2 on an AVX-512 CPU). */

typedef struct { int simd; } probe_isa;   /* 2 = avx512, 1 = avx2, 0 = C */

/* GB/s reading n floats with T threads, best of reps (bench_util.c) */
static double measure_read_bw(probe_isa p, const float *a, size_t n, int T, int reps)
{
    return dsattn_bench_read_bw_pool(p.simd, a, n, T, reps);
}


/* ==== Data ============================================================== */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef enum { FILL_F32, FILL_BF16, FILL_FP8, FILL_BYTES } fill_kind;

/* Fill n bytes (multiple of 8) in parallel with valid values of a kind:
 * f32 in +-[0.5, 1), bf16 likewise, FP8 codes that are never NaN (bit 3
 * clear; every exponent parity-0 code incl. subnormals), or any bytes. */
static void fill_pool(void *p, size_t n, fill_kind kind, uint64_t seed)
{
    uint64_t *q = p;
    size_t nw = n / 8;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < (nw + 4095) / 4096; blk++) {
        uint64_t s = seed * 0x100000001b3ull + blk;
        size_t e = (blk + 1) * 4096 < nw ? (blk + 1) * 4096 : nw;
        for (size_t i = blk * 4096; i < e; i++) {
            uint64_t r = splitmix(&s);
            switch (kind) {
            case FILL_F32:
                r = (r & 0x807fffff807fffffull) | 0x3f0000003f000000ull;
                break;
            case FILL_BF16:
                r = (r & 0x807f807f807f807full) | 0x3f003f003f003f00ull;
                break;
            case FILL_FP8:
                r &= 0xf7f7f7f7f7f7f7f7ull;
                break;
            case FILL_BYTES:
                break;
            }
            q[i] = r;
        }
    }
}

/* ==== Kernel cases ====================================================== */

typedef enum { W_F32, W_BF16, W_FP8, W_FP4 } wkind;

typedef struct {
    wkind kind;
    size_t rows, k, bs;         /* bs: FP8 block edge */
    int finite;                 /* FP8: the no-NaN-code entry the models use */
    size_t tok;                 /* FP8: tokens per call (gemv_fp8_m, a batched step); 0 = 1 */
} gemv_case;

static size_t gemv_tok(const gemv_case *c) { return c->tok > 1 ? c->tok : 1; }

static size_t gemv_wbytes(const gemv_case *c)
{
    switch (c->kind) {
    case W_F32:  return c->rows * c->k * 4;
    case W_BF16: return c->rows * c->k * 2;
    case W_FP8:  return c->rows * c->k;
    case W_FP4:  return c->rows * c->k / 2;
    }
    return 0;
}

static size_t gemv_sbytes(const gemv_case *c)
{
    if (c->kind == W_FP8)
        return ((c->rows + c->bs - 1) / c->bs) * ((c->k + c->bs - 1) / c->bs) * sizeof(float);
    if (c->kind == W_FP4) return c->rows * (c->k / 32);
    return 0;
}

/* Rows [r0, r1) of one matrix (weights at w, scales at s). */
static void gemv_call(const dsattn_kernels *K, const gemv_case *c, const uint8_t *w,
                      const uint8_t *s, const float *x, float *y, size_t r0, size_t r1)
{
    size_t k = c->k, n = r1 - r0;
    switch (c->kind) {
    case W_F32:  K->gemv_f32((const float *)w + r0 * k, x, y + r0, n, k); break;
    case W_BF16: K->gemv_bf16((const uint16_t *)w + r0 * k, x, y + r0, n, k); break;
    case W_FP8: {
        size_t ldsc = (k + c->bs - 1) / c->bs;
        if (gemv_tok(c) > 1) {          /* x: [tok, k], y: [tok, rows] */
            const float *sc = (const float *)s + (r0 / c->bs) * ldsc;
            if (K->gemv_fp8_m) {
                K->gemv_fp8_m(w + r0 * k, sc, c->bs, ldsc, x, k, c->tok, y + r0, c->rows, n, k,
                              c->finite);
            } else {
                for (size_t t = 0; t < c->tok; t++)
                    K->gemv_fp8(w + r0 * k, sc, c->bs, ldsc, x + t * k, y + t * c->rows + r0, n, k);
            }
            break;
        }
        (c->finite ? K->gemv_fp8_finite : K->gemv_fp8)(
            w + r0 * k, (const float *)s + (r0 / c->bs) * ldsc, c->bs, ldsc, x, y + r0, n, k);
        break;
    }
    case W_FP4: K->gemv_fp4(w + r0 * k / 2, s + r0 * (k / 32), x, y + r0, n, k); break;
    }
}

/* Row r of a matrix as floats (scalar, numfmt's decoders). */
static void deq_wrow(const gemv_case *c, const uint8_t *w, const uint8_t *s, size_t r,
                     float *out)
{
    size_t k = c->k;
    for (size_t i = 0; i < k; i++) {
        switch (c->kind) {
        case W_F32: out[i] = ((const float *)w)[r * k + i]; break;
        case W_BF16: out[i] = dsattn_bf16_to_f32(((const uint16_t *)w)[r * k + i]); break;
        case W_FP8: {
            size_t ldsc = (k + c->bs - 1) / c->bs;
            out[i] = dsattn_e4m3_to_f32(w[r * k + i]) *
                     ((const float *)s)[(r / c->bs) * ldsc + i / c->bs];
            break;
        }
        case W_FP4: {
            uint8_t b = w[r * k / 2 + i / 2];
            out[i] = dsattn_e2m1_to_f32((i & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15)) *
                     dsattn_ue8m0_to_f32(s[r * (k / 32) + i / 32]);
            break;
        }
        }
    }
}

/* The test suite's bound (tests/test_kernels.c) with 8 lanes, which holds
 * for both ISAs: |fast - ref| <= (ceil(k/8) + 16) 2^-24 sum|w x|. */
static int within_bound(double got, double want, size_t k, double mag)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    return fabs(got - want) <= ((double)((k + 7) / 8) + 16.0) * 0x1p-24 * mag * 1.0001 +
                               ((double)k + 16.0) * 0x1p-149;
}

/* fast vs ref on the first rows of a matrix */
static int gemv_verify(const dsattn_kernels *K, const gemv_case *c, const uint8_t *w,
                       const uint8_t *s, const float *x)
{
    /* the first 64 rows (of every token: the last token's x, each
     * token against the one-token ref) */
    size_t n = c->rows < 64 ? c->rows : 64, T = gemv_tok(c);
    gemv_case one = *c;
    one.tok = 0;
    float yr[64];
    float *row = dsattn_alloc_array(c->k, sizeof(float));
    float *yf = dsattn_alloc_array(T * c->rows, sizeof(float));
    if (!row || !yf) { dsattn_free(row); dsattn_free(yf); return 0; }
    gemv_call(K, c, w, s, x, yf, 0, n);
    int ok = 1;
    for (size_t t = 0; t < T; t++) {
        const float *xt = x + t * c->k;
        gemv_call(&dsattn_kernels_ref, &one, w, s, xt, yr, 0, n);
        for (size_t r = 0; r < n; r++) {
            deq_wrow(c, w, s, r, row);
            double mag = 0;
            for (size_t i = 0; i < c->k; i++) mag += fabs((double)row[i] * xt[i]);
            ok &= within_bound(yf[t * c->rows + r], yr[r], c->k, mag);
        }
    }
    dsattn_free(row);
    dsattn_free(yf);
    return ok;
}

typedef struct {
    const dsattn_kernels *K;
    out_fmt fmt;
    int threads[4];
    int n_threads;
    double bw[4], peak[4];
    float *pool;
    size_t pool_bytes;
    int quick;
} kctx;

static const char *wname(const gemv_case *c, char *buf, size_t n)
{
    switch (c->kind) {
    case W_F32:  snprintf(buf, n, "gemv_f32"); break;
    case W_BF16: snprintf(buf, n, "gemv_bf16"); break;
    case W_FP8:
        if (gemv_tok(c) > 1)
            snprintf(buf, n, "gemv_fp8_m x%zu%s b%zu", c->tok, c->finite ? " finite" : "", c->bs);
        else
            snprintf(buf, n, "gemv_fp8%s b%zu", c->finite ? "_finite" : "", c->bs);
        break;
    case W_FP4:  snprintf(buf, n, "gemv_fp4"); break;
    }
    return buf;
}

/* One GEMV case at every thread count: the pool holds as many distinct
 * matrices (weights + scales) as fit, so every call streams from DRAM,
 * as decode does across layers. */
static size_t bench_gemv(kctx *b, const gemv_case *c, bench_row *out)
{
    size_t wb = gemv_wbytes(c), sb = gemv_sbytes(c);
    size_t mat = (wb + sb + 4095) & ~(size_t)4095;
    size_t nmat = b->pool_bytes / mat;
    if (nmat < 1) return 0;
    uint8_t *base = (uint8_t *)b->pool;
    fill_kind fk = c->kind == W_F32 ? FILL_F32 : c->kind == W_BF16 ? FILL_BF16
                 : c->kind == W_FP8 ? FILL_FP8 : FILL_BYTES;
    fill_pool(base, nmat * mat, fk, 1 + (uint64_t)c->kind);
    /* valid scales: FP8 fp32 ~1e-3, FP4 UE8M0 in 2^-7..2^0 */
    for (size_t m = 0; m < nmat; m++) {
        uint8_t *s = base + m * mat + wb;
        if (c->kind == W_FP8)
            for (size_t i = 0; i < sb / 4; i++) ((float *)s)[i] = 1e-3f * (1.0f + (float)(i % 7) / 8.0f);
        if (c->kind == W_FP4)
            for (size_t i = 0; i < sb; i++) s[i] = (uint8_t)(120 + i % 8);
    }
    const size_t ntok = gemv_tok(c);
    float *x = dsattn_alloc_array(ntok * c->k, sizeof(float));
    float *y = dsattn_alloc_array(ntok * c->rows, sizeof(float));
    if (!x || !y) { dsattn_free(x); dsattn_free(y); return 0; }
    for (size_t i = 0; i < ntok * c->k; i++) x[i] = (float)((int)(i % 17) - 8) / 8.0f;
    const char *check = gemv_verify(b->K, c, base, base + wb, x) ? "ok" : "FAIL";

    size_t n = 0;
    for (int ti = 0; ti < b->n_threads; ti++) {
        int T = b->threads[ti];
        /* row split: contiguous ranges, boundaries on 128-row multiples so
         * FP8 block rows are never cut */
        size_t unit = 128, nunits = (c->rows + unit - 1) / unit;
        int reps = b->quick ? 2 : 3;
        double best = 1e30;
        for (int rep = 0; rep <= reps; rep++) {
            double t0 = now_s();
#pragma omp parallel num_threads(T)
            {
#ifdef _OPENMP
                int id = omp_get_thread_num(), nt = omp_get_num_threads();
#else
                int id = 0, nt = 1;
#endif
                size_t u0 = nunits * (size_t)id / (size_t)nt, u1 = nunits * (size_t)(id + 1) / (size_t)nt;
                size_t r0 = u0 * unit, r1 = u1 * unit < c->rows ? u1 * unit : c->rows;
                for (size_t m = 0; m < nmat; m++) {
                    const uint8_t *w = base + m * mat;
                    if (r0 < r1) gemv_call(b->K, c, w, w + wb, x, y, r0, r1);
#pragma omp barrier
                }
            }
            double t = (now_s() - t0) / (double)nmat;
            if (rep > 0 && t < best) best = t;      /* rep 0 is warmup */
        }
        bench_row *r = &out[n++];
        memset(r, 0, sizeof *r);
        wname(c, r->kernel, sizeof r->kernel);
        snprintf(r->shape, sizeof r->shape, "%zux%zu", c->rows, c->k);
        r->threads = T;
        r->sec = best;
        r->bytes = (double)(wb + sb) + 4.0 * (double)ntok * (double)(c->k + c->rows);
        r->flops = 2.0 * (double)ntok * (double)c->rows * (double)c->k;
        r->lim_bw = b->bw[ti];
        r->lim_flops = b->peak[ti];
        r->check = check;
    }
    dsattn_free(x);
    dsattn_free(y);
    return n;
}

/* ---- the Linear of a batched step or a prefill chunk ------------------ */

/* dsattn_linear of tok tokens on an FP8 weight with V4.1's 32 x 32 blocks
 * and power-of-two scales, its activations quantized as V4.1's act_quant
 * does: the whole projection of a batched decode step or a prefill chunk,
 * by whatever path the context's table takes (the bf16-dot GEMM,
 * gemv_fp8_m, register tiles). */
typedef struct {
    size_t rows, k, tok;
} linear_case;

/* One Linear case at every thread count (a context each, the ISA of the
 * kernel table): as bench_gemv, matrices rotate through the pool; the
 * first 64 rows of every token are checked against reference mode
 * (gemv_verify's bound on the quantized activations), the reference run
 * on a view of those rows only (a row's output does not depend on the
 * others). */
static size_t bench_linear(kctx *b, dsattn_isa isa, const linear_case *c, bench_row *out)
{
    const gemv_case g = { W_FP8, c->rows, c->k, 32, 1, c->tok };
    const size_t wb = gemv_wbytes(&g), sb = gemv_sbytes(&g);
    const size_t mat = (wb + sb + 4095) & ~(size_t)4095, nmat = b->pool_bytes / mat;
    if (nmat < 1) return 0;
    uint8_t *base = (uint8_t *)b->pool;
    fill_pool(base, nmat * mat, FILL_FP8, 7);
    for (size_t m = 0; m < nmat; m++) {                /* 2^-14 .. 2^-7 */
        float *sc = (float *)(base + m * mat + wb);
        for (size_t i = 0; i < sb / 4; i++) sc[i] = ldexpf(1.0f, -7 - (int)(i % 8));
    }
    const dsattn_actq aq = { 32, DSATTN_ACTQ_POW2 };
    const size_t T = c->tok, nv = c->rows < 64 ? c->rows : 64;
    float *x = dsattn_alloc_array(T * c->k, sizeof(float));
    float *xq = dsattn_alloc_array(T * c->k, sizeof(float));
    float *y = dsattn_alloc_array(T * c->rows, sizeof(float));
    float *yr = dsattn_alloc_array(T * c->rows, sizeof(float));
    float *row = dsattn_alloc_array(c->k, sizeof(float));
    const dsattn_weight w = { .kind = DSATTN_W_FP8, .rows = c->rows, .cols = c->k, .data = base,
                              .scale = (const float *)(base + wb), .block = 32, .finite = 1 };
    size_t n = 0;
    if (!x || !xq || !y || !yr || !row) goto done;
    for (size_t i = 0; i < T * c->k; i++) x[i] = (float)((int)(i % 23) - 11) / 8.0f;
    for (int ti = 0; ti < b->n_threads; ti++) {
        dsattn_ctx_params cp = dsattn_ctx_default_params();
        cp.isa = isa;
        cp.n_threads = b->threads[ti];
        dsattn_ctx *cf = NULL, *cr = NULL;
        cp.mode = DSATTN_MODE_FAST;
        if (dsattn_ctx_create(&cf, &cp) != DSATTN_OK) break;
        const char *check = "ok";
        if (ti == 0) {       /* the check, once: the path is the same at every count */
            cp.mode = DSATTN_MODE_REFERENCE;
            dsattn_weight wv = w;
            wv.rows = nv;
            int ok = dsattn_ctx_create(&cr, &cp) == DSATTN_OK &&
                     dsattn_linear(cr, &wv, x, c->k, T, yr, c->rows, DSATTN_OUT_F32, &aq, xq) ==
                         DSATTN_OK &&
                     dsattn_linear(cf, &w, x, c->k, T, y, c->rows, DSATTN_OUT_F32, &aq, xq) ==
                         DSATTN_OK;
            for (size_t r = 0; r < nv && ok; r++) {    /* xq: the quantized tokens */
                deq_wrow(&g, base, base + wb, r, row);
                for (size_t t = 0; t < T; t++) {
                    double mag = 0;
                    for (size_t i = 0; i < c->k; i++)
                        mag += fabs((double)row[i] * xq[t * c->k + i]);
                    ok &= within_bound(y[t * c->rows + r], yr[t * c->rows + r], c->k, mag);
                }
            }
            dsattn_ctx_destroy(cr);
            check = ok ? "ok" : "FAIL";
        } else {
            check = out[n - 1].check;
        }
        const int reps = b->quick ? 2 : 3;
        double best = 1e30;
        for (int rep = 0; rep <= reps; rep++) {
            const double t0 = now_s();
            for (size_t m = 0; m < nmat; m++) {
                dsattn_weight wm = w;
                wm.data = base + m * mat;
                wm.scale = (const float *)(base + m * mat + wb);
                (void)dsattn_linear(cf, &wm, x, c->k, T, y, c->rows, DSATTN_OUT_BF16, &aq, xq);
            }
            const double t = (now_s() - t0) / (double)nmat;
            if (rep > 0 && t < best) best = t;      /* rep 0 is warmup */
        }
        bench_row *r = &out[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->kernel, sizeof r->kernel, "linear fp8 x%zu b32", T);
        snprintf(r->shape, sizeof r->shape, "%zux%zu", c->rows, c->k);
        r->threads = b->threads[ti];
        r->sec = best;
        r->bytes = (double)(wb + sb) + 4.0 * (double)T * (double)(c->k + c->rows);
        r->flops = 2.0 * (double)T * (double)c->rows * (double)c->k;
        r->lim_bw = b->bw[ti];
        r->lim_flops = dsattn_bench_gemm_peak(cf, b->threads[ti]);
        r->check = check;
        dsattn_ctx_destroy(cf);
    }
done:
    dsattn_free(x); dsattn_free(xq); dsattn_free(y); dsattn_free(yr); dsattn_free(row);
    return n;
}

/* ---- fused packed-row kernels ---------------------------------------- */

typedef enum { F_MDOT_FP4KV, F_MAXPY_FP4KV, F_MDOT_FP4IDX, F_MDOT_SWA, F_MAXPY_SWA,
               F_MDOT_F32, F_MDOT_FP4KV_ROWS, F_MAXPY_FP4KV_ROWS } fused_kind;

typedef struct {
    fused_kind kind;
    size_t nh, d;
} fused_case;

static size_t fused_row_bytes(const fused_case *c)
{
    switch (c->kind) {
    case F_MDOT_FP4KV: case F_MAXPY_FP4KV: case F_MDOT_FP4KV_ROWS: case F_MAXPY_FP4KV_ROWS:
        return dsattn_v41_kv_row_bytes(c->d);
    case F_MDOT_FP4IDX: return dsattn_fp4_index_row_bytes(c->d);
    case F_MDOT_SWA: case F_MAXPY_SWA: return dsattn_v41_swa_row_bytes(c->d);
    case F_MDOT_F32: return c->d * 4;
    }
    return 0;
}

/* rows per call of the many-rows entry in this bench */
#define FUSED_MULTI 8

static void fused_call(const dsattn_kernels *K, const fused_case *c, const float *q,
                       const uint8_t *row, float *out, float *acc)
{
    switch (c->kind) {
    case F_MDOT_FP4KV:  K->mdot_fp4e4m3(q, c->d, c->nh, row, c->d, out); break;
    case F_MAXPY_FP4KV: K->maxpy_fp4e4m3(q, c->nh, row, c->d, acc, c->d); break;
    case F_MDOT_FP4IDX: K->mdot_fp4ue8m0(q, c->d, c->nh, row, c->d, out); break;
    case F_MDOT_SWA:    K->mdot_fp8ue8m0(q, c->d, c->nh, row, c->d, out); break;
    case F_MAXPY_SWA:   K->maxpy_fp8ue8m0(q, c->nh, row, c->d, acc, c->d); break;
    case F_MDOT_F32:    K->mdot_f32(q, c->d, c->nh, (const float *)row, c->d, out); break;
    case F_MDOT_FP4KV_ROWS: {
        /* 8 consecutive rows per call (the caller's gather list) */
        const uint8_t *rp[FUSED_MULTI];
        size_t rb = dsattn_v41_kv_row_bytes(c->d);
        for (size_t r = 0; r < FUSED_MULTI; r++) rp[r] = row + r * rb;
        K->mdot_fp4e4m3_rows(q, c->d, c->nh, rp, FUSED_MULTI, c->d, out, c->nh);
        break;
    }
    case F_MAXPY_FP4KV_ROWS: {
        /* p: [nh, 8] (the first floats of q), acc: [nh, d] */
        const uint8_t *rp[FUSED_MULTI];
        size_t rb = dsattn_v41_kv_row_bytes(c->d);
        for (size_t r = 0; r < FUSED_MULTI; r++) rp[r] = row + r * rb;
        K->maxpy_fp4e4m3_rows(q, FUSED_MULTI, c->nh, rp, FUSED_MULTI, c->d, acc, c->d);
        break;
    }
    }
}

static const char *fused_name(fused_kind k)
{
    switch (k) {
    case F_MDOT_FP4KV:  return "mdot_fp4e4m3 (KV)";
    case F_MAXPY_FP4KV: return "maxpy_fp4e4m3 (KV)";
    case F_MDOT_FP4IDX: return "mdot_fp4ue8m0 (idx)";
    case F_MDOT_SWA:    return "mdot_fp8ue8m0 (SWA)";
    case F_MAXPY_SWA:   return "maxpy_fp8ue8m0 (SWA)";
    case F_MDOT_F32:    return "mdot_f32";
    case F_MDOT_FP4KV_ROWS: return "mdot_fp4e4m3_rows (KV, 8/call)";
    case F_MAXPY_FP4KV_ROWS: return "maxpy_fp4e4m3_rows (KV, 8/call)";
    }
    return "?";
}

/* Packed rows per thread: L2-resident (the rows a decode step re-reads for
 * every head), so the number measures the kernel, not DRAM. */
#define FUSED_ROWS 2048

static void fill_rows(const fused_case *c, uint8_t *rows, size_t n, uint64_t seed)
{
    size_t rb = fused_row_bytes(c);
    float x[2048];
    for (size_t r = 0; r < n; r++) {
        uint8_t *p = rows + r * rb;
        for (size_t i = 0; i < c->d; i++)
            x[i] = (float)((int64_t)(splitmix(&seed) >> 40) - (1 << 23)) / (float)(1 << 22);
        switch (c->kind) {
        case F_MDOT_FP4KV: case F_MAXPY_FP4KV: case F_MDOT_FP4KV_ROWS: case F_MAXPY_FP4KV_ROWS:
            dsattn_v41_kv_pack(x, c->d, p, NULL);
            break;
        case F_MDOT_FP4IDX: dsattn_fp4_index_pack(x, c->d, p, NULL); break;
        case F_MDOT_SWA: case F_MAXPY_SWA: dsattn_v41_swa_pack(x, c->d, p, NULL); break;
        case F_MDOT_F32: memcpy(p, x, c->d * 4); break;
        }
    }
}

static int fused_verify(const dsattn_kernels *K, const fused_case *c, const float *q,
                        const uint8_t *rows)
{
    size_t nh = c->nh, d = c->d, rb = fused_row_bytes(c);
    int multi = c->kind == F_MDOT_FP4KV_ROWS || c->kind == F_MAXPY_FP4KV_ROWS;
    size_t nrow = multi ? FUSED_MULTI : 1;
    float *o1 = dsattn_alloc_array(nh * d, sizeof(float));
    float *o2 = dsattn_alloc_array(nh * d, sizeof(float));
    float *deq = dsattn_alloc_array(FUSED_MULTI * d, sizeof(float));
    int ok = o1 && o2 && deq;
    int axpy = c->kind == F_MAXPY_FP4KV || c->kind == F_MAXPY_SWA || c->kind == F_MAXPY_FP4KV_ROWS;
    for (size_t r0 = 0; ok && r0 < 4; r0 += multi ? 4 : 1) {
        const uint8_t *row = rows + r0 * rb;
        for (size_t r = 0; r < nrow; r++) {
            const uint8_t *rr = row + r * rb;
            float *dr = deq + r * d;
            switch (c->kind) {
            case F_MDOT_FP4KV: case F_MAXPY_FP4KV: case F_MDOT_FP4KV_ROWS: case F_MAXPY_FP4KV_ROWS:
                dsattn_v41_kv_unpack(rr, d, dr);
                break;
            case F_MDOT_FP4IDX: dsattn_fp4_index_unpack(rr, d, dr); break;
            case F_MDOT_SWA: case F_MAXPY_SWA: dsattn_v41_swa_unpack(rr, d, dr); break;
            case F_MDOT_F32: memcpy(dr, rr, d * sizeof(float)); break;
            }
        }
        memset(o1, 0, nh * d * sizeof(float));
        memset(o2, 0, nh * d * sizeof(float));
        fused_call(K, c, q, row, o1, o1);
        fused_call(&dsattn_kernels_ref, c, q, row, o2, o2);
        for (size_t h = 0; h < nh; h++) {
            if (axpy) {   /* acc was 0: nrow products each */
                for (size_t i = 0; i < d; i++) {
                    double m = 0;
                    for (size_t r = 0; r < nrow; r++)
                        m += fabs((double)q[multi ? h * FUSED_MULTI + r : h] * deq[r * d + i]);
                    ok &= fabs((double)o1[h * d + i] - o2[h * d + i]) <=
                          ((double)nrow + 2.0) * 0x1p-24 * m + 0x1p-149;
                }
            } else {
                for (size_t r = 0; r < nrow; r++) {
                    double mag = 0;
                    for (size_t i = 0; i < d; i++) mag += fabs((double)q[h * d + i] * deq[r * d + i]);
                    ok &= within_bound(o1[r * nh + h], o2[r * nh + h], d, mag);
                }
            }
        }
    }
    dsattn_free(o1);
    dsattn_free(o2);
    dsattn_free(deq);
    return ok;
}

static size_t bench_fused(kctx *b, const fused_case *c, bench_row *out)
{
    size_t rb = fused_row_bytes(c), nrows = FUSED_ROWS;
    int maxT = 1;
    for (int i = 0; i < b->n_threads; i++) maxT = b->threads[i] > maxT ? b->threads[i] : maxT;
    uint8_t *rows = dsattn_alloc_array(nrows * (size_t)maxT, rb);
    float *q = dsattn_alloc_array(c->nh * c->d, sizeof(float));
    float *ws = dsattn_alloc_array((size_t)maxT * c->nh, c->d * sizeof(float));
    if (!rows || !q || !ws) { dsattn_free(rows); dsattn_free(q); dsattn_free(ws); return 0; }
    fill_rows(c, rows, nrows * (size_t)maxT, 17 + (uint64_t)c->kind);
    for (size_t i = 0; i < c->nh * c->d; i++) q[i] = (float)((int)(i % 13) - 6) / 6.0f;
    const char *check = fused_verify(b->K, c, q, rows) ? "ok" : "FAIL";
    /* enough sweeps for ~0.1 s per thread count */
    double per_row_flops = 2.0 * (double)c->nh * (double)c->d;
    long sweeps = (long)(0.1 * 50e9 / (per_row_flops * (double)nrows)) + 1;
    if (b->quick) sweeps = sweeps / 4 + 1;
    size_t n = 0;
    for (int ti = 0; ti < b->n_threads; ti++) {
        int T = b->threads[ti];
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
#pragma omp parallel num_threads(T)
            {
#ifdef _OPENMP
                int id = omp_get_thread_num();
#else
                int id = 0;
#endif
                const uint8_t *my = rows + (size_t)id * nrows * rb;
                float *o = ws + (size_t)id * c->nh * c->d;
                size_t step = c->kind == F_MDOT_FP4KV_ROWS || c->kind == F_MAXPY_FP4KV_ROWS
                            ? FUSED_MULTI : 1;
                for (long s = 0; s < sweeps; s++)
                    for (size_t r = 0; r + step <= nrows; r += step)
                        fused_call(b->K, c, q, my + r * rb, o, o);
            }
            double t = (now_s() - t0) / (double)(sweeps * (long)nrows);
            if (t < best) best = t;
        }
        bench_row *r = &out[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->kernel, sizeof r->kernel, "%s", fused_name(c->kind));
        snprintf(r->shape, sizeof r->shape, "nh=%zu d=%zu", c->nh, c->d);
        r->threads = T;
        /* per row per thread; the machine does T rows at once */
        r->sec = best;
        r->bytes = (double)rb * T;
        r->flops = per_row_flops * T;
        r->lim_bw = b->bw[ti];
        r->lim_flops = b->peak[ti];
        r->check = check;
    }
    dsattn_free(rows);
    dsattn_free(q);
    dsattn_free(ws);
    return n;
}

/* ==== Modes ============================================================= */

static int parse_fmt(const char *s, out_fmt *f)
{
    if (!strcmp(s, "md") || !strcmp(s, "markdown")) *f = FMT_MD;
    else if (!strcmp(s, "csv")) *f = FMT_CSV;
    else if (!strcmp(s, "json")) *f = FMT_JSON;
    else return -1;
    return 0;
}

static int bench_kernels(int argc, char **argv)
{
    kctx b;
    memset(&b, 0, sizeof b);
    b.fmt = FMT_MD;
    b.threads[0] = 1;
    b.threads[1] = 2;
    b.n_threads = 2;
    dsattn_isa isa = DSATTN_ISA_AUTO;
    size_t mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            long long t[4];
            int rc = dsattn_cli_list("bench kernels", "--threads", argv[++i], 1, 256, 0, t, 4,
                                     &b.n_threads);
            if (rc) return rc;
            for (int k = 0; k < b.n_threads; k++) b.threads[k] = (int)t[k];
        } else if (!strcmp(argv[i], "--format") && i + 1 < argc) {
            if (parse_fmt(argv[++i], &b.fmt)) { fprintf(stderr, "bench: bad --format\n"); return 2; }
        } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            if (!strcmp(s, "auto")) isa = DSATTN_ISA_AUTO;
            else if (!strcmp(s, "ref")) isa = DSATTN_ISA_REF;
            else if (!strcmp(s, "avx2")) isa = DSATTN_ISA_AVX2;
            else if (!strcmp(s, "avx512")) isa = DSATTN_ISA_AVX512;
            else if (!strcmp(s, "neon")) isa = DSATTN_ISA_NEON;
            else {
                fprintf(stderr, "bench kernels: --isa '%s': expected auto, ref, avx2, avx512 or"
                                " neon\n", s);
                return 2;
            }
        } else if (!strcmp(argv[i], "--mem") && i + 1 < argc) {
            long long x;
            int rc = dsattn_cli_int("bench kernels", "--mem", argv[++i], 64, 1 << 20, 0, &x);
            if (rc) return rc;
            mib = (size_t)x;
        } else if (!strcmp(argv[i], "--quick")) {
            b.quick = 1;
        } else {
            const int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "bench kernels: unknown option %s\n", argv[i]);
            fprintf(help ? stdout : stderr,
                    "usage: dsattn bench kernels [--threads 1,2] [--format md|csv|json]\n"
                    "                            [--isa ref|avx2|avx512|neon] [--mem MiB] [--quick]\n"
                    "  Measures DRAM read bandwidth (one pass over --mem MiB, default 1024) and\n"
                    "  FMA peak, then every GEMV at V4.1 shapes, the fused packed-row\n"
                    "  attention kernels and the FP8 Linear of a batched step and a prefill\n"
                    "  chunk (8, 16 and 128 tokens, the path the table takes), as fractions\n"
                    "  of those limits.  Each case is verified against the scalar reference\n"
                    "  before it is timed.  The header lists the context's kernel table: what\n"
                    "  each slot runs.\n");
            return help ? 0 : 2;
        }
    }
    dsattn_ctx_params cp = dsattn_ctx_default_params();
    cp.isa = isa;
    dsattn_ctx *ctx = NULL;
    if (dsattn_ctx_create(&ctx, &cp) != DSATTN_OK) {
        fprintf(stderr, "bench: this CPU/build cannot run the requested ISA\n");
        return 1;
    }
    b.K = ctx->k;
    b.pool_bytes = mib << 20;
    b.pool = dsattn_alloc(b.pool_bytes);   /* huge pages, as the model weights */
    if (!b.pool) { fprintf(stderr, "bench: cannot allocate %zu MiB\n", mib); dsattn_ctx_destroy(ctx); return 1; }
    fill_pool(b.pool, b.pool_bytes, FILL_F32, 99);

    probe_isa pi = { dsattn_cpu_has_avx512() ? 2 : dsattn_cpu_has_avx2() ? 1 : 0 };
    for (int ti = 0; ti < b.n_threads; ti++) {
        b.bw[ti] = measure_read_bw(pi, b.pool, b.pool_bytes / 4, b.threads[ti], b.quick ? 3 : 5);
        b.peak[ti] = dsattn_bench_fma_peak_ctx(ctx, b.threads[ti]);
    }

    char cpu[128];
    dsattn_bench_cpu_model(cpu, sizeof cpu);
    double load1 = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1) load1 = -1;
        fclose(la);
    }
    FILE *f = stdout;
    if (b.fmt == FMT_JSON) {
        fprintf(f, "{\n  \"commit\": \"%s\", \"cpu\": \"%s\", \"isa\": \"%s\", \"openblas\": \"%s\",\n"
                   "  \"load_avg_1min\": %.2f,\n  \"limits\": [", DSATTN_GIT_COMMIT, cpu, b.K->name,
                dsattn_blas_corename(), load1);
        for (int ti = 0; ti < b.n_threads; ti++)
            fprintf(f, "%s{\"threads\": %d, \"read_gb_s\": %.3f, \"fma_gflop_s\": %.3f}",
                    ti ? ", " : "", b.threads[ti], b.bw[ti], b.peak[ti]);
        fprintf(f, "],\n  \"table\": {");
        for (size_t s = 0; s < DSATTN_KTAB_SLOTS; s++)
            fprintf(f, "%s\"%s\": \"%s\"", s ? ", " : "", dsattn_ktab_slot_name(s),
                    dsattn_ktab_impl_name(ctx->kt, s));
        fprintf(f, "},\n");
    } else if (b.fmt == FMT_MD) {
        fprintf(f, "dsattn bench kernels - commit %s, isa %s, cpu \"%s\", openblas %s\n\n",
                DSATTN_GIT_COMMIT, b.K->name, cpu, dsattn_blas_corename());
        /* the context's whole table (ktab.h): what each slot runs */
        fprintf(f, "kernel table:");
        for (size_t s = 0; s < DSATTN_KTAB_SLOTS; s++)
            fprintf(f, " %s=%s", dsattn_ktab_slot_name(s), dsattn_ktab_impl_name(ctx->kt, s));
        fprintf(f, "\n\n");
        fprintf(f, "| threads | DRAM read (over %zu MiB) | FMA peak (fp32) |\n|--:|--:|--:|\n", mib);
        for (int ti = 0; ti < b.n_threads; ti++)
            fprintf(f, "| %d | %.2f GB/s | %.1f GFLOP/s |\n", b.threads[ti], b.bw[ti], b.peak[ti]);
        fprintf(f, "\n");
        if (load1 > 0.5)
            fprintf(f, "WARNING: 1-minute load average %.2f when the run started: other\n"
                       "processes share the cores and memory, so these numbers are low.\n\n",
                    load1);
    }
    fflush(f);

    const gemv_case gc[] = {
        { W_F32, 32768, 1280, 0, 0, 0 },  { W_F32, 5120, 8192, 0, 0, 0 },  { W_F32, 1280, 5120, 0, 0, 0 },
        { W_BF16, 32768, 1280, 0, 0, 0 }, { W_BF16, 5120, 8192, 0, 0, 0 }, { W_BF16, 1280, 5120, 0, 0, 0 },
        { W_FP8, 32768, 1280, 128, 0, 0 }, { W_FP8, 5120, 8192, 128, 0, 0 }, { W_FP8, 1280, 5120, 128, 0, 0 },
        { W_FP8, 32768, 1280, 32, 0, 0 },  { W_FP8, 5120, 8192, 32, 0, 0 },
        { W_FP8, 32768, 1280, 32, 1, 0 }, { W_FP8, 5120, 8192, 32, 1, 0 },
        /* a batched decode step of 2, 8 and 16 sequences (V4.1's blocks) */
        { W_FP8, 32768, 1280, 32, 1, 2 }, { W_FP8, 5120, 8192, 32, 1, 2 },
        { W_FP8, 32768, 1280, 32, 1, 8 }, { W_FP8, 5120, 8192, 32, 1, 8 },
        { W_FP8, 32768, 1280, 32, 1, 16 }, { W_FP8, 5120, 8192, 32, 1, 16 },
        { W_FP4, 32768, 1280, 0, 0, 0 },  { W_FP4, 5120, 8192, 0, 0, 0 },  { W_FP4, 1280, 5120, 0, 0, 0 },
    };
    const fused_case fc[] = {
        { F_MDOT_FP4KV, 4, 512 },  { F_MDOT_FP4KV, 8, 512 },  { F_MDOT_FP4KV, 64, 512 },
        { F_MAXPY_FP4KV, 4, 512 }, { F_MAXPY_FP4KV, 8, 512 }, { F_MAXPY_FP4KV, 64, 512 },
        { F_MDOT_FP4IDX, 64, 128 },
        { F_MDOT_SWA, 64, 512 },   { F_MAXPY_SWA, 64, 512 },
        { F_MDOT_F32, 64, 512 },
        { F_MDOT_FP4KV_ROWS, 4, 512 }, { F_MDOT_FP4KV_ROWS, 8, 512 },
        { F_MDOT_FP4KV_ROWS, 64, 512 },
        { F_MAXPY_FP4KV_ROWS, 4, 512 }, { F_MAXPY_FP4KV_ROWS, 8, 512 },
        { F_MAXPY_FP4KV_ROWS, 64, 512 },
    };
    /* the batched step's Linear at 8 and 16 tokens, and a prefill chunk's */
    const linear_case lc[] = {
        { 32768, 1280, 8 }, { 5120, 8192, 8 }, { 32768, 1280, 16 }, { 5120, 8192, 16 },
        { 32768, 1280, 128 }, { 5120, 8192, 128 },
    };
    size_t cap = (DSATTN_ARRAY_LEN(gc) + DSATTN_ARRAY_LEN(fc) + DSATTN_ARRAY_LEN(lc)) *
                 (size_t)b.n_threads;
    bench_row *rows = calloc(cap, sizeof *rows);
    size_t n = 0;
    if (!rows) { dsattn_free(b.pool); dsattn_ctx_destroy(ctx); return 1; }
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(gc); i++) {
        if (b.quick && gc[i].rows * gc[i].k > 8u << 20 && gc[i].kind == W_F32) continue;
        n += bench_gemv(&b, &gc[i], rows + n);
    }
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(fc); i++) n += bench_fused(&b, &fc[i], rows + n);
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(lc); i++) n += bench_linear(&b, isa, &lc[i], rows + n);
    print_rows(f, b.fmt, rows, n);
    if (b.fmt == FMT_MD)
        fprintf(f, "\nGEMV: one call = one matrix; matrices rotate through %zu MiB so every\n"
                   "call streams from DRAM.  Fused: one call = one packed row; %d rows per\n"
                   "thread stay in L2 and GB/s counts row bytes only.  Targets (reported,\n"
                   "not asserted): FP8/FP4 GEMV >= 80%% of read BW; FP4 dot with >= 4 heads\n"
                   ">= 50%% of FMA peak.  Linear: dsattn_linear of a batched step or a\n"
                   "prefill chunk (act_quant, then the path the table takes); its %%\n"
                   "peak is of the multiply those Linears run (VDPBF16PS or AMX-BF16 where\n"
                   "the table has them, else the fp32 FMA).\n", mib, FUSED_ROWS);
    /* the read probe again: did the memory's speed hold over the run? (to
     * stderr beside csv / json, which stay machine-readable) */
    FILE *fa = b.fmt == FMT_MD ? f : stderr;
    int moved = 0;
    fputc('\n', fa);
    for (int ti = 0; ti < b.n_threads; ti++)
        moved |= dsattn_bench_read_bw_again_line(
            fa, b.threads[ti], b.bw[ti],
            measure_read_bw(pi, b.pool, b.pool_bytes / 4, b.threads[ti], b.quick ? 3 : 5));
    if (moved) dsattn_bench_read_bw_moved(fa);
    int fail = 0;
    for (size_t i = 0; i < n; i++) fail |= strcmp(rows[i].check, "ok") != 0;
    free(rows);
    dsattn_free(b.pool);
    dsattn_ctx_destroy(ctx);
    return fail ? 1 : 0;
}

static int bench_blas(int argc, char **argv)
{
    if (argc > 1) {
        const int help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        if (!help) fprintf(stderr, "bench blas: unknown option %s\n", argv[1]);
        fprintf(help ? stdout : stderr,
                "usage: dsattn bench blas\n"
                "  The OpenBLAS core type this process runs (and the variables that chose\n"
                "  it), then the speed of one fp32 sgemm at a prefill shape.\n");
        return help ? 0 : 2;
    }
    const char *ct = getenv("OPENBLAS_CORETYPE"), *mk = getenv("DSATTN_BLAS_REEXEC");
    const char *wp = getenv("OMP_WAIT_POLICY");
    printf("openblas_core: %s\nOPENBLAS_CORETYPE=%s\nDSATTN_BLAS_REEXEC=%s\nOMP_WAIT_POLICY=%s\n",
           dsattn_blas_corename(), ct ? ct : "", mk ? mk : "", wp ? wp : "");
    size_t M = 256, N = 2048, K = 2048;
    float *A = dsattn_alloc_array(M * K, sizeof(float)), *B = dsattn_alloc_array(N * K, sizeof(float));
    float *C = dsattn_alloc_array(M * N, sizeof(float));
    if (!A || !B || !C) { dsattn_free(A); dsattn_free(B); dsattn_free(C); return 1; }
    for (size_t i = 0; i < M * K; i++) A[i] = (float)((int)(i % 11) - 5) / 8.0f;
    for (size_t i = 0; i < N * K; i++) B[i] = (float)((int)(i % 7) - 3) / 8.0f;
    dsattn_sgemm_rowmajor(M, N, K, A, K, B, K, C, N);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        dsattn_sgemm_rowmajor(M, N, K, A, K, B, K, C, N);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    printf("sgemm %zux%zux%zu (prefill shape, B = [N,K] weight): %.1f GFLOP/s\n", M, N, K,
           2.0 * (double)(M * N * K) / best / 1e9);
    dsattn_free(A);
    dsattn_free(B);
    dsattn_free(C);
    return 0;
}

/* ==== Command =========================================================== */

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] = mode name */
} bench_mode;

static const bench_mode bench_modes[] = {
    { "kernels", "kernel table vs measured DRAM read BW and FMA peak", bench_kernels },
    { "blas",    "OpenBLAS core type and sgemm speed",                 bench_blas },
    { "v41",     "V4.1-Flash 40-layer decode ms/token vs its byte bound", dsattn_bench_v41 },
    { "mha",     "one MHA/GQA layer (DeepSeek-LLM 7B/67B) decode vs DRAM read BW", dsattn_bench_mha },
    { "mla",     "one MLA layer (V3 bf16/FP8 latent, V3.2 MLA+DSA) decode vs BW and FMA peak", dsattn_bench_mla },
    { "v4",      "one V4-Flash CSA / HCA layer decode to 1M, indexer scan share", dsattn_bench_v4 },
    { "session", "V4.1-Flash session save / load MB/s vs cp, session size at 64K / 1M", dsattn_bench_session },
};

DSATTN_CMD(bench, 20, "measure speed against the machine's limits (dsattn bench: modes)")
static int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: dsattn bench <mode> [options]   (dsattn bench <mode> --help)\n\n");
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(bench_modes); i++)
            fprintf(f, "  %-10s %s\n", bench_modes[i].name, bench_modes[i].summary);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(bench_modes); i++)
        if (!strcmp(argv[1], bench_modes[i].name)) {
            const int rc = bench_modes[i].run(argc - 1, argv + 1);
            /* the read probe again: did the memory's speed hold? (to stderr
             * beside csv / json, which stay machine-readable) */
            int machine = 0;
            for (int a = 2; a + 1 < argc; a++)
                machine |= !strcmp(argv[a], "--format") && strcmp(argv[a + 1], "md");
            if (rc == 0) dsattn_bench_read_bw_recheck(machine ? stderr : stdout);
            return rc;
        }
    fprintf(stderr, "dsattn bench: unknown mode '%s'\n", argv[1]);
    return 2;
}
