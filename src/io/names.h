/* names.h - tensor names of each DeepSeek generation: the released (HF)
 * names mapped to the reference inference names the way each generation's
 * official inference/convert.py does it, the reverse map for writers, and
 * the list of attention tensors a config implies (name, shape, operator).
 *
 * All per-generation naming knowledge lives here: one rename table for
 * every generation (their converters differ only by keys that map to
 * themselves) and the per-generation attention tensor lists.  Inference names are the canonical ones everywhere else:
 *   V3 / V3.2 : layers.{i}.attn_norm.weight, layers.{i}.attn.wq_a.weight,
 *               .q_norm, .wq_b, .wkv_a, .kv_norm, .wkv_b, .wo
 *               (+ V3.2 .attn.indexer.{wq_b, wk, k_norm(+bias), weights_proj})
 *   V4 / V4.1 : layers.{i}.attn.{wq_a, q_norm, wq_b, wkv, kv_norm, attn_sink,
 *               wo_a, wo_b}, .attn.compressor.{wkv, wgate, norm, ape},
 *               .attn.indexer.{wq_b, weights_proj, wk, k_norm, compressor.*}
 *   llama     : layers.{i}.attn_norm.weight, layers.{i}.attn.{wq, wk, wv, wo}
 *               (DeepSeek-LLM 7B / 67B: HF self_attn.{q,k,v,o}_proj)
 * FP8 scales are `<linear>.scale` (inference) = `<linear>.weight_scale_inv`
 * (HF).  The V4/V4.1 releases already store inference names.
 *
 * Deliberately not here: file access and weight decoding.
 */
#ifndef DSATTN_NAMES_H
#define DSATTN_NAMES_H

#include "config.h"
#include "dsattn.h"

#include <stddef.h>
#include <stdint.h>

#define DSATTN_NAME_MAX 160

/* Released name -> inference name (convert.py rules: strip "model.",
 * self_attn->attn, mlp->ffn, weight_scale_inv->scale, then the key table).
 * Returns 1 if a rule changed the name, 0 if it passed through unchanged,
 * -1 if it does not fit in outlen. */
int dsattn_name_to_inference(dsattn_arch a, const char *in, char *out, size_t outlen);

/* Inference name -> released (HF) name, for writers.  Identity for V4/V4.1. */
int dsattn_name_to_hf(dsattn_arch a, const char *in, char *out, size_t outlen);

/* Layer index of an inference name "layers.{i}." or "mtp.{k}." (the latter
 * returned as n_layers + k when n_layers >= 0); -1 if neither. */
int64_t dsattn_name_layer(const char *name, int64_t n_layers);

/* One tensor the attention stack of a config needs. */
typedef enum {
    DSATTN_TS_LINEAR = 0,   /* base name; stored as base.weight (+ base.scale) */
    DSATTN_TS_VECTOR,       /* exact name (norm weight/bias, sink, ape)       */
} dsattn_ts_kind;

typedef struct {
    char           name[DSATTN_NAME_MAX];  /* inference name (LINEAR: base)  */
    dsattn_ts_kind kind;
    int            ndim;
    int64_t        shape[2];               /* LINEAR: [rows, cols] unpacked  */
    int64_t        layer;
    const char    *op;                     /* what it feeds, for `info`      */
} dsattn_tensor_spec;

/* Every attention tensor of layers 0..n_layers-1 the config implies, in
 * layer order.  *out is malloc'd; free() it. */
dsattn_status dsattn_expected_tensors(const dsattn_model_config *c,
                                      dsattn_tensor_spec **out, size_t *n,
                                      char *err, size_t errlen);

/* What an arbitrary inference name feeds (for listing files): fills desc
 * with e.g. "layer 3 (Full): query up-projection" or "not attention".
 * c may be NULL; sp/nsp are dsattn_expected_tensors(c) if the caller has
 * them (NULL: computed here, slower when describing many names). */
void dsattn_name_describe(const dsattn_model_config *c, const dsattn_tensor_spec *sp,
                          size_t nsp, const char *inf_name, char *desc, size_t desclen);

#endif /* DSATTN_NAMES_H */
