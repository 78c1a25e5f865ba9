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
 * of docs/reference-mode.md (exact products, double accumulation, one rounding,
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
 * power-of-two scales.  V3.2: block 128, ue8m0 (a V3.2 config without
 * scale_fmt ue8m0: amax * fp32(1/448)).  V3 (gemm_impl "bf16") quantizes no
 * activation; AMAX_DIV, the V3 triton act_quant's amax / 448, is there for
 * callers of dsattn_linear. */
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

/* A grouped (block-diagonal) Linear: W's rows are G equal groups, group g
 * maps x[t, g*gx .. +W->cols) to y[t, g*(rows/G) ..).  The same sums as G
 * dsattn_linear calls on the row blocks (no activation quantization: the
 * V4/V4.1 wo_a einsum), but a decode call streams W as ONE matrix in one
 * parallel region instead of G small ones.  FP8: rows/G a multiple of the
 * block. */
dsattn_status dsattn_linear_grouped(dsattn_ctx *ctx, const dsattn_weight *W, size_t G,
                                    const float *x, size_t ldx, size_t gx, size_t n_tok,
                                    float *y, size_t ldy, dsattn_out_round round);

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
 * kv, z: [r, D] (slot-major); any r >= 1 (V4 HCA pools 128).  -inf scores
 * give weight 0 (V4's empty first overlap window).  The caller adds any
 * positional bias to z first and casts / normalises the result afterwards. */
void dsattn_softmax_pool(const float *kv, const float *z, size_t r, size_t D,
                         float *out);

/* The Compressor's pooling state machine after its fp32 projections, one
 * function for V4 (CSA overlap, HCA, learned APE) and V4.1 (ratio >= 2, no
 * APE, no overlap) - Compressor.forward of both references:
 *   kv, z: [s, C] fp32 projections wkv(x), wgate(x) of this chunk, with
 *     C = 2d when overlap (channels [:d] feed the NEXT entry's overlap
 *     slots, [d:] this entry), else C = d.
 *   ape: [ratio, C] added to every score (z + ape[token % ratio]), or NULL.
 *   state_kv / state_z: [coff*ratio, C] per-sequence state (coff = 1 +
 *     overlap), initialised by dsattn_compressor_state_init (kv 0, z -inf)
 *     and never cleared: rows [0, ratio) hold the previous complete window
 *     (overlap), rows [coff-1)*ratio + slot the current window's tokens.
 *   prefill (start_pos 0, any s): pools every complete group j < s/ratio;
 *     entry j softmax-pools over ratio slots (non-overlap) or 2*ratio slots
 *     (overlap: channels [:d] of window j-1's tokens - kv 0 / score -inf for
 *     j = 0 - then channels [d:] of window j's); the remainder (and, with
 *     overlap, the last complete window) goes to the state.
 *   decode (s == 1): the token fills its slot; when (start_pos+1) % ratio
 *     == 0 the state pools one entry and (overlap) shifts rows [ratio, 2r)
 *     to [0, ratio).
 * out: [n, d] pooled fp32 values (the caller casts to bf16 and normalises).
 * Returns n: s / ratio in prefill, 0 or 1 in decode.  scratch:
 * dsattn_compressor_scratch(ratio, d) floats. */
size_t dsattn_compressor_scratch(size_t ratio, size_t d);
void   dsattn_compressor_state_init(float *state_kv, float *state_z, size_t ratio,
                                    size_t d, int overlap);
size_t dsattn_compressor_pool(const float *kv, const float *z, size_t s, size_t d,
                              size_t ratio, int overlap, const float *ape,
                              float *state_kv, float *state_z, int64_t start_pos,
                              int prefill, float *out, float *scratch);

/* ==== Hadamard (V3.2 / V4 indexer rotate_activation) ==================== */

/* y = the first n entries of H_p [x; 0] * scale, p the smallest power of
 * two >= n and H_p the Sylvester Hadamard matrix (fast_hadamard_transform,
 * which pads x with zeros to p and returns the first n): sums of +-x exact
 * in double, times scale, rounded once to fp32 (and to bf16 if round ==
 * BF16).  n <= DSATTN_HADAMARD_MAX; y may be x. */
#define DSATTN_HADAMARD_MAX 512
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
/* dsattn_topk on up to `threads` OpenMP threads: contiguous parts of at
 * least 64K entries keep their own k best, one more heap takes the k best
 * of their union.  The same indices in the same order as dsattn_topk.
 * scratch: dsattn_topk_par_scratch(n, k, threads) bytes (int32-aligned). */
size_t dsattn_topk_par_scratch(size_t n, size_t k, int threads);
void dsattn_topk_par(const float *score, size_t n, size_t k, int threads, int32_t *idx_out,
                     void *scratch);
/* The same k indices as dsattn_topk, in ascending index order (quickselect;
 * a heap past 2 log2 n rounds).  scratch: dsattn_topk_set_scratch(n) bytes
 * (int32-aligned). */
size_t dsattn_topk_set_scratch(size_t n);
void dsattn_topk_set(const float *score, size_t n, size_t k, int32_t *idx_out, void *scratch);
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
 * slots > start_pos are -1; width w (V4.1). */
void dsattn_window_idx_decode(size_t w, int64_t start_pos, int32_t *row);
/* The same row with its -1 entries moved to the end (the valid slots keep
 * their order): V4's get_window_topk_idxs, whose early decode rows are
 * [0..start_pos, -1 ...].  V4's sparse_attn starts its running max at -inf,
 * so a leading block of 64 invalid slots would turn the row into NaN. */
void dsattn_window_idx_decode_valid_first(size_t w, int64_t start_pos, int32_t *row);

/* ==== Attention building blocks shared by V4 and V4.1 =================== */
/* The low-rank query, the sliding-window KV projection, the grouped output
 * projection and the index queries of V4 / V4.1 Attention.forward,
 * identical in both references except where a flag of the layer says.
 * Every input row holds bf16 values, every output row too.
 *
 * Two small structs carry the arguments, so that no size can be swapped
 * with another silently: what is the same for every call of a layer
 * (dsattn_attn_layer, built once when the model's weights are bound) and
 * the rows of one call (dsattn_attn_rows: how many, at which positions,
 * the scratch).  The data buffers are the remaining, named arguments. */

typedef struct {
    const dsattn_weight *wq_a, *wq_b;     /* [QL, dim], [H*D, QL]              */
    const dsattn_weight *wkv;             /* [D, dim]                          */
    const dsattn_weight *wo_a, *wo_b;     /* [G*R, H*D/G], [dim, G*R]          */
    const float         *q_norm, *kv_norm; /* [QL], [D]                        */
    const dsattn_rope   *rope;            /* the layer's table                 */
    size_t               H, D, rd;        /* heads, head_dim, rope_head_dim    */
    size_t               G, R;            /* o_groups, o_lora_rank             */
    float                eps;             /* norm_eps                          */
    int                  head_rms;        /* V4: q_h *= rsqrt(mean(q_h^2)+eps) */
    dsattn_actq          aq;              /* FP8 Linears' activation quant:
                                           * block 32 in V4.1, 128 in V4       */
    const dsattn_weight *i_wq_b;          /* index layers: [Hi*Di, QL]         */
    size_t               Hi, Di;          /* index heads, index head_dim       */
    int                  hadamard;        /* V4: Hadamard on index queries     */
} dsattn_attn_layer;

typedef struct {
    size_t         n;                     /* rows                              */
    const int64_t *pos;                   /* row t at pos[t] (a batch of
                                           * sequences); NULL: start_pos + t   */
    int64_t        start_pos;
    float         *aqs;                   /* dsattn_attn_aq_scratch(n, widest
                                           * input) floats                     */
} dsattn_attn_rows;

/* Row t's position: pos[t] for a batch of sequences, start_pos + t for a
 * chunk of one. */
static inline int64_t dsattn_attn_row_pos(const dsattn_attn_rows *r, size_t t)
{
    return r->pos ? r->pos[t] : r->start_pos + (int64_t)t;
}

/* Floats of activation-quantization scratch for the widest input. */
size_t dsattn_attn_aq_scratch(size_t s, size_t max_cols);

/* qr = q_norm(wq_a x) [n, QL]; q = wq_b qr [n, H*D]; head_rms (V4 only):
 * q_h *= rsqrt(mean(q_h^2) + eps) per head, unweighted, in bf16 as the
 * reference's bf16 tensors compute it; then RoPE (interleaved) on each
 * head's last rd dims.  x: [n, dim].  q NULL: qr only. */
dsattn_status dsattn_attn_query(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                const dsattn_attn_rows *r, const float *x, float *qr,
                                float *q);
/* The second half alone: q [n, H*D] from qr [n, QL] for the rows r (their
 * positions for RoPE) - a chunk's heads a block of rows at a time. */
dsattn_status dsattn_attn_query_heads(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                      const dsattn_attn_rows *r, const float *qr, float *q);

/* kv = kv_norm(wkv x) [n, D], RoPE on the last rd dims: the window KV before
 * the generation's quantization (FP8 over all D in V4.1, over the nope dims
 * in V4). */
dsattn_status dsattn_attn_window_kv(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                    const dsattn_attn_rows *r, const float *x, float *kv);

/* The attention output: inverse RoPE at the query position on each head's
 * last rd dims of o [n, H*D] (in place), then o viewed as G groups of
 * H*D/G, group g times wo_a rows [g*R, (g+1)*R) (bf16 einsum, block
 * diagonal) -> oa [n, G*R], then out = wo_b oa [n, dim]. */
dsattn_status dsattn_attn_output(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                 const dsattn_attn_rows *r, float *o, float *oa, float *out);

/* Index queries: q = i_wq_b(qr) [n, Hi*Di] -> RoPE on each head's last rd
 * dims -> (V4: Hadamard over the head's Di dims, scale Di^-0.5, bf16) ->
 * FP4 QDQ (block 32, UE8M0). */
dsattn_status dsattn_index_query(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                 const dsattn_attn_rows *r, const float *qr, float *q);

/* Head weights w [s, Hi] = bf16(weights_proj(x) * fp32(Di^-0.5 * Hi^-0.5)). */
dsattn_status dsattn_index_weights(dsattn_ctx *ctx, const dsattn_weight *wproj,
                                   const float *x, size_t s, size_t Hi, size_t Di,
                                   float *w);

/* ==== The golden cases' stand-in block =================================== */

/* h_{l+1} = h_l + attn_l(bf16(RMSNorm_l(h_l))) over n_layers layers, with an
 * fp32 residual and no FFN (docs/semantics.md §1): every generation's
 * *_stack_forward is this loop around its own layer call.  norm(seq, l)
 * returns layer l's attn_norm weight; attn_in / attn_out (optional) receive
 * [n_layers, n, dim].  The caller advances its sequence afterwards.  The
 * normalised input and the layer output ([n, dim] each) come from ws (the
 * sequence's decode scratch: 2 * dim floats per token). */
typedef dsattn_status (*dsattn_layer_fn)(dsattn_ctx *ctx, void *seq, int layer,
                                         const float *x, size_t n, float *out);
typedef const float *(*dsattn_norm_fn)(const void *seq, int layer);
dsattn_status dsattn_standin_stack(dsattn_ctx *ctx, void *seq, dsattn_layer_fn layer,
                                   dsattn_norm_fn norm, size_t n_layers, size_t dim,
                                   float eps, float *h, size_t n, float *attn_in,
                                   float *attn_out, dsattn_ws *ws);
/* The same loop with the caller's buffers xin, xout [n, dim] (the batched
 * steps: their B rows, one of each sequence, in the context's batch
 * scratch; `seq` is whatever the layer and norm functions read). */
dsattn_status dsattn_standin_rows(dsattn_ctx *ctx, void *seq, dsattn_layer_fn layer,
                                  dsattn_norm_fn norm, size_t n_layers, size_t dim, float eps,
                                  float *h, size_t n, float *xin, float *xout, float *attn_in,
                                  float *attn_out);

#endif /* DSATTN_OPS_H */
