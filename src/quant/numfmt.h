/* numfmt.h - the number formats of DeepSeek's reference code, bit-exact:
 * BF16, FP8 E4M3 ("fn": max 448, no inf), FP4 E2M1, UE8M0/E8M0 scales, and
 * the block quantizers and packed cache-entry layouts built from them.
 *
 * Every encoder rounds to nearest, ties to even, and saturates (satfinite),
 * as the reference's casts do.  Every quantizer has two outputs that must
 * agree: the packed bytes a cache stores, and the dequantized floats the
 * reference keeps ("quant-dequant").  docs/formats.md has the byte tables.
 */
#ifndef DSATTN_NUMFMT_H
#define DSATTN_NUMFMT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ==== Scalar codecs ===================================================== */

static inline uint32_t dsattn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float dsattn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* BF16: RNE from fp32; NaN stays NaN (quieted). */
static inline uint16_t dsattn_f32_to_bf16(float f)
{
    /* a select, not a branch: loops over it vectorise (dsattn_round_bf16_n) */
    const uint32_t u = dsattn_f32_bits(f);
    const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}
static inline float dsattn_bf16_to_f32(uint16_t h) { return dsattn_bits_f32((uint32_t)h << 16); }
/* fp32 -> nearest bf16 value, returned as fp32 ("bf16 semantics"). */
static inline float dsattn_round_bf16(float f) { return dsattn_bf16_to_f32(dsattn_f32_to_bf16(f)); }

/* FP8 E4M3 "fn": bias 7, max 448, 0x7f/0xff NaN, no inf. */
uint8_t dsattn_f32_to_e4m3(float f);          /* RNE, satfinite, NaN->0x7f */
/* Decode table, filled before main() (numfmt.c); hot loops index it. */
extern float dsattn_e4m3_lut[256];
static inline float dsattn_e4m3_to_f32(uint8_t c) { return dsattn_e4m3_lut[c]; }


/* FP4 E2M1: grid 0,.5,1,1.5,2,3,4,6; bit 3 is the sign. */
uint8_t dsattn_f32_to_e2m1(float f);          /* RNE (ties to even code), satfinite */
extern const float dsattn_e2m1_table[16];
static inline float dsattn_e2m1_to_f32(uint8_t c) { return dsattn_e2m1_table[c & 15]; }

/* UE8M0 / E8M0: byte b is 2^(b-127); 0xff is NaN. */
float   dsattn_ue8m0_to_f32(uint8_t b);
/* The same value built in the bits, inline, for the SIMD kernels' block
 * scales: b << 23, byte 0 the subnormal 2^-127, 0xff a quiet NaN */
static inline float dsattn_ue8m0_bits_f32(uint8_t b)
{
    return dsattn_bits_f32(b == 0xff ? 0x7fc00000u : b == 0 ? 0x00400000u : (uint32_t)b << 23);
}
/* Byte for a power of two s in [2^-127, 2^127]; callers pass powers of two. */
uint8_t dsattn_f32_to_ue8m0(float pow2);

/* The reference's ceil rule from the bits: 2^ceil(log2(x)), computed as
 * exponent - 127 + (mantissa != 0) ("fast_round_scale").  x = amax * inv.
 * Inline (bit operations only), so an AVX-512 kernel calling it per block
 * runs it in its own encoding: an out-of-line call into this file's SSE
 * code from AVX-512 code paid an SSE/AVX transition each time. */
static inline float dsattn_pow2_ceil(float x)
{
    const uint32_t u = dsattn_f32_bits(x);
    const uint32_t ex = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (ex == 0xffu) return x;                    /* inf/NaN: pass through */
    const int e = (int)ex - 127 + (man != 0);
    return dsattn_bits_f32((uint32_t)(e + 127) << 23);
}

/* ==== Block quantizers (quant -> dequant, optionally packed) ============ */

/* FP8 E4M3 with a power-of-two UE8M0 scale per `block` values:
 * amax = max(max|x|, 1e-4); s = pow2_ceil(amax * fp32(1/448));
 * code = e4m3(clamp(x / s, -448, 448)); deq = code * s.
 * codes (n bytes) / scales (n/block bytes) / deq (n floats) may be NULL.
 * n must be a multiple of block. */
void dsattn_quant_fp8_ue8m0(const float *x, size_t n, size_t block,
                            uint8_t *codes, uint8_t *scales, float *deq);

/* FP8 E4M3 with an fp32 scale per block, power of two or not:
 * pow2 != 0: s = pow2_ceil(amax/448) (the V3.2 "ue8m0" scale_fmt), else
 * s = amax / 448 (V3 scale_fmt None).  amax floored at 1e-4 either way. */
void dsattn_quant_fp8_f32scale(const float *x, size_t n, size_t block, int pow2,
                               uint8_t *codes, float *scales, float *deq);

/* FP4 E2M1, block 16, E4M3 scale (V4.1 main compressed KV):
 * s = e4m3(max(amax, 6*2^-9) / 6); code = e2m1(clamp(x / s, -6, 6)). */
void dsattn_quant_fp4_e4m3(const float *x, size_t n, uint8_t *packed,
                           uint8_t *scales, float *deq);

/* FP4 E2M1, block 32, UE8M0 scale (V4.1 index K/Q, V4 indexer):
 * s = pow2_ceil(max(amax, 6*2^-126) * fp32(1/6)). */
void dsattn_quant_fp4_ue8m0(const float *x, size_t n, uint8_t *packed,
                            uint8_t *scales, float *deq);

/* ==== Packed cache entries ============================================== */
/* All rows are "payload, then scales".  4-bit codes: element 2i in the low
 * nibble of byte i, element 2i+1 in the high nibble.  See docs/formats.md. */

/* V4.1 main KV: d/2 E2M1 bytes + d/16 E4M3 scales.  288 B at d = 512. */
static inline size_t dsattn_v41_kv_row_bytes(size_t d)  { return d / 2 + d / 16; }
/* V4.1 / V4 index K: d/2 E2M1 bytes + d/32 UE8M0 scales.  68 B at d = 128. */
static inline size_t dsattn_fp4_index_row_bytes(size_t d) { return d / 2 + d / 32; }
/* V4.1 SWA window row: d E4M3 bytes + d/32 UE8M0.  528 B at d = 512. */
static inline size_t dsattn_v41_swa_row_bytes(size_t d) { return d + d / 32; }
/* V4 FlashMLA "MODEL1": d_nope E4M3 + 2*d_rope bf16 + d_nope/64 UE8M0 + 1 pad.
 * 584 B at 448/64. */
static inline size_t dsattn_v4_kv_row_bytes(size_t d_nope, size_t d_rope)
{ return d_nope + 2 * d_rope + d_nope / 64 + 1; }
/* V3.2 FlashMLA "V32_FP8Sparse": 512 E4M3 + 4 fp32 scales (per 128) + 64 bf16 rope = 656. */
static inline size_t dsattn_v32_kv_row_bytes(size_t d_latent, size_t d_rope)
{ return d_latent + 4 * (d_latent / 128) + 2 * d_rope; }
/* V3.2 indexer K: 128 E4M3 + one fp32 scale = 132. */
static inline size_t dsattn_v32_index_row_bytes(size_t d) { return d + 4; }

/* Quantize one row and write its packed bytes; deq (optional) receives the
 * dequantized values, identical to what unpack returns. */
void dsattn_v41_kv_pack(const float *x, size_t d, uint8_t *row, float *deq);
void dsattn_v41_kv_unpack(const uint8_t *row, size_t d, float *out);
void dsattn_fp4_index_pack(const float *x, size_t d, uint8_t *row, float *deq);
void dsattn_fp4_index_unpack(const uint8_t *row, size_t d, float *out);
void dsattn_v41_swa_pack(const float *x, size_t d, uint8_t *row, float *deq);
void dsattn_v41_swa_unpack(const uint8_t *row, size_t d, float *out);
/* V4 MODEL1: x = [nope d_nope | rope d_rope]; nope FP8 block 64 UE8M0,
 * rope stored as bf16 (x's rope values are rounded to bf16). */
void dsattn_v4_kv_pack(const float *x, size_t d_nope, size_t d_rope,
                       uint8_t *row, float *deq);
void dsattn_v4_kv_unpack(const uint8_t *row, size_t d_nope, size_t d_rope,
                         float *out);
/* V3.2 656 B: latent FP8 block 128 with pow2 fp32 scales, rope bf16. */
void dsattn_v32_kv_pack(const float *x, size_t d_latent, size_t d_rope,
                        uint8_t *row, float *deq);
void dsattn_v32_kv_unpack(const uint8_t *row, size_t d_latent, size_t d_rope,
                          float *out);
/* V3.2 indexer K 132 B: FP8 per-vector, pow2 fp32 scale. */
void dsattn_v32_index_pack(const float *x, size_t d, uint8_t *row, float *deq);
void dsattn_v32_index_unpack(const uint8_t *row, size_t d, float *out);

#endif /* DSATTN_NUMFMT_H */
