/* checkpoint.c - open a checkpoint (file, shard index or folder), map its
 * names to inference names, hand out weight descriptors, bind a model's
 * tensors (the one binder every generation's loader uses), and validate it
 * against its config.  See checkpoint.h for the contract.
 *
 * Owns: the shard set, the name table, the decoding of scale tensors, the
 * few conversions the loader is allowed to make.  Weights are never copied
 * unless converted (or unless an F32/BF16 tensor sits at an address its
 * element type cannot be read from, which safetensors allows).
 *
 * Deliberately not here: safetensors parsing (safetensors.c), config
 * parsing (config.c), name rules (names.c), the random writer (mkweights.c).
 */
#include "checkpoint.h"

#include "internal.h"
#include "jsoncfg.h"
#include "names.h"
#include "numfmt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <sys/stat.h>

typedef struct {
    char                   *name;      /* inference name (owned)          */
    const char             *stored;    /* borrowed from the tensor        */
    size_t                  file;
    const dsattn_st_tensor *t;
} ck_entry;

struct dsattn_ckpt {
    char                *layout;
    dsattn_st_file     **files;
    char               **paths;
    size_t               n_files;
    ck_entry            *e;          /* file order                      */
    size_t               n;
    size_t              *by_name;    /* indices into e, sorted by name  */
    dsattn_ckpt_entry   *pub;        /* public view of e                */
    dsattn_model_config  cfg;
    int                  has_cfg;
    char                *cfg_path;
};

/* ==== paths ============================================================= */

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (k == 0 || p[k - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static char *path_dir(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    if (s == path) return strdup("/");
    size_t n = (size_t)(s - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* "model{rank}-mp{world}.safetensors", the names the official convert.py
 * writes (and generate.py reads): 1 on a match, with rank and world. */
static int parse_mp_name(const char *name, unsigned long *rank, unsigned long *world)
{
    const char *p = name;
    if (strncmp(p, "model", 5)) return 0;
    p += 5;
    unsigned long v[2] = { 0, 0 };
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            if (strncmp(p, "-mp", 3)) return 0;
            p += 3;
        }
        if (*p < '0' || *p > '9') return 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (v[k] > 100000) return 0;
            v[k] = v[k] * 10 + (unsigned long)(*p - '0');
        }
    }
    if (strcmp(p, ".safetensors")) return 0;
    *rank = v[0];
    *world = v[1];
    return 1;
}

/* A folder without model.safetensors(.index.json): the official converted
 * layout (model0-mp1.safetensors), the one *.safetensors file it holds, or
 * a trace case (weights.safetensors beside input.safetensors and the
 * expected outputs: tests/data/golden/README.md).  *out is the file to
 * open; errors say what was found and what to do. */
static dsattn_status find_folder_weights(const char *path, char **out, const char **layout,
                                         char *err, size_t errlen)
{
    *out = NULL;
    DIR *d = opendir(path);
    if (!d)
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: cannot list the folder: %s", path,
                           strerror(errno));
    char *single = NULL, *mp1 = NULL;
    size_t n_st = 0, n_mp = 0;
    unsigned long mp_world = 0;
    int mixed = 0, pickles = 0, case_w = 0, case_in = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if (ends_with(nm, ".bin") || ends_with(nm, ".pt") || ends_with(nm, ".pth")) pickles = 1;
        if (!ends_with(nm, ".safetensors")) continue;
        char *full = path_join(path, nm);
        if (!full) {
            free(single);
            free(mp1);
            closedir(d);
            return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        }
        if (!is_file(full)) {
            free(full);
            continue;
        }
        n_st++;
        case_w |= !strcmp(nm, "weights.safetensors");
        case_in |= !strcmp(nm, "input.safetensors");
        unsigned long r = 0, w = 0;
        if (parse_mp_name(nm, &r, &w)) {
            if (n_mp++ && w != mp_world) mixed = 1;
            mp_world = w;
            if (w == 1 && r == 0) {
                free(mp1);
                mp1 = full;
                full = NULL;
            }
        }
        if (full) {
            free(single);
            single = full;
        }
    }
    closedir(d);
    dsattn_status st = DSATTN_OK;
    if (mp1 && !mixed) {
        *out = mp1;
        mp1 = NULL;
        *layout = "folder (model0-mp1.safetensors, convert.py layout)";
    } else if (n_mp && !mixed && mp_world > 1) {
        /* convert.py splits column-parallel weights (wq_b, wkv_b, ...)
         * along dim 0 and row-parallel ones (wo, ...) along dim 1, with their
         * FP8 scale grids, and replicates the rest; dsattn reads one
         * unsplit set instead of re-deriving those rules per generation. */
        st = dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                         "%s: holds model{rank}-mp%lu.safetensors, a checkpoint split for %lu "
                         "model-parallel ranks by convert.py; dsattn reads mp 1: rerun "
                         "convert.py --hf-ckpt-path <HF folder> --save-path <out> "
                         "--n-experts <n> --model-parallel 1, or point dsattn at the HF "
                         "folder itself (model.safetensors.index.json)",
                         path, mp_world, mp_world);
    } else if (n_st == 1 && single) {
        *out = single;
        single = NULL;
        *layout = "folder (one .safetensors file)";
    } else if (case_w && case_in && !n_mp) {
        *out = path_join(path, "weights.safetensors");
        if (!*out) st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        *layout = "folder (a trace case: weights.safetensors)";
    } else if (n_st == 0) {
        /* PyTorch pickles (pytorch_model-*.bin) are programs, not data:
         * never unpickled here */
        st = dsattn_errf(err, errlen, DSATTN_ERR_NOT_FOUND,
                         "%s: folder holds no .safetensors file (looked for "
                         "model.safetensors.index.json, model.safetensors, "
                         "model0-mp1.safetensors, or any one *.safetensors)%s", path,
                         pickles ? "; it holds PyTorch pickles (.bin / .pt), which dsattn does "
                                   "not read: save them as safetensors first (transformers: "
                                   "model.save_pretrained(dir, safe_serialization=True))"
                                 : "");
    } else {
        st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                         "%s: folder holds %zu .safetensors files%s but no "
                         "model.safetensors.index.json: name the file to load, or add the "
                         "index that says which tensor is in which shard", path, n_st,
                         mixed ? " (model{rank}-mp{world} files of different world sizes)"
                               : "");
    }
    free(single);
    free(mp1);
    return st;
}

/* ==== open ============================================================== */

void dsattn_ckpt_close(dsattn_ckpt *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->n; i++) free(ck->e[i].name);
    for (size_t i = 0; i < ck->n_files; i++) {
        dsattn_st_close(ck->files[i]);
        free(ck->paths[i]);
    }
    void *owned[] = { ck->files, ck->paths, ck->e, ck->by_name, ck->pub, ck->layout,
                      ck->cfg_path, ck };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN(owned); i++) free(owned[i]);
}

static dsattn_status ck_add_file(dsattn_ckpt *ck, const char *path, size_t *idx,
                                 char *err, size_t errlen)
{
    for (size_t i = 0; i < ck->n_files; i++)
        if (strcmp(ck->paths[i], path) == 0) {
            *idx = i;
            return DSATTN_OK;
        }
    dsattn_st_file **nf = realloc(ck->files, (ck->n_files + 1) * sizeof *nf);
    if (!nf) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    ck->files = nf;
    char **np = realloc(ck->paths, (ck->n_files + 1) * sizeof *np);
    if (!np) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    ck->paths = np;
    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open(&f, path, err, errlen);
    if (st != DSATTN_OK) return st;
    ck->paths[ck->n_files] = strdup(path);
    if (!ck->paths[ck->n_files]) {
        dsattn_st_close(f);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    ck->files[ck->n_files] = f;
    *idx = ck->n_files++;
    return DSATTN_OK;
}

static dsattn_status ck_push(dsattn_ckpt *ck, size_t *cap, size_t file,
                             const dsattn_st_tensor *t, char *err, size_t errlen)
{
    if (ck->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 256;
        ck_entry *ne = realloc(ck->e, nc * sizeof *ne);
        if (!ne) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        ck->e = ne;
        *cap = nc;
    }
    char inf[DSATTN_NAME_MAX];
    dsattn_arch a = ck->has_cfg ? ck->cfg.arch : DSATTN_ARCH_V4;
    if (dsattn_name_to_inference(a, t->name, inf, sizeof inf) < 0)
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                           "%s: tensor name '%.60s...' is too long (header byte offset %zu)",
                           ck->paths[file], t->name, (size_t)8);
    ck_entry *e = &ck->e[ck->n];
    e->name = strdup(inf);
    if (!e->name) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    e->stored = t->name;
    e->file = file;
    e->t = t;
    ck->n++;
    return DSATTN_OK;
}

/* Shard file names come from a JSON file we do not trust: plain names
 * only, so an index cannot make us open /etc/... or ../../x. */
static int shard_name_ok(const char *s)
{
    return s[0] && s[0] != '/' && s[0] != '.' && !strstr(s, "/") && strlen(s) < 1024;
}

static dsattn_status ck_open_index(dsattn_ckpt *ck, const char *index_path,
                                   char *err, size_t errlen)
{
    cJSON *root = NULL;
    dsattn_status st = dsattn_jcfg_load(&root, index_path, err, errlen);
    if (st != DSATTN_OK) return st;
    const cJSON *wm = NULL;
    st = dsattn_jcfg_object(root, "weight_map", &wm, err, errlen);
    if (st != DSATTN_OK) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", err ? err : "");
        cJSON_Delete(root);
        return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT, "%s: %s", index_path, tmp);
    }
    char *dir = path_dir(index_path);
    if (!dir) {
        cJSON_Delete(root);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    size_t cap = 0;
    for (const cJSON *c = wm->child; c && st == DSATTN_OK; c = c->next) {
        if (!cJSON_IsString(c) || !shard_name_ok(c->valuestring)) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                             "%s: weight_map entry for tensor '%s' is not a plain shard "
                             "file name", index_path, c->string);
            break;
        }
        char *sp = path_join(dir, c->valuestring);
        if (!sp) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
            break;
        }
        if (!is_file(sp)) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOT_FOUND,
                             "%s: shard '%s' (listed for tensor '%s') is missing: %s",
                             index_path, c->valuestring, c->string, sp);
            free(sp);
            break;
        }
        size_t fi = 0;
        st = ck_add_file(ck, sp, &fi, err, errlen);
        free(sp);
        if (st != DSATTN_OK) break;
        const dsattn_st_tensor *t = dsattn_st_find(ck->files[fi], c->string);
        if (!t) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                             "%s: weight_map puts tensor '%s' in shard '%s', which does "
                             "not contain it", index_path, c->string, c->valuestring);
            break;
        }
        st = ck_push(ck, &cap, fi, t, err, errlen);
    }
    free(dir);
    cJSON_Delete(root);
    return st;
}

static int cmp_file_order(const void *a, const void *b)
{
    const ck_entry *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->t->offset < y->t->offset ? -1 : x->t->offset > y->t->offset;
}

/* Name index: qsort has no context pointer in C11 and we keep no globals,
 * so a small merge sort of indices. */
static void msort_idx(size_t *v, size_t *tmp, size_t n, const ck_entry *e)
{
    if (n < 2) return;
    size_t h = n / 2;
    msort_idx(v, tmp, h, e);
    msort_idx(v + h, tmp, n - h, e);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = strcmp(e[v[i]].name, e[v[j]].name) <= 0 ? v[i++] : v[j++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static dsattn_status ck_build_index(dsattn_ckpt *ck, char *err, size_t errlen)
{
    if (ck->n > 1) qsort(ck->e, ck->n, sizeof *ck->e, cmp_file_order);
    ck->by_name = malloc((ck->n + 1) * sizeof *ck->by_name);
    size_t *tmp = malloc((ck->n + 1) * sizeof *tmp);
    ck->pub = malloc((ck->n + 1) * sizeof *ck->pub);
    if (!ck->by_name || !tmp || !ck->pub) {
        free(tmp);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < ck->n; i++) {
        ck->by_name[i] = i;
        ck->pub[i] = (dsattn_ckpt_entry){ ck->e[i].name, ck->e[i].stored,
                                          ck->paths[ck->e[i].file], ck->e[i].t };
    }
    msort_idx(ck->by_name, tmp, ck->n, ck->e);
    free(tmp);
    for (size_t i = 1; i < ck->n; i++) {
        const ck_entry *a = &ck->e[ck->by_name[i - 1]], *b = &ck->e[ck->by_name[i]];
        if (strcmp(a->name, b->name) == 0)
            return dsattn_errf(err, errlen, DSATTN_ERR_FORMAT,
                               "tensor '%s' (%s, byte offset %zu) and '%s' (%s, byte "
                               "offset %zu) are the same inference tensor '%s'",
                               a->stored, ck->paths[a->file], a->t->offset, b->stored,
                               ck->paths[b->file], b->t->offset, a->name);
    }
    return DSATTN_OK;
}

dsattn_status dsattn_ckpt_open(dsattn_ckpt **out, const char *path,
                               const char *config_path, char *err, size_t errlen)
{
    if (!out || !path)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "NULL argument");
    *out = NULL;
    dsattn_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    dsattn_status st = DSATTN_OK;
    char *weights = NULL, *dir = NULL;
    int index = 0;
    const char *layout = "file";

    if (is_dir(path)) {
        dir = strdup(path);
        char *ip = path_join(path, "model.safetensors.index.json");
        char *sp = path_join(path, "model.safetensors");
        if (!dir || !ip || !sp) {
            free(ip);
            free(sp);
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if (is_file(ip)) {
            weights = ip;
            free(sp);
            index = 1;
            layout = "folder (model.safetensors.index.json)";
        } else if (is_file(sp)) {
            weights = sp;
            free(ip);
            layout = "folder (model.safetensors)";
        } else {
            free(ip);
            free(sp);
            st = find_folder_weights(path, &weights, &layout, err, errlen);
            if (st != DSATTN_OK) goto fail;
        }
    } else {
        weights = strdup(path);
        dir = path_dir(path);
        if (!weights || !dir) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        index = ends_with(path, ".json");
        layout = index ? "shard index" : "file";
    }
    if (!(ck->layout = strdup(layout))) {
        st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        goto fail;
    }

    /* Config first: the generation decides how names map. */
    {
        char *cp = config_path ? strdup(config_path) : path_join(dir, "config.json");
        if (!cp) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if (config_path || is_file(cp)) {
            st = dsattn_config_load(&ck->cfg, cp, err, errlen);
            if (st != DSATTN_OK) {
                free(cp);
                goto fail;
            }
            ck->has_cfg = 1;
            ck->cfg_path = cp;
        } else {
            free(cp);
        }
    }

    if (index) {
        st = ck_open_index(ck, weights, err, errlen);
    } else {
        size_t fi = 0, cap = 0;
        st = ck_add_file(ck, weights, &fi, err, errlen);
        for (size_t i = 0; st == DSATTN_OK && i < dsattn_st_count(ck->files[fi]); i++)
            st = ck_push(ck, &cap, fi, dsattn_st_at(ck->files[fi], i), err, errlen);
    }
    if (st != DSATTN_OK) goto fail;
    st = ck_build_index(ck, err, errlen);
    if (st != DSATTN_OK) goto fail;
    free(weights);
    free(dir);
    *out = ck;
    return DSATTN_OK;
fail:
    free(weights);
    free(dir);
    dsattn_ckpt_close(ck);
    return st;
}

dsattn_status dsattn_ckpt_open_model(dsattn_ckpt **ck, const char **cfg_path,
                                     const char *weights, const char *config_json,
                                     char *err, size_t errlen)
{
    dsattn_status st = dsattn_ckpt_open(ck, weights, config_json, err, errlen);
    if (st) return st;
    *cfg_path = config_json ? config_json : dsattn_ckpt_config_path(*ck);
    if (*cfg_path) return DSATTN_OK;
    dsattn_ckpt_close(*ck);
    *ck = NULL;
    return dsattn_errf(err, errlen, DSATTN_ERR_NOT_FOUND,
                       "%s: no config.json beside the weights and none given", weights);
}

const dsattn_model_config *dsattn_ckpt_config(const dsattn_ckpt *ck)
{
    return ck && ck->has_cfg ? &ck->cfg : NULL;
}
const char *dsattn_ckpt_config_path(const dsattn_ckpt *ck) { return ck ? ck->cfg_path : NULL; }
const char *dsattn_ckpt_layout(const dsattn_ckpt *ck) { return ck ? ck->layout : NULL; }
size_t dsattn_ckpt_n_files(const dsattn_ckpt *ck) { return ck ? ck->n_files : 0; }
size_t dsattn_ckpt_count(const dsattn_ckpt *ck) { return ck ? ck->n : 0; }

const dsattn_ckpt_entry *dsattn_ckpt_at(const dsattn_ckpt *ck, size_t i)
{
    return ck && i < ck->n ? &ck->pub[i] : NULL;
}

static const char *entry_name(const void *list, size_t i)
{
    const dsattn_ckpt *ck = list;
    return ck->e[ck->by_name[i]].name;
}

const dsattn_ckpt_entry *dsattn_ckpt_find(const dsattn_ckpt *ck, const char *name)
{
    if (!ck || !name) return NULL;
    size_t i = dsattn_name_bsearch(name, ck->n, entry_name, ck);
    return i < ck->n ? &ck->pub[ck->by_name[i]] : NULL;
}

/* ==== weights =========================================================== */

#define W_BAD(st, ...) dsattn_errf(err, errlen, st, __VA_ARGS__)

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* Decode a scale tensor [sr, sc] (F32 scale_inv or F8_E8M0) to fp32 and
 * reject NaN, Inf and non-positive entries. */
static dsattn_status decode_scales(const dsattn_ckpt_entry *se, float *out, size_t n,
                                   char *err, size_t errlen)
{
    const dsattn_st_tensor *t = se->t;
    if (t->dtype != DSATTN_DT_F32 && t->dtype != DSATTN_DT_F8_E8M0)
        return W_BAD(DSATTN_ERR_FORMAT,
                     "%s: scale tensor '%s' has dtype %s; expected F32 (scale_inv) or "
                     "F8_E8M0 (file offset %zu)", se->file, se->stored_name,
                     dsattn_dtype_name(t->dtype), t->offset);
    dsattn_status st = dsattn_st_to_f32(t, out, n);
    if (st != DSATTN_OK) return W_BAD(st, "%s: scale tensor '%s': cannot decode", se->file, se->stored_name);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i]) || !(out[i] > 0)) {
            size_t esz = dsattn_dtype_size(t->dtype);
            size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : n;
            return W_BAD(DSATTN_ERR_FORMAT,
                         "%s: scale tensor '%s' block (%zu, %zu) is %g (NaN, Inf or not "
                         "positive) at byte offset %zu", se->file, se->stored_name,
                         i / cols, i % cols, (double)out[i], t->offset + i * esz);
        }
    }
    return DSATTN_OK;
}

/* Convert a decoded descriptor to BF16 or F32 storage (owned). */
static dsattn_status convert_to(dsattn_weight *w, dsattn_wkind target, char *err,
                                size_t errlen, const char *what)
{
    size_t n, esz = target == DSATTN_W_BF16 ? 2 : 4, bytes;
    if (!dsattn_mul_size(w->rows, w->cols, &n) || !dsattn_mul_size(n, esz, &bytes))
        return W_BAD(DSATTN_ERR_OVERFLOW, "%s: size overflow", what);
    void *dst = dsattn_alloc(bytes);
    float *row = malloc((w->cols + 1) * sizeof *row);
    if (!dst || !row) {
        dsattn_free(dst);
        free(row);
        return W_BAD(DSATTN_ERR_NOMEM, "%s: out of memory converting", what);
    }
    for (size_t r = 0; r < w->rows; r++) {
        dsattn_weight_row_f32(w, r, row);
        if (target == DSATTN_W_BF16) {
            uint16_t *d = (uint16_t *)dst + r * w->cols;
            for (size_t c = 0; c < w->cols; c++) d[c] = dsattn_f32_to_bf16(row[c]);
        } else {
            memcpy((float *)dst + r * w->cols, row, w->cols * sizeof(float));
        }
    }
    free(row);
    dsattn_free(w->owned);
    w->owned = dst;
    w->data = dst;
    w->kind = target;
    w->scale = NULL;
    w->scale_e8m0 = NULL;
    w->block = 0;
    return DSATTN_OK;
}

dsattn_status dsattn_ckpt_weight(const dsattn_ckpt *ck, const char *base,
                                 unsigned accept, size_t rows, size_t cols,
                                 dsattn_weight *w, char *err, size_t errlen)
{
    if (!ck || !base || !w) return W_BAD(DSATTN_ERR_INVALID_ARG, "NULL argument");
    memset(w, 0, sizeof *w);
    if (!(accept & DSATTN_WMASK_ANY)) accept = DSATTN_WMASK_ANY;
    char wn[DSATTN_NAME_MAX + 16], sn[DSATTN_NAME_MAX + 16];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(sn, sizeof sn, "%s.scale", base);
    const dsattn_ckpt_entry *we = dsattn_ckpt_find(ck, wn);
    if (!we)
        return W_BAD(DSATTN_ERR_NOT_FOUND, "missing tensor '%s' (%s)", wn,
                     ck->n_files == 1 ? ck->paths[0] : "in no shard of the index");
    const dsattn_st_tensor *t = we->t;
    const dsattn_ckpt_entry *se = dsattn_ckpt_find(ck, sn);
    if (t->ndim != 2)
        return W_BAD(DSATTN_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, a Linear "
                     "weight needs 2 (file offset %zu)", we->file, we->stored_name, t->ndim,
                     t->offset);
    size_t R = (size_t)t->shape[0], C = (size_t)t->shape[1];
    /* FP4 comes two ways: bytes (I8/U8, shape [R, C/2], as convert.py
     * writes it) or safetensors' own F4 (shape [R, C] in values); both
     * hold the even element in the low nibble. */
    int packed = (t->dtype == DSATTN_DT_I8 || t->dtype == DSATTN_DT_U8) && se &&
                 se->t->dtype == DSATTN_DT_F8_E8M0;
    int fp4 = packed || (t->dtype == DSATTN_DT_F4 && se && se->t->dtype == DSATTN_DT_F8_E8M0);
    if (packed && !dsattn_mul_size(C, 2, &C))
        return W_BAD(DSATTN_ERR_OVERFLOW, "%s: '%s' too large", we->file, we->stored_name);
    if ((rows && rows != R) || (cols && cols != C))
        return W_BAD(DSATTN_ERR_FORMAT,
                     "%s: tensor '%s' is [%zu, %zu]%s, but the config needs [%zu, %zu] "
                     "(wrong shape for the config; file offset %zu)", we->file,
                     we->stored_name, R, C, packed ? " (FP4-unpacked)" : "", rows ? rows : R,
                     cols ? cols : C, t->offset);
    w->rows = R;
    w->cols = C;
    w->data = t->data;
    dsattn_status st = DSATTN_OK;
    switch (t->dtype) {
    case DSATTN_DT_F32:
    case DSATTN_DT_BF16:
        if (se)
            return W_BAD(DSATTN_ERR_FORMAT, "%s: '%s' is %s but has a scale tensor '%s'",
                         we->file, we->stored_name, dsattn_dtype_name(t->dtype), se->stored_name);
        w->kind = t->dtype == DSATTN_DT_F32 ? DSATTN_W_F32 : DSATTN_W_BF16;
        /* safetensors does not align tensors; a misaligned one is copied */
        if (((uintptr_t)t->data) % dsattn_dtype_size(t->dtype)) {
            void *cp = dsattn_alloc(t->nbytes);
            if (!cp) return W_BAD(DSATTN_ERR_NOMEM, "out of memory");
            memcpy(cp, t->data, t->nbytes);
            w->owned = cp;
            w->data = cp;
        }
        break;
    case DSATTN_DT_F16: {
        float *cp = dsattn_alloc_array(t->numel + 1, sizeof(float));
        if (!cp) return W_BAD(DSATTN_ERR_NOMEM, "out of memory");
        dsattn_st_to_f32(t, cp, t->numel);
        w->kind = DSATTN_W_F32;
        w->owned = cp;
        w->data = cp;
        break;
    }
    case DSATTN_DT_F8_E4M3: {
        if (!se)
            return W_BAD(DSATTN_ERR_NOT_FOUND, "%s: FP8 tensor '%s' has no scale tensor "
                         "'%s' (HF: weight_scale_inv)", we->file, we->stored_name, sn);
        const dsattn_st_tensor *s = se->t;
        if (s->ndim != 2)
            return W_BAD(DSATTN_ERR_FORMAT, "%s: scale '%s' must be 2-D (file offset %zu)",
                         se->file, se->stored_name, s->offset);
        size_t sr = (size_t)s->shape[0], sc = (size_t)s->shape[1], bs = 0;
        const size_t cand[3] = { 128, 64, 32 };
        int64_t cfg_b = ck->has_cfg ? ck->cfg.weight_block : 0;
        if (cfg_b > 0 && ceil_div(R, (size_t)cfg_b) == sr && ceil_div(C, (size_t)cfg_b) == sc)
            bs = (size_t)cfg_b;
        for (int k = 0; !bs && k < 3; k++)
            if (ceil_div(R, cand[k]) == sr && ceil_div(C, cand[k]) == sc) bs = cand[k];
        if (!bs)
            return W_BAD(DSATTN_ERR_FORMAT,
                         "%s: scale '%s' is [%zu, %zu], which matches no 32/64/128 block "
                         "grid of weight [%zu, %zu] (file offset %zu)", se->file,
                         se->stored_name, sr, sc, R, C, s->offset);
        if (cfg_b > 0 && (size_t)cfg_b != bs &&
            !(ceil_div(R, (size_t)cfg_b) == sr && ceil_div(C, (size_t)cfg_b) == sc))
            return W_BAD(DSATTN_ERR_FORMAT,
                         "%s: scale '%s' [%zu, %zu] implies %zux%zu blocks, but the config "
                         "says weight_block_size %lld (file offset %zu)", se->file,
                         se->stored_name, sr, sc, bs, bs, (long long)cfg_b, s->offset);
        float *sf = dsattn_alloc_array(sr * sc + 1, sizeof(float));
        if (!sf) return W_BAD(DSATTN_ERR_NOMEM, "out of memory");
        st = decode_scales(se, sf, sr * sc, err, errlen);
        if (st != DSATTN_OK) {
            dsattn_free(sf);
            return st;
        }
        w->kind = DSATTN_W_FP8;
        w->scale = sf;
        w->owned = sf;
        w->block = bs;
        /* one pass over the bytes: weights without NaN codes may use the
         * GEMV that does not track them (kernels.h gemv_fp8_finite) */
        {
            const uint8_t *b = t->data;
            int nan = 0;
            for (size_t i = 0; i < t->nbytes && !nan; i++) nan = (b[i] & 0x7f) == 0x7f;
            w->finite = !nan;
        }
        break;
    }
    case DSATTN_DT_I8:
    case DSATTN_DT_U8:
    case DSATTN_DT_F4: {
        if (!fp4)
            return W_BAD(DSATTN_ERR_FORMAT,
                         "%s: '%s' is %s without an F8_E8M0 scale '%s': not a FP4 weight "
                         "(file offset %zu)", we->file, we->stored_name,
                         dsattn_dtype_name(t->dtype), sn, t->offset);
        const dsattn_st_tensor *s = se->t;
        if (C % 32 || s->ndim != 2 || (size_t)s->shape[0] != R ||
            (size_t)s->shape[1] != C / 32)
            return W_BAD(DSATTN_ERR_FORMAT,
                         "%s: FP4 scale '%s' must be [%zu, %zu] (one E8M0 per 32 along K) "
                         "(file offset %zu)", se->file, se->stored_name, R, C / 32, s->offset);
        const uint8_t *sb = s->data;
        for (size_t i = 0; i < s->numel; i++)
            if (sb[i] == 0xff)
                return W_BAD(DSATTN_ERR_FORMAT,
                             "%s: FP4 scale '%s' entry (%zu, %zu) is NaN (0xff) at byte "
                             "offset %zu", se->file, se->stored_name, i / (C / 32), i % (C / 32),
                             s->offset + i);
        w->kind = DSATTN_W_FP4;
        w->scale_e8m0 = sb;
        break;
    }
    default:
        return W_BAD(DSATTN_ERR_FORMAT, "%s: '%s' has dtype %s, not a weight format "
                     "(file offset %zu)", we->file, we->stored_name, dsattn_dtype_name(t->dtype),
                     t->offset);
    }
    if (!(accept & DSATTN_WMASK(w->kind))) {
        dsattn_wkind target;
        if (accept & DSATTN_WMASK(DSATTN_W_BF16)) target = DSATTN_W_BF16;
        else if (accept & DSATTN_WMASK(DSATTN_W_F32)) target = DSATTN_W_F32;
        else {
            dsattn_weight_release(w);
            return W_BAD(DSATTN_ERR_UNSUPPORTED,
                         "%s: '%s' is stored as %s; the caller accepts only formats "
                         "dsattn cannot quantize to", we->file, we->stored_name,
                         dsattn_dtype_name(t->dtype));
        }
        st = convert_to(w, target, err, errlen, we->stored_name);
        if (st != DSATTN_OK) {
            dsattn_weight_release(w);
            return st;
        }
    }
    return DSATTN_OK;
}

dsattn_status dsattn_ckpt_vector_f32(const dsattn_ckpt *ck, const char *name,
                                     float *out, size_t n, char *err, size_t errlen)
{
    const dsattn_ckpt_entry *e = dsattn_ckpt_find(ck, name);
    if (!e) return W_BAD(DSATTN_ERR_NOT_FOUND, "missing tensor '%s'", name);
    const dsattn_st_tensor *t = e->t;
    if (t->dtype != DSATTN_DT_F32 && t->dtype != DSATTN_DT_BF16 && t->dtype != DSATTN_DT_F16)
        return W_BAD(DSATTN_ERR_FORMAT, "%s: '%s' has dtype %s; expected F32/BF16/F16 "
                     "(file offset %zu)", e->file, e->stored_name, dsattn_dtype_name(t->dtype),
                     t->offset);
    if (t->numel != n)
        return W_BAD(DSATTN_ERR_FORMAT, "%s: '%s' has %zu elements, the config needs %zu "
                     "(wrong shape for the config; file offset %zu)", e->file, e->stored_name,
                     t->numel, n, t->offset);
    dsattn_st_to_f32(t, out, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i]))
            return W_BAD(DSATTN_ERR_FORMAT, "%s: '%s' element %zu is %g (byte offset %zu)",
                         e->file, e->stored_name, i, (double)out[i],
                         t->offset + i * dsattn_dtype_size(t->dtype));
    return DSATTN_OK;
}

/* ==== Binder ============================================================ */

dsattn_status dsattn_bind_vec(const dsattn_binder *b, const char *name, size_t n, float **out)
{
    float *v = dsattn_alloc_array(n, sizeof(float));
    dsattn_status st = dsattn_owned_add(b->owned, v);
    if (st) return st;
    if ((st = dsattn_ckpt_vector_f32(b->ck, name, v, n, b->err, b->errlen))) return st;
    *out = v;
    return DSATTN_OK;
}

dsattn_status dsattn_bind_mat(const dsattn_binder *b, const char *name, unsigned accept,
                              size_t rows, size_t cols, dsattn_weight *w)
{
    char base[256];
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, ".weight")) n -= 7;
    if (n >= sizeof base)
        return dsattn_errf(b->err, b->errlen, DSATTN_ERR_INVALID_ARG, "tensor name too long");
    memcpy(base, name, n);
    base[n] = '\0';
    dsattn_status st = dsattn_ckpt_weight(b->ck, base, accept, rows, cols, w, b->err, b->errlen);
    if (st) return st;
    if (w->owned && (st = dsattn_owned_add(b->owned, w->owned))) {
        w->owned = NULL;             /* owned_add freed it */
        return st;
    }
    w->owned = NULL;                 /* the model frees it, not the weight */
    return DSATTN_OK;
}

/* ==== validation ======================================================== */

static void report(dsattn_ckpt_issue_fn fn, void *ud, size_t *n, dsattn_status st,
                   const char *msg)
{
    (*n)++;
    if (fn) fn(ud, st, msg);
}

static void fmt_shape(char *b, size_t bl, int nd, const int64_t *sh)
{
    size_t k = 0;
    k += (size_t)snprintf(b + k, bl - k, "[");
    for (int d = 0; d < nd && k < bl; d++)
        k += (size_t)snprintf(b + k, bl - k, "%s%lld", d ? ", " : "", (long long)sh[d]);
    if (k < bl) snprintf(b + k, bl - k, "]");
}

dsattn_status dsattn_ckpt_validate(const dsattn_ckpt *ck, dsattn_ckpt_issue_fn issue,
                                   void *ud, size_t *n_issues)
{
    size_t n = 0;
    char msg[600];
    dsattn_status first = DSATTN_OK;
    if (n_issues) *n_issues = 0;
    if (!ck) return DSATTN_ERR_INVALID_ARG;
    if (!ck->has_cfg) {
        report(issue, ud, &n, DSATTN_ERR_NOT_FOUND,
               "no config.json next to the weights (pass one): cannot check completeness");
        if (n_issues) *n_issues = n;
        return DSATTN_ERR_NOT_FOUND;
    }
    dsattn_tensor_spec *sp = NULL;
    size_t ns = 0;
    dsattn_status st = dsattn_expected_tensors(&ck->cfg, &sp, &ns, msg, sizeof msg);
    if (st != DSATTN_OK) {
        report(issue, ud, &n, st, msg);
        if (n_issues) *n_issues = n;
        return st;
    }
    float *buf = NULL;
    size_t bufn = 0;
    for (size_t i = 0; i < ns; i++) {
        const dsattn_tensor_spec *s = &sp[i];
        if (s->kind == DSATTN_TS_LINEAR) {
            dsattn_weight w;
            st = dsattn_ckpt_weight(ck, s->name, DSATTN_WMASK_ANY, (size_t)s->shape[0],
                                    (size_t)s->shape[1], &w, msg, sizeof msg);
            /* a quantized Linear's input is quantized in blocks first
             * (wo_a excepted: an einsum over the dequantized weight) */
            const int64_t ab = dsattn_fp8_act_block(ck->cfg.arch);
            const size_t nl = strlen(s->name);
            const int wo_a = nl >= 9 && strcmp(s->name + nl - 9, "attn.wo_a") == 0;
            if (st == DSATTN_OK && ab > 0 && !wo_a &&
                (w.kind == DSATTN_W_FP8 || w.kind == DSATTN_W_FP4) && w.cols % (size_t)ab) {
                char wn[DSATTN_NAME_MAX + 8];
                snprintf(wn, sizeof wn, "%s.weight", s->name);
                const dsattn_ckpt_entry *e = dsattn_ckpt_find(ck, wn);
                snprintf(msg, sizeof msg,
                         "%s.weight is stored as %s with %zu input dims, not a multiple of "
                         "the FP8 activation block %lld the reference quantizes its input in "
                         "(store it as bf16)%s%s", s->name,
                         w.kind == DSATTN_W_FP8 ? "FP8" : "FP4", w.cols, (long long)ab,
                         e ? "; file " : "", e ? e->file : "");
                st = DSATTN_ERR_FORMAT;
            }
            dsattn_weight_release(&w);
        } else {
            size_t need = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
            const dsattn_ckpt_entry *e = dsattn_ckpt_find(ck, s->name);
            if (!e) {
                snprintf(msg, sizeof msg, "missing tensor '%s' (%s)", s->name, s->op);
                st = DSATTN_ERR_NOT_FOUND;
            } else if (e->t->ndim != s->ndim ||
                       (s->ndim >= 1 && e->t->shape[0] != s->shape[0]) ||
                       (s->ndim == 2 && e->t->shape[1] != s->shape[1])) {
                char have[96], want[96];
                fmt_shape(have, sizeof have, e->t->ndim, e->t->shape);
                fmt_shape(want, sizeof want, s->ndim, s->shape);
                snprintf(msg, sizeof msg,
                         "%s: tensor '%s' has shape %s, the config needs %s (wrong shape "
                         "for the config; file offset %zu)", e->file, e->stored_name, have,
                         want, e->t->offset);
                st = DSATTN_ERR_FORMAT;
            } else {
                if (need > bufn) {
                    free(buf);
                    buf = malloc(need * sizeof *buf);
                    bufn = buf ? need : 0;
                }
                st = buf ? dsattn_ckpt_vector_f32(ck, s->name, buf, need, msg, sizeof msg)
                         : DSATTN_ERR_NOMEM;
            }
        }
        if (st != DSATTN_OK) {
            if (first == DSATTN_OK) first = st;
            report(issue, ud, &n, st, msg);
        }
    }
    free(buf);
    free(sp);
    if (n_issues) *n_issues = n;
    return first;
}
