/* trace.c - dispatch of `dsattn trace` by model_type, and the input reader
 * every backend shares.  Backends live beside this file, one per
 * generation; add a row to the table below for a new one. */
#include "trace.h"

#include "internal.h"
#include "jsoncfg.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct { const char *model_type; dsattn_trace_fn fn; } backend;


dsattn_status dsattn_trace_case(const char *case_dir, const char *out_path,
                                const dsattn_trace_opts *o, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", case_dir);
    cJSON *root = NULL;
    dsattn_status st = dsattn_jcfg_load(&root, path, err, errlen);
    if (st) return st;
    const char *mt = NULL;
    st = dsattn_jcfg_string_opt(root, "model_type", "", &mt, err, errlen);
    char type[64];
    snprintf(type, sizeof type, "%s", st ? "" : mt);
    int v41_keys = dsattn_jcfg_has(root, "kv_source_layers");
    cJSON_Delete(root);
    if (st) return st;
    const backend table[] = {
        { "deepseek_v41", dsattn_trace_v41 },
        { "deepseek_v3", dsattn_trace_v3 },
        { "deepseek_v32", dsattn_trace_v3 },
        { "deepseek_v4", dsattn_trace_v4 },
    };
    if (!type[0] && v41_keys) snprintf(type, sizeof type, "deepseek_v41");
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(table); i++) {
        if (strcmp(type, table[i].model_type)) continue;
        if (!table[i].fn)
            return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                               "%s: model_type '%s' has no trace backend in this build",
                               path, type);
        return table[i].fn(case_dir, out_path, o, err, errlen);
    }
    return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                       "%s: unknown model_type '%s' (known: deepseek_v3, deepseek_v32, "
                       "deepseek_v4, deepseek_v41)", path, type);
}

dsattn_status dsattn_trace_load_input(const char *case_dir, float **x, size_t *T,
                                      size_t *dim, size_t *prefill, char *err,
                                      size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/input.safetensors", case_dir);
    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open(&f, path, err, errlen);
    if (st) return st;
    const dsattn_st_tensor *tx = dsattn_st_find(f, "x");
    const dsattn_st_tensor *tp = dsattn_st_find(f, "prefill_len");
    if (!tx || !tp || tx->ndim != 2 || tp->numel != 1) {
        dsattn_st_close(f);
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: needs x [T, dim] and prefill_len [1]", path);
    }
    *T = (size_t)tx->shape[0];
    *dim = (size_t)tx->shape[1];
    float p;
    *x = dsattn_alloc_array(tx->numel, sizeof(float));
    if (!*x) { dsattn_st_close(f); return DSATTN_ERR_NOMEM; }
    st = dsattn_st_to_f32(tx, *x, tx->numel);
    if (!st) st = dsattn_st_to_f32(tp, &p, 1);
    dsattn_st_close(f);
    if (st) { dsattn_free(*x); *x = NULL; return st; }
    if (!(p >= 1.0f) || (size_t)p > *T) {
        dsattn_free(*x);
        *x = NULL;
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: prefill_len %g out of [1, %zu]",
                           path, (double)p, *T);
    }
    *prefill = (size_t)p;
    return DSATTN_OK;
}
