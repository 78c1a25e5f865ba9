/* mha_avx2.c - the AVX2 + FMA fast attention kernel of MHA / GQA decode
 * (mha_kernels.h): one query token, the G query heads of one KV head, on
 * CPUs without AVX-512 (AMD Zen 2/3, Intel client cores) and under
 * DSATTN_ISA=avx2.
 *
 * The shape of mha_avx512.c (read its header for the why) with 8 lanes and
 * 16 registers:
 *  - scores: K is key-tiled ([d][32 keys] per tile), so 32 bytes of a tile
 *    row are one dim of 16 keys; decoded once (shift: even keys, mask: odd
 *    keys) they feed 2 FMAs for each head of a batch of 6 or 4 (12 or 8
 *    accumulators, enough to cover the FMA latency), a tile being done in
 *    two 16-key halves per batch (the tile, 8 KB at d = 128, stays in L1
 *    between them).  Batches of 2 and 1 heads take the whole tile at once.  A
 *    partial last tile is copied into a zero-padded 32-key one first.
 *  - softmax: the K pass writes each head's scores (bf16 values after the
 *    contract's two roundings) into its row of the workspace and nothing
 *    else; then, a head at a time, one pass takes the row's max and a
 *    second its exp(s_j - max) and their sum (8 lanes in key order), so a
 *    head's statistics do not depend on the batch it ran in.  The V pass
 *    computes p_j = bf16(exp(s_j - max) / sum) per chunk (the quotient by
 *    the Newton step of mha_avx512.c); for G >= 4 the exp pass keeps its
 *    exps (fp32 rows) and the V pass reads them, where MHA, bound by the K
 *    and V stream, computes them again.  A running max and sum per tile
 *    (a horizontal max, a branch and a rescale per tile and head) measured
 *    4-8 % slower for G = 4 to 16 on a Zen 3 (one thread, 32K-64K keys).
 *  - P.V: V is tiled by 64 keys and 32-dim blocks ([w][32] per block), so
 *    32 bytes are 16 dims of one key; decoded once (even / odd dims) they
 *    feed 2 FMAs per head with p broadcast, accumulators in registers over
 *    the tile: 6 or 4 heads x 16 dims, 2 x 32 or 1 x 64.
 *  - software prefetch of the tile 2 K tiles / 1 V tile ahead, with the
 *    T1 hint: on AMD Zen 4 (in-process A/B, docs/mha.md) the T0 form was
 *    1.2-1.3x slower at 64K keys, on Zen 3 the same.  Likely: a T0
 *    prefetch holds an L1 miss buffer until its line arrives; T1 lines go
 *    to L2, whose refill at the load the FMAs hide.  The calls that work on
 *    a tile share its prefetches, paced over all of them: the score calls
 *    of a K tile take every ncall-th dim's line, the P.V calls of a chunk
 *    a run of the V tile's lines each, spread over their keys.  Asked for
 *    by the first call alone (a burst of 128 lines in a third of a K
 *    tile's time at G = 8), the lines arrive late; paced, G = 4 / 8 / 16
 *    run 1.05-1.13x as fast at 32K-64K keys on a Zen 3 (one thread, in
 *    process, docs/mha.md).  G = 1 and 2 have one score call a tile, and
 *    their P.V calls take whole 32-dim blocks of the V tile.
 * Each key's score is one FMA chain over the dims in order and each head's
 * output one chain over the keys in order, whatever the batch: the heads
 * of a group are only ever batched, never mixed (GQA == MHA bit for bit).
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
#define KEEP_G 4               /* heads per group from which exps are kept   */

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "simd_avx2.h"

/* the hooks of mha_tmpl.h's softmax passes */
#define MHA_KEEP_G KEEP_G
#define MHA_BF16V(p) dsattn_bf16x8_256(p)
#define MHA_EXPN(x) dsattn_exp256_ftz_neg(x)
#define MHA_FIRST(v, n) _mm256_and_ps((v), _mm256_castsi256_ps(dsattn_mask256(n)))
#define MHA_FIRST_OR(v, n, f) _mm256_blendv_ps((f), (v), _mm256_castsi256_ps(dsattn_mask256(n)))
#define MHA_HMAX(v) dsattn_hmax256(v)
#define MHA_HSUM(v) dsattn_hsum256(v)
#include "mha_tmpl.h"

#define UNROLL _Pragma("GCC unroll 8")
#define INLINE DSATTN_AVX2_AI

/* ==== K pass ============================================================ */

/* Scores of keys 16*hb .. 16*(hb+NB)-1 of a full tile kt ([d][32] bf16)
 * for NH heads (q [NH][d]) as bf16 bits in key order: tb[h*ldt + key]
 * (tb 32-byte aligned, ldt a multiple of 16).  pf: a later tile to
 * prefetch (one line per dim) or NULL; this call asks for the lines of
 * dims ph, ph + np, ph + 2 np, ... (np: the tile's score calls). */
INLINE void score_keys(const float *q, size_t d, const uint16_t *kt, const uint16_t *pf,
                       size_t ph, size_t np, float inv, uint16_t *tb, size_t ldt, const int hb,
                       const int NH, const int NB)
{
    __m256 ae[6], ao[6];                           /* [h * NB + b] */
    UNROLL for (int i = 0; i < NH * NB; i++) ae[i] = ao[i] = _mm256_setzero_ps();
    const __m256i him = _mm256_set1_epi32((int)0xffff0000u);
    for (size_t i = 0; i < d; i++) {
        __m256 ve[2], vo[2];
        UNROLL for (int b = 0; b < NB; b++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(kt + i * KT + 16 * (hb + b)));
            /* lane l: key 2l (low word) and key 2l+1 (high word) of the half;
             * the odd keys by a word blend with the shifted (low words 0),
             * which needs no mask register */
            const __m256i e = _mm256_slli_epi32(x, 16);
            ve[b] = _mm256_castsi256_ps(e);
            vo[b] = _mm256_castsi256_ps(_mm256_blend_epi16(x, e, 0x55));
        }
        if (pf && i == ph) {
            _mm_prefetch((const char *)(pf + i * KT), _MM_HINT_T1);
            ph += np;
        }
        UNROLL for (int h = 0; h < NH; h++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)h * d + i);
            UNROLL for (int b = 0; b < NB; b++) {
                ae[h * NB + b] = _mm256_fmadd_ps(ve[b], qb, ae[h * NB + b]);
                ao[h * NB + b] = _mm256_fmadd_ps(vo[b], qb, ao[h * NB + b]);
            }
        }
    }
    const __m256 vinv = _mm256_set1_ps(inv);
    UNROLL for (int h = 0; h < NH; h++)
        UNROLL for (int b = 0; b < NB; b++) {
            const __m256 se = dsattn_rbf16_256(_mm256_mul_ps(dsattn_rbf16_256(ae[h * NB + b]), vinv));
            const __m256 so = dsattn_rbf16_256(_mm256_mul_ps(dsattn_rbf16_256(ao[h * NB + b]), vinv));
            const __m256i pk = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(se), 16),
                                               _mm256_and_si256(_mm256_castps_si256(so), him));
            _mm256_store_si256((__m256i *)(tb + h * ldt + 16 * (hb + b)), pk);
        }
}

#define SCORE_FN(NH, NB)                                                                  \
    static __attribute__((noinline)) void score_##NH##_##NB(const float *q, size_t d,    \
                                  const uint16_t *kt, const uint16_t *pf, size_t ph,  \
                                  size_t np, float inv, uint16_t *tb, size_t ldt, int hb) \
    {                                                                                     \
        if (hb) score_keys(q, d, kt, pf, ph, np, inv, tb, ldt, 1, NH, NB);                \
        else score_keys(q, d, kt, pf, ph, np, inv, tb, ldt, 0, NH, NB);                   \
    }
SCORE_FN(6, 1) SCORE_FN(4, 1) SCORE_FN(2, 2) SCORE_FN(1, 2)

/* ==== V pass ============================================================ */

/* One 16-dim piece of a V tile: dims 16u .. 16u+n-1, key j's n values at
 * base + j * stride (n even, <= 16); m: the first n / 2 dword lanes. */
typedef struct {
    size_t   base, stride;
    __m256i  m;
} vquarter;

/* A call's part of a later V tile's prefetch (the P.V calls of a chunk
 * share the tile's lines, one per key and 32-dim block): one or two runs
 * of consecutive lines from p[r], n[r] lines, one line of each a key. */
typedef struct {
    const uint16_t *p[2];
    size_t n[2];
} pv_pf;

/* acc (per 16-dim quarter u: 8 even dims then 8 odd dims) of NH heads,
 * quarters u0 .. u0+NQ-1, += sum_{j<nk} p[h][j] * V[j][quarter].
 * MASKED: some quarter is narrower than 16 dims or strided otherwise than
 * 32 (the last block when d % 32 != 0).  pf: this call's part of a later
 * full tile's prefetch, or NULL. */
INLINE void pv_keys(const float *pb, const uint16_t *vt, size_t nk, float *acc, size_t u0,
                    const vquarter *vq, const pv_pf *pf, const int NH, const int NQ,
                    const int MASKED)
{
    __m256 ae[6], ao[6];                           /* [h * NQ + u] */
    const uint16_t *base[4];
    UNROLL for (int u = 0; u < NQ; u++) base[u] = vt + vq[u0 + u].base;
    mha_pv_load(ae, ao, acc, u0, NH, NQ);
    const uint16_t *pp0 = pf ? pf->p[0] : NULL, *pp1 = pf ? pf->p[1] : NULL;
    const size_t pn0 = pf ? pf->n[0] : 0, pn1 = pf ? pf->n[1] : 0;
    size_t pacc = 0, px = 0;
    for (size_t j = 0; j < nk; j++) {
        __m256 ve[4], vo[4];
        UNROLL for (int u = 0; u < NQ; u++) {
            __m256i x;
            if (MASKED)
                x = _mm256_maskload_epi32((const int *)(base[u] + j * vq[u0 + u].stride),
                                          vq[u0 + u].m);
            else x = _mm256_loadu_si256((const __m256i *)(base[u] + j * 32));
            const __m256i e = _mm256_slli_epi32(x, 16);
            ve[u] = _mm256_castsi256_ps(e);
            vo[u] = _mm256_castsi256_ps(_mm256_blend_epi16(x, e, 0x55));
        }
        if ((pacc += pn0) >= PVC) {       /* n[0] lines over the chunk's PVC keys */
            pacc -= PVC;
            _mm_prefetch((const char *)(pp0 + px * 32), _MM_HINT_T1);
            if (px < pn1) _mm_prefetch((const char *)(pp1 + px * 32), _MM_HINT_T1);
            px++;
        }
        mha_pv_key(ae, ao, ve, vo, pb + j, NH, NQ);
    }
    mha_pv_store(ae, ao, acc, u0, NH, NQ);
}

#define PV_FN(NH, NQ, MS)                                                                \
    static void pv_##NH##_##NQ##_##MS(const float *pb, const uint16_t *vt, size_t nk,    \
                                      float *acc, size_t u0, const vquarter *vq,         \
                                      const pv_pf *pf)                                   \
    {                                                                                    \
        pv_keys(pb, vt, nk, acc, u0, vq, pf, NH, NQ, MS);                                \
    }
PV_FN(6, 1, 0) PV_FN(4, 1, 0) PV_FN(2, 2, 0) PV_FN(2, 1, 0) PV_FN(1, 4, 0) PV_FN(1, 2, 0) PV_FN(1, 1, 0)
PV_FN(6, 1, 1) PV_FN(4, 1, 1) PV_FN(2, 2, 1) PV_FN(2, 1, 1) PV_FN(1, 4, 1) PV_FN(1, 2, 1) PV_FN(1, 1, 1)

typedef void (*pv_fn)(const float *, const uint16_t *, size_t, float *, size_t,
                      const vquarter *, const pv_pf *);
/* [masked][heads 6 / 4 / 2 / 1][quarters 4 / 2 / 1] (NULL: not a batch shape) */
static const pv_fn pv_tab[2][4][3] = {
    { { NULL, NULL, pv_6_1_0 }, { NULL, NULL, pv_4_1_0 }, { NULL, pv_2_2_0, pv_2_1_0 },
      { pv_1_4_0, pv_1_2_0, pv_1_1_0 } },
    { { NULL, NULL, pv_6_1_1 }, { NULL, NULL, pv_4_1_1 }, { NULL, pv_2_2_1, pv_2_1_1 },
      { pv_1_4_1, pv_1_2_1, pv_1_1_1 } },
};

/* heads in a batch: 6, 4, 2 or 1, and its row in the tables */
static size_t batch(size_t left, int *ix)
{
    if (left >= 6) { *ix = 0; return 6; }
    if (left >= 4) { *ix = 1; return 4; }
    if (left >= 2) { *ix = 2; return 2; }
    *ix = 3;
    return 1;
}

/* score calls of a K tile for batch row ix: two 16-key halves for 6 or 4
 * heads, the whole tile for 2 or 1 */
static size_t score_calls(int ix) { return ix <= 1 ? 2 : 1; }

/* quarters in a P.V call of batch row ix with `left` quarters to go: 1
 * for 6 or 4 heads, 2 for 2, 4 for 1 (never 3) */
static size_t pv_quarters(int ix, size_t left)
{
    const size_t k = DSATTN_MIN((size_t)(ix <= 1 ? 1 : ix == 2 ? 2 : 4), left);
    return k == 3 ? 2 : k;
}

/* score calls of a K tile and P.V calls of a chunk (nq quarters) for G
 * heads: the calls that share the tile's prefetches */
static void count_calls(size_t G, size_t nq, size_t *ns, size_t *npv)
{
    *ns = *npv = 0;
    for (size_t h0 = 0; h0 < G;) {
        int ix;
        h0 += batch(G - h0, &ix);
        *ns += score_calls(ix);
        for (size_t u = 0; u < nq; (*npv)++) u += pv_quarters(ix, nq - u);
    }
}

/* ==== The kernel ======================================================== */

static void attend_avx2(const float *q, size_t G, size_t d, const uint16_t *K,
                        const uint16_t *V, size_t cap, size_t T, float inv, void *ws, float *o)
{
    const size_t tp = (T + KT - 1) / KT * KT;
    float *pb, *acc;
    uint16_t *sc = mha_ws_split(ws, G, tp, &pb, &acc);
    /* Keep the exps for groups of KEEP_G heads and more: there a step is
     * compute-bound and a second exp costs more than the 8 bytes per key
     * and head of writing and reading them; MHA is bound by the K / V
     * stream, and the rows would take a third of L2 from it at 64K keys. */
    float *ex = G >= KEEP_G ? mha_ex_split(acc, G) : NULL;
    float M[64], L[64];
    uint16_t kpad[128 * KT] __attribute__((aligned(64)));   /* a partial tile, padded */

    /* ---- K pass: every head's bf16 scores into its row of sc (a partial
     * last tile's padding keys score 0 there; nothing reads past T) */
    const size_t nq = (d + 15) / 16;                /* 16-dim quarters, <= 8 */
    size_t ncall, npv;
    count_calls(G, nq, &ncall, &npv);
    for (size_t b0 = 0; b0 < T; b0 += KT) {
        const size_t w = DSATTN_MIN((size_t)KT, cap - b0), nk = DSATTN_MIN(w, T - b0);
        const uint16_t *kt = mha_k_tile(K + b0 * d, w, nk, d, kpad);
        const uint16_t *pf = b0 + (PFK + 1) * KT <= T ? K + (b0 + PFK * KT) * d : NULL;
        size_t ph = 0;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            const size_t nh = batch(G - h0, &ix);
            const float *qh = q + h0 * d;
            uint16_t *tb = sc + h0 * tp + b0;
            if (ix == 0) {
                score_6_1(qh, d, kt, pf, ph, ncall, inv, tb, tp, 0);
                score_6_1(qh, d, kt, pf, ph + 1, ncall, inv, tb, tp, 1);
            } else if (ix == 1) {
                score_4_1(qh, d, kt, pf, ph, ncall, inv, tb, tp, 0);
                score_4_1(qh, d, kt, pf, ph + 1, ncall, inv, tb, tp, 1);
            } else if (ix == 2) {
                score_2_2(qh, d, kt, pf, ph, ncall, inv, tb, tp, 0);
            } else {
                score_1_2(qh, d, kt, pf, ph, ncall, inv, tb, tp, 0);
            }
            ph += score_calls(ix);
            h0 += nh;
        }
    }

    /* ---- softmax statistics and exps, a head at a time */
    for (size_t h = 0; h < G; h++)
        L[h] = mha_head_softmax(sc + h * tp, T, ex ? ex + h * tp : NULL, M + h);

    /* ---- V pass: per chunk, probabilities then P.V */
    vquarter vq[8];
    memset(acc, 0, G * 128 * sizeof(float));
    for (size_t c0 = 0; c0 < T; c0 += PVC) {
        const size_t w = DSATTN_MIN((size_t)PVC, cap - c0), nk = DSATTN_MIN(w, T - c0);
        int masked_from = (int)nq;                  /* first quarter needing masks */
        for (size_t u = 0; u < nq; u++) {
            const size_t blk = u / 2 * 32, bs = DSATTN_MIN((size_t)32, d - blk);
            const size_t off = (u & 1) * 16, n = DSATTN_MIN((size_t)16, bs - off);
            vq[u].base = blk * w + off;
            vq[u].stride = bs;
            vq[u].m = dsattn_mask256(n / 2);
            if (bs < 32 && masked_from == (int)nq) masked_from = (int)u;
        }
        mha_chunk_probs(sc, ex, tp, c0, nk, G, M, L, pb);
        /* the next chunk's exps: 4 lines per head (rows of 2 or more heads
         * do not fit in L1 at depth) */
        if (ex && c0 + 2 * PVC <= tp)
            for (size_t h = 0; h < G; h++) {
                const float *e1 = ex + h * tp + c0 + PVC;
                _mm_prefetch((const char *)e1, _MM_HINT_T0);
                _mm_prefetch((const char *)(e1 + 16), _MM_HINT_T0);
                _mm_prefetch((const char *)(e1 + 32), _MM_HINT_T0);
                _mm_prefetch((const char *)(e1 + 48), _MM_HINT_T0);
            }
        const uint16_t *vt = V + c0 * d;
        const size_t nl = (d + 31) / 32 * PVC;        /* lines of a V tile */
        /* each call's lines in one run, or two side by side when there are
         * more of them than keys (npv * PVC >= nl / 2 for d <= 128) */
        const size_t runs = (nl + npv * PVC - 1) / (npv * PVC);
        const uint16_t *vn = c0 + (PFV + 1) * PVC <= T ? vt + PFV * PVC * d : NULL;
        pv_pf vpf;
        const pv_pf *pf = vn ? &vpf : NULL;
        size_t call = 0;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            const size_t nh = batch(G - h0, &ix);
            for (size_t u = 0; u < nq;) {
                const size_t k = pv_quarters(ix, nq - u);
                const int jx = k == 4 ? 0 : k == 2 ? 1 : 2;
                const int masked = (int)(u + k) > masked_from;
                const size_t l0 = call * nl / npv, l1 = ++call * nl / npv;
                if (vn) {
                    const size_t half = runs == 2 ? (l1 - l0 + 1) / 2 : l1 - l0;
                    vpf.p[0] = vn + l0 * 32;
                    vpf.n[0] = half;
                    vpf.p[1] = vn + (l0 + half) * 32;
                    vpf.n[1] = l1 - l0 - half;
                }
                pv_tab[masked][ix][jx](pb + h0 * PVC, vt, nk, acc + h0 * 128, u, vq, pf);
                u += k;
            }
            h0 += nh;
        }
    }

    /* ---- out: undo the even / odd dim order, round to bf16 */
    mha_out(acc, G, d, o, 0);
}

static const dsattn_mha_kern mha_avx2 = { "avx2", attend_avx2, mha_ws_bytes_keep };
const dsattn_mha_kern *const dsattn_mha_kern_avx2_ptr = &mha_avx2;

#else  /* no AVX2 compiler support: no such path */

const dsattn_mha_kern *const dsattn_mha_kern_avx2_ptr = 0;

#endif
