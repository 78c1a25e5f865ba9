/* dsattn_mha.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly.
 *
 * ==== MHA: DeepSeek-LLM 7B, and GQA: DeepSeek-LLM 67B ===================
 *
 * DeepSeek's first generation ships no model code: both repos declare
 * model_type "llama" and transformers 4.33.1, so the reference here is
 * HF LlamaAttention (eager, bf16).  There is no official DeepSeek
 * reference implementation or golden output for these two models;
 * docs/bill.md and src/attn/mha_forward.c state the arithmetic we chose.
 *
 * A dsattn_mha is the attention part of a Llama-form model: config and
 * (random, bf16) weights for all layers, a contiguous range of layers, or
 * none at all (a config-only model sizes caches and bills).  A
 * dsattn_mha_seq is one sequence over it: for each layer it holds, a bf16
 * K cache (post-RoPE keys) and V cache of num_key_value_heads heads.
 * GQA's repeat_kv is a logical index (query head h reads KV head
 * h / (num_attention_heads / num_key_value_heads)); the cache never holds
 * a copy, so its size is 2 * n_kv_heads * head_dim * 2 bytes per token per
 * layer: 16,384 B for 7B (32 KV heads), 4,096 B for 67B (8 KV heads).
 *
 * Calling protocol: for each chunk of n tokens, call dsattn_mha_attn_forward
 * for every layer the sequence holds with that layer's normalised input,
 * then dsattn_mha_seq_advance(n).  Any chunk size works at any position
 * (Llama has no special prefill path); every query attends causally to all
 * positions <= its own.
 */
#ifndef DSATTN_MHA_H
#define DSATTN_MHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)  /* the exported API: see CMakeLists.txt */
#endif

typedef struct dsattn_mha     dsattn_mha;
typedef struct dsattn_mha_seq dsattn_mha_seq;

/* Random bf16 weights from a seed for every layer, from an HF config.json
 * (model_type "llama": hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, rope_theta, max_position_embeddings, rms_norm_eps).
 * Unsupported llama features (rope_scaling, attention_bias, pretraining_tp
 * > 1) are DSATTN_ERR_UNSUPPORTED, naming the key. */
dsattn_status dsattn_mha_create_random(dsattn_mha **out, const char *config_json,
                                       uint64_t seed, char *err, size_t errlen);
/* The same, with weights only for layers [first_layer, first_layer + n)
 * (one layer at real dims is 288 MiB for 67B; the whole stack is 27 GiB).
 * A layer's weights do not depend on which other layers were made.
 * Forward on a layer without weights is DSATTN_ERR_UNSUPPORTED. */
dsattn_status dsattn_mha_create_random_layers(dsattn_mha **out,
                                              const char *config_json,
                                              uint64_t seed, int first_layer,
                                              int n_layers, char *err,
                                              size_t errlen);
/* A released checkpoint (DeepSeek-LLM 7B / 67B, HF Llama names:
 * model.layers.{i}.self_attn.{q,k,v,o}_proj.weight and
 * model.layers.{i}.input_layernorm.weight): `weights` is one .safetensors
 * file, a model.safetensors.index.json or a folder holding either; every
 * layer's tensors are checked against the config (shape, dtype, finite
 * norm weights) and borrowed from the memory-mapped files, which stay
 * open until dsattn_mha_destroy.  bf16 tensors are used as stored; F32 or
 * F16 ones are rounded to bf16 once.  Errors name the tensor and file.
 * config_json NULL: the config.json beside the weights. */
dsattn_status dsattn_mha_load(dsattn_mha **out, const char *config_json,
                              const char *weights, char *err, size_t errlen);
/* Config only, no weights: sequences, fills and bills work, forward does
 * not (DSATTN_ERR_UNSUPPORTED). */
dsattn_status dsattn_mha_load_config(dsattn_mha **out, const char *config_json,
                                     char *err, size_t errlen);
void dsattn_mha_destroy(dsattn_mha *m);

int    dsattn_mha_n_layers(const dsattn_mha *m);
int    dsattn_mha_dim(const dsattn_mha *m);         /* hidden_size          */
int    dsattn_mha_n_heads(const dsattn_mha *m);
int    dsattn_mha_n_kv_heads(const dsattn_mha *m);
int    dsattn_mha_head_dim(const dsattn_mha *m);
int    dsattn_mha_has_weights(const dsattn_mha *m, int layer);
/* Bytes of weights the model holds (all layers it has, as stored). */
size_t dsattn_mha_weight_bytes(const dsattn_mha *m);

/* A sequence holding the caches of every layer, max_seq_len tokens. */
dsattn_status dsattn_mha_seq_create(dsattn_mha_seq **out, const dsattn_mha *m,
                                    size_t max_seq_len);
/* A sequence holding only layers [first_layer, first_layer + n_layers):
 * one pipeline stage's share of the caches (the bill decodes one layer at
 * a depth whose whole-model cache would not fit in memory). */
dsattn_status dsattn_mha_seq_create_layers(dsattn_mha_seq **out,
                                           const dsattn_mha *m,
                                           size_t max_seq_len, int first_layer,
                                           int n_layers);
void    dsattn_mha_seq_destroy(dsattn_mha_seq *s);
int64_t dsattn_mha_seq_pos(const dsattn_mha_seq *s);

/* x: [n, dim] the layer's normalised input (bf16 values); out: [n, dim]
 * (bf16 values).  Tokens sit at positions pos .. pos+n-1; their K/V are
 * written to the cache, then each attends to positions <= its own. */
dsattn_status dsattn_mha_attn_forward(dsattn_ctx *ctx, dsattn_mha_seq *s,
                                      int layer, const float *x, size_t n,
                                      float *out);
dsattn_status dsattn_mha_seq_advance(dsattn_mha_seq *s, size_t n);

/* Batched decode: one token for each of n_seqs sequences of the same model
 * in one call, each at its own position, the layer's weights read once for
 * all of them (a serving loop's step).  x, out: [n_seqs, dim].  The
 * contract is V4.1's (dsattn_v41_attn_forward_batch in dsattn.h): row i
 * equals dsattn_mha_attn_forward on seqs[i] alone (bit for bit in
 * reference mode; in fast mode within the fast path's bounds, 8 rows and
 * more taking the tiled Linear), every sequence is checked first and a
 * failed call changes nothing, *failed names the first bad sequence
 * (SIZE_MAX: not one sequence's), the caller advances each sequence after
 * the last layer, and a steady step allocates nothing.  A sequence may hold
 * only some layers (dsattn_mha_seq_create_layers) if it holds `layer`. */
dsattn_status dsattn_mha_attn_forward_batch(dsattn_ctx *ctx, dsattn_mha_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x,
                                            float *out, size_t *failed);

/* Cache row of token `pos` (< capacity) of a held layer, as floats:
 * k and v [n_kv_heads * head_dim] (either may be NULL).  Rows below the
 * position are the sequence's tokens; a row at or past it holds what was
 * last written there (a layer forward writes the step's rows before the
 * caller advances). */
dsattn_status dsattn_mha_seq_kv(const dsattn_mha_seq *s, int layer, size_t pos,
                                float *k, float *v);

/* The bill, measured from the live allocations: global KV bytes per token
 * = (K + V bytes allocated for every held layer) / max_seq_len.  MHA/GQA
 * has no window or other per-sequence state. */
dsattn_status dsattn_mha_seq_kv_bill(const dsattn_mha_seq *s, dsattn_kv_bill *b);

/*
 * The decode scratch (the kv_bill's scratch_bytes) a sequence of capacity
 * max_seq_len would allocate, without creating one (the bill's
 * per-sequence column at a context no cache could be made for); 0 for a
 * NULL model, SIZE_MAX when the size overflows. */
size_t dsattn_mha_seq_scratch_at(const dsattn_mha *m, size_t max_seq_len);

/* Fill the held layers' caches as if `depth` tokens had been consumed,
 * with random bf16 values in [-1, 1) (benchmarks at deep contexts).  Sets
 * the position to depth (< max_seq_len, so one more token fits). */
dsattn_status dsattn_mha_seq_fill_synthetic(dsattn_mha_seq *s, int64_t depth,
                                            uint64_t seed);

/* Sessions (the "Sessions" section of dsattn.h).  The loaded sequence holds the saved layers. */
dsattn_status dsattn_mha_seq_save(const dsattn_mha_seq *s, const char *path, char *err, size_t errlen);
dsattn_status dsattn_mha_seq_load(dsattn_mha_seq **out, const dsattn_mha *m, const char *path,
                                  size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_mha_seq_load_buffer(dsattn_mha_seq **out, const dsattn_mha *m, const void *buf,
                                         size_t len, size_t max_seq_len, char *err, size_t errlen);
dsattn_status dsattn_mha_seq_clone(dsattn_mha_seq **out, const dsattn_mha_seq *s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* DSATTN_MHA_H */
