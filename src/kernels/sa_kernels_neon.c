/* sa_kernels_neon.c - the Advanced SIMD (ARMv8.0) table of sa_kernels.h:
 * the neon table's sa slot (aarch64 builds only; CMakeLists.txt leaves
 * this file out elsewhere and absent.c then makes dsattn_sa_kern_neon_ptr
 * NULL).  The sparse-attention row decoder and the row-major QK / PV
 * register tiles of sa_kernels_avx2.c on 4 lanes and 32 registers.
 *
 * rows: FP4 16 values a step, FP8 8.  FP4 E2M1: the nibbles are split and
 * interleaved (element 2i is the low nibble) and each s.ee.m placed as the
 * fp16 s.000ee.m000000000, which is exactly 2^-14 times its value,
 * subnormal 0.5 included; FCVTL widens it, and the 2^14 is folded into
 * the block's E4M3 scale (exact), so each value is one rounding of
 * code x scale - exact, as numfmt.c's product is.  FP8 E4M3: simd_neon.h's
 * exact decoder (NaN codes NaN) times the UE8M0 scale as a float (b << 23,
 * 2^-127 for byte 0, NaN for 0xff): one rounding, numfmt.c's
 * code x 2^(e - 127).  Both decode to the unpackers' bits
 * (tests/test_sparse_attn.c, under qemu-aarch64).
 *
 * qk / pv: simd_neon.h's 6 x 16 tile (24 accumulators): QK 6 keys x 16
 * heads, PV 6 columns x 16 heads, the FMA chains of the x86 tables; the
 * loops around it are sa_tmpl.h's, shared with the AVX2 table.
 * finish: sa_tmpl.h by 4 x 4 blocks.  rows_bf16 is the scalar table's (it
 * serves only AMX contexts).  Speed on ARM hardware has not been measured
 * (none here; docs/kernels.md).
 */
#include "sa_kernels.h"

#include <arm_neon.h>
#include <string.h>

#include "mla_kernels.h"
#include "numfmt.h"
#include "simd_neon.h"

#define KT DSATTN_MLA_KT
#define AI static inline __attribute__((always_inline))

/* 8 fp16-bit lanes -> 2 x 4 floats times s */
AI void h8_times(uint16x8_t h, float32x4_t s, float *o)
{
    vst1q_f32(o, vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))), s));
    vst1q_f32(o + 4, vmulq_f32(vcvt_high_f32_f16(vreinterpretq_f16_u16(h)), s));
}

/* E2M1 nibbles (16-bit lanes) -> fp16 bits s.000ee.m000000000 */
AI uint16x8_t e2m1_h(uint16x8_t n)
{
    return vorrq_u16(vandq_u16(vshlq_n_u16(n, 9), vdupq_n_u16(0x0e00)),
                     vandq_u16(vshlq_n_u16(n, 12), vdupq_n_u16(0x8000)));
}

/* values c0..c0+15 of a V4.1 FP4 row (c0 % 16 == 0) -> o */
AI void fp4x16(const uint8_t *row, size_t d, size_t c0, float *o)
{
    const float32x4_t s = vdupq_n_f32(dsattn_e4m3_lut[row[d / 2 + c0 / 16]] * 0x1p14f);
    const uint8x8_t b = vld1_u8(row + c0 / 2);
    const uint8x8x2_t z = vzip_u8(vand_u8(b, vdup_n_u8(0x0f)), vshr_n_u8(b, 4));
    h8_times(e2m1_h(vmovl_u8(z.val[0])), s, o);
    h8_times(e2m1_h(vmovl_u8(z.val[1])), s, o + 8);
}

/* values c0..c0+7 of a V4.1 FP8 window row (c0 % 8 == 0) -> o */
AI void fp8x8(const uint8_t *row, size_t d, size_t c0, float *o)
{
    float32x4_t a, b;
    dsattn_e4m3x8_128n(vld1_u8(row + c0), &a, &b, 1);
    const float32x4_t s = vdupq_n_f32(dsattn_ue8m0_bits_f32(row[d + c0 / 32]));
    vst1q_f32(o, vmulq_f32(a, s));
    vst1q_f32(o + 4, vmulq_f32(b, s));
}

static void rows_neon(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                      size_t d, float *out, size_t ld)
{
    for (size_t r = 0; r < KT; r++) {
        float *o = out + r * ld;
        if (r >= nr) {
            for (size_t c0 = 0; c0 < d; c0 += 4) vst1q_f32(o + c0, vdupq_n_f32(0.0f));
        } else if (kinds[r] == DSATTN_SA_FP4) {
            for (size_t c0 = 0; c0 < d; c0 += 16) fp4x16(rows[r], d, c0, o + c0);
        } else {
            for (size_t c0 = 0; c0 < d; c0 += 8) fp8x8(rows[r], d, c0, o + c0);
        }
    }
}

static int rows_bf16_neon(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                          size_t d, uint16_t *out)
{
    return dsattn_sa_kern_ref.rows_bf16(rows, kinds, nr, d, out);
}

#include "sa_tmpl.h"

static void finish_neon(const float *acct, size_t hp, size_t nh, size_t d, const float *den,
                        float *out)
{
    sa_finish_128n(acct, hp, nh, d, den, out);
}

static const dsattn_sa_kern sa_neon = {
    "neon", finish_neon, rows_neon, rows_bf16_neon, sa_qk_rm, sa_pv_rm,
};
const dsattn_sa_kern *const dsattn_sa_kern_neon_ptr = &sa_neon;
