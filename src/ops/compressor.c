/* compressor.c - the Compressor's pooling state machine and the
 * softmax-gated pooling it runs on each complete group of slots (a
 * per-channel softmax gate over the slots, scalar and exact: O(r d) per
 * new entry), written once for V4 (CSA ratio 4 with overlapping windows,
 * HCA, learned APE on the gate scores) and V4.1 (ratio >= 2: no overlap,
 * no APE).
 *
 * It follows Compressor.forward of both references line by line after the
 * fp32 projections (which the caller makes, because the weights and the
 * output post-processing differ: V4 rotates/quantizes per owner, V4.1
 * returns the latent before RoPE).  Prefill (start_pos 0, any chunk):
 *
 *   cutoff = s - s % ratio
 *   overlap and cutoff >= ratio: state[:ratio] = kv/score[cutoff-ratio:cutoff] (+ape)
 *   remainder: state[off : off+rem] = kv/score[cutoff:] (+ape[:rem]),
 *              off = ratio if overlap else 0
 *   groups: score + ape; overlap_transform (slots [0,r) = channels [:d] of
 *           the previous window, kv 0 / score -inf for the first; slots
 *           [r,2r) = channels [d:] of this window); softmax over the slots
 *
 * Decode (one token): score += ape[pos % ratio]; the token fills state row
 * (overlap ? ratio : 0) + pos % ratio; when (pos+1) % ratio == 0 the entry
 * pools cat(state[:r, :d], state[r:, d:]) (overlap) or state (not), and
 * overlap shifts state[r:] -> state[:r].
 *
 * Not here: the projections, the bf16 cast, RMSNorm, RoPE and
 * quantization of the pooled entry (the callers', per generation).
 */
#include "ops.h"

#include <math.h>

size_t dsattn_compressor_scratch(size_t ratio, size_t d)
{
    return 2 * (2 * ratio) * d;     /* gathered kv and scores of 2r slots */
}

void dsattn_compressor_state_init(float *state_kv, float *state_z, size_t ratio,
                                  size_t d, int overlap)
{
    size_t coff = overlap ? 2 : 1, n = coff * ratio * coff * d;
    for (size_t i = 0; i < n; i++) {
        state_kv[i] = 0.0f;
        state_z[i] = -INFINITY;
    }
}

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

/* Pool one overlap entry from 2r gathered slots: rows [0, r) give channels
 * [:d] (the previous window, may be 0 / -inf), rows [r, 2r) channels [d:]. */
static void pool_overlap(const float *prev_kv, const float *prev_z, const float *cur_kv,
                         const float *cur_z, size_t ldp, size_t ldc, size_t r, size_t d,
                         float *out, float *scratch)
{
    float *gkv = scratch, *gz = scratch + 2 * r * d;
    for (size_t i = 0; i < r; i++) {
        for (size_t c = 0; c < d; c++) {
            gkv[i * d + c] = prev_kv ? prev_kv[i * ldp + c] : 0.0f;
            gz[i * d + c] = prev_z ? prev_z[i * ldp + c] : -INFINITY;
            gkv[(r + i) * d + c] = cur_kv[i * ldc + d + c];
            gz[(r + i) * d + c] = cur_z[i * ldc + d + c];
        }
    }
    dsattn_softmax_pool(gkv, gz, 2 * r, d, out);
}

size_t dsattn_compressor_pool(const float *kv, const float *z, size_t s, size_t d,
                              size_t ratio, int overlap, const float *ape,
                              float *state_kv, float *state_z, int64_t start_pos,
                              int prefill, float *out, float *scratch)
{
    const size_t C = overlap ? 2 * d : d;
    if (prefill) {
        const size_t rem = s % ratio, cutoff = s - rem, off = overlap ? ratio : 0;
        if (overlap && cutoff >= ratio) {
            for (size_t i = 0; i < ratio; i++)
                for (size_t c = 0; c < C; c++) {
                    const size_t t = cutoff - ratio + i;
                    state_kv[i * C + c] = kv[t * C + c];
                    state_z[i * C + c] = ape ? z[t * C + c] + ape[i * C + c] : z[t * C + c];
                }
        }
        for (size_t i = 0; i < rem; i++)
            for (size_t c = 0; c < C; c++) {
                const size_t t = cutoff + i;
                state_kv[(off + i) * C + c] = kv[t * C + c];
                state_z[(off + i) * C + c] = ape ? z[t * C + c] + ape[i * C + c] : z[t * C + c];
            }
        /* Scores of the complete groups with the APE added, group by group
         * (each group's biased scores are needed by itself and, with
         * overlap, by the next group). */
        const size_t ng = cutoff / ratio;
        float *gkv = scratch, *gz = scratch + 2 * ratio * d;
        for (size_t g = 0; g < ng; g++) {
            const float *ck = kv + g * ratio * C, *cz = z + g * ratio * C;
            if (overlap) {
                for (size_t i = 0; i < ratio; i++)
                    for (size_t c = 0; c < d; c++) {
                        if (g > 0) {
                            const size_t tp = (g - 1) * ratio + i;
                            gkv[i * d + c] = kv[tp * C + c];
                            gz[i * d + c] = ape ? z[tp * C + c] + ape[i * C + c] : z[tp * C + c];
                        } else {
                            gkv[i * d + c] = 0.0f;
                            gz[i * d + c] = -INFINITY;
                        }
                        gkv[(ratio + i) * d + c] = ck[i * C + d + c];
                        gz[(ratio + i) * d + c] =
                            ape ? cz[i * C + d + c] + ape[i * C + d + c] : cz[i * C + d + c];
                    }
                dsattn_softmax_pool(gkv, gz, 2 * ratio, d, out + g * d);
            } else {
                for (size_t i = 0; i < ratio; i++)
                    for (size_t c = 0; c < d; c++) {
                        gkv[i * d + c] = ck[i * C + c];
                        gz[i * d + c] = ape ? cz[i * C + c] + ape[i * C + c] : cz[i * C + c];
                    }
                dsattn_softmax_pool(gkv, gz, ratio, d, out + g * d);
            }
        }
        return ng;
    }
    /* decode: one token */
    const size_t slot = (size_t)(start_pos % (int64_t)ratio);
    const size_t row = (overlap ? ratio : 0) + slot;
    for (size_t c = 0; c < C; c++) {
        state_kv[row * C + c] = kv[c];
        state_z[row * C + c] = ape ? z[c] + ape[slot * C + c] : z[c];
    }
    if ((start_pos + 1) % (int64_t)ratio != 0) return 0;
    if (overlap) {
        pool_overlap(state_kv, state_z, state_kv + ratio * C, state_z + ratio * C, C, C,
                     ratio, d, out, scratch);
        memmove(state_kv, state_kv + ratio * C, ratio * C * sizeof(float));
        memmove(state_z, state_z + ratio * C, ratio * C * sizeof(float));
    } else {
        dsattn_softmax_pool(state_kv, state_z, ratio, d, out);
    }
    return 1;
}
