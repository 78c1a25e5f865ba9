/* sparse_attn.c - the attention kernel of V4 and V4.1 (sparse_attn) and
 * the packed-row gather (dsattn_kv_row) it shares with the lightning
 * indexer's scores (indexer.c).
 *
 * sparse_attn follows the TileLang kernel (docs/semantics.md §2.5):
 * indices in blocks of 64 in index order, invalid (-1) rows score -inf, the
 * running max starts at max_init (-1e30 in V4.1 so an all-invalid row gives
 * exactly 0; -inf in V4, where such a row gives NaN), P is rounded to bf16
 * for P.V while the denominator stays fp32, and the per-head sink joins the
 * denominator only, unscaled, after the loop.
 *
 * Reference mode evaluates each block literally (every score and every P.V
 * sum accumulated in double, rounded once).  Fast mode skips invalid rows,
 * dequantizes each gathered row once for all heads, and accumulates in fp32:
 * on AVX-512 and AVX2 through sparse_attn_tiled (sa_kernels.h, heads in
 * lanes, register-tiled GEMMs), elsewhere through the kernel table
 * (sparse_attn_fast).
 */
#include "blas.h"
#include "ops.h"

#include "ktab.h"
#include "numfmt.h"

#include <math.h>

void dsattn_kv_row(const dsattn_kv_src *src, size_t row, float *out)
{
    const uint8_t *p = (const uint8_t *)src->base + row * src->stride;
    switch (src->kind) {
    case DSATTN_KV_F32:     memcpy(out, p, src->d * sizeof(float)); break;
    case DSATTN_KV_V41_SWA: dsattn_v41_swa_unpack(p, src->d, out); break;
    case DSATTN_KV_V41_FP4: dsattn_v41_kv_unpack(p, src->d, out); break;
    case DSATTN_KV_V4:
        dsattn_v4_kv_unpack(p, src->d - src->d_rope, src->d_rope, out);
        break;
    case DSATTN_KV_FP4_IDX: dsattn_fp4_index_unpack(p, src->d, out); break;
    }
}

/* Row j of the concatenation [src0 ; src1]. */
static void cat_row(const dsattn_kv_src *s0, const dsattn_kv_src *s1, size_t j,
                    float *out)
{
    if (j < s0->n_rows) dsattn_kv_row(s0, j, out);
    else dsattn_kv_row(s1, j - s0->n_rows, out);
}

static size_t cat_rows(const dsattn_kv_src *s0, const dsattn_kv_src *s1)
{
    return s0->n_rows + (s1 ? s1->n_rows : 0);
}

#define SA_BLOCK 64

/* keys of one block rounded up to whole 12-key tiles (sparse_attn_tiled) */
#define SA_TBLOCK ((SA_BLOCK + DSATTN_MLA_KT - 1) / DSATTN_MLA_KT * DSATTN_MLA_KT)

/* The tiled path's workspace (hp = nh rounded up to 16): packed q [hp][d],
 * acc^T [d][hp], the tiled block [SA_TBLOCK][d + 16] (rows decoded into
 * it), scores [SA_TBLOCK][hp], max/sum/alpha [3][hp]. */
static size_t tiled_scratch(size_t nh, size_t d)
{
    const size_t hp = (nh + 15) / 16 * 16;
    return 2 * hp * d + SA_TBLOCK * (d + 16) + SA_TBLOCK * hp + 3 * hp;
}

/* The AMX path's workspace (hp = nh rounded up to 32), in floats: packed
 * q [hp][d] bf16, O [hp][d], max/sum/den [3][hp], the block's bf16 rows
 * [DSATTN_AMX_MB][d], 12 decoded fp32 rows [12][d + 16], the block
 * operator's scratch, and 64-byte alignment for each piece. */
static size_t amx_scratch(size_t nh, size_t d)
{
    const size_t hp = (nh + 31) / 32 * 32;
    return hp * d / 2 + hp * d + 3 * hp + (size_t)DSATTN_AMX_MB * d / 2 +
           DSATTN_MLA_KT * (d + 16) + dsattn_amx_ws_bytes(hp, d, d) / 4 + 6 * 16;
}

size_t dsattn_sparse_attn_scratch(size_t nh, size_t d)
{
    /* rows [64][d], scores [nh][64], acc [nh][d], max/sum/scale [3][nh],
     * and (fast path) dots [64][nh]; or the tiled or AMX path's, if larger */
    const size_t plain = SA_BLOCK * d + nh * SA_BLOCK + nh * d + 3 * nh + SA_BLOCK * nh;
    const size_t tiled = tiled_scratch(nh, d), amx = amx_scratch(nh, d);
    const size_t m = plain > tiled ? plain : tiled;
    return m > amx ? m : amx;
}

static float expd(float x) { return (float)exp((double)x); }

static void sparse_attn_ref(const float *q, size_t nh, size_t d,
                            const dsattn_kv_src *s0, const dsattn_kv_src *s1,
                            const int32_t *idx, size_t n_idx, const float *sink,
                            float scale, float max_init, float *out, float *ws)
{
    float *rows = ws, *sc = rows + SA_BLOCK * d, *acc = sc + nh * SA_BLOCK;
    float *mx = acc + nh * d, *sum = mx + nh;
    size_t nrows = cat_rows(s0, s1);
    for (size_t h = 0; h < nh; h++) { mx[h] = max_init; sum[h] = 0.0f; }
    memset(acc, 0, nh * d * sizeof(float));
    for (size_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        size_t nb = DSATTN_MIN((size_t)SA_BLOCK, n_idx - b0);
        int valid[SA_BLOCK];
        for (size_t j = 0; j < nb; j++) {
            int32_t ix = idx[b0 + j];
            valid[j] = ix >= 0 && (size_t)ix < nrows;
            if (valid[j]) cat_row(s0, s1, (size_t)ix, rows + j * d);
            else memset(rows + j * d, 0, d * sizeof(float));
        }
        for (size_t h = 0; h < nh; h++) {
            const float *qh = q + h * d;
            float *sh = sc + h * SA_BLOCK;
            float bmax = -INFINITY;
            for (size_t j = 0; j < nb; j++) {
                double a = 0.0;
                for (size_t i = 0; i < d; i++) a += (double)qh[i] * (double)rows[j * d + i];
                float s = valid[j] ? 0.0f + (float)a : -INFINITY;
                s = s * scale;
                sh[j] = s;
                if (s > bmax) bmax = s;
            }
            float mprev = mx[h];
            float mnew = mprev > bmax ? mprev : bmax;
            if (isnan(mprev)) mnew = mprev;
            mx[h] = mnew;
            float fs = expd(mprev - mnew);
            double rs = 0.0;
            for (size_t j = 0; j < nb; j++) {
                sh[j] = expd(sh[j] - mnew);
                rs += sh[j];
            }
            sum[h] = sum[h] * fs + (float)rs;
            float *ah = acc + h * d;
            for (size_t i = 0; i < d; i++) {
                double pv = 0.0;
                for (size_t j = 0; j < nb; j++)
                    pv += (double)dsattn_round_bf16(sh[j]) * (double)rows[j * d + i];
                ah[i] = ah[i] * fs + (float)pv;
            }
        }
    }
    for (size_t h = 0; h < nh; h++) {
        float den = sum[h];
        if (sink) den = den + expd(sink[h] - mx[h]);
        for (size_t i = 0; i < d; i++)
            out[h * d + i] = dsattn_round_bf16(acc[h * d + i] / den);
    }
}

/* Where row j of [s0 ; s1] lives, and in which packed layout. */
static const uint8_t *cat_ptr(const dsattn_kv_src *s0, const dsattn_kv_src *s1, size_t j,
                              const dsattn_kv_src **src)
{
    *src = j < s0->n_rows ? s0 : s1;
    size_t r = j < s0->n_rows ? j : j - s0->n_rows;
    return (const uint8_t *)(*src)->base + r * (*src)->stride;
}

/* Dequantize the row at p of layout src (any kind) into out. */
static void row_at(const dsattn_kv_src *src, const uint8_t *p, float *out)
{
    dsattn_kv_src one = *src;
    one.base = p;
    dsattn_kv_row(&one, 0, out);
}

/* Fast form: per block of 64 indices, the valid rows are scored and
 * accumulated straight from their packed bytes - FP4 main-KV rows eight at a
 * time through the multi-row kernels (each q / acc vector loaded once for
 * eight rows: 64 heads x 512 floats do not fit L1), FP8 window rows one at
 * a time through the fused kernels; other layouts are dequantized first.
 * fp32 accumulation; P rounded to bf16 as in the reference. */
static void sparse_attn_fast(dsattn_ctx *ctx, const float *q, size_t nh, size_t d,
                             const dsattn_kv_src *s0, const dsattn_kv_src *s1,
                             const int32_t *idx, size_t n_idx, const float *sink,
                             float scale, float max_init, float *out, float *ws)
{
    const dsattn_kernels *k = ctx->k;
    const dsattn_exp_sub_sum_fn vexp = ctx->kt->vmath->exp_sub_sum;
    float *rows = ws, *sc = rows + SA_BLOCK * d, *acc = sc + nh * SA_BLOCK;
    float *mx = acc + nh * d, *sum = mx + nh, *fs = sum + nh;
    float *dots = fs + nh;              /* [64][nh] scores, row-major by entry */
    const size_t nrows = cat_rows(s0, s1);
    const uint8_t *ptr[SA_BLOCK];
    const dsattn_kv_src *src[SA_BLOCK];
    dsattn_kv_kind kind[SA_BLOCK];
    for (size_t h = 0; h < nh; h++) { mx[h] = max_init; sum[h] = 0.0f; }
    memset(acc, 0, nh * d * sizeof(float));
    for (size_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        size_t nb = DSATTN_MIN((size_t)SA_BLOCK, n_idx - b0), nv = 0;
        float tmp[512];
        for (size_t j = 0; j < nb; j++) {
            int32_t ix = idx[b0 + j];
            if (ix < 0 || (size_t)ix >= nrows) continue;
            ptr[nv] = cat_ptr(s0, s1, (size_t)ix, &src[nv]);
            kind[nv] = src[nv]->kind;
            nv++;
        }
        if (nv == 0) {
            /* Only -inf scores: the max does not move; with a -inf running
             * max the reference gets exp(-inf - -inf) = NaN (V4). */
            for (size_t h = 0; h < nh; h++)
                if (isinf(mx[h]) && mx[h] < 0) sum[h] = NAN;
            continue;
        }
        /* scores, in runs of one layout */
        for (size_t r0 = 0; r0 < nv;) {
            size_t r1 = r0 + 1;
            while (r1 < nv && kind[r1] == kind[r0]) r1++;
            if (kind[r0] == DSATTN_KV_V41_FP4) {
                k->mdot_fp4e4m3_rows(q, d, nh, ptr + r0, r1 - r0, d, dots + r0 * nh, nh);
            } else if (kind[r0] == DSATTN_KV_V41_SWA) {
                for (size_t r = r0; r < r1; r++)
                    k->mdot_fp8ue8m0(q, d, nh, ptr[r], d, dots + r * nh);
            } else {
                /* other layouts (V4 MODEL1): dequantize the run once, then
                 * one small GEMM for all heads, on this thread only (the
                 * callers parallelise over heads) */
                for (size_t r = r0; r < r1; r++) row_at(src[r], ptr[r], rows + r * d);
                dsattn_sgemm_small(1, 1, r1 - r0, nh, d, rows + r0 * d, d, q, d, 0.0f,
                                   dots + r0 * nh, nh);
            }
            r0 = r1;
        }
        for (size_t r = 0; r < nv; r++)
            for (size_t h = 0; h < nh; h++) sc[h * SA_BLOCK + r] = dots[r * nh + h] * scale;
        for (size_t h = 0; h < nh; h++) {
            float *sh = sc + h * SA_BLOCK, bmax = -INFINITY;
            for (size_t j = 0; j < nv; j++) bmax = sh[j] > bmax ? sh[j] : bmax;
            float mnew = mx[h] > bmax ? mx[h] : bmax;
            fs[h] = expf(mx[h] - mnew);
            mx[h] = mnew;
            const float rs = vexp(sh, nv, mnew);          /* P in fp32, summed */
            for (size_t j = 0; j < nv; j++) sh[j] = dsattn_round_bf16(sh[j]);  /* bf16 P for P.V */
            sum[h] = sum[h] * fs[h] + rs;
            float *ah = acc + h * d;
            if (fs[h] != 1.0f)
                for (size_t i = 0; i < d; i++) ah[i] *= fs[h];
        }
        /* P.V, in the same runs */
        for (size_t r0 = 0; r0 < nv;) {
            size_t r1 = r0 + 1;
            while (r1 < nv && kind[r1] == kind[r0]) r1++;
            if (kind[r0] == DSATTN_KV_V41_FP4) {
                k->maxpy_fp4e4m3_rows(sc + r0, SA_BLOCK, nh, ptr + r0, r1 - r0, d, acc, d);
            } else if (kind[r0] == DSATTN_KV_V41_SWA) {
                for (size_t r = r0; r < r1; r++) {
                    for (size_t h = 0; h < nh; h++) tmp[h] = sc[h * SA_BLOCK + r];
                    k->maxpy_fp8ue8m0(tmp, nh, ptr[r], d, acc, d);
                }
            } else {
                /* acc[nh, d] += P[nh, run] . rows[run, d] (rows still hold
                 * the run's dequantized values from the score pass) */
                dsattn_sgemm_small(1, 0, nh, d, r1 - r0, sc + r0, SA_BLOCK, rows + r0 * d, d,
                                   1.0f, acc, d);
            }
            r0 = r1;
        }
    }
    for (size_t h = 0; h < nh; h++) {
        float den = sum[h];
        if (sink) den += expf(sink[h] - mx[h]);
        for (size_t i = 0; i < d; i++)
            out[h * d + i] = dsattn_round_bf16(acc[h * d + i] / den);
    }
}

/* Decode one packed row of any layout to fp32: the kernel table's row
 * decoders for the V4.1 layouts, dsattn_kv_row's otherwise. */
static void decode_row(const dsattn_kernels *k, const dsattn_kv_src *src, const uint8_t *p,
                       float *out)
{
    if (src->kind == DSATTN_KV_V41_FP4) k->dequant_fp4e4m3_row(p, src->d, out);
    else if (src->kind == DSATTN_KV_V41_SWA) k->dequant_fp8ue8m0_row(p, src->d, out);
    else row_at(src, p, out);
}

/* The valid rows of the block of indices [b0, b0 + nb): where they live,
 * in index order.  Returns their count. */
static size_t block_rows(const dsattn_kv_src *s0, const dsattn_kv_src *s1, size_t nrows,
                         const int32_t *idx, size_t b0, size_t nb, const uint8_t **ptr,
                         const dsattn_kv_src **src)
{
    size_t nv = 0;
    for (size_t j = 0; j < nb; j++) {
        int32_t ix = idx[b0 + j];
        if (ix < 0 || (size_t)ix >= nrows) continue;
        ptr[nv] = cat_ptr(s0, s1, (size_t)ix, &src[nv]);
        nv++;
    }
    return nv;
}

/* nr <= 12 valid rows (ptr[r] in the layout of src[r]) -> fp32 rows out +
 * r*ld, rows nr..11 zero: the tile decoder for the V4.1 packed layouts,
 * the generic row decode otherwise. */
/* The sa_kernels.h layout of each of nr rows; 0 when one is not a V4.1
 * packed layout. */
static int packed_kinds(const dsattn_kv_src *const *src, size_t nr, unsigned char *kinds)
{
    int packed = 1;
    for (size_t r = 0; r < nr; r++) {
        const dsattn_kv_kind kd = src[r]->kind;
        packed &= kd == DSATTN_KV_V41_FP4 || kd == DSATTN_KV_V41_SWA;
        kinds[r] = kd == DSATTN_KV_V41_FP4 ? DSATTN_SA_FP4 : DSATTN_SA_FP8;
    }
    return packed;
}

static void decode_tile(const dsattn_kernels *k, const dsattn_sa_kern *sk,
                        const uint8_t *const *ptr, const dsattn_kv_src *const *src, size_t nr,
                        size_t d, float *out, size_t ld)
{
    unsigned char kinds[DSATTN_MLA_KT];
    if (packed_kinds(src, nr, kinds)) {
        sk->rows(ptr, kinds, nr, d, out, ld);
        return;
    }
    for (size_t r = 0; r < DSATTN_MLA_KT; r++) {
        if (r < nr) decode_row(k, src[r], ptr[r], out + r * ld);
        else memset(out + r * ld, 0, d * sizeof(float));
    }
}

/* Tiled form (AVX-512 and AVX2 contexts; sa_kernels.h): per block of 64 indices
 * the valid rows are decoded once into fp32 rows (12-row tiles, row-major)
 * that serve both S = Q.K^T and acc^T += P.V for every head of the call,
 * heads in the SIMD lanes, so the decode is paid once per row rather than
 * once per head and both GEMMs run from register tiles of 12 keys x 32
 * heads.  Same block structure and roundings as the reference: running
 * max from max_init, fp32 P summed into the denominator, P rounded to bf16
 * for P.V, sink after the loop; only the summation order (fp32, FMA)
 * differs.  The next block's packed rows are prefetched before P.V. */
static void sparse_attn_tiled(dsattn_ctx *ctx, const dsattn_mla_kern *mk,
                              const dsattn_sa_kern *sk, const float *q,
                              size_t nh, size_t d, const dsattn_kv_src *s0,
                              const dsattn_kv_src *s1, const int32_t *idx, size_t n_idx,
                              const float *sink, float scale, float max_init, float *out,
                              float *ws)
{
    const dsattn_kernels *k = ctx->k;
    const size_t hp = (nh + 15) / 16 * 16, KT = DSATTN_MLA_KT, ld = d + 16;
    float *qp = ws, *acc = qp + hp * d, *kt = acc + d * hp, *st = kt + SA_TBLOCK * ld;
    float *mx = st + SA_TBLOCK * hp, *sum = mx + hp, *al = sum + hp;
    const size_t nrows = cat_rows(s0, s1);
    size_t rb = s0->stride;
    if (s1 && s1->stride > rb) rb = s1->stride;
    const uint8_t *pa[SA_BLOCK], *pb[SA_BLOCK], **cur = pa, **nxt = pb;
    const dsattn_kv_src *sa[SA_BLOCK], *sb[SA_BLOCK], **scur = sa, **snxt = sb;

    dsattn_mla_pack_q(q, d, nh, hp, d, qp);
    for (size_t h = 0; h < hp; h++) { mx[h] = max_init; sum[h] = 0.0f; }
    memset(acc, 0, d * hp * sizeof(float));
    size_t nv = n_idx ? block_rows(s0, s1, nrows, idx, 0, DSATTN_MIN((size_t)SA_BLOCK, n_idx),
                                   cur, scur) : 0;
    for (size_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        /* the next block's rows, prefetched during this block's P.V */
        const size_t b1 = b0 + SA_BLOCK;
        const size_t nn = b1 < n_idx ? block_rows(s0, s1, nrows, idx, b1,
                                                  DSATTN_MIN((size_t)SA_BLOCK, n_idx - b1),
                                                  nxt, snxt) : 0;
        if (nv == 0) {
            /* as sparse_attn_fast: only -inf scores, the max stays; a -inf
             * running max makes the reference's rescale NaN (V4) */
            for (size_t h = 0; h < hp; h++)
                if (isinf(mx[h]) && mx[h] < 0) sum[h] = NAN;
        } else {
            for (size_t t0 = 0; t0 < nv; t0 += KT)
                decode_tile(k, sk, cur + t0, scur + t0, DSATTN_MIN(KT, nv - t0), d,
                            kt + t0 * ld, ld);
            sk->qk(qp, hp, d, kt, ld, nv, st, hp);
            mk->softmax(st, hp, hp, nv, scale, 0, mx, sum, al);
            mk->round_bf16(st, nv * hp);             /* bf16 P for P.V */
            for (size_t r = 0; r < nn; r++)          /* next block: into L2 */
                for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(nxt[r] + o, 0, 2);
            sk->pv(st, hp, hp, kt, ld, nv, d, al, acc);
        }
        const uint8_t **t = cur; cur = nxt; nxt = t;
        const dsattn_kv_src **u = scur; scur = snxt; snxt = u;
        nv = nn;
    }
    for (size_t h = 0; h < nh; h++) al[h] = sink ? sum[h] + expf(sink[h] - mx[h]) : sum[h];
    sk->finish(acc, hp, nh, d, al, out);
}

static float *align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* bf16-block form (amx_attn.h; contexts whose table has the bf16blk slot:
 * AMX tiles, or their VDPBF16PS form): the valid rows of each
 * block of 64 indices are decoded to bf16 - V4.1 packed rows by rows_bf16,
 * other layouts by the tiled path's row decoders and a bf16-number check -
 * and run through one tile block, q packed once; the next block's rows are
 * prefetched meanwhile.  The V4 quirk of sparse_attn_tiled is kept: a
 * block of 64 indices with no valid row while the running max is still
 * -inf makes the sum NaN.  Returns 0 (out untouched) when it does not apply:
 * shapes, a query or row value that is not a bf16 number. */
static int sparse_attn_amx(dsattn_ctx *ctx, const dsattn_mla_kern *mk, const dsattn_sa_kern *sk,
                           const float *q, size_t nh, size_t d, const dsattn_kv_src *s0,
                           const dsattn_kv_src *s1, const int32_t *idx, size_t n_idx,
                           const float *sink, float scale, float max_init, float *out,
                           float *ws)
{
    const size_t hp = (nh + 31) / 32 * 32, MB = DSATTN_AMX_MB, ld = d + 16;
    const dsattn_amx_kern *ak = ctx->kt->bf16blk;
    if (!ak || !ak->fits(hp, d, d)) return 0;
    uint16_t *qb = (uint16_t *)align64(ws);
    float *o = align64((float *)(qb + hp * d));
    float *mx = o + hp * d, *sum = mx + hp, *den = sum + hp;
    uint16_t *rows = (uint16_t *)align64(den + hp);
    float *dec = align64((float *)(rows + MB * d));
    void *bw = align64(dec + DSATTN_MLA_KT * ld);
    if (!ak->pack_q(q, d, nh, hp, d, qb)) return 0;
    const size_t nrows = cat_rows(s0, s1);
    const uint8_t *ptr[SA_BLOCK], *nptr[SA_BLOCK];
    const dsattn_kv_src *src[SA_BLOCK], *nsrc[SA_BLOCK];
    for (size_t h = 0; h < hp; h++) { mx[h] = max_init; sum[h] = 0.0f; }
    memset(o, 0, hp * d * sizeof(float));
    int nan_sum = 0, seen = 0, ok = 1;
    size_t nv = n_idx ? block_rows(s0, s1, nrows, idx, 0, DSATTN_MIN((size_t)SA_BLOCK, n_idx),
                                   ptr, src) : 0;
    ak->begin();
    for (size_t b0 = 0; b0 < n_idx && ok; b0 += SA_BLOCK) {
        /* one tile block per block of 64 indices: the reference rounds P
         * to bf16 against the running max of each such block, and matching
         * that keeps the roundings the reference makes (blocks of up to
         * 256 rows measured 5x the error against it) */
        const size_t b1 = b0 + SA_BLOCK;
        const size_t nn = b1 < n_idx ? block_rows(s0, s1, nrows, idx, b1,
                                                  DSATTN_MIN((size_t)SA_BLOCK, n_idx - b1),
                                                  nptr, nsrc) : 0;
        if (nv == 0 && !seen && isinf(max_init) && max_init < 0) nan_sum = 1;
        seen |= nv > 0;
        /* decode 12 rows at a time into the block's bf16 rows; meanwhile
         * the next block's packed rows come into L2, 12 rows per tile: they
         * are gathered from a cache that the weight stream keeps pushing
         * out of L3.  Measured in V4.1 decode at 4K: decode + bf16
         * ~470 cycles a row before, ~320 (FP4 rows) after; attention phase
         * 10.8-11.2 -> 9.7-10.1 ms a step. */
        for (size_t t0 = 0; t0 < DSATTN_MAX(nv, nn) && ok; t0 += DSATTN_MLA_KT) {
            for (size_t r = t0; r < DSATTN_MIN(nn, t0 + DSATTN_MLA_KT); r++)
                for (size_t off = 0; off < nsrc[r]->stride; off += 64)
                    __builtin_prefetch(nptr[r] + off, 0, 2);
            if (t0 >= nv) continue;
            const size_t nr = DSATTN_MIN((size_t)DSATTN_MLA_KT, nv - t0);
            unsigned char kinds[DSATTN_MLA_KT];
            if (packed_kinds(src + t0, nr, kinds)) {
                /* V4.1 rows straight to bf16 (no fp32 round trip) */
                ok &= sk->rows_bf16(ptr + t0, kinds, nr, d, rows + t0 * d);
            } else {
                decode_tile(ctx->k, sk, ptr + t0, src + t0, nr, d, dec, ld);
                ok &= ak->rows_bf16(dec, ld, nr, d, rows + t0 * d);
            }
        }
        if (!ok) break;
        if (nv > 0) {
            /* zero rows up to a whole 32-key step: the tiles load straight
             * from the block's rows */
            const size_t nq = (nv + 31) / 32;
            memset(rows + nv * d, 0, (32 * nq - nv) * d * sizeof(uint16_t));
            const uint8_t *tp[SA_BLOCK + 32];
            for (size_t i = 0; i < 32 * nq + 32; i++)
                tp[i] = i < 32 * nq ? (const uint8_t *)(rows + i * d) : NULL;
            ak->block(mk, qb, hp, d, d, tp, nv, d * 2, 1, 1, scale, 0, mx, sum, o, bw);
        }
        memcpy(ptr, nptr, nn * sizeof *ptr);
        memcpy(src, nsrc, nn * sizeof *src);
        nv = nn;
    }
    ak->end();
    if (!ok) return 0;
    for (size_t h = 0; h < nh; h++) {
        den[h] = sink ? sum[h] + expf(sink[h] - mx[h]) : sum[h];
        if (nan_sum) den[h] = NAN;
    }
    ak->finish(o, d, nh, den, out);
    return 1;
}

void dsattn_sparse_attn(dsattn_ctx *ctx, const float *q, size_t nh, size_t d,
                        const dsattn_kv_src *src0, const dsattn_kv_src *src1,
                        const int32_t *idx, size_t n_idx, const float *sink,
                        float scale, float max_init, float *out, float *scratch)
{
    /* bytes read: each valid index at the row size of the source it
     * names (V4.1: 528 B window rows, 288 B compressed rows) */
    uint64_t nvalid = 0, bytes = 0;
    size_t nrows = cat_rows(src0, src1);
    const size_t rb0 = src0->kind == DSATTN_KV_F32 ? d * 4 : src0->stride;
    const size_t rb1 = !src1 ? 0 : src1->kind == DSATTN_KV_F32 ? d * 4 : src1->stride;
    const dsattn_mla_kern *mk;
    const dsattn_sa_kern *sk;
    for (size_t j = 0; j < n_idx; j++)
        if (idx[j] >= 0 && (size_t)idx[j] < nrows) {
            nvalid++;
            bytes += (size_t)idx[j] < src0->n_rows ? rb0 : rb1;
        }
    if (ctx->mode == DSATTN_MODE_REFERENCE || nh > 512 || nh > d || d > 512)
        sparse_attn_ref(q, nh, d, src0, src1, idx, n_idx, sink, scale, max_init, out, scratch);
    else if ((mk = ctx->kt->mla) != NULL && (sk = ctx->kt->sa) != NULL && d % 32 == 0) {
        if (!sparse_attn_amx(ctx, mk, sk, q, nh, d, src0, src1, idx, n_idx, sink, scale, max_init,
                             out, scratch))
            sparse_attn_tiled(ctx, mk, sk, q, nh, d, src0, src1, idx, n_idx, sink, scale, max_init,
                              out, scratch);
    }
    else
        sparse_attn_fast(ctx, q, nh, d, src0, src1, idx, n_idx, sink, scale, max_init, out, scratch);
    dsattn_count(ctx, 4ull * nvalid * nh * d, bytes + nh * d * 4ull);
}
