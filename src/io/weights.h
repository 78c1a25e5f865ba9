/* weights.h - the weight descriptor every compute path consumes.
 *
 * A dsattn_weight describes one Linear weight [rows, cols] (torch [out, in])
 * in the format the checkpoint stores it; GEMV runs directly on these bytes.
 * The bytes are normally borrowed from a memory-mapped checkpoint; `owned`
 * is set only when the loader had to convert something, and is freed by
 * whoever owns the descriptor (dsattn_weight_release).
 */
#ifndef DSATTN_WEIGHTS_H
#define DSATTN_WEIGHTS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DSATTN_W_F32  = 0,   /* float [rows, cols]                               */
    DSATTN_W_BF16 = 1,   /* uint16 bf16 bits [rows, cols]                    */
    DSATTN_W_FP8  = 2,   /* E4M3 [rows, cols] + fp32 scale per block x block */
    DSATTN_W_FP4  = 3,   /* E2M1 [rows, cols/2] + UE8M0 per 32 along cols    */
} dsattn_wkind;

typedef struct {
    dsattn_wkind   kind;
    size_t         rows, cols;
    const void    *data;        /* row-major; FP4: cols/2 bytes per row        */
    const float   *scale;       /* FP8: [ceil(rows/block), ceil(cols/block)]   */
    const uint8_t *scale_e8m0;  /* FP4: [rows, cols/32]                        */
    size_t         block;       /* FP8 block edge (32 or 128)                  */
    int            finite;      /* FP8: no NaN code in data (checked / made)  */
    void          *owned;       /* converted storage to free, or NULL          */
} dsattn_weight;

/* Free `owned` (if any) and zero the descriptor.  NULL is a no-op. */
void dsattn_weight_release(dsattn_weight *w);

/* Reference decode of row r into out[cols] as fp32: BF16 exact, FP8 code *
 * block scale, FP4 code * UE8M0 scale.  Plain scalar code, never optimised:
 * fast GEMV kernels are tested against it.  Returns 0, or -1 if r >= rows. */
int dsattn_weight_row_f32(const dsattn_weight *w, size_t r, float *out);

/* Reference y[rows] = W x[cols], double accumulation, one rounding.
 * Returns 0, or -1 on allocation failure / bad descriptor. */
int dsattn_weight_gemv_ref(const dsattn_weight *w, const float *x, float *y);

/* Bytes of `data` (+ scales) the descriptor reads per full GEMV. */
size_t dsattn_weight_bytes(const dsattn_weight *w);

/* ==== Seeded random weights (tests, benchmarks, `dsattn run`) ========= */
/* The generator behind them, for every loader that makes random weights:
 * xorshift64* steps, and a standard normal value by Box-Muller from two. */
static inline uint64_t dsattn_weight_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static inline float dsattn_weight_rng_normal(uint64_t *s)
{
    double u1 = ((double)(dsattn_weight_rng_next(s) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(dsattn_weight_rng_next(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Reproducible from the seed alone, and quick to make at real size (rows
 * are seeded independently and filled in parallel):
 *   DSATTN_W_BF16 / DSATTN_W_F32: N(0, gain^2 / cols), rounded to bf16 values;
 *   DSATTN_W_FP8: E4M3 codes with random sign and mantissa and exponent field
 *     4..11 (magnitudes 2^-3..2^5, never NaN), one power-of-two scale per
 *     block x block giving rows of about `gain` / sqrt(cols) RMS per value.
 * Storage is adopted by `own` (freed with it). */
struct dsattn_owned;
int dsattn_weight_random(dsattn_weight *w, dsattn_wkind kind, size_t rows, size_t cols,
                         size_t block, float gain, uint64_t seed, struct dsattn_owned *own);
/* n values base + jitter * N(0, 1), rounded to bf16 values when bf16. */
int dsattn_vec_random(float **out, size_t n, float base, float jitter, int bf16,
                      uint64_t seed, struct dsattn_owned *own);

/* Bit for an accept mask: DSATTN_WMASK(DSATTN_W_BF16) | ... */
#define DSATTN_WMASK(k) (1u << (unsigned)(k))
#define DSATTN_WMASK_ANY 0xfu

#endif /* DSATTN_WEIGHTS_H */
