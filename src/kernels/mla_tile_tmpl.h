/* mla_tile_tmpl.h - the entries of the MLA tables (mla_kernels.h) whose
 * logic is the same at every vector width, written once: the softmax, the
 * V3.2 latent row decode, the FP8 / bf16 absorption weight rows (one or
 * four rows, dot and axpy), the bf16 rounding and the indexer's ReLU
 * head sum.  mla_tile_avx2.c, mla_tile_avx512.c and mla_tile_neon.c
 * include it after simd_avx2.h / simd_avx512.h / simd_neon.h (the vector
 * words DSV_F, dsv_fmadd, ...) and after their own decoders:
 *
 *   rbf16q(x)                   dsattn_round_bf16 of every lane, NaN quiet
 *   exp_ftz(x)                  the softmaxes' exp (x <= 0 or NaN)
 *   wrow(w, f1, f2, mode)       bf16(e4m3(w) * s) of DSV_N codes, NaN codes NaN
 *   e4m3x2_div256(w, &a, &b)    2 DSV_N finite codes / 256 (a first)
 *   bf16v(p)                    DSV_N bf16 values -> fp32
 *   e4m3v(w)                    DSV_N E4M3 codes -> fp32 (NaN codes NaN)
 *   hsumv(v)                    the horizontal sum in the ISA's fixed order
 *   qk_keytile(qp, hp, D, k, s, ldst)   one key tile's scores, every head
 *   PV_HG, pv_tiles(C), pv_tile(...)    the P.V tiles of one head group:
 *                               PV_HG heads a group, pv_tiles(C) tile calls
 *                               a group, pv_tile one call (returns columns)
 *   PV_COL_OUTER                the order of those calls (mla_pv)
 * (the last five written here, once, for the ISAs whose registers hold
 * the 6 x 16 tile of their simd header, DSV_TILE6X16: AVX2 and NEON; so
 * are their key tiles, mla_tile_rows / mla_tile_bf16, over that header's
 * dsv_store12cols)
 *
 * Every function here is static, so each ISA file gets its own copy built
 * with its own flags; the register tiles (QK, PV, key tiles) stay in the
 * ISA files, their blocking differs; the loops around them are here.
 * Scalar twins: mla_tile.c. */
#ifndef DSV_F
#error "mla_tile_tmpl.h: include simd_avx2.h, simd_avx512.h or simd_neon.h first"
#endif

#include <math.h>
#include <string.h>

#include "numfmt.h"

#define MLA_AI static inline __attribute__((always_inline))

/* Scale blocks are whole multiples of 16 elements (mla_kernels.h), so the
 * loops over a block in steps of 2 DSV_N end on a single last DSV_N step
 * only at 16 lanes (bs % 32 == 16); at 8 lanes that step does not exist. */
#define MLA_ODD_STEP (16 % (2 * DSV_N) != 0)

/* ---- QK and PV on the 6 x 16 tile (AVX2, NEON) --------------------------- */

#ifdef DSV_TILE6X16
/* One key tile (12 keys at k) against every head: keys 0..5 and 6..11 x
 * 16 heads a call, the heads in the packed groups of DSATTN_MLA_HG (the
 * last may be 16: ldq = w floats per latent element).  Per latent element
 * 16 / DSV_N head-vector loads and 6 key broadcasts from the d-major key
 * tile feed 96 / DSV_N FMAs. */
MLA_AI void qk_keytile(const float *qp, size_t hp, size_t D, const float *k, float *s,
                       size_t ldst)
{
    for (size_t h0 = 0; h0 < hp; h0 += DSATTN_MLA_HG) {
        const size_t w = hp - h0 >= DSATTN_MLA_HG ? DSATTN_MLA_HG : hp - h0;   /* 32 or 16 */
        const float *qg = qp + h0 * D;
        for (size_t hh = 0; hh < w; hh += 16) {
            dsv_tile6x16(k, qg + hh, w, D, s + h0 + hh, ldst, 1);
            dsv_tile6x16(k + 6, qg + hh, w, D, s + 6 * ldst + h0 + hh, ldst, 1);
        }
    }
}

/* RC (1..6) latent columns c.. x 16 heads (p, alpha, acct already offset
 * to the first head), over all nk keys of the block; the accumulator tile
 * loaded once per key block, scaled by the softmax rescale on load */
MLA_AI void pv_sub(const float *p, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
                   size_t c, const float *alpha, float *acct, const int RC)
{
    DSV_ACC6X16(a);
    dsv_acc6x16_load(a, RC, acct, hp, alpha);
    for (size_t j0 = 0; j0 < nk; j0 += DSATTN_MLA_KT) {
        const size_t nj = nk - j0 < DSATTN_MLA_KT ? nk - j0 : DSATTN_MLA_KT;
        dsv_acc6x16_fma(a, RC, kt + j0 * D + c * DSATTN_MLA_KT, 1, DSATTN_MLA_KT,
                        p + j0 * ldp, ldp, nj, 0);
    }
    dsv_acc6x16_store(a, RC, acct, hp);
}

/* PV in 16-head slices: column tiles of 6, then one of the 1..5 left;
 * column tile outer (mla_pv): the 442 KB key block of a 192-key block does
 * not stay in a Zen 3's 512 KB L2 beside the queries and accumulators, and
 * streaming it once per head group (8 times a block) left P.V at 1.06x
 * the QK time against 0.94x column tile outer (in process, V3 at 32K keys,
 * 2 threads, three alternating runs each; docs/benchmarks.md).  ARM cores'
 * L2s (512 KB - 2 MB a core) are that case too (not measured). */
#define PV_HG 16
#define pv_tiles(C) ((C) / 6 + ((C) % 6 != 0))
#define PV_COL_OUTER 1

MLA_AI size_t pv_tile(const float *ph, size_t ldp, size_t hp, const float *kt, size_t D,
                      size_t nk, size_t c, size_t C, const float *ah, float *o, int nv)
{
    (void)nv;                               /* always 2: hp % 16 == 0 */
    switch (C - c >= 6 ? 6 : C - c) {
    case 6: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 6); return 6;
    case 5: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 5); return 5;
    case 4: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 4); return 4;
    case 3: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 3); return 3;
    case 2: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 2); return 2;
    default: pv_sub(ph, ldp, hp, kt, D, nk, c, ah, o, 1); return 1;
    }
}

/* Key tiles: DSV_N columns of the 12 rows a step, transposed in registers
 * and stored d-major (dsv_store12cols), the columns past the last whole
 * vector in scalar code; rows nr..11 zero. */
static void mla_tile_rows(const float *rows, size_t ldr, size_t nr, size_t D, float *kt)
{
    size_t d = 0;
    for (; d + DSV_N <= D; d += DSV_N) {
        DSV_F r[DSATTN_MLA_KT];
#pragma GCC unroll 12
        for (int i = 0; i < DSATTN_MLA_KT; i++)
            r[i] = (size_t)i < nr ? dsv_load(rows + (size_t)i * ldr + d) : dsv_zero();
        dsv_store12cols(r, kt + d * DSATTN_MLA_KT);
    }
    for (; d < D; d++)
        for (size_t i = 0; i < DSATTN_MLA_KT; i++)
            kt[d * DSATTN_MLA_KT + i] = i < nr ? rows[i * ldr + d] : 0.0f;
}

static void mla_tile_bf16(const uint8_t *const *rows, size_t nr, size_t D, float *kt)
{
    size_t d = 0;
    for (; d + DSV_N <= D; d += DSV_N) {
        DSV_F r[DSATTN_MLA_KT];
#pragma GCC unroll 12
        for (int i = 0; i < DSATTN_MLA_KT; i++)
            r[i] = (size_t)i < nr ? bf16v(rows[i] + 2 * d) : dsv_zero();
        dsv_store12cols(r, kt + d * DSATTN_MLA_KT);
    }
    for (; d < D; d++)
        for (size_t i = 0; i < DSATTN_MLA_KT; i++)
            kt[d * DSATTN_MLA_KT + i] =
                i < nr ? dsattn_bf16_to_f32((uint16_t)(rows[i][2 * d] | rows[i][2 * d + 1] << 8))
                       : 0.0f;
}
#endif /* DSV_TILE6X16 */

/* ---- QK and PV: the loops around the ISA's register tiles ---------------- */

static void mla_qk(const float *qp, size_t hp, size_t D, const float *kt, size_t nk, float *st,
                   size_t ldst)
{
    const size_t nt = (nk + DSATTN_MLA_KT - 1) / DSATTN_MLA_KT;
    for (size_t t = 0; t < nt; t++)
        qk_keytile(qp, hp, D, kt + t * DSATTN_MLA_KT * D, st + t * DSATTN_MLA_KT * ldst, ldst);
}

/* The P.V tiles over PV_HG-head groups (hp % 16 == 0, the last group of
 * the AVX-512 form may be 16) and column tiles, in the order the ISA file
 * picks with PV_COL_OUTER:
 *   0  head group outer: the group's probabilities stay in L1 while the
 *      whole key block (D floats a key) streams past once per group;
 *   1  column tile outer: one column tile of the key block (nk x its
 *      columns, a few KB) stays in L1 while the head groups' probabilities
 *      stream past - for cores whose L2 does not hold the key block next
 *      to the queries and accumulators (the AVX2 file: Zen 3 has 512 KB).
 * Every output is the same FMA chain either way (only independent tiles
 * are reordered).  The lines of the next block's rows (pf, npf rows of
 * pf_bytes) are prefetched spread evenly over the tile calls. */
static void mla_pv(const float *p, size_t ldp, size_t hp, const float *kt, size_t D, size_t nk,
                   size_t C, const float *alpha, float *acct, const uint8_t *const *pf,
                   size_t npf, size_t pf_bytes)
{
    const size_t lpr = (pf_bytes + 63) / 64, nl = npf * lpr;
    const size_t steps = (hp + PV_HG - 1) / PV_HG * pv_tiles(C);
    size_t done = 0, step = 0, prow = 0, pline = 0;       /* done = prow * lpr + pline */
#define PF_NEXT()                                                                   \
    do {                                                                            \
        __builtin_prefetch((const char *)pf[prow] + pline * 64, 0, 2); /* L2 */    \
        if (++pline == lpr) { pline = 0; prow++; }                                  \
    } while (0)
    if (PV_COL_OUTER) {
        for (size_t c = 0; c < C;) {
            size_t w = 0;                           /* the tile's columns */
            for (size_t h0 = 0; h0 < hp; h0 += PV_HG, step++) {
                const int nv = h0 + PV_HG <= hp ? 2 : 1;
                const size_t want = nl * (step + 1) / steps;
                for (; done < want; done++) PF_NEXT();
                w = pv_tile(p + h0, ldp, hp, kt, D, nk, c, C, alpha + h0, acct + c * hp + h0,
                            nv);
            }
            c += w;
        }
    } else {
        for (size_t h0 = 0; h0 < hp; h0 += PV_HG) {
            const int nv = h0 + PV_HG <= hp ? 2 : 1;    /* the group's halves of PV_HG / 2 */
            const float *ph = p + h0, *ah = alpha + h0;
            for (size_t c = 0; c < C; step++) {
                const size_t want = nl * (step + 1) / steps;
                for (; done < want; done++) PF_NEXT();
                c += pv_tile(ph, ldp, hp, kt, D, nk, c, C, ah, acct + c * hp + h0, nv);
            }
        }
    }
    for (; done < nl; done++) PF_NEXT();
#undef PF_NEXT
}

/* ---- softmax ------------------------------------------------------------- */

static void mla_softmax(float *st, size_t ldst, size_t hp, size_t nk, float scale, int bf16,
                        float *m, float *l, float *alpha)
{
    const DSV_F sc = dsv_set1(scale);
    for (size_t h = 0; h < hp; h += DSV_N) {
        const DSV_F mo = dsv_load(m + h);
        DSV_F mx = mo;
        for (size_t j = 0; j < nk; j++) {
            float *p = st + j * ldst + h;
            DSV_F s = dsv_mul(dsv_load(p), sc);
            if (bf16) s = rbf16q(s);
            dsv_store(p, s);
            mx = dsv_max(mx, s);
        }
        DSV_F a = exp_ftz(dsv_sub(mo, mx));
        a = dsv_sel_eq(mo, mx, a, dsv_set1(1.0f));
        DSV_F sum = dsv_zero();
        for (size_t j = 0; j < nk; j++) {
            float *p = st + j * ldst + h;
            const DSV_F e = exp_ftz(dsv_sub(dsv_load(p), mx));
            dsv_store(p, e);
            sum = dsv_add(sum, e);
        }
        dsv_store(l + h, dsv_fmadd(dsv_load(l + h), a, sum));
        dsv_store(m + h, mx);
        dsv_store(alpha + h, a);
    }
}

/* ---- the V3.2 latent row ------------------------------------------------- */

static float le_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

static void mla_v32_row(const uint8_t *row, size_t kl, size_t dr, float *out)
{
    for (size_t b = 0; b * 128 < kl; b++) {
        const DSV_F s = dsv_set1(le_f32(row + kl + 4 * b));
        for (size_t i = b * 128; i < b * 128 + 128; i += DSV_N)
            dsv_store(out + i, dsv_mul(e4m3v(row + i), s));
    }
    const uint8_t *rp = row + kl + 4 * (kl / 128);
    size_t i = 0;
    for (; i + DSV_N <= dr; i += DSV_N) dsv_store(out + kl + i, bf16v(rp + 2 * i));
    for (; i < dr; i++)
        out[kl + i] = dsattn_bf16_to_f32((uint16_t)(rp[2 * i] | rp[2 * i + 1] << 8));
}

/* ---- absorption weight rows ---------------------------------------------- */

static float w8(const uint8_t *w, const float *scale, size_t bs, size_t i)
{
    return dsattn_round_bf16(dsattn_e4m3_to_f32(w[i]) * scale[i / bs]);
}

/* How one block scale s is applied.  mode 0: e/256 * (256 s) then the
 * bf16 rounding (256 s exact while |s| < 2^100).  mode 1: s a power of two
 * in [2^-100, 2^100]: e * s has e's 4 significant bits, a normal bf16
 * value, so the rounding is the identity and is skipped (bit-identical;
 * the V3.2 release's UE8M0 scales and the generated weights).  mode 2:
 * huge scales, the x256 and s separately, then rounding.  The decoders
 * give e/256: the x256 of the decode is folded into the block scale,
 * (e/256) * (256 s) is the same real product as e * s. */
MLA_AI int wscale(float s, DSV_F *f1, DSV_F *f2)
{
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    const uint32_t e = (u >> 23) & 0xff;
    *f2 = dsv_set1(s);
    if ((u & 0x7fffff) == 0 && e >= 127 - 100 && e <= 127 + 100) {
        *f1 = dsv_set1(s * 256.0f);
        return 1;
    }
    if (s < 0x1p100f && s > -0x1p100f) {
        *f1 = dsv_set1(s * 256.0f);
        return 0;
    }
    *f1 = dsv_set1(256.0f);
    return 2;
}

/* wrow of 2 DSV_N finite codes (the first DSV_N in *v0): one load and one
 * widening, no NaN compare */
MLA_AI void wrow2_finite(const uint8_t *w, DSV_F f1, DSV_F f2, int mode, DSV_F *v0, DSV_F *v1)
{
    DSV_F a, b;
    e4m3x2_div256(w, &a, &b);
    a = dsv_mul(a, f1);
    b = dsv_mul(b, f1);
    if (mode == 2) {
        a = dsv_mul(a, f2);
        b = dsv_mul(b, f2);
    }
    if (mode != 1) {
        a = DSV(dsattn_rbf16_)(a);
        b = DSV(dsattn_rbf16_)(b);
    }
    *v0 = a;
    *v1 = b;
}

MLA_AI void axpy_block(const uint8_t *w, size_t n, DSV_F va, DSV_F f1, DSV_F f2, float *acc,
                       int mode)
{
    for (size_t i = 0; i < n; i += DSV_N) {
        const DSV_F v = wrow(w + i, f1, f2, mode);
        dsv_store(acc + i, dsv_fmadd(va, v, dsv_load(acc + i)));
    }
}

/* Two chains per block: s0 takes the even DSV_N-element steps, s1 the odd
 * ones, folded into s0 at the block's end (a last odd step, MLA_ODD_STEP,
 * goes to s0).  fp8w_dot4 keeps exactly
 * these chains per row. */
MLA_AI DSV_F dot_block(const uint8_t *w, size_t n, DSV_F f1, DSV_F f2, const float *x,
                       DSV_F s0, int mode)
{
    DSV_F s1 = dsv_zero();
    size_t i = 0;
    for (; i + 2 * DSV_N <= n; i += 2 * DSV_N) {
        s0 = dsv_fmadd(wrow(w + i, f1, f2, mode), dsv_load(x + i), s0);
        s1 = dsv_fmadd(wrow(w + i + DSV_N, f1, f2, mode), dsv_load(x + i + DSV_N), s1);
    }
    if (MLA_ODD_STEP && i < n) s0 = dsv_fmadd(wrow(w + i, f1, f2, mode), dsv_load(x + i), s0);
    return dsv_add(s0, s1);
}

/* Both walk the row one scale block at a time (no division per vector). */
static void mla_fp8w_axpy(const uint8_t *w, const float *scale, size_t bs, size_t n, float a,
                          float *acc)
{
    const DSV_F va = dsv_set1(a);
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        DSV_F f1, f2;
        const int mode = wscale(scale[b0 / bs], &f1, &f2);
        if (mode == 1) axpy_block(w + b0, bs, va, f1, f2, acc + b0, 1);
        else if (mode == 0) axpy_block(w + b0, bs, va, f1, f2, acc + b0, 0);
        else axpy_block(w + b0, bs, va, f1, f2, acc + b0, 2);
    }
    for (size_t i = b0; i < n; i++) acc[i] += a * w8(w, scale, bs, i);
}

static float mla_fp8w_dot(const uint8_t *w, const float *scale, size_t bs, size_t n,
                          const float *x)
{
    DSV_F s = dsv_zero();
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        DSV_F f1, f2;
        const int mode = wscale(scale[b0 / bs], &f1, &f2);
        if (mode == 1) s = dot_block(w + b0, bs, f1, f2, x + b0, s, 1);
        else if (mode == 0) s = dot_block(w + b0, bs, f1, f2, x + b0, s, 0);
        else s = dot_block(w + b0, bs, f1, f2, x + b0, s, 2);
    }
    float r = hsumv(s);
    for (size_t i = b0; i < n; i++) r += w8(w, scale, bs, i) * x[i];
    return r;
}

/* Four rows per pass over acc (the W_uk absorption adds 128 rows into one
 * 512-float accumulator per head: one row per pass reloaded it 128 times).
 * One scale block of four finite rows, one mode for all four (a constant
 * after inlining), 2 DSV_N elements a step: each element still sees
 * acc + r0, + r1, + r2, + r3 in that order. */
MLA_AI void axpy4_block_finite(const uint8_t *const *w, size_t b0, size_t bs, const DSV_F *va,
                               const DSV_F *f1, const DSV_F *f2, int mode, float *acc)
{
    size_t i = b0;
    for (; i + 2 * DSV_N <= b0 + bs; i += 2 * DSV_N) {
        DSV_F s0 = dsv_load(acc + i), s1 = dsv_load(acc + i + DSV_N);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            DSV_F v0, v1;
            wrow2_finite(w[k] + i, f1[k], f2[k], mode, &v0, &v1);
            s0 = dsv_fmadd(va[k], v0, s0);
            s1 = dsv_fmadd(va[k], v1, s1);
        }
        dsv_store(acc + i, s0);
        dsv_store(acc + i + DSV_N, s1);
    }
    if (MLA_ODD_STEP && i < b0 + bs) {
        DSV_F s = dsv_load(acc + i);
        for (int k = 0; k < 4; k++) s = dsv_fmadd(va[k], wrow(w[k] + i, f1[k], f2[k], mode), s);
        dsv_store(acc + i, s);
    }
}

static void mla_fp8w_axpy4(const uint8_t *const *w, const float *const *scale, size_t bs,
                           size_t n, const float *a, float *acc, int finite)
{
    const DSV_F va[4] = { dsv_set1(a[0]), dsv_set1(a[1]), dsv_set1(a[2]), dsv_set1(a[3]) };
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        DSV_F f1[4], f2[4];
        int mode[4];
        for (int k = 0; k < 4; k++) mode[k] = wscale(scale[k][b0 / bs], &f1[k], &f2[k]);
        if (finite && mode[0] == mode[1] && mode[0] == mode[2] && mode[0] == mode[3]) {
            if (mode[0] == 1) axpy4_block_finite(w, b0, bs, va, f1, f2, 1, acc);
            else if (mode[0] == 0) axpy4_block_finite(w, b0, bs, va, f1, f2, 0, acc);
            else axpy4_block_finite(w, b0, bs, va, f1, f2, 2, acc);
            continue;
        }
        for (size_t i = b0; i < b0 + bs; i += DSV_N) {
            DSV_F s = dsv_load(acc + i);
            s = dsv_fmadd(va[0], wrow(w[0] + i, f1[0], f2[0], mode[0]), s);
            s = dsv_fmadd(va[1], wrow(w[1] + i, f1[1], f2[1], mode[1]), s);
            s = dsv_fmadd(va[2], wrow(w[2] + i, f1[2], f2[2], mode[2]), s);
            s = dsv_fmadd(va[3], wrow(w[3] + i, f1[3], f2[3], mode[3]), s);
            dsv_store(acc + i, s);
        }
    }
    for (size_t i = b0; i < n; i++)
        for (int k = 0; k < 4; k++) acc[i] += a[k] * w8(w[k], scale[k], bs, i);
}

/* The 2 DSV_N-element steps of one scale block of four finite rows, one
 * mode for all four: the chains of dot_block per row, the x loads shared;
 * returns where it stopped (fp8w_dot4 takes a last odd step). */
MLA_AI size_t dot4_block_finite(const uint8_t *const *w, size_t b0, size_t bs, const float *x,
                                const DSV_F *f1, const DSV_F *f2, int mode, DSV_F *s0,
                                DSV_F *s1)
{
    size_t i = b0;
    for (; i + 2 * DSV_N <= b0 + bs; i += 2 * DSV_N) {
        const DSV_F xa = dsv_load(x + i), xb = dsv_load(x + i + DSV_N);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            DSV_F v0, v1;
            wrow2_finite(w[k] + i, f1[k], f2[k], mode, &v0, &v1);
            s0[k] = dsv_fmadd(v0, xa, s0[k]);
            s1[k] = dsv_fmadd(v1, xb, s1[k]);
        }
    }
    return i;
}

/* fp8w_dot of four rows: each row keeps fp8w_dot's two chains, so the
 * bits are the same; the x vectors are loaded once for the four rows. */
static void mla_fp8w_dot4(const uint8_t *const *w, const float *const *scale, size_t bs,
                          size_t n, const float *x, float *out, int finite)
{
    DSV_F s0[4], s1[4];
    for (int k = 0; k < 4; k++) s0[k] = s1[k] = dsv_zero();
    size_t b0 = 0;
    for (; b0 + bs <= n; b0 += bs) {
        DSV_F f1[4], f2[4];
        int mode[4];
        for (int k = 0; k < 4; k++) mode[k] = wscale(scale[k][b0 / bs], &f1[k], &f2[k]);
        size_t i = b0;
        if (finite && mode[0] == mode[1] && mode[0] == mode[2] && mode[0] == mode[3]) {
            if (mode[0] == 1) i = dot4_block_finite(w, b0, bs, x, f1, f2, 1, s0, s1);
            else if (mode[0] == 0) i = dot4_block_finite(w, b0, bs, x, f1, f2, 0, s0, s1);
            else i = dot4_block_finite(w, b0, bs, x, f1, f2, 2, s0, s1);
        }
        for (; i + 2 * DSV_N <= b0 + bs; i += 2 * DSV_N) {
            const DSV_F xa = dsv_load(x + i), xb = dsv_load(x + i + DSV_N);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                s0[k] = dsv_fmadd(wrow(w[k] + i, f1[k], f2[k], mode[k]), xa, s0[k]);
                s1[k] = dsv_fmadd(wrow(w[k] + i + DSV_N, f1[k], f2[k], mode[k]), xb, s1[k]);
            }
        }
        if (MLA_ODD_STEP && i < b0 + bs) {
            const DSV_F xa = dsv_load(x + i);
            for (int k = 0; k < 4; k++)
                s0[k] = dsv_fmadd(wrow(w[k] + i, f1[k], f2[k], mode[k]), xa, s0[k]);
        }
        /* fp8w_dot folds s1 into s0 after every block (dot_block's return) */
        for (int k = 0; k < 4; k++) {
            s0[k] = dsv_add(s0[k], s1[k]);
            s1[k] = dsv_zero();
        }
    }
    for (int k = 0; k < 4; k++) {
        float r = hsumv(s0[k]);
        for (size_t i = b0; i < n; i++) r += w8(w[k], scale[k], bs, i) * x[i];
        out[k] = r;
    }
}

/* Every element one FMA, the tail past the last whole vector too, so the
 * bits do not depend on the width (tests/test_mla.c's row hash) */
static void mla_bf16w_axpy(const uint16_t *w, size_t n, float a, float *acc)
{
    const DSV_F va = dsv_set1(a);
    size_t i = 0;
    for (; i + DSV_N <= n; i += DSV_N)
        dsv_store(acc + i, dsv_fmadd(va, bf16v((const uint8_t *)(w + i)), dsv_load(acc + i)));
    for (; i < n; i++) acc[i] = fmaf(a, dsattn_bf16_to_f32(w[i]), acc[i]);
}

static void mla_round_bf16(float *x, size_t n)
{
    size_t i = 0;
    for (; i + DSV_N <= n; i += DSV_N) dsv_store(x + i, rbf16q(dsv_load(x + i)));
    for (; i < n; i++) x[i] = dsattn_round_bf16(x[i]);
}

/* ---- the V3.2 indexer's head sum ----------------------------------------- */

static void mla_relu_wsum(const float *c, size_t ldc, size_t nk, const float *w, size_t nh,
                          float *out)
{
    const size_t nv = nh / DSV_N * DSV_N;
    for (size_t j = 0; j < nk; j++) {
        const float *cj = c + j * ldc;
        DSV_F acc = dsv_zero();
        for (size_t h = 0; h < nv; h += DSV_N)
            acc = dsv_fmadd(dsv_max(dsv_load(cj + h), dsv_zero()), dsv_load(w + h), acc);
        float sum = hsumv(acc);
        for (size_t h = nv; h < nh; h++) sum += (cj[h] > 0.0f ? cj[h] : 0.0f) * w[h];
        out[j] = sum;
    }
}
