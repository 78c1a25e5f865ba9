/* sa_tmpl.h - the part of the sparse-attention tables (sa_kernels.h) that
 * is the same arithmetic at both vector widths, written once: finish.
 * Over the vector words of simd_avx2.h / simd_avx512.h (DSV_F, DSV_N,
 * dsv_load, dsv_store, dsv_div, dsv_tr: an in-register DSV_N x DSV_N
 * transpose, dsv_rbf16x: dsattn_round_bf16 on every lane, NaN included).
 * Include once, from sa_kernels_avx2.c and sa_kernels_avx512.c, after
 * their simd header. */
#ifndef DSV_F
#error "sa_tmpl.h: include simd_avx2.h or simd_avx512.h first"
#endif

/* acc^T [d][hp] / den[h] -> bf16 -> out [nh][d], by DSV_N x DSV_N blocks:
 * head vectors divided and rounded, transposed in registers, stored as
 * dims of each head.  Per element the scalar table's division and rounding,
 * so its bits; a partial head group, or d not a multiple of DSV_N, takes
 * the scalar loop. */
DSV_AI void DSV(sa_finish_)(const float *acct, size_t hp, size_t nh, size_t d,
                            const float *den, float *out)
{
    const size_t n = DSV_N;
    for (size_t h0 = 0; h0 < nh; h0 += n) {
        const size_t nv = nh - h0 < n ? nh - h0 : n;
        if (nv < n || d % n) {
            for (size_t h = h0; h < h0 + nv; h++)
                for (size_t c = 0; c < d; c++)
                    out[h * d + c] = dsattn_round_bf16(acct[c * hp + h] / den[h]);
            continue;
        }
        const DSV_F dv = dsv_load(den + h0);
        for (size_t c0 = 0; c0 < d; c0 += n) {
            DSV_F r[DSV_N];
#pragma GCC unroll 16
            for (size_t c = 0; c < n; c++)
                r[c] = dsv_rbf16x(dsv_div(dsv_load(acct + (c0 + c) * hp + h0), dv));
            dsv_tr(r);
#pragma GCC unroll 16
            for (size_t h = 0; h < n; h++) dsv_store(out + (h0 + h) * d + c0, r[h]);
        }
    }
}
