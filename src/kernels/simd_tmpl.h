/* simd_tmpl.h - the helpers of simd_avx2.h, simd_avx512.h and simd_neon.h
 * that are the same arithmetic at every vector width, written once over
 * the vector words the including header defines (DSV_F, dsv_fmadd, ...:
 * the list stands at the top of each): the Cephes exp polynomial after its
 * range reduction, and the bf16 rounding of lanes that are not NaN.  Each
 * ISA header includes it once, after its words, so each ISA gets its own
 * always_inline copy, named by DSV(name) (name256, name512, name128n:
 * dsattn_exp_poly256, dsattn_rbf16_512, ...).  Include only from those
 * three headers. */
#ifndef DSV_F
#error "simd_tmpl.h: include simd_avx2.h, simd_avx512.h or simd_neon.h instead"
#endif

/* exp(xc) = 2^n * p: n = round(xc / ln2), r = xc - n ln2 (ln2 split in a
 * high and a low part so r is exact to ~2^-30), p = exp(r) by the Cephes
 * minimax polynomial on [-ln2/2, ln2/2] (within 2 ulp of expf).  Returns
 * p; the caller applies 2^n its own way. */
DSV_AI DSV_F DSV(dsattn_exp_poly)(DSV_F xc, DSV_F *n_out)
{
    const DSV_F n = dsv_round(dsv_mul(xc, dsv_set1(1.44269504088896341f)));
    DSV_F r = dsv_fnmadd(n, dsv_set1(0.693359375f), xc);
    r = dsv_fnmadd(n, dsv_set1(-2.12194440e-4f), r);
    DSV_F p = dsv_set1(1.9875691500e-4f);
    p = dsv_fmadd(p, r, dsv_set1(1.3981999507e-3f));
    p = dsv_fmadd(p, r, dsv_set1(8.3334519073e-3f));
    p = dsv_fmadd(p, r, dsv_set1(4.1665795894e-2f));
    p = dsv_fmadd(p, r, dsv_set1(1.6666665459e-1f));
    p = dsv_fmadd(p, r, dsv_set1(5.0000001201e-1f));
    p = dsv_fmadd(p, dsv_mul(r, r), r);
    *n_out = n;
    return dsv_add(p, dsv_set1(1.0f));
}

/* fp32 -> nearest bf16 value (RNE) for lanes that are not NaN, or NaN
 * from an FMA / multiply / exp of bf16-valued operands (quiet, low 16 bits
 * zero: adding 0x7fff + 0 leaves it as dsattn_round_bf16 returns it) */
DSV_AI DSV_F DSV(dsattn_rbf16_)(DSV_F x)
{
    const DSV_I u = dsv_casti(x);
    const DSV_I lsb = dsv_i_and(dsv_i_srli(u, 16), dsv_i_set1(1));
    const DSV_I r = dsv_i_add(dsv_i_add(u, dsv_i_set1(0x7fff)), lsb);
    return dsv_castf(dsv_i_and(r, dsv_i_set1((int)0xffff0000u)));
}
