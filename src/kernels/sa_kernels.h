/* sa_kernels.h - internal kernels of the fast sparse_attn path on AVX-512,
 * AVX2 and NEON (src/ops/sparse_attn.c, sparse_attn_tiled).
 *
 * Per block of 64 indices the valid rows are decoded ONCE into fp32 rows
 * (row-major, leading dimension ld) that stay in L2 and serve both GEMMs
 * for every head of the call: S = Q.K^T and acc^T += P.V, heads in the
 * SIMD lanes (the layout of mla_kernels.h: packed queries from
 * dsattn_mla_pack_q, scores [key][hp], acc^T [column][hp]; its softmax and
 * bf16 rounding kernels are reused as they are).  Unlike the MLA tiles the
 * keys stay row-major: QK broadcasts 12 keys from 12 row pointers, PV 12
 * consecutive columns of one key, so decoding needs no transpose - at 32
 * heads per call (the V4.1 decode split) the transpose cost ~10 % of the
 * step.  Register tiles of 12 keys (or columns) x 32 heads, FMA.  The AMX
 * form (sparse_attn_amx) takes the same rows as bf16 from rows_bf16.
 *
 * Four tables: `ref` (sa_kernels.c: plain scalar C, the decode through
 * numfmt.h's unpackers - the cross-check in tests/test_sparse_attn.c),
 * `avx512` (sa_kernels_avx512.c), `avx2` (sa_kernels_avx2.c: 6 x 16
 * sub-tiles of the same tiles) and `neon` (sa_kernels_neon.c, aarch64:
 * the 6 x 16 sub-tiles on 4-lane vectors).  Decoded values are exact products (code
 * x scale, one rounding), so every table decodes to the same bits; NaN
 * codes / NaN scales give NaN.
 *
 * Not here: the softmax (mla_kernels.h), the block loop and the online
 * softmax state (sparse_attn.c), anything that allocates.
 */
#ifndef DSATTN_SA_KERNELS_H
#define DSATTN_SA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Packed row layouts the rows kernel decodes (others: dsattn_kv_row). */
enum { DSATTN_SA_FP4 = 0, DSATTN_SA_FP8 = 1 };

typedef struct dsattn_sa_kern {
    const char *name;                           /* "ref", "avx2", "avx512", "neon" */
    /* out[h * d + c] = bf16(acct[c * hp + h] / den[h]) for h < nh, c < d
     * (the division and the rounding of dsattn_round_bf16). */
    void (*finish)(const float *acct, size_t hp, size_t nh, size_t d, const float *den,
                   float *out);
    /* nr <= 12 packed rows (rows[r], layout kinds[r]: DSATTN_SA_FP4 =
     * dsattn_v41_kv_unpack's 288 B at d 512, DSATTN_SA_FP8 =
     * dsattn_v41_swa_unpack's 528 B) -> fp32 rows out + r * ld (d floats
     * each, the unpackers' values), rows nr..11 zero.  d % 32 == 0. */
    void (*rows)(const uint8_t *const *rows, const unsigned char *kinds, size_t nr, size_t d,
                 float *out, size_t ld);
    /* The same values as bf16 bits for the AMX tiles: nr packed rows ->
     * out + r * d.  Returns 0 (out partly written) when a value is not a
     * bf16 number the tiles take as it is: fp32-only mantissa bits or a
     * subnormal (read as zero) - only an FP8 block whose UE8M0 scale is
     * below 2^-117 can give one; NaN and inf pass, as in
     * dsattn_amx_rows_bf16.  d % 32 == 0, d <= 1024. */
    int (*rows_bf16)(const uint8_t *const *rows, const unsigned char *kinds, size_t nr, size_t d,
                     uint16_t *out);
    /* st[j*ldst + h] = sum_{c<D} row(j, c) * q(c, h) for j < nk rounded up
     * to 12 (rows of the padding must exist, zero), h < hp; qp packed by
     * dsattn_mla_pack_q, row j at rows + j * ld. */
    void (*qk)(const float *qp, size_t hp, size_t D, const float *rows, size_t ld, size_t nk,
               float *st, size_t ldst);
    /* acct[c*hp + h] = acct[c*hp + h] * alpha[h] + sum_{j<nk} row(j, c) * p[j*ldp + h],
     * c < C, h < hp (mla_kernels.h's pv on row-major keys). */
    void (*pv)(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld, size_t nk,
               size_t C, const float *alpha, float *acct);
} dsattn_sa_kern;

extern const dsattn_sa_kern dsattn_sa_kern_ref;
/* NULL when the build has no AVX-512 path */
extern const dsattn_sa_kern *const dsattn_sa_kern_avx512_ptr;
/* NULL when the build has no x86-64 path (sa_kernels_avx2.c) */
extern const dsattn_sa_kern *const dsattn_sa_kern_avx2_ptr;
/* NULL when the build is not for aarch64 (sa_kernels_neon.c) */
extern const dsattn_sa_kern *const dsattn_sa_kern_neon_ptr;

#endif /* DSATTN_SA_KERNELS_H */
