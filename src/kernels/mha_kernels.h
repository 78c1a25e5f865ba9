/* mha_kernels.h - internal: the fast attention kernel of MHA / GQA
 * (DeepSeek-LLM 7B / 67B): one query token against one KV head's bf16
 * cache (K and V key-tiled: the layout is described in src/attn/mha.h,
 * its two tile widths are defined here, where the kernel reads them), for
 * the G query heads of its group at once.
 *
 * The arithmetic is the fast-mode contract of src/attn/mha_forward.c, the
 * same roundings as the reference with fp32 accumulation:
 *   s_j = bf16(bf16(q_h . k_j) * inv_sqrt_d)
 *   p_j = bf16(exp(s_j - max_j s) / sum_j exp(s_j - max))
 *   o_h = bf16(sum_j p_j v_j)
 * Every head's arithmetic is the same whichever G it is computed with (so
 * GQA with repeated KV heads equals MHA bit for bit on one path).
 * The plain C version of this contract is attend_fast_c in mha_forward.c;
 * the reference (double sums) is attend_ref there.  Not here: RoPE, the
 * projections, threading (the caller hands each thread whole KV heads).
 */
#ifndef DSATTN_MHA_KERNELS_H
#define DSATTN_MHA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Tokens per K tile and per V tile of the MHA cache (src/attn/mha.h). */
#define DSATTN_MHA_KTILE 32
#define DSATTN_MHA_VTILE 64

/* q [G][d] (bf16 values), K / V this KV head's caches (offset
 * dsattn_mha_k_index / v_index(cap, d, g, 0, 0)), T visible keys (1 <= T
 * <= cap), ws: the table's ws_bytes(G, T) bytes (any alignment);
 * o [G][d] (bf16 values).  G <= 64, d <= 128 and even. */
typedef void (*dsattn_mha_attend_fn)(const float *q, size_t G, size_t d, const uint16_t *K,
                                     const uint16_t *V, size_t cap, size_t T,
                                     float inv_sqrt_d, void *ws, float *o);

/* The ktab slot (ktab.h): a named attend kernel and its scratch size
 * (ws_bytes(G, T): the bytes ws must have, any alignment). */
typedef struct dsattn_mha_kern {
    const char           *name;                  /* "avx512", "avx2", "neon" */
    dsattn_mha_attend_fn  attend;
    size_t              (*ws_bytes)(size_t G, size_t T);
} dsattn_mha_kern;

/* NULL when the compiler could not build AVX-512 code.  _bf16: the same
 * kernel with q.k and p.v on VDPBF16PS (CPUs with AVX512-BF16 only). */
extern const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr;
extern const dsattn_mha_kern *const dsattn_mha_kern_avx512_bf16_ptr;
/* Whether VDPBF16PS runs at 2/3 of the FMA rate or better on this CPU
 * (timed once; call only where the CPU has AVX512-BF16; 0 where there is
 * no such kernel): the table takes the _bf16 kernel then. */
int dsattn_avx512_bf16dot_full_rate(void);
/* mha_avx2.c: the same contract on AVX2 + FMA; NULL outside x86-64 builds. */
extern const dsattn_mha_kern *const dsattn_mha_kern_avx2_ptr;
/* mha_neon.c: the same contract on Advanced SIMD; NULL outside aarch64 builds. */
extern const dsattn_mha_kern *const dsattn_mha_kern_neon_ptr;

#endif
