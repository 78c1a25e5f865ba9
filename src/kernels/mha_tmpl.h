/* mha_tmpl.h - the parts of the MHA / GQA attend kernels (mha_kernels.h)
 * that are the same at every vector width, written once: the workspace
 * layout, the P.V accumulator steps and the output in dim order.
 * mha_avx2.c and mha_avx512.c include it after simd_avx2.h / simd_avx512.h
 * (the vector words DSV_F, dsv_fmadd, ...) and define KT and PVC (keys per
 * K tile, per P.V chunk) first.  The accumulators of NH heads x NQ dim blocks are ae / ao
 * [h * NQ + u]: a block is 2 DSV_N dims of the V tile, its even dims in ae
 * and its odd ones in ao, stored at acc + h * 128 + block * 2 DSV_N.
 * Each FMA chain runs over the keys in order, so the result does not
 * depend on the batching. */
#ifndef DSV_F
#error "mha_tmpl.h: include simd_avx2.h or simd_avx512.h first"
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

/* o [G][d] = bf16 of acc, each block's dims put back in order: the
 * FMA kernels' even / odd split (PAIRS 0: even dims in the block's first
 * DSV_N floats, odd ones in the second), or the bf16-pair kernel's unpack
 * order (PAIRS 1: per 8 dims, the first 4 in the first half, the next 4 in
 * the second, as vpunpcklwd / vpunpckhwd leave them in each 128-bit lane) */
static inline __attribute__((always_inline)) void mha_out(const float *acc, size_t G, size_t d,
                                                          float *o, const int PAIRS)
{
    for (size_t h = 0; h < G; h++)
        for (size_t i = 0; i < d; i++) {
            const size_t r = i % (2 * DSV_N);
            const size_t at = PAIRS ? (r % 8 >= 4) * DSV_N + r / 8 * 4 + r % 4
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
