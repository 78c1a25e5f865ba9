/* mla_indexer.c - the DeepSeek-V3.2 lightning indexer (Indexer.forward and
 * the fp8_index kernel), exactly as the reference computes it.
 *
 * Per token (docs/semantics.md §5, with the later official fix that
 * the indexer RoPE is NOT interleaved):
 *   q = wq_b(qr) -> [Hi, Di]; RoPE on the FIRST dr dims, half-split pairs
 *   (x[i], x[i + dr/2]); Hadamard 128 scaled by Di^-0.5 (bf16 out);
 *   act_quant per 128 -> E4M3 codes + fp32 scale q_s[h]
 *   k = LayerNorm(wk(x)) (weight + bias, fp32, bf16 out); the same RoPE and
 *   Hadamard; act_quant -> the 132-byte cache row (128 codes + fp32 scale)
 *   w[h] = fp32(bf16(bf16(weights_proj(x)) * Hi^-0.5) * q_s[h]) * Di^-0.5
 *   score[j] = k_s[j] * sum_h relu(q_code_h . k_code_j) * w[h]
 * The kernel multiplies the raw E4M3 codes (q_fp8 . k_fp8) and applies the
 * scales afterwards: q_s inside the head weight, k_s on the head sum.  The
 * causal mask and top-k are the caller's (mla_forward.c).
 *
 * Reference mode: every code dot and the head sum accumulated in double,
 * rounded once (the products of E4M3 values are exact).  Fast mode: key
 * rows are decoded in blocks and multiplied against all heads with sgemm,
 * head sums in fp32, blocks spread over OpenMP threads.
 *
 * Not here: top-k, the index mask, the cache allocation.
 */
#include "mla.h"

#include "blas.h"
#include "ktab.h"
#include "numfmt.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void put_f32le(uint8_t *p, float v)
{
    uint32_t u = dsattn_f32_bits(v);
    p[0] = (uint8_t)u; p[1] = (uint8_t)(u >> 8); p[2] = (uint8_t)(u >> 16); p[3] = (uint8_t)(u >> 24);
}

static float get_f32le(const uint8_t *p)
{
    return dsattn_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
}

/* RoPE (first dr dims, half-split) then Hadamard: the shared q/k prologue. */
static void rope_hadamard(float *v, size_t Di, size_t dr, const float *cs, const float *sn,
                          int interleaved)
{
    dsattn_rope_apply(v, dr, cs, sn, interleaved, 0, DSATTN_OUT_BF16);
    dsattn_hadamard(v, Di, (float)pow((double)Di, -0.5), v, DSATTN_OUT_BF16);
}

dsattn_status dsattn_mla_index_qk(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                  const float *x, const float *qr, size_t s,
                                  int64_t start_pos, float *qc, float *wq,
                                  uint8_t *kcache, dsattn_ws *ws)
{
    return dsattn_mla_index_qk_rows(ctx, m, l, x, qr, s, start_pos, NULL, kcache, NULL, qc, wq,
                                    ws);
}

dsattn_status dsattn_mla_index_qk_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                       const float *x, const float *qr, size_t s,
                                       int64_t start_pos, const int64_t *pos,
                                       uint8_t *kcache, uint8_t *const *krow, float *qc,
                                       float *wq, dsattn_ws *ws)
{
    const dsattn_mla_config *c = &m->cfg;
    const dsattn_mla_layer_w *L = &m->layer[l];
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    const size_t dr = (size_t)c->rope, dim = (size_t)c->dim, QL = (size_t)c->q_lora_rank;
    const size_t kb = dsattn_v32_index_row_bytes(Di);
    const int pow2 = c->ue8m0;
    const dsattn_actq *aq = m->use_actq ? &m->actq : NULL;
    const size_t maxk = DSATTN_MAX(dim, QL);
    dsattn_status st;
    const dsattn_ws_pos mark = dsattn_ws_mark(ws);
    float *kk = dsattn_ws_arrayz(ws, s * (Di + maxk) + 1, sizeof(float));
    if (!kk) return DSATTN_ERR_NOMEM;
    float *aqs = kk + s * Di;
    float cs[64], sn[64];

    /* queries */
    if ((st = dsattn_linear(ctx, &L->i_wq_b, qr, QL, s, qc, Hi * Di, DSATTN_OUT_BF16, aq, aqs)))
        goto done;
    /* keys */
    if ((st = dsattn_linear(ctx, &L->i_wk, x, dim, s, kk, Di, DSATTN_OUT_BF16, aq, aqs)))
        goto done;
    /* head weights: bf16 Linear, times Hi^-0.5 in bf16 */
    if ((st = dsattn_linear(ctx, &L->i_wproj, x, dim, s, wq, Hi, DSATTN_OUT_BF16, NULL, NULL)))
        goto done;
    {
        const float hs = (float)pow((double)Hi, -0.5), ds = (float)pow((double)Di, -0.5);
        for (size_t t = 0; t < s; t++) {
            const int64_t p = pos ? pos[t] : start_pos + (int64_t)t;
            dsattn_rope_cs(&m->rope, p, cs, sn);
            float *k = kk + t * Di;
            dsattn_layernorm(k, L->i_knorm_w, L->i_knorm_b, Di, c->eps, k, DSATTN_OUT_BF16);
            rope_hadamard(k, Di, dr, cs, sn, c->rope_il_index);
            uint8_t *row = krow ? krow[t] : kcache + (size_t)p * kb;
            float ks;
            dsattn_quant_fp8_f32scale(k, Di, Di, pow2, row, &ks, NULL);
            put_f32le(row + Di, ks);
            for (size_t h = 0; h < Hi; h++) {
                float *q = qc + (t * Hi + h) * Di;
                uint8_t codes[512];
                float qs;
                rope_hadamard(q, Di, dr, cs, sn, c->rope_il_index);
                dsattn_quant_fp8_f32scale(q, Di, Di, pow2, codes, &qs, NULL);
                for (size_t i = 0; i < Di; i++) q[i] = dsattn_e4m3_to_f32(codes[i]);
                float w = dsattn_round_bf16(wq[t * Hi + h] * hs);
                w = w * qs;
                wq[t * Hi + h] = w * ds;
            }
        }
    }
done:
    dsattn_ws_put(ws, kk);
    dsattn_ws_reset(ws, mark);
    return st;
}

/* ==== fp8_index ========================================================= */

static void scores_ref(const float *qc, const float *w, size_t Hi, size_t Di,
                       const uint8_t *kcache, size_t kb, size_t j0, size_t j1, float *score)
{
    for (size_t j = j0; j < j1; j++) {
        const uint8_t *row = kcache + j * kb;
        float kv[512];
        for (size_t i = 0; i < Di; i++) kv[i] = dsattn_e4m3_to_f32(row[i]);
        double sum = 0.0;
        for (size_t h = 0; h < Hi; h++) {
            const float *q = qc + h * Di;
            double a = 0.0;
            for (size_t i = 0; i < Di; i++) a += (double)q[i] * (double)kv[i];
            float d = (float)a;
            float r = d > 0.0f ? d : 0.0f;
            sum += (double)(r * w[h]);
        }
        score[j] = (float)sum * get_f32le(row + Di);
    }
}

#define IDX_BLOCK 128

static void scores_fast(const dsattn_mla_kern *mk, const float *qc, const float *w, size_t Hi,
                        size_t Di, const uint8_t *kcache, size_t kb, size_t j0, size_t j1,
                        float *score, const float *lut, float *kbuf, float *lg)
{
    for (size_t b0 = j0; b0 < j1; b0 += IDX_BLOCK) {
        size_t nb = DSATTN_MIN((size_t)IDX_BLOCK, j1 - b0);
        for (size_t j = 0; j < nb; j++) {
            const uint8_t *row = kcache + (b0 + j) * kb;
            for (size_t i = 0; i < Di; i++) kbuf[j * Di + i] = lut[row[i]];
        }
        /* lg[j, h] = k_j . q_h, on this thread only (with nt = 1 the region
         * around is inactive and OpenBLAS would fork a team inside it) */
        dsattn_sgemm_small(1, 1, nb, Hi, Di, kbuf, Di, qc, Di, 0.0f, lg, Hi);
        mk->relu_wsum(lg, Hi, nb, w, Hi, score + b0);
        for (size_t j = 0; j < nb; j++) score[b0 + j] *= get_f32le(kcache + (b0 + j) * kb + Di);
    }
}

/* The bf16-block form (amx_attn.h; contexts whose table has the bf16blk
 * slot: AMX-BF16 tiles, or VDPBF16PS): the
 * queries are E4M3 values (quantized above) and the keys E4M3 codes, bf16 numbers both,
 * so each logit k_j . q_h is a tile product of exact terms summed in fp32,
 * as the sgemm path sums them in another order; relu, weights and the key
 * scale as scores_fast.  Blocks of 256 keys over the threads; a NaN key
 * code sends the call back to the FMA path.  Returns 0 when it does not
 * apply (nothing written that the FMA path does not overwrite). */
static int scores_amx(dsattn_ctx *ctx, const float *qc, const float *w, size_t Hi, size_t Di,
                      const uint8_t *kcache, size_t kb, size_t n, float *score, dsattn_ws *ws)
{
    const size_t hp = (Hi + 31) / 32 * 32, MB = DSATTN_AMX_MB;
    const dsattn_mla_kern *mk = ctx->kt->mla;
    const dsattn_amx_kern *ak = ctx->kt->bf16blk;
    if (!ak || !mk || !ak->fits(hp, Di, Di) || Di % 32 || n < MB) return 0;
    const dsattn_ws_pos mark = dsattn_ws_mark(ws);
    const size_t nth = (size_t)DSATTN_MAX(ctx->n_threads, 1);
    /* qb, then per thread rows [MB, Di] bf16 and c [MB, hp] */
    const size_t per = (MB * Di * sizeof(uint16_t) + MB * hp * sizeof(float) + 63) / 64 * 64;
    uint8_t *all = dsattn_ws_array(ws, nth, per);
    uint16_t *qb = dsattn_ws_array(ws, hp * Di, sizeof(uint16_t));
    if (!qb || !all) {
        dsattn_ws_put(ws, qb);
        dsattn_ws_put(ws, all);
        dsattn_ws_reset(ws, mark);
        return 0;
    }
    int ok = ak->pack_q(qc, Di, Hi, hp, Di, qb);
    const size_t nblk = (n + MB - 1) / MB;
    const float one = 1.0f;
    DSATTN_PARALLEL(ok && nblk > 1 ? (int)nth : 1, {
        const int tid = dsattn_tid;
        uint16_t *rows = (uint16_t *)(void *)(all + (size_t)tid * per);
        float *c = (float *)(void *)(all + (size_t)tid * per + MB * Di * sizeof(uint16_t));
        int mine = ok;
        const int tiles = mine;          /* ok may change under other threads */
        if (tiles) ak->begin();
        size_t blo_, bhi_;
        dsattn_range(nblk, dsattn_tid, dsattn_nth, &blo_, &bhi_);
        for (size_t b = blo_; b < bhi_; b++) {
            if (!mine) continue;
            const size_t j0 = b * MB, nb = DSATTN_MIN(MB, n - j0), n32 = (nb + 31) / 32;
            for (size_t j = 0; j < nb && mine; j++)
                mine = ak->fp8_row_bf16(kcache + (j0 + j) * kb, &one, Di, Di, rows + j * Di);
            if (!mine) continue;
            memset(rows + nb * Di, 0, (32 * n32 - nb) * Di * sizeof(uint16_t));
            ak->gemm_nt(qb, hp, Di, rows, n32, c, NULL, 0);
            mk->relu_wsum(c, hp, nb, w, Hi, score + j0);
            for (size_t j = 0; j < nb; j++) score[j0 + j] *= get_f32le(kcache + (j0 + j) * kb + Di);
        }
        if (tiles) ak->end();
        if (!mine) {
        _Pragma("omp atomic write")
            ok = 0;
        }
    });
    dsattn_ws_put(ws, qb);
    dsattn_ws_put(ws, all);
    dsattn_ws_reset(ws, mark);
    return ok;
}

size_t dsattn_mla_index_scores_ws(size_t Hi, size_t Di, int n_threads)
{
    const size_t nth = (size_t)DSATTN_MAX(n_threads, 1), MB = DSATTN_AMX_MB;
    const size_t hp = (Hi + 31) / 32 * 32;
    size_t amx = 0, fma = 0;
    dsattn_ws_need(&amx, nth, (MB * Di * sizeof(uint16_t) + MB * hp * sizeof(float) + 63) / 64 * 64);
    dsattn_ws_need(&amx, hp * Di, sizeof(uint16_t));
    dsattn_ws_need(&fma, nth * (IDX_BLOCK * Di + IDX_BLOCK * Hi), sizeof(float));
    return DSATTN_MAX(amx, fma);
}

void dsattn_mla_index_scores(dsattn_ctx *ctx, const float *qc, const float *w,
                             size_t Hi, size_t Di, const uint8_t *kcache,
                             size_t n, float *score, dsattn_ws *ws)
{
    const size_t kb = dsattn_v32_index_row_bytes(Di);
    if (ctx->mode == DSATTN_MODE_FAST && Di <= 512 &&
        scores_amx(ctx, qc, w, Hi, Di, kcache, kb, n, score, ws)) {
        dsattn_count(ctx, 2ull * n * Hi * Di + 3ull * n * Hi, (uint64_t)n * kb + Hi * Di * 4ull);
        return;
    }
    if (ctx->mode == DSATTN_MODE_REFERENCE || Di > 512) {
        scores_ref(qc, w, Hi, Di, kcache, kb, 0, n, score);
    } else {
        float lut[256];
        for (int i = 0; i < 256; i++) lut[i] = dsattn_e4m3_to_f32((uint8_t)i);
        /* the head sum: the context's SIMD form, or the scalar one */
        const dsattn_mla_kern *mk = ctx->kt->mla;
        if (!mk) mk = &dsattn_mla_kern_ref;
        const size_t nblk = (n + IDX_BLOCK - 1) / IDX_BLOCK;
        int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
        if (nblk < 4) nt = 1;
        const dsattn_ws_pos mark = dsattn_ws_mark(ws);
        const size_t per = IDX_BLOCK * Di + IDX_BLOCK * Hi;
        float *all = dsattn_ws_array(ws, (size_t)nt * per, sizeof(float));
        DSATTN_PARALLEL(nt, {
            const int tid = dsattn_tid;
            float *kbuf = all ? all + (size_t)tid * per : NULL;
            size_t blo_, bhi_;
            dsattn_range(nblk, dsattn_tid, dsattn_nth, &blo_, &bhi_);
            for (size_t b = blo_; b < bhi_; b++) {
                size_t j0 = b * IDX_BLOCK, j1 = DSATTN_MIN(n, j0 + IDX_BLOCK);
                if (kbuf) scores_fast(mk, qc, w, Hi, Di, kcache, kb, j0, j1, score, lut, kbuf,
                                      kbuf + IDX_BLOCK * Di);
                else scores_ref(qc, w, Hi, Di, kcache, kb, j0, j1, score);
            }
        });
        dsattn_ws_put(ws, all);
        dsattn_ws_reset(ws, mark);
    }
    dsattn_count(ctx, 2ull * n * Hi * Di + 3ull * n * Hi, (uint64_t)n * kb + Hi * Di * 4ull);
}
