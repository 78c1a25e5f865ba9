/* fuzz_safetensors.c - libFuzzer target over the safetensors reader and
 * everything a loaded file feeds: load-from-buffer, tensor lookup, dtype
 * conversion, and the checkpoint decoders (dsattn_ckpt_open on the same
 * bytes as a .safetensors file, then every Linear weight through
 * dsattn_ckpt_weight under several accept masks, which dequantizes FP8 /
 * FP4 blocks and checks scales, and every small tensor through
 * dsattn_ckpt_vector_f32).
 *
 * Build: CC=clang cmake -S . -B build-fuzz -DDSATTN_FUZZ=ON (the library is
 * built with coverage for these targets).  The input is a whole file; the
 * readers must accept or reject it without touching a byte outside the
 * buffer (ASan) or hitting UB (UBSan).  abort() marks only a violated
 * invariant: a lookup that does not find what the listing holds, a
 * conversion failing for a dtype the converter supports (or succeeding for
 * one it does not), a weight descriptor that disagrees with its tensor.
 */
#include "checkpoint.h"
#include "fuzz_common.h"
#include "safetensors.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The dtypes dsattn_st_to_f32 converts; every other dtype the parser
 * accepts is DSATTN_ERR_UNSUPPORTED there (safetensors.h). */
static int converts(dsattn_dtype dt)
{
    switch (dt) {
    case DSATTN_DT_F32: case DSATTN_DT_F16: case DSATTN_DT_BF16: case DSATTN_DT_F8_E4M3:
    case DSATTN_DT_F8_E8M0: case DSATTN_DT_I8: case DSATTN_DT_U8: case DSATTN_DT_I32:
    case DSATTN_DT_I64:
        return 1;
    default:
        return 0;
    }
}

static void buffer_checks(const uint8_t *buf, size_t size)
{
    char err[512];
    dsattn_st_file *f = NULL;
    if (dsattn_st_open_buffer(&f, buf, size, err, sizeof err) != DSATTN_OK) return;
    size_t n = dsattn_st_count(f);
    for (size_t i = 0; i < n; i++) {
        const dsattn_st_tensor *t = dsattn_st_at(f, i);
        if (dsattn_st_find(f, t->name) != t) abort();   /* lookup is exact */
        /* every byte of every tensor is inside the buffer */
        if (t->nbytes) {
            const uint8_t *p = t->data;
            if (p < buf || p + t->nbytes > buf + size) abort();
            volatile uint8_t s = 0;
            s ^= p[0];
            s ^= p[t->nbytes - 1];
            (void)s;
        }
        /* bounded conversion: small tensors only, to keep runs fast */
        if (t->numel <= 4096) {
            float *out = malloc((t->numel + 1) * sizeof *out);
            if (out) {
                dsattn_status st = dsattn_st_to_f32(t, out, t->numel);
                if (converts(t->dtype) ? st != DSATTN_OK
                                       : (st != DSATTN_ERR_UNSUPPORTED && t->numel))
                    abort();
                free(out);
            }
        }
    }
    for (size_t i = 0; i < dsattn_st_meta_count(f); i++) {
        const char *v = NULL;
        const char *k = dsattn_st_meta_at(f, i, &v);
        if (!k || dsattn_st_meta(f, k) != v) abort();
    }
    dsattn_st_close(f);
}

static void checkpoint_checks(const uint8_t *data, size_t size)
{
    char path[512], err[512];
    fuzz_write("model.safetensors", data, size, path, sizeof path);
    dsattn_ckpt *ck = NULL;
    if (dsattn_ckpt_open(&ck, path, NULL, err, sizeof err) != DSATTN_OK) {
        if (ck) abort();   /* a failed open leaves nothing behind */
        return;
    }
    const unsigned masks[] = { DSATTN_WMASK_ANY, DSATTN_WMASK(DSATTN_W_BF16),
                               DSATTN_WMASK(DSATTN_W_F32) };
    for (size_t i = 0; i < dsattn_ckpt_count(ck); i++) {
        const dsattn_ckpt_entry *e = dsattn_ckpt_at(ck, i);
        if (!e || !e->name || dsattn_ckpt_find(ck, e->name) != e) abort();
        const dsattn_st_tensor *t = e->t;
        size_t len = strlen(e->name);
        /* Linear weights: bounded size (dequantization is numel work) */
        if (len > 7 && !strcmp(e->name + len - 7, ".weight") && t->numel <= 65536 &&
            len - 7 < 400) {
            char base[408];
            memcpy(base, e->name, len - 7);
            base[len - 7] = 0;
            for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
                dsattn_weight w;
                if (dsattn_ckpt_weight(ck, base, masks[m], 0, 0, &w, err, sizeof err) ==
                    DSATTN_OK) {
                    /* the descriptor is of a kind the caller accepted, and
                     * covers the tensor's rows */
                    if (!(masks[m] & DSATTN_WMASK(w.kind))) abort();
                    if (t->ndim != 2 || w.rows != (size_t)t->shape[0]) abort();
                    dsattn_weight_release(&w);
                }
            }
        }
        if (t->numel <= 4096) {
            float *out = malloc((t->numel + 1) * sizeof *out);
            if (out) {
                if (dsattn_ckpt_vector_f32(ck, e->name, out, t->numel, err, sizeof err) ==
                    DSATTN_OK)
                    for (size_t k = 0; k < t->numel; k++)
                        if (!isfinite(out[k])) abort();   /* documented: finite only */
                free(out);
            }
        }
    }
    dsattn_ckpt_close(ck);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size heap block so any over-read is caught. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    buffer_checks(buf, size);
    free(buf);
    checkpoint_checks(data, size);
    return 0;
}
