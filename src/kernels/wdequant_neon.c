/* wdequant_neon.c - E4M3 bytes to fp32 sixteen at a time on Advanced SIMD
 * (wdequant.h), the neon table's wdq slot: the decode of wdequant_avx2.c
 * (dsattn_e4m3x8_128n of simd_neon.h: the code moved into an fp16, FCVTL
 * and an exact * 256, the NaN codes 0x7f / 0xff NaN), times the block
 * scale, one rounding, as the scalar twin (wdequant.c): bit-exact (a NaN
 * code gives a NaN, its sign not part of the contract, as on x86). */
#include "wdequant.h"

#include "numfmt.h"
#include "simd_neon.h"

void dsattn_fp8_row_f32_neon(const uint8_t *w, const float *scale, size_t bs, size_t k,
                             float *out)
{
    size_t i = 0;
    for (; i + 16 <= k; i += 16) {
        float32x4_t f[4], s[4];
        const uint8x16_t c = vld1q_u8(w + i);
        dsattn_e4m3x8_128n(vget_low_u8(c), &f[0], &f[1], 1);
        dsattn_e4m3x8_128n(vget_high_u8(c), &f[2], &f[3], 1);
        if (bs % 4 == 0) {
            for (int j = 0; j < 4; j++) s[j] = vdupq_n_f32(scale[(i + 4 * (size_t)j) / bs]);
        } else {
            float tmp[16];
            for (size_t j = 0; j < 16; j++) tmp[j] = scale[(i + j) / bs];
            for (int j = 0; j < 4; j++) s[j] = vld1q_f32(tmp + 4 * j);
        }
        for (int j = 0; j < 4; j++) vst1q_f32(out + i + 4 * j, vmulq_f32(f[j], s[j]));
    }
    for (; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

static const dsattn_wdequant_kern wdequant_neon = { "neon", dsattn_fp8_row_f32_neon };
const dsattn_wdequant_kern *const dsattn_wdequant_neon_ptr = &wdequant_neon;
