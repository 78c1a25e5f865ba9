/* csa_weights.c - the weights of the attention block every layer of both
 * compressed-sparse-attention generations (V4, V4.1) has - attn_norm, the
 * low-rank query wq_a / q_norm / wq_b, the window wkv / kv_norm, the sink
 * and the grouped output wo_a / wo_b - bound from a checkpoint or made at
 * random, and the checkpoint's opening with its config (csa.h).
 *
 * Owns: the names, shapes, order and seeds of those tensors.  Each
 * generation gives its rule (tensor name suffix, accepted formats, its
 * binder) and binds or makes the rest of its layer itself: compressors and
 * indexers in v4_model.c and v41_model.c.
 */
#include "csa.h"

#include <stdio.h>

dsattn_status dsattn_csa_bind_block(const dsattn_binder *b, const dsattn_csa_config *c,
                                    int64_t l, const dsattn_csa_bind_rule *r,
                                    const dsattn_csa_block_w *w)
{
    char n[256];
    dsattn_status st;
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank;
#define V(name) (snprintf(n, sizeof n, "layers.%lld.%s", (long long)l, name), n)
#define M(name) (snprintf(n, sizeof n, "layers.%lld.attn.%s%s", (long long)l, name, r->suffix), n)
    if ((st = dsattn_bind_vec(b, V("attn_norm.weight"), dim, w->attn_norm))) return st;
    if ((st = r->bind_mat(b, M("wq_a"), r->lin, QL, dim, w->wq_a))) return st;
    if ((st = dsattn_bind_vec(b, V("attn.q_norm.weight"), QL, w->q_norm))) return st;
    if ((st = r->bind_mat(b, M("wq_b"), r->lin, H * D, QL, w->wq_b))) return st;
    if ((st = r->bind_mat(b, M("wkv"), r->lin, D, dim, w->wkv))) return st;
    if ((st = dsattn_bind_vec(b, V("attn.kv_norm.weight"), D, w->kv_norm))) return st;
    if ((st = dsattn_bind_vec(b, V("attn.attn_sink"), H, w->sink))) return st;
    if ((st = r->bind_mat(b, M("wo_a"), r->wo_a, G * R, H * D / G, w->wo_a))) return st;
    return r->bind_mat(b, M("wo_b"), r->lin, dim, G * R, w->wo_b);
#undef V
#undef M
}

dsattn_status dsattn_csa_random_block(const dsattn_csa_config *c, const dsattn_csa_block_w *w,
                                      dsattn_wkind lin, dsattn_wkind wo_a, int sink_bf16,
                                      uint64_t *k, dsattn_owned *own)
{
    const size_t dim = (size_t)c->dim, H = (size_t)c->n_heads, D = (size_t)c->head_dim;
    const size_t QL = (size_t)c->q_lora_rank, G = (size_t)c->o_groups;
    const size_t R = (size_t)c->o_lora_rank, bs = (size_t)c->fp8_block;
#define MAT(kind, rows, cols, wt) dsattn_weight_random(wt, kind, rows, cols, bs, 1.0f, ++*k, own)
#define VEC(len, base, jit, bf16, out) dsattn_vec_random(out, len, base, jit, bf16, ++*k, own)
    dsattn_status st = VEC(dim, 1.0f, 0.1f, 1, w->attn_norm);
    if (!st) st = MAT(lin, QL, dim, w->wq_a);
    if (!st) st = VEC(QL, 1.0f, 0.1f, 1, w->q_norm);
    if (!st) st = MAT(lin, H * D, QL, w->wq_b);
    if (!st) st = MAT(lin, D, dim, w->wkv);
    if (!st) st = VEC(D, 1.0f, 0.1f, 1, w->kv_norm);
    if (!st) st = VEC(H, 0.0f, 1.0f, sink_bf16, w->sink);
    if (!st) st = MAT(wo_a, G * R, H * D / G, w->wo_a);
    if (!st) st = MAT(lin, dim, G * R, w->wo_b);
#undef MAT
#undef VEC
    return st;
}
