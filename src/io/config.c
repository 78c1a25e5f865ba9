/* config.c - HF and inference config.json -> dsattn_model_config, and the
 * V4.1 layer plan derived from it (see config.h for the rules).
 *
 * Owns: architecture detection, the key-name translation between the two
 * formats, range and consistency checks.  Every error names the key and the
 * file.  Deliberately not here: anything about tensors.
 */
#include "config.h"

#include "internal.h"
#include "jsoncfg.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

const char *dsattn_arch_name(dsattn_arch a)
{
    switch (a) {
    case DSATTN_ARCH_V3:  return "deepseek_v3";
    case DSATTN_ARCH_V32: return "deepseek_v32";
    case DSATTN_ARCH_V4:  return "deepseek_v4";
    case DSATTN_ARCH_V41: return "deepseek_v41";
    case DSATTN_ARCH_LLAMA: return "llama";
    default:              return "unknown";
    }
}

int64_t dsattn_fp8_act_block(dsattn_arch a)
{
    switch (a) {
    case DSATTN_ARCH_V41: return 32;
    case DSATTN_ARCH_V32:
    case DSATTN_ARCH_V4:  return 128;
    default:              return 0;
    }
}

const char *dsattn_v41_mode_name(dsattn_v41_mode m)
{
    switch (m) {
    case DSATTN_V41_SWA:     return "SWA";
    case DSATTN_V41_FULL:    return "Full";
    case DSATTN_V41_REINDEX: return "Reindex";
    case DSATTN_V41_REUSE:   return "Reuse";
    case DSATTN_V41_MTP:     return "MTP";
    }
    return "?";
}

/* A reader bound to one JSON object and one key style.  `hf` picks the
 * second name of each pair.  Errors are prefixed with the file. */
typedef struct {
    const cJSON *obj;
    const char  *what;
    int          hf;
    char        *err;
    size_t       errlen;
} cfg_rd;

static dsattn_status rd_fail(cfg_rd *r, dsattn_status st)
{
    if (r->err && r->errlen) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", r->err);
        snprintf(r->err, r->errlen, "%s: %s", r->what, tmp);
    }
    return st;
}

static dsattn_status rd_int(cfg_rd *r, const char *inf, const char *hf,
                            int64_t *out)
{
    dsattn_status st = dsattn_jcfg_int(r->obj, r->hf ? hf : inf, out, r->err, r->errlen);
    return st == DSATTN_OK ? st : rd_fail(r, st);
}

static dsattn_status rd_int_opt(cfg_rd *r, const char *inf, const char *hf,
                                int64_t def, int64_t *out)
{
    dsattn_status st = dsattn_jcfg_int_opt(r->obj, r->hf ? hf : inf, def, out,
                                           r->err, r->errlen);
    return st == DSATTN_OK ? st : rd_fail(r, st);
}

static dsattn_status rd_dbl_opt(cfg_rd *r, const char *inf, const char *hf,
                                double def, double *out)
{
    dsattn_status st = dsattn_jcfg_double_opt(r->obj, r->hf ? hf : inf, def, out,
                                              r->err, r->errlen);
    return st == DSATTN_OK ? st : rd_fail(r, st);
}

static dsattn_status rd_dbl(cfg_rd *r, const char *inf, const char *hf, double *out)
{
    dsattn_status st = dsattn_jcfg_double(r->obj, r->hf ? hf : inf, out, r->err,
                                          r->errlen);
    return st == DSATTN_OK ? st : rd_fail(r, st);
}

static dsattn_status rd_arr(cfg_rd *r, const char *inf, const char *hf,
                            int64_t *out, int64_t *n)
{
    size_t k = 0;
    dsattn_status st = dsattn_jcfg_int_array(r->obj, r->hf ? hf : inf, out,
                                             DSATTN_MAX_LAYERS, &k, r->err,
                                             r->errlen);
    if (st != DSATTN_OK) return rd_fail(r, st);
    *n = (int64_t)k;
    return DSATTN_OK;
}

#define TRY(x)                                 \
    do {                                       \
        dsattn_status st_ = (x);               \
        if (st_ != DSATTN_OK) return st_;      \
    } while (0)

static dsattn_arch arch_from_type(const char *mt)
{
    if (!strcmp(mt, "deepseek_v3")) return DSATTN_ARCH_V3;
    if (!strcmp(mt, "deepseek_v32")) return DSATTN_ARCH_V32;
    if (!strcmp(mt, "deepseek_v4")) return DSATTN_ARCH_V4;
    if (!strcmp(mt, "deepseek_v41") || !strcmp(mt, "deepseek_v41_text"))
        return DSATTN_ARCH_V41;
    if (!strcmp(mt, "llama")) return DSATTN_ARCH_LLAMA;
    return DSATTN_ARCH_UNKNOWN;
}

static dsattn_status check_pos(const char *what, const char *key, int64_t v,
                               int64_t lo, char *err, size_t errlen)
{
    if (v < lo || v > ((int64_t)1 << 40))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: key '%s' = %lld is out of range (must be >= %lld)",
                           what, key, (long long)v, (long long)lo);
    return DSATTN_OK;
}

/* A group of required integer keys: read them all, then check each against
 * its lower bound (errors name the inference key).  An `opt` key that is
 * absent takes the value `def`. */
typedef struct {
    const char *inf, *hf;
    size_t      off;          /* offsetof(dsattn_model_config, field) */
    int64_t     lo;
    int         opt;
    int64_t     def;
} int_key;
#define IKEY(inf, hf, field, lo) { inf, hf, offsetof(dsattn_model_config, field), lo, 0, 0 }

static int64_t *key_field(dsattn_model_config *c, const int_key *k)
{
    return (int64_t *)((char *)c + k->off);
}

static dsattn_status rd_keys(cfg_rd *r, dsattn_model_config *c, const int_key *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        TRY(k[i].opt ? rd_int_opt(r, k[i].inf, k[i].hf, k[i].def, key_field(c, &k[i]))
                     : rd_int(r, k[i].inf, k[i].hf, key_field(c, &k[i])));
    for (size_t i = 0; i < n; i++)
        TRY(check_pos(r->what, k[i].inf, *key_field(c, &k[i]), k[i].lo, r->err, r->errlen));
    return DSATTN_OK;
}

/* The layer lists of V4.1: in range, no duplicates; sorted on return. */
static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static dsattn_status check_list(const char *what, const char *key, int64_t *v,
                                int64_t n, int64_t limit, char *err, size_t errlen)
{
    for (int64_t i = 0; i < n; i++)
        if (v[i] < 0 || v[i] >= limit)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key '%s' entry %lld = %lld is outside layers 0..%lld",
                               what, key, (long long)i, (long long)v[i],
                               (long long)limit - 1);
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_i64);
    for (int64_t i = 1; i < n; i++)
        if (v[i] == v[i - 1])
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key '%s' lists layer %lld twice", what, key,
                               (long long)v[i]);
    return DSATTN_OK;
}

dsattn_status dsattn_config_from_json(dsattn_model_config *c, const cJSON *root,
                                      const char *what, char *err, size_t errlen)
{
    if (!c || !root)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "NULL argument");
    if (!what) what = "config.json";
    memset(c, 0, sizeof *c);
    c->candidate_source_layer = -1;

    /* ---- which format, which architecture ---------------------------- */
    const cJSON *obj = root, *quant = NULL;
    const char *mt = NULL;
    dsattn_status st = dsattn_jcfg_string_opt(root, "model_type", NULL, &mt, err, errlen);
    if (st != DSATTN_OK) return dsattn_errf(err, errlen, st, "%s: key 'model_type' is not a string", what);
    if (dsattn_jcfg_has(root, "text_config")) {
        const cJSON *tc;
        st = dsattn_jcfg_object(root, "text_config", &tc, err, errlen);
        if (st != DSATTN_OK)
            return dsattn_errf(err, errlen, st, "%s: key 'text_config' is not an object", what);
        obj = tc;
        const char *tmt = NULL;
        if (dsattn_jcfg_string_opt(tc, "model_type", NULL, &tmt, err, errlen) == DSATTN_OK &&
            !mt)
            mt = tmt;
    }
    if (dsattn_jcfg_has(root, "quantization_config")) {
        if (dsattn_jcfg_object(root, "quantization_config", &quant, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key 'quantization_config' is not an object", what);
    } else if (obj != root && dsattn_jcfg_has(obj, "quantization_config")) {
        if (dsattn_jcfg_object(obj, "quantization_config", &quant, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key 'text_config.quantization_config' is not an object",
                               what);
    }
    int hf = dsattn_jcfg_has(obj, "hidden_size") || dsattn_jcfg_has(obj, "num_hidden_layers");
    int flat = dsattn_jcfg_has(obj, "dim") || dsattn_jcfg_has(obj, "n_layers");
    if (hf && flat)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: mixes HF keys (hidden_size/num_hidden_layers) with "
                           "inference keys (dim/n_layers)", what);
    if (!hf && !flat)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: neither HF (hidden_size) nor inference (dim) keys "
                           "found: not a DeepSeek config", what);
    c->hf_keys = hf;
    if (mt) {
        c->arch = arch_from_type(mt);
        if (c->arch == DSATTN_ARCH_UNKNOWN)
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: unknown architecture model_type '%s' (supported: "
                               "llama, deepseek_v3, deepseek_v32, deepseek_v4, deepseek_v41)",
                               what, mt);
    } else {
        /* The inference/config.json files carry no model_type: the keys
         * themselves tell the generation apart. */
        if (dsattn_jcfg_has(obj, hf ? "kv_source_layer_ids" : "kv_source_layers"))
            c->arch = DSATTN_ARCH_V41;
        else if (dsattn_jcfg_has(obj, "compress_ratios"))
            c->arch = DSATTN_ARCH_V4;
        else if (dsattn_jcfg_has(obj, "kv_lora_rank") && dsattn_jcfg_has(obj, "index_n_heads"))
            c->arch = DSATTN_ARCH_V32;
        else if (dsattn_jcfg_has(obj, "kv_lora_rank"))
            c->arch = DSATTN_ARCH_V3;
        else
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: no model_type and no key that identifies a "
                               "DeepSeek attention generation", what);
    }

    cfg_rd r = { obj, what, hf, err, errlen };
    dsattn_arch a = c->arch;
    int mla = a == DSATTN_ARCH_V3 || a == DSATTN_ARCH_V32;

    static const int_key shape_keys[] = {
        IKEY("dim", "hidden_size", dim, 1),
        IKEY("n_layers", "num_hidden_layers", n_layers, 1),
        IKEY("n_heads", "num_attention_heads", n_heads, 1),
    };
    TRY(rd_keys(&r, c, shape_keys, DSATTN_ARRAY_LEN(shape_keys)));
    if (c->n_layers > DSATTN_MAX_LAYERS)
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: %lld layers, at most %d supported", what,
                           (long long)c->n_layers, DSATTN_MAX_LAYERS);
    if (a == DSATTN_ARCH_LLAMA) {
        /* DeepSeek-LLM 7B / 67B: an HF LlamaConfig (LlamaConfig's defaults),
         * bf16 weights.  The MHA model (src/attn/mha_model.c) takes these
         * and refuses what its forward does not implement (RoPE scaling,
         * biases, tensor parallel, head_dim past 128). */
        if (!hf)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: model_type llama needs the HF keys (hidden_size, ...)", what);
        if (quant)
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: key 'quantization_config': quantized llama weights are "
                               "not implemented (DeepSeek-LLM ships bf16)", what);
        TRY(rd_int_opt(&r, "", "num_key_value_heads", c->n_heads, &c->n_kv_heads));
        if (c->dim % c->n_heads)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key 'num_attention_heads': %lld must divide hidden_size "
                               "%lld", what, (long long)c->n_heads, (long long)c->dim);
        if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: key 'num_key_value_heads': %lld must divide "
                               "num_attention_heads %lld", what, (long long)c->n_kv_heads,
                               (long long)c->n_heads);
        c->head_dim = c->dim / c->n_heads;
        c->rope_theta = 10000.0;
        c->norm_eps = 1e-6;
        c->max_seq_len = 2048;
        TRY(rd_dbl_opt(&r, "", "rope_theta", c->rope_theta, &c->rope_theta));
        TRY(rd_dbl_opt(&r, "", "rms_norm_eps", c->norm_eps, &c->norm_eps));
        TRY(rd_int_opt(&r, "", "max_position_embeddings", c->max_seq_len, &c->max_seq_len));
        snprintf(c->dtype, sizeof c->dtype, "bf16");
        return DSATTN_OK;
    }
    int64_t n_mtp = -1;
    TRY(rd_int_opt(&r, "n_mtp_layers", "num_nextn_predict_layers", -1, &n_mtp));
    if (n_mtp < -1 || n_mtp > 64)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: MTP layer count %lld out of range", what, (long long)n_mtp);

    if (mla) {
        static const int_key mla_keys[] = {
            { "q_lora_rank", "q_lora_rank", offsetof(dsattn_model_config, q_lora_rank), 0, 1, 0 },
            IKEY("kv_lora_rank", "kv_lora_rank", kv_lora_rank, 1),
            IKEY("qk_nope_head_dim", "qk_nope_head_dim", qk_nope_head_dim, 1),
            IKEY("qk_rope_head_dim", "qk_rope_head_dim", qk_rope_head_dim, 2),
            IKEY("v_head_dim", "v_head_dim", v_head_dim, 1),
        };
        TRY(rd_keys(&r, c, mla_keys, DSATTN_ARRAY_LEN(mla_keys)));
        if (c->qk_rope_head_dim % 2)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: qk_rope_head_dim %lld is odd", what,
                               (long long)c->qk_rope_head_dim);
        c->n_mtp = n_mtp < 0 ? 0 : n_mtp;
        /* V3 ModelArgs defaults; the HF file nests them in rope_scaling. */
        c->rope_theta = 10000.0;
        c->rope_factor = 40;
        c->original_seq_len = 4096;
        c->beta_fast = 32;
        c->beta_slow = 1;
        c->mscale = 1.0;
        c->max_seq_len = 4096 * 4;
        c->norm_eps = 1e-6;
    } else {
        static const int_key v4_keys[] = {
            IKEY("q_lora_rank", "q_lora_rank", q_lora_rank, 1),
            IKEY("head_dim", "head_dim", head_dim, 1),
            IKEY("rope_head_dim", "qk_rope_head_dim", rope_head_dim, 2),
            IKEY("o_groups", "o_groups", o_groups, 1),
            IKEY("o_lora_rank", "o_lora_rank", o_lora_rank, 1),
            IKEY("window_size", "sliding_window", window_size, 1),
        };
        TRY(rd_keys(&r, c, v4_keys, DSATTN_ARRAY_LEN(v4_keys)));
        /* V4.1 rotates the tail of a head and quantizes all of it, so a
         * head of rope dims only is valid there; V4 quantizes the non-rope
         * part by itself and needs some. */
        if (c->rope_head_dim > c->head_dim || c->rope_head_dim % 2 || c->rope_head_dim <= 0 ||
            (a != DSATTN_ARCH_V41 && c->rope_head_dim == c->head_dim))
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: rope_head_dim %lld must be even, positive and %s head_dim %lld",
                               what, (long long)c->rope_head_dim,
                               a == DSATTN_ARCH_V41 ? "at most" : "below", (long long)c->head_dim);
        if (c->n_heads % c->o_groups)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: n_heads %lld is not a multiple of o_groups %lld",
                               what, (long long)c->n_heads, (long long)c->o_groups);
        TRY(rd_arr(&r, "compress_ratios", "compress_ratios", c->compress_ratios,
                   &c->n_compress_ratios));
        for (int64_t i = 0; i < c->n_compress_ratios; i++)
            if (c->compress_ratios[i] < 0)
                return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                                   "%s: compress_ratios[%lld] = %lld is negative", what,
                                   (long long)i, (long long)c->compress_ratios[i]);
        /* V4's ModelArgs has n_mtp_layers = 1: an inference config that
         * omits it has one MTP entry */
        if (a == DSATTN_ARCH_V4 && !hf && n_mtp < 0) n_mtp = 1;
        /* One entry per backbone layer, then the MTP/DSpark layers'.  The
         * reference reads compress_ratios[layer_id] for the n_layers blocks
         * and the n_mtp MTP blocks, so it needs that many entries and
         * ignores any after them; the same here (the surplus is kept as
         * MTP entries, which are not part of the stack). */
        if (n_mtp >= 0 && c->n_compress_ratios < c->n_layers + n_mtp)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: compress_ratios has %lld entries, but n_layers %lld + "
                               "%lld MTP layers need %lld", what,
                               (long long)c->n_compress_ratios, (long long)c->n_layers,
                               (long long)n_mtp, (long long)(c->n_layers + n_mtp));
        if (c->n_compress_ratios < c->n_layers)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: compress_ratios has %lld entries, fewer than n_layers %lld",
                               what, (long long)c->n_compress_ratios, (long long)c->n_layers);
        /* An MTP/DSpark entry may hold any ratio: the reference builds
         * those blocks from it, and they are not part of the attention stack
         * dsattn runs. */
        c->n_mtp = c->n_compress_ratios - c->n_layers;
        /* RoPE / YaRN: required, the V4 configs always carry them. */
        TRY(rd_dbl(&r, "rope_theta", "rope_theta", &c->rope_theta));
        TRY(rd_dbl(&r, "compress_rope_theta", "compress_rope_theta", &c->compress_rope_theta));
        c->mscale = 1.0;
        c->norm_eps = a == DSATTN_ARCH_V41 ? 1e-20 : 1e-6;
    }

    if (a != DSATTN_ARCH_V3) {
        static const int_key index_keys[] = {
            IKEY("index_n_heads", "index_n_heads", index_n_heads, 1),
            IKEY("index_head_dim", "index_head_dim", index_head_dim, 1),
            IKEY("index_topk", "index_topk", index_topk, 1),
        };
        TRY(rd_keys(&r, c, index_keys, DSATTN_ARRAY_LEN(index_keys)));
    }

    if (a == DSATTN_ARCH_V41) {
        TRY(rd_arr(&r, "kv_source_layers", "kv_source_layer_ids", c->kv_source_layers,
                   &c->n_kv_source_layers));
        TRY(rd_arr(&r, "index_source_layers", "index_source_layer_ids",
                   c->index_source_layers, &c->n_index_source_layers));
        TRY(rd_int(&r, "candidate_source_layer", "candidate_source_layer_id",
                   &c->candidate_source_layer));
        /* candidate_source_layer < 0 means no hierarchical pool (the
         * reference's own smoke-test config); the pool's sizes matter only
         * when there is a source. */
        if (c->candidate_source_layer >= 0) {
            static const int_key pool_keys[] = {
                IKEY("candidate_topk_blocks", "candidate_topk_blocks", candidate_topk_blocks, 1),
                IKEY("candidate_block_size", "candidate_block_size", candidate_block_size, 1),
            };
            TRY(rd_keys(&r, c, pool_keys, DSATTN_ARRAY_LEN(pool_keys)));
        }
        int64_t lim = c->n_compress_ratios;
        TRY(check_list(what, "kv_source_layers", c->kv_source_layers,
                       c->n_kv_source_layers, lim, err, errlen));
        TRY(check_list(what, "index_source_layers", c->index_source_layers,
                       c->n_index_source_layers, lim, err, errlen));
    }

    /* ---- RoPE, YaRN, norm ------------------------------------------- */
    if (hf) {
        TRY(rd_dbl_opt(&r, "", "rope_theta", c->rope_theta, &c->rope_theta));
        TRY(rd_dbl_opt(&r, "", "rms_norm_eps", c->norm_eps, &c->norm_eps));
        TRY(rd_int_opt(&r, "", "max_position_embeddings", c->max_seq_len, &c->max_seq_len));
        if (dsattn_jcfg_has(obj, "rope_scaling")) {
            const cJSON *rs;
            if (dsattn_jcfg_object(obj, "rope_scaling", &rs, err, errlen) != DSATTN_OK)
                return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                                   "%s: key 'rope_scaling' is not an object", what);
            cfg_rd q = { rs, what, 1, err, errlen };
            TRY(rd_dbl(&q, "", "factor", &c->rope_factor));
            TRY(rd_int_opt(&q, "", "original_max_position_embeddings",
                           c->original_seq_len, &c->original_seq_len));
            /* ints in ModelArgs: 32.0 reads as 32, 32.5 or 1e28 is an error */
            TRY(rd_int_opt(&q, "", "beta_fast", c->beta_fast, &c->beta_fast));
            TRY(rd_int_opt(&q, "", "beta_slow", c->beta_slow, &c->beta_slow));
            double ms = c->mscale;
            TRY(rd_dbl_opt(&q, "", "mscale", ms, &ms));
            TRY(rd_dbl_opt(&q, "", "mscale_all_dim", ms, &c->mscale));
        } else if (!mla) {
            return dsattn_errf(err, errlen, DSATTN_ERR_NOT_FOUND,
                               "%s: key 'rope_scaling': missing (YaRN parameters)", what);
        }
    } else {
        if (mla) TRY(rd_dbl_opt(&r, "rope_theta", "", c->rope_theta, &c->rope_theta));
        double rf = c->rope_factor;
        /* beta_fast / beta_slow are ints in ModelArgs: an integral number
         * reads as that integer, anything else is an error */
        if (mla) {
            TRY(rd_dbl_opt(&r, "rope_factor", "", rf, &c->rope_factor));
            TRY(rd_int_opt(&r, "original_seq_len", "", c->original_seq_len,
                           &c->original_seq_len));
            TRY(rd_int_opt(&r, "beta_fast", "", c->beta_fast, &c->beta_fast));
            TRY(rd_int_opt(&r, "beta_slow", "", c->beta_slow, &c->beta_slow));
            TRY(rd_dbl_opt(&r, "mscale", "", c->mscale, &c->mscale));
        } else {
            TRY(rd_dbl(&r, "rope_factor", "", &c->rope_factor));
            if (a == DSATTN_ARCH_V4)     /* ModelArgs default 0: no YaRN ramp */
                TRY(rd_int_opt(&r, "original_seq_len", "", 0, &c->original_seq_len));
            else
                TRY(rd_int(&r, "original_seq_len", "", &c->original_seq_len));
            TRY(rd_int(&r, "beta_fast", "", &c->beta_fast));
            TRY(rd_int(&r, "beta_slow", "", &c->beta_slow));
        }
        TRY(rd_dbl_opt(&r, "norm_eps", "", c->norm_eps, &c->norm_eps));
        TRY(rd_int_opt(&r, "max_seq_len", "", c->max_seq_len, &c->max_seq_len));
    }
    if (!(c->rope_theta > 0) || !(c->rope_factor > 0) || !(c->norm_eps > 0) ||
        (!mla && !(c->compress_rope_theta > 0)))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: rope_theta, rope_factor, compress_rope_theta and norm_eps "
                           "must be positive", what);

    /* ---- weight storage --------------------------------------------- */
    const char *dt = NULL, *sf = NULL, *sd = NULL;
    if (!hf) {
        /* ModelArgs.dtype: "fp8" in V4's model.py, "bf16" before it */
        const char *dt_def = a == DSATTN_ARCH_V4 ? "fp8" : "bf16";
        if (dsattn_jcfg_string_opt(obj, "dtype", dt_def, &dt, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: key 'dtype' is not a string", what);
        if (dsattn_jcfg_string_opt(obj, "scale_fmt", "", &sf, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: key 'scale_fmt' is not a string", what);
        if (dsattn_jcfg_string_opt(obj, "scale_dtype", "", &sd, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: key 'scale_dtype' is not a string", what);
        if (strcmp(dt, "bf16") && strcmp(dt, "fp8"))
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: key 'dtype' = '%s' (expected bf16 or fp8)", what, dt);
    } else {
        dt = "bf16";
        sf = "";
    }
    if (quant) {
        const char *qm = NULL;
        if (dsattn_jcfg_string(quant, "quant_method", &qm, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: quantization_config.quant_method missing or not a string", what);
        if (strcmp(qm, "fp8"))
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: quantization_config.quant_method '%s' (only fp8)", what, qm);
        dt = "fp8";
        int64_t wb[4];
        size_t nwb = 0;
        if (dsattn_jcfg_has(quant, "weight_block_size")) {
            if (dsattn_jcfg_int_array(quant, "weight_block_size", wb, 4, &nwb, err,
                                      errlen) != DSATTN_OK || nwb != 2)
                return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                                   "%s: quantization_config.weight_block_size must be [n, n]",
                                   what);
            if (wb[0] != wb[1] || (wb[0] != 32 && wb[0] != 64 && wb[0] != 128))
                return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                                   "%s: quantization_config.weight_block_size [%lld, %lld]: "
                                   "only square 32, 64 or 128 blocks", what,
                                   (long long)wb[0], (long long)wb[1]);
            c->weight_block = wb[0];
        }
        const char *qsf = NULL;
        if (dsattn_jcfg_string_opt(quant, "scale_fmt", sf, &qsf, err, errlen) != DSATTN_OK)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: quantization_config.scale_fmt is not a string", what);
        sf = qsf;
    }
    snprintf(c->dtype, sizeof c->dtype, "%s", dt);
    snprintf(c->scale_fmt, sizeof c->scale_fmt, "%s", sf ? sf : "");
    snprintf(c->scale_dtype, sizeof c->scale_dtype, "%s", sd ? sd : "");

    if (a == DSATTN_ARCH_V41) {
        dsattn_v41_plan *p = malloc(sizeof *p);
        if (!p) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        char e2[400];
        st = dsattn_v41_plan_from_config(c, p, e2, sizeof e2);
        free(p);
        if (st != DSATTN_OK) return dsattn_errf(err, errlen, st, "%s: %s", what, e2);
    }
    return DSATTN_OK;
}

dsattn_status dsattn_config_load(dsattn_model_config *cfg, const char *path,
                                 char *err, size_t errlen)
{
    cJSON *root = NULL;
    dsattn_status st = dsattn_jcfg_load(&root, path, err, errlen);
    if (st != DSATTN_OK) return st;
    st = dsattn_config_from_json(cfg, root, path, err, errlen);
    cJSON_Delete(root);
    return st;
}

/* ==== V4.1 plan ========================================================= */

static int in_list(const int64_t *v, int64_t n, int64_t x)
{
    for (int64_t i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* Every source layer (kv or index) is a backbone layer that compresses. */
static dsattn_status check_sources(const dsattn_model_config *c, const char *role,
                                   const int64_t *v, int64_t n, char *err, size_t errlen)
{
    const int64_t L = c->n_layers;
    for (int64_t k = 0; k < n; k++) {
        if (v[k] < 0 || v[k] >= L)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: %s source layer %lld is not a backbone layer "
                               "(0..%lld)", role, (long long)v[k], (long long)L - 1);
        if (c->compress_ratios[v[k]] == 0)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: %s source layer %lld has compress ratio 0 "
                               "(a source must compress)", role, (long long)v[k]);
    }
    return DSATTN_OK;
}

dsattn_status dsattn_v41_plan_from_config(const dsattn_model_config *c,
                                          dsattn_v41_plan *p, char *err,
                                          size_t errlen)
{
    if (!c || !p) return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "NULL argument");
    if (c->arch != DSATTN_ARCH_V41)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "layer plan: config is %s, not deepseek_v41",
                           dsattn_arch_name(c->arch));
    memset(p, 0, sizeof *p);
    int64_t L = c->n_layers, total = c->n_compress_ratios;
    if (L < 1 || total < L || total > DSATTN_MAX_LAYERS)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "layer plan: %lld compress_ratios for %lld layers",
                           (long long)total, (long long)L);
    p->n_layers = L;
    p->n_mtp = total - L;
    dsattn_status st = check_sources(c, "kv", c->kv_source_layers, c->n_kv_source_layers,
                                     err, errlen);
    if (st == DSATTN_OK)
        st = check_sources(c, "index", c->index_source_layers, c->n_index_source_layers, err,
                           errlen);
    if (st != DSATTN_OK) return st;
    int64_t cand = c->candidate_source_layer;
    if (cand >= 0 && !in_list(c->index_source_layers, c->n_index_source_layers, cand))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "layer plan: candidate_source_layer %lld is not an index source "
                           "layer", (long long)cand);
    for (int64_t k = 0; k < c->n_kv_source_layers; k++)
        if (!in_list(c->index_source_layers, c->n_index_source_layers, c->kv_source_layers[k]))
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: kv source layer %lld is not an index source "
                               "(unsupported plan: its index keys would have no scorer)",
                               (long long)c->kv_source_layers[k]);
    int64_t kv_src = -1, idx_src = -1;
    for (int64_t i = 0; i < total; i++) {
        dsattn_v41_layer_plan *l = &p->layer[i];
        l->ratio = c->compress_ratios[i];
        l->kv_source = l->index_source = -1;
        if (i >= L) {
            l->mode = DSATTN_V41_MTP;
            continue;
        }
        if (l->ratio == 0) {
            l->mode = DSATTN_V41_SWA;
            p->n_swa++;
            continue;
        }
        int is_kv = in_list(c->kv_source_layers, c->n_kv_source_layers, i);
        int is_idx = in_list(c->index_source_layers, c->n_index_source_layers, i);
        if (is_kv) kv_src = i;
        if (is_idx) idx_src = i;
        if (kv_src < 0)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: layer %lld compresses (ratio %lld) but no kv "
                               "source layer is at or before it", (long long)i,
                               (long long)l->ratio);
        if (c->compress_ratios[kv_src] != l->ratio)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: layer %lld has ratio %lld but reads the "
                               "compressed KV of layer %lld, whose ratio is %lld",
                               (long long)i, (long long)l->ratio, (long long)kv_src,
                               (long long)c->compress_ratios[kv_src]);
        if (idx_src < 0)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: layer %lld compresses but no index source "
                               "layer is at or before it", (long long)i);
        l->kv_source = kv_src;
        l->index_source = idx_src;
        l->is_candidate_source = i == cand;
        if (is_kv) {
            l->mode = DSATTN_V41_FULL;
            p->n_full++;
        } else if (is_idx) {
            /* A Reindex layer before the candidate source (or with none)
             * scores every visible entry, as the reference's
             * uses_candidates = 0 <= candidate_source_layer < layer_id. */
            l->mode = DSATTN_V41_REINDEX;
            p->n_reindex++;
        } else {
            l->mode = DSATTN_V41_REUSE;
            p->n_reuse++;
        }
    }
    /* Every index source after the candidate source masks its scores with
     * the pool (the reference's uses_candidates = 0 <= candidate_source <
     * layer_id), a mask over the source's entries: with another ratio its
     * shape is not the layer's, and the reference fails there. */
    for (int64_t i = cand + 1; cand >= 0 && i < L; i++)
        if ((p->layer[i].mode == DSATTN_V41_FULL || p->layer[i].mode == DSATTN_V41_REINDEX) &&
            p->layer[i].ratio != p->layer[cand].ratio)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "layer plan: index source layer %lld has ratio %lld, but the "
                               "candidate pool of layer %lld it is masked with covers ratio-%lld "
                               "entries", (long long)i, (long long)p->layer[i].ratio,
                               (long long)cand, (long long)p->layer[cand].ratio);
    return DSATTN_OK;
}
