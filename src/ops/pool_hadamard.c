/* pool_hadamard.c - two small shared operators of the compressed-attention
 * generations: the compressor's softmax-gated pooling (V4 CSA/HCA and V4.1
 * CSA2 pool token slots with a per-channel softmax gate) and the
 * Hadamard rotation the V3.2 and V4 indexers apply before FP8/FP4 (V4.1
 * has none).  Scalar and exact: both are O(d) per new entry.  The pooling
 * state machine around dsattn_softmax_pool is compressor.c. */
#include "ops.h"

#include "numfmt.h"

#include <math.h>

void dsattn_softmax_pool(const float *kv, const float *z, size_t r, size_t D,
                         float *out)
{
    /* e_i is evaluated twice (for the sum, then for p_i) rather than kept in
     * a buffer, so r is unbounded (HCA pools 128 slots); exp is deterministic,
     * so both evaluations give the same fp32 value. */
    for (size_t c = 0; c < D; c++) {
        float mx = -INFINITY;
        for (size_t i = 0; i < r; i++) mx = z[i * D + c] > mx ? z[i * D + c] : mx;
        double se = 0.0;
        for (size_t i = 0; i < r; i++) se += (float)exp((double)(z[i * D + c] - mx));
        float sum = (float)se;
        double acc = 0.0;
        for (size_t i = 0; i < r; i++) {
            float e = (float)exp((double)(z[i * D + c] - mx));
            float p = e / sum;
            acc += (double)(kv[i * D + c] * p);
        }
        out[c] = (float)acc;
    }
}

void dsattn_hadamard(const float *x, size_t n, float scale, float *y,
                     dsattn_out_round round)
{
    double buf[256];
    for (size_t i = 0; i < n && i < 256; i++) buf[i] = x[i];
    for (size_t h = 1; h < n; h *= 2)               /* butterflies, exact */
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                double a = buf[j], b = buf[j + h];
                buf[j] = a + b;
                buf[j + h] = a - b;
            }
    for (size_t i = 0; i < n && i < 256; i++) {
        float v = (float)(buf[i] * (double)scale);
        y[i] = round == DSATTN_OUT_BF16 ? dsattn_round_bf16(v) : v;
    }
}
