/* v4.h - internal layout of the DeepSeek-V4 (CSA + HCA) attention stack.
 *
 * The public face is include/dsattn_v4.h; this header holds the structures
 * the model, the forward pass, the trace tool and the white-box tests share.
 * Vocabulary: D = head_dim (512), rd = rope_head_dim (64), H = n_heads,
 * Di = index_head_dim (128), Hi = index_n_heads (64), w = window_size
 * (128), m = compress ratio, T = compressed entries visible at the end of
 * the current chunk (end_pos / m).
 */
#ifndef DSATTN_V4_INTERNAL_H
#define DSATTN_V4_INTERNAL_H

#include "csa.h"
#include "dsattn.h"
#include "internal.h"
#include "ops.h"
#include "weights.h"

#define DSATTN_V4_CSA_RATIO  4        /* ratio 4 = CSA (overlap + indexer) */
#define DSATTN_V4_ACT_BLOCK  128      /* act_quant block before FP8 GEMMs   */

/* The shared CSA-family config (csa.h); V4 leaves the V4.1 plan fields
 * at zero.  Its FP8 weight block is 128. */
typedef dsattn_csa_config dsattn_v4_config;

/* One Compressor: wkv / wgate [coff*d, dim] (bf16 or fp32 storage, fp32
 * compute), ape [ratio, coff*d] fp32, norm [d]. */
typedef struct {
    size_t        d, ratio;
    int           overlap, rotate;
    dsattn_weight wkv, wgate;
    float        *ape, *norm;
} dsattn_v4_compressor_w;

typedef struct {
    int64_t        ratio;
    dsattn_v4_kind kind;
    dsattn_rope    rope;

    float         *attn_norm;                  /* [dim]                      */
    dsattn_weight  wq_a, wq_b, wkv, wo_a, wo_b;
    float         *q_norm, *kv_norm, *sink;    /* [q_lora], [D], [H]         */
    dsattn_v4_compressor_w comp;               /* ratio > 0                  */
    dsattn_v4_compressor_w icomp;              /* CSA: the indexer's         */
    dsattn_weight  i_wq_b, i_wproj;            /* CSA indexer                */
    dsattn_attn_layer attn;                    /* the shared blocks' view    */
} dsattn_v4_layer_w;

struct dsattn_v4 {
    dsattn_v4_config   cfg;
    dsattn_v4_layer_w  layer[DSATTN_MAX_LAYERS];
    int                has_weights;            /* 0: config-only model       */
    void              *ckpt;                   /* dsattn_ckpt, if loaded */
    dsattn_owned        owned;                  /* buffers to free           */
};

/* Pooling state of one compressor: [coff*m, coff*d] fp32 each. */
typedef struct {
    float *kv, *z;
} dsattn_v4_comp_s;

typedef struct {
    uint8_t *kv;              /* [w + cap] MODEL1 rows: ring, then entries  */
    uint8_t *ikv;             /* CSA: [cap] FP4 index-key rows              */
    size_t   cap;             /* compressed entries the layer can hold      */
    dsattn_v4_comp_s comp, icomp;
    int32_t *sel;             /* CSA: last chunk's top-k, j or -1, [rows, w] */
    size_t   sel_rows, sel_w, sel_cap;
    int32_t *sel_own;         /* sel's decode-step buffer (dsattn_chunk_rows) */
    size_t   sel_own_cap;
} dsattn_v4_layer_s;

struct dsattn_v4_seq {
    const dsattn_v4    *m;
    dsattn_v4_empty     empty;
    int64_t             pos;               /* tokens consumed so far        */
    size_t              max_seq_len;
    int                 first, count;      /* layers held: [first, first + count) */
    dsattn_v4_layer_s   layer[DSATTN_MAX_LAYERS];   /* by model layer; NULL
                                            * buffers outside the held range */
    /* Decode scratch, sized at creation for one token at capacity (so a
     * decode step allocates nothing; a prefill chunk may grow or spill). */
    void               *scratch;           /* the layer forward's buffers   */
    size_t              scratch_size;
    dsattn_ws           ws;                /* compressors, indexer, stack   */
    size_t              kv_bytes;          /* compressed + index rows, as
                                            * allocated                     */
    size_t              window_bytes, state_bytes;
};

/* Whether s holds layer l's caches (false for any l outside the model). */
static inline int dsattn_v4_seq_holds(const dsattn_v4_seq *s, int64_t l)
{
    return l >= s->first && l < (int64_t)s->first + s->count;
}

/* Whether s holds every layer of its model (what the stacks run). */
static inline int dsattn_v4_seq_whole(const dsattn_v4_seq *s)
{
    return s->first == 0 && s->count == s->m->cfg.n_layers;
}

/* Parse an inference/config.json (ModelArgs keys).  Errors name the key. */
dsattn_status dsattn_v4_config_load(dsattn_v4_config *c, const char *path,
                                    char *err, size_t errlen);
dsattn_status dsattn_v4_config_validate(const dsattn_v4_config *c, char *err,
                                        size_t errlen);

/* Bytes of one packed row: MODEL1 KV (584 at 512/64), index key (68 at 128). */
/* ==== Pieces of the layer forward a batched step shares ================ */

typedef dsattn_csa_chunk dsattn_v4_chunk;

/* A compressor of layer l (index 0: the main one, 1: the CSA indexer's)
 * after its projections kv, z [ck->s, coff*d] (wkv x, wgate x, fp32):
 * pooling state, new entries normalised, rotated and packed into the
 * layer's cache, as the one-sequence forward does. */
dsattn_status dsattn_v4_compress_rows(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l, int index,
                                      const dsattn_v4_chunk *ck, const float *kv,
                                      const float *z);

/* A CSA layer's projections a batched step ran over all its rows: this
 * sequence's index queries qi (RoPE, Hadamard, FP4), head weights wts and
 * the indexer compressor's kv / z. */
typedef struct {
    float       *qi, *wts;
    const float *ikv, *iz;
} dsattn_v4_index_pre;

/* The indexer of CSA layer l for one sequence after those projections:
 * its compressor, scores, top-k into rows [ck->s, kw] (offset added) and
 * the layer's selection. */
dsattn_status dsattn_v4_index_rows(dsattn_ctx *ctx, dsattn_v4_seq *seq, int l,
                                   const dsattn_v4_chunk *ck, size_t offset, int32_t *rows,
                                   size_t kw, const dsattn_v4_index_pre *pre);

size_t dsattn_v4_kv_bytes(const dsattn_v4_config *c);
size_t dsattn_v4_idx_bytes(const dsattn_v4_config *c);

#endif /* DSATTN_V4_INTERNAL_H */
