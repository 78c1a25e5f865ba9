/* cli_util.c - config.json edits and the generation's check of a config,
 * temporary files, synthetic inputs and the MHA / GQA stand-in stack the
 * subcommands share (see cli_util.h). */
#include "cli_util.h"

#include "config.h"
#include "dsattn_mha.h"
#include "dsattn_mla.h"
#include "dsattn_v4.h"

#include "mha.h"
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dsattn_cli_json_set_num(cJSON *j, const char *key, double v)
{
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddNumberToObject(j, key, v);
}

void dsattn_cli_json_set_ints(cJSON *j, const char *key, const int *v, int n)
{
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddItemToObject(j, key, cJSON_CreateIntArray(v, n));
}

double dsattn_cli_json_num(const cJSON *j, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

int dsattn_cli_json_is_fp8(const cJSON *j)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    return cJSON_IsString(v) && !strcmp(v->valuestring, "fp8");
}

int dsattn_cli_json_write(const cJSON *j, const char *path)
{
    char *txt = cJSON_Print(j);
    FILE *f = txt ? fopen(path, "w") : NULL;
    int ok = f && fputs(txt, f) >= 0;
    if (f && fclose(f)) ok = 0;
    free(txt);
    return ok ? 0 : -1;
}

const char *dsattn_cli_tmp_root(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] ? t : "/tmp";
}

int dsattn_cli_tmp_file(char *buf, size_t n, const char *tag, const char *suffix)
{
    int w = snprintf(buf, n, "%s/dsattn_%s_XXXXXX%s", dsattn_cli_tmp_root(), tag, suffix);
    if (w < 0 || (size_t)w >= n) return -1;
    int fd = mkstemps(buf, (int)strlen(suffix));
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void dsattn_cli_input_row(float *h, size_t dim, uint64_t seed, int64_t pos)
{
    uint64_t s = splitmix64(splitmix64(seed) ^ (uint64_t)pos) | 1u;
    for (size_t i = 0; i < dim; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        h[i] = (float)((double)(s >> 11) * 0x1p-52 - 1.0) * 1.7320508f;
    }
}

float *dsattn_cli_rand_bf16(size_t n, uint64_t seed, uint64_t salt)
{
    float *x = malloc(n * sizeof(float) + 1);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + salt;
    for (size_t i = 0; i < n && x; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        float u = (float)((double)(s >> 11) * 0x1p-52 - 1.0) * 1.7320508f;
        uint32_t b;
        memcpy(&b, &u, 4);
        b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;      /* RNE to bf16 */
        memcpy(&x[i], &b, 4);
    }
    return x;
}

const char *dsattn_cli_configs_dir(void)
{
    static char dir[1100];
    const char *e = getenv("DSATTN_CONFIGS");
    if (e && *e) return e;
    if (access("configs/deepseek-v4.1-flash.json", R_OK) == 0) return "configs";
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) {
            *s = 0;
            snprintf(dir, sizeof dir, "%s/../configs", exe);
            char probe[1200];
            snprintf(probe, sizeof probe, "%s/deepseek-v4.1-flash.json", dir);
            if (access(probe, R_OK) == 0) return dir;
        }
    }
    return "configs";
}

const char *dsattn_cli_mib(double b, char *buf, size_t n)
{
    if (b >= 1048576.0) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else snprintf(buf, n, "%.1f KiB", b / 1024.0);
    return buf;
}

/* ==== The MHA / GQA stand-in stack ====================================== */

static dsattn_status mha_layer(dsattn_ctx *ctx, void *seq, int l, const float *x, size_t n,
                               float *out)
{
    return dsattn_mha_attn_forward(ctx, (dsattn_mha_seq *)seq, l, x, n, out);
}

static const float *mha_norm(const void *seq, int l)
{
    return ((const dsattn_mha_seq *)seq)->m->layer[l].norm;
}

dsattn_status dsattn_cli_mha_stack(dsattn_ctx *ctx, dsattn_mha_seq *s, size_t n_layers,
                                   float *h, size_t n)
{
    const dsattn_mha *m = s->m;
    dsattn_status st = dsattn_standin_stack(ctx, s, mha_layer, mha_norm, n_layers,
                                            (size_t)dsattn_mha_dim(m), m->cfg.rms_norm_eps, h,
                                            n, NULL, NULL, NULL);
    return st ? st : dsattn_mha_seq_advance(s, n);
}

/* the batch is the `seq` the layer and norm functions read */
typedef struct {
    dsattn_mha_seq **s;
    size_t          *failed;
} mha_batch;

static dsattn_status mha_layer_batch(dsattn_ctx *ctx, void *seq, int l, const float *x, size_t n,
                                     float *out)
{
    const mha_batch *b = seq;
    return dsattn_mha_attn_forward_batch(ctx, b->s, n, l, x, out, b->failed);
}

static const float *mha_norm_batch(const void *seq, int l)
{
    return ((const mha_batch *)seq)->s[0]->m->layer[l].norm;
}

dsattn_status dsattn_cli_mha_stack_batch(dsattn_ctx *ctx, dsattn_mha_seq **t, size_t B,
                                         size_t n_layers, float *h, float *xio,
                                         size_t *failed)
{
    const dsattn_mha *m = t[0]->m;
    const size_t dim = (size_t)dsattn_mha_dim(m);
    mha_batch b = { t, failed };
    dsattn_status st = dsattn_standin_rows(ctx, &b, mha_layer_batch, mha_norm_batch, n_layers, dim,
                                           m->cfg.rms_norm_eps, h, B, xio, xio + B * dim,
                                           NULL, NULL);
    for (size_t k = 0; k < B && !st; k++) st = dsattn_mha_seq_advance(t[k], 1);
    return st;
}

dsattn_status dsattn_cli_config_check(const char *path, int arch, char *err, size_t errlen)
{
    dsattn_status st;
    switch (arch) {
    case DSATTN_ARCH_LLAMA: {
        dsattn_mha *m = NULL;
        st = dsattn_mha_load_config(&m, path, err, errlen);
        dsattn_mha_destroy(m);
        return st;
    }
    case DSATTN_ARCH_V3:
    case DSATTN_ARCH_V32: {
        dsattn_mla *m = NULL;
        st = dsattn_mla_create_config_only(&m, path, err, errlen);
        dsattn_mla_destroy(m);
        return st;
    }
    case DSATTN_ARCH_V4: {
        dsattn_v4 *m = NULL;
        st = dsattn_v4_load_config(&m, path, err, errlen);
        dsattn_v4_destroy(m);
        return st;
    }
    case DSATTN_ARCH_V41: {
        dsattn_v41 *m = NULL;
        st = dsattn_v41_load_config(&m, path, err, errlen);
        dsattn_v41_destroy(m);
        return st;
    }
    default:
        return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED, "%s: unknown model type", path);
    }
}
