/* amx_attn.h - products over bf16 rows on AMX-BF16 tiles: the attention
 * blocks of the V3 absorbed MLA decode over its latent cache
 * (src/attn/mla_attend.c) and of the V4.1 / V4 sparse attention over
 * decoded FP8 / FP4 rows (src/ops/sparse_attn.c), and the same score
 * product as a GEMM for the prefill projections (src/ops/linear.c) and the
 * V3.2 indexer's logits (src/attn/mla_indexer.c).  Implemented in
 * amx_attn_avx512.c.
 *
 * Why it may run where the FMA tiles of mla_kernels.h / sa_kernels.h do:
 * every operand is a bf16 number - the bf16 cache, or rows whose packed
 * values are exact in bf16 (callers check), and queries that
 * dsattn_amx_pack_q checks - so each tile product is an exact fp32 product
 * summed in fp32.  P goes to the P.V tile rounded to bf16 (RNE), as the
 * sparse attention's reference does and the MLA reference does with its
 * normalised p.  Only fp32 summation orders differ from the FMA tiles.
 *
 * Shapes: hp heads (a multiple of 32; heads past the real ones have zero
 * queries), rows of D bf16 (a multiple of 32, <= 1024), the first C of
 * them the values (C a multiple of 32, <= D; K and V share the rows).
 *
 * Per block of nk <= DSATTN_AMX_MB keys (block's scores, P^T and V pairs
 * in the caller's scratch, in L2):
 *   S^T [keys, heads] = K . Q^T  (A = 16 rows x 32 dims from the rows,
 *       B = the packed queries, 2 x 2 accumulator tiles per pass);
 *   mk->softmax on S^T (heads in lanes: scale, optional bf16 scores, the
 *       running max / sum in m, l, the rescale factors);
 *   rows of O whose head's max moved are scaled;
 *   O [heads, C] += P . V  (A = P^T in bf16, B = V with pairs of keys
 *       interleaved, rebuilt per block).
 * O is kept as 16 x 16 tiles, 64-byte aligned, zero before the first block:
 *   head h, column c at o[((h / 16) * (C / 16) + c / 16) * 256 + (h % 16) * 16 + c % 16]
 *
 * The caller checks dsattn_cpu_has_amx_bf16() (the context's amx flag),
 * and brackets the blocks of one thread with dsattn_amx_begin / _end
 * (tile configuration and release).
 */
#ifndef DSATTN_AMX_ATTN_H
#define DSATTN_AMX_ATTN_H

#include "mla_kernels.h"

#include <stddef.h>
#include <stdint.h>

#define DSATTN_AMX_MB 256               /* keys per block, a multiple of 32 */

int dsattn_amx_fits(size_t hp, size_t D, size_t C);
/* q rows (H of ldq floats, D used; heads H..hp-1 zero) -> qb (hp * D
 * uint16, 64-byte aligned): tile (g, s) at qb + (g * D/32 + s) * 512, row k,
 * column 2n + e = q[16g + n][32s + 2k + e].  0 when a value is not a bf16
 * number (the caller keeps its FMA path). */
int dsattn_amx_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D, uint16_t *qb);
/* scratch of dsattn_amx_block (any alignment): S^T [MB, hp] f32, P^T
 * [hp, MB] bf16, V pairs [MB, C] bf16, staged keys [32, D] bf16, alpha
 * [hp], alignment.  A size formula, the same on every build (callers size
 * their workspace before they know the context). */
static inline size_t dsattn_amx_ws_bytes(size_t hp, size_t D, size_t C)
{
    return (size_t)DSATTN_AMX_MB * hp * 4 + hp * DSATTN_AMX_MB * 2 + (size_t)DSATTN_AMX_MB * C * 2 +
           32 * D * 2 + hp * 4 + 64;
}
void dsattn_amx_begin(void);
void dsattn_amx_end(void);
/* One block: key i's bf16 row at r[i] (i < nk); r[nk .. 32*ceil(nk/32)) are
 * NULL or point to zero rows (padding: they get P = 0), and the 32 entries
 * after those are the next block's first rows or NULL (prefetched only).  contiguous: row i is at
 * r[0] + i * stride for every i < 32*ceil(nk/32) (tile loads straight from
 * the rows); otherwise the rows are staged.  hot: the caller has just
 * written the rows (decoded), so nothing is prefetched - prefetching lines
 * already in L2, 32 per tile step, doubled the score pass (V4.1 sparse
 * attention: 13.9K -> 7.5K cycles per 64-key block without it). */
void dsattn_amx_block(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                      size_t C, const uint8_t *const *r, size_t nk, size_t stride,
                      int contiguous, int hot, float scale, int bf16_scores, float *m, float *l,
                      float *o, void *ws);

/* The score product alone, as a GEMM for the prefill projections
 * (src/ops/linear.c): c[i*hp + h] = sum_d rows[i][d] * q(h, d) for
 * i < 32 * n32, rows contiguous bf16 [32*n32][D] (D a multiple of 32, no
 * upper limit here), q packed by dsattn_amx_pack_q with hp columns.  The
 * pf_bytes at pf (the caller's next weight rows; may be 0) are prefetched
 * into L2, spread over the tile steps. */
void dsattn_amx_gemm_nt(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows,
                        size_t n32, float *c, const uint8_t *pf, size_t pf_bytes);

/* One FP8 row (K E4M3 codes, one scale per bs columns: scale[c / bs]) ->
 * K bf16 values, e4m3(w) * scale exactly.  bs % 32 == 0, K % 32 == 0.  0
 * when a code is a NaN code (0x7f / 0xff) or a scale is not a power of two
 * with which every product stays a normal bf16 (2^-117 .. 2^119): the
 * caller keeps its FMA path then. */
int dsattn_amx_fp8_row_bf16(const uint8_t *w, const float *scale, size_t bs, size_t K,
                            uint16_t *out);

/* nr fp32 rows (row r at x + r*ldx, d values, d % 16 == 0) -> bf16 rows
 * out + r*d; 0 unless every value is a bf16 number the tiles read as is
 * (no fp32-only mantissa bits, not subnormal: AMX reads those as zero).
 * NaN passes, as on the FMA path. */
int dsattn_amx_rows_bf16(const float *x, size_t ldx, size_t nr, size_t d, uint16_t *out);
/* out[h*C + c] = bf16(O(h, c) / den[h]) for h < nh (dsattn_round_bf16) */
void dsattn_amx_finish(const float *o, size_t C, size_t nh, const float *den, float *out);

/* The ktab slot (ktab.h): the entry points above, for algorithm code. */
typedef struct dsattn_amx_kern {
    const char *name;                                   /* "amx-bf16" */
    int  (*fits)(size_t hp, size_t D, size_t C);
    int  (*pack_q)(const float *q, size_t ldq, size_t H, size_t hp, size_t D, uint16_t *qb);
    void (*begin)(void);
    void (*end)(void);
    void (*block)(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D, size_t C,
                  const uint8_t *const *r, size_t nk, size_t stride, int contiguous, int hot,
                  float scale, int bf16_scores, float *m, float *l, float *o, void *ws);
    void (*gemm_nt)(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows, size_t n32,
                    float *c, const uint8_t *pf, size_t pf_bytes);
    int  (*fp8_row_bf16)(const uint8_t *w, const float *scale, size_t bs, size_t K,
                         uint16_t *out);
    int  (*rows_bf16)(const float *x, size_t ldx, size_t nr, size_t d, uint16_t *out);
    void (*finish)(const float *o, size_t C, size_t nh, const float *den, float *out);
} dsattn_amx_kern;

/* NULL when the build has no AVX-512 path; the context puts it in its
 * table only where dsattn_cpu_has_amx_bf16() */
extern const dsattn_amx_kern *const dsattn_amx_avx512_ptr;
/* The same entry points with every tile product formed by VDPBF16PS in
 * zmm registers ("bf16-dot": the layouts, scratch and arithmetic above;
 * begin / end do nothing): for CPUs with AVX512-BF16 and no AMX.  NULL
 * when the build has no AVX-512 path. */
extern const dsattn_amx_kern *const dsattn_bf16blk_avx512_ptr;

#endif /* DSATTN_AMX_ATTN_H */
