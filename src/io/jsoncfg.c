/* jsoncfg.c - strict typed getters over cJSON (see jsoncfg.h).
 *
 * Owns: reading a JSON file into memory with a size cap, and the type checks
 * of each getter.  Keys are matched case-sensitively, as Python's json does.
 * Deliberately not here: any schema, any default that is not the caller's.
 */
#include "jsoncfg.h"

#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* config.json files are a few KB; an index.json of a big checkpoint is a
 * few hundred KB.  Anything past this is not a config. */
#define DSATTN_JCFG_MAX_BYTES ((size_t)64 << 20)

dsattn_status dsattn_jcfg_parse(cJSON **out, const char *text, size_t len,
                                const char *what, char *err, size_t errlen)
{
    if (!out || (!text && len))
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "dsattn_jcfg_parse: NULL argument");
    *out = NULL;
    if (!what) what = "<json>";
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text ? text : "", len, &end, 0);
    if (!root) {
        size_t at = end && text && end >= text && end <= text + len
                        ? (size_t)(end - text) : 0;
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: not valid JSON (near byte offset %zu)", what, at);
    }
    for (const char *p = end; p && p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: garbage after the JSON value at byte offset %zu",
                               what, (size_t)(p - text));
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: top-level JSON value is not an object", what);
    }
    *out = root;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_load(cJSON **out, const char *path, char *err,
                               size_t errlen)
{
    if (!out || !path)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "dsattn_jcfg_load: NULL argument");
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return dsattn_errf(err, errlen,
                           errno == ENOENT ? DSATTN_ERR_NOT_FOUND : DSATTN_ERR_IO,
                           "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    dsattn_status st = DSATTN_OK;
    while (buf) {
        if (n == cap) {
            if (cap >= DSATTN_JCFG_MAX_BYTES) {
                st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                                 "%s: larger than %zu bytes: not a config file",
                                 path, DSATTN_JCFG_MAX_BYTES);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, fp);
        n += k;
        if (k == 0) {
            if (ferror(fp))
                st = dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: read error",
                                 path);
            break;
        }
    }
    fclose(fp);
    if (!buf) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    if (st == DSATTN_OK) st = dsattn_jcfg_parse(out, buf, n, path, err, errlen);
    free(buf);
    return st;
}

static const cJSON *jc_get(const cJSON *obj, const char *key)
{
    if (!obj || !key) return NULL;
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(j) ? NULL : j;
}

bool dsattn_jcfg_has(const cJSON *obj, const char *key)
{
    return jc_get(obj, key) != NULL;
}

static const char *jc_type(const cJSON *j)
{
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "null";
}

static dsattn_status jc_missing(const char *key, char *err, size_t errlen)
{
    return dsattn_errf(err, errlen, DSATTN_ERR_NOT_FOUND,
                       "key '%s': missing", key);
}

static bool jc_exact_int(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!isfinite(d) || floor(d) != d || fabs(d) > 9007199254740992.0)
        return false;
    *out = (int64_t)d;
    return true;
}

/* The value of `key` when it is present and `is` accepts it; else the
 * error "missing" or "expected <what>, got <its type>". */
static dsattn_status jc_typed(const cJSON *obj, const char *key, cJSON_bool (*is)(const cJSON *),
                              const char *what, const cJSON **out, char *err, size_t errlen)
{
    const cJSON *j = jc_get(obj, key);
    if (!j) return jc_missing(key, err, errlen);
    if (!is(j))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "key '%s': expected %s, got %s", key,
                           what, jc_type(j));
    *out = j;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_int(const cJSON *obj, const char *key, int64_t *out,
                              char *err, size_t errlen)
{
    const cJSON *j = jc_get(obj, key);
    if (!j) return jc_missing(key, err, errlen);
    if (!jc_exact_int(j, out))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "key '%s': expected an integer, got %s%s", key,
                           jc_type(j), cJSON_IsNumber(j) ? " that is not integral" : "");
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_double(const cJSON *obj, const char *key, double *out,
                                 char *err, size_t errlen)
{
    const cJSON *j = jc_get(obj, key);
    if (!j) return jc_missing(key, err, errlen);
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "key '%s': expected a finite number, got %s", key,
                           jc_type(j));
    *out = j->valuedouble;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_bool(const cJSON *obj, const char *key, bool *out,
                               char *err, size_t errlen)
{
    const cJSON *j;
    dsattn_status st = jc_typed(obj, key, cJSON_IsBool, "true/false", &j, err, errlen);
    if (st == DSATTN_OK) *out = cJSON_IsTrue(j);
    return st;
}

dsattn_status dsattn_jcfg_string(const cJSON *obj, const char *key,
                                 const char **out, char *err, size_t errlen)
{
    const cJSON *j;
    dsattn_status st = jc_typed(obj, key, cJSON_IsString, "a string", &j, err, errlen);
    if (st == DSATTN_OK) *out = j->valuestring;
    return st;
}

dsattn_status dsattn_jcfg_int_array(const cJSON *obj, const char *key,
                                    int64_t *out, size_t max, size_t *n,
                                    char *err, size_t errlen)
{
    const cJSON *j;
    dsattn_status st = jc_typed(obj, key, cJSON_IsArray, "an array of integers", &j, err, errlen);
    if (st != DSATTN_OK) return st;
    size_t k = 0;
    for (const cJSON *c = j->child; c; c = c->next, k++) {
        if (k >= max)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "key '%s': more than %zu entries", key, max);
        if (!jc_exact_int(c, &out[k]))
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "key '%s': entry %zu is not an integer", key, k);
    }
    *n = k;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_object(const cJSON *obj, const char *key,
                                 const cJSON **out, char *err, size_t errlen)
{
    return jc_typed(obj, key, cJSON_IsObject, "an object", out, err, errlen);
}

dsattn_status dsattn_jcfg_int_opt(const cJSON *obj, const char *key, int64_t def,
                                  int64_t *out, char *err, size_t errlen)
{
    if (jc_get(obj, key)) return dsattn_jcfg_int(obj, key, out, err, errlen);
    *out = def;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_double_opt(const cJSON *obj, const char *key,
                                     double def, double *out, char *err,
                                     size_t errlen)
{
    if (jc_get(obj, key)) return dsattn_jcfg_double(obj, key, out, err, errlen);
    *out = def;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_bool_opt(const cJSON *obj, const char *key, bool def,
                                   bool *out, char *err, size_t errlen)
{
    if (jc_get(obj, key)) return dsattn_jcfg_bool(obj, key, out, err, errlen);
    *out = def;
    return DSATTN_OK;
}

dsattn_status dsattn_jcfg_string_opt(const cJSON *obj, const char *key,
                                     const char *def, const char **out,
                                     char *err, size_t errlen)
{
    if (jc_get(obj, key)) return dsattn_jcfg_string(obj, key, out, err, errlen);
    *out = def;
    return DSATTN_OK;
}
