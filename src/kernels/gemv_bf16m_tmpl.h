/* gemv_bf16m_tmpl.h - the multi-token bf16 GEMV of a batched decode step
 * (kernels.h gemv_bf16_m), written once for the AVX-512 and AVX2 tables:
 * kernels_avx512.c and kernels_avx2.c include it after simd_avx512.h /
 * simd_avx2.h (the vector words DSV_F, dsv_fmadd, ...) with GBM_R, the rows
 * of a pass, defined first (2 on 32 registers: 2 rows x 8 tokens = 16
 * accumulators; 1 on 16 registers), and optionally GBM_CHAINS(T), the FMA
 * chains each (row, token) sum runs as (1 if not defined; the AVX2 file
 * asks for 8 / T, so that a pass of few tokens still has the 8 chains the
 * FMA latency needs).  Chain c takes the vectors c, c + NC, c + 2 NC, ...
 * of the slab; the chains are added pairwise before the lanes.
 *
 * Each DSV_N-wide vector of a weight row is widened once (bf16 -> fp32: a
 * zero-extend to 32-bit lanes and a shift by 16) and multiplied into every
 * token of the pass (up to GBM_TMAX), so a step of B tokens costs about one
 * weight read and B x the FMAs, where B one-token GEMVs cost B decodes and
 * B passes over the weight.  k is walked in equal slabs whose x (the pass's
 * tokens x the slab, at most GBM_XL1 floats: 32 KB) stays in L1; a row's
 * slab sums (one FMA chain a lane, then the lanes added) are added to y
 * slab by slab, the elements past the last whole vector in scalar fmaf.
 * While a slab is computed, each row's lines of the next slab are
 * prefetched into L2 (during the last slab: the same lines of the rows
 * after the call's, the next chunk of its caller: a prefetch never faults),
 * so each row is read front to back.  The order differs from gemv_bf16's:
 * tested against it with gemv_bf16's bound (tests/test_kernels.c). */
#ifndef DSV_F
#error "gemv_bf16m_tmpl.h: include simd_avx2.h or simd_avx512.h first"
#endif
#ifndef GBM_R
#error "gemv_bf16m_tmpl.h: define GBM_R (rows a pass) first"
#endif

#include <math.h>

#if DSV_N == 16
#define GBM_WIDEN(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define GBM_HSUM(v) _mm512_reduce_add_ps(v)
#else
#define GBM_WIDEN(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define GBM_HSUM(v) dsattn_hsum256(v)
#endif

#define GBM_TMAX 8          /* tokens a pass */
#define GBM_XL1 8192        /* floats of x a slab holds: 32 KB */
#ifndef GBM_CHAINS
#define GBM_CHAINS(T) 1     /* FMA chains a (row, token) sum (header) */
#endif
#define GBM_NCMAX 8         /* the most chains a sum */

/* Rows [0, R) (row stride k) over elements [k0, k0 + kn) for T tokens
 * (x + t * ldx, y + t * ldy); acc_in: add to y (a later slab).  pf: the
 * first row's line to prefetch at element offset 0 of the slab (the rows
 * k apart), or NULL. */
DSV_AI void gbm_rows(const uint16_t *W, size_t k, size_t k0, size_t kn, const float *x,
                     size_t ldx, float *y, size_t ldy, int acc_in, const uint16_t *pf,
                     const int R, const int T)
{
    const int NC = GBM_CHAINS(T);
    DSV_F acc[GBM_R][GBM_TMAX][GBM_NCMAX];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[r][t][c] = dsv_zero();
    const size_t kv = kn / DSV_N * DSV_N;
    for (size_t i0 = 0; i0 < kv; i0 += (size_t)NC * DSV_N) {
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const size_t i = i0 + (size_t)c * DSV_N;
            if (NC > 1 && i >= kv) break;
            DSV_F w[GBM_R];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                w[r] = GBM_WIDEN(W + (size_t)r * k + k0 + i);
                if (pf && i % 32 == 0)        /* one line: 32 bf16 */
                    _mm_prefetch((const char *)(pf + (size_t)r * k + i), _MM_HINT_T1);
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const DSV_F xv = dsv_load(x + (size_t)t * ldx + k0 + i);
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                    acc[r][t][c] = dsv_fmadd(w[r], xv, acc[r][t][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            /* the chains pairwise: (0 + 1) + (2 + 3), ... */
            for (int h = 1; h < NC; h *= 2)
                for (int c = 0; c + h < NC; c += 2 * h)
                    acc[r][t][c] = dsv_add(acc[r][t][c], acc[r][t][c + h]);
            float s = GBM_HSUM(acc[r][t][0]);
            for (size_t i = kv; i < kn; i++)
                s = fmaf(dsattn_bf16_to_f32(W[(size_t)r * k + k0 + i]), x[(size_t)t * ldx + k0 + i], s);
            float *o = y + (size_t)t * ldy + r;
            *o = acc_in ? *o + s : s;
        }
}

/* every row of one slab for T tokens: passes of GBM_R rows, a last single
 * row; T made a constant (accumulators in registers) */
static void gbm_slab(const uint16_t *W, size_t k, size_t k0, size_t kn, const float *x,
                     size_t ldx, float *y, size_t ldy, size_t rows, int acc_in,
                     const uint16_t *pf, size_t T)
{
    size_t r = 0;
#define GBM_CASE(n)                                                                          \
    case n:                                                                                  \
        for (; r + GBM_R <= rows; r += GBM_R)                                                \
            gbm_rows(W + r * k, k, k0, kn, x, ldx, y + r, ldy, acc_in, pf + r * k, GBM_R, n); \
        for (; r < rows; r++)                                                                \
            gbm_rows(W + r * k, k, k0, kn, x, ldx, y + r, ldy, acc_in, pf + r * k, 1, n);    \
        break;
    switch (T) {
    GBM_CASE(8) GBM_CASE(7) GBM_CASE(6) GBM_CASE(5) GBM_CASE(4) GBM_CASE(3) GBM_CASE(2)
    default: GBM_CASE(1)
    }
#undef GBM_CASE
}

static void gemv_bf16_m_simd(const uint16_t *W, const float *x, size_t ldx, size_t m, float *y,
                             size_t ldy, size_t rows, size_t k)
{
    for (size_t g0 = 0; g0 < m; g0 += GBM_TMAX) {
        const size_t T = m - g0 < GBM_TMAX ? m - g0 : GBM_TMAX;
        /* equal slabs of whole 64-element lines, x of each in L1 */
        const size_t cap = GBM_XL1 / T / 64 * 64, ns = k > cap ? (k + cap - 1) / cap : 1;
        size_t ks = ((k + ns - 1) / ns + 63) / 64 * 64;
        if (ks == 0) ks = 64;
        for (size_t k0 = 0; k0 == 0 || k0 < k; k0 += ks) {      /* k = 0: y = 0 */
            const size_t kn = k - k0 < ks ? k - k0 : ks;
            const uint16_t *pf = k0 + ks < k ? W + k0 + ks : W + rows * k;
            gbm_slab(W, k, k0, kn, x + g0 * ldx, ldx, y + g0 * ldy, ldy, rows, k0 > 0, pf, T);
        }
    }
}

#undef GBM_WIDEN
#undef GBM_HSUM
#undef GBM_CHAINS
#undef GBM_NCMAX
