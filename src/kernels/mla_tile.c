/* mla_tile.c - the scalar table of mla_kernels.h and the query packing
 * (the table choice is dispatch.c's).
 *
 * Each `ref` entry is the plainest loop of its contract in fp32 (products
 * and sums in a fixed order, -ffp-contract=off), written to be read and
 * to be the cross-check of the AVX-512 table, not to be fast.  The softmax
 * uses the double exp of the reference softmax rounded to fp32.
 *
 * Not here: the SIMD table (mla_tile_avx512.c), the attention driver
 * (src/attn/mla_attend.c).
 */
#include "mla_kernels.h"

#include "numfmt.h"

#include <math.h>
#include <string.h>

void dsattn_mla_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D, float *qp)
{
    for (size_t g = 0; g * DSATTN_MLA_HG < hp; g++) {
        const size_t h0 = g * DSATTN_MLA_HG;
        const size_t w = hp - h0 >= DSATTN_MLA_HG ? DSATTN_MLA_HG : hp - h0;
        float *o = qp + h0 * D;
        for (size_t d = 0; d < D; d++)
            for (size_t i = 0; i < w; i++)
                o[d * w + i] = h0 + i < H ? q[(h0 + i) * ldq + d] : 0.0f;
    }
}

/* q(d, h) of the packed layout */
static inline float qat(const float *qp, size_t hp, size_t D, size_t d, size_t h)
{
    const size_t h0 = h / DSATTN_MLA_HG * DSATTN_MLA_HG;
    const size_t w = hp - h0 >= DSATTN_MLA_HG ? DSATTN_MLA_HG : hp - h0;
    return qp[h0 * D + d * w + (h - h0)];
}

/* key(j, d) of the tiled layout */
static inline float kat(const float *kt, size_t D, size_t j, size_t d)
{
    return kt[j / DSATTN_MLA_KT * DSATTN_MLA_KT * D + d * DSATTN_MLA_KT + j % DSATTN_MLA_KT];
}

static void qk_ref(const float *qp, size_t hp, size_t D, const float *kt, size_t nk, float *st,
                   size_t ldst)
{
    const size_t nj = (nk + DSATTN_MLA_KT - 1) / DSATTN_MLA_KT * DSATTN_MLA_KT;
    for (size_t j = 0; j < nj; j++)
        for (size_t h = 0; h < hp; h++) {
            float a = 0.0f;
            for (size_t d = 0; d < D; d++) a += kat(kt, D, j, d) * qat(qp, hp, D, d, h);
            st[j * ldst + h] = a;
        }
}

static void softmax_ref(float *st, size_t ldst, size_t hp, size_t nk, float scale, int bf16,
                        float *m, float *l, float *alpha)
{
    for (size_t h = 0; h < hp; h++) {
        float mx = m[h];
        for (size_t j = 0; j < nk; j++) {
            float s = st[j * ldst + h] * scale;
            if (bf16) s = dsattn_round_bf16(s);
            st[j * ldst + h] = s;
            mx = s > mx ? s : mx;
        }
        const float a = mx == m[h] ? 1.0f : (float)exp((double)(m[h] - mx));
        float sum = 0.0f;
        for (size_t j = 0; j < nk; j++) {
            const float e = (float)exp((double)(st[j * ldst + h] - mx));
            st[j * ldst + h] = e;
            sum += e;
        }
        l[h] = l[h] * a + sum;
        m[h] = mx;
        alpha[h] = a;
    }
}

static void pv_ref(const float *p, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
                   size_t C, const float *alpha, float *acct, const uint8_t *const *pf,
                   size_t npf, size_t pf_bytes)
{
    (void)pf; (void)npf; (void)pf_bytes;          /* a hint only */
    for (size_t c = 0; c < C; c++)
        for (size_t h = 0; h < hp; h++) {
            float a = acct[c * hp + h] * alpha[h];
            for (size_t j = 0; j < nk; j++) a += kat(kt, D, j, c) * p[j * ldp + h];
            acct[c * hp + h] = a;
        }
}

static void tile_rows_ref(const float *rows, size_t ldr, size_t nr, size_t D, float *kt)
{
    for (size_t d = 0; d < D; d++)
        for (size_t r = 0; r < DSATTN_MLA_KT; r++)
            kt[d * DSATTN_MLA_KT + r] = r < nr ? rows[r * ldr + d] : 0.0f;
}

static void tile_bf16_ref(const uint8_t *const *rows, size_t nr, size_t D, float *kt)
{
    for (size_t d = 0; d < D; d++)
        for (size_t r = 0; r < DSATTN_MLA_KT; r++)
            kt[d * DSATTN_MLA_KT + r] =
                r < nr ? dsattn_bf16_to_f32((uint16_t)(rows[r][2 * d] | rows[r][2 * d + 1] << 8))
                       : 0.0f;
}

static void v32_row_ref(const uint8_t *row, size_t kl, size_t dr, float *out)
{
    dsattn_v32_kv_unpack(row, kl, dr, out);
}

static float w8(const uint8_t *w, const float *scale, size_t bs, size_t i)
{
    return dsattn_round_bf16(dsattn_e4m3_to_f32(w[i]) * scale[i / bs]);
}

static void fp8w_axpy_ref(const uint8_t *w, const float *scale, size_t bs, size_t n, float a,
                          float *acc)
{
    for (size_t i = 0; i < n; i++) acc[i] += a * w8(w, scale, bs, i);
}

static void fp8w_axpy4_ref(const uint8_t *const *w, const float *const *scale, size_t bs,
                           size_t n, const float *a, float *acc, int finite)
{
    (void)finite;                       /* a promise the scalar code needs not */
    for (int k = 0; k < 4; k++) fp8w_axpy_ref(w[k], scale[k], bs, n, a[k], acc);
}

static float fp8w_dot_ref(const uint8_t *w, const float *scale, size_t bs, size_t n,
                          const float *x)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += w8(w, scale, bs, i) * x[i];
    return s;
}

static void fp8w_dot4_ref(const uint8_t *const *w, const float *const *scale, size_t bs,
                          size_t n, const float *x, float *out, int finite)
{
    (void)finite;
    for (int k = 0; k < 4; k++) out[k] = fp8w_dot_ref(w[k], scale[k], bs, n, x);
}

static void bf16w_axpy_ref(const uint16_t *w, size_t n, float a, float *acc)
{
    for (size_t i = 0; i < n; i++) acc[i] += a * dsattn_bf16_to_f32(w[i]);
}

static void round_bf16_ref(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = dsattn_round_bf16(x[i]);
}

static void relu_wsum_ref(const float *c, size_t ldc, size_t nk, const float *w, size_t nh,
                          float *out)
{
    for (size_t j = 0; j < nk; j++) {
        float sum = 0.0f;
        for (size_t h = 0; h < nh; h++) sum += (c[j * ldc + h] > 0.0f ? c[j * ldc + h] : 0.0f) * w[h];
        out[j] = sum;
    }
}

const dsattn_mla_kern dsattn_mla_kern_ref = {
    "ref", qk_ref, softmax_ref, pv_ref, tile_rows_ref, tile_bf16_ref, v32_row_ref,
    fp8w_axpy_ref, fp8w_dot_ref, fp8w_axpy4_ref, fp8w_dot4_ref, bf16w_axpy_ref, round_bf16_ref,
    relu_wsum_ref,
};
