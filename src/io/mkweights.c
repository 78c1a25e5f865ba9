/* mkweights.c - writes a random, seeded checkpoint in the official layout
 * (single model.safetensors, or HF shards + model.safetensors.index.json)
 * for tests and benchmarks: `dsattn make-weights`.
 *
 * Owns: which Linear each generation's release stores in FP8 and with which
 * scale type, the 2-D block quantizer used to write them, and shard layout.
 * Values: Linear weights ~ N(0, 1/cols), norm weights 1 + 0.1 N, biases
 * 0.1 N, sinks 0.5 N, ape 0.1 N.  Each tensor has its own RNG stream derived
 * from (seed, tensor index), so the values do not depend on sharding and a
 * shard is generated only when it is written (memory: one shard at a time).
 *
 * Deliberately not here: MTP/DSpark, MoE, embeddings (attention stacks only).
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
#include <sys/stat.h>
#include <sys/types.h>

/* splitmix64: the whole stream is determined by the 64-bit state. */
static uint64_t mw_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float mw_normal(uint64_t *s)
{
    double u1 = ((double)(mw_next(s) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(mw_next(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Which Linear a release stores in FP8 (name suffix after "layers.{i}."). */
static int mw_is_fp8(dsattn_arch a, const char *sfx)
{
    static const char *v3[] = { "attn.wq_a", "attn.wq_b", "attn.wq", "attn.wkv_a",
                                "attn.wkv_b", "attn.wo", "attn.indexer.wq_b",
                                "attn.indexer.wk", NULL };
    /* V4: every attention Linear except the compressors and weights_proj. */
    static const char *v4[] = { "attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a",
                                "attn.wo_b", "attn.indexer.wq_b", NULL };
    /* V4.1 keeps wo_a, compressors, indexer wk / weights_proj in bf16. */
    static const char *v41[] = { "attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b",
                                 "attn.indexer.wq_b", NULL };
    if (a == DSATTN_ARCH_LLAMA) return 0;       /* DeepSeek-LLM ships bf16 */
    const char **t = a == DSATTN_ARCH_V41 ? v41 : a == DSATTN_ARCH_V4 ? v4 : v3;
    for (; *t; t++)
        if (strcmp(*t, sfx) == 0) return 1;
    return 0;
}

static int64_t mw_default_block(dsattn_arch a) { return a == DSATTN_ARCH_V41 ? 32 : 128; }

typedef struct {
    char         name[DSATTN_NAME_MAX];   /* inference name as written   */
    dsattn_dtype dtype;
    int          ndim;
    int64_t      shape[2];
    size_t       nbytes;
    size_t       spec;                    /* index into the spec list    */
    int          part;                    /* 0 data, 1 scale             */
} mw_item;

static dsattn_status mw_mkdir(const char *dir, char *err, size_t errlen)
{
    char buf[4096];
    if (strlen(dir) >= sizeof buf)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "%s: path too long", dir);
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: cannot create: %s", buf,
                               strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return dsattn_errf(err, errlen, DSATTN_ERR_IO, "%s: cannot create: %s", buf,
                           strerror(errno));
    return DSATTN_OK;
}

/* Fill the bytes of item `it` (deterministic in seed and spec index). */
static dsattn_status mw_fill(const dsattn_model_config *c, const dsattn_tensor_spec *s,
                             const mw_item *it, uint64_t seed, int64_t block,
                             int f32_scale, void *out)
{
    const size_t R = (size_t)s->shape[0], C = s->ndim == 2 ? (size_t)s->shape[1] : 1;
    const size_t n = R * C;
    uint64_t st = seed ^ (0x632be59bd9b4e019ull * (it->spec + 1));
    float *x = malloc((n + 1) * sizeof *x);
    if (!x) return DSATTN_ERR_NOMEM;
    const char *leaf = strrchr(s->name, '.');
    leaf = leaf ? leaf + 1 : s->name;
    if (s->kind == DSATTN_TS_LINEAR) {
        float sd = 1.0f / sqrtf((float)C);
        for (size_t i = 0; i < n; i++) x[i] = mw_normal(&st) * sd;
    } else if (strstr(s->name, "norm.weight")) {
        for (size_t i = 0; i < n; i++) x[i] = 1.0f + 0.1f * mw_normal(&st);
    } else if (strcmp(leaf, "attn_sink") == 0) {
        for (size_t i = 0; i < n; i++) x[i] = 0.5f * mw_normal(&st);
    } else {
        for (size_t i = 0; i < n; i++) x[i] = 0.1f * mw_normal(&st);
    }
    (void)c;
    if (it->dtype == DSATTN_DT_F32 && it->part == 0) {
        memcpy(out, x, n * 4);
    } else if (it->dtype == DSATTN_DT_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = dsattn_f32_to_bf16(x[i]);
    } else {
        /* FP8 with a 2-D block scale: amax over each tile (floored at 1e-4
         * like act_quant), s = amax/448 (V3 scale_inv) or its power-of-two
         * ceiling (UE8M0). */
        const size_t bs = (size_t)block, sr = (R + bs - 1) / bs, sc = (C + bs - 1) / bs;
        for (size_t bi = 0; bi < sr; bi++)
            for (size_t bj = 0; bj < sc; bj++) {
                float amax = 1e-4f;
                for (size_t r = bi * bs; r < R && r < (bi + 1) * bs; r++)
                    for (size_t q = bj * bs; q < C && q < (bj + 1) * bs; q++)
                        amax = fmaxf(amax, fabsf(x[r * C + q]));
                float sf = f32_scale ? amax / 448.0f : dsattn_pow2_ceil(amax / 448.0f);
                if (it->part == 1) {
                    if (f32_scale) ((float *)out)[bi * sc + bj] = sf;
                    else ((uint8_t *)out)[bi * sc + bj] = dsattn_f32_to_ue8m0(sf);
                    continue;
                }
                for (size_t r = bi * bs; r < R && r < (bi + 1) * bs; r++)
                    for (size_t q = bj * bs; q < C && q < (bj + 1) * bs; q++)
                        ((uint8_t *)out)[r * C + q] = dsattn_f32_to_e4m3(x[r * C + q] / sf);
            }
    }
    free(x);
    return DSATTN_OK;
}

dsattn_status dsattn_make_weights(const dsattn_model_config *c, const dsattn_mw_params *p,
                                  const char *out_dir, char *err, size_t errlen)
{
    if (!c || !p || !out_dir)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG, "NULL argument");
    if (p->shards < 1 || p->shards > 9999)
        return dsattn_errf(err, errlen, DSATTN_ERR_INVALID_ARG,
                           "--shards %d: must be 1..9999", p->shards);
    dsattn_tensor_spec *sp = NULL;
    size_t ns = 0;
    dsattn_status st = dsattn_expected_tensors(c, &sp, &ns, err, errlen);
    if (st != DSATTN_OK) return st;
    const int64_t block = c->weight_block > 0 ? c->weight_block : mw_default_block(c->arch);
    const int f32_scale = c->arch == DSATTN_ARCH_V3 || c->arch == DSATTN_ARCH_V32;
    mw_item *items = calloc(2 * ns + 1, sizeof *items);
    size_t ni = 0, total = 0;
    if (!items) {
        free(sp);
        return dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
    }
    for (size_t k = 0; k < ns; k++) {
        const dsattn_tensor_spec *s = &sp[k];
        const char *sfx = strchr(s->name + 7, '.') + 1;
        const char *leaf = strrchr(s->name, '.') + 1;
        int fp8 = p->format == DSATTN_MW_FP8 && s->kind == DSATTN_TS_LINEAR &&
                  mw_is_fp8(c->arch, sfx);
        const int64_t ab = dsattn_fp8_act_block(c->arch);
        if (fp8 && ab > 0 && strcmp(sfx, "attn.wo_a") != 0 && s->shape[1] % ab) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                             "--format fp8: %s.weight would have %lld input dims, not a "
                             "multiple of the FP8 activation block %lld the reference "
                             "quantizes its input in (use --format bf16 for these shapes)",
                             s->name, (long long)s->shape[1], (long long)ab);
            break;
        }
        mw_item *it = &items[ni++];
        it->spec = k;
        it->ndim = s->ndim;
        it->shape[0] = s->shape[0];
        it->shape[1] = s->shape[1];
        if (s->kind == DSATTN_TS_LINEAR) {
            snprintf(it->name, sizeof it->name, "%.140s.weight", s->name);
            it->dtype = fp8 ? DSATTN_DT_F8_E4M3 : DSATTN_DT_BF16;
        } else {
            snprintf(it->name, sizeof it->name, "%s", s->name);
            it->dtype = strcmp(leaf, "attn_sink") == 0 || strcmp(leaf, "ape") == 0
                            ? DSATTN_DT_F32 : DSATTN_DT_BF16;
        }
        size_t numel = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
        it->nbytes = numel * dsattn_dtype_size(it->dtype);
        total += it->nbytes;
        if (fp8) {
            mw_item *sc = &items[ni++];
            *sc = *it;
            sc->part = 1;
            snprintf(sc->name, sizeof sc->name, "%.140s.scale", s->name);
            sc->dtype = f32_scale ? DSATTN_DT_F32 : DSATTN_DT_F8_E8M0;
            sc->shape[0] = (s->shape[0] + block - 1) / block;
            sc->shape[1] = (s->shape[1] + block - 1) / block;
            sc->nbytes = (size_t)(sc->shape[0] * sc->shape[1]) * dsattn_dtype_size(sc->dtype);
            total += sc->nbytes;
        }
    }
    if (st != DSATTN_OK) {
        free(items);
        free(sp);
        return st;
    }
    st = mw_mkdir(out_dir, err, errlen);
    int shards = p->shards;
    if ((size_t)shards > ns) shards = (int)ns;
    cJSON *index = shards > 1 ? cJSON_CreateObject() : NULL;
    cJSON *wmap = NULL;
    if (index) {
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        wmap = cJSON_AddObjectToObject(index, "weight_map");
    }
    size_t next = 0;
    for (int sh = 0; st == DSATTN_OK && sh < shards; sh++) {
        char fname[64], *path;
        if (shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, shards);
        size_t plen = strlen(out_dir) + strlen(fname) + 2;
        path = malloc(plen);
        if (!path) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(path, plen, "%s/%s", out_dir, fname);
        dsattn_st_writer *w = dsattn_st_writer_create();
        if (!w) st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        /* Tensor groups (a weight and its scale stay together) are dealt
         * out evenly by count: group g goes to shard g * shards / groups. */
        while (st == DSATTN_OK && next < ni &&
               (items[next].part == 1 ||
                (size_t)items[next].spec * (size_t)shards / ns == (size_t)sh)) {
            mw_item *it = &items[next];
            void *buf = malloc(it->nbytes + 1);
            if (!buf) {
                st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
                break;
            }
            st = mw_fill(c, &sp[it->spec], it, p->seed, block, f32_scale, buf);
            char nm[2 * DSATTN_NAME_MAX];
            if (st == DSATTN_OK) {
                if (p->names == DSATTN_MW_NAMES_HF) {
                    if (dsattn_name_to_hf(c->arch, it->name, nm, sizeof nm) < 0)
                        st = DSATTN_ERR_OVERFLOW;
                } else {
                    snprintf(nm, sizeof nm, "%s", it->name);
                }
            }
            if (st == DSATTN_OK)
                st = dsattn_st_writer_add(w, nm, it->dtype, it->ndim, it->shape, buf);
            if (st == DSATTN_OK && wmap) cJSON_AddStringToObject(wmap, nm, fname);
            free(buf);
            if (st != DSATTN_OK) {
                dsattn_errf(err, errlen, st, "make-weights: cannot add '%s'", nm);
                break;
            }
            next++;
        }
        if (st == DSATTN_OK) {
            char meta[32];
            dsattn_st_writer_meta(w, "format", "pt");
            snprintf(meta, sizeof meta, "%llu", (unsigned long long)p->seed);
            dsattn_st_writer_meta(w, "dsattn_seed", meta);
            dsattn_st_writer_meta(w, "model_type", dsattn_arch_name(c->arch));
            st = dsattn_st_writer_save(w, path, err, errlen);
        }
        dsattn_st_writer_destroy(w);
        free(path);
    }
    if (st == DSATTN_OK && index) {
        char *txt = cJSON_Print(index);
        size_t plen = strlen(out_dir) + 40;
        char *path = malloc(plen);
        if (!txt || !path) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_NOMEM, "out of memory");
        } else {
            snprintf(path, plen, "%s/model.safetensors.index.json", out_dir);
            FILE *fp = fopen(path, "wb");
            if (!fp || fputs(txt, fp) < 0 || fputc('\n', fp) < 0) st = DSATTN_ERR_IO;
            if (fp && fclose(fp) != 0) st = DSATTN_ERR_IO;
            if (st != DSATTN_OK) dsattn_errf(err, errlen, st, "%s: write failed", path);
        }
        free(path);
        free(txt);
    }
    cJSON_Delete(index);
    if (st == DSATTN_OK && p->config_path) {
        /* Copy the config verbatim: the folder is then self-describing. */
        size_t plen = strlen(out_dir) + 16;
        char *path = malloc(plen);
        FILE *in = fopen(p->config_path, "rb"), *out = NULL;
        if (path) {
            snprintf(path, plen, "%s/config.json", out_dir);
            out = in ? fopen(path, "wb") : NULL;
        }
        if (!path || !in || !out) {
            st = dsattn_errf(err, errlen, DSATTN_ERR_IO, "cannot copy %s to %s/config.json",
                             p->config_path, out_dir);
        } else {
            char b[8192];
            size_t k;
            while ((k = fread(b, 1, sizeof b, in)) > 0)
                if (fwrite(b, 1, k, out) != k) st = DSATTN_ERR_IO;
        }
        if (in) fclose(in);
        if (out && fclose(out) != 0) st = DSATTN_ERR_IO;
        if (st != DSATTN_OK) dsattn_errf(err, errlen, st, "cannot write %s/config.json", out_dir);
        free(path);
    }
    free(items);
    free(sp);
    return st;
}
