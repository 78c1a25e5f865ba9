/* kernels.h - the ISA-dispatched kernel table.
 *
 * Algorithm code (src/ops, src/attn) never contains ISA ifdefs; it calls
 * through a dsattn_kernels table chosen once per context (the `k` slot of
 * the context's table of tables, ktab.h).  The `ref` table
 * (kernels_ref.c) is the scalar reference of every entry and is never
 * deleted: it follows the arithmetic contract of the golden cases - every
 * product formed exactly, accumulated in double, rounded ONCE to fp32 - so a
 * context in DSATTN_MODE_REFERENCE is bit-reproducible.  The AVX2, AVX-512
 * and NEON tables accumulate in fp32 in their own order and are tested
 * against `ref` (tests/test_kernels.c) with stated relative bounds.
 *
 * Shapes: W is row-major [rows, k] (torch Linear layout [out, in]); x is [k];
 * y is [rows].  Everything is unaligned-safe; k and rows may be any size
 * (tails are handled inside each kernel).
 */
#ifndef DSATTN_KERNELS_H
#define DSATTN_KERNELS_H

#include "cpu.h"          /* the probes the tables are chosen by */

#include <stddef.h>
#include <stdint.h>

typedef struct dsattn_kernels {
    const char *name;                   /* "ref", "avx2", "avx512", "neon" */

    /* y[r] = sum_i W[r*k + i] * x[i], r < rows */
    void (*gemv_f32)(const float *W, const float *x, float *y,
                     size_t rows, size_t k);
    void (*gemv_bf16)(const uint16_t *W, const float *x, float *y,
                      size_t rows, size_t k);
    /* FP8 E4M3 weights with one fp32 scale per bs x bs block.  `scale` points
     * at the scale row of weight row 0 of this call (the caller passes
     * W + r0*k and scale + (r0/bs)*ldsc with r0 a multiple of bs), ldsc =
     * ceil(k/bs) scales per scale row. */
    void (*gemv_fp8)(const uint8_t *W, const float *scale, size_t bs,
                     size_t ldsc, const float *x, float *y,
                     size_t rows, size_t k);
    /* FP4 E2M1 weights, packed two per byte (even element in the low nibble),
     * k/2 bytes per row; one UE8M0 byte per 32 values along k (k/32 per
     * row).  k must be a multiple of 32. */
    void (*gemv_fp4)(const uint8_t *W, const uint8_t *scale, const float *x,
                     float *y, size_t rows, size_t k);

    /* dot of two fp32 vectors */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    /* out[h] = q[h*ldq .. +n] . v  for h < nh: several heads sharing one
     * key row (the key is loaded once) */
    void (*mdot_f32)(const float *q, size_t ldq, size_t nh, const float *v,
                     size_t n, float *out);

    /* ==== Attention fast paths over packed cache rows ===================
     * Row layouts are numfmt.h's (payload, then scales; 4-bit codes: even
     * element in the low nibble).  The dequant entries are bit-exact to
     * numfmt.c's unpack functions on every input, NaN codes included; the
     * fused mdot/maxpy entries equal "dequant the row, then mdot_f32 /
     * maxpy_f32" (ref) up to fp32 accumulation order (fast). */

    /* acc[h*ldacc + i] += p[h] * v[i], i < n, h < nh.  ref: each element
     * fp32(acc + p*v) with the product exact (one rounding). */
    void (*maxpy_f32)(const float *p, size_t nh, const float *v, size_t n,
                      float *acc, size_t ldacc);

    /* V4.1 main KV row (dsattn_v41_kv_unpack): d/2 E2M1 bytes, then d/16
     * E4M3 scales, one per 16 values.  d % 16 == 0.  288 B at d = 512. */
    void (*dequant_fp4e4m3_row)(const uint8_t *row, size_t d, float *out);
    /* V4.1 SWA window row (dsattn_v41_swa_unpack): d E4M3 codes, then d/32
     * UE8M0 scales.  d % 32 == 0.  528 B at d = 512. */
    void (*dequant_fp8ue8m0_row)(const uint8_t *row, size_t d, float *out);
    /* Index-K row (dsattn_fp4_index_unpack): d/2 E2M1 bytes, then d/32
     * UE8M0 scales.  d % 32 == 0.  68 B at d = 128. */
    void (*dequant_fp4ue8m0_row)(const uint8_t *row, size_t d, float *out);

    /* out[h] = q[h*ldq .. +d] . deq(row) for h < nh: every head that shares
     * the packed row reads it once (MQA/MLA-style attention scores). */
    void (*mdot_fp4e4m3)(const float *q, size_t ldq, size_t nh,
                         const uint8_t *row, size_t d, float *out);
    /* Many rows per call: out[r*ldo + h] = q_h . deq(rows[r]), r < nr.
     * The per-row entry reloads all of q (nh*d floats; 128 KB for 64 heads
     * at d = 512, more than L1) for every row; the AVX-512 form of this one
     * decodes up to 8 rows at once and uses each loaded q vector for all of
     * them (the AVX2 and NEON forms run row after row).  rows[]
     * may point anywhere (gathered top-k rows). */
    void (*mdot_fp4e4m3_rows)(const float *q, size_t ldq, size_t nh,
                              const uint8_t *const *rows, size_t nr, size_t d,
                              float *out, size_t ldo);
    /* acc[h*ldacc + i] += p[h] * deq(row)[i]: the matching P.V update. */
    void (*maxpy_fp4e4m3)(const float *p, size_t nh, const uint8_t *row,
                          size_t d, float *acc, size_t ldacc);
    /* The P.V update of a block of rows:
     *   acc[h*ldacc + i] += sum_r p[h*ldp + r] * deq(rows[r])[i],  r < nr.
     * ref rounds once per element (double sum of acc and all products);
     * the AVX-512 form reads and writes each acc element once per 8 rows
     * instead of once per row (64 heads x 512 floats of acc do not fit L1);
     * the AVX2 and NEON forms run row after row. */
    void (*maxpy_fp4e4m3_rows)(const float *p, size_t ldp, size_t nh,
                               const uint8_t *const *rows, size_t nr, size_t d,
                               float *acc, size_t ldacc);
    /* Index heads against one FP4 index-K row (lightning indexer dots). */
    void (*mdot_fp4ue8m0)(const float *q, size_t ldq, size_t nh,
                          const uint8_t *row, size_t d, float *out);
    /* The same pair over SWA window rows. */
    void (*mdot_fp8ue8m0)(const float *q, size_t ldq, size_t nh,
                          const uint8_t *row, size_t d, float *out);
    void (*maxpy_fp8ue8m0)(const float *p, size_t nh, const uint8_t *row,
                           size_t d, float *acc, size_t ldacc);

    /* ==== bf16 cache rows (MHA / GQA caches, MLA latent cache) ========== */

    /* out[i] = the fp32 value of bf16 bits src[i], i < n.  Exact on every
     * path (a 16-bit shift), NaN payloads included. */
    void (*cvt_bf16_f32)(const uint16_t *src, size_t n, float *out);
    /* Several heads against several bf16 rows:
     *   out[r*ldo + h] = sum_i q[h*ldq + i] * bf16(rows[r*ldr + i]),
     * i < k, h < nh, r < nr.  Every row is decoded once for all nh heads
     * (GQA: the G query heads of a KV head; the P.V pass over the
     * block-transposed V uses it too, "rows" = channels, k = tokens).
     * ref: exact products, double sum, one rounding; fast: fp32 FMA,
     * register tiles of heads x rows reduced together. */
    void (*mdot_bf16_rows)(const float *q, size_t ldq, size_t nh,
                           const uint16_t *rows, size_t ldr, size_t nr,
                           size_t k, float *out, size_t ldo);

    /* gemv_fp8 for weights known to hold no E4M3 NaN code (0x7f / 0xff) -
     * checked by the loader, impossible in generated weights.  On such
     * weights its results equal gemv_fp8's bit for bit; it only skips the
     * per-byte NaN tracking that makes a NaN weight give a NaN output. */
    void (*gemv_fp8_finite)(const uint8_t *W, const float *scale, size_t bs,
                            size_t ldsc, const float *x, float *y,
                            size_t rows, size_t k);

    /* gemv_fp8 (finite: gemv_fp8_finite) against an x prepared once for
     * several calls - the ops layer's row chunks of one Linear, every one a
     * call against the same x.  fp8_prep_x(x, k, px) fills
     * px[DSATTN_FP8_PX_FLOATS(k)] (32-byte aligned); gemv_fp8_px with that
     * px and the same x then has gemv_fp8's (gemv_fp8_finite's) bits.  What
     * it saves is the table's per-call work on x (the AVX2 exponent-shift
     * table: arranging x and taking its group maxima, once per call of
     * 64-256 rows otherwise).  NULL in the tables without such work. */
    void (*fp8_prep_x)(const float *x, size_t k, float *px);
    void (*gemv_fp8_px)(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                        const float *x, const float *px, float *y, size_t rows, size_t k,
                        int finite);

    /* gemv_fp8 of m tokens at once (a batched decode step):
     *   y[t*ldy + r] = gemv_fp8 of x + t*ldx, row r, t < m, r < rows,
     * with gemv_fp8_finite's contract when finite != 0.  Each weight block is
     * decoded once for all m tokens: fp32 FMA in the table's own order,
     * tested against m calls of the ref gemv_fp8 with gemv_fp8's bound -
     * except the AVX2 table's tiled form (12+ tokens, finite codes, blocks
     * a multiple of 32), whose outputs are each one FMA chain over all of
     * k: its bound counts k additions.
     * NULL in the ref table: the caller loops gemv_fp8 over the tokens (and
     * a fast context without it takes the panel + sgemm path for 8+
     * tokens). */
    void (*gemv_fp8_m)(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                       const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                       size_t rows, size_t k, int finite);

    /* gemv_bf16 of m tokens at once (a batched decode step over bf16
     * weights: MHA / GQA, V3's converted projections):
     *   y[t*ldy + r] = W row r . (x + t*ldx), t < m, r < rows,
     * each weight vector widened once for every token; fp32 FMA in the
     * table's own order, tested against m calls of the ref gemv_bf16 with
     * gemv_bf16's bound.  NULL (ref): the caller loops gemv_bf16. */
    void (*gemv_bf16_m)(const uint16_t *W, const float *x, size_t ldx, size_t m, float *y,
                        size_t ldy, size_t rows, size_t k);

    /* Activation quantization before an FP8 projection (V3.2 / V4 / V4.1
     * act_quant with UE8M0 scales): deq = the deq output of numfmt.c's
     * dsattn_quant_fp8_ue8m0(x, n, block, ...), bit for bit on every path,
     * NaN positions included (as NaN).  n a multiple of block. */
    void (*act_quant_fp8_pow2)(const float *x, size_t n, size_t block, float *deq);
} dsattn_kernels;

/* The floats of a prepared FP8 GEMV x of k elements (fp8_prep_x): x in
 * 32-element groups rearranged, then one maximum per group. */
#define DSATTN_FP8_PX_FLOATS(k) (((k) + 31) / 32 * 32 + ((k) + 31) / 32)

/* The packed row formats of the entries above, as the tables' row loops
 * (dequant_range, mdot_row, maxpy_row in each kernels_*.c) take them:
 * FP4 E2M1 with an E4M3 scale per 16 (V4.1 KV), FP4 with a UE8M0 scale per
 * 32 (index K), FP8 E4M3 with a UE8M0 scale per 32 (V4.1 SWA).
 * kernels_rows_tmpl.h turns each table's loops into its entries. */
enum { DSATTN_ROW_FP4E4M3 = 0, DSATTN_ROW_FP4UE8M0 = 1, DSATTN_ROW_FP8UE8M0 = 2 };

extern const dsattn_kernels dsattn_kernels_ref;
/* The scalar entry, shared by the tables without a SIMD form. */
void dsattn_act_quant_fp8_pow2_ref(const float *x, size_t n, size_t block, float *deq);
/* NULL when the build has no such path (the x86 tables in a non-x86 build,
 * the NEON table in a non-aarch64 build: absent.c). */
extern const dsattn_kernels *const dsattn_kernels_avx2_ptr;
/* The AVX2 and AVX-512 tables with the exponent-shift FP8 GEMV decode
 * (kernels_avx2.c, kernels_avx512.c), for cores whose FMA takes subnormal
 * operands at full rate - which dsattn_avx2_fma_subnormal_full_rate
 * measures once (0 without AVX2; the AVX-512 FMA is the same unit). */
extern const dsattn_kernels *const dsattn_kernels_avx2_expshift_ptr;
int dsattn_avx2_fma_subnormal_full_rate(void);
/* The AVX2 exponent-shift GEMV's planner for blocks of 32 (fp8sh.h's
 * dsattn_fp8sh_plan with sc the pass's scales, one per group: the same
 * results; kernels_avx2.c).  Returns 0 in builds without the AVX2 table. */
int dsattn_avx2_fp8sh_plan32(const float *bm, size_t ng, const float *sc, float *pk,
                             float *unscale);
extern const dsattn_kernels *const dsattn_kernels_avx512_ptr;
extern const dsattn_kernels *const dsattn_kernels_avx512_expshift_ptr;
extern const dsattn_kernels *const dsattn_kernels_neon_ptr;

#endif /* DSATTN_KERNELS_H */
