/* ktab.h - the context's table of kernel tables: every ISA-specific entry
 * point dsattn has, chosen once per context (dsattn_ctx_create, dispatch.c).
 *
 * Algorithm code (src/ops, src/attn) reads its kernels from ctx->kt and
 * nowhere else: no ISA ifdefs, no lookups by ISA name, no direct calls of
 * an ISA's entry points.  A slot that is NULL means "this context has no
 * such fast form": the caller keeps its generic path (the scalar reference
 * in reference mode, OpenBLAS sgemm, the C loops of the fast contract).
 *
 *   slot    table type           what it runs                  scalar twin (test)
 *   k       dsattn_kernels       GEMVs, packed-row dots/axpys  dsattn_kernels_ref (test_kernels)
 *   mla     dsattn_mla_kern      heads-in-lanes tiles: MLA     dsattn_mla_kern_ref (test_mla)
 *                                decode, V4/V4.1 Linear pieces
 *   sa      dsattn_sa_kern       sparse-attention row decode   dsattn_sa_kern_ref (test_sparse_attn)
 *                                and row-major tiles
 *   pgemm   dsattn_pgemm_kern    prefill GEMM tiles            dsattn_pgemm_ref (test_pgemm)
 *   wdq     dsattn_wdequant_kern FP8 weight row -> fp32        dsattn_wdequant_ref (test_vmath)
 *   vmath   dsattn_vmath_kern    exp(x - m) with its sum       dsattn_vmath_ref (test_vmath)
 *   mha     dsattn_mha_kern      MHA/GQA decode attend         attend_fast_c in mha_forward.c (test_mha)
 *   amx     dsattn_amx_kern      AMX-BF16 attention/GEMM tiles the mla/sa FMA tiles (test_mla,
 *                                                              test_sparse_attn, test_pgemm)
 *   index   dsattn_index_kern    exact integer indexer scores  the reference score (test_formats)
 *                                (AVX-512 VNNI / AMX-INT8, AVX2, NEON)
 *   bf16blk dsattn_amx_kern      the attention blocks over     the mla/sa FMA tiles (test_mla,
 *                                bf16 rows: amx, or the same   test_sparse_attn)
 *                                on VDPBF16PS ("bf16-dot")
 *
 * k, wdq and vmath are never NULL.  Which slots a table fills:
 *   ref      k = ref, wdq = ref, vmath = ref, the rest NULL
 *   avx2     k, mla, sa, pgemm, mha, wdq, vmath, index = their AVX2 forms
 *            (*_avx2.c; k is avx2-expshift where the FMA takes subnormals
 *            at full rate), amx NULL
 *   avx512   every slot its AVX-512 form (each NULL where the compiler
 *            could not build it; k is avx512-expshift as for avx2, pgemm
 *            avx512-bf16 where the CPU has AVX512-BF16 and $DSATTN_BF16DOT
 *            is not "0"); amx only where the CPU and OS run
 *            AMX-BF16 and $DSATTN_AMX is not "0" (dsattn_ctx_set_amx
 *            toggles it); index where built for x86-64 (it checks the CPU's
 *            VNNI itself, per call shape); bf16blk = amx where set, else
 *            the VDPBF16PS blocks where pgemm is avx512-bf16.  The V3 MLA,
 *            the V3.2 indexer's logits and the V4 / V4.1 sparse attention
 *            read bf16blk; the prefill Linear keeps amx (it has its own
 *            bf16-dot GEMM).  mha is avx512-bf16 (q.k and p.v on
 *            VDPBF16PS) where bf16blk is those blocks and the CPU issues
 *            VDPBF16PS near its FMA rate (timed once), else avx512.
 *   neon     k, mla, sa, pgemm, mha, wdq, vmath, index = their NEON
 *            forms (aarch64 builds only; index the SDOT form where the CPU
 *            has the dot product); amx and bf16blk NULL
 */
#ifndef DSATTN_KTAB_H
#define DSATTN_KTAB_H

#include "dsattn.h"
#include "kernels.h"
#include "amx_attn.h"
#include "index_vnni.h"
#include "mha_kernels.h"
#include "mla_kernels.h"
#include "pgemm.h"
#include "sa_kernels.h"
#include "vmath.h"
#include "wdequant.h"

typedef struct dsattn_ktab {
    const char                 *name;   /* the ISA: "ref", "avx2", "avx512", "neon" */
    const dsattn_kernels       *k;
    const dsattn_mla_kern      *mla;
    const dsattn_sa_kern       *sa;
    const dsattn_pgemm_kern    *pgemm;
    const dsattn_wdequant_kern *wdq;
    const dsattn_vmath_kern    *vmath;
    const dsattn_mha_kern      *mha;
    const dsattn_amx_kern      *amx;
    const dsattn_index_kern    *index;
    const dsattn_amx_kern      *bf16blk;
} dsattn_ktab;

/* The table of `isa` (REF, AVX2, AVX512 or NEON; never AUTO) with the AMX slot
 * filled when amx != 0 and the CPU runs AMX-BF16.  DSATTN_ERR_UNSUPPORTED
 * when this build or CPU cannot run `isa`.  Used by dsattn_ctx_create, and
 * by the tests and `dsattn bench kernels` to enumerate every table. */
dsattn_status dsattn_ktab_fill(dsattn_ktab *t, dsattn_isa isa, int amx);

/* The bf16-dot GEMM of an AVX-512 context (pgemm avx512-bf16, chosen at
 * creation where the CPU has AVX512-BF16 and $DSATTN_BF16DOT is not "0")
 * on or off, and with it the slots that follow it (bf16blk, mha); returns
 * whether the context now runs it.  Internal: the tests
 * compare the two paths. */
int dsattn_ctx_set_bf16dot(dsattn_ctx *ctx, int on);

/* Every slot's scalar twin, filled (the cross-check of each fast slot):
 * k, mla, sa, pgemm, wdq, vmath their scalar tables; mha, amx, index, bf16blk NULL
 * (their twins are the generic paths named above). */
void dsattn_ktab_scalar(dsattn_ktab *t);

/* Slot names and the chosen implementation's name ("-" for NULL), for
 * listings: i < DSATTN_KTAB_SLOTS. */
#define DSATTN_KTAB_SLOTS 10
const char *dsattn_ktab_slot_name(size_t i);
const char *dsattn_ktab_impl_name(const dsattn_ktab *t, size_t i);

#endif /* DSATTN_KTAB_H */
