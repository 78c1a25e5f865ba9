/* mla_kernels.h - internal kernels of the fast absorbed MLA decode
 * (src/attn/mla_attend.c), heads in SIMD lanes.
 *
 * Why a layout of its own: the absorbed decode is two GEMMs per key tile,
 * S = Q . K^T ([H, D] x [D, nk]) and acc += P . V ([H, nk] x [nk, KL]), with
 * K and V the SAME decoded latent rows.  With the heads in the lanes
 * (Q^T packed once per step, S^T [nk, H], acc^T [KL, H]) neither operand is
 * ever transposed or packed per tile: the decoded rows are broadcast one
 * float at a time against head vectors, the online softmax is elementwise
 * over head vectors (no horizontal reductions), and the per-head rescale
 * folds into the P.V tile load.  hp (heads, padded) is a multiple of 16;
 * padded heads carry zero queries and are ignored by the caller.
 *
 * Four tables: `ref` (mla_tile.c: plain scalar C, fp32 in a fixed order,
 * the cross-check of the SIMD tables in tests/test_mla.c), `avx512`
 * (mla_tile_avx512.c: register tiles of 12 rows x 32 heads, FMA), `avx2`
 * (mla_tile_avx2.c: the same FMA chains in 6 x 16 sub-tiles, equal to
 * avx512 bit for bit on QK, PV and the softmax) and `neon`
 * (mla_tile_neon.c, aarch64: the 6 x 16 sub-tiles on 4-lane vectors, the
 * same bits again).  The driver uses the
 * context's table (ktab.h's mla slot) and keeps its sgemm path where the
 * slot is NULL; reference mode never comes here.
 *
 * Not here: the layer, the merge of per-thread softmax states, anything
 * that allocates.
 */
#ifndef DSATTN_MLA_KERNELS_H
#define DSATTN_MLA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* heads per register tile: packed queries come in groups of this many
 * (the last group may be 16 when hp % 32 == 16) */
#define DSATTN_MLA_HG 32
/* keys per tile of the decoded key block.  A key block of nk rows of D
 * floats is stored in tiles of 12 keys, d-major inside a tile:
 *   key j, element d  at  kt[(j / 12) * 12 * D + d * 12 + j % 12]
 * so the 12 keys of a tile are broadcast from one pointer with constant
 * displacements (QK) and so are 12 consecutive elements of one key (PV).
 * A last partial tile is zero padded (the table's tile_rows / tile_bf16). */
#define DSATTN_MLA_KT 12

typedef struct dsattn_mla_kern {
    const char *name;                            /* "ref", "avx2", "avx512", "neon" */

    /* Scores of a tiled key block, heads in lanes:
     *   st[j*ldst + h] = sum_{d<D} key(j, d) * q(d, h),   h < hp
     * for every j of every tile (j < nk rounded up to 12: padded keys give
     * zero scores; st has room for them).  q is packed by
     * dsattn_mla_pack_q: group g (heads 32g..) is a [D, w] block (w = 32,
     * or 16 for a last half group) at qp + 32*g*D. */
    void (*qk)(const float *qp, size_t hp, size_t D, const float *kt, size_t nk, float *st,
               size_t ldst);
    /* Online softmax over one key block of scores st [nk, ldst] (hp heads):
     * s = st * scale (then rounded to bf16 when bf16 != 0), per head the
     * running max m[h] and sum l[h] update, st <- exp(s - m_new), and
     * alpha[h] = exp(m_old - m_new) (1 when the max did not move). */
    void (*softmax)(float *st, size_t ldst, size_t hp, size_t nk, float scale, int bf16,
                    float *m, float *l, float *alpha);
    /* P.V with the rescale folded in, heads in lanes, over the tiled block:
     *   acct[c*hp + h] = acct[c*hp + h] * alpha[h] + sum_{j<nk} key(j, c) * p[j*ldp + h]
     * c < C (C <= D: the latent part of each key), h < hp.
     * While it runs, the pf_bytes-byte rows pf[0..npf) (the next block's
     * cache rows; npf may be 0) are prefetched into L2, spread over the
     * work, so the next decode does not wait on memory. */
    void (*pv)(const float *p, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
               size_t C, const float *alpha, float *acct, const uint8_t *const *pf, size_t npf,
               size_t pf_bytes);
    /* nr <= 12 fp32 rows (row r at rows + r*ldr, D floats) -> one tile at
     * kt (12 * D floats), rows nr..11 zero */
    void (*tile_rows)(const float *rows, size_t ldr, size_t nr, size_t D, float *kt);
    /* the same from nr bf16 rows (rows[r], D values each): decode and
     * transpose in one pass */
    void (*tile_bf16)(const uint8_t *const *rows, size_t nr, size_t D, float *kt);
    /* One FP8 latent row (dsattn_v32_kv_unpack's layout and values: E4M3
     * codes x per-128 fp32 scale, then bf16 rope; NaN codes give NaN).
     * kl % 128 == 0 (the layer refuses other kv_lora_rank), any dr. */
    void (*v32_row)(const uint8_t *row, size_t kl, size_t dr, float *out);

    /* Weight rows of the W_uk / W_uv absorption with the reference's bf16
     * weight values: w(i) = bf16(e4m3(w[i]) * scale[i / bs]) (weight_dequant)
     * or the bf16 value itself.  bs % 16 == 0; NaN codes give NaN. */
    void (*fp8w_axpy)(const uint8_t *w, const float *scale, size_t bs, size_t n, float a,
                      float *acc);                       /* acc[i] += a * w(i) */
    float (*fp8w_dot)(const uint8_t *w, const float *scale, size_t bs, size_t n,
                      const float *x);                   /* sum_i w(i) * x[i]  */
    /* fp8w_axpy of rows 0..3 in that order, one pass over acc: the same
     * bits as four fp8w_axpy calls (each element sees the same chain).
     * finite != 0 promises no NaN code in the four rows (the weight's
     * dsattn_weight.finite); the SIMD form then decodes 2 vectors of codes a
     * step (32 on AVX-512, 16 on AVX2, 8 on NEON) without the NaN compare -
     * same bits (NaN sign and payload, as everywhere, not part of that). */
    void (*fp8w_axpy4)(const uint8_t *const *w, const float *const *scale, size_t bs, size_t n,
                       const float *a, float *acc, int finite);
    /* out[k] = fp8w_dot(w[k], scale[k], ...) for rows 0..3, bit for bit,
     * with the x loads shared; finite as for fp8w_axpy4 */
    void (*fp8w_dot4)(const uint8_t *const *w, const float *const *scale, size_t bs, size_t n,
                      const float *x, float *out, int finite);
    void (*bf16w_axpy)(const uint16_t *w, size_t n, float a, float *acc);
    /* x[i] = bf16(x[i]), the RNE rounding of dsattn_round_bf16 (NaN kept) */
    void (*round_bf16)(float *x, size_t n);
    /* The V3.2 indexer's head sum: out[j] = sum_h relu(c[j*ldc + h]) * w[h],
     * h < nh, j < nk, in fp32 (ref: h in order; avx512/avx2/neon: 16/8/4 heads
     * per lane, lanes added at the end) */
    void (*relu_wsum)(const float *c, size_t ldc, size_t nk, const float *w, size_t nh,
                      float *out);
} dsattn_mla_kern;

extern const dsattn_mla_kern dsattn_mla_kern_ref;
/* NULL when the build has no such path (absent.c, or the compiler's) */
extern const dsattn_mla_kern *const dsattn_mla_kern_avx2_ptr;
extern const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr;
extern const dsattn_mla_kern *const dsattn_mla_kern_neon_ptr;

/* Pack q [H rows of ldq floats, D used] into groups (see qk): hp heads,
 * rows h >= H zero.  qp has hp * D floats. */
void dsattn_mla_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D, float *qp);

#endif /* DSATTN_MLA_KERNELS_H */
