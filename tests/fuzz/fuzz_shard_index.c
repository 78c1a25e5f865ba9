/* fuzz_shard_index.c - libFuzzer target over the shard index
 * (model.safetensors.index.json): the input is the index file, written
 * into a folder that also holds two small valid shards
 * (model-00001-of-00002.safetensors, model-00002-of-00002.safetensors) so
 * the index can name real files, missing ones and wrong ones.
 * dsattn_ckpt_open must accept or refuse it with a message, never read
 * outside a buffer (ASan) or hit UB (UBSan); abort() marks a violated
 * invariant (an accepted checkpoint whose listing and lookup disagree, or
 * an entry outside the shards the index names). */
#include "checkpoint.h"
#include "fuzz_common.h"
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A shard holding two BF16 tensors (names as the seed corpus's indexes). */
static void write_shard(const char *file, const char *t0, const char *t1)
{
    static uint16_t vals[8] = { 0x3f80, 0x4000, 0x4040, 0x4080, 0xbf80, 0, 0x3f00, 0x3e80 };
    dsattn_st_writer *w = dsattn_st_writer_create();
    if (!w) abort();
    int64_t shape[2] = { 2, 2 };
    char err[256], path[512];
    if (dsattn_st_writer_add(w, t0, DSATTN_DT_BF16, 2, shape, vals) ||
        dsattn_st_writer_add(w, t1, DSATTN_DT_BF16, 2, shape, vals + 4))
        abort();
    fuzz_write(file, (const uint8_t *)"", 0, path, sizeof path);   /* registers it */
    if (dsattn_st_writer_save(w, path, err, sizeof err)) abort();
    dsattn_st_writer_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        write_shard("model-00001-of-00002.safetensors", "layers.0.attn.wq_a.weight",
                    "layers.0.attn_norm.weight");
        write_shard("model-00002-of-00002.safetensors", "layers.1.attn.wq_a.weight",
                    "layers.1.attn_norm.weight");
        ready = 1;
    }
    if (size > (1u << 20)) return 0;
    char path[512], err[1024];
    fuzz_write("model.safetensors.index.json", data, size, path, sizeof path);
    dsattn_ckpt *ck = NULL;
    if (dsattn_ckpt_open(&ck, path, NULL, err, sizeof err) != DSATTN_OK) {
        if (ck) abort();
        return 0;
    }
    size_t n = dsattn_ckpt_count(ck);
    if (n > 4) abort();   /* only the two shards' four tensors exist */
    for (size_t i = 0; i < n; i++) {
        const dsattn_ckpt_entry *e = dsattn_ckpt_at(ck, i);
        if (!e || !e->t || dsattn_ckpt_find(ck, e->name) != e) abort();
        float v[4];
        if (e->t->numel == 4 &&
            dsattn_ckpt_vector_f32(ck, e->name, v, 4, err, sizeof err) != DSATTN_OK)
            abort();
    }
    dsattn_ckpt_close(ck);
    return 0;
}
