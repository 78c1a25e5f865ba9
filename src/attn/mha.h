/* mha.h - internal layout of the MHA / GQA (DeepSeek-LLM 7B / 67B, HF
 * Llama form) attention stack.
 *
 * The public face is include/dsattn_mha.h; this header holds what the model
 * (mha_model.c), the forward pass (mha_forward.c), the bill and the tests
 * share.  Vocabulary: H = num_attention_heads, Hkv = num_key_value_heads,
 * G = H / Hkv query heads per KV head, d = head_dim = hidden / H, T = keys
 * visible to a query (its position + 1).
 */
#ifndef DSATTN_MHA_INTERNAL_H
#define DSATTN_MHA_INTERNAL_H

#include "dsattn.h"
#include "internal.h"
#include "mha_kernels.h"
#include "ops.h"
#include "weights.h"


typedef struct {
    int64_t hidden, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_position_embeddings;       /* reported, not enforced        */
    double  rope_theta;
    float   rms_norm_eps;
} dsattn_mha_config;

typedef struct {
    float         *norm;                    /* input_layernorm [hidden]     */
    dsattn_weight  wq, wk, wv, wo;          /* bf16 [out, in], no bias      */
} dsattn_mha_layer_w;

struct dsattn_mha {
    dsattn_mha_config   cfg;
    dsattn_rope         rope;               /* full RoPE, all d dims        */
    dsattn_mha_layer_w *layer;              /* [n_layers]                   */
    int                 w_first, w_count;   /* layers that have weights     */
    dsattn_owned        owned;                  /* buffers to free           */
    void               *ckpt;               /* dsattn_ckpt, if loaded       */
};

/* Cache of one layer, bf16 bits:
 *   K [Hkv][cap][d]  post-RoPE keys (as HF's past_key_value holds them),
 *                    stored key-tiled: token tile b (tokens b*KT ..
 *                    b*KT+w-1, w = min(KT, cap - b*KT)) is a [d][w]
 *                    matrix, so one 64-byte line holds one dim of 32 keys
 *                    and the score pass puts keys in SIMD lanes (scores of
 *                    32 keys per FMA chain, no horizontal sums).
 *   V [Hkv][cap][d]  values, key-tiled the other way: token tile b (VT
 *                    = 64 tokens, w = min(VT, cap - b*VT)) is split in
 *                    blocks of 32 dims, each a [w][32] matrix (the last
 *                    block [w][d % 32] when d is not a multiple of 32), so
 *                    one line is 32 dims of one key and the P.V pass puts
 *                    dims in lanes (acc[h][:] += p[h][j] * v_j, no
 *                    horizontal sums) while reading each block as one
 *                    contiguous 4 KB run.
 * Exactly Hkv * d * cap values each, no padding (last tiles are only w
 * keys wide): the bill sees the bytes the layout needs.  One KV head's
 * K and V are each contiguous, so the fast decode streams them once for all
 * G query heads of its group. */
/* DSATTN_MHA_KTILE / DSATTN_MHA_VTILE: mha_kernels.h */

typedef struct {
    uint16_t *k, *v;
} dsattn_mha_layer_s;

/* Offset of K[g][t][i] in a layer's K buffer (cap tokens per head). */
static inline size_t dsattn_mha_k_index(size_t cap, size_t d, size_t g, size_t t, size_t i)
{
    size_t b0 = t / DSATTN_MHA_KTILE * DSATTN_MHA_KTILE;
    size_t w = DSATTN_MIN((size_t)DSATTN_MHA_KTILE, cap - b0);
    return g * cap * d + b0 * d + i * w + (t - b0);
}

/* Offset of V[g][t][i] in a layer's V buffer. */
static inline size_t dsattn_mha_v_index(size_t cap, size_t d, size_t g, size_t t, size_t i)
{
    size_t b0 = t / DSATTN_MHA_VTILE * DSATTN_MHA_VTILE;
    size_t w = DSATTN_MIN((size_t)DSATTN_MHA_VTILE, cap - b0);
    size_t blk = i / 32 * 32, bw = DSATTN_MIN((size_t)32, d - blk);
    return g * cap * d + b0 * d + blk * w + (t - b0) * bw + (i - blk);
}

struct dsattn_mha_seq {
    const dsattn_mha   *m;
    int64_t             pos;
    size_t              max_seq_len;        /* cap: tokens per cache        */
    size_t              bytes_allocated;    /* K + V, as seq_create made them */
    int                 first, count;       /* layers held                  */
    dsattn_mha_layer_s *layer;              /* [count]                      */
    void               *scratch;            /* forward scratch, sized at
                                             * creation for a decode step
                                             * at capacity (a longer chunk
                                             * grows it)                    */
    size_t              scratch_size;
};

/* Scratch bytes one decode step (one token, any position below cap) of
 * the forward needs, in either mode, with up to dsattn_ws_threads()
 * threads; SIZE_MAX on overflow. */
size_t dsattn_mha_decode_scratch_bytes(const dsattn_mha_config *c, size_t cap);

dsattn_status dsattn_mha_config_load(dsattn_mha_config *c, const char *path,
                                     char *err, size_t errlen);

/* KV cache bytes per token per layer: K and V, Hkv heads of d bf16. */
static inline size_t dsattn_mha_kv_bytes_per_layer(const dsattn_mha_config *c)
{
    return 2u * (size_t)c->n_kv_heads * (size_t)c->head_dim * 2u;
}

#endif /* DSATTN_MHA_INTERNAL_H */
