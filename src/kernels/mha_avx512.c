/* mha_avx512.c - the AVX-512 fast attention kernels of MHA / GQA decode
 * (mha_kernels.h): one query token, the G query heads of one KV head; in
 * two forms, "avx512" on FMAs and "avx512-bf16" on VDPBF16PS (at the end:
 * the timed probe that picks between them), written once as templates.
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
 *  - the VDPBF16PS form (PAIRS): q . k and p . v are sums of products of
 *    two bf16 numbers (the contract's q and p are bf16 values), each exact
 *    in fp32, and VDPBF16PS adds two of them to a lane per instruction.
 *    Two tile rows (two dims of 32 keys; two keys of 32 dims) are paired
 *    word by word by vpunpcklwd / vpunpckhwd, so one instruction does the
 *    work of two FMAs: 1.3-1.4x the FMA kernel's speed at G = 8 on a Zen 5
 *    core (docs/mha.md).  Only the fp32 summation order differs, and
 *    VDPBF16PS reads and writes subnormals as zero.
 * Each head's arithmetic is the same whatever G is (heads are only ever
 * batched, never mixed), which the GQA == MHA test checks bit for bit.
 * Not here: threading (the caller gives each thread whole KV heads).
 */
#include "mha_kernels.h"

#include "internal.h"

#include <math.h>
#include <string.h>
#include <time.h>

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

/* acc += the bf16 pair products of a and b, lane by lane (VDPBF16PS).  In
 * asm so that the templates below, shared by both kernels of this file,
 * carry no target attribute (a bf16 intrinsic would need one all the way
 * up); only the bf16-pair kernel reaches it, and the table offers that
 * kernel only on CPUs with AVX512-BF16 (dispatch.c). */
INLINE __m512 dpbf16(__m512 acc, __m512i a, __m512i b)
{
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* The lanes of a pair kernel's registers: vpunpcklwd / vpunpckhwd of two
 * rows of 32 keys (or dims) pair word k of each, 128-bit lane by lane, so
 * lane e of the "lo" register holds key 8 (e / 4) + e % 4 and of the "hi"
 * register key 8 (e / 4) + 4 + e % 4.  pair_mask: the lanes of lo (off 0)
 * or hi (off 4) whose key is below nk. */
static __mmask16 pair_mask(size_t nk, unsigned off)
{
    unsigned m = 0;
    for (unsigned e = 0; e < 16; e++)
        if (8 * (e / 4) + off + e % 4 < nk) m |= 1u << e;
    return (__mmask16)m;
}

/* ==== K pass: one tile, NH heads ======================================== */

/* kt: the tile ([d][w] bf16), nk <= w keys of it visible; MASKED: the tile
 * is partial (w or nk < 32).  Scores (natural key order, bf16 bits) go to
 * sc[h * ldsc + 0..nk); the running max / sum-of-exp of each head are
 * updated.  pf: a later tile to prefetch (full tiles only) or NULL.
 * PAIRS 0: qv is q [NH][d] (fp32 holding bf16 values), one FMA per key, dim
 * and head; PAIRS 1: qv is q2 [NH][64], each head's dims as bf16 pairs
 * (word 2i + 1 dim 2i + 1 above dim 2i), one VDPBF16PS per 2 dims of 16
 * keys and head, the two tile rows of those dims interleaved by unpacks. */
INLINE void score_tile(const void *qv, size_t d, const uint16_t *kt, size_t w, size_t nk,
                       const uint16_t *pf, float inv, uint16_t *sc, size_t ldsc,
                       float *mrun, __m512 *lrun, const int NH, const int MASKED,
                       const int PAIRS)
{
    __m512 ae[8], ao[8];   /* PAIRS: the "lo" and "hi" lanes (pair_mask) */
    UNROLL for (int h = 0; h < NH; h++) ae[h] = ao[h] = _mm512_setzero_ps();
    const __m512i him = _mm512_set1_epi32((int)0xffff0000u);
    const __mmask32 km = (__mmask32)((1ull << nk) - 1);
    const size_t ld = MASKED ? w : KT;
    if (PAIRS) {
        const uint32_t *q2 = (const uint32_t *)qv;
        for (size_t i = 0; i < d; i += 2) {
            __m512i x0, x1;
            if (MASKED) {
                x0 = _mm512_maskz_loadu_epi16(km, kt + i * ld);
                x1 = _mm512_maskz_loadu_epi16(km, kt + (i + 1) * ld);
            } else {
                x0 = _mm512_loadu_si512(kt + i * KT);
                x1 = _mm512_loadu_si512(kt + (i + 1) * KT);
                if (pf) {
                    _mm_prefetch((const char *)(pf + i * KT), _MM_HINT_T1);
                    _mm_prefetch((const char *)(pf + (i + 1) * KT), _MM_HINT_T1);
                }
            }
            const __m512i lo = _mm512_unpacklo_epi16(x0, x1), hi = _mm512_unpackhi_epi16(x0, x1);
            UNROLL for (int h = 0; h < NH; h++) {
                const __m512i qb = _mm512_set1_epi32((int)q2[(size_t)h * 64 + i / 2]);
                ae[h] = dpbf16(ae[h], lo, qb);
                ao[h] = dpbf16(ao[h], hi, qb);
            }
        }
    } else {
        const float *q = (const float *)qv;
        for (size_t i = 0; i < d; i++) {
            __m512i x;
            if (MASKED) {
                x = _mm512_maskz_loadu_epi16(km, kt + i * ld);
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
    }
    /* word k of the packed scores: the bf16 bits (word 2e + 1 of lane e)
     * of key k, from se (index < 32) or so (index >= 32) */
    static const uint16_t pidx_eo[32] = {
        1, 33, 3, 35, 5, 37, 7, 39, 9, 41, 11, 43, 13, 45, 15, 47,
        17, 49, 19, 51, 21, 53, 23, 55, 25, 57, 27, 59, 29, 61, 31, 63 };
    static const uint16_t pidx_pr[32] = {
        1, 3, 5, 7, 33, 35, 37, 39, 9, 11, 13, 15, 41, 43, 45, 47,
        17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63 };
    const __m512i pidx = _mm512_loadu_si512(PAIRS ? pidx_pr : pidx_eo);
    __mmask16 me = 0xffff, mo = 0xffff;
    if (MASKED) {
        me = PAIRS ? pair_mask(nk, 0) : (__mmask16)((1u << ((nk + 1) / 2)) - 1);
        mo = PAIRS ? pair_mask(nk, 4) : (__mmask16)((1u << (nk / 2)) - 1);
    }
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

#define SCORE_FN(NH, MS, PR)                                                          \
    static void score_##NH##_##MS##_##PR(const void *q, size_t d, const uint16_t *kt, \
                                         size_t w, size_t nk, const uint16_t *pf,     \
                                         float inv, uint16_t *sc, size_t ldsc,        \
                                         float *mrun, __m512 *lrun)                   \
    {                                                                                 \
        score_tile(q, d, kt, w, nk, pf, inv, sc, ldsc, mrun, lrun, NH, MS, PR);       \
    }
SCORE_FN(8, 0, 0) SCORE_FN(4, 0, 0) SCORE_FN(2, 0, 0) SCORE_FN(1, 0, 0)
SCORE_FN(8, 1, 0) SCORE_FN(4, 1, 0) SCORE_FN(2, 1, 0) SCORE_FN(1, 1, 0)
SCORE_FN(8, 0, 1) SCORE_FN(4, 0, 1) SCORE_FN(2, 0, 1) SCORE_FN(1, 0, 1)
SCORE_FN(8, 1, 1) SCORE_FN(4, 1, 1) SCORE_FN(2, 1, 1) SCORE_FN(1, 1, 1)

typedef void (*score_fn)(const void *, size_t, const uint16_t *, size_t, size_t,
                         const uint16_t *, float, uint16_t *, size_t, float *, __m512 *);
/* [PAIRS][MASKED][batch index] */
static const score_fn score_tab[2][2][4] = {
    { { score_1_0_0, score_2_0_0, score_4_0_0, score_8_0_0 },
      { score_1_1_0, score_2_1_0, score_4_1_0, score_8_1_0 } },
    { { score_1_0_1, score_2_0_1, score_4_0_1, score_8_0_1 },
      { score_1_1_1, score_2_1_1, score_4_1_1, score_8_1_1 } },
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
 * cost ~10 cycles per 16 probabilities; this is 3 FMA-port uops).
 * PAIRS 0: pbv is float [G][PVC]; 1: uint16_t [G][PVC], the bf16 bits (so
 * keys 2m and 2m + 1 form one bf16 pair). */
INLINE void chunk_probs(const uint16_t *sc, size_t ldsc, size_t c0, size_t nk, size_t G,
                        const float *M, const float *L, void *pbv, const int PAIRS)
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
            const __m512 p = _mm512_maskz_mov_ps(m, round_bf16(q1));
            if (PAIRS)
                _mm256_storeu_si256((__m256i *)((uint16_t *)pbv + h * PVC + k),
                                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(p), 16)));
            else
                _mm512_storeu_ps((float *)pbv + h * PVC + k, p);
        }
    }
}

/* Keys j and j + 1 (TWO; else j alone, the pair's other half zero) into
 * the pair accumulators: the two V rows of each block interleaved by
 * unpacks (lanes as pair_mask says, dims for keys), one VDPBF16PS per
 * block half and head with the heads' bf16 pair (p_j, p_j+1) broadcast. */
INLINE void pv_pair(__m512 *ae, __m512 *ao, const uint16_t *pw, const uint16_t *const *base,
                    const size_t *st, const __mmask32 *bm, size_t b, size_t j,
                    const uint16_t *pf, const int NH, const int NQ, const int MASKED,
                    const int TWO)
{
    __m512i lo[4], hi[4];
    UNROLL for (int u = 0; u < NQ; u++) {
        __m512i x0, x1 = _mm512_setzero_si512();
        if (MASKED) {
            x0 = _mm512_maskz_loadu_epi16(bm[b + u], base[u] + j * st[u]);
            if (TWO) x1 = _mm512_maskz_loadu_epi16(bm[b + u], base[u] + (j + 1) * st[u]);
        } else {
            x0 = _mm512_loadu_si512(base[u] + j * 32);
            if (TWO) x1 = _mm512_loadu_si512(base[u] + (j + 1) * 32);
        }
        if (pf) {
            _mm_prefetch((const char *)(pf + (b + u) * 32 * PVC + j * 32), _MM_HINT_T1);
            if (TWO) _mm_prefetch((const char *)(pf + (b + u) * 32 * PVC + (j + 1) * 32), _MM_HINT_T1);
        }
        lo[u] = _mm512_unpacklo_epi16(x0, x1);
        hi[u] = _mm512_unpackhi_epi16(x0, x1);
    }
    UNROLL for (int h = 0; h < NH; h++) {
        uint32_t pair;
        memcpy(&pair, pw + (size_t)h * PVC + j, sizeof pair);
        const __m512i pb = _mm512_set1_epi32((int)pair);
        UNROLL for (int u = 0; u < NQ; u++) {
            ae[h * NQ + u] = dpbf16(ae[h * NQ + u], lo[u], pb);
            ao[h * NQ + u] = dpbf16(ao[h * NQ + u], hi[u], pb);
        }
    }
}

/* acc of NH heads, dim blocks b .. b+NQ-1, += sum_j<nk p[h][j] * V[j][block]
 * (permuted per 32-dim block as mha_out reads it: PAIRS 0 16 even dims
 * then 16 odd dims; 1 the unpack order).  pv: the chunk's p, as
 * chunk_probs wrote it.  vt: the V tile (w keys), bs[k]: block k's width
 * (32, the tail, or 0 past d).  MASKED: some block is partial or past d
 * (bm: each block's dim mask).  pf: a later full tile to prefetch (same
 * blocks) or NULL. */
INLINE void pv_chunk(const void *pv, const uint16_t *vt, size_t w, size_t nk, float *acc,
                     size_t b, const size_t *bs, const __mmask32 *bm, const uint16_t *pf,
                     const int NH, const int NQ, const int MASKED, const int PAIRS)
{
    __m512 ae[8], ao[8];
    const uint16_t *base[4];
    size_t st[4];
    UNROLL for (int u = 0; u < NQ; u++) {
        base[u] = vt + (b + u) * 32 * w;
        st[u] = MASKED ? bs[b + u] : 32;
    }
    mha_pv_load(ae, ao, acc, b, NH, NQ);
    if (PAIRS) {
        const uint16_t *pw = (const uint16_t *)pv;
        size_t j = 0;
        for (; j + 1 < nk; j += 2) pv_pair(ae, ao, pw, base, st, bm, b, j, pf, NH, NQ, MASKED, 1);
        if (j < nk) pv_pair(ae, ao, pw, base, st, bm, b, j, pf, NH, NQ, MASKED, 0);
    } else {
        const float *pb = (const float *)pv;
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
    }
    mha_pv_store(ae, ao, acc, b, NH, NQ);
}

/* NQ: dim blocks per call, so NH * NQ <= 8 register pairs (NH 1 keeps 4). */
#define PV_FN(NH, NQ, MS, PR)                                                            \
    static void pv_##NH##_##MS##_##PR(const void *pv, const uint16_t *vt, size_t w,      \
                                      size_t nk, float *acc, size_t b, const size_t *bs, \
                                      const __mmask32 *bm, const uint16_t *pf)           \
    {                                                                                    \
        pv_chunk(pv, vt, w, nk, acc, b, bs, bm, pf, NH, NQ, MS, PR);                     \
    }
PV_FN(8, 1, 0, 0) PV_FN(4, 2, 0, 0) PV_FN(2, 4, 0, 0) PV_FN(1, 4, 0, 0)
PV_FN(8, 1, 1, 0) PV_FN(4, 2, 1, 0) PV_FN(2, 4, 1, 0) PV_FN(1, 4, 1, 0)
PV_FN(8, 1, 0, 1) PV_FN(4, 2, 0, 1) PV_FN(2, 4, 0, 1) PV_FN(1, 4, 0, 1)
PV_FN(8, 1, 1, 1) PV_FN(4, 2, 1, 1) PV_FN(2, 4, 1, 1) PV_FN(1, 4, 1, 1)

typedef void (*pv_fn)(const void *, const uint16_t *, size_t, size_t, float *, size_t,
                      const size_t *, const __mmask32 *, const uint16_t *);
/* [PAIRS][MASKED][batch index] */
static const pv_fn pv_tab[2][2][4] = {
    { { pv_1_0_0, pv_2_0_0, pv_4_0_0, pv_8_0_0 }, { pv_1_1_0, pv_2_1_0, pv_4_1_0, pv_8_1_0 } },
    { { pv_1_0_1, pv_2_0_1, pv_4_0_1, pv_8_0_1 }, { pv_1_1_1, pv_2_1_1, pv_4_1_1, pv_8_1_1 } },
};
static const int pv_nq[4] = { 4, 4, 2, 1 };

/* ==== Which form: VDPBF16PS against the FMA, timed once ================= */

/* ns for 12 chains x 1024 of VDPBF16PS (BF) or of vfmadd231ps, 512-bit */
__attribute__((noinline)) static double dot_probe(const int BF)
{
    __m512 acc[12];
    const __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x2f802f80);
    for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_ps();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int it = 0; it < 1024; it++) {
        for (int i = 0; i < 12; i++)
            acc[i] = BF ? dpbf16(acc[i], a, b)
                        : _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc[i]);
        __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]),
                              "+v"(acc[4]), "+v"(acc[5]), "+v"(acc[6]), "+v"(acc[7]),
                              "+v"(acc[8]), "+v"(acc[9]), "+v"(acc[10]), "+v"(acc[11]));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float sink[16];
    _mm512_storeu_ps(sink, _mm512_add_ps(acc[0], acc[11]));
    __asm__ volatile("" : : "r"(sink) : "memory");
    return (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
}

/* Does VDPBF16PS issue at two thirds of the FMA's rate or better (so the
 * pair kernel does at least 4/3 of the FMA kernel's multiply-adds per
 * cycle)?  Measured: AMD Zen 5 0.93 of the FMA rate (two multiply-adds
 * per lane each), the Xeon VM of docs/benchmarks.md 0.2-0.25.  Min of 5
 * alternating runs, a few microseconds in all, once per process; the
 * caller knows the CPU has AVX512-BF16. */
int dsattn_avx512_bf16dot_full_rate(void)
{
    static int known = -1;   /* immutable once measured */
    int r = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (r >= 0) return r;
    double tf = 1e30, tb = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const double a = dot_probe(0), b = dot_probe(1);
        if (a < tf) tf = a;
        if (b < tb) tb = b;
    }
    r = tb <= 1.5 * tf;
    __atomic_store_n(&known, r, __ATOMIC_RELAXED);
    return r;
}

/* ==== The kernels ======================================================= */

/* PAIRS: the VDPBF16PS form (q packed into bf16 pairs first) */
INLINE void attend(const float *q, size_t G, size_t d, const uint16_t *K, const uint16_t *V,
                   size_t cap, size_t T, float inv, void *ws, float *o, const int PAIRS)
{
    const size_t tp = (T + KT - 1) / KT * KT;
    float *pb, *acc;
    uint16_t *sc = mha_ws_split(ws, G, tp, &pb, &acc);
    uint32_t *q2 = (uint32_t *)(acc + G * 128);   /* PAIRS: ws_bytes_pairs */
    float M[64], L[64];
    __m512 lrun[64];
    for (size_t h = 0; h < G; h++) {
        M[h] = -INFINITY;
        lrun[h] = _mm512_setzero_ps();
    }
    if (PAIRS)   /* q holds bf16 values: their bits are the top halves */
        for (size_t h = 0; h < G; h++)
            for (size_t i = 0; i < d; i += 2) {
                uint32_t u0, u1;
                memcpy(&u0, &q[h * d + i], 4);
                memcpy(&u1, &q[h * d + i + 1], 4);
                q2[h * 64 + i / 2] = (u0 >> 16) | (u1 & 0xffff0000u);
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
            score_tab[PAIRS][part][ix](PAIRS ? (const void *)(q2 + h0 * 64) : (const void *)(q + h0 * d),
                                       d, kt, w, nk, h0 ? NULL : pf, inv, sc + h0 * tp + b0, tp,
                                       M + h0, lrun + h0);
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
        chunk_probs(sc, tp, c0, nk, G, M, L, pb, PAIRS);
        const uint16_t *vt = V + c0 * d;
        const uint16_t *pf = c0 + (PFV + 1) * PVC <= T ? vt + PFV * PVC * d : NULL;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            size_t nh = batch(G - h0, &ix);
            const size_t nq = (size_t)pv_nq[ix];
            for (size_t b = 0; b < nb; b += nq) {
                const int masked = 32 * (b + nq) > d;
                pv_tab[PAIRS][masked][ix](PAIRS ? (const void *)((uint16_t *)pb + h0 * PVC)
                                                : (const void *)(pb + h0 * PVC),
                                          vt, w, nk, acc + h0 * 128, b, bs, bm, h0 ? NULL : pf);
            }
            h0 += nh;
        }
    }

    /* ---- out: undo the dim order of the accumulators, round to bf16 */
    mha_out(acc, G, d, o, PAIRS);
}

static void attend_avx512(const float *q, size_t G, size_t d, const uint16_t *K,
                          const uint16_t *V, size_t cap, size_t T, float inv, void *ws,
                          float *o)
{
    attend(q, G, d, K, V, cap, T, inv, ws, o, 0);
}

static void attend_pairs(const float *q, size_t G, size_t d, const uint16_t *K,
                         const uint16_t *V, size_t cap, size_t T, float inv, void *ws,
                         float *o)
{
    attend(q, G, d, K, V, cap, T, inv, ws, o, 1);
}

/* the pair kernel's workspace: mha_ws_bytes and q's bf16 pairs [G][64] */
static size_t ws_bytes_pairs(size_t G, size_t T)
{
    return mha_ws_bytes(G, T) + G * 64 * sizeof(uint32_t);
}

static const dsattn_mha_kern mha_avx512 = { "avx512", attend_avx512, mha_ws_bytes };
const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = &mha_avx512;
static const dsattn_mha_kern mha_avx512_bf16 = { "avx512-bf16", attend_pairs, ws_bytes_pairs };
const dsattn_mha_kern *const dsattn_mha_kern_avx512_bf16_ptr = &mha_avx512_bf16;

#else  /* no AVX-512 compiler support: no such path */

const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = 0;
const dsattn_mha_kern *const dsattn_mha_kern_avx512_bf16_ptr = 0;
int dsattn_avx512_bf16dot_full_rate(void) { return 0; }

#endif
