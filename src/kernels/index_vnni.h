/* index_vnni.h - exact integer fast path of the lightning-indexer score
 * over FP4 index keys (index_vnni_avx512.c says why it is exact). */
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

/* Does this CPU run the path for nh heads of dh dims? */
int  dsattn_index_vnni_ok(size_t nh, size_t dh);
/* Lay out one token's FP4-QDQ queries q [nh, dh] and weights w [nh].
 * Returns 0 if q is not exactly FP4 QDQ values (then use the reference). */
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
    const char *name;                                   /* "vnni" */
    int  (*ok)(size_t nh, size_t dh);
    int  (*prepare)(dsattn_index_vnni_q *p, const float *q, size_t nh, size_t dh,
                    const float *w);
    void (*scores)(const dsattn_index_vnni_q *p, const uint8_t *base, size_t row_bytes,
                   const int32_t *sel, size_t j0, size_t n, float *score);
} dsattn_index_kern;

/* NULL when the build has no x86-64 path */
extern const dsattn_index_kern *const dsattn_index_vnni_ptr;

#endif
