/* v41.h - internal layout of the DeepSeek-V4.1 (CSA2) attention stack.
 *
 * The public face is the "CSA2" section of include/dsattn.h; this header
 * holds the structures the stack, the trace tool, the bill and the tests
 * share.  Vocabulary: D = head_dim (512), rd = rope_head_dim (64), H =
 * n_heads, Di = index_head_dim, Hi = index_n_heads, w = window_size,
 * m = compress ratio, T = number of compressed entries visible at the end
 * of the current chunk (end_pos / m).
 */
#ifndef DSATTN_V41_H
#define DSATTN_V41_H

#include "csa.h"
#include "dsattn.h"
#include "internal.h"
#include "ops.h"
#include "weights.h"


/* The shared CSA-family config (csa.h), its layer plan fields filled from
 * the io layer's plan.  Default FP8 weight block 32. */
typedef dsattn_csa_config dsattn_v41_config;

typedef struct {
    int64_t         ratio;
    dsattn_v41_mode mode;
    int             is_kv_source, is_index_source, owns_k;
    int             is_candidate_source, uses_candidates;
    dsattn_rope     rope;

    float          *attn_norm;                 /* [dim]                     */
    dsattn_weight   wq_a, wq_b, wkv, wo_a, wo_b;
    float          *q_norm, *kv_norm, *sink;   /* [q_lora], [D], [H]        */
    dsattn_weight   c_wkv, c_wgate;            /* compressor (KV sources)   */
    float          *c_norm;
    dsattn_weight   i_wq_b, i_wproj, i_wk;     /* indexer (index sources)   */
    float          *i_knorm;
    dsattn_attn_layer attn;                    /* the shared blocks' view    */
} dsattn_v41_layer_w;

struct dsattn_v41 {
    dsattn_v41_config   cfg;
    dsattn_v41_layer_w  layer[DSATTN_MAX_LAYERS];
    void               *ckpt;                  /* dsattn_ckpt, if loaded */
    dsattn_owned        owned;                  /* buffers to free           */
};

typedef struct {
    uint8_t *ring;            /* [w, swa_bytes] window rows, slot = pos % w */
    uint8_t *ckv;             /* KV sources: [cap, kv_bytes] FP4 entries    */
    uint8_t *kidx;            /* owners: [cap, idx_bytes] FP4 index keys    */
    size_t   cap;             /* entries ckv/kidx can hold                  */
    float   *kv_state, *score_state;   /* ratio >= 2 sources: [m, D] fp32  */
    int32_t *sel;             /* last chunk's own selection [s, sel_w], j's */
    size_t   sel_rows, sel_w, sel_cap;
    int32_t *sel_own;         /* sel's decode-step buffer (dsattn_chunk_rows) */
    size_t   sel_own_cap;
    int      source_read;     /* layer whose compress_kv this layer read    */
    int      index_read;      /* layer whose index_k this layer scored      */
    int      topk_read;       /* layer whose top-k rows this layer attended */
} dsattn_v41_layer_s;

struct dsattn_v41_seq {
    const dsattn_v41   *m;
    dsattn_v41_index_k  index_k_mode;
    int64_t             pos;               /* tokens consumed so far        */
    size_t              max_seq_len;
    dsattn_v41_layer_s  layer[DSATTN_MAX_LAYERS];

    /* The shared attention runtime: four slots, written and read in layer
     * order (docs/semantics.md §7.2).  Owned by the sequence. */
    struct {
        int      compress_kv;     /* layer whose compressed cache is current */
        int      index_k;         /* layer whose index-key cache is current  */
        int32_t *topk;            /* [rows, width] final rows, offset applied */
        size_t   topk_rows, topk_w, topk_cap;
        int64_t  topk_p0;         /* position of row 0                        */
        size_t   topk_off;        /* the offset applied (writer's window rows) */
        int      topk_valid;
        int      topk_layer;      /* index source that wrote the rows        */
        int32_t *cand;            /* pool positions per row, ascending       */
        size_t  *cand_n;          /* [rows] count                            */
        size_t   cand_rows, cand_stride, cand_cap, cand_n_cap;
        int64_t  cand_p0;         /* position of row 0                        */
        int      cand_valid;
        /* the decode-step buffers of topk, cand, cand_n (dsattn_chunk_rows) */
        int32_t *topk_own, *cand_own;
        size_t  *cand_n_own;
        size_t   topk_own_cap, cand_own_cap, cand_n_own_cap;
    } rt;

    /* Decode scratch, sized at creation for one token at capacity (so a
     * decode step allocates nothing; a prefill chunk may grow them). */
    void     *scratch;                    /* the layer forward's buffers   */
    size_t    scratch_size;
    void     *iscratch;                   /* compressor / indexer buffers  */
    size_t    iscratch_size;
    dsattn_ws ws;                         /* stack_forward's rows          */
    size_t    kv_bytes;                   /* ckv + kidx, as allocated      */
    size_t    window_bytes, state_bytes;  /* rings, compressor state       */
};

/* Check a loaded config against the reference's rules and dsattn's
 * limits (the plan's modes are assigned when the model is finished).
 * Errors name the offending key. */
dsattn_status dsattn_v41_config_validate(dsattn_v41_config *c, char *err,
                                         size_t errlen);
/* Parse a config.json (flat inference keys, or HF with text_config). */
dsattn_status dsattn_v41_config_load(dsattn_v41_config *c, const char *path,
                                     char *err, size_t errlen);

/* select_candidate_blocks for one row: scores[0..T) already masked
 * (-inf beyond the row's visible count cl); block score = max of its
 * positions, the newest visible block pinned to +inf, the top topk_blocks
 * blocks with a score above -inf kept.  Writes the pool's positions in
 * ascending order to pool and returns their count.  bscore/bidx: scratch
 * of ceil(T/bs) + 1 entries. */
size_t dsattn_v41_candidate_pool(const float *scores, size_t T, size_t cl, size_t bs,
                                 size_t topk_blocks, float *bscore, int32_t *bidx,
                                 int32_t *pool);

/* ==== Pieces of the layer forward a batched step shares ================ */

typedef dsattn_csa_chunk dsattn_v41_chunk;

/* A ratio >= 2 compressor after its projections: kv, z [ck->s, D] fp32
 * (wkv x, wgate x) pooled into the layer's state; the completed groups'
 * latents (bf16 cast, RMSNorm) go to lat.  Returns their count.  ws:
 * dsattn_v41_compress_pool_scratch bytes. */
size_t dsattn_v41_compress_pool(dsattn_v41_seq *seq, int l, const float *kv, const float *z,
                                const dsattn_v41_chunk *ck, float *lat, float *ws);
size_t dsattn_v41_compress_pool_scratch(const dsattn_v41 *m, int l);
/* The act-quant scratch's row: the widest input of the layer forward's
 * activation-quantized Linears (v41_forward.c). */
size_t dsattn_v41_actq_cols(const dsattn_v41_config *c);

/* The projections of an index source a batched step ran over all its
 * rows: kk [n_new, Di] the owner's new index keys (i_wk of the latents,
 * bf16, before norm and RoPE; modified in place), qi the FP4 index queries
 * and wts the head weights of this sequence's rows. */
typedef struct {
    float *kk, *qi, *wts;
} dsattn_v41_index_pre;

/* The indexer of layer l for one sequence after those projections: keys
 * published, scores, candidate pool, top-k (the single-sequence path's
 * exact steps).  offset: the window rows before the compressed ones in
 * the attention's index row. */
dsattn_status dsattn_v41_index_rows(dsattn_ctx *ctx, dsattn_v41_seq *seq, int l,
                                    const dsattn_v41_chunk *ck, size_t n_new, size_t offset,
                                    const dsattn_v41_index_pre *pre);

/* Bytes of one packed row of each cache. */
size_t dsattn_v41_swa_bytes(const dsattn_v41_config *c);
size_t dsattn_v41_ckv_bytes(const dsattn_v41_config *c);
size_t dsattn_v41_kidx_bytes(const dsattn_v41_config *c);

#endif /* DSATTN_V41_H */
