/* kernels_avx512.c - the AVX-512 (F/BW/VL/DQ) kernel table.
 *
 * Owns the fast path of every dsattn_kernels entry on AVX-512 CPUs.  Each
 * kernel accumulates in fp32 with FMA in its own order and is tested against
 * the scalar reference (kernels_ref.c) with stated bounds in
 * tests/test_kernels.c; docs/kernels.md has the contracts and measured
 * speeds.  Every kernel is single-threaded and reentrant (no mutable
 * globals, scratch lives on the stack): the ops layer calls the GEMVs on row
 * ranges from an OpenMP loop.  Deliberately not here: threading, allocation,
 * VBMI/BF16/FP16 instructions (the dispatch only checks F/BW/VL/DQ).
 *
 * The decode tricks, all exact:
 *  - E4M3 -> fp16 is a bit move: sign to bit 15, the 7 magnitude bits to
 *    bits 13..7.  The fp16 number is the E4M3 value times 2^-8, subnormals
 *    included (an E4M3 subnormal lands on an fp16 subnormal), and
 *    vcvtph2ps turns it into a normal fp32 with no denormal penalty.  The
 *    2^8 is put back by an exact power-of-two multiply.  0x7f/0xff (NaN in
 *    E4M3 "fn") would decode as +-480, so every path that can meet them
 *    detects them separately.
 *  - E2M1 is a 16-entry table: vpermps looks it up with the low 4 bits of
 *    each 32-bit lane and ignores the rest, so a nibble only has to be
 *    shifted to the bottom of its lane, never masked.
 *  - UE8M0 b is the fp32 bit pattern b << 23, except b = 0 (2^-127, a
 *    subnormal) and b = 255 (NaN), which are patched by compare masks.
 *
 * GEMV streaming: the rows of a step (4 at a time) form one contiguous
 * region.  The f32, bf16 and FP4 GEMVs read its rows interleaved line by
 * line, which the hardware streamer follows poorly when rows are short
 * (k = 1280: 2.5 KB per bf16 row, half the DRAM rate), so every step
 * prefetches a later step's region sequentially, R lines per iteration,
 * two regions ahead and into L2 (measured: into L1, or one region ahead, a
 * few % slower).  The FP8 GEMV, which carries most of the bytes, reads each
 * row front to back instead, a purely sequential stream with a prefetch
 * cursor 8 KB ahead: 10-13 % faster than the interleaved read at V4.1's
 * shapes (dsattn bench kernels, 2 threads).  Its four partial sums per row
 * (one per x vector) also keep the FMAs off each other's latency.
 *
 * GEMV layout trick: the FP8 and FP4 GEMVs decode weights in whatever lane
 * order is cheapest and re-arrange x once per call (and fold the FP8 block
 * scales into it) so that lanes line up; x is shared by every row, the
 * weights are not.
 */
#include "kernels.h"
#include "fp8sh.h"
#include "numfmt.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "simd_avx512.h"

#define AI static inline __attribute__((always_inline))
#define A64 __attribute__((aligned(64)))

/* Elements of x re-arranged per pass of the FP8/FP4 GEMVs (32 KB stack). */
#define XCH 8192
/* The exponent-shift FP8 GEMV's pass: 16 KB of arranged x, which stays in
 * a 32 KB L1 (AMD Zen 4) beside the weight stream (k = 8192 in one pass of
 * XCH: measured 1.3-1.8x slower there) */
#define XCH_L1 4096
/* Row elements decoded per pass of the buffered fused kernels (4 KB). */
#define RCH 1024

static const float e2m1_tab[16] A64 = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* ==== Small helpers ===================================================== */

AI __mmask16 mask16(size_t n) { return (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u); }
AI __mmask64 mask64(size_t n) { return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1); }

AI float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* Four accumulators -> their four sums in one __m128. */
AI __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m256 ta = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 tb = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 tc = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 td = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 ab = _mm256_hadd_ps(ta, tb), cd = _mm256_hadd_ps(tc, td);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}


/* y[0..R) = (accumulate ? y + s : s) */
AI void put_sums(float *y, const float *s, int R, int accumulate)
{
    for (int r = 0; r < R; r++) y[r] = accumulate ? y[r] + s[r] : s[r];
}

/* 16 UE8M0 bytes -> 16 exact fp32 scales (2^(b-127), NaN for 255). */
AI __m512 ue8m0x16(__m128i b)
{
    __m512i e = _mm512_cvtepu8_epi32(b);
    __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
    f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x00400000)));
    f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
    return f;
}

/* n (<= 16) UE8M0 bytes -> floats; lanes past n are 0. */
AI void ue8m0_to_f32(const uint8_t *b, size_t n, float *out)
{
    __m128i v = _mm_maskz_loadu_epi8(mask16(n), b);
    _mm512_storeu_ps(out, _mm512_maskz_mov_ps(mask16(n), ue8m0x16(v)));
}

/* Words holding one E4M3 code in their low byte -> fp16 bits of value*2^-8. */
AI __m512i e4m3w_to_h(__m512i w)
{
    return _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1),
                            _mm512_set1_epi16((short)0xBF80));
}

/* n (<= 32) E4M3 codes -> exact floats (NaN codes included); the rest 0. */
AI void e4m3_to_f32(const uint8_t *c, size_t n, float *out)
{
    __mmask32 m = n >= 32 ? 0xffffffffu : (1u << n) - 1u;
    __m512i w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, c));
    __m512i h = e4m3w_to_h(w);
    __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7f)),
                                            _mm512_set1_epi16(0x7f));
    const __m512 k256 = _mm512_set1_ps(256.0f), qnan = _mm512_set1_ps(__builtin_nanf(""));
    __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), k256);
    __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), k256);
    f0 = _mm512_mask_mov_ps(f0, (__mmask16)nan, qnan);
    f1 = _mm512_mask_mov_ps(f1, (__mmask16)(nan >> 16), qnan);
    _mm512_storeu_ps(out, _mm512_maskz_mov_ps(mask16(n), f0));
    _mm512_storeu_ps(out + 16, _mm512_maskz_mov_ps(mask16(n > 16 ? n - 16 : 0), f1));
}

/* ==== fp32 / bf16 GEMV ================================================== */

/* bf16 -> fp32 is a 16-bit shift: zero-extend 16 halves, shift left 16. */
AI __m512 bf16x16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* R rows (4 to 1) of W . x, W fp32 or (BF) bf16, one FMA chain a lane per
 * row; the rows two blocks ahead are prefetched, one 64-byte line per row
 * a step that starts a line. */
AI void gemv_rows(const void *W, size_t k, const float *x, float *y, const int R, const int BF)
{
    const size_t es = BF ? 2 : 4;                   /* bytes an element */
    const char *Wb = (const char *)W;
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (!BF || !(i & 16))
                _mm_prefetch(Wb + 2 * R * k * es + (i / (64 / es) * R + r) * 64, _MM_HINT_T1);
            const char *wr = Wb + (r * k + i) * es;
            const __m512 wv = BF ? bf16x16(_mm256_loadu_si256((const __m256i *)wr))
                                 : _mm512_loadu_ps((const float *)wr);
            acc[r] = _mm512_fmadd_ps(wv, xv, acc[r]);
        }
    }
    if (i < k) {
        __mmask16 m = mask16(k - i);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 wv =
                BF ? bf16x16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)W + r * k + i))
                   : _mm512_maskz_loadu_ps(m, (const float *)W + r * k + i);
            acc[r] = _mm512_fmadd_ps(wv, xv, acc[r]);
        }
    }
    if (R == 4) {
        _mm_storeu_ps(y, hsum4(acc[0], acc[1], acc[2], acc[3]));
    } else {
        for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
    }
}

/* all rows: 4 at a time, then the 3, 2 or 1 left */
AI void gemv_all(const void *W, const float *x, float *y, size_t rows, size_t k, const int BF)
{
    const size_t rb = k * (BF ? 2 : 4);             /* bytes a row */
    const char *Wb = (const char *)W;
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) gemv_rows(Wb + r * rb, k, x, y + r, 4, BF);
    switch (rows - r) {
    case 3: gemv_rows(Wb + r * rb, k, x, y + r, 3, BF); break;
    case 2: gemv_rows(Wb + r * rb, k, x, y + r, 2, BF); break;
    case 1: gemv_rows(Wb + r * rb, k, x, y + r, 1, BF); break;
    default: break;
    }
}

static void gemv_f32_avx512(const float *W, const float *x, float *y, size_t rows,
                            size_t k)
{
    gemv_all(W, x, y, rows, k, 0);
}

static void gemv_bf16_avx512(const uint16_t *W, const float *x, float *y,
                             size_t rows, size_t k)
{
    gemv_all(W, x, y, rows, k, 1);
}

/* ==== FP8 E4M3 GEMV ===================================================== */
/* A 64-byte load of codes is decoded as 16-bit lanes: the even bytes and
 * the odd bytes each become 32 fp16 numbers (5 integer ops), then four
 * vcvtph2ps give [even 0..30], [even 32..62], [odd 1..31], [odd 33..63].
 * x is arranged the same way once per call, with each element already
 * multiplied by its block scale; the rows of one call that share a scale
 * row share that arranged x.  The 2^-8 of the fp16 decode comes back as
 * one exact *256 per output.  NaN codes are tracked with one byte max per
 * load (code | 0x80 is 0xff exactly for 0x7f and 0xff). */

static void fp8_arrange_x(const float *x, const float *sc, size_t bs, size_t k0,
                          size_t kn, float *xb)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14,
                                         16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    size_t t0 = 0;
    if (bs % 32 == 0 && k0 % 32 == 0) {
        /* Whole 64-element chunks: each 32-element half lies in one scale
         * block, whose index advances without a division per vector (a
         * 64-bit divide per 16 elements cost more than the rest). */
        size_t blk = k0 / bs, left = bs - k0 % bs;  /* elements left in blk */
        for (; t0 + 64 <= kn; t0 += 64) {
            const __m512 s0 = _mm512_set1_ps(sc[blk]);
            if ((left -= 32) == 0) { blk++; left = bs; }
            const __m512 s1 = _mm512_set1_ps(sc[blk]);
            if ((left -= 32) == 0) { blk++; left = bs; }
            const float *xi = x + t0;
            __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(xi), s0);
            __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(xi + 16), s0);
            __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(xi + 32), s1);
            __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(xi + 48), s1);
            float *o = xb + t0;
            _mm512_store_ps(o,      _mm512_permutex2var_ps(a0, ie, a1));
            _mm512_store_ps(o + 16, _mm512_permutex2var_ps(a2, ie, a3));
            _mm512_store_ps(o + 32, _mm512_permutex2var_ps(a0, io, a1));
            _mm512_store_ps(o + 48, _mm512_permutex2var_ps(a2, io, a3));
        }
    }
    for (; t0 < kn; t0 += 64) {
        __m512 a[4];
        for (int m = 0; m < 4; m++) {
            size_t off = t0 + 16 * (size_t)m;
            __mmask16 mk = mask16(off < kn ? kn - off : 0);
            a[m] = _mm512_maskz_loadu_ps(mk, x + off);
            if (bs % 32 == 0) {
                /* 32-element halves never straddle a scale block; padding
                 * lanes stay exactly 0 even if a scale is inf. */
                if (mk) a[m] = _mm512_maskz_mul_ps(mk, a[m],
                                                   _mm512_set1_ps(sc[(k0 + off) / bs]));
            } else {
                float tmp[16] A64;
                _mm512_store_ps(tmp, a[m]);
                for (size_t l = 0; l < 16 && off + l < kn; l++)
                    tmp[l] *= sc[(k0 + off + l) / bs];
                a[m] = _mm512_load_ps(tmp);
            }
        }
        float *o = xb + t0;
        _mm512_store_ps(o,      _mm512_permutex2var_ps(a[0], ie, a[1]));
        _mm512_store_ps(o + 16, _mm512_permutex2var_ps(a[2], ie, a[3]));
        _mm512_store_ps(o + 32, _mm512_permutex2var_ps(a[0], io, a[1]));
        _mm512_store_ps(o + 48, _mm512_permutex2var_ps(a[2], io, a[3]));
    }
}

/* One 64-code step of a row: four partial sums (one per x vector, so no
 * FMA waits on another) and the NaN byte max. */
/* 64 E4M3 codes -> their values x 2^-8 in the arranged order (w[0] even
 * codes 0..30, w[1] even 32..62, w[2] odd 1..31, w[3] odd 33..63), and the
 * NaN byte max. */
AI void fp8_decode64(__m512i v, __m512 *w, __m512i *nanv, const int track_nan)
{
    const __m512i keep = _mm512_set1_epi16((short)0xBF80);
    if (track_nan) *nanv = _mm512_max_epu8(*nanv, _mm512_or_si512(v, _mm512_set1_epi8((char)0x80)));
    const __m512i lo = e4m3w_to_h(v);
    const __m512i hi = _mm512_and_si512(_mm512_srai_epi16(v, 1), keep);
    w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
    w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo, 1));
    w[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(hi));
    w[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hi, 1));
}

/* The exponent-shift decode (the avx512-expshift table), kernels_avx2.c's
 * fp8sh_decode32 on 64 codes: lane i of w[j] is code 4i + j of the load,
 * its sign moved to bit 31 and its seven magnitude bits to bits 26..20 of
 * an fp32, which is the E4M3 value times 2^-120 exactly (E4M3 subnormals
 * become fp32 subnormals with the same digits).  One 16-bit arithmetic
 * shift by 4 places the high byte's code of each word (codes 4i + 3 and,
 * after an 8-bit move up, 4i + 2) in the high word of its dword; a 32-bit
 * shift by 16 brings the low word's (4i + 1, 4i) there too; the AND with
 * 0x87F00000 keeps sign and magnitude.  5 shifts and 4 ANDs per 64 codes,
 * no vcvtph2ps (2 uops and a 256-bit datapath on AMD Zen 4); the NaN byte
 * max as above. */
AI void fp8sh_decode64(__m512i v, __m512 *w, __m512i *nanv, const int track_nan)
{
    const __m512i m = _mm512_set1_epi32((int)0x87F00000u);
    if (track_nan) *nanv = _mm512_max_epu8(*nanv, _mm512_or_si512(v, _mm512_set1_epi8((char)0x80)));
    const __m512i t3 = _mm512_srai_epi16(v, 4);                          /* codes 4i+3, 4i+1 */
    const __m512i t2 = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);    /* codes 4i+2, 4i */
    w[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(t2, 16), m));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(t3, 16), m));
    w[2] = _mm512_castsi512_ps(_mm512_and_si512(t2, m));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(t3, m));
}

/* The exponent shift needs subnormal operands read as they are: where the
 * caller's thread runs with denormals-are-zero (MXCSR.DAZ, bit 6, as
 * -ffast-math start-up code sets it) the fp16 decode runs instead. */
AI int fp8sh_mxcsr_ok(void) { return !(_mm_getcsr() & 0x40); }

/* The exponent-shift decode's x, unscaled (fp8sh.h has the scaling):
 * xp[64g + 16j + i] = x[64g + 4i + j], zero past kn up to the next
 * multiple of 64, and bm[h] = max |x| of the 32-element group h (lanes
 * 0..7 of a vector hold group 2g, lanes 8..15 group 2g + 1).  Returns 0 if
 * some x is inf or NaN (the caller then takes the fp16 decode). */
static int fp8sh_prep_x(const float *x, size_t kn, float *xp, float *bm)
{
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    /* [4i + j for i < 8 | 4i + j + 1 for i < 8] of two vectors: codes j and j + 1 */
    const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28,
                                         1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(2));
    __mmask16 fin = 0xffff;
    for (size_t t0 = 0; t0 < kn; t0 += 64) {
        __m512 a[4], ab[4];
        for (int m = 0; m < 4; m++) {
            const size_t off = t0 + 16 * (size_t)m;
            const __mmask16 mk = mask16(off < kn ? kn - off : 0);
            a[m] = _mm512_maskz_loadu_ps(mk, x + off);
            ab[m] = _mm512_abs_ps(a[m]);
            fin &= _mm512_cmp_ps_mask(ab[m], inf, _CMP_LT_OQ);
        }
        bm[t0 / 32] = _mm512_reduce_max_ps(_mm512_max_ps(ab[0], ab[1]));
        if (t0 + 32 < kn) bm[t0 / 32 + 1] = _mm512_reduce_max_ps(_mm512_max_ps(ab[2], ab[3]));
        const __m512 p0 = _mm512_permutex2var_ps(a[0], ia, a[1]);
        const __m512 p1 = _mm512_permutex2var_ps(a[0], ib, a[1]);
        const __m512 q0 = _mm512_permutex2var_ps(a[2], ia, a[3]);
        const __m512 q1 = _mm512_permutex2var_ps(a[2], ib, a[3]);
        float *o = xp + t0;
        _mm512_store_ps(o,      _mm512_shuffle_f32x4(p0, q0, 0x44));
        _mm512_store_ps(o + 16, _mm512_shuffle_f32x4(p0, q0, 0xEE));
        _mm512_store_ps(o + 32, _mm512_shuffle_f32x4(p1, q1, 0x44));
        _mm512_store_ps(o + 48, _mm512_shuffle_f32x4(p1, q1, 0xEE));
    }
    return fin == 0xffff;
}

/* xb = (xp * its group's scale sg[h]) * pk over [0, kn) rounded up to 64:
 * fp8sh_prep_x's x, scaled as dsattn_fp8sh_plan says (a group past kn, in
 * a last half-filled step, is zeros times 0). */
static void fp8sh_scale_x(const float *xp, const float *sg, size_t kn, float pk, float *xb)
{
    const __m512 vk = _mm512_set1_ps(pk);
    const size_t ng = (kn + 31) / 32;
    for (size_t t0 = 0; t0 < kn; t0 += 64) {
        const size_t h = t0 / 32;
        const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(sg[h]),
                                             _mm256_set1_ps(h + 1 < ng ? sg[h + 1] : 0.0f), 1);
        for (int j = 0; j < 4; j++) {
            const size_t o = t0 + 16 * (size_t)j;
            _mm512_store_ps(xb + o, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(xp + o), sv), vk));
        }
    }
}

/* sh = 0: the fp16 decode and fp8_arrange_x's order; sh = 1: the
 * exponent-shift decode and fp8sh_prep_x's order. */
AI void fp8_step(__m512i v, const float *xc, __m512 *a, __m512i *nanv, const int track_nan,
                 const int sh)
{
    __m512 w[4];
    if (sh) fp8sh_decode64(v, w, nanv, track_nan);
    else    fp8_decode64(v, w, nanv, track_nan);
    /* unrolled, or GCC 12 keeps w and the accumulators in memory (2.3x slower) */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) a[j] = _mm512_fmadd_ps(w[j], _mm512_load_ps(xc + 16 * j), a[j]);
}

/* R rows, each read front to back in one pass (a purely sequential stream
 * when kn == k).  The prefetch cursor (*pr, *pc) walks the same stream
 * FP8_PF bytes ahead - into the rows after this call's, which the next call
 * reads - one line per step, into L2.  Measured on 32768 x 1280 (V4.1's
 * wq_b), 2 threads, cold: 4 rows interleaved line by line 29-30 GB/s,
 * sequential rows 32-33, a plain read 32-33; with no software prefetch the
 * sequential rows drop to 15. */
#define FP8_PF 8192

AI void fp8_rows(const uint8_t *W, size_t k, const float *xb, size_t kn, float *y,
                 const int R, int accumulate, const int track_nan, size_t *pr, size_t *pc,
                 const int sh, float fin)
{
    __m512 acc[4];
    int nan[4] = { 0, 0, 0, 0 };
    const size_t kf = kn / 64 * 64;
    for (int r = 0; r < R; r++) {
        const uint8_t *w = W + r * k;
        __m512 a[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                        _mm512_setzero_ps() };
        __m512i nanv = _mm512_setzero_si512();
        for (size_t t0 = 0; t0 < kf; t0 += 64) {
            _mm_prefetch((const char *)(W + *pr * k + *pc), _MM_HINT_T1);
            if ((*pc += 64) >= kn) { *pc = 0; ++*pr; }
            fp8_step(_mm512_loadu_si512(w + t0), xb + t0, a, &nanv, track_nan, sh);
        }
        if (kf < kn)   /* the arranged x is zero past kn, masked codes too */
            fp8_step(_mm512_maskz_loadu_epi8(mask64(kn - kf), w + kf), xb + kf, a, &nanv,
                     track_nan, sh);
        acc[r] = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        if (track_nan) nan[r] = _mm512_cmpeq_epi8_mask(nanv, _mm512_set1_epi8(-1)) != 0;
    }
    *pr -= (size_t)R;
    float s[4];
    if (R == 4) _mm_storeu_ps(s, hsum4(acc[0], acc[1], acc[2], acc[3]));
    else for (int r = 0; r < R; r++) s[r] = hsum(acc[r]);
    for (int r = 0; r < R; r++) {
        s[r] *= fin;
        if (nan[r]) s[r] = __builtin_nanf("");
    }
    put_sums(y, s, R, accumulate);
}

/* xb = the arranged xp times the block scales sc (bs % 32 == 0, kn % 64
 * == 0, from element 0): per 64-element chunk its two 32-element halves'
 * scales, in the arranged order [s0 x16, s1 x16, s0 x16, s1 x16]. */
static void fp8_scale_x(const float *xp, const float *sc, size_t bs, size_t kn, float *xb)
{
    size_t blk = 0, left = bs;
    for (size_t t0 = 0; t0 < kn; t0 += 64) {
        const __m512 s0 = _mm512_set1_ps(sc[blk]);
        if ((left -= 32) == 0) { blk++; left = bs; }
        const __m512 s1 = _mm512_set1_ps(sc[blk]);
        if ((left -= 32) == 0) { blk++; left = bs; }
        _mm512_store_ps(xb + t0,      _mm512_mul_ps(_mm512_load_ps(xp + t0), s0));
        _mm512_store_ps(xb + t0 + 16, _mm512_mul_ps(_mm512_load_ps(xp + t0 + 16), s1));
        _mm512_store_ps(xb + t0 + 32, _mm512_mul_ps(_mm512_load_ps(xp + t0 + 32), s0));
        _mm512_store_ps(xb + t0 + 48, _mm512_mul_ps(_mm512_load_ps(xp + t0 + 48), s1));
    }
}

/* rows [rb0, rb1) of one x pass, 4 at a time */
AI void fp8_rows_span(const uint8_t *w, size_t k, const float *xb, size_t kn, float *y,
                      size_t rb0, size_t rb1, int acc, const int nan, size_t *pr, size_t *pc,
                      const int sh, float fin)
{
    size_t r = rb0;
    for (; r + 4 <= rb1; r += 4) fp8_rows(w + r * k, k, xb, kn, y + r, 4, acc, nan, pr, pc, sh, fin);
    switch (rb1 - r) {
    case 3: fp8_rows(w + r * k, k, xb, kn, y + r, 3, acc, nan, pr, pc, sh, fin); break;
    case 2: fp8_rows(w + r * k, k, xb, kn, y + r, 2, acc, nan, pr, pc, sh, fin); break;
    case 1: fp8_rows(w + r * k, k, xb, kn, y + r, 1, acc, nan, pr, pc, sh, fin); break;
    default: break;
    }
}

/* sh: try the exponent-shift decode (per scale row and x pass; the fp16
 * decode where x or x * scale is not finite, or DAZ is on).  x is prepared
 * for it once per pass of XCH_L1 elements (once per call where k <=
 * XCH_L1), then only scaled per scale row. */
AI void gemv_fp8_impl(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                      const float *x, float *y, size_t rows, size_t k, const int nan,
                      const int sh)
{
    float xb[XCH] A64, xp[XCH] A64;
    if (bs == 0) return;
    if (k == 0) {                        /* empty sums, as the reference */
        memset(y, 0, rows * sizeof(float));
        return;
    }
    const int shd = sh && bs % 32 == 0 && fp8sh_mxcsr_ok();
    float bm[XCH / 32], sg[XCH / 32];
    size_t prep_k0 = SIZE_MAX;           /* the exponent-shift pass xp holds */
    int xfin = 0;
    /* one pass over x (every V4.1 shape): arranged once (a block size
     * past XCH: one scale of 1), then only re-scaled per scale row */
    const int once = !shd && k <= XCH && k % 64 == 0 && bs % 32 == 0 && rows > bs;
    const size_t xch = shd ? XCH_L1 : XCH;
    if (once) {
        const float one = 1.0f;
        fp8_arrange_x(x, &one, 2 * XCH, 0, k, xp);
    }
    for (size_t rb0 = 0; rb0 < rows;) {
        size_t sr = rb0 / bs;                       /* scale row */
        size_t rb1 = (sr + 1) * bs < rows ? (sr + 1) * bs : rows;
        const float *sc = scale + sr * ldsc;
        for (size_t k0 = 0; k0 < k; k0 += xch) {
            size_t kn = k - k0 < xch ? k - k0 : xch;
            int acc = k0 > 0;
            float fin = 256.0f, pk;
            if (shd && prep_k0 != k0) {
                xfin = fp8sh_prep_x(x + k0, kn, xp, bm);
                prep_k0 = k0;
            }
            const int s1 = shd && xfin &&
                           dsattn_fp8sh_plan(bm, (kn + 31) / 32, sc, bs, k0, sg, &pk, &fin);
            if (s1) {
                fp8sh_scale_x(xp, sg, kn, pk, xb);
            } else {
                fin = 256.0f;
                if (once) fp8_scale_x(xp, sc, bs, kn, xb);
                else fp8_arrange_x(x + k0, sc, bs, k0, kn, xb);
            }
            /* prefetch cursor, relative to the call's current rows */
            size_t pr = FP8_PF / kn, pc = FP8_PF % kn / 64 * 64;
            if (s1) fp8_rows_span(W + k0, k, xb, kn, y, rb0, rb1, acc, nan, &pr, &pc, 1, fin);
            else    fp8_rows_span(W + k0, k, xb, kn, y, rb0, rb1, acc, nan, &pr, &pc, 0, fin);
        }
        rb0 = rb1;
    }
}

/* NaN codes propagate (the reference's contract on any bytes) */
static void gemv_fp8_avx512(const uint8_t *W, const float *scale, size_t bs,
                            size_t ldsc, const float *x, float *y, size_t rows,
                            size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 1, 0);
}

static void gemv_fp8_expshift(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                              const float *x, float *y, size_t rows, size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 1, 1);
}

/* Weights without NaN codes: the same sums without the tracking (about 5 %
 * of a V4.1 decode step, measured with dsattn bench v41). */
static void gemv_fp8_finite_avx512(const uint8_t *W, const float *scale, size_t bs,
                                   size_t ldsc, const float *x, float *y, size_t rows,
                                   size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 0, 0);
}

static void gemv_fp8_finite_expshift(const uint8_t *W, const float *scale, size_t bs,
                                     size_t ldsc, const float *x, float *y, size_t rows,
                                     size_t k)
{
    gemv_fp8_impl(W, scale, bs, ldsc, x, y, rows, k, 0, 1);
}

/* ==== FP8 E4M3 GEMV over several tokens ================================= */
/* m tokens against one weight (a batched decode step: one row per
 * sequence).  Each 64-code step of a weight row is decoded once (as in
 * fp8_step) and multiplied into every token of the pass: up to 16
 * accumulators, one per (row, token) - 2 rows x up to 8 tokens, or one row
 * x 9..M_T1MAX tokens with the fp16 decode (the dearer decode; measured on
 * Ice Lake: 4-9 % faster than passes of 8 + 1 or 2), else two passes of 2
 * rows x up to 8 - so a decode serves 4 FMA vectors per token and an x
 * load serves the pass's rows; up to 4 tokens, each sum runs as two
 * chains (even and odd vectors of the step), which the FMA latency would
 * otherwise bound.
 *
 * Memory order.  The rows are taken in blocks of about M_BLK bytes; within
 * a block k is walked in equal slabs whose scaled x (T tokens x the slab,
 * M_XL1 floats up to 3 tokens, M_XB past) stays in L1, and a row's slab
 * sums are added to y slab by slab.  While a block is computed, a cursor
 * prefetches the next block front to back into L2, one line per 64 codes
 * decoded, so DRAM sees one sequential stream whatever the slabs.  Measured
 * on Zen 4 (2 threads, 2 tokens, 4096 x 8192): slabs over the whole matrix
 * with a per-row prefetch into L1 read 11-12 GB/s, blocks 27-30.
 *
 * Per scale row each token's slab is scaled with its block scales (as
 * gemv_fp8_impl does it), so every product is the one gemv_fp8 forms.  The
 * exponent-shift x (fp8sh_prep_x) is prepared once per pass where the
 * pass's tokens x k fit M_XP floats, else per block and slab.  Shapes
 * outside this form (k % 64, bs % 32) go token by token through
 * gemv_fp8_impl. */
#define M_TMAX 16
#define M_T1MAX 10                 /* the fp16 decode's one-row pass: up to 10 tokens */
#define M_XB 8192                  /* scaled x: the pass's tokens x one slab, 32 KB */
#define M_XL1 4096                 /* ... up to 3 tokens, 16 KB */
#define M_XP 16384                 /* the exponent-shift x of the whole pass, 64 KB */
#define M_BLK 262144               /* bytes of weight rows per block */
#define M_PF_ROWS 8                /* x per slab: rows ahead a line is prefetched */

/* the prefetch: the next block's cursor [p, end), or (ahead > 0) the line
 * `ahead` bytes past each line read */
typedef struct { const uint8_t *p, *end; size_t ahead; } m_pf;

AI void fp8_rows_m(const uint8_t *W, size_t k, const float *xb, size_t ldxb, size_t kn,
                   float *y, size_t ldy, const int R, const int T, int accumulate,
                   const int track_nan, const int sh, const float *fin, m_pf *pf)
{
    __m512 acc[2][M_T1MAX], acb[2][M_T1MAX];
    const int split = T <= 4;
    const uint8_t *pp = pf->p, *pe = pf->end;
    const size_t ahead = pf->ahead;
    __m512i nanv[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = acb[r][t] = _mm512_setzero_ps();
    for (size_t t0 = 0; t0 < kn; t0 += 64) {
        __m512 wv[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const uint8_t *w = W + (size_t)r * k + t0;
            if (ahead) _mm_prefetch((const char *)(w + ahead), _MM_HINT_T0);
            else if (pp < pe) { _mm_prefetch((const char *)pp, _MM_HINT_T1); pp += 64; }
            if (sh) fp8sh_decode64(_mm512_loadu_si512(w), wv[r], &nanv[r], track_nan);
            else    fp8_decode64(_mm512_loadu_si512(w), wv[r], &nanv[r], track_nan);
        }
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const float *xc = xb + (size_t)t * ldxb + t0;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512 xv = _mm512_load_ps(xc + 16 * j);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    if (split && (j & 1)) acb[r][t] = _mm512_fmadd_ps(wv[r][j], xv, acb[r][t]);
                    else                  acc[r][t] = _mm512_fmadd_ps(wv[r][j], xv, acc[r][t]);
                }
            }
        }
    }
    if (split)
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_add_ps(acc[r][t], acb[r][t]);
    pf->p = pp;
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        float s[M_T1MAX];
        if (T >= 8) _mm256_storeu_ps(s, dsattn_hsum8(acc[r]));
        for (int t = T >= 8 ? 8 : 0; t < T; t++) s[t] = hsum(acc[r][t]);
        const int nan = track_nan && _mm512_cmpeq_epi8_mask(nanv[r], _mm512_set1_epi8(-1)) != 0;
        for (int t = 0; t < T; t++) {
            const float v = nan ? __builtin_nanf("") : s[t] * fin[t];
            float *o = y + (size_t)t * ldy + r;
            *o = accumulate ? *o + v : v;
        }
    }
}

/* rows [0, nr) of one scale row, one slab: pairs of rows for up to 8
 * tokens, single rows past 8 */
AI void fp8_pass_m(const uint8_t *W, size_t k, const float *xb, size_t ldxb, size_t kn,
                   float *y, size_t ldy, size_t nr, const int T, int accumulate,
                   const int track_nan, const int sh, const float *fin, m_pf *pf)
{
    size_t r = 0;
    if (T <= 8)
        for (; r + 2 <= nr; r += 2)
            fp8_rows_m(W + r * k, k, xb, ldxb, kn, y + r, ldy, 2, T, accumulate, track_nan, sh,
                       fin, pf);
    for (; r < nr; r++)
        fp8_rows_m(W + r * k, k, xb, ldxb, kn, y + r, ldy, 1, T, accumulate, track_nan, sh, fin,
                   pf);
}

/* one scale row's rows [0, nr) and one slab for T (<= M_T1MAX) tokens, the
 * token count made a constant (accumulators in registers) */
static void fp8_pass_tokens(const uint8_t *w, size_t k, const float *xb, size_t kc, size_t kn,
                            float *yo, size_t ldy, size_t nr, size_t T, int acc, int nan, int s1,
                            const float *fin, m_pf *pf)
{
    switch (T) {
#define M_CASE(n) case n: if (s1) fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, n, acc, nan, 1, fin, pf); \
                          else fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, n, acc, nan, 0, fin, pf); \
                          break;
    M_CASE(10) M_CASE(9) M_CASE(8) M_CASE(7) M_CASE(6) M_CASE(5) M_CASE(4) M_CASE(3) M_CASE(2)
#undef M_CASE
    default: if (s1) fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, 1, acc, nan, 1, fin, pf);
             else fp8_pass_m(w, k, xb, kc, kn, yo, ldy, nr, 1, acc, nan, 0, fin, pf);
             break;
    }
}

/* sh: the exponent-shift decode where every token of the pass takes it
 * (x and x * scale finite), else the fp16 decode for the pass.  Each
 * token's slab is prepared for it once (fp8sh_prep_x) and scaled per scale
 * row. */
AI void gemv_fp8_m_impl(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
                        const float *x, size_t ldx, size_t m, float *y, size_t ldy,
                        size_t rows, size_t k, int finite, const int sh)
{
    if (bs == 0 || m == 0) return;
    if (k == 0 || k % 64 || bs % 32) {
        for (size_t t = 0; t < m; t++)
            gemv_fp8_impl(W, scale, bs, ldsc, x + t * ldx, y + t * ldy, rows, k, !finite, sh);
        return;
    }
    const int shd = sh && fp8sh_mxcsr_ok();
    float xb[M_XB] A64;                 /* the pass's tokens x one slab, scaled */
    float xp[M_XP] A64, bm[M_XP / 32], sg[M_XB / 32];
    for (size_t g0 = 0; g0 < m; g0 += M_TMAX) {
        const size_t T = m - g0 < M_TMAX ? m - g0 : M_TMAX;
        const size_t cap = (T <= 3 ? M_XL1 : M_XB) / T / 64 * 64, ns = (k + cap - 1) / cap;
        const size_t kc = (k / 64 + ns - 1) / ns * 64;
        const int whole = T * k <= M_XP;
        int xall = shd;
        if (whole)
            for (size_t t = 0; t < T && xall; t++)
                xall = fp8sh_prep_x(x + (g0 + t) * ldx, k, xp + t * k, bm + t * (k / 32));
        /* blocks where x is prepared once for the pass; else one block of
         * all rows (x prepared per slab), each row's line M_PF_ROWS rows
         * ahead prefetched */
        const size_t rbk = !whole ? rows : (M_BLK / k < 2 ? 2 : M_BLK / k) & ~(size_t)1;
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
                    float fin[M_TMAX], pk[M_TMAX];  /* arranged, times this row's scales */
                    int s1 = xfin;
                    for (size_t t = 0; t < T && s1; t++)
                        s1 = dsattn_fp8sh_plan(bm + (t * ldp + p0) / 32, kn / 32, scale + sr * ldsc,
                                               bs, k0, sg, pk + t, fin + t) &&
                             (fp8sh_scale_x(xp + t * ldp + p0, sg, kn, pk[t], xb + t * kc), 1);
                    if (!s1)
                        for (size_t t = 0; t < T; t++) {
                            fp8_arrange_x(x + (g0 + t) * ldx + k0, scale + sr * ldsc, bs, k0, kn,
                                          xb + t * kc);
                            fin[t] = 256.0f;
                        }
                    const uint8_t *w = W + rb0 * k + k0;
                    float *yo = y + g0 * ldy + rb0;
                    const size_t nr = rb1 - rb0;
                    const int acc = k0 > 0, nan = !finite;
                    if (T > 8 && (sh || T > M_T1MAX)) {
                        /* two passes of 2 rows x 8 and 2 rows x the rest over the
                         * scale row's rows, which the second pass finds in L1/L2:
                         * one row x 16 tokens loads an x vector per FMA and spills
                         * accumulators (1 thread, 16 tokens: AMD Zen 4, 128 x 1280
                         * in L2, 1.35x faster; Intel Ice Lake, 5120 x 8192 and
                         * 32768 x 1280 from DRAM, 1.1-1.2x) */
                        fp8_pass_tokens(w, k, xb, kc, kn, yo, ldy, nr, 8, acc, nan, s1, fin, &pf);
                        fp8_pass_tokens(w, k, xb + 8 * kc, kc, kn, yo + 8 * ldy, ldy, nr, T - 8,
                                        acc, nan, s1, fin + 8, &pf);
                    } else {
                        fp8_pass_tokens(w, k, xb, kc, kn, yo, ldy, nr, T, acc, nan, s1, fin, &pf);
                    }
                    rb0 = rb1;
                }
            }
        }
    }
}

static void gemv_fp8_m_avx512(const uint8_t *W, const float *scale, size_t bs, size_t ldsc,
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
/* A 64-byte load is 16 dwords of 8 nibbles each; dword lane i holds
 * elements 8i..8i+7 of a 128-element chunk.  Shifting by 4j brings element
 * 8i+j to the bottom of every lane, so 7 shifts + 8 vpermps decode the
 * chunk as X_j[i] = w[8i+j].  x is transposed the same way once per call
 * (3 rounds of vpermt2ps per 128 elements).  Lanes 4b..4b+3 hold block b's
 * 32 elements in every X_j, so one scale vector [s0 x4, s1 x4, s2 x4, s3 x4]
 * multiplies the chunk's 8-term partial sums once. */

static void fp4_arrange_x(const float *x, size_t kn, float *xb)
{
    const __m512i i1lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i i1hi = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
    const __m512i i2a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i2b = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i i3a = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i i3b = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (size_t t0 = 0; t0 < kn; t0 += 128) {
        __m512 a[8], s1[8], s2[8];
        for (int m = 0; m < 8; m++) {
            size_t off = t0 + 16 * (size_t)m;
            a[m] = _mm512_maskz_loadu_ps(mask16(off < kn ? kn - off : 0), x + off);
        }
        /* s1[2p]: cols 0..3 of rows 4p..4p+3; s1[2p+1]: cols 4..7 */
        for (int p = 0; p < 4; p++) {
            s1[2 * p]     = _mm512_permutex2var_ps(a[2 * p], i1lo, a[2 * p + 1]);
            s1[2 * p + 1] = _mm512_permutex2var_ps(a[2 * p], i1hi, a[2 * p + 1]);
        }
        /* s2[4q + 2h + c]: cols 4h+2c, 4h+2c+1 of rows 8q..8q+7 */
        for (int q = 0; q < 2; q++)
            for (int h = 0; h < 2; h++) {
                __m512 u = s1[4 * q + h], v = s1[4 * q + 2 + h];
                s2[4 * q + 2 * h]     = _mm512_permutex2var_ps(u, i2a, v);
                s2[4 * q + 2 * h + 1] = _mm512_permutex2var_ps(u, i2b, v);
            }
        float *o = xb + t0;
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 2; c++) {
                __m512 u = s2[2 * h + c], v = s2[4 + 2 * h + c];
                int col = 4 * h + 2 * c;
                _mm512_store_ps(o + 16 * col,       _mm512_permutex2var_ps(u, i3a, v));
                _mm512_store_ps(o + 16 * (col + 1), _mm512_permutex2var_ps(u, i3b, v));
            }
    }
}

#define FP4_STEP(J, X)                                                        \
    do {                                                                      \
        __m512 xj = _mm512_load_ps(xc + 16 * (J));                            \
        _Pragma("GCC unroll 4")                                               \
        for (int r = 0; r < R; r++)                                           \
            blk[r] = _mm512_fmadd_ps(                                         \
                _mm512_permutexvar_ps(_mm512_srli_epi32(v[r], 4 * (J)), tab), \
                xj, blk[r]);                                                  \
    } while (0)

/* sb: R rows x (XCH/32) scale floats of this pass, zero past kn/32. */
AI void fp4_rows(const uint8_t *W, size_t rs, const float *xb, size_t kn,
                 const float *sb, float *y, const int R, int accumulate)
{
    const __m512 tab = _mm512_load_ps(e2m1_tab);
    const __m512i is = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4], blk[4];
    __m512i v[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (size_t t0 = 0; t0 < kn; t0 += 128) {
        const float *xc = xb + t0;
        /* bytes left in this chunk: 16, 32, 48 or 64 */
        size_t nb = (kn - t0 >= 128 ? 128 : kn - t0) / 2;
        __mmask16 m = mask16(nb / 4);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(W + (2 * R + r) * rs + t0 / 2), _MM_HINT_T1);
            v[r] = _mm512_maskz_loadu_epi32(m, W + r * rs + t0 / 2);
            blk[r] = _mm512_mul_ps(_mm512_permutexvar_ps(v[r], tab), _mm512_load_ps(xc));
        }
        FP4_STEP(1, x1); FP4_STEP(2, x2); FP4_STEP(3, x3);
        FP4_STEP(4, x4); FP4_STEP(5, x5); FP4_STEP(6, x6); FP4_STEP(7, x7);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 s4 = _mm512_castps128_ps512(_mm_loadu_ps(sb + r * (XCH / 32) + t0 / 32));
            acc[r] = _mm512_fmadd_ps(blk[r], _mm512_permutexvar_ps(is, s4), acc[r]);
        }
    }
    float s[4];
    if (R == 4) _mm_storeu_ps(s, hsum4(acc[0], acc[1], acc[2], acc[3]));
    else for (int r = 0; r < R; r++) s[r] = hsum(acc[r]);
    put_sums(y, s, R, accumulate);
}

static void gemv_fp4_avx512(const uint8_t *W, const uint8_t *scale,
                            const float *x, float *y, size_t rows, size_t k)
{
    float xb[XCH] A64;
    float sb[4 * (XCH / 32) + 16] A64;
    const size_t rs = k / 2, ss = k / 32;
    if (k == 0) memset(y, 0, rows * sizeof(float));
    for (size_t k0 = 0; k0 < k; k0 += XCH) {
        size_t kn = k - k0 < XCH ? k - k0 : XCH;
        int acc = k0 > 0;
        fp4_arrange_x(x + k0, kn, xb);
        for (size_t r = 0; r < rows; r += 4) {
            int R = rows - r >= 4 ? 4 : (int)(rows - r);
            for (int q = 0; q < R; q++) {
                const uint8_t *sc = scale + (r + (size_t)q) * ss + k0 / 32;
                float *o = sb + (size_t)q * (XCH / 32);
                /* zero the tail up to a multiple of 4 blocks: padding
                 * lanes multiply exact zeros, never garbage */
                for (size_t b = 0; b < kn / 32 + 4; b += 16) {
                    size_t n = b < kn / 32 ? kn / 32 - b : 0;
                    ue8m0_to_f32(sc + b, n, o + b);
                }
            }
            const uint8_t *w = W + r * rs + k0 / 2;
            switch (R) {
            case 4: fp4_rows(w, rs, xb, kn, sb, y + r, 4, acc); break;
            case 3: fp4_rows(w, rs, xb, kn, sb, y + r, 3, acc); break;
            case 2: fp4_rows(w, rs, xb, kn, sb, y + r, 2, acc); break;
            default: fp4_rows(w, rs, xb, kn, sb, y + r, 1, acc); break;
            }
        }
    }
}

/* ==== dot / mdot / maxpy (fp32) ========================================= */

static float dot_f32_avx512(const float *a, const float *b, size_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return hsum(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* G heads (G = 16, 8, 4 or 1) against v; out gets (or adds) the sums.
 * 16 and 8 heads give 16/8 independent FMA chains; 4 heads and 1 head
 * unroll by two / four to hide the FMA latency.  Head rows are addressed
 * as base[g/4] + {0, 1, 2, 3} * ldq so the loop needs G/4 + 2 pointer
 * registers, not G (16 row pointers spill and cost a reload per FMA). */
AI void mdot_group(const float *q, size_t ldq, const float *v, size_t n, float *out,
                   const int G, int accumulate)
{
    __m512 a[16], b[16];
    const int U = G >= 8 ? 1 : (G == 4 ? 2 : 4);     /* chains per head */
    const ptrdiff_t L = (ptrdiff_t)ldq * 4, off[4] = { 0, L, 2 * L, 3 * L };
    const char *base[4];
    for (int j = 0; j < 4; j++) base[j] = (const char *)(q + 4 * (size_t)j * ldq);
    for (int g = 0; g < G * U; g++) a[g] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 * (size_t)U <= n; i += 16 * (size_t)U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m512 w = _mm512_loadu_ps(v + i + 16 * u);
            const ptrdiff_t o = (ptrdiff_t)(i + 16 * (size_t)u) * 4;
#pragma GCC unroll 16
            for (int g = 0; g < G; g++) {
                const float *qp = (const float *)(base[g / 4] + o + off[g % 4]);
                a[g * U + u] = _mm512_fmadd_ps(_mm512_loadu_ps(qp), w, a[g * U + u]);
            }
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 w = _mm512_maskz_loadu_ps(m, v + i);
#pragma GCC unroll 16
        for (int g = 0; g < G; g++)
            a[g * U] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * ldq + i), w, a[g * U]);
    }
    for (int g = 0; g < G; g++) {
        b[g] = a[g * U];
        for (int u = 1; u < U; u++) b[g] = _mm512_add_ps(b[g], a[g * U + u]);
    }
    float s[16];
    if (G >= 8) {
        for (int g0 = 0; g0 < G; g0 += 8) _mm256_storeu_ps(s + g0, dsattn_hsum8(b + g0));
    } else if (G == 4) {
        _mm_storeu_ps(s, hsum4(b[0], b[1], b[2], b[3]));
    } else {
        for (int g = 0; g < G; g++) s[g] = hsum(b[g]);
    }
    put_sums(out, s, G, accumulate);
}

static void mdot_core(const float *q, size_t ldq, size_t nh, const float *v, size_t n,
                      float *out, int accumulate)
{
    size_t h = 0;
    for (; h + 16 <= nh; h += 16) mdot_group(q + h * ldq, ldq, v, n, out + h, 16, accumulate);
    if (h + 8 <= nh) { mdot_group(q + h * ldq, ldq, v, n, out + h, 8, accumulate); h += 8; }
    if (h + 4 <= nh) { mdot_group(q + h * ldq, ldq, v, n, out + h, 4, accumulate); h += 4; }
    for (; h < nh; h++) mdot_group(q + h * ldq, ldq, v, n, out + h, 1, accumulate);
}

static void mdot_f32_avx512(const float *q, size_t ldq, size_t nh, const float *v,
                            size_t n, float *out)
{
    mdot_core(q, ldq, nh, v, n, out, 0);
}

static void maxpy_f32_avx512(const float *p, size_t nh, const float *v, size_t n,
                             float *acc, size_t ldacc)
{
    /* v is loaded once per 64 elements and reused by every head */
    for (size_t i = 0; i < n; i += 64) {
        size_t left = n - i;
        __mmask16 m0 = mask16(left), m1 = mask16(left > 16 ? left - 16 : 0);
        __mmask16 m2 = mask16(left > 32 ? left - 32 : 0), m3 = mask16(left > 48 ? left - 48 : 0);
        __m512 v0 = _mm512_maskz_loadu_ps(m0, v + i), v1 = _mm512_maskz_loadu_ps(m1, v + i + 16);
        __m512 v2 = _mm512_maskz_loadu_ps(m2, v + i + 32), v3 = _mm512_maskz_loadu_ps(m3, v + i + 48);
        for (size_t h = 0; h < nh; h++) {
            float *a = acc + h * ldacc + i;
            __m512 ph = _mm512_set1_ps(p[h]);
            _mm512_mask_storeu_ps(a, m0, _mm512_fmadd_ps(ph, v0, _mm512_maskz_loadu_ps(m0, a)));
            _mm512_mask_storeu_ps(a + 16, m1, _mm512_fmadd_ps(ph, v1, _mm512_maskz_loadu_ps(m1, a + 16)));
            _mm512_mask_storeu_ps(a + 32, m2, _mm512_fmadd_ps(ph, v2, _mm512_maskz_loadu_ps(m2, a + 32)));
            _mm512_mask_storeu_ps(a + 48, m3, _mm512_fmadd_ps(ph, v3, _mm512_maskz_loadu_ps(m3, a + 48)));
        }
    }
}

/* ==== Packed cache rows ================================================= */
/* Natural-order FP4 decode of 32 elements (16 payload bytes): the 16 bytes
 * are broadcast to all four 128-bit lanes; one vpshufb puts byte i/2 in the
 * low byte and byte 8+i/2 in the third byte of dword i; a variable shift by
 * 0/4 brings the right nibble of both to bits 0..3 / 16..19.  Two vpermps
 * then give elements 0..15 and 16..31.  `half` decodes only 8 bytes. */

AI void fp4_unit(const uint8_t *p, int half, __m512 *wa, __m512 *wb)
{
    const __m512 tab = _mm512_load_ps(e2m1_tab);
    /* dword i (i = 0..15): byte0 = i/2, byte2 = 8 + i/2, bytes 1,3 zeroed */
    const __m512i sh = _mm512_setr_epi32(
        (int)0x80088000, (int)0x80088000, (int)0x80098001, (int)0x80098001,
        (int)0x800a8002, (int)0x800a8002, (int)0x800b8003, (int)0x800b8003,
        (int)0x800c8004, (int)0x800c8004, (int)0x800d8005, (int)0x800d8005,
        (int)0x800e8006, (int)0x800e8006, (int)0x800f8007, (int)0x800f8007);
    const __m512i cnt = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    __m128i b = half ? _mm_loadl_epi64((const __m128i *)p) : _mm_loadu_si128((const __m128i *)p);
    __m512i t = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(b), sh);
    t = _mm512_srlv_epi32(t, cnt);
    *wa = _mm512_permutexvar_ps(t, tab);
    *wb = _mm512_permutexvar_ps(_mm512_srli_epi32(t, 16), tab);
}

/* 32 E4M3 codes -> 2 x 16 exact floats in natural order (NaN codes too). */
AI void fp8_unit(const uint8_t *p, __m512 *f0, __m512 *f1)
{
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    __m512i h = e4m3w_to_h(w);
    __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7f)),
                                            _mm512_set1_epi16(0x7f));
    const __m512 k256 = _mm512_set1_ps(256.0f), qnan = _mm512_set1_ps(__builtin_nanf(""));
    *f0 = _mm512_mask_mov_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), k256),
                             (__mmask16)nan, qnan);
    *f1 = _mm512_mask_mov_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), k256),
                             (__mmask16)(nan >> 16), qnan);
}

/* Row formats of the fused kernels (compile-time constants after inlining). */

/* Scales of elements [i0, i0 + n) (n <= 512) as floats: one per 16
 * elements for FP4/E4M3, one per 32 for the UE8M0 formats. */
AI void row_scales(const int fmt, const uint8_t *row, size_t d, size_t i0, size_t n,
                   float *sf)
{
    if (fmt == DSATTN_ROW_FP4E4M3) {
        e4m3_to_f32(row + d / 2 + i0 / 16, n / 16, sf);
    } else {
        const uint8_t *sc = row + (fmt == DSATTN_ROW_FP4UE8M0 ? d / 2 : d) + i0 / 32;
        ue8m0_to_f32(sc, n / 32, sf);
    }
}

/* Elements [i, i+32) (or [i, i+16) if half) of a row, i - i0 < 512,
 * multiplied by their scale: bit-exactly numfmt's unpack. */
AI void row_unit(const int fmt, const uint8_t *row, size_t i, size_t i0,
                 const float *sf, int half, __m512 *wa, __m512 *wb)
{
    size_t j = i - i0;
    if (fmt == DSATTN_ROW_FP8UE8M0) {
        fp8_unit(row + i, wa, wb);
        __m512 s = _mm512_set1_ps(sf[j / 32]);
        *wa = _mm512_mul_ps(*wa, s);
        *wb = _mm512_mul_ps(*wb, s);
    } else if (fmt == DSATTN_ROW_FP4UE8M0) {
        fp4_unit(row + i / 2, 0, wa, wb);
        __m512 s = _mm512_set1_ps(sf[j / 32]);
        *wa = _mm512_mul_ps(*wa, s);
        *wb = _mm512_mul_ps(*wb, s);
    } else {
        fp4_unit(row + i / 2, half, wa, wb);
        *wa = _mm512_mul_ps(*wa, _mm512_set1_ps(sf[j / 16]));
        if (!half) *wb = _mm512_mul_ps(*wb, _mm512_set1_ps(sf[j / 16 + 1]));
    }
}

/* Dequantize elements [i0, i0 + n) of a row into out[0..n). */
AI void dequant_range(const int fmt, const uint8_t *row, size_t d, size_t i0, size_t n,
                      float *out)
{
    float sf[32] A64;
    for (size_t c0 = i0; c0 < i0 + n; c0 += 512) {
        size_t cn = i0 + n - c0 < 512 ? i0 + n - c0 : 512;
        row_scales(fmt, row, d, c0, cn, sf);
        size_t u = 0;
        for (; u + 32 <= cn; u += 32) {
            __m512 wa, wb;
            row_unit(fmt, row, c0 + u, c0, sf, 0, &wa, &wb);
            _mm512_storeu_ps(out + (c0 - i0) + u, wa);
            _mm512_storeu_ps(out + (c0 - i0) + u + 16, wb);
        }
        if (u < cn) {                    /* 16 left: FP4/E4M3 only */
            __m512 wa, wb;
            row_unit(fmt, row, c0 + u, c0, sf, 1, &wa, &wb);
            _mm512_storeu_ps(out + (c0 - i0) + u, wa);
        }
    }
}

/* ==== Fused row kernels ================================================= */
/* Few heads (<= 8): decode 32 elements into two registers and feed every
 * head straight away, two accumulators per head.  More heads: decode up to
 * RCH elements into an L1 buffer once and run the 16/8/4-head mdot core
 * over it, so the decode cost is shared by all heads. */

AI void mdot_direct(const int fmt, const float *q, size_t ldq, const uint8_t *row,
                    size_t d, float *out, const int NH)
{
    __m512 aa[8], ab[8];
    float sf[32] A64;
    /* head rows as base[h/4] + {0,1,2,3} * ldq (see mdot_group) */
    const ptrdiff_t L = (ptrdiff_t)ldq * 4, off[4] = { 0, L, 2 * L, 3 * L };
    const char *base[2] = { (const char *)q, (const char *)(q + 4 * ldq) };
    for (int h = 0; h < NH; h++) aa[h] = ab[h] = _mm512_setzero_ps();
    for (size_t c0 = 0; c0 < d; c0 += 512) {
        size_t cn = d - c0 < 512 ? d - c0 : 512;
        row_scales(fmt, row, d, c0, cn, sf);
        size_t u = 0;
        for (; u + 32 <= cn; u += 32) {
            __m512 wa, wb;
            row_unit(fmt, row, c0 + u, c0, sf, 0, &wa, &wb);
            const ptrdiff_t o = (ptrdiff_t)(c0 + u) * 4;
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                const float *qp = (const float *)(base[h / 4] + o + off[h % 4]);
                aa[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qp), wa, aa[h]);
                ab[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qp + 16), wb, ab[h]);
            }
        }
        if (u < cn) {
            __m512 wa, wb;
            row_unit(fmt, row, c0 + u, c0, sf, 1, &wa, &wb);
            const float *qi = q + c0 + u;
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++)
                aa[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qi + h * ldq), wa, aa[h]);
        }
    }
    for (int h = 0; h < NH; h++) aa[h] = _mm512_add_ps(aa[h], ab[h]);
    if (NH == 8) {
        _mm256_storeu_ps(out, dsattn_hsum8(aa));
    } else if (NH >= 4) {
        _mm_storeu_ps(out, hsum4(aa[0], aa[1], aa[2], aa[3]));
        for (int h = 4; h < NH; h++) out[h] = hsum(aa[h]);
    } else {
        for (int h = 0; h < NH; h++) out[h] = hsum(aa[h]);
    }
}

AI void mdot_row(const int fmt, const float *q, size_t ldq, size_t nh,
                 const uint8_t *row, size_t d, float *out)
{
    switch (nh) {
    case 0: return;
    case 1: mdot_direct(fmt, q, ldq, row, d, out, 1); return;
    case 2: mdot_direct(fmt, q, ldq, row, d, out, 2); return;
    case 3: mdot_direct(fmt, q, ldq, row, d, out, 3); return;
    case 4: mdot_direct(fmt, q, ldq, row, d, out, 4); return;
    case 5: mdot_direct(fmt, q, ldq, row, d, out, 5); return;
    case 6: mdot_direct(fmt, q, ldq, row, d, out, 6); return;
    case 7: mdot_direct(fmt, q, ldq, row, d, out, 7); return;
    case 8: mdot_direct(fmt, q, ldq, row, d, out, 8); return;
    default: break;
    }
    float buf[RCH] A64;
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
    float sf[32] A64;
    for (size_t c0 = 0; c0 < d; c0 += 512) {
        size_t cn = d - c0 < 512 ? d - c0 : 512;
        row_scales(fmt, row, d, c0, cn, sf);
        for (size_t u = 0; u < cn; u += 32) {
            int half = cn - u < 32;
            __m512 wa, wb;
            row_unit(fmt, row, c0 + u, c0, sf, half, &wa, &wb);
            for (size_t h = 0; h < nh; h++) {
                float *a = acc + h * ldacc + c0 + u;
                __m512 ph = _mm512_set1_ps(p[h]);
                _mm512_storeu_ps(a, _mm512_fmadd_ps(ph, wa, _mm512_loadu_ps(a)));
                if (!half)
                    _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(ph, wb, _mm512_loadu_ps(a + 16)));
            }
        }
    }
}

#include "kernels_rows_tmpl.h"

/* ---- many rows per call ------------------------------------------------
 * Up to MR rows are decoded into L1 buffers (MR x MRCH floats = 16 KB),
 * then heads go two at a time over all of them: per 16 elements, 2 q loads
 * and MR buffer loads feed 2*MR FMAs (16 independent chains at MR = 8).
 * Each q vector fetched from L2 now serves 8 rows instead of 1. */
#define MR 8
#define MRCH 512

AI void rows_group(const float *q, size_t ldq, const float *buf, size_t n, float *out,
                   size_t ldo, const int R, const int G, int accumulate)
{
    __m512 acc[2 * MR];
    for (int j = 0; j < G * R; j++) acc[j] = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __m512 qa = _mm512_loadu_ps(q + i);
        __m512 qb = G == 2 ? _mm512_loadu_ps(q + ldq + i) : qa;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_load_ps(buf + r * MRCH + i);
            acc[r] = _mm512_fmadd_ps(qa, w, acc[r]);
            if (G == 2) acc[R + r] = _mm512_fmadd_ps(qb, w, acc[R + r]);
        }
    }
    float s[2 * MR];
    if (G * R == 16) {
        _mm256_storeu_ps(s, dsattn_hsum8(acc));
        _mm256_storeu_ps(s + 8, dsattn_hsum8(acc + 8));
    } else if (G * R == 8) {
        _mm256_storeu_ps(s, dsattn_hsum8(acc));
    } else {
        for (int j = 0; j < G * R; j++) s[j] = hsum(acc[j]);
    }
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * ldo + g;
            *o = accumulate ? *o + s[g * R + r] : s[g * R + r];
        }
}

AI void rows_heads(const float *q, size_t ldq, size_t nh, const float *buf, size_t n,
                   float *out, size_t ldo, const int R, int accumulate)
{
    size_t h = 0;
    for (; h + 2 <= nh; h += 2) rows_group(q + h * ldq, ldq, buf, n, out + h, ldo, R, 2, accumulate);
    if (h < nh) rows_group(q + h * ldq, ldq, buf, n, out + h, ldo, R, 1, accumulate);
}

static void mdot_fp4e4m3_rows_avx512(const float *q, size_t ldq, size_t nh,
                                     const uint8_t *const *rows, size_t nr, size_t d,
                                     float *out, size_t ldo)
{
    float buf[MR * MRCH] A64;
    if (d == 0)
        for (size_t r = 0; r < nr; r++) memset(out + r * ldo, 0, nh * sizeof(float));
    for (size_t r0 = 0; r0 < nr; r0 += MR) {
        int R = nr - r0 >= MR ? MR : (int)(nr - r0);
        for (size_t d0 = 0; d0 < d; d0 += MRCH) {
            size_t n = d - d0 < MRCH ? d - d0 : MRCH;
            int acc = d0 > 0;
            for (int r = 0; r < R; r++)
                dequant_range(DSATTN_ROW_FP4E4M3, rows[r0 + (size_t)r], d, d0, n, buf + r * MRCH);
            const float *qd = q + d0;
            float *o = out + r0 * ldo;
            switch (R) {
            case 8: rows_heads(qd, ldq, nh, buf, n, o, ldo, 8, acc); break;
            case 7: rows_heads(qd, ldq, nh, buf, n, o, ldo, 7, acc); break;
            case 6: rows_heads(qd, ldq, nh, buf, n, o, ldo, 6, acc); break;
            case 5: rows_heads(qd, ldq, nh, buf, n, o, ldo, 5, acc); break;
            case 4: rows_heads(qd, ldq, nh, buf, n, o, ldo, 4, acc); break;
            case 3: rows_heads(qd, ldq, nh, buf, n, o, ldo, 3, acc); break;
            case 2: rows_heads(qd, ldq, nh, buf, n, o, ldo, 2, acc); break;
            default: rows_heads(qd, ldq, nh, buf, n, o, ldo, 1, acc); break;
            }
        }
    }
}

/* P.V over a block of rows: per head, 8 independent accumulator vectors
 * (128 elements) each take one FMA per row, so the FMA latency is hidden
 * and each acc element is loaded and stored once per MR rows. */
AI void pv_rows(const float *p, size_t ldp, size_t nh, const float *buf, size_t n,
                float *acc, size_t ldacc, const int R)
{
    for (size_t h = 0; h < nh; h++) {
        __m512 ph[MR];
        for (int r = 0; r < R; r++) ph[r] = _mm512_set1_ps(p[h * ldp + (size_t)r]);
        float *a = acc + h * ldacc;
        size_t i = 0;
        for (; i + 128 <= n; i += 128) {
            __m512 t[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) t[u] = _mm512_loadu_ps(a + i + 16 * u);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    t[u] = _mm512_fmadd_ps(ph[r], _mm512_load_ps(buf + r * MRCH + i + 16 * u), t[u]);
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) _mm512_storeu_ps(a + i + 16 * u, t[u]);
        }
        for (; i < n; i += 16) {         /* n is a multiple of 16 */
            __m512 t = _mm512_loadu_ps(a + i);
            for (int r = 0; r < R; r++)
                t = _mm512_fmadd_ps(ph[r], _mm512_load_ps(buf + r * MRCH + i), t);
            _mm512_storeu_ps(a + i, t);
        }
    }
}

static void maxpy_fp4e4m3_rows_avx512(const float *p, size_t ldp, size_t nh,
                                      const uint8_t *const *rows, size_t nr, size_t d,
                                      float *acc, size_t ldacc)
{
    float buf[MR * MRCH] A64;
    for (size_t r0 = 0; r0 < nr; r0 += MR) {
        int R = nr - r0 >= MR ? MR : (int)(nr - r0);
        for (size_t d0 = 0; d0 < d; d0 += MRCH) {
            size_t n = d - d0 < MRCH ? d - d0 : MRCH;
            for (int r = 0; r < R; r++)
                dequant_range(DSATTN_ROW_FP4E4M3, rows[r0 + (size_t)r], d, d0, n, buf + r * MRCH);
            const float *pr = p + r0;
            float *a = acc + d0;
            switch (R) {
            case 8: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 8); break;
            case 7: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 7); break;
            case 6: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 6); break;
            case 5: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 5); break;
            case 4: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 4); break;
            case 3: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 3); break;
            case 2: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 2); break;
            default: pv_rows(pr, ldp, nh, buf, n, a, ldacc, 1); break;
            }
        }
    }
}

/* ==== bf16 rows: conversion and multi-head x multi-row dots ============= */

static void cvt_bf16_f32_avx512(const uint16_t *src, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(out + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

AI __m512 bf16x16_load(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

AI __m512 bf16x16_maskload(__mmask16 m, const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Sixteen horizontal sums at once: lane s of the result = sum of v[s]'s
 * lanes.  A transpose-and-add tree (31 shuffles, 15 adds) instead of 16
 * separate reductions (~128 shuffles and adds). */
/* no loops and no arrays of temporaries: GCC would keep those in memory */
#define RED_F4(a, b, i1, i2) _mm512_add_ps(_mm512_shuffle_f32x4((a), (b), i1), _mm512_shuffle_f32x4((a), (b), i2))
#define RED_PS(a, b, i1, i2) _mm512_add_ps(_mm512_shuffle_ps((a), (b), i1), _mm512_shuffle_ps((a), (b), i2))
AI __m512 reduce16_ps(const __m512 v[16])
{
    /* 256-bit halves: a_i = src 2i | 2i+1 */
    const __m512 a0 = RED_F4(v[0], v[1], 0x44, 0xEE), a1 = RED_F4(v[2], v[3], 0x44, 0xEE);
    const __m512 a2 = RED_F4(v[4], v[5], 0x44, 0xEE), a3 = RED_F4(v[6], v[7], 0x44, 0xEE);
    const __m512 a4 = RED_F4(v[8], v[9], 0x44, 0xEE), a5 = RED_F4(v[10], v[11], 0x44, 0xEE);
    const __m512 a6 = RED_F4(v[12], v[13], 0x44, 0xEE), a7 = RED_F4(v[14], v[15], 0x44, 0xEE);
    /* 128-bit lane L of b_i: src 4i + L */
    const __m512 b0 = RED_F4(a0, a1, 0x88, 0xDD), b1 = RED_F4(a2, a3, 0x88, 0xDD);
    const __m512 b2 = RED_F4(a4, a5, 0x88, 0xDD), b3 = RED_F4(a6, a7, 0x88, 0xDD);
    /* lane L of c_i: 2 x src 8i+L, 2 x 8i+4+L */
    const __m512 c0 = RED_PS(b0, b1, 0x44, 0xEE), c1 = RED_PS(b2, b3, 0x44, 0xEE);
    /* element 4L + e now holds source L + 4e: put source s at lane s */
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(perm, RED_PS(c0, c1, 0x88, 0xDD));
}
#undef RED_F4
#undef RED_PS

/* One register tile: HB heads x RB rows (HB * RB <= 16), accumulator
 * h*RB + r; the row chunk is decoded once and used by all HB heads. */
AI void mdot_bf16_tile(const float *q, size_t ldq, const uint16_t *rows, size_t ldr,
                       size_t k, float *out, size_t ldo, const int HB, const int RB)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 w[16];
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) w[r] = bf16x16_load(rows + r * ldr + i);
#pragma GCC unroll 16
        for (int h = 0; h < HB; h++) {
            const __m512 qv = _mm512_loadu_ps(q + h * ldq + i);
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) acc[h * RB + r] = _mm512_fmadd_ps(qv, w[r], acc[h * RB + r]);
        }
    }
    if (i < k) {
        const __mmask16 m = (__mmask16)((1u << (k - i)) - 1u);
        __m512 w[16];
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) w[r] = bf16x16_maskload(m, rows + r * ldr + i);
#pragma GCC unroll 16
        for (int h = 0; h < HB; h++) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * ldq + i);
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) acc[h * RB + r] = _mm512_fmadd_ps(qv, w[r], acc[h * RB + r]);
        }
    }
    float s[16];
    _mm512_storeu_ps(s, reduce16_ps(acc));
#pragma GCC unroll 16
    for (int h = 0; h < HB; h++)
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) out[r * ldo + h] = s[h * RB + r];
}

/* The GQA tile (8 heads x 2 rows) written with named accumulators: GCC
 * keeps the generic tile's acc[16] array in memory (its unroll pragmas run
 * after scalar replacement), which measured ~2x slower in cache. */
AI void mdot_bf16_tile82(const float *q, size_t ldq, const uint16_t *rows, size_t ldr,
                         size_t k, float *out, size_t ldo)
{
#define Z _mm512_setzero_ps()
    __m512 a0 = Z, a1 = Z, a2 = Z, a3 = Z, a4 = Z, a5 = Z, a6 = Z, a7 = Z;
    __m512 b0 = Z, b1 = Z, b2 = Z, b3 = Z, b4 = Z, b5 = Z, b6 = Z, b7 = Z;
#undef Z
    const uint16_t *r0 = rows, *r1 = rows + ldr;
    size_t i = 0;
#define STEP(LOADW, LOADQ)                                                     \
    do {                                                                       \
        const __m512 w0 = LOADW(r0 + i), w1 = LOADW(r1 + i);                   \
        __m512 qv;                                                             \
        qv = LOADQ(q + i);           a0 = _mm512_fmadd_ps(qv, w0, a0); b0 = _mm512_fmadd_ps(qv, w1, b0); \
        qv = LOADQ(q + ldq + i);     a1 = _mm512_fmadd_ps(qv, w0, a1); b1 = _mm512_fmadd_ps(qv, w1, b1); \
        qv = LOADQ(q + 2 * ldq + i); a2 = _mm512_fmadd_ps(qv, w0, a2); b2 = _mm512_fmadd_ps(qv, w1, b2); \
        qv = LOADQ(q + 3 * ldq + i); a3 = _mm512_fmadd_ps(qv, w0, a3); b3 = _mm512_fmadd_ps(qv, w1, b3); \
        qv = LOADQ(q + 4 * ldq + i); a4 = _mm512_fmadd_ps(qv, w0, a4); b4 = _mm512_fmadd_ps(qv, w1, b4); \
        qv = LOADQ(q + 5 * ldq + i); a5 = _mm512_fmadd_ps(qv, w0, a5); b5 = _mm512_fmadd_ps(qv, w1, b5); \
        qv = LOADQ(q + 6 * ldq + i); a6 = _mm512_fmadd_ps(qv, w0, a6); b6 = _mm512_fmadd_ps(qv, w1, b6); \
        qv = LOADQ(q + 7 * ldq + i); a7 = _mm512_fmadd_ps(qv, w0, a7); b7 = _mm512_fmadd_ps(qv, w1, b7); \
    } while (0)
    for (; i + 16 <= k; i += 16) STEP(bf16x16_load, _mm512_loadu_ps);
    if (i < k) {
        const __mmask16 m = (__mmask16)((1u << (k - i)) - 1u);
#define LW(p) bf16x16_maskload(m, (p))
#define LQ(p) _mm512_maskz_loadu_ps(m, (p))
        STEP(LW, LQ);
#undef LW
#undef LQ
    }
#undef STEP
    /* accumulator order h*2 + r, as the generic tile */
    const __m512 v[16] = { a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7 };
    const __m512 s = reduce16_ps(v);
    /* lanes 0,2,..,14 -> row 0's heads; 1,3,..,15 -> row 1's */
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m512 t = _mm512_permutexvar_ps(ev, s);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(t));
    _mm256_storeu_ps(out + ldo, _mm512_extractf32x8_ps(t, 1));
}

/* Heads in groups of HB, rows in tiles of RB, then single-row tiles.
 * The rows are streamed from memory (a decode cache), and a tile reads RB
 * rows interleaved, which the hardware streamer follows poorly (the same
 * trouble as the GEMVs above): every tile prefetches, into L2, the rows of
 * the tile about 4 KB further on.  Prefetches never fault, so running past
 * the last row (into the next block of the same cache, usually) is safe. */
AI void mdot_bf16_heads(const float *q, size_t ldq, const uint16_t *rows, size_t ldr,
                        size_t nr, size_t k, float *out, size_t ldo, const int HB, const int RB)
{
    const size_t rb = 2 * ldr, far = 4096 / (rb ? rb : 1);
    const size_t ahead = far > (size_t)RB ? far : (size_t)RB;
    size_t r = 0;
    for (; r + (size_t)RB <= nr; r += (size_t)RB) {
        for (int j = 0; j < RB; j++) {
            /* address arithmetic in uintptr_t: the target may lie past
             * the rows this call owns */
            const uintptr_t p = (uintptr_t)rows + (r + ahead + (size_t)j) * rb;
            for (size_t b = 0; b < 2 * k; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T1);
        }
        if (HB == 8 && RB == 2)
            mdot_bf16_tile82(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo);
        else
            mdot_bf16_tile(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, HB, RB);
    }
    for (; r < nr; r++) mdot_bf16_tile(q, ldq, rows + r * ldr, ldr, k, out + r * ldo, ldo, HB, 1);
}

static void mdot_bf16_rows_avx512(const float *q, size_t ldq, size_t nh, const uint16_t *rows,
                                  size_t ldr, size_t nr, size_t k, float *out, size_t ldo)
{
    size_t h = 0;
    for (; h + 8 <= nh; h += 8) mdot_bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 8, 2);
    if (h + 4 <= nh) { mdot_bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 4, 4); h += 4; }
    if (h + 2 <= nh) { mdot_bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 2, 8); h += 2; }
    if (h < nh) mdot_bf16_heads(q + h * ldq, ldq, rows, ldr, nr, k, out + h, ldo, 1, 8);
}

/* ==== The table ========================================================= */

/* ==== Activation quantization (act_quant, UE8M0) ======================= */
/* The scalar quantizer's deq output, 16 lanes at a time.  Per block: amax
 * (a NaN anywhere makes the scalar's fmaxf(amax, 1e-4) take 1e-4), the
 * power-of-two scale s = pow2_ceil(amax / 448) from the scalar code itself,
 * then per element v = clamp(x / s, +-448) with NaN kept (max/min return
 * their second operand on NaN), rounded to the E4M3 grid: below 2^-6 to a
 * multiple of 2^-9 (roundscale, RNE), above it to 3 mantissa bits (RNE by
 * integer add on the bits; a carry moves into the exponent as the scalar's
 * m == 16 case does), sign restored, times s. */
static void act_quant_fp8_pow2_avx512(const float *x, size_t n, size_t block, float *deq)
{
    if (block % 16 || block == 0) {
        dsattn_act_quant_fp8_pow2_ref(x, n, block, deq);
        return;
    }
    const float inv448 = (float)(1.0 / 448.0);
    const __m512 lo = _mm512_set1_ps(-448.0f), hi = _mm512_set1_ps(448.0f);
    const __m512 sub = _mm512_set1_ps(0x1p-6f);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), sgnm = _mm512_set1_epi32((int)0x80000000u);
    const __m512i rnd = _mm512_set1_epi32(0x7ffff), one = _mm512_set1_epi32(1);
    const __m512i keep = _mm512_set1_epi32((int)0xfff00000u);
    for (size_t b = 0; b + block <= n; b += block) {
        const float *xb = x + b;
        __m512 m = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (size_t i = 0; i < block; i += 16) {
            __m512 v = _mm512_loadu_ps(xb + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absm)));
        }
        float amax = _mm512_reduce_max_ps(m);
        amax = nan ? 1e-4f : (amax > 1e-4f ? amax : 1e-4f);
        const float s = dsattn_pow2_ceil(amax * inv448);
        const __m512 sv = _mm512_set1_ps(s);
        for (size_t i = 0; i < block; i += 16) {
            __m512 v = _mm512_div_ps(_mm512_loadu_ps(xb + i), sv);
            v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            __m512i u = _mm512_castps_si512(v);
            __m512i sg = _mm512_and_si512(u, sgnm);
            __m512 a = _mm512_castsi512_ps(_mm512_and_si512(u, absm));
            __m512 rs = _mm512_roundscale_ps(a, (9 << 4) | _MM_FROUND_TO_NEAREST_INT |
                                                    _MM_FROUND_NO_EXC);
            __m512i au = _mm512_castps_si512(a);
            __m512i rn = _mm512_add_epi32(au, _mm512_add_epi32(rnd, _mm512_and_si512(
                                                _mm512_srli_epi32(au, 20), one)));
            rn = _mm512_and_si512(rn, keep);
            __mmask16 small = _mm512_cmp_ps_mask(a, sub, _CMP_LT_OQ);
            __m512 g = _mm512_mask_mov_ps(_mm512_castsi512_ps(rn), small, rs);
            g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);  /* NaN */
            g = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), sg));
            _mm512_storeu_ps(deq + b + i, _mm512_mul_ps(g, sv));
        }
    }
}

/* ==== bf16 GEMV over several tokens (gemv_bf16m_tmpl.h) ================ */
#define GBM_R 2
#include "gemv_bf16m_tmpl.h"

#define AVX512_TABLE(NAME, FP8, FP8F, FP8M) {               \
    .name                 = NAME,                           \
    .gemv_f32             = gemv_f32_avx512,                \
    .gemv_bf16            = gemv_bf16_avx512,               \
    .gemv_fp8             = FP8,                            \
    .gemv_fp8_finite      = FP8F,                           \
    .gemv_fp8_m           = FP8M,                           \
    .gemv_bf16_m          = gemv_bf16_m_simd,               \
    .act_quant_fp8_pow2   = act_quant_fp8_pow2_avx512,      \
    .gemv_fp4             = gemv_fp4_avx512,                \
    .dot_f32              = dot_f32_avx512,                 \
    .mdot_f32             = mdot_f32_avx512,                \
    .maxpy_f32            = maxpy_f32_avx512,               \
    ROWS_TABLE_ENTRIES(mdot_fp4e4m3_rows_avx512, maxpy_fp4e4m3_rows_avx512), \
    .cvt_bf16_f32         = cvt_bf16_f32_avx512,            \
    .mdot_bf16_rows       = mdot_bf16_rows_avx512,          \
}

static const dsattn_kernels kernels_avx512 =
    AVX512_TABLE("avx512", gemv_fp8_avx512, gemv_fp8_finite_avx512, gemv_fp8_m_avx512);

/* The exponent-shift FP8 decode in the GEMVs: for CPUs whose FMA takes
 * subnormal operands at full rate (dispatch.c chooses). */
static const dsattn_kernels kernels_avx512_expshift =
    AVX512_TABLE("avx512-expshift", gemv_fp8_expshift, gemv_fp8_finite_expshift,
                 gemv_fp8_m_expshift);

const dsattn_kernels *const dsattn_kernels_avx512_ptr = &kernels_avx512;
const dsattn_kernels *const dsattn_kernels_avx512_expshift_ptr = &kernels_avx512_expshift;

#else  /* no AVX-512 compiler support: no such path */

const dsattn_kernels *const dsattn_kernels_avx512_ptr = 0;
const dsattn_kernels *const dsattn_kernels_avx512_expshift_ptr = 0;

#endif
