/* fuzz_safetensors.c - libFuzzer target over the safetensors reader's
 * load-from-buffer path and everything a loaded file feeds: tensor lookup,
 * dtype conversion and the checkpoint weight decoders' input checks.
 *
 * Build: cmake -DDSATTN_FUZZ=ON -DCMAKE_C_COMPILER=clang ... && ./fuzz_safetensors
 * The input is a whole file; the reader must reject or accept it without
 * touching a byte outside the buffer (ASan) or hitting UB (UBSan).
 * Deliberately not here: file I/O (mmap is the same parser over a mapping).
 *
 * The reader's source is compiled into this target (not taken from the
 * library archive) so libFuzzer's coverage instrumentation sees its
 * branches; the linker then never pulls safetensors.o from libdsattn.a.
 */
#include "safetensors.c"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size heap block so any over-read is caught. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    char err[512];
    dsattn_st_file *f = NULL;
    if (dsattn_st_open_buffer(&f, buf, size, err, sizeof err) == DSATTN_OK) {
        size_t n = dsattn_st_count(f);
        for (size_t i = 0; i < n; i++) {
            const dsattn_st_tensor *t = dsattn_st_at(f, i);
            if (dsattn_st_find(f, t->name) != t) abort();   /* lookup is exact */
            /* bounded conversion: small tensors only, to keep runs fast */
            if (t->numel <= 4096) {
                float *out = malloc((t->numel + 1) * sizeof *out);
                if (out) {
                    if (dsattn_st_to_f32(t, out, t->numel) != DSATTN_OK) abort();
                    free(out);
                }
            }
            /* every byte of every tensor is inside the buffer */
            if (t->nbytes) {
                volatile uint8_t s = 0;
                s ^= ((const uint8_t *)t->data)[0];
                s ^= ((const uint8_t *)t->data)[t->nbytes - 1];
                (void)s;
            }
        }
        for (size_t i = 0; i < dsattn_st_meta_count(f); i++) {
            const char *v = NULL;
            const char *k = dsattn_st_meta_at(f, i, &v);
            if (!k || dsattn_st_meta(f, k) != v) abort();
        }
        dsattn_st_close(f);
    }
    free(buf);
    return 0;
}
