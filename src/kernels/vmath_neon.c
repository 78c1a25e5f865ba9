/* vmath_neon.c - Advanced SIMD exp(x - m) with its sum (vmath.h), the neon
 * table's vmath slot: dsattn_exp128n of simd_neon.h, the x86 tables' exp
 * bit for bit (exactly 0 below -104, NaN propagates), 4 lanes; the tail
 * through a zero-padded copy.  The sum's order is its own (4 lanes, then
 * across them), within the bound tests/test_vmath.c holds every form to. */
#include "vmath.h"

#include <string.h>

#include "simd_neon.h"

float dsattn_exp_sub_sum_neon(float *x, size_t n, float m)
{
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t acc = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = dsattn_exp128n(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(x + i, v);
        acc = vaddq_f32(acc, v);
    }
    if (i < n) {
        float t[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        memcpy(t, x + i, (n - i) * sizeof(float));
        const float32x4_t v = dsattn_exp128n(vsubq_f32(vld1q_f32(t), vm));
        /* the padding lanes are zeroed before the sum */
        const float32x4_t k = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v),
                                                               dsattn_mask128n(n - i)));
        vst1q_f32(t, k);
        memcpy(x + i, t, (n - i) * sizeof(float));
        acc = vaddq_f32(acc, k);
    }
    return dsattn_hsum128n(acc);
}

void dsattn_exp_ftz_neon(const float *x, size_t n, float *out)
{
    for (size_t i = 0; i < n; i += 4) {
        float t[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        const size_t k = n - i < 4 ? n - i : 4;
        memcpy(t, x + i, k * sizeof(float));
        vst1q_f32(t, dsattn_exp128n_ftz(vld1q_f32(t)));
        memcpy(out + i, t, k * sizeof(float));
    }
}

static const dsattn_vmath_kern vmath_neon = { "neon", dsattn_exp_sub_sum_neon };
const dsattn_vmath_kern *const dsattn_vmath_neon_ptr = &vmath_neon;
