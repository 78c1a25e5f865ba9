/* mla_tile_neon.c - the Advanced SIMD (ARMv8.0) table of mla_kernels.h:
 * the neon table's mla slot (aarch64 builds only; CMakeLists.txt leaves
 * this file out elsewhere and absent.c then makes dsattn_mla_kern_neon_ptr
 * NULL).
 *
 * The AVX2 table's arithmetic (mla_tile_avx2.c) on 4 lanes and 32
 * registers.  QK and PV run on simd_neon.h's 6 x 16 tile, the AVX2 form's
 * sub-tiles with 16 heads as 4 vectors: 24 accumulators, per step 4 head
 * vector loads and 6 key broadcasts (LD1R) for 24 FMAs.  Every score is
 * one FMA chain over the latent elements in order and every P.V output
 * one chain from acc * alpha over the keys in order, as on x86, so QK, PV
 * and the softmax give the AVX2 and AVX-512 tables' bits (the tests hold
 * the three to one hash, tests/test_mla.c).  The softmax's exp is
 * simd_neon.h's, which is the x86 tables' bit for bit; dsv_max is x86
 * maxps there (a NaN score gives what it gives on x86).
 *
 * Decoders: E4M3 codes through fp16 as on x86 (s.eeee.mmm placed as the
 * fp16 s.0eeee.mmm0000000 is 2^-8 times the value; FCVTL widens it
 * exactly; the x256 is exact, or folded into a weight block's scale), NaN
 * codes put back as NaN; bf16 by a 16-bit shift.  All read their bytes
 * through byte loads (no alignment assumed).
 *
 * Speed on ARM hardware has not been measured (none here;
 * docs/kernels.md).
 *
 * Here: the 4-lane decoders.  Not here: what mla_tile_tmpl.h writes once
 * (the 6 x 16 sub-tile calls and key tiles it shares with AVX2, column
 * tile outer in P.V; the QK / PV loops, softmax, row decode,
 * absorption rows), the register tile itself (simd_neon.h), the driver
 * (mla_attend.c), the scalar cross-check (mla_tile.c).
 */
#include "mla_kernels.h"

#include <arm_neon.h>
#include <string.h>

#include "numfmt.h"
#include "simd_neon.h"

#define AI static inline __attribute__((always_inline))

/* ---- small vector helpers (the hooks of mla_tile_tmpl.h) ------------------ */

/* exp(x) for x <= 0: 0 below -69.3, a NaN lane returns x - the AVX2
 * table's exp8_ftz lane for lane */
AI float32x4_t exp4_ftz(float32x4_t x)
{
    return vbslq_f32(vceqq_f32(x, x), dsattn_exp128n_ftz_neg(x), x);
}

/* 4 E4M3 codes -> their exact fp32 values (NaN codes -> NaN) */
AI float32x4_t e4m3x4(const uint8_t *w)
{
    const uint16x8_t b = dsattn_codes4_128n(w);
    const float32x4_t f = vmulq_n_f32(dsattn_h4_128n(dsattn_e4m3_h_128n(b)), 256.0f);
    return vbslq_f32(dsattn_e4m3_nan4_128n(b), vdupq_n_f32(__builtin_nanf("")), f);
}

/* bf16(e4m3(w) * s) of 4 codes (NaN codes: NaN), for wscale's mode */
AI float32x4_t wrow4(const uint8_t *w, float32x4_t f1, float32x4_t f2, int mode)
{
    const uint16x8_t b = dsattn_codes4_128n(w);
    float32x4_t v = vmulq_f32(dsattn_h4_128n(dsattn_e4m3_h_128n(b)), f1);
    if (mode == 2) v = vmulq_f32(v, f2);
    if (mode != 1) v = dsattn_rbf16_128n(v);
    return vbslq_f32(dsattn_e4m3_nan4_128n(b), vdupq_n_f32(__builtin_nanf("")), v);
}

/* 8 codes without NaN codes -> their values / 256 (the first 4 in *v0) */
AI void e4m3x8_div256(const uint8_t *w, float32x4_t *v0, float32x4_t *v1)
{
    const uint16x8_t h = dsattn_e4m3_h_128n(vmovl_u8(vld1_u8(w)));
    *v0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    *v1 = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
}

/* 4 bf16 values (8 bytes at p, any alignment) -> fp32, exactly */
AI float32x4_t bf16x4(const uint8_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(p)), 16));
}

#define rbf16q dsattn_rbf16x_128n
#define exp_ftz exp4_ftz
#define wrow wrow4
#define e4m3x2_div256 e4m3x8_div256
#define bf16v bf16x4
#define e4m3v e4m3x4
#define hsumv dsattn_hsum128n

#include "mla_tile_tmpl.h"

static const dsattn_mla_kern mla_neon = {
    "neon", mla_qk, mla_softmax, mla_pv, mla_tile_rows, mla_tile_bf16, mla_v32_row,
    mla_fp8w_axpy, mla_fp8w_dot, mla_fp8w_axpy4, mla_fp8w_dot4, mla_bf16w_axpy,
    mla_round_bf16, mla_relu_wsum,
};
const dsattn_mla_kern *const dsattn_mla_kern_neon_ptr = &mla_neon;
