/* session.c - the session file format: writing a header and a list of
 * sections atomically, validating a whole image before anything is
 * restored, restoring and cloning through the same section lists, and the
 * canonical model hashes.
 *
 * Layout (little-endian; docs/sessions.md is the reader's description):
 *   header   128 B  magic "DSATTNSS", format, header size, library version,
 *                   generation, variant[2], section count, config hash,
 *                   shapes hash, position, capacity, file size, zeros,
 *                   XXH3-64 of the 120 bytes before it
 *   section  name[40] (NUL padded), u64 length, the bytes, XXH3-64 of
 *            name + length + bytes
 *   trailer  magic "DSATTNSE", XXH3-64 of every byte of the file before it
 * Checksums are xxHash's XXH3-64 (libxxhash), not a hand-written one.
 *
 * Saving writes `<path>.tmp-<pid>` in the same folder, fsyncs it, renames
 * it over `path` and fsyncs the folder, so a process killed at any moment
 * leaves either the previous file or the new one (and at worst a stale
 * temporary, which nothing reads).
 */
#define XXH_STATIC_LINKING_ONLY
#include "session.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static const char MAGIC[8] = { 'D', 'S', 'A', 'T', 'T', 'N', 'S', 'S' };
static const char MAGIC_END[8] = { 'D', 'S', 'A', 'T', 'T', 'N', 'S', 'E' };

/* ==== Little-endian fields ============================================= */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
void dsattn_sess_put_i64(uint8_t *p, int64_t v) { put_u64(p, (uint64_t)v); }
int64_t dsattn_sess_get_i64(const uint8_t *p) { return (int64_t)get_u64(p); }

/* Raw sections (fp32 state, int32 rows) are host bytes: little-endian hosts only. */
static int host_le(void)
{
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

const char *dsattn_sess_gen_name(uint32_t g)
{
    switch (g) {
    case DSATTN_SESSION_MHA: return "mha";
    case DSATTN_SESSION_MLA: return "mla";
    case DSATTN_SESSION_V4:  return "v4";
    case DSATTN_SESSION_V41: return "v41";
    }
    return "?";
}

/* ==== Section lists ==================================================== */

dsattn_sess_sec *dsattn_sess_add(dsattn_sess_list *l, void *mem, size_t bytes,
                                 const char *fmt, ...)
{
    if (l->failed) return NULL;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        dsattn_sess_sec *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) { l->failed = 1; return NULL; }
        l->v = nv;
        l->cap = nc;
    }
    dsattn_sess_sec *s = &l->v[l->n];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof s->name) { l->failed = 1; return NULL; }
    s->mem = mem;
    s->bytes = bytes;
    l->n++;
    return s;
}

void dsattn_sess_list_free(dsattn_sess_list *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ==== Header =========================================================== */

static void header_encode(const dsattn_sess_header *h, uint8_t b[DSATTN_SESS_HEADER])
{
    memset(b, 0, DSATTN_SESS_HEADER);
    memcpy(b, MAGIC, 8);
    put_u32(b + 8, h->format);
    put_u32(b + 12, DSATTN_SESS_HEADER);
    memcpy(b + 16, h->lib_version, 15);
    put_u32(b + 32, h->generation);
    put_u32(b + 36, h->variant[0]);
    put_u32(b + 40, h->variant[1]);
    put_u32(b + 44, h->n_sections);
    put_u64(b + 48, h->config_hash);
    put_u64(b + 56, h->shapes_hash);
    put_u64(b + 64, (uint64_t)h->pos);
    put_u64(b + 72, h->capacity);
    put_u64(b + 80, h->file_bytes);
    put_u64(b + 120, XXH3_64bits(b, 120));
}

/* ==== Saving =========================================================== */

typedef struct {
    int          fd;
    XXH3_state_t file, sec;
    uint8_t     *buf;              /* small writes are gathered here */
    size_t       used, cap;
    int          failed;           /* errno of the first failure     */
} writer;

static void w_flush(writer *w)
{
    size_t done = 0;
    while (!w->failed && done < w->used) {
        ssize_t k = write(w->fd, w->buf + done, w->used - done);
        if (k < 0) {
            if (errno == EINTR) continue;
            w->failed = errno ? errno : EIO;
        } else {
            done += (size_t)k;
        }
    }
    w->used = 0;
}

/* Append bytes: hashed into the file (and, if in_sec, the section) state. */
static void w_put(writer *w, const void *p, size_t n, int in_sec)
{
    const uint8_t *b = p;
    while (n && !w->failed) {
        /* large runs are hashed and written straight from the sequence in
         * chunks that stay in cache between the two hashes and the write */
        size_t k = DSATTN_MIN(n, (size_t)1 << 20);
        XXH3_64bits_update(&w->file, b, k);
        if (in_sec) XXH3_64bits_update(&w->sec, b, k);
        if (k >= w->cap / 2) {
            w_flush(w);
            size_t done = 0;
            while (!w->failed && done < k) {
                ssize_t r = write(w->fd, b + done, k - done);
                if (r < 0) {
                    if (errno == EINTR) continue;
                    w->failed = errno ? errno : EIO;
                } else {
                    done += (size_t)r;
                }
            }
        } else {
            if (w->used + k > w->cap) w_flush(w);
            memcpy(w->buf + w->used, b, k);
            w->used += k;
        }
        b += k;
        n -= k;
    }
}

static int fsync_dir_of(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

dsattn_status dsattn_sess_save(const char *path, dsattn_sess_header *h,
                               const dsattn_sess_list *l, char *err, size_t errlen)
{
    if (!path || !h || !l) return DSATTN_ERR_INVALID_ARG;
    if (!host_le())
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: sessions are little-endian; this host is not", path);
    if (l->failed) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: section list", path);
    size_t total = DSATTN_SESS_HEADER + DSATTN_SESS_TRAILER, big = 0;
    for (size_t i = 0; i < l->n; i++) {
        size_t t;
        if (!dsattn_add_size(l->v[i].bytes, DSATTN_SESS_SEC_HEAD + 8, &t) ||
            !dsattn_add_size(total, t, &total))
            return dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW, "%s: session size overflows", path);
        if (!l->v[i].mem) big = DSATTN_MAX(big, l->v[i].bytes);
    }
    h->format = DSATTN_SESS_FORMAT;
    memset(h->lib_version, 0, sizeof h->lib_version);
    snprintf(h->lib_version, sizeof h->lib_version, "%s", dsattn_version());
    h->n_sections = (uint32_t)l->n;
    h->file_bytes = total;
    if (l->n > UINT32_MAX)
        return dsattn_errf(err, errlen, DSATTN_ERR_OVERFLOW, "%s: too many sections", path);

    char tmp[4200];
    int k = snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    if (k < 0 || (size_t)k >= sizeof tmp)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "%s: path too long", path);
    writer w;
    memset(&w, 0, sizeof w);
    w.cap = (size_t)1 << 20;
    w.buf = malloc(w.cap);
    uint8_t *gath = big ? malloc(big) : NULL;
    if (!w.buf || (big && !gath)) {
        free(w.buf);
        free(gath);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory", path);
    }
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        int e = errno;
        free(w.buf);
        free(gath);
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: cannot create: %s", tmp, strerror(e));
    }
    XXH3_64bits_reset(&w.file);

    uint8_t hb[DSATTN_SESS_HEADER];
    header_encode(h, hb);
    w_put(&w, hb, sizeof hb, 0);
    for (size_t i = 0; i < l->n && !w.failed; i++) {
        const dsattn_sess_sec *s = &l->v[i];
        uint8_t sh[DSATTN_SESS_SEC_HEAD] = { 0 };
        memcpy(sh, s->name, strnlen(s->name, DSATTN_SESS_NAME - 1));
        put_u64(sh + DSATTN_SESS_NAME, s->bytes);
        XXH3_64bits_reset(&w.sec);
        w_put(&w, sh, sizeof sh, 1);
        if (s->bytes) {
            const void *src = s->mem;
            if (!src) {
                s->gather(s, gath);
                src = gath;
            }
            w_put(&w, src, s->bytes, 1);
        }
        uint8_t cs[8];
        put_u64(cs, XXH3_64bits_digest(&w.sec));
        w_put(&w, cs, 8, 0);
    }
    uint8_t tr[DSATTN_SESS_TRAILER];
    memcpy(tr, MAGIC_END, 8);
    w_put(&w, tr, 8, 0);
    put_u64(tr + 8, XXH3_64bits_digest(&w.file));
    w_put(&w, tr + 8, 8, 0);
    w_flush(&w);
    free(w.buf);
    free(gath);
    if (!w.failed && fsync(w.fd) != 0) w.failed = errno ? errno : EIO;
    if (close(w.fd) != 0 && !w.failed) w.failed = errno ? errno : EIO;
    if (!w.failed && rename(tmp, path) != 0) w.failed = errno ? errno : EIO;
    if (w.failed) {
        unlink(tmp);
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: write failed: %s", path,
                           strerror(w.failed));
    }
    if (fsync_dir_of(path) != 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: saved, but fsync of its folder "
                           "failed: %s", path, strerror(errno));
    return DSATTN_OK;
}

/* ==== Parsing ========================================================== */

#define FAIL(...) do { st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)

void dsattn_sess_file_free(dsattn_sess_file *f)
{
    if (!f) return;
    free(f->off);
    free(f->sz);
    free(f->names);
    f->off = f->sz = NULL;
    f->names = NULL;
}

dsattn_status dsattn_sess_parse(dsattn_sess_file *f, const void *bufv, size_t len,
                                const char *name, char *err, size_t errlen)
{
    if (!f) return DSATTN_ERR_INVALID_ARG;
    memset(f, 0, sizeof *f);
    if (!name) name = "<buffer>";
    f->name = name;
    f->buf = bufv;
    f->len = len;
    const uint8_t *b = bufv;
    dsattn_status st;
    if (!host_le())
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                           "%s: sessions are little-endian; this host is not", name);
    if (!b && len) return DSATTN_ERR_INVALID_ARG;
    if (len < 8 || memcmp(b, MAGIC, 8) != 0) {
        if (len < 8) FAIL("%s: not a dsattn session (%zu bytes, no magic)", name, len);
        FAIL("%s: not a dsattn session (bad magic)", name);
    }
    if (len < DSATTN_SESS_HEADER)
        FAIL("%s: truncated: %zu bytes, the header alone is %d", name, len, DSATTN_SESS_HEADER);
    dsattn_sess_header *h = &f->h;
    h->format = get_u32(b + 8);
    if (h->format != DSATTN_SESS_FORMAT)
        FAIL("%s: session format %u, this library reads format %d", name, (unsigned)h->format,
             DSATTN_SESS_FORMAT);
    if (get_u64(b + 120) != XXH3_64bits(b, 120)) FAIL("%s: header: checksum mismatch", name);
    if (get_u32(b + 12) != DSATTN_SESS_HEADER)
        FAIL("%s: header: size %u, want %d", name, (unsigned)get_u32(b + 12), DSATTN_SESS_HEADER);
    for (int i = 88; i < 120; i++)
        if (b[i]) FAIL("%s: header: reserved byte %d is not zero", name, i);
    memcpy(h->lib_version, b + 16, 16);
    h->lib_version[15] = 0;
    h->generation = get_u32(b + 32);
    h->variant[0] = get_u32(b + 36);
    h->variant[1] = get_u32(b + 40);
    h->n_sections = get_u32(b + 44);
    h->config_hash = get_u64(b + 48);
    h->shapes_hash = get_u64(b + 56);
    h->pos = (int64_t)get_u64(b + 64);
    h->capacity = get_u64(b + 72);
    h->file_bytes = get_u64(b + 80);
    if (h->file_bytes != len)
        FAIL("%s: %s: the header says %llu bytes, the file has %zu", name,
             len < h->file_bytes ? "truncated" : "trailing bytes",
             (unsigned long long)h->file_bytes, len);
    if (h->pos < 0 || (uint64_t)h->pos > h->capacity)
        FAIL("%s: header: position %lld outside capacity %llu", name, (long long)h->pos,
             (unsigned long long)h->capacity);
    const size_t min_sec = DSATTN_SESS_SEC_HEAD + 8;
    if (h->n_sections > (len - DSATTN_SESS_HEADER) / min_sec)
        FAIL("%s: header: %u sections cannot fit in %zu bytes", name, (unsigned)h->n_sections, len);
    const size_t ns = h->n_sections;
    f->off = malloc((ns + 1) * sizeof *f->off);
    f->sz = malloc((ns + 1) * sizeof *f->sz);
    f->names = malloc((ns + 1) * sizeof *f->names);
    if (!f->off || !f->sz || !f->names) {
        st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    size_t at = DSATTN_SESS_HEADER;
    for (size_t i = 0; i < ns; i++) {
        if (len - at < min_sec + DSATTN_SESS_TRAILER)
            FAIL("%s: section #%zu at offset %zu: truncated (%zu bytes left)", name, i, at,
                 len - at);
        const uint8_t *sh = b + at;
        size_t nl = strnlen((const char *)sh, DSATTN_SESS_NAME);
        if (nl == 0 || nl == DSATTN_SESS_NAME)
            FAIL("%s: section #%zu at offset %zu: name is empty or not terminated", name, i, at);
        for (size_t k = 0; k < DSATTN_SESS_NAME; k++) {
            unsigned char ch = sh[k];
            if (k < nl ? (ch < 0x21 || ch > 0x7e) : ch != 0)
                FAIL("%s: section #%zu at offset %zu: bad byte in its name", name, i, at);
        }
        memcpy(f->names[i], sh, DSATTN_SESS_NAME);
        uint64_t sl = get_u64(sh + DSATTN_SESS_NAME);
        size_t left = len - at - min_sec - DSATTN_SESS_TRAILER;
        if (sl > left)
            FAIL("%s: section '%s': length %llu exceeds the %zu bytes left in the file", name,
                 f->names[i], (unsigned long long)sl, left);
        uint64_t want = get_u64(sh + DSATTN_SESS_SEC_HEAD + sl);
        if (XXH3_64bits(sh, DSATTN_SESS_SEC_HEAD + (size_t)sl) != want)
            FAIL("%s: section '%s': checksum mismatch (corrupted)", name, f->names[i]);
        f->off[i] = at + DSATTN_SESS_SEC_HEAD;
        f->sz[i] = (size_t)sl;
        at += min_sec + (size_t)sl;
    }
    if (len - at != DSATTN_SESS_TRAILER)
        FAIL("%s: %zu bytes after the last of %zu sections, want the %d-byte trailer", name,
             len - at, ns, DSATTN_SESS_TRAILER);
    if (memcmp(b + at, MAGIC_END, 8) != 0) FAIL("%s: trailer: bad magic", name);
    if (XXH3_64bits(b, at + 8) != get_u64(b + at + 8))
        FAIL("%s: trailer: whole-file checksum mismatch", name);
    return DSATTN_OK;
fail:
    dsattn_sess_file_free(f);
    return st;
}

long dsattn_sess_find(const dsattn_sess_file *f, const char *name)
{
    for (size_t i = 0; i < f->h.n_sections; i++)
        if (!strncmp(f->names[i], name, DSATTN_SESS_NAME)) return (long)i;
    return -1;
}

dsattn_status dsattn_sess_check_model(const dsattn_sess_file *f, uint32_t generation,
                                      uint64_t config_hash, uint64_t shapes_hash,
                                      char *err, size_t errlen)
{
    dsattn_status st;
    if (f->h.generation != generation)
        FAIL("%s: a %s session, not %s", f->name, dsattn_sess_gen_name(f->h.generation),
             dsattn_sess_gen_name(generation));
    if (f->h.config_hash != config_hash)
        FAIL("%s: saved from another model config (config hash %016llx, this model %016llx)",
             f->name, (unsigned long long)f->h.config_hash, (unsigned long long)config_hash);
    if (f->h.shapes_hash != shapes_hash)
        FAIL("%s: saved from a model with other weight shapes or dtypes (shapes hash %016llx, "
             "this model %016llx)", f->name, (unsigned long long)f->h.shapes_hash,
             (unsigned long long)shapes_hash);
    return DSATTN_OK;
fail:
    return st;
}

dsattn_status dsattn_sess_restore(const dsattn_sess_file *f, const dsattn_sess_list *l,
                                  char *err, size_t errlen)
{
    dsattn_status st;
    if (l->failed) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "%s: out of memory", f->name);
    if (f->h.n_sections != l->n)
        FAIL("%s: %u sections, a sequence at position %lld has %zu", f->name,
             (unsigned)f->h.n_sections, (long long)f->h.pos, l->n);
    for (size_t i = 0; i < l->n; i++) {
        if (strncmp(f->names[i], l->v[i].name, DSATTN_SESS_NAME))
            FAIL("%s: section #%zu is '%s', want '%s'", f->name, i, f->names[i], l->v[i].name);
        if (f->sz[i] != l->v[i].bytes)
            FAIL("%s: section '%s': %zu bytes, the header's position and the model give %zu",
                 f->name, f->names[i], f->sz[i], l->v[i].bytes);
    }
    for (size_t i = 0; i < l->n; i++) {
        const dsattn_sess_sec *s = &l->v[i];
        if (!s->bytes) continue;
        if (s->mem) memcpy(s->mem, f->buf + f->off[i], s->bytes);
        else s->scatter(s, f->buf + f->off[i]);
    }
    return DSATTN_OK;
fail:
    return st;
}

dsattn_status dsattn_sess_copy(const dsattn_sess_list *dst, const dsattn_sess_list *src)
{
    if (dst->failed || src->failed) return DSATTN_ERR_NOMEM;
    if (dst->n != src->n) return DSATTN_ERR_INVALID_ARG;
    size_t big = 0;
    for (size_t i = 0; i < src->n; i++) {
        if (strcmp(dst->v[i].name, src->v[i].name) || dst->v[i].bytes != src->v[i].bytes)
            return DSATTN_ERR_INVALID_ARG;
        if (!src->v[i].mem || !dst->v[i].mem) big = DSATTN_MAX(big, src->v[i].bytes);
    }
    uint8_t *tmp = big ? malloc(big) : NULL;
    if (big && !tmp) return DSATTN_ERR_NOMEM;
    for (size_t i = 0; i < src->n; i++) {
        const dsattn_sess_sec *s = &src->v[i], *d = &dst->v[i];
        if (!s->bytes) continue;
        const void *from = s->mem;
        if (!from) { s->gather(s, tmp); from = tmp; }
        if (d->mem) memcpy(d->mem, from, s->bytes);
        else d->scatter(d, from);
    }
    free(tmp);
    return DSATTN_OK;
}

/* ==== Mapping ========================================================== */

dsattn_status dsattn_sess_map_file(dsattn_sess_map *m, const char *path, char *err,
                                   size_t errlen)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: cannot open: %s", path,
                           strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: not a regular file", path);
    }
    m->len = (size_t)sb.st_size;
    if (m->len) {
        void *p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        }
        (void)madvise(p, m->len, MADV_SEQUENTIAL | MADV_WILLNEED);
        m->base = p;
    }
    close(fd);
    return DSATTN_OK;
}

void dsattn_sess_unmap(dsattn_sess_map *m)
{
    if (m->base) munmap(m->base, m->len);
    memset(m, 0, sizeof *m);
}

/* ==== Canonical hashes ================================================= */

struct dsattn_sess_canon {
    XXH3_state_t st;
};

dsattn_sess_canon *dsattn_sess_canon_new(void)
{
    dsattn_sess_canon *c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
    if (c) XXH3_64bits_reset(&c->st);
    return c;
}

static void canon_line(dsattn_sess_canon *c, const char *key, const char *val)
{
    if (!c) return;
    XXH3_64bits_update(&c->st, key, strlen(key));
    XXH3_64bits_update(&c->st, "=", 1);
    XXH3_64bits_update(&c->st, val, strlen(val));
    XXH3_64bits_update(&c->st, "\n", 1);
}

void dsattn_sess_canon_i(dsattn_sess_canon *c, const char *key, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    canon_line(c, key, b);
}

void dsattn_sess_canon_f(dsattn_sess_canon *c, const char *key, double v)
{
    char b[64];
    snprintf(b, sizeof b, "%a", v);      /* exact: hexadecimal float */
    canon_line(c, key, b);
}

void dsattn_sess_canon_w(dsattn_sess_canon *c, const char *key, const dsattn_weight *w)
{
    static const char *kind[] = { "f32", "bf16", "fp8", "fp4" };
    char b[96];
    if (!w || !w->data) snprintf(b, sizeof b, "absent");
    else
        snprintf(b, sizeof b, "%s[%zu,%zu]/%zu", (unsigned)w->kind < 4 ? kind[w->kind] : "?",
                 w->rows, w->cols, w->kind == DSATTN_W_FP8 ? w->block : (size_t)0);
    canon_line(c, key, b);
}

void dsattn_sess_canon_v(dsattn_sess_canon *c, const char *key, const void *p, size_t n)
{
    char b[48];
    if (!p) snprintf(b, sizeof b, "absent");
    else snprintf(b, sizeof b, "f32[%zu]", n);
    canon_line(c, key, b);
}

uint64_t dsattn_sess_canon_done(dsattn_sess_canon *c)
{
    if (!c) return 0;
    uint64_t h = XXH3_64bits_digest(&c->st);
    free(c);
    return h;
}
