/* csa.h - what the two compressed-sparse-attention generations, V4 (CSA +
 * HCA) and V4.1 (CSA2), share at model level: one config struct, one
 * reader of it from the io layer's normalised model config, the checks
 * both apply, the RoPE table a layer of a given compress ratio uses, and
 * the stored size of a weight.
 *
 * Their ModelArgs carry the same numbers (dimensions, compress ratios,
 * indexer, RoPE / YaRN, weight storage); V4.1 adds its layer plan (kv and
 * index sources, the candidate pool), which a V4 config leaves at zero
 * (candidate_source_layer -1).  Each generation's own rules stay in its
 * model file (v4_model.c, v41_model.c), given to the reader as `finish`.
 */
#ifndef DSATTN_CSA_H
#define DSATTN_CSA_H

#include "checkpoint.h"
#include "config.h"
#include "dsattn.h"
#include "internal.h"
#include "ops.h"
#include "weights.h"

typedef struct {
    int64_t dim, n_layers, n_total_layers;     /* total = compress_ratios len:
                                                * backbone + MTP / DSpark    */
    int64_t n_heads, head_dim, rope_head_dim, q_lora_rank;
    int64_t o_groups, o_lora_rank, window_size;
    int64_t compress_ratios[DSATTN_MAX_LAYERS];
    int64_t index_n_heads, index_head_dim, index_topk;
    double  rope_theta, compress_rope_theta, rope_factor, original_seq_len;
    double  beta_fast, beta_slow;
    float   norm_eps;
    int     fp8;                               /* dtype "fp8"                */
    int64_t fp8_block;                         /* weight block edge          */

    /* V4.1 only: the layer plan (the io layer's), zero in a V4 config */
    uint8_t is_kv_source[DSATTN_MAX_LAYERS];
    uint8_t is_index_source[DSATTN_MAX_LAYERS];
    dsattn_v41_mode mode[DSATTN_MAX_LAYERS];
    int64_t candidate_source_layer;            /* -1: none                   */
    int64_t candidate_topk_blocks, candidate_block_size;
} dsattn_csa_config;

/* The rows a layer forward runs over: a chunk of s rows of one sequence
 * from start_pos, a prefill when the sequence was empty. */
typedef struct {
    size_t  s;                /* rows in this chunk                          */
    int64_t start_pos;
    int     prefill;
} dsattn_csa_chunk;

/* A generation's part of reading its config: its own fields and checks,
 * given the shared fields already copied. */
typedef dsattn_status (*dsattn_csa_finish_fn)(dsattn_csa_config *c,
                                              const dsattn_model_config *mc, char *err,
                                              size_t errlen);

/* Read config.json (either format, through io/config.c) as generation
 * `arch`: the shared fields (weight block `default_block` when the config
 * names none), then `finish`.  Every error starts with the path. */
dsattn_status dsattn_csa_config_load(dsattn_csa_config *c, const char *path, dsattn_arch arch,
                                     int64_t default_block, dsattn_csa_finish_fn finish,
                                     char *err, size_t errlen);

/* The range checks both generations apply (layer count, dimensions that
 * size dsattn's per-row buffers, o_groups dividing n_heads, norm_eps). */
dsattn_status dsattn_csa_config_check(const dsattn_csa_config *c, char *err, size_t errlen);

/* The RoPE table of a layer of compress ratio `ratio` (Attention.__init__):
 * compressed layers (ratio > 0, ratio 1 included) compress_rope_theta with
 * YaRN, pure sliding-window layers rope_theta without. */
void dsattn_csa_layer_rope(dsattn_rope *r, const dsattn_csa_config *c, int64_t ratio);

/* The dims and flags of the shared attention blocks' view of a layer
 * (ops.h dsattn_attn_layer) from the config; `v4`: V4's per-head query RMS,
 * Hadamard index queries and activation block 128 (V4.1: none, none, 32).
 * The weight pointers are the generation's to set, once its weights are
 * bound. */
void dsattn_csa_attn_layer(dsattn_attn_layer *a, const dsattn_csa_config *c, int v4);

/* Build layer L's view L->attn: the dims above and pointers to L's
 * weights, which both generations' layer structs name alike. */
#define DSATTN_CSA_ATTN_LINK(L, c, v4)                                                   \
    do {                                                                                 \
        dsattn_attn_layer *a_ = &(L)->attn;                                              \
        dsattn_csa_attn_layer(a_, (c), (v4));                                            \
        a_->wq_a = &(L)->wq_a; a_->wq_b = &(L)->wq_b; a_->wkv = &(L)->wkv;               \
        a_->wo_a = &(L)->wo_a; a_->wo_b = &(L)->wo_b; a_->i_wq_b = &(L)->i_wq_b;         \
        a_->q_norm = (L)->q_norm; a_->kv_norm = (L)->kv_norm; a_->rope = &(L)->rope;     \
    } while (0)

/* Bytes of a weight as the checkpoint stores it (FP8: one UE8M0 scale
 * byte a block; 0 for an unbound weight). */
size_t dsattn_csa_stored_bytes(const dsattn_weight *w);

/* ==== The attention block's weights every V4 / V4.1 layer has ==========
 * (csa_weights.c) */

/* Where one layer keeps them: attn_norm [dim], wq_a [q_lora, dim], q_norm
 * [q_lora], wq_b [H*D, q_lora], wkv [D, dim], kv_norm [D], sink [H], wo_a
 * [G*R, H*D/G], wo_b [dim, G*R].  DSATTN_CSA_BLOCK_W(L) points into a
 * layer struct of either generation (they name the fields alike). */
typedef struct {
    float        **attn_norm, **q_norm, **kv_norm, **sink;
    dsattn_weight *wq_a, *wq_b, *wkv, *wo_a, *wo_b;
} dsattn_csa_block_w;

#define DSATTN_CSA_BLOCK_W(L)                                                         \
    ((dsattn_csa_block_w){ &(L)->attn_norm, &(L)->q_norm, &(L)->kv_norm, &(L)->sink,  \
                           &(L)->wq_a, &(L)->wq_b, &(L)->wkv, &(L)->wo_a, &(L)->wo_b })

/* How a generation binds the block: its Linears' tensor names end in
 * `suffix` ("" for V4's, ".weight" for V4.1's), accept the formats `lin`
 * (wo_a: `wo_a`), through `bind_mat` (dsattn_bind_mat or the generation's
 * stricter form). */
typedef struct {
    const char *suffix;
    unsigned    lin, wo_a;
    dsattn_status (*bind_mat)(const dsattn_binder *b, const char *name, unsigned accept,
                              size_t rows, size_t cols, dsattn_weight *w);
} dsattn_csa_bind_rule;

/* Bind layer l's block from the checkpoint, in the order attn_norm, wq_a,
 * q_norm, wq_b, wkv, kv_norm, attn_sink, wo_a, wo_b (the first error is
 * returned). */
dsattn_status dsattn_csa_bind_block(const dsattn_binder *b, const dsattn_csa_config *c,
                                    int64_t l, const dsattn_csa_bind_rule *r,
                                    const dsattn_csa_block_w *w);

/* Seeded random block weights (io/weights.c), one seed a tensor from ++*k
 * in the binding order: the Linears in format `lin` (FP8 blocks of
 * c->fp8_block), wo_a in `wo_a`, the norms bf16-rounded around 1, the sink
 * around 0 (bf16-rounded when sink_bf16). */
dsattn_status dsattn_csa_random_block(const dsattn_csa_config *c, const dsattn_csa_block_w *w,
                                      dsattn_wkind lin, dsattn_wkind wo_a, int sink_bf16,
                                      uint64_t *k, dsattn_owned *own);


/* ==== The phases of a layer step every V4 / V4.1 forward shares ========
 * (csa_attend.c) */

/* The query and window-KV phases: q, qr from the rows of x (`rows`; q
 * NULL: qr only, the heads left to dsattn_attn_query_heads); the
 * window KV kvw [krows->n, D] from the rows of kx (krows, kx NULL: the
 * query's rows), which pack(arg, kvw) quantizes into the generation's
 * rows and rings. */
typedef struct {
    const float            *x;
    float                  *qr, *q;
    const dsattn_attn_rows *krows;
    const float            *kx;
    float                  *kvw;
    void                  (*pack)(const void *arg, const float *kvw);
    const void             *arg;
} dsattn_csa_qkv;

/* dsattn_attn_query (phase QUERY), then dsattn_attn_window_kv and pack
 * (phase KV). */
dsattn_status dsattn_csa_query_kv(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                  const dsattn_attn_rows *rows, const dsattn_csa_qkv *j);


/* What one row attends: its window entries and its compressed entries
 * (csrc unused when cw is 0), the widths of the two parts of its index row,
 * and the rule for a row with no valid entry (V4's DEFINED option: zeros;
 * otherwise the kernel's result from the running max's start max_init). */
typedef struct {
    dsattn_kv_src wsrc, csrc;
    size_t        ww, cw;
    float         max_init;
    int           zero_empty;
} dsattn_csa_row_src;

typedef struct {
    const float *q;                 /* [n, H*D] queries                    */
    float       *o, *oa, *out;      /* [n, H*D], [n, G*R], [n, dim]         */
    const float *sink;              /* [H], or NULL                        */
    size_t       hg, hper;          /* head groups per row, heads a group  */
    size_t       att_ws, per_thr;   /* a thread's attention scratch floats,
                                     * its whole slice (index row after)   */
    float       *thr_ws;            /* [threads, per_thr]                  */
    /* row t's index row idx (width ww + cw) and its sources */
    void       (*row)(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src);
    const void  *arg;
} dsattn_csa_attend;

/* The sparse attention of rows->n rows, one task per (row, head group),
 * then dsattn_attn_output into out.  Phases ATTN and OUTPUT. */
dsattn_status dsattn_csa_attend_output(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                       const dsattn_attn_rows *rows, const dsattn_csa_attend *j);

/* The rows of a chunk of one sequence (arg of dsattn_csa_chunk_row): a
 * prefill's window entries (dsattn_window_idx_prefill) or the decode
 * ring's (valid_first: V4's order, dsattn_window_idx_decode_valid_first),
 * then row t of the top-k rows cidx [s, src.cw]; the same sources for
 * every row. */
typedef struct {
    const dsattn_csa_chunk *ck;
    size_t                  w;
    int                     valid_first;
    const int32_t          *cidx;
    dsattn_csa_row_src      src;
} dsattn_csa_chunk_rows;

void dsattn_csa_chunk_row(const void *arg, size_t t, int32_t *idx, dsattn_csa_row_src *src);

/* Rows of a prompt whose heads (q, the attention output o, the grouped
 * output oa: ~288 KB a row at V4-Flash / V4.1-Flash widths) are in memory
 * at once: V4's and V4.1's prompts run their query heads, attention and
 * output a block at a time (every row's arithmetic is its own, so the bits
 * do not depend on the blocking in reference mode).  Tests lower it to
 * cross blocks in small cases. */
extern size_t dsattn_csa_prompt_block;

/* The heads of rows->n rows of one sequence (pos NULL) a block of qb rows
 * at a time: the query heads of the block from qr [rows->n, QL] into q
 * [qb, H*D] (phase QUERY), then dsattn_csa_attend_output of the block.
 * j's o and oa hold qb rows, its out all rows; j->row numbers all rows
 * (the block's row t is its row t0 + t). */
dsattn_status dsattn_csa_prompt_attend(dsattn_ctx *ctx, const dsattn_attn_layer *a,
                                       const dsattn_attn_rows *rows, const float *qr, float *q,
                                       size_t qb, const dsattn_csa_attend *j);

#endif /* DSATTN_CSA_H */
