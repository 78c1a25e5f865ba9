/* dsattn_v4.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly.
 *
 * ==== CSA + HCA: DeepSeek-V4 (Flash / Pro) ==============================
 *
 * A dsattn_v4 is the attention part of a V4 model: config, layer plan and
 * weights.  A dsattn_v4_seq is one sequence over it: per layer ONE packed
 * KV buffer (as the reference's Attention.kv_cache): the sliding-window
 * ring in rows [0, window) (token p in slot p % window), then the
 * compressed entries; CSA layers add their indexer's key cache; plus the
 * compressors' fp32 pooling state.  Rows use FlashMLA's MODEL1 layout:
 * nope E4M3 | rope bf16 | one UE8M0 per 64 nope dims | 1 pad byte (584 B
 * at 448 + 64); index keys are FP4 E2M1 + UE8M0 per 32 (68 B at 128).
 *
 * Layer kinds come from compress_ratios (n_layers + n_mtp entries; the
 * trailing MTP entries are reported, not run): 0 -> sliding window only
 * (rope_theta, no YaRN); 4 -> CSA (overlapping compressor, lightning
 * indexer with its own compressor, top-index_topk entries); any other
 * ratio -> HCA (non-overlapping compressor, every visible entry attended).
 * Compressed layers use compress_rope_theta with YaRN.
 *
 * Calling protocol (the reference's): for each chunk, call
 * dsattn_v4_attn_forward for every layer 0..n_layers-1 in order, then
 * dsattn_v4_seq_advance.  The first chunk may be a prefill of n >= 1
 * tokens at position 0; every later chunk is one token (the reference has
 * no chunked prefill).  dsattn_v4_stack_forward runs the golden-case
 * stand-in block h += attn_l(bf16(RMSNorm_l(h))) over all layers and
 * advances.
 */
#ifndef DSATTN_V4_H
#define DSATTN_V4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)  /* the exported API: see CMakeLists.txt */
#endif

typedef enum {
    DSATTN_V4_NONE = -1,    /* layer_kind of a NULL model or a layer out of range */
    DSATTN_V4_SWA = 0,      /* compress ratio 0: sliding window only       */
    DSATTN_V4_CSA = 1,      /* ratio 4: overlapping compressor + indexer    */
    DSATTN_V4_HCA = 2,      /* any other ratio: attends every entry         */
    DSATTN_V4_MTP = 3,      /* entries past n_layers: reported, not run     */
} dsattn_v4_kind;

/* What an attention row with no valid index yields.  The V4 kernel starts
 * its running max at -inf, so such a row (or one whose first block of 64
 * indices is all invalid) comes out NaN: REFERENCE (default) reproduces
 * that.  ZERO gives a defined result: an all-invalid row is 0, and a row
 * with valid indices is the softmax over them (V4.1's -1e30 bound).  Rows
 * the stack itself builds always hold the query's own window slot first,
 * so the choice only matters for direct kernel-level use; both agree
 * bit for bit on every other row. */
typedef enum {
    DSATTN_V4_EMPTY_REFERENCE = 0,
    DSATTN_V4_EMPTY_ZERO      = 1,
} dsattn_v4_empty;

typedef struct dsattn_v4     dsattn_v4;
typedef struct dsattn_v4_seq dsattn_v4_seq;

/* Load from an inference/config.json (ModelArgs keys + "model_type":
 * "deepseek_v4"; NULL: config.json beside the weights) and a checkpoint
 * with the official inference names (layers.{i}.attn.*,
 * layers.{i}.attn_norm.weight): one .safetensors file, a
 * model.safetensors.index.json with its shards, or a folder holding
 * either, convert.py's model0-mp1.safetensors or one .safetensors file
 * (docs/checkpoints.md, "Folders").  Files are memory-mapped and weights borrowed from the mapping,
 * except FP8 wo_a, which is dequantized to bf16 as the official conversion
 * does (the reference runs wo_a as a bf16 einsum). */
dsattn_status dsattn_v4_load(dsattn_v4 **out, const char *config_json,
                             const char *weights, char *err, size_t errlen);
/* Random weights from a seed at the config's dims (fp8 != 0: the released
 * formats - FP8 E4M3 with 128x128 block scales for wq_a, wq_b, wkv, wo_b,
 * indexer.wq_b - needs the Linear input dims to be multiples of 128;
 * else every Linear bf16).  Compressor weights are bf16 values computed
 * in fp32, as the reference does. */
dsattn_status dsattn_v4_create_random(dsattn_v4 **out, const char *config_json,
                                      uint64_t seed, int fp8, char *err,
                                      size_t errlen);
/* Config and plan only, no weights: enough to create sequences, measure the
 * KV bill and fill synthetic caches at real size; forward returns
 * DSATTN_ERR_UNSUPPORTED. */
dsattn_status dsattn_v4_load_config(dsattn_v4 **out, const char *config_json,
                                    char *err, size_t errlen);
void dsattn_v4_destroy(dsattn_v4 *m);

int            dsattn_v4_n_layers(const dsattn_v4 *m);
int            dsattn_v4_dim(const dsattn_v4 *m);
/* layer in [0, n_layers + n_mtp): kind and compress ratio */
dsattn_v4_kind dsattn_v4_layer_kind(const dsattn_v4 *m, int layer);
int            dsattn_v4_layer_ratio(const dsattn_v4 *m, int layer);
/* Bytes of attention weights the stack holds (all layers, as stored). */
size_t         dsattn_v4_weight_bytes(const dsattn_v4 *m);
/* The CSA layers' lightning indexer: heads, head dim and top-k (any
 * pointer may be NULL). */
dsattn_status  dsattn_v4_index_shape(const dsattn_v4 *m, int *n_heads, int *head_dim,
                                     int *topk);

/* max_seq_len: tokens the sequence may hold (caches are sized from it). */
dsattn_status dsattn_v4_seq_create(dsattn_v4_seq **out, const dsattn_v4 *m,
                                   size_t max_seq_len, dsattn_v4_empty empty);
/* A sequence holding only layers [first_layer, first_layer + n_layers): one
 * pipeline stage's share of the caches, or one layer of a checkpoint timed
 * at a depth whose whole-model cache would not fit (dsattn bench v4
 * --weights).  Forwards, accessors and the batched call take only the
 * layers it holds (DSATTN_ERR_INVALID_ARG otherwise); the stand-in stacks
 * take only a sequence of every layer. */
dsattn_status dsattn_v4_seq_create_layers(dsattn_v4_seq **out, const dsattn_v4 *m,
                                          size_t max_seq_len, dsattn_v4_empty empty,
                                          int first_layer, int n_layers);
void    dsattn_v4_seq_destroy(dsattn_v4_seq *s);
int64_t dsattn_v4_seq_pos(const dsattn_v4_seq *s);

/* x: [n, dim] the layer's normalised input (bf16 values); out: [n, dim]. */
dsattn_status dsattn_v4_attn_forward(dsattn_ctx *ctx, dsattn_v4_seq *s,
                                     int layer, const float *x, size_t n,
                                     float *out);
dsattn_status dsattn_v4_seq_advance(dsattn_v4_seq *s, size_t n);

/* Golden-case stand-in stack over all layers; h: [n, dim] fp32 residual,
 * updated in place.  attn_in / attn_out (optional): [n_layers, n, dim]. */
dsattn_status dsattn_v4_stack_forward(dsattn_ctx *ctx, dsattn_v4_seq *s,
                                      float *h, size_t n, float *attn_in,
                                      float *attn_out);

/* Batched decode: one token for each of n_seqs sequences of the same model
 * in one call, each at its own position, the weights streamed once for
 * all of them.  x, out: [n_seqs, dim]; the contract is V4.1's
 * (dsattn_v41_attn_forward_batch in dsattn.h): row i equals
 * dsattn_v4_attn_forward on seqs[i] alone (bit for bit in reference mode),
 * every sequence is checked first and a failed call changes nothing,
 * *failed names the first bad sequence (SIZE_MAX: not one sequence's), the
 * caller advances each sequence after the last layer.  Sequences may
 * differ in their dsattn_v4_empty rule. */
dsattn_status dsattn_v4_attn_forward_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs,
                                           size_t n_seqs, int layer, const float *x,
                                           float *out, size_t *failed);
/* The stand-in stack over the batch: h [n_seqs, dim] updated in place,
 * attn_in / attn_out (optional) [n_layers, n_seqs, dim]; advances every
 * sequence by one token. */
dsattn_status dsattn_v4_stack_forward_batch(dsattn_ctx *ctx, dsattn_v4_seq *const *seqs,
                                            size_t n_seqs, float *h, float *attn_in,
                                            float *attn_out, size_t *failed);

/* The last chunk's top-k of a CSA layer as the reference returns it: per
 * row, compressed-entry indices j (window offset removed) in descending
 * index-score order (ties: lower j first), -1 for the picks a prefill row
 * cannot see; rows x width, width = min(index_topk, end_pos / 4). */
dsattn_status dsattn_v4_seq_selection(const dsattn_v4_seq *s, int layer,
                                      const int32_t **rows, size_t *n_rows,
                                      size_t *width);

/* Packed cache rows of a layer: which = 0 the KV buffer (window ring rows,
 * then the compressed entries written so far; MODEL1 rows), 1 the indexer
 * key cache of a CSA layer (entries written so far). */
dsattn_status dsattn_v4_seq_cache(const dsattn_v4_seq *s, int layer, int which,
                                  const uint8_t **rows, size_t *n_rows,
                                  size_t *row_bytes);

/* The bill, measured from the live allocations: global KV bytes per token =
 * (compressed entries + index keys of every layer) / max_seq_len; the
 * window rings and the compressors' fp32 state reported separately. */
dsattn_status dsattn_v4_seq_kv_bill(const dsattn_v4_seq *s, dsattn_kv_bill *b);

/*
 * The decode scratch (the kv_bill's scratch_bytes) a sequence of capacity
 * max_seq_len would allocate, without creating one (the bill's
 * per-sequence column at a context no cache could be made for); 0 for a
 * NULL model, SIZE_MAX when the size overflows. */
size_t dsattn_v4_seq_scratch_at(const dsattn_v4 *m, size_t max_seq_len);

/* Fill every cache as if `depth` tokens had been consumed, with random
 * valid packed rows and a compressor state a decode step can continue
 * from (benchmarks at 1M context).  Sets the position to depth. */
dsattn_status dsattn_v4_seq_fill_synthetic(dsattn_v4_seq *s, int64_t depth,
                                           uint64_t seed);

/* Sessions (the "Sessions" section of dsattn.h).  The loaded sequence keeps the saved empty-row mode. */
dsattn_status dsattn_v4_seq_save(const dsattn_v4_seq *s, const char *path, char *err, size_t errlen);
dsattn_status dsattn_v4_seq_load(dsattn_v4_seq **out, const dsattn_v4 *m, const char *path,
                                 size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_v4_seq_load_buffer(dsattn_v4_seq **out, const dsattn_v4 *m, const void *buf,
                                        size_t len, size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_v4_seq_clone(dsattn_v4_seq **out, const dsattn_v4_seq *s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* DSATTN_V4_H */
