/* sa_kernels.c - the scalar `ref` table of sa_kernels.h.  Plain C through
 * numfmt.h's unpackers: the cross-check the AVX-512 and AVX2 tables are
 * compared with, bit for bit, in tests/test_sparse_attn.c.
 * Never used by sparse_attn.c's reference mode (that one never tiles).
 */
#include "sa_kernels.h"

#include "mla_kernels.h"
#include "numfmt.h"

#include <string.h>

static void finish_ref(const float *acct, size_t hp, size_t nh, size_t d, const float *den,
                       float *out)
{
    for (size_t h = 0; h < nh; h++)
        for (size_t c = 0; c < d; c++)
            out[h * d + c] = dsattn_round_bf16(acct[c * hp + h] / den[h]);
}

static void rows_ref(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                     size_t d, float *out, size_t ld)
{
    for (size_t r = 0; r < DSATTN_MLA_KT; r++) {
        float *o = out + r * ld;
        if (r >= nr) memset(o, 0, d * sizeof(float));
        else if (kinds[r] == DSATTN_SA_FP4) dsattn_v41_kv_unpack(rows[r], d, o);
        else dsattn_v41_swa_unpack(rows[r], d, o);
    }
}

static int rows_bf16_ref(const uint8_t *const *rows, const unsigned char *kinds, size_t nr,
                         size_t d, uint16_t *out)
{
    float v[1024];
    if (d > 1024) return 0;
    for (size_t r = 0; r < nr; r++) {
        if (kinds[r] == DSATTN_SA_FP4) dsattn_v41_kv_unpack(rows[r], d, v);
        else dsattn_v41_swa_unpack(rows[r], d, v);
        for (size_t c = 0; c < d; c++) {
            const uint32_t u = dsattn_f32_bits(v[c]);
            const int nan = (u & 0x7fffffffu) > 0x7f800000u;
            if (!nan && ((u & 0xffffu) || ((u & 0x7f800000u) == 0 && (u & 0x7fffffffu))))
                return 0;
            out[r * d + c] = (uint16_t)(u >> 16);
        }
    }
    return 1;
}

/* q(c, h) of dsattn_mla_pack_q's layout */
static float qat(const float *qp, size_t hp, size_t D, size_t c, size_t h)
{
    const size_t h0 = h / DSATTN_MLA_HG * DSATTN_MLA_HG;
    const size_t w = hp - h0 >= DSATTN_MLA_HG ? DSATTN_MLA_HG : hp - h0;
    return qp[h0 * D + c * w + (h - h0)];
}

static void qk_ref(const float *qp, size_t hp, size_t D, const float *rows, size_t ld,
                   size_t nk, float *st, size_t ldst)
{
    const size_t nkp = (nk + DSATTN_MLA_KT - 1) / DSATTN_MLA_KT * DSATTN_MLA_KT;
    for (size_t j = 0; j < nkp; j++)
        for (size_t h = 0; h < hp; h++) {
            float a = 0.0f;
            for (size_t c = 0; c < D; c++) a += rows[j * ld + c] * qat(qp, hp, D, c, h);
            st[j * ldst + h] = a;
        }
}

static void pv_ref(const float *p, size_t ldp, size_t hp, const float *rows, size_t ld,
                   size_t nk, size_t C, const float *alpha, float *acct)
{
    for (size_t c = 0; c < C; c++)
        for (size_t h = 0; h < hp; h++) {
            float a = acct[c * hp + h] * alpha[h];
            for (size_t j = 0; j < nk; j++) a += rows[j * ld + c] * p[j * ldp + h];
            acct[c * hp + h] = a;
        }
}

const dsattn_sa_kern dsattn_sa_kern_ref = {
    "ref", finish_ref, rows_ref, rows_bf16_ref, qk_ref, pv_ref,
};
