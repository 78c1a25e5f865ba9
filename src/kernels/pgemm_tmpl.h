/* pgemm_tmpl.h - the FP8 weight tile of pgemm.h's AVX2, AVX-512 and NEON
 * tables (tile_fp8), written once over the vector words of simd_avx2.h /
 * simd_avx512.h / simd_neon.h (DSV_F, DSV_N, dsv_mul, ...): DSV_N columns of the MR rows
 * at a time, each code decoded and times its block's scale, then stored
 * column-major into the packed tile.  With finite codes whose scales allow
 * it (dsattn_pgemm_cheap) the x256 of the cheap decode is folded into the
 * scale: (e / 256) * (256 s) is the real product e * s rounded once, the
 * same bits as e * s; otherwise the exact decode (NaN codes kept) times s.
 * The including file defines, before it, its hooks:
 *   PG_RN                 length of the register array (>= MR)
 *   pg_e4m3_div256(w)     DSV_N finite codes -> value / 256
 *   pg_e4m3_exact(w)      DSV_N codes -> value (NaN codes: NaN)
 *   pg_store_cols(r, a)   r[i] = row i (i < MR) -> a[c*MR + i], c < DSV_N
 * and, where the simd header has the 6 x 16 tile (DSV_TILE6X16: AVX2,
 * NEON), the table's tile from it (pg_tile):
 *   pg_sub12x8(a, b, kc, c, ldc, first)   rows 0..11 x tokens 0..7
 * Include once, from pgemm_avx2.c, pgemm_avx512.c and pgemm_neon.c only. */
#ifndef PG_RN
#error "pgemm_tmpl.h: define PG_RN and the pg_* hooks first"
#endif

#ifdef DSV_TILE6X16
/* The 12 x 32 tile as 6 x 16 sub-tiles over the same packed operands for
 * each full 16 tokens, and pg_sub12x8 for a last 8 (nw % 16 == 8) */
static void pg_tile(const float *a, const float *b, size_t kc, int nw, float *c, size_t ldc,
                    int first)
{
    int j = 0;
    for (; j + 16 <= nw; j += 16) {
        dsv_tile6x16(a, b + j, NR, kc, c + j, ldc, first);
        dsv_tile6x16(a + 6, b + j, NR, kc, c + 6 * ldc + j, ldc, first);
    }
    if (j < nw) pg_sub12x8(a, b + j, kc, c + j, ldc, first);
}
#endif

AI void tile_fp8_impl(const uint8_t *w, size_t K, const float *const *sc, size_t bs, size_t nr,
                      float *a, const int cheap)
{
    size_t blk = 0, left = bs;              /* scale block of column d, columns left in it */
    for (size_t d = 0; d < K; d += DSV_N) {
        DSV_F r[PG_RN];
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            const uint8_t *wi = w + (size_t)i * K + d;
            if ((size_t)i >= nr) r[i] = dsv_zero();
            else if (cheap) r[i] = dsv_mul(pg_e4m3_div256(wi), dsv_set1(256.0f * sc[i][blk]));
            else r[i] = dsv_mul(pg_e4m3_exact(wi), dsv_set1(sc[i][blk]));
        }
        if ((left -= DSV_N) == 0) { blk++; left = bs; }
        pg_store_cols(r, a + d * MR);
    }
}

static void tile_fp8(const uint8_t *w, size_t K, const float *const *sc, size_t bs, size_t nr,
                     int finite, float *a)
{
    if (dsattn_pgemm_cheap(sc, nr, K, bs, finite)) tile_fp8_impl(w, K, sc, bs, nr, a, 1);
    else tile_fp8_impl(w, K, sc, bs, nr, a, 0);
}
