/* jsoncfg.h - strict getters over cJSON for config.json files.
 *
 * A config key that is missing or has the wrong type is an error naming the
 * key, never a silent default: a checkpoint run with a wrong dimension is
 * worse than one that refuses to start.  Callers that do have a documented
 * default use the *_opt getters, which still reject a present key of the
 * wrong type.  Error text is "key 'K': ..."; callers prefix the file name
 * (dsattn_jcfg_load already names the file in its own errors).
 *
 * Deliberately not here: knowledge of any particular config schema.
 */
#ifndef DSATTN_JSONCFG_H
#define DSATTN_JSONCFG_H

#include "dsattn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Read and parse `path`; *out is a tree to free with cJSON_Delete.  Errors:
 * NOT_FOUND / IO (file), FORMAT (not JSON, with byte offset; not an object). */
dsattn_status dsattn_jcfg_load(cJSON **out, const char *path, char *err,
                               size_t errlen);
/* Same from memory; `what` names the source in error text (may be NULL). */
dsattn_status dsattn_jcfg_parse(cJSON **out, const char *text, size_t len,
                                const char *what, char *err, size_t errlen);

bool dsattn_jcfg_has(const cJSON *obj, const char *key);  /* present, non-null */

/* Integers must be exact (3.0 is accepted, 3.5 is not) and |v| <= 2^53. */
dsattn_status dsattn_jcfg_int(const cJSON *obj, const char *key, int64_t *out,
                              char *err, size_t errlen);
dsattn_status dsattn_jcfg_double(const cJSON *obj, const char *key, double *out,
                                 char *err, size_t errlen);
dsattn_status dsattn_jcfg_bool(const cJSON *obj, const char *key, bool *out,
                               char *err, size_t errlen);
/* *out borrows from the tree. */
dsattn_status dsattn_jcfg_string(const cJSON *obj, const char *key,
                                 const char **out, char *err, size_t errlen);
/* Array of integers, at most `max` long; *n receives the length. */
dsattn_status dsattn_jcfg_int_array(const cJSON *obj, const char *key,
                                    int64_t *out, size_t max, size_t *n,
                                    char *err, size_t errlen);
/* Nested object (e.g. "text_config", "quantization_config"). */
dsattn_status dsattn_jcfg_object(const cJSON *obj, const char *key,
                                 const cJSON **out, char *err, size_t errlen);

/* Missing (or null) -> *out = def, OK.  Present with the wrong type -> error. */
dsattn_status dsattn_jcfg_int_opt(const cJSON *obj, const char *key, int64_t def,
                                  int64_t *out, char *err, size_t errlen);
dsattn_status dsattn_jcfg_double_opt(const cJSON *obj, const char *key,
                                     double def, double *out, char *err,
                                     size_t errlen);
dsattn_status dsattn_jcfg_bool_opt(const cJSON *obj, const char *key, bool def,
                                   bool *out, char *err, size_t errlen);
dsattn_status dsattn_jcfg_string_opt(const cJSON *obj, const char *key,
                                     const char *def, const char **out,
                                     char *err, size_t errlen);

#endif /* DSATTN_JSONCFG_H */
