/* index_vnni.h - exact integer fast paths of the lightning-indexer score
 * over FP4 index keys: the query layout they share (index_prep.c) and the
 * forms of the `index` slot, AVX-512 VNNI / AMX-INT8
 * (index_vnni_avx512.c, which says why the integer sums are exact), AVX2
 * (index_avx2.c) and NEON (index_neon.c); all give the reference's bits. */
#ifndef DSATTN_INDEX_VNNI_H
#define DSATTN_INDEX_VNNI_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t  nh, dh;
    int8_t  qb[64 * 4 * 64] __attribute__((aligned(64)));  /* [dh/4][64 heads][4] */
    float   unit[8 * 64];                                   /* [block][head] u_q      */
    double  unitd[8 * 64];                                  /* the same, as doubles   */
    int32_t nbias[8 * 64];          /* [block][head] -12*sum q: the acc start */
    float   w[64];                                          /* head weights (bf16)    */
    int     use_amx;        /* prepare sets it where AMX-INT8 runs; 0 forces VNNI */
    /* exponents of the nonzero query blocks' units: for the exact fp32
     * scaling of the block sums (index_vnni_avx512.c, key_fits_f32) */
    int     ue_min, ue_max, ue_span;  /* ue_span: max over heads of max - min */
    int     use_f32;        /* 1: keys that fit take the fp32 scaling; 0 forces double */
} dsattn_index_vnni_q;

/* Does this CPU and OS run AMX-INT8 tiles for this process?  The first call
 * asks Linux for the tile-data permission (arch_prctl); 0 where either is
 * missing.  The AMX form gives the same bits as the VNNI form. */
int  dsattn_index_amx_ok(void);

/* Lay out one token's FP4-QDQ queries q [nh, dh] and weights w [nh] for
 * either form (index_prep.c, plain C; use_amx = 0).  Returns 0 if q is not
 * exactly FP4 QDQ values (then use the reference) or the shape is outside
 * nh % 16 == 0 <= 64, dh % 32 == 0 <= 256. */
int  dsattn_index_q_prepare(dsattn_index_vnni_q *p, const float *q, size_t nh,
                            size_t dh, const float *w);
/* E2M1 code -> 2*value + 12: the keys' biased half-units (0..24), the
 * unsigned operand of the byte dot products */
extern const int8_t dsattn_index_k_lut[16];

/* Can this key's block sums be scaled in fp32 exactly?  Its scales are
 * 2^(e_b - 128) (UE8M0 byte e_b); the terms are corr * 2^(ue + e_b - 128)
 * with |corr| < 2^14.  Exact if, per head, the term exponents span at most
 * 8 (four terms then fit 14 + 8 + 2 = 24 bits), the smallest stays >= 2^-120
 * (normal) and the sum stays < 2^110.  Inline: both forms call it per key,
 * each in its own encoding.  The _min form also returns the smallest scale
 * byte (when use_f32), which the AVX2 form's scaling starts from. */
static inline int dsattn_index_key_fits_f32_min(const dsattn_index_vnni_q *p,
                                                const uint8_t *scales, size_t nb, int *kmin_out)
{
    if (!p->use_f32) return 0;
    int kmin = 255, kmax = 0;
    for (size_t b = 0; b < nb; b++) {
        const int e = scales[b];
        kmin = e < kmin ? e : kmin;
        kmax = e > kmax ? e : kmax;
    }
    *kmin_out = kmin;
    return p->ue_span + (kmax - kmin) <= 8 && p->ue_min + kmin - 128 >= -120 &&
           p->ue_max + kmax - 128 + 16 <= 110;
}

static inline int dsattn_index_key_fits_f32(const dsattn_index_vnni_q *p,
                                            const uint8_t *scales, size_t nb)
{
    int kmin;
    return dsattn_index_key_fits_f32_min(p, scales, nb, &kmin);
}

/* Does this CPU run the VNNI form for nh heads of dh dims? */
int  dsattn_index_vnni_ok(size_t nh, size_t dh);
/* dsattn_index_q_prepare, with use_amx set where AMX-INT8 runs */
int  dsattn_index_vnni_prepare(dsattn_index_vnni_q *p, const float *q, size_t nh,
                               size_t dh, const float *w);
/* Does key row `row` take the exact fp32 scaling (for the tests)? */
int  dsattn_index_vnni_key_f32(const dsattn_index_vnni_q *p, const uint8_t *row);
/* score[j] for key rows sel[j] (or j0 + j when sel is NULL), each row the
 * 68-B-style FP4 index layout of dh values. */
void dsattn_index_vnni_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score);

/* The ktab slot (ktab.h): the entry points above, for algorithm code. */
typedef struct dsattn_index_kern {
    const char *name;                       /* "vnni", "avx2", "neon", "neon-dot" */
    int  (*ok)(size_t nh, size_t dh);
    int  (*prepare)(dsattn_index_vnni_q *p, const float *q, size_t nh, size_t dh,
                    const float *w);
    void (*scores)(const dsattn_index_vnni_q *p, const uint8_t *base, size_t row_bytes,
                   const int32_t *sel, size_t j0, size_t n, float *score);
} dsattn_index_kern;

/* NULL when the build has no x86-64 path (vnni, avx2) / no aarch64 path (neon) */
extern const dsattn_index_kern *const dsattn_index_vnni_ptr;
extern const dsattn_index_kern *const dsattn_index_avx2_ptr;
extern const dsattn_index_kern *const dsattn_index_neon_ptr;
/* the SDOT form (aarch64 builds; run it only where dsattn_cpu_has_neon_dotprod) */
extern const dsattn_index_kern *const dsattn_index_neon_dot_ptr;

/* The NEON forms' entry points (index_neon.c, aarch64 builds; prepare is
 * the shared one).  ok: the shape is the shared layout's.  _dot_scores
 * takes a CPU with the dot product (dsattn_cpu_has_neon_dotprod). */
int  dsattn_index_neon_ok(size_t nh, size_t dh);
void dsattn_index_neon_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score);
void dsattn_index_neon_dot_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                                  size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                                  float *score);

/* The AVX2 form's entry points (index_avx2.c; prepare is the shared one).
 * ok: the CPU has AVX2 and the shape is the VNNI form's. */
int  dsattn_index_avx2_ok(size_t nh, size_t dh);
void dsattn_index_avx2_scores(const dsattn_index_vnni_q *p, const uint8_t *base,
                              size_t row_bytes, const int32_t *sel, size_t j0, size_t n,
                              float *score);

#endif
