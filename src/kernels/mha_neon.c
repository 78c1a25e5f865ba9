/* mha_neon.c - the Advanced SIMD (ARMv8.0) attention kernel of MHA / GQA
 * decode (mha_kernels.h): one query token, the G query heads of one KV
 * head; the neon table's mha slot (aarch64 builds only; CMakeLists.txt
 * leaves this file out elsewhere and absent.c then makes
 * dsattn_mha_kern_neon_ptr NULL).
 *
 * The passes of mha_avx2.c (read its header for the why) with 4 lanes and
 * 32 registers:
 *  - scores: K is key-tiled ([d][32 keys] per tile), so 32 bytes of a tile
 *    row are one dim of 16 keys, widened in key order (SHLL #16: bf16 ->
 *    fp32 exactly) into 4 vectors that feed 4 FMAs for each head of a
 *    batch of 4 (16 accumulators), the tile done in two 16-key halves per
 *    batch; batches of 2 and 1 heads take the whole tile at once.  A
 *    partial last tile is copied into a zero-padded one first.
 *  - softmax: the K pass writes each head's scores (bf16 after the
 *    contract's two roundings) into its row of the workspace; then, a head
 *    at a time, one pass takes the row's max and a second its
 *    exp(s_j - max) (simd_neon.h: the x86 tables' exp, bit for bit) and
 *    their sum (two 4-lane accumulators over the keys in order, then
 *    across), so a head's statistics do not depend on its batch.  The V
 *    pass computes p_j = bf16(exp(s_j - max) / sum) per chunk (the
 *    quotient by one Newton step from the reciprocal); for G >= 4 it reads
 *    the exps the softmax pass kept, for MHA it computes them again.
 *  - P.V: V is tiled by 64 keys and 32-dim blocks ([w][32] per block), so
 *    16 bytes are 8 dims of one key, widened in dim order into 2 vectors
 *    that feed 2 FMAs per head with p broadcast; accumulators in registers
 *    over the chunk: 4 heads x 16 dims, 2 heads x 32, 1 x 32.  The
 *    last block of a d that is no multiple of 32 is read with its own
 *    stride and, for a part of 8 dims, through a zero-padded copy.
 *  - no software prefetch: K and V of a KV head are each one contiguous
 *    stream, the pattern ARM cores' hardware prefetchers follow.  Speed on
 *    ARM hardware has not been measured (docs/kernels.md).
 * Each key's score is one FMA chain over the dims in order and each head's
 * output one chain over the keys in order, whatever the batch: GQA == MHA
 * bit for bit (tests/test_mha.c, under qemu-aarch64).
 * Not here: threading (the caller gives each thread whole KV heads).
 */
#include "mha_kernels.h"

#include "internal.h"

#include <math.h>
#include <string.h>

#include "simd_neon.h"

#define KT  DSATTN_MHA_KTILE   /* keys per K tile (one 64-byte line per dim) */
#define PVC DSATTN_MHA_VTILE   /* keys per P.V chunk: one V tile             */
#define KEEP_G 4               /* heads per group from which exps are kept   */

/* the hooks of mha_tmpl.h's softmax passes */
#define MHA_KEEP_G KEEP_G
#define MHA_BF16V(p) dsattn_bf16x4_128n(p)
#define MHA_EXPN(x) dsattn_exp128n_ftz_neg(x)
#define MHA_FIRST(v, n) \
    vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), dsattn_mask128n(n)))
#define MHA_FIRST_OR(v, n, f) vbslq_f32(dsattn_mask128n(n), (v), (f))
#define MHA_HMAX(v) dsattn_hmax128n(v)
#define MHA_HSUM(v) dsattn_hsum128n(v)
#include "mha_tmpl.h"

#define UNROLL _Pragma("GCC unroll 8")
#define INLINE DSATTN_NEON_AI

/* ==== K pass ============================================================ */

/* Scores of keys 16*hb .. 16*(hb+NB)-1 of a full tile kt ([d][32] bf16)
 * for NH heads (q [NH][d]) as bf16 bits in key order: tb[h*ldt + key]
 * (ldt a multiple of 16). */
INLINE void score_keys(const float *q, size_t d, const uint16_t *kt, float inv, uint16_t *tb,
                       size_t ldt, const int hb, const int NH, const int NB)
{
    float32x4_t a[16];                              /* [(h * NB + b) * 4 + c] */
    UNROLL for (int i = 0; i < NH * NB * 4; i++) a[i] = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < d; i++) {
        float32x4_t k[8];
        UNROLL for (int b = 0; b < NB; b++) {
            const uint16_t *r = kt + i * KT + 16 * (hb + b);
            const uint16x8_t x0 = vld1q_u16(r), x1 = vld1q_u16(r + 8);
            k[4 * b + 0] = dsattn_bf16lo_128n(x0);
            k[4 * b + 1] = dsattn_bf16hi_128n(x0);
            k[4 * b + 2] = dsattn_bf16lo_128n(x1);
            k[4 * b + 3] = dsattn_bf16hi_128n(x1);
        }
        UNROLL for (int h = 0; h < NH; h++) {
            const float32x4_t qb = vld1q_dup_f32(q + (size_t)h * d + i);
            UNROLL for (int c = 0; c < NB * 4; c++)
                a[h * NB * 4 + c] = vfmaq_f32(a[h * NB * 4 + c], k[c], qb);
        }
    }
    const float32x4_t vinv = vdupq_n_f32(inv);
    UNROLL for (int h = 0; h < NH; h++)
        UNROLL for (int c = 0; c < NB * 4; c += 2) {
            const float32x4_t s0 =
                dsattn_rbf16_128n(vmulq_f32(dsattn_rbf16_128n(a[h * NB * 4 + c]), vinv));
            const float32x4_t s1 =
                dsattn_rbf16_128n(vmulq_f32(dsattn_rbf16_128n(a[h * NB * 4 + c + 1]), vinv));
            vst1q_u16(tb + h * ldt + 16 * hb + 4 * c, dsattn_bf16pack_128n(s0, s1));
        }
}

#define SCORE_FN(NH, NB)                                                                   \
    static __attribute__((noinline)) void score_##NH##_##NB(const float *q, size_t d,     \
                                  const uint16_t *kt, float inv, uint16_t *tb, size_t ldt, \
                                  int hb)                                                  \
    {                                                                                      \
        if (hb) score_keys(q, d, kt, inv, tb, ldt, 1, NH, NB);                             \
        else score_keys(q, d, kt, inv, tb, ldt, 0, NH, NB);                                \
    }
SCORE_FN(4, 1) SCORE_FN(2, 2) SCORE_FN(1, 2)

/* ==== V pass ============================================================ */

/* One 8-dim unit of a V tile: dims 8u .. 8u+n-1, key j's n values at
 * base + j * stride (n even, <= 8) */
typedef struct {
    size_t base, stride, n;
} vunit;

/* 8 bf16 values of a unit's row: n of them, the rest 0 (a narrow unit is
 * the last of its row; reading 8 could leave the cache) */
INLINE uint16x8_t load_unit(const uint16_t *p, size_t n)
{
    if (n == 8) return vld1q_u16(p);
    uint16_t t[8] = { 0 };
    memcpy(t, p, n * sizeof(uint16_t));
    return vld1q_u16(t);
}

/* acc (per 8-dim unit: dims in order) of NH heads, units u0 .. u0+NQ-1,
 * += sum_{j<nk} p[h][j] * V[j][unit].  MASKED: some unit is narrower than
 * 8 dims or strided otherwise than 32 (the last block when d % 32 != 0). */
INLINE void pv_keys(const float *pb, const uint16_t *vt, size_t nk, float *acc, size_t u0,
                    const vunit *vu, const int NH, const int NQ, const int MASKED)
{
    float32x4_t ae[8], ao[8];                       /* [h * NQ + u] */
    const uint16_t *base[4];
    UNROLL for (int u = 0; u < NQ; u++) base[u] = vt + vu[u0 + u].base;
    mha_pv_load(ae, ao, acc, u0, NH, NQ);
    for (size_t j = 0; j < nk; j++) {
        float32x4_t ve[4], vo[4];
        UNROLL for (int u = 0; u < NQ; u++) {
            const uint16x8_t x = MASKED ? load_unit(base[u] + j * vu[u0 + u].stride, vu[u0 + u].n)
                                        : vld1q_u16(base[u] + j * 32);
            ve[u] = dsattn_bf16lo_128n(x);
            vo[u] = dsattn_bf16hi_128n(x);
        }
        mha_pv_key(ae, ao, ve, vo, pb + j, NH, NQ);
    }
    mha_pv_store(ae, ao, acc, u0, NH, NQ);
}

#define PV_FN(NH, NQ, MS)                                                                \
    static void pv_##NH##_##NQ##_##MS(const float *pb, const uint16_t *vt, size_t nk,    \
                                      float *acc, size_t u0, const vunit *vu)            \
    {                                                                                    \
        pv_keys(pb, vt, nk, acc, u0, vu, NH, NQ, MS);                                    \
    }
PV_FN(4, 2, 0) PV_FN(4, 1, 0) PV_FN(2, 4, 0) PV_FN(2, 2, 0) PV_FN(2, 1, 0)
PV_FN(1, 4, 0) PV_FN(1, 2, 0) PV_FN(1, 1, 0)
PV_FN(4, 2, 1) PV_FN(4, 1, 1) PV_FN(2, 4, 1) PV_FN(2, 2, 1) PV_FN(2, 1, 1)
PV_FN(1, 4, 1) PV_FN(1, 2, 1) PV_FN(1, 1, 1)

typedef void (*pv_fn)(const float *, const uint16_t *, size_t, float *, size_t, const vunit *);
/* [masked][heads 4 / 2 / 1][units 4 / 2 / 1] (NULL: not a batch shape) */
static const pv_fn pv_tab[2][3][3] = {
    { { NULL, pv_4_2_0, pv_4_1_0 }, { pv_2_4_0, pv_2_2_0, pv_2_1_0 },
      { pv_1_4_0, pv_1_2_0, pv_1_1_0 } },
    { { NULL, pv_4_2_1, pv_4_1_1 }, { pv_2_4_1, pv_2_2_1, pv_2_1_1 },
      { pv_1_4_1, pv_1_2_1, pv_1_1_1 } },
};

/* heads in a batch: 4, 2 or 1, and its row in the tables.  Four at most:
 * the broadcast query (K pass) or probability (P.V) of each head takes a
 * register beside the 16 accumulators and the row's vectors, and with 6
 * heads (24 accumulators) GCC 12 spilled three of them every step. */
static size_t batch(size_t left, int *ix)
{
    if (left >= 4) { *ix = 0; return 4; }
    if (left >= 2) { *ix = 1; return 2; }
    *ix = 2;
    return 1;
}

/* units in a P.V call of batch row ix with `left` units to go: 2 for 4
 * heads, 4 for 2 or 1 (never 3) */
static size_t pv_units(int ix, size_t left)
{
    const size_t k = DSATTN_MIN((size_t)(ix == 0 ? 2 : 4), left);
    return k == 3 ? 2 : k;
}

/* ==== The kernel ======================================================== */

static void attend_neon(const float *q, size_t G, size_t d, const uint16_t *K,
                        const uint16_t *V, size_t cap, size_t T, float inv, void *ws, float *o)
{
    const size_t tp = (T + KT - 1) / KT * KT;
    float *pb, *acc;
    uint16_t *sc = mha_ws_split(ws, G, tp, &pb, &acc);
    float *ex = G >= KEEP_G ? mha_ex_split(acc, G) : NULL;
    float M[64], L[64];
    uint16_t kpad[128 * KT] __attribute__((aligned(64)));   /* a partial tile, padded */

    /* ---- K pass: every head's bf16 scores into its row of sc (a partial
     * last tile's padding keys score 0 there; nothing reads past T) */
    for (size_t b0 = 0; b0 < T; b0 += KT) {
        const size_t w = DSATTN_MIN((size_t)KT, cap - b0), nk = DSATTN_MIN(w, T - b0);
        const uint16_t *kt = mha_k_tile(K + b0 * d, w, nk, d, kpad);
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            const size_t nh = batch(G - h0, &ix);
            const float *qh = q + h0 * d;
            uint16_t *tb = sc + h0 * tp + b0;
            if (ix == 0) {
                score_4_1(qh, d, kt, inv, tb, tp, 0);
                score_4_1(qh, d, kt, inv, tb, tp, 1);
            } else if (ix == 1) {
                score_2_2(qh, d, kt, inv, tb, tp, 0);
            } else {
                score_1_2(qh, d, kt, inv, tb, tp, 0);
            }
            h0 += nh;
        }
    }

    /* ---- softmax statistics and exps, a head at a time */
    for (size_t h = 0; h < G; h++)
        L[h] = mha_head_softmax(sc + h * tp, T, ex ? ex + h * tp : NULL, M + h);

    /* ---- V pass: per chunk, probabilities then P.V */
    const size_t nu = (d + 7) / 8;                  /* 8-dim units, <= 16 */
    vunit vu[16];
    memset(acc, 0, G * 128 * sizeof(float));
    for (size_t c0 = 0; c0 < T; c0 += PVC) {
        const size_t w = DSATTN_MIN((size_t)PVC, cap - c0), nk = DSATTN_MIN(w, T - c0);
        size_t masked_from = nu;                    /* first unit needing the masked form */
        for (size_t u = 0; u < nu; u++) {
            const size_t blk = u / 4 * 32, bs = DSATTN_MIN((size_t)32, d - blk);
            const size_t off = (u & 3) * 8;
            vu[u].base = blk * w + off;
            vu[u].stride = bs;
            vu[u].n = DSATTN_MIN((size_t)8, bs - off);
            if (bs < 32 && masked_from == nu) masked_from = u;
        }
        mha_chunk_probs(sc, ex, tp, c0, nk, G, M, L, pb);
        const uint16_t *vt = V + c0 * d;
        for (size_t h0 = 0; h0 < G;) {
            int ix;
            const size_t nh = batch(G - h0, &ix);
            for (size_t u = 0; u < nu;) {
                const size_t k = pv_units(ix, nu - u);
                const int jx = k == 4 ? 0 : k == 2 ? 1 : 2;
                const int masked = u + k > masked_from;
                pv_tab[masked][ix][jx](pb + h0 * PVC, vt, nk, acc + h0 * 128, u, vu);
                u += k;
            }
            h0 += nh;
        }
    }

    /* ---- out: the dims are in order, round to bf16 */
    mha_out(acc, G, d, o, 2);
}

static const dsattn_mha_kern mha_neon = { "neon", attend_neon, mha_ws_bytes_keep };
const dsattn_mha_kern *const dsattn_mha_kern_neon_ptr = &mha_neon;
