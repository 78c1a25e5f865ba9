/* pgemm_neon.c - the Advanced SIMD (ARMv8.0) table of pgemm.h: the neon
 * table's pgemm slot (aarch64 builds only; CMakeLists.txt leaves this file
 * out elsewhere and absent.c then makes dsattn_pgemm_neon_ptr NULL).
 *
 * The 12 x 32 tile of the prefill GEMM as sub-tiles on 4-lane vectors, as
 * pgemm_avx2.c runs it on 8: 6 rows x 16 tokens (simd_neon.h's tile, 24
 * accumulators; per k 4 token loads and 6 row broadcasts) for each full
 * 16 tokens, and 12 rows x 8 tokens for a last 8 (24 accumulators; per k
 * 2 token loads and 3 loads of the 12 row values, each lane feeding 2
 * FMAs by element).  Each output is one FMA chain over k in increasing
 * order, the `ref` tile's, so every table gives the same bits
 * (tests/test_pgemm.c).  pack_b transposes 4 x 4 blocks in registers;
 * tile_fp8 (pgemm_tmpl.h, shared with the x86 tables) decodes E4M3 by the
 * fp16 bit move (value / 256, the x256 folded into the block scale) for
 * finite weights, times 256 with the NaN codes blended in otherwise.
 * Speed on ARM hardware has not been measured (none here; docs/kernels.md).
 */
#include "pgemm.h"

#include <arm_neon.h>
#include <string.h>

#include "numfmt.h"
#include "simd_neon.h"

#define MR DSATTN_PGEMM_MR
#define NR DSATTN_PGEMM_NR
#define AI static inline __attribute__((always_inline))

static void pack_b_neon(const float *x, size_t ldx, size_t nt, size_t K, float *bp)
{
    for (size_t t0 = 0; t0 < NR; t0 += 4)
        for (size_t k0 = 0; k0 < K; k0 += 4) {
            const size_t kn = K - k0 >= 4 ? 4 : K - k0;
            float32x4_t r[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const size_t t = t0 + (size_t)i;
                if (t >= nt) {
                    r[i] = vdupq_n_f32(0.0f);
                } else if (kn == 4) {
                    r[i] = vld1q_f32(x + t * ldx + k0);
                } else {
                    float v[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
                    memcpy(v, x + t * ldx + k0, kn * sizeof(float));
                    r[i] = vld1q_f32(v);
                }
            }
            dsattn_tr4_128n(r);
            for (size_t c = 0; c < kn; c++) vst1q_f32(bp + (k0 + c) * NR + t0, r[c]);
        }
}

/* rows 0..11 x tokens 0..7 of b */
AI void sub12x8(const float *a, const float *b, size_t kc, float *c, size_t ldc, int first)
{
    float32x4_t acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++)
            acc[i][v] = first ? vdupq_n_f32(0.0f) : vld1q_f32(c + (size_t)i * ldc + 4 * v);
    for (size_t k = 0; k < kc; k++) {
        const float32x4_t b0 = vld1q_f32(b + k * NR), b1 = vld1q_f32(b + k * NR + 4);
        const float32x4_t av[3] = { vld1q_f32(a + k * MR), vld1q_f32(a + k * MR + 4),
                                    vld1q_f32(a + k * MR + 8) };
#define PG_ROWS(g)                                                                  \
        acc[4 * g + 0][0] = vfmaq_laneq_f32(acc[4 * g + 0][0], b0, av[g], 0);     \
        acc[4 * g + 0][1] = vfmaq_laneq_f32(acc[4 * g + 0][1], b1, av[g], 0);     \
        acc[4 * g + 1][0] = vfmaq_laneq_f32(acc[4 * g + 1][0], b0, av[g], 1);     \
        acc[4 * g + 1][1] = vfmaq_laneq_f32(acc[4 * g + 1][1], b1, av[g], 1);     \
        acc[4 * g + 2][0] = vfmaq_laneq_f32(acc[4 * g + 2][0], b0, av[g], 2);     \
        acc[4 * g + 2][1] = vfmaq_laneq_f32(acc[4 * g + 2][1], b1, av[g], 2);     \
        acc[4 * g + 3][0] = vfmaq_laneq_f32(acc[4 * g + 3][0], b0, av[g], 3);     \
        acc[4 * g + 3][1] = vfmaq_laneq_f32(acc[4 * g + 3][1], b1, av[g], 3);
        PG_ROWS(0)
        PG_ROWS(1)
        PG_ROWS(2)
#undef PG_ROWS
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) vst1q_f32(c + (size_t)i * ldc + 4 * v, acc[i][v]);
}

/* 4 finite codes -> value / 256 (the caller's scale carries the x256) */
AI float32x4_t e4m3x4_div256(const uint8_t *w)
{
    return dsattn_h4_128n(dsattn_e4m3_h_128n(dsattn_codes4_128n(w)));
}

/* 4 codes, any: the fp16 move times 256 (exact), and the scalar decode's
 * NaN (its sign from the code) where the code is s.1111.111 */
AI float32x4_t e4m3x4_exact(const uint8_t *w)
{
    const uint16x8_t b = dsattn_codes4_128n(w);
    const float32x4_t v = vmulq_n_f32(dsattn_h4_128n(dsattn_e4m3_h_128n(b)), 256.0f);
    const uint32x4_t m = dsattn_e4m3_nan4_128n(b);
    const uint32x4_t nan = vorrq_u32(vreinterpretq_u32_f32(vdupq_n_f32(dsattn_e4m3_lut[0x7f])),
                                     vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x80000000u)));
    return vbslq_f32(m, vreinterpretq_f32_u32(nan), v);
}

/* The 4 columns of the 12 rows: three 4 x 4 transposes */
#define PG_RN MR
#define pg_e4m3_div256 e4m3x4_div256
#define pg_e4m3_exact e4m3x4_exact
#define pg_sub12x8 sub12x8
#define pg_store_cols dsattn_store12x4_128n
#include "pgemm_tmpl.h"

static const dsattn_pgemm_kern pgemm_neon = {
    .name = "neon", .pack_b = pack_b_neon, .tile = pg_tile, .tile_fp8 = tile_fp8};
const dsattn_pgemm_kern *const dsattn_pgemm_neon_ptr = &pgemm_neon;
