/* v41_model.c - the V4.1 (CSA2) model object: config, layer plan, weights.
 *
 * Owns: V4.1's config rules (its checks, the source layers and each
 * layer's mode from the io layer's plan; the fields it shares with V4 are
 * read by csa_config.c, either config.json format through src/io),
 * deriving each layer's flags exactly as Attention.__init__ does, binding
 * the per-layer weights by their official inference names from a mapped
 * safetensors file (borrowed, never copied unless a conversion is needed),
 * and making random weights at any config's dims for tests and benchmarks.
 * Not here: the forward pass and the per-sequence state (v41_forward.c),
 * sharded checkpoints and HF-name mapping (src/io).
 */
#include "v41.h"

#include "checkpoint.h"
#include "config.h"
#include "model_glue.h"
#include "numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ==== Config ============================================================ */

size_t dsattn_v41_swa_bytes(const dsattn_v41_config *c)
{
    return dsattn_v41_swa_row_bytes((size_t)c->head_dim);
}
size_t dsattn_v41_ckv_bytes(const dsattn_v41_config *c)
{
    return dsattn_v41_kv_row_bytes((size_t)c->head_dim);
}
size_t dsattn_v41_kidx_bytes(const dsattn_v41_config *c)
{
    return dsattn_fp4_index_row_bytes((size_t)c->index_head_dim);
}

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__); \
    } while (0)

/* What FP8 weights add to the shape rules: the reference quantizes every
 * FP8 Linear's input in blocks of 32 (act_quant(x, 32, ...), which asserts
 * the last dim is a multiple of the block), so every FP8 Linear's input dim
 * must be one.  bf16 weights run F.linear, which has no such rule. */
static dsattn_status v41_check_fp8_dims(const dsattn_v41_config *c, char *err, size_t errlen)
{
    CHECKF(c->dim % 32 == 0, "dim %lld is not a multiple of the FP8 activation block 32 "
           "(FP8 weights; bf16 weights accept any dim)", (long long)c->dim);
    CHECKF(c->q_lora_rank % 32 == 0, "q_lora_rank %lld is not a multiple of the FP8 activation "
           "block 32 (FP8 weights; bf16 weights accept any q_lora_rank)",
           (long long)c->q_lora_rank);
    CHECKF((c->o_groups * c->o_lora_rank) % 32 == 0,
           "o_groups * o_lora_rank = %lld is not a multiple of the FP8 activation block 32 "
           "(the input of the FP8 wo_b; bf16 weights accept any o_lora_rank)",
           (long long)(c->o_groups * c->o_lora_rank));
    return DSATTN_OK;
}

dsattn_status dsattn_v41_config_validate(dsattn_v41_config *c, char *err,
                                         size_t errlen)
{
    /* Two kinds of rule: the reference's own (quantization blocks, RoPE
     * pairs, the layer plan), and dsattn's fixed per-row buffers (the upper
     * bounds, all above every published config), each message saying which. */
    dsattn_status st = dsattn_csa_config_check(c, err, errlen);
    if (st) return st;
    CHECKF(c->head_dim > 0 && c->head_dim % 32 == 0,
           "head_dim %lld is not a positive multiple of 32, the block of the window KV's "
           "FP8 quantization", (long long)c->head_dim);
    CHECKF(c->head_dim <= 512, "head_dim %lld is above 512 (a dsattn limit: per-row buffers)",
           (long long)c->head_dim);
    CHECKF(c->rope_head_dim > 0 && c->rope_head_dim % 2 == 0 &&
               c->rope_head_dim <= c->head_dim && c->rope_head_dim <= c->index_head_dim,
           "rope_head_dim %lld must be even (RoPE rotates pairs), <= head_dim and <= "
           "index_head_dim", (long long)c->rope_head_dim);
    CHECKF(c->rope_head_dim <= 128, "rope_head_dim %lld is above 128 (a dsattn limit: "
           "per-row RoPE tables)", (long long)c->rope_head_dim);
    CHECKF(c->index_head_dim > 0 && c->index_head_dim % 32 == 0,
           "index_head_dim %lld is not a positive multiple of 32, the block of the index "
           "keys' FP4 quantization", (long long)c->index_head_dim);
    CHECKF(c->index_head_dim <= 512, "index_head_dim %lld is above 512 (a dsattn limit)",
           (long long)c->index_head_dim);
    if (c->fp8 && (st = v41_check_fp8_dims(c, err, errlen))) return st;

    /* the layer plan's rules (sources, ratios, candidates) are the io
     * layer's dsattn_v41_plan_from_config, applied by dsattn_v41_config_load;
     * here only the per-entry bound of dsattn's buffers */
    for (int64_t l = 0; l < c->n_total_layers; l++)
        CHECKF(c->compress_ratios[l] >= 0 && c->compress_ratios[l] <= 1024,
               "compress_ratios[%lld] = %lld out of range (0..1024, a dsattn limit)",
               (long long)l, (long long)c->compress_ratios[l]);
    CHECKF(c->fp8_block == 32 || c->fp8_block == 64 || c->fp8_block == 128,
           "FP8 weight block %lld unsupported", (long long)c->fp8_block);
    return DSATTN_OK;
}

/* V4.1's part of reading its config (csa_config.c reads the shared
 * fields): the source layers, the candidate pool and each layer's mode from
 * the io layer's plan, then the checks. */
static dsattn_status v41_finish(dsattn_csa_config *c, const dsattn_model_config *mc, char *err,
                                size_t errlen)
{
    for (int64_t i = 0; i < mc->n_kv_source_layers; i++) {
        int64_t l = mc->kv_source_layers[i];
        CHECKF(l >= 0 && l < c->n_total_layers, "kv_source_layers: layer %lld out of range",
               (long long)l);
        c->is_kv_source[l] = 1;
    }
    for (int64_t i = 0; i < mc->n_index_source_layers; i++) {
        int64_t l = mc->index_source_layers[i];
        CHECKF(l >= 0 && l < c->n_total_layers, "index_source_layers: layer %lld out of range",
               (long long)l);
        c->is_index_source[l] = 1;
    }
    c->candidate_source_layer = mc->candidate_source_layer;
    c->candidate_topk_blocks = mc->candidate_topk_blocks;
    c->candidate_block_size = mc->candidate_block_size;
    dsattn_v41_plan *plan = malloc(sizeof *plan);
    if (!plan) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    dsattn_status st = dsattn_v41_plan_from_config(mc, plan, err, errlen);
    for (int64_t l = 0; !st && l < c->n_layers; l++) c->mode[l] = plan->layer[l].mode;
    free(plan);
    return st ? st : dsattn_v41_config_validate(c, err, errlen);
}

dsattn_status dsattn_v41_config_load(dsattn_v41_config *c, const char *path,
                                     char *err, size_t errlen)
{
    return dsattn_csa_config_load(c, path, DSATTN_ARCH_V41, 32, v41_finish, err, errlen);
}

/* ==== Model object ====================================================== */

static void plan_layers(dsattn_v41 *m)
{
    const dsattn_v41_config *c = &m->cfg;
    for (int64_t l = 0; l < c->n_layers; l++) {
        dsattn_v41_layer_w *L = &m->layer[l];
        L->ratio = c->compress_ratios[l];
        L->mode = c->mode[l];
        L->is_kv_source = L->mode == DSATTN_V41_FULL;
        L->is_index_source = L->mode == DSATTN_V41_FULL || L->mode == DSATTN_V41_REINDEX;
        L->owns_k = L->is_kv_source;
        L->is_candidate_source = L->is_index_source && c->candidate_source_layer == l;
        L->uses_candidates = L->is_index_source && c->candidate_source_layer >= 0 &&
                             c->candidate_source_layer < l;
        /* compress_ratio > 0 (not > 1): ratio-1 layers use the long-range
         * table too (docs/semantics.md §2.3). */
        dsattn_csa_layer_rope(&L->rope, c, L->ratio);
    }
}

/* Each layer's view for the shared attention blocks (ops.h): the config's
 * dims and flags, pointers to the layer's weights.  Run once the weights
 * are bound (a config-only model links its empty ones). */
static void link_layers(dsattn_v41 *m)
{
    for (int64_t l = 0; l < m->cfg.n_layers; l++) DSATTN_CSA_ATTN_LINK(&m->layer[l], &m->cfg, 0);
}

void dsattn_v41_destroy(dsattn_v41 *m)
{
    if (!m) return;
    dsattn_owned_free(&m->owned);
    if (m->ckpt) dsattn_ckpt_close((dsattn_ckpt *)m->ckpt);
    free(m);
}

int dsattn_v41_n_layers(const dsattn_v41 *m) { return m ? (int)m->cfg.n_layers : -1; }
int dsattn_v41_dim(const dsattn_v41 *m) { return m ? (int)m->cfg.dim : -1; }
dsattn_v41_mode dsattn_v41_layer_mode(const dsattn_v41 *m, int l)
{
    return m && l >= 0 && l < m->cfg.n_layers ? m->layer[l].mode : (dsattn_v41_mode)-1;
}
int dsattn_v41_layer_ratio(const dsattn_v41 *m, int l)
{
    return m && l >= 0 && l < m->cfg.n_layers ? (int)m->layer[l].ratio : -1;
}

/* The plan's static sources: the shared runtime's compress_kv / topk_idxs
 * slots hold the last KV / index source run at or before a layer (layers run
 * in order every chunk), so that is what the layer reads. */
static int last_source(const dsattn_v41 *m, int l, int kv)
{
    if (!m || l < 0 || l >= m->cfg.n_layers || m->layer[l].ratio == 0) return -1;
    for (int j = l; j >= 0; j--)
        if (kv ? m->layer[j].is_kv_source : m->layer[j].is_index_source) return j;
    return -1;
}
int dsattn_v41_layer_kv_source(const dsattn_v41 *m, int l) { return last_source(m, l, 1); }
int dsattn_v41_layer_topk_source(const dsattn_v41 *m, int l) { return last_source(m, l, 0); }

size_t dsattn_v41_weight_bytes(const dsattn_v41 *m)
{
    size_t t = 0;
    if (!m) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_v41_layer_w *L = &m->layer[l];
        const dsattn_weight *ws[] = { &L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
                                      &L->c_wkv, &L->c_wgate, &L->i_wq_b, &L->i_wproj, &L->i_wk };
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++) t += dsattn_csa_stored_bytes(ws[i]);
    }
    return t;
}

/* ==== Binding weights from a checkpoint ================================ */

/* Weights come through the io layer's checkpoint (one file, a shard index
 * or a folder; inference or HF names): Linear weights are borrowed from the
 * mapping in the format stored, converted only where V4.1 needs another:
 * dense weights for the compressors of ratio 2+ (they pool in fp32), and
 * wo_a when FP8 blocks do not divide o_lora_rank (its einsum runs on bf16
 * or on whole FP8 blocks). */
/* A V4.1 Linear: the shared binder, and a quantized one must take inputs
 * in whole activation blocks of 32 (act_quant). */
static dsattn_status bind_mat(const dsattn_binder *b, const char *name, unsigned accept,
                              size_t rows, size_t cols, dsattn_weight *w)
{
    dsattn_status st = dsattn_bind_mat(b, name, accept, rows, cols, w);
    if (st) return st;
    if ((w->kind == DSATTN_W_FP8 || w->kind == DSATTN_W_FP4) && w->cols % 32)
        return dsattn_errf(b->err, b->errlen, DSATTN_ERR_FORMAT,
                           "%s: stored as %s with %zu input dims, not a multiple of the "
                           "activation block 32 its quantized GEMM needs (store it as bf16)",
                           name, w->kind == DSATTN_W_FP8 ? "FP8" : "FP4", w->cols);
    return DSATTN_OK;
}

#define ANY    DSATTN_WMASK_ANY
#define DENSE  (DSATTN_WMASK(DSATTN_W_BF16) | DSATTN_WMASK(DSATTN_W_F32))

static dsattn_status bind_layer(dsattn_v41 *m, const dsattn_binder *b, int64_t l)
{
    const dsattn_v41_config *c = &m->cfg;
    dsattn_v41_layer_w *L = &m->layer[l];
    char n[256];
    dsattn_status st;
    size_t dim = (size_t)c->dim, D = (size_t)c->head_dim, QL = (size_t)c->q_lora_rank;
    size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    /* wo_a: bf16 as the reference holds it, or FP8 as the checkpoint does
     * (exactly the same einsum, half the bytes: see dsattn_attn_output) */
    unsigned wo_a_ok = DSATTN_WMASK(DSATTN_W_BF16) | DSATTN_WMASK(DSATTN_W_F32) |
                       ((size_t)c->o_lora_rank % (size_t)c->fp8_block == 0 ? DSATTN_WMASK(DSATTN_W_FP8) : 0);
    const dsattn_csa_bind_rule rule = { ".weight", ANY, wo_a_ok, bind_mat };
    if ((st = dsattn_csa_bind_block(b, c, l, &rule, &DSATTN_CSA_BLOCK_W(L)))) return st;
#define P(fmt) (snprintf(n, sizeof n, "layers.%lld." fmt, (long long)l), n)
    if (L->is_kv_source) {
        /* a pooling compressor runs in fp32: dense weights only */
        unsigned cm = L->ratio > 1 ? DENSE : ANY;
        if ((st = bind_mat(b, P("attn.compressor.wkv.weight"), cm, D, dim, &L->c_wkv))) return st;
        if ((st = dsattn_bind_vec(b, P("attn.compressor.norm.weight"), D, &L->c_norm))) return st;
        if (L->ratio > 1 &&
            (st = bind_mat(b, P("attn.compressor.wgate.weight"), DENSE, D, dim, &L->c_wgate)))
            return st;
    }
    if (L->is_index_source) {
        if ((st = bind_mat(b, P("attn.indexer.wq_b.weight"), ANY, Hi * Di, QL, &L->i_wq_b)))
            return st;
        if ((st = bind_mat(b, P("attn.indexer.weights_proj.weight"), ANY, Hi, dim, &L->i_wproj)))
            return st;
        if (L->owns_k) {
            if ((st = bind_mat(b, P("attn.indexer.wk.weight"), ANY, Di, D, &L->i_wk))) return st;
            if ((st = dsattn_bind_vec(b, P("attn.indexer.k_norm.weight"), Di, &L->i_knorm))) return st;
        }
    }
#undef P
    return DSATTN_OK;
}

/* What the config decides: the layers' plan, their (empty) links. */
static dsattn_status setup_layers(dsattn_v41 *m)
{
    plan_layers(m);
    link_layers(m);
    return DSATTN_OK;
}

DSATTN_MODEL_NEW(v41, setup_layers)

dsattn_status dsattn_v41_load_config(dsattn_v41 **out, const char *config_json,
                                     char *err, size_t errlen)
{
    return v41_new_model(out, config_json, err, errlen);
}

static void v41_loaded(dsattn_v41 *m, int first, int count)  /* always every layer */
{
    (void)first;
    (void)count;
    link_layers(m);
}

DSATTN_MODEL_LOAD(v41, bind_layer, v41_loaded)

/* ==== Random weights ==================================================== */

dsattn_status dsattn_v41_create_random(dsattn_v41 **out, const char *config_json,
                                       uint64_t seed, int fp8, char *err,
                                       size_t errlen)
{
    dsattn_v41 *m = NULL;
    dsattn_status st = v41_new_model(&m, config_json, err, errlen);
    if (st) return st;
    m->cfg.fp8 = fp8;
    if (fp8 && (st = v41_check_fp8_dims(&m->cfg, err, errlen))) {
        dsattn_v41_destroy(m);
        return st;
    }
    const dsattn_v41_config *c = &m->cfg;
    size_t dim = (size_t)c->dim, D = (size_t)c->head_dim, QL = (size_t)c->q_lora_rank;
    size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    size_t bs = (size_t)c->fp8_block;
    uint64_t k = seed * 1000003ull + 17;
    const dsattn_wkind lin = fp8 ? DSATTN_W_FP8 : DSATTN_W_BF16;
    /* the released checkpoint stores wo_a in FP8 too */
    const dsattn_wkind wo_a = fp8 && (size_t)c->o_lora_rank % bs == 0 ? DSATTN_W_FP8
                                                                       : DSATTN_W_BF16;
    /* the shared seeded generator (io/weights.c); compressors of ratio > 1
     * are fp32 as in the checkpoint, FP8 where the release is FP8 */
#define MAT(rows, cols, w) dsattn_weight_random(w, lin, rows, cols, bs, 1.0f, ++k, &m->owned)
#define DMAT(rows, cols, f32, w) dsattn_weight_random(w, (f32) ? DSATTN_W_F32 : DSATTN_W_BF16, \
                                                       rows, cols, bs, 1.0f, ++k, &m->owned)
#define VEC(n, base, jit, out) dsattn_vec_random(out, n, base, jit, 1, ++k, &m->owned)
    for (int64_t l = 0; l < c->n_layers && !st; l++) {
        dsattn_v41_layer_w *L = &m->layer[l];
        st = dsattn_csa_random_block(c, &DSATTN_CSA_BLOCK_W(L), lin, wo_a, 1, &k, &m->owned);
        if (L->is_kv_source) {
            int f32 = L->ratio > 1;
            if (!st) st = DMAT(D, dim, f32, &L->c_wkv);
            if (!st && L->ratio > 1) st = DMAT(D, dim, 1, &L->c_wgate);
            if (!st) st = VEC(D, 1.0f, 0.1f, &L->c_norm);
        }
        if (L->is_index_source) {
            if (!st) st = MAT(Hi * Di, QL, &L->i_wq_b);
            if (!st) st = DMAT(Hi, dim, 0, &L->i_wproj);
            if (L->owns_k) {
                if (!st) st = DMAT(Di, D, 0, &L->i_wk);
                if (!st) st = VEC(Di, 1.0f, 0.1f, &L->i_knorm);
            }
        }
    }
#undef MAT
#undef DMAT
#undef VEC
    if (st) { dsattn_v41_destroy(m); return st; }
    link_layers(m);
    *out = m;
    return DSATTN_OK;
}
