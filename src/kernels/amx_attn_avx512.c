/* amx_attn_avx512.c - amx_attn.h: attention blocks over bf16 key rows on
 * AMX-BF16 tiles (the layouts and the arithmetic are described there), and
 * the same blocks with each tile product formed by VDPBF16PS in zmm
 * registers (CPUs with AVX512-BF16 and no AMX: AMD Zen 4).
 *
 * Not here: which rows a block holds, the choice of path, the thread split
 * and the merge (src/attn/mla_attend.c, src/ops/sparse_attn.c).
 */
#include "amx_attn.h"

#include "simd_avx512.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__x86_64__)
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define MB DSATTN_AMX_MB

typedef struct {
    uint8_t  palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} amx_cfg;

int dsattn_amx_fits(size_t hp, size_t D, size_t C)
{
    return hp % 32 == 0 && hp > 0 && D % 32 == 0 && C % 32 == 0 && C > 0 && C <= D && D <= 1024;
}

/* 16 fp32 lanes -> their high halves (the bf16 bits); *bad collects lanes
 * that are not bf16 numbers the tiles take as is: fp32-only mantissa bits,
 * or subnormal (the tiles read those as zero).  NaN passes. */
static inline __m256i bf16_exact16(__m512i u, __mmask16 *bad)
{
    const __m512i lo = _mm512_set1_epi32(0xffff), ex = _mm512_set1_epi32(0x7f800000);
    *bad |= _mm512_test_epi32_mask(u, lo) |
            (_mm512_testn_epi32_mask(u, ex) & _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffffff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

/* Head n's 32 values of one 32-dim step as bf16 pairs: dword k = (d 2k,
 * d 2k+1), checked by bf16_exact16 */
static inline __m512 pairs32(const float *v, __mmask16 *bad)
{
    const __m256i ha = bf16_exact16(_mm512_loadu_si512(v), bad);
    const __m256i hb = bf16_exact16(_mm512_loadu_si512(v + 16), bad);
    return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(ha), hb, 1));
}

int dsattn_amx_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D, uint16_t *qb)
{
    /* per 16 heads and 32 dims: 16 x 16 dword pairs, transposed (tile row
     * k = pair k of every head) */
    const size_t ns = D / 32;
    __mmask16 bad = 0;
    for (size_t g = 0; g < hp / 16; g++)
        for (size_t st = 0; st < ns; st++) {
            __m512 r[16];
            for (size_t n = 0; n < 16; n++) {
                const size_t h = 16 * g + n;
                r[n] = h < H ? pairs32(q + h * ldq + 32 * st, &bad) : _mm512_setzero_ps();
            }
            dsattn_tr16(r);
            uint16_t *t = qb + (g * ns + st) * 512;
            for (size_t k = 0; k < 16; k++) _mm512_store_ps((float *)(t + k * 32), r[k]);
        }
    return bad == 0;
}

/* 16 bf16 of P (fp32, finite, >= 0) by RNE, as 16-bit words */
static inline __m256i bf16x16(__m512 x)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(dsattn_rbf16(x)), 16));
}

/* The block's rows r[0..32*nq) (NULL = a zero row) into V pairs: tile (s, cg)
 * at vb + (s * C/16 + cg) * 512, row k, column 2n + e = V[32s + 2k + e][16cg + n] */
static void v_pairs(const uint8_t *const *r, size_t nq, size_t C, const uint16_t *zero,
                    uint16_t *vb)
{
    /* word 2n + e of the low half: V[2k + e][n] -> index n + 32e */
    static const uint16_t lo_idx[32] __attribute__((aligned(64))) = {
        0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47 };
    const __m512i lo = _mm512_load_si512(lo_idx);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const size_t ncg = C / 16;
    for (size_t s = 0; s < nq; s++)
        for (size_t k = 0; k < 16; k++) {
            const uint8_t *ra = r[32 * s + 2 * k], *rb = r[32 * s + 2 * k + 1];
            const uint16_t *a = ra ? (const uint16_t *)ra : zero;
            const uint16_t *b = rb ? (const uint16_t *)rb : zero;
            for (size_t c = 0; c < C; c += 32) {
                const __m512i va = _mm512_loadu_si512(a + c), vb2 = _mm512_loadu_si512(b + c);
                uint16_t *t = vb + (s * ncg + c / 16) * 512 + k * 32;
                _mm512_store_si512(t, _mm512_permutex2var_epi16(va, lo, vb2));
                _mm512_store_si512(t + 512, _mm512_permutex2var_epi16(va, hi, vb2));
            }
        }
}

/* P^T tiles from S^T [nk32 keys, ldst]: tile (g, s) at pa + (g * nq + s) *
 * 512, row n (head 16g + n), column j = key 32s + j; keys >= nk give 0 */
static void p_tiles(const float *st, size_t ldst, size_t hp, size_t nk, size_t nq, uint16_t *pa)
{
    for (size_t g = 0; g < hp / 16; g++)
        for (size_t j0 = 0; j0 < 32 * nq; j0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + (size_t)i < nk ? _mm512_loadu_ps(st + (j0 + (size_t)i) * ldst + 16 * g)
                                           : _mm512_setzero_ps();
            dsattn_tr16(r);
            uint16_t *t = pa + (g * nq + j0 / 32) * 512 + j0 % 32;
            for (int n = 0; n < 16; n++) _mm256_store_si256((__m256i *)(t + n * 32), bf16x16(r[n]));
        }
}

/* Lines to bring into L2 a few per tile step while the tiles run: the
 * 32 rows rows[0..32) of row_lines lines each (NULL rows skipped), or one
 * region of `lines` lines. */
typedef struct {
    const uint8_t *const *rows;
    const uint8_t *region;
    size_t row_lines, lines, per, at;
} pf_cursor;

static inline void pf_step(pf_cursor *c)
{
    for (size_t e = 0; e < c->per && c->at < c->lines; e++, c->at++) {
        const uint8_t *p = c->rows ? c->rows[c->at / c->row_lines] : c->region;
        const size_t line = c->rows ? c->at % c->row_lines : c->at;
        if (p) _mm_prefetch((const char *)p + line * 64, _MM_HINT_T1);
    }
}

/* c[i*hp + h] = row i . q(h) for 32 rows at base (stride bytes apart):
 * per pair of 16-head groups, 2 x 2 accumulator tiles over the D/32 steps */
AMX_TARGET static void rows32(const uint8_t *base, size_t stride, const uint16_t *qb, size_t hp,
                              size_t D, float *c, pf_cursor *pf)
{
    const size_t ns = D / 32;
    for (size_t g = 0; g < hp / 16; g += 2) {
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        for (size_t s = 0; s < ns; s++) {
            pf_step(pf);
            _tile_loadd(0, base + s * 64, stride);
            _tile_loadd(1, base + 16 * stride + s * 64, stride);
            _tile_loadd(2, qb + (g * ns + s) * 512, 64);
            _tile_loadd(3, qb + ((g + 1) * ns + s) * 512, 64);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
        }
        float *o = c + 16 * g;
        _tile_stored(4, o, hp * 4);
        _tile_stored(5, o + 16, hp * 4);
        _tile_stored(6, o + 16 * hp, hp * 4);
        _tile_stored(7, o + 16 * hp + 16, hp * 4);
    }
}

static void dot_rows32(const uint8_t *base, size_t stride, const uint16_t *qb, size_t hp,
                       size_t D, float *c, pf_cursor *pf);

/* dot: the VDPBF16PS form of rows32 (dot_rows32) */
static void scores(const uint16_t *qb, size_t hp, size_t D, const uint8_t *const *r, size_t nq,
                   size_t rb, int contiguous, int hot, uint16_t *stage, float *st, int dot)
{
    const size_t ns = D / 32, ng = hp / 16;
    for (size_t q = 0; q < nq; q++) {
        /* the next 32 rows (r has 32 entries past the block: the next
         * block's first rows, or NULL) into L2 while these compute: the
         * strided tile loads straight from memory stalled ~30 % of the time */
        pf_cursor pf = { r + 32 * (q + 1), NULL, ns, hot ? 0 : 32 * ns,
                         (32 + ng / 2 - 1) / (ng / 2), 0 };
        /* 32 keys: straight from the cache, or staged with zero rows */
        const uint8_t *base = r[32 * q];
        size_t stride = rb;
        if (!contiguous) {
            for (size_t i = 0; i < 32; i++) {
                const uint8_t *ri = r[32 * q + i];
                if (ri) memcpy(stage + i * D, ri, D * 2);
                else memset(stage + i * D, 0, D * 2);
            }
            base = (const uint8_t *)stage;
            stride = D * 2;
        }
        if (dot) dot_rows32(base, stride, qb, hp, D, st + 32 * q * hp, &pf);
        else     rows32(base, stride, qb, hp, D, st + 32 * q * hp, &pf);
    }
}

AMX_TARGET static void pv(const uint16_t *pa, const uint16_t *vb, size_t hp, size_t C,
                          size_t nq, float *o)
{
    const size_t ng = hp / 16, ncg = C / 16;
    for (size_t g = 0; g < ng; g += 2)
        for (size_t cg = 0; cg < ncg; cg += 2) {
            float *o00 = o + (g * ncg + cg) * 256, *o01 = o00 + 256;
            float *o10 = o00 + ncg * 256, *o11 = o10 + 256;
            _tile_loadd(4, o00, 64);
            _tile_loadd(5, o01, 64);
            _tile_loadd(6, o10, 64);
            _tile_loadd(7, o11, 64);
            for (size_t s = 0; s < nq; s++) {
                _tile_loadd(0, pa + (g * nq + s) * 512, 64);
                _tile_loadd(1, pa + ((g + 1) * nq + s) * 512, 64);
                _tile_loadd(2, vb + (s * ncg + cg) * 512, 64);
                _tile_loadd(3, vb + (s * ncg + cg + 1) * 512, 64);
                _tile_dpbf16ps(4, 0, 2);
                _tile_dpbf16ps(5, 0, 3);
                _tile_dpbf16ps(6, 1, 2);
                _tile_dpbf16ps(7, 1, 3);
            }
            _tile_stored(4, o00, 64);
            _tile_stored(5, o01, 64);
            _tile_stored(6, o10, 64);
            _tile_stored(7, o11, 64);
        }
}

AMX_TARGET void dsattn_amx_begin(void)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    /* GCC's ldtilecfg builtin does not tell the optimiser that it reads
     * the 64 bytes: without this the rows / colsb stores were dropped as
     * dead (SIGILL on the first tile load) */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

AMX_TARGET void dsattn_amx_end(void) { _tile_release(); }

static void dot_pv(const uint16_t *pa, const uint16_t *vb, size_t hp, size_t C, size_t nq,
                   float *o);

static void block_impl(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                       size_t C, const uint8_t *const *r, size_t nk, size_t stride,
                       int contiguous, int hot, float scale, int bf16_scores, float *m, float *l,
                       float *o, void *ws, int dot)
{
    uint8_t *w = (uint8_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    float *st = (float *)w;
    uint16_t *pa = (uint16_t *)(st + (size_t)MB * hp);
    uint16_t *vb = pa + hp * MB;
    uint16_t *stage = vb + (size_t)MB * C;
    float *alpha = (float *)(stage + 32 * D);
    static const uint16_t zero[1024] __attribute__((aligned(64)));      /* C <= D <= 1024 */
    const size_t ncg = C / 16, nq = (nk + 31) / 32;
    scores(qb, hp, D, r, nq, stride, contiguous, hot, stage, st, dot);
    mk->softmax(st, hp, hp, nk, scale, bf16_scores, m, l, alpha);
    /* O rows of heads whose max moved */
    for (size_t h = 0; h < hp; h++) {
        if (alpha[h] == 1.0f) continue;
        const __m512 a = _mm512_set1_ps(alpha[h]);
        float *row = o + (h / 16) * ncg * 256 + (h % 16) * 16;
        for (size_t cg = 0; cg < ncg; cg++)
            _mm512_store_ps(row + cg * 256, _mm512_mul_ps(a, _mm512_load_ps(row + cg * 256)));
    }
    p_tiles(st, hp, hp, nk, nq, pa);
    v_pairs(r, nq, C, zero, vb);
    if (dot) dot_pv(pa, vb, hp, C, nq, o);
    else     pv(pa, vb, hp, C, nq, o);
}

void dsattn_amx_block(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                      size_t C, const uint8_t *const *r, size_t nk, size_t stride,
                      int contiguous, int hot, float scale, int bf16_scores, float *m, float *l,
                      float *o, void *ws)
{
    block_impl(mk, qb, hp, D, C, r, nk, stride, contiguous, hot, scale, bf16_scores, m, l, o, ws,
               0);
}

static void gemm_nt_impl(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows,
                         size_t n32, float *c, const uint8_t *pf, size_t pf_bytes, int dot)
{
    const size_t lines = (pf_bytes + 63) / 64, steps = n32 * (hp / 32) * (D / 32);
    pf_cursor cur = { NULL, pf, 0, lines, steps ? (lines + steps - 1) / steps : 0, 0 };
    for (size_t q = 0; q < n32; q++) {
        const uint8_t *base = (const uint8_t *)(rows + 32 * q * D);
        if (dot) dot_rows32(base, D * 2, qb, hp, D, c + 32 * q * hp, &cur);
        else     rows32(base, D * 2, qb, hp, D, c + 32 * q * hp, &cur);
    }
}

void dsattn_amx_gemm_nt(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows,
                        size_t n32, float *c, const uint8_t *pf, size_t pf_bytes)
{
    gemm_nt_impl(qb, hp, D, rows, n32, c, pf, pf_bytes, 0);
}

/* ==== The same blocks on VDPBF16PS (CPUs with AVX512-BF16, no AMX) ====== */
/* One tile product C[16][16] += A . B as the tiles form it, in zmm
 * registers: A is 16 rows of 16 bf16 pairs (row m at a + m * lda), B 16
 * rows k of 16 pairs (b + 32k, the tile layout above), and row m of C gains
 * sum_k A[m] pair k (x) B row k - one VDPBF16PS per (m, k), A's pair
 * broadcast from memory, B's row loaded once for the 16 rows of C.  The
 * products are the tiles' (exact; bf16 subnormals and subnormal results
 * read and written as zero by both); only the fp32 summation order
 * differs, as between any two of dsattn's fast paths. */
#define DOT_TARGET __attribute__((target("avx512f,avx512bf16")))

DOT_TARGET static inline void dot_tile(__m512 *acc, const uint8_t *a, size_t lda, const uint16_t *b)
{
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
        const __m512bh bk = (__m512bh)_mm512_loadu_si512(b + 32 * k);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            int32_t pair;
            memcpy(&pair, a + (size_t)m * lda + 4 * (size_t)k, sizeof pair);
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), bk);
        }
    }
}

/* rows32 on VDPBF16PS: per 16-head group and 16 keys, 16 accumulators over
 * the D/32 steps; the prefetch cursor steps as often as rows32's */
DOT_TARGET static void dot_rows32(const uint8_t *base, size_t stride, const uint16_t *qb,
                                  size_t hp, size_t D, float *c, pf_cursor *pf)
{
    const size_t ns = D / 32;
    for (size_t g = 0; g < hp / 16; g++)
        for (size_t half = 0; half < 2; half++) {
            __m512 acc[16];
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
            const uint8_t *a = base + half * 16 * stride;
            for (size_t s = 0; s < ns; s++) {
                if (g % 2 == 0 && half == 0) pf_step(pf);
                dot_tile(acc, a + s * 64, stride, qb + (g * ns + s) * 512);
            }
            float *o = c + half * 16 * hp + 16 * g;
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++) _mm512_storeu_ps(o + (size_t)m * hp, acc[m]);
        }
}

/* pv on VDPBF16PS: each 16 x 16 tile of O in registers over the block's
 * 32-key steps */
DOT_TARGET static void dot_pv(const uint16_t *pa, const uint16_t *vb, size_t hp, size_t C,
                              size_t nq, float *o)
{
    const size_t ng = hp / 16, ncg = C / 16;
    for (size_t g = 0; g < ng; g++)
        for (size_t cg = 0; cg < ncg; cg++) {
            float *ot = o + (g * ncg + cg) * 256;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++) acc[m] = _mm512_load_ps(ot + 16 * m);
            for (size_t s = 0; s < nq; s++)
                dot_tile(acc, (const uint8_t *)(pa + (g * nq + s) * 512), 64,
                         vb + (s * ncg + cg) * 512);
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++) _mm512_store_ps(ot + 16 * m, acc[m]);
        }
}

static void dot_block(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                      size_t C, const uint8_t *const *r, size_t nk, size_t stride, int contiguous,
                      int hot, float scale, int bf16_scores, float *m, float *l, float *o, void *ws)
{
    block_impl(mk, qb, hp, D, C, r, nk, stride, contiguous, hot, scale, bf16_scores, m, l, o, ws,
               1);
}

static void dot_gemm_nt(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows,
                        size_t n32, float *c, const uint8_t *pf, size_t pf_bytes)
{
    gemm_nt_impl(qb, hp, D, rows, n32, c, pf, pf_bytes, 1);
}

static void dot_begin(void) {}
static void dot_end(void) {}

int dsattn_amx_fp8_row_bf16(const uint8_t *w, const float *scale, size_t bs, size_t K,
                            uint16_t *out)
{
    const __m256i m7f = _mm256_set1_epi8(0x7f);
    __mmask32 nan = 0;
    for (size_t b0 = 0; b0 < K; b0 += bs) {
        const float sc = scale[b0 / bs];
        uint32_t u;
        memcpy(&u, &sc, sizeof u);
        const int e = (int)((u >> 23) & 0xff) - 127;
        if ((u & 0x807fffffu) || e < -117 || e > 119) return 0;
        /* e4m3 / 256 from the fp16 bits, times 256 s: exact (power of two) */
        const __m512 f = _mm512_set1_ps(sc * 256.0f);
        const size_t b1 = b0 + bs < K ? b0 + bs : K;
        for (size_t i = b0; i < b1; i += 32) {
            __m512 v0, v1;
            const __m256i c = _mm256_loadu_si256((const __m256i *)(w + i));
            nan |= _mm256_cmpeq_epi8_mask(_mm256_and_si256(c, m7f), m7f);
            dsattn_e4m3x32_div256(w + i, &v0, &v1);
            _mm512_storeu_si512(out + i,
                                dsattn_bf16_hi32(_mm512_mul_ps(v0, f), _mm512_mul_ps(v1, f)));
        }
    }
    return nan == 0;
}

int dsattn_amx_rows_bf16(const float *x, size_t ldx, size_t nr, size_t d, uint16_t *out)
{
    __mmask16 bad = 0;
    for (size_t r = 0; r < nr; r++)
        for (size_t i = 0; i < d; i += 16)
            _mm256_storeu_si256((__m256i *)(out + r * d + i),
                                bf16_exact16(_mm512_loadu_si512(x + r * ldx + i), &bad));
    return bad == 0;
}

void dsattn_amx_finish(const float *o, size_t C, size_t nh, const float *den, float *out)
{
    const size_t ncg = C / 16;
    for (size_t h = 0; h < nh; h++) {
        const __m512 dn = _mm512_set1_ps(den[h]);
        const float *row = o + (h / 16) * ncg * 256 + (h % 16) * 16;
        for (size_t cg = 0; cg < ncg; cg++)
            _mm512_storeu_ps(out + h * C + cg * 16,
                             dsattn_rbf16(_mm512_div_ps(_mm512_load_ps(row + cg * 256), dn)));
    }
}

static const dsattn_amx_kern amx_avx512 = {
    "amx-bf16", dsattn_amx_fits, dsattn_amx_pack_q, dsattn_amx_begin, dsattn_amx_end,
    dsattn_amx_block, dsattn_amx_gemm_nt, dsattn_amx_fp8_row_bf16, dsattn_amx_rows_bf16,
    dsattn_amx_finish,
};
const dsattn_amx_kern *const dsattn_amx_avx512_ptr = &amx_avx512;

static const dsattn_amx_kern bf16dot_avx512 = {
    "bf16-dot", dsattn_amx_fits, dsattn_amx_pack_q, dot_begin, dot_end, dot_block, dot_gemm_nt,
    dsattn_amx_fp8_row_bf16, dsattn_amx_rows_bf16, dsattn_amx_finish,
};
const dsattn_amx_kern *const dsattn_bf16blk_avx512_ptr = &bf16dot_avx512;

#else  /* no AVX-512 build: the AMX form does not exist (callers never get
        * here: dsattn_amx_fits says no) */

int dsattn_amx_fits(size_t hp, size_t D, size_t C)
{
    (void)hp; (void)D; (void)C;
    return 0;
}

int dsattn_amx_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D, uint16_t *qb)
{
    (void)q; (void)ldq; (void)H; (void)hp; (void)D; (void)qb;
    return 0;
}

void dsattn_amx_gemm_nt(const uint16_t *qb, size_t hp, size_t D, const uint16_t *rows,
                        size_t n32, float *c, const uint8_t *pf, size_t pf_bytes)
{
    (void)qb; (void)hp; (void)D; (void)rows; (void)n32; (void)c; (void)pf; (void)pf_bytes;
}

int dsattn_amx_fp8_row_bf16(const uint8_t *w, const float *scale, size_t bs, size_t K,
                            uint16_t *out)
{
    (void)w; (void)scale; (void)bs; (void)K; (void)out;
    return 0;
}

int dsattn_amx_rows_bf16(const float *x, size_t ldx, size_t nr, size_t d, uint16_t *out)
{
    (void)x; (void)ldx; (void)nr; (void)d; (void)out;
    return 0;
}

void dsattn_amx_finish(const float *o, size_t C, size_t nh, const float *den, float *out)
{
    (void)o; (void)C; (void)nh; (void)den; (void)out;
}

void dsattn_amx_begin(void) {}
void dsattn_amx_end(void) {}

void dsattn_amx_block(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                      size_t C, const uint8_t *const *r, size_t nk, size_t stride,
                      int contiguous, int hot, float scale, int bf16_scores, float *m, float *l,
                      float *o, void *ws)
{
    (void)mk; (void)qb; (void)hp; (void)D; (void)C; (void)r; (void)nk; (void)stride;
    (void)contiguous; (void)hot; (void)scale; (void)bf16_scores; (void)m; (void)l; (void)o; (void)ws;
}

const dsattn_amx_kern *const dsattn_amx_avx512_ptr = NULL;
const dsattn_amx_kern *const dsattn_bf16blk_avx512_ptr = NULL;

#endif
