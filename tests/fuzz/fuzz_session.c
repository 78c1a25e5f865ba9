/* fuzz_session.c - libFuzzer target over session load-from-buffer: the
 * format parser (src/io/session.c) and a generation's checks and restore
 * (src/attn/session_seq.c), into a small V4.1 model with random weights.
 *
 * Build: cmake -DDSATTN_FUZZ=ON -DCMAKE_C_COMPILER=clang ... && ./fuzz_session
 * An input starting with 'D' is a whole file, loaded as is, then once more
 * with every checksum recomputed (header, sections by their stated lengths,
 * whole file) so the fuzzer also reaches the checks behind the checksums:
 * the model hashes, options, runtime slots, section list and sizes.  Any
 * other input is a recipe: byte 0 picks a real session of the model (the
 * position, 0..8, after a prefill) and whether to re-seal it; then each
 * 3 bytes are (u16 offset, xor mask) applied to that image.  A load must succeed or fail cleanly, never touch a byte outside
 * the buffer (ASan) or hit UB (UBSan); a loaded sequence is saved to memory
 * again through clone to exercise the copy path.
 *
 * The library it links is the fuzz build's copy with coverage (CMake's
 * dsattn_fuzzlib), so libFuzzer sees the session code's branches.
 */
#include "dsattn.h"
#include "fuzz_common.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dsattn_v41 *model(void)
{
    static dsattn_v41 *m;
    static int tried;
    if (tried) return m;
    tried = 1;
    char path[512];
    fuzz_path("config.json", path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs("{\"dim\": 64, \"n_layers\": 3, \"n_heads\": 2, \"head_dim\": 32, \"rope_head_dim\": 8,"
          " \"q_lora_rank\": 32, \"o_groups\": 1, \"o_lora_rank\": 32, \"window_size\": 4,"
          " \"compress_ratios\": [0, 2, 1], \"kv_source_layers\": [1, 2],"
          " \"index_source_layers\": [1, 2], \"candidate_source_layer\": -1,"
          " \"index_n_heads\": 2, \"index_head_dim\": 32,"
          " \"index_topk\": 2, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
          " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
          " \"beta_slow\": 1, \"norm_eps\": 1e-6, \"dtype\": \"bf16\"}\n", f);
    fclose(f);
    char err[256];
    if (dsattn_v41_create_random(&m, path, 1, 0, err, sizeof err)) m = NULL;
    unlink(path);
    return m;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Recompute every checksum of an image (the format of docs/sessions.md). */
static void reseal(uint8_t *b, size_t n)
{
    if (n < 128) return;
    put_u64(b + 120, XXH3_64bits(b, 120));
    size_t at = 128;
    uint32_t ns = get_u32(b + 44);
    for (uint32_t i = 0; i < ns && n - at >= 56; i++) {
        uint64_t len = get_u64(b + at + 40);
        if (len > n - at - 56) return;
        put_u64(b + at + 48 + len, XXH3_64bits(b + at, 48 + (size_t)len));
        at += 56 + (size_t)len;
    }
    if (n - at == 16) put_u64(b + at + 8, XXH3_64bits(b, at + 8));
}

static void try_load(dsattn_v41 *m, const uint8_t *buf, size_t size)
{
    char err[512];
    dsattn_v41_seq *s = NULL;
    /* an explicit capacity: a forged header capacity must not size the caches */
    dsattn_status st = dsattn_v41_seq_load_buffer(&s, m, buf, size, 64, err, sizeof err);
    if (st == DSATTN_OK) {
        if (!s) abort();
        dsattn_v41_seq *c = NULL;
        if (dsattn_v41_seq_clone(&c, s) != DSATTN_OK) abort();
        dsattn_v41_seq_destroy(c);
        dsattn_v41_seq_destroy(s);
    } else if (s) {
        abort();                      /* a failed load returns no sequence */
    }
}

/* A real session of the model at position p (cached). */
static const uint8_t *image(dsattn_v41 *m, unsigned p, size_t *len)
{
    static uint8_t *img[9];
    static size_t n[9];
    static int made[9];
    if (!made[p]) {
        made[p] = 1;
        dsattn_ctx_params cp = dsattn_ctx_default_params();
        cp.mode = DSATTN_MODE_REFERENCE;
        dsattn_ctx *ctx = NULL;
        dsattn_v41_seq *s = NULL;
        char path[512], err[256];
        fuzz_path("seed.session", path, sizeof path);
        float *h = calloc(64 * 8 + 1, sizeof(float));
        for (int i = 0; h && i < 64 * 8; i++) h[i] = (float)((i * 37) % 17 - 8) / 8.0f;
        if (h && !dsattn_ctx_create(&ctx, &cp) &&
            !dsattn_v41_seq_create(&s, m, 16, DSATTN_V41_INDEX_K_REFERENCE) &&
            (p == 0 || !dsattn_v41_stack_forward(ctx, s, h, p, NULL, NULL)) &&
            !dsattn_v41_seq_save(s, path, err, sizeof err)) {
            FILE *f = fopen(path, "rb");
            if (f && !fseek(f, 0, SEEK_END)) {
                long k = ftell(f);
                rewind(f);
                img[p] = k > 0 ? malloc((size_t)k) : NULL;
                if (img[p] && fread(img[p], 1, (size_t)k, f) == (size_t)k) n[p] = (size_t)k;
            }
            if (f) fclose(f);
        }
        unlink(path);
        free(h);
        dsattn_v41_seq_destroy(s);
        dsattn_ctx_destroy(ctx);
    }
    *len = n[p];
    return n[p] ? img[p] : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsattn_v41 *m = model();
    if (!m || !size) return 0;
    uint8_t *buf;
    size_t n;
    int seal;
    if (data[0] == 'D') {
        n = size;
        seal = 1;
        buf = malloc(n);                  /* exact size: any over-read is caught */
        if (!buf) return 0;
        memcpy(buf, data, n);
        try_load(m, buf, n);
    } else {
        const uint8_t *img = image(m, data[0] % 9u, &n);
        if (!img) return 0;
        seal = data[0] & 0x80;
        buf = malloc(n);
        if (!buf) return 0;
        memcpy(buf, img, n);
        for (size_t i = 1; i + 3 <= size; i += 3) {
            size_t at = ((size_t)data[i] | (size_t)data[i + 1] << 8) % n;
            buf[at] ^= data[i + 2];
        }
    }
    if (seal) reseal(buf, n);
    try_load(m, buf, n);
    free(buf);
    return 0;
}
