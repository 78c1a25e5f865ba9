/* ops.h - the shared operators of every generation, written once.
 *
 * Linear layers (bf16 / fp32 / FP8 block-scaled / FP4 weights, with the
 * reference's activation quantization before FP8 GEMMs), RMSNorm, RoPE with
 * the YaRN table, the sparse attention kernel with sink (V4 / V4.1), the
 * lightning-indexer score, top-k with the lower-index tie rule, and the
 * window index rows.
 *
 * Numbers: activations are float arrays that hold bf16 values wherever the
 * reference holds a bf16 tensor ("bf16 semantics"); each op says where it
 * rounds.  In DSATTN_MODE_REFERENCE every op follows the arithmetic contract
 * of golden-cases.md §4 (exact products, double accumulation, one rounding,
 * no FMA contraction, lower index wins ties) and is bit-reproducible; in
 * DSATTN_MODE_FAST the same op runs SIMD kernels with fp32 accumulation and
 * OpenMP threads, tested against the reference.
 */
#ifndef DSATTN_OPS_H
#define DSATTN_OPS_H

#include "internal.h"
#include "weights.h"

#include <stddef.h>
#include <stdint.h>

/* ==== Linear ============================================================ */

/* How a Linear treats its input before an FP8 GEMM (the reference's
 * act_quant inside linear()).  V4/V4.1: block 32 (V4.1) or 128 (V4), UE8M0
 * power-of-two scales.  V3.2: block 128, ue8m0.  V3: block 128, s = amax/448. */
typedef enum {
    DSATTN_ACTQ_POW2      = 0,   /* s = 2^ceil(log2(amax/448))               */
    DSATTN_ACTQ_AMAX_MUL  = 1,   /* s = amax * fp32(1/448)                   */
    DSATTN_ACTQ_AMAX_DIV  = 2,   /* s = amax / 448 (V3 triton kernel)        */
} dsattn_actq_scale;

typedef struct {
    size_t            block;     /* activation block along k (32 or 128)     */
    dsattn_actq_scale scale;
} dsattn_actq;

typedef enum {
    DSATTN_OUT_BF16 = 0,         /* round the fp32 result to bf16            */
    DSATTN_OUT_F32  = 1,         /* keep fp32 (fp32 compute paths)           */
} dsattn_out_round;

/* y[t, r] = sum_i W[r, i] * x[t, i] for t < n_tok, r < W->rows.
 * x: [n_tok, ldx] (W->cols used), y: [n_tok, ldy].  FP8/FP4 weights first
 * quantize each x row with `aq` (ignored for F32/BF16 weights).
 * scratch: n_tok * W->cols floats (the quantized activations); may be NULL
 * for F32/BF16 weights. */
dsattn_status dsattn_linear(dsattn_ctx *ctx, const dsattn_weight *W,
                            const float *x, size_t ldx, size_t n_tok,
                            float *y, size_t ldy, dsattn_out_round round,
                            const dsattn_actq *aq, float *scratch);

/* Round n floats to bf16 in place. */
void dsattn_round_bf16_n(float *x, size_t n);

/* ==== Norms ============================================================= */

/* RMSNorm (V3/V4/V4.1 RMSNorm.forward):
 *   var = fp32(sum x^2) / n;  r = fp32(1/sqrt(var + eps));  y = w * (x * r)
 * each step one fp32 operation; y rounded to bf16 if round == BF16.
 * w: n weights (bf16 values stored as float), or NULL for none. */
void dsattn_rmsnorm(const float *x, const float *w, size_t n, float eps,
                    float *y, dsattn_out_round round);

/* LayerNorm (V3.2 indexer k_norm, F.layer_norm on fp32): mean, biased
 * variance, (x - mean) * rsqrt(var + eps) * w + b; rounded as requested. */
void dsattn_layernorm(const float *x, const float *w, const float *b, size_t n,
                      float eps, float *y, dsattn_out_round round);

/* ==== RoPE ============================================================== */

/* Frequencies of one RoPE table (V3 precompute_freqs_cis / V4 / V4.1):
 *   freqs[i] = 1 / base^(2i/dim)   (fp32 ops)
 * with YaRN when original_seq_len > 0 (and, for V3, only when the caller
 * decided it applies):  low = max(floor(cd(beta_fast)), 0),
 * high = min(ceil(cd(beta_slow)), dim - 1), ramp clamp((i-low)/max(high-low,
 * 1e-3), 0, 1), smooth = 1 - ramp, freqs = freqs/factor*(1-smooth) +
 * freqs*smooth.  V3's linear_ramp_factor uses (high-low) with +0.001 when
 * equal; the two agree except when low == high. */
typedef struct {
    size_t dim;                  /* rope dims (pairs = dim/2), <= 128         */
    float  freqs[64];
} dsattn_rope;

void dsattn_rope_init(dsattn_rope *r, size_t dim, double base, int yarn,
                      double original_seq_len, double factor, double beta_fast,
                      double beta_slow);

/* cos/sin of fp32(pos) * freqs[i], evaluated in double, rounded to fp32. */
void dsattn_rope_cs(const dsattn_rope *r, int64_t pos, float *cos_out,
                    float *sin_out);

/* Rotate x[0..dim) in place at the given cos/sin: interleaved pairs
 * (x[2i], x[2i+1]) or half-split pairs (x[i], x[i+dim/2]).  inverse uses
 * the conjugate.  Result rounded to bf16 if round == BF16. */
void dsattn_rope_apply(float *x, size_t dim, const float *c, const float *s,
                       int interleaved, int inverse, dsattn_out_round round);

/* ==== Packed KV sources for sparse attention ============================ */

typedef enum {
    DSATTN_KV_F32     = 0,       /* float rows [n, d]                        */
    DSATTN_KV_V41_SWA = 1,       /* E4M3 + UE8M0/32 rows (528 B at 512)      */
    DSATTN_KV_V41_FP4 = 2,       /* E2M1 + E4M3/16 rows (288 B at 512)       */
    DSATTN_KV_V4      = 3,       /* MODEL1: nope E4M3 | rope bf16 | UE8M0/64 */
    DSATTN_KV_FP4_IDX = 4,       /* E2M1 + UE8M0/32 index keys (68 B at 128) */
} dsattn_kv_kind;

typedef struct {
    dsattn_kv_kind kind;
    const void    *base;         /* row 0                                    */
    size_t         stride;       /* bytes between rows                       */
    size_t         n_rows;
    size_t         d;            /* values per row                           */
    size_t         d_rope;       /* V4 only: trailing bf16 dims              */
} dsattn_kv_src;

/* Dequantize row `row` of src into out[d]. */
void dsattn_kv_row(const dsattn_kv_src *src, size_t row, float *out);

/* ==== Sparse attention (V4 / V4.1 sparse_attn kernel) =================== */

/* One query token, all heads.  Index j of idx[] addresses the
 * concatenation [src0 rows ; src1 rows] (src1 may be NULL); -1 is skipped.
 *   s = scale * q_h . kv  (invalid: -inf); running max from max_init
 *   (-1e30 V4.1, -INFINITY V4); blocks of 64 in index order; P rounded to
 *   bf16 for P.V, fp32 denominator; sum += exp(sink_h - max); o = bf16(acc/sum).
 * q: [nh, d] (bf16 values), out: [nh, d].  sink may be NULL (no sink).
 * scratch: dsattn_sparse_attn_scratch(nh, d) floats. */
size_t dsattn_sparse_attn_scratch(size_t nh, size_t d);
void dsattn_sparse_attn(dsattn_ctx *ctx, const float *q, size_t nh, size_t d,
                        const dsattn_kv_src *src0, const dsattn_kv_src *src1,
                        const int32_t *idx, size_t n_idx, const float *sink,
                        float scale, float max_init, float *out, float *scratch);

/* ==== Lightning indexer score (V3.2 style weights, V4 / V4.1 bf16) ====== */

/* score[j] = bf16( sum_h bf16( relu(bf16(q_h . k_j)) * w_h ) ), the head sum
 * accumulated in double and rounded once to fp32 then bf16 (V4 / V4.1
 * Indexer.forward in bf16).  q: [nh, dh] (QDQ'd, bf16 values), w: [nh]
 * (already scaled, bf16 values), keys: rows [j0, j0+n) of ksrc. */
void dsattn_index_scores_bf16(dsattn_ctx *ctx, const float *q, size_t nh,
                              size_t dh, const float *w,
                              const dsattn_kv_src *ksrc, size_t j0, size_t n,
                              float *score);

/* Same, but only at the listed key rows (rows[i] < ksrc->n_rows): used when
 * a layer scores a candidate pool instead of the whole cache. */
void dsattn_index_scores_bf16_at(dsattn_ctx *ctx, const float *q, size_t nh,
                                 size_t dh, const float *w,
                                 const dsattn_kv_src *ksrc,
                                 const int32_t *rows, size_t n, float *score);

/* ==== Compressor pooling (V4 / V4.1 Compressor) ======================= */

/* Softmax-gated pooling of r slots per channel, in fp32:
 *   e_i = exp(z_i - max_i z), p_i = e_i / sum_i e_i, out = sum_i fp32(kv_i*p_i)
 * kv, z: [r, D] (slot-major); r <= 64.  -inf scores give weight 0 (V4's
 * empty first overlap window).  The caller adds any positional bias to z
 * first and casts / normalises the result afterwards. */
void dsattn_softmax_pool(const float *kv, const float *z, size_t r, size_t D,
                         float *out);

/* ==== Hadamard (V3.2 / V4 indexer rotate_activation) ==================== */

/* y = H_n x * scale for n a power of two <= 256, H the Sylvester Hadamard
 * matrix (fast_hadamard_transform): sums of +-x exact in double, times
 * scale, rounded once to fp32 (and to bf16 if round == BF16). */
void dsattn_hadamard(const float *x, size_t n, float scale, float *y,
                     dsattn_out_round round);

/* ==== Top-k ============================================================= */

/* The k largest of score[0..n) (k <= n): higher score first, ties broken by
 * the lower index; -inf entries are selectable (as torch.topk), NaN sorts
 * above everything.  idx_out[k] in descending score order.  The fast path
 * (k << n) keeps a k-heap and yields the same set and order.
 * scratch: dsattn_topk_scratch(n, k) bytes. */
size_t dsattn_topk_scratch(size_t n, size_t k);
void dsattn_topk(const float *score, size_t n, size_t k, int32_t *idx_out,
                 void *scratch);
/* The same by a full sort of all n keys: the readable statement of the rule
 * (tests compare the two).  Allocates; not for hot paths. */
void dsattn_topk_ref(const float *score, size_t n, size_t k, int32_t *idx_out);

/* Sort n int32 ascending with -1 entries moved to the end. */
void dsattn_sort_idx_valid_first(int32_t *v, size_t n);

/* ==== Window index rows (V4 / V4.1 get_window_topk_idxs) ================ */

/* Prefill row t of a chunk of s tokens (window w): positions
 * max(0,t-w+1)..t, then -1 while t < w-1; width min(s, w). */
void dsattn_window_idx_prefill(size_t w, size_t s, size_t t, int32_t *row);
/* Decode at start_pos: ring slots oldest first ((pos%w)+1 .. w-1, 0 .. pos%w),
 * slots > start_pos are -1; width w. */
void dsattn_window_idx_decode(size_t w, int64_t start_pos, int32_t *row);

#endif /* DSATTN_OPS_H */
