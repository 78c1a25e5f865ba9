/* mla_amx_avx512.c - the absorbed MLA decode over a bf16 latent cache on
 * AMX-BF16 tiles (mla_kernels.h, "AMX form").
 *
 * Why it is exact enough to exist: with the bf16 latent cache of V3 every
 * operand of both GEMMs is a bf16 number - the cached latent and rope key,
 * q' = bf16(q_nope . W_uk) and the bf16 q_pe (dsattn_mla_amx_pack_q checks
 * the queries and refuses otherwise) - so each tile product is an exact
 * fp32 product summed in fp32, like the FMA kernels.  P goes to the P.V
 * tile as bf16 (RNE of the unnormalised exp); the reference rounds its
 * normalised p to bf16 as well.  What differs from the AVX-512 tiles is the
 * fp32 summation order and that rounding of P.
 *
 * Per thread and block of MB keys (the block's scores, P^T and V stay in
 * L2):
 *   S^T [keys, heads] = K . Q^T : A = 16 cache rows x 32 dims straight from
 *       the cache (stride = the row), B = the packed queries (pairs of dims
 *       x 16 heads), C = 16 keys x 16 heads, 2 x 2 C tiles per pass;
 *   the heads-in-lanes online softmax of mla_kernels.h on S^T;
 *   rows of O whose head's max moved are scaled by alpha;
 *   O [heads, KL] += P . V : A = P^T (16 heads x 32 keys, bf16, transposed
 *       from S^T), B = V with pairs of keys interleaved (rebuilt from the
 *       block's rows), C = 16 heads x 16 latent columns, kept in memory as
 *       tiles between blocks.
 * Partial tiles (a block's tail, gathered key sets) are staged with zero
 * rows; padded keys get P = 0 and zero V rows.
 *
 * Not here: the choice of path, the thread split and the merge
 * (absorbed_row_tiled in src/attn/mla_forward.c).
 */
#include "mla_kernels.h"

#include "simd_avx512.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__x86_64__)
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define MB 256                          /* keys per block, a multiple of 32 */

typedef struct {
    uint8_t  palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} amx_cfg;

int dsattn_mla_amx_fits(size_t hp, size_t D, size_t KL)
{
    return hp % 32 == 0 && hp > 0 && D % 32 == 0 && KL % 32 == 0 && KL <= D && D <= 1024;
}

int dsattn_mla_amx_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D,
                          uint16_t *qb)
{
    /* tile (g, s) at qb + (g * D/32 + s) * 512: row k, column 2n + e holds
     * q[16g + n][32s + 2k + e] */
    const size_t ns = D / 32;
    for (size_t g = 0; g < hp / 16; g++)
        for (size_t s = 0; s < ns; s++) {
            uint16_t *t = qb + (g * ns + s) * 512;
            for (size_t k = 0; k < 16; k++)
                for (size_t n = 0; n < 16; n++)
                    for (size_t e = 0; e < 2; e++) {
                        const size_t h = 16 * g + n, d = 32 * s + 2 * k + e;
                        float v = h < H ? q[h * ldq + d] : 0.0f;
                        uint32_t u;
                        memcpy(&u, &v, sizeof u);
                        if (u & 0xffffu) return 0;          /* not a bf16 number */
                        t[k * 32 + 2 * n + e] = (uint16_t)(u >> 16);
                    }
        }
    return 1;
}

/* per thread: S^T [MB, hp] f32, P^T [hp, MB] bf16, V pairs [MB, KL] bf16,
 * staged keys [32, D] bf16, alpha [hp] */
size_t dsattn_mla_amx_ws_bytes(size_t hp, size_t D, size_t KL)
{
    return (size_t)MB * hp * 4 + hp * MB * 2 + (size_t)MB * KL * 2 + 32 * D * 2 + hp * 4 + 256;
}

/* 16 bf16 of P (fp32, finite, >= 0) by RNE, as 16-bit words */
static inline __m256i bf16x16(__m512 x)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(dsattn_rbf16(x)), 16));
}

/* The block's rows r[0..32*nq) (NULL = a zero row) into V pairs: tile (s, cg)
 * at vb + (s * KL/16 + cg) * 512, row k, column 2n + e = V[32s + 2k + e][16cg + n] */
static void v_pairs(const uint8_t *const *r, size_t nq, size_t KL, const uint16_t *zero,
                    uint16_t *vb)
{
    /* word 2n + e of the low half: V[2k + e][n] -> index n + 32e */
    static const uint16_t lo_idx[32] __attribute__((aligned(64))) = {
        0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47 };
    const __m512i lo = _mm512_load_si512(lo_idx);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const size_t ncg = KL / 16;
    for (size_t s = 0; s < nq; s++)
        for (size_t k = 0; k < 16; k++) {
            const uint8_t *ra = r[32 * s + 2 * k], *rb = r[32 * s + 2 * k + 1];
            const uint16_t *a = ra ? (const uint16_t *)ra : zero;
            const uint16_t *b = rb ? (const uint16_t *)rb : zero;
            for (size_t c = 0; c < KL; c += 32) {
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

AMX_TARGET static void scores(const uint16_t *qb, size_t hp, size_t D,
                              const uint8_t *const *r, size_t nq, const uint8_t *cache,
                              size_t rb, int contiguous, uint16_t *stage, float *st)
{
    const size_t ns = D / 32, ng = hp / 16;
    for (size_t q = 0; q < nq; q++) {
        /* the next 32 rows (r has 32 entries past the block: the next
         * block's first rows, or NULL) into L2 while these compute: the
         * strided tile loads straight from memory stalled ~30 % of the time */
        const uint8_t *const *nx = r + 32 * (q + 1);
        const size_t lines = 32 * (D * 2 / 64), per = (lines + ng / 2 * ns - 1) / (ng / 2 * ns);
        size_t pl = 0;                  /* next line: row pl / (D/32), line pl % (D/32) */
        /* 32 keys: straight from the cache, or staged with zero rows */
        const uint8_t *base = r[32 * q] ? r[32 * q] : cache;
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
        for (size_t g = 0; g < ng; g += 2) {
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            for (size_t s = 0; s < ns; s++) {
                for (size_t e = 0; e < per && pl < lines; e++, pl++)
                    if (nx[pl / ns]) _mm_prefetch((const char *)nx[pl / ns] + pl % ns * 64, _MM_HINT_T1);
                _tile_loadd(0, base + s * 64, stride);
                _tile_loadd(1, base + 16 * stride + s * 64, stride);
                _tile_loadd(2, qb + (g * ns + s) * 512, 64);
                _tile_loadd(3, qb + ((g + 1) * ns + s) * 512, 64);
                _tile_dpbf16ps(4, 0, 2);
                _tile_dpbf16ps(5, 0, 3);
                _tile_dpbf16ps(6, 1, 2);
                _tile_dpbf16ps(7, 1, 3);
            }
            float *o = st + (32 * q) * hp + 16 * g;
            _tile_stored(4, o, hp * 4);
            _tile_stored(5, o + 16, hp * 4);
            _tile_stored(6, o + 16 * hp, hp * 4);
            _tile_stored(7, o + 16 * hp + 16, hp * 4);
        }
    }
}

AMX_TARGET static void pv(const uint16_t *pa, const uint16_t *vb, size_t hp, size_t KL,
                          size_t nq, float *o)
{
    const size_t ng = hp / 16, ncg = KL / 16;
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

AMX_TARGET void dsattn_mla_amx_part(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp,
                                    size_t D, size_t KL, const uint8_t *cache, size_t rb,
                                    const int32_t *idx, size_t i0, size_t i1, float scale,
                                    int v3, float *m, float *l, float *o, void *ws)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    uint8_t *w = (uint8_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    float *st = (float *)w;
    uint16_t *pa = (uint16_t *)(st + (size_t)MB * hp);
    uint16_t *vb = pa + hp * MB;
    uint16_t *stage = vb + (size_t)MB * KL;
    float *alpha = (float *)(stage + 32 * D);
    const uint8_t *r[MB + 32];
    const uint16_t zero[1024] = { 0 };                /* KL <= D <= 1024 */
    const size_t ncg = KL / 16;
    for (size_t b0 = i0; b0 < i1; b0 += MB) {
        const size_t nk = i1 - b0 < MB ? i1 - b0 : MB, nq = (nk + 31) / 32;
        int contiguous = !idx && nk == 32 * nq;
        for (size_t i = 0; i < 32 * nq; i++)
            r[i] = i < nk ? cache + (idx ? (size_t)idx[b0 + i] : b0 + i) * rb : NULL;
        for (size_t i = 32 * nq; i < 32 * nq + 32; i++)     /* prefetch only */
            r[i] = nk == MB && b0 + i < i1
                       ? cache + (idx ? (size_t)idx[b0 + i] : b0 + i) * rb : NULL;
        scores(qb, hp, D, r, nq, cache, rb, contiguous, stage, st);
        mk->softmax(st, hp, hp, nk, scale, v3, m, l, alpha);
        /* O rows of heads whose max moved */
        for (size_t h = 0; h < hp; h++) {
            if (alpha[h] == 1.0f) continue;
            const __m512 a = _mm512_set1_ps(alpha[h]);
            float *row = o + (h / 16) * ncg * 256 + (h % 16) * 16;
            for (size_t cg = 0; cg < ncg; cg++)
                _mm512_store_ps(row + cg * 256, _mm512_mul_ps(a, _mm512_load_ps(row + cg * 256)));
        }
        p_tiles(st, hp, hp, nk, nq, pa);
        v_pairs(r, nq, KL, zero, vb);
        pv(pa, vb, hp, KL, nq, o);
    }
    _tile_release();
}

#else  /* no AVX-512 build: the AMX form does not exist */

int dsattn_mla_amx_fits(size_t hp, size_t D, size_t KL)
{
    (void)hp; (void)D; (void)KL;
    return 0;
}

int dsattn_mla_amx_pack_q(const float *q, size_t ldq, size_t H, size_t hp, size_t D,
                          uint16_t *qb)
{
    (void)q; (void)ldq; (void)H; (void)hp; (void)D; (void)qb;
    return 0;
}

size_t dsattn_mla_amx_ws_bytes(size_t hp, size_t D, size_t KL)
{
    (void)hp; (void)D; (void)KL;
    return 0;
}

void dsattn_mla_amx_part(const dsattn_mla_kern *mk, const uint16_t *qb, size_t hp, size_t D,
                         size_t KL, const uint8_t *cache, size_t rb, const int32_t *idx,
                         size_t i0, size_t i1, float scale, int v3, float *m, float *l, float *o,
                         void *ws)
{
    (void)mk; (void)qb; (void)hp; (void)D; (void)KL; (void)cache; (void)rb; (void)idx;
    (void)i0; (void)i1; (void)scale; (void)v3; (void)m; (void)l; (void)o; (void)ws;
}

#endif
