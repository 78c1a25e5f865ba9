/* safetensors.c - the safetensors reader (mmap or caller buffer) and writer.
 *
 * Owns: header parsing and validation, the sorted tensor and metadata tables,
 * dtype conversion to fp32, and the writer's byte layout.
 *
 * Validation order matters for the error a user sees, so it follows the file:
 * (1) the 8-byte length, (2) the header fits in the file, (3) it is JSON and
 * an object, (4) each entry's fields, dtype, shape and offsets, (5) offsets
 * inside the data section and matching shape x dtype, (6) duplicate names,
 * (7) overlaps.  Numbers in the header arrive as cJSON doubles; we accept
 * only exact non-negative integers up to 2^53, so "1.5", "-1" or "1e300"
 * never become a size.  All products go through dsattn_mul_size.
 *
 * Holes between tensors and trailing bytes are accepted (harmless, and some
 * writers align tensors); overlaps are not (two names aliasing one byte is
 * either corruption or an attack on whoever writes through one of them).
 *
 * Deliberately not here: shard indexes, name maps, weight formats.
 */
#include "safetensors.h"

#include "internal.h"
#include "numfmt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== dtypes ============================================================ */

static const struct {
    const char *name;
    unsigned    bits;
} dsattn_dt_table[] = {
    [DSATTN_DT_F32]          = { "F32", 32 },
    [DSATTN_DT_F16]          = { "F16", 16 },
    [DSATTN_DT_BF16]         = { "BF16", 16 },
    [DSATTN_DT_F8_E4M3]      = { "F8_E4M3", 8 },
    [DSATTN_DT_F8_E8M0]      = { "F8_E8M0", 8 },
    [DSATTN_DT_I8]           = { "I8", 8 },
    [DSATTN_DT_U8]           = { "U8", 8 },
    [DSATTN_DT_I32]          = { "I32", 32 },
    [DSATTN_DT_I64]          = { "I64", 64 },
    [DSATTN_DT_BOOL]         = { "BOOL", 8 },
    [DSATTN_DT_I16]          = { "I16", 16 },
    [DSATTN_DT_U16]          = { "U16", 16 },
    [DSATTN_DT_U32]          = { "U32", 32 },
    [DSATTN_DT_U64]          = { "U64", 64 },
    [DSATTN_DT_F64]          = { "F64", 64 },
    [DSATTN_DT_C64]          = { "C64", 64 },
    [DSATTN_DT_F8_E5M2]      = { "F8_E5M2", 8 },
    [DSATTN_DT_F8_E4M3FNUZ]  = { "F8_E4M3FNUZ", 8 },
    [DSATTN_DT_F8_E5M2FNUZ]  = { "F8_E5M2FNUZ", 8 },
    [DSATTN_DT_F4]           = { "F4", 4 },
    [DSATTN_DT_F6_E2M3]      = { "F6_E2M3", 6 },
    [DSATTN_DT_F6_E3M2]      = { "F6_E3M2", 6 },
};

unsigned dsattn_dtype_bits(dsattn_dtype dt)
{
    if ((unsigned)dt >= DSATTN_ARRAY_LEN(dsattn_dt_table)) return 0;
    return dsattn_dt_table[dt].bits;
}

size_t dsattn_dtype_size(dsattn_dtype dt)
{
    unsigned b = dsattn_dtype_bits(dt);
    return b % 8 ? 0 : b / 8;
}

dsattn_status dsattn_dtype_nbytes(dsattn_dtype dt, size_t numel, size_t *out)
{
    unsigned b = dsattn_dtype_bits(dt);
    size_t bits;
    if (!out || b == 0) return DSATTN_ERR_INVALID_ARG;
    if (b % 8 == 0)
        return dsattn_mul_size(numel, b / 8, out) ? DSATTN_OK : DSATTN_ERR_OVERFLOW;
    if (!dsattn_mul_size(numel, b, &bits)) return DSATTN_ERR_OVERFLOW;
    if (bits % 8) return DSATTN_ERR_FORMAT;
    *out = bits / 8;
    return DSATTN_OK;
}

const char *dsattn_dtype_name(dsattn_dtype dt)
{
    if ((unsigned)dt >= DSATTN_ARRAY_LEN(dsattn_dt_table)) return "?";
    return dsattn_dt_table[dt].name;
}

dsattn_status dsattn_dtype_parse(const char *s, dsattn_dtype *out)
{
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(dsattn_dt_table); i++) {
        if (strcmp(s, dsattn_dt_table[i].name) == 0) {
            *out = (dsattn_dtype)i;
            return DSATTN_OK;
        }
    }
    return DSATTN_ERR_FORMAT;
}

float dsattn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 0) {
        float v = ldexpf((float)m, -24);        /* zero or subnormal, exact */
        return sign ? -v : v;
    }
    if (e == 31) return dsattn_bits_f32(sign | 0x7f800000u | (m << 13));
    return dsattn_bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
}

/* ==== Reader ============================================================ */

struct dsattn_st_file {
    char             *path;       /* for error text; "<buffer>" if none   */
    const uint8_t    *base;       /* whole file                           */
    size_t            len;
    void             *map;        /* mmap base to unmap, or NULL          */
    size_t            data_start; /* 8 + header length                    */
    dsattn_st_tensor *t;          /* sorted by offset (file order)        */
    size_t            n;
    size_t           *by_name;    /* indices into t, sorted by name       */
    char            **meta_k, **meta_v;  /* sorted by key                 */
    size_t            n_meta;
};

static void st_free(dsattn_st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_k[i]);
        free(f->meta_v[i]);
    }
    if (f->map) munmap(f->map, f->len);
    void *owned[] = { f->meta_k, f->meta_v, f->t, f->by_name, f->path, f };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(owned); i++) free(owned[i]);
}

void dsattn_st_close(dsattn_st_file *f) { st_free(f); }

/* Byte offset of `"name"` inside the header, for error text: the header is
 * the only place a defective entry exists, so point the user at it.  Falls
 * back to the header start when the name needs JSON escapes. */
static size_t st_key_pos(const char *hdr, size_t hlen, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl + 2 <= hlen; i++) {
        if (hdr[i] == '"' && memcmp(hdr + i + 1, name, nl) == 0 &&
            hdr[i + 1 + nl] == '"')
            return 8 + i;
    }
    return 8;
}

/* An exact integer in [0, 2^53]; false for anything else. */
static bool st_json_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!isfinite(d) || d < 0 || d > 9007199254740992.0 || floor(d) != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static int st_cmp_offset(const void *a, const void *b)
{
    const dsattn_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort has no context argument in C11: sort pointers to names instead. */
typedef struct { const char *name; size_t idx; } st_name_ref;
static int st_cmp_name(const void *a, const void *b)
{
    const st_name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

typedef struct { char *k, *v; } st_kv;
static int st_cmp_kv(const void *a, const void *b)
{
    return strcmp(((const st_kv *)a)->k, ((const st_kv *)b)->k);
}

static dsattn_status st_parse_meta(dsattn_st_file *f, const cJSON *m,
                                   const char *hdr, size_t hlen,
                                   char *err, size_t errlen)
{
    size_t pos = st_key_pos(hdr, hlen, "__metadata__");
    if (!cJSON_IsObject(m))
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: __metadata__ is not an object (header byte offset %zu)",
                           f->path, pos);
    size_t n = 0;
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->string)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: __metadata__ value of '%s' is not a string "
                               "(header byte offset %zu)",
                               f->path, c->string ? c->string : "?", pos);
        n++;
    }
    if (n == 0) return DSATTN_OK;
    st_kv *kv = calloc(n, sizeof *kv);
    f->meta_k = calloc(n, sizeof(char *));
    f->meta_v = calloc(n, sizeof(char *));
    if (!kv || !f->meta_k || !f->meta_v) {
        free(kv);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory",
                           f->path);
    }
    size_t i = 0;
    for (const cJSON *c = m->child; c; c = c->next, i++) {
        kv[i].k = strdup(c->string);
        kv[i].v = strdup(c->valuestring);
        if (!kv[i].k || !kv[i].v) {
            for (size_t j = 0; j <= i; j++) { free(kv[j].k); free(kv[j].v); }
            free(kv);
            return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM,
                               "%s: out of memory", f->path);
        }
    }
    qsort(kv, n, sizeof *kv, st_cmp_kv);
    for (i = 0; i < n; i++) {
        if (i > 0 && strcmp(kv[i].k, kv[i - 1].k) == 0) {
            dsattn_status st = dsattn_errf(
                err, errlen, DSATTN_ERR_FORMAT,
                "%s: __metadata__ key '%s' appears twice (header byte offset %zu)",
                f->path, kv[i].k, pos);
            for (size_t j = 0; j < n; j++) { free(kv[j].k); free(kv[j].v); }
            free(kv);
            return st;
        }
    }
    for (i = 0; i < n; i++) {
        f->meta_k[i] = kv[i].k;
        f->meta_v[i] = kv[i].v;
    }
    f->n_meta = n;
    free(kv);
    return DSATTN_OK;
}

/* One header entry -> one tensor, fully checked against the data section. */
static dsattn_status st_parse_entry(dsattn_st_file *f, const cJSON *e,
                                    dsattn_st_tensor *t, const char *hdr,
                                    size_t hlen, char *err, size_t errlen)
{
    const char *name = e->string;
    size_t pos = st_key_pos(hdr, hlen, name);
    size_t data_len = f->len - f->data_start;
#define ST_BAD(...)                                                        \
    do {                                                                   \
        char why_[256];                                                    \
        snprintf(why_, sizeof why_, __VA_ARGS__);                          \
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,                 \
                           "%s: tensor '%s': %s (header byte offset %zu)", f->path, \
                           name, why_, pos);                               \
    } while (0)

    if (name[0] == '\0') ST_BAD("empty tensor name");
    if (!cJSON_IsObject(e)) ST_BAD("entry is not an object");
    const cJSON *jdt = NULL, *jsh = NULL, *joff = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        if (strcmp(c->string, "dtype") == 0 && !jdt) jdt = c;
        else if (strcmp(c->string, "shape") == 0 && !jsh) jsh = c;
        else if (strcmp(c->string, "data_offsets") == 0 && !joff) joff = c;
        else ST_BAD("unexpected or repeated field '%s'", c->string);
    }
    if (!cJSON_IsString(jdt)) ST_BAD("missing or non-string \"dtype\"");
    if (dsattn_dtype_parse(jdt->valuestring, &t->dtype) != DSATTN_OK)
        ST_BAD("unknown dtype \"%.40s\"", jdt->valuestring);
    if (!cJSON_IsArray(jsh)) ST_BAD("missing or non-array \"shape\"");
    int nd = cJSON_GetArraySize(jsh);
    if (nd > DSATTN_ST_MAX_NDIM)
        ST_BAD("%d dimensions, at most %d supported", nd, DSATTN_ST_MAX_NDIM);
    t->ndim = nd;
    size_t numel = 1;
    int d = 0;
    for (const cJSON *c = jsh->child; c; c = c->next, d++) {
        uint64_t v;
        if (!st_json_u64(c, &v)) ST_BAD("shape[%d] is not a non-negative integer", d);
        t->shape[d] = (int64_t)v;
        if (v > SIZE_MAX || !dsattn_mul_size(numel, (size_t)v, &numel))
            return dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW,
                               "%s: tensor '%s': shape product overflows "
                               "(header byte offset %zu)", f->path, name, pos);
    }
    t->numel = numel;
    dsattn_status nb = dsattn_dtype_nbytes(t->dtype, numel, &t->nbytes);
    if (nb == DSATTN_ERR_FORMAT)
        ST_BAD("%zu %s elements of %u bits are not a whole number of bytes", numel,
               dsattn_dtype_name(t->dtype), dsattn_dtype_bits(t->dtype));
    if (nb != DSATTN_OK)
        return dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW,
                           "%s: tensor '%s': byte size overflows (header byte offset %zu)",
                           f->path, name, pos);
    if (!cJSON_IsArray(joff) || cJSON_GetArraySize(joff) != 2)
        ST_BAD("\"data_offsets\" must be [begin, end]");
    uint64_t b, en;
    if (!st_json_u64(joff->child, &b) || !st_json_u64(joff->child->next, &en))
        ST_BAD("\"data_offsets\" are not non-negative integers");
    if (en < b)
        ST_BAD("data_offsets end %llu < begin %llu", (unsigned long long)en,
               (unsigned long long)b);
    if (en > data_len)
        ST_BAD("data_offsets [%llu, %llu] run past the data section "
               "(%zu bytes; file offset %llu > file size %zu)",
               (unsigned long long)b, (unsigned long long)en, data_len,
               (unsigned long long)(f->data_start + en), f->len);
    if ((size_t)(en - b) != t->nbytes)
        ST_BAD("%llu data bytes at file offset %zu, but %s x %zu elements needs %zu",
               (unsigned long long)(en - b), f->data_start + (size_t)b,
               dsattn_dtype_name(t->dtype), numel, t->nbytes);
    t->offset = f->data_start + (size_t)b;
    t->data = f->base + t->offset;
    t->name = strdup(name);
    if (!t->name)
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory",
                           f->path);
    return DSATTN_OK;
#undef ST_BAD
}

static dsattn_status st_parse(dsattn_st_file *f, char *err, size_t errlen)
{
    if (f->len < 8)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: truncated: %zu bytes, shorter than the 8-byte "
                           "header length (byte offset 0)", f->path, f->len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->base[i];
    if (hl > f->len - 8)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: header length %llu at byte offset 0 runs past the "
                           "end of the file (%zu bytes): truncated or not safetensors",
                           f->path, (unsigned long long)hl, f->len);
    if (hl > DSATTN_ST_MAX_HEADER)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: header length %llu exceeds the %zu-byte limit",
                           f->path, (unsigned long long)hl, DSATTN_ST_MAX_HEADER);
    size_t hlen = (size_t)hl;
    const char *hdr = (const char *)f->base + 8;
    f->data_start = 8 + hlen;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: header is not valid JSON (near byte offset %zu)",
                           f->path, 8 + at);
    }
    /* Only padding (whitespace; NUL from some writers) may follow the JSON. */
    for (const char *p = end; p && p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            cJSON_Delete(root);
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "%s: garbage after the header JSON at byte offset %zu",
                               f->path, (size_t)(8 + (p - hdr)));
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: header JSON is not an object (byte offset 8)",
                           f->path);
    }

    dsattn_status st = DSATTN_OK;
    size_t n = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c->string && strcmp(c->string, "__metadata__") == 0) {
            if (meta) {
                st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                                 "%s: __metadata__ appears twice", f->path);
                goto done;
            }
            meta = c;
        } else {
            n++;
        }
    }
    if (meta && (st = st_parse_meta(f, meta, hdr, hlen, err, errlen)) != DSATTN_OK)
        goto done;
    if (n) {
        f->t = calloc(n, sizeof *f->t);
        f->by_name = calloc(n, sizeof *f->by_name);
        if (!f->t || !f->by_name) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory",
                             f->path);
            goto done;
        }
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta) continue;
        st = st_parse_entry(f, c, &f->t[f->n], hdr, hlen, err, errlen);
        if (st != DSATTN_OK) goto done;
        f->n++;
    }

    /* Duplicate names: JSON objects may legally repeat keys; we may not. */
    st_name_ref *refs = n ? calloc(n, sizeof *refs) : NULL;
    if (n && !refs) {
        st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory", f->path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) refs[i] = (st_name_ref){ f->t[i].name, i };
    if (n) qsort(refs, n, sizeof *refs, st_cmp_name);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(refs[i].name, refs[i - 1].name) == 0) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                             "%s: tensor '%s' appears twice in the header "
                             "(header byte offset %zu)", f->path, refs[i].name,
                             st_key_pos(hdr, hlen, refs[i].name));
            free(refs);
            goto done;
        }
    }
    free(refs);

    /* Overlaps: sort by offset, track the furthest end of a non-empty one. */
    if (n) qsort(f->t, n, sizeof *f->t, st_cmp_offset);
    size_t far_end = 0, far_i = 0;
    for (size_t i = 0; i < n; i++) {
        const dsattn_st_tensor *t = &f->t[i];
        if (t->nbytes == 0) continue;
        if (i > 0 && far_end > t->offset) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                             "%s: tensor '%s' (file bytes %zu..%zu) overlaps tensor "
                             "'%s' (ends at byte %zu)", f->path, t->name, t->offset,
                             t->offset + t->nbytes, f->t[far_i].name, far_end);
            goto done;
        }
        far_end = t->offset + t->nbytes;
        far_i = i;
    }
    /* by_name: indices of the offset-sorted array, sorted by name. */
    {
        st_name_ref *r2 = n ? calloc(n, sizeof *r2) : NULL;
        if (n && !r2) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory",
                             f->path);
            goto done;
        }
        for (size_t i = 0; i < n; i++) r2[i] = (st_name_ref){ f->t[i].name, i };
        if (n) qsort(r2, n, sizeof *r2, st_cmp_name);
        for (size_t i = 0; i < n; i++) f->by_name[i] = r2[i].idx;
        free(r2);
    }
done:
    cJSON_Delete(root);
    return st;
}

static dsattn_status st_new(dsattn_st_file **out, const char *path)
{
    dsattn_st_file *f = calloc(1, sizeof *f);
    if (!f) return DSATTN_ERR_NOMEM;
    f->path = strdup(path ? path : "<buffer>");
    if (!f->path) {
        free(f);
        return DSATTN_ERR_NOMEM;
    }
    *out = f;
    return DSATTN_OK;
}

dsattn_status dsattn_st_open_buffer_named(dsattn_st_file **out, const void *buf,
                                          size_t len, const char *name,
                                          char *err, size_t errlen)
{
    if (!out || (!buf && len))
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "dsattn_st_open_buffer: NULL argument");
    *out = NULL;
    dsattn_st_file *f;
    if (st_new(&f, name) != DSATTN_OK)
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    static const uint8_t empty[1];
    f->base = buf ? buf : empty;
    f->len = len;
    dsattn_status st = st_parse(f, err, errlen);
    if (st != DSATTN_OK) {
        st_free(f);
        return st;
    }
    *out = f;
    return DSATTN_OK;
}

dsattn_status dsattn_st_open_buffer(dsattn_st_file **out, const void *buf,
                                    size_t len, char *err, size_t errlen)
{
    return dsattn_st_open_buffer_named(out, buf, len, NULL, err, errlen);
}

dsattn_status dsattn_st_open(dsattn_st_file **out, const char *path, char *err,
                             size_t errlen)
{
    if (!out || !path)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "dsattn_st_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsattn_errf(err, errlen, errno == ENOENT ? DSATTN_ERR_NOT_FOUND
                                                        : DSATTN_ERR_IO,
                           "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: not a regular file",
                           path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW, "%s: too large", path);
    }
    dsattn_st_file *f;
    if (st_new(&f, path) != DSATTN_OK) {
        close(fd);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    f->len = (size_t)sb.st_size;
    static const uint8_t empty[1];
    f->base = empty;
    if (f->len > 0) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            dsattn_status st = dsattn_errf(err, errlen, DSATTN_ERR_IO,
                                           "%s: mmap failed: %s", path,
                                           strerror(errno));
            close(fd);
            st_free(f);
            return st;
        }
        f->map = m;
        f->base = m;
    }
    close(fd);
    dsattn_status st = st_parse(f, err, errlen);
    if (st != DSATTN_OK) {
        st_free(f);
        return st;
    }
    *out = f;
    return DSATTN_OK;
}

size_t dsattn_st_count(const dsattn_st_file *f) { return f ? f->n : 0; }

const dsattn_st_tensor *dsattn_st_at(const dsattn_st_file *f, size_t i)
{
    return f && i < f->n ? &f->t[i] : NULL;
}

size_t dsattn_name_bsearch(const char *key, size_t n,
                           const char *(*name)(const void *list, size_t i), const void *list)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(key, name(list, mid));
        if (c == 0) return mid;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return n;
}

static const char *tensor_name(const void *list, size_t i)
{
    const dsattn_st_file *f = list;
    return f->t[f->by_name[i]].name;
}

static const char *meta_key(const void *list, size_t i)
{
    return ((const dsattn_st_file *)list)->meta_k[i];
}

const dsattn_st_tensor *dsattn_st_find(const dsattn_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    size_t i = dsattn_name_bsearch(name, f->n, tensor_name, f);
    return i < f->n ? &f->t[f->by_name[i]] : NULL;
}

const char *dsattn_st_meta(const dsattn_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    size_t i = dsattn_name_bsearch(key, f->n_meta, meta_key, f);
    return i < f->n_meta ? f->meta_v[i] : NULL;
}

size_t dsattn_st_meta_count(const dsattn_st_file *f) { return f ? f->n_meta : 0; }

const char *dsattn_st_meta_at(const dsattn_st_file *f, size_t i, const char **value)
{
    if (!f || i >= f->n_meta) return NULL;
    if (value) *value = f->meta_v[i];
    return f->meta_k[i];
}

const char *dsattn_st_path(const dsattn_st_file *f) { return f ? f->path : NULL; }
const uint8_t *dsattn_st_base(const dsattn_st_file *f) { return f ? f->base : NULL; }
size_t dsattn_st_size(const dsattn_st_file *f) { return f ? f->len : 0; }

/* Unaligned little-endian element loads (tensor data is not aligned). */
static uint16_t ld_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static int32_t ld_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static int64_t ld_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

dsattn_status dsattn_st_to_f32(const dsattn_st_tensor *t, float *out, size_t n)
{
    if (!t || (!out && n) || n != t->numel) return DSATTN_ERR_INVALID_ARG;
    if (n == 0) return DSATTN_OK;
    const uint8_t *p = t->data;
    /* Element loads go through memcpy: tensor data is not aligned. */
    switch (t->dtype) {
    case DSATTN_DT_F32:
        memcpy(out, p, n * 4);
        break;
    case DSATTN_DT_F16:
        for (size_t i = 0; i < n; i++) out[i] = dsattn_f16_to_f32(ld_u16(p + 2 * i));
        break;
    case DSATTN_DT_BF16:
        for (size_t i = 0; i < n; i++) out[i] = dsattn_bf16_to_f32(ld_u16(p + 2 * i));
        break;
    case DSATTN_DT_F8_E4M3:
        for (size_t i = 0; i < n; i++) out[i] = dsattn_e4m3_to_f32(p[i]);
        break;
    case DSATTN_DT_F8_E8M0:
        for (size_t i = 0; i < n; i++) out[i] = dsattn_ue8m0_to_f32(p[i]);
        break;
    case DSATTN_DT_I8:
        for (size_t i = 0; i < n; i++) out[i] = (float)(int8_t)p[i];
        break;
    case DSATTN_DT_U8:
        for (size_t i = 0; i < n; i++) out[i] = (float)p[i];
        break;
    case DSATTN_DT_I32:
        for (size_t i = 0; i < n; i++) out[i] = (float)ld_i32(p + 4 * i);
        break;
    case DSATTN_DT_I64:
        for (size_t i = 0; i < n; i++) out[i] = (float)ld_i64(p + 8 * i);
        break;
    default:
        return DSATTN_ERR_UNSUPPORTED;
    }
    return DSATTN_OK;
}

/* ==== Writer ============================================================ */

typedef struct {
    char        *name;
    dsattn_dtype dtype;
    int          ndim;
    int64_t      shape[DSATTN_ST_MAX_NDIM];
    size_t       nbytes;
    uint8_t     *data;   /* NULL when nbytes == 0 */
} st_wentry;

struct dsattn_st_writer {
    st_wentry *e;
    size_t     n, cap;
    char     **mk, **mv;
    size_t     nm, mcap;
    size_t     data_bytes;
};

dsattn_st_writer *dsattn_st_writer_create(void)
{
    return calloc(1, sizeof(dsattn_st_writer));
}

void dsattn_st_writer_destroy(dsattn_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    for (size_t i = 0; i < w->nm; i++) {
        free(w->mk[i]);
        free(w->mv[i]);
    }
    free(w->e);
    free(w->mk);
    free(w->mv);
    free(w);
}

dsattn_status dsattn_st_writer_add(dsattn_st_writer *w, const char *name,
                                   dsattn_dtype dtype, int ndim,
                                   const int64_t *shape, const void *data)
{
    if (!w || !name || !name[0] || ndim < 0 || ndim > DSATTN_ST_MAX_NDIM ||
        (ndim > 0 && !shape) || dsattn_dtype_bits(dtype) == 0 ||
        strcmp(name, "__metadata__") == 0)
        return DSATTN_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0) return DSATTN_ERR_INVALID_ARG;
    size_t numel = 1, nbytes;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return DSATTN_ERR_INVALID_ARG;
        if ((uint64_t)shape[d] > SIZE_MAX ||
            !dsattn_mul_size(numel, (size_t)shape[d], &numel))
            return DSATTN_ERR_OVERFLOW;
    }
    dsattn_status nb = dsattn_dtype_nbytes(dtype, numel, &nbytes);
    if (nb == DSATTN_ERR_FORMAT) return DSATTN_ERR_INVALID_ARG;   /* partial byte */
    if (nb != DSATTN_OK || !dsattn_add_size(w->data_bytes, nbytes, &w->data_bytes))
        return DSATTN_ERR_OVERFLOW;
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 16;
        st_wentry *ne = realloc(w->e, nc * sizeof *ne);
        if (!ne) return DSATTN_ERR_NOMEM;
        w->e = ne;
        w->cap = nc;
    }
    st_wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return DSATTN_ERR_NOMEM;
    if (nbytes) {
        e->data = malloc(nbytes);
        if (!e->data) {
            free(e->name);
            return DSATTN_ERR_NOMEM;
        }
        if (data) memcpy(e->data, data, nbytes);
        else memset(e->data, 0, nbytes);
    }
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->nbytes = nbytes;
    w->n++;
    return DSATTN_OK;
}

dsattn_status dsattn_st_writer_meta(dsattn_st_writer *w, const char *key,
                                    const char *value)
{
    if (!w || !key || !value) return DSATTN_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->nm; i++) {
        if (strcmp(w->mk[i], key) == 0) {     /* last value wins */
            char *v = strdup(value);
            if (!v) return DSATTN_ERR_NOMEM;
            free(w->mv[i]);
            w->mv[i] = v;
            return DSATTN_OK;
        }
    }
    if (w->nm == w->mcap) {
        size_t nc = w->mcap ? 2 * w->mcap : 8;
        char **a = realloc(w->mk, nc * sizeof *a);
        if (!a) return DSATTN_ERR_NOMEM;
        w->mk = a;
        char **b = realloc(w->mv, nc * sizeof *b);
        if (!b) return DSATTN_ERR_NOMEM;
        w->mv = b;
        w->mcap = nc;
    }
    w->mk[w->nm] = strdup(key);
    w->mv[w->nm] = strdup(value);
    if (!w->mk[w->nm] || !w->mv[w->nm]) {
        free(w->mk[w->nm]);
        free(w->mv[w->nm]);
        return DSATTN_ERR_NOMEM;
    }
    w->nm++;
    return DSATTN_OK;
}

size_t dsattn_st_writer_data_bytes(const dsattn_st_writer *w)
{
    return w ? w->data_bytes : 0;
}

/* A growable string: header JSON is written by hand (not cJSON_Print) so
 * offsets print as exact integers, never as 1e+15. */
typedef struct {
    char  *p;
    size_t n, cap;
    int    oom;
} st_sb;

static void sb_put(st_sb *s, const char *b, size_t k)
{
    if (s->oom) return;
    if (s->n + k + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 256;
        while (nc < s->n + k + 1) nc *= 2;
        char *np = realloc(s->p, nc);
        if (!np) {
            s->oom = 1;
            return;
        }
        s->p = np;
        s->cap = nc;
    }
    memcpy(s->p + s->n, b, k);
    s->n += k;
    s->p[s->n] = '\0';
}

static void sb_printf(st_sb *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(st_sb *s, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k > 0) sb_put(s, buf, (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1);
}

static void sb_jstr(st_sb *s, const char *str)
{
    sb_put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = { '\\', (char)*c };
            sb_put(s, e, 2);
        } else if (*c < 0x20) {
            sb_printf(s, "\\u%04x", *c);
        } else {
            sb_put(s, (const char *)c, 1);
        }
    }
    sb_put(s, "\"", 1);
}

dsattn_status dsattn_st_writer_save(dsattn_st_writer *w, const char *path,
                                    char *err, size_t errlen)
{
    if (!w || !path)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "dsattn_st_writer_save: NULL argument");
    st_sb s = { 0 };
    sb_put(&s, "{", 1);
    int first = 1;
    if (w->nm) {
        sb_put(&s, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < w->nm; i++) {
            if (i) sb_put(&s, ",", 1);
            sb_jstr(&s, w->mk[i]);
            sb_put(&s, ":", 1);
            sb_jstr(&s, w->mv[i]);
        }
        sb_put(&s, "}", 1);
        first = 0;
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_wentry *e = &w->e[i];
        if (!first) sb_put(&s, ",", 1);
        first = 0;
        sb_jstr(&s, e->name);
        sb_printf(&s, ":{\"dtype\":\"%s\",\"shape\":[", dsattn_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++)
            sb_printf(&s, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        sb_printf(&s, "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
        off += e->nbytes;
    }
    sb_put(&s, "}", 1);
    /* Pad with spaces so the data section starts 8-byte aligned. */
    while (!s.oom && (8 + s.n) % 8 != 0) sb_put(&s, " ", 1);
    if (s.oom) {
        free(s.p);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }

    /* Write to a temporary and rename: a crashed writer never leaves a
     * half-written file under the final name. */
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 8);
    if (!tmp) {
        free(s.p);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        dsattn_status st = dsattn_errf(err, errlen, DSATTN_ERR_IO,
                                       "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        free(s.p);
        return st;
    }
    uint8_t lenb[8];
    uint64_t hl = s.n;
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(hl >> (8 * i));
    int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(s.p, 1, s.n, fp) == s.n;
    for (size_t i = 0; ok && i < w->n; i++)
        if (w->e[i].nbytes)
            ok = fwrite(w->e[i].data, 1, w->e[i].nbytes, fp) == w->e[i].nbytes;
    if (fclose(fp) != 0) ok = 0;
    free(s.p);
    if (!ok || rename(tmp, path) != 0) {
        dsattn_status st = dsattn_errf(err, errlen, DSATTN_ERR_IO,
                                       "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return DSATTN_OK;
}
