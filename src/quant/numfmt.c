/* numfmt.c - scalar codecs, block quantizers and packed cache rows.
 *
 * This file is the single definition of how dsattn turns floats into the
 * bytes DeepSeek's caches and checkpoints hold.  It is scalar on purpose:
 * quantization runs once per new cache entry (O(d) per token), never in the
 * attention inner loop, so clarity and exactness beat speed here.  The
 * rounding rules mirror the reference kernels (docs/semantics.md §2.6):
 * RNE with saturation, scales from the bits (ceil rule), true fp32 division.
 */
#include "numfmt.h"

#include <math.h>

/* ==== E4M3 ============================================================== */

static float e4m3_decode(uint8_t c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) return s ? -NAN : NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}


float dsattn_e4m3_lut[256];

/* The table is pure data computed from the format's definition; filling it
 * before main() keeps the decoder a plain load in every hot loop. */
__attribute__((constructor)) static void e4m3_lut_init(void)
{
    for (int i = 0; i < 256; i++) dsattn_e4m3_lut[i] = e4m3_decode((uint8_t)i);
}

uint8_t dsattn_f32_to_e4m3(float f)
{
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    if (a >= 448.0) return (uint8_t)(sign | 0x7e);          /* satfinite */
    if (a < ldexp(1.0, -6)) {                                /* subnormal */
        double m = nearbyint(a * 512.0);                     /* RNE       */
        return (uint8_t)(sign | (uint8_t)m);                 /* m == 8 is 2^-6 */
    }
    int ex;
    (void)frexp(a, &ex);                                     /* a = fr*2^ex */
    int e = ex - 1;                                          /* 2^e <= a    */
    double m = nearbyint(ldexp(a, 3 - e));                   /* [8, 16]     */
    if (m >= 16.0) { m = 8.0; e++; }
    return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)(m - 8.0));
}

/* ==== E2M1 ============================================================== */

const float dsattn_e2m1_table[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

uint8_t dsattn_f32_to_e2m1(float f)
{
    /* Midpoints between grid values; a tie goes to the even code, which is
     * the lower value at 0.25, 1.25, 2.5, 5 and the upper at 0.75, 1.75, 3.5.
     * NaN saturates to the largest magnitude (cvt.rn.satfinite). */
    uint8_t sign = signbit(f) ? 8 : 0;
    float a = fabsf(f);
    uint8_t c;
    if (isnan(f))        return 7;
    if (a <= 0.25f)      c = 0;
    else if (a < 0.75f)  c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f)  c = 3;
    else if (a <= 2.5f)  c = 4;
    else if (a < 3.5f)   c = 5;
    else if (a <= 5.0f)  c = 6;
    else                 c = 7;
    return (uint8_t)(sign | c);
}

/* ==== UE8M0 ============================================================= */

float dsattn_ue8m0_to_f32(uint8_t b)
{
    if (b == 0xff) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

uint8_t dsattn_f32_to_ue8m0(float pow2)
{
    int ex;
    if (!(pow2 > 0.0f) || isinf(pow2)) return 0xff;
    (void)frexpf(pow2, &ex);
    int b = ex - 1 + 127;
    if (b < 0) b = 0;
    if (b > 254) b = 254;
    return (uint8_t)b;
}


/* ==== Block quantizers ================================================== */

static float block_amax(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m || isnan(a)) m = a;
    }
    return m;
}

static float clampf(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

void dsattn_quant_fp8_ue8m0(const float *x, size_t n, size_t block,
                            uint8_t *codes, uint8_t *scales, float *deq)
{
    const float inv448 = (float)(1.0 / 448.0);
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        float amax = fmaxf(block_amax(xb, block), 1e-4f);
        float s = dsattn_pow2_ceil(amax * inv448);
        if (scales) scales[b] = dsattn_f32_to_ue8m0(s);
        for (size_t i = 0; i < block; i++) {
            uint8_t c = dsattn_f32_to_e4m3(clampf(xb[i] / s, -448.0f, 448.0f));
            if (codes) codes[b * block + i] = c;
            if (deq) deq[b * block + i] = dsattn_e4m3_to_f32(c) * s;
        }
    }
}

void dsattn_quant_fp8_f32scale(const float *x, size_t n, size_t block, int pow2,
                               uint8_t *codes, float *scales, float *deq)
{
    const float inv448 = (float)(1.0 / 448.0);
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        float amax = fmaxf(block_amax(xb, block), 1e-4f);
        float s = pow2 ? dsattn_pow2_ceil(amax * inv448) : amax * inv448;
        if (scales) scales[b] = s;
        for (size_t i = 0; i < block; i++) {
            uint8_t c = dsattn_f32_to_e4m3(clampf(xb[i] / s, -448.0f, 448.0f));
            if (codes) codes[b * block + i] = c;
            if (deq) deq[b * block + i] = dsattn_e4m3_to_f32(c) * s;
        }
    }
}

static void put_nibble(uint8_t *packed, size_t i, uint8_t code)
{
    if (i & 1) packed[i / 2] = (uint8_t)((packed[i / 2] & 0x0f) | (code << 4));
    else       packed[i / 2] = (uint8_t)((packed[i / 2] & 0xf0) | code);
}

void dsattn_quant_fp4_e4m3(const float *x, size_t n, uint8_t *packed,
                           uint8_t *scales, float *deq)
{
    const size_t block = 16;
    const float floor_ = 6.0f * 0x1p-9f;
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        float amax = fmaxf(block_amax(xb, block), floor_);
        uint8_t sc = dsattn_f32_to_e4m3(amax / 6.0f);
        float s = dsattn_e4m3_to_f32(sc);
        if (scales) scales[b] = sc;
        for (size_t i = 0; i < block; i++) {
            uint8_t c = dsattn_f32_to_e2m1(clampf(xb[i] / s, -6.0f, 6.0f));
            if (packed) put_nibble(packed, b * block + i, c);
            if (deq) deq[b * block + i] = dsattn_e2m1_to_f32(c) * s;
        }
    }
}

void dsattn_quant_fp4_ue8m0(const float *x, size_t n, uint8_t *packed,
                            uint8_t *scales, float *deq)
{
    const size_t block = 32;
    const float floor_ = 6.0f * 0x1p-126f;
    const float inv6 = (float)(1.0 / 6.0);
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        float amax = fmaxf(block_amax(xb, block), floor_);
        float s = dsattn_pow2_ceil(amax * inv6);
        if (scales) scales[b] = dsattn_f32_to_ue8m0(s);
        for (size_t i = 0; i < block; i++) {
            uint8_t c = dsattn_f32_to_e2m1(clampf(xb[i] / s, -6.0f, 6.0f));
            if (packed) put_nibble(packed, b * block + i, c);
            if (deq) deq[b * block + i] = dsattn_e2m1_to_f32(c) * s;
        }
    }
}

/* ==== Packed rows ======================================================= */

void dsattn_v41_kv_pack(const float *x, size_t d, uint8_t *row, float *deq)
{
    dsattn_quant_fp4_e4m3(x, d, row, row + d / 2, deq);
}

/* An FP4 row: d/2 bytes of E2M1 nibbles (low nibble first), then one
 * scale byte per `group` values, decoded by `scale`. */
static inline void fp4_row_unpack(const uint8_t *row, size_t d, size_t group,
                                  float (*scale)(uint8_t), float *out)
{
    const uint8_t *sc = row + d / 2;
    for (size_t i = 0; i < d; i++) {
        uint8_t c = (i & 1) ? (uint8_t)(row[i / 2] >> 4) : (uint8_t)(row[i / 2] & 15);
        out[i] = dsattn_e2m1_to_f32(c) * scale(sc[i / group]);
    }
}

void dsattn_v41_kv_unpack(const uint8_t *row, size_t d, float *out)
{
    fp4_row_unpack(row, d, 16, dsattn_e4m3_to_f32, out);
}

void dsattn_fp4_index_pack(const float *x, size_t d, uint8_t *row, float *deq)
{
    dsattn_quant_fp4_ue8m0(x, d, row, row + d / 2, deq);
}

void dsattn_fp4_index_unpack(const uint8_t *row, size_t d, float *out)
{
    fp4_row_unpack(row, d, 32, dsattn_ue8m0_to_f32, out);
}

void dsattn_v41_swa_pack(const float *x, size_t d, uint8_t *row, float *deq)
{
    dsattn_quant_fp8_ue8m0(x, d, 32, row, row + d, deq);
}

void dsattn_v41_swa_unpack(const uint8_t *row, size_t d, float *out)
{
    for (size_t i = 0; i < d; i++)
        out[i] = dsattn_e4m3_to_f32(row[i]) * dsattn_ue8m0_to_f32(row[d + i / 32]);
}

void dsattn_v4_kv_pack(const float *x, size_t d_nope, size_t d_rope,
                       uint8_t *row, float *deq)
{
    dsattn_quant_fp8_ue8m0(x, d_nope, 64, row, row + d_nope + 2 * d_rope, deq);
    for (size_t i = 0; i < d_rope; i++) {
        uint16_t h = dsattn_f32_to_bf16(x[d_nope + i]);
        row[d_nope + 2 * i]     = (uint8_t)(h & 0xff);
        row[d_nope + 2 * i + 1] = (uint8_t)(h >> 8);
        if (deq) deq[d_nope + i] = dsattn_bf16_to_f32(h);
    }
    row[d_nope + 2 * d_rope + d_nope / 64] = 0;             /* pad byte */
}

void dsattn_v4_kv_unpack(const uint8_t *row, size_t d_nope, size_t d_rope,
                         float *out)
{
    const uint8_t *sc = row + d_nope + 2 * d_rope;
    for (size_t i = 0; i < d_nope; i++)
        out[i] = dsattn_e4m3_to_f32(row[i]) * dsattn_ue8m0_to_f32(sc[i / 64]);
    for (size_t i = 0; i < d_rope; i++) {
        uint16_t h = (uint16_t)(row[d_nope + 2 * i] | (row[d_nope + 2 * i + 1] << 8));
        out[d_nope + i] = dsattn_bf16_to_f32(h);
    }
}

static void put_f32le(uint8_t *p, float f)
{
    uint32_t u = dsattn_f32_bits(f);
    p[0] = (uint8_t)u; p[1] = (uint8_t)(u >> 8); p[2] = (uint8_t)(u >> 16); p[3] = (uint8_t)(u >> 24);
}

static float get_f32le(const uint8_t *p)
{
    return dsattn_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                           (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

void dsattn_v32_kv_pack(const float *x, size_t d_latent, size_t d_rope,
                        uint8_t *row, float *deq)
{
    size_t nb = d_latent / 128;
    float sc[64];
    for (size_t b = 0; b < nb; b++)
        dsattn_quant_fp8_f32scale(x + b * 128, 128, 128, 1, row + b * 128, &sc[b],
                                  deq ? deq + b * 128 : NULL);
    for (size_t b = 0; b < nb; b++) put_f32le(row + d_latent + 4 * b, sc[b]);
    uint8_t *rp = row + d_latent + 4 * nb;
    for (size_t i = 0; i < d_rope; i++) {
        uint16_t h = dsattn_f32_to_bf16(x[d_latent + i]);
        rp[2 * i] = (uint8_t)(h & 0xff);
        rp[2 * i + 1] = (uint8_t)(h >> 8);
        if (deq) deq[d_latent + i] = dsattn_bf16_to_f32(h);
    }
}

void dsattn_v32_kv_unpack(const uint8_t *row, size_t d_latent, size_t d_rope,
                          float *out)
{
    size_t nb = d_latent / 128;
    for (size_t i = 0; i < d_latent; i++)
        out[i] = dsattn_e4m3_to_f32(row[i]) * get_f32le(row + d_latent + 4 * (i / 128));
    const uint8_t *rp = row + d_latent + 4 * nb;
    for (size_t i = 0; i < d_rope; i++)
        out[d_latent + i] = dsattn_bf16_to_f32((uint16_t)(rp[2 * i] | (rp[2 * i + 1] << 8)));
}

void dsattn_v32_index_pack(const float *x, size_t d, uint8_t *row, float *deq)
{
    float s;
    dsattn_quant_fp8_f32scale(x, d, d, 1, row, &s, deq);
    put_f32le(row + d, s);
}

void dsattn_v32_index_unpack(const uint8_t *row, size_t d, float *out)
{
    float s = get_f32le(row + d);
    for (size_t i = 0; i < d; i++) out[i] = dsattn_e4m3_to_f32(row[i]) * s;
}
