/* test_sparse_attn.c - the fast sparse_attn path (src/ops/sparse_attn.c,
 * sparse_attn_tiled) and its kernels (src/kernels/sa_kernels*.c) against
 * the scalar forms they must track.
 *
 * Kernel level: the AVX-512 and AVX2 row decoders equal numfmt.h's unpackers bit for
 * bit (NaN codes and NaN / extreme scales included); QK and PV equal the
 * scalar table within fp32 reassociation (rel 1e-5); finish is bit-exact.
 * Driver level: fast mode vs reference mode of dsattn_sparse_attn on the
 * V4.1 layouts ([FP8 window rows ; FP4 compressed rows]) over odd shapes -
 * 1 row, rows not a multiple of the 12-key tile, heads not a multiple of
 * the 16 / 32-head register tile, -1 and out-of-range indices, all-invalid
 * rows (exact 0 from -1e30, NaN from -inf), NaN codes - with the bounds
 * stated at each check.  Under DSATTN_ISA=ref the driver checks run the
 * kernel-table fast path instead (same bounds); a kernel check skips where
 * the CPU or the build lacks its table.
 */
#include "harness.h"
#include "internal.h"
#include "kernels.h"
#include "mla_kernels.h"
#include "numfmt.h"
#include "ops.h"
#include "ktab.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* n random V4.1 rows of one layout, values ~ N(0, sd) rounded to bf16 */
static uint8_t *make_rows(int fp4, size_t n, size_t d, float sd, dsattn_rng *g)
{
    const size_t rb = fp4 ? dsattn_v41_kv_row_bytes(d) : dsattn_v41_swa_row_bytes(d);
    uint8_t *rows = malloc(n * rb);
    float *x = malloc(d * sizeof(float));
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < d; i++) x[i] = dsattn_round_bf16(sd * dsattn_rng_normal(g));
        if (fp4) dsattn_v41_kv_pack(x, d, rows + r * rb, NULL);
        else dsattn_v41_swa_pack(x, d, rows + r * rb, NULL);
    }
    free(x);
    return rows;
}

static int same_bits_or_nan(float a, float b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return dsattn_f32_bits(a) == dsattn_f32_bits(b);
}

/* ==== Kernels =========================================================== */

static void rows_decoder_equals_unpackers_bit_for_bit_on(const dsattn_ktab *KT)
{
    const dsattn_sa_kern *A = KT ? KT->sa : NULL, *R = &dsattn_sa_kern_ref;
    if (!KT) return;
    if (!A) { dsattn_test_skip("no sparse-attention tiles in this table (build)"); return; }
    const size_t d = 512, ld = d + 16, n = 24;
    dsattn_rng g = { 11 };
    uint8_t *f4 = make_rows(1, n, d, 3.0f, &g), *f8 = make_rows(0, n, d, 3.0f, &g);
    const size_t b4 = dsattn_v41_kv_row_bytes(d), b8 = dsattn_v41_swa_row_bytes(d);
    /* every code and scale the formats have, NaN ones included */
    for (size_t r = 0; r < 4; r++)
        for (size_t i = 0; i < d; i++) f8[r * b8 + i] = (uint8_t)(i + 37 * r);
    for (size_t i = 0; i < d / 32; i++) {
        f8[0 * b8 + d + i] = (uint8_t)(i * 17);         /* 0x00 .. 0xff scales */
        f8[1 * b8 + d + i] = i & 1 ? 0xff : 0x00;        /* NaN and 2^-127    */
        f8[2 * b8 + d + i] = (uint8_t)(0xf0 + i % 15);   /* near the top      */
    }
    for (size_t i = 0; i < d / 16; i++) {
        f4[0 * b4 + d / 2 + i] = (uint8_t)(i * 8 + 1);   /* E4M3 scales incl. subnormal */
        f4[1 * b4 + d / 2 + i] = i & 1 ? 0x7f : 0xff;    /* NaN scales        */
    }
    const uint8_t *rp[12];
    unsigned char kinds[12];
    float *a = malloc(12 * ld * sizeof(float)), *b = malloc(12 * ld * sizeof(float));
    for (size_t nr = 1; nr <= 12; nr++) {
        for (int mix = 0; mix < 3; mix++) {
            for (size_t r = 0; r < 12; r++) {
                const int k4 = mix == 0 ? 1 : mix == 1 ? 0 : (int)((r + nr) % 3 == 0);
                kinds[r] = k4 ? DSATTN_SA_FP4 : DSATTN_SA_FP8;
                const size_t src = (r * 5 + nr) % n;
                rp[r] = k4 ? f4 + src * b4 : f8 + src * b8;
            }
            memset(a, 0x55, 12 * ld * sizeof(float));
            memset(b, 0x33, 12 * ld * sizeof(float));
            A->rows(rp, kinds, nr, d, a, ld);
            R->rows(rp, kinds, nr, d, b, ld);
            size_t bad = 0;
            for (size_t r = 0; r < 12; r++)
                for (size_t i = 0; i < d; i++) bad += !same_bits_or_nan(a[r * ld + i], b[r * ld + i]);
            CHECK_MSG(bad == 0, "nr %zu mix %d: %zu decoded values differ", nr, mix, bad);
            for (size_t r = nr; r < 12; r++) CHECK(a[r * ld] == 0.0f && a[r * ld + d - 1] == 0.0f);
        }
    }
    /* NaN codes did reach the decoder */
    kinds[0] = DSATTN_SA_FP8;
    rp[0] = f8;
    A->rows(rp, kinds, 1, d, a, ld);
    CHECK(isnan(a[0x7f]) && isnan(a[0xff]) && !isnan(a[0x7e]));
    free(a); free(b); free(f4); free(f8);
}

static void bf16_rows_decoder_equals_rows_and_refuses_subnormals_on(const dsattn_ktab *KT)
{
    /* rows_bf16 (the AMX form's decoder) against rows: the same values as
     * bf16, on both tables, for random rows and the formats' edge codes and
     * scales; an FP8 block whose scale makes a subnormal is refused by both,
     * the same tiny scale over codes that stay normal is not. */
    const dsattn_sa_kern *A = KT ? KT->sa : NULL, *R = &dsattn_sa_kern_ref;
    if (!KT) return;
    if (!A) { dsattn_test_skip("no sparse-attention tiles in this table (build)"); return; }
    const size_t d = 512, ld = d + 16, n = 16;
    dsattn_rng g = { 23 };
    uint8_t *f4 = make_rows(1, n, d, 3.0f, &g), *f8 = make_rows(0, n, d, 3.0f, &g);
    const size_t b4 = dsattn_v41_kv_row_bytes(d), b8 = dsattn_v41_swa_row_bytes(d);
    for (size_t i = 0; i < d; i++) f8[i] = (uint8_t)i;                  /* every FP8 code  */
    for (size_t i = 0; i < d / 32; i++) {
        f8[d + i] = (uint8_t)(10 + i * 15);                             /* 2^-117 .. NaN   */
        f8[b8 + d + i] = i == 3 ? 9 : f8[b8 + d + i];                    /* one block at 2^-118 */
        f8[2 * b8 + d + i] = i == 5 ? 0 : f8[2 * b8 + d + i];            /* 2^-127, big codes */
    }
    for (size_t i = 0; i < 32; i++) {
        f8[b8 + 3 * 32 + i] = (uint8_t)(i == 7 ? 0x01 : 0x40);          /* 2^-9 x 2^-118   */
        f8[2 * b8 + 5 * 32 + i] = (uint8_t)(i & 1 ? 0xfe : 0x7d);       /* >= 2^-127 x 320 */
    }
    for (size_t i = 0; i < d / 16; i++)
        f4[d / 2 + i] = (uint8_t)(i * 8 + 1);                           /* every E4M3 range */
    f4[b4 + d / 2 + 2] = 0x7f;                                          /* a NaN scale     */
    float *v = malloc(DSATTN_MLA_KT * ld * sizeof(float));    /* rows writes 12 rows */
    uint16_t *ha = malloc(d * 2 * n), *hr = malloc(d * 2 * n);
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (size_t r = 0; r < n; r++) {
            const uint8_t *rp[1] = { fp4 ? f4 + r * b4 : f8 + r * b8 };
            const unsigned char kind[1] = { fp4 ? DSATTN_SA_FP4 : DSATTN_SA_FP8 };
            const int oka = A->rows_bf16(rp, kind, 1, d, ha);
            const int okr = R->rows_bf16(rp, kind, 1, d, hr);
            const int refuse = !fp4 && r == 1;
            CHECK_MSG(oka == !refuse && okr == !refuse, "fp4 %d row %zu: avx512 %d ref %d", fp4,
                      r, oka, okr);
            if (refuse) continue;
            R->rows(rp, kind, 1, d, v, ld);
            size_t bad = 0, nan = 0;
            for (size_t c = 0; c < d; c++) {
                const float fa = dsattn_bf16_to_f32(ha[c]), fr = dsattn_bf16_to_f32(hr[c]);
                bad += !same_bits_or_nan(fa, v[c]) || !same_bits_or_nan(fr, v[c]);
                nan += isnan(fa);
            }
            CHECK_MSG(bad == 0, "fp4 %d row %zu: %zu values differ from rows", fp4, r, bad);
            if ((!fp4 && r == 0) || (fp4 && r == 1)) CHECK_MSG(nan > 0, "fp4 %d row %zu: no NaN", fp4, r);
        }
    free(v); free(ha); free(hr); free(f4); free(f8);
}

static void qk_pv_finish_match_scalar_table_on(const dsattn_ktab *KT)
{
    const dsattn_sa_kern *A = KT ? KT->sa : NULL, *R = &dsattn_sa_kern_ref;
    if (!KT) return;
    if (!A) { dsattn_test_skip("no sparse-attention tiles in this table (build)"); return; }
    /* D = 96: whole 6-column P.V tiles and vectors; D = 37: a last single
     * column and the finish's scalar path (d not a multiple of the width) */
    static const size_t Ds[2] = { 96, 37 };
    for (int di = 0; di < 2; di++) {
    const size_t D = Ds[di];
    const size_t ld = D + 16, nkmax = 72;
    const size_t hps[] = { 16, 32, 48, 64 }, nks[] = { 1, 5, 12, 13, 64 };
    dsattn_rng g = { 5 };
    float *q = malloc(64 * D * 4), *qp = malloc(64 * D * 4), *rows = malloc(nkmax * ld * 4);
    float *s1 = malloc(nkmax * 64 * 4), *s2 = malloc(nkmax * 64 * 4), *al = malloc(64 * 4);
    float *a1 = malloc(D * 64 * 4), *a2 = malloc(D * 64 * 4), *den = malloc(64 * 4);
    float *o1 = malloc(64 * D * 4), *o2 = malloc(64 * D * 4);
    for (size_t i = 0; i < 64 * D; i++) q[i] = dsattn_rng_normal(&g);
    for (size_t i = 0; i < nkmax * ld; i++) rows[i] = dsattn_rng_normal(&g);
    for (size_t h = 0; h < 64; h++) { al[h] = 0.25f + 0.01f * (float)h; den[h] = 0.7f + (float)h; }
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++) {
            const size_t hp = hps[a], nk = nks[b], nkp = (nk + 11) / 12 * 12, H = hp - 3;
            dsattn_mla_pack_q(q, D, H, hp, D, qp);
            A->qk(qp, hp, D, rows, ld, nk, s1, hp);
            R->qk(qp, hp, D, rows, ld, nk, s2, hp);
            double rel = dsattn_rel_l2(s1, s2, nkp * hp);
            CHECK_MSG(rel < 1e-5, "qk hp %zu nk %zu rel %g", hp, nk, rel);
            for (size_t i = 0; i < D * hp; i++) a1[i] = a2[i] = dsattn_rng_normal(&g);
            A->pv(s2, hp, hp, rows, ld, nk, D, al, a1);
            R->pv(s2, hp, hp, rows, ld, nk, D, al, a2);
            rel = dsattn_rel_l2(a1, a2, D * hp);
            CHECK_MSG(rel < 1e-5, "pv hp %zu nk %zu rel %g", hp, nk, rel);
            /* NaNs with low payload bits (signalling, negative, and the
             * largest, whose rounding carry would make it -0 if NaN lanes were
             * rounded as numbers) and infinities: finish keeps them NaN and
             * infinite, as dsattn_round_bf16 does */
            const uint32_t special[5] = { 0x7fa12345u, 0xffc0ffffu, 0x7fffffffu, 0x7f800000u,
                                          0xff800000u };
            for (size_t j = 0; j < 5; j++) memcpy(&a2[(7 * j + 2) * hp + j], &special[j], 4);
            A->finish(a2, hp, H, D, den, o1);
            R->finish(a2, hp, H, D, den, o2);
            CHECK_BITS("finish", o1, o2, H * D);
        }
    free(q); free(qp); free(rows); free(s1); free(s2); free(al); free(a1); free(a2);
    free(den); free(o1); free(o2);
    }
}

/* FNV-1a (tests/harness.c) over what the sparse-attention tiles compute on
 * one fixed case at the V4.1 width (d 512): 20 rows decoded as two 12-key
 * tiles (FP4 and FP8 rows mixed, a short last tile), their scores against
 * 45 heads (hp 48), P.V with a rescale over probabilities made from those
 * scores, and the finish's division and bf16 rounding.  The value is what
 * the AVX-512 and AVX2 tables give on x86-64; every SIMD table a build and
 * CPU have (NEON on aarch64, under qemu in CI) must give it. */
#define SA_TILE_FNV 0x68172d59b66c2593ull /* the AVX-512 and AVX2 tables, 2026-12-07 */

static uint64_t sa_tile_hash(const dsattn_sa_kern *A)
{
    enum { D = 512, LD = D + 16, H = 45, HP = 48, NK = 20, NKP = 24 };
    dsattn_rng g = { 91 };
    uint8_t *f4 = make_rows(1, 12, D, 2.0f, &g), *f8 = make_rows(0, 12, D, 2.0f, &g);
    const size_t b4 = dsattn_v41_kv_row_bytes(D), b8 = dsattn_v41_swa_row_bytes(D);
    float *rows = malloc(NKP * LD * 4), *q = malloc(H * D * 4), *qp = malloc(HP * D * 4);
    float *st = malloc(NKP * HP * 4), *acct = malloc(D * HP * 4), *out = malloc(H * D * 4);
    float al[HP], den[HP];
    uint64_t h = DSATTN_FNV_START;
    if (!rows || !q || !qp || !st || !acct || !out || !f4 || !f8) goto done;
    for (size_t t = 0; t < 2; t++) {
        const uint8_t *rp[12];
        unsigned char kinds[12];
        const size_t nr = t ? NK - 12 : 12;
        for (size_t r = 0; r < 12; r++) {
            kinds[r] = (r + t) % 3 ? DSATTN_SA_FP4 : DSATTN_SA_FP8;
            rp[r] = kinds[r] == DSATTN_SA_FP4 ? f4 + ((r * 7 + t) % 12) * b4
                                              : f8 + ((r * 5 + t) % 12) * b8;
        }
        A->rows(rp, kinds, nr, D, rows + t * 12 * LD, LD);
    }
    for (size_t r = 0; r < NKP; r++) h = dsattn_fnv_bits(h, rows + r * LD, D);
    for (size_t i = 0; i < H * D; i++) q[i] = 0.05f * dsattn_rng_normal(&g);
    dsattn_mla_pack_q(q, D, H, HP, D, qp);
    A->qk(qp, HP, D, rows, LD, NK, st, HP);
    h = dsattn_fnv_bits(h, st, NKP * HP);
    for (size_t i = 0; i < NK * HP; i++) st[i] = dsattn_round_bf16(expf(0.1f * st[i] - 1.0f));
    for (size_t i = 0; i < D * HP; i++) acct[i] = dsattn_rng_normal(&g);
    for (size_t i = 0; i < HP; i++) {
        al[i] = i % 4 ? 1.0f : 0.375f;
        den[i] = 3.0f + 0.37f * (float)i;
    }
    A->pv(st, HP, HP, rows, LD, NK, D, al, acct);
    h = dsattn_fnv_bits(h, acct, D * HP);
    A->finish(acct, HP, H, D, den, out);
    h = dsattn_fnv_bits(h, out, H * D);
done:
    free(rows); free(q); free(qp); free(st); free(acct); free(out); free(f4); free(f8);
    return h;
}

DSATTN_TEST(sparse_attn, tile_bits_are_one_function_on_every_isa)
{
    static const dsattn_isa isas[3] = { DSATTN_ISA_AVX512, DSATTN_ISA_AVX2, DSATTN_ISA_NEON };
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        dsattn_ktab t;
        if (dsattn_ktab_fill(&t, isas[i], 0) != DSATTN_OK || !t.sa) continue;
        const uint64_t h = sa_tile_hash(t.sa);
        CHECK_MSG(h == SA_TILE_FNV, "%s: sparse-attention tile hash 0x%016llx, expected 0x%016llx",
                  t.sa->name, (unsigned long long)h, (unsigned long long)SA_TILE_FNV);
        seen++;
    }
    if (!seen) dsattn_test_skip("no sparse-attention tiles (CPU or build)");
}

DSATTN_TEST(sparse_attn, rows_decoder_equals_unpackers_bit_for_bit)
{
    rows_decoder_equals_unpackers_bit_for_bit_on(dsattn_test_avx512_ktab());
}

DSATTN_TEST(sparse_attn, rows_decoder_equals_unpackers_bit_for_bit_avx2)
{
    rows_decoder_equals_unpackers_bit_for_bit_on(dsattn_test_avx2_ktab());
}

DSATTN_TEST(sparse_attn, rows_decoder_equals_unpackers_bit_for_bit_neon)
{
    rows_decoder_equals_unpackers_bit_for_bit_on(dsattn_test_neon_ktab());
}

DSATTN_TEST(sparse_attn, bf16_rows_decoder_equals_rows_and_refuses_subnormals)
{
    bf16_rows_decoder_equals_rows_and_refuses_subnormals_on(dsattn_test_avx512_ktab());
}

DSATTN_TEST(sparse_attn, bf16_rows_decoder_equals_rows_and_refuses_subnormals_avx2)
{
    bf16_rows_decoder_equals_rows_and_refuses_subnormals_on(dsattn_test_avx2_ktab());
}

DSATTN_TEST(sparse_attn, bf16_rows_decoder_equals_rows_and_refuses_subnormals_neon)
{
    bf16_rows_decoder_equals_rows_and_refuses_subnormals_on(dsattn_test_neon_ktab());
}

DSATTN_TEST(sparse_attn, qk_pv_finish_match_scalar_table)
{
    qk_pv_finish_match_scalar_table_on(dsattn_test_avx512_ktab());
}

DSATTN_TEST(sparse_attn, qk_pv_finish_match_scalar_table_avx2)
{
    qk_pv_finish_match_scalar_table_on(dsattn_test_avx2_ktab());
}

DSATTN_TEST(sparse_attn, qk_pv_finish_match_scalar_table_neon)
{
    qk_pv_finish_match_scalar_table_on(dsattn_test_neon_ktab());
}

/* ==== Driver: fast vs reference ========================================= */

typedef struct {
    uint8_t *win, *cmp;
    dsattn_kv_src s0, s1;
    size_t nw, nc, d;
} v41_cache;

static void cache_init(v41_cache *c, size_t nw, size_t nc, size_t d, dsattn_rng *g)
{
    c->nw = nw; c->nc = nc; c->d = d;
    c->win = make_rows(0, nw, d, 1.0f, g);
    c->cmp = make_rows(1, nc, d, 1.0f, g);
    dsattn_kv_src w = { DSATTN_KV_V41_SWA, c->win, dsattn_v41_swa_row_bytes(d), nw, d, 0 };
    dsattn_kv_src k = { DSATTN_KV_V41_FP4, c->cmp, dsattn_v41_kv_row_bytes(d), nc, d, 0 };
    c->s0 = w;
    c->s1 = k;
}

static void cache_free(v41_cache *c) { free(c->win); free(c->cmp); }

static size_t g_nan;   /* NaN lanes of the last fast_vs_ref (equal in both modes) */

/* run both modes; returns rel L2 of fast vs reference (NaN lanes must
 * agree and are left out) */
/* the fast context's bf16 attention blocks (AMX tiles, or VDPBF16PS): -1
 * as created, 0 off, 1 on (where the CPU has them) */
static int g_blk = -1;

static double fast_vs_ref(const v41_cache *c, size_t nh, const int32_t *idx, size_t n_idx,
                          float max_init, float qsd, uint64_t seed, double *cos_out,
                          float *o_fast, float *o_ref)
{
    const size_t d = c->d;
    dsattn_rng g = { seed };
    float *q = malloc(nh * d * 4), *sink = malloc(nh * 4);
    for (size_t i = 0; i < nh * d; i++) q[i] = dsattn_round_bf16(qsd * dsattn_rng_normal(&g));
    for (size_t h = 0; h < nh; h++) sink[h] = dsattn_round_bf16(dsattn_rng_normal(&g));
    float *ws = malloc(dsattn_sparse_attn_scratch(nh, d) * sizeof(float));
    dsattn_ctx *cr = dsattn_test_ctx(DSATTN_MODE_REFERENCE, 1), *cf = dsattn_test_ctx(DSATTN_MODE_FAST, 1);
    if (cf && g_blk >= 0) dsattn_test_set_bf16blk(cf, g_blk);
    const float scale = 1.0f / sqrtf((float)d);
    dsattn_sparse_attn(cr, q, nh, d, &c->s0, &c->s1, idx, n_idx, sink, scale, max_init, o_ref, ws);
    dsattn_sparse_attn(cf, q, nh, d, &c->s0, &c->s1, idx, n_idx, sink, scale, max_init, o_fast,
                       ws);
    size_t nan_mismatch = 0;
    g_nan = 0;
    for (size_t i = 0; i < nh * d; i++) {
        g_nan += isnan(o_ref[i]);
        nan_mismatch += isnan(o_ref[i]) != isnan(o_fast[i]);
        if (isnan(o_ref[i])) o_ref[i] = o_fast[i] = 0.0f;
    }
    CHECK_MSG(nan_mismatch == 0, "%zu NaN lanes differ between fast and reference", nan_mismatch);
    double rel = dsattn_rel_l2(o_fast, o_ref, nh * d);
    if (getenv("SA_TEST_VERBOSE")) fprintf(stderr, "  nh %zu n_idx %zu rel %.3g\n", nh, n_idx, rel);
    if (cos_out) *cos_out = dsattn_cosine(o_fast, o_ref, nh * d);
    dsattn_ctx_destroy(cr);
    dsattn_ctx_destroy(cf);
    free(q); free(sink); free(ws);
    return rel;
}

/* Bound: fp32 FMA sums vs the reference's double sums, and the bf16 P
 * and output roundings that flip where a value sits near a tie.  Measured
 * worst rel L2 3.0e-4 over these cases (SA_TEST_VERBOSE=1 prints each),
 * identical bf16 outputs for most small cases.  1.5e-3 rel L2 and cosine
 * > 0.99999 catch a wrong row, head, scale, rescale or a dropped bf16
 * rounding of P (rel ~1e-2 and more). */
#define SA_REL 1.5e-3
#define SA_COS 0.99999

DSATTN_TEST(sparse_attn, fast_vs_reference_odd_shapes)
{
    dsattn_rng g = { 21 };
    v41_cache c;
    cache_init(&c, 128, 300, 512, &g);
    const size_t nhs[] = { 1, 3, 17, 32, 40, 64 };
    const size_t nis[] = { 1, 11, 13, 64, 65, 140, 640 };
    int32_t *idx = malloc(640 * sizeof(int32_t));
    float *o1 = malloc(64 * 512 * 4), *o2 = malloc(64 * 512 * 4);
    for (size_t a = 0; a < sizeof nhs / sizeof nhs[0]; a++)
        for (size_t b = 0; b < sizeof nis / sizeof nis[0]; b++) {
            const size_t ni = nis[b];
            /* window rows first, then compressed (offset 128), as V4.1 */
            for (size_t i = 0; i < ni; i++)
                idx[i] = i < ni / 4 ? (int32_t)((i * 7 + a) % 128)
                                    : (int32_t)(128 + (i * 131 + b) % 300);
            double cs;
            const double rel = fast_vs_ref(&c, nhs[a], idx, ni, -1e30f, 0.5f, 100 + a * 10 + b,
                                           &cs, o1, o2);
            CHECK_MSG(rel < SA_REL && cs > SA_COS, "nh %zu n_idx %zu: rel %g cos %.7f", nhs[a],
                      ni, rel, cs);
        }
    free(idx); free(o1); free(o2);
    cache_free(&c);
}

DSATTN_TEST(sparse_attn, fast_vs_reference_invalid_indices)
{
    dsattn_rng g = { 22 };
    v41_cache c;
    cache_init(&c, 128, 200, 512, &g);
    int32_t idx[400];
    float *o1 = malloc(40 * 512 * 4), *o2 = malloc(40 * 512 * 4);
    /* -1 and out-of-range entries mixed in; one block of 64 entirely -1 */
    for (int i = 0; i < 400; i++) {
        idx[i] = i % 5 == 2 ? -1 : i % 11 == 4 ? 328 + i : (int32_t)((i * 53) % 328);
        if (i >= 128 && i < 192) idx[i] = -1;
    }
    double cs;
    double rel = fast_vs_ref(&c, 40, idx, 400, -1e30f, 0.5f, 7, &cs, o1, o2);
    CHECK_MSG(rel < SA_REL && cs > SA_COS, "mixed invalid: rel %g cos %.7f", rel, cs);
    /* V4's -inf start with a leading all-invalid block: NaN in both */
    fast_vs_ref(&c, 40, idx + 128, 400 - 128, -INFINITY, 0.5f, 8, &cs, o1, o2);
    CHECK_MSG(g_nan == 40 * 512, "-inf start, invalid first block: %zu NaN lanes", g_nan);
    /* all invalid, V4.1 start: exactly 0 in both modes */
    for (int i = 0; i < 400; i++) idx[i] = i % 2 ? -1 : 100000 + i;
    memset(o1, 0x7f, 40 * 512 * 4);
    fast_vs_ref(&c, 40, idx, 400, -1e30f, 0.5f, 9, NULL, o1, o2);
    size_t nz = 0;
    for (size_t i = 0; i < 40 * 512; i++) nz += o1[i] != 0.0f || o2[i] != 0.0f;
    CHECK_MSG(nz == 0, "all-invalid row: %zu non-zero outputs", nz);
    free(o1); free(o2);
    cache_free(&c);
}

DSATTN_TEST(sparse_attn, fast_vs_reference_peaked_scores)
{
    /* large queries: the softmax is dominated by few rows and the running
     * max moves between blocks (the rescale path), window and compressed */
    dsattn_rng g = { 23 };
    v41_cache c;
    cache_init(&c, 128, 600, 512, &g);
    int32_t idx[640];
    for (int i = 0; i < 640; i++) idx[i] = i < 128 ? i : 128 + (i * 389) % 600;
    float *o1 = malloc(32 * 512 * 4), *o2 = malloc(32 * 512 * 4);
    double cs;
    const double rel = fast_vs_ref(&c, 32, idx, 640, -1e30f, 4.0f, 31, &cs, o1, o2);
    CHECK_MSG(rel < SA_REL && cs > SA_COS, "peaked: rel %g cos %.7f", rel, cs);
    free(o1); free(o2);
    cache_free(&c);
}

DSATTN_TEST(sparse_attn, nan_codes_give_nan_in_both_modes)
{
    dsattn_rng g = { 24 };
    v41_cache c;
    cache_init(&c, 128, 100, 512, &g);
    c.win[5 * c.s0.stride + 17] = 0x7f;                   /* one FP8 NaN code */
    c.cmp[3 * c.s1.stride + 256 + 2] = 0xff;              /* one NaN E4M3 scale */
    int32_t idx[80];
    float *o1 = malloc(17 * 512 * 4), *o2 = malloc(17 * 512 * 4);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 80; i++) idx[i] = i < 40 ? i + 20 : 128 + (i - 40);
        idx[pass ? 70 : 10] = pass ? 128 + 3 : 5;
        /* fast_vs_ref checks the NaN lanes agree; every lane must be NaN */
        fast_vs_ref(&c, 17, idx, 80, -1e30f, 0.5f, 40 + pass, NULL, o1, o2);
        CHECK_MSG(g_nan == 17 * 512, "pass %d: %zu of %d lanes NaN", pass, g_nan, 17 * 512);
    }
    free(o1); free(o2);
    cache_free(&c);
}

DSATTN_TEST(sparse_attn, bf16_blocks_and_fma_tiles_both_match_reference)
{
    /* Where the CPU has AMX-BF16 or AVX512-BF16: the same cases through the
     * bf16 blocks (AMX tiles, or their VDPBF16PS form; rows decoded,
     * checked bf16, one tile block per 64 indices) and the
     * FMA tiles, each against reference mode with the bound above; V4's
     * -inf start with a leading block of 64 invalid indices gives NaN in
     * both (fast_vs_ref compares the NaN lanes); and the two fast forms do
     * not give identical bits everywhere (so the tile form really ran). */
    if (!dsattn_test_bf16blk_or_skip()) return;
    dsattn_rng g = { 23 };
    v41_cache c;
    cache_init(&c, 128, 300, 512, &g);
    const size_t nhs[] = { 1, 17, 32, 64 };
    const size_t nis[] = { 13, 64, 140, 640 };
    int32_t *idx = malloc(640 * sizeof(int32_t));
    float *oa = malloc(64 * 512 * 4), *of = malloc(64 * 512 * 4), *orf = malloc(64 * 512 * 4);
    size_t differ = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (int v4 = 0; v4 < 2; v4++) {
                const size_t ni = nis[b];
                for (size_t i = 0; i < ni; i++)
                    idx[i] = i < ni / 4 ? (int32_t)((i * 5 + a) % 128)
                                        : (int32_t)(128 + (i * 97 + b) % 300);
                if (v4)                 /* a leading block with no valid row */
                    for (size_t i = 0; i < ni && i < 64; i++) idx[i] = -1;
                const float mi = v4 ? -INFINITY : -1e30f;
                double ca, cf;
                g_blk = 1;
                const double ra = fast_vs_ref(&c, nhs[a], idx, ni, mi, 0.5f, 300 + a * 10 + b, &ca,
                                              oa, orf);
                g_blk = 0;
                const double rf = fast_vs_ref(&c, nhs[a], idx, ni, mi, 0.5f, 300 + a * 10 + b, &cf,
                                              of, orf);
                CHECK_MSG(ra < SA_REL && ca > SA_COS, "bf16 blocks nh %zu n_idx %zu v4 %d: rel %g cos %.7f",
                          nhs[a], ni, v4, ra, ca);
                CHECK_MSG(rf < SA_REL && cf > SA_COS, "FMA nh %zu n_idx %zu v4 %d: rel %g cos %.7f",
                          nhs[a], ni, v4, rf, cf);
                differ += memcmp(oa, of, nhs[a] * 512 * sizeof(float)) != 0;
            }
    g_blk = -1;
    CHECK_MSG(differ > 0, "the bf16 blocks and FMA forms gave identical bits in every case");
    free(idx); free(oa); free(of); free(orf);
    cache_free(&c);
}

/* The bytes counter charges each valid index at the row size of the source
 * it names: V4.1 window rows (528 B at d 512) and compressed rows (288 B),
 * not every row at the window's size. */
DSATTN_TEST(sparse_attn, bytes_read_count_each_row_at_its_size)
{
    dsattn_rng g = { 77 };
    const size_t d = 512, nh = 4, nw = 8, nc = 16;
    v41_cache c;
    cache_init(&c, nw, nc, d, &g);
    CHECK_EQ_INT(c.s0.stride, 528);
    CHECK_EQ_INT(c.s1.stride, 288);
    /* 3 window rows, 5 compressed rows, 2 invalid */
    const int32_t idx[10] = { 0, 3, 7, -1, 8, 9, 12, 20, 23, (int32_t)(nw + nc) };
    float *q = calloc(nh * d, 4), *o = malloc(nh * d * 4), *sink = calloc(nh, 4);
    float *ws = malloc(dsattn_sparse_attn_scratch(nh, d) * sizeof(float));
    for (int mode = 0; mode < 2; mode++) {
        dsattn_ctx *ctx = dsattn_test_ctx(mode ? DSATTN_MODE_REFERENCE : DSATTN_MODE_FAST, 1);
        if (!ctx) break;
        dsattn_ctx_counters_reset(ctx);
        dsattn_sparse_attn(ctx, q, nh, d, &c.s0, &c.s1, idx, 10, sink, 0.05f, -1e30f, o, ws);
        const dsattn_counters k = dsattn_ctx_counters(ctx);
        CHECK_EQ_INT(k.bytes_read, 3 * 528 + 5 * 288 + nh * d * 4);
        CHECK_EQ_INT(k.flops, 4ull * 8 * nh * d);
        dsattn_ctx_destroy(ctx);
    }
    free(q); free(o); free(sink); free(ws);
    cache_free(&c);
}
