/* dispatch.c - the one place that chooses kernels: the context's table of
 * tables (ktab.h) and the context constructor that fills it.
 *
 * Every context gets its own dsattn_ktab, filled once in dsattn_ctx_create
 * (the AMX slot is toggled by dsattn_ctx_set_amx): ref in reference mode,
 * otherwise the best path the build and CPU run (avx512, avx2, neon)
 * unless $DSATTN_ISA or the caller forces one.  valgrind cannot execute AVX-512, so forcing DSATTN_ISA=ref
 * (or avx2) must always work; $DSATTN_AMX=0 keeps the AMX slot empty.
 * Nothing else in dsattn looks at an ISA's name or calls an ISA's entry
 * point directly.  The tables of other architectures are NULL in a build
 * (absent.c): an aarch64 build offers ref and neon, an x86-64 build ref,
 * avx2 and avx512.
 */
#include "ktab.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The slots an x86-64 table fills from its ISA files (each NULL where
 * the build has no such form); wdq and vmath keep their scalar forms then */
static void fill_x86(dsattn_ktab *t, const dsattn_kernels *k, const dsattn_mla_kern *mla,
                     const dsattn_sa_kern *sa, const dsattn_pgemm_kern *pgemm,
                     const dsattn_wdequant_kern *wdq, const dsattn_vmath_kern *vmath,
                     const dsattn_mha_kern *mha)
{
    t->k = k;
    t->mla = mla;
    t->sa = sa;
    t->pgemm = pgemm;
    if (wdq) t->wdq = wdq;
    if (vmath) t->vmath = vmath;
    t->mha = mha;
}

/* The AVX-512 pgemm table: with the bf16-dot GEMM where on and the CPU
 * has AVX512-BF16 */
static const dsattn_pgemm_kern *bf16dot_pgemm(int on)
{
    return on && dsattn_pgemm_avx512_bf16_ptr && dsattn_cpu_has_avx512_bf16()
               ? dsattn_pgemm_avx512_bf16_ptr : dsattn_pgemm_avx512_ptr;
}

/* The bf16 attention blocks (amx_attn.h): the AMX tiles where the table
 * has them, else their VDPBF16PS form where the table runs the bf16-dot
 * GEMM (the same CPU condition, the same switch).  The MHA / GQA attend
 * follows them, on VDPBF16PS with the blocks' form where that instruction
 * also runs near the FMA's rate (timed once: on AMD Zen 5 it does, so
 * twice the multiply-adds; on the Xeon VM measured a quarter of it), else
 * on FMAs. */
static void set_bf16blk(dsattn_ktab *t)
{
    t->bf16blk = t->amx ? t->amx
               : t->pgemm && t->pgemm->fp8_bf16 ? dsattn_bf16blk_avx512_ptr : NULL;
    t->mha = t->bf16blk && t->bf16blk == dsattn_bf16blk_avx512_ptr &&
                     dsattn_mha_kern_avx512_bf16_ptr && dsattn_avx512_bf16dot_full_rate()
                 ? dsattn_mha_kern_avx512_bf16_ptr : dsattn_mha_kern_avx512_ptr;
}

static int bf16dot_from_env(void)
{
    const char *e = getenv("DSATTN_BF16DOT");
    return !(e && !strcmp(e, "0"));
}

dsattn_status dsattn_ktab_fill(dsattn_ktab *t, dsattn_isa isa, int amx)
{
    memset(t, 0, sizeof *t);
    t->wdq = &dsattn_wdequant_ref;
    t->vmath = &dsattn_vmath_ref;
    switch (isa) {
    case DSATTN_ISA_REF:
        t->k = &dsattn_kernels_ref;
        break;
    case DSATTN_ISA_AVX2:
        if (!(dsattn_cpu_has_avx2() && dsattn_kernels_avx2_ptr)) return DSATTN_ERR_UNSUPPORTED;
        /* the exponent-shift FP8 decode where the FMA takes subnormal
         * operands at full rate (measured once: AMD Zen does) */
        fill_x86(t, dsattn_kernels_avx2_expshift_ptr && dsattn_avx2_fma_subnormal_full_rate()
                        ? dsattn_kernels_avx2_expshift_ptr : dsattn_kernels_avx2_ptr,
                 dsattn_mla_kern_avx2_ptr, dsattn_sa_kern_avx2_ptr, dsattn_pgemm_avx2_ptr,
                 dsattn_wdequant_avx2_ptr, dsattn_vmath_avx2_ptr, dsattn_mha_kern_avx2_ptr);
        t->index = dsattn_index_avx2_ptr;
        break;
    case DSATTN_ISA_AVX512:
        if (!(dsattn_cpu_has_avx512() && dsattn_kernels_avx512_ptr))
            return DSATTN_ERR_UNSUPPORTED;
        /* the exponent-shift FP8 decode as for AVX2 (AMD Zen 4, 2 threads,
         * in L2: 1.5x the fp16 decode's rate) */
        fill_x86(t, dsattn_kernels_avx512_expshift_ptr && dsattn_avx2_fma_subnormal_full_rate()
                        ? dsattn_kernels_avx512_expshift_ptr : dsattn_kernels_avx512_ptr,
                 dsattn_mla_kern_avx512_ptr,
                 dsattn_sa_kern_avx512_ptr,
                 /* + the bf16-dot GEMM where the CPU multiplies bf16 pairs */
                 bf16dot_pgemm(bf16dot_from_env()),
                 dsattn_wdequant_avx512_ptr,
                 dsattn_vmath_avx512_ptr, dsattn_mha_kern_avx512_ptr);
        t->amx = amx && dsattn_cpu_has_amx_bf16() ? dsattn_amx_avx512_ptr : NULL;
        set_bf16blk(t);
        t->index = dsattn_index_vnni_ptr;
        break;
    case DSATTN_ISA_NEON:
        /* aarch64 builds only (the *_neon.c files, all present together).
         * Advanced SIMD is part of ARMv8.0: no probe; the indexer's SDOT
         * form where the CPU has the dot product. */
        if (!dsattn_kernels_neon_ptr) return DSATTN_ERR_UNSUPPORTED;
        t->k = dsattn_kernels_neon_ptr;
        t->mla = dsattn_mla_kern_neon_ptr;
        t->sa = dsattn_sa_kern_neon_ptr;
        t->pgemm = dsattn_pgemm_neon_ptr;
        t->mha = dsattn_mha_kern_neon_ptr;
        t->vmath = dsattn_vmath_neon_ptr;
        t->wdq = dsattn_wdequant_neon_ptr;
        t->index = dsattn_cpu_has_neon_dotprod() ? dsattn_index_neon_dot_ptr
                                                 : dsattn_index_neon_ptr;
        break;
    default:
        return DSATTN_ERR_INVALID_ARG;
    }
    t->name = isa == DSATTN_ISA_REF ? "ref" : isa == DSATTN_ISA_AVX2 ? "avx2"
            : isa == DSATTN_ISA_AVX512 ? "avx512" : "neon";
    return DSATTN_OK;
}

void dsattn_ktab_scalar(dsattn_ktab *t)
{
    memset(t, 0, sizeof *t);
    t->name = "scalar";
    t->k = &dsattn_kernels_ref;
    t->mla = &dsattn_mla_kern_ref;
    t->sa = &dsattn_sa_kern_ref;
    t->pgemm = &dsattn_pgemm_ref;
    t->wdq = &dsattn_wdequant_ref;
    t->vmath = &dsattn_vmath_ref;
}

const char *dsattn_ktab_slot_name(size_t i)
{
    static const char *const n[DSATTN_KTAB_SLOTS] = {
        "k", "mla", "sa", "pgemm", "wdq", "vmath", "mha", "amx", "index", "bf16blk" };
    return i < DSATTN_KTAB_SLOTS ? n[i] : "?";
}

const char *dsattn_ktab_impl_name(const dsattn_ktab *t, size_t i)
{
    const char *s = NULL;
    switch (i) {
    case 0: s = t->k ? t->k->name : NULL; break;
    case 1: s = t->mla ? t->mla->name : NULL; break;
    case 2: s = t->sa ? t->sa->name : NULL; break;
    case 3: s = t->pgemm ? t->pgemm->name : NULL; break;
    case 4: s = t->wdq ? t->wdq->name : NULL; break;
    case 5: s = t->vmath ? t->vmath->name : NULL; break;
    case 6: s = t->mha ? t->mha->name : NULL; break;
    case 7: s = t->amx ? t->amx->name : NULL; break;
    case 8: s = t->index ? t->index->name : NULL; break;
    case 9: s = t->bf16blk ? t->bf16blk->name : NULL; break;
    default: break;
    }
    return s ? s : "-";
}

/* ==== The context: where the table is chosen ============================ */

/* The context and its table in one allocation (dsattn_ctx_destroy frees
 * the context, the first member). */
typedef struct {
    dsattn_ctx  c;
    dsattn_ktab t;
} ctx_with_table;

static dsattn_isa isa_from_env(void)
{
    const char *e = getenv("DSATTN_ISA");
    if (!e || !*e) return DSATTN_ISA_AUTO;
    if (!strcmp(e, "ref"))    return DSATTN_ISA_REF;
    if (!strcmp(e, "avx2"))   return DSATTN_ISA_AVX2;
    if (!strcmp(e, "avx512")) return DSATTN_ISA_AVX512;
    if (!strcmp(e, "neon"))   return DSATTN_ISA_NEON;
    return DSATTN_ISA_AUTO;
}

static int amx_from_env(void)
{
    const char *amx = getenv("DSATTN_AMX");
    return !(amx && !strcmp(amx, "0"));
}

dsattn_status dsattn_ctx_create(dsattn_ctx **out, const dsattn_ctx_params *p)
{
    if (!out) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_ctx_params d = p ? *p : dsattn_ctx_default_params();
    if (d.mode != DSATTN_MODE_FAST && d.mode != DSATTN_MODE_REFERENCE)
        return DSATTN_ERR_INVALID_ARG;
    if (d.n_threads > DSATTN_MAX_THREADS) return DSATTN_ERR_INVALID_ARG;
    dsattn_isa isa = d.isa;
    if (d.mode == DSATTN_MODE_REFERENCE) isa = DSATTN_ISA_REF;
    if (isa == DSATTN_ISA_AUTO) isa = isa_from_env();
    if (isa == DSATTN_ISA_AUTO) {
        if (dsattn_cpu_has_avx512() && dsattn_kernels_avx512_ptr) isa = DSATTN_ISA_AVX512;
        else if (dsattn_cpu_has_avx2() && dsattn_kernels_avx2_ptr) isa = DSATTN_ISA_AVX2;
        else if (dsattn_kernels_neon_ptr) isa = DSATTN_ISA_NEON;
        else isa = DSATTN_ISA_REF;
    }
    if (isa < DSATTN_ISA_AUTO || isa > DSATTN_ISA_NEON) return DSATTN_ERR_INVALID_ARG;
    dsattn_ktab t;
    dsattn_status st = dsattn_ktab_fill(&t, isa, amx_from_env());
    if (st) return st;

    ctx_with_table *ct = calloc(1, sizeof *ct);
    if (!ct) return DSATTN_ERR_NOMEM;
    dsattn_ctx *c = &ct->c;
    ct->t = t;
    c->mode = d.mode;
    c->phase = -1;
    c->isa = isa;
    c->kt = &ct->t;
    c->k = ct->t.k;
#ifdef _OPENMP
    c->n_threads = d.n_threads > 0 ? d.n_threads : omp_get_max_threads();
#else
    c->n_threads = 1;
#endif
    *out = c;
    return DSATTN_OK;
}

const char *dsattn_ctx_isa_name(const dsattn_ctx *ctx)
{
    return ctx ? ctx->kt->name : "none";
}

int dsattn_ctx_amx(const dsattn_ctx *ctx) { return ctx ? ctx->kt->amx != NULL : 0; }

int dsattn_ctx_set_bf16dot(dsattn_ctx *ctx, int on)
{
    if (!ctx || ctx->isa != DSATTN_ISA_AVX512) return 0;
    dsattn_ktab *t = &((ctx_with_table *)ctx)->t;
    t->pgemm = bf16dot_pgemm(on);
    set_bf16blk(t);
    return t->pgemm != NULL && t->pgemm->fp8_bf16 != NULL;
}

int dsattn_ctx_set_amx(dsattn_ctx *ctx, int on)
{
    if (!ctx) return 0;
    /* the context's own table (ctx_with_table): only this slot changes */
    dsattn_ktab *t = &((ctx_with_table *)ctx)->t;
    t->amx = on && ctx->isa == DSATTN_ISA_AVX512 && dsattn_cpu_has_amx_bf16()
                 ? dsattn_amx_avx512_ptr : NULL;
    set_bf16blk(t);
    return t->amx != NULL;
}
