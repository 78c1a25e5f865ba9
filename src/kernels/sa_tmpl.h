/* sa_tmpl.h - the parts of the sparse-attention tables (sa_kernels.h)
 * that are the same arithmetic at every vector width, written once: finish
 * (every width), and QK / PV on the 6 x 16 tile (the widths whose simd
 * header has it, DSV_TILE6X16: AVX2 and NEON).  Over the vector words of
 * simd_avx2.h / simd_avx512.h / simd_neon.h (DSV_F, DSV_N, dsv_load,
 * dsv_store, dsv_div, dsv_tr: an in-register DSV_N x DSV_N transpose,
 * dsv_rbf16x: dsattn_round_bf16 on every lane, NaN included; the
 * dsv_acc6x16 tile words).  Include once, from sa_kernels_avx2.c,
 * sa_kernels_avx512.c and sa_kernels_neon.c, after their simd header. */
#ifndef DSV_F
#error "sa_tmpl.h: include simd_avx2.h, simd_avx512.h or simd_neon.h first"
#endif

#ifdef DSV_TILE6X16
/* 6 keys (rows k + r*ld) x 16 heads (q + d*w: 16 / DSV_N vectors) */
DSV_AI void sa_qk_tile(const float *q, size_t w, size_t D, const float *k, size_t ld,
                       float *st, size_t ldst)
{
    DSV_ACC6X16(a);
    dsv_acc6x16_zero(a);
    dsv_acc6x16_fma(a, 6, k, 1, ld, q, w, D, 0);
    dsv_acc6x16_store(a, 6, st, ldst);
}

/* the table's qk: per 12-key tile, per 32-head group (the last may be
 * 16), two 6-key halves of each 16 heads */
static void sa_qk_rm(const float *qp, size_t hp, size_t D, const float *rows, size_t ld,
                     size_t nk, float *st, size_t ldst)
{
    for (size_t j0 = 0; j0 < nk; j0 += DSATTN_MLA_KT)
        for (size_t h0 = 0; h0 < hp; h0 += DSATTN_MLA_HG) {
            /* group of 32 heads (the last may be 16): [D, w] at qp + h0 * D */
            const size_t w = hp - h0 >= DSATTN_MLA_HG ? DSATTN_MLA_HG : hp - h0;
            for (size_t hh = 0; hh < w; hh += 16)
                for (size_t r0 = 0; r0 < DSATTN_MLA_KT; r0 += 6)
                    sa_qk_tile(qp + h0 * D + hh, w, D, rows + (j0 + r0) * ld, ld,
                               st + (j0 + r0) * ldst + h0 + hh, ldst);
        }
}

/* RC columns c.. x 16 heads over all nk keys (the key rows prefetched 8
 * ahead); rescale on load */
DSV_AI void sa_pv_tile(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld,
                       size_t nk, size_t c, const float *alpha, float *acct, const int RC)
{
    DSV_ACC6X16(a);
    dsv_acc6x16_load(a, RC, acct, hp, alpha);
    dsv_acc6x16_fma(a, RC, rows + c, ld, 1, p, ldp, nk, 8);
    dsv_acc6x16_store(a, RC, acct, hp);
}

/* the table's pv: per 16 heads, column tiles of 6, then single columns */
static void sa_pv_rm(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld,
                     size_t nk, size_t C, const float *alpha, float *acct)
{
    for (size_t h0 = 0; h0 < hp; h0 += 16) {
        const float *ph = p + h0, *ah = alpha + h0;
        size_t c = 0;
        for (; c + 6 <= C; c += 6)
            sa_pv_tile(ph, ldp, hp, rows, ld, nk, c, ah, acct + c * hp + h0, 6);
        for (; c < C; c++) sa_pv_tile(ph, ldp, hp, rows, ld, nk, c, ah, acct + c * hp + h0, 1);
    }
}
#endif /* DSV_TILE6X16 */

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
