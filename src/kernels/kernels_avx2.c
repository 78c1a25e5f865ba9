/* kernels_avx2.c - the AVX2 + FMA + F16C kernel table.
 *
 * Owns the fast path of every dsattn_kernels entry on CPUs without AVX-512
 * (and under valgrind, which cannot run AVX-512: DSATTN_ISA=avx2).  Same
 * contract as kernels_avx512.c - fp32 FMA accumulation in its own order,
 * tested against kernels_ref.c with stated bounds, single-threaded and
 * reentrant - on 8 lanes and 16 registers.  The f32 / bf16 GEMVs take 4
 * rows a step and prefetch the next step's rows (into L1 up to 16 KB
 * ahead, else L2); the FP8 and FP4 GEMVs stream one row at a time (the
 * FP8 one two rows at a time in passes of FP8_PAIR codes or more) with a
 * cursor FP8_PF / FP4_PF bytes ahead, decoding the weights in a fixed
 * permuted order and re-arranging x into that order once per pass
 * (fp8_arrange_x, fp8sh_prep_x, fp4_arrange64); the multi-token FP8 GEMV
 * takes one row x up to 8 tokens, or from 12 tokens 6 x 16 register tiles
 * over decoded row panels with the tokens packed in the lanes (mt_pack_x).
 * The other kernels keep the natural element order.
 *
 * Decodes (exact, see kernels_avx512.c for the reasoning):
 *  - E4M3 -> fp16 bit move (value * 2^-8), vcvtph2ps, exact * 256 later;
 *    or (the avx2-expshift table) shifts into the fp32 exponent field.
 *  - E2M1 in the GEMV: vpshufb of the high and low bf16 bytes of the 16
 *    values, interleaved into words, widened to fp32 by a shift or a mask.
 *    In the packed-row kernels (fp4x8): a 4-byte broadcast shifted by 0, 4,
 *    ..., 28 puts nibble i at the bottom of lane i (natural order for
 *    free); vpermps looks up the 3-bit magnitude (it reads only bits 0..2
 *    here) and the sign bit is moved to bit 31 with a second variable shift
 *    and xor-ed in.
 *  - UE8M0 b: bits b << 23, with b = 0 -> 2^-127 and b = 255 -> NaN.
 */
#include "kernels.h"
#include "fp8sh.h"
#include "pgemm.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>
#include <time.h>

#include "numfmt.h"
#include "simd_avx2.h"

#define AI static inline __attribute__((always_inline))
#define A32 __attribute__((aligned(32)))

/* Row elements decoded per pass of the fused kernels (4 KB of stack). */
#define RCH 1024

static const float e2m1_mag[8] A32 = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };

/* maskload/maskstore masks for the first n (< 8) lanes */
static const int32_t lane_mask_src[16] = { -1, -1, -1, -1, -1, -1, -1, -1,
                                           0, 0, 0, 0, 0, 0, 0, 0 };
AI __m256i mask8(size_t n)
{
    return _mm256_loadu_si256((const __m256i *)(lane_mask_src + 8 - (n > 8 ? 8 : n)));
}

AI float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight accumulators -> eight sums. */
AI __m256 hsum8(const __m256 *a)
{
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20),
                         _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* 8 consecutive E2M1 codes (4 bytes at p) -> 8 floats, natural order. */
AI __m256 fp4x8(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i shr = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i shl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    __m256i b = _mm256_set1_epi32((int)u);
    __m256 mag = _mm256_permutevar8x32_ps(_mm256_load_ps(e2m1_mag), _mm256_srlv_epi32(b, shr));
    __m256i sgn = _mm256_and_si256(_mm256_sllv_epi32(b, shl), _mm256_set1_epi32(INT32_MIN));
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sgn));
}

/* 16 words each holding an E4M3 code in the low byte -> fp16 bits. */
AI __m256i e4m3w_to_h(__m256i w)
{
    return _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1),
                            _mm256_set1_epi16((short)0xBF80));
}

/* 16 E4M3 codes -> 2 x 8 exact floats, NaN codes included. */
AI void fp8x16_exact(__m128i c, __m256 *f0, __m256 *f1)
{
    __m256i w = _mm256_cvtepu8_epi16(c);
    __m256i h = e4m3w_to_h(w);
    __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)),
                                     _mm256_set1_epi16(0x7f));
    const __m256 k256 = _mm256_set1_ps(256.0f), qnan = _mm256_set1_ps(__builtin_nanf(""));
    __m256 a = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k256);
    __m256 b = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k256);
    __m256i na = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan));
    __m256i nb = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan, 1));
    *f0 = _mm256_blendv_ps(a, qnan, _mm256_castsi256_ps(na));
    *f1 = _mm256_blendv_ps(b, qnan, _mm256_castsi256_ps(nb));
}

/* ==== fp32 / bf16 GEMV ================================================== */

/* R rows (4 or 1) of W . x, W fp32 or (BF) bf16, one FMA chain a lane per
 * row; the next R rows are prefetched one 64-byte line per row a step
 * that starts a line: into L1 when they are at most 16 KB ahead, else into
 * L2 (T1).  Lines prefetched into L1 R * k * es bytes ahead are evicted
 * before use once that passes L1's size: on a Zen 4 core, one thread,
 * 8192 x 8192 bf16 read 12-14 GB/s with T0 and 24-25 with T1; 1280-wide
 * rows (10 KB ahead) read the same either way, T0 a little ahead. */
AI void gemv_rows(const void *W, size_t k, const float *x, float *y, const int R, const int BF)
{
    const size_t es = BF ? 2 : 4;                   /* bytes an element */
    const char *Wb = (const char *)W;
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (!(i & (BF ? 24 : 8))) {     /* next step's rows, one line per row per 64 B */
                const char *pl = Wb + R * k * es + (i / (64 / es) * R + r) * 64;
                if (R * k * es <= 16384) _mm_prefetch(pl, _MM_HINT_T0);
                else                     _mm_prefetch(pl, _MM_HINT_T1);
            }
            const char *wr = Wb + (r * k + i) * es;
            const __m256 wv = BF ? dsattn_bf16x8_256(wr)
                                 : _mm256_loadu_ps((const float *)wr);
            acc[r] = _mm256_fmadd_ps(wv, xv, acc[r]);
        }
    }
    if (i < k && !BF) {
        __m256i m = mask8(k - i);
        __m256 xv = _mm256_maskload_ps(x + i, m);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_maskload_ps((const float *)W + r * k + i, m), xv,
                                     acc[r]);
    } else if (i < k) {
        float xt[8] A32 = { 0 };
        memcpy(xt, x + i, (k - i) * sizeof(float));
        __m256 xv = _mm256_load_ps(xt);
        for (int r = 0; r < R; r++) {
            uint16_t wt[8] = { 0 };
            memcpy(wt, (const uint16_t *)W + r * k + i, (k - i) * sizeof(uint16_t));
            acc[r] = _mm256_fmadd_ps(dsattn_bf16x8_256(wt), xv, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
}

static void gemv_f32_avx2(const float *W, const float *x, float *y, size_t rows, size_t k)
{
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) gemv_rows(W + r * k, k, x, y + r, 4, 0);
    for (; r < rows; r++) gemv_rows(W + r * k, k, x, y + r, 1, 0);
}

static void gemv_bf16_avx2(const uint16_t *W, const float *x, float *y, size_t rows,
                           size_t k)
{
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) gemv_rows(W + r * k, k, x, y + r, 4, 1);
    for (; r < rows; r++) gemv_rows(W + r * k, k, x, y + r, 1, 1);
}

/* ==== FP8 E4M3 GEMV ===================================================== */
/* The AVX-512 design in 8 lanes.  A 32-byte load of codes is decoded as
 * 16-bit lanes: the even bytes and the odd bytes each become 16 fp16
 * numbers (5 integer ops for both, no shuffle), then four vcvtph2ps give
 * [even 0..14], [even 16..30], [odd 1..15], [odd 17..31].  x is arranged
 * the same way once per call and scale row, each element already times its
 * block scale, so a row is 4 FMAs per 32 codes into four partial sums (one
 * per x vector: no FMA waits on another).  Each row is read front to back
 * with two prefetch cursors in the pass's row stream, one line per 64
 * codes each, running into the rows the next call reads: FP8_PF bytes
 * ahead into L2 and FP8_PF1 ahead into L1 (without the L1 one, rows read
 * in one pass from DRAM took 1.12-1.22x the time on Zen 3, 1 and 2
 * threads; rows cut into passes, k = 8192, the same).  The 2^-8 of the
 * fp16 decode comes back as one exact *256 per output.  NaN codes are tracked
 * with one byte max per load (code | 0x80 is 0xff exactly for 0x7f/0xff).
 * Block sizes that are not a multiple of 32 take the plain per-element
 * path (correct, not fast: no checkpoint uses them).
 *
 * Why fp16 and not integer shifts straight into an fp32 exponent field
 * (value * 2^-120, the factor folded into the scale): E4M3 subnormal codes
 * would become fp32 subnormals, and an FMA with a subnormal operand takes
 * a microcode assist on Intel cores - measured 67x slower on this project's
 * AVX-512 test host with 1 code in 16 subnormal (random bytes); vcvtph2ps
 * turns fp16 subnormals into normal fp32 numbers at its normal rate. */

/* Elements of x arranged per pass of the FP8 GEMV.  A row of k <= XCH is
 * one pass; a longer one is cut into equal passes of at most XCH.
 * Passes of FP8_PAIR codes or more take the rows two at a time (fp8_row2),
 * so a pass's x (up to 32 KB) crosses from L2 into L1 once per pair of
 * rows.  Measured on AMD Zen 3, 2 threads, against one row at a time with
 * passes of at most 4096 (6144 in one): 4096 x 8192 1.27x and 4608 x 7168
 * 1.5x the rate in one pass by pairs (two passes read 4 KB of every 8 KB
 * of the stream, 12-17 % slower than rows of 4096, and one pass a row at a
 * time had x out of L1), 8192 x 4096 1.08-1.14x, 10240 x 3072 1.09-1.27x;
 * at k = 1024 and 1280 pairs were 2-14 % slower (and 16384 x 2048 -5 to
 * +7 %). */
#define XCH 8192
#define FP8_PAIR 3072
#define FP8_PF 8192    /* prefetch distance in bytes of the row stream, into L2 */
#define FP8_PF1 1024   /* the same, into L1 */

/* A prefetch cursor in a pass's row stream (the pass's bytes of each row,
 * row after row; for fp8_row2 each pair's first row, the second at +k):
 * p the next line, c its offset in its row's pass.  rs: the bytes from one
 * row of the stream to the next (k, or 2k for pairs). */
typedef struct {
    const uint8_t *p;
    size_t c;
} fp8_cursor;

/* dist bytes ahead of row 0's pass start (pass [k0, k0 + kn) of rows rs apart) */
AI fp8_cursor fp8_cursor_at(const uint8_t *W, size_t rs, size_t k0, size_t kn, size_t dist)
{
    fp8_cursor c = { NULL, dist % kn / 64 * 64 };
    c.p = W + dist / kn * rs + k0 + c.c;
    return c;
}

/* one line on, into the next row's pass at the end of one */
AI void fp8_cursor_step(fp8_cursor *c, size_t rs, size_t kn)
{
    c->p += 64;
    if ((c->c += 64) >= kn) {
        c->c = 0;
        c->p += rs - kn;
    }
}

/* xb[g*32 ..] for the 32-element groups of x[0, kn): the arranged order
 * above, each element times sc[(k0 + its index) / bs]; zero past kn (and
 * padding stays exactly 0 even if a scale is inf or NaN).  bs % 32 == 0,
 * k0 % 32 == 0. */
static void fp8_arrange_x(const float *x, const float *sc, size_t bs, size_t k0,
                          size_t kn, float *xb)
{
    size_t blk = k0 / bs, left = bs - k0 % bs;     /* elements left in blk */
    for (size_t t0 = 0; t0 < kn; t0 += 32) {
        const float sv = sc[blk];
        const __m256 s = _mm256_set1_ps(sv);
        if ((left -= 32) == 0) { blk++; left = bs; }
        __m256 a[4];
        if (t0 + 32 <= kn) {
            for (int m = 0; m < 4; m++) a[m] = _mm256_mul_ps(_mm256_loadu_ps(x + t0 + 8 * m), s);
        } else {
            float t[32] A32;
            memset(t, 0, sizeof t);
            for (size_t l = 0; t0 + l < kn; l++) t[l] = x[t0 + l] * sv;
            for (int m = 0; m < 4; m++) a[m] = _mm256_load_ps(t + 8 * m);
        }
        float *o = xb + t0;
        for (int h = 0; h < 2; h++) {    /* h = 0: elements 0..15, 1: 16..31 */
            __m256 ev = _mm256_shuffle_ps(a[2 * h], a[2 * h + 1], 0x88);
            __m256 od = _mm256_shuffle_ps(a[2 * h], a[2 * h + 1], 0xDD);
            _mm256_store_ps(o + 8 * h, _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
            _mm256_store_ps(o + 16 + 8 * h, _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
        }
    }
}

/* The exponent shift needs subnormal operands read as they are: where the
 * caller's thread runs with denormals-are-zero (MXCSR.DAZ, bit 6, as
 * -ffast-math start-up code sets it) the fp16 decode runs instead. */
AI int fp8sh_mxcsr_ok(void) { return !(_mm_getcsr() & 0x40); }

/* Does this core's FMA take a subnormal operand at the rate of a normal
 * one?  Timed once (min of 5 alternating runs of 8 x 2048 dependent-free
 * FMAs each, a few microseconds): the exponent-shift decode hands the FMA
 * a subnormal for every E4M3 subnormal code, which costs a microcode
 * assist per instruction on cores that take one (Intel's: measured 67x on
 * an AVX-512 host with 1 code in 16 subnormal) and nothing where the FMA
 * handles them in hardware (AMD Zen 3: measured, the same speed).  A
 * ratio under 2 is "full rate"; an assisting core is 20x and more. */
__attribute__((noinline)) static double fma_probe(float v)
{
    __m256 acc[8];
    const __m256 a = _mm256_set1_ps(v), b = _mm256_set1_ps(0x1p100f);
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int it = 0; it < 2048; it++) {
        for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]),
                              "+x"(acc[4]), "+x"(acc[5]), "+x"(acc[6]), "+x"(acc[7]));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float sink[8];
    _mm256_storeu_ps(sink, _mm256_add_ps(acc[0], acc[7]));
    __asm__ volatile("" : : "r"(sink) : "memory");
    return (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
}

int dsattn_avx2_fma_subnormal_full_rate(void)
{
    static int known = -1;                 /* immutable once measured */
    int r = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (r >= 0) return r;
    volatile float sub = 0x1p-130f, nrm = 0x1p-30f;
    double tn = 1e30, ts = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double a = fma_probe(nrm), b = fma_probe(sub);
        if (a < tn) tn = a;
        if (b < ts) ts = b;
    }
    r = ts < 2.0 * tn;
    __atomic_store_n(&known, r, __ATOMIC_RELAXED);
    return r;
}

/* the largest of 8 int32 lanes */
AI int32_t hmax_epi32(__m256i v)
{
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4E));
    return _mm_cvtsi128_si32(_mm_max_epi32(m, _mm_shuffle_epi32(m, 0xB1)));
}

/* The exponent-shift decode's x, unscaled (fp8sh.h has the scaling):
 * xp[32g + 8j + i] = x[32g + 4i + j], zero past kn up to the next multiple
 * of 32, and bm[g] = max |x| of group g - taken on the bits, so a group
 * holding an inf or a NaN has an inf or NaN maximum, which
 * dsattn_fp8sh_plan refuses.  Returns 0 if some x is inf or NaN (the
 * caller then takes the fp16 decode, whose arithmetic on such inputs the
 * tests pin down). */
static int fp8sh_prep_x(const float *x, size_t kn, float *xp, float *bm)
{
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i all = _mm256_setzero_si256();
    for (size_t t0 = 0; t0 < kn; t0 += 32) {
        __m256 a[4];
        __m256i mx = _mm256_setzero_si256();
        for (int m = 0; m < 4; m++) {
            const size_t off = t0 + 8 * (size_t)m;
            a[m] = _mm256_maskload_ps(x + off, mask8(off < kn ? kn - off : 0));
            /* |x| bits: ordered as the values, inf above every finite, NaN above inf */
            mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_castps_si256(a[m]), absm));
        }
        all = _mm256_max_epi32(all, mx);
        const int32_t mb = hmax_epi32(mx);
        memcpy(&bm[t0 / 32], &mb, 4);
        const __m256 t0v = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpackhi_ps(a[0], a[1]);
        const __m256 t2 = _mm256_unpacklo_ps(a[2], a[3]), t3 = _mm256_unpackhi_ps(a[2], a[3]);
        const __m256 c[4] = { _mm256_shuffle_ps(t0v, t2, 0x44), _mm256_shuffle_ps(t0v, t2, 0xEE),
                              _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE) };
        for (int j = 0; j < 4; j++)
            _mm256_store_ps(xp + t0 + 8 * (size_t)j, _mm256_permutevar8x32_ps(c[j], perm));
    }
    return hmax_epi32(all) < 0x7f800000;
}

/* dsattn_fp8sh_plan (fp8sh.h) for blocks of 32, eight groups at a time:
 * group g's scale is sc[g] itself (so the caller scales with sc, no sg
 * copy); the same *pk, *unscale and return as the scalar planner (the
 * largest product is the same number; max and > agree on non-NaN). */
int dsattn_avx2_fp8sh_plan32(const float *bm, size_t ng, const float *sc, float *pk,
                             float *unscale)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(__builtin_inff());
    __m256 big = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (size_t g = 0; g < ng; g += 8) {
        const __m256i m = mask8(ng - g < 8 ? ng - g : 8);
        const __m256 p = _mm256_mul_ps(_mm256_maskload_ps(bm + g, m),
                                       _mm256_and_ps(_mm256_maskload_ps(sc + g, m), absm));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(p, inf, _CMP_NLT_UQ));    /* inf or NaN */
        big = _mm256_max_ps(big, p);
    }
    if (_mm256_movemask_ps(bad)) return 0;
    return dsattn_fp8sh_pow2(dsattn_hmax256(big), pk, unscale);
}

/* xb = (xp * its group's scale sg[g]) * pk over the groups of [0, kn):
 * fp8sh_prep_x's x, scaled as dsattn_fp8sh_plan says. */
static void fp8sh_scale_x(const float *xp, const float *sg, size_t kn, float pk, float *xb)
{
    const __m256 vk = _mm256_set1_ps(pk);
    for (size_t t0 = 0; t0 < kn; t0 += 32) {
        const __m256 sv = _mm256_set1_ps(sg[t0 / 32]);
        for (int j = 0; j < 4; j++) {
            const size_t o = t0 + 8 * (size_t)j;
            _mm256_store_ps(xb + o, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(xp + o), sv), vk));
        }
    }
}

/* One 32-code step of a row. */
/* 32 E4M3 codes -> their values x 2^-8 in the arranged order, and the
 * NaN byte max. */
AI void fp8_decode32(__m256i v, __m256 *w, __m256i *nanv, const int track_nan)
{
    const __m256i keep = _mm256_set1_epi16((short)0xBF80);
    if (track_nan) *nanv = _mm256_max_epu8(*nanv, _mm256_or_si256(v, _mm256_set1_epi8((char)0x80)));
    const __m256i lo = e4m3w_to_h(v);
    const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(v, 1), keep);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
    w[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

/* The exponent-shift decode (the avx2-expshift table): lane i of w[j] is
 * code 4i + j of the 32-byte load, its bits moved into an fp32 - sign to
 * bit 31, eeee.mmm to bits 26..20 - which is the E4M3 value times 2^-120
 * exactly (E4M3 subnormals become fp32 subnormals with the same digits).
 * One 16-bit arithmetic shift by 4 serves two codes of a dword: the code
 * in the high byte of a word lands on bits 10..4 of it with its sign
 * copied above, so the high word of each dword is already in place (codes
 * 4i + 3 and, after the bytes move up by 8, 4i + 2) and the low word's is
 * one 32-bit shift by 16 away (4i + 1, 4i); the AND 0x87F00000 keeps the
 * sign and the seven bits.  5 shifts and 4 ANDs per 32 codes (Zen 3: 1.6x
 * the fp16 decode's rate in L2); the NaN byte max as above. */
AI void fp8sh_decode32(__m256i v, __m256 *w, __m256i *nanv, const int track_nan)
{
    const __m256i m = _mm256_set1_epi32((int)0x87F00000u);
    if (track_nan) *nanv = _mm256_max_epu8(*nanv, _mm256_or_si256(v, _mm256_set1_epi8((char)0x80)));
    const __m256i t3 = _mm256_srai_epi16(v, 4);                          /* codes 4i+3, 4i+1 */
    const __m256i t2 = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);    /* codes 4i+2, 4i */
    w[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t2, 16), m));
    w[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t3, 16), m));
    w[2] = _mm256_castsi256_ps(_mm256_and_si256(t2, m));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(t3, m));
}

/* sh = 0: the fp16 decode and fp8_arrange_x's order; sh = 1: the
 * exponent-shift decode and fp8sh_prep_x's order. */
AI void fp8_step(__m256i v, const float *xc, __m256 *a, __m256i *nanv, const int track_nan,
                 const int sh)
{
    __m256 w[4];
    if (sh) fp8sh_decode32(v, w, nanv, track_nan);
    else    fp8_decode32(v, w, nanv, track_nan);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) a[j] = _mm256_fmadd_ps(w[j], _mm256_load_ps(xc + 8 * j), a[j]);
}

/* The codes [t0, kn) of a row after its whole 64-code steps, and its sum
 * times fin (256 after the fp16 decode, the arrangement's unscale after
 * the exponent shift); NaN where a NaN code was seen (track_nan). */
AI float fp8_row_end(const uint8_t *w, size_t t0, size_t kn, const float *xb, __m256 *a,
                     __m256i nanv, const int track_nan, const int sh, float fin)
{
    for (; t0 < kn; t0 += 32) {          /* the arranged x is zero past kn */
        __m256i v;
        if (t0 + 32 <= kn) {
            v = _mm256_loadu_si256((const __m256i *)(w + t0));
        } else {
            uint8_t ct[32] A32 = { 0 };
            memcpy(ct, w + t0, kn - t0);
            v = _mm256_load_si256((const __m256i *)ct);
        }
        fp8_step(v, xb + t0, a, &nanv, track_nan, sh);
    }
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))) * fin;
    if (track_nan && _mm256_movemask_epi8(_mm256_cmpeq_epi8(nanv, _mm256_set1_epi8(-1))))
        s = __builtin_nanf("");
    return s;
}

/* One row's codes [0, kn) (of a row of k) against the arranged xb, into
 * *y (added to it if accumulate). */
AI void fp8_row(const uint8_t *w, size_t k, const float *xb, size_t kn, float *y,
                int accumulate, const int track_nan, fp8_cursor *pf, const int sh, float fin)
{
    __m256 a[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
    __m256i nanv = _mm256_setzero_si256();
    const size_t k64 = kn / 64 * 64;
    size_t t0 = 0;
    for (; t0 < k64; t0 += 64) {
        _mm_prefetch((const char *)pf[0].p, _MM_HINT_T1);
        _mm_prefetch((const char *)pf[1].p, _MM_HINT_T0);
        fp8_cursor_step(&pf[0], k, kn);
        fp8_cursor_step(&pf[1], k, kn);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w + t0)), xb + t0, a, &nanv, track_nan,
                 sh);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w + t0 + 32)), xb + t0 + 32, a, &nanv,
                 track_nan, sh);
    }
    const float s = fp8_row_end(w, t0, kn, xb, a, nanv, track_nan, sh, fin);
    *y = accumulate ? *y + s : s;
}

/* Rows w and w + k at once, into y[0] and y[1]: the two rows' loads of x
 * are the same lines, so x crosses from L2 into L1 once per pair when a
 * pass's x does not fit L1 beside the weights.  Each row's arithmetic is
 * fp8_row's (the same bits); pf are pair-stream cursors. */
AI void fp8_row2(const uint8_t *w, size_t k, const float *xb, size_t kn, float *y,
                 int accumulate, const int track_nan, fp8_cursor *pf, const int sh, float fin)
{
    __m256 a[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
    __m256 b[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
    __m256i na = _mm256_setzero_si256(), nb = _mm256_setzero_si256();
    const uint8_t *w1 = w + k;
    const size_t k64 = kn / 64 * 64;
    size_t t0 = 0;
    for (; t0 < k64; t0 += 64) {
        _mm_prefetch((const char *)pf[0].p, _MM_HINT_T1);
        _mm_prefetch((const char *)(pf[0].p + k), _MM_HINT_T1);
        _mm_prefetch((const char *)pf[1].p, _MM_HINT_T0);
        _mm_prefetch((const char *)(pf[1].p + k), _MM_HINT_T0);
        fp8_cursor_step(&pf[0], 2 * k, kn);
        fp8_cursor_step(&pf[1], 2 * k, kn);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w + t0)), xb + t0, a, &na, track_nan, sh);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w1 + t0)), xb + t0, b, &nb, track_nan, sh);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w + t0 + 32)), xb + t0 + 32, a, &na,
                 track_nan, sh);
        fp8_step(_mm256_loadu_si256((const __m256i *)(w1 + t0 + 32)), xb + t0 + 32, b, &nb,
                 track_nan, sh);
    }
    const float s0 = fp8_row_end(w, t0, kn, xb, a, na, track_nan, sh, fin);
    const float s1 = fp8_row_end(w1, t0, kn, xb, b, nb, track_nan, sh, fin);
    y[0] = accumulate ? y[0] + s0 : s0;
    y[1] = accumulate ? y[1] + s1 : s1;
}

static void fp8_row_generic(const uint8_t *w, const float *sc, size_t bs,
                            const float *x, float *y, size_t k)
{
    __m256 acc = _mm256_setzero_ps();
    float t[8] A32;
    for (size_t i = 0; i < k; i += 8) {
        size_t n = k - i < 8 ? k - i : 8;
        for (size_t l = 0; l < 8; l++)
            t[l] = l < n ? dsattn_e4m3_to_f32(w[i + l]) * sc[(i + l) / bs] : 0.0f;
        __m256 xv = _mm256_maskload_ps(x + i, mask8(n));
        acc = _mm256_fmadd_ps(_mm256_load_ps(t), xv, acc);
    }
    *y = hsum(acc);
}

/* Rows [r0, r1) of one scale row of a pass (kn codes from k0, rows of k)
 * against the arranged xb, one at a time or (pairs) two at a time, the
 * last of an odd count alone; s1: the exponent-shift decode, whose sums
 * are multiplied by fin.  One non-inlined copy per form: compiled into one
 * function with the pair loop, the one-row loop read a DRAM-resident
 * 32768 x 1024 matrix 12-14 % slower on Zen 3 (2 threads). */
AI void fp8_rows(const uint8_t *W, size_t k, size_t k0, const float *xb, size_t kn, float *y,
                 size_t r0, size_t r1, fp8_cursor *pf, int s1, float fin, const int nan,
                 const int pairs)
{
    /* The cursors in locals, so that they live in registers: through pf
     * (the caller's array) GCC keeps them in memory, a load and a store of
     * each field per 64 codes.  In registers, on Zen 3 with 2 threads,
     * 32768 x 1024 reads 4-19 % faster and the pairs 4-5 %; on one thread
     * the one-row loop 2-7 % slower (docs/benchmarks.md, 2026-12-06 10:30). */
    fp8_cursor lp[2] = { pf[0], pf[1] };
    size_t r = r0;
    for (; pairs && r + 1 < r1; r += 2) {
        if (s1)
            fp8_row2(W + r * k + k0, k, xb, kn, y + r, k0 > 0, nan, lp, 1, fin);
        else
            fp8_row2(W + r * k + k0, k, xb, kn, y + r, k0 > 0, nan, lp, 0, 256.0f);
    }
    for (; r < r1; r++) {
        if (s1)
            fp8_row(W + r * k + k0, k, xb, kn, y + r, k0 > 0, nan, lp, 1, fin);
        else
            fp8_row(W + r * k + k0, k, xb, kn, y + r, k0 > 0, nan, lp, 0, 256.0f);
    }
    pf[0] = lp[0];
    pf[1] = lp[1];
}

typedef void (*fp8_rows_fn)(const uint8_t *, size_t, size_t, const float *, size_t, float *,
                            size_t, size_t, fp8_cursor *, int, float);
#define FP8_ROWS_FORM(name, NAN, PAIRS)                                                        \
    static __attribute__((noinline)) void name(const uint8_t *W, size_t k, size_t k0,        \
                                               const float *xb, size_t kn, float *y, size_t r0, \
                                               size_t r1, fp8_cursor *pf, int s1, float fin)  \
    {                                                                                          \
        fp8_rows(W, k, k0, xb, kn, y, r0, r1, pf, s1, fin, NAN, PAIRS);                        \
    }
FP8_ROWS_FORM(fp8_rows_n0p0, 0, 0)
FP8_ROWS_FORM(fp8_rows_n0p1, 0, 1)
FP8_ROWS_FORM(fp8_rows_n1p0, 1, 0)
FP8_ROWS_FORM(fp8_rows_n1p1, 1, 1)
#undef FP8_ROWS_FORM

/* sh: try the exponent-shift decode (per scale row and x pass; the fp16
 * decode where x or x * scale is not finite).  x is prepared for it once
 * per pass and call (or, px != NULL, taken from px: fp8_prep_x_expshift
 * over all of k, which is the passes' preparations side by side), then
 * only scaled per scale row. */
AI void gemv_fp8_impl(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                      const float *x, float *y, size_t rows, size_t k, const int nan,
                      const int sh, const float *px)
{
    float xb[XCH] A32, xp[XCH] A32, bm[XCH / 32], sg[XCH / 32];
    if (bs == 0) return;
    if (k == 0) {                        /* empty sums, as the reference */
        memset(y, 0, rows * sizeof(float));
        return;
    }
    if (bs % 32) {
        for (size_t r = 0; r < rows; r++)
            fp8_row_generic(W + r * k, scale + (r / bs) * ldsc, bs, x, y + r, k);
        return;
    }
    const int shd = sh && fp8sh_mxcsr_ok();
    size_t xch = k;                      /* pass length: k, or equal parts of <= XCH */
    if (k > XCH) {
        const size_t np = (k + XCH - 1) / XCH;
        xch = ((k + np - 1) / np + 63) / 64 * 64;
    }
    /* Passes outermost: x is prepared once per pass and call, arranged
     * again per scale row, and the prefetch cursors run through the pass's
     * row stream across the scale rows (with scale rows outermost, x would
     * be prepared for every pass of every scale row: 5120 x 8192 in 32 x 32
     * blocks took 1.04-1.09x the time on Zen 3).  Each output is the sum of
     * its passes in order. */
    const size_t k32 = (k + 31) / 32 * 32;
    for (size_t k0 = 0; k0 < k; k0 += xch) {
        const size_t kn = k - k0 < xch ? k - k0 : xch;
        /* a pass with an inf or NaN x: the prepared maxima hold it, and
         * dsattn_fp8sh_plan refuses every scale row (the fp16 decode) */
        const float *xpp = px ? px + k0 : xp, *bmp = px ? px + k32 + k0 / 32 : bm;
        const int xfin = shd && (px || fp8sh_prep_x(x + k0, kn, xp, bm));
        const int pairs = kn >= FP8_PAIR;
        const fp8_rows_fn rows_fn = nan ? (pairs ? fp8_rows_n1p1 : fp8_rows_n1p0)
                                        : (pairs ? fp8_rows_n0p1 : fp8_rows_n0p0);
        /* prefetch cursors: FP8_PF (L2) and FP8_PF1 (L1) bytes ahead in the
         * pass's row stream, or half that in each row of the pair stream */
        const size_t rs = pairs ? 2 * k : k, pd = pairs ? 2 : 1;
        fp8_cursor pf[2] = { fp8_cursor_at(W, rs, k0, kn, FP8_PF / pd),
                             fp8_cursor_at(W, rs, k0, kn, FP8_PF1 / pd) };
        for (size_t rb0 = 0; rb0 < rows;) {
            const size_t sr = rb0 / bs;                 /* scale row */
            const size_t rb1 = (sr + 1) * bs < rows ? (sr + 1) * bs : rows;
            const float *sc = scale + sr * ldsc;
            float fin = 256.0f, pk;
            /* blocks of 32: a group's scale is its block's, sc[k0 / 32 + g] */
            const float *gs = bs == 32 ? sc + k0 / 32 : sg;
            const int s1 = xfin && (bs == 32
                                    ? dsattn_avx2_fp8sh_plan32(bmp, (kn + 31) / 32, gs, &pk, &fin)
                                    : dsattn_fp8sh_plan(bmp, (kn + 31) / 32, sc, bs, k0, sg, &pk, &fin));
            if (s1) fp8sh_scale_x(xpp, gs, kn, pk, xb);
            else fp8_arrange_x(x + k0, sc, bs, k0, kn, xb);
            rows_fn(W, k, k0, xb, kn, y, rb0, rb1, pf, s1, fin);
            rb0 = rb1;
        }
    }
}

/* NaN codes propagate (the reference's contract on any bytes) */
static void gemv_fp8_avx2(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                          const float *x, float *y, size_t rows, size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 1, 0, NULL);
}

static void gemv_fp8_expshift(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                         const float *x, float *y, size_t rows, size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 1, 1, NULL);
}

/* Weights without NaN codes: the same sums without the tracking. */
static void gemv_fp8_finite_avx2(const uint8_t *W, const float *scale, size_t bs,
                                 size_t ldsc, const float *x, float *y, size_t rows,
                                 size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 0, 0, NULL);
}

static void gemv_fp8_finite_expshift(const uint8_t *W, const float *scale, size_t bs,
                                     size_t ldsc,
                                const float *x, float *y, size_t rows, size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 0, 1, NULL);
}

/* The table's prepared x (kernels.h fp8_prep_x): fp8sh_prep_x over all of
 * k - xp, then the group maxima.  A pass of gemv_fp8_impl starts on a
 * group (its length is a multiple of 64), so its part of px is what its
 * own preparation would be. */
static void fp8_prep_x_expshift(const float *x, size_t k, float *px)
{
    (void)fp8sh_prep_x(x, k, px, px + (k + 31) / 32 * 32);
}

static void gemv_fp8_px_expshift(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                                 const float *x, const float *px, float *y, size_t rows,
                                 size_t k, int finite)
{
    if (finite) gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 0, 1, px);
    else        gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 1, 1, px);
}

/* ==== FP8 E4M3 GEMV over several tokens ================================= */
/* m tokens against one weight (a batched decode step: one row per
 * sequence).  Each 32-code step of a row is decoded once (as in fp8_step)
 * and multiplied into every token of the pass: one row x up to eight
 * tokens, 8 accumulators of the 16 registers; up to 4 tokens each sum
 * runs as two chains (even and odd vectors of the step), which the FMA
 * latency would otherwise bound.  A row leaves its T x 8 lane sums in a
 * small buffer, and every 8 rows fp8_rows_out folds them and writes one
 * 8-row vector per token: folding and updating y at each row's end
 * measured ~15 % slower at 8 tokens (Zen 3, in process, docs/benchmarks.md
 * 2026-12-06 18:40).
 *
 * Memory order (the AVX-512 table's, kernels_avx512.c): the rows go in
 * blocks of about M_BLK bytes; within a block k is walked in equal slabs
 * whose scaled x (the pass's tokens x the slab: M_XB floats, 16 KB)
 * stays in L1, and a row's slab sums are added to y slab by slab.  While a
 * block is computed, a cursor prefetches the next block front to back
 * into L2, one line per 64 codes, so DRAM sees one sequential stream.
 * Each token's slab is scaled with its block scales once per scale row
 * (as gemv_fp8_impl does it); the exponent-shift x is prepared once per
 * call where the pass's tokens x k fit M_XP floats, else per slab over all
 * the rows in one block (each row's line M_PF_ROWS rows ahead
 * prefetched).  Shapes gemv_fp8_impl does not take in this form (bs % 32,
 * k % 32) go token by token through it. */
#define M_T 8
#define M_XB 4096                  /* scaled x: the pass's tokens x one slab, 16 KB */
#define M_KC 512                   /* the slab past 3 tokens */
#define M_XP 16384                 /* the exponent-shift x of the whole pass, 64 KB */
#define M_BLK 262144               /* bytes of weight rows per block */
#define M_PF_ROWS 8                /* x per slab: rows ahead a line is prefetched */

/* the prefetch: the next block's cursor [p, end), or (ahead > 0) the line
 * `ahead` bytes past each line read */
typedef struct { const uint8_t *p, *end; size_t ahead; } m_pf;

/* One row's codes [0, kn) against the pass's T tokens: out[8t + i] = lane
 * i of token t's sum, *nan = a NaN code was seen (track_nan). */
AI void fp8_row_m(const uint8_t *w, const float *xb, size_t ldxb, size_t kn, const int T,
                  const int track_nan, const int sh, m_pf *pf, float *out, int *nan)
{
    /* NC chains per token (step vector j feeds chain j % NC) */
    const int NC = T <= 4 ? 2 : 1;
    __m256 acc[M_T][2];
    const uint8_t *pp = pf->p, *pe = pf->end;
    const size_t ahead = pf->ahead;
    __m256i nanv = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++) acc[t][c] = _mm256_setzero_ps();
    for (size_t t0 = 0; t0 < kn; t0 += 32) {
        if (t0 % 64 == 0) {
            if (ahead) _mm_prefetch((const char *)(w + t0 + ahead), _MM_HINT_T0);
            else if (pp < pe) { _mm_prefetch((const char *)pp, _MM_HINT_T1); pp += 64; }
        }
        __m256 wv[4];
        if (sh) fp8sh_decode32(_mm256_loadu_si256((const __m256i *)(w + t0)), wv, &nanv, track_nan);
        else    fp8_decode32(_mm256_loadu_si256((const __m256i *)(w + t0)), wv, &nanv, track_nan);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float *xc = xb + (size_t)t * ldxb + t0;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[t][j % NC] =
                    _mm256_fmadd_ps(wv[j], _mm256_load_ps(xc + 8 * j), acc[t][j % NC]);
        }
    }
    pf->p = pp;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        _mm256_store_ps(out + 8 * t, NC == 2 ? _mm256_add_ps(acc[t][0], acc[t][1]) : acc[t][0]);
    }
    *nan = track_nan && _mm256_movemask_epi8(_mm256_cmpeq_epi8(nanv, _mm256_set1_epi8(-1)));
}

/* The lane sums of 8 rows' vectors a[r] in one vector (lane r), each in
 * hsum's order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)). */
AI __m256 hsum_rows8(const __m256 *a)
{
    __m256 e[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        /* rows r and r + 4, one a lane half: w_i = v_i + v_(i+4) */
        const __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(a[r], a[r + 4], 0x20),
                                       _mm256_permute2f128_ps(a[r], a[r + 4], 0x31));
        const __m256 d = _mm256_add_ps(c, _mm256_permute_ps(c, 0x4E));   /* w_i + w_(i^2) */
        e[r] = _mm256_add_ps(d, _mm256_permute_ps(d, 0xB1));             /* the sum, every lane */
    }
    return _mm256_blend_ps(_mm256_blend_ps(e[0], e[1], 0x22), _mm256_blend_ps(e[2], e[3], 0x88),
                           0xCC);
}

/* Rows r0 .. r0 + n - 1 (n <= 8) of a pass from their accumulators
 * ab[r][t] (8 floats each): each row's sum over its 8 lanes, times fin[t],
 * NaN where the row saw a NaN code, into y or added to it.  The lane sums
 * go in one fixed order per row (hsum8's at 8 tokens, hsum's below),
 * whatever the row's place in its group: a batched step's last bits
 * decide near-ties of the indexers' top-k, and the soak holds batched
 * rows to their one-sequence twins. */
AI void fp8_rows_out(const float *ab, const int *nan, size_t n, float *y, size_t ldy,
                     const int T, int accumulate, const float *fin)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i nmask = _mm256_setr_epi32(nan[0], nan[1], nan[2], nan[3], nan[4], nan[5],
                                            nan[6], nan[7]);
    const __m256 isnan = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nmask, _mm256_setzero_si256()));
    const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane));
    for (int t = 0; t < T; t++) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[r] = _mm256_load_ps(ab + (size_t)(r * M_T + t) * 8);
        __m256 v = _mm256_mul_ps(T == M_T ? hsum8(a) : hsum_rows8(a), _mm256_set1_ps(fin[t]));
        v = _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), isnan);
        float *o = y + (size_t)t * ldy;
        if (n == 8) {
            _mm256_storeu_ps(o, accumulate ? _mm256_add_ps(_mm256_loadu_ps(o), v) : v);
        } else {
            const __m256i m = _mm256_castps_si256(live);
            if (accumulate) v = _mm256_add_ps(_mm256_maskload_ps(o, m), v);
            _mm256_maskstore_ps(o, m, v);
        }
    }
}

AI void fp8_pass_m(const uint8_t *W, size_t k, const float *xb, size_t ldxb, size_t kn,
                   float *y, size_t ldy, size_t nr, const int T, int accumulate,
                   const int track_nan, const int sh, const float *fin, m_pf *pf)
{
    float ab[8 * M_T * 8] A32;               /* [row of the group][token][lane] */
    int nan[8];
    for (size_t r0 = 0; r0 < nr; r0 += 8) {
        const size_t n = nr - r0 < 8 ? nr - r0 : 8;
        for (size_t r = 0; r < 8; r++) {
            nan[r] = 0;
            if (r >= n) {
                for (int t = 0; t < T; t++)
                    _mm256_store_ps(ab + (r * M_T + (size_t)t) * 8, _mm256_setzero_ps());
            } else if (sh) {
                fp8_row_m(W + (r0 + r) * k, xb, ldxb, kn, T, track_nan, 1, pf, ab + r * M_T * 8,
                          &nan[r]);
            } else {
                fp8_row_m(W + (r0 + r) * k, xb, ldxb, kn, T, track_nan, 0, pf, ab + r * M_T * 8,
                          &nan[r]);
            }
        }
        fp8_rows_out(ab, nan, n, y + r0, ldy, T, accumulate, fin);
    }
}

/* ---- From 12 tokens: a small GEMM (decoded row panels x tokens in lanes) ----
 * The one-row form above reloads each token's x for every row and keeps one
 * FMA chain per (row, token).  From MT_MIN tokens, with finite codes and
 * block scales whose 256 s is finite (dsattn_pgemm_cheap), the rows are
 * multiplied as pgemm.h's prefill tiles multiply them, turned for a few
 * tokens: the tokens sit in the lanes (16, zero-padded, packed k-major once
 * per group of up to MT_BLKR rows and k slice of MT_KC, in fp8_decode32's
 * order: code 2i of a 32-code step at i, 2i + 1 at 16 + i), and each weight
 * value is broadcast from a small row-major buffer into which a panel of up
 * to MT_RP rows is decoded per slice, (e4m3 / 256) * (256 s): the exact
 * dequantised value, no transpose.  simd_avx2.h's 6 x 16 register tile
 * (12 accumulators) runs over the panel, so each decoded value serves two
 * FMAs; the next panel's slice is prefetched while one is multiplied (at
 * 12+ tokens a weight byte serves 24+ FLOPs, far from the memory bound, so
 * the panels need no front-to-back block stream).  At 8 tokens each value
 * would serve one FMA and its decode (vcvtph2ps and the fp32 stores) costs
 * as much: the one-row form stays below MT_MIN.  Each output is one fp32
 * FMA chain over k (slices in order, a step's codes in the decode's order)
 * whatever the row's panel or the call's rows, so the result does not
 * depend on how a caller cuts the rows; it differs from the one-row form's
 * by summation order only (tests/test_kernels.c bounds both against the
 * scalar reference).  The AVX-512 table keeps its 2-row form: there 16
 * tokens fill one vector, each value serves one FMA, and this form measured
 * no faster (docs/benchmarks.md, 2026-12-05 03:15). */
#define MT_MIN 12                  /* tokens from which the tiles run */
#define MT_KC 256                  /* k slice */
#define MT_TG 16                   /* tokens per group */
#define MT_RP 12                   /* rows per decoded panel */
#define MT_WLD (MT_KC + 16)        /* decoded row stride: rows apart in L1 sets */
#define MT_BLKR 192                /* rows per group of rows */

/* tokens [0, nt) of x (nt <= 16), k [k0, k0 + kc) -> xs[k' * MT_TG + t], k'
 * where fp8_decode32 puts code k; tokens nt..15 zero */
AI void mt_pack_x(const float *x, size_t ldx, size_t nt, size_t k0, size_t kc, float *xs)
{
    for (size_t tb = 0; tb < MT_TG; tb += 8)
        for (size_t c = 0; c < kc; c += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (size_t i = 0; i < 8; i++)
                r[i] = tb + i < nt ? _mm256_loadu_ps(x + (tb + i) * ldx + k0 + c)
                                   : _mm256_setzero_ps();
            dsattn_tr8_256(r);
            const size_t base = c & ~(size_t)31, kk = c & 31;
#pragma GCC unroll 8
            for (size_t j = 0; j < 8; j++) {
                const size_t q = kk + j;
                _mm256_storeu_ps(xs + (base + (q & 1 ? 16 + q / 2 : q / 2)) * MT_TG + tb, r[j]);
            }
        }
}

/* R rows (row r at w + r * k, its block scales at sc[r]; bs % 32 == 0)
 * codes [k0, k0 + kc) -> wd[r * MT_WLD + k'] */
AI void mt_decode(const uint8_t *w, size_t k, const float *const *sc, size_t bs, size_t k0,
                  size_t kc, size_t R, float *wd)
{
    uint32_t bi[MT_KC / 32];                  /* each step's scale block */
    for (size_t c = 0; c < kc; c += 32) bi[c / 32] = (uint32_t)((k0 + c) / bs);
    for (size_t r = 0; r < R; r++) {
        const uint8_t *wr = w + r * k + k0;
        float *o = wd + r * MT_WLD;
        for (size_t c = 0; c < kc; c += 32) {
            const __m256 s = _mm256_set1_ps(256.0f * sc[r][bi[c / 32]]);
            __m256 v[4];
            __m256i nanv;
            fp8_decode32(_mm256_loadu_si256((const __m256i *)(wr + c)), v, &nanv, 0);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(o + c + 8 * j, _mm256_mul_ps(v[j], s));
        }
    }
}

/* n <= 6 decoded rows x 16 tokens over kc: c[r * MT_TG + t] (+)= sum */
AI void mt_tile(const float *wd, const float *xs, size_t kc, const int n, float *c, int first)
{
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < n; r++) {
        acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)r * MT_TG);
        acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + (size_t)r * MT_TG + 8);
    }
    dsattn_acc6x16_fma_256(acc, n, wd, 1, MT_WLD, xs, MT_TG, kc, 0);
    dsattn_acc6x16_store_256(acc, n, c, MT_TG);
}

/* A panel's R <= 12 rows as two tiles of up to 6, the row count a constant
 * in each; noinline: inlined into the driver, the decode's constants took
 * registers and an accumulator went to memory. */
static __attribute__((noinline)) void mt_panel(const float *wd, const float *xs, size_t kc,
                                               size_t R, float *c, int first)
{
    for (size_t r0 = 0; r0 < R;) {
        const size_t n = R - r0 > 6 ? (R - r0 + 1) / 2 : R - r0;    /* 12 -> 6 + 6, 11 -> 6 + 5 */
        const float *w = wd + r0 * MT_WLD;
        float *o = c + r0 * MT_TG;
        switch (n) {
#define MT_CASE(m) case m: mt_tile(w, xs, kc, m, o, first); break;
        MT_CASE(6) MT_CASE(5) MT_CASE(4) MT_CASE(3) MT_CASE(2)
#undef MT_CASE
        default: mt_tile(w, xs, kc, 1, o, first); break;
        }
        r0 += n;
    }
}

/* Does the tiled form take this call? */
static int mt_ok(const float *scale, size_t bs, size_t ldsc, size_t m, size_t rows, size_t k,
                 int finite)
{
    if (!finite || m < MT_MIN || k == 0 || k % 32 || bs == 0 || bs % 32) return 0;
    for (size_t sr = 0; sr * bs < rows; sr++) {
        const float *sc = scale + sr * ldsc;
        if (!dsattn_pgemm_cheap(&sc, 1, k, bs, 1)) return 0;
    }
    return 1;
}

static void gemv_fp8_mt(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                        const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                        size_t rows, size_t k)
{
    float xs[MT_KC * MT_TG] A32;
    float wd[MT_RP * MT_WLD] A32;
    float cb[MT_BLKR * MT_TG] A32;
    for (size_t t0 = 0; t0 < m; t0 += MT_TG) {
        const size_t nt = m - t0 < MT_TG ? m - t0 : MT_TG;
        for (size_t b0 = 0; b0 < rows; b0 += MT_BLKR) {
            const size_t nb = rows - b0 < MT_BLKR ? rows - b0 : MT_BLKR;
            const size_t np = (nb + MT_RP - 1) / MT_RP;          /* panels, as even as can be */
            for (size_t k0 = 0; k0 < k; k0 += MT_KC) {
                const size_t kc = k - k0 < MT_KC ? k - k0 : MT_KC;
                mt_pack_x(x + t0 * ldx, ldx, nt, k0, kc, xs);
                for (size_t p = 0, p0 = 0; p < np; p++) {
                    const size_t R = (nb - p0) / (np - p) + ((nb - p0) % (np - p) != 0);
                    const float *sc[MT_RP];
                    for (size_t r = 0; r < R; r++) sc[r] = scale + (b0 + p0 + r) / bs * ldsc;
                    mt_decode(W + (b0 + p0) * k, k, sc, bs, k0, kc, R, wd);
                    /* the next panel's slice (or the next slice's first panel);
                     * past the call's rows too (a prefetch never faults) */
                    const uint8_t *nx = p + 1 < np ? W + (b0 + p0 + R) * k + k0
                                                   : W + b0 * k + k0 + MT_KC;
                    for (size_t r = 0; r < MT_RP; r++)
                        for (size_t c = 0; c < kc; c += 64)
                            _mm_prefetch((const char *)(nx + r * k + c), _MM_HINT_T0);
                    mt_panel(wd, xs, kc, R, cb + p0 * MT_TG, k0 == 0);
                    p0 += R;
                }
            }
            for (size_t t = 0; t < nt; t++)
                for (size_t r = 0; r < nb; r++) y[(t0 + t) * ldy + b0 + r] = cb[r * MT_TG + t];
        }
    }
}


/* sh: the exponent-shift decode where every token of the pass takes it
 * (x and x * scale finite), else the fp16 decode for the pass. */
AI void gemv_fp8_m_impl(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                        const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                        size_t rows, size_t k, int finite, const int sh)
{
    if (bs == 0 || m == 0) return;
    if (k == 0 || k % 32 || bs % 32) {
        for (size_t t = 0; t < m; t++)
            gemv_fp8_impl(W, scale, bs, ldsc, x + t * ldx, y + t * ldy, rows, k, !finite, sh,
                          NULL);
        return;
    }
    if (mt_ok(scale, bs, ldsc, m, rows, k, finite)) {
        gemv_fp8_mt(W, scale, bs, ldsc, x, ldx, m, y, ldy, rows, k);
        return;
    }
    float xb[M_XB] A32, xp[M_XP] A32, bm[M_XP / 32], sg[M_XB / 32];
    const int shd = sh && fp8sh_mxcsr_ok();
    for (size_t g0 = 0; g0 < m; g0 += M_T) {
        const size_t T = m - g0 < M_T ? m - g0 : M_T;
        const size_t cap = T <= 3 ? M_XB / T / 32 * 32 : M_KC, ns = (k + cap - 1) / cap;
        const size_t kc = (k / 32 + ns - 1) / ns * 32;
        const int whole = T * k <= M_XP;
        int xall = shd;
        if (whole)
            for (size_t t = 0; t < T && xall; t++)
                xall = fp8sh_prep_x(x + (g0 + t) * ldx, k, xp + t * k, bm + t * (k / 32));
        const size_t rbk = !whole ? rows : (M_BLK / k < 1 ? 1 : M_BLK / k);
        for (size_t b0 = 0; b0 < rows; b0 += rbk) {
            const size_t b1 = rows - b0 < rbk ? rows : b0 + rbk;
            /* past the call's rows too (a prefetch never faults): the next
             * rows are the ones a GEMV's next chunk reads (as gemv_fp8_impl) */
            m_pf pf = { W + b1 * k, W + (b1 + rbk) * k, whole ? 0 : M_PF_ROWS * k };
            for (size_t k0 = 0; k0 < k; k0 += kc) {
                const size_t kn = k - k0 < kc ? k - k0 : kc;
                const size_t ldp = whole ? k : kc, p0 = whole ? k0 : 0;
                int xfin = whole ? xall : shd;
                if (!whole)
                    for (size_t t = 0; t < T && xfin; t++)
                        xfin = fp8sh_prep_x(x + (g0 + t) * ldx + k0, kn, xp + t * kc,
                                            bm + t * (kc / 32));
                for (size_t rb0 = b0; rb0 < b1;) {
                    const size_t sr = rb0 / bs;                       /* scale row */
                    const size_t rb1 = (sr + 1) * bs < b1 ? (sr + 1) * bs : b1;
                    float fin[M_T], pk[M_T];
                    int s1 = xfin;
                    for (size_t t = 0; t < T && s1; t++)
                        s1 = dsattn_fp8sh_plan(bm + (t * ldp + p0) / 32, kn / 32,
                                               scale + sr * ldsc, bs, k0, sg, pk + t, fin + t) &&
                             (fp8sh_scale_x(xp + t * ldp + p0, sg, kn, pk[t], xb + t * kc), 1);
                    if (!s1)
                        for (size_t t = 0; t < T; t++) {
                            fp8_arrange_x(x + (g0 + t) * ldx + k0, scale + sr * ldsc, bs, k0,
                                          kn, xb + t * kc);
                            fin[t] = 256.0f;
                        }
                    const uint8_t *w = W + rb0 * k + k0;
                    float *yo = y + g0 * ldy + rb0;
                    const int acc = k0 > 0, nan = !finite;
                    const size_t nr = rb1 - rb0;
                    switch (T) {   /* the token count as a constant: accumulators in registers */
#define M_CASE(n) case n: fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, n, acc, nan, s1, fin, &pf); break;
                    M_CASE(8) M_CASE(7) M_CASE(6) M_CASE(5) M_CASE(4) M_CASE(3) M_CASE(2)
#undef M_CASE
                    default: fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, 1, acc, nan, s1, fin, &pf);
                             break;
                    }
                    rb0 = rb1;
                }
            }
        }
    }
}

static void gemv_fp8_m_avx2(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                            const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                            size_t rows, size_t k, int finite)
{
    gemv_fp8_m_impl(W, scale, bs, ldsc, x, ldx, m, y, ldy, rows, k, finite, 0);
}

static void gemv_fp8_m_expshift(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                           const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                           size_t rows, size_t k, int finite)
{
    gemv_fp8_m_impl(W, scale, bs, ldsc, x, ldx, m, y, ldy, rows, k, finite, 1);
}

/* ==== FP4 E2M1 GEMV ===================================================== */
/* 64 codes (32 bytes) per step and no per-element shuffle: every E2M1
 * value is a bf16 number, so two vpshufb look up the high and the low byte
 * of its bf16 bits (the low nibbles, then the high nibbles split off with
 * a shift and an and), two byte unpacks make 16-bit bf16 words, and each
 * word vector gives two fp32 vectors by a 32-bit shift (even words) and an
 * and (odd words): 8 shuffles and 8 shift/and per 64 codes, the rest FMAs.
 * The values come out in a fixed permuted order; x is arranged into that
 * order once per call (4 x 4 transposes into a 32 KB stack buffer, K in
 * chunks of 8192 past that), so each row costs only its own decode.  Lane
 * half l of every vector holds elements of block l of the 64 codes: one
 * FMA per step applies both UE8M0 block scales (decoded per row part:
 * b << 23; 0 -> 2^-127, 255 -> NaN).  Rows are read front to back with a
 * prefetch FP4_PF bytes ahead.  A row part ending on a half step (K % 64
 * == 32) sums its last 32 codes in C. */

#define FP4_XCH 8192   /* elements of x arranged per pass (32 KB of stack) */
#define FP4_PF 4096    /* prefetch distance in bytes of the row stream */

/* bf16 bytes of the E2M1 values 0 .5 1 1.5 2 3 4 6, then their negatives */
static const uint8_t e2m1_bf16_hi[16] = { 0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                          0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0 };
static const uint8_t e2m1_bf16_lo[16] = { 0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                          0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0 };

/* x[0..63] into the decode's order: fp4_step's 8 vectors each hold, in
 * lane half l, one column b of a 4 x 4 block of x: x[32l + 16h + 4i + b],
 * i = 0..3 (the elements of the even or odd words of the low or high
 * nibbles of bytes 0-7 or 8-15), in the order written below. */
AI void fp4_arrange64(const float *x, float *xa)
{
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const float *p = x + 16 * h;
        const __m256 r0 = _mm256_loadu2_m128(p + 32, p), r1 = _mm256_loadu2_m128(p + 36, p + 4);
        const __m256 r2 = _mm256_loadu2_m128(p + 40, p + 8), r3 = _mm256_loadu2_m128(p + 44, p + 12);
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 c0 = _mm256_shuffle_ps(t0, t2, 0x44), c1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 c2 = _mm256_shuffle_ps(t1, t3, 0x44), c3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        /* fp4_step's vectors: 0 <- (h0, b0), 1 <- (h0, b2), 2 <- (h1, b0),
         * 3 <- (h1, b2), 4 <- (h0, b1), 5 <- (h0, b3), 6 <- (h1, b1), 7 <- (h1, b3) */
        _mm256_storeu_ps(xa + (size_t)(2 * h) * 8, c0);
        _mm256_storeu_ps(xa + (size_t)(2 * h + 1) * 8, c2);
        _mm256_storeu_ps(xa + (size_t)(2 * h + 4) * 8, c1);
        _mm256_storeu_ps(xa + (size_t)(2 * h + 5) * 8, c3);
    }
}

/* One 64-code step: 32 bytes v, the arranged x at xa, block scales
 * [s0 x4 | s1 x4] in sv. */
AI void fp4_step(__m256i v, const float *xa, __m256 sv, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), hm = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e2m1_bf16_hi));
    const __m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e2m1_bf16_lo));
    const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    const __m256i llo = _mm256_shuffle_epi8(tl, lo), hlo = _mm256_shuffle_epi8(th, lo);
    const __m256i lhi = _mm256_shuffle_epi8(tl, hi), hhi = _mm256_shuffle_epi8(th, hi);
    /* words of bytes 0-7 / 8-15 of each lane half: low nibbles, high nibbles */
    const __m256i wa = _mm256_unpacklo_epi8(llo, hlo), wb = _mm256_unpackhi_epi8(llo, hlo);
    const __m256i wc = _mm256_unpacklo_epi8(lhi, hhi), wd = _mm256_unpackhi_epi8(lhi, hhi);
#define FP4_EVEN(w) _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
#define FP4_ODD(w) _mm256_castsi256_ps(_mm256_and_si256(w, hm))
    __m256 p0 = _mm256_mul_ps(FP4_EVEN(wa), _mm256_loadu_ps(xa));
    __m256 p1 = _mm256_mul_ps(FP4_ODD(wa), _mm256_loadu_ps(xa + 8));
    p0 = _mm256_fmadd_ps(FP4_EVEN(wb), _mm256_loadu_ps(xa + 16), p0);
    p1 = _mm256_fmadd_ps(FP4_ODD(wb), _mm256_loadu_ps(xa + 24), p1);
    p0 = _mm256_fmadd_ps(FP4_EVEN(wc), _mm256_loadu_ps(xa + 32), p0);
    p1 = _mm256_fmadd_ps(FP4_ODD(wc), _mm256_loadu_ps(xa + 40), p1);
    p0 = _mm256_fmadd_ps(FP4_EVEN(wd), _mm256_loadu_ps(xa + 48), p0);
    p1 = _mm256_fmadd_ps(FP4_ODD(wd), _mm256_loadu_ps(xa + 56), p1);
#undef FP4_EVEN
#undef FP4_ODD
    *acc = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), sv, *acc);
}

/* 8 UE8M0 bytes -> floats (0 -> 2^-127, 255 -> NaN) */
AI __m256 ue8m0x8(const uint8_t *p)
{
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i f = _mm256_slli_epi32(b, 23);
    f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x00400000),
                           _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x7fc00000),
                           _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(f);
}

AI __m256 scale_pair(const float *sb)
{
    return _mm256_set_m128(_mm_broadcast_ss(sb + 1), _mm_broadcast_ss(sb));
}

static void gemv_fp4_avx2(const uint8_t *W, const uint8_t *scale, const float *x,
                          float *y, size_t rows, size_t k)
{
    float xa[FP4_XCH] A32;
    float sb[FP4_XCH / 32] A32;
    const size_t rs = k / 2, ss = k / 32;
    for (size_t k0 = 0; k0 == 0 || k0 < k; k0 += FP4_XCH) {     /* k = 0: y = 0 */
        const size_t kn = k - k0 < FP4_XCH ? k - k0 : FP4_XCH;
        const size_t kf = kn / 64 * 64;                  /* whole steps */
        for (size_t c = 0; c < kf; c += 64) fp4_arrange64(x + k0 + c, xa + c);
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *w = W + r * rs + k0 / 2, *s = scale + r * ss + k0 / 32;
            size_t b = 0;
            for (; b + 8 <= kn / 32; b += 8) _mm256_store_ps(sb + b, ue8m0x8(s + b));
            for (; b < kn / 32; b++) sb[b] = dsattn_ue8m0_bits_f32(s[b]);
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            size_t c = 0;
            for (; c + 128 <= kf; c += 128) {
                _mm_prefetch((const char *)(w + c / 2 + FP4_PF), _MM_HINT_T0);
                fp4_step(_mm256_loadu_si256((const __m256i *)(w + c / 2)), xa + c,
                         scale_pair(sb + c / 32), &acc0);
                fp4_step(_mm256_loadu_si256((const __m256i *)(w + c / 2 + 32)), xa + c + 64,
                         scale_pair(sb + c / 32 + 2), &acc1);
            }
            if (c < kf)
                fp4_step(_mm256_loadu_si256((const __m256i *)(w + c / 2)), xa + c,
                         scale_pair(sb + c / 32), &acc0);
            float tail = 0.0f;
            if (kf < kn) {                               /* a last 32 codes */
                float part = 0.0f;
                for (size_t i = kf; i < kn; i++)
                    part += dsattn_e2m1_to_f32((uint8_t)(w[i / 2] >> (4 * (i & 1)))) * x[k0 + i];
                tail = part * sb[kf / 32];
            }
            const float v = hsum(_mm256_add_ps(acc0, acc1)) + tail;
            y[r] = k0 == 0 ? v : y[r] + v;
        }
    }
}

/* ==== dot / mdot / maxpy (fp32) ========================================= */

static float dot_f32_avx2(const float *a, const float *b, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i < n; i += 8) {
        __m256i m = mask8(n - i);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* G = 8 heads (one chain each), 4 heads (two chains), 1 head (four). */
AI void mdot_group(const float *q, size_t ldq, const float *v, size_t n, float *out,
                   const int G, int accumulate)
{
    __m256 a[8], b[8];
    const int U = G == 8 ? 1 : (G == 4 ? 2 : 4);
    for (int g = 0; g < G * U; g++) a[g] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 * (size_t)U <= n; i += 8 * (size_t)U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 w = _mm256_loadu_ps(v + i + 8 * u);
#pragma GCC unroll 8
            for (int g = 0; g < G; g++)
                a[g * U + u] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * ldq + i + 8 * u), w,
                                               a[g * U + u]);
        }
    }
    for (; i < n; i += 8) {
        __m256i m = mask8(n - i);
        __m256 w = _mm256_maskload_ps(v + i, m);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++)
            a[g * U] = _mm256_fmadd_ps(_mm256_maskload_ps(q + g * ldq + i, m), w, a[g * U]);
    }
    for (int g = 0; g < G; g++) {
        b[g] = a[g * U];
        for (int u = 1; u < U; u++) b[g] = _mm256_add_ps(b[g], a[g * U + u]);
    }
    float s[8];
    if (G == 8) _mm256_storeu_ps(s, hsum8(b));
    else for (int g = 0; g < G; g++) s[g] = hsum(b[g]);
    for (int g = 0; g < G; g++) out[g] = accumulate ? out[g] + s[g] : s[g];
}

static void mdot_core(const float *q, size_t ldq, size_t nh, const float *v, size_t n,
                      float *out, int accumulate)
{
    size_t h = 0;
    for (; h + 8 <= nh; h += 8) mdot_group(q + h * ldq, ldq, v, n, out + h, 8, accumulate);
    if (h + 4 <= nh) { mdot_group(q + h * ldq, ldq, v, n, out + h, 4, accumulate); h += 4; }
    for (; h < nh; h++) mdot_group(q + h * ldq, ldq, v, n, out + h, 1, accumulate);
}

static void mdot_f32_avx2(const float *q, size_t ldq, size_t nh, const float *v,
                          size_t n, float *out)
{
    mdot_core(q, ldq, nh, v, n, out, 0);
}

static void maxpy_f32_avx2(const float *p, size_t nh, const float *v, size_t n,
                           float *acc, size_t ldacc)
{
    for (size_t i = 0; i < n; i += 32) {
        size_t left = n - i;
        if (left >= 32) {
            __m256 v0 = _mm256_loadu_ps(v + i), v1 = _mm256_loadu_ps(v + i + 8);
            __m256 v2 = _mm256_loadu_ps(v + i + 16), v3 = _mm256_loadu_ps(v + i + 24);
            for (size_t h = 0; h < nh; h++) {
                float *a = acc + h * ldacc + i;
                __m256 ph = _mm256_set1_ps(p[h]);
                _mm256_storeu_ps(a, _mm256_fmadd_ps(ph, v0, _mm256_loadu_ps(a)));
                _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(ph, v1, _mm256_loadu_ps(a + 8)));
                _mm256_storeu_ps(a + 16, _mm256_fmadd_ps(ph, v2, _mm256_loadu_ps(a + 16)));
                _mm256_storeu_ps(a + 24, _mm256_fmadd_ps(ph, v3, _mm256_loadu_ps(a + 24)));
            }
        } else {
            for (size_t j = i; j < n; j += 8) {
                __m256i m = mask8(n - j);
                __m256 vv = _mm256_maskload_ps(v + j, m);
                for (size_t h = 0; h < nh; h++) {
                    float *a = acc + h * ldacc + j;
                    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(p[h]), vv, _mm256_maskload_ps(a, m));
                    _mm256_maskstore_ps(a, m, r);
                }
            }
        }
    }
}

/* ==== Packed cache rows ================================================= */

/* Dequantize elements [i0, i0 + n) of a row of format fmt into out. */
AI void dequant_range(const int fmt, const uint8_t *row, size_t d, size_t i0, size_t n,
                      float *out)
{
    float scf[64];
    /* scales in groups of <= 64 blocks; blocks are 16 or 32 elements */
    const size_t blk = fmt == DSATTN_ROW_FP4E4M3 ? 16 : 32;
    for (size_t c0 = i0; c0 < i0 + n; c0 += 64 * blk) {
        size_t cn = i0 + n - c0 < 64 * blk ? i0 + n - c0 : 64 * blk;
        const uint8_t *sb = row + (fmt == DSATTN_ROW_FP8UE8M0 ? d : d / 2) + c0 / blk;
        for (size_t b = 0; b < cn / blk; b++)
            scf[b] = fmt == DSATTN_ROW_FP4E4M3 ? dsattn_e4m3_to_f32(sb[b]) : dsattn_ue8m0_bits_f32(sb[b]);
        if (fmt == DSATTN_ROW_FP8UE8M0) {
            for (size_t i = c0; i < c0 + cn; i += 16) {
                __m256 f0, f1, s = _mm256_set1_ps(scf[(i - c0) / 32]);
                fp8x16_exact(_mm_loadu_si128((const __m128i *)(row + i)), &f0, &f1);
                _mm256_storeu_ps(out + (i - i0), _mm256_mul_ps(f0, s));
                _mm256_storeu_ps(out + (i - i0) + 8, _mm256_mul_ps(f1, s));
            }
        } else {
            /* scf is indexed by (i - c0) / blk */
            for (size_t i = c0; i < c0 + cn; i += 16) {
                __m256 s = _mm256_set1_ps(scf[(i - c0) / blk]);
                _mm256_storeu_ps(out + (i - i0), _mm256_mul_ps(fp4x8(row + i / 2), s));
                _mm256_storeu_ps(out + (i - i0) + 8, _mm256_mul_ps(fp4x8(row + i / 2 + 4), s));
            }
        }
    }
}

/* Fused kernels: decode up to RCH elements into an L1 buffer once, then
 * run the fp32 mdot / maxpy over it for every head. */
AI void mdot_row(const int fmt, const float *q, size_t ldq, size_t nh,
                 const uint8_t *row, size_t d, float *out)
{
    float buf[RCH] A32;
    if (d == 0) memset(out, 0, nh * sizeof(float));
    for (size_t i0 = 0; i0 < d; i0 += RCH) {
        size_t n = d - i0 < RCH ? d - i0 : RCH;
        dequant_range(fmt, row, d, i0, n, buf);
        mdot_core(q + i0, ldq, nh, buf, n, out, i0 > 0);
    }
}

AI void maxpy_row(const int fmt, const float *p, size_t nh, const uint8_t *row,
                  size_t d, float *acc, size_t ldacc)
{
    float buf[RCH] A32;
    for (size_t i0 = 0; i0 < d; i0 += RCH) {
        size_t n = d - i0 < RCH ? d - i0 : RCH;
        dequant_range(fmt, row, d, i0, n, buf);
        maxpy_f32_avx2(p, nh, buf, n, acc + i0, ldacc);
    }
}

#include "kernels_rows_tmpl.h"

/* ==== bf16 rows: conversion and multi-head x multi-row dots ============= */

static void cvt_bf16_f32_avx2(const uint16_t *src, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) out[i] = dsattn_bf16_to_f32(src[i]);
}

/* Eight horizontal sums at once: lane s = sum of v[s]'s lanes. */
AI __m256 reduce8_ps(const __m256 v[8])
{
    __m256 a[4], c[2];
    for (int i = 0; i < 4; i++) {      /* 128-bit lane L: src 2i + L */
        __m256 x = _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20);
        __m256 y = _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31);
        a[i] = _mm256_add_ps(x, y);
    }
    for (int i = 0; i < 2; i++) {      /* lane L: 2 x src 4i+L, 2 x 4i+2+L */
        __m256 x = _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44);
        __m256 y = _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE);
        c[i] = _mm256_add_ps(x, y);
    }
    __m256 x = _mm256_shuffle_ps(c[0], c[1], 0x88);
    __m256 y = _mm256_shuffle_ps(c[0], c[1], 0xDD);
    /* element 4L + e holds source L + 2e */
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    return _mm256_permutevar8x32_ps(_mm256_add_ps(x, y), perm);
}

/* HB heads x RB rows (HB * RB <= 8); the k tail (k % 8) runs in scalar
 * fp32 after the vector sums. */
AI void mdot_bf16_tile2(const float *q, size_t ldq, const uint16_t *rows, size_t ldr,
                        size_t k, float *out, size_t ldo, const int HB, const int RB)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 w[8];
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++) w[r] = dsattn_bf16x8_256(rows + r * ldr + i);
#pragma GCC unroll 8
        for (int h = 0; h < HB; h++) {
            const __m256 qv = _mm256_loadu_ps(q + h * ldq + i);
#pragma GCC unroll 8
            for (int r = 0; r < RB; r++) acc[h * RB + r] = _mm256_fmadd_ps(qv, w[r], acc[h * RB + r]);
        }
    }
    float s[8];
    _mm256_storeu_ps(s, reduce8_ps(acc));
    for (int h = 0; h < HB; h++)
        for (int r = 0; r < RB; r++) {
            float t = s[h * RB + r];
            for (size_t j = i; j < k; j++)
                t += q[h * ldq + j] * dsattn_bf16_to_f32(rows[r * ldr + j]);
            out[r * ldo + h] = t;
        }
}

AI void mdot_bf16_heads2(const float *q, size_t ldq, const uint16_t *rows, size_t ldr,
                         size_t nr, size_t k, float *out, size_t ldo, const int HB, const int RB)
{
    size_t r = 0;
    for (; r + (size_t)RB <= nr; r += (size_t)RB)
        mdot_bf16_tile2(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, HB, RB);
    for (; r < nr; r++) mdot_bf16_tile2(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, HB, 1);
}

static void mdot_bf16_rows_avx2(const float *q, size_t ldq, size_t nh, const uint16_t *rows,
                                size_t ldr, size_t nr, size_t k, float *out, size_t ldo)
{
    size_t h = 0;
    for (; h + 4 <= nh; h += 4) mdot_bf16_heads2(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 4, 2);
    if (h + 2 <= nh) { mdot_bf16_heads2(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 2, 4); h += 2; }
    if (h < nh) mdot_bf16_heads2(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 1, 8);
}

/* ==== Activation quantization (act_quant, UE8M0) ======================= */
/* The scalar quantizer's deq output (dsattn_quant_fp8_ue8m0), 8 lanes at a
 * time, bit for bit (the NEON form's steps): per block the amax (any NaN
 * makes the scalar's fmaxf(amax, 1e-4) take 1e-4), the power-of-two scale
 * s from the scalar code itself, then per element y = clamp(x / s, +-448)
 * with NaN kept (minps / maxps return their second operand on NaN: the
 * bound goes first), rounded to the E4M3 grid - at |y| >= 2^-6 an integer
 * round-to-nearest-even of the fp32 bits to 3 mantissa bits (a carry moves
 * into the exponent, as the scalar's m == 16 case does; |y| <= 448 keeps it
 * finite; a NaN's bits stay a NaN), below 2^-6 the nearest multiple of 2^-9
 * (roundps of y * 2^9, exact scalings, -0.0 kept) - times s.  A block size
 * that is not a multiple of 8 takes the scalar code. */
static void act_quant_fp8_pow2_avx2(const float *x, size_t n, size_t block, float *deq)
{
    if (block == 0 || block % 8) {
        dsattn_act_quant_fp8_pow2_ref(x, n, block, deq);
        return;
    }
    const float inv448 = (float)(1.0 / 448.0);
    const __m256 lo = _mm256_set1_ps(-448.0f), hi = _mm256_set1_ps(448.0f);
    const __m256 sub = _mm256_set1_ps(0x1p-6f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i half = _mm256_set1_epi32(0x7ffff), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32((int)0xfff00000u);
    for (size_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (size_t i = 0; i < block; i += 8) {
            const __m256 v = _mm256_loadu_ps(xb + i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            m = _mm256_max_ps(m, _mm256_and_ps(v, absm));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        amax = _mm256_movemask_ps(nan) ? 1e-4f : (amax > 1e-4f ? amax : 1e-4f);
        const float s = dsattn_pow2_ceil(amax * inv448);
        const __m256 sv = _mm256_set1_ps(s);
        for (size_t i = 0; i < block; i += 8) {
            const __m256 y = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_div_ps(_mm256_loadu_ps(xb + i), sv)));
            const __m256i u = _mm256_castps_si256(y);
            const __m256i rn = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(half,
                                   _mm256_and_si256(_mm256_srli_epi32(u, 20), one))), keep);
            const __m256 small = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(512.0f)),
                                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                               _mm256_set1_ps(0x1p-9f));
            const __m256 q = _mm256_blendv_ps(_mm256_castsi256_ps(rn), small,
                                              _mm256_cmp_ps(_mm256_and_ps(y, absm), sub, _CMP_LT_OQ));
            _mm256_storeu_ps(deq + b * block + i, _mm256_mul_ps(q, sv));
        }
    }
}

/* ==== bf16 GEMV over several tokens (gemv_bf16m_tmpl.h) ================ */
#define GBM_R 1
#define GBM_CHAINS(T) ((T) == 1 ? 8 : (T) == 2 ? 4 : (T) <= 4 ? 2 : 1)
#include "gemv_bf16m_tmpl.h"

/* ==== The table ========================================================= */

/* The table's entries; the two AVX2 tables differ only in the FP8 GEMVs. */
#define AVX2_TABLE(NAME, FP8, FP8F, FP8M, PX, FP8PX) {     \
    .name                 = NAME,                           \
    .gemv_f32             = gemv_f32_avx2,                  \
    .gemv_bf16            = gemv_bf16_avx2,                 \
    .gemv_fp8             = FP8,                            \
    .gemv_fp8_finite      = FP8F,                           \
    .fp8_prep_x           = PX,                             \
    .gemv_fp8_px          = FP8PX,                          \
    .gemv_fp8_m           = FP8M,                           \
    .gemv_bf16_m          = gemv_bf16_m_simd,               \
    .act_quant_fp8_pow2   = act_quant_fp8_pow2_avx2,        \
    .gemv_fp4             = gemv_fp4_avx2,                  \
    .dot_f32              = dot_f32_avx2,                   \
    .mdot_f32             = mdot_f32_avx2,                  \
    .maxpy_f32            = maxpy_f32_avx2,                 \
    ROWS_TABLE_ENTRIES(mdot_fp4e4m3_rows_each, maxpy_fp4e4m3_rows_each), \
    .cvt_bf16_f32         = cvt_bf16_f32_avx2,              \
    .mdot_bf16_rows       = mdot_bf16_rows_avx2,            \
}

static const dsattn_kernels kernels_avx2 =
    AVX2_TABLE("avx2", gemv_fp8_avx2, gemv_fp8_finite_avx2, gemv_fp8_m_avx2, NULL, NULL);

/* The exponent-shift FP8 decode in the GEMVs: for CPUs whose FMA takes
 * subnormal operands at full rate (dispatch.c chooses). */
static const dsattn_kernels kernels_avx2_expshift =
    AVX2_TABLE("avx2-expshift", gemv_fp8_expshift, gemv_fp8_finite_expshift,
               gemv_fp8_m_expshift, fp8_prep_x_expshift, gemv_fp8_px_expshift);

const dsattn_kernels *const dsattn_kernels_avx2_ptr = &kernels_avx2;
const dsattn_kernels *const dsattn_kernels_avx2_expshift_ptr = &kernels_avx2_expshift;

#else  /* no AVX2 compiler support: no such path */

const dsattn_kernels *const dsattn_kernels_avx2_ptr = 0;
const dsattn_kernels *const dsattn_kernels_avx2_expshift_ptr = 0;
int dsattn_avx2_fma_subnormal_full_rate(void) { return 0; }
int dsattn_avx2_fp8sh_plan32(const float *bm, size_t ng, const float *sc, float *pk,
                             float *unscale)
{
    (void)bm; (void)ng; (void)sc; (void)pk; (void)unscale;
    return 0;
}

#endif
