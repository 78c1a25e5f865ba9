/* mla.h - internal layout of the MLA (DeepSeek-V3) and MLA + DSA
 * (DeepSeek-V3.2) attention stacks.
 *
 * The public face is include/dsattn_mla.h; this header holds what the model
 * (mla_model.c), the sequence and layer forward (mla_forward.c), the
 * attention paths (mla_attend.c), the batched step (mla_batch.c), the
 * indexer (mla_indexer.c), the trace backend and the tests share.
 * Vocabulary: H = n_heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim,
 * dv = v_head_dim, KL = kv_lora_rank, QL = q_lora_rank, Hi/Di = index heads
 * and head dim, end = position after the current chunk.
 */
#ifndef DSATTN_MLA_INTERNAL_H
#define DSATTN_MLA_INTERNAL_H

#include "dsattn.h"
#include "internal.h"
#include "numfmt.h"
#include "ops.h"
#include "weights.h"


typedef struct {
    int     dsa;                       /* V3.2: lightning indexer + top-k   */
    int64_t dim, n_layers, n_heads;
    int64_t q_lora_rank;               /* 0: a single wq (V3 allows it)     */
    int64_t kv_lora_rank, nope, rope, v_dim;
    int64_t index_n_heads, index_head_dim, index_topk;
    int64_t max_seq_len;               /* gates YaRN and mscale             */
    double  rope_theta, rope_factor, original_seq_len, beta_fast, beta_slow;
    double  mscale;
    float   eps;                       /* RMSNorm / LayerNorm eps (1e-6)    */
    int     fp8;                       /* config dtype "fp8"                */
    int     ue8m0;                     /* scale_fmt "ue8m0" (power-of-2)    */
    int     yarn;                      /* max_seq_len > original_seq_len    */
    float   softmax_scale;             /* qk_head_dim^-0.5 (* mscale^2)     */
    /* RoPE pairing per path: MLA q/k interleaved (every revision); indexer
     * half-split (the official fix; the stored V3.2-Exp commit 3b99a535
     * used interleaved).  Tests flip these to show a wrong convention is
     * caught by the golden cases. */
    int     rope_il_mla, rope_il_index;
    /* Tests only: V3.2 attends every visible token (indexer still runs and
     * fills its cache), the dense MLA a top-k >= visible must equal. */
    int     force_dense;
} dsattn_mla_config;

typedef struct {
    float         *attn_norm;                 /* [dim]                      */
    dsattn_weight  wq, wq_a, wq_b, wkv_a, wkv_b, wo;
    float         *q_norm, *kv_norm;          /* [QL], [KL]                 */
    dsattn_weight  i_wq_b, i_wk, i_wproj;     /* V3.2 indexer               */
    float         *i_knorm_w, *i_knorm_b;     /* LayerNorm [Di]             */
} dsattn_mla_layer_w;

struct dsattn_mla {
    dsattn_mla_config  cfg;
    int                has_weights;           /* layers [w_first, + w_count) */
    int                w_first, w_count;      /* have their weights bound   */
    dsattn_rope        rope;                  /* one table, every layer     */
    dsattn_actq        actq;                  /* before FP8 GEMMs (V3.2)    */
    int                use_actq;              /* V3 gemm_impl "bf16": none  */
    dsattn_mla_layer_w layer[DSATTN_MAX_LAYERS];
    void              *ckpt;                  /* dsattn_ckpt, if loaded     */
    dsattn_owned        owned;                  /* buffers to free           */
};

typedef struct {
    uint8_t *cache;           /* [cap, row_bytes] MLA rows (format's layout) */
    uint8_t *v;               /* NAIVE: [cap, H*dv] bf16 values              */
    uint8_t *kidx;            /* V3.2: [cap, 132] FP8 index keys             */
    int32_t *sel;             /* V3.2: last chunk's selection [rows, sel_w]  */
    size_t   sel_rows, sel_w, sel_cap;
    int32_t *sel_own;         /* sel's decode-step buffer (dsattn_chunk_rows) */
    size_t   sel_own_cap;
} dsattn_mla_layer_s;

struct dsattn_mla_seq {
    const dsattn_mla   *m;
    dsattn_mla_cache    fmt;
    int64_t             pos;
    size_t              max_seq_len;
    size_t              row_bytes;    /* MLA cache bytes per token per layer */
    size_t              v_bytes;      /* NAIVE V bytes per token per layer   */
    size_t              idx_bytes;    /* 132 at real size, 0 for V3          */
    size_t              kv_bytes;     /* all layers' caches, as allocated    */
    size_t              scratch_bytes;/* ws + selection rows, as allocated   */
    dsattn_ws           ws;           /* decode scratch, sized at creation for
                                       * one token at capacity (mla_ws_bytes):
                                       * no allocation per step               */
    int                 first, count; /* layers held: [first, first + count) */
    dsattn_mla_layer_s  layer[DSATTN_MAX_LAYERS];  /* by model layer; NULL
                                       * caches outside the held range      */
};

/* Whether m has layer l's weights (false for any l outside the model). */
static inline int dsattn_mla_model_holds(const dsattn_mla *m, int64_t l)
{
    return m->has_weights && l >= m->w_first && l < (int64_t)m->w_first + m->w_count;
}

/* Whether s holds layer l's caches (false for any l outside the model). */
static inline int dsattn_mla_seq_holds(const dsattn_mla_seq *s, int64_t l)
{
    return l >= s->first && l < (int64_t)s->first + s->count;
}

/* Whether s holds every layer of its model. */
static inline int dsattn_mla_seq_whole(const dsattn_mla_seq *s)
{
    return s->first == 0 && s->count == s->m->cfg.n_layers;
}

/* Whether a stack may start on s: it holds every layer's caches and its
 * model has every layer's weights or none (a config-only model: the
 * forward then says DSATTN_ERR_UNSUPPORTED, as for any forward). */
static inline int dsattn_mla_seq_stackable(const dsattn_mla_seq *s)
{
    const dsattn_mla *m = s->m;
    return dsattn_mla_seq_whole(s) &&
           (!m->has_weights || (m->w_first == 0 && m->w_count == m->cfg.n_layers));
}

dsattn_status dsattn_mla_config_load(dsattn_mla_config *c, const char *path,
                                     char *err, size_t errlen);

/* Row r of a Linear weight as the reference's weight_dequant gives it:
 * fp32 code*scale rounded to bf16 (exact copy for bf16/f32 weights). */
void dsattn_mla_weight_row_bf16(const dsattn_weight *w, size_t r, float *out);

/* ==== Lightning indexer (mla_indexer.c) ================================ */

/* Index queries and head weights of s tokens (positions start_pos..):
 * qc: [s, Hi, Di] E4M3 code values (fp32), wq: [s, Hi] fp32 weights
 * (weights_proj(x) * Hi^-0.5 * q_scale * Di^-0.5); new keys are packed into
 * kcache rows start_pos.. (132 B).  x: [s, dim], qr: [s, QL].  Scratch
 * from ws (NULL: the heap), s * (Di + max(dim, QL)) + 1 floats. */
dsattn_status dsattn_mla_index_qk(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                  const float *x, const float *qr, size_t s,
                                  int64_t start_pos, float *qc, float *wq,
                                  uint8_t *kcache, dsattn_ws *ws);

/* The same for s rows of different sequences (the batched decode step):
 * row t at position pos[t], its key packed into krow[t] (132 B).  pos NULL:
 * start_pos + t; krow NULL: kcache + position * 132. */
dsattn_status dsattn_mla_index_qk_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                       const float *x, const float *qr, size_t s,
                                       int64_t start_pos, const int64_t *pos,
                                       uint8_t *kcache, uint8_t *const *krow, float *qc,
                                       float *wq, dsattn_ws *ws);

/* fp8_index for one query row over key rows [0, n):
 * score[j] = k_s[j] * sum_h relu(q_h . k_j) * w_h, the head sum in double
 * rounded once (reference), fp32 (fast).  Scratch from ws (NULL: the
 * heap): dsattn_mla_index_scores_ws bytes for a context of n_threads. */
void dsattn_mla_index_scores(dsattn_ctx *ctx, const float *qc, const float *w,
                             size_t Hi, size_t Di, const uint8_t *kcache,
                             size_t n, float *score, dsattn_ws *ws);
/* Scratch bytes index_scores takes from its ws with n_threads threads. */
size_t dsattn_mla_index_scores_ws(size_t Hi, size_t Di, int n_threads);

/* ==== Between the forward, the attention paths and the batched step ==== */

/* A bf16 cache value (little-endian bytes) as fp32. */
static inline float dsattn_mla_get_bf16(const uint8_t *p)
{
    return dsattn_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* Where the expanded keys and values of a query's key set live.  Key j of
 * head h: nope part at kn + j*ldk + h*hsk (dn floats), rope part at
 * kr + j*ldr + h*hsr (dr floats); value at v + j*ldv + h*hsv (dv floats). */
typedef struct {
    const float *kn, *kr, *v;
    size_t ldk, hsk, ldr, hsr, ldv, hsv;
} dsattn_mla_kv_view;

/* The row buffers of a layer step (dsattn_mla_fwd_buf_rows). */
typedef struct {
    float *q, *qa, *kv, *kvb, *o, *xo, *aqs, *qr, *qc, *wq, *score;
} dsattn_mla_fwd_buf;

/* mla_forward.c: the row buffers of n rows, in order from ws (0 when one is
 * missing); the query (q_norm(wq_a x), wq_b, RoPE) and the latent rows
 * (kv_norm(wkv_a x) | RoPE(k_pe)) of n rows, row t at position start + t or
 * at seqs[t]'s position; token j's cache row (e: wkv_b's [H, dn + dv] for a
 * NAIVE cache); the attended positions of one query row's top-k
 * (ascending, -1 padded to width; returns how many); a realloc that only
 * grows (0 when out of memory). */
int           dsattn_mla_fwd_buf_rows(dsattn_mla_fwd_buf *b, dsattn_ws *ws,
                                      const dsattn_mla_config *c, size_t n, int expanded);
dsattn_status dsattn_mla_query_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *x,
                                    size_t n, int64_t start, dsattn_mla_seq *const *seqs,
                                    const dsattn_mla_fwd_buf *b);
dsattn_status dsattn_mla_latent_rows(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                     const float *x, size_t n, int64_t start,
                                     dsattn_mla_seq *const *seqs, const dsattn_mla_fwd_buf *b);
void          dsattn_mla_cache_write(dsattn_mla_seq *seq, int l, size_t j, const float *kv,
                                     const float *e);
size_t        dsattn_mla_select_row(const float *score, size_t nvis, size_t topk,
                                    size_t width, int32_t *row);

/* mla_attend.c: latent row j of layer l -> kv[KL] and pe[dr] (either may
 * be NULL); the absorption products of nr rows (q: [nr, H, dn + dr] ->
 * qa [nr, H, KL]; x [nr, H, KL] -> o [nr, H * dv]) and one thread's scratch
 * of them; one query row's absorbed attention over keys idx[0..n) (or
 * 0..n-1), reference and fast (xo [H, KL]); the threads a row of n keys
 * splits over; the fast paths' scratch bytes with nt threads (FMA tiles,
 * bf16 blocks, sgemm); one row over expanded keys and over the naive
 * cache (o [H, dv]).  v3: V3's bf16 score arithmetic, else V3.2's fp32. */
void          dsattn_mla_latent_row(const dsattn_mla_seq *s, int l, size_t j, float *kv,
                                    float *pe);
size_t        dsattn_mla_absorb_ws_per(size_t KL, size_t nr);
dsattn_status dsattn_mla_absorb_q(dsattn_ctx *ctx, const dsattn_mla *m, int l, const float *q,
                                  size_t nr, float *qa, dsattn_ws *wa);
dsattn_status dsattn_mla_absorb_out(dsattn_ctx *ctx, const dsattn_mla *m, int l,
                                    const float *x, size_t nr, float *o, dsattn_ws *wa);
dsattn_status dsattn_mla_absorbed_row_ref(const dsattn_mla_seq *s, int l, const float *qa,
                                          const float *qpe, const int32_t *idx, size_t n,
                                          int v3, float *xo, dsattn_ws *wa);
dsattn_status dsattn_mla_absorbed_row_fast(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l,
                                           const float *qa, const float *qpe,
                                           const int32_t *idx, size_t n, int v3, float *xo,
                                           int n_threads, dsattn_ws *wa);
int           dsattn_mla_row_threads(size_t n, int n_threads);
size_t        dsattn_mla_tiled_ws_bytes(size_t H, size_t KL, size_t dr, int nt, size_t *per_out,
                                        size_t *wsf_out);
size_t        dsattn_mla_amx_ws_bytes(size_t H, size_t KL, size_t dr, int fp8, int nt,
                                      size_t *part_out, size_t *per_out);
size_t        dsattn_mla_generic_ws_bytes(size_t H, size_t KL, size_t dr, int nt,
                                          size_t *per_out);
dsattn_status dsattn_mla_expanded_row(dsattn_ctx *ctx, const dsattn_mla_config *c,
                                      const float *q, const dsattn_mla_kv_view *kv,
                                      const int32_t *idx, size_t n, int v3, float *o,
                                      dsattn_ws *wa);
dsattn_status dsattn_mla_naive_row(dsattn_ctx *ctx, const dsattn_mla_seq *s, int l,
                                   const float *q, const int32_t *idx, size_t n, int v3,
                                   float *o, dsattn_ws *wa);

#endif /* DSATTN_MLA_INTERNAL_H */
