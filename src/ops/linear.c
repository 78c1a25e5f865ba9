/* linear.c - every Linear layer of every generation: dsattn_linear, and
 * dsattn_linear_grouped for the block-diagonal wo_a of V4 / V4.1.
 *
 * What the reference's linear() does, per weight format:
 *   bf16 weight  -> F.linear in bf16: fp32 accumulation, bf16 output
 *   fp32 weight  -> F.linear in fp32 (V4.1 ratio-2 compressor), fp32 output
 *   FP8 weight   -> act_quant(x) to E4M3 blocks, then fp8_gemm with the
 *                   weight's block scales, bf16 output
 *   FP4 weight   -> the same with E2M1 weights (MXFP4, E8M0 per 32)
 * The output rounding is the caller's choice (round), because the same
 * weight format can sit in an fp32 compute path.
 *
 * Reference mode: one ref-kernel GEMV per token, rows split across OpenMP
 * threads (each output is computed by one thread in one order, so the
 * result does not depend on the thread count).  Fast mode: SIMD GEMV for
 * decode-sized inputs (one parallel region per call, ~256 KB row chunks:
 * one contiguous run per thread, the rest taken by whichever thread is
 * free; a grouped weight streamed as one matrix; FP8 x prepared once per
 * thread where the table offers it, kernels.h gemv_fp8_px); for
 * prefill-sized inputs the weight is decoded 12 rows at a time into
 * register-tile panels and multiplied by pgemm.h's tiles (AVX-512, AVX2;
 * AMX-BF16 tiles where the table has them), or dequantized in row panels
 * and multiplied with OpenBLAS sgemm (tables without pgemm tiles).
 */
#include "blas.h"
#include "ops.h"

#include "ktab.h"
#include "numfmt.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* dsattn_round_bf16 on each element; its select (numfmt.h) lets the
 * compiler vectorise the loop for the build's baseline ISA. */
void dsattn_round_bf16_n(float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] = dsattn_round_bf16(x[i]);
}

/* act_quant of one row, dequantized values written to q. */
static void actq_row(const dsattn_kernels *kt, const float *x, size_t k, const dsattn_actq *aq,
                     float *q)
{
    switch (aq->scale) {
    case DSATTN_ACTQ_POW2:             /* = dsattn_quant_fp8_ue8m0, bit for bit */
        kt->act_quant_fp8_pow2(x, k, aq->block, q);
        break;
    case DSATTN_ACTQ_AMAX_MUL:
        for (size_t b = 0; b < k; b += aq->block) {
            float s;
            dsattn_quant_fp8_f32scale(x + b, aq->block, aq->block, 0, NULL, &s, q + b);
        }
        break;
    case DSATTN_ACTQ_AMAX_DIV: {
        /* V3 triton: s = max(amax, 1e-4) / 448 ; y = x / s */
        for (size_t b = 0; b < k; b += aq->block) {
            float amax = 0.0f;
            for (size_t i = 0; i < aq->block; i++) amax = fmaxf(amax, fabsf(x[b + i]));
            amax = fmaxf(amax, 1e-4f);
            float s = amax / 448.0f;
            for (size_t i = 0; i < aq->block; i++) {
                float v = x[b + i] / s;
                v = v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v);
                q[b + i] = dsattn_e4m3_to_f32(dsattn_f32_to_e4m3(v)) * s;
            }
        }
        break;
    }
    }
}

/* rows [r0, r1) of W times one input row. */
static void gemv_rows(const dsattn_kernels *k, const dsattn_weight *W,
                      const float *x, float *y, size_t r0, size_t r1)
{
    size_t K = W->cols;
    switch (W->kind) {
    case DSATTN_W_F32:
        k->gemv_f32((const float *)W->data + r0 * K, x, y + r0, r1 - r0, K);
        break;
    case DSATTN_W_BF16:
        k->gemv_bf16((const uint16_t *)W->data + r0 * K, x, y + r0, r1 - r0, K);
        break;
    case DSATTN_W_FP8: {
        size_t ldsc = (K + W->block - 1) / W->block;
        (W->finite ? k->gemv_fp8_finite : k->gemv_fp8)(
            (const uint8_t *)W->data + r0 * K, W->scale + (r0 / W->block) * ldsc, W->block, ldsc,
            x, y + r0, r1 - r0, K);
        break;
    }
    case DSATTN_W_FP4:
        k->gemv_fp4((const uint8_t *)W->data + r0 * (K / 2), W->scale_e8m0 + r0 * (K / 32),
                    x, y + r0, r1 - r0, K);
        break;
    }
}

/* Dequantize rows [r0, r0+n) of W into out [n, cols] fp32 (the reference
 * row decode of weights.c, so the BLAS path sees the same values). */
static void dequant_rows(const dsattn_weight *W, size_t r0, size_t n, float *out)
{
    for (size_t r = r0; r < r0 + n; r++)
        (void)dsattn_weight_row_f32(W, r, out + (r - r0) * W->cols);
}

/* The decode-sized path (and every reference-mode call).  The rows are cut
 * into chunks of ~GEMV_CHUNK_BYTES (a multiple of 4 rows and of the FP8
 * block, so every block edge and the kernels' 4-row passes fall where a
 * whole-matrix call puts them: each output is computed by one kernel call
 * in one order, and the result does not depend on the thread count or on
 * which thread ran it).  Each thread owns one contiguous run of chunks and
 * streams it front to back, its kernel prefetch running ahead across chunk
 * edges; a thread that is done takes chunks from the back of the run with
 * the most left.  The shared machine slows one core or the other by 5-10 %
 * from call to call: with fixed halves the faster thread's idle time at the
 * end of the calls summed to ~18 ms per V4.1 decode step at 4K (measured),
 * while the other streamed at one core's bandwidth; with chunks, ~2.5 ms.
 * Chunks of 64 KB measured slower (more stream restarts), 1 MB the same.
 *
 * W's rows are G groups of rows/G; group g reads its input at x + g*gx and
 * writes y + g*(rows/G) (G = 1: a plain Linear); a chunk may span group
 * edges, so a grouped weight streams as one matrix.  Every token of a
 * chunk is done before the next chunk, while the chunk is in L2. */
#define GEMV_CHUNK_BYTES ((size_t)256 << 10)
#define GEMV_MAX_OWNERS 64

/* One thread's run of chunks: next chunk from the front in the low 32
 * bits, end (exclusive) in the high 32; owner and thieves both move it
 * with compare-and-swap, so every chunk is taken exactly once. */
typedef struct {
    _Atomic uint64_t run;
    char pad[64 - sizeof(uint64_t)];
} gemv_run;

static int run_take(gemv_run *r, int from_back, uint32_t *chunk)
{
    uint64_t v = atomic_load_explicit(&r->run, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)v, e = (uint32_t)(v >> 32);
        if (f >= e) return 0;
        uint64_t nv = from_back ? ((uint64_t)(e - 1) << 32 | f) : ((uint64_t)e << 32 | (f + 1));
        if (atomic_compare_exchange_weak_explicit(&r->run, &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *chunk = from_back ? e - 1 : f;
            return 1;
        }
    }
}

/* Chunk rows: whole FP8 blocks and whole 4-row passes, about
 * GEMV_CHUNK_BYTES of weights, at least one unit.  A step of
 * GEMV_WIDE_TOK+ tokens takes up to 4x that, while every thread still gets
 * 4+ chunks: its kernel call is compute-bound (a byte of weights serves
 * 2 x n_tok FLOPs), and the AVX2 table's tiled form packs the tokens once
 * per call and k slice (kernels_avx2.c), so longer calls spread that.
 * Rows of more than GEMV_LONG_ROW bytes take up to 4x too (same bound):
 * a GEMV splits such rows into k passes and prepares x once per pass and
 * call (the AVX2 FP8 kernel), which a 256 KB call of 32 rows of 8192 codes
 * would do for every 32 rows.  With 1 MB calls (and that kernel's passes
 * outermost) the V4.1 decode's output projections take 118-121 ms a step
 * at 4K against 125-127 (Zen 3, 2 threads, alternating runs). */
#define GEMV_LONG_ROW 4096
#define GEMV_WIDE_TOK 12
static size_t chunk_rows(const dsattn_weight *W, size_t n_tok, size_t nthr)
{
    size_t unit = 4;
    if (W->kind == DSATTN_W_FP8 && W->block > 0)
        unit = W->block % 4 == 0 ? W->block : 4 * W->block;
    size_t row_bytes =
        DSATTN_MAX((size_t)1, dsattn_weight_bytes(W) / DSATTN_MAX((size_t)1, W->rows));
    size_t bytes = GEMV_CHUNK_BYTES;
    if (n_tok >= GEMV_WIDE_TOK || row_bytes > GEMV_LONG_ROW)
        bytes = DSATTN_MAX(bytes, DSATTN_MIN(4 * bytes, dsattn_weight_bytes(W) / (4 * nthr)));
    size_t units = bytes / (unit * row_bytes);
    return unit * DSATTN_MAX((size_t)1, units);
}

/* A thread's prepared x for the FP8 GEMVs of one single-token Linear
 * (kernels.h fp8_prep_x; tables that have it): prepared at the thread's
 * first chunk in each row group, on its own stack (rows of up to
 * GEMV_PX_MAXK codes: 66 KB), instead of once per chunk inside the
 * kernel. */
#define GEMV_PX_MAXK 16384
typedef struct {
    float *buf;
    size_t g;                          /* the row group buf holds; SIZE_MAX: none */
} gemv_px;

static int px_fits(const dsattn_kernels *k, const dsattn_weight *W, size_t n_tok)
{
    return k->gemv_fp8_px && k->fp8_prep_x && W->kind == DSATTN_W_FP8 && n_tok == 1 &&
           W->block > 0 && W->block % 32 == 0 && W->cols <= GEMV_PX_MAXK;
}

static void gemv_chunk(const dsattn_kernels *k, const dsattn_weight *W, size_t G,
                       const float *x, size_t ldx, size_t gx, size_t n_tok,
                       float *y, size_t ldy, dsattn_out_round round, size_t r0, size_t r1,
                       gemv_px *px)
{
    const size_t Rg = W->rows / G;
    if (W->kind == DSATTN_W_FP8 && n_tok > 1 && k->gemv_fp8_m) {
        /* every token of the chunk per weight block decoded (a batched step) */
        const size_t K = W->cols, ldsc = (K + W->block - 1) / W->block;
        for (size_t g = r0 / Rg; g < G && g * Rg < r1; g++) {
            size_t a = DSATTN_MAX(r0, g * Rg), b = DSATTN_MIN(r1, (g + 1) * Rg);
            k->gemv_fp8_m((const uint8_t *)W->data + a * K, W->scale + (a / W->block) * ldsc,
                          W->block, ldsc, x + g * gx, ldx, n_tok, y + a, ldy, b - a, K,
                          W->finite);
        }
        if (round == DSATTN_OUT_BF16)
            for (size_t t = 0; t < n_tok; t++) dsattn_round_bf16_n(y + t * ldy + r0, r1 - r0);
        return;
    }
    if (W->kind == DSATTN_W_BF16 && n_tok > 1 && k->gemv_bf16_m) {
        /* the same for bf16 weights: each vector widened once for all tokens */
        const size_t K = W->cols;
        for (size_t g = r0 / Rg; g < G && g * Rg < r1; g++) {
            size_t a = DSATTN_MAX(r0, g * Rg), b = DSATTN_MIN(r1, (g + 1) * Rg);
            k->gemv_bf16_m((const uint16_t *)W->data + a * K, x + g * gx, ldx, n_tok, y + a, ldy,
                           b - a, K);
        }
        if (round == DSATTN_OUT_BF16)
            for (size_t t = 0; t < n_tok; t++) dsattn_round_bf16_n(y + t * ldy + r0, r1 - r0);
        return;
    }
    if (px) {                           /* px_fits held */
        const size_t K = W->cols, ldsc = (K + W->block - 1) / W->block;
        for (size_t g = r0 / Rg; g < G && g * Rg < r1; g++) {
            size_t a = DSATTN_MAX(r0, g * Rg), b = DSATTN_MIN(r1, (g + 1) * Rg);
            if (px->g != g) {
                k->fp8_prep_x(x + g * gx, K, px->buf);
                px->g = g;
            }
            k->gemv_fp8_px((const uint8_t *)W->data + a * K, W->scale + (a / W->block) * ldsc,
                           W->block, ldsc, x + g * gx, px->buf, y + a, b - a, K, W->finite);
        }
        if (round == DSATTN_OUT_BF16) dsattn_round_bf16_n(y + r0, r1 - r0);
        return;
    }
    for (size_t t = 0; t < n_tok; t++) {
        float *yt = y + t * ldy;
        for (size_t g = r0 / Rg; g < G && g * Rg < r1; g++) {
            size_t a = DSATTN_MAX(r0, g * Rg), b = DSATTN_MIN(r1, (g + 1) * Rg);
            gemv_rows(k, W, x + t * ldx + g * gx, yt, a, b);
        }
        if (round == DSATTN_OUT_BF16) dsattn_round_bf16_n(yt + r0, r1 - r0);
    }
}

static void gemv_tasks(dsattn_ctx *ctx, const dsattn_weight *W, size_t G,
                       const float *x, size_t ldx, size_t gx, size_t n_tok,
                       float *y, size_t ldy, dsattn_out_round round)
{
    const dsattn_kernels *k = ctx->k;
    const size_t R = W->rows, K = W->cols;
    const size_t cr = chunk_rows(W, n_tok, (size_t)DSATTN_MAX(1, ctx->n_threads));
    const size_t n_chunks = (R + cr - 1) / cr;
    const size_t owners = DSATTN_MIN((size_t)DSATTN_MAX(1, ctx->n_threads),
                                     DSATTN_MIN(n_chunks, (size_t)GEMV_MAX_OWNERS));
    if (owners < 2 || n_tok * R * K < 65536 || n_chunks > UINT32_MAX) {
        gemv_chunk(k, W, G, x, ldx, gx, n_tok, y, ldy, round, 0, R, NULL);
        return;
    }
    const int use_px = px_fits(k, W, n_tok);
    gemv_run runs[GEMV_MAX_OWNERS];
    for (size_t o = 0; o < owners; o++) {
        uint64_t f = n_chunks * o / owners, e = n_chunks * (o + 1) / owners;
        atomic_init(&runs[o].run, e << 32 | f);
    }
#pragma omp parallel num_threads((int)owners)
    {
        /* a smaller team (nested, or the runtime's limit) leaves whole
         * runs to be taken from the back: every chunk is still done */
        const size_t me = (size_t)omp_get_thread_num();
        uint32_t c;
        float pxbuf[DSATTN_FP8_PX_FLOATS(GEMV_PX_MAXK)] __attribute__((aligned(32)));
        gemv_px pxs = { pxbuf, SIZE_MAX };
        for (;;) {
            int got = me < owners && run_take(&runs[me], 0, &c);
            while (!got) {                  /* the run with the most left */
                size_t best = owners;
                uint64_t most = 0;
                for (size_t q = 0; q < owners; q++) {
                    uint64_t v = atomic_load_explicit(&runs[q].run, memory_order_relaxed);
                    uint32_t f = (uint32_t)v, e = (uint32_t)(v >> 32);
                    if (e > f && e - f > most) { most = e - f; best = q; }
                }
                if (best == owners) break;
                got = run_take(&runs[best], 1, &c);
            }
            if (!got) break;
            size_t r0 = (size_t)c * cr;
            gemv_chunk(k, W, G, x, ldx, gx, n_tok, y, ldy, round, r0, DSATTN_MIN(R, r0 + cr),
                       use_px ? &pxs : NULL);
        }
    }
}

/* need bytes of prefill scratch: the context's grow-only buffer, or a
 * private one when called from inside a parallel region (several callers
 * may run at once there; *own = 1, the caller frees it).  NULL: no memory. */
static void *lin_scratch(dsattn_ctx *ctx, size_t need, int *own)
{
    *own = omp_in_parallel();
    if (*own) return dsattn_alloc(need);
    if (ctx->lin_ws_bytes < need) {
        dsattn_free(ctx->lin_ws);
        ctx->lin_ws_bytes = 0;
        if (!(ctx->lin_ws = dsattn_alloc(need))) return NULL;
        ctx->lin_ws_bytes = need;
    }
    return ctx->lin_ws;
}

/* rows [nr] x K (row r at rows + r*K) -> one k-major tile of 12 rows
 * (pgemm.h's layout, rows nr..11 zero): the generic form of the mla
 * table's tile_rows, for tables with pgemm tiles but no mla slot. */
static void tile_rows_c(const float *rows, size_t ldr, size_t nr, size_t K, float *a)
{
    for (size_t k = 0; k < K; k++)
        for (size_t r = 0; r < DSATTN_PGEMM_MR; r++)
            a[k * DSATTN_PGEMM_MR + r] = r < nr ? rows[r * ldr + k] : 0.0f;
}

/* The prefill path on the FMA tiles (pgemm.h).  The activations are packed
 * once into groups of 32 tokens (per row group of a grouped weight: G
 * groups of rows/G rows, group g reading x + g*gx); each thread then
 * takes panels of PG_ROWS weight rows inside one group (dynamic), decodes them 12 rows at a time into the
 * k-major tile layout, and runs the 12 x 32 register tile over k slices of
 * PG_KC: the tile's weight slice (12 KB) and the token group's slice (32
 * KB) fit a 48 KB L1 together, and the weight slice with one 16-token half
 * (what each AVX2 sub-tile reads twice, pgemm_avx2.c) a 32 KB one; the
 * group's slice stays in L2 while the panel's tiles pass over it (the
 * slice sizes measured: docs/kernels.md, the prefill GEMM).  A group's
 * last tile call covers its tokens rounded up to 8.  The
 * panel's sums live in a [PG_ROWS][np] buffer and are written to y
 * transposed at the end.  mk (the table's mla slot) may be NULL: its
 * tile_rows and round_bf16 then have their C forms here. */
#define PG_ROWS 96
#define PG_KC 256

static dsattn_status prefill_tiled(dsattn_ctx *ctx, const dsattn_pgemm_kern *pk,
                                   const dsattn_mla_kern *mk, const dsattn_weight *W, size_t G,
                                   const float *x, size_t ldx, size_t gx, size_t n_tok, float *y,
                                   size_t ldy, dsattn_out_round round)
{
    const size_t K = W->cols, R = W->rows, Rg = R / G, MR = DSATTN_PGEMM_MR, NR = DSATTN_PGEMM_NR;
    const size_t ng = (n_tok + NR - 1) / NR, np = ng * NR;
    const size_t pan_g = (Rg + PG_ROWS - 1) / PG_ROWS, n_pan = G * pan_g;   /* panels */
    const int nthr = DSATTN_MAX(1, ctx->n_threads);
    /* shared: the packed tokens of every group; per thread: 12 decoded
     * rows, the panel's tiles, the panel's sums */
    size_t nb, a1, a2, per_thr, nall;
    if (!dsattn_mul3_size(G, np, K, &nb) || !dsattn_mul_size(MR + PG_ROWS, K, &a1) ||
        !dsattn_mul_size(PG_ROWS, np, &a2) || !dsattn_add_size(a1, a2, &per_thr) ||
        !dsattn_mul_size(per_thr, (size_t)nthr, &nall))
        return DSATTN_ERR_NOMEM;
    size_t need;
    if (!dsattn_add_size(nb, nall, &need) || !dsattn_mul_size(need, sizeof(float), &need))
        return DSATTN_ERR_NOMEM;
    int own;
    float *ws = lin_scratch(ctx, need, &own);
    if (!ws) return DSATTN_ERR_NOMEM;
    float *bp = ws, *tbuf = bp + nb;
    const dsattn_fp8_row_fn fp8_row = ctx->kt->wdq->fp8_row;
    const int fused = W->kind == DSATTN_W_FP8 && W->block % 16 == 0 && K % 16 == 0;
    void (*const tile_rows)(const float *, size_t, size_t, size_t, float *) =
        mk ? mk->tile_rows : tile_rows_c;
    void (*const round_bf16)(float *, size_t) = mk ? mk->round_bf16 : dsattn_round_bf16_n;
    /* two loops, each a region only with 2+ threads (DSATTN_PARALLEL_FOR_DYN:
     * a one-thread region would allocate a libgomp team per call) */
    DSATTN_PARALLEL_FOR_DYN(nthr, j, G * ng, {
        const size_t gr = j / ng, g = j % ng;
        pk->pack_b(x + gr * gx + g * NR * ldx, ldx, DSATTN_MIN(NR, n_tok - g * NR), K,
                   bp + (gr * np + g * NR) * K);
    });
    DSATTN_PARALLEL_FOR_DYN(nthr, pi, n_pan, {
        float *rows = tbuf + (size_t)dsattn_thread_num() * per_thr;
        float *ap = rows + MR * K, *cb = ap + PG_ROWS * K;
        const size_t gr = pi / pan_g, r0 = gr * Rg + pi % pan_g * PG_ROWS;
        const size_t n = DSATTN_MIN((size_t)PG_ROWS, (gr + 1) * Rg - r0);
        const float *bg = bp + gr * np * K;
        const size_t nt = (n + MR - 1) / MR;
        for (size_t i = 0; i < nt; i++) {
            const size_t a = r0 + i * MR, m = DSATTN_MIN(MR, r0 + n - a);
            if (fused) {
                const size_t ldsc = (K + W->block - 1) / W->block;
                const float *sc[DSATTN_PGEMM_MR];
                for (size_t r = 0; r < MR; r++)
                    sc[r] = W->scale + ((a + DSATTN_MIN(r, m - 1)) / W->block) * ldsc;
                pk->tile_fp8((const uint8_t *)W->data + a * K, K, sc, W->block, m,
                             W->finite, ap + i * MR * K);
                continue;
            }
            if (W->kind == DSATTN_W_FP8) {
                const size_t ldsc = (K + W->block - 1) / W->block;
                for (size_t r = 0; r < m; r++)
                    fp8_row((const uint8_t *)W->data + (a + r) * K,
                            W->scale + ((a + r) / W->block) * ldsc, W->block, K, rows + r * K);
            } else {
                dequant_rows(W, a, m, rows);
            }
            tile_rows(rows, K, m, K, ap + i * MR * K);
        }
        for (size_t k0 = 0; k0 < K; k0 += PG_KC) {
            const size_t kc = DSATTN_MIN((size_t)PG_KC, K - k0);
            for (size_t g = 0; g < ng; g++) {
                const int nw = (int)DSATTN_MIN(NR, (n_tok - g * NR + 7) / 8 * 8);
                for (size_t i = 0; i < nt; i++)
                    pk->tile(ap + i * MR * K + k0 * MR, bg + g * NR * K + k0 * NR, kc, nw,
                             cb + i * MR * np + g * NR, np, k0 == 0);
            }
        }
        if (round == DSATTN_OUT_BF16) round_bf16(cb, n * np);
        for (size_t t = 0; t < n_tok; t++)
            for (size_t r = 0; r < n; r++) y[t * ldy + r0 + r] = cb[r * np + t];
    });
    if (own) dsattn_free(ws);
    return DSATTN_OK;
}

/* The prefill path on AMX-BF16 tiles (contexts whose table has the amx
 * slot; amx_attn.h).
 * The reference's FP8 linear() quantizes the activations to E4M3 times a
 * power-of-two scale, and FP8 weights with UE8M0 / power-of-two block
 * scales decode to E4M3 times a power of two: both are bf16 numbers, so a
 * TDPBF16PS product is exact and only the fp32 summation order differs
 * from the FMA tile (as between any two fast paths).  bf16 weights go in
 * as they are.  Per chunk of tokens (<= 128, and <= 1 MB of packed bf16
 * per group) the tokens are packed once as the tiles' B operand
 * (dsattn_amx_pack_q, which checks they are bf16 numbers); each thread
 * takes 32-row panels (dynamic), decodes FP8 rows to bf16 with the check,
 * and runs the score GEMM of amx_attn.h against the chunk: C [32 rows]
 * [chunk] -> rounded -> y.  Returns 0 (y possibly written, to be
 * overwritten) when a value is not a bf16 number or the shapes do not
 * fit; *st carries an allocation failure. */
static int prefill_amx(dsattn_ctx *ctx, const dsattn_mla_kern *mk, const dsattn_weight *W,
                       size_t G, const float *x, size_t ldx, size_t gx, size_t n_tok, float *y,
                       size_t ldy, dsattn_out_round round, dsattn_status *st)
{
    const size_t K = W->cols, R = W->rows, Rg = R / G;
    const dsattn_amx_kern *ak = ctx->kt->amx;
    if (!ak || K % 32 || Rg % 32 || n_tok == 0 ||
        !((W->kind == DSATTN_W_FP8 && W->finite) || W->kind == DSATTN_W_BF16))
        return 0;
    size_t tc = ((size_t)1 << 20) / (2 * K) / 32 * 32;        /* tokens per chunk */
    tc = DSATTN_MAX((size_t)32, DSATTN_MIN(tc, (size_t)128));
    tc = DSATTN_MIN(tc, (n_tok + 31) / 32 * 32);
    const int nthr = DSATTN_MAX(1, ctx->n_threads);
    /* shared: the packed chunk of every group; per thread: 32 bf16 rows,
     * one fp32 row, C [32][tc] */
    size_t qbytes, per, all, need;
    if (!dsattn_mul3_size(G, tc, K * 2, &qbytes) ||
        !dsattn_mul_size(K, 32 * 2 + 4, &per) || !dsattn_add_size(per, 32 * tc * 4 + 256, &per) ||
        !dsattn_mul_size(per, (size_t)nthr, &all) || !dsattn_add_size(qbytes + 64, all, &need)) {
        *st = DSATTN_ERR_NOMEM;
        return 1;
    }
    int own;
    uint8_t *ws = lin_scratch(ctx, need, &own);
    if (!ws) { *st = DSATTN_ERR_NOMEM; return 1; }
    uint16_t *qb = (uint16_t *)ws;
    uint8_t *tws = ws + (qbytes + 63) / 64 * 64;
    const dsattn_fp8_row_fn fp8_row = ctx->kt->wdq->fp8_row;
    const size_t n_pan = R / 32;
    int failed = 0;
    for (size_t c0 = 0; c0 < n_tok && !failed; c0 += tc) {
        const size_t nc = DSATTN_MIN(tc, n_tok - c0);
        for (size_t g = 0; g < G && !failed; g++)
            failed = !ak->pack_q(x + g * gx + c0 * ldx, ldx, nc, tc, K, qb + g * tc * K);
        if (failed) break;
#pragma omp parallel num_threads(nthr)
        {
            uint8_t *mine = tws + (size_t)omp_get_thread_num() * ((per + 63) / 64 * 64);
            uint16_t *rows = (uint16_t *)mine;
            float *frow = (float *)(mine + 32 * K * 2), *cb = frow + K;
            int bad = 0;
            ak->begin();
            /* interleaved panels: a thread's next panel is known, and its
             * weight rows are prefetched while this panel's tiles run (the
             * decode waited on memory otherwise: 4 KB rows, a new stream
             * at every page) */
#pragma omp for schedule(static, 1)
            for (size_t pi = 0; pi < n_pan; pi++) {
                const size_t r0 = pi * 32, g = r0 / Rg;
                if (bad) continue;
                const size_t nx = pi + (size_t)omp_get_num_threads();
                const size_t wb = W->kind == DSATTN_W_BF16 ? 2 : 1;
                const uint8_t *pf = nx < n_pan ? (const uint8_t *)W->data + nx * 32 * K * wb : NULL;
                const uint16_t *pr;
                if (W->kind == DSATTN_W_BF16) {
                    pr = (const uint16_t *)W->data + r0 * K;
                } else {
                    const size_t ldsc = (K + W->block - 1) / W->block;
                    for (size_t r = 0; r < 32 && !bad; r++) {
                        const uint8_t *wr = (const uint8_t *)W->data + (r0 + r) * K;
                        const float *sr = W->scale + ((r0 + r) / W->block) * ldsc;
                        if (W->block % 32 == 0) {
                            bad = !ak->fp8_row_bf16(wr, sr, W->block, K, rows + r * K);
                        } else {
                            fp8_row(wr, sr, W->block, K, frow);
                            bad = !ak->rows_bf16(frow, K, 1, K, rows + r * K);
                        }
                    }
                    pr = rows;
                }
                if (bad) continue;
                ak->gemm_nt(qb + g * tc * K, tc, K, pr, 1, cb, pf, pf ? 32 * K * wb : 0);
                if (round == DSATTN_OUT_BF16) mk->round_bf16(cb, 32 * tc);
                for (size_t t = 0; t < nc; t++)
                    for (size_t r = 0; r < 32; r++) y[(c0 + t) * ldy + r0 + r] = cb[r * tc + t];
            }
            ak->end();
            if (bad) {
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    if (own) dsattn_free(ws);
    return !failed;
}

/* The bf16-dot path (pgemm.h's fp8_bf16, the avx512-bf16 table): FP8
 * weights without NaN codes and with power-of-two block scales, against
 * activations that are bf16 numbers - the reference's act_quant (V3.2, V4,
 * V4.1: E4M3 times a power of two) or bf16 values (the attention output
 * into wo_a).  Every product is then exact; the sums differ from the FMA
 * paths' only in their order.  x is packed to bf16 once per call (per
 * group), with the exponent range of its nonzero elements; the threads
 * take runs of 8 panels of 32 rows (dynamic; a panel lies inside one scale
 * row and one group) and check, per panel, pgemm.h's guard for each block scale 2^e: a power
 * of two with e in [-117, 119] (every code a normal bf16 number), and
 * every product at most 2^100 in magnitude (the E4M3 magnitudes lie in
 * [2^-9, 2^9)).  Returns 0 - y possibly written, the caller's path
 * then overwrites it - when a check fails or the shapes do not fit; *st
 * carries an allocation failure. */
#define DOT_PANEL 32
#define DOT_RUN 8          /* panels a thread takes in a row: the kernel's
                            * prefetch runs ahead into its own next panel */

static int linear_dotbf16(dsattn_ctx *ctx, const dsattn_weight *W, size_t G, const float *x,
                          size_t ldx, size_t gx, size_t n_tok, float *y, size_t ldy,
                          dsattn_out_round round, dsattn_status *st)
{
    const dsattn_pgemm_kern *pk = ctx->kt->pgemm;
    const size_t K = W->cols, R = W->rows, Rg = R / G, bs = W->block;
    if (!pk || !pk->fp8_bf16 || W->kind != DSATTN_W_FP8 || !W->finite || n_tok == 0 ||
        K % 32 || bs == 0 || bs % 32 || Rg % DOT_PANEL)
        return 0;
    const size_t nkb = (K + bs - 1) / bs;
    const int nthr = DSATTN_MAX(1, ctx->n_threads);
    /* shared: the tokens as bf16, per group; per thread: the kernel's
     * work, a panel's exponent offsets */
    const size_t ldxb = K + 32;               /* rows not 2^n bytes apart */
    const size_t per = DSATTN_PGEMM_DOT_WORK + (nkb * 2 + 63) / 64 * 64;
    size_t xbytes, ebytes, need;
    if (!dsattn_mul3_size(G, n_tok, ldxb * 2, &xbytes) ||
        !dsattn_mul_size((size_t)nthr, per, &ebytes) ||
        !dsattn_add_size(xbytes + 64, ebytes, &need)) {
        *st = DSATTN_ERR_NOMEM;
        return 1;
    }
    int own;
    uint8_t *ws = lin_scratch(ctx, need, &own);
    if (!ws) { *st = DSATTN_ERR_NOMEM; return 1; }
    uint16_t *xb = (uint16_t *)ws;
    uint8_t *tws = ws + (xbytes + 63) / 64 * 64;
    int efmin = 255, efmax = 0, ok = 1;
    for (size_t g = 0; g < G && ok; g++) {
        int lo, hi;
        ok = pk->pack_bf16(x + g * gx, ldx, n_tok, K, xb + g * n_tok * ldxb, ldxb, &lo, &hi);
        efmin = DSATTN_MIN(efmin, lo);
        efmax = DSATTN_MAX(efmax, hi);
    }
    atomic_int failed = !ok;
    if (ok) {
        const int xe_hi = efmax - 127, any = efmax >= efmin;
        const uint8_t *w8 = (const uint8_t *)W->data;
        const size_t n_pan = R / DOT_PANEL, n_run = (n_pan + DOT_RUN - 1) / DOT_RUN;
        DSATTN_PARALLEL_FOR_DYN(nthr, ri, n_run, {
            uint8_t *mine = tws + (size_t)dsattn_thread_num() * per;
            int16_t *eo = (int16_t *)(mine + DSATTN_PGEMM_DOT_WORK);
            for (size_t pi = ri * DOT_RUN; pi < DSATTN_MIN(n_pan, (ri + 1) * DOT_RUN); pi++) {
                const size_t r0 = pi * DOT_PANEL;
                const float *sr = W->scale + (r0 / bs) * nkb;
                int good = !atomic_load_explicit(&failed, memory_order_relaxed);
                for (size_t b = 0; b < nkb && good; b++) {
                    uint32_t u;
                    memcpy(&u, &sr[b], 4);
                    const int e = (int)(u >> 23) - 127;
                    good = !(u & 0x807fffffu) && e >= -117 && e <= 119 &&
                           (!any || e + 9 + xe_hi + 1 <= 100);
                    eo[b] = (int16_t)(e * 128);
                }
                if (!good) {
                    atomic_store_explicit(&failed, 1, memory_order_relaxed);
                    break;
                }
                const size_t g = r0 / Rg;
                pk->fp8_bf16(w8 + r0 * K, K, DOT_PANEL, eo, bs, xb + g * n_tok * ldxb, ldxb,
                             n_tok, y + r0, ldy, mine);
                if (round == DSATTN_OUT_BF16)
                    for (size_t t = 0; t < n_tok; t++)
                        dsattn_round_bf16_n(y + t * ldy + r0, DOT_PANEL);
            }
        });
    }
    if (own) dsattn_free(ws);
    return !atomic_load(&failed);
}

/* The prefill-sized fast path where the kernel table has GEMM tiles
 * (pgemm slot: AVX-512, AVX2, NEON): AMX-BF16 tiles where they apply (the amx
 * slot, which comes with the mla slot), else the FMA tiles.  Returns 0
 * when the table has none (the caller's sgemm path); *st carries an
 * allocation failure. */
static int prefill_tiles(dsattn_ctx *ctx, const dsattn_weight *W, size_t G, const float *x,
                         size_t ldx, size_t gx, size_t n_tok, float *y, size_t ldy,
                         dsattn_out_round round, dsattn_status *st)
{
    const dsattn_pgemm_kern *pk = ctx->kt->pgemm;
    const dsattn_mla_kern *mk = ctx->kt->mla;
    if (!pk) return 0;
    if (!(mk && prefill_amx(ctx, mk, W, G, x, ldx, gx, n_tok, y, ldy, round, st)))
        *st = prefill_tiled(ctx, pk, mk, W, G, x, ldx, gx, n_tok, y, ldy, round);
    return 1;
}

/* Up to LIN_GEMV_MAX_TOK tokens (a batched decode step) an FP8 weight
 * goes through the table's multi-token GEMV, which decodes each block once
 * for every token, rather than through the register tiles, which pad the
 * tokens to whole tiles and decode the weight into panels first (measured
 * with dsattn bench v41 --batch).  Not where the context runs AMX tiles. */
#define LIN_GEMV_MAX_TOK 16
/* From this many tokens on, the bf16-dot path where it applies (below, the
 * GEMVs read the weight at about the same rate; measured with dsattn bench
 * v41 --batch) */
#define LIN_DOT_MIN_TOK 4

static int batched_gemv(const dsattn_ctx *ctx, const dsattn_weight *W)
{
    return ((W->kind == DSATTN_W_FP8 && ctx->k->gemv_fp8_m) ||
            (W->kind == DSATTN_W_BF16 && ctx->k->gemv_bf16_m)) && !ctx->kt->amx;
}

static dsattn_status linear_run(dsattn_ctx *ctx, const dsattn_weight *W,
                            const float *x, size_t ldx, size_t n_tok,
                            float *y, size_t ldy, dsattn_out_round round,
                            const dsattn_actq *aq, float *scratch)
{
    if (!ctx || !W || !x || !y) return DSATTN_ERR_INVALID_ARG;
    const size_t K = W->cols, R = W->rows;
    const float *in = x;
    size_t ldin = ldx;
    int quant = (W->kind == DSATTN_W_FP8 || W->kind == DSATTN_W_FP4);
    if (quant && aq) {
        if (!scratch || aq->block == 0 || K % aq->block) return DSATTN_ERR_UNSUPPORTED;
        /* rows are independent: a prefill chunk's are split over the
         * threads; a decode step's few rows stay in this thread */
        const int nthr = n_tok >= 32 && !omp_in_parallel() ? DSATTN_MAX(1, ctx->n_threads) : 1;
        DSATTN_PARALLEL_FOR_DYN(nthr, t, n_tok,
                                { actq_row(ctx->k, x + t * ldx, K, aq, scratch + t * K); });
        in = scratch;
        ldin = K;
    }
    if (W->kind == DSATTN_W_FP4 && K % 32) return DSATTN_ERR_UNSUPPORTED;

    dsattn_status st = DSATTN_OK;
    const int tiles = ctx->mode == DSATTN_MODE_FAST && n_tok >= 8 &&
                      !(n_tok <= LIN_GEMV_MAX_TOK && batched_gemv(ctx, W));
    if (ctx->mode == DSATTN_MODE_FAST && n_tok >= LIN_DOT_MIN_TOK &&
        linear_dotbf16(ctx, W, 1, in, ldin, 0, n_tok, y, ldy, round, &st)) {
        if (st) return st;
    } else if (tiles && prefill_tiles(ctx, W, 1, in, ldin, 0, n_tok, y, ldy, round, &st)) {
        if (st) return st;
    } else if (tiles) {
        /* Prefill-sized: each thread dequantizes its own row panels (SIMD
         * for FP8) and multiplies them with sgemm, which OpenBLAS runs
         * single-threaded inside our region - one thread pool, no
         * oversubscription, the weight read once per call. */
        const size_t panel = 128;
        const size_t n_pan = (R + panel - 1) / panel;
        const int nthr = DSATTN_MAX(1, ctx->n_threads);
        size_t wbytes;
        if (!dsattn_mul_size((size_t)nthr * panel, K * sizeof(float), &wbytes))
            return DSATTN_ERR_NOMEM;
        int own;                 /* the context's grow-only scratch: no allocation per call */
        float *wbuf = lin_scratch(ctx, wbytes, &own);
        if (!wbuf) return DSATTN_ERR_NOMEM;
        const dsattn_fp8_row_fn fp8_row = ctx->kt->wdq->fp8_row;
        DSATTN_PARALLEL_FOR_DYN(nthr, pi, n_pan, {
            size_t r0 = pi * panel, n = DSATTN_MIN(panel, R - r0);
            float *wb = wbuf + (size_t)dsattn_thread_num() * panel * K;
            if (W->kind == DSATTN_W_FP8) {
                size_t ldsc = (K + W->block - 1) / W->block;
                for (size_t r = r0; r < r0 + n; r++)
                    fp8_row((const uint8_t *)W->data + r * K, W->scale + (r / W->block) * ldsc,
                            W->block, K, wb + (r - r0) * K);
            } else {
                dequant_rows(W, r0, n, wb);
            }
            /* on this thread only: with one thread the region above is
             * inactive, and OpenBLAS would fork its own team inside it
             * (beside the idle pool: 2.5 instead of 11 tok/s on 1 thread) */
            dsattn_sgemm_small(1, 1, n_tok, n, K, in, ldin, wb, K, 0.0f, y + r0, ldy);
        });
        if (own) dsattn_free(wbuf);
        if (round == DSATTN_OUT_BF16)
            for (size_t t = 0; t < n_tok; t++) dsattn_round_bf16_n(y + t * ldy, R);
    } else {
        gemv_tasks(ctx, W, 1, in, ldin, 0, n_tok, y, ldy, round);   /* rounds its rows */
    }
    dsattn_count(ctx, 2ull * n_tok * R * K, dsattn_weight_bytes(W) + n_tok * K * 4ull);
    return DSATTN_OK;
}

/* A timed projection call of dt seconds (counters were b0/f0 before it):
 * its time goes to the open phase's projection time, or to OTHER as a phase
 * of its own when none is open. */
static void prof_add(dsattn_ctx *ctx, double dt, uint64_t b0, uint64_t f0)
{
    const int ph = ctx->phase >= 0 ? ctx->phase : DSATTN_PHASE_OTHER;
    ctx->prof.proj_seconds[ph] += dt;
    ctx->prof.proj_flops[ph] += ctx->cnt.flops - f0;
    if (ctx->phase < 0) {                 /* no open phase: it is its own */
        ctx->prof.seconds[ph] += dt;
        ctx->prof.bytes_read[ph] += ctx->cnt.bytes_read - b0;
        ctx->prof.flops[ph] += ctx->cnt.flops - f0;
    }
}

/* The profiled entry: with profiling on, the call's wall time goes to the
 * open phase (OTHER outside any).  Calls from inside a parallel region are
 * not timed: their time is already inside their caller's phase. */
dsattn_status dsattn_linear(dsattn_ctx *ctx, const dsattn_weight *W,
                            const float *x, size_t ldx, size_t n_tok,
                            float *y, size_t ldy, dsattn_out_round round,
                            const dsattn_actq *aq, float *scratch)
{
    if (!ctx || !ctx->prof_on || omp_in_parallel())
        return linear_run(ctx, W, x, ldx, n_tok, y, ldy, round, aq, scratch);
    const double t0 = dsattn_clock();
    const uint64_t b0 = ctx->cnt.bytes_read, f0 = ctx->cnt.flops;
    dsattn_status st = linear_run(ctx, W, x, ldx, n_tok, y, ldy, round, aq, scratch);
    prof_add(ctx, dsattn_clock() - t0, b0, f0);
    return st;
}

/* Rows [r0, r0+n) of a weight as a weight of its own (r0 a multiple of the
 * FP8 block when FP8). */
static dsattn_weight sub_rows(const dsattn_weight *w, size_t r0, size_t n)
{
    dsattn_weight v = *w;
    switch (w->kind) {
    case DSATTN_W_FP8: {
        size_t ldsc = (w->cols + w->block - 1) / w->block;
        v.data = (const uint8_t *)w->data + r0 * w->cols;
        v.scale = w->scale + (r0 / w->block) * ldsc;
        break;
    }
    case DSATTN_W_FP4:
        v.data = (const uint8_t *)w->data + r0 * (w->cols / 2);
        v.scale_e8m0 = w->scale_e8m0 + r0 * (w->cols / 32);
        break;
    case DSATTN_W_F32:
    case DSATTN_W_BF16:
        v.data = (const uint8_t *)w->data + r0 * w->cols * (w->kind == DSATTN_W_F32 ? 4 : 2);
        break;
    }
    v.rows = n;
    v.owned = NULL;
    return v;
}

dsattn_status dsattn_linear_grouped(dsattn_ctx *ctx, const dsattn_weight *W, size_t G,
                                    const float *x, size_t ldx, size_t gx, size_t n_tok,
                                    float *y, size_t ldy, dsattn_out_round round)
{
    if (!ctx || !W || !x || !y || G == 0 || W->rows % G) return DSATTN_ERR_INVALID_ARG;
    const size_t Rg = W->rows / G;
    if ((W->kind == DSATTN_W_FP8 && Rg % W->block) || (W->kind == DSATTN_W_FP4 && W->cols % 32))
        return DSATTN_ERR_UNSUPPORTED;
    const int small = n_tok <= LIN_GEMV_MAX_TOK && batched_gemv(ctx, W);
    if (ctx->mode == DSATTN_MODE_FAST && n_tok >= 8 && !small && !ctx->kt->pgemm) {
        /* prefill-sized without register tiles: the panel + sgemm path,
         * one group at a time */
        for (size_t g = 0; g < G; g++) {
            dsattn_weight wg = sub_rows(W, g * Rg, Rg);
            dsattn_status st = dsattn_linear(ctx, &wg, x + g * gx, ldx, n_tok, y + g * Rg, ldy,
                                             round, NULL, NULL);
            if (st) return st;
        }
        return DSATTN_OK;
    }
    const int timed = ctx->prof_on && !omp_in_parallel();
    const double t0 = timed ? dsattn_clock() : 0.0;
    const uint64_t b0 = ctx->cnt.bytes_read, f0 = ctx->cnt.flops;
    dsattn_status st = DSATTN_OK;
    if (ctx->mode == DSATTN_MODE_FAST && n_tok >= LIN_DOT_MIN_TOK &&
        linear_dotbf16(ctx, W, G, x, ldx, gx, n_tok, y, ldy, round, &st)) {
        if (st) return st;
    } else if (ctx->mode == DSATTN_MODE_FAST && n_tok >= 8 && !small) {
        /* prefill-sized with GEMM tiles: every group's panels in one region */
        prefill_tiles(ctx, W, G, x, ldx, gx, n_tok, y, ldy, round, &st);
        if (st) return st;
    } else {
        gemv_tasks(ctx, W, G, x, ldx, gx, n_tok, y, ldy, round);
    }
    dsattn_count(ctx, 2ull * n_tok * W->rows * W->cols,
                 dsattn_weight_bytes(W) + n_tok * G * W->cols * 4ull);
    if (timed) prof_add(ctx, dsattn_clock() - t0, b0, f0);
    return DSATTN_OK;
}
