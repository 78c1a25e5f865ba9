/* model_glue.h - the start every generation's model has alike, written once
 * as a macro that a generation's model file expands: <g>_new_model, the
 * model of a config.json without weights, which every constructor
 * (config-only, checkpoint, random weights) begins with.  It makes a zeroed
 * dsattn_<g>, reads its cfg with dsattn_<g>_config_load, then lets
 * SETUP(m) derive what the config decides (tables, layer plans, arrays);
 * on a failure the model is given back with dsattn_<g>_destroy and *out
 * stays NULL.
 *
 * Of the model type it reads only the field cfg.
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

#endif /* DSATTN_MODEL_GLUE_H */
