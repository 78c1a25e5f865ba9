/* names.c - the HF <-> inference name tables and the attention
 * tensors each config implies.  See names.h.
 *
 * The forward map reproduces convert.py literally, including its use of
 * Python's str.replace (every occurrence of the key is replaced), because a
 * loader that maps names differently from the official converter would load
 * a different model.  The key is the second-to-last dotted component, or the
 * last one for V4's parameters without a ".weight" suffix (hc*, attn_sink,
 * ape, and the hash-routing table, which the checkpoint and the official
 * converter spell "tie2eid" while the model's parameter is tid2eid: the
 * test below matches the checkpoint's spelling).  V3's converter raises on an unknown key; we pass unknown
 * names through unchanged, because only attention tensors are ever looked up
 * and the rest are listed as "not attention".
 */
#include "names.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct { const char *hf, *inf; } name_pair;

/* The renames of DeepSeek-V3 inference/convert.py `mapping`.  The V3.2-Exp,
 * V4 (Flash/Pro) and V4.1 converters use the same renames; the keys they add
 * (gate, norm, scale, the indexer's wq_b / wk / k_norm / weights_proj, V4's
 * embed / wo_a / wo_b / head / attn_sink) map to themselves, which
 * str.replace leaves unchanged, so one table serves every generation. */
static const name_pair dsattn_hf_renames[] = {
    { "embed_tokens", "embed" },       { "input_layernorm", "attn_norm" },
    { "post_attention_layernorm", "ffn_norm" },
    { "q_proj", "wq" },                { "q_a_proj", "wq_a" },
    { "q_a_layernorm", "q_norm" },     { "q_b_proj", "wq_b" },
    { "kv_a_proj_with_mqa", "wkv_a" }, { "kv_a_layernorm", "kv_norm" },
    { "kv_b_proj", "wkv_b" },          { "o_proj", "wo" },
    { "gate_proj", "w1" },             { "down_proj", "w2" },
    { "up_proj", "w3" },               { "lm_head", "head" },
    { NULL, NULL },
};

/* DeepSeek-LLM (llama) ships no converter; its separate key and value
 * projections take the inference names the other generations' rules
 * would give them had the table listed them (q_proj and o_proj, the norms
 * and the MLP already map above): layers.{i}.attn.{wq, wk, wv, wo}. */
static const name_pair dsattn_llama_renames[] = {
    { "k_proj", "wk" }, { "v_proj", "wv" }, { NULL, NULL },
};

/* Python's s.replace(old, new) into out; -1 if it does not fit. */
static int replace_all(const char *s, const char *old, const char *rep, char *out,
                       size_t outlen)
{
    size_t ol = strlen(old), rl = strlen(rep), k = 0;
    if (ol == 0) return -1;
    while (*s) {
        if (strncmp(s, old, ol) == 0) {
            if (k + rl >= outlen) return -1;
            memcpy(out + k, rep, rl);
            k += rl;
            s += ol;
        } else {
            if (k + 1 >= outlen) return -1;
            out[k++] = *s++;
        }
    }
    out[k] = '\0';
    return 0;
}

int dsattn_name_to_inference(dsattn_arch a, const char *in, char *out, size_t outlen)
{
    char b1[2 * DSATTN_NAME_MAX], b2[2 * DSATTN_NAME_MAX];
    if (strlen(in) >= DSATTN_NAME_MAX) return -1;
    const char *s = in;
    if (strncmp(s, "model.", 6) == 0) s += 6;
    if (replace_all(s, "self_attn", "attn", b1, sizeof b1) ||
        replace_all(b1, "mlp", "ffn", b2, sizeof b2) ||
        replace_all(b2, "weight_scale_inv", "scale", b1, sizeof b1) ||
        replace_all(b1, "e_score_correction_bias", "bias", b2, sizeof b2))
        return -1;
    /* key: second-to-last component, or the last for V4's bare parameters */
    char key[2 * DSATTN_NAME_MAX] = "";
    const char *last = strrchr(b2, '.');
    int v4 = a == DSATTN_ARCH_V4 || a == DSATTN_ARCH_V41;
    if (v4 && (strstr(b2, "hc") || strstr(b2, "attn_sink") || strstr(b2, "tie2eid") ||
               strstr(b2, "ape"))) {
        snprintf(key, sizeof key, "%s", last ? last + 1 : b2);
    } else if (last) {
        const char *p = last;
        while (p > b2 && p[-1] != '.') p--;
        size_t kl = (size_t)(last - p);
        if (kl < sizeof key) {
            memcpy(key, p, kl);
            key[kl] = '\0';
        }
    }
    const char *rep = NULL;
    for (const name_pair *m = dsattn_hf_renames; key[0] && m->hf; m++)
        if (strcmp(m->hf, key) == 0) rep = m->inf;
    for (const name_pair *m = dsattn_llama_renames; a == DSATTN_ARCH_LLAMA && key[0] && m->hf; m++)
        if (strcmp(m->hf, key) == 0) rep = m->inf;
    if (rep && strcmp(rep, key) != 0) {
        if (replace_all(b2, key, rep, b1, sizeof b1)) return -1;
    } else {
        snprintf(b1, sizeof b1, "%s", b2);
    }
    if (strlen(b1) >= outlen) return -1;
    memcpy(out, b1, strlen(b1) + 1);
    return strcmp(out, in) != 0;
}

/* Reverse map, V3, V3.2 and llama only (the V4 releases store inference
 * names). */
static const name_pair dsattn_v3_attn_rev[] = {
    { "q_a_proj", "wq_a" },            { "q_a_layernorm", "q_norm" },
    { "q_b_proj", "wq_b" },            { "q_proj", "wq" },
    { "kv_a_proj_with_mqa", "wkv_a" }, { "kv_a_layernorm", "kv_norm" },
    { "kv_b_proj", "wkv_b" },          { "o_proj", "wo" },
    { NULL, NULL },
};
static const name_pair dsattn_llama_attn_rev[] = {
    { "q_proj", "wq" }, { "k_proj", "wk" }, { "v_proj", "wv" }, { "o_proj", "wo" },
    { NULL, NULL },
};

int dsattn_name_to_hf(dsattn_arch a, const char *in, char *out, size_t outlen)
{
    if (a != DSATTN_ARCH_V3 && a != DSATTN_ARCH_V32 && a != DSATTN_ARCH_LLAMA) {
        if (strlen(in) >= outlen) return -1;
        memcpy(out, in, strlen(in) + 1);
        return 0;
    }
    /* Split "layers.{i}.<rest>" */
    char rest[DSATTN_NAME_MAX], buf[2 * DSATTN_NAME_MAX];
    int64_t layer;
    int used = 0;
    if (sscanf(in, "layers.%lld.%n", (long long *)&layer, &used) != 1 || used == 0 ||
        strlen(in + used) >= sizeof rest) {
        int k = snprintf(out, outlen, "model.%s", in);
        return k < 0 || (size_t)k >= outlen ? -1 : 1;
    }
    snprintf(rest, sizeof rest, "%s", in + used);
    if (strcmp(rest, "attn_norm.weight") == 0) {
        snprintf(buf, sizeof buf, "model.layers.%lld.input_layernorm.weight",
                 (long long)layer);
    } else if (strcmp(rest, "ffn_norm.weight") == 0) {
        snprintf(buf, sizeof buf, "model.layers.%lld.post_attention_layernorm.weight",
                 (long long)layer);
    } else if (strncmp(rest, "attn.", 5) == 0) {
        /* attn.<key>.<leaf> or attn.indexer.<key>.<leaf> */
        const char *r = rest + 5;
        const char *dot = strrchr(r, '.');
        if (!dot) return -1;
        char mid[DSATTN_NAME_MAX], leaf[64];
        size_t ml = (size_t)(dot - r);
        memcpy(mid, r, ml);
        mid[ml] = '\0';
        snprintf(leaf, sizeof leaf, "%s", dot + 1);
        if (strcmp(leaf, "scale") == 0) snprintf(leaf, sizeof leaf, "weight_scale_inv");
        const char *hk = mid;
        if (strchr(mid, '.') == NULL)
            for (const name_pair *m = a == DSATTN_ARCH_LLAMA ? dsattn_llama_attn_rev
                                                              : dsattn_v3_attn_rev;
                 m->hf; m++)
                if (strcmp(m->inf, mid) == 0) hk = m->hf;
        snprintf(buf, sizeof buf, "model.layers.%lld.self_attn.%s.%s", (long long)layer,
                 hk, leaf);
    } else {
        snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)layer, rest);
    }
    if (strlen(buf) >= outlen) return -1;
    memcpy(out, buf, strlen(buf) + 1);
    return 1;
}

int64_t dsattn_name_layer(const char *name, int64_t n_layers)
{
    long long i;
    int used = 0;
    if (sscanf(name, "layers.%lld.%n", &i, &used) == 1 && used > 0 && i >= 0) return i;
    if (sscanf(name, "mtp.%lld.%n", &i, &used) == 1 && used > 0 && i >= 0)
        return n_layers >= 0 ? n_layers + i : i;
    return -1;
}

/* ==== Expected tensors ================================================== */

typedef struct {
    dsattn_tensor_spec *v;
    size_t n, cap;
    int oom;
} spec_list;

static void add(spec_list *l, int64_t layer, const char *suffix, dsattn_ts_kind kind,
                int ndim, int64_t d0, int64_t d1, const char *op)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        dsattn_tensor_spec *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) {
            l->oom = 1;
            return;
        }
        l->v = nv;
        l->cap = nc;
    }
    dsattn_tensor_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "layers.%lld.%s", (long long)layer, suffix);
    s->kind = kind;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->layer = layer;
    s->op = op;
}

#define LIN(sfx, r, c, op) add(&l, i, sfx, DSATTN_TS_LINEAR, 2, r, c, op)
#define VEC(sfx, n, op)    add(&l, i, sfx, DSATTN_TS_VECTOR, 1, n, 0, op)

dsattn_status dsattn_expected_tensors(const dsattn_model_config *c,
                                      dsattn_tensor_spec **out, size_t *n,
                                      char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    spec_list l = { 0 };
    const int64_t D = c->dim, H = c->n_heads;
    dsattn_v41_plan *plan = NULL;
    if (c->arch == DSATTN_ARCH_V41) {
        plan = malloc(sizeof *plan);
        if (!plan) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        dsattn_status st = dsattn_v41_plan_from_config(c, plan, err, errlen);
        if (st != DSATTN_OK) {
            free(plan);
            return st;
        }
    }
    for (int64_t i = 0; i < c->n_layers; i++) {
        VEC("attn_norm.weight", D, "pre-attention RMSNorm");
        if (c->arch == DSATTN_ARCH_LLAMA) {
            const int64_t hd = c->head_dim;
            LIN("attn.wq", H * hd, D, "query projection");
            LIN("attn.wk", c->n_kv_heads * hd, D, "key projection");
            LIN("attn.wv", c->n_kv_heads * hd, D, "value projection");
            LIN("attn.wo", D, H * hd, "output projection");
            continue;
        }
        if (c->arch == DSATTN_ARCH_V3 || c->arch == DSATTN_ARCH_V32) {
            const int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
            if (c->q_lora_rank > 0) {
                LIN("attn.wq_a", c->q_lora_rank, D, "query down-projection");
                VEC("attn.q_norm.weight", c->q_lora_rank, "query RMSNorm");
                LIN("attn.wq_b", H * qk, c->q_lora_rank, "query up-projection");
            } else {
                LIN("attn.wq", H * qk, D, "query projection");
            }
            LIN("attn.wkv_a", c->kv_lora_rank + c->qk_rope_head_dim, D,
                "KV down-projection + rope key");
            VEC("attn.kv_norm.weight", c->kv_lora_rank, "latent KV RMSNorm");
            LIN("attn.wkv_b", H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank,
                "KV up-projection (k_nope | v)");
            LIN("attn.wo", D, H * c->v_head_dim, "output projection");
            if (c->arch == DSATTN_ARCH_V32) {
                const int64_t qin = c->q_lora_rank > 0 ? c->q_lora_rank : D;
                LIN("attn.indexer.wq_b", c->index_n_heads * c->index_head_dim, qin,
                    "indexer query projection");
                LIN("attn.indexer.wk", c->index_head_dim, D, "indexer key projection");
                VEC("attn.indexer.k_norm.weight", c->index_head_dim, "indexer key LayerNorm");
                VEC("attn.indexer.k_norm.bias", c->index_head_dim, "indexer key LayerNorm bias");
                LIN("attn.indexer.weights_proj", c->index_n_heads, D, "indexer head weights");
            }
            continue;
        }
        /* V4 / V4.1: the part every layer has */
        const int64_t hd = c->head_dim, og = c->o_groups;
        LIN("attn.wq_a", c->q_lora_rank, D, "query down-projection");
        VEC("attn.q_norm.weight", c->q_lora_rank, "query RMSNorm");
        LIN("attn.wq_b", H * hd, c->q_lora_rank, "query up-projection");
        LIN("attn.wkv", hd, D, "window KV projection");
        VEC("attn.kv_norm.weight", hd, "window KV RMSNorm");
        VEC("attn.attn_sink", H, "attention sink logits");
        LIN("attn.wo_a", og * c->o_lora_rank, H * hd / og, "grouped output projection A");
        LIN("attn.wo_b", D, og * c->o_lora_rank, "output projection B");
        const int64_t m = c->compress_ratios[i];
        if (c->arch == DSATTN_ARCH_V4) {
            if (m == 0) continue;
            const int64_t coff = 1 + (m == 4);
            LIN("attn.compressor.wkv", coff * hd, D, "compressor KV projection");
            LIN("attn.compressor.wgate", coff * hd, D, "compressor gate");
            add(&l, i, "attn.compressor.ape", DSATTN_TS_VECTOR, 2, m, coff * hd,
                "compressor position bias");
            VEC("attn.compressor.norm.weight", hd, "compressor RMSNorm");
            if (m == 4) {
                const int64_t ihd = c->index_head_dim;
                LIN("attn.indexer.wq_b", c->index_n_heads * ihd, c->q_lora_rank,
                    "indexer query projection");
                LIN("attn.indexer.weights_proj", c->index_n_heads, D, "indexer head weights");
                LIN("attn.indexer.compressor.wkv", coff * ihd, D,
                    "indexer compressor KV projection");
                LIN("attn.indexer.compressor.wgate", coff * ihd, D, "indexer compressor gate");
                add(&l, i, "attn.indexer.compressor.ape", DSATTN_TS_VECTOR, 2, m, coff * ihd,
                    "indexer compressor position bias");
                VEC("attn.indexer.compressor.norm.weight", ihd, "indexer compressor RMSNorm");
            }
            continue;
        }
        /* V4.1: by layer mode */
        const dsattn_v41_layer_plan *lp = &plan->layer[i];
        if (lp->mode == DSATTN_V41_FULL) {
            LIN("attn.compressor.wkv", hd, D, "compressor KV projection");
            if (m > 1) LIN("attn.compressor.wgate", hd, D, "compressor gate");
            VEC("attn.compressor.norm.weight", hd, "compressor RMSNorm");
        }
        if (lp->mode == DSATTN_V41_FULL || lp->mode == DSATTN_V41_REINDEX) {
            LIN("attn.indexer.wq_b", c->index_n_heads * c->index_head_dim, c->q_lora_rank,
                "indexer query projection");
            LIN("attn.indexer.weights_proj", c->index_n_heads, D, "indexer head weights");
        }
        if (lp->mode == DSATTN_V41_FULL) {
            LIN("attn.indexer.wk", c->index_head_dim, hd, "index key projection (from latent)");
            VEC("attn.indexer.k_norm.weight", c->index_head_dim, "index key RMSNorm");
        }
    }
    free(plan);
    if (l.oom) {
        free(l.v);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    *out = l.v;
    *n = l.n;
    return DSATTN_OK;
}

void dsattn_name_describe(const dsattn_model_config *c, const dsattn_tensor_spec *given,
                          size_t n_given, const char *name, char *desc, size_t desclen)
{
    int64_t nl = c ? c->n_layers : -1;
    int64_t layer = dsattn_name_layer(name, nl);
    int is_attn = strstr(name, ".attn.") != NULL || strstr(name, ".attn_norm.") != NULL;
    if (layer < 0 || !is_attn) {
        snprintf(desc, desclen, "not attention (ignored)");
        return;
    }
    if (c && layer >= c->n_layers) {
        snprintf(desc, desclen, "MTP/DSpark layer %lld (listed, not run)",
                 (long long)(layer - c->n_layers));
        return;
    }
    /* Strip "layers.{i}." and the leaf to find the operator in the specs. */
    const char *rest = strchr(name + 7, '.');
    rest = rest ? rest + 1 : name;
    char base[DSATTN_NAME_MAX];
    snprintf(base, sizeof base, "%s", rest);
    const char *what = NULL;
    int is_scale = 0;
    size_t bl = strlen(base);
    if (bl > 6 && strcmp(base + bl - 6, ".scale") == 0) {
        base[bl - 6] = '\0';
        is_scale = 1;
    } else if (bl > 7 && strcmp(base + bl - 7, ".weight") == 0 &&
               !strstr(base, "norm")) {
        base[bl - 7] = '\0';
    }
    if (c) {
        dsattn_tensor_spec *sp = NULL;
        size_t n = 0;
        const dsattn_tensor_spec *use = given;
        if (!use && dsattn_expected_tensors(c, &sp, &n, NULL, 0) == DSATTN_OK) use = sp;
        else n = n_given;
        if (use) {
            char full[DSATTN_NAME_MAX + 48];
            snprintf(full, sizeof full, "layers.%lld.%s", (long long)layer, base);
            for (size_t k = 0; k < n && !what; k++)
                if (strcmp(use[k].name, full) == 0) what = use[k].op;
        }
        free(sp);
    }
    const char *mode = "";
    if (c && c->arch == DSATTN_ARCH_V41) {
        dsattn_v41_plan *p = malloc(sizeof *p);
        if (p && dsattn_v41_plan_from_config(c, p, NULL, 0) == DSATTN_OK)
            mode = dsattn_v41_mode_name(p->layer[layer].mode);
        free(p);
    } else if (c && c->arch == DSATTN_ARCH_V4) {
        int64_t m = c->compress_ratios[layer];
        mode = m == 0 ? "SWA" : m == 4 ? "CSA" : "HCA";
    }
    if (what)
        snprintf(desc, desclen, "layer %lld%s%s%s: %s%s", (long long)layer,
                 mode[0] ? " (" : "", mode, mode[0] ? ")" : "", what,
                 is_scale ? " [FP8 scales]" : "");
    else
        snprintf(desc, desclen, "layer %lld: not used by this layer's attention",
                 (long long)layer);
}
