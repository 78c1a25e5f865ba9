/* dsattn_mla.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly.
 *
 * ==== MLA: DeepSeek-V3, and MLA + DSA: DeepSeek-V3.2 ====================
 *
 * A dsattn_mla is the attention part of a V3 (model_type deepseek_v3) or
 * V3.2 (deepseek_v32: MLA plus the lightning indexer) model: config and
 * weights.  A dsattn_mla_seq is one sequence over it: the per-layer caches
 * in the format chosen at creation, and for V3.2 the 132-byte FP8 index-key
 * cache.
 *
 * Cache formats (bytes per token per layer at the released dims):
 *   NAIVE        expanded K [H, nope+rope] and V [H, v] in bf16 (the
 *                official attn_impl = "naive" buffers)             81,920 B
 *   LATENT_BF16  kv_norm latent + RoPE'd shared key, bf16 (the official
 *                attn_impl = "absorb" kv_cache/pe_cache; default)   1,152 B
 *   LATENT_FP8   FlashMLA "V32_FP8Sparse" rows: 512 E4M3 + 4 fp32 scales
 *                (per 128) + 64 bf16 rope                             656 B
 * V3.2 adds 128 E4M3 codes + one fp32 scale of index key:             132 B
 *
 * Which attention path runs follows the official code:
 *   V3:   the absorbed path for prefill and decode with a latent cache
 *         (attn_impl "absorb", the default), the expanded path with NAIVE.
 *   V3.2: prefill (n > 1) is the non-absorbed MHA path over the chunk's own
 *         expanded K/V with the index mask; decode (n = 1) is the absorbed
 *         path over the latent cache with the index mask (or the expanded
 *         path over a NAIVE cache).
 * The two paths are the same maths rounded to bf16 at different points;
 * they agree to about 1e-2 relative (tests/test_mla.c states the bound).
 *
 * Calling protocol: for each chunk, call dsattn_mla_attn_forward for every
 * layer 0..n_layers-1 with that layer's normalised input, then
 * dsattn_mla_seq_advance(n).  The first chunk may be a prefill of n >= 1
 * tokens at position 0 (causal); every later chunk is one token, as in the
 * reference's generate loop.  dsattn_mla_stack_forward runs the golden-case
 * stand-in block h += attn_l(bf16(RMSNorm_l(h))) over all layers and
 * advances.
 *
 * YaRN (rope_factor, original_seq_len, beta_fast/slow) and the mscale^2
 * factor on the softmax scale are on exactly when the config's max_seq_len
 * (ModelArgs default 16384 when absent) exceeds original_seq_len, as in the
 * reference.  A sequence's capacity is its own max_seq_len argument.
 */
#ifndef DSATTN_MLA_H
#define DSATTN_MLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)  /* the exported API: see CMakeLists.txt */
#endif

typedef enum {
    DSATTN_MLA_CACHE_NAIVE       = 0,
    DSATTN_MLA_CACHE_LATENT_BF16 = 1,
    DSATTN_MLA_CACHE_LATENT_FP8  = 2,
} dsattn_mla_cache;

typedef struct dsattn_mla     dsattn_mla;
typedef struct dsattn_mla_seq dsattn_mla_seq;

/* Load from a config.json (official inference keys or HF keys) and a
 * safetensors file, shard index or folder with the official names
 * (layers.{i}.attn_norm.weight, layers.{i}.attn.{wq_a,q_norm,wq_b,wkv_a,
 * kv_norm,wkv_b,wo}, V3.2 also layers.{i}.attn.indexer.{wq_b,wk,k_norm,
 * weights_proj}; HF names are mapped as convert.py does).  FP8 weights of a
 * V3 checkpoint are dequantized to bf16 once (the reference's default
 * gemm_impl "bf16"); V3.2 keeps them FP8 and quantizes activations per 128
 * (scale_fmt ue8m0: power-of-two scales).  config_json NULL: the
 * config.json beside the weights. */
dsattn_status dsattn_mla_load(dsattn_mla **out, const char *config_json,
                              const char *weights, char *err, size_t errlen);
/* The same for layers [first_layer, first_layer + n_layers) only: the
 * other layers' tensors are neither read nor converted (a V3 checkpoint's
 * FP8 projections become about 374 MB of bf16 per layer), and a forward of
 * another layer gives DSATTN_ERR_UNSUPPORTED; the stand-in stacks need
 * every layer.  For one pipeline stage, or timing one layer (dsattn bench
 * mla --weights). */
dsattn_status dsattn_mla_load_layers(dsattn_mla **out, const char *config_json,
                                     const char *weights, int first_layer, int n_layers,
                                     char *err, size_t errlen);
/* Random weights from a seed at the config's dims (fp8 != 0: FP8 E4M3 with
 * 128x128 power-of-two block scales, as the released checkpoints store,
 * partial blocks at the edges; else bf16).  V3.2 with FP8 weights needs dim,
 * q_lora_rank, kv_lora_rank and n_heads * v_head_dim in multiples of 128
 * (it quantizes each FP8 Linear's input in blocks of 128): else
 * DSATTN_ERR_UNSUPPORTED. */
dsattn_status dsattn_mla_create_random(dsattn_mla **out, const char *config_json,
                                       uint64_t seed, int fp8, char *err,
                                       size_t errlen);
/* Config only, no weights: sequences and bills work, forward does not
 * (DSATTN_ERR_UNSUPPORTED).  For sizing caches at the released dims. */
dsattn_status dsattn_mla_create_config_only(dsattn_mla **out,
                                            const char *config_json,
                                            char *err, size_t errlen);
void dsattn_mla_destroy(dsattn_mla *m);

int    dsattn_mla_is_dsa(const dsattn_mla *m);      /* 1 for V3.2          */
int    dsattn_mla_n_layers(const dsattn_mla *m);
int    dsattn_mla_dim(const dsattn_mla *m);
int    dsattn_mla_has_weights(const dsattn_mla *m);
/* The softmax scale in use: qk_head_dim^-0.5, times mscale^2 under YaRN. */
float  dsattn_mla_softmax_scale(const dsattn_mla *m);
/* Bytes of weights the stack holds (all layers, as stored). */
size_t dsattn_mla_weight_bytes(const dsattn_mla *m);

/* A sequence holding the caches of every layer, max_seq_len tokens. */
dsattn_status dsattn_mla_seq_create(dsattn_mla_seq **out, const dsattn_mla *m,
                                    size_t max_seq_len, dsattn_mla_cache cache);
/* A sequence holding only layers [first_layer, first_layer + n_layers): one
 * pipeline stage's share of the caches, or one layer of a checkpoint timed
 * at a depth whose whole-model cache would not fit in memory (dsattn bench
 * mla --weights).  Forwards, accessors and the batched call take only the
 * layers it holds (DSATTN_ERR_INVALID_ARG otherwise); the stand-in stacks
 * take only a sequence of every layer. */
dsattn_status dsattn_mla_seq_create_layers(dsattn_mla_seq **out, const dsattn_mla *m,
                                           size_t max_seq_len, dsattn_mla_cache cache,
                                           int first_layer, int n_layers);
void    dsattn_mla_seq_destroy(dsattn_mla_seq *s);
int64_t dsattn_mla_seq_pos(const dsattn_mla_seq *s);
dsattn_mla_cache dsattn_mla_seq_cache_format(const dsattn_mla_seq *s);

/* x: [n, dim] the layer's normalised input (bf16 values); out: [n, dim]
 * (bf16 values).  n > 1 only at position 0. */
dsattn_status dsattn_mla_attn_forward(dsattn_ctx *ctx, dsattn_mla_seq *s,
                                      int layer, const float *x, size_t n,
                                      float *out);
dsattn_status dsattn_mla_seq_advance(dsattn_mla_seq *s, size_t n);

/* Golden-case stand-in stack over all layers; h: [n, dim] fp32 residual,
 * updated in place.  attn_in/attn_out (optional, [n_layers, n, dim]). */
dsattn_status dsattn_mla_stack_forward(dsattn_ctx *ctx, dsattn_mla_seq *s,
                                       float *h, size_t n, float *attn_in,
                                       float *attn_out);

/* ---- Batched decode across sequences ----
 * One decode token for each of n_seqs sequences of the same model, each at
 * its own position (0 included: its first token): x, out are [n_seqs, dim]
 * row-major, row i belonging to seqs[i].  Every weight projection (wq_a,
 * wq_b or wq, wkv_a, the absorption products with wkv_b, wo, and V3.2's
 * indexer wq_b / wk / weights_proj) runs once over the n_seqs rows, so each
 * weight is read once per step; the attention over each sequence's own
 * cache, the indexer scores and the top-k run per sequence.  A batch may
 * mix depths and cache formats; sequences may join or leave between steps.
 * Row i's result and cache writes are those of dsattn_mla_attn_forward on
 * seqs[i] alone: bit for bit in reference mode, within the fast path's
 * bounds in fast mode.
 * Every sequence is checked before anything is written: non-NULL, of the
 * model of seqs[0], room for one more token, no pointer twice.  On failure
 * the status is returned, *failed (if non-NULL) gets the index of the
 * first bad sequence (SIZE_MAX when the fault is no sequence's: a NULL
 * argument, n_seqs 0, the layer, a model without weights) and no sequence
 * and no output is written.  The caller advances every sequence after the last
 * layer (dsattn_mla_seq_advance(s, 1)), as with the one-sequence API.
 * The B-row buffers live in the context (grow-only): a step with no more
 * sequences than an earlier one on the same context allocates nothing. */
dsattn_status dsattn_mla_attn_forward_batch(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x,
                                            float *out, size_t *failed);
/* The golden-case stand-in stack for one decode token per sequence: h
 * [n_seqs, dim] fp32 residuals updated in place; attn_in / attn_out
 * (optional) [n_layers, n_seqs, dim].  Advances every sequence by one. */
dsattn_status dsattn_mla_stack_forward_batch(dsattn_ctx *ctx, dsattn_mla_seq *const *seqs,
                                             size_t n_seqs, float *h, float *attn_in,
                                             float *attn_out, size_t *failed);

/* V3.2: the last chunk's selection of a layer, as token positions attended
 * (<= the query's position), ascending, -1 padded: rows x width with
 * width = min(index_topk, end position).  DSATTN_ERR_NOT_FOUND for V3. */
dsattn_status dsattn_mla_seq_selection(const dsattn_mla_seq *s, int layer,
                                       const int32_t **rows, size_t *n_rows,
                                       size_t *width);

/* The widths of dsattn_mla_seq_latent's two outputs: kv_lora_rank and
 * qk_rope_head_dim (either pointer may be NULL). */
dsattn_status dsattn_mla_latent_dims(const dsattn_mla *m, int *kv_lora_rank, int *rope_dim);
/* Cache contents of token `pos` (< position) of a layer, dequantized:
 * latent caches: kv[kv_lora_rank] and pe[qk_rope_head_dim] (either may be
 * NULL; dsattn_mla_latent_dims gives both widths); NAIVE:
 * DSATTN_ERR_NOT_FOUND. */
dsattn_status dsattn_mla_seq_latent(const dsattn_mla_seq *s, int layer,
                                    size_t pos, float *kv, float *pe);
/* V3.2 index key of token `pos`: 128 E4M3 codes and the fp32 scale. */
dsattn_status dsattn_mla_seq_index_key(const dsattn_mla_seq *s, int layer,
                                       size_t pos, uint8_t *codes, float *scale);

/* The bill, measured from the live allocations: global KV bytes per token =
 * (all layers' MLA cache + index cache bytes allocated) / max_seq_len; MLA
 * has no window or compressor state. */
dsattn_status dsattn_mla_seq_kv_bill(const dsattn_mla_seq *s, dsattn_kv_bill *b);

/*
 * The decode scratch (the kv_bill's scratch_bytes) a sequence of capacity
 * max_seq_len would allocate, without creating one (the bill's
 * per-sequence column at a context no cache could be made for); 0 for a
 * NULL model, SIZE_MAX when the size overflows. */
size_t dsattn_mla_seq_scratch_at(const dsattn_mla *m, size_t max_seq_len,
                                 dsattn_mla_cache cache);

/* Fill the caches as if `depth` tokens had been consumed, with random valid
 * entries (benchmarks at 32K-128K context).  Sets the position to depth. */
dsattn_status dsattn_mla_seq_fill_synthetic(dsattn_mla_seq *s, int64_t depth,
                                            uint64_t seed);

/* Sessions (the "Sessions" section of dsattn.h).  The loaded sequence keeps the saved cache format. */
dsattn_status dsattn_mla_seq_save(const dsattn_mla_seq *s, const char *path, char *err, size_t errlen);
dsattn_status dsattn_mla_seq_load(dsattn_mla_seq **out, const dsattn_mla *m, const char *path,
                                  size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_mla_seq_load_buffer(dsattn_mla_seq **out, const dsattn_mla *m, const void *buf,
                                         size_t len, size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_mla_seq_clone(dsattn_mla_seq **out, const dsattn_mla_seq *s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* DSATTN_MLA_H */
