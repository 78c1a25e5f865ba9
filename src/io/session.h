/* session.h - the session file format every generation's sequence is saved
 * in, loaded from and cloned through.
 *
 * A generation describes its sequence as a header (generation, sequence
 * options, hashes of the model's config and weight shapes, position,
 * capacity) and a list of named sections, each a run of bytes that is
 * either contiguous memory of the sequence or gathered / scattered by a
 * callback (a layout that depends on the capacity).  This module owns
 * everything else: the byte layout (docs/sessions.md), the XXH3 checksums,
 * the atomic save (temporary file, fsync, rename, fsync of the folder), the
 * validation of a whole file before anything is restored, and the copy of
 * one sequence's sections into another's (clone).  The per-generation
 * section lists are src/attn/session_seq.c.
 */
#ifndef DSATTN_SESSION_H
#define DSATTN_SESSION_H

#include "dsattn.h"
#include "weights.h"

#include <stddef.h>
#include <stdint.h>

#define DSATTN_SESS_FORMAT      1
#define DSATTN_SESS_HEADER      128     /* bytes of the file header        */
#define DSATTN_SESS_NAME        40      /* bytes of a section name field   */
#define DSATTN_SESS_SEC_HEAD    48      /* name + u64 length               */
#define DSATTN_SESS_TRAILER     16      /* magic + u64 file checksum       */

typedef struct {
    uint32_t format;                    /* DSATTN_SESS_FORMAT              */
    char     lib_version[16];           /* dsattn_version() of the writer  */
    uint32_t generation;                /* dsattn_session_gen              */
    uint32_t variant[2];                /* the generation's sequence options */
    uint32_t n_sections;
    uint64_t config_hash, shapes_hash;
    int64_t  pos;
    uint64_t capacity;                  /* max_seq_len of the saved sequence */
    uint64_t file_bytes;
} dsattn_sess_header;

struct dsattn_sess_sec;
typedef void (*dsattn_sess_gather_fn)(const struct dsattn_sess_sec *sec, uint8_t *out);
typedef void (*dsattn_sess_scatter_fn)(const struct dsattn_sess_sec *sec, const uint8_t *in);

/* One section: `bytes` bytes at `mem`, or (mem == NULL) produced by gather
 * on save / consumed by scatter on load (obj and arg are theirs). */
typedef struct dsattn_sess_sec {
    char                   name[DSATTN_SESS_NAME];
    size_t                 bytes;
    void                  *mem;
    dsattn_sess_gather_fn  gather;
    dsattn_sess_scatter_fn scatter;
    void                  *obj;
    size_t                 arg[3];
} dsattn_sess_sec;

typedef struct {
    dsattn_sess_sec *v;
    size_t           n, cap;
    int              failed;            /* an add ran out of memory / name too long */
} dsattn_sess_list;

/* Append a section (name printf-style).  Failures are sticky in list->failed. */
dsattn_sess_sec *dsattn_sess_add(dsattn_sess_list *l, void *mem, size_t bytes,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void dsattn_sess_list_free(dsattn_sess_list *l);

/* Write header + sections atomically to path.  h->n_sections and
 * h->file_bytes are filled in here; h->format and h->lib_version too. */
dsattn_status dsattn_sess_save(const char *path, dsattn_sess_header *h,
                               const dsattn_sess_list *l, char *err, size_t errlen);

/* A parsed, fully validated session image (borrowed bytes). */
typedef struct {
    const uint8_t     *buf;
    size_t             len;
    const char        *name;            /* file name for messages          */
    dsattn_sess_header h;
    size_t            *off;             /* data offset of section i        */
    size_t            *sz;              /* its length                      */
    char             (*names)[DSATTN_SESS_NAME];
} dsattn_sess_file;

/* Validate everything a file says about itself: size, magic, format,
 * header checksum, every section's framing and checksum, the trailer and
 * the whole-file checksum.  Errors name `name` and the section. */
dsattn_status dsattn_sess_parse(dsattn_sess_file *f, const void *buf, size_t len,
                                const char *name, char *err, size_t errlen);
void dsattn_sess_file_free(dsattn_sess_file *f);
/* Index of the section called `name`, or -1. */
long dsattn_sess_find(const dsattn_sess_file *f, const char *name);

/* Map a file read-only (the bytes parse and restore read). */
typedef struct {
    void  *base;
    size_t len;
} dsattn_sess_map;
dsattn_status dsattn_sess_map_file(dsattn_sess_map *m, const char *path, char *err,
                                   size_t errlen);
void dsattn_sess_unmap(dsattn_sess_map *m);

/* Check the file's generation and model hashes against `want`. */
dsattn_status dsattn_sess_check_model(const dsattn_sess_file *f, uint32_t generation,
                                      uint64_t config_hash, uint64_t shapes_hash,
                                      char *err, size_t errlen);
/* The file's section list must equal l's, name for name and size for size;
 * only then is every section copied into the sequence l describes. */
dsattn_status dsattn_sess_restore(const dsattn_sess_file *f, const dsattn_sess_list *l,
                                  char *err, size_t errlen);
/* Copy every section of src into dst (same names and sizes): clone. */
dsattn_status dsattn_sess_copy(const dsattn_sess_list *dst, const dsattn_sess_list *src);

/* Canonical hashes: feed "key=value" lines, take the XXH3-64 of them. */
typedef struct dsattn_sess_canon dsattn_sess_canon;
dsattn_sess_canon *dsattn_sess_canon_new(void);
void     dsattn_sess_canon_i(dsattn_sess_canon *c, const char *key, int64_t v);
void     dsattn_sess_canon_f(dsattn_sess_canon *c, const char *key, double v);
/* A weight: its format, shape and block ("absent" when it has no data). */
void     dsattn_sess_canon_w(dsattn_sess_canon *c, const char *key, const dsattn_weight *w);
/* A vector weight of n values: present or absent. */
void     dsattn_sess_canon_v(dsattn_sess_canon *c, const char *key, const void *p, size_t n);
uint64_t dsattn_sess_canon_done(dsattn_sess_canon *c);   /* frees c; 0 on OOM */

/* Little-endian scalar helpers for small state sections. */
void    dsattn_sess_put_i64(uint8_t *p, int64_t v);
int64_t dsattn_sess_get_i64(const uint8_t *p);

const char *dsattn_sess_gen_name(uint32_t generation);

#endif /* DSATTN_SESSION_H */
