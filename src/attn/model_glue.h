/* model_glue.h - what every generation's model has alike, written once as
 * macros that a generation's model file expands: <g>_new_model, the
 * model of a config.json without weights, which every constructor
 * (config-only, checkpoint, random weights) begins with.  It makes a zeroed
 * dsattn_<g>, reads its cfg with dsattn_<g>_config_load, then lets
 * SETUP(m) derive what the config decides (tables, layer plans, arrays);
 * on a failure the model is given back with dsattn_<g>_destroy and *out
 * stays NULL; and dsattn_<g>_load, the checkpoint constructor, which
 * starts from it.
 *
 * Of the model type they use only the fields cfg, ckpt (the checkpoint the
 * model keeps open) and owned (the buffers it frees).
 */
#ifndef DSATTN_MODEL_GLUE_H
#define DSATTN_MODEL_GLUE_H

#include "dsattn.h"

#include <stdlib.h>

#define DSATTN_MODEL_NEW(g, SETUP)                                                        \
    static dsattn_status g##_new_model(dsattn_##g **out, const char *config_json,         \
                                       char *err, size_t errlen)                          \
    {                                                                                     \
        if (!out || !config_json) return DSATTN_ERR_INVALID_ARG;                          \
        *out = NULL;                                                                      \
        dsattn_##g *m = calloc(1, sizeof *m);                                             \
        if (!m) return DSATTN_ERR_NOMEM;                                                  \
        dsattn_status st = dsattn_##g##_config_load(&m->cfg, config_json, err, errlen);   \
        if (!st) st = SETUP(m);                                                           \
        if (st) {                                                                         \
            dsattn_##g##_destroy(m);                                                      \
            return st;                                                                    \
        }                                                                                 \
        *out = m;                                                                         \
        return DSATTN_OK;                                                                 \
    }

/* dsattn_<g>_load, the checkpoint constructor every generation has alike:
 * the checkpoint opened with its config (dsattn_ckpt_open_model: the
 * config given, else the one beside the weights), the model of that config
 * (<g>_new_model above), then BIND(m, binder, layer) for every layer of
 * the range, the model keeping the checkpoint open (m->ckpt) and every
 * converted tensor on m->owned; LOADED(m, first, count) then finishes what
 * depends on the layers being bound.  On a failure nothing is returned and
 * everything made is freed.  <g>_load_layers (static) binds only layers
 * [first, first + count), count < 0 meaning every layer from first, for a
 * generation that offers a partial model; dsattn_<g>_load is every layer.
 * The expanding file includes checkpoint.h. */
#define DSATTN_MODEL_LOAD(g, BIND, LOADED)                                                  \
    static inline dsattn_status g##_load_layers(dsattn_##g **out, const char *config_json,  \
                                                const char *weights, int first, int count,  \
                                                char *err, size_t errlen)                   \
    {                                                                                       \
        if (!out || !weights) return DSATTN_ERR_INVALID_ARG;                                \
        *out = NULL;                                                                        \
        dsattn_ckpt *ck = NULL;                                                             \
        const char *cfg_path = NULL;                                                        \
        dsattn_status st = dsattn_ckpt_open_model(&ck, &cfg_path, weights, config_json,     \
                                                  err, errlen);                             \
        if (st) return st;                                                                  \
        dsattn_##g *m = NULL;                                                               \
        if ((st = g##_new_model(&m, cfg_path, err, errlen))) {                              \
            dsattn_ckpt_close(ck);                                                          \
            return st;                                                                      \
        }                                                                                   \
        m->ckpt = ck;                                                                       \
        if (count < 0) count = first >= 0 ? (int)(m->cfg.n_layers - first) : 0;             \
        if (first < 0 || count <= 0 || (int64_t)first + count > m->cfg.n_layers) {          \
            st = dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,                           \
                             "layers [%d, %lld) outside the model's %lld", first,           \
                             (long long)first + count, (long long)m->cfg.n_layers);         \
            dsattn_##g##_destroy(m);                                                        \
            return st;                                                                      \
        }                                                                                   \
        const dsattn_binder b = { ck, &m->owned, err, errlen };                             \
        for (int64_t l = first; l < (int64_t)first + count && !st; l++) st = BIND(m, &b, l); \
        if (st) {                                                                           \
            dsattn_##g##_destroy(m);                                                        \
            return st;                                                                      \
        }                                                                                   \
        LOADED(m, first, count);                                                            \
        *out = m;                                                                           \
        return DSATTN_OK;                                                                   \
    }                                                                                       \
    dsattn_status dsattn_##g##_load(dsattn_##g **out, const char *config_json,              \
                                    const char *weights, char *err, size_t errlen)          \
    {                                                                                       \
        return g##_load_layers(out, config_json, weights, 0, -1, err, errlen);              \
    }

#endif /* DSATTN_MODEL_GLUE_H */
