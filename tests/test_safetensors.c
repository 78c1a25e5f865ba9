/* test_safetensors.c - the safetensors reader/writer and the JSON config
 * getters: round trips for every dtype, the golden vectors file, and one
 * hand-made malformed buffer per defect, each rejected with the right
 * status (and, under ASan, without touching a byte it should not). */
#include "harness.h"
#include "jsoncfg.h"
#include "numfmt.h"
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char st_tmp[DSATTN_TEST_PATH];
static const char *tmp_path(const char *tag)
{
    dsattn_test_tmp(st_tmp, sizeof st_tmp, "dsattn_test_st_%s.safetensors", tag);
    return st_tmp;
}

DSATTN_TEST(safetensors, roundtrip_all_dtypes)
{
    dsattn_rng rng = { 7 };
    enum { N = 37 };            /* odd: exercises unaligned tensor starts */
    float f32[N];
    uint16_t f16[N], bf16[N];
    uint8_t e4m3[N], e8m0[N], u8[N];
    int8_t i8[N];
    int32_t i32[N];
    int64_t i64[N];
    for (int i = 0; i < N; i++) {
        f32[i] = dsattn_rng_normal(&rng);
        bf16[i] = dsattn_f32_to_bf16(f32[i]);
        e4m3[i] = dsattn_f32_to_e4m3(f32[i] * 10);
        e8m0[i] = (uint8_t)(120 + i % 15);
        u8[i] = (uint8_t)(i * 7);
        i8[i] = (int8_t)(i * 5 - 90);
        i32[i] = i * 1000 - 17000;
        i64[i] = (int64_t)i * 100000000 - 5;
    }
    /* 1.0, -2.0, 0.5, 65504 (max), smallest subnormal 2^-24, -0 */
    const uint16_t f16v[] = { 0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000 };
    for (int i = 0; i < N; i++) f16[i] = f16v[i % 6];

    dsattn_st_writer *w = dsattn_st_writer_create();
    CHECK(w != NULL);
    int64_t s1[1] = { N }, s3[3] = { 1, N, 1 };
    CHECK_OK(dsattn_st_writer_add(w, "u8", DSATTN_DT_U8, 1, s1, u8));
    CHECK_OK(dsattn_st_writer_add(w, "f32", DSATTN_DT_F32, 3, s3, f32));
    CHECK_OK(dsattn_st_writer_add(w, "f16", DSATTN_DT_F16, 1, s1, f16));
    CHECK_OK(dsattn_st_writer_add(w, "bf16", DSATTN_DT_BF16, 1, s1, bf16));
    CHECK_OK(dsattn_st_writer_add(w, "e4m3", DSATTN_DT_F8_E4M3, 1, s1, e4m3));
    CHECK_OK(dsattn_st_writer_add(w, "e8m0", DSATTN_DT_F8_E8M0, 1, s1, e8m0));
    CHECK_OK(dsattn_st_writer_add(w, "i8", DSATTN_DT_I8, 1, s1, i8));
    CHECK_OK(dsattn_st_writer_add(w, "i32", DSATTN_DT_I32, 1, s1, i32));
    CHECK_OK(dsattn_st_writer_add(w, "i64", DSATTN_DT_I64, 1, s1, i64));
    CHECK_OK(dsattn_st_writer_add(w, "scalar", DSATTN_DT_F32, 0, NULL, f32));
    int64_t s0[2] = { 0, 5 };
    CHECK_OK(dsattn_st_writer_add(w, "empty", DSATTN_DT_F32, 2, s0, NULL));
    CHECK_EQ_INT(dsattn_st_writer_add(w, "u8", DSATTN_DT_U8, 1, s1, u8),
                 DSATTN_ERR_INVALID_ARG);                   /* duplicate */
    CHECK_OK(dsattn_st_writer_meta(w, "format", "pt"));
    CHECK_OK(dsattn_st_writer_meta(w, "quote\"d", "back\\slash\nnl"));
    char err[512] = "";
    const char *path = tmp_path("rt");
    CHECK_OK(dsattn_st_writer_save(w, path, err, sizeof err));
    dsattn_st_writer_destroy(w);

    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open(&f, path, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "open: %s", err);
    if (!f) return;
    CHECK_EQ_INT(dsattn_st_count(f), 11);
    CHECK(strcmp(dsattn_st_meta(f, "format"), "pt") == 0);
    CHECK(strcmp(dsattn_st_meta(f, "quote\"d"), "back\\slash\nnl") == 0);
    CHECK(dsattn_st_meta(f, "nope") == NULL);
    CHECK(dsattn_st_find(f, "nope") == NULL);
    /* data section is 8-byte aligned; file order is insertion order */
    CHECK_EQ_INT(dsattn_st_at(f, 0)->offset % 8, 0);
    CHECK(strcmp(dsattn_st_at(f, 0)->name, "u8") == 0);

    float got[N];
    const dsattn_st_tensor *t = dsattn_st_find(f, "f32");
    CHECK(t && t->dtype == DSATTN_DT_F32 && t->ndim == 3 && t->shape[1] == N &&
          t->numel == N && t->nbytes == 4 * N);
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    CHECK_BITS("f32", got, f32, N);
    CHECK_EQ_INT(dsattn_st_to_f32(t, got, N - 1), DSATTN_ERR_INVALID_ARG);

    float want[N];
    t = dsattn_st_find(f, "f16");
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    const float f16f[] = { 1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, -0.0f };
    for (int i = 0; i < N; i++) want[i] = f16f[i % 6];
    CHECK_BITS("f16", got, want, N);
    CHECK(signbit(got[5]));

    t = dsattn_st_find(f, "bf16");
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    for (int i = 0; i < N; i++) want[i] = dsattn_bf16_to_f32(bf16[i]);
    CHECK_BITS("bf16", got, want, N);

    t = dsattn_st_find(f, "e4m3");
    CHECK(t && t->dtype == DSATTN_DT_F8_E4M3 && t->nbytes == N);
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    for (int i = 0; i < N; i++) want[i] = dsattn_e4m3_to_f32(e4m3[i]);
    CHECK_BITS("e4m3", got, want, N);

    t = dsattn_st_find(f, "e8m0");
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    for (int i = 0; i < N; i++) want[i] = ldexpf(1.0f, e8m0[i] - 127);
    CHECK_BITS("e8m0", got, want, N);

    t = dsattn_st_find(f, "u8");
    CHECK(memcmp(t->data, u8, N) == 0);
    t = dsattn_st_find(f, "i8");
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    for (int i = 0; i < N; i++) want[i] = (float)i8[i];
    CHECK_BITS("i8", got, want, N);
    t = dsattn_st_find(f, "i32");
    CHECK_OK(dsattn_st_to_f32(t, got, N));
    for (int i = 0; i < N; i++) want[i] = (float)i32[i];
    CHECK_BITS("i32", got, want, N);
    t = dsattn_st_find(f, "i64");
    CHECK(t && t->nbytes == 8 * N && memcmp(t->data, i64, sizeof i64) == 0);
    t = dsattn_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4);
    t = dsattn_st_find(f, "empty");
    CHECK(t && t->ndim == 2 && t->numel == 0 && t->nbytes == 0);
    dsattn_st_close(f);
    unlink(path);
}

DSATTN_TEST(safetensors, golden_vectors)
{
    char err[512] = "";
    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open(
        &f, dsattn_test_data("golden/v41/vectors.safetensors"), err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "%s", err);
    if (!f) return;
    CHECK_EQ_INT(dsattn_st_count(f), 37);
    const dsattn_st_tensor *t = dsattn_st_find(f, "fp4_main.packed");
    CHECK(t && t->dtype == DSATTN_DT_U8 && t->ndim == 2 && t->shape[0] == 48 &&
          t->shape[1] == 288);
    t = dsattn_st_find(f, "sparse_attn.q");
    CHECK(t && t->dtype == DSATTN_DT_F32 && t->ndim == 3 && t->shape[0] == 6 &&
          t->shape[1] == 64 && t->shape[2] == 512);
    t = dsattn_st_find(f, "rope.pos");
    CHECK(t && t->dtype == DSATTN_DT_I32 && t->shape[0] == 306);
    CHECK(dsattn_st_meta(f, "kind") && strcmp(dsattn_st_meta(f, "kind"), "vectors") == 0);
    const char *tol = dsattn_st_meta(f, "tolerances");
    CHECK(tol && strstr(tol, "\"sparse_attn.out\": \"rel:5e-3\"") != NULL);
    /* file order: first tensor starts at the data section */
    t = dsattn_st_at(f, 0);
    CHECK(t && strcmp(t->name, "fp4_main.in") == 0 && t->offset == 8 + 3800);
    /* e4m3.code (U8 bytes) is what our codec makes of e4m3.in (F32) */
    const dsattn_st_tensor *ti = dsattn_st_find(f, "e4m3.in");
    t = dsattn_st_find(f, "e4m3.code");
    if (t && ti && ti->numel == 268 && t->numel == 268) {
        float in[268], code[268];
        CHECK_OK(dsattn_st_to_f32(ti, in, 268));
        CHECK_OK(dsattn_st_to_f32(t, code, 268));
        int bad = 0;
        for (int i = 0; i < 268; i++)
            bad += code[i] != (float)dsattn_f32_to_e4m3(in[i]);
        CHECK_EQ_INT(bad, 0);
    }
    dsattn_st_close(f);
}

/* ==== Malformed buffers ================================================= */

/* Build "u64 len | header | data" in a fresh heap buffer of exactly the
 * stated size, so ASan catches any read past it. */
static uint8_t *mk(const char *hdr, uint64_t claimed_len, size_t data_len,
                   size_t *out_len)
{
    size_t hl = strlen(hdr);
    size_t n = 8 + hl + data_len;
    uint8_t *b = malloc(n ? n : 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(claimed_len >> (8 * i));
    memcpy(b + 8, hdr, hl);
    memset(b + 8 + hl, 0x3c, data_len);
    *out_len = n;
    return b;
}

static dsattn_status try_buf(const char *hdr, size_t data_len, char *err,
                             size_t errlen)
{
    size_t n;
    uint8_t *b = mk(hdr, strlen(hdr), data_len, &n);
    dsattn_st_file *f = NULL;
    dsattn_status st = dsattn_st_open_buffer_named(&f, b, n, "bad.safetensors",
                                                   err, errlen);
    if (st == DSATTN_OK) CHECK(f != NULL);
    else CHECK(f == NULL);
    dsattn_st_close(f);
    free(b);
    return st;
}

#define EXPECT_BAD(hdr, dlen, status, needle)                                  \
    do {                                                                       \
        char e_[512] = "";                                                     \
        dsattn_status s_ = try_buf(hdr, dlen, e_, sizeof e_);                  \
        CHECK_MSG(s_ == (status), "%s: got %d want %d (%s)", hdr, (int)s_,     \
                  (int)(status), e_);                                          \
        CHECK_MSG(strstr(e_, needle) != NULL, "error '%s' lacks '%s'", e_,     \
                  needle);                                                     \
        CHECK_MSG(strstr(e_, "bad.safetensors") != NULL, "no file in '%s'", e_); \
    } while (0)

DSATTN_TEST(safetensors, malformed_truncated)
{
    uint8_t b[5] = { 1, 0, 0, 0, 0 };
    char err[256] = "";
    dsattn_st_file *f = NULL;
    CHECK_EQ_INT(dsattn_st_open_buffer(&f, b, sizeof b, err, sizeof err),
                 DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "truncated") != NULL);
    CHECK_EQ_INT(dsattn_st_open_buffer(&f, NULL, 0, err, sizeof err),
                 DSATTN_ERR_FORMAT);
    CHECK(f == NULL);
    /* A valid file cut short inside its data section. */
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    EXPECT_BAD(h, 15, DSATTN_ERR_FORMAT, "past the data section");
    CHECK_EQ_INT(try_buf(h, 16, err, sizeof err), DSATTN_OK);
}

DSATTN_TEST(safetensors, malformed_header_len_beyond_file)
{
    size_t n;
    uint8_t *b = mk("{}", 1000, 0, &n);
    char err[256] = "";
    dsattn_st_file *f = NULL;
    CHECK_EQ_INT(dsattn_st_open_buffer(&f, b, n, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "header length 1000") != NULL);
    free(b);
    b = mk("{}", UINT64_MAX, 0, &n);        /* would wrap 8 + len */
    CHECK_EQ_INT(dsattn_st_open_buffer(&f, b, n, err, sizeof err), DSATTN_ERR_FORMAT);
    free(b);
}

DSATTN_TEST(safetensors, malformed_not_json)
{
    EXPECT_BAD("{\"a\": [1, 2", 0, DSATTN_ERR_FORMAT, "not valid JSON");
    EXPECT_BAD("garbage!", 0, DSATTN_ERR_FORMAT, "not valid JSON");
    EXPECT_BAD("[1, 2, 3]", 0, DSATTN_ERR_FORMAT, "not an object");
    EXPECT_BAD("{} x", 0, DSATTN_ERR_FORMAT, "garbage after");
    EXPECT_BAD("{\"a\": 3}", 0, DSATTN_ERR_FORMAT, "not an object");
    EXPECT_BAD("{\"__metadata__\": {\"k\": 1}}", 0, DSATTN_ERR_FORMAT, "not a string");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
               "\"extra\":1}}", 4, DSATTN_ERR_FORMAT, "'extra'");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
               4, DSATTN_ERR_FORMAT, "shape[0]");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
               4, DSATTN_ERR_FORMAT, "shape[0]");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DSATTN_ERR_FORMAT,
               "data_offsets");
    /* header padded with spaces is fine */
    char err[256];
    CHECK_EQ_INT(try_buf("{}      ", 0, err, sizeof err), DSATTN_OK);
}

DSATTN_TEST(safetensors, malformed_offsets)
{
    /* out of range */
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               12, DSATTN_ERR_FORMAT, "'a'");
    /* end < begin */
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}",
               12, DSATTN_ERR_FORMAT, "end 4 < begin 8");
    /* huge offset (2^53) */
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
               "\"data_offsets\":[9007199254740991,9007199254740992]}}",
               4, DSATTN_ERR_FORMAT, "past the data section");
    /* above 2^53: not an exact integer */
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
               "\"data_offsets\":[0,18446744073709551616]}}",
               4, DSATTN_ERR_FORMAT, "data_offsets");
}

DSATTN_TEST(safetensors, malformed_overlap)
{
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, DSATTN_ERR_FORMAT, "overlaps");
    /* fully contained, listed first */
    EXPECT_BAD("{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[5,6]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
               12, DSATTN_ERR_FORMAT, "overlaps");
    /* adjacent is fine, and so is a hole, and an empty tensor anywhere */
    char err[256] = "";
    CHECK_EQ_INT(try_buf("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                         12, err, sizeof err), DSATTN_OK);
}

DSATTN_TEST(safetensors, malformed_size_mismatch)
{
    EXPECT_BAD("{\"a\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[0,16]}}",
               16, DSATTN_ERR_FORMAT, "needs 12");
}

DSATTN_TEST(safetensors, malformed_unknown_dtype)
{
    EXPECT_BAD("{\"a\":{\"dtype\":\"F8_E5M3\",\"shape\":[1],\"data_offsets\":[0,1]}}",
               1, DSATTN_ERR_FORMAT, "unknown dtype \"F8_E5M3\"");
    EXPECT_BAD("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}",
               1, DSATTN_ERR_FORMAT, "dtype");
}

/* Every dtype of the format parses, with its byte count; the sub-byte ones
 * are packed and must come out in whole bytes. */
DSATTN_TEST(safetensors, every_format_dtype)
{
    static const struct { const char *name; unsigned bits; } dt[] = {
        { "BOOL", 8 }, { "U8", 8 }, { "I8", 8 }, { "F8_E5M2", 8 }, { "F8_E4M3", 8 },
        { "F8_E8M0", 8 }, { "F8_E4M3FNUZ", 8 }, { "F8_E5M2FNUZ", 8 }, { "I16", 16 },
        { "U16", 16 }, { "F16", 16 }, { "BF16", 16 }, { "I32", 32 }, { "U32", 32 },
        { "F32", 32 }, { "C64", 64 }, { "F64", 64 }, { "I64", 64 }, { "U64", 64 },
        { "F4", 4 }, { "F6_E2M3", 6 }, { "F6_E3M2", 6 },
    };
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        dsattn_dtype d;
        CHECK_OK(dsattn_dtype_parse(dt[i].name, &d));
        CHECK_EQ_INT(dsattn_dtype_bits(d), dt[i].bits);
        CHECK(strcmp(dsattn_dtype_name(d), dt[i].name) == 0);
        CHECK_EQ_INT(dsattn_dtype_size(d), dt[i].bits % 8 ? 0 : dt[i].bits / 8);
        /* 12 elements: a whole number of bytes at every width */
        char h[160], err[256] = "";
        size_t nb = 12 * dt[i].bits / 8;
        snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"%s\",\"shape\":[3,4],\"data_offsets\":[0,%zu]}}",
                 dt[i].name, nb);
        CHECK_MSG(try_buf(h, nb, err, sizeof err) == DSATTN_OK, "%s: %s", dt[i].name, err);
    }
    /* 3 F4 values are 12 bits, 5 F6 values 30: not whole bytes */
    EXPECT_BAD("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}",
               2, DSATTN_ERR_FORMAT, "whole number of bytes");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[5],\"data_offsets\":[0,4]}}",
               4, DSATTN_ERR_FORMAT, "whole number of bytes");
    /* and the byte count is checked against the offsets like any other */
    EXPECT_BAD("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               4, DSATTN_ERR_FORMAT, "needs 2");
    size_t nb = 0;
    CHECK_EQ_INT(dsattn_dtype_nbytes(DSATTN_DT_F4, SIZE_MAX, &nb), DSATTN_ERR_OVERFLOW);
    CHECK_EQ_INT(dsattn_dtype_nbytes((dsattn_dtype)999, 1, &nb), DSATTN_ERR_INVALID_ARG);
    /* the writer refuses a partial byte */
    dsattn_st_writer *w = dsattn_st_writer_create();
    int64_t three = 3;
    uint8_t b[2] = { 0, 0 };
    CHECK_EQ_INT(dsattn_st_writer_add(w, "x", DSATTN_DT_F4, 1, &three, b), DSATTN_ERR_INVALID_ARG);
    dsattn_st_writer_destroy(w);
}

DSATTN_TEST(safetensors, malformed_shape_overflow)
{
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
               "\"data_offsets\":[0,0]}}", 0, DSATTN_ERR_OVERFLOW, "overflow");
    /* product fits, times dtype size does not */
    EXPECT_BAD("{\"a\":{\"dtype\":\"I64\",\"shape\":[4294967296,1073741824],"
               "\"data_offsets\":[0,0]}}", 0, DSATTN_ERR_OVERFLOW, "overflow");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
               "\"data_offsets\":[0,4]}}", 4, DSATTN_ERR_FORMAT, "9 dimensions");
}

DSATTN_TEST(safetensors, malformed_duplicate_name)
{
    EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, DSATTN_ERR_FORMAT, "appears twice");
}

DSATTN_TEST(safetensors, open_missing_file)
{
    char err[256] = "";
    dsattn_st_file *f = NULL;
    CHECK_EQ_INT(dsattn_st_open(&f, "/nonexistent/x.safetensors", err, sizeof err),
                 DSATTN_ERR_NOT_FOUND);
    CHECK(strstr(err, "/nonexistent/x.safetensors") != NULL);
    CHECK(f == NULL);
}

/* Every prefix of a valid file must be rejected cleanly or accepted as a
 * valid (smaller) file, never read out of bounds. */
DSATTN_TEST(safetensors, every_truncation)
{
    dsattn_st_writer *w = dsattn_st_writer_create();
    int64_t s[2] = { 3, 5 };
    float d[15] = { 0 };
    CHECK_OK(dsattn_st_writer_add(w, "x", DSATTN_DT_F32, 2, s, d));
    CHECK_OK(dsattn_st_writer_add(w, "y", DSATTN_DT_BF16, 2, s, NULL));
    CHECK_OK(dsattn_st_writer_meta(w, "m", "v"));
    char err[256];
    const char *path = tmp_path("trunc");
    CHECK_OK(dsattn_st_writer_save(w, path, err, sizeof err));
    dsattn_st_writer_destroy(w);
    FILE *fp = fopen(path, "rb");
    uint8_t full[4096];
    size_t n = fread(full, 1, sizeof full, fp);
    fclose(fp);
    unlink(path);
    for (size_t k = 0; k < n; k++) {
        uint8_t *b = malloc(k ? k : 1);
        memcpy(b, full, k);
        dsattn_st_file *f = NULL;
        dsattn_status st = dsattn_st_open_buffer(&f, b, k, err, sizeof err);
        CHECK_MSG(st != DSATTN_OK, "prefix %zu accepted", k);
        dsattn_st_close(f);
        free(b);
    }
    dsattn_st_file *f = NULL;
    CHECK_OK(dsattn_st_open_buffer(&f, full, n, err, sizeof err));
    dsattn_st_close(f);
}

/* ==== JSON config getters =============================================== */

DSATTN_TEST(safetensors, jsoncfg_getters)
{
    const char *txt = "{\"n\": 12, \"f\": 2.5, \"b\": true, \"s\": \"csa2\","
                      " \"arr\": [0, 0, 4, 128], \"half\": 3.5, \"nul\": null,"
                      " \"sub\": {\"k\": 1}, \"big\": [1,2,3,4,5,6,7,8,9]}";
    cJSON *j = NULL;
    char err[256] = "";
    CHECK_OK(dsattn_jcfg_parse(&j, txt, strlen(txt), "cfg.json", err, sizeof err));
    if (!j) return;
    int64_t i;
    double d;
    bool b;
    const char *s;
    int64_t arr[8];
    size_t n;
    CHECK_OK(dsattn_jcfg_int(j, "n", &i, err, sizeof err));
    CHECK_EQ_INT(i, 12);
    CHECK_OK(dsattn_jcfg_double(j, "f", &d, err, sizeof err));
    CHECK(d == 2.5);
    CHECK_OK(dsattn_jcfg_double(j, "n", &d, err, sizeof err));  /* int is a number */
    CHECK_OK(dsattn_jcfg_bool(j, "b", &b, err, sizeof err));
    CHECK(b);
    CHECK_OK(dsattn_jcfg_string(j, "s", &s, err, sizeof err));
    CHECK(strcmp(s, "csa2") == 0);
    CHECK_OK(dsattn_jcfg_int_array(j, "arr", arr, 8, &n, err, sizeof err));
    CHECK(n == 4 && arr[3] == 128);
    const cJSON *sub;
    CHECK_OK(dsattn_jcfg_object(j, "sub", &sub, err, sizeof err));
    CHECK_OK(dsattn_jcfg_int(sub, "k", &i, err, sizeof err));

    CHECK_EQ_INT(dsattn_jcfg_int(j, "missing", &i, err, sizeof err), DSATTN_ERR_NOT_FOUND);
    CHECK(strstr(err, "'missing'") != NULL);
    CHECK_EQ_INT(dsattn_jcfg_int(j, "nul", &i, err, sizeof err), DSATTN_ERR_NOT_FOUND);
    CHECK_EQ_INT(dsattn_jcfg_int(j, "half", &i, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "'half'") != NULL);
    CHECK_EQ_INT(dsattn_jcfg_int(j, "s", &i, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK_EQ_INT(dsattn_jcfg_bool(j, "n", &b, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK_EQ_INT(dsattn_jcfg_string(j, "n", &s, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK_EQ_INT(dsattn_jcfg_int_array(j, "big", arr, 8, &n, err, sizeof err),
                 DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "'big'") != NULL);
    CHECK_EQ_INT(dsattn_jcfg_object(j, "arr", &sub, err, sizeof err), DSATTN_ERR_FORMAT);

    CHECK_OK(dsattn_jcfg_int_opt(j, "missing", 5, &i, err, sizeof err));
    CHECK_EQ_INT(i, 5);
    CHECK_EQ_INT(dsattn_jcfg_int_opt(j, "s", 5, &i, err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK_OK(dsattn_jcfg_bool_opt(j, "missing", true, &b, err, sizeof err));
    CHECK(b);
    CHECK_OK(dsattn_jcfg_string_opt(j, "missing", "x", &s, err, sizeof err));
    CHECK(strcmp(s, "x") == 0);
    CHECK_OK(dsattn_jcfg_double_opt(j, "f", 1.0, &d, err, sizeof err));
    CHECK(d == 2.5);
    cJSON_Delete(j);

    CHECK_EQ_INT(dsattn_jcfg_parse(&j, "{\"a\":", 5, "x.json", err, sizeof err),
                 DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "x.json") != NULL);
    CHECK_EQ_INT(dsattn_jcfg_parse(&j, "[1]", 3, "x.json", err, sizeof err),
                 DSATTN_ERR_FORMAT);
}

DSATTN_TEST(safetensors, jsoncfg_load_file)
{
    cJSON *j = NULL;
    char err[256] = "";
    CHECK_OK(dsattn_jcfg_load(&j, dsattn_test_data("golden/v41/tiny-seed0/config.json"),
                              err, sizeof err));
    int64_t n_layers = 0, arr[64];
    size_t n = 0;
    CHECK_OK(dsattn_jcfg_int(j, "n_layers", &n_layers, err, sizeof err));
    CHECK_OK(dsattn_jcfg_int_array(j, "compress_ratios", arr, 64, &n, err, sizeof err));
    CHECK(n >= (size_t)n_layers && n_layers > 0);
    cJSON_Delete(j);
    CHECK_EQ_INT(dsattn_jcfg_load(&j, "/nonexistent.json", err, sizeof err),
                 DSATTN_ERR_NOT_FOUND);
    CHECK(strstr(err, "/nonexistent.json") != NULL);
}
