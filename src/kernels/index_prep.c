/* index_prep.c - the query layout shared by both integer forms of the
 * lightning-indexer score (the `index` slot: index_vnni_avx512.c,
 * index_avx2.c): one token's FP4-QDQ queries as int8 half-units in the
 * [dh/4][64 heads][4] byte order, the per-block bias correction of the
 * unsigned x signed byte dots, the block units as float and double, the
 * exponent range that decides the fp32 block scaling, and the keys' code
 * table.  Plain C, built for every architecture, so either form's table
 * calls the same prepare and no AVX-512 instruction reaches an AVX2 host.
 */
#include "index_vnni.h"

#include "numfmt.h"

#include <math.h>
#include <string.h>

const int8_t dsattn_index_k_lut[16] = { 12, 13, 14, 15, 16, 18, 20, 24,
                                        12, 11, 10, 9, 8, 6, 4, 0 };

int dsattn_index_q_prepare(dsattn_index_vnni_q *p, const float *q, size_t nh, size_t dh,
                           const float *w)
{
    if (nh > 64 || dh > 256 || nh % 16 || dh % 32) return 0;
    p->nh = nh;
    p->dh = dh;
    p->use_amx = 0;
    p->use_f32 = 1;
    p->ue_min = 1000;
    p->ue_max = -1000;
    p->ue_span = 0;
    const size_t nb = dh / 32;
    memset(p->qb, 0, sizeof p->qb);
    for (size_t h = 0; h < nh; h++) {
        p->w[h] = w[h];
        int hmin = 1000, hmax = -1000;
        for (size_t b = 0; b < nb; b++) {
            const float *qq = q + h * dh + b * 32;
            /* a compare, not fmaxf (the same NaN rule: NaN skipped): this
             * file is plain C, but the rule of docs/kernels.md on libm
             * calls in loops holds for every kernel file */
            float amax = 0.0f;
            for (size_t i = 0; i < 32; i++) {
                const float a = fabsf(qq[i]);
                amax = a > amax ? a : amax;
            }
            /* unit u = s/2 with s = 2^ceil(log2(amax/6)): every FP4 QDQ value
             * is an integer multiple of u within +-12 */
            float u = amax > 0.0f ? dsattn_pow2_ceil(amax / 6.0f) * 0.5f : 1.0f;
            int32_t sum = 0;
            for (size_t i = 0; i < 32; i++) {
                float v = qq[i] / u;
                int iv = (int)lrintf(v);
                if ((float)iv != v || iv < -12 || iv > 12) return 0;   /* not FP4 QDQ */
                size_t d = b * 32 + i;
                p->qb[((d / 4) * 64 + h) * 4 + d % 4] = (int8_t)iv;
                sum += iv;
            }
            p->nbias[b * 64 + h] = -12 * sum;
            p->unit[b * 64 + h] = u;
            p->unitd[b * 64 + h] = (double)u;
            if (amax > 0.0f) {              /* an all-zero block adds exactly 0 */
                /* u = 2^e, a power of two: e from its bits (a subnormal u,
                 * exponent field 0, from where its one bit sits) */
                const uint32_t ub = dsattn_f32_bits(u), ef = (ub >> 23) & 0xffu;
                int e = ef ? (int)ef - 127 : -149 + (31 - __builtin_clz(ub & 0x7fffffu));
                hmin = e < hmin ? e : hmin;
                hmax = e > hmax ? e : hmax;
            }
        }
        if (hmax >= hmin) {
            p->ue_min = hmin < p->ue_min ? hmin : p->ue_min;
            p->ue_max = hmax > p->ue_max ? hmax : p->ue_max;
            p->ue_span = hmax - hmin > p->ue_span ? hmax - hmin : p->ue_span;
        }
    }
    if (p->ue_max < p->ue_min) p->ue_min = p->ue_max = 0;    /* all-zero query */
    return 1;
}

int dsattn_index_vnni_key_f32(const dsattn_index_vnni_q *p, const uint8_t *row)
{
    return dsattn_index_key_fits_f32(p, row + p->dh / 2, p->dh / 32);
}
