/* gemv_fp8mt_tmpl.h - the tiled form of the multi-token FP8 GEMV
 * (kernels.h gemv_fp8_m) of a batched decode step of MT_MIN or more
 * tokens, over the vector words of simd_avx2.h / simd_avx512.h (DSV_F,
 * dsv_fmadd, ...).  kernels_avx2.c includes it; the AVX-512 table does not:
 * there 16 tokens fill one vector, each decoded value serves one FMA, and
 * on the Ice Lake core the form ran at 65-68 GFLOP/s a thread against
 * 68-71 for its 2-row form (16 tokens; at 12, 45-51 against 68).  The
 * including file defines, before it:
 *   MT_TR, MT_TV      the register tile: MT_TR rows x MT_TV token vectors
 *                     (AVX2 6 x 2: 12 accumulators, each FMA's latency
 *                     covered; the switch of mt_panel takes MT_TR <= 12)
 *   mt_tr(r)          DSV_F r[DSV_N]: r[i] lane j -> r[j] lane i
 *   mt_decode32(w, s, o)  32 finite E4M3 codes at w -> o[0..31], each value
 *                     / 256 times s, in the form's order (one rounding: the
 *                     exact e4m3 * scale when s = 256 * scale)
 *   MT_POS(q)         where that order puts code q of the 32
 * and calls gemv_fp8_mt from its gemv_fp8_m where mt_ok holds.
 *
 * The table's one-row form reloads each token's x for every row and keeps
 * one FMA chain per (row, token).  Here the rows are multiplied as
 * pgemm.h's prefill tiles multiply them, turned for a few tokens: the
 * tokens sit in the vector lanes (MT_TG of them, zero-padded, packed
 * k-major once per group of up to MT_BLKR rows and k slice of MT_KC, in
 * mt_decode32's order), and each weight value is broadcast from a small
 * row-major buffer into which a panel of up to MT_RP rows is decoded per
 * slice, (e4m3 / 256) * (256 s): the exact dequantised value, no transpose.
 * A decoded value serves MT_TV FMAs; the next panel's slice is prefetched
 * while one is multiplied (at MT_MIN+ tokens a weight byte serves 24+
 * FLOPs, far from the memory bound, so the panels need no front-to-back
 * block stream).  At 8 tokens on AVX2 each value
 * would serve one FMA and its decode costs as much: the one-row form stays
 * below MT_MIN.  The block's partial sums live in cb and go to y at its
 * end.  Each output is one fp32 FMA chain over k (slices in order, the
 * codes of a 32-code step in mt_decode32's order) of exact products' values
 * times x, whatever the row's panel or the call's rows: the result does not
 * depend on how a caller cuts the rows.  It differs from the one-row form's
 * by summation order only (tests/test_kernels.c bounds both against the
 * scalar reference). */
#ifndef DSV_F
#error "gemv_fp8mt_tmpl.h: include simd_avx2.h or simd_avx512.h first"
#endif
#if !defined(MT_TR) || !defined(MT_TV) || !defined(MT_POS)
#error "gemv_fp8mt_tmpl.h: define MT_TR, MT_TV, MT_POS, mt_tr and mt_decode32 first"
#endif

#define MT_MIN 12                  /* tokens from which the tiles run */
#define MT_KC 256                  /* k slice */
#define MT_TG (MT_TV * DSV_N)      /* tokens per group: 16 */
#define MT_RP 12                   /* rows per decoded panel */
#define MT_WLD (MT_KC + 16)        /* decoded row stride: rows apart in L1 sets */
#define MT_BLKR 192                /* rows per group of rows */

/* tokens [0, nt) of x (nt <= MT_TG), k [k0, k0 + kc) -> xs[k' * MT_TG + t],
 * k' where mt_decode32 puts code k within its 32-code step; tokens
 * nt..MT_TG-1 zero */
DSV_AI void mt_pack_x(const float *x, size_t ldx, size_t nt, size_t k0, size_t kc, float *xs)
{
    for (size_t tb = 0; tb < MT_TG; tb += DSV_N)
        for (size_t c = 0; c < kc; c += DSV_N) {
            DSV_F r[DSV_N];
#pragma GCC unroll 16
            for (size_t i = 0; i < DSV_N; i++)
                r[i] = tb + i < nt ? dsv_load(x + (tb + i) * ldx + k0 + c) : dsv_zero();
            mt_tr(r);
            const size_t base = c & ~(size_t)31, kk = c & 31;
#pragma GCC unroll 16
            for (size_t j = 0; j < DSV_N; j++)
                dsv_store(xs + (base + MT_POS(kk + j)) * MT_TG + tb, r[j]);
        }
}

/* R rows (row r at w + r * k, its block scales at sc[r]; bs % 32 == 0)
 * codes [k0, k0 + kc) -> wd[r * MT_WLD + k'] */
DSV_AI void mt_decode(const uint8_t *w, size_t k, const float *const *sc, size_t bs, size_t k0,
                      size_t kc, size_t R, float *wd)
{
    uint32_t bi[MT_KC / 32];                  /* each step's scale block */
    for (size_t c = 0; c < kc; c += 32) bi[c / 32] = (uint32_t)((k0 + c) / bs);
    for (size_t r = 0; r < R; r++) {
        const uint8_t *wr = w + r * k + k0;
        float *o = wd + r * MT_WLD;
        for (size_t c = 0; c < kc; c += 32)
            mt_decode32(wr + c, dsv_set1(256.0f * sc[r][bi[c / 32]]), o + c);
    }
}

/* R <= MT_TR decoded rows x MT_TG tokens over kc: c[r * MT_TG + t] (+)= sum */
DSV_AI void mt_tile(const float *wd, const float *xs, size_t kc, const int R, float *c,
                    int first)
{
    DSV_F acc[MT_TR][MT_TV];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < MT_TV; v++)
            acc[r][v] = first ? dsv_zero() : dsv_load(c + (size_t)r * MT_TG + (size_t)v * DSV_N);
    for (size_t k = 0; k < kc; k++) {
        DSV_F xv[MT_TV];
#pragma GCC unroll 2
        for (int v = 0; v < MT_TV; v++) xv[v] = dsv_load(xs + k * MT_TG + (size_t)v * DSV_N);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const DSV_F wv = dsv_set1(wd[(size_t)r * MT_WLD + k]);
#pragma GCC unroll 2
            for (int v = 0; v < MT_TV; v++) acc[r][v] = dsv_fmadd(wv, xv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < MT_TV; v++)
            dsv_store(c + (size_t)r * MT_TG + (size_t)v * DSV_N, acc[r][v]);
}

/* A panel's R <= MT_RP rows in register tiles of at most MT_TR rows, as
 * even as can be; the row count a constant in each (the accumulators in
 * registers); noinline: inlined into the driver, the decode's constants
 * took registers and an accumulator went to memory. */
static __attribute__((noinline)) void mt_panel(const float *wd, const float *xs, size_t kc,
                                               size_t R, float *c, int first)
{
    const size_t nt = (R + MT_TR - 1) / MT_TR;
    for (size_t i = 0, r0 = 0; i < nt; i++) {
        const size_t n = (R - r0) / (nt - i) + ((R - r0) % (nt - i) != 0);
        const float *w = wd + r0 * MT_WLD;
        float *o = c + r0 * MT_TG;
        switch (n) {
#define MT_CASE(m) case m: mt_tile(w, xs, kc, m, o, first); break;
#if MT_TR > 6
        MT_CASE(12) MT_CASE(11) MT_CASE(10) MT_CASE(9) MT_CASE(8) MT_CASE(7)
#endif
        MT_CASE(6) MT_CASE(5) MT_CASE(4) MT_CASE(3) MT_CASE(2)
#undef MT_CASE
        default: mt_tile(w, xs, kc, 1, o, first); break;
        }
        r0 += n;
    }
}

/* Does the tiled form take this call?  m tokens, finite codes, bs and k
 * multiples of 32, and every block scale's 256 s finite (or s infinite:
 * dsattn_pgemm_cheap's condition, so (e / 256) * (256 s) is e * s). */
static int mt_ok(const float *scale, size_t bs, size_t ldsc, size_t m, size_t rows, size_t k,
                 int finite)
{
    if (!finite || m < MT_MIN || k == 0 || k % 32 || bs == 0 || bs % 32) return 0;
    for (size_t sr = 0; sr * bs < rows; sr++) {
        const float *sc = scale + sr * ldsc;
        for (size_t b = 0; b < (k + bs - 1) / bs; b++)
            if (__builtin_isinf(256.0f * sc[b]) && !__builtin_isinf(sc[b])) return 0;
    }
    return 1;
}

static void gemv_fp8_mt(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                        const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                        size_t rows, size_t k)
{
    float xs[MT_KC * MT_TG] __attribute__((aligned(64)));
    float wd[MT_RP * MT_WLD] __attribute__((aligned(64)));
    float cb[MT_BLKR * MT_TG] __attribute__((aligned(64)));
    for (size_t t0 = 0; t0 < m; t0 += MT_TG) {
        const size_t nt = m - t0 < MT_TG ? m - t0 : MT_TG;
        for (size_t b0 = 0; b0 < rows; b0 += MT_BLKR) {
            const size_t nb = rows - b0 < MT_BLKR ? rows - b0 : MT_BLKR;
            const size_t np = (nb + MT_RP - 1) / MT_RP;          /* panels, as even as can be */
            for (size_t k0 = 0; k0 < k; k0 += MT_KC) {
                const size_t kc = k - k0 < MT_KC ? k - k0 : MT_KC;
                mt_pack_x(x + t0 * ldx, ldx, nt, k0, kc, xs);
                for (size_t p = 0, p0 = 0; p < np; p++) {
                    const size_t R = (nb - p0) / (np - p) + ((nb - p0) % (np - p) != 0);
                    const float *sc[MT_RP];
                    for (size_t r = 0; r < R; r++) sc[r] = scale + (b0 + p0 + r) / bs * ldsc;
                    mt_decode(W + (b0 + p0) * k, k, sc, bs, k0, kc, R, wd);
                    /* the next panel's slice (or the next slice's first panel);
                     * past the call's rows too (a prefetch never faults) */
                    const uint8_t *nx = p + 1 < np ? W + (b0 + p0 + R) * k + k0
                                                   : W + b0 * k + k0 + MT_KC;
                    for (size_t r = 0; r < MT_RP; r++)
                        for (size_t c = 0; c < kc; c += 64)
                            _mm_prefetch((const char *)(nx + r * k + c), _MM_HINT_T0);
                    mt_panel(wd, xs, kc, R, cb + p0 * MT_TG, k0 == 0);
                    p0 += R;
                }
            }
            for (size_t t = 0; t < nt; t++)
                for (size_t r = 0; r < nb; r++) y[(t0 + t) * ldy + b0 + r] = cb[r * MT_TG + t];
        }
    }
}
