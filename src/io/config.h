/* config.h - model configuration of every DeepSeek generation dsattn loads,
 * read from either config format DeepSeek ships, and the V4.1 layer plan.
 *
 * Two formats exist for each release:
 *   - HF `config.json` (hidden_size, num_hidden_layers, ...; V4.1 nests the
 *     text model under `text_config`; `quantization_config` carries
 *     `weight_block_size` and `scale_fmt`);
 *   - the flat `inference/config.json` whose keys are the reference code's
 *     ModelArgs field names (dim, n_layers, ...).
 * Both are normalised into one dsattn_model_config using the inference names.
 *
 * Policy: structural keys (dimensions, layer counts, compress ratios, source
 * layers) are required, and contradictions are errors.  Only the RoPE/YaRN
 * and norm parameters fall back to the reference ModelArgs defaults when
 * absent, because the official V3 config files rely on exactly that.
 *
 * Deliberately not here: tensor names and shapes (names.h), file access
 * (checkpoint.h).
 */
#ifndef DSATTN_CONFIG_H
#define DSATTN_CONFIG_H

#include "dsattn.h"
#include "internal.h"

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>


typedef enum {
    DSATTN_ARCH_UNKNOWN = 0,
    DSATTN_ARCH_V3,      /* MLA                       (deepseek_v3)  */
    DSATTN_ARCH_V32,     /* MLA + DSA indexer         (deepseek_v32) */
    DSATTN_ARCH_V4,      /* CSA + HCA                 (deepseek_v4)  */
    DSATTN_ARCH_V41,     /* CSA2, cross-layer sharing (deepseek_v41) */
    DSATTN_ARCH_LLAMA,   /* MHA / GQA, DeepSeek-LLM 7B / 67B (llama)   */
} dsattn_arch;

const char *dsattn_arch_name(dsattn_arch a);   /* "deepseek_v41", ... */
/* The block in which the reference quantizes the input of an FP8 Linear
 * (act_quant, which needs the input dim to be a multiple of it): 32 for
 * V4.1, 128 for V3.2 and V4; 0 for V3, whose FP8 weights are dequantized
 * and run as bf16 GEMMs.  wo_a (V4, V4.1) is an einsum over dequantized
 * weights and takes no activation quantization. */
int64_t dsattn_fp8_act_block(dsattn_arch a);

typedef struct {
    dsattn_arch arch;
    int         hf_keys;           /* 1 if read from an HF config.json      */

    /* common */
    int64_t dim, n_layers, n_heads;
    int64_t n_kv_heads;            /* llama: num_key_value_heads (GQA)      */
    int64_t n_mtp;                 /* MTP / DSpark layers after n_layers    */
    int64_t q_lora_rank;           /* 0 = no low-rank q (V3 allows it)      */

    /* MLA (V3, V3.2) */
    int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;

    /* V4 / V4.1; llama: hidden_size / num_attention_heads */
    int64_t head_dim, rope_head_dim, o_groups, o_lora_rank, window_size;
    int64_t compress_ratios[DSATTN_MAX_LAYERS];
    int64_t n_compress_ratios;     /* n_layers + n_mtp                      */

    /* indexer (V3.2, V4, V4.1) */
    int64_t index_n_heads, index_head_dim, index_topk;

    /* V4.1 cross-layer sharing */
    int64_t kv_source_layers[DSATTN_MAX_LAYERS], n_kv_source_layers;
    int64_t index_source_layers[DSATTN_MAX_LAYERS], n_index_source_layers;
    int64_t candidate_source_layer, candidate_topk_blocks, candidate_block_size;

    /* RoPE / YaRN / norms (defaults = the generation's ModelArgs defaults) */
    double  rope_theta, compress_rope_theta, rope_factor, mscale, norm_eps;
    int64_t original_seq_len, beta_fast, beta_slow, max_seq_len;

    /* weight storage as the config declares it */
    char    dtype[16];             /* "bf16" / "fp8" (as written)           */
    char    scale_fmt[16];         /* "ue8m0" or "" (fp32 scale_inv)        */
    char    scale_dtype[16];       /* V4 "scale_dtype" as written, or ""    */
    int64_t weight_block;          /* FP8 block edge from weight_block_size,
                                      0 if the config does not say         */
} dsattn_model_config;

/* Parse either format.  `what` names the source (file path) in errors.
 * DSATTN_ERR_UNSUPPORTED for an unknown model_type; FORMAT / NOT_FOUND for
 * bad or missing keys, with the key named. */
dsattn_status dsattn_config_from_json(dsattn_model_config *cfg, const cJSON *root,
                                      const char *what, char *err, size_t errlen);
dsattn_status dsattn_config_load(dsattn_model_config *cfg, const char *path,
                                 char *err, size_t errlen);

/* Compress ratio of layer i (0 past the list). */
static inline int64_t dsattn_config_ratio(const dsattn_model_config *c, int64_t i)
{
    return i >= 0 && i < c->n_compress_ratios ? c->compress_ratios[i] : 0;
}

/* ==== V4.1 layer plan =================================================== */
/* The rule (model.py Attention.__init__ flags, docs/semantics.md §7.1):
 *   layer < n_layers, ratio 0                          -> SWA (window only)
 *   ratio > 0 and in kv_source_layers                   -> FULL (publishes
 *       compressed KV, index K, top-k; candidates if candidate source)
 *   ratio > 0, in index_source_layers, not a kv source  -> REINDEX
 *   any other ratio > 0                                 -> REUSE
 *   entries at n_layers.. (MTP / DSpark)                -> MTP (reported,
 *       not run by the attention stack)
 * Errors: a kv/index source whose ratio is 0 or that lies outside the
 * backbone; a kv source that is not also an index source; a compressed
 * layer with no kv source at or before it, or whose ratio differs from its
 * kv source's; a compressed layer with no index source at or before it; a
 * candidate source that is not an index source; duplicate list entries
 * (the config reader's).  A REINDEX layer before the candidate source (or
 * in a plan without one) scores every visible entry, as the reference does.
 * This is the one plan: the V4.1 model takes its layer modes from it. */
/* dsattn_v41_mode (SWA, FULL, REINDEX, REUSE, MTP) is public: include/dsattn.h. */

const char *dsattn_v41_mode_name(dsattn_v41_mode m);  /* "SWA", "Full", ... */

typedef struct {
    dsattn_v41_mode mode;
    int64_t ratio;
    int64_t kv_source;        /* layer whose compressed KV it reads, -1 */
    int64_t index_source;     /* layer whose top-k it reads, -1         */
    int     is_candidate_source;
} dsattn_v41_layer_plan;

typedef struct {
    int64_t n_layers, n_mtp;
    dsattn_v41_layer_plan layer[DSATTN_MAX_LAYERS];  /* n_layers + n_mtp */
    int64_t n_full, n_reindex, n_reuse, n_swa;
} dsattn_v41_plan;

dsattn_status dsattn_v41_plan_from_config(const dsattn_model_config *c,
                                          dsattn_v41_plan *plan,
                                          char *err, size_t errlen);

#endif /* DSATTN_CONFIG_H */
