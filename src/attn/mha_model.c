/* mha_model.c - the MHA / GQA model object (DeepSeek-LLM 7B / 67B in HF
 * Llama form) and its sequences: config, random weights, caches, bill.
 *
 * Owns: its view of an HF config.json with model_type "llama" (the only
 * form DeepSeek-LLM ships - the repos carry no model code; the keys are
 * read by src/io/config.c, this file adds what its forward refuses),
 * binding a released checkpoint's layers, making random bf16
 * weights for all layers, a range of layers or none, allocating the bf16
 * K / V caches of a sequence (all layers or one pipeline stage's range),
 * the KV bill from those live allocations, and synthetic cache fills for
 * deep-context benchmarks.  The checkpoint's HF names
 * (model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, input_layernorm)
 * are mapped to inference names by src/io/names.c.
 * Not here: the forward pass (mha_forward.c).
 */
#include "mha.h"

#include "checkpoint.h"
#include "config.h"
#include "jsoncfg.h"
#include "model_glue.h"
#include "numfmt.h"
#include "seq_glue.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ==== Config ============================================================ */

#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return mha_fail(err, errlen, DSATTN_ERR_FORMAT, path, __VA_ARGS__); \
    } while (0)

/* An error naming the file, then what is wrong. */
static dsattn_status mha_fail(char *err, size_t errlen, dsattn_status st, const char *path,
                              const char *fmt, ...)
{
    if (err && errlen) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(err, errlen, "%s: %s", path, msg);
    }
    return st;
}

/* The shapes and RoPE / norm keys come from the io layer's reader (the
 * one every generation and the checkpoint checks use, src/io/config.c);
 * what only this model refuses or derives is checked here. */
static dsattn_status parse(dsattn_mha_config *c, const cJSON *o, const char *path, char *err,
                           size_t errlen)
{
    dsattn_status st;
    const char *mt = NULL;
    bool bias = false;
    int64_t tp = 1;
    if ((st = dsattn_jcfg_string(o, "model_type", &mt, err, errlen)))
        return mha_fail(err, errlen, st, path, "key 'model_type' missing or not a string");
    if (strcmp(mt, "llama"))
        return mha_fail(err, errlen, DSATTN_ERR_UNSUPPORTED, path,
                        "key 'model_type': '%s' is not \"llama\" (MHA/GQA reads the "
                        "DeepSeek-LLM 7B/67B configs)", mt);
    dsattn_model_config *mc = malloc(sizeof *mc);
    if (!mc) return DSATTN_ERR_NOMEM;
    st = dsattn_config_from_json(mc, o, path, err, errlen);
    if (!st) {
        c->hidden = mc->dim;
        c->n_layers = mc->n_layers;
        c->n_heads = mc->n_heads;
        c->n_kv_heads = mc->n_kv_heads;        /* LlamaConfig's default: n_heads */
        c->head_dim = mc->head_dim;            /* hidden / n_heads */
        c->rope_theta = mc->rope_theta;
        c->max_position_embeddings = mc->max_seq_len;
        c->rms_norm_eps = (float)mc->norm_eps;
    }
    const double eps = st ? 0.0 : mc->norm_eps;
    free(mc);
    if (st) return st;
    if ((st = dsattn_jcfg_bool_opt(o, "attention_bias", false, &bias, err, errlen)) ||
        (st = dsattn_jcfg_int_opt(o, "pretraining_tp", 1, &tp, err, errlen)))
        return mha_fail(err, errlen, st, path, "%s", err);
    if (dsattn_jcfg_has(o, "rope_scaling"))
        return mha_fail(err, errlen, DSATTN_ERR_UNSUPPORTED, path,
                        "key 'rope_scaling': RoPE scaling is not implemented "
                        "(DeepSeek-LLM has none)");
    if (bias)
        return mha_fail(err, errlen, DSATTN_ERR_UNSUPPORTED, path,
                        "key 'attention_bias': biased projections are not implemented");
    if (tp != 1)
        return mha_fail(err, errlen, DSATTN_ERR_UNSUPPORTED, path,
                        "key 'pretraining_tp': %lld (only 1 is implemented)", (long long)tp);

    CHECKF(c->hidden <= (1 << 16), "key 'hidden_size': %lld out of range",
           (long long)c->hidden);
    CHECKF(c->n_heads <= 1024, "key 'num_attention_heads': %lld out of range",
           (long long)c->n_heads);
    if (dsattn_jcfg_has(o, "head_dim")) {
        int64_t hd = 0;
        if ((st = dsattn_jcfg_int(o, "head_dim", &hd, err, errlen)))
            return mha_fail(err, errlen, st, path, "%s", err);
        CHECKF(hd == c->head_dim, "key 'head_dim': %lld, but hidden_size / "
               "num_attention_heads = %lld (transformers 4.33 derives it)",
               (long long)hd, (long long)c->head_dim);
    }
    /* Full RoPE over all d dims; the shared table holds 64 pairs. */
    CHECKF(c->head_dim % 2 == 0 && c->head_dim <= 128,
           "head_dim %lld (hidden_size / num_attention_heads) must be even and <= 128",
           (long long)c->head_dim);
    CHECKF(c->rope_theta > 1.0 && isfinite(c->rope_theta), "key 'rope_theta': %g out of range",
           c->rope_theta);
    CHECKF(eps >= 0.0 && isfinite(eps), "key 'rms_norm_eps': %g out of range", eps);
    CHECKF(c->max_position_embeddings > 0, "key 'max_position_embeddings' must be positive");
    return DSATTN_OK;
}

dsattn_status dsattn_mha_config_load(dsattn_mha_config *c, const char *path,
                                     char *err, size_t errlen)
{
    cJSON *root = NULL;
    memset(c, 0, sizeof *c);
    dsattn_status st = dsattn_jcfg_load(&root, path, err, errlen);
    if (st) return st;
    st = parse(c, root, path, err, errlen);
    cJSON_Delete(root);
    return st;
}

/* ==== Model object ====================================================== */

static dsattn_status own(dsattn_mha *m, void *p)
{
    return dsattn_owned_add(&m->owned, p);
}

void dsattn_mha_destroy(dsattn_mha *m)
{
    if (!m) return;
    dsattn_owned_free(&m->owned);
    dsattn_ckpt_close((dsattn_ckpt *)m->ckpt);
    free(m->layer);
    free(m);
}

/* What the config decides: the layer array, the RoPE table. */
static dsattn_status setup_model(dsattn_mha *m)
{
    m->layer = calloc((size_t)m->cfg.n_layers, sizeof *m->layer);
    if (!m->layer) return DSATTN_ERR_NOMEM;
    /* LlamaRotaryEmbedding: inv_freq = 1/base^(2i/d) over all d dims, no
     * scaling; the shared op computes it with the same fp32 steps. */
    dsattn_rope_init(&m->rope, (size_t)m->cfg.head_dim, m->cfg.rope_theta, 0, 0, 1, 0, 0);
    return DSATTN_OK;
}

DSATTN_MODEL_NEW(mha, setup_model)

dsattn_status dsattn_mha_load_config(dsattn_mha **out, const char *config_json,
                                     char *err, size_t errlen)
{
    return mha_new_model(out, config_json, err, errlen);
}

/* ==== Loading =========================================================== */

/* Layer l's tensors from the checkpoint: the four projections as bf16 (the
 * checkpoints are bf16; an F32 or F16 file is rounded to bf16 once, as
 * model.to(torch.bfloat16) would), the norm weight as the bf16 values the
 * model holds. */
static dsattn_status bind_layer(dsattn_mha *m, const dsattn_binder *b, int64_t l)
{
    const dsattn_mha_config *c = &m->cfg;
    dsattn_mha_layer_w *L = &m->layer[l];
    const size_t D = (size_t)c->hidden, Hd = (size_t)(c->n_heads * c->head_dim);
    const size_t KVd = (size_t)(c->n_kv_heads * c->head_dim);
    const unsigned bf16 = DSATTN_WMASK(DSATTN_W_BF16);
    char n[128];
    dsattn_status st;
#define P(fmt) (snprintf(n, sizeof n, "layers.%lld." fmt, (long long)l), n)
    if ((st = dsattn_bind_vec(b, P("attn_norm.weight"), D, &L->norm))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wq"), bf16, Hd, D, &L->wq))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wk"), bf16, KVd, D, &L->wk))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wv"), bf16, KVd, D, &L->wv))) return st;
    if ((st = dsattn_bind_mat(b, P("attn.wo"), bf16, D, Hd, &L->wo))) return st;
#undef P
    dsattn_round_bf16_n(L->norm, D);
    return DSATTN_OK;
}

static void mha_loaded(dsattn_mha *m, int first, int count)
{
    m->w_first = first;
    m->w_count = count;
}

DSATTN_MODEL_LOAD(mha, bind_layer, mha_loaded)

/* ==== Random weights ==================================================== */
/* Every matrix row gets its own generator seeded from (seed, layer, matrix,
 * row), so a layer's weights are the same whichever other layers are made
 * and whatever the thread count.  Values are uniform with variance 1/cols
 * (unit-gain projections), rounded to bf16. */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float uni(uint64_t *s)   /* [-1, 1) */
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    *s = x;
    return (float)((double)(x >> 11) * 0x1p-52 - 1.0);
}

static dsattn_status rand_bf16(dsattn_mha *m, size_t rows, size_t cols, uint64_t key,
                               dsattn_weight *w)
{
    memset(w, 0, sizeof *w);
    uint16_t *p = dsattn_alloc_array(rows, cols * sizeof(uint16_t));
    dsattn_status st = own(m, p);
    if (st) return st;
    const float a = sqrtf(3.0f / (float)cols);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        uint64_t s = mix64(key ^ mix64(r)) | 1;
        for (size_t i = 0; i < cols; i++) p[r * cols + i] = dsattn_f32_to_bf16(a * uni(&s));
    }
    w->kind = DSATTN_W_BF16;
    w->rows = rows;
    w->cols = cols;
    w->data = p;
    return DSATTN_OK;
}

static dsattn_status rand_layer(dsattn_mha *m, int l, uint64_t seed)
{
    const dsattn_mha_config *c = &m->cfg;
    dsattn_mha_layer_w *L = &m->layer[l];
    size_t D = (size_t)c->hidden, Hd = (size_t)(c->n_heads * c->head_dim);
    size_t KVd = (size_t)(c->n_kv_heads * c->head_dim);
    uint64_t k = mix64(seed) ^ mix64((uint64_t)l * 0x100000001b3ull);
    dsattn_status st;
    if ((st = rand_bf16(m, Hd, D, mix64(k + 1), &L->wq))) return st;
    if ((st = rand_bf16(m, KVd, D, mix64(k + 2), &L->wk))) return st;
    if ((st = rand_bf16(m, KVd, D, mix64(k + 3), &L->wv))) return st;
    if ((st = rand_bf16(m, D, Hd, mix64(k + 4), &L->wo))) return st;
    L->norm = dsattn_alloc_array(D, sizeof(float));
    if ((st = own(m, L->norm))) return st;
    uint64_t s = mix64(k + 5) | 1;
    for (size_t i = 0; i < D; i++) L->norm[i] = dsattn_round_bf16(1.0f + 0.1f * uni(&s));
    return DSATTN_OK;
}

dsattn_status dsattn_mha_create_random_layers(dsattn_mha **out,
                                              const char *config_json,
                                              uint64_t seed, int first_layer,
                                              int n_layers, char *err,
                                              size_t errlen)
{
    dsattn_status st = mha_new_model(out, config_json, err, errlen);
    if (st) return st;
    dsattn_mha *m = *out;
    if (first_layer < 0 || n_layers <= 0 || first_layer + (int64_t)n_layers > m->cfg.n_layers) {
        const long long nl = (long long)m->cfg.n_layers;     /* read before the free */
        dsattn_mha_destroy(m);
        *out = NULL;
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "layers [%d, %lld) outside the model's %lld layers, or none",
                           first_layer, (long long)first_layer + n_layers, nl);
    }
    for (int l = first_layer; l < first_layer + n_layers && !st; l++) st = rand_layer(m, l, seed);
    if (st) { dsattn_mha_destroy(m); *out = NULL; return st; }
    m->w_first = first_layer;
    m->w_count = n_layers;
    return DSATTN_OK;
}

dsattn_status dsattn_mha_create_random(dsattn_mha **out, const char *config_json,
                                       uint64_t seed, char *err, size_t errlen)
{
    dsattn_mha_config c;
    dsattn_status st = dsattn_mha_config_load(&c, config_json, err, errlen);
    if (st) { if (out) *out = NULL; return st; }
    return dsattn_mha_create_random_layers(out, config_json, seed, 0, (int)c.n_layers, err,
                                           errlen);
}

int dsattn_mha_n_layers(const dsattn_mha *m) { return m ? (int)m->cfg.n_layers : -1; }
int dsattn_mha_dim(const dsattn_mha *m) { return m ? (int)m->cfg.hidden : -1; }
int dsattn_mha_n_heads(const dsattn_mha *m) { return m ? (int)m->cfg.n_heads : -1; }
int dsattn_mha_n_kv_heads(const dsattn_mha *m) { return m ? (int)m->cfg.n_kv_heads : -1; }
int dsattn_mha_head_dim(const dsattn_mha *m) { return m ? (int)m->cfg.head_dim : -1; }

int dsattn_mha_has_weights(const dsattn_mha *m, int layer)
{
    return m && layer >= 0 && layer < m->cfg.n_layers && m->layer[layer].wq.data != NULL;
}

size_t dsattn_mha_weight_bytes(const dsattn_mha *m)
{
    size_t t = 0;
    if (!m) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_mha_layer_w *L = &m->layer[l];
        const dsattn_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo };
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(ws); i++)
            if (ws[i]->data) t += ws[i]->rows * ws[i]->cols * sizeof(uint16_t);
    }
    return t;
}

/* ==== Sequences ========================================================= */

dsattn_status dsattn_mha_seq_create_layers(dsattn_mha_seq **out,
                                           const dsattn_mha *m,
                                           size_t max_seq_len, int first_layer,
                                           int n_layers)
{
    if (!out || !m || max_seq_len == 0 || first_layer < 0 || n_layers <= 0 ||
        first_layer + (int64_t)n_layers > m->cfg.n_layers)
        return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    const dsattn_mha_config *c = &m->cfg;
    /* One cache is Hkv * d * cap bf16; check the product once. */
    size_t per = 0;
    if (!dsattn_mul3_size((size_t)c->n_kv_heads * (size_t)c->head_dim, max_seq_len,
                          sizeof(uint16_t), &per))
        return DSATTN_ERR_OVERFLOW;
    dsattn_mha_seq *s = calloc(1, sizeof *s);
    if (!s) return DSATTN_ERR_NOMEM;
    s->m = m;
    s->max_seq_len = max_seq_len;
    s->first = first_layer;
    s->count = n_layers;
    s->layer = calloc((size_t)n_layers, sizeof *s->layer);
    if (!s->layer) { free(s); return DSATTN_ERR_NOMEM; }
    for (int i = 0; i < n_layers; i++) {
        /* deep caches come back 2 MiB aligned as transparent huge pages
         * (dsattn_alloc, core.c): ~11 % of a GQA step at 256K */
        s->layer[i].k = dsattn_alloc(per);
        s->layer[i].v = dsattn_alloc(per);
        if (!s->layer[i].k || !s->layer[i].v) {
            dsattn_mha_seq_destroy(s);
            return DSATTN_ERR_NOMEM;
        }
        s->bytes_allocated += 2 * per;
    }
    /* a decode step's scratch at capacity: no allocation per step */
    const size_t sb = dsattn_mha_decode_scratch_bytes(c, max_seq_len);
    if (sb == SIZE_MAX || !(s->scratch = dsattn_alloc(sb))) {
        dsattn_mha_seq_destroy(s);
        return sb == SIZE_MAX ? DSATTN_ERR_OVERFLOW : DSATTN_ERR_NOMEM;
    }
    s->scratch_size = sb;
    *out = s;
    return DSATTN_OK;
}

dsattn_status dsattn_mha_seq_create(dsattn_mha_seq **out, const dsattn_mha *m,
                                    size_t max_seq_len)
{
    if (!m) return DSATTN_ERR_INVALID_ARG;
    return dsattn_mha_seq_create_layers(out, m, max_seq_len, 0, (int)m->cfg.n_layers);
}

void dsattn_mha_seq_destroy(dsattn_mha_seq *s)
{
    if (!s) return;
    if (s->layer)
        for (int i = 0; i < s->count; i++) {
            dsattn_free(s->layer[i].k);
            dsattn_free(s->layer[i].v);
        }
    free(s->layer);
    dsattn_free(s->scratch);
    free(s);
}

DSATTN_SEQ_POS_API(mha)

dsattn_status dsattn_mha_seq_kv(const dsattn_mha_seq *s, int layer, size_t pos,
                                float *k, float *v)
{
    if (!s || layer < s->first || layer >= s->first + s->count || pos >= s->max_seq_len)
        return DSATTN_ERR_INVALID_ARG;
    const dsattn_mha_config *c = &s->m->cfg;
    const dsattn_mha_layer_s *S = &s->layer[layer - s->first];
    const size_t d = (size_t)c->head_dim, cap = s->max_seq_len;
    for (size_t g = 0; g < (size_t)c->n_kv_heads; g++)
        for (size_t i = 0; i < d; i++) {
            if (k) k[g * d + i] = dsattn_bf16_to_f32(S->k[dsattn_mha_k_index(cap, d, g, pos, i)]);
            if (v) v[g * d + i] = dsattn_bf16_to_f32(S->v[dsattn_mha_v_index(cap, d, g, pos, i)]);
        }
    return DSATTN_OK;
}

size_t dsattn_mha_seq_scratch_at(const dsattn_mha *m, size_t cap)
{
    return m ? dsattn_mha_decode_scratch_bytes(&m->cfg, cap) : 0;
}

dsattn_status dsattn_mha_seq_kv_bill(const dsattn_mha_seq *s, dsattn_kv_bill *b)
{
    if (!s || !b) return DSATTN_ERR_INVALID_ARG;
    /* What seq_create allocated: two caches of Hkv * d * cap bf16 per held
     * layer (no repeat_kv copies, no window, no state), and the forward's
     * scratch. */
    *b = (dsattn_kv_bill){ .global_bytes_allocated = s->bytes_allocated,
                           .scratch_bytes = s->scratch_size };
    return dsattn_kv_bill_per_token(b, s->max_seq_len);
}

/* Tokens per generator of the synthetic fill: the 64 the first layout
 * used, so a fill stores the same values whatever the layout. */
#define FILL_BLOCK 64
_Static_assert(FILL_BLOCK % DSATTN_MHA_KTILE == 0 && FILL_BLOCK % DSATTN_MHA_VTILE == 0,
               "a fill block holds whole K and V tiles");

dsattn_status dsattn_mha_seq_fill_synthetic(dsattn_mha_seq *s, int64_t depth,
                                            uint64_t seed)
{
    if (!s || depth < 0 || (size_t)depth >= s->max_seq_len) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mha_config *c = &s->m->cfg;
    const size_t d = (size_t)c->head_dim, cap = s->max_seq_len, Hkv = (size_t)c->n_kv_heads;
    const size_t n = (size_t)depth;
    for (int i = 0; i < s->count; i++) {
        dsattn_mha_layer_s *S = &s->layer[i];
        /* one generator per (kv head, block of FILL_BLOCK tokens), so a
         * thread owns whole K and V tiles (FILL_BLOCK is a multiple of both)
         * and the values do not depend on the thread count or the cache
         * layout; four values per 64-bit draw, (u16 - 32768) / 32768
         * rounded to bf16: token t's K dims, then its V dims */
        const size_t B = FILL_BLOCK, nblk = (n + B - 1) / B;
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < Hkv * nblk; r++) {
            uint64_t st = mix64(seed ^ mix64(((uint64_t)(s->first + i) << 40) ^ r)) | 1;
            size_t g = r / nblk, t0 = (r % nblk) * B;
            for (size_t t = t0; t < DSATTN_MIN(n, t0 + B); t++) {
                for (size_t e = 0; e < 2 * d; e += 4) {
                    st ^= st << 13; st ^= st >> 7; st ^= st << 17;
                    for (size_t q = 0; q < 4; q++) {
                        float x = (float)((int32_t)((st >> (16 * q)) & 0xffff) - 32768) * 0x1p-15f;
                        uint16_t bits = dsattn_f32_to_bf16(x);
                        if (e + q < d) S->k[dsattn_mha_k_index(cap, d, g, t, e + q)] = bits;
                        else S->v[dsattn_mha_v_index(cap, d, g, t, e + q - d)] = bits;
                    }
                }
            }
        }
    }
    s->pos = depth;
    return DSATTN_OK;
}
