/* safetensors.h - bounds-checked safetensors reader and a small writer.
 *
 * File layout (the format as Hugging Face's safetensors defines it):
 *   u64 little-endian N | N bytes of JSON header | data section
 * The header is one JSON object: "name" -> {"dtype", "shape", "data_offsets":
 * [begin, end]} with offsets relative to the data section, plus an optional
 * "__metadata__" object of string -> string.
 *
 * The reader trusts nothing: every length, offset, shape and dtype is checked
 * against the bytes actually present before a tensor is handed out, and every
 * defect comes back as a dsattn_status with text naming the file, the tensor
 * and the byte offset.  Tensor data is borrowed from the mapping (or the
 * caller's buffer) and is NOT guaranteed to be aligned: safetensors packs
 * tensors back to back, so read elements with memcpy or dsattn_st_to_f32.
 *
 * The writer lays tensors out back to back in insertion order, with the
 * header padded by spaces so the data section starts 8-byte aligned, which
 * is what the reference Python writer does and what its strict reader
 * (contiguous, no holes) accepts.
 *
 * Deliberately not here: shard indexes, name maps and weight formats (see
 * checkpoint.h), and any writing of data we did not get from the caller.
 */
#ifndef DSATTN_SAFETENSORS_H
#define DSATTN_SAFETENSORS_H

#include "dsattn.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    DSATTN_DT_F32,
    DSATTN_DT_F16,
    DSATTN_DT_BF16,
    DSATTN_DT_F8_E4M3,   /* "F8_E4M3": FP8 E4M3fn                       */
    DSATTN_DT_F8_E8M0,   /* "F8_E8M0": UE8M0 power-of-two scale bytes    */
    DSATTN_DT_I8,
    DSATTN_DT_U8,
    DSATTN_DT_I32,
    DSATTN_DT_I64,
    /* The rest of the format's dtypes (the reference Rust crate's Dtype
     * enum): a checkpoint shard may hold them for tensors dsattn never
     * loads (MoE experts, say), so the header must parse.  Sub-byte types
     * are packed: a tensor's bytes are numel * bits / 8, which must be
     * whole. */
    DSATTN_DT_BOOL,
    DSATTN_DT_I16,
    DSATTN_DT_U16,
    DSATTN_DT_U32,
    DSATTN_DT_U64,
    DSATTN_DT_F64,
    DSATTN_DT_C64,
    DSATTN_DT_F8_E5M2,
    DSATTN_DT_F8_E4M3FNUZ,
    DSATTN_DT_F8_E5M2FNUZ,
    DSATTN_DT_F4,        /* "F4": FP4 E2M1, two per byte; shape counts
                          * values, the lower index in the low nibble    */
    DSATTN_DT_F6_E2M3,
    DSATTN_DT_F6_E3M2,
} dsattn_dtype;

#define DSATTN_ST_MAX_NDIM 8
/* Largest header we accept: real checkpoints stay far below a few MB. */
#define DSATTN_ST_MAX_HEADER ((size_t)100 << 20)

/* Bytes per element; 0 for the sub-byte types (F4, F6_*) and unknown. */
size_t      dsattn_dtype_size(dsattn_dtype dt);
unsigned    dsattn_dtype_bits(dsattn_dtype dt);   /* 4, 6, 8, ... 64; 0 unknown */
/* Bytes of numel elements: OVERFLOW if it does not fit size_t, FORMAT if
 * a sub-byte tensor is not a whole number of bytes, INVALID_ARG for an
 * unknown dtype. */
dsattn_status dsattn_dtype_nbytes(dsattn_dtype dt, size_t numel, size_t *out);
const char *dsattn_dtype_name(dsattn_dtype dt);   /* "F32", "F8_E4M3", ... */
/* Parse a safetensors dtype string; DSATTN_ERR_FORMAT if unknown. */
dsattn_status dsattn_dtype_parse(const char *s, dsattn_dtype *out);

typedef struct {
    const char  *name;
    dsattn_dtype dtype;
    int          ndim;                        /* 0..DSATTN_ST_MAX_NDIM      */
    int64_t      shape[DSATTN_ST_MAX_NDIM];
    size_t       numel;                       /* prod(shape); 1 if ndim = 0 */
    size_t       nbytes;                      /* numel * dtype size         */
    size_t       offset;                      /* absolute byte offset in file */
    const void  *data;                        /* borrowed, maybe unaligned  */
} dsattn_st_tensor;

typedef struct dsattn_st_file dsattn_st_file;

/* mmap `path` read-only and validate it.  The mapping lives until close. */
dsattn_status dsattn_st_open(dsattn_st_file **out, const char *path,
                             char *err, size_t errlen);
/* Validate a caller buffer (borrowed: it must outlive the handle).  Used by
 * tests and the fuzzer; `name` (may be NULL) is used in error text. */
dsattn_status dsattn_st_open_buffer(dsattn_st_file **out, const void *buf,
                                    size_t len, char *err, size_t errlen);
dsattn_status dsattn_st_open_buffer_named(dsattn_st_file **out, const void *buf,
                                          size_t len, const char *name,
                                          char *err, size_t errlen);
void dsattn_st_close(dsattn_st_file *f);

/* Tensors in file order (order of data offsets). */
size_t                  dsattn_st_count(const dsattn_st_file *f);
const dsattn_st_tensor *dsattn_st_at(const dsattn_st_file *f, size_t i);
/* NULL if absent.  O(log n). */
const dsattn_st_tensor *dsattn_st_find(const dsattn_st_file *f, const char *name);

/* Binary search among n names in strcmp order, the i-th of which is
 * name(list, i): the i whose name equals key, or n when none does.  Every
 * by-name lookup of the io layer (tensors, metadata, checkpoint entries). */
size_t dsattn_name_bsearch(const char *key, size_t n,
                           const char *(*name)(const void *list, size_t i), const void *list);
/* __metadata__ value or NULL. */
const char *dsattn_st_meta(const dsattn_st_file *f, const char *key);
size_t      dsattn_st_meta_count(const dsattn_st_file *f);
/* i-th metadata pair (sorted by key); returns key, *value set. */
const char *dsattn_st_meta_at(const dsattn_st_file *f, size_t i, const char **value);
const char *dsattn_st_path(const dsattn_st_file *f);
/* The whole file bytes (for byte-offset arithmetic in callers). */
const uint8_t *dsattn_st_base(const dsattn_st_file *f);
size_t         dsattn_st_size(const dsattn_st_file *f);

/* Convert F32, F16, BF16, F8_E4M3, F8_E8M0 (2^(b-127)), I8, U8, I32 and
 * I64 (by value) to fp32; other dtypes DSATTN_ERR_UNSUPPORTED.  n must
 * equal t->numel, else DSATTN_ERR_INVALID_ARG. */
dsattn_status dsattn_st_to_f32(const dsattn_st_tensor *t, float *out, size_t n);

/* IEEE half -> fp32 (exact). */
float dsattn_f16_to_f32(uint16_t h);

/* ==== Writer ============================================================ */

typedef struct dsattn_st_writer dsattn_st_writer;

dsattn_st_writer *dsattn_st_writer_create(void);          /* NULL on OOM */
void dsattn_st_writer_destroy(dsattn_st_writer *w);
/* Copies name and numel*size bytes of data (data may be NULL: zeros).
 * Rejects duplicate names, ndim > 8, negative dims, size overflow. */
dsattn_status dsattn_st_writer_add(dsattn_st_writer *w, const char *name,
                                   dsattn_dtype dtype, int ndim,
                                   const int64_t *shape, const void *data);
dsattn_status dsattn_st_writer_meta(dsattn_st_writer *w, const char *key,
                                    const char *value);
/* Bytes of tensor data added so far (the header excluded), for sharding
 * decisions. */
size_t dsattn_st_writer_data_bytes(const dsattn_st_writer *w);
dsattn_status dsattn_st_writer_save(dsattn_st_writer *w, const char *path,
                                    char *err, size_t errlen);

#endif /* DSATTN_SAFETENSORS_H */
