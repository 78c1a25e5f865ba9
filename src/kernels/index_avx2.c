/* index_avx2.c - the AVX2 form of the `index` slot: the lightning-indexer
 * score over FP4 index keys with AVX2 integer dot products, the same bits
 * as the AVX-512 VNNI form (index_vnni_avx512.c) and the scalar reference.
 *
 * The query layout is the shared one (index_prep.c): int8 half-units, for
 * each group of 4 dims 8 heads x 4 bytes per ymm, keys decoded to biased
 * half-units k + 12 (0..24), and the block sum started at -12 * sum(q).
 * AVX2 has no vpdpbusd; its two steps are vpmaddubsw (unsigned key bytes x
 * signed query bytes, adjacent pairs summed into int16 with saturation)
 * and vpmaddwd (int16 pairs into int32).  Nothing saturates or wraps: a
 * key byte is at most 24 and a query byte at most 12 in magnitude, so a
 * pair sum is at most 2 * 24 * 12 = 576 in magnitude; each int16 lane
 * starts at half the bias correction (|-12 * sum(q)| / 2 <= 2304) and adds
 * the pair sums of a whole 32-dim block (8 groups) before widening: at
 * most 2304 + 8 * 576 = 6912 < 32767.  The widened block sum is then
 * exactly the vpdpbusd one.  Keys whose block sums the VNNI form scales in
 * fp32 (dsattn_index_key_fits_f32: every partial sum exact) get the same
 * exact sum here in int32 - the widening vpmaddwd multiplies by the power
 * of two between each block's scale and the key's smallest (score_rows) -
 * then converted to fp32 and scaled by a power of two, both exact; the others
 * repeat the VNNI form's double scaling in its order.  The head weighting
 * repeats the VNNI form's operations in its order, 8 lanes at a time - the
 * double head sum in the same lanes and the same reduction tree - so the
 * scores are the same bits.
 *
 * Keys come in fours (the key loop around score_rows is the VNNI form's,
 * index_scores_tmpl.h).  When all four take the fp32 scaling (the common
 * case) they go two at a time through score_row1, whose int16 block sums
 * and int32 totals of 32 heads stay in registers and whose two keys' head
 * weightings run side by side (two independent latency chains); otherwise
 * the four go together through score_rows4, whose 8 groups x 4 keys of byte dot
 * products are one asm block (block4: compiled from intrinsics, GCC kept
 * the accumulators in memory) and whose totals go through memory.
 *
 * Limits: the VNNI form's (nh a multiple of 16 up to 64, dh a multiple of
 * 32 up to 256); callers check dsattn_index_avx2_ok() and fall back to the
 * reference.  Built with -mavx2 -mfma -mf16c only.
 */
#include "index_vnni.h"

#include "numfmt.h"
#include "simd_avx2.h"

#include <string.h>

int dsattn_index_avx2_ok(size_t nh, size_t dh)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return have && nh % 16 == 0 && nh >= 16 && nh <= 64 && dh % 32 == 0 && dh >= 32 &&
           dh <= 256;
}

#define AI static inline __attribute__((always_inline))

/* One row's FP4 codes to biased half-units, element order kept (the even
 * element is the low nibble), dh / 2 bytes read: 32 code bytes per step
 * (each 128-bit half decodes its own 16 bytes, stored as it comes out),
 * a last 16 in the SSE form. */
AI void decode_row(const uint8_t *row, size_t dh, __m128i lut, uint8_t *kb)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i m8 = _mm256_set1_epi8(0x0f), l8 = _mm256_broadcastsi128_si256(lut);
    size_t c = 0;
    for (; c + 32 <= dh / 2; c += 32) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(row + c));
        const __m256i lo = _mm256_and_si256(x, m8);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m8);
        const __m256i a = _mm256_shuffle_epi8(l8, _mm256_unpacklo_epi8(lo, hi));
        const __m256i b = _mm256_shuffle_epi8(l8, _mm256_unpackhi_epi8(lo, hi));
        /* a: bytes 0-7 | 16-23 of the 32, b: 8-15 | 24-31 */
        _mm_store_si128((__m128i *)(kb + 2 * c), _mm256_castsi256_si128(a));
        _mm_store_si128((__m128i *)(kb + 2 * c + 16), _mm256_castsi256_si128(b));
        _mm_store_si128((__m128i *)(kb + 2 * c + 32), _mm256_extracti128_si256(a, 1));
        _mm_store_si128((__m128i *)(kb + 2 * c + 48), _mm256_extracti128_si256(b, 1));
    }
    for (; c < dh / 2; c += 16) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(row + c));
        const __m128i lo = _mm_and_si128(x, m4);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
        _mm_store_si128((__m128i *)(kb + 2 * c), _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)));
        _mm_store_si128((__m128i *)(kb + 2 * c + 16),
                        _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)));
    }
}

/* 2^(e - 128) as a double */
AI __m256d key_scaled(uint8_t e)
{
    return _mm256_castsi256_pd(_mm256_set1_epi64x((long long)(((uint64_t)e + 1023 - 128) << 52)));
}

/* Head weighting of 8 heads' fp32 dots into the double head sum, lanes
 * 0-3 in lo and 4-7 in hi (the VNNI form's 8 double lanes):
 * bf16(dot) -> relu -> bf16(* w) -> added in double. */
AI void head_oct(__m256d *lo, __m256d *hi, __m256 dot, const float *w)
{
    const __m256 d = _mm256_max_ps(dsattn_rbf16_256(dot), _mm256_setzero_ps());
    const __m256 pr = dsattn_rbf16_256(_mm256_mul_ps(d, _mm256_loadu_ps(w)));
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
}

/* The VNNI form's _mm512_reduce_add_pd: (hi + lo), then its halves, then
 * the two lanes; rounded to fp32, then to bf16. */
AI float head_reduce(__m256d lo, __m256d hi)
{
    const __m256d t3 = _mm256_add_pd(hi, lo);
    const __m128d t6 = _mm_add_pd(_mm256_extractf128_pd(t3, 1), _mm256_castpd256_pd128(t3));
    return dsattn_round_bf16((float)(_mm_cvtsd_f64(t6) + _mm_cvtsd_f64(_mm_unpackhi_pd(t6, t6))));
}

#define IDX_ROWS 4

/* Per call, from the query layout (aux_prepare): the key table, the bias
 * correction split over each int32 lane's two int16 halves (the int16
 * accumulators start there, so the widened sum already holds it), and for
 * the fp32-scaled keys the integer block weights 2^(e_bh - emin_h + s) (e_bh
 * the exponent of block b's unit u_q of head h, emin_h the smallest over
 * the head's nonzero blocks, s = 0..8 the key block's scale over the key's
 * smallest: one row per s, so a key picks its weights by address) and
 * emin_h - 1 in an fp32 exponent field. */
#define IDX_KSH 9                     /* key block shifts 0..8 (ue_span + kmax - kmin <= 8) */
typedef struct {
    __m128i lut;
    int16_t nb16[8 * 64 * 2] __attribute__((aligned(32)));            /* [block][head][2] */
    int16_t qms[8 * IDX_KSH * 64 * 2] __attribute__((aligned(32)));   /* [block][s][head][2] */
    int32_t hexp23[64] __attribute__((aligned(32)));                  /* (emin_h - 1) << 23 */
} idx_aux;

static void aux_prepare(const dsattn_index_vnni_q *p, idx_aux *a)
{
    const size_t nb = p->dh / 32;
    uint64_t nz[8];                     /* [block] bit h: the block of head h is nonzero */
    for (size_t b = 0; b < nb; b++) {
        __m256i o[8];
        for (size_t k = 0; k < 8; k++) o[k] = _mm256_setzero_si256();
        for (size_t g = 0; g < 8; g++)
            for (size_t k = 0; k < 8; k++)
                o[k] = _mm256_or_si256(o[k], _mm256_load_si256((const __m256i *)(p->qb + (b * 8 + g) * 256) + k));
        nz[b] = 0;
        for (size_t k = 0; k < 8; k++) {
            const __m256i z = _mm256_cmpeq_epi32(o[k], _mm256_setzero_si256());
            nz[b] |= (uint64_t)(~_mm256_movemask_ps(_mm256_castsi256_ps(z)) & 0xff) << (8 * k);
        }
    }
    for (size_t h = 0; h < p->nh; h++) {
        int e[8], emin = 1000;
        for (size_t b = 0; b < nb; b++) {
            /* u = 2^e, as index_prep.c reads it (a subnormal u from where its bit sits) */
            const uint32_t ub = dsattn_f32_bits(p->unit[b * 64 + h]), ef = (ub >> 23) & 0xffu;
            e[b] = ef ? (int)ef - 127 : -149 + (31 - __builtin_clz(ub & 0x7fffffu));
            if (nz[b] >> h & 1) emin = e[b] < emin ? e[b] : emin;
        }
        if (emin == 1000) emin = p->ue_min;    /* an all-zero head: its sums are 0 */
        for (size_t b = 0; b < nb; b++) {
            /* zero blocks add 0 whatever their weight; the others lie within
             * ue_span <= 8 binades when any key takes the fp32 scaling */
            int sh = nz[b] >> h & 1 ? e[b] - emin : 0;
            sh = sh > 8 ? 8 : sh;
            const int32_t bias = p->nbias[b * 64 + h];
            a->nb16[(b * 64 + h) * 2] = (int16_t)(bias >> 1);
            a->nb16[(b * 64 + h) * 2 + 1] = (int16_t)(bias - (bias >> 1));
            /* a fit key reads only rows with sh + s <= 8; the others are
             * clamped so they stay int16 */
            for (int ks = 0; ks < IDX_KSH; ks++) {
                const int t = sh + ks > 14 ? 14 : sh + ks;
                a->qms[((b * IDX_KSH + (size_t)ks) * 64 + h) * 2] =
                    a->qms[((b * IDX_KSH + (size_t)ks) * 64 + h) * 2 + 1] = (int16_t)(1 << t);
            }
        }
        a->hexp23[h] = (int32_t)((uint32_t)(emin - 1) << 23);
    }
}

/* One 32-dim block of 16 heads for 4 keys: per group of 4 dims a key's
 * 4 bytes broadcast, 2 vpmaddubsw against the group's query bytes (q, 256 B
 * apart per group) and 2 int16 adds into acc[key][0..1].  In assembly:
 * GCC's allocation of the 8 accumulators around the rest of score_rows
 * kept some of them in memory, a store-to-load chain per group. */
#define BLOCK4_G(g)                                                                   \
    "vpbroadcastd " #g "*4(%[k0]), %[kv]\n\t"                                         \
    "vpmaddubsw " #g "*256(%[q]), %[kv], %[t]\n\t"                                    \
    "vpaddw %[t], %[a00], %[a00]\n\t"                                                 \
    "vpmaddubsw " #g "*256+32(%[q]), %[kv], %[kv]\n\t"                                \
    "vpaddw %[kv], %[a01], %[a01]\n\t"                                                \
    "vpbroadcastd " #g "*4(%[k1]), %[kv]\n\t"                                         \
    "vpmaddubsw " #g "*256(%[q]), %[kv], %[t]\n\t"                                    \
    "vpaddw %[t], %[a10], %[a10]\n\t"                                                 \
    "vpmaddubsw " #g "*256+32(%[q]), %[kv], %[kv]\n\t"                                \
    "vpaddw %[kv], %[a11], %[a11]\n\t"                                                \
    "vpbroadcastd " #g "*4(%[k2]), %[kv]\n\t"                                         \
    "vpmaddubsw " #g "*256(%[q]), %[kv], %[t]\n\t"                                    \
    "vpaddw %[t], %[a20], %[a20]\n\t"                                                 \
    "vpmaddubsw " #g "*256+32(%[q]), %[kv], %[kv]\n\t"                                \
    "vpaddw %[kv], %[a21], %[a21]\n\t"                                                \
    "vpbroadcastd " #g "*4(%[k3]), %[kv]\n\t"                                         \
    "vpmaddubsw " #g "*256(%[q]), %[kv], %[t]\n\t"                                    \
    "vpaddw %[t], %[a30], %[a30]\n\t"                                                 \
    "vpmaddubsw " #g "*256+32(%[q]), %[kv], %[kv]\n\t"                                \
    "vpaddw %[kv], %[a31], %[a31]\n\t"

AI void block4(const int8_t *q, const uint8_t *k0, const uint8_t *k1, const uint8_t *k2,
               const uint8_t *k3, __m256i acc[][2])
{
    __m256i kv, t;
    __asm__(BLOCK4_G(0) BLOCK4_G(1) BLOCK4_G(2) BLOCK4_G(3)
            BLOCK4_G(4) BLOCK4_G(5) BLOCK4_G(6) BLOCK4_G(7)
            : [a00] "+x"(acc[0][0]), [a01] "+x"(acc[0][1]), [a10] "+x"(acc[1][0]),
              [a11] "+x"(acc[1][1]), [a20] "+x"(acc[2][0]), [a21] "+x"(acc[2][1]),
              [a30] "+x"(acc[3][0]), [a31] "+x"(acc[3][1]), [kv] "=&x"(kv), [t] "=&x"(t)
            : [q] "r"(q), [k0] "r"(k0), [k1] "r"(k1), [k2] "r"(k2), [k3] "r"(k3),
              "m"(*(const int8_t(*)[7 * 256 + 64])q), "m"(*(const uint8_t(*)[32])k0),
              "m"(*(const uint8_t(*)[32])k1), "m"(*(const uint8_t(*)[32])k2),
              "m"(*(const uint8_t(*)[32])k3));
}
#undef BLOCK4_G

/* NR keys x NHC chunks of 16 heads in the VNNI form's double scaling,
 * compile-time shapes: the fours with a key outside the fp32 scaling (any
 * key's double sum, rounded to fp32, is the bits the fp32 form gives it).
 * Per block and chunk the 2 x NR int16 accumulators stay in registers over
 * the block's 8 groups; each pair of query loads feeds NR keys; the double
 * totals go through memory, block after block. */
AI void score_rows4(const dsattn_index_vnni_q *p, const uint8_t *const *row, size_t dh,
                    const idx_aux *a, const size_t NR, const size_t NHC, float *out)
{
    uint8_t kb[IDX_ROWS][256] __attribute__((aligned(32)));
    double td[IDX_ROWS][64] __attribute__((aligned(32)));
    const size_t nb = dh / 32;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) decode_row(row[r], dh, a->lut, kb[r]);
    for (size_t b = 0; b < nb; b++) {
        /* the chunk loop rolled on purpose: unrolled, GCC kept the key
         * broadcasts live across the head chunks and spilled accumulators */
#pragma GCC unroll 1
        for (size_t hc = 0; hc < NHC; hc++) {
            const size_t h0 = b * 64 + hc * 16;
            __m256i acc[IDX_ROWS][2];
            const __m256i nb0 = _mm256_load_si256((const __m256i *)(a->nb16 + h0 * 2));
            const __m256i nb1 = _mm256_load_si256((const __m256i *)(a->nb16 + h0 * 2 + 16));
#pragma GCC unroll 4
            for (size_t r = 0; r < NR; r++) {
                acc[r][0] = nb0;
                acc[r][1] = nb1;
            }
            const int8_t *qb = p->qb + (b * 8 * 64 + hc * 16) * 4;
            if (NR == 4) {
                block4(qb, kb[0] + b * 32, kb[1] + b * 32, kb[2] + b * 32, kb[3] + b * 32, acc);
            } else {
#pragma GCC unroll 1
                for (size_t g = 0; g < 8; g++) {
                    const __m256i q0 = _mm256_load_si256((const __m256i *)(qb + g * 256));
                    const __m256i q1 = _mm256_load_si256((const __m256i *)(qb + g * 256 + 32));
#pragma GCC unroll 4
                    for (size_t r = 0; r < NR; r++) {
                        int32_t kk;
                        memcpy(&kk, kb[r] + b * 32 + g * 4, 4);
                        const __m256i kv = _mm256_set1_epi32(kk);
                        acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_maddubs_epi16(kv, q0));
                        acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_maddubs_epi16(kv, q1));
                    }
                }
            }
            const int first = b == 0;      /* the totals start at 0 (no memset) */
#pragma GCC unroll 4
            for (size_t r = 0; r < NR; r++) {
                const __m256d ks = key_scaled(row[r][dh / 2 + b]);
#pragma GCC unroll 2
                for (size_t s = 0; s < 2; s++) {
                    /* corr * u_q * s_k exact in double, one fused add each */
                    const size_t h = hc * 16 + s * 8;
                    const __m256i corr = _mm256_madd_epi16(acc[r][s], ones);
                    const __m256d u0 = _mm256_mul_pd(_mm256_loadu_pd(p->unitd + h0 + s * 8), ks);
                    const __m256d u1 =
                        _mm256_mul_pd(_mm256_loadu_pd(p->unitd + h0 + s * 8 + 4), ks);
                    const __m256d f0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(corr));
                    const __m256d f1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(corr, 1));
                    const __m256d z = _mm256_setzero_pd();
                    _mm256_store_pd(td[r] + h,
                                    _mm256_fmadd_pd(f0, u0, first ? z : _mm256_load_pd(td[r] + h)));
                    const __m256d t1 = first ? z : _mm256_load_pd(td[r] + h + 4);
                    _mm256_store_pd(td[r] + h + 4, _mm256_fmadd_pd(f1, u1, t1));
                }
            }
        }
    }
    /* the head weighting of the NR keys side by side: their double sums
     * are independent chains; the totals rounded to fp32 first, as in the
     * VNNI form */
    __m256d lo[IDX_ROWS], hi[IDX_ROWS];
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) lo[r] = hi[r] = _mm256_setzero_pd();
#pragma GCC unroll 1
    for (size_t h = 0; h < NHC * 16; h += 8) {
#pragma GCC unroll 4
        for (size_t r = 0; r < NR; r++) {
            const __m256 dot = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_load_pd(td[r] + h + 4)),
                                               _mm256_cvtpd_ps(_mm256_load_pd(td[r] + h)));
            head_oct(&lo[r], &hi[r], dot, p->w + h);
        }
    }
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) out[r] = head_reduce(lo[r], hi[r]);
}

/* One key that takes the fp32 scaling (dsattn_index_key_fits_f32): its
 * blocks are summed in int32, block b of head h adding corr_bh * 2^(e_bh -
 * emin_h + k_b - kmin), k_b its scale byte and kmin the smallest, the power
 * of two the int16 multiplier of the widening vpmaddwd.  The shift is at
 * most ue_span + (kmax - kmin) <= 8, so with |corr| <= 32 * 12 * 12 = 4608
 * the total stays below 8 * 2^12.2 * 2^8 < 2^24: exact in int32, exact as
 * a float, and times 2^(emin_h + kmin - 128) (a power of two, the smallest
 * term's, >= 2^-120 by the same check) exactly the sum the VNNI form forms
 * in fp32 - which is exact too.  The head weighting puts the heads in the
 * same order into the same double lanes as score_rows4 and the VNNI form.
 * Heads go in passes of up to 32 (2 chunks): the 4 int16 block
 * accumulators and the 4 int32 totals of a pass stay in registers over the
 * blocks, so a block costs its byte dots and 4 widening vpmaddwd + vpaddd
 * (the multipliers read from aux's row for the block's shift).  kmin: the
 * key's smallest scale byte (dsattn_index_key_fits_f32_min). */
AI void score_row1(const dsattn_index_vnni_q *p, const uint8_t *const *row, size_t dh,
                   const idx_aux *a, const int *kmin, const size_t NK, const size_t NHC,
                   float *out)
{
    uint8_t kb[2][256] __attribute__((aligned(32)));
    const size_t nb = dh / 32;
    __m256i k23[2];
    __m256d lo[2], hi[2];
#pragma GCC unroll 2
    for (size_t k = 0; k < NK; k++) {
        decode_row(row[k], dh, a->lut, kb[k]);
        k23[k] = _mm256_set1_epi32((int)((uint32_t)kmin[k] << 23));
        lo[k] = hi[k] = _mm256_setzero_pd();
    }
#pragma GCC unroll 2
    for (size_t c0 = 0; c0 < NHC; c0 += 2) {
        const size_t NC = NHC - c0 >= 2 ? 2 : 1;
        __m256i ti[2][2][2];
#pragma GCC unroll 2
        for (size_t k = 0; k < NK; k++) {
#pragma GCC unroll 2
            for (size_t c = 0; c < NC; c++)
                ti[k][c][0] = ti[k][c][1] = _mm256_setzero_si256();
#pragma GCC unroll 1
            for (size_t b = 0; b < nb; b++) {
                const size_t h0 = b * 64 + c0 * 16;
                __m256i acc[2][2];
#pragma GCC unroll 2
                for (size_t c = 0; c < NC; c++)
#pragma GCC unroll 2
                    for (size_t s = 0; s < 2; s++)
                        acc[c][s] = _mm256_load_si256(
                            (const __m256i *)(a->nb16 + (h0 + c * 16 + s * 8) * 2));
                const int8_t *qb = p->qb + (b * 8 * 64 + c0 * 16) * 4;
#pragma GCC unroll 8
                for (size_t g = 0; g < 8; g++) {
                    int32_t kk;
                    memcpy(&kk, kb[k] + b * 32 + g * 4, 4);
                    const __m256i kv = _mm256_set1_epi32(kk);
#pragma GCC unroll 2
                    for (size_t c = 0; c < NC; c++)
#pragma GCC unroll 2
                        for (size_t s = 0; s < 2; s++)
                            acc[c][s] = _mm256_add_epi16(
                                acc[c][s],
                                _mm256_maddubs_epi16(kv, _mm256_load_si256((const __m256i *)(
                                                             qb + g * 256 + c * 64 + s * 32))));
                    /* each group's sum in its register: left free, GCC formed all 32
                     * products first (the adds reassociated) and spilled them */
#pragma GCC unroll 2
                    for (size_t c = 0; c < NC; c++)
#pragma GCC unroll 2
                        for (size_t s = 0; s < 2; s++) __asm__("" : "+x"(acc[c][s]));
                }
                const int16_t *qm =
                    a->qms +
                    ((b * IDX_KSH + (size_t)(row[k][dh / 2 + b] - kmin[k])) * 64 + c0 * 16) * 2;
#pragma GCC unroll 2
                for (size_t c = 0; c < NC; c++)
#pragma GCC unroll 2
                    for (size_t s = 0; s < 2; s++) {
                        const __m256i m =
                            _mm256_load_si256((const __m256i *)(qm + (c * 16 + s * 8) * 2));
                        ti[k][c][s] = _mm256_add_epi32(ti[k][c][s], _mm256_madd_epi16(acc[c][s], m));
                    }
            }
        }
        /* the keys' head weightings side by side: independent chains */
#pragma GCC unroll 2
        for (size_t c = 0; c < NC; c++)
#pragma GCC unroll 2
            for (size_t s = 0; s < 2; s++)
#pragma GCC unroll 2
                for (size_t k = 0; k < NK; k++) {
                    const size_t h = (c0 + c) * 16 + s * 8;
                    /* 2^(emin_h - 1 + kmin - 128 + 128): (e << 23) + (kmin << 23) */
                    const __m256 sc = _mm256_castsi256_ps(_mm256_add_epi32(
                        _mm256_load_si256((const __m256i *)(a->hexp23 + h)), k23[k]));
                    head_oct(&lo[k], &hi[k], _mm256_mul_ps(_mm256_cvtepi32_ps(ti[k][c][s]), sc),
                             p->w + h);
                }
    }
#pragma GCC unroll 2
    for (size_t k = 0; k < NK; k++) out[k] = head_reduce(lo[k], hi[k]);
}

/* score_row1 compiled apart for each number of head chunks: inlined into
 * the 4-key loop, GCC interleaved the keys and spilled the totals */
#define ROW1_FN(NHC)                                                                       \
    static __attribute__((noinline)) void score_row1_##NHC(                                \
        const dsattn_index_vnni_q *p, const uint8_t *const *row, size_t dh,                \
        const idx_aux *a, const int *kmin, size_t nk, float *out)                          \
    {                                                                                      \
        if (nk == 2) score_row1(p, row, dh, a, kmin, 2, NHC, out);                         \
        else         score_row1(p, row, dh, a, kmin, 1, NHC, out);                         \
    }
ROW1_FN(1) ROW1_FN(2) ROW1_FN(3) ROW1_FN(4)
#undef ROW1_FN

/* Keys that all take the fp32 scaling (the common case) two at a time
 * (score_row1);
 * otherwise the four together in the double scaling (a branch per key in
 * the block loop cost more than the double scaling of the fit ones). */
AI void score_rows(const dsattn_index_vnni_q *p, const uint8_t *const *row, size_t dh,
                   const idx_aux *a, const size_t NR, const size_t NHC, float *out)
{
    int all = 1, kmin[IDX_ROWS];
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++)
        all &= dsattn_index_key_fits_f32_min(p, row[r] + dh / 2, dh / 32, &kmin[r]);
    if (all) {
#pragma GCC unroll 2
        for (size_t r = 0; r < NR; r += 2) {
            const size_t nk = NR - r >= 2 ? 2 : 1;
            if (NHC == 1) score_row1_1(p, row + r, dh, a, kmin + r, nk, out + r);
            else if (NHC == 2) score_row1_2(p, row + r, dh, a, kmin + r, nk, out + r);
            else if (NHC == 3) score_row1_3(p, row + r, dh, a, kmin + r, nk, out + r);
            else score_row1_4(p, row + r, dh, a, kmin + r, nk, out + r);
        }
    } else {
        score_rows4(p, row, dh, a, NR, NHC, out);
    }
}

#define IDX_LUT const idx_aux *
#define IDX_TARGET
#include "index_scores_tmpl.h"

void dsattn_index_avx2_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score)
{
    idx_aux a;
    a.lut = _mm_loadu_si128((const __m128i *)dsattn_index_k_lut);
    aux_prepare(p, &a);
    score_heads(p, base, row_bytes, sel, j0, n, &a, score);
}

static const dsattn_index_kern index_avx2 = {
    "avx2", dsattn_index_avx2_ok, dsattn_index_q_prepare, dsattn_index_avx2_scores,
};
const dsattn_index_kern *const dsattn_index_avx2_ptr = &index_avx2;
