/* mha_tmpl.h - the parts of the MHA / GQA attend kernels (mha_kernels.h)
 * that are the same at every vector width, written once: the workspace
 * layout, the P.V accumulator steps, the output in dim order, and the
 * softmax passes of the kernels that keep their exps (AVX2, NEON).
 * mha_avx2.c, mha_avx512.c and mha_neon.c include it after simd_avx2.h /
 * simd_avx512.h / simd_neon.h (the vector words DSV_F, dsv_fmadd, ...) and
 * define KT and PVC (keys per K tile, per P.V chunk) first, and the hooks
 * of the softmax passes at the end (AVX2 and NEON).  The accumulators of
 * NH heads x NQ dim blocks are ae / ao [h * NQ + u]: a block is 2 DSV_N
 * dims of the V tile, split between ae and ao as the kernel decodes them
 * (x86: even dims in ae, odd ones in ao; NEON: the first DSV_N, then the
 * next), stored at acc + h * 128 + block * 2 DSV_N.
 * Each FMA chain runs over the keys in order, so the result does not
 * depend on the batching. */
#ifndef DSV_F
#error "mha_tmpl.h: include simd_avx2.h, simd_avx512.h or simd_neon.h first"
#endif

/* the accumulators of blocks b0 .. b0 + NQ - 1 from acc */
static inline __attribute__((always_inline)) void
mha_pv_load(DSV_F *ae, DSV_F *ao, const float *acc, size_t b0, const int NH, const int NQ)
{
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 8") for (int u = 0; u < NQ; u++) {
            ae[h * NQ + u] = dsv_load(acc + h * 128 + (b0 + (size_t)u) * 2 * DSV_N);
            ao[h * NQ + u] = dsv_load(acc + h * 128 + (b0 + (size_t)u) * 2 * DSV_N + DSV_N);
        }
}

/* one key: its decoded even / odd dims ve / vo [u] times each head's
 * probability pj[h * PVC] */
static inline __attribute__((always_inline)) void
mha_pv_key(DSV_F *ae, DSV_F *ao, const DSV_F *ve, const DSV_F *vo, const float *pj,
           const int NH, const int NQ)
{
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
        const DSV_F p = dsv_set1(pj[h * PVC]);
        _Pragma("GCC unroll 8") for (int u = 0; u < NQ; u++) {
            ae[h * NQ + u] = dsv_fmadd(ve[u], p, ae[h * NQ + u]);
            ao[h * NQ + u] = dsv_fmadd(vo[u], p, ao[h * NQ + u]);
        }
    }
}

/* the accumulators back to acc */
static inline __attribute__((always_inline)) void
mha_pv_store(const DSV_F *ae, const DSV_F *ao, float *acc, size_t b0, const int NH,
             const int NQ)
{
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 8") for (int u = 0; u < NQ; u++) {
            dsv_store(acc + h * 128 + (b0 + (size_t)u) * 2 * DSV_N, ae[h * NQ + u]);
            dsv_store(acc + h * 128 + (b0 + (size_t)u) * 2 * DSV_N + DSV_N, ao[h * NQ + u]);
        }
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The workspace: bf16 scores [G][tp] (tp = T rounded up to the K tile,
 * 64-byte rows for the streaming stores), the probabilities of a chunk
 * [G][PVC], accumulators [G][128]; +64: the kernel aligns ws itself. */
static size_t mha_ws_bytes(size_t G, size_t T)
{
    size_t tp = (T + KT - 1) / KT * KT;
    return 64 + up64(G * tp * sizeof(uint16_t)) + G * PVC * sizeof(float) +
           G * 128 * sizeof(float);
}

/* its pieces in ws: returns the scores, *pb the probabilities, *acc the
 * accumulators */
static inline __attribute__((always_inline)) uint16_t *
mha_ws_split(void *ws, size_t G, size_t tp, float **pb, float **acc)
{
    uint16_t *sc = (uint16_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    *pb = (float *)((char *)sc + up64(G * tp * sizeof(uint16_t)));
    *acc = *pb + G * PVC;
    return sc;
}

/* The K tile at b0 of a cache of cap keys (w keys wide, nk of them
 * visible): the tile itself when it is full, else a copy into kpad
 * ([d][KT], d <= 128) with the keys from nk on 0, so the score kernels
 * always take whole tiles (the padding keys score 0; nothing reads them
 * past T). */
static inline const uint16_t *mha_k_tile(const uint16_t *kt, size_t w, size_t nk, size_t d,
                                         uint16_t *kpad)
{
    if (nk == KT) return kt;
    for (size_t i = 0; i < d; i++) {
        memcpy(kpad + i * KT, kt + i * w, nk * sizeof(uint16_t));
        memset(kpad + i * KT + nk, 0, (KT - nk) * sizeof(uint16_t));
    }
    return kpad;
}

/* o [G][d] = bf16 of acc, each block's dims put back in order: the
 * FMA kernels' even / odd split (PAIRS 0: even dims in the block's first
 * DSV_N floats, odd ones in the second), or the bf16-pair kernel's unpack
 * order (PAIRS 1: per 8 dims, the first 4 in the first half, the next 4 in
 * the second, as vpunpcklwd / vpunpckhwd leave them in each 128-bit lane),
 * or in order (PAIRS 2: the NEON kernel, which widens bf16 rows in order) */
static inline __attribute__((always_inline)) void mha_out(const float *acc, size_t G, size_t d,
                                                          float *o, const int PAIRS)
{
    for (size_t h = 0; h < G; h++)
        for (size_t i = 0; i < d; i++) {
            const size_t r = i % (2 * DSV_N);
            const size_t at = PAIRS == 2 ? r
                            : PAIRS ? (r % 8 >= 4) * DSV_N + r / 8 * 4 + r % 4
                                    : (r & 1) * DSV_N + r / 2;
            float a = acc[h * 128 + i / (2 * DSV_N) * (2 * DSV_N) + at];
            uint32_t u;
            memcpy(&u, &a, 4);
            /* dsattn_round_bf16, without pulling numfmt into this header set */
            if ((u & 0x7fffffffu) > 0x7f800000u) u = (u & 0xffff0000u) | 0x400000u;
            else u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
            memcpy(&o[h * d + i], &u, 4);
        }
}

#ifdef MHA_KEEP_G
/* ---- The exp-keeping kernels' softmax (AVX2, NEON) ---------------------
 * Written once over the vector words and the ISA file's hooks, defined
 * before this header is included:
 *   MHA_KEEP_G             heads per group from which the exps are kept
 *   MHA_BF16V(p)           DSV_N bf16 values at p -> fp32
 *   MHA_EXPN(x)            the softmaxes' exp for x <= 0 or NaN
 *   MHA_FIRST(v, n)        v's first n lanes (1 <= n <= DSV_N), the rest 0
 *   MHA_FIRST_OR(v, n, f)  v's first n lanes, the rest from f
 *   MHA_HMAX(v), MHA_HSUM(v)  the horizontal max / sum, the ISA's order
 * and DSV(dsattn_rbf16_) of simd_tmpl.h for the bf16 rounding. */

/* The workspace: the layout above and after it, 64-byte aligned, the fp32
 * exp rows [G][tp] of mha_head_softmax (G >= MHA_KEEP_G). */
static size_t mha_ws_bytes_keep(size_t G, size_t T)
{
    const size_t tp = (T + KT - 1) / KT * KT;
    return mha_ws_bytes(G, T) + (G >= MHA_KEEP_G ? 64 + G * tp * sizeof(float) : 0);
}

static float *mha_ex_split(float *acc, size_t G)
{
    return (float *)(((uintptr_t)(acc + G * 128) + 63) & ~(uintptr_t)63);
}

/* One head's softmax statistics over its T bf16 scores sc (key order, a
 * row of whole K tiles): *M = max_j s_j, and the return value
 * L = sum_j exp(s_j - M), summed in two DSV_N-lane sums (keys of even and
 * odd DSV_N-blocks of each 2 DSV_N) in key order, then the two and
 * across the lanes.  ex non-NULL: the exps go there too (0 for the keys
 * from T up to the next multiple of DSV_N).  A function of the head's
 * scores alone: the same bits whatever batch the head ran in. */
static float mha_head_softmax(const uint16_t *sc, size_t T, float *ex, float *M)
{
    const size_t TN = T / DSV_N * DSV_N;
    const DSV_F ninf = dsv_set1(-INFINITY);
    DSV_F m0 = ninf, m1 = ninf;
    size_t j = 0;
    for (; j + 2 * DSV_N <= TN; j += 2 * DSV_N) {
        m0 = dsv_max(m0, MHA_BF16V(sc + j));
        m1 = dsv_max(m1, MHA_BF16V(sc + j + DSV_N));
    }
    if (j < TN) m0 = dsv_max(m0, MHA_BF16V(sc + j));
    /* DSV_N values at TN are inside the row (whole tiles) */
    if (TN < T) m1 = dsv_max(m1, MHA_FIRST_OR(MHA_BF16V(sc + TN), T - TN, ninf));
    *M = MHA_HMAX(dsv_max(m0, m1));
    const DSV_F mb = dsv_set1(*M);
    DSV_F l0 = dsv_zero(), l1 = dsv_zero();
    for (j = 0; j + 2 * DSV_N <= TN; j += 2 * DSV_N) {
        const DSV_F e0 = MHA_EXPN(dsv_sub(MHA_BF16V(sc + j), mb));
        const DSV_F e1 = MHA_EXPN(dsv_sub(MHA_BF16V(sc + j + DSV_N), mb));
        if (ex) {
            dsv_store(ex + j, e0);
            dsv_store(ex + j + DSV_N, e1);
        }
        l0 = dsv_add(l0, e0);
        l1 = dsv_add(l1, e1);
    }
    if (j < TN) {
        const DSV_F e0 = MHA_EXPN(dsv_sub(MHA_BF16V(sc + j), mb));
        if (ex) dsv_store(ex + j, e0);
        l0 = dsv_add(l0, e0);
    }
    if (TN < T) {
        const DSV_F e1 = MHA_FIRST(MHA_EXPN(dsv_sub(MHA_BF16V(sc + TN), mb)), T - TN);
        if (ex) dsv_store(ex + TN, e1);
        l1 = dsv_add(l1, e1);
    }
    return MHA_HSUM(dsv_add(l0, l1));
}

/* p[h][0..PVC) of a chunk: bf16(exp(s - M_h) / L_h) (the quotient by one
 * Newton step from the reciprocal), keys past nk get 0.  The exps are
 * mha_head_softmax's rows ex, or with ex NULL computed again from the
 * scores sc: the same function of the same s and M_h, the same bits.  A
 * load of DSV_N values at k < nk stays inside a row (rows of sc are whole
 * tiles, of ex whole DSV_Ns). */
static void mha_chunk_probs(const uint16_t *sc, const float *ex, size_t ld, size_t c0,
                            size_t nk, size_t G, const float *M, const float *L, float *pb)
{
    for (size_t h = 0; h < G; h++) {
        const DSV_F mb = dsv_set1(M[h]), lb = dsv_set1(L[h]);
        const DSV_F rb = dsv_set1(1.0f / L[h]);
        for (size_t k = 0; k < PVC; k += DSV_N) {
            DSV_F r = dsv_zero();
            if (k < nk) {
                const size_t o = h * ld + c0 + k;
                const DSV_F e = ex ? dsv_load(ex + o) : MHA_EXPN(dsv_sub(MHA_BF16V(sc + o), mb));
                const DSV_F q0 = dsv_mul(e, rb);
                const DSV_F q1 = dsv_fmadd(dsv_fnmadd(q0, lb, e), rb, q0);
                r = DSV(dsattn_rbf16_)(q1);
                if (nk - k < DSV_N) r = MHA_FIRST(r, nk - k);
            }
            dsv_store(pb + h * PVC + k, r);
        }
    }
}
#endif /* MHA_KEEP_G */
