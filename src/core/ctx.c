/* ctx.c - dsattn_ctx: the arithmetic mode, the kernel table and the thread
 * count.  A context owns no tensors; it is cheap to create one per mode. */
#include "internal.h"
#include "kernels.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

dsattn_ctx_params dsattn_ctx_default_params(void)
{
    dsattn_ctx_params p = { DSATTN_MODE_FAST, DSATTN_ISA_AUTO, 0 };
    return p;
}

static const dsattn_kernels *table_for(dsattn_isa isa)
{
    switch (isa) {
    case DSATTN_ISA_AVX512: return dsattn_kernels_avx512_ptr;
    case DSATTN_ISA_AVX2:   return dsattn_kernels_avx2_ptr;
    default:                return &dsattn_kernels_ref;
    }
}

static dsattn_isa isa_from_env(void)
{
    const char *e = getenv("DSATTN_ISA");
    if (!e || !*e) return DSATTN_ISA_AUTO;
    if (!strcmp(e, "ref"))    return DSATTN_ISA_REF;
    if (!strcmp(e, "avx2"))   return DSATTN_ISA_AVX2;
    if (!strcmp(e, "avx512")) return DSATTN_ISA_AVX512;
    return DSATTN_ISA_AUTO;
}

dsattn_status dsattn_ctx_create(dsattn_ctx **out, const dsattn_ctx_params *p)
{
    if (!out) return DSATTN_ERR_INVALID_ARG;
    *out = NULL;
    dsattn_ctx_params d = p ? *p : dsattn_ctx_default_params();
    if (d.mode != DSATTN_MODE_FAST && d.mode != DSATTN_MODE_REFERENCE)
        return DSATTN_ERR_INVALID_ARG;
    dsattn_isa isa = d.isa;
    if (d.mode == DSATTN_MODE_REFERENCE) isa = DSATTN_ISA_REF;
    if (isa == DSATTN_ISA_AUTO) isa = isa_from_env();
    if (isa == DSATTN_ISA_AUTO) {
        if (dsattn_cpu_has_avx512() && dsattn_kernels_avx512_ptr) isa = DSATTN_ISA_AVX512;
        else if (dsattn_cpu_has_avx2() && dsattn_kernels_avx2_ptr) isa = DSATTN_ISA_AVX2;
        else isa = DSATTN_ISA_REF;
    }
    if (isa == DSATTN_ISA_AVX512 && !(dsattn_cpu_has_avx512() && dsattn_kernels_avx512_ptr))
        return DSATTN_ERR_UNSUPPORTED;
    if (isa == DSATTN_ISA_AVX2 && !(dsattn_cpu_has_avx2() && dsattn_kernels_avx2_ptr))
        return DSATTN_ERR_UNSUPPORTED;
    if (isa < DSATTN_ISA_AUTO || isa > DSATTN_ISA_AVX512) return DSATTN_ERR_INVALID_ARG;

    dsattn_ctx *c = calloc(1, sizeof *c);
    if (!c) return DSATTN_ERR_NOMEM;
    c->mode = d.mode;
    c->phase = -1;
    c->isa = isa;
    c->k = table_for(isa);
    const char *amx = getenv("DSATTN_AMX");
    c->amx = isa == DSATTN_ISA_AVX512 && dsattn_cpu_has_amx_bf16() && !(amx && !strcmp(amx, "0"));
#ifdef _OPENMP
    c->n_threads = d.n_threads > 0 ? d.n_threads : omp_get_max_threads();
#else
    c->n_threads = 1;
#endif
    *out = c;
    return DSATTN_OK;
}

void dsattn_ctx_destroy(dsattn_ctx *ctx)
{
    if (!ctx) return;
    dsattn_free(ctx->lin_ws);
    free(ctx);
}

const char *dsattn_ctx_isa_name(const dsattn_ctx *ctx)
{
    return ctx ? ctx->k->name : "none";
}

int dsattn_ctx_amx(const dsattn_ctx *ctx) { return ctx ? ctx->amx : 0; }

int dsattn_ctx_set_amx(dsattn_ctx *ctx, int on)
{
    if (!ctx) return 0;
    ctx->amx = on && ctx->isa == DSATTN_ISA_AVX512 && dsattn_cpu_has_amx_bf16();
    return ctx->amx;
}

dsattn_mode dsattn_ctx_mode(const dsattn_ctx *ctx) { return ctx->mode; }
int dsattn_ctx_threads(const dsattn_ctx *ctx) { return ctx->n_threads; }

void dsattn_ctx_counters_reset(dsattn_ctx *ctx)
{
    if (!ctx) return;
    memset(&ctx->cnt, 0, sizeof ctx->cnt);
    memset(&ctx->prof, 0, sizeof ctx->prof);
}

void dsattn_ctx_set_profiling(dsattn_ctx *ctx, int on)
{
    if (!ctx) return;
    ctx->prof_on = on != 0;
    ctx->phase = -1;
}

dsattn_profile dsattn_ctx_profile(const dsattn_ctx *ctx)
{
    dsattn_profile z;
    memset(&z, 0, sizeof z);
    return ctx ? ctx->prof : z;
}

const char *dsattn_phase_name(dsattn_phase p)
{
    static const char *const n[DSATTN_PHASE_COUNT] = {
        "query", "kv", "compress", "index", "attention", "output", "other" };
    return (unsigned)p < DSATTN_PHASE_COUNT ? n[p] : "?";
}

dsattn_counters dsattn_ctx_counters(const dsattn_ctx *ctx)
{
    dsattn_counters z = { 0, 0 };
    return ctx ? ctx->cnt : z;
}
