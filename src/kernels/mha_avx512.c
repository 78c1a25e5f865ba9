/* mha_avx512.c - the AVX-512 fast attention kernel of MHA / GQA decode
 * (mha_kernels.h): one query token, the G query heads of one KV head.
 *
 * Why this shape.  GQA (67B: 8 query heads per KV head, d = 128) needs 8
 * FMAs per bf16 cache element, so at DRAM speed the step is close to
 * compute bound; what it cannot afford is a horizontal sum per (key, head)
 * or a bf16 -> fp32 decode per head.  So:
 *  - scores: K is key-tiled ([d][32 keys] per tile, mha.h), so one 64-byte
 *    line is one dim of 32 keys.  It is decoded once (shift / mask: even
 *    keys, odd keys) and feeds 2 FMAs for each head of the group; scores of
 *    32 keys come out in two registers per head, no reductions.
 *  - P.V: V is tiled by 64 keys and 32-dim blocks ([w][32] per block), so
 *    one line is 32 dims of one key; decoded once, 2 FMAs per head with p
 *    broadcast; accumulators stay in registers over a tile, dims are done
 *    in register-sized blocks, each block a contiguous 4 KB run (a
 *    row-major V read that way strides 256 B: the V pass ran ~20% slower).
 *  - softmax: the scores (bf16 values after the two roundings) are kept as
 *    bf16 bits, 2 B per key and head, written with streaming stores (no
 *    read-for-ownership, no eviction of the K / V stream: ~9% of a GQA
 *    step at 256K); the running max and sum of exp are
 *    kept per head during the K pass (sum rescaled when the max grows), so
 *    the V pass computes p_j = bf16(exp(s_j - max) / sum) per chunk from
 *    the global max and sum: the roundings of the contract are all there,
 *    only the order of the fp32 sums differs from the plain C path.
 *  - software prefetch of the tile / rows a few KB ahead, hint T1 (into L2:
 *    on the Xeon the same as T0, on AMD Zen 4 1.04-1.2x faster at 64K keys;
 *    docs/mha.md).
 * Each head's arithmetic is the same whatever G is (heads are only ever
 * batched, never mixed), which the GQA == MHA test checks bit for bit.
 * Not here: threading (the caller gives each thread whole KV heads).
 */
#include "mha_kernels.h"

#include "internal.h"

#include <math.h>
#include <string.h>

#define KT  DSATTN_MHA_KTILE   /* keys per K tile (one 64-byte line per dim) */
#define PVC DSATTN_MHA_VTILE   /* keys per P.V chunk: one V tile             */
#define PFK 2                  /* K prefetch distance, tiles (8 KB each)     */
#define PFV 1                  /* V prefetch distance, tiles (16 KB each)    */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#include <immintrin.h>

#include "simd_avx512.h"
#include "mha_tmpl.h"

#define UNROLL _Pragma("GCC unroll 8")
#define INLINE static inline __attribute__((always_inline))


/* fp32 -> nearest bf16 value (RNE): dsattn_round_bf16 per lane for every
 * value these kernels round.  Without its NaN branch: a NaN here is an FMA,
 * multiply or exp result of bf16-valued operands, so it is quiet with its
 * low 16 bits zero, and adding 0x7fff + 0 leaves it bit for bit what the
 * scalar rounding returns (no carry out of the low half). */
INLINE __m512 round_bf16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* ==== K pass: one tile, NH heads ======================================== */

/* kt: the tile ([d][w] bf16), nk <= w keys of it visible; MASKED: the tile
 * is partial (w or nk < 32).  Scores (natural key order, bf16 bits) go to
 * sc[h * ldsc + 0..nk); the running max / sum-of-exp of each head are
 * updated.  pf: a later tile to prefetch (full tiles only) or NULL. */
INLINE void score_tile(const float *q, size_t d, const uint16_t *kt, size_t w, size_t nk,
                       const uint16_t *pf, float inv, uint16_t *sc, size_t ldsc,
                       float *mrun, __m512 *lrun, const int NH, const int MASKED)
{
    __m512 ae[8], ao[8];
    UNROLL for (int h = 0; h < NH; h++) ae[h] = ao[h] = _mm512_setzero_ps();
    const __m512i him = _mm512_set1_epi32((int)0xffff0000u);
    const __mmask32 km = (__mmask32)((1ull << nk) - 1);
    for (size_t i = 0; i < d; i++) {
        __m512i x;
        if (MASKED) {
            x = _mm512_maskz_loadu_epi16(km, kt + i * w);
        } else {
            x = _mm512_loadu_si512(kt + i * KT);
            if (pf) _mm_prefetch((const char *)(pf + i * KT), _MM_HINT_T1);
        }
        /* lane e of ve = key 2e, of vo = key 2e+1 (bf16 -> fp32 is exact) */
        const __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        const __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(x, him));
        UNROLL for (int h = 0; h < NH; h++) {
            const __m512 qb = _mm512_set1_ps(q[(size_t)h * d + i]);
            ae[h] = _mm512_fmadd_ps(ve, qb, ae[h]);
            ao[h] = _mm512_fmadd_ps(vo, qb, ao[h]);
        }
    }
    /* word 2e+1 (the bf16 bits) of lane e: even keys from se, odd from so */
    const __m512i pidx = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19,
                                          49, 17, 47, 15, 45, 13, 43, 11, 41, 9, 39, 7, 37, 5,
                                          35, 3, 33, 1);
    const __mmask16 me = (__mmask16)((1u << ((nk + 1) / 2)) - 1), mo = (__mmask16)((1u << (nk / 2)) - 1);
    const __m512 vinv = _mm512_set1_ps(inv), ninf = _mm512_set1_ps(-INFINITY);
    UNROLL for (int h = 0; h < NH; h++) {
        const __m512 se = round_bf16(_mm512_mul_ps(round_bf16(ae[h]), vinv));
        const __m512 so = round_bf16(_mm512_mul_ps(round_bf16(ao[h]), vinv));
        const __m512i pk = _mm512_permutex2var_epi16(_mm512_castps_si512(se), pidx,
                                                     _mm512_castps_si512(so));
        __m512 mx;
        if (MASKED) {
            _mm512_mask_storeu_epi16(sc + (size_t)h * ldsc, km, pk);
            mx = _mm512_max_ps(_mm512_mask_mov_ps(ninf, me, se), _mm512_mask_mov_ps(ninf, mo, so));
        } else {
            _mm512_stream_si512((void *)(sc + (size_t)h * ldsc), pk);
            mx = _mm512_max_ps(se, so);
        }
        const float tmax = _mm512_reduce_max_ps(mx);
        if (tmax > mrun[h]) {   /* the max grew: rescale the sum so far */
            lrun[h] = _mm512_mul_ps(lrun[h], _mm512_set1_ps(expf(mrun[h] - tmax)));
            mrun[h] = tmax;
        }
        const __m512 mb = _mm512_set1_ps(mrun[h]);
        __m512 e = dsattn_exp512_ftz(_mm512_sub_ps(se, mb)), f = dsattn_exp512_ftz(_mm512_sub_ps(so, mb));
        if (MASKED) {
            e = _mm512_maskz_mov_ps(me, e);
            f = _mm512_maskz_mov_ps(mo, f);
        }
        lrun[h] = _mm512_add_ps(lrun[h], _mm512_add_ps(e, f));
    }
}

#define SCORE_FN(NH, MS)                                                          \
    static void score_##NH##_##MS(const float *q, size_t d, const uint16_t *kt,   \
                                  size_t w, size_t nk, const uint16_t *pf,        \
                                  float inv, uint16_t *sc, size_t ldsc,           \
                                  float *mrun, __m512 *lrun)                      \
    {                                                                             \
        score_tile(q, d, kt, w, nk, pf, inv, sc, ldsc, mrun, lrun, NH, MS);       \
    }
SCORE_FN(8, 0) SCORE_FN(4, 0) SCORE_FN(2, 0) SCORE_FN(1, 0)
SCORE_FN(8, 1) SCORE_FN(4, 1) SCORE_FN(2, 1) SCORE_FN(1, 1)

typedef void (*score_fn)(const float *, size_t, const uint16_t *, size_t, size_t,
                         const uint16_t *, float, uint16_t *, size_t, float *, __m512 *);
static const score_fn score_tab[2][4] = {
    { score_1_0, score_2_0, score_4_0, score_8_0 },
    { score_1_1, score_2_1, score_4_1, score_8_1 },
};

/* heads in this batch: 8, 4, 2 or 1, and its index in score_tab */
static size_t batch(size_t left, int *ix)
{
    if (left >= 8) { *ix = 3; return 8; }
    if (left >= 4) { *ix = 2; return 4; }
    if (left >= 2) { *ix = 1; return 2; }
    *ix = 0;
    return 1;
}

/* ==== V pass ============================================================ */

/* p[h][0..nk) of a chunk from its bf16 scores: bf16(exp(s - M_h) / L_h).
 * Keys past nk are not read (masked loads) and get p = 0.  The quotient is
 * q0 = e * (1/L) refined by one Newton step on the FMA residual (e - q0 L),
 * which is the IEEE quotient but in rare near-tie cases (a vdivps would
 * cost ~10 cycles per 16 probabilities; this is 3 FMA-port uops). */
static void chunk_probs(const uint16_t *sc, size_t ldsc, size_t c0, size_t nk, size_t G,
                        const float *M, const float *L, float *pb)
{
    for (size_t h = 0; h < G; h++) {
        const __m512 mb = _mm512_set1_ps(M[h]), lb = _mm512_set1_ps(L[h]);
        const __m512 rb = _mm512_set1_ps(1.0f / L[h]);
        for (size_t k = 0; k < PVC; k += 16) {
            const size_t r = nk > k ? DSATTN_MIN(nk - k, (size_t)16) : 0;
            const __mmask16 m = (__mmask16)((1u << r) - 1);
            const __m256i x = _mm256_maskz_loadu_epi16(m, sc + h * ldsc + c0 + k);
            const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
            const __m512 e = dsattn_exp512_ftz(_mm512_sub_ps(s, mb));
            const __m512 q0 = _mm512_mul_ps(e, rb);
            const __m512 q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(q0, lb, e), rb, q0);
            _mm512_storeu_ps(pb + h * PVC + k, _mm512_maskz_mov_ps(m, round_bf16(q1)));
        }
    }
}

/* acc (permuted: per 32-dim block, 16 even dims then 16 odd dims) of NH
 * heads, dim blocks b .. b+NQ-1, += sum_j<nk p[h][j] * V[j][block].
 * vt: the V tile (w keys), bs[k]: block k's width (32, the tail, or 0 past
 * d).  MASKED: some block is partial or past d (bm: each block's dim mask).
 * pf: a later full tile to prefetch (same blocks) or NULL. */
INLINE void pv_chunk(const float *pb, const uint16_t *vt, size_t w, size_t nk, float *acc,
                     size_t b, const size_t *bs, const __mmask32 *bm, const uint16_t *pf,
                     const int NH, const int NQ, const int MASKED)
{
    __m512 ae[8], ao[8];
    const uint16_t *base[4];
    size_t st[4];
    UNROLL for (int u = 0; u < NQ; u++) {
        base[u] = vt + (b + u) * 32 * w;
        st[u] = MASKED ? bs[b + u] : 32;
    }
    mha_pv_load(ae, ao, acc, b, NH, NQ);
    const __m512i him = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t j = 0; j < nk; j++) {
        __m512 ve[4], vo[4];
        UNROLL for (int u = 0; u < NQ; u++) {
            __m512i x;
            if (MASKED) x = _mm512_maskz_loadu_epi16(bm[b + u], base[u] + j * st[u]);
            else x = _mm512_loadu_si512(base[u] + j * 32);
            if (pf) _mm_prefetch((const char *)(pf + (b + u) * 32 * PVC + j * 32), _MM_HINT_T1);
            ve[u] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            vo[u] = _mm512_castsi512_ps(_mm512_and_si512(x, him));
        }
        mha_pv_key(ae, ao, ve, vo, pb + j, NH, NQ);
    }
    mha_pv_store(ae, ao, acc, b, NH, NQ);
}

/* NQ: dim blocks per call, so NH * NQ <= 8 register pairs (NH 1 keeps 4). */
#define PV_FN(NH, NQ, MS)                                                            \
    static void pv_##NH##_##MS(const float *pb, const uint16_t *vt, size_t w,        \
                               size_t nk, float *acc, size_t b, const size_t *bs,    \
                               const __mmask32 *bm, const uint16_t *pf)              \
    {                                                                                \
        pv_chunk(pb, vt, w, nk, acc, b, bs, bm, pf, NH, NQ, MS);                     \
    }
PV_FN(8, 1, 0) PV_FN(4, 2, 0) PV_FN(2, 4, 0) PV_FN(1, 4, 0)
PV_FN(8, 1, 1) PV_FN(4, 2, 1) PV_FN(2, 4, 1) PV_FN(1, 4, 1)

typedef void (*pv_fn)(const float *, const uint16_t *, size_t, size_t, float *, size_t,
                      const size_t *, const __mmask32 *, const uint16_t *);
static const pv_fn pv_tab[2][4] = {
    { pv_1_0, pv_2_0, pv_4_0, pv_8_0 },
    { pv_1_1, pv_2_1, pv_4_1, pv_8_1 },
};
static const int pv_nq[4] = { 4, 4, 2, 1 };

/* ==== The kernel ======================================================== */

static void attend_avx512(const float *q, size_t G, size_t d, const uint16_t *K,
                          const uint16_t *V, size_t cap, size_t T, float inv, void *ws,
                          float *o)
{
    const size_t tp = (T + KT - 1) / KT * KT;
    float *pb, *acc;
    uint16_t *sc = mha_ws_split(ws, G, tp, &pb, &acc);
    float M[64], L[64];
    __m512 lrun[64];
    for (size_t h = 0; h < G; h++) {
        M[h] = -INFINITY;
        lrun[h] = _mm512_setzero_ps();
    }

    /* ---- K pass: scores, running max and sum */
    for (size_t b0 = 0; b0 < T; b0 += KT) {
        const size_t w = DSATTN_MIN((size_t)KT, cap - b0), nk = DSATTN_MIN(w, T - b0);
        const uint16_t *kt = K + b0 * d;
        const int part = nk < KT;
        const uint16_t *pf = b0 + (PFK + 1) * KT <= T ? kt + PFK * KT * d : NULL;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            size_t nh = batch(G - h0, &ix);
            score_tab[part][ix](q + h0 * d, d, kt, w, nk, h0 ? NULL : pf, inv, sc + h0 * tp + b0,
                                tp, M + h0, lrun + h0);
            h0 += nh;
        }
    }
    for (size_t h = 0; h < G; h++) L[h] = _mm512_reduce_add_ps(lrun[h]);
    _mm_sfence();   /* the streamed scores are ordered before the V pass reads them */

    /* ---- V pass: per chunk, probabilities then P.V */
    const size_t nb = (d + 31) / 32;
    __mmask32 bm[4];
    size_t bs[4];
    for (size_t k = 0; k < 4; k++) {
        bs[k] = d > 32 * k ? DSATTN_MIN(d - 32 * k, (size_t)32) : 0;
        bm[k] = (__mmask32)((1ull << bs[k]) - 1);
    }
    memset(acc, 0, G * 128 * sizeof(float));
    for (size_t c0 = 0; c0 < T; c0 += PVC) {
        const size_t w = DSATTN_MIN((size_t)PVC, cap - c0), nk = DSATTN_MIN(w, T - c0);
        chunk_probs(sc, tp, c0, nk, G, M, L, pb);
        const uint16_t *vt = V + c0 * d;
        const uint16_t *pf = c0 + (PFV + 1) * PVC <= T ? vt + PFV * PVC * d : NULL;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            size_t nh = batch(G - h0, &ix);
            const size_t nq = (size_t)pv_nq[ix];
            for (size_t b = 0; b < nb; b += nq) {
                const int masked = 32 * (b + nq) > d;
                pv_tab[masked][ix](pb + h0 * PVC, vt, w, nk, acc + h0 * 128, b, bs, bm,
                                   h0 ? NULL : pf);
            }
            h0 += nh;
        }
    }

    /* ---- out: undo the even / odd dim order, round to bf16 */
    mha_out(acc, G, d, o);
}

static const dsattn_mha_kern mha_avx512 = { "avx512", attend_avx512, mha_ws_bytes };
const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = &mha_avx512;

#else  /* no AVX-512 compiler support: no such path */

const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = 0;

#endif
