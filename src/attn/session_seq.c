/* session_seq.c - save, load and clone of every generation's sequence
 * through the one session format (src/io/session.c).
 *
 * Owns, per generation, only what is specific to it: the canonical hashes
 * of its model config and weight shapes, the sequence options carried in
 * the header's variant fields, and the list of sections its sequence is
 * made of at its position (docs/sessions.md lists them).  One driver does
 * the rest for all four: save = describe + write; load = validate the
 * whole file, check the model hashes, options and small state, create a
 * fresh sequence, check the section list against it, restore; clone =
 * create + copy the same sections.  A failed load never returns a
 * sequence.  Per-chunk observations (last selections, which layer read
 * what) and scratch are not state: they are not saved.
 */
#include "session.h"

#include "internal.h"
#include "mha.h"
#include "mla.h"
#include "v4.h"
#include "v41.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    uint32_t gen;
    uint64_t (*config_hash)(const void *m);
    uint64_t (*shapes_hash)(const void *m);
    const void *(*model_of)(const void *seq);
    /* generation, variant, position, capacity of a sequence */
    void (*head)(const void *seq, dsattn_sess_header *h);
    /* the sections of the sequence at its position */
    void (*sections)(void *seq, dsattn_sess_list *l);
    /* options and small state of a file, before anything is created */
    dsattn_status (*check)(const void *m, const dsattn_sess_file *f, char *err, size_t errlen);
    dsattn_status (*create)(void **out, const void *m, size_t cap, const uint32_t variant[2]);
    void (*set_pos)(void *seq, int64_t pos);
    void (*destroy)(void *seq);
} gen_ops;

/* ==== The driver ======================================================= */

static dsattn_status drv_save(const gen_ops *o, const void *seq, const char *path, char *err,
                              size_t errlen)
{
    if (!seq || !path) return DSATTN_ERR_INVALID_ARG;
    dsattn_sess_header h;
    memset(&h, 0, sizeof h);
    const void *m = o->model_of(seq);
    o->head(seq, &h);
    h.generation = o->gen;
    h.config_hash = o->config_hash(m);
    h.shapes_hash = o->shapes_hash(m);
    dsattn_sess_list l = { 0 };
    o->sections((void *)seq, &l);
    dsattn_status st = dsattn_sess_save(path, &h, &l, err, errlen);
    dsattn_sess_list_free(&l);
    return st;
}

static dsattn_status drv_load_buffer(const gen_ops *o, void **out, const void *m,
                                     const void *buf, size_t len, size_t cap, const char *name,
                                     char *err, size_t errlen)
{
    if (out) *out = NULL;
    if (!out || !m || (!buf && len)) return DSATTN_ERR_INVALID_ARG;
    /* a caller's buffer of 0 bytes is a count of 0 (include/dsattn.h); an
     * empty file (name set) is a malformed session */
    if (!name && len == 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "<buffer>: 0 bytes, no session to load");
    dsattn_sess_file f;
    dsattn_status st = dsattn_sess_parse(&f, buf, len, name, err, errlen);
    if (st) return st;
    void *seq = NULL;
    dsattn_sess_list l = { 0 };
    st = dsattn_sess_check_model(&f, o->gen, o->config_hash(m), o->shapes_hash(m), err, errlen);
    if (!st && cap == 0) {
        if (f.h.capacity > SIZE_MAX)
            st = dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW, "%s: capacity %llu too large",
                             f.name, (unsigned long long)f.h.capacity);
        cap = (size_t)f.h.capacity;
    }
    if (!st && (cap == 0 || (uint64_t)f.h.pos > cap))
        st = dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                         "%s: position %lld does not fit a capacity of %zu tokens", f.name,
                         (long long)f.h.pos, cap);
    if (!st) st = o->check(m, &f, err, errlen);
    if (!st) {
        st = o->create(&seq, m, cap, f.h.variant);
        if (st)
            dsattn_errf(err, errlen, st, "%s: cannot create a sequence of %zu tokens: %s", f.name,
                        cap, dsattn_status_str(st));
    }
    if (!st) {
        o->set_pos(seq, f.h.pos);
        o->sections(seq, &l);
        st = dsattn_sess_restore(&f, &l, err, errlen);
    }
    dsattn_sess_list_free(&l);
    dsattn_sess_file_free(&f);
    if (st) {
        if (seq) o->destroy(seq);
        return st;
    }
    *out = seq;
    return DSATTN_OK;
}

static dsattn_status drv_load(const gen_ops *o, void **out, const void *m, const char *path,
                              size_t cap, char *err, size_t errlen)
{
    if (!out || !m || !path) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_sess_map map;
    dsattn_status st = dsattn_sess_map_file(&map, path, err, errlen);
    if (st) return st;
    st = drv_load_buffer(o, out, m, map.base, map.len, cap, path, err, errlen);
    dsattn_sess_unmap(&map);
    return st;
}

static dsattn_status drv_clone(const gen_ops *o, void **out, const void *seq)
{
    if (!out || !seq) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_sess_header h;
    memset(&h, 0, sizeof h);
    o->head(seq, &h);
    void *c = NULL;
    dsattn_status st = o->create(&c, o->model_of(seq), (size_t)h.capacity, h.variant);
    if (st) return st;
    o->set_pos(c, h.pos);
    dsattn_sess_list a = { 0 }, b = { 0 };
    o->sections((void *)seq, &a);
    o->sections(c, &b);
    st = dsattn_sess_copy(&b, &a);
    dsattn_sess_list_free(&a);
    dsattn_sess_list_free(&b);
    if (st) { o->destroy(c); return st; }
    *out = c;
    return DSATTN_OK;
}

/* A generation's glue, alike for all four: model_of, head (variant fields
 * from g##_variant, position, capacity), set_pos, destroy, its ops and the
 * four public entry points (declared in include/dsattn.h), each a call of
 * the driver.  The generation writes g##_config_hash, g##_shapes_hash,
 * g##_variant, g##_sections, g##_check and g##_create. */
#define SESSION_API(g, GEN)                                                            \
    static const void *g##_model_of(const void *s) { return ((const dsattn_##g##_seq *)s)->m; } \
    static void g##_head(const void *sv, dsattn_sess_header *h)                        \
    {                                                                                  \
        const dsattn_##g##_seq *s = sv;                                                \
        g##_variant(s, h->variant);                                                    \
        h->pos = s->pos;                                                               \
        h->capacity = s->max_seq_len;                                                  \
    }                                                                                  \
    static void g##_set_pos(void *s, int64_t pos) { ((dsattn_##g##_seq *)s)->pos = pos; } \
    static void g##_destroy(void *s) { dsattn_##g##_seq_destroy(s); }                  \
    static const gen_ops g##_ops = { GEN, g##_config_hash, g##_shapes_hash, g##_model_of, \
                                     g##_head, g##_sections, g##_check, g##_create,    \
                                     g##_set_pos, g##_destroy };                       \
    dsattn_status dsattn_##g##_seq_save(const dsattn_##g##_seq *s, const char *path,   \
                                        char *err, size_t errlen)                      \
    {                                                                                  \
        return drv_save(&g##_ops, s, path, err, errlen);                               \
    }                                                                                  \
    dsattn_status dsattn_##g##_seq_load(dsattn_##g##_seq **out, const dsattn_##g *m,   \
                                        const char *path, size_t max_seq_len,          \
                                        char *err, size_t errlen)                      \
    {                                                                                  \
        return drv_load(&g##_ops, (void **)out, m, path, max_seq_len, err, errlen);    \
    }                                                                                  \
    dsattn_status dsattn_##g##_seq_load_buffer(dsattn_##g##_seq **out,                 \
                                               const dsattn_##g *m, const void *buf,   \
                                               size_t len, size_t max_seq_len,         \
                                               char *err, size_t errlen)               \
    {                                                                                  \
        return drv_load_buffer(&g##_ops, (void **)out, m, buf, len, max_seq_len, NULL, \
                               err, errlen);                                           \
    }                                                                                  \
    dsattn_status dsattn_##g##_seq_clone(dsattn_##g##_seq **out,                       \
                                         const dsattn_##g##_seq *s)                    \
    {                                                                                  \
        return drv_clone(&g##_ops, (void **)out, s);                                   \
    }

/* The header's small-state section: `n` little-endian int64 values. */
static dsattn_status get_state(const dsattn_sess_file *f, const char *name, size_t n,
                               int64_t *v, char *err, size_t errlen)
{
    long i = dsattn_sess_find(f, name);
    if (i < 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: no section '%s'", f->name, name);
    if (f->sz[i] != 8 * n)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: section '%s': %zu bytes, want %zu",
                           f->name, name, f->sz[i], 8 * n);
    for (size_t k = 0; k < n; k++) v[k] = dsattn_sess_get_i64(f->buf + f->off[i] + 8 * k);
    return DSATTN_OK;
}

#define BADF(...) dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__)

/* The header's option fields of a generation with one: variant[0] at most
 * max0, variant[1] zero. */
static dsattn_status check_variant(const dsattn_sess_file *f, uint32_t max0, const char *what,
                                   char *err, size_t errlen)
{
    if (f->h.variant[0] > max0 || f->h.variant[1] != 0)
        return BADF("%s: header: unknown %s %u/%u", f->name, what, (unsigned)f->h.variant[0],
                    (unsigned)f->h.variant[1]);
    return DSATTN_OK;
}

/* A layer's weights and vectors by name, for the shapes hash. */
typedef struct { const char *n; const dsattn_weight *w; } named_w;
typedef struct { const char *n; const float *v; } named_v;

/* Adds "layers.<l>.<name>" of each weight and vector to the shapes hash. */
static void canon_layer(dsattn_sess_canon *h, long long l, const named_w *ws, size_t nw,
                        const named_v *vs, size_t nv)
{
    char k[96];
    for (size_t i = 0; i < nw; i++) {
        snprintf(k, sizeof k, "layers.%lld.%s", l, ws[i].n);
        dsattn_sess_canon_w(h, k, ws[i].w);
    }
    for (size_t i = 0; i < nv; i++) {
        snprintf(k, sizeof k, "layers.%lld.%s", l, vs[i].n);
        dsattn_sess_canon_v(h, k, vs[i].v, 0);
    }
}

/* The config hash of both CSA generations (csa.h): the same keys in the
 * same order, V4.1's layer plan and candidate pool where it has them. */
static uint64_t csa_config_hash(const dsattn_csa_config *c, int64_t arch)
{
    const int v41 = arch == DSATTN_SESSION_V41;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    char k[64];
    dsattn_sess_canon_i(h, "arch", arch);
    dsattn_sess_canon_i(h, "dim", c->dim);
    dsattn_sess_canon_i(h, "n_layers", c->n_layers);
    dsattn_sess_canon_i(h, "n_total_layers", c->n_total_layers);
    dsattn_sess_canon_i(h, "n_heads", c->n_heads);
    dsattn_sess_canon_i(h, "head_dim", c->head_dim);
    dsattn_sess_canon_i(h, "rope_head_dim", c->rope_head_dim);
    dsattn_sess_canon_i(h, "q_lora_rank", c->q_lora_rank);
    dsattn_sess_canon_i(h, "o_groups", c->o_groups);
    dsattn_sess_canon_i(h, "o_lora_rank", c->o_lora_rank);
    dsattn_sess_canon_i(h, "window_size", c->window_size);
    for (int64_t l = 0; l < c->n_total_layers; l++) {
        snprintf(k, sizeof k, "layer.%lld.ratio", (long long)l);
        dsattn_sess_canon_i(h, k, c->compress_ratios[l]);
        if (!v41) continue;
        snprintf(k, sizeof k, "layer.%lld.kv_source", (long long)l);
        dsattn_sess_canon_i(h, k, c->is_kv_source[l]);
        snprintf(k, sizeof k, "layer.%lld.index_source", (long long)l);
        dsattn_sess_canon_i(h, k, c->is_index_source[l]);
    }
    if (v41) {
        dsattn_sess_canon_i(h, "candidate_source_layer", c->candidate_source_layer);
        dsattn_sess_canon_i(h, "candidate_topk_blocks", c->candidate_topk_blocks);
        dsattn_sess_canon_i(h, "candidate_block_size", c->candidate_block_size);
    }
    dsattn_sess_canon_i(h, "index_n_heads", c->index_n_heads);
    dsattn_sess_canon_i(h, "index_head_dim", c->index_head_dim);
    dsattn_sess_canon_i(h, "index_topk", c->index_topk);
    dsattn_sess_canon_f(h, "rope_theta", c->rope_theta);
    dsattn_sess_canon_f(h, "compress_rope_theta", c->compress_rope_theta);
    dsattn_sess_canon_f(h, "rope_factor", c->rope_factor);
    dsattn_sess_canon_f(h, "original_seq_len", c->original_seq_len);
    dsattn_sess_canon_f(h, "beta_fast", c->beta_fast);
    dsattn_sess_canon_f(h, "beta_slow", c->beta_slow);
    dsattn_sess_canon_f(h, "norm_eps", (double)c->norm_eps);
    dsattn_sess_canon_i(h, "fp8", c->fp8);
    dsattn_sess_canon_i(h, "fp8_block", c->fp8_block);
    return dsattn_sess_canon_done(h);
}

/* ==== V4.1 (CSA2) ====================================================== */

static uint64_t v41_config_hash(const void *mv)
{
    return csa_config_hash(&((const dsattn_v41 *)mv)->cfg, DSATTN_SESSION_V41);
}

static uint64_t v41_shapes_hash(const void *mv)
{
    const dsattn_v41 *m = mv;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_v41_layer_w *L = &m->layer[l];
        const named_w ws[] = {
            { "wq_a", &L->wq_a }, { "wq_b", &L->wq_b }, { "wkv", &L->wkv },
            { "wo_a", &L->wo_a }, { "wo_b", &L->wo_b }, { "compressor.wkv", &L->c_wkv },
            { "compressor.wgate", &L->c_wgate }, { "indexer.wq_b", &L->i_wq_b },
            { "indexer.weights_proj", &L->i_wproj }, { "indexer.wk", &L->i_wk },
        };
        const named_v vs[] = {
            { "attn_norm", L->attn_norm }, { "q_norm", L->q_norm }, { "kv_norm", L->kv_norm },
            { "attn_sink", L->sink }, { "compressor.norm", L->c_norm },
            { "indexer.k_norm", L->i_knorm },
        };
        canon_layer(h, (long long)l, ws, DSATTN_ARRAY_LEN(ws), vs, DSATTN_ARRAY_LEN(vs));
    }
    return dsattn_sess_canon_done(h);
}

static void v41_variant(const dsattn_v41_seq *s, uint32_t v[2])
{
    v[0] = (uint32_t)s->index_k_mode;
}

/* The runtime slots that carry across steps: which layer's compressed KV
 * and index keys are current (REFERENCE index_k mode reads the latter
 * before an owner publishes on decode steps of an incomplete group).  The
 * top-k and candidate rows are always written by an earlier layer of the
 * same step before anything reads them (config validation: every
 * compressed layer has a preceding index source), so they are not state. */
static void v41_rt_gather(const dsattn_sess_sec *sec, uint8_t *out)
{
    const dsattn_v41_seq *s = sec->obj;
    dsattn_sess_put_i64(out, s->rt.compress_kv);
    dsattn_sess_put_i64(out + 8, s->rt.index_k);
}

static void v41_rt_scatter(const dsattn_sess_sec *sec, const uint8_t *in)
{
    dsattn_v41_seq *s = sec->obj;
    s->rt.compress_kv = (int)dsattn_sess_get_i64(in);
    s->rt.index_k = (int)dsattn_sess_get_i64(in + 8);
}

static void v41_sections(void *sv, dsattn_sess_list *l)
{
    dsattn_v41_seq *s = sv;
    const dsattn_v41 *m = s->m;
    const dsattn_v41_config *c = &m->cfg;
    const size_t D = (size_t)c->head_dim, w = (size_t)c->window_size;
    dsattn_sess_sec *rt = dsattn_sess_add(l, NULL, 16, "runtime");
    if (rt) {
        rt->gather = v41_rt_gather;
        rt->scatter = v41_rt_scatter;
        rt->obj = s;
    }
    for (int64_t i = 0; i < c->n_layers; i++) {
        const dsattn_v41_layer_w *L = &m->layer[i];
        dsattn_v41_layer_s *S = &s->layer[i];
        const long long li = (long long)i;
        dsattn_sess_add(l, S->ring, w * dsattn_v41_swa_bytes(c), "layer.%lld.window", li);
        if (!S->ckv) continue;
        const size_t n = (size_t)s->pos / (size_t)L->ratio;
        dsattn_sess_add(l, S->ckv, n * dsattn_v41_ckv_bytes(c), "layer.%lld.kv", li);
        if (S->kidx)
            dsattn_sess_add(l, S->kidx, n * dsattn_v41_kidx_bytes(c), "layer.%lld.index_k", li);
        if (S->kv_state) {
            const size_t b = (size_t)L->ratio * D * sizeof(float);
            dsattn_sess_add(l, S->kv_state, b, "layer.%lld.compressor.kv", li);
            dsattn_sess_add(l, S->score_state, b, "layer.%lld.compressor.score", li);
        }
    }
}

static dsattn_status v41_check(const void *mv, const dsattn_sess_file *f, char *err,
                               size_t errlen)
{
    const dsattn_v41 *m = mv;
    dsattn_status st = check_variant(f, DSATTN_V41_INDEX_K_REFERENCE, "V4.1 options", err, errlen);
    if (st) return st;
    int64_t v[2] = { -1, -1 };
    st = get_state(f, "runtime", 2, v, err, errlen);
    if (st) return st;
    const int64_t nl = m->cfg.n_layers;
    if (v[0] != -1 && (v[0] < 0 || v[0] >= nl || !m->layer[v[0]].is_kv_source))
        return BADF("%s: section 'runtime': compress_kv slot names layer %lld, not a KV source",
                    f->name, (long long)v[0]);
    if (v[1] != -1 && (v[1] < 0 || v[1] >= nl || !m->layer[v[1]].owns_k))
        return BADF("%s: section 'runtime': index_k slot names layer %lld, not an index-key "
                    "owner", f->name, (long long)v[1]);
    return DSATTN_OK;
}

static dsattn_status v41_create(void **out, const void *m, size_t cap, const uint32_t var[2])
{
    return dsattn_v41_seq_create((dsattn_v41_seq **)out, m, cap, (dsattn_v41_index_k)var[0]);
}

SESSION_API(v41, DSATTN_SESSION_V41)

/* ==== V4 (CSA + HCA) =================================================== */

static uint64_t v4_config_hash(const void *mv)
{
    return csa_config_hash(&((const dsattn_v4 *)mv)->cfg, DSATTN_SESSION_V4);
}

static void v4_canon_comp(dsattn_sess_canon *h, const char *pre, const dsattn_v4_compressor_w *C)
{
    char k[128];
    snprintf(k, sizeof k, "%s.shape", pre);
    dsattn_sess_canon_i(h, k, (int64_t)(C->d * 100000 + C->ratio * 10 + (size_t)C->overlap));
    snprintf(k, sizeof k, "%s.rotate", pre);
    dsattn_sess_canon_i(h, k, C->rotate);
    snprintf(k, sizeof k, "%s.wkv", pre);
    dsattn_sess_canon_w(h, k, &C->wkv);
    snprintf(k, sizeof k, "%s.wgate", pre);
    dsattn_sess_canon_w(h, k, &C->wgate);
    snprintf(k, sizeof k, "%s.ape", pre);
    dsattn_sess_canon_v(h, k, C->ape, 0);
    snprintf(k, sizeof k, "%s.norm", pre);
    dsattn_sess_canon_v(h, k, C->norm, 0);
}

static uint64_t v4_shapes_hash(const void *mv)
{
    const dsattn_v4 *m = mv;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    char k[96];
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_v4_layer_w *L = &m->layer[l];
        const named_w ws[] = {
            { "wq_a", &L->wq_a }, { "wq_b", &L->wq_b }, { "wkv", &L->wkv }, { "wo_a", &L->wo_a },
            { "wo_b", &L->wo_b }, { "indexer.wq_b", &L->i_wq_b },
            { "indexer.weights_proj", &L->i_wproj },
        };
        const named_v vs[] = {
            { "attn_norm", L->attn_norm }, { "q_norm", L->q_norm }, { "kv_norm", L->kv_norm },
            { "attn_sink", L->sink },
        };
        canon_layer(h, (long long)l, ws, DSATTN_ARRAY_LEN(ws), vs, DSATTN_ARRAY_LEN(vs));
        snprintf(k, sizeof k, "layers.%lld.compressor", (long long)l);
        v4_canon_comp(h, k, &L->comp);
        snprintf(k, sizeof k, "layers.%lld.indexer.compressor", (long long)l);
        v4_canon_comp(h, k, &L->icomp);
    }
    return dsattn_sess_canon_done(h);
}

/* variant[1] of a sequence of layers [first, first + count) (MLA, V4): 0
 * for every layer of its model, else first | count << 16 (count >= 1);
 * check_layer_range and layer_range below read it */
static uint32_t layer_range_word(int first, int count, int whole)
{
    return whole ? 0 : (uint32_t)first | (uint32_t)count << 16;
}

/* variant[0] the empty mode, variant[1] the layers held */
static void v4_variant(const dsattn_v4_seq *s, uint32_t v[2])
{
    v[0] = (uint32_t)s->empty;
    v[1] = layer_range_word(s->first, s->count, dsattn_v4_seq_whole(s));
}

/* Bytes of one of a compressor's two pooling-state arrays (as seq_create
 * allocates them: [coff*m, coff*d] fp32). */
static size_t v4_comp_bytes(const dsattn_v4_compressor_w *C)
{
    const size_t coff = C->overlap ? 2 : 1;
    return coff * C->ratio * coff * C->d * sizeof(float);
}

static void v4_sections(void *sv, dsattn_sess_list *l)
{
    dsattn_v4_seq *s = sv;
    const dsattn_v4 *m = s->m;
    const dsattn_v4_config *c = &m->cfg;
    const size_t w = (size_t)c->window_size, kvb = dsattn_v4_kv_bytes(c);
    for (int64_t i = s->first; i < (int64_t)s->first + s->count; i++) {
        const dsattn_v4_layer_w *L = &m->layer[i];
        dsattn_v4_layer_s *S = &s->layer[i];
        const long long li = (long long)i;
        const size_t n = L->ratio > 0 ? (size_t)s->pos / (size_t)L->ratio : 0;
        /* one buffer: the window ring (w rows), then the compressed entries */
        dsattn_sess_add(l, S->kv, (w + n) * kvb, "layer.%lld.kv", li);
        if (S->ikv) dsattn_sess_add(l, S->ikv, n * dsattn_v4_idx_bytes(c), "layer.%lld.index_k", li);
        if (S->comp.kv) {
            dsattn_sess_add(l, S->comp.kv, v4_comp_bytes(&L->comp), "layer.%lld.compressor.kv", li);
            dsattn_sess_add(l, S->comp.z, v4_comp_bytes(&L->comp), "layer.%lld.compressor.score", li);
        }
        if (S->icomp.kv) {
            dsattn_sess_add(l, S->icomp.kv, v4_comp_bytes(&L->icomp),
                            "layer.%lld.indexer.compressor.kv", li);
            dsattn_sess_add(l, S->icomp.z, v4_comp_bytes(&L->icomp),
                            "layer.%lld.indexer.compressor.score", li);
        }
    }
}

/* variant[1] (layer_range_word): 0, or [first, first + count) inside the
 * model's n_layers */
static dsattn_status check_layer_range(const dsattn_sess_file *f, int64_t n_layers, char *err,
                                       size_t errlen)
{
    const uint32_t v1 = f->h.variant[1], first = v1 & 0xffff, count = v1 >> 16;
    if (v1 != 0 && (count == 0 || (int64_t)first + count > n_layers))
        return BADF("%s: header: layers [%u, %u) outside the model's %lld", f->name,
                    (unsigned)first, (unsigned)(first + count), (long long)n_layers);
    return DSATTN_OK;
}

/* the range variant[1] says, for the model of n_layers */
static void layer_range(const uint32_t var[2], int64_t n_layers, int *first, int *count)
{
    *first = var[1] ? (int)(var[1] & 0xffff) : 0;
    *count = var[1] ? (int)(var[1] >> 16) : (int)n_layers;
}

static dsattn_status v4_check(const void *mv, const dsattn_sess_file *f, char *err,
                              size_t errlen)
{
    const dsattn_v4 *m = mv;
    if (f->h.variant[0] > DSATTN_V4_EMPTY_ZERO)
        return BADF("%s: header: unknown V4 options %u", f->name, (unsigned)f->h.variant[0]);
    return check_layer_range(f, m->cfg.n_layers, err, errlen);
}

static dsattn_status v4_create(void **out, const void *mv, size_t cap, const uint32_t var[2])
{
    const dsattn_v4 *m = mv;
    int first, count;
    layer_range(var, m->cfg.n_layers, &first, &count);
    return dsattn_v4_seq_create_layers((dsattn_v4_seq **)out, m, cap, (dsattn_v4_empty)var[0],
                                       first, count);
}

SESSION_API(v4, DSATTN_SESSION_V4)

/* ==== MLA (V3) and MLA + DSA (V3.2) ==================================== */

static uint64_t mla_config_hash(const void *mv)
{
    const dsattn_mla_config *c = &((const dsattn_mla *)mv)->cfg;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    dsattn_sess_canon_i(h, "arch", DSATTN_SESSION_MLA);
    dsattn_sess_canon_i(h, "dsa", c->dsa);
    dsattn_sess_canon_i(h, "dim", c->dim);
    dsattn_sess_canon_i(h, "n_layers", c->n_layers);
    dsattn_sess_canon_i(h, "n_heads", c->n_heads);
    dsattn_sess_canon_i(h, "q_lora_rank", c->q_lora_rank);
    dsattn_sess_canon_i(h, "kv_lora_rank", c->kv_lora_rank);
    dsattn_sess_canon_i(h, "qk_nope_head_dim", c->nope);
    dsattn_sess_canon_i(h, "qk_rope_head_dim", c->rope);
    dsattn_sess_canon_i(h, "v_head_dim", c->v_dim);
    dsattn_sess_canon_i(h, "index_n_heads", c->index_n_heads);
    dsattn_sess_canon_i(h, "index_head_dim", c->index_head_dim);
    dsattn_sess_canon_i(h, "index_topk", c->index_topk);
    dsattn_sess_canon_i(h, "max_seq_len", c->max_seq_len);
    dsattn_sess_canon_f(h, "rope_theta", c->rope_theta);
    dsattn_sess_canon_f(h, "rope_factor", c->rope_factor);
    dsattn_sess_canon_f(h, "original_seq_len", c->original_seq_len);
    dsattn_sess_canon_f(h, "beta_fast", c->beta_fast);
    dsattn_sess_canon_f(h, "beta_slow", c->beta_slow);
    dsattn_sess_canon_f(h, "mscale", c->mscale);
    dsattn_sess_canon_f(h, "eps", (double)c->eps);
    dsattn_sess_canon_i(h, "fp8", c->fp8);
    dsattn_sess_canon_i(h, "ue8m0", c->ue8m0);
    dsattn_sess_canon_i(h, "rope_interleaved_mla", c->rope_il_mla);
    dsattn_sess_canon_i(h, "rope_interleaved_index", c->rope_il_index);
    dsattn_sess_canon_i(h, "force_dense", c->force_dense);
    return dsattn_sess_canon_done(h);
}

static uint64_t mla_shapes_hash(const void *mv)
{
    const dsattn_mla *m = mv;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const dsattn_mla_layer_w *L = &m->layer[l];
        const named_w ws[] = {
            { "wq", &L->wq }, { "wq_a", &L->wq_a }, { "wq_b", &L->wq_b },
            { "wkv_a", &L->wkv_a }, { "wkv_b", &L->wkv_b }, { "wo", &L->wo },
            { "indexer.wq_b", &L->i_wq_b }, { "indexer.wk", &L->i_wk },
            { "indexer.weights_proj", &L->i_wproj },
        };
        const named_v vs[] = {
            { "attn_norm", L->attn_norm }, { "q_norm", L->q_norm }, { "kv_norm", L->kv_norm },
            { "indexer.k_norm.weight", L->i_knorm_w }, { "indexer.k_norm.bias", L->i_knorm_b },
        };
        canon_layer(h, (long long)l, ws, DSATTN_ARRAY_LEN(ws), vs, DSATTN_ARRAY_LEN(vs));
    }
    return dsattn_sess_canon_done(h);
}

/* variant[0] the cache format, variant[1] the layers held */
static void mla_variant(const dsattn_mla_seq *s, uint32_t v[2])
{
    v[0] = (uint32_t)s->fmt;
    v[1] = layer_range_word(s->first, s->count, dsattn_mla_seq_whole(s));
}

static void mla_sections(void *sv, dsattn_sess_list *l)
{
    dsattn_mla_seq *s = sv;
    const size_t n = (size_t)s->pos;
    for (int64_t i = s->first; i < (int64_t)s->first + s->count; i++) {
        dsattn_mla_layer_s *S = &s->layer[i];
        const long long li = (long long)i;
        dsattn_sess_add(l, S->cache, n * s->row_bytes, "layer.%lld.kv", li);
        if (S->v) dsattn_sess_add(l, S->v, n * s->v_bytes, "layer.%lld.v", li);
        if (S->kidx) dsattn_sess_add(l, S->kidx, n * s->idx_bytes, "layer.%lld.index_k", li);
    }
}

static dsattn_status mla_check(const void *mv, const dsattn_sess_file *f, char *err,
                               size_t errlen)
{
    const dsattn_mla *m = mv;
    if (f->h.variant[0] > DSATTN_MLA_CACHE_LATENT_FP8)
        return BADF("%s: header: unknown MLA cache format %u", f->name,
                    (unsigned)f->h.variant[0]);
    return check_layer_range(f, m->cfg.n_layers, err, errlen);
}

static dsattn_status mla_create(void **out, const void *mv, size_t cap, const uint32_t var[2])
{
    const dsattn_mla *m = mv;
    int first, count;
    layer_range(var, m->cfg.n_layers, &first, &count);
    return dsattn_mla_seq_create_layers((dsattn_mla_seq **)out, m, cap, (dsattn_mla_cache)var[0],
                                        first, count);
}

SESSION_API(mla, DSATTN_SESSION_MLA)

/* ==== MHA / GQA ======================================================== */

static uint64_t mha_config_hash(const void *mv)
{
    const dsattn_mha_config *c = &((const dsattn_mha *)mv)->cfg;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    dsattn_sess_canon_i(h, "arch", DSATTN_SESSION_MHA);
    dsattn_sess_canon_i(h, "hidden", c->hidden);
    dsattn_sess_canon_i(h, "n_layers", c->n_layers);
    dsattn_sess_canon_i(h, "n_heads", c->n_heads);
    dsattn_sess_canon_i(h, "n_kv_heads", c->n_kv_heads);
    dsattn_sess_canon_i(h, "head_dim", c->head_dim);
    dsattn_sess_canon_i(h, "max_position_embeddings", c->max_position_embeddings);
    dsattn_sess_canon_f(h, "rope_theta", c->rope_theta);
    dsattn_sess_canon_f(h, "rms_norm_eps", (double)c->rms_norm_eps);
    return dsattn_sess_canon_done(h);
}

static uint64_t mha_shapes_hash(const void *mv)
{
    const dsattn_mha *m = mv;
    dsattn_sess_canon *h = dsattn_sess_canon_new();
    dsattn_sess_canon_i(h, "weights.first", m->w_first);
    dsattn_sess_canon_i(h, "weights.count", m->w_count);
    for (int l = 0; m->layer && l < m->w_count; l++) {
        const dsattn_mha_layer_w *L = &m->layer[m->w_first + l];
        const named_w ws[] = {
            { "q_proj", &L->wq }, { "k_proj", &L->wk }, { "v_proj", &L->wv }, { "o_proj", &L->wo },
        };
        const named_v vs[] = { { "input_layernorm", L->norm } };
        canon_layer(h, m->w_first + l, ws, DSATTN_ARRAY_LEN(ws), vs, DSATTN_ARRAY_LEN(vs));
    }
    return dsattn_sess_canon_done(h);
}

static void mha_variant(const dsattn_mha_seq *s, uint32_t v[2])
{
    v[0] = (uint32_t)s->first;
    v[1] = (uint32_t)s->count;
}

/* The K and V caches are key-tiled and their last tile's width depends on
 * the capacity (mha.h).  Tiles below the position's last full tile are the
 * same bytes at any capacity >= pos, so each head's run of them is one
 * section straight from memory; the remaining tokens of every head go in
 * one gathered section per layer and cache, token-major [Hkv][t][d]. */
static size_t mha_full(const dsattn_mha_seq *s, int v)
{
    const size_t t = v ? DSATTN_MHA_VTILE : DSATTN_MHA_KTILE;
    return (size_t)s->pos / t * t;
}

static void mha_tail(const dsattn_sess_sec *sec, uint8_t *out, const uint8_t *in)
{
    const dsattn_mha_seq *s = sec->obj;
    const int v = (int)sec->arg[1];
    const size_t Hkv = (size_t)s->m->cfg.n_kv_heads, d = (size_t)s->m->cfg.head_dim;
    const size_t cap = s->max_seq_len, t0 = mha_full(s, v), t1 = (size_t)s->pos;
    uint16_t *base = v ? s->layer[sec->arg[0]].v : s->layer[sec->arg[0]].k;
    size_t o = 0;
    for (size_t g = 0; g < Hkv; g++)
        for (size_t t = t0; t < t1; t++)
            for (size_t i = 0; i < d; i++, o += 2) {
                size_t at = v ? dsattn_mha_v_index(cap, d, g, t, i)
                              : dsattn_mha_k_index(cap, d, g, t, i);
                if (out) memcpy(out + o, base + at, 2);
                else memcpy(base + at, in + o, 2);
            }
}
static void mha_tail_gather(const dsattn_sess_sec *sec, uint8_t *out) { mha_tail(sec, out, NULL); }
static void mha_tail_scatter(const dsattn_sess_sec *sec, const uint8_t *in)
{
    mha_tail(sec, NULL, in);
}

static void mha_sections(void *sv, dsattn_sess_list *l)
{
    dsattn_mha_seq *s = sv;
    const size_t Hkv = (size_t)s->m->cfg.n_kv_heads, d = (size_t)s->m->cfg.head_dim;
    const size_t cap = s->max_seq_len;
    for (int i = 0; i < s->count; i++) {
        const int li = s->first + i;
        for (int v = 0; v < 2; v++) {
            uint16_t *base = v ? s->layer[i].v : s->layer[i].k;
            const char *kv = v ? "v" : "k";
            const size_t full = mha_full(s, v);
            for (size_t g = 0; g < Hkv; g++)
                dsattn_sess_add(l, base + g * cap * d, full * d * 2, "layer.%d.%s.head.%zu", li,
                                kv, g);
            dsattn_sess_sec *t = dsattn_sess_add(l, NULL, Hkv * ((size_t)s->pos - full) * d * 2,
                                                 "layer.%d.%s.tail", li, kv);
            if (t) {
                t->gather = mha_tail_gather;
                t->scatter = mha_tail_scatter;
                t->obj = s;
                t->arg[0] = (size_t)i;
                t->arg[1] = (size_t)v;
            }
        }
    }
}

static dsattn_status mha_check(const void *mv, const dsattn_sess_file *f, char *err,
                               size_t errlen)
{
    const dsattn_mha *m = mv;
    const uint64_t first = f->h.variant[0], count = f->h.variant[1];
    if (count == 0 || first + count > (uint64_t)m->cfg.n_layers)
        return BADF("%s: header: layers [%llu, %llu) outside the model's %lld", f->name,
                    (unsigned long long)first, (unsigned long long)(first + count),
                    (long long)m->cfg.n_layers);
    return DSATTN_OK;
}

static dsattn_status mha_create(void **out, const void *m, size_t cap, const uint32_t var[2])
{
    return dsattn_mha_seq_create_layers((dsattn_mha_seq **)out, m, cap, (int)var[0], (int)var[1]);
}

SESSION_API(mha, DSATTN_SESSION_MHA)

/* ==== Header only ====================================================== */

const char *dsattn_session_gen_name(dsattn_session_gen g) { return dsattn_sess_gen_name(g); }

dsattn_status dsattn_session_info_read(const char *path, dsattn_session_info *info, char *err,
                                       size_t errlen)
{
    if (!path || !info) return DSATTN_ERR_INVALID_ARG;
    dsattn_sess_map map;
    dsattn_status st = dsattn_sess_map_file(&map, path, err, errlen);
    if (st) return st;
    dsattn_sess_file f;
    st = dsattn_sess_parse(&f, map.base, map.len, path, err, errlen);
    if (!st) {
        memset(info, 0, sizeof *info);
        info->format = f.h.format;
        memcpy(info->lib_version, f.h.lib_version, sizeof info->lib_version);
        info->generation = (dsattn_session_gen)f.h.generation;
        info->variant[0] = f.h.variant[0];
        info->variant[1] = f.h.variant[1];
        info->n_sections = f.h.n_sections;
        info->config_hash = f.h.config_hash;
        info->shapes_hash = f.h.shapes_hash;
        info->pos = f.h.pos;
        info->capacity = f.h.capacity;
        info->file_bytes = f.h.file_bytes;
        dsattn_sess_file_free(&f);
    }
    dsattn_sess_unmap(&map);
    return st;
}
