/* csa_config.c - the config of the compressed-sparse-attention generations
 * (V4, V4.1): reading the fields they share from the io layer's normalised
 * model config, the checks they share, the per-ratio RoPE table, the dims
 * of the shared attention blocks' view of a layer and a weight's stored
 * size (csa.h).
 *
 * Owns: nothing generation-specific; V4's scale rules and V4.1's layer
 * plan are their model files' `finish` steps.
 */
#include "csa.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__); \
    } while (0)

static dsattn_status copy_shared(dsattn_csa_config *c, const dsattn_model_config *mc,
                                 dsattn_arch arch, int64_t default_block, char *err,
                                 size_t errlen)
{
    if (mc->arch != arch)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "config is %s, not %s",
                           dsattn_arch_name(mc->arch), dsattn_arch_name(arch));
    CHECKF(mc->n_compress_ratios <= DSATTN_MAX_LAYERS, "too many layers (%lld)",
           (long long)mc->n_compress_ratios);
    c->dim = mc->dim;
    c->n_layers = mc->n_layers;
    c->n_total_layers = mc->n_compress_ratios;
    c->n_heads = mc->n_heads;
    c->head_dim = mc->head_dim;
    c->rope_head_dim = mc->rope_head_dim;
    c->q_lora_rank = mc->q_lora_rank;
    c->o_groups = mc->o_groups;
    c->o_lora_rank = mc->o_lora_rank;
    c->window_size = mc->window_size;
    for (int64_t l = 0; l < mc->n_compress_ratios; l++)
        c->compress_ratios[l] = mc->compress_ratios[l];
    c->index_n_heads = mc->index_n_heads;
    c->index_head_dim = mc->index_head_dim;
    c->index_topk = mc->index_topk;
    c->rope_theta = mc->rope_theta;
    c->compress_rope_theta = mc->compress_rope_theta;
    c->rope_factor = mc->rope_factor;
    c->original_seq_len = (double)mc->original_seq_len;
    c->beta_fast = (double)mc->beta_fast;
    c->beta_slow = (double)mc->beta_slow;
    c->norm_eps = (float)mc->norm_eps;
    c->fp8 = !strcmp(mc->dtype, "fp8");
    c->fp8_block = mc->weight_block ? mc->weight_block : default_block;
    return DSATTN_OK;
}

dsattn_status dsattn_csa_config_load(dsattn_csa_config *c, const char *path, dsattn_arch arch,
                                     int64_t default_block, dsattn_csa_finish_fn finish,
                                     char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->candidate_source_layer = -1;
    dsattn_model_config *mc = calloc(1, sizeof *mc);
    if (!mc) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    dsattn_status st = dsattn_config_load(mc, path, err, errlen);
    if (!st) st = copy_shared(c, mc, arch, default_block, err, errlen);
    if (!st) st = finish(c, mc, err, errlen);
    free(mc);
    if (st && err && errlen && !strstr(err, path)) {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s: %s", path, err);
        snprintf(err, errlen, "%s", tmp);
    }
    return st;
}

dsattn_status dsattn_csa_config_check(const dsattn_csa_config *c, char *err, size_t errlen)
{
    /* the upper bounds are dsattn's fixed per-row buffers, all above
     * every published config */
    CHECKF(c->n_layers > 0 && c->n_layers <= c->n_total_layers &&
               c->n_total_layers <= DSATTN_MAX_LAYERS,
           "n_layers %lld / compress_ratios length %lld out of range (max %d)",
           (long long)c->n_layers, (long long)c->n_total_layers, DSATTN_MAX_LAYERS);
    CHECKF(c->dim > 0 && c->dim <= (1 << 16),
           "dim %lld must be positive and at most 65536 (a dsattn limit)", (long long)c->dim);
    CHECKF(c->n_heads > 0 && c->n_heads <= 512,
           "n_heads %lld must be positive and at most 512 (a dsattn limit)", (long long)c->n_heads);
    CHECKF(c->q_lora_rank > 0 && c->q_lora_rank <= (1 << 16),
           "q_lora_rank %lld must be positive and at most 65536 (a dsattn limit)",
           (long long)c->q_lora_rank);
    CHECKF(c->o_groups > 0 && c->n_heads % c->o_groups == 0,
           "o_groups %lld must divide n_heads %lld", (long long)c->o_groups, (long long)c->n_heads);
    CHECKF(c->o_lora_rank > 0 && c->o_lora_rank <= (1 << 16),
           "o_lora_rank %lld must be positive and at most 65536 (a dsattn limit)",
           (long long)c->o_lora_rank);
    CHECKF(c->window_size > 0 && c->window_size <= (1 << 20),
           "window_size %lld must be positive and at most 1048576 (a dsattn limit)",
           (long long)c->window_size);
    CHECKF(c->index_n_heads > 0 && c->index_n_heads <= 256,
           "index_n_heads %lld must be positive and at most 256 (a dsattn limit)",
           (long long)c->index_n_heads);
    CHECKF(c->index_topk > 0, "index_topk must be positive");
    CHECKF(c->norm_eps >= 0.0f, "norm_eps must be >= 0");
    return DSATTN_OK;
}

void dsattn_csa_layer_rope(dsattn_rope *r, const dsattn_csa_config *c, int64_t ratio)
{
    if (ratio > 0)
        dsattn_rope_init(r, (size_t)c->rope_head_dim, c->compress_rope_theta, 1,
                         c->original_seq_len, c->rope_factor, c->beta_fast, c->beta_slow);
    else
        dsattn_rope_init(r, (size_t)c->rope_head_dim, c->rope_theta, 0, 0, 1, 0, 0);
}

void dsattn_csa_attn_layer(dsattn_attn_layer *a, const dsattn_csa_config *c, int v4)
{
    a->H = (size_t)c->n_heads;
    a->D = (size_t)c->head_dim;
    a->rd = (size_t)c->rope_head_dim;
    a->G = (size_t)c->o_groups;
    a->R = (size_t)c->o_lora_rank;
    a->eps = c->norm_eps;
    a->head_rms = v4;
    a->aq.block = v4 ? 128 : 32;
    a->aq.scale = DSATTN_ACTQ_POW2;
    a->Hi = (size_t)c->index_n_heads;
    a->Di = (size_t)c->index_head_dim;
    a->hadamard = v4;
}

size_t dsattn_csa_stored_bytes(const dsattn_weight *w)
{
    if (!w->data) return 0;
    switch (w->kind) {
    case DSATTN_W_F32:  return w->rows * w->cols * 4;
    case DSATTN_W_BF16: return w->rows * w->cols * 2;
    case DSATTN_W_FP8:
        return w->rows * w->cols +
               ((w->rows + w->block - 1) / w->block) * ((w->cols + w->block - 1) / w->block);
    case DSATTN_W_FP4:  return w->rows * w->cols / 2 + w->rows * w->cols / 32;
    }
    return 0;
}
