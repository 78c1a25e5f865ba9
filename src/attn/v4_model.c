/* v4_model.c - the V4 (CSA + HCA) model object: config, layer plan, weights.
 *
 * Owns: V4's config rules (its checks and scale format; the fields it shares
 * with V4.1 are read by csa_config.c), deriving each layer's kind
 * from compress_ratios exactly as Attention.__init__ does (0 -> sliding
 * window, 4 -> CSA with overlap and an indexer, anything else -> HCA; the
 * n_mtp trailing entries are the MTP block, not part of the stack),
 * binding the per-layer weights by their official inference names through
 * the io layer's checkpoint (one file, shard index or folder; borrowed from
 * the mapping, only FP8 wo_a converted to bf16 as the official conversion
 * does), random weights at any config's dims, and a config-only model for
 * bills at real size.
 * Not here: the forward pass and per-sequence state (v4_forward.c), the
 * config.json formats (src/io/config.c).
 */
#include "v4.h"

#include "checkpoint.h"
#include "model_glue.h"
#include "numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ==== Config ============================================================ */

size_t dsattn_v4_kv_bytes(const dsattn_v4_config *c)
{
    return dsattn_v4_kv_row_bytes((size_t)(c->head_dim - c->rope_head_dim),
                                  (size_t)c->rope_head_dim);
}

size_t dsattn_v4_idx_bytes(const dsattn_v4_config *c)
{
    return dsattn_fp4_index_row_bytes((size_t)c->index_head_dim);
}

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__); \
    } while (0)

dsattn_status dsattn_v4_config_validate(const dsattn_v4_config *c, char *err, size_t errlen)
{
    dsattn_status st = dsattn_csa_config_check(c, err, errlen);
    if (st) return st;
    CHECKF(c->rope_head_dim > 0 && c->rope_head_dim % 2 == 0 && c->rope_head_dim <= 128,
           "rope_head_dim %lld must be even and in (0, 128]", (long long)c->rope_head_dim);
    CHECKF(c->head_dim > c->rope_head_dim && (c->head_dim - c->rope_head_dim) % 64 == 0,
           "head_dim %lld: the nope part (head_dim - rope_head_dim = %lld) must be a positive "
           "multiple of 64 (FP8 blocks of 64)",
           (long long)c->head_dim, (long long)(c->head_dim - c->rope_head_dim));
    CHECKF(c->head_dim <= 512, "head_dim %lld is above 512 (a dsattn limit: per-row buffers)",
           (long long)c->head_dim);
    CHECKF(c->index_head_dim >= 32 && c->index_head_dim % 32 == 0 &&
               c->index_head_dim >= c->rope_head_dim,
           "index_head_dim %lld must be a positive multiple of 32 (FP4 blocks of 32) and >= "
           "rope_head_dim", (long long)c->index_head_dim);
    CHECKF(c->index_head_dim <= DSATTN_HADAMARD_MAX,
           "index_head_dim %lld is above %d (a dsattn limit: per-row buffers)",
           (long long)c->index_head_dim, DSATTN_HADAMARD_MAX);
    CHECKF(c->index_topk <= (1 << 24), "index_topk %lld out of range", (long long)c->index_topk);
    CHECKF(c->rope_theta > 1.0 && c->compress_rope_theta > 1.0,
           "rope_theta / compress_rope_theta must be > 1");
    CHECKF(c->original_seq_len >= 0 && c->rope_factor > 0 && c->beta_fast > 0 && c->beta_slow > 0,
           "YaRN parameters out of range");
    for (int64_t l = 0; l < c->n_total_layers; l++)
        CHECKF(c->compress_ratios[l] >= 0 && c->compress_ratios[l] <= 65536,
               "compress_ratios[%lld] = %lld out of range", (long long)l,
               (long long)c->compress_ratios[l]);
    CHECKF(c->fp8_block == 128, "FP8 weight block %lld unsupported (V4 uses 128)",
           (long long)c->fp8_block);
    return DSATTN_OK;
}

/* V4's part of reading its config (csa_config.c reads the shared fields,
 * with V4's ModelArgs defaults from the io layer: dtype fp8, one MTP
 * layer, original_seq_len 0).
 * Transformer.__init__: scale_fmt = "ue8m0" if scale_dtype == "fp8" else
 * the config's scale_fmt.  dsattn implements the power-of-two (UE8M0)
 * scales the release uses; MODEL1 rows have no room for fp32 scales.
 * scale_dtype defaults to "fp8". */
static dsattn_status v4_finish(dsattn_csa_config *c, const dsattn_model_config *mc, char *err,
                               size_t errlen)
{
    const char *sd = mc->scale_dtype[0] ? mc->scale_dtype : "fp8";
    if (strcmp(sd, "fp8") != 0 && strcmp(mc->scale_fmt, "ue8m0") != 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "scale_dtype '%s' / scale_fmt '%s': only UE8M0 (power-of-two) "
                           "scales are implemented", sd, mc->scale_fmt);
    return dsattn_v4_config_validate(c, err, errlen);
}

dsattn_status dsattn_v4_config_load(dsattn_v4_config *c, const char *path, char *err,
                                    size_t errlen)
{
    return dsattn_csa_config_load(c, path, DSATTN_ARCH_V4, 128, v4_finish, err, errlen);
}

/* ==== Model lifetime and plan =========================================== */

static void plan_layers(dsattn_v4 *m)
{
    const dsattn_v4_config *c = &m->cfg;
    for (int64_t l = 0; l < c->n_total_layers; l++) {
        dsattn_v4_layer_w *L = &m->layer[l];
        L->ratio = c->compress_ratios[l];
        if (l >= c->n_layers) L->kind = DSATTN_V4_MTP;
        else if (L->ratio == 0) L->kind = DSATTN_V4_SWA;
        else if (L->ratio == DSATTN_V4_CSA_RATIO) L->kind = DSATTN_V4_CSA;
        else L->kind = DSATTN_V4_HCA;
        dsattn_csa_layer_rope(&L->rope, c, L->ratio);
        const int overlap = L->ratio == DSATTN_V4_CSA_RATIO;
        L->comp.d = (size_t)c->head_dim;
        L->comp.ratio = (size_t)L->ratio;
        L->comp.overlap = overlap;
        L->comp.rotate = 0;
        L->icomp.d = (size_t)c->index_head_dim;
        L->icomp.ratio = (size_t)L->ratio;
        L->icomp.overlap = overlap;
        L->icomp.rotate = 1;
    }
}

/* L->attn of every layer, after its weights are bound (V4's flags). */
static void link_layers(dsattn_v4 *m)
{
    for (int64_t l = 0; l < m->cfg.n_layers; l++) DSATTN_CSA_ATTN_LINK(&m->layer[l], &m->cfg, 1);
}

void dsattn_v4_destroy(dsattn_v4 *m)
{
    if (!m) return;
    dsattn_owned_free(&m->owned);
    if (m->ckpt) dsattn_ckpt_close((dsattn_ckpt *)m->ckpt);
    free(m);
}

int dsattn_v4_n_layers(const dsattn_v4 *m) { return m ? (int)m->cfg.n_layers : -1; }
int dsattn_v4_dim(const dsattn_v4 *m) { return m ? (int)m->cfg.dim : -1; }

dsattn_v4_kind dsattn_v4_layer_kind(const dsattn_v4 *m, int l)
{
    if (!m || l < 0 || l >= m->cfg.n_total_layers) return DSATTN_V4_NONE;
    return m->layer[l].kind;
}

int dsattn_v4_layer_ratio(const dsattn_v4 *m, int l)
{
    if (!m || l < 0 || l >= m->cfg.n_total_layers) return -1;
    return (int)m->layer[l].ratio;
}

dsattn_status dsattn_v4_index_shape(const dsattn_v4 *m, int *n_heads, int *head_dim, int *topk)
{
    if (!m) return DSATTN_ERR_INVALID_ARG;
    if (n_heads) *n_heads = (int)m->cfg.index_n_heads;
    if (head_dim) *head_dim = (int)m->cfg.index_head_dim;
    if (topk) *topk = (int)m->cfg.index_topk;
    return DSATTN_OK;
}

size_t dsattn_v4_weight_bytes(const dsattn_v4 *m)
{
    size_t t = 0;
    if (!m) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_v4_layer_w *L = &m->layer[l];
        const dsattn_weight *ws[] = { &L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
                                      &L->comp.wkv, &L->comp.wgate, &L->icomp.wkv,
                                      &L->icomp.wgate, &L->i_wq_b, &L->i_wproj };
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++) t += dsattn_csa_stored_bytes(ws[i]);
    }
    return t;
}

/* What the config decides: the layers' plan, their (empty) links. */
static dsattn_status setup_layers(dsattn_v4 *m)
{
    plan_layers(m);
    link_layers(m);
    return DSATTN_OK;
}

DSATTN_MODEL_NEW(v4, setup_layers)

dsattn_status dsattn_v4_load_config(dsattn_v4 **out, const char *config_json, char *err,
                                    size_t errlen)
{
    return v4_new_model(out, config_json, err, errlen);
}

/* ==== Binding weights from a checkpoint ================================ */

/* Weights come through the io layer's checkpoint (one file, a shard index
 * or a folder): Linear weights are borrowed from the mapping in the format
 * stored, converted only where V4 computes in another format - wo_a runs
 * as a bf16 einsum (an FP8 wo_a is dequantized, as the official conversion
 * does), the compressors in fp32 (dense weights), weights_proj in bf16. */
#define LIN    (DSATTN_WMASK(DSATTN_W_BF16) | DSATTN_WMASK(DSATTN_W_F32) | DSATTN_WMASK(DSATTN_W_FP8))
#define DENSE  (DSATTN_WMASK(DSATTN_W_BF16) | DSATTN_WMASK(DSATTN_W_F32))
#define BF16   DSATTN_WMASK(DSATTN_W_BF16)

static dsattn_status bind_compressor(const dsattn_v4 *m, const dsattn_binder *b, const char *prefix, int64_t l,
                                     dsattn_v4_compressor_w *C)
{
    char n[256];
    dsattn_status st;
    const size_t coff = C->overlap ? 2 : 1, dim = (size_t)m->cfg.dim;
#define P(sfx) (snprintf(n, sizeof n, "layers.%lld.%s.%s", (long long)l, prefix, sfx), n)
    if ((st = dsattn_bind_mat(b, P("wkv"), DENSE, coff * C->d, dim, &C->wkv))) return st;
    if ((st = dsattn_bind_mat(b, P("wgate"), DENSE, coff * C->d, dim, &C->wgate))) return st;
    if ((st = dsattn_bind_vec(b, P("ape"), C->ratio * coff * C->d, &C->ape))) return st;
    if ((st = dsattn_bind_vec(b, P("norm.weight"), C->d, &C->norm))) return st;
#undef P
    return DSATTN_OK;
}

static dsattn_status bind_layer(dsattn_v4 *m, const dsattn_binder *b, int64_t l)
{
    const dsattn_v4_config *c = &m->cfg;
    dsattn_v4_layer_w *L = &m->layer[l];
    char n[256];
    dsattn_status st;
    size_t dim = (size_t)c->dim, QL = (size_t)c->q_lora_rank;
    size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    static const dsattn_csa_bind_rule rule = { "", LIN, BF16, dsattn_bind_mat };
    if ((st = dsattn_csa_bind_block(b, c, l, &rule, &DSATTN_CSA_BLOCK_W(L)))) return st;
#define P(fmt) (snprintf(n, sizeof n, "layers.%lld." fmt, (long long)l), n)
    if (L->ratio > 0 && (st = bind_compressor(m, b, "attn.compressor", l, &L->comp))) return st;
    if (L->kind == DSATTN_V4_CSA) {
        if ((st = bind_compressor(m, b, "attn.indexer.compressor", l, &L->icomp))) return st;
        if ((st = dsattn_bind_mat(b, P("attn.indexer.wq_b"), LIN, Hi * Di, QL, &L->i_wq_b))) return st;
        if ((st = dsattn_bind_mat(b, P("attn.indexer.weights_proj"), BF16, Hi, dim, &L->i_wproj)))
            return st;
    }
#undef P
    /* FP8 GEMMs quantize their input in blocks of 128 first */
    const dsattn_weight *q8[] = { &L->wq_a, &L->wq_b, &L->wkv, &L->wo_b, &L->i_wq_b };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(q8); i++)
        if (q8[i]->data && q8[i]->kind == DSATTN_W_FP8 && q8[i]->cols % DSATTN_V4_ACT_BLOCK)
            return dsattn_errf(b->err, b->errlen, DSATTN_ERR_FORMAT,
                               "layer %lld: an FP8 Linear has %zu input dims, not a multiple "
                               "of the activation block 128", (long long)l, q8[i]->cols);
    return DSATTN_OK;
}

#undef LIN
#undef DENSE
#undef BF16

static void v4_loaded(dsattn_v4 *m, int first, int count)   /* always every layer */
{
    (void)first;
    (void)count;
    m->has_weights = 1;
    link_layers(m);
}

DSATTN_MODEL_LOAD(v4, bind_layer, v4_loaded)

/* ==== Random weights ==================================================== */

/* Seeded weights from the shared generator (io/weights.c). */
static dsattn_status rand_bf16(dsattn_v4 *m, size_t rows, size_t cols, uint64_t seed,
                               dsattn_weight *w)
{
    return dsattn_weight_random(w, DSATTN_W_BF16, rows, cols, 0, 1.0f, seed, &m->owned);
}

static dsattn_status rand_compressor(dsattn_v4 *m, dsattn_v4_compressor_w *C, uint64_t *k)
{
    const size_t coff = C->overlap ? 2 : 1, dim = (size_t)m->cfg.dim;
    dsattn_status st = rand_bf16(m, coff * C->d, dim, ++*k, &C->wkv);
    if (!st) st = rand_bf16(m, coff * C->d, dim, ++*k, &C->wgate);
    if (!st) st = dsattn_vec_random(&C->ape, C->ratio * coff * C->d, 0.0f, 0.1f, 0, ++*k, &m->owned);
    if (!st) st = dsattn_vec_random(&C->norm, C->d, 1.0f, 0.1f, 1, ++*k, &m->owned);
    return st;
}

dsattn_status dsattn_v4_create_random(dsattn_v4 **out, const char *config_json, uint64_t seed,
                                      int fp8, char *err, size_t errlen)
{
    if (!out) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_v4 *m = NULL;
    dsattn_status st = v4_new_model(&m, config_json, err, errlen);
    if (st) return st;
    m->cfg.fp8 = fp8 != 0;
    const dsattn_v4_config *c = &m->cfg;
    size_t dim = (size_t)c->dim, QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    size_t R = (size_t)c->o_lora_rank;
    size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    size_t bs = (size_t)c->fp8_block;
    if (fp8 && (dim % DSATTN_V4_ACT_BLOCK || QL % DSATTN_V4_ACT_BLOCK ||
                (G * R) % DSATTN_V4_ACT_BLOCK)) {
        dsattn_v4_destroy(m);
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: FP8 weights need dim, q_lora_rank and o_groups*o_lora_rank to "
                           "be multiples of 128 (the activation block)", config_json);
    }
    uint64_t k = seed * 1000003ull + 17;
    const dsattn_wkind lin = fp8 ? DSATTN_W_FP8 : DSATTN_W_BF16;
#define MAT(rows, cols, w) dsattn_weight_random(w, lin, rows, cols, bs, 1.0f, ++k, &m->owned)
    for (int64_t l = 0; l < c->n_layers && !st; l++) {
        dsattn_v4_layer_w *L = &m->layer[l];
        st = dsattn_csa_random_block(c, &DSATTN_CSA_BLOCK_W(L), lin, DSATTN_W_BF16, 0, &k,
                                     &m->owned);
        if (L->ratio > 0 && !st) st = rand_compressor(m, &L->comp, &k);
        if (L->kind == DSATTN_V4_CSA) {
            if (!st) st = rand_compressor(m, &L->icomp, &k);
            if (!st) st = MAT(Hi * Di, QL, &L->i_wq_b);
            if (!st) st = rand_bf16(m, Hi, dim, ++k, &L->i_wproj);
        }
    }
#undef MAT
    if (st) { dsattn_v4_destroy(m); return st; }
    m->has_weights = 1;
    link_layers(m);
    *out = m;
    return DSATTN_OK;
}
