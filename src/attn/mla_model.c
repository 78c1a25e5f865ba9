/* mla_model.c - the MLA (V3) / MLA + DSA (V3.2) model object: config,
 * the RoPE table and softmax scale it implies, and the per-layer weights.
 *
 * Owns: turning a parsed config (src/io/config.h, either key format) into
 * the numbers the forward pass needs - including the reference's runtime
 * gate "YaRN and mscale only when max_seq_len > original_seq_len" - binding
 * the official inference names through the checkpoint loader, the weight
 * format policy of each generation, and random weights at any config's
 * dims for tests and benchmarks.
 *
 * Weight format policy (what each reference's linear() does):
 *   V3   gemm_impl = "bf16" (the default of DeepSeek-V3 inference/model.py):
 *        FP8 weights are dequantized to bf16 (weight_dequant) and the GEMM
 *        runs in bf16 with no activation quantization.  The loader does the
 *        dequantization once; random FP8 weights use power-of-two scales, for
 *        which the dequantization is exact, so they stay FP8 in memory.
 *   V3.2 FP8 weights stay FP8; activations are quantized per 128 first
 *        (act_quant with scale_fmt: ue8m0 -> power-of-two scales, else
 *        amax * (1/448)), then fp8_gemm.  weights_proj is always bf16.
 *
 * Not here: sequences and the layer forward (mla_forward.c), the attention
 * paths (mla_attend.c), batched decode (mla_batch.c), the indexer
 * (mla_indexer.c), file parsing (src/io).
 */
#include "mla.h"

#include "checkpoint.h"
#include "config.h"
#include "model_glue.h"
#include "numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ==== Config ============================================================ */

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__); \
    } while (0)

static dsattn_status config_from_model(dsattn_mla_config *c, const dsattn_model_config *mc,
                                       const char *path, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (mc->arch != DSATTN_ARCH_V3 && mc->arch != DSATTN_ARCH_V32)
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: model_type '%s' is not deepseek_v3 / deepseek_v32", path,
                           dsattn_arch_name(mc->arch));
    c->dsa = mc->arch == DSATTN_ARCH_V32;
    c->dim = mc->dim;
    c->n_layers = mc->n_layers;
    c->n_heads = mc->n_heads;
    c->q_lora_rank = mc->q_lora_rank;
    c->kv_lora_rank = mc->kv_lora_rank;
    c->nope = mc->qk_nope_head_dim;
    c->rope = mc->qk_rope_head_dim;
    c->v_dim = mc->v_head_dim;
    c->index_n_heads = mc->index_n_heads;
    c->index_head_dim = mc->index_head_dim;
    c->index_topk = mc->index_topk;
    c->max_seq_len = mc->max_seq_len;
    c->rope_theta = mc->rope_theta;
    c->rope_factor = mc->rope_factor;
    c->original_seq_len = (double)mc->original_seq_len;
    c->beta_fast = (double)mc->beta_fast;
    c->beta_slow = (double)mc->beta_slow;
    c->mscale = mc->mscale;
    c->eps = (float)mc->norm_eps;
    c->fp8 = !strcmp(mc->dtype, "fp8");
    c->ue8m0 = !strcmp(mc->scale_fmt, "ue8m0");
    c->rope_il_mla = 1;
    c->rope_il_index = 0;

    CHECKF(c->n_layers > 0 && c->n_layers <= DSATTN_MAX_LAYERS,
           "%s: n_layers %lld out of range (1..%d)", path, (long long)c->n_layers,
           DSATTN_MAX_LAYERS);
    CHECKF(c->dim > 0 && c->dim <= (1 << 16), "%s: dim %lld out of range", path,
           (long long)c->dim);
    CHECKF(c->n_heads > 0 && c->n_heads <= 1024, "%s: n_heads %lld out of range", path,
           (long long)c->n_heads);
    CHECKF(c->q_lora_rank >= 0 && c->q_lora_rank <= (1 << 16),
           "%s: q_lora_rank %lld out of range", path, (long long)c->q_lora_rank);
    CHECKF(c->kv_lora_rank > 0 && c->kv_lora_rank <= 4096,
           "%s: kv_lora_rank %lld out of range", path, (long long)c->kv_lora_rank);
    CHECKF(c->nope > 0 && c->nope <= 1024 && c->v_dim > 0 && c->v_dim <= 1024,
           "%s: qk_nope_head_dim / v_head_dim out of range", path);
    CHECKF(c->rope > 0 && c->rope % 2 == 0 && c->rope <= 128,
           "%s: qk_rope_head_dim %lld must be even and <= 128", path, (long long)c->rope);
    CHECKF(c->original_seq_len > 0 && c->rope_factor > 0 && c->rope_theta > 1,
           "%s: original_seq_len, rope_factor and rope_theta must be positive", path);
    CHECKF(c->beta_fast > 0 && c->beta_slow > 0, "%s: beta_fast / beta_slow must be positive",
           path);
    CHECKF(c->max_seq_len > 0, "%s: max_seq_len must be positive", path);
    if (c->dsa) {
        /* fp8_index takes one q scale per head and one k scale per token, so
         * the reference only runs with one 128-block per index vector. */
        CHECKF(c->index_head_dim == 128,
               "%s: index_head_dim %lld: the V3.2 indexer quantizes one 128-wide block "
               "per vector (fp8_index has one scale per head / token)", path,
               (long long)c->index_head_dim);
        CHECKF(c->rope <= c->index_head_dim, "%s: qk_rope_head_dim exceeds index_head_dim", path);
        CHECKF(c->index_n_heads > 0 && c->index_n_heads <= 1024,
               "%s: index_n_heads %lld out of range", path, (long long)c->index_n_heads);
        CHECKF(c->index_topk > 0, "%s: index_topk must be positive", path);
        CHECKF(c->q_lora_rank > 0, "%s: the V3.2 indexer needs q_lora_rank > 0 (it reads qr)",
               path);
    }

    /* The reference's runtime gate: YaRN frequencies and mscale^2 on the
     * softmax scale only when max_seq_len > original_seq_len. */
    c->yarn = (double)c->max_seq_len > c->original_seq_len;
    double sc = pow((double)(c->nope + c->rope), -0.5);
    if (c->yarn) {
        double ms = 0.1 * c->mscale * log(c->rope_factor) + 1.0;
        sc = c->dsa ? sc * ms * ms : sc * (ms * ms);   /* V3.2: s*m*m; V3: s *= m**2 */
    }
    c->softmax_scale = (float)sc;
    return DSATTN_OK;
}

dsattn_status dsattn_mla_config_load(dsattn_mla_config *c, const char *path, char *err,
                                     size_t errlen)
{
    dsattn_model_config mc;
    dsattn_status st = dsattn_config_load(&mc, path, err, errlen);
    if (st) return st;
    return config_from_model(c, &mc, path, err, errlen);
}

/* ==== Object ============================================================ */

static dsattn_status own(dsattn_mla *m, void *p)
{
    return dsattn_owned_add(&m->owned, p);
}

void dsattn_mla_destroy(dsattn_mla *m)
{
    if (!m) return;
    for (int64_t l = 0; l < DSATTN_MAX_LAYERS; l++) {
        dsattn_mla_layer_w *L = &m->layer[l];
        dsattn_weight *ws[] = { &L->wq, &L->wq_a, &L->wq_b, &L->wkv_a, &L->wkv_b, &L->wo,
                                &L->i_wq_b, &L->i_wk, &L->i_wproj };
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++) dsattn_weight_release(ws[i]);
    }
    dsattn_owned_free(&m->owned);
    dsattn_ckpt_close((dsattn_ckpt *)m->ckpt);
    free(m);
}

static dsattn_status setup_numbers(dsattn_mla *m)
{
    const dsattn_mla_config *c = &m->cfg;
    dsattn_rope_init(&m->rope, (size_t)c->rope, c->rope_theta, c->yarn, c->original_seq_len,
                     c->rope_factor, c->beta_fast, c->beta_slow);
    /* V3.2 linear(): act_quant(x, 128, scale_fmt) before every FP8 GEMM.
     * V3 (gemm_impl "bf16") never quantizes activations. */
    m->use_actq = c->dsa;
    m->actq.block = 128;
    m->actq.scale = c->ue8m0 ? DSATTN_ACTQ_POW2 : DSATTN_ACTQ_AMAX_MUL;
    return DSATTN_OK;
}

DSATTN_MODEL_NEW(mla, setup_numbers)

dsattn_status dsattn_mla_create_config_only(dsattn_mla **out, const char *config_json,
                                            char *err, size_t errlen)
{
    return mla_new_model(out, config_json, err, errlen);
}

int dsattn_mla_is_dsa(const dsattn_mla *m) { return m ? m->cfg.dsa : -1; }
int dsattn_mla_n_layers(const dsattn_mla *m) { return m ? (int)m->cfg.n_layers : -1; }
int dsattn_mla_dim(const dsattn_mla *m) { return m ? (int)m->cfg.dim : -1; }
int dsattn_mla_has_weights(const dsattn_mla *m) { return m ? m->has_weights : 0; }
float dsattn_mla_softmax_scale(const dsattn_mla *m) { return m ? m->cfg.softmax_scale : NAN; }

dsattn_status dsattn_mla_latent_dims(const dsattn_mla *m, int *kv_lora_rank, int *rope_dim)
{
    if (!m) return DSATTN_ERR_INVALID_ARG;
    if (kv_lora_rank) *kv_lora_rank = (int)m->cfg.kv_lora_rank;
    if (rope_dim) *rope_dim = (int)m->cfg.rope;
    return DSATTN_OK;
}

size_t dsattn_mla_weight_bytes(const dsattn_mla *m)
{
    size_t t = 0;
    if (!m) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_mla_layer_w *L = &m->layer[l];
        const dsattn_weight *ws[] = { &L->wq, &L->wq_a, &L->wq_b, &L->wkv_a, &L->wkv_b, &L->wo,
                                      &L->i_wq_b, &L->i_wk, &L->i_wproj };
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++)
            if (ws[i]->data) t += dsattn_weight_bytes(ws[i]);
    }
    return t;
}

void dsattn_mla_weight_row_bf16(const dsattn_weight *w, size_t r, float *out)
{
    if (w->kind == DSATTN_W_BF16) {
        const uint16_t *p = (const uint16_t *)w->data + r * w->cols;
        for (size_t i = 0; i < w->cols; i++) out[i] = dsattn_bf16_to_f32(p[i]);
        return;
    }
    dsattn_weight_row_f32(w, r, out);
    if (w->kind != DSATTN_W_F32) dsattn_round_bf16_n(out, w->cols);
}

/* ==== Loading =========================================================== */

static dsattn_status bind_layer(dsattn_mla *m, const dsattn_binder *b, int64_t l)
{
    const dsattn_mla_config *c = &m->cfg;
    dsattn_mla_layer_w *L = &m->layer[l];
    char n[256];
    dsattn_status st;
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope;
    const size_t dqk = (size_t)(c->nope + c->rope), dv = (size_t)c->v_dim;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    /* V3 runs every Linear in bf16 (FP8 dequantized once, as weight_dequant);
     * V3.2 keeps FP8 for the FP8 GEMM path. */
    const unsigned dense = DSATTN_WMASK(DSATTN_W_BF16) | DSATTN_WMASK(DSATTN_W_F32);
    const unsigned acc = c->dsa ? dense | DSATTN_WMASK(DSATTN_W_FP8) : dense;
#define P(fmt) (snprintf(n, sizeof n, "layers.%lld." fmt, (long long)l), n)
    if ((st = dsattn_bind_vec(b, P("attn_norm.weight"), dim, &L->attn_norm))) return st;
    if (QL > 0) {
        if ((st = dsattn_bind_mat(b, P("attn.wq_a"), acc, QL, dim, &L->wq_a))) return st;
        if ((st = dsattn_bind_vec(b, P("attn.q_norm.weight"), QL, &L->q_norm))) return st;
        if ((st = dsattn_bind_mat(b, P("attn.wq_b"), acc, H * dqk, QL, &L->wq_b))) return st;
    } else {
        if ((st = dsattn_bind_mat(b, P("attn.wq"), acc, H * dqk, dim, &L->wq))) return st;
    }
    if ((st = dsattn_bind_mat(b, P("attn.wkv_a"), acc, KL + dr, dim, &L->wkv_a))) return st;
    if ((st = dsattn_bind_vec(b, P("attn.kv_norm.weight"), KL, &L->kv_norm))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wkv_b"), acc, H * (dqk - dr + dv), KL, &L->wkv_b))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wo"), acc, dim, H * dv, &L->wo))) return st;
    if (c->dsa) {
        if ((st = dsattn_bind_mat(b, P("attn.indexer.wq_b"), acc, Hi * Di, QL, &L->i_wq_b))) return st;
        if ((st = dsattn_bind_mat(b, P("attn.indexer.wk"), acc, Di, dim, &L->i_wk))) return st;
        /* weights_proj is a bf16 Linear in every revision */
        if ((st = dsattn_bind_mat(b, P("attn.indexer.weights_proj"), dense, Hi, dim, &L->i_wproj)))
            return st;
        if ((st = dsattn_bind_vec(b, P("attn.indexer.k_norm.weight"), Di, &L->i_knorm_w))) return st;
        if ((st = dsattn_bind_vec(b, P("attn.indexer.k_norm.bias"), Di, &L->i_knorm_b))) return st;
    }
#undef P
    const dsattn_weight *ws[] = { &L->wq, &L->wq_a, &L->wq_b, &L->wkv_a, &L->wkv_b, &L->wo,
                                  &L->i_wq_b, &L->i_wk };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++)
        if (ws[i]->kind == DSATTN_W_FP8 && ws[i]->cols % 128)
            return dsattn_errf(b->err, b->errlen, DSATTN_ERR_FORMAT,
                               "layer %lld: an FP8 weight with %zu input features: act_quant "
                               "needs a multiple of 128", (long long)l, ws[i]->cols);
    return DSATTN_OK;
}

static void mla_loaded(dsattn_mla *m, int first, int count)
{
    m->has_weights = 1;
    m->w_first = first;
    m->w_count = count;
}

DSATTN_MODEL_LOAD(mla, bind_layer, mla_loaded)

dsattn_status dsattn_mla_load_layers(dsattn_mla **out, const char *config_json,
                                     const char *weights, int first_layer, int n_layers,
                                     char *err, size_t errlen)
{
    if (n_layers <= 0) return DSATTN_ERR_INVALID_ARG;
    return mla_load_layers(out, config_json, weights, first_layer, n_layers, err, errlen);
}

/* ==== Random weights ==================================================== */

/* bf16 weight ~ N(0, 1/cols), rows generated in parallel from per-row seeds. */
static dsattn_status rand_bf16(dsattn_mla *m, size_t rows, size_t cols, uint64_t seed,
                               dsattn_weight *w)
{
    memset(w, 0, sizeof *w);
    uint16_t *p = dsattn_alloc_array(rows * cols, 2);
    dsattn_status st = own(m, p);
    if (st) return st;
    const float sd = 1.0f / sqrtf((float)cols);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        uint64_t s = (seed * 0x9e3779b97f4a7c15ull) ^ (r * 0xd1b54a32d192ed03ull) ^ 1;
        for (size_t i = 0; i < cols; i++)
            p[r * cols + i] = dsattn_f32_to_bf16(dsattn_weight_rng_normal(&s) * sd);
    }
    w->kind = DSATTN_W_BF16;
    w->rows = rows;
    w->cols = cols;
    w->data = p;
    return DSATTN_OK;
}

/* FP8 weight: N(0,1) values quantized per 128x128 block with a power-of-two
 * scale (UE8M0 like the V3.2 release; exact under V3's bf16 dequant). */
static dsattn_status rand_fp8(dsattn_mla *m, size_t rows, size_t cols, uint64_t seed,
                              dsattn_weight *w)
{
    memset(w, 0, sizeof *w);
    const size_t bs = 128, sr = (rows + bs - 1) / bs, sc = (cols + bs - 1) / bs;
    uint8_t *p = dsattn_alloc_array(rows, cols);
    float *scale = dsattn_alloc_array(sr * sc, sizeof(float));
    dsattn_status st = own(m, p);
    if (!st) st = own(m, scale);
    if (st) return st;
    /* |N(0,1)| < 4.5 essentially always: one scale 2^ceil(log2(4.5/448)) per
     * block times the 1/sqrt(cols) gain, rounded to a power of two. */
    const float s = dsattn_pow2_ceil(4.5f / 448.0f / sqrtf((float)cols));
    for (size_t i = 0; i < sr * sc; i++) scale[i] = s;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        uint64_t g = (seed * 0x9e3779b97f4a7c15ull) ^ (r * 0xd1b54a32d192ed03ull) ^ 1;
        const float sd = 1.0f / sqrtf((float)cols);
        for (size_t i = 0; i < cols; i++) {
            float v = dsattn_weight_rng_normal(&g) * sd / s;
            v = v > 448.0f ? 448.0f : (v < -448.0f ? -448.0f : v);
            p[r * cols + i] = dsattn_f32_to_e4m3(v);
        }
    }
    w->kind = DSATTN_W_FP8;
    w->rows = rows;
    w->cols = cols;
    w->data = p;
    w->scale = scale;
    w->block = bs;
    w->finite = 1;          /* clamped to +-448 above: no NaN code (0x7f/0xff) */
    return DSATTN_OK;
}

static dsattn_status rand_vec(dsattn_mla *m, size_t n, float base, float jitter, uint64_t seed,
                              float **out)
{
    float *v = dsattn_alloc_array(n, sizeof(float));
    dsattn_status st = own(m, v);
    if (st) return st;
    uint64_t s = (seed * 0x9e3779b97f4a7c15ull) | 1;
    for (size_t i = 0; i < n; i++) v[i] = dsattn_round_bf16(base + jitter * dsattn_weight_rng_normal(&s));
    *out = v;
    return DSATTN_OK;
}

dsattn_status dsattn_mla_create_random(dsattn_mla **out, const char *config_json,
                                       uint64_t seed, int fp8, char *err, size_t errlen)
{
    if (!out) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_mla *m = NULL;
    dsattn_status st = mla_new_model(&m, config_json, err, errlen);
    if (st) return st;
    m->cfg.fp8 = fp8 != 0;
    const dsattn_mla_config *c = &m->cfg;
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    const size_t KL = (size_t)c->kv_lora_rank, dr = (size_t)c->rope, dn = (size_t)c->nope;
    const size_t dv = (size_t)c->v_dim;
    const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
    /* V3.2 quantizes each FP8 Linear's input in blocks of 128 (V3 uses
     * its FP8 weights dequantized, at any widths, as the loader does) */
    if (fp8 && m->use_actq && (dim % 128 || (QL && QL % 128) || KL % 128 || (H * dv) % 128)) {
        dsattn_mla_destroy(m);
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "random FP8 weights on V3.2 need dim, q_lora_rank, kv_lora_rank and "
                           "n_heads*v_head_dim to be multiples of 128 (act_quant blocks)");
    }
    uint64_t k = seed * 1000003ull + 17;
#define MAT(rows, cols, w) (fp8 ? rand_fp8(m, rows, cols, ++k, w) : rand_bf16(m, rows, cols, ++k, w))
    for (int64_t l = 0; l < c->n_layers && !st; l++) {
        dsattn_mla_layer_w *L = &m->layer[l];
        if (!st) st = rand_vec(m, dim, 1.0f, 0.1f, ++k, &L->attn_norm);
        if (QL > 0) {
            if (!st) st = MAT(QL, dim, &L->wq_a);
            if (!st) st = rand_vec(m, QL, 1.0f, 0.1f, ++k, &L->q_norm);
            if (!st) st = MAT(H * (dn + dr), QL, &L->wq_b);
        } else if (!st) {
            st = MAT(H * (dn + dr), dim, &L->wq);
        }
        if (!st) st = MAT(KL + dr, dim, &L->wkv_a);
        if (!st) st = rand_vec(m, KL, 1.0f, 0.1f, ++k, &L->kv_norm);
        if (!st) st = MAT(H * (dn + dv), KL, &L->wkv_b);
        if (!st) st = MAT(dim, H * dv, &L->wo);
        if (c->dsa) {
            if (!st) st = MAT(Hi * Di, QL, &L->i_wq_b);
            if (!st) st = MAT(Di, dim, &L->i_wk);
            if (!st) st = rand_bf16(m, Hi, dim, ++k, &L->i_wproj);
            if (!st) st = rand_vec(m, Di, 1.0f, 0.1f, ++k, &L->i_knorm_w);
            if (!st) st = rand_vec(m, Di, 0.0f, 0.1f, ++k, &L->i_knorm_b);
        }
    }
#undef MAT
    if (st) { dsattn_mla_destroy(m); return st; }
    m->has_weights = 1;
    m->w_first = 0;
    m->w_count = (int)c->n_layers;
    *out = m;
    return DSATTN_OK;
}
