/* mha_forward.c - the attention forward of MHA / GQA (HF LlamaAttention,
 * transformers 4.33.1, eager, bf16), reference and fast, for one
 * sequence's chunk and for a batched decode step across sequences (one
 * function over rows, layer_rows: the rows of a chunk are one sequence's
 * consecutive positions, those of a batch one token of each sequence).
 *
 * There is no official DeepSeek code for DeepSeek-LLM 7B / 67B (the repos
 * say model_type "llama"), so the contract is LlamaAttention.forward run in
 * bf16 as the checkpoints ship, with the roundings where its bf16 tensors
 * round:
 *   q, k, v = bf16 Linear (no bias)                      dsattn_linear
 *   cos, sin = fp32 tables cast to bf16 (cos_cached.to(x.dtype))
 *   q, k = RoPE, rotate_half = half-split pairs (x[i], x[i+d/2]) over all d
 *       dims, via the shared dsattn_rope_apply: products and the sum in
 *       fp32, one bf16 rounding (HF rounds q*cos and rotate_half(q)*sin to
 *       bf16 before adding: at most one bf16 ulp apart, a documented
 *       departure that keeps one RoPE op in the library)
 *   K, V appended to the bf16 cache (K after RoPE); repeat_kv is the index
 *       g = h / G, never a copy
 *   s_j = bf16(bf16(q.k_j) * fp32(1/sqrt(d)))   (matmul in bf16, then the
 *       division by math.sqrt(d), which CUDA evaluates as a multiply by the
 *       fp32 reciprocal)
 *   causal mask: keys after the query's position are excluded (HF adds
 *       finfo.min; exp gives exactly 0 either way)
 *   p_j = bf16(exp(s_j - max) / sum)   softmax(dtype=float32).to(bf16)
 *   o = bf16(sum_j p_j v_j)            bf16 matmul, fp32 accumulation
 *   out = bf16 o_proj(o)
 *
 * Reference mode: every sum accumulated in double and rounded once (the
 * golden-case contract), exp in double rounded to fp32, one (query, head)
 * per work item, so the result is bit-reproducible whatever the threads.
 * Fast mode: the same roundings with fp32 accumulation and exp within 2 ulp
 * of expf, one (query, KV head) pair per work item (OpenMP), all G query
 * heads of the group at once, so each bf16 K / V element is read from
 * memory once per query token and decoded once for the whole group.  The
 * AVX-512, AVX2 and NEON tables get their kernel from the table's mha
 * slot (src/kernels/mha_avx512.c, mha_avx2.c, mha_neon.c: keys in lanes
 * for the scores, dims in lanes for P.V, bf16 scores with a running max /
 * sum between the two passes; docs/mha.md); the ref table runs attend_fast_c, the plain
 * C statement of the same arithmetic.
 */
#include "mha.h"

#include "batch_common.h"
#include "cpu.h"
#include "ktab.h"
#include "numfmt.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The forward's scratch: the sequence's, sized at creation for a decode
 * step, or the context's for a chunk that needs more (nothing kept). */
static float *scratch_get(dsattn_ctx *ctx, dsattn_mha_seq *s, size_t floats)
{
    size_t bytes;
    if (!dsattn_mul_size(floats, sizeof(float), &bytes)) return NULL;
    return dsattn_call_scratch(ctx, DSATTN_CTX_SCR_CHUNK, s->scratch, s->scratch_size, bytes);
}

/* ==== Softmax of one score row, shared by both paths =================== */

/* sc[0..T): raw q.k sums (fp32) -> scaled bf16 scores -> bf16 probabilities.
 * ref != 0: exp in double and the sum in double, each rounded once. */
static void softmax_row(float *sc, size_t T, float inv_sqrt_d, int ref)
{
    float mx = -INFINITY;
    for (size_t j = 0; j < T; j++) {
        float s = dsattn_round_bf16(dsattn_round_bf16(sc[j]) * inv_sqrt_d);
        sc[j] = s;
        mx = s > mx ? s : mx;
    }
    if (ref) {
        double sum = 0.0;
        for (size_t j = 0; j < T; j++) {
            sc[j] = (float)exp((double)(sc[j] - mx));
            sum += sc[j];
        }
        float fs = (float)sum;
        for (size_t j = 0; j < T; j++) sc[j] = dsattn_round_bf16(sc[j] / fs);
    } else {
        float sum = 0.0f;
        for (size_t j = 0; j < T; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        for (size_t j = 0; j < T; j++) sc[j] = dsattn_round_bf16(sc[j] / sum);
    }
}

/* ==== Reference: one query head against its KV head ==================== */

/* K, V: this KV head's key-tiled caches (the layer's buffers at
 * dsattn_mha_k_index / v_index(cap, d, g, 0, 0)). */
static void attend_ref(const float *q, size_t d, const uint16_t *K, const uint16_t *V,
                       size_t cap, size_t T, float inv_sqrt_d, float *sc, float *o)
{
    for (size_t j = 0; j < T; j++) {
        double a = 0.0;
        for (size_t i = 0; i < d; i++)
            a += (double)q[i] * (double)dsattn_bf16_to_f32(K[dsattn_mha_k_index(cap, d, 0, j, i)]);
        sc[j] = (float)a;
    }
    softmax_row(sc, T, inv_sqrt_d, 1);
    for (size_t i = 0; i < d; i++) {
        double a = 0.0;
        for (size_t j = 0; j < T; j++)
            a += (double)sc[j] * (double)dsattn_bf16_to_f32(V[dsattn_mha_v_index(cap, d, 0, j, i)]);
        o[i] = dsattn_round_bf16((float)a);
    }
}

/* ==== Fast, plain C: one query token, the G query heads of one KV head == */

/* The fast-mode arithmetic without SIMD (the kernel of the tables with no
 * mha slot: ref; the layer-level test holds the SIMD kernels to it
 * and all to the reference): q [G][d], K / V
 * as attend_ref, T visible keys, ws >= attend_fast_c_floats(G, d, T)
 * floats, o [G][d].  Each K tile is read once for the group (the scores of
 * its keys in a register-sized row per head), each V row decoded once (by
 * its index: this path is about clarity, not layout-aware speed). */
static size_t attend_fast_c_floats(size_t G, size_t d, size_t T)
{
    return G * T + G * d + d;
}

static void attend_fast_c(const float *q, size_t G, size_t d, const uint16_t *K,
                          const uint16_t *V, size_t cap, size_t T, float inv_sqrt_d,
                          void *ws, float *o)
{
    const size_t KT = DSATTN_MHA_KTILE;
    float *sc = ws, *acc = sc + G * T, *v = acc + G * d;
    for (size_t b0 = 0; b0 < T; b0 += KT) {
        const size_t w = DSATTN_MIN(KT, cap - b0), nk = DSATTN_MIN(w, T - b0);
        const uint16_t *kt = K + b0 * d;
        for (size_t h = 0; h < G; h++) {
            float s[DSATTN_MHA_KTILE] = { 0 };
            for (size_t i = 0; i < d; i++) {
                const float qi = q[h * d + i];
                for (size_t j = 0; j < nk; j++) s[j] += qi * dsattn_bf16_to_f32(kt[i * w + j]);
            }
            memcpy(sc + h * T + b0, s, nk * sizeof(float));
        }
    }
    for (size_t h = 0; h < G; h++) softmax_row(sc + h * T, T, inv_sqrt_d, 0);
    memset(acc, 0, G * d * sizeof(float));
    for (size_t j = 0; j < T; j++) {
        for (size_t i = 0; i < d; i++) v[i] = dsattn_bf16_to_f32(V[dsattn_mha_v_index(cap, d, 0, j, i)]);
        for (size_t h = 0; h < G; h++) {
            const float p = sc[h * T + j];
            float *ah = acc + h * d;
            for (size_t i = 0; i < d; i++) ah[i] += p * v[i];
        }
    }
    for (size_t i = 0; i < G * d; i++) o[i] = dsattn_round_bf16(acc[i]);
}

/* ==== The layer forward ================================================= */

/* The forward's scratch in floats for n tokens, Tmax visible keys, nt
 * threads; kind 0 reference, 1 the C fast kernel, 2 the table's kernel mhk:
 * q [n, H*d] | kv [n, 2*Hkv*d] | o [n, H*d] (*act floats) | per thread its
 * work, rounded to 64 bytes (the kernel's scratch is aligned). */
static int scratch_floats(const dsattn_mha_config *c, size_t n, size_t Tmax, int nt, int kind,
                          const dsattn_mha_kern *mhk, size_t *act, size_t *total)
{
    const size_t H = (size_t)c->n_heads, Hkv = (size_t)c->n_kv_heads;
    const size_t d = (size_t)c->head_dim, G = H / Hkv;
    size_t per_thread = kind == 0 ? Tmax
                      : kind == 1 ? attend_fast_c_floats(G, d, Tmax)
                      : (mhk->ws_bytes(G, Tmax) + 3) / 4;
    per_thread = (per_thread + 15) & ~(size_t)15;
    size_t thr;
    *act = (n * (2 * H * d + 2 * Hkv * d) + 15) & ~(size_t)15;
    return dsattn_mul_size((size_t)nt, per_thread, &thr) && dsattn_add_size(*act, thr, total);
}

size_t dsattn_mha_decode_scratch_bytes(const dsattn_mha_config *c, size_t cap)
{
    if (cap > SIZE_MAX / 64 || c->n_kv_heads <= 0) return SIZE_MAX;
    size_t most = 0, act, total;
    const int T = dsattn_ws_threads();
    /* every kernel a context of this build and CPU can hold (dispatch.c) */
    const dsattn_mha_kern *kerns[4] = {
        dsattn_cpu_has_avx512() ? dsattn_mha_kern_avx512_ptr : NULL,
        dsattn_cpu_has_avx512_bf16() ? dsattn_mha_kern_avx512_bf16_ptr : NULL,
        dsattn_cpu_has_avx2() ? dsattn_mha_kern_avx2_ptr : NULL,
        dsattn_mha_kern_neon_ptr };
    for (int kind = 0; kind < 6; kind++) {
        const dsattn_mha_kern *mhk = kind >= 2 ? kerns[kind - 2] : NULL;
        if (kind >= 2 && !mhk) continue;
        for (int nt = 1; nt <= T; nt++) {
            if (!scratch_floats(c, 1, cap, nt, kind >= 2 ? 2 : kind, mhk, &act, &total) ||
                total > SIZE_MAX / sizeof(float))
                return SIZE_MAX;
            most = DSATTN_MAX(most, total);
        }
    }
    return most * sizeof(float);
}

/* The rows of one layer step.  One sequence: its n tokens at positions
 * pos .. pos+n-1 (a chunk, each row seeing the keys up to its own
 * position); n sequences (the batched step): row t is seqs[t]'s one token
 * at its own position. */
typedef struct {
    dsattn_mha_seq *const *seqs;
    size_t                 nseq;   /* 1 or n */
    int                    layer;
} mha_rows;

static dsattn_mha_seq *row_seq(const mha_rows *r, size_t t)
{
    return r->seqs[r->nseq == 1 ? 0 : t];
}

static size_t row_pos(const mha_rows *r, size_t t)
{
    return (size_t)row_seq(r, t)->pos + (r->nseq == 1 ? t : 0);
}

static dsattn_mha_layer_s *row_cache(const mha_rows *r, size_t t)
{
    dsattn_mha_seq *s = row_seq(r, t);
    return &s->layer[r->layer - s->first];
}

/* The layer over n rows of x (the rows' sequences checked by the caller),
 * in scratch (scratch_floats(c, n, Tmax, nt, kind, mhk): act floats of
 * activations, then per_thread a thread; Tmax >= every row's position + 1). */
static dsattn_status layer_rows(dsattn_ctx *ctx, const mha_rows *r, const float *x, size_t n,
                                float *out, float *scratch, size_t act, size_t per_thread)
{
    const dsattn_mha *m = r->seqs[0]->m;
    const dsattn_mha_config *c = &m->cfg;
    const dsattn_mha_layer_w *L = &m->layer[r->layer];
    const size_t D = (size_t)c->hidden, H = (size_t)c->n_heads, Hkv = (size_t)c->n_kv_heads;
    const size_t d = (size_t)c->head_dim, G = H / Hkv;
    const int ref = ctx->mode == DSATTN_MODE_REFERENCE;
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const dsattn_mha_kern *mhk = ctx->kt->mha;
    dsattn_mha_attend_fn attend = mhk ? mhk->attend : attend_fast_c;
    float *q = scratch, *kv = q + n * H * d, *o = kv + n * 2 * Hkv * d, *work = q + act;
    dsattn_status st;

    /* ---- projections (bf16 Linears, no bias), the weights read once for all rows */
    if ((st = dsattn_linear(ctx, &L->wq, x, D, n, q, H * d, DSATTN_OUT_BF16, NULL, NULL))) return st;
    if ((st = dsattn_linear(ctx, &L->wk, x, D, n, kv, 2 * Hkv * d, DSATTN_OUT_BF16, NULL, NULL)))
        return st;
    if ((st = dsattn_linear(ctx, &L->wv, x, D, n, kv + Hkv * d, 2 * Hkv * d, DSATTN_OUT_BF16,
                            NULL, NULL)))
        return st;

    /* ---- RoPE (bf16 tables, half-split pairs, all d dims) at each row's
     * position, cache append */
    for (size_t t = 0; t < n; t++) {
        const size_t p = row_pos(r, t), cap = row_seq(r, t)->max_seq_len;
        dsattn_mha_layer_s *S = row_cache(r, t);
        float cs[64], sn[64];
        dsattn_rope_cs(&m->rope, (int64_t)p, cs, sn);
        for (size_t i = 0; i < d / 2; i++) {
            cs[i] = dsattn_round_bf16(cs[i]);
            sn[i] = dsattn_round_bf16(sn[i]);
        }
        for (size_t h = 0; h < H; h++)
            dsattn_rope_apply(q + (t * H + h) * d, d, cs, sn, 0, 0, DSATTN_OUT_BF16);
        float *kt = kv + t * 2 * Hkv * d, *vt = kt + Hkv * d;
        for (size_t g = 0; g < Hkv; g++) {
            dsattn_rope_apply(kt + g * d, d, cs, sn, 0, 0, DSATTN_OUT_BF16);
            for (size_t i = 0; i < d; i++) {
                S->k[dsattn_mha_k_index(cap, d, g, p, i)] = dsattn_f32_to_bf16(kt[g * d + i]);
                S->v[dsattn_mha_v_index(cap, d, g, p, i)] = dsattn_f32_to_bf16(vt[g * d + i]);
            }
        }
    }

    /* ---- attention: each row sees the keys up to its own position; a
     * work item is one (row, query head) in reference mode, one (row, KV
     * head) with its G query heads in fast mode */
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    const size_t units = ref ? H : Hkv;
    DSATTN_PARALLEL_FOR_DYN(nt, it, n * units, {
        float *ws = work + (size_t)dsattn_thread_num() * per_thread;
        const size_t t = it / units, u = it % units, g = ref ? u / G : u;
        const size_t T = row_pos(r, t) + 1, cap = row_seq(r, t)->max_seq_len;
        const dsattn_mha_layer_s *S = row_cache(r, t);
        if (ref)
            attend_ref(q + (t * H + u) * d, d, S->k + g * cap * d, S->v + g * cap * d, cap, T,
                       inv_sqrt_d, ws, o + (t * H + u) * d);
        else   /* the G heads of group g are contiguous in q and o */
            attend(q + (t * H + g * G) * d, G, d, S->k + g * cap * d, S->v + g * cap * d, cap,
                   T, inv_sqrt_d, ws, o + (t * H + g * G) * d);
    });
    /* Work of the core: per visible key, 2d FLOPs for q.k and 2d for p.v per
     * head; bytes: each KV head's K and V rows once per query token. */
    uint64_t keys = 0;
    for (size_t t = 0; t < n; t++) keys += row_pos(r, t) + 1;
    dsattn_count(ctx, 4ull * keys * H * d, keys * Hkv * d * 2ull * 2ull + n * H * d * 4ull);

    /* ---- output projection */
    return dsattn_linear(ctx, &L->wo, o, H * d, n, out, D, DSATTN_OUT_BF16, NULL, NULL);
}

/* the scratch kind of ctx: 0 reference, 1 the C fast kernel, 2 the table's */
static int scratch_kind(const dsattn_ctx *ctx)
{
    return ctx->mode == DSATTN_MODE_REFERENCE ? 0 : ctx->kt->mha ? 2 : 1;
}

dsattn_status dsattn_mha_attn_forward(dsattn_ctx *ctx, dsattn_mha_seq *s,
                                      int layer, const float *x, size_t n,
                                      float *out)
{
    if (!ctx || !s || !x || !out || n == 0) return DSATTN_ERR_INVALID_ARG;
    const dsattn_mha_config *c = &s->m->cfg;
    if (layer < s->first || layer >= s->first + s->count) return DSATTN_ERR_INVALID_ARG;
    if (n > s->max_seq_len || (size_t)s->pos > s->max_seq_len - n) return DSATTN_ERR_INVALID_ARG;
    if (!s->m->layer[layer].wq.data) return DSATTN_ERR_UNSUPPORTED;   /* config-only layer */
    if (c->n_heads / c->n_kv_heads > 64) return DSATTN_ERR_UNSUPPORTED;
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    size_t act, total;
    if (!scratch_floats(c, n, (size_t)s->pos + n, nt, scratch_kind(ctx), ctx->kt->mha, &act,
                        &total))
        return DSATTN_ERR_OVERFLOW;
    float *scratch = scratch_get(ctx, s, total);
    if (!scratch) return DSATTN_ERR_NOMEM;
    const mha_rows r = { &s, 1, layer };
    return layer_rows(ctx, &r, x, n, out, scratch, act, (total - act) / (size_t)nt);
}

/* ==== The batched decode step =========================================== */

static int seq_info(const void *seqs, size_t i, dsattn_batch_seq_info *info)
{
    const dsattn_mha_seq *s = ((dsattn_mha_seq *const *)seqs)[i];
    if (!s) return 0;
    *info = (dsattn_batch_seq_info){ s, s->m, 0, s->pos, s->max_seq_len,
                                     (size_t)s->m->cfg.hidden, s->m->w_count > 0,
                                     s->m->cfg.n_layers };
    return 1;
}

static dsattn_status attn_batch(dsattn_ctx *ctx, dsattn_mha_seq *const *seqs, size_t B,
                                int layer, const float *x, float *out, size_t *failed)
{
    dsattn_status st = dsattn_batch_check_seqs(ctx, seqs, B, seq_info, x, out, &layer, failed);
    if (st) return st;
    const dsattn_mha *m = seqs[0]->m;
    const dsattn_mha_config *c = &m->cfg;
    if (layer < 0 || layer >= c->n_layers) return DSATTN_ERR_INVALID_ARG;
    size_t cap = 0;
    for (size_t i = 0; i < B; i++) {
        if (layer < seqs[i]->first || layer >= seqs[i]->first + seqs[i]->count) {
            *failed = i;                                /* a sequence of other layers */
            return DSATTN_ERR_INVALID_ARG;
        }
        cap = DSATTN_MAX(cap, seqs[i]->max_seq_len);
    }
    if (!m->layer[layer].wq.data) return DSATTN_ERR_UNSUPPORTED;     /* config-only layer */
    if (c->n_heads / c->n_kv_heads > 64) return DSATTN_ERR_UNSUPPORTED;
    /* sized from the capacities, not the positions: a steady step finds
     * the context's batch scratch big enough and allocates nothing */
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    size_t act, total;
    if (!scratch_floats(c, B, cap, nt, scratch_kind(ctx), ctx->kt->mha, &act, &total) ||
        total > SIZE_MAX / sizeof(float) - 16)
        return DSATTN_ERR_OVERFLOW;
    float *base = dsattn_ctx_scratch(ctx, DSATTN_CTX_SCR_BATCH, total * sizeof(float) + 64);
    if (!base) return DSATTN_ERR_NOMEM;
    float *scratch = (float *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    const mha_rows r = { seqs, B, layer };
    return layer_rows(ctx, &r, x, B, out, scratch, act, (total - act) / (size_t)nt);
}

/* *failed is written only when the call fails */
dsattn_status dsattn_mha_attn_forward_batch(dsattn_ctx *ctx, dsattn_mha_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x, float *out,
                                            size_t *failed)
{
    size_t bad = SIZE_MAX;
    return dsattn_batch_result(attn_batch(ctx, seqs, n_seqs, layer, x, out, &bad), &bad, failed);
}
