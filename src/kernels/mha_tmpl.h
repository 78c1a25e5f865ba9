/* mha_tmpl.h - the P.V accumulator steps of the MHA / GQA attend kernels
 * (mha_kernels.h) that are the same at every vector width, written once:
 * mha_avx2.c and mha_avx512.c include it after simd_avx2.h / simd_avx512.h
 * (the vector words DSV_F, dsv_fmadd, ...) and define PVC (keys per P.V
 * chunk) first.  The accumulators of NH heads x NQ dim blocks are ae / ao
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
